//! The port for calls to other regions: the one way the domain reaches
//! another region's node.
//!
//! [`Peers`] holds one lazily connected channel per peer region. The domain
//! (`node.rs`, `cluster.rs`, `explain.rs`, `status.rs`, the links) calls
//! its typed methods — `lookup`, `attach`, `plan`, `operation_part`,
//! `explain_part`, `region_figures`, `watch`, `release`, `ack`,
//! `check_backrefs`, `keeps_another_target`, `list_deleting` — with core
//! values, and gets back core values, the answers of this module
//! ([`LookupAnswer`], [`WatchedEvent`], [`WatchEnd`], [`ExplainPart`],
//! [`RegionFigures`]) or a [`RemoteError`].
//!
//! Those methods speak protobuf, so they are an inherent impl of [`Peers`]
//! that lives at the wire edge, in `api/peer_client.rs`, with the rule that
//! classifies what came back (`api/forward.rs`). The domain never names
//! anything of `api/`; this module names nothing above it either: it is
//! the channels, the answers and the error, all below the domain.
//!
//! By default a channel dials TCP. Given a [`PeerConnector`], [`Peers::new`]
//! lets it open the byte stream to a peer's address instead: the
//! simulation (`tests/simulation.rs`) passes one that dials turmoil's
//! simulated network, so the same channels, services and links run there
//! unchanged.

mod answers;
mod remote_error;

pub(crate) use answers::{ExplainPart, LookupAnswer, RegionFigures, WatchEnd, WatchedEvent};
pub(crate) use remote_error::{RelayedCode, RelayedStatus, RemoteError};

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use cascade_core::{CoreError, RegionId};
use cascade_tls::NodeTls;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::transport::{Channel, Endpoint, Uri};

/// Bound on one peer call; a peer that does not answer is unavailable.
pub const PEER_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How links between regions dial, ping and decide that a peer is gone
/// (`[links]` in the node's config). One set for the whole node: every
/// channel to a peer and the server's own connections use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkTimings {
    /// One bound on dialling a peer: TCP connect and TLS handshake
    /// together. A peer that accepts TCP but never answers the handshake
    /// (a wedged process, a broken middlebox) fails the dial after this
    /// long and the channel dials again on the next call; unbounded, the
    /// pending handshake held the channel, and every call to the region
    /// failed until a restart.
    pub dial_timeout: Duration,
    /// An HTTP/2 ping after this long without reading anything on a
    /// connection (both ways: channels to peers, and the server's
    /// accepted connections). A connection whose packets vanish (a
    /// partition, a host gone without a reset) otherwise stays "open"
    /// forever. Found by the simulation.
    pub keepalive_interval: Duration,
    /// A ping unanswered this long closes the connection. Generous on
    /// purpose: on a slow link that is busy moving bytes the answer queues
    /// behind them, and closing a healthy connection there turned forwarded
    /// calls that were applied into UNAVAILABLE. A dead peer is noticed
    /// sooner by [`LinkTimings::silence_timeout`].
    pub keepalive_timeout: Duration,
    /// A link that hears nothing from its peer this long (no event, no
    /// heartbeat: the peer's watch stream sends one every
    /// [`WATCH_HEARTBEAT`] while it has nothing else) reads down, in
    /// `cascade status` and the metrics, and dials again.
    pub silence_timeout: Duration,
}

/// How often a peer's watch stream says it is alive while it has no
/// event to send (`PeerEvent.heartbeat`).
pub const WATCH_HEARTBEAT: Duration = Duration::from_secs(1);

impl Default for LinkTimings {
    fn default() -> Self {
        Self {
            dial_timeout: Duration::from_secs(3),
            keepalive_interval: Duration::from_secs(5),
            keepalive_timeout: Duration::from_secs(20),
            silence_timeout: Duration::from_secs(5),
        }
    }
}

/// A byte stream to a peer, as a [`PeerConnector`] opens it.
pub trait PeerIo: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> PeerIo for T {}

/// What a [`PeerConnector`] returns.
pub type PeerConnecting = Pin<Box<dyn Future<Output = std::io::Result<Box<dyn PeerIo>>> + Send>>;

