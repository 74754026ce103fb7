//! Creates a client can retry (issue 23, part 4).
//!
//! A create with a reference into another region is written CREATING
//! (invisible), attached at the owners, then settled. When its request dies
//! midway (the client's deadline, a reset connection, a crash) the resource
//! stays CREATING until someone settles it: a retry of the create (the node
//! finishes the earlier one first) or the reconciler. What a client sees
//! must stay true to what a Get sees: ALREADY_EXISTS only for a resource a
//! Get returns, and no acknowledged create lost.
//!
//! Real nodes on loopback behind `tests/support/fault_proxy.rs`.

// Test code: deadlines and elapsed times are real time (clippy.toml).
#![allow(clippy::disallowed_methods)]
// Progress and results go to the terminal (`--nocapture`).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::fault_proxy::Fault;
use crate::support::*;
use cascade_client::{Client, ClientError};
use cascade_proto::v1;

/// How long a client waits before it gives up on a call (and cancels it).
const CUT: Duration = Duration::from_millis(1500);

/// A reference pinned to `uid` (no Lookup at the owner: the create goes
/// straight to its durable CREATING write and the Attach).
fn pinned(name: &str, uid: &str) -> v1::ObjectRef {
    v1::ObjectRef {
        name: name.to_owned(),
        uid: uid.to_owned(),
        ..Default::default()
    }
}

/// `name` with `refs`: `(field, [pinned target])`.
fn spec_pinned(name: &str, refs: &[(&str, v1::ObjectRef)]) -> v1::ResourceSpec {
    v1::ResourceSpec {
        name: name.to_owned(),
        refs: refs
            .iter()
            .map(|(field, target)| v1::ReferenceField {
                field: (*field).to_owned(),
                targets: vec![target.clone()],
            })
            .collect(),
        ..Default::default()
    }
}

/// Runs a client call and gives up on it after [`CUT`]: the call is
/// dropped, its HTTP/2 stream reset, and the node's handler with it (a
/// forwarding node's too, and the owner's behind it). Panics if it answered.
async fn cut<T: std::fmt::Debug>(call: impl std::future::Future<Output = Result<T, ClientError>>) {
    if let Ok(answer) = tokio::time::timeout(CUT, call).await {
        panic!("the call was to be cut by its deadline, and it answered {answer:?}");
    }
}

/// The uid of `name` in `region`'s dump while it is CREATING.
async fn creating_uid(pc: &ProxiedCluster, region: &str, name: &str) -> String {
    let endpoint = pc.cluster.node(region).node.endpoint();
    eventually(Duration::from_secs(10), &format!("{name} to be CREATING"), || async {
        let d = dump(&endpoint).await.ok()?;
        d.resources
            .iter()
            .find(|r| r.name == name && state(r) == v1::ResourceState::Creating)
            .map(|r| r.uid.clone())
    })
    .await
}

fn details(e: &ClientError) -> v1::ErrorDetails {
    match e {
        ClientError::Status(s) => cascade_proto::error_details(s).unwrap_or_else(|| panic!("no details in {e}")),
        other => panic!("not a status: {other}"),
    }
}

fn reason(e: &ClientError) -> v1::ErrorReason {
    v1::ErrorReason::try_from(details(e).reason).unwrap_or(v1::ErrorReason::Unspecified)
}

async fn assert_not_found(client: &Client, name: &str, when: &str) {
    match client.get(name).await {
        Err(e) if code(&e) == Some(tonic::Code::NotFound) => {}
        other => panic!("{when}: a Get of {name} should say NOT_FOUND, got {other:?}"),
    }
}

