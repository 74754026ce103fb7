//! The node's TLS acceptor, in front of tonic's server (a node's and a
//! standby's): each connection's handshake, then its client certificate
//! checked once, before any service may see the connection.
//!
//! tonic's own TLS (`ServerTlsConfig` with a client CA) fails the handshake
//! of a certificate of another CA, so such a client saw a transport error,
//! not a status; and one set of roots could not tell a `[auth] client_ca`
//! certificate (a client) from the cluster's (a region). Here the handshake
//! only proves the client holds the key of what it offers
//! (`cascade_tls::ServerTls`), and then:
//!
//! - no certificate, or one of the cluster's CA or of `client_ca`: the
//!   connection goes to tonic as a `TlsStream`, whose `TlsConnectInfo`
//!   gives every service the chain (`peer_certs()`) as before;
//! - any other ([`ClientCertificate::Untrusted`], a `client_ca` leaf
//!   naming a region included): the connection never reaches a service. A
//!   small HTTP/2 server of its own answers every call on it
//!   UNAUTHENTICATED (trailers-only) with what to fix, and records each
//!   refusal ([`RecordRefusal`]: a node audits it), for at most
//!   [`REFUSED_CONNECTION_LIFETIME`].
//!
//! Limits: a handshake has [`HANDSHAKE_TIMEOUT`] and runs in its own task,
//! so a client that never sends a ClientHello (a tarpit, a slowloris)
//! holds only its own slot; at most [`MAX_HANDSHAKES_IN_FLIGHT`] run at
//! once. Over that, new connections wait in the listen backlog (this
//! stream stops pulling from the listener) rather than being closed: a
//! burst of legitimate reconnections (every peer and client after a
//! restart) is served in order instead of reset, and a flood of idle
//! handshakes holds the rest for at most the handshake deadline. Failed
//! handshakes are logged once a window with a count, never one line each.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, UNIX_EPOCH};

use cascade_tls::{ClientCertificate, ServerTls, Untrusted};
use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::Status;
use tracing::{debug, warn};

use crate::auth::AuthSettings;
use crate::clock::Clock;
use crate::log_throttle::Throttle;
use crate::node::NodeError;

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes in progress at once; more connections wait to be accepted.
pub const MAX_HANDSHAKES_IN_FLIGHT: usize = 128;

/// How long a connection with an untrusted certificate is answered before
/// it is closed (gracefully: calls in progress get their answer). Its
/// client reconnects to be refused again, with a new handshake.
pub const REFUSED_CONNECTION_LIFETIME: Duration = Duration::from_secs(10);

/// Calls at once on a connection with an untrusted certificate.
const REFUSED_CONNECTION_STREAMS: u32 = 16;

/// Where the calls refused on an untrusted connection are written down
/// (a node: a throttled warning and the audit log, `api/authn.rs`).
pub(crate) trait RecordRefusal: Send + Sync + 'static {
    /// `method` is the call's path as the client sent it.
    fn refused<'a>(&'a self, method: &'a str, status: &'a Status) -> BoxFuture<'a, ()>;
}

/// The server side of `tls`, with `[auth] client_ca` when `auth` names one
/// (read now: a missing or malformed file stops the start).
pub(crate) fn server_tls(tls: &cascade_tls::NodeTls, auth: &AuthSettings) -> Result<ServerTls, NodeError> {
    let client_ca = auth
        .client_ca
        .as_deref()
        .map(cascade_tls::ClientCa::load)
        .transpose()
        .map_err(|e| NodeError::Config(format!("[auth] client_ca: {e}")))?;
    tls.server(client_ca.as_ref())
        .map_err(|e| NodeError::Config(format!("[tls]: {e}")))
}

/// What every handshake of one server shares.
pub(crate) struct Acceptor {
    tls: ServerTls,
    acceptor: TlsAcceptor,
    /// A chain is verified at this clock's time.
    clock: Arc<dyn Clock>,
    refusals: Arc<dyn RecordRefusal>,
    /// HTTP/2 keepalive of the refused connections, as of the server's.
    keepalive: (Duration, Duration),
    failures_logged: Throttle,
}

impl Acceptor {
    pub(crate) fn new(
        tls: ServerTls,
        clock: Arc<dyn Clock>,
        refusals: Arc<dyn RecordRefusal>,
        keepalive: (Duration, Duration),
    ) -> Arc<Self> {
        Arc::new(Self {
            acceptor: TlsAcceptor::from(tls.config()),
            tls,
            clock,
            refusals,
            keepalive,
            failures_logged: Throttle::default(),
        })
    }

