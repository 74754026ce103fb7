//! The port for calls to other regions: the one way the domain reaches
//! another region's node.
//!
//! [`Peers`] holds one lazily connected channel per peer region. The domain
//! (`node.rs`, `cluster.rs`, `explain.rs`, `status.rs`, the links) calls
//! its typed methods — `lookup`, `attach`, `plan`, `operation_part`,
//! `explain_part`, `region_figures`, `watch`, `release`, `ack`,
//! `check_backrefs`, `keeps_another_target`, `list_deleting` — with core
//! values (and, for a call made for a client, its [`Deadline`]), and gets
//! back core values, the answers of this module
//! ([`LookupAnswer`], [`WatchedEvent`], [`WatchEnd`], [`ExplainPart`],
//! [`RegionFigures`]) or a [`RemoteError`].
//!
//! Those methods speak protobuf, so they are an inherent impl of [`Peers`]
//! that lives at the wire edge, in `api/peer_client.rs`, with the rule that
//! classifies what came back (`api/forward.rs`). The domain never names
//! anything of `api/`; this module names nothing above it either: it is
//! the channels, the answers and the error, all below the domain.
//!
//! Each region is given as one or more addresses (its nodes: a writer and
//! standbys that forward to it, see [`PeerAddresses`]); its channel dials
//! them in turn, the one that answered last first, the next one as soon as
//! that one fails or a moment later if it has not connected yet
//! ([`NEXT_ADDRESS_AFTER`]), so a node that is down costs a dial that
//! much at most, not a call's deadline.
//!
//! Every call through a channel announces this node's protocol version
//! (`cascade_proto::PROTOCOL_VERSION_HEADER`) and records the version the
//! region's answer announces ([`Peers::version_of`]): a region not heard
//! from yet counts as the oldest, and what an older region cannot handle
//! is not relied on (`api/peer.rs`'s Watch, `admin.rs`'s force purge).
//!
//! By default a channel dials TCP. Given a [`PeerConnector`], [`Peers::new`]
//! lets it open the byte stream to a peer's address instead: the
//! simulation (`tests/simulation.rs`) passes one that dials turmoil's
//! simulated network, so the same channels, services and links run there
//! unchanged.

mod answers;
mod deadline;
mod remote_error;

/// The most nodes of one region a status lists (the rest are left out).
pub(crate) const MAX_REGION_NODES: usize = 32;

pub(crate) use answers::{
    ControlAction, ControlToDeliver, ExplainPart, LookupAnswer, RegionFigures, RegionNode, WatchEnd, Watched,
    WatchedEvent,
};
pub(crate) use deadline::{answer_margin, still_awaited, Deadline};
pub(crate) use remote_error::{RelayedCode, RelayedStatus, RemoteError};

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use cascade_core::{CoreError, RegionId};
use cascade_proto::{announced_version, OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION_HEADER};
use cascade_tls::NodeTls;
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::transport::{Channel, Endpoint, Uri};

/// The most addresses one region may be given in `[peers]` (its nodes).
pub const MAX_PEER_ADDRESSES: usize = 16;

/// How long a dial waits for one address of a region before it also
/// tries the next (the earlier attempt goes on: the first to connect
/// wins). Short: a node that is down must not hold the region's calls.
pub const NEXT_ADDRESS_AFTER: Duration = Duration::from_millis(250);

/// The addresses of one peer region's nodes (`[peers]`: a string, or a
/// list of at most [`MAX_PEER_ADDRESSES`]): never empty. Any node of the
/// region that answers will do: a standby forwards every call to the
/// region's writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAddresses(Vec<String>);

/// Why a list of addresses is not a region's addresses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerAddressesError {
    #[error("a region needs at least one address")]
    Empty,
    #[error("at most {MAX_PEER_ADDRESSES} addresses per region, not {0}")]
    TooMany(usize),
}

