//! Benchmark harness: cost of a large cascade on each storage engine.
//!
//! `cargo bench --bench cascade` (N from `CASCADE_BENCH_N`, default 10,000)
//! creates one network with N ports, deletes it with cascade, and runs the
//! deletion work to the end, driving the protocol exactly as the node's
//! writer does (core step → atomic batch → commit), without gRPC. It prints
//! per engine: wall time, deleted resources per second, and key writes per
//! deleted resource (the floor of deletion throughput is that number times
//! the engine's write rate; see DESIGN.md, "Storage engine").

// Not a node: a benchmark: it measures real time (clippy.toml).
#![allow(clippy::disallowed_methods)]
// Its report is its output.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::sync::Arc;
use std::time::Instant;

use cascade_core::protocol::{self, DeleteRequest, RefRequest, ResourceSpec};
use cascade_core::{Ctx, Policy, RegionId, Schema, SequentialIds, Timestamp};
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

/// A policy that allows everything but is not `AllowAll`, so the closure
/// check walks the closure and decides every member (a policy engine's
/// own cost per decision is measured apart: this is the walk's).
/// It counts its decisions: the members the check decided.
#[derive(Default)]
struct AllowsEveryMember {
    decisions: std::sync::atomic::AtomicUsize,
}

impl cascade_core::auth::Authorize for AllowsEveryMember {
    fn decide(
        &self,
        _: &cascade_core::auth::Principal,
        _: cascade_core::auth::Verb,
        _: cascade_core::auth::Target<'_>,
    ) -> cascade_core::auth::Decision {
        self.decisions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        cascade_core::auth::Decision::allow("bench: allow every member")
    }
}

/// Runs of the closure check whose median is reported.
const CLOSURE_CHECK_RUNS: usize = 5;

struct Figures {
    /// Median time of the closure check (the delete's dry run for a
    /// principal under a policy that may refuse, this region's part).
    closure_check_secs: f64,
    /// Members that check walked and decided.
    closure_checked: usize,
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
    // closure, every member decided (nothing written).
    let mut check_times = Vec::new();
    let mut closure_checked = 0;
    for _ in 0..CLOSURE_CHECK_RUNS {
        let allows_every_member = AllowsEveryMember::default();
        let checked_ctx = Ctx {
            authorizer: &allows_every_member,
            ..ctx(clock)
        };
        let check = DeleteRequest {
            name: "bench/network/n".into(),
            cascade: true,
            dry_run: true,
            requested_by: "bench".into(),
            principal: cascade_core::auth::Principal {
                id: "bench".into(),
                groups: Vec::new(),
                via: cascade_core::auth::Via::Token,
            },
            ..Default::default()
        };
        let started = Instant::now();
        let step = protocol::delete(&state, checked_ctx, &mut ids, check).expect("closure check");
        check_times.push(started.elapsed().as_secs_f64());
        let protocol::DeleteOutcome::DryRun(plan) = step.value else {
            panic!("a dry run answers a plan");
        };
        assert!(plan.denied.is_empty(), "every member is allowed");
        closure_checked = allows_every_member.decisions.load(std::sync::atomic::Ordering::Relaxed);
    }
    check_times.sort_by(f64::total_cmp);
    let closure_check_secs = check_times[check_times.len() / 2];

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
        closure_check_secs,
        closure_checked,
        create_secs,
        delete_secs: started.elapsed().as_secs_f64(),
        deleted,
        key_writes,
        steps,
    }
}

fn report(engine: &str, f: &Figures) {
    println!(
        "{engine:<7} closure check (p50 of {CLOSURE_CHECK_RUNS}) {:>8.1} ms for {} members, {:.2} µs per member",
        f.closure_check_secs * 1e3,
        f.closure_checked,
        f.closure_check_secs * 1e6 / f.closure_checked.max(1) as f64,
    );
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
