//! Model checking of the cross-region deletion protocol (see the crate doc).
//!
//! - `exhaustive_near_the_root`: every interleaving up to a depth bound.
//! - `random_deep_traces`: random complete runs (every maximal path is
//!   finite), which reach the full purge and the blocked/failed outcomes.
//! - `random_runs_with_message_faults_crashes_and_a_racing_create`: the
//!   same over the deep configuration.
//! - `random_runs_with_a_budget_pause_resume_and_cancel` and
//!   `exhaustive_near_the_root_with_a_budget_and_controls`: the same with
//!   a budget of 4 members and pause, resume and cancel (issue 29).
//! - `random_runs_with_an_undelete_racing_the_expiry_and_a_second_delete`:
//!   the same with soft delete and the client's Undelete (issue 29), its
//!   answers lost and its driver crashed, racing the expiry, a second
//!   Delete of a restored member and an update of the unset referrer.
//! - `random_runs_with_schema_reloads_during_the_cascade` and
//!   `exhaustive_near_the_root_with_schema_reloads`: the same with every
//!   region reloading its schema at any moment (issue 31): a kind added,
//!   then the router's `block` gateway changed to `unset`, each judged by
//!   a reload's compatibility check (refused under a running deletion of
//!   its kinds, and then not applied).
//! - `deep` (ignored; also `cargo run -p cascade-model --release --example deep`):
//!   the larger configuration with message-level faults and the racing create.

// Test code, not a node: poll deadlines and elapsed times are real time,
// and made-up ids need no IdSource (clippy.toml).
#![allow(clippy::disallowed_methods)]
// Progress and results go to the terminal (`--nocapture`).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::time::{Duration, Instant};

use cascade_model::{CascadeModel, Config, ALWAYS};
use stateright::{Checker, Model, UniformChooser};

#[test]
fn setup_builds_the_topology_through_the_core() {
    let model = CascadeModel::new(Config::bounded());
    assert_eq!(model.initial.len(), 12);
    let init = &model.init_states()[0];
    for r in &init.regions {
        assert!(r
            .state
            .resources
            .values()
            .all(|r| r.state == cascade_core::ResourceState::Active));
        assert!(r.state.pending_attach.is_empty() && r.state.work.is_empty());
    }
    // Cross-region rows at the owners: p←m, n←pt, n2←r, m←x, pt←g, x←h.
    let remote_rows = init
        .regions
        .iter()
        .flat_map(|r| r.state.backrefs.values())
        .filter(|b| b.target.name.region() != b.referrer.name.region())
        .count();
    assert_eq!(
        remote_rows, 12,
        "each cross-region reference: owner row + importer mirror"
    );
    assert!(model.quiescent(init));
    assert!(model.leaks(init).is_empty(), "{:?}", model.leaks(init));
}

#[test]
fn exhaustive_near_the_root() {
    let started = Instant::now();
    let checker = CascadeModel::new(Config::bounded())
        .checker()
        .threads(2)
        .target_max_depth(8)
        .spawn_bfs()
        .join();
    println!(
        "exhaustive: {} states ({} unique), depth {}, {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    assert!(checker.unique_state_count() > 1_000);
    for name in ALWAYS {
        checker.assert_no_discovery(name);
    }
}

/// Random complete runs of `config` until 20,000 states; every property,
/// liveness included, must hold on each run.
fn random_complete_runs(config: Config, seed: u64, label: &str) {
    let started = Instant::now();
    let checker = CascadeModel::new(config)
        .checker()
        .threads(2)
        .target_state_count(20_000)
        .timeout(Duration::from_secs(40))
        .spawn_simulation(seed, UniformChooser)
        .join();
    println!(
        "simulation ({label}): {} states, depth {}, {:.1?}",
        checker.state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    assert!(checker.state_count() > 0);
    checker.assert_properties();
}

#[test]
fn random_deep_traces() {
    random_complete_runs(Config::bounded(), 7, "bounded config");
}

#[test]
fn random_runs_with_soft_delete() {
    // Members are buried DELETED (a window of 5 ms) instead of purged, and
    // a clock jump expires them: every property holds with the new state,
    // and the whole closure is still purged in the end.
    random_complete_runs(Config::soft_delete(), 13, "soft delete");
}

#[test]
fn random_runs_with_message_faults_crashes_and_a_racing_create() {
    // The deep configuration: requests and answers are separate messages
    // that are lost, duplicated and reordered, and a region crashes.
    random_complete_runs(Config::deep(), 11, "deep config");
}

#[test]
fn random_runs_with_a_budget_pause_resume_and_cancel() {
    // A budget of 4 of the closure's 8 members, leased by rb and rc from
    // ra, and each region paused, resumed or cancelled at any moment:
    // never more than 4 members leave ACTIVE, and every other property
    // holds (a member held by the budget or a cancel is explained).
    random_complete_runs(Config::bounded_with_controls(), 13, "budget and controls");
}

#[test]
fn random_runs_with_a_budget_controls_and_soft_delete() {
    // Both parts of issue 29 at once: the budget and controls of
    // `bounded_with_controls`, and members kept DELETED for a window that a
    // clock jump passes (`soft_delete`). A buried member counts against
    // the budget like a purged one.
    let config = Config {
        retain_ms: Config::soft_delete().retain_ms,
        jumps: Config::soft_delete().jumps,
        ..Config::bounded_with_controls()
    };
    random_complete_runs(config, 17, "budget, controls and soft delete");
}

#[test]
fn random_runs_with_an_undelete_racing_the_expiry_and_a_second_delete() {
    // Every run that finishes the deletion may undelete it, before or
    // after a clock jump expires its members: no member is both RESTORED
    // and purged, a finished undelete accounts for every member, and it
    // always ends.
    random_complete_runs(Config::undelete(), 29, "undelete");
}

#[test]
fn random_runs_with_schema_reloads_during_the_cascade() {
    random_complete_runs(Config::schema_change(), 31, "schema reloads");
}

#[test]
fn exhaustive_near_the_root_with_schema_reloads() {
    let started = Instant::now();
    let checker = CascadeModel::new(Config::schema_change())
        .checker()
        .threads(2)
        .target_max_depth(6)
        .spawn_bfs()
        .join();
    println!(
        "exhaustive (schema reloads): {} states ({} unique), depth {}, {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    assert!(checker.unique_state_count() > 1_000);
    for name in ALWAYS {
        checker.assert_no_discovery(name);
    }
}

#[test]
fn exhaustive_near_the_root_with_a_budget_and_controls() {
    let checker = CascadeModel::new(Config::bounded_with_controls())
        .checker()
        .threads(2)
        .target_max_depth(6)
        .spawn_bfs()
        .join();
    println!(
        "exhaustive with controls: {} states ({} unique)",
        checker.state_count(),
        checker.unique_state_count()
    );
    for name in ALWAYS {
        checker.assert_no_discovery(name);
    }
}

#[test]
#[ignore = "deep run (3 GB, a minute in release): cargo test -p cascade-model --release -- --ignored"]
fn deep() {
    let started = Instant::now();
    let checker = CascadeModel::new(Config::deep())
        .checker()
        .threads(std::thread::available_parallelism().map_or(1, |n| n.get()))
        .target_max_depth(10)
        .spawn_bfs()
        .join();
    println!(
        "deep: {} states ({} unique), depth {}, {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    for name in ALWAYS {
        checker.assert_no_discovery(name);
    }
}
