//! A fault-injecting TCP proxy for tests of real nodes on loopback.
//!
//! Node X is configured to dial [`FaultProxy::addr`] (or [`FaultProxy::uri`])
//! instead of peer Y's address, and the proxy forwards every connection to Y
//! over real TCP. A test switches the [`Fault`] at run time with
//! [`FaultProxy::set`]; the change applies to the connections already open
//! and to new ones at once, so a partition can begin and end in the middle
//! of a call, a watch stream or a TLS session.
//!
//! Each accepted connection is one task that owns both sockets. Each
//! direction is a reader and a writer joined by a bounded queue (the delay
//! line of [`Fault::Latency`]); both consult a `watch` of the current fault
//! per chunk. [`FaultProxy::reset_all`] and stopping reach every connection
//! through two more `watch` channels; tearing a connection down drops its
//! pumps first and then both sockets with `SO_LINGER` 0, so the peers see a
//! TCP RST, not a FIN. Nothing outlives the handle: dropping it (or
//! [`FaultProxy::stop`]) ends the accept loop and every connection task.
//!
//! The counters say what happened, for assertions: a close is attributed to
//! the side whose read (or write) failed or returned EOF first, and is not
//! counted at all when the proxy itself reset the connection or was stopped.

// Test code: the delay line of `Fault::Latency` and the throttle's pacing
// are real time (`tokio::time::Instant::now`), as in the rest of tests/support.
#![allow(clippy::disallowed_methods)]

use std::future::pending;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, Instant};

/// Read buffer of each direction: large enough that a pump is never the
/// bottleneck on loopback, small enough to throttle finely.
const BUF: usize = 32 * 1024;
/// Chunks queued per direction between reader and writer. Bounds the memory
/// of a delay line (at most `QUEUE * BUF` bytes in flight per direction) and
/// makes a full delay line push back on the sender, as a real link would.
const QUEUE: usize = 64;
/// How long connecting to the upstream may take before the client is
/// treated as if the upstream had refused it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The throttle reads this fraction of a second's worth of bytes at a time,
/// so the rate is smooth at the scale of a test (50 ms steps).
const THROTTLE_SLICES_PER_SEC: u64 = 20;

/// What the proxy does to traffic; see [`FaultProxy::set`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forward both ways: a healthy link.
    Pass,
    /// A silent partition, as a network that loses every packet: open
    /// connections stay open and new ones are accepted (and connected to
    /// the upstream), but every byte read from either side is dropped.
    /// Nothing is closed and no RST is sent.
    ///
    /// Bytes are read and discarded rather than left unread, so neither
    /// side's send buffer fills: a sender sees its writes succeed and never
    /// get an answer, as behind a lossy network. The dropped bytes are gone:
    /// after the partition lifts the byte stream has a gap, which TLS and
    /// HTTP/2 detect and end the connection over (a reconnect then works).
    /// Use [`Fault::Hold`] for a partition that heals without loss.
    ///
    /// A close (FIN or RST) of one side is traffic too: it is held back
    /// while its direction is blocked and forwarded once it is not, so the
    /// partition also hides a peer's exit.
    Silent,
    /// Only one direction passes; the other is dropped as in
    /// [`Fault::Silent`]. `to_upstream: true` lets client→upstream bytes
    /// pass and drops upstream→client ones. Nothing is closed.
    OneWay { to_upstream: bool },
    /// A partition that loses nothing: the proxy stops reading both sides,
    /// so bytes wait in the kernel's buffers (and the senders' windows fill,
    /// as when nothing is acknowledged) and are delivered, in order, once
    /// the fault is lifted. Models a partition shorter than TCP's
    /// retransmission timeout. Not in the original brief; added because
    /// [`Fault::Silent`] cannot heal an HTTP/2 connection.
    Hold,
    /// New connections are closed at once with a TCP RST (`SO_LINGER` 0),
    /// as by a peer whose port is closed. Connections already open keep
    /// passing as in [`Fault::Pass`]. On loopback the kernel completes the
    /// handshake before the proxy accepts, so a dialler's `connect` usually
    /// succeeds and its first read or write fails with ECONNRESET (`connect`
    /// itself reports the reset when it lands first, under load).
    Refuse,
    /// New connections are accepted and whatever they send is read and
    /// thrown away; nothing is forwarded (the upstream is never dialled)
    /// and nothing is sent back: a peer that accepts TCP but never answers
    /// the TLS or HTTP/2 handshake. Connections already open keep passing.
    ///
    /// A connection accepted in this mode stays dead when the fault changes
    /// back to [`Fault::Pass`] (it never got an upstream): only connections
    /// accepted afterwards pass.
    Tarpit,
    /// Both directions pass, each limited to `bytes_per_sec` (0 counts as
    /// 1), by pacing reads in slices of 1/20 s worth of bytes, so a sender
    /// is pushed back on as on a slow link. Nothing is closed.
    Throttle { bytes_per_sec: u64 },
    /// Every chunk is delivered this much later than it was read, in each
    /// direction (a round trip costs twice), in order. The delay line is a
    /// queue per direction: reading goes on while earlier chunks wait.
    /// Closes travel the delay line too.
    Latency(Duration),
}

