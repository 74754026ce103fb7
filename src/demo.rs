//! `cascade demo`: three region nodes in one process on loopback, each on
//! an embedded sled (or, with `--storage-engine fjall`, fjall) in a
//! temporary directory, the example schema, a
//! Neutron-like topology with references across the regions, and what to
//! try next. Every region requires authentication (`[auth] mode =
//! "required"`) with two identities: an administrator and a user the
//! example policy limits, whose tokens are made fresh every run.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use cascade_client::Client;
use cascade_core::{RegionId, Schema};
use cascade_node::auth::{AuthMode, AuthSettings};
use cascade_node::store::StorageEngine;
use cascade_node::{NodeSettings, RunningNode};
use cascade_proto::v1;
use cascade_tls::DevPki;

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Address of the first region's node; when taken, a free port is used
    /// instead. The other regions take free ports.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: String,
    /// Keep the data here instead of a temporary directory.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Storage engine of the nodes: sled or fjall.
    #[arg(long, env = "CASCADE_STORAGE_ENGINE", value_name = "ENGINE", default_value_t = StorageEngine::Sled)]
    storage_engine: StorageEngine,
    /// Set up, print, and exit instead of serving until Ctrl-C (for scripts).
    #[arg(long)]
    no_wait: bool,
    /// Serve without TLS (by default the demo's nodes use mutual TLS with a
    /// freshly generated development CA, written next to the data).
    #[arg(long)]
    plaintext: bool,
}

/// The demo's regions; the first serves on `--listen`.
pub const DEMO_REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

/// The shell variable the demo exports for a region's address
/// (`DEMO_EU_WEST`), which the README tour's `cascade check` uses.
fn demo_variable(region: &str) -> String {
    format!("DEMO_{}", region.to_ascii_uppercase().replace('-', "_"))
}

/// One of the demo's identities: a static token's principal and group,
/// and the shell variable its token is exported as.
struct DemoIdentity {
    principal: &'static str,
    group: &'static str,
    variable: &'static str,
    /// What the policy lets it do, in a few words (printed).
    may: &'static str,
}

/// The administrator: its token is `CASCADE_TOKEN`, so every command of the
/// tour runs as it unless told otherwise (`cascade admin` included: the
/// demo has no separate `[admin] token`, which `required` refuses).
const DEMO_ADMIN: DemoIdentity = DemoIdentity {
    principal: "admin",
    group: "admins",
    variable: "CASCADE_TOKEN",
    may: "may do everything",
};

/// A user the example policy limits: a network administrator, who may
/// delete networks and subnets but not ports (so not a cascade reaching
/// one, which the tour shows).
const DEMO_USER: DemoIdentity = DemoIdentity {
    principal: "alice",
    group: "net-admins",
    variable: "ALICE_TOKEN",
    may: "may delete networks and subnets, not ports",
};

/// The policy every region of the demo decides with: the shipped example,
/// as it is, so the tour shows what a user copies.
const DEMO_POLICY: &str = include_str!("../deploy/auth/policy.cedar");

/// Writes the demo's tokens file (fresh random tokens, stored as their
/// SHA-256 as `cascade auth hash-token` prints them) and its policy under
/// `dir`; the authentication every region requires, and each identity's
/// token.
fn write_identities(dir: &std::path::Path) -> Result<(AuthSettings, Vec<(DemoIdentity, String)>)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tokens_toml =
        String::from("# cascade demo's static tokens (made fresh every run; only their hashes are here)\n");
    let mut identities = Vec::new();
    for identity in [DEMO_ADMIN, DEMO_USER] {
        let token = cascade_client::cli::random_token()?;
        tokens_toml +=
            &cascade_client::cli::token_entry(&token, identity.principal, &[identity.group.to_owned()], false);
        identities.push((identity, token));
    }
    let tokens_file = dir.join("tokens.toml");
    std::fs::write(&tokens_file, tokens_toml).with_context(|| format!("writing {}", tokens_file.display()))?;
    let policy_file = dir.join("policy.cedar");
    std::fs::write(&policy_file, DEMO_POLICY).with_context(|| format!("writing {}", policy_file.display()))?;
    let auth = AuthSettings {
        mode: AuthMode::Required,
        tokens_file: Some(tokens_file),
        policy_file: Some(policy_file),
        ..AuthSettings::default()
    };
    Ok((auth, identities))
}