/// Retries `create` until it answers something other than UNAVAILABLE
/// (a channel that redials after a fault). Every ALREADY_EXISTS is checked
/// at once against a Get through `reader`: it must return the resource.
async fn retry_create(via: &Client, reader: &Client, spec: &v1::ResourceSpec) -> Result<v1::Resource, ClientError> {
    eventually(
        Duration::from_secs(20),
        &format!("a retry of {} to answer", spec.name),
        || async {
            match via.create(spec.clone()).await {
                Err(e) if code(&e) == Some(tonic::Code::Unavailable) => {
                    assert_ne!(reason(&e), v1::ErrorReason::Unsettled, "{e}");
                    None
                }
                Err(e) if code(&e) == Some(tonic::Code::AlreadyExists) => {
                    let read = reader.get(&spec.name).await;
                    assert!(read.is_ok(), "ALREADY_EXISTS ({e}) while a Get says {read:?}");
                    Some(Err(e))
                }
                answer => Some(answer),
            }
        },
    )
    .await
}

/// One sample of a node's `/metrics`.
async fn gauge(addr: SocketAddr, name: &str) -> f64 {
    *crate::support::scrape(addr)
        .await
        .get(name)
        .unwrap_or_else(|| panic!("no sample {name} in the scrape"))
}

/// A create is forwarded by region A's node to region B's, which writes it
/// CREATING and asks A to attach; A's answer is held, and the client gives
/// up (its deadline), so the call is cut at every hop and the resource
/// stays CREATING, invisible. Whatever the retry answers, a Get agrees
/// with it: UNAVAILABLE naming A while A cannot be asked (the earlier
/// create is removed: a later retry creates afresh), ALREADY_EXISTS once
/// it can (the earlier create is finished, and a Get returns it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_create_after_a_cut_forward_answers_what_a_get_sees() {
    let pc = start_cluster_behind_proxies(&["ra", "rb"], |s| {
        s.metrics_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    })
    .await;
    let a = pc.cluster.client("ra");
    let b = pc.cluster.client("rb");
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/net", &[("project", &["ra/project/p"])]),
    ])
    .await
    .unwrap();
    let net = a.get("ra/network/net").await.unwrap();
    let port = |name: &str| spec_pinned(name, &[("network", pinned("ra/network/net", &net.uid))]);
    // The client asks region ra's node, which forwards to the owner, rb.
    let forwarder = pc.client("ra");
    let attach = pc.peer_proxy("rb", "ra");
    let metrics = pc.cluster.node("rb").node.metrics_addr().expect("metrics served");
    const OLDEST: &str = "cascade_creating_oldest_seconds";
    assert_eq!(gauge(metrics, OLDEST).await, 0.0, "nothing CREATING yet");

    // 1. Cut while the owner of the reference holds its answer.
    attach.set(Fault::Hold);
    let first = port("rb/port/p1");
    cut(forwarder.create(first.clone())).await;
    let earlier = creating_uid(&pc, "rb", "rb/port/p1").await;
    assert_not_found(a, "rb/port/p1", "while the create is unsettled").await;
    assert_not_found(b, "rb/port/p1", "while the create is unsettled").await;
    assert!(gauge(metrics, OLDEST).await > 0.0, "the unsettled create is counted");

    // ra cannot be asked now (its connection reset, new ones refused): the
    // retry says so, naming ra; not ALREADY_EXISTS, and not "unsettled"
    // when the node knows better. The earlier create is gone.
    attach.set(Fault::Refuse);
    attach.reset_all();
    let refused = forwarder.create(first.clone()).await.unwrap_err();
    assert_eq!(code(&refused), Some(tonic::Code::Unavailable), "{refused}");
    assert_eq!(reason(&refused), v1::ErrorReason::RegionUnavailable, "{refused}");
    assert_eq!(details(&refused).region, "ra", "{refused}");
    assert_not_found(b, "rb/port/p1", "after the UNAVAILABLE retry").await;
    let left = creating(&dump(&pc.cluster.node("rb").node.endpoint()).await.unwrap());
    assert!(left.is_empty(), "the earlier create was removed: {left:?}");

    // Once ra answers again, a retry creates it afresh.
    attach.set(Fault::Pass);
    let created = retry_create(forwarder, b, &first).await.expect("the retry creates it");
    assert_ne!(
        created.uid, earlier,
        "a new incarnation: the earlier create was removed"
    );
    let read = a.get("rb/port/p1").await.expect("a Get returns what the retry created");
    assert_eq!(
        (read.uid.as_str(), state(&read)),
        (created.uid.as_str(), v1::ResourceState::Active)
    );

    // 2. Cut again; this time ra answers by the time the client retries:
    // the node finishes the earlier create, and the retry answers what a
    // Get then returns.
    attach.set(Fault::Hold);
    let second = port("rb/port/p2");
    cut(forwarder.create(second.clone())).await;
    let earlier = creating_uid(&pc, "rb", "rb/port/p2").await;
    assert_not_found(a, "rb/port/p2", "while the create is unsettled").await;
    // Two clients retry at once (one through ra, one at rb itself): both
    // settle the same earlier create, which must be harmless.
    attach.set(Fault::Pass);
    let (answer, other) = tokio::join!(
        retry_create(forwarder, b, &second),
        retry_create(pc.client("rb"), b, &second)
    );
    let read = a
        .get("rb/port/p2")
        .await
        .expect("a Get returns it right after the retry");
    assert_eq!(state(&read), v1::ResourceState::Active);
    for answer in [answer, other] {
        match answer {
            Err(e) if code(&e) == Some(tonic::Code::AlreadyExists) => {
                assert_eq!(read.uid, earlier, "ALREADY_EXISTS: the earlier create, finished");
                assert_eq!(details(&e).resource.unwrap_or_default().name, "rb/port/p2");
            }
            Ok(r) => assert_eq!(r.uid, read.uid, "OK: the resource a Get returns"),
            Err(e) => panic!("the retry should answer OK or ALREADY_EXISTS: {e}"),
        }
    }
    eventually(Duration::from_secs(5), "no CREATING resource counted", || async {
        (gauge(metrics, OLDEST).await == 0.0).then_some(())
    })
    .await;
    wait_quiescent(&pc.cluster).await;
    assert_no_violations(&pc.cluster).await;
}

