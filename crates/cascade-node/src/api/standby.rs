//! What a standby serves: every gRPC call forwarded, unchanged, to the
//! writer of its region, and its own health.
//!
//! Several `cascade serve` processes of one region share its database; one
//! writes (it runs a [`Node`](crate::Node)), the others stand by. A
//! standby holds no node and never reads the region's tables: it is an
//! HTTP/2 gRPC proxy in front of the writer, so a client or a peer region
//! may dial any node of a region.
//!
//! - **Every service but health is forwarded** (Resources, Peer, Admin,
//!   reflection, and whatever a newer writer serves): the request goes out
//!   on a channel to the writer as it came in — path, metadata (the
//!   caller's `grpc-timeout` included, which the writer honours), body —
//!   and the writer's response comes back as it is, streams included both
//!   ways. The channel is made anew when the writer's address changes; it
//!   dials with the node's link timings (one bound on TCP and TLS
//!   together, HTTP/2 keepalive) and, with TLS, presents this node's own
//!   certificate and accepts only a writer whose certificate names this
//!   region. No writer known: UNAVAILABLE "region R has no writer right
//!   now; retry". A writer that cannot be reached: UNAVAILABLE naming its
//!   address, at once (a refused dial) or after the dial timeout. A call
//!   another standby forwarded ([`FORWARDED_BY_STANDBY`]) is not forwarded
//!   again: UNAVAILABLE, not a loop, while a standby is named the writer.
//!   A writer that hangs after accepting a call is bounded by the caller's
//!   deadline, else by the HTTP/2 keepalive of the channel.
//! - **Who the caller is** survives the hop under mutual TLS: the writer
//!   sees this node's certificate, so the standby says which region the
//!   caller's verified certificate names ([`RELAYED_REGION`], see
//!   `api/relay.rs`) and which administrator it verified ([`FORWARDED_FOR`],
//!   as a forwarding region does), after removing whatever the caller sent
//!   under those names, so that nobody can forge them through a standby.
//! - **With `[auth] mode = "required"`** the standby authenticates the
//!   callers of Resources and Admin as a writer would (`api/authn.rs`),
//!   refuses the rest UNAUTHENTICATED, and vouches for the principal it
//!   found (`cascade-principal-bin`, replacing whatever the caller sent),
//!   which the writer believes from a node of its own region.
//! - **Health is the standby's own**: `""` and the `cascade.v1.*` services
//!   are SERVING while the writer answers its own health check as SERVING
//!   (asked every [`StandbySettings::writer_check_every`], within as long),
//!   NOT_SERVING otherwise; [`WRITER_HEALTH_SERVICE`] is always NOT_SERVING
//!   here, SERVING on the writer, so probes tell them apart.
//! - **Limits**: a message over `max_message_bytes` is not forwarded
//!   either way (RESOURCE_EXHAUSTED; the writer checks again), at most
//!   [`MAX_STREAMS_PER_CONNECTION`] calls at once per connection.
//! - **Stopping** (the process is about to become the writer, or exits):
//!   calls waiting on the writer and forwarded streams end at once with
//!   UNAVAILABLE, which clients retry and watchers resume from their
//!   revision, so the connections close and the listener is free. So do
//!   forwarded streams whose connection to the writer fails (a writer
//!   killed mid-stream).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use cascade_core::limits::quote;
use cascade_core::RegionId;
use cascade_tls::NodeTls;
use futures::future::BoxFuture;
use futures::Stream;
use http::HeaderMap;
use http_body::Frame;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};
use tonic::Status;
use tower::ServiceExt;
use tracing::{info, warn};

use crate::api::admin::FORWARDED_FOR;
use crate::api::authn::{is_guarded, Authenticator};
use crate::api::principal::PRINCIPAL_HEADER;
use crate::api::relay::RELAYED_REGION;
use crate::api::tls_accept::{accept, server_tls, Acceptor, RecordRefusal};
use crate::auth::AuthSettings;
use crate::clock::SystemClock;
use crate::config::NodeSettings;
use crate::log_throttle::Throttle;
use crate::node::NodeError;
use crate::peers::{AnnouncingChannel, LinkTimings, PeerAddresses, Peers};

/// The health service name that tells the writer (SERVING) from a standby
/// (NOT_SERVING, always).
pub const WRITER_HEALTH_SERVICE: &str = "cascade.v1.Writer";

