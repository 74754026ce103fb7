//! `cascade status` and `cascade health`: what an operator and a probe
//! ask of a running cluster.

use super::node_config::{listen_endpoint, NodeConfig};
use super::{print_json, ClientArgs};
use crate::client::{AdminClient, ClientError, ClientTls};
use crate::render;
use clap::Args;

/// `cascade health`.
#[derive(Debug, Clone, Args)]
pub struct HealthArgs {
    /// Probe the node this configuration describes, instead of --server:
    /// its `listen` address (0.0.0.0 dialed on loopback) with its `[tls]`
    /// CA and identity, expecting its region's certificate. What a probe
    /// inside the node's container runs (deploy/kubernetes).
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// The service to ask about: empty for the node as a whole, or
    /// cascade.v1.Resources, cascade.v1.Peer, cascade.v1.Admin.
    #[arg(long, default_value = "")]
    pub service: String,
}

/// How long `cascade status` waits for the node it asks.
const STATUS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Every region on one screen; exit 1 while a region is unreachable.
pub(super) async fn run_status(args: &ClientArgs, json: bool) -> Result<i32, ClientError> {
    let tls = args.tls.load()?;
    let asked = async {
        let token = args.bearer().map(str::to_owned);
        let client = AdminClient::connect_with(&args.server, tls.as_ref(), token).await?;
        client.cluster_status().await
    };
    // A node that takes the connection and answers nothing (frozen) must
    // not hang the command: the node itself waits 2 s per region.
    let status = tokio::time::timeout(STATUS_TIMEOUT, asked)
        .await
        .map_err(|_| ClientError::Usage(format!("{}: no answer within {STATUS_TIMEOUT:?}", args.server)))??;
    if json {
        print_json(&render::cluster_status_json(&status));
    } else {
        print!("{}", render::cluster_status_text(&status));
    }
    Ok(i32::from(status.regions.iter().any(|r| !r.reachable)))
}

/// How long `cascade health` waits for an answer (a probe's own timeout
/// is usually a second or more above it).
const HEALTH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

pub(super) async fn run_health(health: &HealthArgs, args: &ClientArgs, json: bool) -> Result<i32, ClientError> {
    // Where to dial, and how: resolved before the clock starts.
    let (endpoint, tls, region) = match &health.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ClientError::Usage(format!("cannot read {}: {e}", path.display())))?;
            let config: NodeConfig =
                toml::from_str(&text).map_err(|e| ClientError::Usage(format!("{}: {e}", path.display())))?;
            let listen = config.listen.as_deref().unwrap_or("127.0.0.1:50051");
            let endpoint = listen_endpoint(listen, config.tls.is_some())
                .map_err(|e| ClientError::Usage(format!("{}: {e}", path.display())))?;
            let tls = match &config.tls {
                Some(files) => Some(
                    ClientTls::load(&files.ca, Some((files.cert.as_path(), files.key.as_path())), None)
                        .map_err(|e| ClientError::Usage(format!("{}: tls: {e}", path.display())))?,
                ),
                None => None,
            };
            (endpoint, tls, config.region)
        }
        None => (args.server.clone(), args.tls.load()?, None),
    };
    let request = tonic_health::pb::HealthCheckRequest {
        service: health.service.clone(),
    };
    // One deadline over the connection (a frozen node completes the TCP
    // handshake, and TLS has no timeout of its own) and the call.
    let asked = async {
        let channel = crate::client::connect_channel(&endpoint, tls.as_ref(), region.as_deref()).await?;
        Ok::<_, ClientError>(
            tonic_health::pb::health_client::HealthClient::new(channel)
                .check(request)
                .await?,
        )
    };
    let answer = tokio::time::timeout(HEALTH_TIMEOUT, asked)
        .await
        .map_err(|_| ClientError::Usage(format!("{endpoint}: no health answer within {HEALTH_TIMEOUT:?}")))??;
    let status = tonic_health::pb::health_check_response::ServingStatus::try_from(answer.into_inner().status)
        .unwrap_or(tonic_health::pb::health_check_response::ServingStatus::Unknown);
    if json {
        print_json(&serde_json::json!({ "service": health.service, "status": status.as_str_name() }));
    } else {
        println!("{}", status.as_str_name());
    }
    Ok(i32::from(
        status != tonic_health::pb::health_check_response::ServingStatus::Serving,
    ))
}