/// Regression (issue 23: "one resource with an `allow_dangling` reference
/// stayed CREATING for more than 120 s after the last kill"). A batch with
/// any cross-region reference is CREATING as a whole. Its members without a
/// tracked remote reference (one whose only remote reference is
/// `allow_dangling`, which keeps no back-reference; one whose references
/// are all local) have nothing to attach, and the reconciler returned them
/// unchanged, calling them confirmed, on every pass: CREATING for ever once
/// the request that made them died. Here the request is cut while the
/// attach of its one tracked reference is held, and the node restarts (as
/// after a kill): the reconciler must settle every member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_batch_member_whose_only_remote_reference_is_allow_dangling_is_settled_after_a_restart() {
    let mut pc = start_cluster_behind_proxies(&["ra", "rb"], |_| {}).await;
    let a = pc.cluster.client("ra");
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/net", &[("project", &["ra/project/p"])]),
        spec_in("ra/qos_policy/gold", &[]),
    ])
    .await
    .unwrap();
    let net = a.get("ra/network/net").await.unwrap();
    let gold = a.get("ra/qos_policy/gold").await.unwrap();
    pc.cluster
        .client("rb")
        .batch_create(vec![
            spec_in("rb/project/p", &[]),
            spec_in("rb/network/local", &[("project", &["rb/project/p"])]),
        ])
        .await
        .unwrap();
    let local = pc.cluster.client("rb").get("rb/network/local").await.unwrap();
    let batch = vec![
        // Tracked: a back-reference at ra, attached (held here).
        spec_pinned("rb/port/tracked", &[("network", pinned("ra/network/net", &net.uid))]),
        // Its only remote reference is allow_dangling: nothing to attach.
        spec_pinned(
            "rb/port/dangling",
            &[
                ("network", pinned("rb/network/local", &local.uid)),
                ("qos_policy", pinned("ra/qos_policy/gold", &gold.uid)),
            ],
        ),
        // Local references only, one to a CREATING sibling.
        spec_in("rb/trunk/t", &[("parent_port", &["rb/port/dangling"])]),
    ];
    let attach = pc.peer_proxy("rb", "ra");
    attach.set(Fault::Hold);
    cut(pc.client("rb").batch_create(batch)).await;
    let endpoint = pc.cluster.node("rb").node.endpoint();
    let members = ["rb/port/dangling", "rb/port/tracked", "rb/trunk/t"];
    eventually(Duration::from_secs(10), "the batch to be CREATING", || async {
        let left = creating(&dump(&endpoint).await.ok()?);
        (left == members).then_some(())
    })
    .await;
    for name in members {
        assert_not_found(pc.cluster.client("rb"), name, "while the batch is unsettled").await;
    }
    attach.set(Fault::Pass);
    pc.cluster.stop("rb").await;
    pc.cluster.restart("rb").await;

    let b = pc.cluster.client("rb");
    eventually(Duration::from_secs(15), "every member settled ACTIVE", || async {
        for name in members {
            let r = b.get(name).await.ok()?;
            if state(&r) != v1::ResourceState::Active {
                return None;
            }
        }
        Some(())
    })
    .await;
    let dangling = b.get("rb/port/dangling").await.unwrap();
    let qos = &dangling
        .refs
        .iter()
        .find(|f| f.field == "qos_policy")
        .expect("qos_policy kept")
        .targets[0];
    assert_eq!((qos.uid.as_str(), qos.dangling), (gold.uid.as_str(), false));
    let left = creating(&dump(&pc.cluster.node("rb").node.endpoint()).await.unwrap());
    assert!(left.is_empty(), "{left:?}");
    wait_quiescent(&pc.cluster).await;
    assert_no_violations(&pc.cluster).await;
}

