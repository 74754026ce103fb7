//! The container image, the compose file and the Kubernetes manifests
//! agree with each other and with the node: every manifest parses, every
//! node.toml is a configuration the node accepts (its schema: unknown keys
//! are refused), and the parts that must match do (ports, probe commands
//! and health service names, mount paths, region names, peer addresses).
//! `kubectl kustomize deploy/kubernetes/overlays/REGION` renders what this
//! reads; this test needs neither kubectl nor docker.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use cascade_node::ConfigFile;
use yaml_rust2::{Yaml, YamlLoader};

const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every document of a YAML file.
fn yaml(path: &Path) -> Vec<Yaml> {
    YamlLoader::load_from_str(&read(path)).unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()))
}

fn yaml_one(path: &Path) -> Yaml {
    let mut docs = yaml(path);
    assert_eq!(docs.len(), 1, "{}: one document", path.display());
    docs.remove(0)
}

fn str_of<'a>(y: &'a Yaml, what: &str) -> &'a str {
    y.as_str().unwrap_or_else(|| panic!("{what}: not a string: {y:?}"))
}

fn list<'a>(y: &'a Yaml, what: &str) -> &'a [Yaml] {
    y.as_vec()
        .map(Vec::as_slice)
        .unwrap_or_else(|| panic!("{what}: not a list: {y:?}"))
}

fn strings(y: &Yaml, what: &str) -> Vec<String> {
    list(y, what).iter().map(|s| str_of(s, what).to_owned()).collect()
}