    /// A handshake that failed or did not finish in time: one line a
    /// window (anyone can make them, as often as they like).
    fn failed(&self, why: &str) {
        debug!(error = why, "TLS handshake failed");
        if let Some(more) = self.failures_logged.admit() {
            warn!(error = why, suppressed = more.count(), "a TLS handshake failed{more}");
        }
    }
}

/// The connections of `incoming` after their handshake, those tonic may
/// serve (see the module doc); untrusted ones are answered here. Dropping
/// the stream (the server stopped accepting) ends every handshake in
/// progress and every refused connection.
pub(crate) fn accept<I, IO, IE>(incoming: I, acceptor: Arc<Acceptor>) -> impl Stream<Item = Result<TlsStream<IO>, IE>>
where
    I: Stream<Item = Result<IO, IE>>,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    IE: Send + 'static,
{
    let (serving, stopped) = watch::channel(());
    incoming
        .map(move |connection| {
            // Held as long as the stream: its drop is the stop signal.
            let _serving = &serving;
            let handshake = match connection {
                Ok(io) => Ok(tokio::spawn(handshake(io, acceptor.clone(), stopped.clone()))),
                Err(e) => Err(e),
            };
            async move {
                match handshake {
                    Ok(task) => task.await.ok().flatten().map(Ok),
                    Err(e) => Some(Err(e)),
                }
            }
        })
        // Pulls the next connection only while fewer handshakes run.
        .buffer_unordered(MAX_HANDSHAKES_IN_FLIGHT)
        .filter_map(futures::future::ready)
}

/// One connection's handshake and classification: the stream for tonic,
/// or None (failed, timed out, stopped, or untrusted and refused here).
async fn handshake<IO>(io: IO, shared: Arc<Acceptor>, mut stopped: watch::Receiver<()>) -> Option<TlsStream<IO>>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let accepted = tokio::select! {
        accepted = tokio::time::timeout(HANDSHAKE_TIMEOUT, shared.acceptor.accept(io)) => accepted,
        _ = stopped.changed() => return None,
    };
    let stream = match accepted {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            shared.failed(&e.to_string());
            return None;
        }
        Err(_) => {
            shared.failed(&format!("no handshake within {} s", HANDSHAKE_TIMEOUT.as_secs()));
            return None;
        }
    };
    let now = UNIX_EPOCH + Duration::from_millis(shared.clock.now().0);
    match shared.tls.classify(stream.get_ref().1.peer_certificates(), now) {
        ClientCertificate::Absent | ClientCertificate::OfCluster | ClientCertificate::OfClientCa => Some(stream),
        ClientCertificate::Untrusted(why) => {
            tokio::spawn(refuse(stream, why, shared, stopped));
            None
        }
    }
}

/// Serves a connection whose certificate is untrusted: every call is
/// answered UNAUTHENTICATED, for [`REFUSED_CONNECTION_LIFETIME`] at most.
async fn refuse<IO>(stream: TlsStream<IO>, why: Untrusted, shared: Arc<Acceptor>, mut stopped: watch::Receiver<()>)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let refuser = Refuser {
        message: Arc::from(why.to_string()),
        refusals: shared.refusals.clone(),
    };
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new()).http2_only();
    let (interval, timeout) = shared.keepalive;
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(REFUSED_CONNECTION_STREAMS)
        .keep_alive_interval(interval)
        .keep_alive_timeout(timeout);
    let connection = builder.serve_connection(
        TokioIo::new(stream),
        hyper_util::service::TowerToHyperService::new(refuser),
    );
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => return,
        _ = tokio::time::sleep(REFUSED_CONNECTION_LIFETIME) => {}
        _ = stopped.changed() => {}
    }
    connection.as_mut().graceful_shutdown();
    // Calls already answered; what is left is the GOAWAY's round trip.
    let _ = tokio::time::timeout(Duration::from_secs(1), connection).await;
}

/// The service of an untrusted connection: each call UNAUTHENTICATED,
/// trailers-only, saying what to fix; nothing of it reaches a service.
#[derive(Clone)]
struct Refuser {
    message: Arc<str>,
    refusals: Arc<dyn RecordRefusal>,
}

impl<B> tower::Service<http::Request<B>> for Refuser {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let status = Status::unauthenticated(self.message.to_string());
        let refusals = self.refusals.clone();
        let method = request.uri().path().to_owned();
        Box::pin(async move {
            refusals.refused(&method, &status).await;
            Ok(status.into_http())
        })
    }
}