/// Seconds of connection resets in the load test: `CASCADE_RESET_SECS`,
/// 60 unless set.
fn reset_secs() -> u64 {
    std::env::var("CASCADE_RESET_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60)
}

/// xorshift64*: the load's choices, a function of the seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n.max(1)
    }
}

/// Tries per call before a worker gives up on it (and leaves it to the end).
const TRIES: usize = 8;

/// What the load test's clients were told, and what they did.
#[derive(Default)]
struct Ledger {
    /// Created names that answered OK or ALREADY_EXISTS, with the networks
    /// they reference (a delete of one of them may cascade to them).
    acknowledged: BTreeMap<String, Vec<String>>,
    /// Every network a delete was sent for (whatever it answered).
    deletes: BTreeSet<String>,
    /// Networks each region's worker may reference: created and not
    /// deleted by the test.
    networks: BTreeMap<String, Vec<String>>,
    /// Creates every try of which failed in transit: tried again at the end.
    unanswered: Vec<Vec<v1::ResourceSpec>>,
    /// ALREADY_EXISTS answers whose Get right after said NOT_FOUND and
    /// that no delete of the test explains.
    phantom: Vec<String>,
    answers: BTreeMap<String, usize>,
    transit_failures: BTreeMap<String, usize>,
}

impl Ledger {
    /// Whether a delete of the test may have removed `name`.
    fn excused(&self, name: &str) -> bool {
        self.deletes.contains(name)
            || self
                .acknowledged
                .get(name)
                .is_some_and(|nets| nets.iter().any(|n| self.deletes.contains(n)))
    }
}

/// What the networks a spec references are.
fn networks_of(spec: &v1::ResourceSpec) -> Vec<String> {
    spec.refs
        .iter()
        .filter(|f| f.field == "network")
        .flat_map(|f| f.targets.iter().map(|t| t.name.clone()))
        .collect()
}

