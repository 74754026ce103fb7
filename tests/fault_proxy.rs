//! Self-tests of the fault-injecting TCP proxy (`tests/support/fault_proxy.rs`):
//! every fault, switched while connections are open, against a loopback echo
//! server or an upstream the test drives by hand, and gRPC to a real node
//! through it.

// Test code: round trips are timed with `Instant::now`.
#![allow(clippy::disallowed_methods)]
// Timings go to the terminal (`--nocapture`).
#![allow(clippy::print_stderr)]

mod support;

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_client::Client;
use cascade_proto::v1;
use support::fault_proxy::{Fault, FaultProxy};
use support::{eventually, full, spec, start_node};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// How long anything that should happen may take.
const LIMIT: Duration = Duration::from_secs(5);
/// How long "nothing arrives" is watched for.
const QUIET: Duration = Duration::from_millis(500);

/// A server on 127.0.0.1:0 behind the proxy: echoes every connection, or
/// hands each to the test to drive by hand.
struct Upstream {
    addr: SocketAddr,
    /// Connections accepted.
    accepted: Arc<AtomicU64>,
    /// Bytes the echo received.
    received: Arc<AtomicU64>,
    /// Accepted connections, when not echoing.
    conns: mpsc::UnboundedReceiver<TcpStream>,
    task: JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    async fn echo() -> Self {
        Self::start(true).await
    }

    async fn manual() -> Self {
        Self::start(false).await
    }

    async fn start(echo: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind upstream");
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicU64::new(0));
        let received = Arc::new(AtomicU64::new(0));
        let (tx, conns) = mpsc::unbounded_channel();
        let task = tokio::spawn({
            let accepted = Arc::clone(&accepted);
            let received = Arc::clone(&received);
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::Relaxed);
                    stream.set_nodelay(true).unwrap();
                    if echo {
                        tokio::spawn(echo_conn(stream, Arc::clone(&received)));
                    } else if tx.send(stream).is_err() {
                        return;
                    }
                }
            }
        });
        Upstream {
            addr,
            accepted,
            received,
            conns,
            task,
        }
    }

    /// The next connection the proxy made (manual upstream).
    async fn next(&mut self) -> TcpStream {
        tokio::time::timeout(LIMIT, self.conns.recv())
            .await
            .expect("the proxy connects upstream in time")
            .expect("upstream running")
    }

    fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
}