/// The finalizer of `eu-west/project/legacy`: the tour plays its controller.
const DEMO_FINALIZER: &str = "billing.example.com/close-account";

/// Attempts before a held deletion is FAILED in the demo (20 by default):
/// the tour reaches FAILED, and an administrator's retry, in three steps.
const DEMO_MAX_ATTEMPTS: u32 = 3;

fn spec(name: &str, attrs: &[(&str, &str)], refs: &[(&str, &[&str])]) -> v1::ResourceSpec {
    v1::ResourceSpec {
        name: name.to_owned(),
        attributes: attrs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        refs: refs
            .iter()
            .map(|(field, targets)| v1::ReferenceField {
                field: field.to_string(),
                targets: targets
                    .iter()
                    .map(|t| v1::ObjectRef {
                        name: t.to_string(),
                        ..Default::default()
                    })
                    .collect(),
            })
            .collect(),
        finalizers: Vec::new(),
    }
}

/// The seed 001 topology spread over three regions, created in batches
/// (one region per batch, in dependency order):
/// - eu-west owns the project, the networks, subnets and a router;
/// - us-east has the ports (on eu-west's network), a trunk and subports;
/// - ap-south has a floating IP on a us-east port (unset), a port group of
///   us-east ports (list owner), and a router whose gateway is eu-west's
///   external network (block).
pub fn topology() -> Vec<(&'static str, Vec<v1::ResourceSpec>)> {
    let mut ports = Vec::new();
    for i in 1..=6 {
        let subnet = if i % 2 == 0 {
            "eu-west/subnet/net1-a"
        } else {
            "eu-west/subnet/net1-b"
        };
        ports.push(spec(
            &format!("us-east/port/p{i}"),
            &[("mac", &format!("fa:16:3e:00:00:0{i}"))],
            &[
                ("network", &["eu-west/network/net1"]),
                ("subnet", &[subnet]),
                ("security_groups", &["eu-west/security_group/web"]),
            ],
        ));
    }
    vec![
        (
            "eu-west",
            vec![
                spec("eu-west/project/demo", &[("owner", "alice")], &[]),
                // An external cleanup its purge waits for (README: finalizer
                // controllers, and the admin tour).
                v1::ResourceSpec {
                    finalizers: vec![DEMO_FINALIZER.to_owned()],
                    ..spec("eu-west/project/legacy", &[("owner", "bob")], &[])
                },
                spec(
                    "eu-west/security_group/web",
                    &[],
                    &[("project", &["eu-west/project/demo"])],
                ),
                spec(
                    "eu-west/network/net1",
                    &[("cidr", "10.0.0.0/16")],
                    &[("project", &["eu-west/project/demo"])],
                ),
                spec(
                    "eu-west/subnet/net1-a",
                    &[("cidr", "10.0.1.0/24")],
                    &[("network", &["eu-west/network/net1"])],
                ),
                spec(
                    "eu-west/subnet/net1-b",
                    &[("cidr", "10.0.2.0/24")],
                    &[("network", &["eu-west/network/net1"])],
                ),
                spec("eu-west/router/r1", &[], &[("project", &["eu-west/project/demo"])]),
                spec(
                    "eu-west/router_interface/r1-a",
                    &[],
                    &[
                        ("router", &["eu-west/router/r1"]),
                        ("subnet", &["eu-west/subnet/net1-a"]),
                    ],
                ),
                spec(
                    "eu-west/network/ext",
                    &[("external", "true")],
                    &[("project", &["eu-west/project/demo"])],
                ),
            ],
        ),
        ("us-east", ports),
        (
            "us-east",
            vec![
                spec("us-east/trunk/t1", &[], &[("parent_port", &["us-east/port/p1"])]),
                spec(
                    "us-east/subport/t1-s2",
                    &[("vlan", "102")],
                    &[("trunk", &["us-east/trunk/t1"]), ("port", &["us-east/port/p2"])],
                ),
                spec(
                    "us-east/subport/t1-s3",
                    &[("vlan", "103")],
                    &[("trunk", &["us-east/trunk/t1"]), ("port", &["us-east/port/p3"])],
                ),
            ],
        ),
        (
            "ap-south",
            vec![
                spec("ap-south/project/ops", &[("owner", "bob")], &[]),
                spec(
                    "ap-south/floating_ip/fip1",
                    &[("address", "203.0.113.10")],
                    &[("project", &["ap-south/project/ops"]), ("port", &["us-east/port/p4"])],
                ),
                spec(
                    "ap-south/port_group/web-ports",
                    &[],
                    &[("ports", &["us-east/port/p5", "us-east/port/p6"])],
                ),
                spec(
                    "ap-south/router/edge",
                    &[],
                    &[
                        ("project", &["ap-south/project/ops"]),
                        ("gateway_network", &["eu-west/network/ext"]),
                    ],
                ),
            ],
        ),
    ]
}

