//! Starting, serving and stopping a node.
//!
//! What a node takes from its surroundings — time, randomness, and how it
//! reaches its peers — comes in a [`NodeEnv`], and what it serves on is any
//! stream of connections ([`Node::serve_incoming`]). The defaults are the
//! real ones; the simulation (`tests/simulation.rs`) substitutes turmoil's
//! clock, network and a seed, and runs this same code.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::transport::server::Connected;

use cascade_proto::v1::resources_server::ResourcesServer;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, oneshot};
use tokio_stream::wrappers::TcpListenerStream;
use tracing::info;

use crate::clock::{Clock, SystemClock};
use crate::config::NodeSettings;
use crate::entropy::{stable_hash, wall_clock_seed, SeededUids, SystemUids, UidSource};
use crate::links::{LinkContext, Links};
use crate::peer_service::PeerService;
use crate::peers::{PeerConnector, Peers, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT};
use crate::service::ResourcesService;
use crate::store::{MemoryStore, SledStore, Store, StoreError};
use crate::writer::{WriterContext, WriterHandle, WriterUnavailable};
use cascade_proto::v1::peer_server::PeerServer;
use cascade_tls::NodeTls;

pub use cascade_proto::MAX_MESSAGE_BYTES;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Writer(#[from] WriterUnavailable),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("reflection service: {0}")]
    Reflection(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("configuration: {0}")]
    Config(String),
}

/// The node's surroundings, injectable so a simulation controls them.
#[derive(Clone)]
pub struct NodeEnv {
    /// `deleted_at`, retry schedules, attach times.
    pub clock: Arc<dyn Clock>,
    /// None: uids from [`SystemUids`] and reconnect jitter from the wall
    /// clock. Some: [`SeededUids`] and jitter derived from this seed and the
    /// region, so a run replays exactly (give each node its own region, or
    /// its own seed).
    pub seed: Option<u64>,
    /// Opens connections to peers instead of TCP (see [`PeerConnector`]).
    pub connector: Option<PeerConnector>,
}

impl Default for NodeEnv {
    fn default() -> Self {
        Self {
            clock: Arc::new(SystemClock),
            seed: None,
            connector: None,
        }
    }
}

/// An opened node: store and writer running, not yet serving.
pub struct Node {
    service: ResourcesService,
    /// Tells the service's streams to end when serving stops.
    shutting_down: tokio::sync::watch::Sender<bool>,
    /// Served with TLS (peers and clients) when set.
    tls: Option<NodeTls>,
    /// How often peer links send releases and look at their streams.
    link_tick: std::time::Duration,
    check_interval: std::time::Duration,
    /// Seeds the peer links' reconnect jitter.
    jitter_seed: u64,
}

impl Node {
    pub async fn open(settings: NodeSettings) -> Result<Self, NodeError> {
        Self::open_with_clock(settings, Arc::new(SystemClock)).await
    }

    pub async fn open_with_clock(settings: NodeSettings, clock: Arc<dyn Clock>) -> Result<Self, NodeError> {
        Self::open_with(
            settings,
            NodeEnv {
                clock,
                ..NodeEnv::default()
            },
        )
        .await
    }

