//! A `cascade serve` process of a region of several nodes over one
//! database: a standby until it takes the writer lease, then the writer
//! until it loses it, then a standby again.
//!
//! ```text
//!            ┌──────── lease expired or released: try_acquire → epoch ───────┐
//!            │                                                               ▼
//!   standby: forwards every call to the writer        writer: fence(epoch), Node::open (loads the
//!   (api/standby.rs), polls the lease                  region's state as a restart does), serves,
//!            ▲                                         renews every `renew_every`
//!            └── renew refused or late, a fenced commit, a commit of unknown outcome ──┘
//! ```
//!
//! One listener for the process's whole life: an accept task hands each
//! connection to whichever server runs now, so a role change never closes
//! the port (clients and peers see their open calls end, and reconnect).
//!
//! Safety is the store's fence, not this loop's timing: a writer that lost
//! its lease can still try to commit (a step in flight, a pause), and the
//! commit is refused inside its own transaction. This loop makes a writer
//! that cannot renew step down before the database would refuse it, and a
//! standby take over as soon as the lease runs out.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Mutex};
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::clock::monotonic_now;
use crate::config::NodeSettings;
use crate::ha::{HaSettings, WriterRole};
use crate::log_throttle::Throttle;
use crate::node::{Node, NodeEnv, NodeError};
use crate::store::{LeaseHolder, PostgresStore, StoreError, WriterLease};

/// The region's store and its lease: one PostgreSQL store for the
/// process's life, fenced anew at every takeover.
#[derive(Clone)]
pub struct SharedStore {
    pub store: Arc<PostgresStore>,
}

impl SharedStore {
    fn lease(&self) -> Arc<dyn WriterLease> {
        self.store.clone()
    }
}

/// A standby forgets a node that has not announced itself for this many
/// times the lease's time to live (it was stopped or died).
const FORGET_AFTER_TTLS: u32 = 12;

/// How long a standby that took the lease waits for the calls it was
/// forwarding to finish before it closes their connections.
const STANDBY_DRAIN: Duration = Duration::from_millis(500);

/// Connections accepted and not yet taken by a server.
const ACCEPT_BACKLOG: usize = 256;

/// Serves `listener` as a node of a region of several nodes until
/// `shutdown` resolves: a standby or the writer, as the lease decides. On
/// shutdown the writer stops its steps, flushes and releases the lease, so
/// a standby takes over at once instead of after the time to live.
pub async fn serve_region_node(
    settings: NodeSettings,
    shared: SharedStore,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), NodeError> {
    let bound = listener.local_addr()?;
    let ha = settings.ha.clone();
    let me = ha
        .holder(bound, settings.tls.is_some())
        .map_err(|e| NodeError::Config(e.to_string()))?;
    info!(region = %settings.region, node = %me.node, address = %me.address, "serving as a node of a region of several nodes");
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let connections = Connections::accept(listener);
    // One console for the process's life, across its roles; the node a
    // writer opens serves none of its own.
    let console = {
        let mut stop = stop_rx.clone();
        crate::api::server::start_region_console(&settings, bound, async move {
            let _ = stop.wait_for(|stop| *stop).await;
        })?
    };
    let mut settings = settings;
    settings.console_listen = None;
    let takeovers = Arc::new(AtomicU64::new(0));
    loop {
        let Some((epoch, asked_at)) = standby(&settings, &shared, &me, &connections, stop_rx.clone()).await? else {
            return stopped(console).await;
        };
        takeovers.fetch_add(1, Ordering::Relaxed);
        let role = WriterRole {
            me: me.clone(),
            epoch,
            lease: shared.lease(),
            takeovers: takeovers.clone(),
        };
        match write(&settings, &shared, role, asked_at, &connections, stop_rx.clone()).await? {
            Ended::Shutdown => return stopped(console).await,
            Ended::SteppedDown(why) => {
                warn!(region = %settings.region, node = %me.node, epoch, %why, "stepped down: this node is a standby again");
            }
        }
    }
}