impl PeerAddresses {
    /// The addresses, in the order they are tried first.
    pub fn new(addresses: Vec<String>) -> Result<Self, PeerAddressesError> {
        match addresses.len() {
            0 => Err(PeerAddressesError::Empty),
            n if n > MAX_PEER_ADDRESSES => Err(PeerAddressesError::TooMany(n)),
            _ => Ok(Self(addresses)),
        }
    }

    /// The addresses, in the order of the config.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    /// The same region at other addresses (a test routing through proxies).
    pub fn map(self, f: impl FnMut(String) -> String) -> Self {
        Self(self.0.into_iter().map(f).collect())
    }
}

/// One address.
impl From<String> for PeerAddresses {
    fn from(address: String) -> Self {
        Self(vec![address])
    }
}

impl From<&str> for PeerAddresses {
    fn from(address: &str) -> Self {
        Self(vec![address.to_owned()])
    }
}

/// The addresses joined by ", " (`cascade status`).
impl std::fmt::Display for PeerAddresses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join(", "))
    }
}

/// Bound on one peer call; a peer that does not answer is unavailable. A
/// call made for a client's request is bounded by what is left of that
/// client's deadline when that is shorter ([`Deadline`]).
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
    /// Region → channel to its nodes. Immutable after start.
    channels: Arc<BTreeMap<String, AnnouncingChannel>>,
    /// Largest message either way; the same limit the node's server enforces.
    pub(crate) max_message_bytes: usize,
    /// The protocol version this node announces (and behaves as).
    pub(crate) own_version: u32,
}

tokio::task_local! {
    /// Headers every call made on a peer's channel carries while a client's
    /// call is being handled: the caller this node vouches for (set by the
    /// wire edge's authentication layer, `api/authn.rs`).
    static CARRIED: (http::HeaderName, http::HeaderValue);
}

/// Runs `work` with every call it makes on a peer's channel carrying
/// `header` (the vouched caller); `None` carries nothing.
pub(crate) async fn carrying<F: Future>(header: Option<(http::HeaderName, http::HeaderValue)>, work: F) -> F::Output {
    match header {
        Some(header) => CARRIED.scope(header, work).await,
        None => work.await,
    }
}

/// A channel to a region's nodes that announces this node's protocol
/// version on every call and records the version every answer announces.
#[derive(Clone)]
pub(crate) struct AnnouncingChannel {
    inner: Channel,
    own_version: http::HeaderValue,
    /// The version the region last announced; 0: none heard yet.
    heard: Arc<AtomicU32>,
}

