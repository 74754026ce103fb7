//! `cascade demo`: a node on an embedded sled in a temporary directory, the
//! example schema, a small Neutron-like topology, and what to try next.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use cascade_client::Client;
use cascade_core::{RegionId, Schema};
use cascade_node::{NodeSettings, RunningNode};
use cascade_proto::v1;

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Address to serve on; when taken, a free port is used instead.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: String,
    /// Keep the data here instead of a temporary directory.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Set up, print, and exit instead of serving until Ctrl-C (for scripts).
    #[arg(long)]
    no_wait: bool,
}

pub const DEMO_REGION: &str = "eu-west";

fn spec(name: &str, attrs: &[(&str, &str)], refs: &[(&str, &[&str])]) -> v1::ResourceSpec {
    v1::ResourceSpec {
        name: format!("{DEMO_REGION}/{name}"),
        attributes: attrs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        refs: refs
            .iter()
            .map(|(field, targets)| v1::ReferenceField {
                field: field.to_string(),
                targets: targets
                    .iter()
                    .map(|t| v1::ObjectRef {
                        name: format!("{DEMO_REGION}/{t}"),
                        ..Default::default()
                    })
                    .collect(),
            })
            .collect(),
        finalizers: Vec::new(),
    }
}

/// The seed 001 topology: a network with subnets, ports, a trunk with
/// subports, a router interface, a floating IP, and a blocked network.
pub fn topology() -> Vec<v1::ResourceSpec> {
    let mut out = vec![
        spec("project/demo", &[("owner", "alice")], &[]),
        spec("security_group/web", &[], &[("project", &["project/demo"])]),
        spec(
            "network/net1",
            &[("cidr", "10.0.0.0/16")],
            &[("project", &["project/demo"])],
        ),
        spec(
            "subnet/net1-a",
            &[("cidr", "10.0.1.0/24")],
            &[("network", &["network/net1"])],
        ),
        spec(
            "subnet/net1-b",
            &[("cidr", "10.0.2.0/24")],
            &[("network", &["network/net1"])],
        ),
    ];
    for i in 1..=6 {
        let subnet = if i % 2 == 0 { "subnet/net1-a" } else { "subnet/net1-b" };
        out.push(spec(
            &format!("port/p{i}"),
            &[("mac", &format!("fa:16:3e:00:00:0{i}"))],
            &[
                ("network", &["network/net1"]),
                ("subnet", &[subnet]),
                ("security_groups", &["security_group/web"]),
            ],
        ));
    }
    out.extend([
        spec("trunk/t1", &[], &[("parent_port", &["port/p1"])]),
        spec(
            "subport/t1-s2",
            &[("vlan", "102")],
            &[("trunk", &["trunk/t1"]), ("port", &["port/p2"])],
        ),
        spec(
            "subport/t1-s3",
            &[("vlan", "103")],
            &[("trunk", &["trunk/t1"]), ("port", &["port/p3"])],
        ),
        spec("router/r1", &[], &[("project", &["project/demo"])]),
        spec(
            "router_interface/r1-a",
            &[],
            &[("router", &["router/r1"]), ("subnet", &["subnet/net1-a"])],
        ),
        spec(
            "floating_ip/fip1",
            &[("address", "203.0.113.10")],
            &[("project", &["project/demo"]), ("port", &["port/p4"])],
        ),
        spec("port_group/web-ports", &[], &[("ports", &["port/p5", "port/p6"])]),
        // A second network, used as a router gateway: deleting it is blocked.
        spec(
            "network/ext",
            &[("external", "true")],
            &[("project", &["project/demo"])],
        ),
        spec(
            "router/edge",
            &[],
            &[("project", &["project/demo"]), ("gateway_network", &["network/ext"])],
        ),
    ]);
    out
}

pub async fn run(args: DemoArgs) -> Result<()> {
    let (data_dir, _temp) = match args.data_dir {
        Some(d) => (d, None),
        None => {
            let t = tempfile::tempdir().context("cannot create a temporary directory")?;
            (t.path().to_owned(), Some(t))
        }
    };
    let listener = match tokio::net::TcpListener::bind(&args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("note: {} is not available ({e}); using a free port", args.listen);
            tokio::net::TcpListener::bind("127.0.0.1:0").await?
        }
    };
    let schema = Schema::from_toml(cascade_core::schema::EXAMPLE_SCHEMA)?;
    let region = RegionId::parse(DEMO_REGION)?;
    let settings = NodeSettings::new(region, Arc::new(schema), Some(data_dir.clone()));
    let node = RunningNode::start(settings, listener).await?;
    let endpoint = node.endpoint();
    let client = Client::connect(&endpoint).await?;
    let created = client.batch_create(topology()).await?;

    let exe = "cargo run --release --";
    println!("Cascade demo: region {DEMO_REGION} serving on {endpoint}");
    println!(
        "data: {} ({} resources created from deploy/schemas/neutron.toml)\n",
        data_dir.display(),
        created.len()
    );
    println!("Try, in another terminal:");
    println!("  export CASCADE_SERVER={endpoint}");
    println!("  {exe} list");
    println!("  {exe} get {DEMO_REGION}/network/net1");
    println!("  {exe} delete {DEMO_REGION}/network/net1                      # refused: lists its dependents");
    println!("  {exe} delete {DEMO_REGION}/network/net1 --cascade --dry-run  # what a cascade would do");
    println!("  {exe} delete {DEMO_REGION}/network/net1 --cascade --wait     # do it, with progress");
    println!("  {exe} get {DEMO_REGION}/floating_ip/fip1                     # survived: its port reference was unset");
    println!("  {exe} delete {DEMO_REGION}/network/ext --cascade             # refused: router/edge blocks it");
    println!("  {exe} watch --from 1                                      # every event, from the start");
    if args.no_wait {
        node.stop().await?;
        return Ok(());
    }
    println!("\nCtrl-C stops the demo (its data directory is removed).");
    crate::shutdown_signal().await;
    node.stop().await?;
    Ok(())
}