/// One direction of a proxied connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    ToUpstream,
    ToClient,
}

impl Fault {
    /// Bytes (and closes) in `dir` are dropped.
    fn blocks(self, dir: Dir) -> bool {
        match self {
            Fault::Silent => true,
            Fault::OneWay { to_upstream } => to_upstream != (dir == Dir::ToUpstream),
            _ => false,
        }
    }

    /// Nothing is read nor written, but nothing is lost either.
    fn holds(self) -> bool {
        self == Fault::Hold
    }

    /// Data and closes in `dir` go through now.
    fn passes(self, dir: Dir) -> bool {
        !self.holds() && !self.blocks(dir)
    }

    fn latency(self) -> Option<Duration> {
        match self {
            Fault::Latency(d) => Some(d),
            _ => None,
        }
    }

    fn rate(self) -> Option<u64> {
        match self {
            Fault::Throttle { bytes_per_sec } => Some(bytes_per_sec.max(1)),
            _ => None,
        }
    }
}

/// What the proxy did, for assertions. Plain atomics, read with `Relaxed`:
/// tests poll them with a deadline.
#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    open: AtomicU64,
    refused: AtomicU64,
    upstream_failures: AtomicU64,
    resets_by_proxy: AtomicU64,
    closed_by_client: AtomicU64,
    closed_by_upstream: AtomicU64,
    bytes_to_upstream: AtomicU64,
    bytes_to_client: AtomicU64,
    bytes_dropped: AtomicU64,
}

fn bump(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// What the accept loop and every connection task share.
struct Shared {
    upstream: SocketAddr,
    /// The current fault; pumps consult it per chunk.
    fault: watch::Sender<Fault>,
    /// Bumped by `reset_all`: every connection subscribed before resets.
    resets: watch::Sender<u64>,
    counters: Counters,
}

impl Shared {
    fn reset_all(&self) {
        self.resets.send_modify(|generation| *generation += 1);
    }
}

/// A running proxy from a loopback port to one upstream address. Dropping
/// it stops it (see [`FaultProxy::stop`]).
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// `true` (or dropped) stops the accept loop and every connection.
    stop: watch::Sender<bool>,
}