/// Calls in flight at once on one connection to a standby (HTTP/2
/// `SETTINGS_MAX_CONCURRENT_STREAMS`, hyper's default): each holds a
/// stream to the writer while it lasts.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 200;

/// Metadata a standby adds to every call it forwards. A standby that
/// receives a call carrying it does not forward it again: the address it
/// was given for the writer is a standby's (a lease row that still names a
/// process restarted as a standby, until it expires), and forwarding would
/// go round in a loop.
pub(crate) const FORWARDED_BY_STANDBY: &str = "cascade-forwarded-by-standby";

/// How often a standby asks its writer's health by default.
pub const DEFAULT_WRITER_CHECK_EVERY: Duration = Duration::from_secs(1);

/// What a standby needs: its region, how it speaks to clients and to the
/// writer, and its limits.
#[derive(Debug, Clone)]
pub struct StandbySettings {
    pub region: RegionId,
    /// Serve TLS with this node's certificate, and dial the writer with it.
    pub tls: Option<NodeTls>,
    /// The largest message forwarded either way (the node's own limit).
    pub max_message_bytes: usize,
    /// Dial timeout and keepalives, of the server and of the channel to
    /// the writer.
    pub links: LinkTimings,
    /// `[admin] identities`: a caller whose certificate names one is
    /// vouched for to the writer as that administrator.
    pub admin_identities: Vec<String>,
    /// How often the writer's health is asked (and the bound on each ask).
    pub writer_check_every: Duration,
    /// `[auth]`: with `required`, the standby authenticates the callers of
    /// Resources and Admin itself and vouches for them to its writer.
    pub auth: AuthSettings,
    /// The cluster's other regions (a certificate of one vouches).
    pub peer_regions: Vec<String>,
}

impl StandbySettings {
    /// The standby's settings of the node `settings` describe.
    pub fn of_node(settings: &NodeSettings) -> Self {
        Self {
            region: settings.region.clone(),
            tls: settings.tls.clone(),
            max_message_bytes: settings.limits.max_message_bytes,
            links: settings.links,
            admin_identities: settings.admin.identities.clone(),
            writer_check_every: DEFAULT_WRITER_CHECK_EVERY,
            auth: settings.auth.clone(),
            peer_regions: settings.peers.keys().map(|r| r.to_string()).collect(),
        }
    }
}

/// Serves every connection `incoming` yields as a standby of
/// `settings.region` until `shutdown` resolves: every gRPC call but health
/// forwarded unchanged to the writer whose address `writer` holds (`None`:
/// no writer known), health as the module doc says.
///
/// A caller's client certificate is read as tonic offers it, on TCP
/// connections (`TcpIncoming`, or any stream of `TcpStream`s), after
/// `api/tls_accept.rs` verified it.
pub async fn serve_standby<I, IO, IE>(
    settings: StandbySettings,
    incoming: I,
    writer: watch::Receiver<Option<String>>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), NodeError>
where
    I: Stream<Item = Result<IO, IE>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    info!(region = %settings.region, tls = settings.tls.is_some(), "serving as a standby");
    let (stop, stopping) = watch::channel(false);
    let peers = settings.peer_regions.clone();
    let authenticator = Authenticator::load(
        &settings.auth,
        Arc::new(SystemClock),
        settings.region.clone(),
        settings.tls.is_some(),
        Box::new(move |r| peers.iter().any(|p| p == r)),
    )?;
    let proxy = Proxy(Arc::new(ProxyState {
        route: WriterRoute::new(&settings, writer),
        stopping,
        unreachable_logged: Throttle::default(),
        authenticator,
        refusals_logged: Throttle::default(),
    }));
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status(WRITER_HEALTH_SERVICE, tonic_health::ServingStatus::NotServing)
        .await;
    crate::api::report_health(&health, false).await;
    let health_proxy = proxy.clone();

    let forward = tower::service_fn(move |request: http::Request<axum::body::Body>| {
        let proxy = proxy.clone();
        async move { Ok::<_, std::convert::Infallible>(proxy.forward(request).await) }
    });
    let router = tonic::service::Routes::new(health_service)
        .into_axum_router()
        .fallback_service(forward);
    // TLS as on a node (`api/tls_accept.rs`): a client certificate no CA
    // of the region issued is answered UNAUTHENTICATED here, never forwarded.
    let acceptor = match &settings.tls {
        Some(tls) => Some(Acceptor::new(
            server_tls(tls, &settings.auth)?,
            Arc::new(SystemClock),
            Arc::new(StandbyRefusals {
                region: settings.region.clone(),
                logged: Throttle::default(),
            }),
            (settings.links.keepalive_interval, settings.links.keepalive_timeout),
        )),
        None => None,
    };
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(settings.links.keepalive_interval))
        .http2_keepalive_timeout(Some(settings.links.keepalive_timeout))
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION);
    // Only once nothing before the server can fail: the task runs until the server ends.
    let health_task = tokio::spawn(follow_writer_health(health_proxy, health, settings.writer_check_every));
    let shutdown = async move {
        shutdown.await;
        // Forwarded streams end now, or the graceful stop would wait on
        // watches that never end.
        let _ = stop.send(true);
    };
    let router = builder.add_routes(tonic::service::Routes::from(router));
    let result = match acceptor {
        Some(acceptor) => {
            router
                .serve_with_incoming_shutdown(accept(incoming, acceptor), shutdown)
                .await
        }
        None => router.serve_with_incoming_shutdown(incoming, shutdown).await,
    };
    health_task.abort();
    info!(region = %settings.region, "standby stopped");
    Ok(result?)
}