/// The process stops: its console (told by the same signal) closes its
/// connections first.
async fn stopped(console: Option<tokio::task::JoinHandle<()>>) -> Result<(), NodeError> {
    if let Some(console) = console {
        let _ = console.await;
    }
    Ok(())
}

/// Accepted connections, handed to the server of the current role.
struct Connections {
    rx: Arc<Mutex<mpsc::Receiver<TcpStream>>>,
}

impl Connections {
    fn accept(listener: TcpListener) -> Self {
        let (tx, rx) = mpsc::channel(ACCEPT_BACKLOG);
        tokio::spawn(async move {
            let failing = Throttle::new(Duration::from_secs(10));
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        // As `Node::serve`: small writes (events, replies)
                        // must not wait for a delayed ACK.
                        let _ = stream.set_nodelay(true);
                        if tx.send(stream).await.is_err() {
                            return;
                        }
                        failing.reset();
                    }
                    Err(e) => {
                        // Out of file descriptors, mostly: wait a little
                        // rather than spin.
                        if let Some(more) = failing.admit() {
                            warn!(error = %e, suppressed = more.count(), "cannot accept a connection{more}");
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
        Self {
            rx: Arc::new(Mutex::new(rx)),
        }
    }

    /// The connections from now on, until the server that reads them stops
    /// reading (then the next role's server gets the rest).
    fn stream(&self) -> impl Stream<Item = Result<TcpStream, std::io::Error>> + Send + 'static {
        futures::stream::unfold(self.rx.clone(), |rx| async move {
            let next = rx.lock().await.recv().await;
            next.map(|stream| (Ok(stream), rx))
        })
    }
}

/// Runs a blocking lease call off the runtime's workers.
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(call)
        .await
        .unwrap_or_else(|e| Err(StoreError::Engine(format!("a lease call panicked: {e}"))))
}

/// Serves as a standby until this node takes the lease (its epoch, and
/// when the request that took it was sent) or shuts down (None).
async fn standby(
    settings: &NodeSettings,
    shared: &SharedStore,
    me: &LeaseHolder,
    connections: &Connections,
    mut stop: watch::Receiver<bool>,
) -> Result<Option<(u64, Instant)>, NodeError> {
    let ha = &settings.ha;
    let (writer_tx, writer_rx) = watch::channel::<Option<String>>(None);
    let (serving_tx, serving_rx) = watch::channel(false);
    let server = tokio::spawn(crate::api::standby::serve_standby(
        crate::api::standby::StandbySettings::of_node(settings),
        connections.stream(),
        writer_rx,
        async move {
            let mut serving_rx = serving_rx;
            let _ = serving_rx.wait_for(|stop| *stop).await;
        },
    ));
    let unreachable = Throttle::new(Duration::from_secs(30));
    let forget_after = ha.lease_ttl * FORGET_AFTER_TTLS;
    let taken = loop {
        if *stop.borrow() {
            break None;
        }
        // Before the request: the lease runs at least until
        // `valid_until` of this instant, whatever the request's latency.
        let asked_at = monotonic_now();
        let attempt = {
            let (lease, me, region) = (shared.lease(), me.clone(), settings.region.clone());
            let ttl = ha.lease_ttl;
            blocking(move || {
                if let Some(epoch) = lease.try_acquire(&me, ttl)? {
                    return Ok(Err(epoch));
                }
                // For status only: a failed announce must not keep this
                // node from taking over.
                if let Err(e) = lease.announce(&me, forget_after) {
                    tracing::debug!(%region, error = %e, "standby: could not announce itself");
                }
                lease.read().map(Ok)
            })
            .await
        };
        let wait = match attempt {
            Ok(Err(epoch)) => break Some((epoch, asked_at)),
            Ok(Ok(record)) => {
                unreachable.reset();
                let writer = record
                    .holder
                    .filter(|_| !record.expires_in.is_zero())
                    .map(|h| h.address)
                    .filter(|address| *address != me.address);
                writer_tx.send_if_modified(|current| {
                    let changed = *current != writer;
                    if changed {
                        info!(region = %settings.region, writer = writer.as_deref().unwrap_or("none"), "standby: the region's writer");
                        *current = writer.clone();
                    }
                    changed
                });
                // Poll again when the lease would expire if not renewed,
                // but at least every `renew_every`: a takeover then comes
                // within a few milliseconds of the expiry.
                (record.expires_in + Duration::from_millis(20)).min(ha.renew_every)
            }
            Err(e) => {
                if let Some(more) = unreachable.admit() {
                    warn!(region = %settings.region, error = %e, suppressed = more.count(),
                        "standby: cannot read the writer lease{more}");
                }
                ha.renew_every
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|stop| *stop) => {}
        }
    };
    let _ = serving_tx.send(true);
    // Taken just as the node was told to stop: give it back at once, so a
    // standby need not wait out the time to live.
    if let (Some((epoch, _)), true) = (taken, *stop.borrow()) {
        release(settings, &shared.lease(), epoch).await;
        return Ok(None);
    }
    // Calls the standby is forwarding (a client's Watch, a peer's stream)
    // may not end on their own: the writer must not wait on them. Their
    // clients reconnect, to this node as the writer.
    let mut server = server;
    match tokio::time::timeout(STANDBY_DRAIN, &mut server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => warn!(region = %settings.region, error = %e, "the standby server ended with an error"),
        Ok(Err(e)) => warn!(region = %settings.region, error = %e, "the standby server panicked"),
        Err(_) => server.abort(),
    }
    Ok(taken)
}

/// Why the writer's time ended.
#[derive(Clone)]
enum Ended {
    Shutdown,
    SteppedDown(String),
}

/// Serves as the writer at `role.epoch` (taken by a request sent at
/// `asked_at`) until shutdown or until the lease is lost.
async fn write(
    settings: &NodeSettings,
    shared: &SharedStore,
    role: WriterRole,
    asked_at: Instant,
    connections: &Connections,
    mut stop: watch::Receiver<bool>,
) -> Result<Ended, NodeError> {
    let ha = settings.ha.clone();
    let epoch = role.epoch;
    let lease = shared.lease();
    lease.fence(epoch);
    let mut lost = lease.lost();
    // Renewed from now on, also while the region's state loads: a large
    // region takes longer to load than the lease lives.
    let (why_tx, why_rx) = watch::channel::<Option<Ended>>(None);
    let why_tx = Arc::new(why_tx);
    let keeper = tokio::spawn(keep_lease(ha.clone(), lease.clone(), epoch, asked_at, why_tx.clone()));
    info!(region = %settings.region, node = %role.me.node, epoch, "took the writer lease: loading the region's state");
    let env = NodeEnv {
        // Bound to this epoch: a step of an earlier writer of this process
        // that still runs cannot commit at it.
        store: Some(shared.store.at_epoch(epoch)),
        role: Some(role.clone()),
        ..NodeEnv::default()
    };
    let node = match Node::open_with(settings.clone(), env).await {
        Ok(node) => node,
        Err(e) => {
            keeper.abort();
            release(settings, &lease, epoch).await;
            // A database that went away while the state loaded: a standby
            // again, to try later. Anything else (a corrupt record) is
            // this process's end: its supervisor restarts it, and says why.
            return match e {
                NodeError::Store(e) if e.may_clear() => {
                    tokio::time::sleep(ha.renew_every).await;
                    Ok(Ended::SteppedDown(format!("could not load the region's state: {e}")))
                }
                e => Err(e),
            };
        }
    };
    // The lease may have been lost while the state loaded.
    if why_rx.borrow().is_some() || *lost.borrow() {
        node.writer.stop().await;
        keeper.abort();
        release(settings, &lease, epoch).await;
        let why = why_rx.borrow().clone();
        return Ok(why.unwrap_or_else(|| Ended::SteppedDown("the lease was lost while the state loaded".into())));
    }
    info!(region = %settings.region, node = %role.me.node, epoch, "serving as the region's writer");
    let writer_ended = node.writer.ended_unasked();
    let end = {
        let why_tx = why_tx.clone();
        let mut why_rx = why_rx.clone();
        async move {
            tokio::select! {
                _ = stop.wait_for(|stop| *stop) => { why_tx.send_if_modified(|w| set_once(w, Ended::Shutdown)); }
                // No writer runs in this process any more: a standby (this
                // node's next turn, or another) takes over from the store.
                () = writer_ended => {
                    why_tx.send_if_modified(|w| set_once(w, Ended::SteppedDown(
                        "the writer's supervisor ended without being asked to".into())));
                }
                _ = lost.wait_for(|lost| *lost) => {
                    why_tx.send_if_modified(|w| set_once(w, Ended::SteppedDown(
                        "a commit was refused: another node holds the lease, or a commit's outcome is unknown".into())));
                }
                _ = why_rx.wait_for(|w| w.is_some()) => {}
            }
        }
    };
    let served = node.serve_incoming(connections.stream(), end).await;
    keeper.abort();
    let ended = why_rx
        .borrow()
        .clone()
        .unwrap_or_else(|| Ended::SteppedDown("the server ended".into()));
    match served {
        // Said by the step-down's line, with the writer's own error before it.
        Ok(()) | Err(NodeError::WriterEnded) => {}
        Err(e) => error!(region = %settings.region, epoch, error = %e, "the writer's server failed"),
    }
    // Released after the writer stopped and flushed (serve_incoming does
    // both): a standby that takes over reads everything this one wrote.
    // After a step-down the lease is someone else's (release changes
    // nothing then), or the database is unreachable.
    release(settings, &lease, epoch).await;
    Ok(ended)
}

/// Gives the lease held at `epoch` back (nothing if it moved on).
async fn release(settings: &NodeSettings, lease: &Arc<dyn WriterLease>, epoch: u64) {
    let lease = lease.clone();
    if let Err(e) = blocking(move || lease.release(epoch)).await {
        warn!(region = %settings.region, epoch, error = %e, "could not release the writer lease: a standby takes over when it expires");
    }
}

fn set_once(slot: &mut Option<Ended>, why: Ended) -> bool {
    if slot.is_some() {
        return false;
    }
    *slot = Some(why);
    true
}

/// Renews the lease every `renew_every`; says why the writer must step
/// down when a renew is refused or when none succeeded before its own
/// deadline.
async fn keep_lease(
    ha: HaSettings,
    lease: Arc<dyn WriterLease>,
    epoch: u64,
    asked_at: Instant,
    why: Arc<watch::Sender<Option<Ended>>>,
) {
    let mut valid_until = ha.valid_until(asked_at);
    let failing = Throttle::new(Duration::from_secs(10));
    loop {
        let next = (monotonic_now() + ha.renew_every).min(valid_until);
        tokio::time::sleep_until(next).await;
        if monotonic_now() >= valid_until {
            why.send_if_modified(|w| {
                set_once(
                    w,
                    Ended::SteppedDown(format!(
                        "the lease was not renewed within its time to live ({:?})",
                        ha.lease_ttl
                    )),
                )
            });
            return;
        }
        let sent_at = monotonic_now();
        let renew = {
            let lease = lease.clone();
            let ttl = ha.lease_ttl;
            tokio::time::timeout_at(valid_until, blocking(move || lease.renew(epoch, ttl))).await
        };
        match renew {
            Ok(Ok(true)) => {
                valid_until = ha.valid_until(sent_at);
                failing.reset();
            }
            Ok(Ok(false)) => {
                why.send_if_modified(|w| {
                    set_once(
                        w,
                        Ended::SteppedDown(format!(
                            "another node took the lease over (this node held epoch {epoch})"
                        )),
                    )
                });
                return;
            }
            Ok(Err(e)) => {
                if let Some(more) = failing.admit() {
                    warn!(epoch, error = %e, suppressed = more.count(), "cannot renew the writer lease{more}");
                }
            }
            // The deadline passed during the call: the next turn says so.
            Err(_) => {}
        }
    }
}
