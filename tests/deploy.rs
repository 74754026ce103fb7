//! The container image, the compose file and the Kubernetes manifests
//! agree with each other and with the node: every manifest parses, every
//! node.toml is a configuration the node accepts (its schema: unknown keys
//! are refused), and the parts that must match do (ports, probe commands
//! and health service names, mount paths, region names, peer addresses,
//! each node's name and advertised address, the database each region's
//! nodes share and the password they log in with, the selectors of the
//! Deployment, its disruption budget and its anti-affinity).
//! `kubectl kustomize deploy/kubernetes/overlays/REGION` renders what this
//! reads (the labels kustomize adds to selectors are added here the same
//! way); this test needs neither kubectl nor docker.

mod manifests;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use cascade_node::ha::{HaConfig, HaSettings};
use cascade_node::ConfigFile;
use manifests::{
    compose_volumes, database_url, env_var, kustomize_labels, list, merged, mounted_at, named, port_of, read, root,
    str_of, string_map, strings, toml_section, toml_str, toml_table, volume_holding, with_labels, yaml, yaml_one,
    DatabaseUrl,
};
use yaml_rust2::{Yaml, YamlLoader};

const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

/// Where every container's gRPC listener is, as a node that listens on a
/// wildcard address is bound: the advertised address names the same port.
const WILDCARD: &str = "0.0.0.0";

/// The node's services gRPC health reports on: the server (`""`), every
/// `service` of proto/cascade/v1 (read from the .proto files, the same
/// list the node registers), and `cascade.v1.Writer`, SERVING on a
/// region's writer only, which no .proto declares.
fn health_services() -> BTreeSet<String> {
    let mut services = BTreeSet::from([String::new(), cascade_node::WRITER_HEALTH_SERVICE.to_owned()]);
    for entry in std::fs::read_dir(root().join("proto/cascade/v1")).expect("proto dir") {
        let text = read(&entry.expect("entry").path());
        for line in text.lines() {
            if let Some(name) = line.strip_prefix("service ").and_then(|l| l.split_whitespace().next()) {
                services.insert(format!("cascade.v1.{name}"));
            }
        }
    }
    services
}

/// What a node.toml must say given where it runs: the region, ports, TLS
/// files under their mount, peers at their addresses, a schema the image
/// has, and its region's state in PostgreSQL (no data directory).
struct Expected<'a> {
    region: &'a str,
    grpc_port: u16,
    metrics_port: u16,
    tls_mount: &'a str,
    /// Every address of `peer` that the config must list (in any order).
    peer_addresses: &'a dyn Fn(&str) -> BTreeSet<String>,
}