/// A standby holds no store: the calls it refuses for an untrusted client
/// certificate are logged (once a window), not audited.
struct StandbyRefusals {
    region: RegionId,
    logged: Throttle,
}

impl RecordRefusal for StandbyRefusals {
    fn refused<'a>(&'a self, method: &'a str, status: &'a Status) -> BoxFuture<'a, ()> {
        if let Some(more) = self.logged.admit() {
            warn!(region = %self.region, method = %quote(method), reason = %status.message(),
                suppressed = more.count(), "a standby refused a call with an untrusted client certificate{more}");
        }
        Box::pin(std::future::ready(()))
    }
}

/// The channel to the current writer, made again when its address changes.
struct WriterRoute {
    region: RegionId,
    tls: Option<NodeTls>,
    links: LinkTimings,
    max_message_bytes: usize,
    admin_identities: Vec<String>,
    writer: watch::Receiver<Option<String>>,
    /// The last address and what it gave: a channel, or why it cannot be dialled.
    current: Mutex<Option<Route>>,
}

#[derive(Clone)]
struct Route {
    /// As the lease holds it (quoted in errors).
    address: String,
    channel: Result<AnnouncingChannel, String>,
}

impl WriterRoute {
    fn new(settings: &StandbySettings, writer: watch::Receiver<Option<String>>) -> Self {
        Self {
            region: settings.region.clone(),
            tls: settings.tls.clone(),
            links: settings.links,
            max_message_bytes: settings.max_message_bytes,
            admin_identities: settings.admin_identities.clone(),
            writer,
            current: Mutex::new(None),
        }
    }

    /// The route to the writer now; None while no writer is known.
    fn now(&self) -> Option<Route> {
        let address = self.writer.borrow().clone()?;
        let mut current = self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(route) = current.as_ref().filter(|r| r.address == address) {
            return Some(route.clone());
        }
        let route = Route {
            channel: self.dial(&address),
            address,
        };
        *current = Some(route.clone());
        Some(route)
    }

    /// A lazily connected channel to `address` (a scheme is added when the
    /// lease holds a bare `host:port`): the same channel a node makes to a
    /// peer region, with this region as the identity the writer must prove.
    fn dial(&self, address: &str) -> Result<AnnouncingChannel, String> {
        let uri = if address.contains("://") {
            address.to_owned()
        } else {
            let scheme = if self.tls.is_some() { "https" } else { "http" };
            format!("{scheme}://{address}")
        };
        let addresses = PeerAddresses::new(vec![uri]).map_err(|e| e.to_string())?;
        let writer = std::collections::BTreeMap::from([(self.region.clone(), addresses)]);
        // A call relayed unchanged keeps the protocol version its caller
        // announced; a client's call is announced at this binary's.
        let peers = Peers::new(
            &writer,
            self.tls.as_ref(),
            None,
            self.links,
            self.max_message_bytes,
            cascade_proto::PROTOCOL_VERSION,
        )
        .map_err(|e| e.message)?;
        peers.channel(self.region.as_str()).map_err(|e| e.to_string())
    }
}