/// A failure in transit: the call may or may not have been applied, and
/// the client retries.
fn in_transit(e: &ClientError) -> bool {
    match code(e) {
        Some(
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown | tonic::Code::Cancelled,
        ) => true,
        // hyper/h2 report a stream cut mid-answer as INTERNAL.
        Some(tonic::Code::Internal) => {
            let text = e.to_string();
            text.contains("h2 protocol error") || text.contains("transport") || text.contains("connection")
        }
        Some(_) => false,
        None => true,
    }
}

/// Sends one create (a batch when more than one spec) with retries; records
/// what it was told. Returns whether it was acknowledged.
async fn create_with_retries(
    via: &Client,
    owner: &Client,
    specs: Vec<v1::ResourceSpec>,
    ledger: &Mutex<Ledger>,
    tries: usize,
) -> bool {
    for attempt in 0..tries {
        let call = async {
            if specs.len() == 1 {
                via.create(specs[0].clone()).await.map(|_| ())
            } else {
                via.batch_create(specs.clone()).await.map(|_| ())
            }
        };
        let answer = match tokio::time::timeout(Duration::from_secs(10), call).await {
            Ok(answer) => answer,
            Err(_) => {
                *ledger
                    .lock()
                    .unwrap()
                    .transit_failures
                    .entry("client deadline".into())
                    .or_default() += 1;
                continue;
            }
        };
        let label = match &answer {
            Ok(()) => "OK".to_owned(),
            Err(e) => format!("{:?}", code(e)),
        };
        *ledger.lock().unwrap().answers.entry(label).or_default() += 1;
        match answer {
            Ok(()) => {
                let mut l = ledger.lock().unwrap();
                for s in &specs {
                    l.acknowledged.insert(s.name.clone(), networks_of(s));
                }
                return true;
            }
            Err(e) if code(&e) == Some(tonic::Code::AlreadyExists) => {
                // Only our own earlier try can hold the name: it went
                // through, and a Get must return it (unless a delete of
                // ours removed it since). A batch's answer names one
                // member: that one is acknowledged.
                let name = details(&e).resource.unwrap_or_default().name;
                let read = owner.get(&name).await;
                let mut l = ledger.lock().unwrap();
                let spec = specs.iter().find(|s| s.name == name);
                let spec = spec.unwrap_or_else(|| panic!("ALREADY_EXISTS names {name}, not in the request: {e}"));
                l.acknowledged.insert(name.clone(), networks_of(spec));
                if matches!(&read, Err(e) if code(e) == Some(tonic::Code::NotFound)) && !l.excused(&name) {
                    l.phantom
                        .push(format!("{name}: ALREADY_EXISTS ({e}) but a Get said NOT_FOUND"));
                }
                return true;
            }
            Err(e) if in_transit(&e) => {
                *ledger
                    .lock()
                    .unwrap()
                    .transit_failures
                    .entry(format!("{:?}", code(&e)))
                    .or_default() += 1;
                tokio::time::sleep(Duration::from_millis(50 + 50 * attempt as u64)).await;
            }
            // A referenced network deleted meanwhile, or being deleted.
            Err(e) if matches!(code(&e), Some(tonic::Code::NotFound | tonic::Code::FailedPrecondition)) => {
                return false
            }
            Err(e) => panic!("create {:?}: unexpected answer {e}", specs[0].name),
        }
    }
    ledger.lock().unwrap().unanswered.push(specs);
    false
}