impl FaultProxy {
    /// Binds `127.0.0.1:0` and forwards every connection to `upstream`,
    /// starting in [`Fault::Pass`]. The upstream need not be listening yet:
    /// it is dialled per accepted connection (a refusal resets the client,
    /// as a direct dial would have failed).
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the fault proxy");
        let addr = listener.local_addr().expect("the fault proxy's address");
        let (stop, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            upstream,
            fault: watch::channel(Fault::Pass).0,
            resets: watch::channel(0).0,
            counters: Counters::default(),
        });
        tokio::spawn(accept_loop(listener, Arc::clone(&shared), stop_rx));
        FaultProxy { addr, shared, stop }
    }

    /// The address to give the dialler instead of the upstream's.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, for a peer entry or `Client::connect`. A TLS
    /// node dials `https://` + [`FaultProxy::addr`]: the proxy forwards
    /// bytes and does not care.
    pub fn uri(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address connections are forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// Switches the fault. Open connections see it from their next chunk
    /// (a chunk being written when it changes finishes); new connections
    /// see it when they are accepted.
    pub fn set(&self, fault: Fault) {
        self.shared.fault.send_replace(fault);
    }

    /// The current fault.
    pub fn fault(&self) -> Fault {
        *self.shared.fault.borrow()
    }

    /// Resets every open connection, both sides, now (RST with `SO_LINGER`
    /// 0), including tarpitted ones and ones still dialling the upstream.
    /// Counted in [`FaultProxy::resets_by_proxy`], never as a close by
    /// either side. Connections accepted afterwards follow the current
    /// fault.
    pub fn reset_all(&self) {
        self.shared.reset_all();
    }

    /// Calls [`FaultProxy::reset_all`] at random intervals in `[min, max]`
    /// for `for_how_long` (the last interval that would end after it is not
    /// waited for), or until the proxy stops. The intervals are a function
    /// of `seed` (xorshift; no `rand` dependency), so a failing run can be
    /// replayed. The handle yields how many times it reset.
    pub fn reset_loop(&self, min: Duration, max: Duration, for_how_long: Duration, seed: u64) -> JoinHandle<u32> {
        assert!(min <= max, "reset_loop: min {min:?} > max {max:?}");
        let shared = Arc::clone(&self.shared);
        let mut stop = self.stop.subscribe();
        tokio::spawn(async move {
            let mut rng = XorShift::new(seed);
            let end = Instant::now() + for_how_long;
            let mut resets = 0;
            loop {
                let at = Instant::now() + min + (max - min).mul_f64(rng.unit());
                if at > end {
                    return resets;
                }
                tokio::select! {
                    biased;
                    _ = stopped(&mut stop) => return resets,
                    _ = sleep_until(at) => {}
                }
                shared.reset_all();
                resets += 1;
            }
        })
    }

    /// Stops accepting (the listener closes as soon as the accept task runs)
    /// and resets every connection. Closes it causes are not counted.
    /// Idempotent; dropping the handle does the same.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    fn count(&self, counter: impl Fn(&Counters) -> &AtomicU64) -> u64 {
        counter(&self.shared.counters).load(Ordering::Relaxed)
    }

    /// Connections the listener accepted, in any mode (refused ones too).
    pub fn accepted(&self) -> u64 {
        self.count(|c| &c.accepted)
    }

    /// Client connections the proxy holds open now: proxied, tarpitted or
    /// still dialling the upstream (not refused ones).
    pub fn open(&self) -> u64 {
        self.count(|c| &c.open)
    }

    /// Connections reset at accept by [`Fault::Refuse`].
    pub fn refused(&self) -> u64 {
        self.count(|c| &c.refused)
    }

    /// Connections whose upstream could not be dialled (refused or timed
    /// out). The client was reset, or tarpitted if the fault at the time
    /// did not let upstream→client traffic through ([`Fault::Silent`],
    /// `OneWay { to_upstream: true }`, [`Fault::Hold`]): a partition hides
    /// the refusal, and that connection stays dead after it lifts.
    pub fn upstream_failures(&self) -> u64 {
        self.count(|c| &c.upstream_failures)
    }

    /// Connections torn down by [`FaultProxy::reset_all`].
    pub fn resets_by_proxy(&self) -> u64 {
        self.count(|c| &c.resets_by_proxy)
    }

    /// Connections the dialler closed or reset first (its side's read
    /// returned EOF or an error, or a write to it failed, before anything
    /// else ended the connection). A half-close counts when it happens.
    pub fn closed_by_client(&self) -> u64 {
        self.count(|c| &c.closed_by_client)
    }

    /// Connections the upstream closed or reset first (as for
    /// [`FaultProxy::closed_by_client`]).
    pub fn closed_by_upstream(&self) -> u64 {
        self.count(|c| &c.closed_by_upstream)
    }

    /// Bytes written to the upstream.
    pub fn bytes_to_upstream(&self) -> u64 {
        self.count(|c| &c.bytes_to_upstream)
    }

    /// Bytes written to the client.
    pub fn bytes_to_client(&self) -> u64 {
        self.count(|c| &c.bytes_to_client)
    }

    /// Bytes read and thrown away ([`Fault::Silent`], [`Fault::OneWay`],
    /// [`Fault::Tarpit`]).
    pub fn bytes_dropped(&self) -> u64 {
        self.count(|c| &c.bytes_dropped)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Returns once the proxy is stopped or its handle dropped.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

/// Closes `stream` with a TCP RST instead of a FIN.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stopped(&mut stop) => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            // EMFILE and the like: back off instead of spinning.
            Err(_) => {
                sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        bump(&shared.counters.accepted, 1);
        if *shared.fault.borrow() == Fault::Refuse {
            bump(&shared.counters.refused, 1);
            reset(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        // Subscribed here, so a reset_all from now on reaches it.
        let resets = shared.resets.subscribe();
        tokio::spawn(serve(Arc::clone(&shared), stream, stop.clone(), resets));
    }
}

/// Counts a connection in `open` while it lives.
struct OpenGuard<'a>(&'a AtomicU64);

impl<'a> OpenGuard<'a> {
    fn new(open: &'a AtomicU64) -> Self {
        bump(open, 1);
        OpenGuard(open)
    }
}

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why a connection task ended.
enum End {
    /// Both sides closed (FINs forwarded); sockets close normally.
    Closed,
    /// One side failed or reset; the other is reset too.
    Broken,
    /// `reset_all`.
    Reset,
    /// The proxy stopped.
    Stopped,
}

/// One accepted connection, from dialling the upstream to the end.
async fn serve(
    shared: Arc<Shared>,
    client: TcpStream,
    mut stop: watch::Receiver<bool>,
    mut resets: watch::Receiver<u64>,
) {
    let counters = &shared.counters;
    let _open = OpenGuard::new(&counters.open);
    let upstream = if *shared.fault.borrow() == Fault::Tarpit {
        None
    } else {
        let dial = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(shared.upstream));
        let dialled = tokio::select! {
            biased;
            _ = stopped(&mut stop) => {
                reset(client);
                return;
            }
            _ = resets.changed() => {
                bump(&counters.resets_by_proxy, 1);
                reset(client);
                return;
            }
            dialled = dial => dialled,
        };
        match dialled {
            Ok(Ok(upstream)) => Some(upstream),
            _ => {
                bump(&counters.upstream_failures, 1);
                if shared.fault.borrow().passes(Dir::ToClient) {
                    reset(client);
                    return;
                }
                // A partition hides the refusal: the client hears nothing.
                None
            }
        }
    };
    let end = match upstream {
        None => tarpit(&shared, client, &mut stop, &mut resets).await,
        Some(upstream) => {
            let _ = upstream.set_nodelay(true);
            proxy(&shared, client, upstream, &mut stop, &mut resets).await
        }
    };
    if let End::Reset = end {
        bump(&counters.resets_by_proxy, 1);
    }
}