#[derive(Clone)]
struct Proxy(Arc<ProxyState>);

struct ProxyState {
    route: WriterRoute,
    /// True once the standby stops.
    stopping: watch::Receiver<bool>,
    /// Every call fails the same way while the writer is down: one line a window.
    unreachable_logged: Throttle,
    /// `[auth] mode = "required"`: who calls Resources and Admin.
    authenticator: Option<Authenticator>,
    /// Anyone can be refused, as often as they like: one line a window.
    refusals_logged: Throttle,
}

impl Proxy {
    /// One call, forwarded; whatever goes wrong is a gRPC status.
    async fn forward(&self, request: http::Request<axum::body::Body>) -> http::Response<tonic::body::Body> {
        let state = &self.0;
        let region = &state.route.region;
        let Some(route) = state.route.now() else {
            return answer(Status::unavailable(format!(
                "region {region} has no writer right now; retry"
            )));
        };
        let channel = match route.channel {
            Ok(channel) => channel,
            Err(why) => {
                return answer(Status::unavailable(format!(
                    "region {region}'s writer has an address this standby cannot dial, {}: {why}",
                    quote(&route.address)
                )))
            }
        };
        let (mut parts, body) = request.into_parts();
        if parts.headers.contains_key(FORWARDED_BY_STANDBY) {
            return answer(Status::unavailable(format!(
                "region {region} has no writer right now (a standby was named as the writer); retry"
            )));
        }
        parts
            .headers
            .insert(FORWARDED_BY_STANDBY, http::HeaderValue::from_static("1"));
        if let Some(authenticator) = &state.authenticator {
            if is_guarded(parts.uri.path()) {
                // The writer sees this standby's certificate: the caller
                // travels as the principal this standby vouches for.
                match authenticator.authenticate(&parts.headers, &parts.extensions) {
                    Ok(principal) => {
                        parts.headers.remove(PRINCIPAL_HEADER);
                        if let Some((name, value)) = authenticator.carried(&principal, &parts.headers) {
                            parts.headers.insert(name, value);
                        }
                    }
                    Err(refusal) => {
                        if let Some(more) = state.refusals_logged.admit() {
                            warn!(region = %region, method = parts.uri.path(), reason = %refusal,
                                suppressed = more.count(), "a standby refused an unauthenticated call{more}");
                        }
                        return answer(Status::unauthenticated(refusal.to_string()));
                    }
                }
            }
        }
        let certificates = parts
            .extensions
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(TlsConnectInfo::peer_certs);
        relay_identity(
            &mut parts.headers,
            state.route.tls.is_some(),
            certificates.as_deref().map(Vec::as_slice),
            &state.route.admin_identities,
        );
        // What the server put there (connection info, routing) is this hop's.
        parts.extensions = http::Extensions::new();
        let oversized = Arc::new(OnceLock::new());
        let body = LimitedRequest {
            inner: body,
            messages: MessageSizes::new(state.route.max_message_bytes),
            oversized: oversized.clone(),
        };
        let call = channel.oneshot(http::Request::from_parts(parts, tonic::body::Body::new(body)));
        let mut stopping = state.stopping.clone();
        let answered = tokio::select! {
            answered = call => answered,
            _ = stopping.wait_for(|stop| *stop) => {
                return answer(Status::unavailable(format!("this standby of region {region} is stopping; retry")));
            }
        };
        match answered {
            Ok(response) => {
                state.unreachable_logged.reset();
                response.map(|body| {
                    tonic::body::Body::new(LimitedResponse {
                        inner: body,
                        messages: MessageSizes::new(state.route.max_message_bytes),
                        stopping: Box::pin(async move {
                            let _ = stopping.wait_for(|stop| *stop).await;
                        }),
                        region: region.clone(),
                        ended: false,
                    })
                })
            }
            Err(_) if oversized.get().is_some() => {
                let length = oversized.get().copied().unwrap_or_default();
                answer(too_large(length, state))
            }
            Err(e) if caller_deadline_passed(&e) => answer(Status::deadline_exceeded(format!(
                "the caller's deadline passed before region {region}'s writer at {} answered",
                quote(&route.address)
            ))),
            Err(e) => {
                let why = error_chain(&e);
                if let Some(more) = state.unreachable_logged.admit() {
                    warn!(region = %region, writer = %route.address, error = %why, suppressed = more.count(),
                        "a standby could not forward a call to its writer{more}");
                }
                answer(Status::unavailable(format!(
                    "region {region}'s writer at {} cannot be reached: {why}",
                    quote(&route.address)
                )))
            }
        }
    }

