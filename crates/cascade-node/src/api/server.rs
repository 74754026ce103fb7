//! Serving a node and stopping it: the gRPC server that composes the
//! services of `api/` (with health, reflection and the tower layers), the
//! peer links beside it, and the metrics listener.
//!
//! What a node takes from its surroundings — time, randomness, and how it
//! reaches its peers — comes in a [`NodeEnv`], and what it
//! serves on is any stream of connections ([`Node::serve_incoming`]). The
//! defaults are the real ones; the simulation (`tests/simulation.rs`)
//! substitutes turmoil's clock, network and a seed, and runs this same code.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::server::{Connected, TcpIncoming};
use tracing::info;

use crate::api::tls_accept::{accept, server_tls, Acceptor};
use crate::config::NodeSettings;
use crate::links::{LinkContext, Links};
use crate::node::{Node, NodeEnv, NodeError};

impl Node {
    /// Serves on `listener` until `shutdown` resolves, then stops the writer
    /// after its current step and flushes the store.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), NodeError> {
        let addr = listener.local_addr()?;
        info!(region = %self.region, %addr, tls = self.tls.is_some(), "serving");
        if let Ok(mut advertised) = self.advertised.lock() {
            let scheme = if self.tls.is_some() { "https" } else { "http" };
            *advertised = Some(format!("{scheme}://{addr}"));
        }
        // Watch events and small replies are single small writes: without
        // TCP_NODELAY, Nagle holds each until the peer's delayed ACK (about
        // 40 ms on Linux), which was most of a cross-region notification's
        // latency (cascade-bench P3).
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        self.serve_incoming(incoming, shutdown).await
    }

    /// Serves every connection `incoming` yields until `shutdown` resolves,
    /// then stops like [`Node::serve`]. Any byte stream will do: TCP, or a
    /// simulated network.
    pub async fn serve_incoming<I, IO, IE>(
        self,
        incoming: I,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), NodeError>
    where
        I: Stream<Item = Result<IO, IE>>,
        IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
        IO::ConnectInfo: Clone + Send + Sync + 'static,
        IE: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    {
        let node = Arc::new(self);
        let (health, _) = tonic_health::server::health_reporter();
        let health_service = tonic_health::pb::health_server::HealthServer::new(
            crate::api::writer_health::WriterHealth::new(node.committing.subscribe(), health.clone()),
        );
        let services = crate::api::services(&node);
        // Resources and Admin behind the authentication layer (a pass-through
        // with `[auth] mode = "none"`); Peer keeps its region certificate check.
        let gate = crate::api::authn::Gate::new(&node)?;
        // Health follows the writer: NOT_SERVING while commits fail. A
        // Check reads the writer's flag itself (`api/writer_health.rs`);
        // the reporter, fed by the task below, knows the names and feeds
        // Watch streams. Subscribed before the first report, so no change is missed. The
        // first report is made before the server answers: made by the task
        // below, a probe that came first was told the service is unknown
        // (`faults::disk_full`'s first health check read no status in 2
        // runs of 107).
        let mut committing = node.committing.subscribe();
        let serving = *committing.borrow_and_update();
        report_writer_health(&health, serving).await;
        let health_task = tokio::spawn(async move {
            while committing.changed().await.is_ok() {
                // The borrow ends here: it must not be held across the report.
                let serving = *committing.borrow_and_update();
                report_writer_health(&health, serving).await;
            }
        });
        let metrics_task = match node.metrics_listener.lock().ok().and_then(|mut l| l.take()) {
            Some(listener) => {
                let listener = TcpListener::from_std(listener)?;
                let mut stopping = node.shutting_down.subscribe();
                Some(tokio::spawn(crate::metrics::serve_metrics(
                    node.clone(),
                    listener,
                    async move {
                        let _ = stopping.wait_for(|stop| *stop).await;
                    },
                )))
            }
            None => None,
        };
        let console_task = match node.console_listener.lock().ok().and_then(|mut l| l.take()) {
            Some(listener) => {
                let listener = TcpListener::from_std(listener)?;
                let setup = console_setup(&node)?;
                let mut stopping = node.shutting_down.subscribe();
                Some(tokio::spawn(crate::console::serve(setup, listener, async move {
                    let _ = stopping.wait_for(|stop| *stop).await;
                })))
            }
            None => None,
        };
        let reflection = crate::api::reflection().map_err(|e| NodeError::Reflection(e.to_string()))?;
        let reflection_v1alpha = crate::api::reflection_v1alpha().map_err(|e| NodeError::Reflection(e.to_string()))?;
        let links = Links::start(LinkContext {
            node: node.clone(),
            tick: node.link_tick,
            check_interval: node.check_interval,
            jitter_seed: node.jitter_seed,
        })
        .await
        .map_err(|e| NodeError::Config(format!("starting peer links: {e}")))?;
        // The schema file: reloaded when it changes and on SIGHUP.
        let schema_task =
            crate::schema_reload::spawn_watch(node.schema_reloader(), node.shutting_down.subscribe()).await;
        let stopping = node.clone();
        // A writer gone for good ends the server too: serving would only
        // refuse (`WriterHandle::ended_unasked`).
        let writer_ended = node.writer.ended_unasked();
        let (ended_tx, mut ended_rx) = oneshot::channel::<()>();
        let shutdown = async move {
            tokio::select! {
                () = shutdown => {}
                () = writer_ended => { let _ = ended_tx.send(()); }
            }
            stopping.stop_streams();
        };
        // TLS is ours (`api/tls_accept.rs`): a client certificate no CA of
        // this node issued is answered UNAUTHENTICATED, never handed to
        // the services.
        let acceptor = match &node.tls {
            Some(tls) => Some(Acceptor::new(
                server_tls(tls, &node.auth)?,
                node.clock.clone(),
                gate.clone(),
                (
                    node.link_timings.keepalive_interval,
                    node.link_timings.keepalive_timeout,
                ),
            )),
            None => None,
        };
        let router = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(node.link_timings.keepalive_interval))
            .http2_keepalive_timeout(Some(node.link_timings.keepalive_timeout))
            // Each call's span: a child of the caller's trace context.
            .trace_fn(crate::api::trace_propagation::request_span)
            // Outermost: the code a client sees is the code counted.
            .layer(crate::api::grpc_metrics::GrpcMetricsLayer(node.metrics.clone()))
            // tonic's own refusals of unreadable requests, in the documented codes.
            .layer(tower::util::MapResponseLayer::new(
                crate::api::wire_errors::rewrite::<tonic::body::Body>,
            ))
            // Every answer says which protocol version this node speaks
            // (`cascade_proto::PROTOCOL_VERSION_HEADER`): the calling node
            // remembers it (`peers/mod.rs`).
            .layer(tower::util::MapResponseLayer::new(announce_version(
                node.peers.own_version,
            )))
            .add_service(health_service)
            .add_service(reflection)
            .add_service(reflection_v1alpha)
            .add_service(gate.guard(services.resources))
            .add_service(services.peer)
            .add_service(gate.guard(services.admin));
        let result = match acceptor {
            Some(acceptor) => {
                router
                    .serve_with_incoming_shutdown(accept(incoming, acceptor), shutdown)
                    .await
            }
            None => router.serve_with_incoming_shutdown(incoming, shutdown).await,
        };
        // Also when the connections ended on their own: the metrics
        // listener and the streams stop on this.
        node.stop_streams();
        links.stop().await;
        health_task.abort();
        if let Some(task) = schema_task {
            // It stops on `shutting_down`; a reload in progress finishes first.
            let _ = task.await;
        }
        if let Some(task) = metrics_task {
            let _ = task.await;
        }
        if let Some(task) = console_task {
            if let Ok(Err(e)) = task.await {
                tracing::error!(error = %e, "the console stopped");
            }
        }
        node.writer.stop().await;
        node.store.flush()?;
        info!(region = %node.region, "stopped");
        result?;
        match ended_rx.try_recv() {
            Ok(()) => Err(NodeError::WriterEnded),
            Err(_) => Ok(()),
        }
    }
}