/// Reads and discards what the client sends until it leaves, the proxy
/// resets it or stops. Never dials the upstream, never writes.
async fn tarpit(
    shared: &Shared,
    mut client: TcpStream,
    stop: &mut watch::Receiver<bool>,
    resets: &mut watch::Receiver<u64>,
) -> End {
    let counters = &shared.counters;
    let mut buf = vec![0u8; BUF];
    let end = loop {
        tokio::select! {
            biased;
            _ = stopped(stop) => break End::Stopped,
            _ = resets.changed() => break End::Reset,
            read = client.read(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    bump(&counters.closed_by_client, 1);
                    // Its FIN (or RST) ends it; our FIN back is harmless.
                    return End::Closed;
                }
                Ok(n) => bump(&counters.bytes_dropped, n as u64),
            },
        }
    };
    reset(client);
    end
}

/// Pumps both directions until both sides closed, one failed, the proxy
/// resets or stops; then drops the pumps and closes both sockets (with RST
/// unless both closed cleanly).
async fn proxy(
    shared: &Shared,
    mut client: TcpStream,
    mut upstream: TcpStream,
    stop: &mut watch::Receiver<bool>,
    resets: &mut watch::Receiver<u64>,
) -> End {
    // Set once the connection's end is attributed, so it is counted once.
    let attributed = AtomicBool::new(false);
    let end = {
        let (client_read, client_write) = client.split();
        let (upstream_read, upstream_write) = upstream.split();
        let to_upstream = pump(Dir::ToUpstream, client_read, upstream_write, shared, &attributed);
        let to_client = pump(Dir::ToClient, upstream_read, client_write, shared, &attributed);
        tokio::pin!(to_upstream, to_client);
        let (mut upstream_done, mut client_done) = (false, false);
        loop {
            tokio::select! {
                biased;
                _ = stopped(stop) => break End::Stopped,
                _ = resets.changed() => break End::Reset,
                end = &mut to_upstream, if !upstream_done => match end {
                    DirEnd::Eof => upstream_done = true,
                    DirEnd::Broken => break End::Broken,
                },
                end = &mut to_client, if !client_done => match end {
                    DirEnd::Eof => client_done = true,
                    DirEnd::Broken => break End::Broken,
                },
            }
            if upstream_done && client_done {
                break End::Closed;
            }
        }
        // The pumps (and their borrows of the sockets) are dropped here, so
        // nothing they would have seen of the teardown below is counted.
    };
    if !matches!(end, End::Closed) {
        reset(client);
        reset(upstream);
    }
    end
}