    /// Whether the writer answers its own health check as SERVING within `within`.
    async fn writer_serving(&self, within: Duration) -> bool {
        let Some(Route {
            channel: Ok(channel), ..
        }) = self.0.route.now()
        else {
            return false;
        };
        let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
        let mut request = tonic::Request::new(tonic_health::pb::HealthCheckRequest { service: String::new() });
        request.set_timeout(within);
        match tokio::time::timeout(within, client.check(request)).await {
            Ok(Ok(reply)) => {
                reply.into_inner().status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
            }
            _ => false,
        }
    }
}

/// Keeps the standby's health in step with the writer's: asked every
/// `every`, and at once when the writer's address changes.
async fn follow_writer_health(proxy: Proxy, health: tonic_health::server::HealthReporter, every: Duration) {
    let mut writer = proxy.0.route.writer.clone();
    let mut reported = false;
    let region = proxy.0.route.region.clone();
    // A writer that comes and goes would say so every few seconds.
    let down_logged = Throttle::default();
    loop {
        let serving = proxy.writer_serving(every).await;
        if serving != reported {
            crate::api::report_health(&health, serving).await;
            let address = writer.borrow().clone().unwrap_or_default();
            if serving {
                info!(region = %region, writer = %address, "standby SERVING: its writer answers");
            } else if let Some(more) = down_logged.admit() {
                warn!(region = %region, writer = %address, suppressed = more.count(),
                    "standby NOT_SERVING: its writer does not answer{more}");
            }
            reported = serving;
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            changed = writer.changed() => {
                if changed.is_err() {
                    // Nobody will name another writer: keep asking this one.
                    tokio::time::sleep(every).await;
                }
            }
        }
    }
}

/// Replaces whatever the caller sent as [`RELAYED_REGION`] and
/// [`FORWARDED_FOR`] by what this standby verified (see `api/relay.rs`).
/// With TLS, the relayed region is always set (empty when the caller's
/// certificate names no region, or it presented none), so the writer never
/// mistakes a relayed call for one of its own region's nodes.
fn relay_identity(
    headers: &mut HeaderMap,
    tls: bool,
    certificates: Option<&[tonic::transport::CertificateDer<'static>]>,
    admin_identities: &[String],
) {
    headers.remove(RELAYED_REGION);
    let vouched_by_caller = headers.remove(FORWARDED_FOR);
    if !tls {
        // Plain text: the writer trusts no header anyway.
        return;
    }
    let region = certificates.and_then(|c| cascade_tls::peer_region(c).ok());
    let value = region.as_ref().map(|r| r.to_string()).unwrap_or_default();
    if let Ok(value) = value.parse() {
        headers.insert(RELAYED_REGION, value);
    }
    let names = certificates.map(cascade_tls::certificate_dns_names).unwrap_or_default();
    if let Some(name) = names.iter().find(|n| admin_identities.contains(n)) {
        if let Ok(value) = name.parse() {
            headers.insert(FORWARDED_FOR, value);
        }
    } else if let (Some(_), Some(vouched)) = (&region, vouched_by_caller) {
        // A region's node forwarding for an administrator it verified: the
        // writer decides whether that region may vouch.
        headers.insert(FORWARDED_FOR, vouched);
    }
}

/// A status as a whole (trailers-only) gRPC response.
fn answer(status: Status) -> http::Response<tonic::body::Body> {
    status.into_http()
}

fn too_large(length: usize, state: &ProxyState) -> Status {
    Status::resource_exhausted(format!(
        "a message of {length} bytes is over this node's limit of {} bytes",
        state.route.max_message_bytes
    ))
}

/// Whether the channel gave up on the caller's own `grpc-timeout` (tonic's
/// channel honours it too, racing this server's own timer) rather than on
/// reaching the writer (a dial that failed or timed out is a `ConnectError`).
fn caller_deadline_passed(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut timed_out = false;
    let mut cause = Some(e);
    while let Some(error) = cause {
        if error.is::<tonic::ConnectError>() {
            return false;
        }
        timed_out |= error.is::<tonic::TimeoutExpired>();
        cause = error.source();
    }
    timed_out
}

/// A transport error with its causes (tonic's own text is "transport error").
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The length prefixes of the gRPC messages in a body, read as its bytes
/// go by (a message and its 5-byte prefix may be split anyhow).
struct MessageSizes {
    max: usize,
    /// The prefix read so far of the next message.
    prefix: [u8; 5],
    prefix_len: usize,
    /// Bytes of the current message still to come.
    remaining: usize,
}

impl MessageSizes {
    fn new(max: usize) -> Self {
        Self {
            max,
            prefix: [0; 5],
            prefix_len: 0,
            remaining: 0,
        }
    }

    /// Reads `data`; `Err(length)` for a message over the limit that starts in it.
    fn read(&mut self, mut data: &[u8]) -> Result<(), usize> {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(data.len());
                self.remaining -= n;
                data = &data[n..];
                continue;
            }
            let n = (5 - self.prefix_len).min(data.len());
            self.prefix[self.prefix_len..self.prefix_len + n].copy_from_slice(&data[..n]);
            self.prefix_len += n;
            data = &data[n..];
            if self.prefix_len == 5 {
                self.prefix_len = 0;
                let [_, a, b, c, d] = self.prefix;
                let length = usize::try_from(u32::from_be_bytes([a, b, c, d])).unwrap_or(usize::MAX);
                if length > self.max {
                    return Err(length);
                }
                self.remaining = length;
            }
        }
        Ok(())
    }

    /// [`MessageSizes::read`] over every chunk of a frame's data.
    fn read_frame(&mut self, frame: &Frame<Bytes>) -> Result<(), usize> {
        match frame.data_ref() {
            Some(data) => self.read(data.chunk()),
            None => Ok(()),
        }
    }
}