/// What the console needs of its node (`console.rs`): the node's own API
/// address to call as a client, and with `[tls]` the cluster's CA and the
/// region's certificate name to check it by (no client identity: the
/// console calls as its browser's caller, never as this region) and the
/// node's certificate to serve HTTPS with.
/// Reports the server and its services SERVING or NOT_SERVING as the
/// writer commits or not, and the writer's own health service with them:
/// a node that serves a `Node` is its region's writer (a standby reports
/// NOT_SERVING for it: `api/standby.rs`).
async fn report_writer_health(health: &tonic_health::server::HealthReporter, serving: bool) {
    crate::api::report_health(health, serving).await;
    let writer = if serving {
        tonic_health::ServingStatus::Serving
    } else {
        tonic_health::ServingStatus::NotServing
    };
    health
        .set_service_status(crate::api::standby::WRITER_HEALTH_SERVICE, writer)
        .await;
}

fn console_setup(node: &Node) -> Result<crate::console::ConsoleSetup, NodeError> {
    let api_endpoint = node.advertised.lock().ok().and_then(|a| a.clone()).ok_or_else(|| {
        NodeError::Config("console.listen: the node's own API address is not known (it serves no listener)".into())
    })?;
    Ok(console_setup_of(
        api_endpoint,
        node.tls.as_ref(),
        node.region.as_str(),
        node.console_addr,
        &node.console_allowed_hosts,
    ))
}

fn console_setup_of(
    api_endpoint: String,
    tls: Option<&cascade_tls::NodeTls>,
    region: &str,
    listen: Option<SocketAddr>,
    allowed_hosts: &[String],
) -> crate::console::ConsoleSetup {
    let (client_tls, https_identity) = match tls {
        Some(tls) => {
            let mut client = tls.as_client();
            let identity = client.identity.take();
            client.server_name = Some(cascade_tls::identity_name(region));
            (Some(client), identity)
        }
        None => (None, None),
    };
    crate::console::ConsoleSetup {
        api_endpoint,
        client_tls,
        https_identity,
        region: region.to_owned(),
        listen,
        allowed_hosts: allowed_hosts.to_vec(),
    }
}