/// How one direction ended.
#[derive(Debug, PartialEq, Eq)]
enum DirEnd {
    /// The source closed and the FIN was forwarded.
    Eof,
    /// A read or write failed (a reset, usually).
    Broken,
}

/// One chunk in a direction's queue. `data: None` is the source's FIN.
struct Chunk {
    /// When to write it (`Fault::Latency`); `None`: at once.
    due: Option<Instant>,
    data: Option<Vec<u8>>,
}

/// Counts the end of the connection as `side`'s doing, unless something
/// already ended it.
fn attribute(shared: &Shared, attributed: &AtomicBool, side: Dir) {
    if !attributed.swap(true, Ordering::Relaxed) {
        let counter = match side {
            // The side a direction reads from: `ToUpstream` reads the client.
            Dir::ToUpstream => &shared.counters.closed_by_client,
            Dir::ToClient => &shared.counters.closed_by_upstream,
        };
        bump(counter, 1);
    }
}

/// One direction: a reader and a writer joined by the delay line. Ends
/// when the writer forwarded the FIN or either half failed.
async fn pump(
    dir: Dir,
    mut src: ReadHalf<'_>,
    mut dst: WriteHalf<'_>,
    shared: &Shared,
    attributed: &AtomicBool,
) -> DirEnd {
    let (tx, rx) = mpsc::channel(QUEUE);
    let reader = read_side(dir, &mut src, tx, shared, attributed);
    let writer = write_side(dir, &mut dst, rx, shared, attributed);
    tokio::select! {
        biased;
        end = reader => end,
        end = writer => end,
    }
}