/// The element of `items` whose `name` is `name`.
fn named<'a>(items: &'a Yaml, name: &str, what: &str) -> &'a Yaml {
    list(items, what)
        .iter()
        .find(|i| i["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("{what}: no entry named {name}"))
}

/// The node's services gRPC health reports on: the server (`""`) and
/// every `service` of proto/cascade/v1 (read from the .proto files, the
/// same list the node registers).
fn health_services() -> BTreeSet<String> {
    let mut services = BTreeSet::from([String::new()]);
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

/// A node configuration as the node reads it (unknown keys are errors).
fn node_config(path: &Path) -> ConfigFile {
    ConfigFile::load(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn port_of(addr: &str, what: &str) -> u16 {
    addr.parse::<SocketAddr>()
        .unwrap_or_else(|e| panic!("{what} {addr:?}: {e}"))
        .port()
}

/// What a node.toml must say given where it runs: the region, ports, paths
/// under the mounts, peers at their addresses, a schema the image has.
struct Expected<'a> {
    region: &'a str,
    grpc_port: u16,
    metrics_port: u16,
    data_mount: &'a str,
    tls_mount: &'a str,
    peer_address: &'a dyn Fn(&str) -> String,
}

fn check_node_config(path: &Path, expected: &Expected<'_>) {
    let c = node_config(path);
    let what = path.display();
    assert_eq!(c.region.as_deref(), Some(expected.region), "{what}: region");
    assert_eq!(
        port_of(c.listen.as_deref().expect("listen"), "listen"),
        expected.grpc_port,
        "{what}: listen port"
    );
    assert_eq!(
        port_of(c.metrics_listen.as_deref().expect("metrics_listen"), "metrics_listen"),
        expected.metrics_port,
        "{what}: metrics_listen port"
    );
    let data_dir = c.data_dir.as_ref().expect("data_dir");
    assert!(
        data_dir.starts_with(expected.data_mount),
        "{what}: data_dir {} is not on the data volume {}",
        data_dir.display(),
        expected.data_mount
    );
    let tls = c.tls.as_ref().expect("[tls]");
    let tls_file = |p: &Path, file: String| {
        assert_eq!(p, Path::new(expected.tls_mount).join(&file), "{what}: [tls] {file}");
    };
    tls_file(&tls.ca, "ca.pem".into());
    tls_file(&tls.cert, format!("{}.pem", expected.region));
    tls_file(&tls.key, format!("{}.key", expected.region));
    // The image has the schema the config names (the Dockerfile copies
    // deploy/schemas/ to /etc/cascade/schemas/), and the node accepts it.
    let schema = c.schema.as_ref().expect("schema");
    let in_repo = root().join("deploy/schemas").join(
        schema
            .strip_prefix("/etc/cascade/schemas")
            .unwrap_or_else(|_| panic!("{what}: schema {} is not in the image", schema.display())),
    );
    cascade_node::config::load_schema(Some(&in_repo)).unwrap_or_else(|e| panic!("{what}: {e}"));
    let peers: BTreeSet<&str> = c.peers.keys().map(String::as_str).collect();
    let others: BTreeSet<&str> = REGIONS.iter().copied().filter(|r| *r != expected.region).collect();
    assert_eq!(peers, others, "{what}: [peers] lists every other region");
    for (peer, addr) in &c.peers {
        assert_eq!(addr, &(expected.peer_address)(peer), "{what}: [peers] {peer}");
    }
}

#[test]
fn the_dockerfile_runs_as_a_user_with_a_data_volume_and_the_ports_of_the_manifests() {
    let text = read(&root().join("Dockerfile"));
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    assert!(
        lines.iter().filter(|l| l.starts_with("FROM ")).count() >= 2,
        "multi-stage"
    );
    let user = lines.iter().rev().find(|l| l.starts_with("USER ")).expect("USER");
    assert!(!user.contains(" 0") && !user.contains("root"), "{user}");
    assert!(lines.contains(&r#"VOLUME ["/var/lib/cascade"]"#), "data volume");
    assert!(lines.contains(&"EXPOSE 50051 9090"), "gRPC and metrics ports");
    assert!(lines.contains(&"COPY deploy/schemas/ /etc/cascade/schemas/"));
    assert!(lines.contains(&r#"ENTRYPOINT ["/usr/local/bin/cascade"]"#));
}

#[test]
fn the_kubernetes_manifests_agree_with_each_other_and_with_the_node() {
    let k8s = root().join("deploy/kubernetes");
    let base = yaml_one(&k8s.join("base/kustomization.yaml"));
    let resources = strings(&base["resources"], "base resources");
    assert_eq!(resources, ["statefulset.yaml", "service.yaml"]);
    let set = yaml_one(&k8s.join("base/statefulset.yaml"));
    let service = yaml_one(&k8s.join("base/service.yaml"));
    assert_eq!(str_of(&set["kind"], "kind"), "StatefulSet");
    assert_eq!(set["spec"]["replicas"].as_i64(), Some(1), "one node per region");
    assert_eq!(
        str_of(&set["spec"]["serviceName"], "serviceName"),
        str_of(&service["metadata"]["name"], "name")
    );
    assert!(
        service["spec"]["clusterIP"].as_str() == Some("None"),
        "headless Service"
    );

    let pod = &set["spec"]["template"]["spec"];
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
    let annotations = &set["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(
        annotations["prometheus.io/port"].as_str(),
        Some(metrics.to_string().as_str())
    );

    // Mounts: data on the claim template, config from the ConfigMap, TLS
    // from the Secret.
    let mount = |name: &str| {
        str_of(
            &named(&container["volumeMounts"], name, "volumeMounts")["mountPath"],
            name,
        )
        .to_owned()
    };
    let (data_mount, config_mount, tls_mount) = (mount("data"), mount("config"), mount("tls"));
    let claim = &list(&set["spec"]["volumeClaimTemplates"], "claims")[0];
    assert_eq!(claim["metadata"]["name"].as_str(), Some("data"));
    assert_eq!(
        named(&pod["volumes"], "config", "volumes")["configMap"]["name"].as_str(),
        Some("cascade-config")
    );
    let config_file = format!("{config_mount}/node.toml");
    let args = strings(&container["args"], "args");
    assert_eq!(args, ["serve", "--config", config_file.as_str()]);

    // Probes: `cascade health` on the node's own config, about services
    // the node reports on.
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
    }

    for region in REGIONS {
        let overlay = k8s.join("overlays").join(region);
        let k = yaml_one(&overlay.join("kustomization.yaml"));
        assert_eq!(strings(&k["resources"], "resources"), ["../../base"], "{region}");
        assert_eq!(k["nameSuffix"].as_str(), Some(format!("-{region}").as_str()));
        let labels = &list(&k["labels"], "labels")[0]["pairs"];
        assert_eq!(labels["cascade.dev/region"].as_str(), Some(region));
        let generator = named(&k["configMapGenerator"], "cascade-config", "configMapGenerator");
        assert_eq!(strings(&generator["files"], "files"), ["node.toml"]);
        // The Secret's name, set by the patch (it is not suffixed).
        let patch = list(&k["patches"], "patches")
            .iter()
            .flat_map(|p| YamlLoader::load_from_str(str_of(&p["patch"], "patch")).expect("patch is YAML"))
            .find(|p| p["kind"].as_str() == Some("StatefulSet"))
            .expect("a StatefulSet patch");
        let tls = named(&patch["spec"]["template"]["spec"]["volumes"], "tls", "patched volumes");
        assert_eq!(
            tls["secret"]["secretName"].as_str(),
            Some(format!("cascade-tls-{region}").as_str())
        );

        let service_name = str_of(&service["metadata"]["name"], "service name");
        check_node_config(
            &overlay.join("node.toml"),
            &Expected {
                region,
                grpc_port: grpc,
                metrics_port: metrics,
                data_mount: &data_mount,
                tls_mount: &tls_mount,
                // The peer's Service, with its overlay's suffix.
                peer_address: &|peer| format!("https://{service_name}-{peer}:{grpc}"),
            },
        );
    }
}

#[test]
fn the_compose_file_runs_three_regions_with_mutual_tls() {
    let dir = root().join("deploy/compose");
    let compose = yaml_one(&dir.join("compose.yaml"));
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
        ]
    );
    let certs = &compose["services"]["certs"];
    let made = strings(&certs["command"], "certs command").join(" ");
    for region in REGIONS {
        assert!(
            made.contains(region),
            "the certs job issues {region}'s certificate: {made}"
        );
    }
    for region in REGIONS {
        let service = &compose["services"][region];
        assert!(!service.is_badvalue(), "service {region}");
        let volumes = strings(&service["volumes"], "volumes");
        let target = |source: &str| -> String {
            volumes
                .iter()
                .find_map(|v| v.strip_prefix(&format!("{source}:")))
                .map(|rest| rest.trim_end_matches(":ro").to_owned())
                .unwrap_or_else(|| panic!("{region}: no volume from {source}: {volumes:?}"))
        };
        assert_eq!(target(&format!("./{region}.toml")), config_file, "{region}: its config");
        let ports = strings(&service["ports"], "ports");
        let container_port = |p: &str| -> u16 { p.rsplit(':').next().and_then(|p| p.parse().ok()).expect("a port") };
        let grpc = container_port(&ports[0]);
        let metrics = container_port(&ports[1]);
        check_node_config(
            &dir.join(format!("{region}.toml")),
            &Expected {
                region,
                grpc_port: grpc,
                metrics_port: metrics,
                data_mount: &target(&format!("{region}-data")),
                tls_mount: &target("certs"),
                // Compose services are reached by their names.
                peer_address: &|peer| format!("https://{peer}:{grpc}"),
            },
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