    /// Opens a node in the given surroundings (see [`NodeEnv`]).
    pub async fn open_with(settings: NodeSettings, env: NodeEnv) -> Result<Self, NodeError> {
        let NodeEnv { clock, seed, connector } = env;
        let region_seed = seed.map(|s| s ^ stable_hash(settings.region.as_str()));
        let ids: Arc<dyn UidSource> = match region_seed {
            Some(s) => Arc::new(SeededUids::new(s, clock.clone())),
            None => Arc::new(SystemUids),
        };
        let jitter_seed = region_seed.map_or_else(wall_clock_seed, |s| s.rotate_left(17));
        let store: Arc<dyn Store> = match &settings.data_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                Arc::new(SledStore::open(dir)?)
            }
            None => Arc::new(MemoryStore::default()),
        };
        let (events, _) = broadcast::channel(4096);
        let (shutting_down_tx, shutting_down) = tokio::sync::watch::channel(false);
        if let Some(tls) = &settings.tls {
            if tls.region() != &settings.region {
                return Err(NodeError::Config(format!(
                    "the TLS certificate names region {}, but this node is region {}",
                    tls.region(),
                    settings.region
                )));
            }
        }
        let peers = Peers::new(
            &settings.peers,
            settings.tls.as_ref(),
            connector,
            settings.limits.max_message_bytes,
        )
        .map_err(|e| NodeError::Config(e.to_string()))?;
        let closure_checks = crate::writer::ClosureChecks::default();
        let writer = WriterHandle::spawn(WriterContext {
            region: settings.region.clone(),
            schema: settings.schema.clone(),
            policy: settings.policy.clone(),
            store: store.clone(),
            clock: clock.clone(),
            ids,
            events: events.clone(),
            tick: settings.tick,
            closure_checks: closure_checks.clone(),
        })
        .await?;
        Ok(Self {
            service: ResourcesService {
                region: settings.region,
                schema: settings.schema,
                store,
                writer,
                events,
                limits: settings.limits,
                peer_auth: settings.tls.is_some(),
                shutting_down,
                policy: settings.policy,
                peers,
                clock,
                acks: Default::default(),
                outbox_retention: settings.outbox_retention,
                closure_checks,
            },
            tls: settings.tls,
            link_tick: settings.tick,
            check_interval: settings.check_interval,
            jitter_seed,
            shutting_down: shutting_down_tx,
        })
    }

    /// Serves on `listener` until `shutdown` resolves, then stops the writer
    /// after its current step and flushes the store.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), NodeError> {
        let addr = listener.local_addr()?;
        info!(region = %self.service.region, %addr, tls = self.tls.is_some(), "serving");
        self.serve_incoming(TcpListenerStream::new(listener), shutdown).await
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
        IE: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<ResourcesServer<ResourcesService>>().await;
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(cascade_proto::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(|e| NodeError::Reflection(e.to_string()))?;
        let writer = self.service.writer.clone();
        let store = self.service.store.clone();
        let region = self.service.region.clone();
        let links = Links::start(LinkContext {
            node: self.service.clone(),
            tick: self.link_tick,
            check_interval: self.check_interval,
            jitter_seed: self.jitter_seed,
        })
        .await
        .map_err(|e| NodeError::Config(format!("starting peer links: {e}")))?;
        let max_message = self.service.limits.max_message_bytes;
        let peer_api = PeerServer::new(PeerService {
            node: self.service.clone(),
        })
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(max_message);
        let api = ResourcesServer::new(self.service)
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_message);
        let stop_streams = self.shutting_down;
        let shutdown = async move {
            shutdown.await;
            let _ = stop_streams.send(true);
        };
        let mut builder = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT));
        if let Some(tls) = &self.tls {
            builder = builder.tls_config(tls.server_config())?;
        }
        let result = builder
            // tonic's own refusals of unreadable requests, in the documented codes.
            .layer(tower::util::MapResponseLayer::new(
                crate::wire_errors::rewrite::<tonic::body::Body>,
            ))
            .add_service(health_service)
            .add_service(reflection)
            .add_service(api)
            .add_service(peer_api)
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await;
        links.stop().await;
        writer.stop().await;
        store.flush()?;
        info!(%region, "stopped");
        Ok(result?)
    }
}

/// A node serving in a background task (tests, the demo).
pub struct RunningNode {
    pub addr: SocketAddr,
    /// Serving TLS: the endpoint is `https://`.
    tls: bool,
    /// Dropping it also stops the node.
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), NodeError>>,
}

impl RunningNode {
    pub async fn start(settings: NodeSettings, listener: TcpListener) -> Result<Self, NodeError> {
        let addr = listener.local_addr()?;
        let tls = settings.tls.is_some();
        let node = Node::open(settings).await?;
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(node.serve(listener, async {
            let _ = rx.await;
        }));
        Ok(Self {
            addr,
            tls,
            shutdown: Some(tx),
            task,
        })
    }

    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
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