/// The console of a process of a region of several nodes (`[ha]`,
/// `api/roles.rs`): bound once and served for the process's whole life,
/// standby or writer, since it is a client of the process's own API
/// address (`api`), which a standby forwards to the writer and a writer
/// answers itself; so a takeover does not close it, and its pages answer
/// what the API answers meanwhile. None when `[console] listen` is not set.
pub(crate) fn start_region_console(
    settings: &NodeSettings,
    api: SocketAddr,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<Option<tokio::task::JoinHandle<()>>, NodeError> {
    let Some(addr) = settings.console_listen else {
        return Ok(None);
    };
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| NodeError::Config(format!("console.listen: cannot listen on {addr}: {e}")))?;
    listener.set_nonblocking(true)?;
    let listen = listener.local_addr()?;
    let listener = TcpListener::from_std(listener)?;
    let scheme = if settings.tls.is_some() { "https" } else { "http" };
    let setup = console_setup_of(
        format!("{scheme}://{api}"),
        settings.tls.as_ref(),
        settings.region.as_str(),
        Some(listen),
        &settings.console_allowed_hosts,
    );
    let region = settings.region.to_string();
    Ok(Some(tokio::spawn(async move {
        if let Err(e) = crate::console::serve(setup, listener, stop).await {
            tracing::error!(%region, error = %e, "the console stopped");
        }
    })))
}

/// A node serving in a background task (tests, the demo).
pub struct RunningNode {
    pub addr: SocketAddr,
    /// Where its Prometheus metrics are served, when `metrics_listen` is set.
    metrics_addr: Option<SocketAddr>,
    /// Where its web console is served, when `[console] listen` is set.
    console_addr: Option<SocketAddr>,
    /// Serving TLS: the endpoint is `https://`.
    tls: bool,
    /// Reloads its schema file, as SIGHUP and the file watch do.
    schema: crate::schema_reload::SchemaReloader,
    /// Dropping it also stops the node.
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), NodeError>>,
    writer: crate::writer::WriterHandle,
}

impl RunningNode {
    pub async fn start(settings: NodeSettings, listener: TcpListener) -> Result<Self, NodeError> {
        Self::start_with(settings, NodeEnv::default(), listener).await
    }

    /// [`RunningNode::start`] in the given surroundings (see [`NodeEnv`]).
    pub async fn start_with(settings: NodeSettings, env: NodeEnv, listener: TcpListener) -> Result<Self, NodeError> {
        let addr = listener.local_addr()?;
        let tls = settings.tls.is_some();
        let node = Node::open_with(settings, env).await?;
        let metrics_addr = node.metrics_addr();
        let console_addr = node.console_addr();
        let schema = node.schema_reloader();
        let writer = node.writer.clone();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(node.serve(listener, async {
            let _ = rx.await;
        }));
        Ok(Self {
            addr,
            metrics_addr,
            console_addr,
            tls,
            schema,
            shutdown: Some(tx),
            task,
            writer,
        })
    }

    /// Reads the node's schema file again and puts it in force, or says
    /// why not: what SIGHUP and a change of the file do
    /// (`schema_reload.rs`).
    pub async fn reload_schema(
        &self,
    ) -> Result<crate::schema_reload::ReloadOutcome, crate::schema_reload::ReloadError> {
        self.schema.reload(crate::writer::ReloadCause::Call).await
    }

    /// The version of the schema in force.
    pub fn schema_version(&self) -> crate::schema_in_force::SchemaVersion {
        self.schema.version()
    }

    /// `http://ADDR/metrics` serves the node's Prometheus metrics (when
    /// its settings asked for them).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The web console's URL (`http://ADDR/`, `https://` with TLS), when
    /// its settings asked for one.
    pub fn console_url(&self) -> Option<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.console_addr.map(|addr| format!("{scheme}://{addr}/"))
    }

    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Tests only: ends the writer's supervisor as a failure of its own
    /// would (`writer/handle.rs`).
    #[doc(hidden)]
    pub fn end_writer_supervisor_unasked(&self) {
        self.writer.end_supervisor_unasked();
    }

    /// Whether the node's server ended by itself (a writer that ended,
    /// say); [`Self::stop`] then says why.
    pub fn has_ended(&self) -> bool {
        self.task.is_finished()
    }

    /// Graceful stop: in-flight requests finish, the writer completes its step.
    pub async fn stop(mut self) -> Result<(), NodeError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match (&mut self.task).await {
            Ok(r) => r,
            Err(e) => Err(NodeError::Io(std::io::Error::other(e.to_string()))),
        }
    }
}

/// Adds this node's protocol version to an answer's headers, unless the
/// answer already carries one: an answer relayed unchanged (a standby's,
/// from its writer) speaks for the node that made it, the one that applies
/// what it is sent.
fn announce_version<B>(version: u32) -> impl Fn(http::Response<B>) -> http::Response<B> + Clone {
    let value = http::HeaderValue::from(version);
    move |mut response: http::Response<B>| {
        response
            .headers_mut()
            .entry(cascade_proto::PROTOCOL_VERSION_HEADER)
            .or_insert_with(|| value.clone());
        response
    }
}