pin_project_lite::pin_project! {
    /// A caller's request body on its way to the writer: a message over the
    /// limit is not sent; the call fails, and `oversized` says why.
    struct LimitedRequest {
        #[pin]
        inner: axum::body::Body,
        messages: MessageSizes,
        oversized: Arc<OnceLock<usize>>,
    }
}

impl http_body::Body for LimitedRequest {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match this.messages.read_frame(&frame) {
                Ok(()) => Poll::Ready(Some(Ok(frame))),
                Err(length) => {
                    let _ = this.oversized.set(length);
                    Poll::Ready(Some(Err(
                        format!("a message of {length} bytes is over the limit").into()
                    )))
                }
            },
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

pin_project_lite::pin_project! {
    /// The writer's response body on its way back: ends with UNAVAILABLE
    /// when the standby stops or the connection to the writer fails, with
    /// RESOURCE_EXHAUSTED at a message over the limit.
    struct LimitedResponse {
        #[pin]
        inner: tonic::body::Body,
        messages: MessageSizes,
        stopping: Pin<Box<dyn Future<Output = ()> + Send>>,
        region: RegionId,
        ended: bool,
    }
}

impl http_body::Body for LimitedResponse {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        if this.stopping.as_mut().poll(cx).is_ready() {
            *this.ended = true;
            let status = Status::unavailable(format!(
                "this standby of region {} is stopping; retry (a watch resumes from its last revision)",
                this.region
            ));
            return Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)))));
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match this.messages.read_frame(&frame) {
                Ok(()) => Poll::Ready(Some(Ok(frame))),
                Err(length) => {
                    *this.ended = true;
                    let status = Status::resource_exhausted(format!(
                        "the writer of region {} answered a message of {length} bytes, over this node's limit",
                        this.region
                    ));
                    Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)))))
                }
            },
            Poll::Ready(Some(Err(lost))) => {
                // The writer's own statuses come in trailers; an error here is
                // the connection to it failing mid-answer (a writer killed or
                // cut off): UNAVAILABLE, which clients retry and watchers
                // resume from, not the reset tonic would pass on.
                *this.ended = true;
                let status = Status::unavailable(format!(
                    "the writer of region {} went away mid-answer ({}); retry (a watch resumes from its last revision)",
                    this.region,
                    lost.message()
                ));
                Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)))))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }
}

/// The trailers that end a response with `status`.
fn trailers(status: &Status) -> HeaderMap {
    let mut headers = HeaderMap::new();
    // Only a status whose details do not fit a header fails here; ours have none.
    let _ = status.add_header(&mut headers);
    headers
}

#[cfg(test)]
mod tests;
