//! `cascade check` over a cluster, and what the CLI reads of a node's
//! configuration file to reach that node (`check --config`, `health
//! --config`).

use std::collections::BTreeMap;

use super::{print_json, TlsArgs};
use crate::check;
use crate::client::{ClientError, ClientTls};
use clap::Args;

/// Which regions `cascade check` reads.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// A region and its node, `REGION=ENDPOINT` (repeatable), e.g.
    /// `ra=http://127.0.0.1:50051`.
    #[arg(long = "region", value_name = "REGION=ENDPOINT")]
    pub regions: Vec<String>,
    /// A node's TOML configuration: its `region` at `listen`, and `[peers]`.
    /// Its `schema` (or the embedded example schema) decides which references
    /// are tracked.
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// The cluster's schema file (overrides the configuration's). Without one
    /// (and without --config), tracked-ness is learned from the rows.
    #[arg(long, value_name = "FILE")]
    pub schema: Option<std::path::PathBuf>,
}

/// The part of a node's configuration file the checker reads.
#[derive(Debug, serde::Deserialize)]
pub(super) struct NodeConfig {
    pub(super) region: Option<String>,
    pub(super) listen: Option<String>,
    pub(super) schema: Option<std::path::PathBuf>,
    #[serde(default)]
    pub(super) peers: BTreeMap<String, PeerAddress>,
    /// The node's identity: with it the checker calls the Peer API as that region.
    pub(super) tls: Option<NodeTlsFiles>,
}

/// A region in `[peers]`: its address, or the addresses of its nodes (any
/// of them answers for the region: a standby forwards to its writer).
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
pub(super) enum PeerAddress {
    One(String),
    Nodes(Vec<String>),
}

impl PeerAddress {
    /// The address the checker dials: the first of the region's nodes.
    fn first(self) -> Option<String> {
        match self {
            PeerAddress::One(address) => Some(address),
            PeerAddress::Nodes(nodes) => nodes.into_iter().next(),
        }
    }
}

#[derive(Debug, serde::Deserialize)]
pub(super) struct NodeTlsFiles {
    pub(super) ca: std::path::PathBuf,
    pub(super) cert: std::path::PathBuf,
    pub(super) key: std::path::PathBuf,
}

/// What `cascade check` reads, and how.
struct CheckTargets {
    regions: Regions,
    schema: Option<cascade_core::Schema>,
    /// From --config's `[tls]`, unless the TLS flags say otherwise.
    tls: Option<ClientTls>,
}

/// The endpoint that dials a node's `listen` address: an unspecified IP
/// (0.0.0.0, ::) is dialed on loopback; port 0 cannot be dialed.
pub(super) fn listen_endpoint(listen: &str, tls: bool) -> Result<String, ClientError> {
    let addr: std::net::SocketAddr = listen
        .parse()
        .map_err(|_| ClientError::Usage(format!("listen {listen:?}: expected an address like 127.0.0.1:50051")))?;
    if addr.port() == 0 {
        return Err(ClientError::Usage(format!(
            "listen {listen:?}: port 0 picks a free port at start, which the configuration does not say; \
             give the node's region with --region REGION=http://HOST:PORT instead"
        )));
    }
    let ip = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    let scheme = if tls { "https" } else { "http" };
    Ok(format!("{scheme}://{}", std::net::SocketAddr::new(ip, addr.port())))
}

/// `(region, endpoint)` pairs.
type Regions = Vec<(String, String)>;

/// The `(region, endpoint)` pairs and the schema `cascade check` uses.
fn check_targets(args: &CheckArgs, tls_args: &TlsArgs) -> Result<CheckTargets, ClientError> {
    let mut tls = tls_args.load()?;
    let mut regions: BTreeMap<String, String> = BTreeMap::new();
    let mut schema_path = args.schema.clone();
    let mut use_example = false;
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ClientError::Usage(format!("cannot read {}: {e}", path.display())))?;
        let config: NodeConfig =
            toml::from_str(&text).map_err(|e| ClientError::Usage(format!("{}: {e}", path.display())))?;
        let region = config
            .region
            .ok_or_else(|| ClientError::Usage(format!("{}: region: is required", path.display())))?;
        let listen = config.listen.as_deref().unwrap_or("127.0.0.1:50051");
        let endpoint = listen_endpoint(listen, config.tls.is_some())
            .map_err(|e| ClientError::Usage(format!("{}: {e}", path.display())))?;
        if let (None, Some(files)) = (&tls, &config.tls) {
            let identity = Some((files.cert.as_path(), files.key.as_path()));
            tls = Some(
                ClientTls::load(&files.ca, identity, None)
                    .map_err(|e| ClientError::Usage(format!("{}: tls: {e}", path.display())))?,
            );
        }
        regions.insert(region, endpoint);
        for (peer, endpoint) in config.peers {
            if let Some(endpoint) = endpoint.first() {
                regions.insert(peer, endpoint);
            }
        }
        if schema_path.is_none() {
            schema_path = config.schema;
            use_example = schema_path.is_none();
        }
    }
    for r in &args.regions {
        let (region, endpoint) = r
            .split_once('=')
            .filter(|(region, endpoint)| !region.is_empty() && !endpoint.is_empty())
            .ok_or_else(|| ClientError::Usage(format!("--region {r:?}: expected REGION=ENDPOINT")))?;
        regions.insert(region.to_owned(), endpoint.to_owned());
    }
    if regions.is_empty() {
        return Err(ClientError::Usage(
            "cascade check: give the regions with --region REGION=ENDPOINT (repeatable) or --config FILE".into(),
        ));
    }
    let schema = match schema_path {
        Some(p) => {
            let text = std::fs::read_to_string(&p)
                .map_err(|e| ClientError::Usage(format!("cannot read schema {}: {e}", p.display())))?;
            Some(
                cascade_core::Schema::from_toml(&text)
                    .map_err(|e| ClientError::Usage(format!("schema {}: {e}", p.display())))?,
            )
        }
        None if use_example => Some(
            cascade_core::Schema::from_toml(cascade_core::schema::EXAMPLE_SCHEMA)
                .map_err(|e| ClientError::Usage(format!("embedded example schema: {e}")))?,
        ),
        None => None,
    };
    Ok(CheckTargets {
        regions: regions.into_iter().collect(),
        schema,
        tls,
    })
}

pub(super) async fn run_check(args: &CheckArgs, tls: &TlsArgs, json: bool) -> Result<i32, ClientError> {
    let targets = check_targets(args, tls)?;
    let report =
        check::check_cluster_with_schema(&targets.regions, targets.schema.as_ref(), targets.tls.as_ref()).await?;
    if json {
        print_json(&serde_json::to_value(&report).unwrap_or_default());
    } else {
        print!("{}", check::report_text(&report));
    }
    Ok(if report.violations.is_empty() { 0 } else { 1 })
}