/// Opens the connection to a peer's address (the URI of its `[peers]`
/// entry) in place of TCP. Called again whenever the channel reconnects.
pub type PeerConnector = Arc<dyn Fn(Uri) -> PeerConnecting + Send + Sync>;

/// The other regions' nodes, one lazily connected channel each.
#[derive(Clone)]
pub struct Peers {
    /// Region → channel to its node. Immutable after start.
    channels: Arc<BTreeMap<String, Channel>>,
    /// Largest message either way; the same limit the node's server enforces.
    pub(crate) max_message_bytes: usize,
}

#[derive(Debug, thiserror::Error)]
#[error("peer {region}: invalid address {addr:?}: {message}")]
pub struct PeerAddressError {
    pub region: String,
    pub addr: String,
    pub message: String,
}

impl Peers {
    /// With `tls`, each channel presents this node's certificate and accepts
    /// only a server certificate naming the region it is listed as. With
    /// `connector`, connections are opened by it instead of TCP (a simulated
    /// network); TLS, when on, runs over whatever it opens.
    pub fn new(
        peers: &BTreeMap<RegionId, String>,
        tls: Option<&NodeTls>,
        connector: Option<PeerConnector>,
        timings: LinkTimings,
        max_message_bytes: usize,
    ) -> Result<Self, PeerAddressError> {
        let mut channels = BTreeMap::new();
        for (region, addr) in peers {
            let invalid = |message: String| PeerAddressError {
                region: region.to_string(),
                addr: addr.clone(),
                message,
            };
            let mut endpoint = Endpoint::from_shared(addr.clone()).map_err(|e| invalid(e.to_string()))?;
            if let Some(tls) = tls {
                endpoint = endpoint
                    .tls_config(tls.peer_client_config(region.as_str()))
                    .map_err(|e| invalid(e.to_string()))?;
            }
            let endpoint = endpoint
                .connect_timeout(timings.dial_timeout)
                .http2_keep_alive_interval(timings.keepalive_interval)
                .keep_alive_timeout(timings.keepalive_timeout)
                .keep_alive_while_idle(true);
            // Always through a connector of our own: tonic bounds its
            // built-in TCP dial by `connect_timeout` but not the TLS
            // handshake after it, while a custom connector is wrapped,
            // TLS included, in one timeout (tonic's `Endpoint::
            // connect_with_connector_lazy`), so a tarpit cannot hold the
            // channel.
            let connect: PeerConnector = connector.clone().unwrap_or_else(|| Arc::new(dial_tcp));
            let channel = endpoint.connect_with_connector_lazy(tower::service_fn(move |uri: Uri| {
                let connecting = connect(uri);
                async move { connecting.await.map(hyper_util::rt::TokioIo::new) }
            }));
            channels.insert(region.to_string(), channel);
        }
        Ok(Self {
            channels: Arc::new(channels),
            max_message_bytes,
        })
    }

    /// The peers' regions, in name order.
    pub fn regions(&self) -> impl Iterator<Item = &str> {
        self.channels.keys().map(String::as_str)
    }

    /// Whether `region` is a peer of this node.
    pub fn knows(&self, region: &str) -> bool {
        self.channels.contains_key(region)
    }

    /// The channel to `region`'s node; UNAVAILABLE for a region that is not a peer.
    pub(crate) fn channel(&self, region: &str) -> Result<Channel, CoreError> {
        self.channels
            .get(region)
            .cloned()
            .ok_or_else(|| CoreError::RegionUnavailable {
                region: region.to_owned(),
                reason: "not a peer of this node (see [peers] in its config)".into(),
            })
    }
}

/// The default dial: TCP to the address's host and port, without Nagle
/// (peer calls are small request/answer exchanges).
fn dial_tcp(uri: Uri) -> PeerConnecting {
    Box::pin(async move {
        let host = uri
            .host()
            .unwrap_or("localhost")
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
            Some("https") => 443,
            _ => 80,
        });
        let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
        stream.set_nodelay(true)?;
        Ok(Box::new(stream) as Box<dyn PeerIo>)
    })
}