/// Checks a node.toml against `expected`; returns its database URL.
fn check_node_config(path: &Path, expected: &Expected<'_>) -> DatabaseUrl {
    let c = toml_table(path);
    let what = &path.display().to_string();
    assert_eq!(toml_str(&c, "region", what), expected.region, "{what}: region");
    assert!(
        !toml_str(&c, "cluster", what).is_empty(),
        "{what}: the cluster its database is recorded for"
    );
    assert_eq!(
        port_of(toml_str(&c, "listen", what), "listen"),
        expected.grpc_port,
        "{what}: listen port"
    );
    assert_eq!(
        port_of(toml_str(&c, "metrics_listen", what), "metrics_listen"),
        expected.metrics_port,
        "{what}: metrics_listen port"
    );
    assert!(
        !c.contains_key("data_dir"),
        "{what}: a node over PostgreSQL keeps nothing on its disk"
    );

    let storage = toml_section(&c, "storage", what);
    assert_eq!(
        toml_str(storage, "engine", what),
        "postgres",
        "{what}: [storage] engine"
    );
    let url = database_url(toml_str(storage, "url", what), what);
    assert_eq!(url.port, 5432, "{what}: PostgreSQL's port");
    assert!(
        !toml_str(storage, "schema", what).is_empty(),
        "{what}: [storage] schema"
    );

    let tls = toml_section(&c, "tls", what);
    let tls_file = |key: &str, file: String| {
        assert_eq!(
            Path::new(toml_str(tls, key, what)),
            Path::new(expected.tls_mount).join(&file),
            "{what}: [tls] {key}"
        );
    };
    tls_file("ca", "ca.pem".into());
    tls_file("cert", format!("{}.pem", expected.region));
    tls_file("key", format!("{}.key", expected.region));
    // The image has the schema the config names (the Dockerfile copies
    // deploy/schemas/ to /etc/cascade/schemas/), and the node accepts it.
    let schema = Path::new(toml_str(&c, "schema", what));
    let in_repo = root().join("deploy/schemas").join(
        schema
            .strip_prefix("/etc/cascade/schemas")
            .unwrap_or_else(|_| panic!("{what}: schema {} is not in the image", schema.display())),
    );
    cascade_node::config::load_schema(Some(&in_repo)).unwrap_or_else(|e| panic!("{what}: {e}"));

    let peers = toml_section(&c, "peers", what);
    let listed: BTreeSet<&str> = peers.keys().map(String::as_str).collect();
    let others: BTreeSet<&str> = REGIONS.iter().copied().filter(|r| *r != expected.region).collect();
    assert_eq!(listed, others, "{what}: [peers] lists every other region");
    for (peer, entry) in peers {
        let addresses: BTreeSet<String> = match entry {
            toml::Value::String(one) => BTreeSet::from([one.clone()]),
            toml::Value::Array(several) => several
                .iter()
                .map(|a| {
                    a.as_str()
                        .unwrap_or_else(|| panic!("{what}: [peers] {peer}: {a:?}"))
                        .to_owned()
                })
                .collect(),
            other => panic!("{what}: [peers] {peer}: {other:?}"),
        };
        assert_eq!(addresses, (expected.peer_addresses)(peer), "{what}: [peers] {peer}");
        assert!(
            addresses.iter().all(|a| a.starts_with("https://")),
            "{what}: [peers] {peer}: with [tls], peers are dialled over TLS"
        );
    }
    url
}

/// Who a node is among its region's nodes, as the node resolves `[ha]`
/// from its flags or environment: `advertise` must be a valid address,
/// over TLS, naming the port it listens on, and it is the address the
/// node records for the region's other nodes and clients.
fn check_node_identity(node_name: &str, advertise: &str, grpc_port: u16, what: &str) {
    let settings = HaSettings::from_config(&HaConfig {
        node_name: Some(node_name.to_owned()),
        advertise: Some(advertise.to_owned()),
        ..HaConfig::default()
    })
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    let bound = SocketAddr::new(WILDCARD.parse().expect("an address"), grpc_port);
    let holder = settings.holder(bound, true).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(
        (holder.node.as_str(), holder.address.as_str()),
        (node_name, advertise),
        "{what}"
    );
    assert!(advertise.starts_with("https://"), "{what}: {advertise} is not TLS");
    assert!(
        advertise.ends_with(&format!(":{grpc_port}")),
        "{what}: {advertise} is not the gRPC port {grpc_port}"
    );
}