/// One region's client: creates ports referencing other regions' networks
/// (alone, forwarded through another region's node, or in a batch with a
/// member whose only remote reference is `allow_dangling`), creates
/// networks, and now and then deletes one of its networks with cascade.
async fn worker(
    region: String,
    others: Vec<String>,
    clients: BTreeMap<String, Client>,
    direct: Client,
    ledger: Arc<Mutex<Ledger>>,
    until: Instant,
    seed: u64,
) {
    let mut rng = Rng::new(seed);
    let own = &clients[&region];
    let mut k = 0;
    while Instant::now() < until {
        k += 1;
        let other = &others[rng.below(others.len())];
        let remote_net = {
            let l = ledger.lock().unwrap();
            let nets = &l.networks[other];
            nets[rng.below(nets.len())].clone()
        };
        let local_net = {
            let l = ledger.lock().unwrap();
            let nets = &l.networks[&region];
            nets[rng.below(nets.len())].clone()
        };
        let qos = format!("{other}/qos_policy/q");
        let port = |name: String, network: &str, qos: Option<&str>| {
            let (net, q) = ([network], qos.map(|q| [q]));
            let mut refs: Vec<(&str, &[&str])> = vec![("network", &net[..])];
            if let Some(q) = &q {
                refs.push(("qos_policy", &q[..]));
            }
            spec_in(&name, &refs)
        };
        match rng.below(10) {
            0..=2 => {
                let spec = port(
                    format!("{region}/port/p{k}"),
                    &remote_net,
                    (k % 2 == 0).then_some(qos.as_str()),
                );
                create_with_retries(own, &direct, vec![spec], &ledger, TRIES).await;
            }
            3 => {
                // Through another region's node, which forwards it.
                let spec = port(format!("{region}/port/p{k}"), &remote_net, None);
                create_with_retries(&clients[other], &direct, vec![spec], &ledger, TRIES).await;
            }
            4 | 5 => {
                let batch = vec![
                    port(format!("{region}/port/b{k}-tracked"), &remote_net, None),
                    port(format!("{region}/port/b{k}-dangling"), &local_net, Some(&qos)),
                ];
                create_with_retries(own, &direct, batch, &ledger, TRIES).await;
            }
            6 | 7 => {
                let name = format!("{region}/network/n{k}");
                let spec = spec_in(&name, &[("project", &[&format!("{region}/project/p")])]);
                if create_with_retries(own, &direct, vec![spec], &ledger, TRIES).await {
                    ledger.lock().unwrap().networks.get_mut(&region).unwrap().push(name);
                }
            }
            _ => {
                // Cascade-delete one of this region's networks (keep two).
                let victim = {
                    let mut l = ledger.lock().unwrap();
                    let nets = l.networks.get_mut(&region).unwrap();
                    if nets.len() <= 2 {
                        continue;
                    }
                    let victim = nets.remove(rng.below(nets.len()));
                    l.deletes.insert(victim.clone());
                    victim
                };
                for attempt in 0..TRIES {
                    match own.delete(delete_req(&victim, true)).await {
                        Err(e) if in_transit(&e) => {
                            tokio::time::sleep(Duration::from_millis(50 + 50 * attempt as u64)).await
                        }
                        _ => break,
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every connection of a three-region cluster (each node to each other,
/// each client to its node) is reset at random every 0.5 to 2 s for a
/// minute, under a load of cross-region creates and cascading deletes from
/// clients that retry what failed in transit. Every create a client was
/// told succeeded (OK, or ALREADY_EXISTS for its own earlier try) is
/// readable afterwards, unless a delete of the test removed it; and the
/// cluster settles to a state the invariant checker accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_reset_every_half_to_two_seconds_under_create_and_cascade_load_lose_no_acknowledged_create() {
    let started = Instant::now();
    let seed: u64 = std::env::var("CASCADE_RESET_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(23);
    let load_for = Duration::from_secs(reset_secs());
    let regions = ["ra", "rb", "rc"];
    let pc = start_cluster_behind_proxies(&regions, |_| {}).await;
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    for r in regions {
        let mut nets = Vec::new();
        let mut specs = vec![
            spec_in(&format!("{r}/project/p"), &[]),
            spec_in(&format!("{r}/qos_policy/q"), &[]),
        ];
        for i in 0..3 {
            let name = format!("{r}/network/seed{i}");
            specs.push(spec_in(&name, &[("project", &[&format!("{r}/project/p")])]));
            nets.push(name);
        }
        pc.cluster.client(r).batch_create(specs).await.unwrap();
        ledger.lock().unwrap().networks.insert(r.to_owned(), nets);
    }

    // Some latency on every hop, so that a reset finds calls in flight
    // (on bare loopback a create is over before most resets come).
    for p in pc.proxies() {
        p.set(Fault::Latency(Duration::from_millis(15)));
    }
    let resets: Vec<_> = pc
        .proxies()
        .enumerate()
        .map(|(i, p)| {
            p.reset_loop(
                Duration::from_millis(500),
                Duration::from_secs(2),
                load_for,
                seed + i as u64,
            )
        })
        .collect();
    let until = Instant::now() + load_for;
    let clients: BTreeMap<String, Client> = regions.iter().map(|r| (r.to_string(), pc.client(r).clone())).collect();
    let mut workers = Vec::new();
    for (i, r) in regions.iter().enumerate() {
        let others = regions.iter().filter(|o| *o != r).map(|o| o.to_string()).collect();
        workers.push(tokio::spawn(worker(
            r.to_string(),
            others,
            clients.clone(),
            pc.cluster.client(r).clone(),
            ledger.clone(),
            until,
            seed * 31 + i as u64,
        )));
    }
    for w in workers {
        w.await.expect("worker");
    }
    let mut reset_count = 0;
    for r in resets {
        reset_count += r.await.expect("reset loop");
    }

    // The resets are over: what every try failed in transit is tried once
    // more (a client retries), which also settles what those tries left
    // CREATING.
    let unanswered = std::mem::take(&mut ledger.lock().unwrap().unanswered);
    for specs in &unanswered {
        let region = &specs[0].name[..2];
        create_with_retries(
            &clients[region],
            pc.cluster.client(region),
            specs.clone(),
            &ledger,
            TRIES,
        )
        .await;
    }
    // What is left CREATING (a create whose target a delete of ours took
    // away before its retry) is the reconciler's, within `settle_after`.
    let endpoints = pc.cluster.endpoints();
    eventually(Duration::from_secs(45), "nothing left CREATING", || async {
        for (_, endpoint) in &endpoints {
            if !creating(&dump(endpoint).await.ok()?).is_empty() {
                return None;
            }
        }
        Some(())
    })
    .await;
    wait_quiescent(&pc.cluster).await;
    assert_no_violations(&pc.cluster).await;

    // (name, whether a delete of ours may have removed it)
    let acknowledged: Vec<(String, bool)> = {
        let l = ledger.lock().unwrap();
        l.acknowledged.keys().map(|n| (n.clone(), l.excused(n))).collect()
    };
    let mut lost = Vec::new();
    for (name, excused) in &acknowledged {
        let region = &name[..2];
        match pc.cluster.client(region).get(name).await {
            Ok(_) => {}
            Err(e) if code(&e) == Some(tonic::Code::NotFound) && *excused => {}
            Err(e) => lost.push(format!("{name}: {e}")),
        }
    }
    let l = ledger.lock().unwrap();
    println!(
        "seed {seed}: {} s of resets ({reset_count} resets), {} acknowledged creates, {} cascading deletes, \
         answers {:?}, failures in transit {:?}, {} creates retried after the resets; {:.1} s in all",
        load_for.as_secs(),
        l.acknowledged.len(),
        l.deletes.len(),
        l.answers,
        l.transit_failures,
        unanswered.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        l.phantom.is_empty(),
        "ALREADY_EXISTS for what a Get did not return: {:#?}",
        l.phantom
    );
    assert!(lost.is_empty(), "acknowledged creates lost: {lost:#?}");
    assert!(reset_count > 0, "the proxies reset connections");
    assert!(
        l.acknowledged.len() > 50,
        "a meaningful load: {} acknowledged",
        l.acknowledged.len()
    );
}