impl tower::Service<http::Request<tonic::body::Body>> for AnnouncingChannel {
    type Response = http::Response<tonic::body::Body>;
    type Error = tonic::transport::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        // Kept when already set: a call relayed unchanged (a standby
        // forwarding to its writer) speaks for the node that made it.
        request
            .headers_mut()
            .entry(PROTOCOL_VERSION_HEADER)
            .or_insert_with(|| self.own_version.clone());
        // Replacing whatever a relayed request brought: only this node's
        // own authentication layer decides whom it vouches for.
        if let Ok((name, value)) = CARRIED.try_with(Clone::clone) {
            request.headers_mut().insert(name, value);
        }
        let heard = self.heard.clone();
        let answer = tower::Service::call(&mut self.inner, request);
        Box::pin(async move {
            let answer = answer.await?;
            if let Some(version) =
                announced_version(answer.headers().get(PROTOCOL_VERSION_HEADER).map(|v| v.as_bytes()))
            {
                heard.store(version, Ordering::Relaxed);
            }
            Ok(answer)
        })
    }
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
    ///
    /// `own_version` is the protocol version this node announces
    /// (`cascade_proto::PROTOCOL_VERSION` but in a test of mixed versions).
    pub fn new(
        peers: &BTreeMap<RegionId, PeerAddresses>,
        tls: Option<&NodeTls>,
        connector: Option<PeerConnector>,
        timings: LinkTimings,
        max_message_bytes: usize,
        own_version: u32,
    ) -> Result<Self, PeerAddressError> {
        let mut channels = BTreeMap::new();
        for (region, addresses) in peers {
            let invalid = |addr: &str, message: String| PeerAddressError {
                region: region.to_string(),
                addr: addr.to_owned(),
                message,
            };
            let mut uris = Vec::with_capacity(addresses.as_slice().len());
            for addr in addresses.as_slice() {
                uris.push(addr.parse::<Uri>().map_err(|e| invalid(addr, e.to_string()))?);
            }
            let addr = addresses.as_slice().first().cloned().unwrap_or_default();
            let invalid = |message: String| invalid(&addr, message);
            // The endpoint's own address is only the channel's authority
            // and scheme; the connector below dials every address (not
            // tonic's `Channel::balance_list`: it dials with each
            // endpoint's own connector, without the bound on the TLS
            // handshake below, and not over a simulation's network).
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
            let uris: Arc<[Uri]> = uris.into();
            let answered_last = Arc::new(AtomicUsize::new(0));
            let channel = endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let connecting = dial_in_turn(connect.clone(), uris.clone(), answered_last.clone());
                async move { connecting.await.map(hyper_util::rt::TokioIo::new) }
            }));
            channels.insert(
                region.to_string(),
                AnnouncingChannel {
                    inner: channel,
                    own_version: http::HeaderValue::from(own_version),
                    heard: Arc::new(AtomicU32::new(0)),
                },
            );
        }
        Ok(Self {
            channels: Arc::new(channels),
            max_message_bytes,
            own_version,
        })
    }

    /// The protocol version `region` last announced; None: not heard from
    /// since this node started (or it announces none: a node before
    /// version 2).
    pub fn version_of(&self, region: &str) -> Option<u32> {
        self.channels
            .get(region)
            .map(|c| c.heard.load(Ordering::Relaxed))
            .filter(|v| *v > 0)
    }

    /// Whether `region` is known to speak at least protocol `version`: a
    /// region not heard from counts as the oldest.
    pub fn speaks_at_least(&self, region: &str, version: u32) -> bool {
        self.version_of(region).unwrap_or(OLDEST_PROTOCOL_VERSION) >= version
    }

    /// `region` announced `version` in a call it made on this node.
    pub(crate) fn heard_from(&self, region: &str, version: u32) {
        if let Some(c) = self.channels.get(region) {
            c.heard.store(version, Ordering::Relaxed);
        }
    }

    /// The peers' regions, in name order.
    pub fn regions(&self) -> impl Iterator<Item = &str> {
        self.channels.keys().map(String::as_str)
    }

    /// Whether `region` is a peer of this node.
    pub fn knows(&self, region: &str) -> bool {
        self.channels.contains_key(region)
    }

    /// The channel to `region`'s nodes; UNAVAILABLE for a region that is not a peer.
    pub(crate) fn channel(&self, region: &str) -> Result<AnnouncingChannel, CoreError> {
        self.channels
            .get(region)
            .cloned()
            .ok_or_else(|| CoreError::RegionUnavailable {
                region: region.to_owned(),
                reason: "not a peer of this node (see [peers] in its config)".into(),
            })
    }
}