/// Reads `src` chunk by chunk, dropping what the fault blocks and queueing
/// the rest with its due time. Stops reading while the fault holds, paces
/// reads under a throttle. Returns only when the read failed (after the
/// failure may pass); after EOF it queues the FIN and waits to be dropped.
async fn read_side(
    dir: Dir,
    src: &mut ReadHalf<'_>,
    tx: mpsc::Sender<Chunk>,
    shared: &Shared,
    attributed: &AtomicBool,
) -> DirEnd {
    let mut fault = shared.fault.subscribe();
    let mut buf = vec![0u8; BUF];
    // Throttle: when the next slice may be read. Never ahead of now when
    // idle, so no burst credit accumulates.
    let mut next_slice: Option<Instant> = None;
    loop {
        let Ok(current) = fault.wait_for(|f| !f.holds()).await.map(|f| *f) else {
            return pending().await;
        };
        let mut len = BUF;
        match current.rate() {
            Some(rate) => {
                if let Some(at) = next_slice.filter(|at| *at > Instant::now()) {
                    tokio::select! {
                        _ = sleep_until(at) => {}
                        // Re-evaluate: the throttle may be gone.
                        _ = fault.changed() => continue,
                    }
                }
                len = usize::try_from(rate / THROTTLE_SLICES_PER_SEC)
                    .unwrap_or(BUF)
                    .clamp(1, BUF);
            }
            None => next_slice = None,
        }
        let read = src.read(&mut buf[..len]).await;
        let now = Instant::now();
        let current = *fault.borrow_and_update();
        let n = match read {
            Ok(0) => {
                attribute(shared, attributed, dir);
                let fin = Chunk {
                    due: current.latency().map(|d| now + d),
                    data: None,
                };
                let _ = tx.send(fin).await;
                return pending().await;
            }
            Ok(n) => n,
            Err(_) => {
                attribute(shared, attributed, dir);
                // A reset is traffic too: held back while this direction is
                // blocked.
                if fault.wait_for(|f| f.passes(dir)).await.is_err() {
                    return pending().await;
                }
                return DirEnd::Broken;
            }
        };
        if let Some(rate) = current.rate() {
            let from = next_slice.map_or(now, |at| at.max(now));
            next_slice = Some(from + Duration::from_secs_f64(n as f64 / rate as f64));
        }
        if current.blocks(dir) {
            bump(&shared.counters.bytes_dropped, n as u64);
            continue;
        }
        let chunk = Chunk {
            due: current.latency().map(|d| now + d),
            data: Some(buf[..n].to_vec()),
        };
        if tx.send(chunk).await.is_err() {
            return pending().await;
        }
    }
}

/// Writes queued chunks to `dst` when due, unless the fault blocks their
/// direction by then (they are dropped) or holds (they wait). Forwards the
/// FIN once the direction passes.
async fn write_side(
    dir: Dir,
    dst: &mut WriteHalf<'_>,
    mut rx: mpsc::Receiver<Chunk>,
    shared: &Shared,
    attributed: &AtomicBool,
) -> DirEnd {
    let mut fault = shared.fault.subscribe();
    let sent = match dir {
        Dir::ToUpstream => &shared.counters.bytes_to_upstream,
        Dir::ToClient => &shared.counters.bytes_to_client,
    };
    // The side written to is the one the other direction reads.
    let dst_side = match dir {
        Dir::ToUpstream => Dir::ToClient,
        Dir::ToClient => Dir::ToUpstream,
    };
    while let Some(chunk) = rx.recv().await {
        if let Some(due) = chunk.due {
            sleep_until(due).await;
        }
        let Some(data) = chunk.data else {
            if fault.wait_for(|f| f.passes(dir)).await.is_err() {
                return pending().await;
            }
            let _ = dst.shutdown().await;
            return DirEnd::Eof;
        };
        let Ok(current) = fault.wait_for(|f| !f.holds()).await.map(|f| *f) else {
            return pending().await;
        };
        if current.blocks(dir) {
            bump(&shared.counters.bytes_dropped, data.len() as u64);
            continue;
        }
        if dst.write_all(&data).await.is_err() {
            attribute(shared, attributed, dst_side);
            return DirEnd::Broken;
        }
        bump(sent, data.len() as u64);
    }
    pending().await
}

/// xorshift64, seeded through splitmix64: reproducible intervals without a
/// `rand` dependency.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        XorShift(if z == 0 { 1 } else { z })
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}