/// Echoes until EOF (then closes its side too) or an error.
async fn echo_conn(mut stream: TcpStream, received: Arc<AtomicU64>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) => {
                let _ = stream.shutdown().await;
                return;
            }
            Err(_) => return,
            Ok(n) => {
                received.fetch_add(n as u64, Ordering::Relaxed);
                if stream.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

async fn dial(proxy: &FaultProxy) -> TcpStream {
    let stream = TcpStream::connect(proxy.addr()).await.expect("connect to the proxy");
    stream.set_nodelay(true).unwrap();
    stream
}

/// Reads exactly `n` bytes within [`LIMIT`].
async fn read_n(stream: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    tokio::time::timeout(LIMIT, stream.read_exact(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("{n} bytes within {LIMIT:?}"))
        .expect("read");
    buf
}

/// Writes `msg` and expects it back, exactly.
async fn echoes(stream: &mut TcpStream, msg: &[u8]) {
    stream.write_all(msg).await.expect("write");
    assert_eq!(read_n(stream, msg.len()).await, msg, "echo of {msg:?}");
}

/// Nothing arrives for [`QUIET`], and the connection is not closed either.
async fn quiet(stream: &mut TcpStream) {
    let mut buf = [0u8; 256];
    match tokio::time::timeout(QUIET, stream.read(&mut buf)).await {
        Err(_) => {}
        Ok(Ok(0)) => panic!("expected silence, the connection was closed (EOF)"),
        Ok(Ok(n)) => panic!("expected silence, got {:?}", String::from_utf8_lossy(&buf[..n])),
        Ok(Err(e)) => panic!("expected silence, the connection failed: {e}"),
    }
}

/// The next read ends the connection: `None` for EOF, else the error kind.
/// Data or silence fails the test.
async fn end_of(stream: &mut TcpStream) -> Option<ErrorKind> {
    let mut buf = [0u8; 256];
    match tokio::time::timeout(LIMIT, stream.read(&mut buf)).await {
        Err(_) => panic!("the connection stayed open for {LIMIT:?}"),
        Ok(Ok(0)) => None,
        Ok(Ok(n)) => panic!("expected the end, got {:?}", String::from_utf8_lossy(&buf[..n])),
        Ok(Err(e)) => Some(e.kind()),
    }
}

/// Waits until `value()` equals `want`.
async fn wait_eq(what: &str, want: u64, value: impl Fn() -> u64) {
    eventually(LIMIT, &format!("{what} == {want} (is {})", value()), || {
        let ok = value() == want;
        async move { ok.then_some(()) }
    })
    .await
}

fn closes(proxy: &FaultProxy) -> (u64, u64) {
    (proxy.closed_by_client(), proxy.closed_by_upstream())
}

/// 1. Pass forwards both ways, intact, and the counters count it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_forwards_both_ways_and_counts() {
    let up = Upstream::echo().await;
    let proxy = FaultProxy::start(up.addr).await;
    assert_eq!(proxy.fault(), Fault::Pass);
    assert_eq!(proxy.uri(), format!("http://127.0.0.1:{}", proxy.addr().port()));
    let mut c = dial(&proxy).await;
    echoes(&mut c, b"hello").await;
    // 200 KiB of a pattern, written while it is read back.
    let payload: Vec<u8> = (0..200 * 1024).map(|i: u32| (i % 251) as u8).collect();
    let (mut r, mut w) = c.split();
    let mut back = vec![0u8; payload.len()];
    let (wrote, read) = tokio::join!(w.write_all(&payload), r.read_exact(&mut back));
    wrote.unwrap();
    read.unwrap();
    assert!(back == payload, "200 KiB came back intact");
    let total = 5 + payload.len() as u64;
    wait_eq("bytes_to_upstream", total, || proxy.bytes_to_upstream()).await;
    wait_eq("bytes_to_client", total, || proxy.bytes_to_client()).await;
    assert_eq!(up.received(), total);
    assert_eq!((proxy.accepted(), proxy.open()), (1, 1));
    assert_eq!(closes(&proxy), (0, 0));
    assert_eq!(
        (proxy.resets_by_proxy(), proxy.refused(), proxy.bytes_dropped()),
        (0, 0, 0)
    );
}

/// 2. Silent: nothing passes either way, nothing is closed, new connections
/// are accepted; after Pass the same connections echo again, and what was
/// sent during the partition is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_drops_everything_and_closes_nothing() {
    let up = Upstream::echo().await;
    let proxy = FaultProxy::start(up.addr).await;
    let mut c = dial(&proxy).await;
    echoes(&mut c, b"a").await;

    proxy.set(Fault::Silent);
    c.write_all(b"b").await.unwrap();
    // Accepted (and connected upstream) during the partition.
    let mut during = dial(&proxy).await;
    during.write_all(b"x").await.unwrap();
    tokio::join!(quiet(&mut c), quiet(&mut during));
    wait_eq("bytes_dropped", 2, || proxy.bytes_dropped()).await;
    assert_eq!((proxy.accepted(), proxy.open()), (2, 2));
    assert_eq!(closes(&proxy), (0, 0));
    assert_eq!(proxy.resets_by_proxy(), 0);

    proxy.set(Fault::Pass);
    // Exactly "c" comes back, not "bc": "b" was dropped, not delayed.
    echoes(&mut c, b"c").await;
    echoes(&mut during, b"d").await;
    assert_eq!(up.received(), 3, "a, c and d reached the upstream; b and x did not");
    assert_eq!(closes(&proxy), (0, 0));
}