pub async fn run(args: DemoArgs) -> Result<()> {
    let (data_root, _temp) = match args.data_dir {
        Some(d) => (d, None),
        None => {
            let t = tempfile::tempdir().context("cannot create a temporary directory")?;
            (t.path().to_owned(), Some(t))
        }
    };
    // Bind every listener first, so each node knows every peer's address.
    let mut listeners = Vec::new();
    let first = match tokio::net::TcpListener::bind(&args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("note: {} is not available ({e}); using a free port", args.listen);
            tokio::net::TcpListener::bind("127.0.0.1:0").await?
        }
    };
    listeners.push(first);
    for _ in 1..DEMO_REGIONS.len() {
        listeners.push(tokio::net::TcpListener::bind("127.0.0.1:0").await?);
    }
    let pki = if args.plaintext {
        None
    } else {
        let pki = DevPki::generate(&DEMO_REGIONS).context("generating the demo's certificates")?;
        pki.write(&data_root.join("certs"))?;
        Some(pki)
    };
    let scheme = if pki.is_some() { "https" } else { "http" };
    let endpoints: Vec<String> = listeners
        .iter()
        .map(|l| l.local_addr().map(|a| format!("{scheme}://{a}")))
        .collect::<std::io::Result<_>>()?;
    let schema = Arc::new(Schema::from_toml(cascade_core::schema::EXAMPLE_SCHEMA)?);
    // The same identities and policy for the three regions: a call
    // forwarded without TLS carries the caller's token to the next node,
    // which checks it again.
    let auth_dir = data_root.join("auth");
    let (auth, identities) = write_identities(&auth_dir)?;
    let mut nodes = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let region = RegionId::parse(DEMO_REGIONS[i])?;
        let mut settings = NodeSettings::new(region, schema.clone(), Some(data_root.join(DEMO_REGIONS[i])));
        settings.check_interval = std::time::Duration::from_secs(5);
        settings.engine = args.storage_engine;
        settings.policy.max_attempts = DEMO_MAX_ATTEMPTS;
        settings.auth = auth.clone();
        // Prometheus metrics on a free port each (printed below).
        settings.metrics_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
        // The web console on a free port each (printed below).
        settings.console_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
        if let Some(pki) = &pki {
            settings.tls = Some(pki.node_tls(DEMO_REGIONS[i])?);
        }
        for (j, peer) in DEMO_REGIONS.iter().enumerate() {
            if j != i {
                settings
                    .peers
                    .insert(RegionId::parse(peer)?, endpoints[j].clone().into());
            }
        }
        nodes.push(RunningNode::start(settings, listener).await?);
    }
    // The example data is created by the administrator.
    let admin_token = identities
        .iter()
        .find(|(identity, _)| identity.principal == DEMO_ADMIN.principal)
        .map(|(_, token)| token.as_str())
        .context("the demo's administrator")?;
    let client = Client::connect_with(&endpoints[0], pki.as_ref().map(DevPki::client).as_ref())
        .await?
        .with_token(admin_token)?;
    let mut created = 0;
    for (region, batch) in topology() {
        let n = batch.len();
        // Any node forwards a request to the owning region.
        client
            .batch_create(batch)
            .await
            .with_context(|| format!("creating the example data of {region}"))?;
        created += n;
    }

    let endpoint = &endpoints[0];
    println!("Cascade demo: three regions on loopback, {created} resources (schema deploy/schemas/neutron.toml)");
    for (region, ep) in DEMO_REGIONS.iter().zip(&endpoints) {
        println!("  {region:<9} {ep}");
    }
    println!("Prometheus metrics:");
    for (region, node) in DEMO_REGIONS.iter().zip(&nodes) {
        if let Some(addr) = node.metrics_addr() {
            println!("  {region:<9} http://{addr}/metrics");
        }
    }
    println!("Web console (sign in with a token below; README, \"The console\"):");
    for (region, node) in DEMO_REGIONS.iter().zip(&nodes) {
        if let Some(url) = node.console_url() {
            println!("  {region:<9} {url}");
        }
    }
    if pki.is_some() {
        println!("  (HTTPS with the region's certificate from the demo's CA: a browser warns unless it trusts ca.pem)");
    }
    println!(
        "data: {} ({})
",
        data_root.display(),
        args.storage_engine
    );
    let certs = data_root.join("certs");
    match &pki {
        Some(_) => println!(
            "Mutual TLS between the regions (development CA in {}; --plaintext turns it off).\n",
            certs.display()
        ),
        None => println!("Plain text (without --plaintext the nodes use mutual TLS).\n"),
    }
    println!(
        "Authentication required, with two identities (static tokens, fresh every run, in {}; \
         the policy is deploy/auth/policy.cedar, copied there):",
        auth_dir.display()
    );
    for (identity, _) in &identities {
        println!(
            "  {:<6} group {:<11} {} ({})",
            identity.principal, identity.group, identity.may, identity.variable
        );
    }
    println!();
    println!("Any node accepts any request and forwards it to the owning region. In another terminal:");
    println!("  alias cascade='cargo run --release -q --'");
    println!("  export CASCADE_SERVER={endpoint}");
    if pki.is_some() {
        println!("  export CASCADE_CA_CERT={}", certs.join("ca.pem").display());
    }
    for (identity, token) in &identities {
        println!("  export {}={token}", identity.variable);
    }
    // What the tour's `cascade check` line names: every region's address
    // and, with TLS, the directory of the region certificates it presents.
    for (region, ep) in DEMO_REGIONS.iter().zip(&endpoints) {
        println!("  export {}={ep}", demo_variable(region));
    }
    if pki.is_some() {
        println!("  export DEMO_CERTS={}", certs.display());
    }
    println!("then follow README.md, \"A five-minute tour\" (CI runs it against this demo), e.g.:");
    println!("  cascade status                                     # every region: reachable, lag, deletions");
    println!("  cascade list --kind port --all-regions             # the ports, in us-east");
    println!("  cascade tree eu-west/network/net1                  # what a cascade of net1 would reach");
    println!(
        "  cascade --token ${} delete eu-west/network/net1 --cascade  # as {}: refused, it reaches ports",
        DEMO_USER.variable, DEMO_USER.principal
    );
    println!(
        "  cascade delete eu-west/network/net1 --cascade --wait               # as {}: done",
        DEMO_ADMIN.principal
    );
    println!(
        "A finalizer controller's failures, and an administrator: the demo gives up on a deletion after \
         {DEMO_MAX_ATTEMPTS} attempts (eu-west/project/legacy waits for {DEMO_FINALIZER})."
    );
    if !args.no_wait {
        println!("\nCtrl-C stops the demo (a temporary data directory is removed).");
        crate::shutdown_signal().await;
    }
    for node in nodes {
        node.stop().await?;
    }
    Ok(())
}