#[test]
fn the_dockerfile_runs_as_a_user_with_a_data_directory_and_the_ports_of_the_manifests() {
    let text = read(&root().join("Dockerfile"));
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    assert!(
        lines.iter().filter(|l| l.starts_with("FROM ")).count() >= 2,
        "multi-stage"
    );
    let user = lines.iter().rev().find(|l| l.starts_with("USER ")).expect("USER");
    assert!(!user.contains(" 0") && !user.contains("root"), "{user}");
    // A node on an embedded engine mounts its volume on a directory the
    // user owns; the regions on PostgreSQL get no anonymous volume.
    assert!(
        lines
            .iter()
            .any(|l| l.contains("chown cascade:cascade /var/lib/cascade")),
        "the data directory belongs to the user"
    );
    assert!(
        !lines.iter().any(|l| l.starts_with("VOLUME")),
        "no image volume: the deployed regions keep their state in PostgreSQL"
    );
    assert!(lines.contains(&"EXPOSE 50051 9090"), "gRPC and metrics ports");
    assert!(lines.contains(&"COPY deploy/schemas/ /etc/cascade/schemas/"));
    assert!(lines.contains(&r#"ENTRYPOINT ["/usr/local/bin/cascade"]"#));
}

#[test]
fn the_kubernetes_manifests_agree_with_each_other_and_with_the_node() {
    let k8s = root().join("deploy/kubernetes");
    let base = yaml_one(&k8s.join("base/kustomization.yaml"));
    let resources: BTreeSet<String> = strings(&base["resources"], "base resources").into_iter().collect();
    assert_eq!(
        resources,
        BTreeSet::from(["deployment.yaml".into(), "service.yaml".into(), "pdb.yaml".into()])
    );
    let base_labels = kustomize_labels(&base, "base labels");
    let deployment = yaml_one(&k8s.join("base/deployment.yaml"));
    let service = yaml_one(&k8s.join("base/service.yaml"));
    let budget = yaml_one(&k8s.join("base/pdb.yaml"));
    assert_eq!(str_of(&deployment["kind"], "kind"), "Deployment");
    let replicas = deployment["spec"]["replicas"].as_i64();
    assert_eq!(replicas, Some(2), "two nodes per region: a writer and a standby");
    assert!(
        deployment["spec"]["volumeClaimTemplates"].is_badvalue(),
        "no claim: the state is in PostgreSQL"
    );
    assert_eq!(str_of(&budget["kind"], "kind"), "PodDisruptionBudget");
    assert_eq!(
        budget["spec"]["minAvailable"].as_i64(),
        Some(1),
        "one node of the region stays through a drain"
    );
    // Only ready pods (the writer, a standby that reaches it) get calls.
    assert_ne!(
        service["spec"]["publishNotReadyAddresses"].as_bool(),
        Some(true),
        "the Service sends calls to ready pods only"
    );

    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    assert_eq!(
        pod["securityContext"]["runAsUser"].as_i64(),
        Some(10001),
        "the image's user"
    );
    let container = &list(&pod["containers"], "containers")[0];
    let port = |name: &str| -> u16 {
        let p = named(&container["ports"], name, "container ports")["containerPort"]
            .as_i64()
            .expect("containerPort");
        u16::try_from(p).expect("a port")
    };
    let (grpc, metrics) = (port("grpc"), port("metrics"));
    for name in ["grpc", "metrics"] {
        let service_port = named(&service["spec"]["ports"], name, "service ports");
        assert_eq!(service_port["targetPort"].as_str(), Some(name));
        assert_eq!(
            service_port["port"].as_i64(),
            Some(i64::from(port(name))),
            "Service port {name}"
        );
    }
    let annotations = &deployment["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(
        annotations["prometheus.io/port"].as_str(),
        Some(metrics.to_string().as_str())
    );

    // Mounts: config from the ConfigMap, TLS from the Secret; nothing
    // else, and nothing for data.
    let mount = |name: &str| {
        str_of(
            &named(&container["volumeMounts"], name, "volumeMounts")["mountPath"],
            name,
        )
        .to_owned()
    };
    let (config_mount, tls_mount) = (mount("config"), mount("tls"));
    let volumes: BTreeSet<String> = list(&pod["volumes"], "volumes")
        .iter()
        .map(|v| {
            assert!(
                !v["configMap"].is_badvalue() || !v["secret"].is_badvalue(),
                "volume {v:?}: only configuration and secrets, no data"
            );
            str_of(&v["name"], "volume name").to_owned()
        })
        .collect();
    assert_eq!(volumes, BTreeSet::from(["config".into(), "tls".into()]));
    assert_eq!(list(&container["volumeMounts"], "volumeMounts").len(), 2);
    assert_eq!(
        named(&pod["volumes"], "config", "volumes")["configMap"]["name"].as_str(),
        Some("cascade-config")
    );
    let config_file = format!("{config_mount}/node.toml");
    let args = strings(&container["args"], "args");
    assert_eq!(args, ["serve", "--config", config_file.as_str()]);

    // Probes: `cascade health` on the node's own config, about services
    // the node reports on; ready means service "": the writer, or a
    // standby that reaches it.
    let known = health_services();
    for probe in ["readinessProbe", "livenessProbe"] {
        let command = strings(&container[probe]["exec"]["command"], probe);
        assert_eq!(
            &command[..4],
            ["cascade", "health", "--config", config_file.as_str()],
            "{probe}"
        );
        let service = match command.iter().position(|a| a == "--service") {
            Some(i) => command[i + 1].clone(),
            None => String::new(),
        };
        assert!(
            known.contains(&service),
            "{probe}: health service {service:?} is not one of {known:?}"
        );
        if probe == "readinessProbe" {
            assert_eq!(service, "", "readiness: the writer or a standby that reaches it");
        }
    }

    // Who each pod is: its name, and its IP at the gRPC port.
    let (_, node_name) = env_var(container, "CASCADE_NODE_NAME");
    assert_eq!(
        node_name["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("metadata.name")
    );
    let (pod_ip_at, pod_ip) = env_var(container, "POD_IP");
    assert_eq!(
        pod_ip["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("status.podIP")
    );
    let (advertise_at, advertise) = env_var(container, "CASCADE_ADVERTISE");
    assert!(
        pod_ip_at < advertise_at,
        "POD_IP is defined before CASCADE_ADVERTISE uses it"
    );
    let advertise = str_of(&advertise["value"], "CASCADE_ADVERTISE");
    assert_eq!(advertise, format!("https://$(POD_IP):{grpc}"));
    check_node_identity(
        "cascade-eu-west-7d4b9c6f5-x2x4q",
        &advertise.replace("$(POD_IP)", "10.1.2.3"),
        grpc,
        "CASCADE_ADVERTISE",
    );
    let (_, password) = env_var(container, "CASCADE_PG_PASSWORD");
    assert_eq!(password["valueFrom"]["secretKeyRef"]["key"].as_str(), Some("password"));

    let example_database = yaml_one(&k8s.join("postgres/cloudnativepg.yaml"));
    for region in REGIONS {
        let overlay = k8s.join("overlays").join(region);
        let kustomization_text = read(&overlay.join("kustomization.yaml"));
        let k = yaml_one(&overlay.join("kustomization.yaml"));
        assert_eq!(strings(&k["resources"], "resources"), ["../../base"], "{region}");
        assert_eq!(k["nameSuffix"].as_str(), Some(format!("-{region}").as_str()));
        let mut labels = base_labels.clone();
        labels.extend(kustomize_labels(&k, region));
        assert_eq!(labels.get("cascade.dev/region").map(String::as_str), Some(region));
        let generator = named(&k["configMapGenerator"], "cascade-config", "configMapGenerator");
        assert_eq!(strings(&generator["files"], "files"), ["node.toml"]);

        // The disruption budget and the anti-affinity select exactly the
        // Deployment's pods: this region's nodes.
        let template = &deployment["spec"]["template"];
        let pod_labels = with_labels(&template["metadata"]["labels"], &labels, region);
        let selector = with_labels(&deployment["spec"]["selector"]["matchLabels"], &labels, region);
        assert!(
            selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
            "{region}: the Deployment's selector {selector:?} selects its pods {pod_labels:?}"
        );
        let budget_selector = with_labels(&budget["spec"]["selector"]["matchLabels"], &labels, region);
        assert_eq!(budget_selector, selector, "{region}: the budget's pods");
        let terms = list(
            &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"],
            "anti-affinity",
        );
        let term = &terms[0]["podAffinityTerm"];
        assert_eq!(term["topologyKey"].as_str(), Some("kubernetes.io/hostname"));
        assert_eq!(
            with_labels(&term["labelSelector"]["matchLabels"], &labels, region),
            selector,
            "{region}: the region's nodes on different machines"
        );

        // The Secrets' names, set by the patch (they are not suffixed),
        // and how to create each, in the overlay's comments.
        let patch = list(&k["patches"], "patches")
            .iter()
            .flat_map(|p| YamlLoader::load_from_str(str_of(&p["patch"], "patch")).expect("patch is YAML"))
            .find(|p| p["kind"].as_str() == Some("Deployment"))
            .expect("a Deployment patch");
        let patched = &patch["spec"]["template"]["spec"];
        let tls_secret = str_of(
            &named(&patched["volumes"], "tls", "patched volumes")["secret"]["secretName"],
            "tls secretName",
        );
        assert_eq!(tls_secret, format!("cascade-tls-{region}"));
        let patched_container = named(&patched["containers"], "cascade", "patched containers");
        let (_, patched_password) = env_var(patched_container, "CASCADE_PG_PASSWORD");
        let password_ref = &patched_password["valueFrom"]["secretKeyRef"];
        let password_secret = str_of(&password_ref["name"], "password secret");
        assert_eq!(password_secret, format!("cascade-postgres-{region}"));
        assert_eq!(password_ref["key"].as_str(), Some("password"));
        for secret in [tls_secret, password_secret] {
            assert!(
                kustomization_text.contains(&format!("kubectl create secret generic {secret} ")),
                "{region}: how to create the Secret {secret} is not documented"
            );
        }

        let service_name = str_of(&service["metadata"]["name"], "service name");
        let config = overlay.join("node.toml");
        let url = check_node_config(
            &config,
            &Expected {
                region,
                grpc_port: grpc,
                metrics_port: metrics,
                tls_mount: &tls_mount,
                // The peer's Service, with its overlay's suffix: any of
                // its ready pods answers.
                peer_addresses: &|peer| BTreeSet::from([format!("https://{service_name}-{peer}:{grpc}")]),
            },
        );
        // The password is the Secret's, in the environment.
        let storage = toml_section(&toml_table(&config), "storage", region).clone();
        assert!(
            !storage.contains_key("password_file"),
            "{region}: the password comes from CASCADE_PG_PASSWORD"
        );
        // The example database is region eu-west's: the operator makes
        // the database, its owner and the read-write Service the url names,
        // with the password of the Secret the nodes read.
        if region == "eu-west" {
            assert_eq!(str_of(&example_database["kind"], "kind"), "Cluster");
            let initdb = &example_database["spec"]["bootstrap"]["initdb"];
            assert_eq!(initdb["database"].as_str(), Some(url.database.as_str()));
            assert_eq!(initdb["owner"].as_str(), Some(url.user.as_str()));
            assert_eq!(initdb["secret"]["name"].as_str(), Some(password_secret));
            let cluster = str_of(&example_database["metadata"]["name"], "cluster name");
            assert_eq!(url.host, format!("{cluster}-rw"), "{region}: the primary's Service");
            assert!(
                example_database["spec"]["postgresql"]["synchronous"]["number"]
                    .as_i64()
                    .is_some_and(|n| n >= 1),
                "a failover of PostgreSQL must not lose an acknowledged commit"
            );
        } else {
            assert_eq!(url.host, format!("cascade-pg-{region}-rw"), "{region}: database host");
        }
    }

    // PostgreSQL comes from an operator or a managed service, never from
    // a StatefulSet shipped here as if it were production.
    for dir in [
        "base",
        "postgres",
        "overlays/eu-west",
        "overlays/us-east",
        "overlays/ap-south",
    ] {
        for entry in std::fs::read_dir(k8s.join(dir)).expect("manifest dir") {
            let path = entry.expect("entry").path();
            if path.extension().and_then(|e| e.to_str()) == Some("yaml") {
                for doc in yaml(&path) {
                    assert_ne!(doc["kind"].as_str(), Some("StatefulSet"), "{}", path.display());
                }
            }
        }
    }
}

#[test]
fn the_compose_file_runs_three_regions_of_two_nodes_over_postgres_with_mutual_tls() {
    let dir = root().join("deploy/compose");
    let compose = yaml_one(&dir.join("compose.yaml"));
    let services: Vec<(String, Yaml)> = compose["services"]
        .as_hash()
        .expect("services")
        .iter()
        .map(|(name, s)| (str_of(name, "service name").to_owned(), merged(s)))
        .collect();
    let node = &compose["x-node"];
    let command = strings(&node["command"], "command");
    assert_eq!(command[..2], ["serve", "--config"]);
    let config_file = command[2].clone();
    let health = strings(&node["healthcheck"]["test"], "healthcheck");
    assert_eq!(
        health,
        [
            "CMD",
            "/usr/local/bin/cascade",
            "health",
            "--config",
            config_file.as_str()
        ],
        "healthy: the writer, or a standby that reaches it (service \"\")"
    );
    assert_eq!(
        node["depends_on"]["postgres"]["condition"].as_str(),
        Some("service_healthy"),
        "the nodes start once PostgreSQL accepts connections"
    );
    let secrets = &compose["services"]["secrets"];
    let made = strings(&secrets["command"], "secrets command").join(" ");
    for region in REGIONS {
        assert!(
            made.contains(region),
            "the secrets job issues {region}'s certificate: {made}"
        );
    }
    assert_eq!(
        node["depends_on"]["secrets"]["condition"].as_str(),
        Some("service_completed_successfully")
    );

    // PostgreSQL: its password from a file the secrets job makes, healthy
    // once it accepts connections, an init script for the regions.
    let postgres = &compose["services"]["postgres"];
    assert!(
        str_of(&postgres["image"], "postgres image").starts_with("postgres:"),
        "the official image"
    );
    let postgres_health = strings(&postgres["healthcheck"]["test"], "postgres healthcheck");
    assert!(postgres_health.iter().any(|a| a == "pg_isready"), "{postgres_health:?}");
    let postgres_env = string_map(&postgres["environment"], "postgres environment");
    assert!(
        !postgres_env.contains_key("POSTGRES_PASSWORD"),
        "no password in the compose file"
    );
    let postgres_volumes = compose_volumes(postgres, "postgres");
    for key in ["POSTGRES_PASSWORD_FILE", "CASCADE_PASSWORD_FILE"] {
        let file = &postgres_env[key];
        let (_, name) = volume_holding(&postgres_volumes, file, key);
        assert!(made.contains(&name), "the secrets job makes {name} ({key}): {made}");
    }
    let init_script = postgres_volumes
        .iter()
        .find(|(_, target)| target.starts_with("/docker-entrypoint-initdb.d/"))
        .map(|(source, _)| read(&dir.join(source)))
        .expect("an init script");

    let mut host_ports = BTreeSet::new();
    for region in REGIONS {
        let region_config = format!("./{region}.toml");
        // The region's nodes: the services that read its config.
        let nodes: Vec<(&str, &Yaml)> = services
            .iter()
            .filter(|(_, s)| s["volumes"].as_vec().is_some())
            .filter(|(_, s)| {
                compose_volumes(s, "volumes")
                    .iter()
                    .any(|(source, target)| *source == region_config && *target == config_file)
            })
            .map(|(name, s)| (name.as_str(), s))
            .collect();
        assert_eq!(
            nodes.len(),
            2,
            "{region}: two nodes: {:?}",
            nodes.iter().map(|n| n.0).collect::<Vec<_>>()
        );

        let config = dir.join(format!("{region}.toml"));
        let c = toml_table(&config);
        let grpc = port_of(toml_str(&c, "listen", region), "listen");
        let metrics = port_of(toml_str(&c, "metrics_listen", region), "metrics_listen");
        let mut tls_mounts = BTreeSet::new();
        for (name, service) in &nodes {
            for key in ["image", "command", "depends_on", "healthcheck"] {
                assert_eq!(service[key], node[key], "{name}: {key} of the node anchor");
            }
            let env = string_map(&service["environment"], name);
            assert_eq!(env["CASCADE_NODE_NAME"], *name, "{name}: its node name");
            let advertise = &env["CASCADE_ADVERTISE"];
            assert_eq!(*advertise, format!("https://{name}:{grpc}"), "{name}: its address");
            check_node_identity(name, advertise, grpc, name);
            let ports = strings(&service["ports"], "ports");
            let container_port =
                |p: &str| -> u16 { p.rsplit(':').next().and_then(|p| p.parse().ok()).expect("a port") };
            let published: BTreeSet<u16> = ports.iter().map(|p| container_port(p)).collect();
            assert_eq!(published, BTreeSet::from([grpc, metrics]), "{name}: published ports");
            for p in &ports {
                let host = p.split(':').next().expect("a host port").to_owned();
                assert!(host_ports.insert(host.clone()), "{name}: host port {host} is taken");
            }
            tls_mounts.insert(mounted_at(&compose_volumes(service, name), "certs", name));
        }
        assert_eq!(tls_mounts.len(), 1, "{region}: one TLS mount");
        let tls_mount = tls_mounts.pop_first().expect("a TLS mount");

        let url = check_node_config(
            &config,
            &Expected {
                region,
                grpc_port: grpc,
                metrics_port: metrics,
                tls_mount: &tls_mount,
                // Every node of the peer region, by its service name.
                peer_addresses: &|peer| {
                    services
                        .iter()
                        .filter(|(_, s)| s["volumes"].as_vec().is_some())
                        .filter(|(_, s)| {
                            compose_volumes(s, "volumes")
                                .iter()
                                .any(|(source, _)| *source == format!("./{peer}.toml"))
                        })
                        .map(|(name, _)| format!("https://{name}:{grpc}"))
                        .collect()
                },
            },
        );
        // The region's own database on the postgres service, made with
        // the role its nodes log in as, who read the password the init
        // script gave that role.
        assert_eq!(url.host, "postgres", "{region}: the postgres service");
        assert!(
            init_script.contains(&format!("CREATE DATABASE {} OWNER {};", url.database, url.user)),
            "{region}: the init script makes database {} owned by {}",
            url.database,
            url.user
        );
        assert!(init_script.contains(&format!("CREATE ROLE {} LOGIN PASSWORD :'password';", url.user)));
        let storage = toml_section(&c, "storage", region);
        let password_file = toml_str(storage, "password_file", region);
        let role_password = volume_holding(&postgres_volumes, &postgres_env["CASCADE_PASSWORD_FILE"], "postgres");
        for (name, service) in &nodes {
            assert_eq!(
                volume_holding(&compose_volumes(service, name), password_file, name),
                role_password,
                "{name}: the password of the role the init script made"
            );
        }
    }
    let databases = init_script.matches("CREATE DATABASE ").count();
    assert_eq!(databases, REGIONS.len(), "a database per region");
}

/// What kustomize itself renders from each overlay, when `kubectl` is on
/// this machine (without it the test says so and checks nothing: the
/// test above reads the same manifests by hand, adding the labels as
/// kustomize does, and this one holds that reading to kustomize's own).
#[test]
fn the_rendered_overlays_run_two_nodes_of_their_region_when_kubectl_is_here() {
    if std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_err()
    {
        eprintln!("kubectl is not installed: the overlays were not rendered");
        return;
    }
    for region in REGIONS {
        let overlay = root().join("deploy/kubernetes/overlays").join(region);
        let out = std::process::Command::new("kubectl")
            .arg("kustomize")
            .arg(&overlay)
            .output()
            .expect("run kubectl kustomize");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{region}: kubectl kustomize: {stderr}");
        let docs = YamlLoader::load_from_str(&String::from_utf8_lossy(&out.stdout)).expect("rendered YAML");
        let kinds: Vec<&str> = docs.iter().map(|d| str_of(&d["kind"], "kind")).collect();
        let mut sorted = kinds.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service"],
            "{region}: what is applied"
        );
        let one = |kind: &str| &docs[kinds.iter().position(|k| *k == kind).expect("rendered")];
        let (deployment, budget, service, config) = (
            one("Deployment"),
            one("PodDisruptionBudget"),
            one("Service"),
            one("ConfigMap"),
        );
        assert_eq!(deployment["spec"]["replicas"].as_i64(), Some(2), "{region}");
        assert_eq!(budget["spec"]["minAvailable"].as_i64(), Some(1), "{region}");
        let selector = string_map(&deployment["spec"]["selector"]["matchLabels"], "selector");
        assert_eq!(selector.get("cascade.dev/region").map(String::as_str), Some(region));
        let template = &deployment["spec"]["template"];
        let pod_labels = string_map(&template["metadata"]["labels"], "pod labels");
        assert!(
            selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
            "{region}: {selector:?} selects {pod_labels:?}"
        );
        let pod = &template["spec"];
        let term = &list(
            &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"],
            "anti-affinity",
        )[0]["podAffinityTerm"];
        for (what, other) in [
            ("budget", &budget["spec"]["selector"]["matchLabels"]),
            ("Service", &service["spec"]["selector"]),
            ("anti-affinity", &term["labelSelector"]["matchLabels"]),
        ] {
            assert_eq!(
                string_map(other, what),
                selector,
                "{region}: the {what} selects the region's pods"
            );
        }
        let container = &list(&pod["containers"], "containers")[0];
        let (_, password) = env_var(container, "CASCADE_PG_PASSWORD");
        assert_eq!(
            password["valueFrom"]["secretKeyRef"]["name"].as_str(),
            Some(format!("cascade-postgres-{region}").as_str())
        );
        let tls = named(&pod["volumes"], "tls", "volumes");
        assert_eq!(
            tls["secret"]["secretName"].as_str(),
            Some(format!("cascade-tls-{region}").as_str())
        );
        let mounted = named(&pod["volumes"], "config", "volumes");
        assert_eq!(
            mounted["configMap"]["name"], config["metadata"]["name"],
            "{region}: the config"
        );
        assert_eq!(
            config["data"]["node.toml"].as_str(),
            Some(read(&overlay.join("node.toml")).as_str()),
            "{region}: its node.toml"
        );
    }
}

/// Every node.toml of the compose file and of the Kubernetes overlays.
fn deployed_configs() -> Vec<PathBuf> {
    REGIONS
        .iter()
        .flat_map(|region| {
            [
                root().join(format!("deploy/compose/{region}.toml")),
                root().join(format!("deploy/kubernetes/overlays/{region}/node.toml")),
            ]
        })
        .collect()
}

/// The node reads every deployed config as it is (unknown keys are
/// errors): `cluster`, `[storage]`'s url, password_file and schema, and
/// `[peers]` lists of a region's nodes.
#[test]
fn every_deployed_node_config_is_one_the_node_reads() {
    for path in deployed_configs() {
        node_config(&path);
    }
}

/// The probes' `cascade health --config` reads every deployed config, up
/// to the TLS files it names (which are in the containers, not here):
/// a config it could not read would fail every probe, and no node would
/// ever be ready.
#[test]
fn the_health_probe_reads_every_deployed_config() {
    for path in deployed_configs() {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cascade"))
            .args(["health", "--config"])
            .arg(&path)
            .output()
            .expect("run cascade health");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("cannot read /etc/cascade/tls/ca.pem"),
            "{}: cascade health did not get to the TLS files: {stderr}",
            path.display()
        );
    }
}

/// `deploy/region.example.toml` documents every key: the node must read
/// it as it is (unknown keys are errors), `[links]` included.
#[test]
fn the_example_region_config_is_one_the_node_reads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/region.example.toml");
    let file = node_config(&path);
    let links = file.links.clone();
    assert_eq!(links.silence_timeout_ms, Some(5000), "{links:?}");
    assert_eq!(links.dial_timeout_ms, Some(3000), "{links:?}");
    // The schema path is relative to the repository root, as the README runs it.
    let mut file = file;
    file.schema = file.schema.map(|s| Path::new(env!("CARGO_MANIFEST_DIR")).join(s));
    let settings = cascade_node::NodeSettings::from_file(&file).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(settings.links.silence_timeout, std::time::Duration::from_secs(5));
}

/// A node configuration as the node reads it (unknown keys are errors).
fn node_config(path: &Path) -> ConfigFile {
    ConfigFile::load(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
