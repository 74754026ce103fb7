//! The deeper run of the model:
//! `cargo run -p cascade-model --release --example deep [-- MAX_DEPTH [RANDOM_STATES]]`.
//!
//! Explores [`Config::deep`] (two faults, two clock jumps per region,
//! message-level loss/duplication/reordering with crashes, the racing
//! create) in two ways, on every core, and fails on any violation:
//!
//! 1. breadth-first, exhaustively up to MAX_DEPTH (default 10: about
//!    325,000 states, 3 GB; each level multiplies memory by about four), checking
//!    the invariants that must hold in every state;
//! 2. random complete runs until RANDOM_STATES states (default 1,000,000),
//!    which reach the ends a depth bound cannot (the full purge, the
//!    explained FAILED) and check every property, liveness included.
//!
//! `CASCADE_MODEL_CONFIG=bounded|minimal` picks a smaller configuration.

// Not a node: an example run: it reports real elapsed time (clippy.toml).
#![allow(clippy::disallowed_methods)]
// Its report is its output.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::time::Instant;

use cascade_model::{CascadeModel, Config, ALWAYS};
use stateright::{Checker, Model, UniformChooser};

fn main() {
    let mut args = std::env::args().skip(1);
    let depth: usize = args.next().map_or(10, |d| d.parse().expect("MAX_DEPTH: a number"));
    let random_states: usize = args
        .next()
        .map_or(1_000_000, |n| n.parse().expect("RANDOM_STATES: a number"));
    let config = match std::env::var("CASCADE_MODEL_CONFIG").as_deref() {
        Ok("bounded") => Config::bounded(),
        Ok("minimal") => Config::minimal(),
        _ => Config::deep(),
    };
    println!("config: {config:?}");
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());

    let started = Instant::now();
    let bfs = CascadeModel::new(config.clone())
        .checker()
        .threads(threads)
        .target_max_depth(depth)
        .spawn_bfs()
        .join();
    println!(
        "exhaustive to depth {depth}: {} states ({} unique) in {:.1?}",
        bfs.state_count(),
        bfs.unique_state_count(),
        started.elapsed()
    );
    for name in ALWAYS {
        bfs.assert_no_discovery(name);
    }

    let started = Instant::now();
    let random = CascadeModel::new(config)
        .checker()
        .threads(threads)
        .target_state_count(random_states)
        .spawn_simulation(1, UniformChooser)
        .join();
    println!(
        "random complete runs: {} states, max depth {}, in {:.1?}",
        random.state_count(),
        random.max_depth(),
        started.elapsed()
    );
    random.assert_properties();
    println!("all properties hold");
}
