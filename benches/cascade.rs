//! Benchmark harness: cost of a large cascade on each storage engine.
//!
//! `cargo bench --bench cascade` (N from `CASCADE_BENCH_N`, default 10,000)
//! creates one network with N ports, deletes it with cascade, and runs the
//! deletion work to the end, driving the protocol exactly as the node's
//! writer does (core step → atomic batch → commit), without gRPC. It prints
//! per engine: wall time, deleted resources per second, and key writes per
//! deleted resource (the floor of deletion throughput is that number times
//! the engine's write rate; see DESIGN.md, "Storage engine"). Before the
//! delete it times the closure check (the walk a delete under a policy
//! makes first, every member decided) twice: with a policy that allows
//! every member at no cost (the walk alone) and with the node's Cedar
//! authorizer on the example policy (`deploy/auth/policy.cedar`), for an
//! administrator (every member allowed, every member decided).

// Not a node: a benchmark: it measures real time (clippy.toml).
#![allow(clippy::disallowed_methods)]
// Its report is its output.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::sync::Arc;
use std::time::Instant;

use std::sync::atomic::{AtomicUsize, Ordering};

use cascade_core::auth::{Authorize, Decision, Principal, Target, Verb, Via};
use cascade_core::protocol::{self, DeleteRequest, RefRequest, ResourceSpec};
use cascade_core::{Ctx, Policy, RegionId, Schema, SequentialIds, Timestamp};
use cascade_node::auth::policy::PolicyAuthorizer;
use cascade_node::codec::{encode_writes, StoreState};
use cascade_node::store::{MemoryStore, SledStore, Store};

fn spec(name: &str, refs: &[(&str, &str)]) -> ResourceSpec {
    ResourceSpec {
        name: format!("bench/{name}"),
        refs: refs
            .iter()
            .map(|(f, t)| {
                (
                    f.to_string(),
                    vec![RefRequest {
                        name: format!("bench/{t}"),
                        uid: None,
                    }],
                )
            })
            .collect(),
        ..Default::default()
    }
}

const EXAMPLE_POLICY: &str = include_str!("../deploy/auth/policy.cedar");

/// A policy that allows everything but is not `AllowAll`, so the closure
/// check walks the closure and decides every member at no cost of its own:
/// the walk's.
struct AllowsEveryMember;

impl Authorize for AllowsEveryMember {
    fn decide(&self, _: &Principal, _: Verb, _: Target<'_>) -> Decision {
        Decision::allow("bench: allow every member")
    }
}

/// An authorizer that counts its decisions: the members the check decided.
struct Counted<'a> {
    inner: &'a dyn Authorize,
    decisions: AtomicUsize,
}

impl Authorize for Counted<'_> {
    fn decide(&self, principal: &Principal, verb: Verb, target: Target<'_>) -> Decision {
        self.decisions.fetch_add(1, Ordering::Relaxed);
        self.inner.decide(principal, verb, target)
    }
}

/// Runs of the closure check whose median is reported.
const CLOSURE_CHECK_RUNS: usize = 5;

/// One policy's closure check: the median of its runs and the members decided.
struct ClosureCheck {
    policy: &'static str,
    secs: f64,
    checked: usize,
}

struct Figures {
    /// The closure check (the delete's dry run for a principal under a
    /// policy that may refuse, this region's part) under each policy.
    closure_checks: Vec<ClosureCheck>,
    create_secs: f64,
    delete_secs: f64,
    deleted: u64,
    key_writes: usize,
    steps: usize,
}