/// Hold: nothing passes, nothing is lost; lifted, the held bytes arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_delivers_everything_once_lifted() {
    let up = Upstream::echo().await;
    let proxy = FaultProxy::start(up.addr).await;
    let mut c = dial(&proxy).await;
    echoes(&mut c, b"before").await;
    proxy.set(Fault::Hold);
    c.write_all(b"held").await.unwrap();
    quiet(&mut c).await;
    assert_eq!(up.received(), 6, "the held bytes did not reach the upstream yet");
    proxy.set(Fault::Pass);
    assert_eq!(read_n(&mut c, 4).await, b"held");
    echoes(&mut c, b"after").await;
    assert_eq!((proxy.bytes_dropped(), proxy.open()), (0, 1));
    assert_eq!(closes(&proxy), (0, 0));
}

/// 3. OneWay in each direction, on the same connection, driven from both
/// ends; the blocked direction's bytes are dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_way_passes_one_direction_only() {
    let mut up = Upstream::manual().await;
    let proxy = FaultProxy::start(up.addr).await;
    let mut c = dial(&proxy).await;
    let mut s = up.next().await;

    proxy.set(Fault::OneWay { to_upstream: true });
    c.write_all(b"ping").await.unwrap();
    assert_eq!(read_n(&mut s, 4).await, b"ping");
    s.write_all(b"pong").await.unwrap();
    quiet(&mut c).await;

    proxy.set(Fault::OneWay { to_upstream: false });
    s.write_all(b"back").await.unwrap();
    // "back", not "pong": that was dropped.
    assert_eq!(read_n(&mut c, 4).await, b"back");
    c.write_all(b"lost").await.unwrap();
    quiet(&mut s).await;

    proxy.set(Fault::Pass);
    c.write_all(b"fine").await.unwrap();
    assert_eq!(read_n(&mut s, 4).await, b"fine");
    s.write_all(b"good").await.unwrap();
    assert_eq!(read_n(&mut c, 4).await, b"good");
    assert_eq!(proxy.bytes_dropped(), 8, "pong and lost");
    wait_eq("bytes_to_upstream", 8, || proxy.bytes_to_upstream()).await;
    wait_eq("bytes_to_client", 8, || proxy.bytes_to_client()).await;
    assert_eq!(closes(&proxy), (0, 0));
}

/// 4. Refuse: a new connection is reset at once, the open one still echoes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuse_resets_new_connections_only() {
    let up = Upstream::echo().await;
    let proxy = FaultProxy::start(up.addr).await;
    let mut open = dial(&proxy).await;
    echoes(&mut open, b"one").await;

    proxy.set(Fault::Refuse);
    let started = Instant::now();
    match TcpStream::connect(proxy.addr()).await {
        Ok(mut refused) => assert_eq!(end_of(&mut refused).await, Some(ErrorKind::ConnectionReset)),
        Err(e) => assert!(
            matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused),
            "{e}"
        ),
    }
    eprintln!("refused connection reset after {:?}", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(1), "reset at once");
    echoes(&mut open, b"still here").await;
    assert_eq!((proxy.accepted(), proxy.refused(), proxy.open()), (2, 1, 1));
    assert_eq!(up.accepted(), 1, "the refused connection never reached the upstream");
    assert_eq!(closes(&proxy), (0, 0));
}

/// 5. Tarpit: accepted, read, never answered nor forwarded; it stays dead
/// after Pass, while a new connection echoes. Open connections pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tarpit_accepts_and_never_answers() {
    let up = Upstream::echo().await;
    let proxy = FaultProxy::start(up.addr).await;
    let mut before = dial(&proxy).await;
    echoes(&mut before, b"x").await;

    proxy.set(Fault::Tarpit);
    let mut pit = dial(&proxy).await;
    pit.write_all(b"hello").await.unwrap();
    quiet(&mut pit).await;
    echoes(&mut before, b"open ones pass").await;
    wait_eq("bytes_dropped", 5, || proxy.bytes_dropped()).await;
    assert_eq!(up.accepted(), 1, "the tarpit never dialled the upstream");

    proxy.set(Fault::Pass);
    pit.write_all(b"again").await.unwrap();
    quiet(&mut pit).await;
    let mut after = dial(&proxy).await;
    echoes(&mut after, b"alive").await;
    assert_eq!(up.accepted(), 2);
    assert_eq!((proxy.accepted(), proxy.open()), (3, 3));
    assert_eq!(closes(&proxy), (0, 0));
}