/// Dials a region's addresses in turn, from the one that connected last:
/// the next attempt starts when the one before failed, or
/// [`NEXT_ADDRESS_AFTER`] after it started if it is still trying (it goes
/// on meanwhile), and the first connection wins. A node that refuses costs
/// nothing, a silent one that pause; the whole dial stays within the
/// channel's dial timeout.
fn dial_in_turn(connect: PeerConnector, uris: Arc<[Uri]>, answered_last: Arc<AtomicUsize>) -> PeerConnecting {
    if uris.len() == 1 {
        return connect(uris[0].clone());
    }
    Box::pin(async move {
        let n = uris.len();
        let first = answered_last.load(Ordering::Relaxed) % n;
        let attempt = |k: usize| {
            let i = (first + k) % n;
            let connecting = connect(uris[i].clone());
            async move { connecting.await.map(|io| (i, io)) }
        };
        let mut attempts = futures::stream::FuturesUnordered::new();
        let mut started = 0;
        let mut last_error = None;
        loop {
            if attempts.is_empty() {
                if started == n {
                    return Err(last_error.unwrap_or_else(|| std::io::Error::other("no address to dial")));
                }
                attempts.push(attempt(started));
                started += 1;
            }
            tokio::select! {
                Some(outcome) = attempts.next() => match outcome {
                    Ok((i, io)) => {
                        answered_last.store(i, Ordering::Relaxed);
                        return Ok(io);
                    }
                    Err(e) => last_error = Some(e),
                },
                () = tokio::time::sleep(NEXT_ADDRESS_AFTER), if started < n => {
                    attempts.push(attempt(started));
                    started += 1;
                }
            }
        }
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A connector over named hosts: `up` connects (an in-memory stream),
    /// `down` refuses at once, `silent` never answers; every dial is noted.
    fn connector(dialled: Arc<std::sync::Mutex<Vec<String>>>) -> PeerConnector {
        Arc::new(move |uri: Uri| {
            let host = uri.host().unwrap_or_default().to_owned();
            let dialled = dialled.clone();
            Box::pin(async move {
                dialled.lock().unwrap().push(host.clone());
                match host.as_str() {
                    "down" => Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
                    "silent" => futures::future::pending().await,
                    _ => Ok(Box::new(tokio::io::duplex(64).0) as Box<dyn PeerIo>),
                }
            })
        })
    }

    fn uris(hosts: &[&str]) -> Arc<[Uri]> {
        hosts.iter().map(|h| format!("http://{h}:1").parse().unwrap()).collect()
    }

    #[tokio::test]
    async fn a_node_that_refuses_costs_nothing_and_the_one_that_answered_is_dialled_first_next_time() {
        let dialled = Arc::default();
        let answered_last = Arc::new(AtomicUsize::new(0));
        let hosts = uris(&["down", "up"]);
        let started = crate::clock::monotonic_now();
        dial_in_turn(connector(Arc::clone(&dialled)), hosts.clone(), answered_last.clone())
            .await
            .expect("the second node answers");
        assert!(started.elapsed() < NEXT_ADDRESS_AFTER, "{:?}", started.elapsed());
        assert_eq!(*dialled.lock().unwrap(), ["down", "up"]);
        dialled.lock().unwrap().clear();
        dial_in_turn(connector(Arc::clone(&dialled)), hosts, answered_last)
            .await
            .expect("it answers again");
        assert_eq!(*dialled.lock().unwrap(), ["up"]);
    }

    #[tokio::test]
    async fn a_silent_node_costs_one_pause_and_all_down_is_an_error() {
        let dialled = Arc::default();
        let started = crate::clock::monotonic_now();
        let dial = dial_in_turn(connector(dialled), uris(&["silent", "up"]), Arc::default());
        dial.await.expect("the second node answers");
        let took = started.elapsed();
        assert!(took >= NEXT_ADDRESS_AFTER && took < NEXT_ADDRESS_AFTER * 4, "{took:?}");
        let refused = dial_in_turn(connector(Arc::default()), uris(&["down", "down"]), Arc::default()).await;
        assert_eq!(
            refused.err().map(|e| e.kind()),
            Some(std::io::ErrorKind::ConnectionRefused)
        );
    }

    #[test]
    fn a_region_has_one_to_sixteen_addresses() {
        assert_eq!(PeerAddresses::new(vec![]), Err(PeerAddressesError::Empty));
        let many = vec!["http://a:1".to_owned(); MAX_PEER_ADDRESSES + 1];
        assert_eq!(PeerAddresses::new(many), Err(PeerAddressesError::TooMany(17)));
        let two = PeerAddresses::new(vec!["http://a:1".into(), "http://b:2".into()]).unwrap();
        assert_eq!(two.to_string(), "http://a:1, http://b:2");
    }
}