fn run(store: &dyn Store, n: usize) -> Figures {
    let schema = Schema::from_toml(cascade_core::schema::EXAMPLE_SCHEMA).expect("example schema");
    let region = RegionId::parse("bench").expect("region");
    let policy = Policy::default();
    let mut ids = SequentialIds::default();
    let mut clock = 1u64;
    let apply = |step_writes: cascade_core::state::WriteSet| {
        let batch = encode_writes(&StoreState { store }, &step_writes).expect("encode");
        store.commit(batch).expect("commit");
        store.flush().expect("flush");
    };
    let ctx = |now| Ctx {
        schema: &schema,
        region: &region,
        now: Timestamp(now),
        policy: &policy,
        authorizer: &cascade_core::auth::AllowAll,
    };

    let started = Instant::now();
    let state = StoreState { store };
    let step = protocol::create(
        &state,
        ctx(clock),
        &mut ids,
        vec![spec("project/p", &[]), spec("network/n", &[("project", "project/p")])],
    )
    .expect("create");
    apply(step.writes);
    let ports: Vec<usize> = (0..n).collect();
    for chunk in ports.chunks(1000) {
        let specs = chunk
            .iter()
            .map(|i| spec(&format!("port/p{i}"), &[("network", "network/n")]))
            .collect();
        let step = protocol::create(&state, ctx(clock), &mut ids, specs).expect("create ports");
        apply(step.writes);
    }
    let create_secs = started.elapsed().as_secs_f64();

    // The closure check before the delete: the region's walk of the whole
    // closure, every member decided (nothing written), by an administrator
    // (the example policy allows every member, after deciding each).
    let cedar = PolicyAuthorizer::from_text(
        std::path::Path::new("deploy/auth/policy.cedar"),
        EXAMPLE_POLICY,
        // The node's policy metrics, in a registry nobody scrapes.
        &Default::default(),
    )
    .expect("the example policy loads");
    let policies: [(&'static str, &dyn Authorize); 2] = [
        ("allows every member (the walk alone)", &AllowsEveryMember),
        ("Cedar, the example policy", &cedar),
    ];
    let mut closure_checks = Vec::new();
    for (policy, authorizer) in policies {
        let mut check_times = Vec::new();
        let mut checked = 0;
        for _ in 0..CLOSURE_CHECK_RUNS {
            let counted = Counted {
                inner: authorizer,
                decisions: AtomicUsize::new(0),
            };
            let checked_ctx = Ctx {
                authorizer: &counted,
                ..ctx(clock)
            };
            let check = DeleteRequest {
                name: "bench/network/n".into(),
                cascade: true,
                dry_run: true,
                requested_by: "bench".into(),
                principal: Principal {
                    id: "bench".into(),
                    groups: vec!["admins".into()],
                    via: Via::Token,
                },
                ..Default::default()
            };
            let started = Instant::now();
            let step = protocol::delete(&state, checked_ctx, &mut ids, check).expect("closure check");
            check_times.push(started.elapsed().as_secs_f64());
            let protocol::DeleteOutcome::DryRun(plan) = step.value else {
                panic!("a dry run answers a plan");
            };
            assert!(
                plan.denied.is_empty(),
                "every member is allowed ({} refused)",
                plan.denied.len()
            );
            checked = counted.decisions.load(Ordering::Relaxed);
        }
        check_times.sort_by(f64::total_cmp);
        closure_checks.push(ClosureCheck {
            policy,
            secs: check_times[check_times.len() / 2],
            checked,
        });
    }

    let started = Instant::now();
    let delete = DeleteRequest {
        name: "bench/network/n".into(),
        cascade: true,
        dry_run: false,
        allow_missing: false,
        etag: None,
        uid: None,
        requested_by: "bench".into(),
        orphan: false,
        remote_kept: Default::default(),
        principal: Default::default(),
        retain_ms: 0,
        bounds: Default::default(),
        operation_id: None,
    };
    let step = protocol::delete(&state, ctx(clock), &mut ids, delete).expect("delete");
    let mut key_writes = step.writes.key_writes();
    apply(step.writes);
    let mut steps = 0;
    let mut deleted = 0;
    loop {
        clock += 1;
        let step = protocol::process_work(&state, ctx(clock)).expect("work");
        steps += 1;
        key_writes += step.writes.key_writes();
        deleted += step.value.purged as u64;
        let idle = step.value.items == 0 && !step.value.more;
        apply(step.writes);
        if idle {
            break;
        }
    }
    Figures {
        closure_checks,
        create_secs,
        delete_secs: started.elapsed().as_secs_f64(),
        deleted,
        key_writes,
        steps,
    }
}

fn report(engine: &str, f: &Figures) {
    for check in &f.closure_checks {
        println!(
            "{engine:<7} closure check (p50 of {CLOSURE_CHECK_RUNS}) {:>8.1} ms for {} members, {:.2} µs per member: {}",
            check.secs * 1e3,
            check.checked,
            check.secs * 1e6 / check.checked.max(1) as f64,
            check.policy,
        );
    }
    println!(
        "{engine:<7} create {:>7.2}s | cascade delete {:>7.2}s, {:>6} deleted, {:>8.0} deleted/s, {:>5} steps, {:.1} key writes per deleted resource",
        f.create_secs,
        f.delete_secs,
        f.deleted,
        f.deleted as f64 / f.delete_secs.max(1e-9),
        f.steps,
        f.key_writes as f64 / f.deleted.max(1) as f64,
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing
    // useful either; both just run the harness.
    let n: usize = std::env::var("CASCADE_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    println!(
        "cascade of one network with {n} ports (batch budget {})",
        Policy::default().batch_budget
    );
    // `CASCADE_BENCH_ENGINES=memory` profiles the core alone.
    let engines = std::env::var("CASCADE_BENCH_ENGINES").unwrap_or_else(|_| "memory,sled".into());
    if engines.split(',').any(|e| e == "memory") {
        let memory: Arc<dyn Store> = Arc::new(MemoryStore::default());
        report("memory", &run(memory.as_ref(), n));
    }
    if engines.split(',').any(|e| e == "sled") {
        let dir = tempfile::tempdir().expect("temp dir");
        let sled = SledStore::open(dir.path()).expect("sled opens");
        report("sled", &run(&sled, n));
    }
}