/// 6. Throttle at 32 KiB/s: 64 KiB echoed takes about two seconds (each
/// direction at the rate, pipelined), and closes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttle_limits_the_rate_and_closes_nothing() {
    let up = Upstream::echo().await;
    let proxy = FaultProxy::start(up.addr).await;
    let mut c = dial(&proxy).await;
    echoes(&mut c, b"warm").await;

    proxy.set(Fault::Throttle {
        bytes_per_sec: 32 * 1024,
    });
    let payload: Vec<u8> = (0..64 * 1024).map(|i: u32| (i % 253) as u8).collect();
    let started = Instant::now();
    let (mut r, mut w) = c.split();
    let mut back = vec![0u8; payload.len()];
    let (wrote, read) = tokio::join!(w.write_all(&payload), async {
        tokio::time::timeout(Duration::from_secs(10), r.read_exact(&mut back)).await
    });
    let took = started.elapsed();
    wrote.unwrap();
    read.expect("echo within 10 s").unwrap();
    eprintln!("64 KiB echoed at 32 KiB/s in {took:?}");
    assert!(back == payload, "intact");
    assert!(took >= Duration::from_millis(1500), "too fast: {took:?}");
    assert!(took < Duration::from_secs(4), "too slow: {took:?}");
    assert_eq!(closes(&proxy), (0, 0));
    assert_eq!((proxy.resets_by_proxy(), proxy.open()), (0, 1));

    proxy.set(Fault::Pass);
    echoes(&mut c, b"unthrottled").await;
}

