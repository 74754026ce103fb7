//! The deeper run of the model: `cargo run -p cascade-model --release --example deep [-- max_depth]`.
//!
//! Explores [`Config::deep`] (two faults, two clock jumps per region, the
//! racing create) breadth-first on every core, prints the states explored
//! and the time taken, and fails on any property violation.

use std::time::Instant;

use cascade_model::{CascadeModel, Config};
use stateright::{Checker, Model};

fn main() {
    let depth: Option<usize> = std::env::args().nth(1).map(|d| d.parse().expect("max depth"));
    let config = match std::env::var("CASCADE_MODEL_CONFIG").as_deref() {
        Ok("bounded") => Config::bounded(),
        Ok("minimal") => Config::minimal(),
        _ => Config::deep(),
    };
    println!("config: {config:?}, max depth: {depth:?}");
    let started = Instant::now();
    let mut builder = CascadeModel::new(config).checker().threads(num_threads());
    if let Some(depth) = depth {
        builder = builder.target_max_depth(depth);
    }
    let checker = builder.spawn_bfs().join();
    println!(
        "states explored: {} (unique {}), max depth {}, in {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker.assert_properties();
    println!("all properties hold");
}

fn num_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