/// 7. Latency 200 ms: a round trip takes at least 400 ms, order is kept,
/// and chunks in flight overlap (a delay line, not a sleeping reader).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_delays_each_direction_in_order() {
    let up = Upstream::echo().await;
    let proxy = FaultProxy::start(up.addr).await;
    let mut c = dial(&proxy).await;
    echoes(&mut c, b"0").await;

    proxy.set(Fault::Latency(Duration::from_millis(200)));
    let started = Instant::now();
    echoes(&mut c, b"1").await;
    let round_trip = started.elapsed();
    eprintln!("round trip at 200 ms latency: {round_trip:?}");
    assert!(round_trip >= Duration::from_millis(400), "{round_trip:?}");
    assert!(round_trip < Duration::from_secs(2), "{round_trip:?}");

    // Ten separate writes 20 ms apart: in order, and in about one round
    // trip plus the spread, not ten round trips.
    let started = Instant::now();
    let (mut r, mut w) = c.split();
    let writes = async {
        for b in b'a'..b'k' {
            w.write_all(&[b]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let mut back = [0u8; 10];
    let (_, read) = tokio::join!(writes, async {
        tokio::time::timeout(LIMIT, r.read_exact(&mut back)).await
    });
    read.expect("in time").unwrap();
    let took = started.elapsed();
    eprintln!("ten writes 20 ms apart echoed at 200 ms latency in {took:?}");
    assert_eq!(&back, b"abcdefghij");
    assert!(took >= Duration::from_millis(580), "{took:?}");
    assert!(took < Duration::from_millis(1500), "pipelined: {took:?}");

    proxy.set(Fault::Pass);
    let started = Instant::now();
    echoes(&mut c, b"2").await;
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(closes(&proxy), (0, 0));
}

/// 8. reset_all resets both sides of every connection, counted as the
/// proxy's doing only; new connections pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_all_resets_both_sides() {
    let mut up = Upstream::manual().await;
    let proxy = FaultProxy::start(up.addr).await;
    let mut c1 = dial(&proxy).await;
    let mut s1 = up.next().await;
    let mut c2 = dial(&proxy).await;
    let mut s2 = up.next().await;
    c1.write_all(b"1").await.unwrap();
    assert_eq!(read_n(&mut s1, 1).await, b"1");
    s2.write_all(b"2").await.unwrap();
    assert_eq!(read_n(&mut c2, 1).await, b"2");
    assert_eq!(proxy.open(), 2);

    proxy.reset_all();
    for stream in [&mut c1, &mut s1, &mut c2, &mut s2] {
        assert_eq!(end_of(stream).await, Some(ErrorKind::ConnectionReset));
    }
    wait_eq("resets_by_proxy", 2, || proxy.resets_by_proxy()).await;
    wait_eq("open", 0, || proxy.open()).await;
    assert_eq!(closes(&proxy), (0, 0));

    let mut c3 = dial(&proxy).await;
    let mut s3 = up.next().await;
    c3.write_all(b"3").await.unwrap();
    assert_eq!(read_n(&mut s3, 1).await, b"3");
    assert_eq!(proxy.resets_by_proxy(), 2);
}

/// 9. Closes are attributed to the side that closed first: a client's FIN
/// or RST, an upstream's FIN; each is forwarded, and counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closes_are_attributed_to_the_side_that_closed() {
    let mut up = Upstream::manual().await;
    let proxy = FaultProxy::start(up.addr).await;

    // The client closes (FIN): the upstream sees EOF.
    let c = dial(&proxy).await;
    let mut s = up.next().await;
    drop(c);
    wait_eq("closed_by_client", 1, || proxy.closed_by_client()).await;
    assert_eq!(end_of(&mut s).await, None);
    drop(s);
    wait_eq("open", 0, || proxy.open()).await;

    // The client resets: the upstream sees the reset.
    let c = dial(&proxy).await;
    let mut s = up.next().await;
    c.set_zero_linger().unwrap();
    drop(c);
    wait_eq("closed_by_client", 2, || proxy.closed_by_client()).await;
    assert_eq!(end_of(&mut s).await, Some(ErrorKind::ConnectionReset));
    wait_eq("open", 0, || proxy.open()).await;

    // The upstream closes: the client sees EOF; the client's close after
    // that is not counted again.
    let mut c = dial(&proxy).await;
    let s = up.next().await;
    drop(s);
    wait_eq("closed_by_upstream", 1, || proxy.closed_by_upstream()).await;
    assert_eq!(end_of(&mut c).await, None);
    drop(c);
    wait_eq("open", 0, || proxy.open()).await;

    assert_eq!(closes(&proxy), (2, 1));
    assert_eq!(proxy.resets_by_proxy(), 0);
}

/// An upstream that is down: the client is reset at once, unless a
/// partition hides it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_upstream_resets_the_client_unless_partitioned() {
    let gone = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    };
    let proxy = FaultProxy::start(gone).await;
    // The reset may come before `connect` returns, which then reports it.
    match TcpStream::connect(proxy.addr()).await {
        Ok(mut c) => assert_eq!(end_of(&mut c).await, Some(ErrorKind::ConnectionReset)),
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}"),
    }
    wait_eq("upstream_failures", 1, || proxy.upstream_failures()).await;

    proxy.set(Fault::Silent);
    let mut c = dial(&proxy).await;
    quiet(&mut c).await;
    assert_eq!(proxy.upstream_failures(), 2);
    assert_eq!(closes(&proxy), (0, 0));
}

/// reset_loop resets at random intervals within its bounds, for its time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_loop_resets_repeatedly_for_its_time() {
    let up = Upstream::echo().await;
    let proxy = FaultProxy::start(up.addr).await;
    let started = Instant::now();
    let resets = proxy.reset_loop(
        Duration::from_millis(50),
        Duration::from_millis(100),
        Duration::from_millis(800),
        7,
    );
    // Pings until the loop ends, dialling again whenever the connection
    // breaks (a reset can also land before `connect` returns).
    let mut c: Option<TcpStream> = None;
    let mut broken = 0;
    while !resets.is_finished() {
        let Some(stream) = c.as_mut() else {
            c = TcpStream::connect(proxy.addr()).await.ok();
            continue;
        };
        let mut buf = [0u8; 1];
        let ok = stream.write_all(b"p").await.is_ok()
            && matches!(tokio::time::timeout(LIMIT, stream.read(&mut buf)).await, Ok(Ok(1)));
        if !ok {
            broken += 1;
            c = None;
        }
    }
    let n = resets.await.unwrap();
    let took = started.elapsed();
    eprintln!("reset_loop: {n} resets in {took:?}, the client saw {broken} broken connections");
    assert!((7..=16).contains(&n), "800 ms / [50, 100] ms: {n}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(broken >= 1 && proxy.resets_by_proxy() >= 1);
    assert_eq!(closes(&proxy), (0, 0), "only the proxy closed connections");
    let mut after = dial(&proxy).await;
    echoes(&mut after, b"after").await;
}

/// Dropping the proxy resets its connections and stops accepting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_proxy_closes_everything() {
    let up = Upstream::echo().await;
    let proxy = FaultProxy::start(up.addr).await;
    let addr = proxy.addr();
    let mut c = dial(&proxy).await;
    echoes(&mut c, b"x").await;
    drop(proxy);
    assert_eq!(end_of(&mut c).await, Some(ErrorKind::ConnectionReset));
    eventually(LIMIT, "the proxy's port to refuse connections", || async {
        TcpStream::connect(addr).await.is_err().then_some(())
    })
    .await;
}

/// 10. gRPC to a real node through the proxy: a call succeeds in Pass,
/// fails with a short deadline in Silent, and succeeds again once the
/// partition lifts (on the same channel, which reconnects if the gap broke
/// its HTTP/2 connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_through_the_proxy() {
    let node = start_node().await;
    node.client
        .create(spec("project/p", &[]))
        .await
        .expect("create directly");
    let proxy = FaultProxy::start(node.node.addr).await;
    let client = Client::connect(&proxy.uri()).await.expect("connect through the proxy");
    let name = full("project/p");
    assert_eq!(client.get(&name).await.expect("get through the proxy").name, name);

    proxy.set(Fault::Silent);
    let mut req = tonic::Request::new(v1::GetRequest {
        name: name.clone(),
        show_deleted: false,
    });
    req.set_timeout(Duration::from_millis(500));
    let started = Instant::now();
    match tokio::time::timeout(Duration::from_secs(3), client.raw().get(req)).await {
        Err(_) => {}
        Ok(Ok(r)) => panic!("answered through a silent partition: {r:?}"),
        Ok(Err(s)) => assert!(
            matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ),
            "{s:?}"
        ),
    }
    eprintln!("gRPC get in Silent failed after {:?}", started.elapsed());
    assert_eq!(proxy.open(), 1, "the partition closed nothing");

    proxy.set(Fault::Pass);
    eventually(
        Duration::from_secs(10),
        "a get through the proxy after the partition",
        || async { client.get(&name).await.ok() },
    )
    .await;
    eprintln!(
        "after Pass: accepted {}, closed by client {}, by upstream {}",
        proxy.accepted(),
        proxy.closed_by_client(),
        proxy.closed_by_upstream()
    );
}

/// gRPC through a Hold: the call waits, then completes once lifted, on the
/// same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_survives_a_hold() {
    let node = start_node().await;
    node.client
        .create(spec("project/p", &[]))
        .await
        .expect("create directly");
    let proxy = FaultProxy::start(node.node.addr).await;
    let client = Client::connect(&proxy.uri()).await.expect("connect through the proxy");
    let name = full("project/p");
    client.get(&name).await.expect("get through the proxy");

    proxy.set(Fault::Hold);
    let call = tokio::spawn({
        let client = client.clone();
        let name = name.clone();
        async move { client.get(&name).await }
    });
    tokio::time::sleep(QUIET).await;
    assert!(!call.is_finished(), "answered through a hold");
    proxy.set(Fault::Pass);
    let got = tokio::time::timeout(LIMIT, call)
        .await
        .expect("answered once lifted")
        .unwrap()
        .expect("the held call succeeds");
    assert_eq!(got.name, name);
    assert_eq!((proxy.accepted(), proxy.open()), (1, 1));
    assert_eq!(closes(&proxy), (0, 0));
}
