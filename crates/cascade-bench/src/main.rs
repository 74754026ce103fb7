//! `cascade-bench`: benchmarks through the real product.
//!
//! ```sh
//! cargo run --release -p cascade-bench -- --quick     # about a minute
//! cargo run --release -p cascade-bench                # the full sizes (long)
//! ```
//!
//! Every row runs in a fresh child process (this binary re-executed with a
//! hidden `row` subcommand), so its peak RSS (`VmHWM`) is its own. In the
//! child, nodes are in-process: `Node::open`, then `Node::serve` on a
//! listener bound to `127.0.0.1:0`; clients talk real gRPC to them; the
//! engines write to a temporary directory (memory: none; postgres: a
//! schema per region in the database of `--postgres-url`, else of a
//! throwaway server the parent starts, each store fenced as its region's
//! writer and handed to `Node::open_with`, see `postgres.rs`). Writes are
//! counted by each node's `WriteStats`. The parent prints a table and the
//! issue's targets, and writes the rows to `target/bench/results.json`
//! after each one (a run stopped halfway keeps what it measured).
//!
//! The scenarios (docs/BENCHMARKS.md says more, and what each column is):
//!
//! - **P1, local cascade**: one region populated with BatchCreate, then
//!   Delete of a root with cascade, polled with GetOperation until done.
//!   Shapes of the example schema: `flat` (a network and `n` ports),
//!   `tree` (a project, `n/100` networks, the rest subnets: three levels),
//!   `unset` (a network, `n/2` ports, `n/2` floating IPs whose `port`
//!   reference is `unset`). While the cascade runs, one client issues small
//!   Creates against the same region in a loop: their p50/p99 say whether
//!   the deletion holds other writes. Measured: Delete call time, wall time
//!   to SUCCEEDED, deleted per second, key writes per deleted resource
//!   (the nodes' write counters across the deletion, minus what the
//!   concurrent Creates wrote), RSS before, at peak during and after.
//! - **Baseline** (after each P1 row): the raw engine (`Store`, no node)
//!   doing the same number of key writes with the same value bytes in the
//!   same number of batches, commit and flush each; the P1 row gets
//!   `p1_over_baseline` = its wall time over the baseline's.
//! - **Native** (after each P1 row on postgres): PostgreSQL's own `ON
//!   DELETE CASCADE` of the same shape and size on the same server (a
//!   parent row and `n` child rows with a foreign key; the tree's three
//!   levels; `SET NULL` for the unset shape), populated with
//!   `generate_series`: the time of the `DELETE` of the parent, and apart
//!   the `VACUUM` after it; the P1 row gets `p1_over_native`.
//! - **P2, cross-region cascade**: a network in `r0` and `n` ports
//!   referencing it spread over five regions; Delete with cascade; the
//!   aggregate rate is deleted resources (all regions) per second.
//! - **P3, notification latency**: every region imports from the five
//!   next ones (a port on each of their networks); networks are deleted
//!   one at a time; a sample is the time from the owner's DELETING event
//!   to the importer's DELETING event of its port, both seen on Watch
//!   streams in this process.
//! - **P4, memory**: the RSS of a process with one idle node. P1's rows
//!   carry the RSS during (peak) and after a cascade.
//! - **Decision** (`cascade-bench decision`): one authorization decision
//!   of the Cedar policy engine, in process (`decision.rs`).
//! - **P5, cross-region BatchCreate**: `n` ports in `r1` referencing a
//!   network in `r0`, batches of 1,000 from two callers; references/s.

// Not a node: a benchmark measures real time, and the parent reads the
// rows its children print (clippy.toml's sanctioned places are the node's).
#![allow(clippy::disallowed_methods)]
// Its report is its output.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod audit;
mod baseline;
mod decision;

/// glibc's malloc was about a third of the writer's CPU in a 1M cascade
/// (`perf record`, docs/BENCHMARKS.md); mimalloc is the process-wide allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
mod harness;
mod local;
mod postgres;
mod remote;
mod report;
mod spec;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use clap::{Parser, Subcommand};

use crate::harness::Result;
use crate::spec::{Engine, Row, RowSpec, Scenario, Shape, WriteFigures};

/// The prefix of the one line a child prints its row on.
const ROW_PREFIX: &str = "CASCADE_BENCH_ROW ";

#[derive(Parser)]
#[command(
    name = "cascade-bench",
    about = "Benchmarks Cascade through real nodes, gRPC and engines; writes target/bench/results.json"
)]
struct Cli {
    /// Small sizes: the whole run takes under a minute.
    #[arg(long)]
    quick: bool,
    /// Engines to run (default: every engine this build has).
    #[arg(long, value_delimiter = ',')]
    engines: Option<Vec<String>>,
    /// Scenarios to run: p1 (with its baseline), p2, p3, p4, p5, audit (default: all).
    #[arg(long, value_delimiter = ',')]
    scenarios: Option<Vec<String>>,
    /// P1 shapes to run: flat, tree, unset (default: all three).
    #[arg(long, value_delimiter = ',')]
    shapes: Option<Vec<String>>,
    /// Sizes for P1, P2 and P5, replacing the defaults (a list: 10000,100000).
    #[arg(long, value_delimiter = ',')]
    n: Option<Vec<u64>>,
    /// The nodes' writer and link tick in ms (`NodeSettings::tick`).
    #[arg(long, default_value_t = 200)]
    tick_ms: u64,
    /// Engine postgres on this server (`postgres://user@host:port/db` or a
    /// libpq key=value string, no password: CASCADE_PG_PASSWORD); default: a
    /// throwaway server started by cascade-testpg (fsync=off).
    #[arg(long)]
    postgres_url: Option<String>,
    /// P1, P2: no one-resource Deletes beside the cascade (the small-delete
    /// probe), only the small Creates: to measure what the probe adds.
    #[arg(long)]
    no_delete_probe: bool,
    /// Runs the whole plan this many times, one round after another, so
    /// that the sizes of a shape alternate; the slope and the linearity
    /// target then take the median of each size's rows, and postgres's
    /// flat rate target the median rate of its largest size's rows. Why:
    /// on a machine whose speed drifts over minutes, one run's slope moved
    /// by up to 1.6x from the next run's (docs/BENCHMARKS.md, "The
    /// key-write count at 1M"). 1 to 20.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// Where to write the rows (default: <target dir>/bench/results.json).
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Measures one row (JSON RowSpec) and prints it: what the parent runs.
    #[command(hide = true)]
    Row { spec: String },
    /// The cost of one authorization decision (issue 27): p50/p99 over
    /// `--decisions` decisions with the example policy and with it plus
    /// `--rules` rules, in process; rows also go to bench/decision.json.
    Decision {
        #[arg(long, default_value_t = 100_000)]
        decisions: usize,
        #[arg(long, default_value_t = 1_000)]
        rules: usize,
    },
}

/// `CARGO_TARGET_DIR` when set, else the workspace's `target/`.
fn default_out() -> PathBuf {
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap_or(std::path::Path::new("."));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    target.join("bench").join("results.json")
}

struct Sizes {
    p1_flat: Vec<u64>,
    p1_shapes: Vec<u64>,
    p2: Vec<u64>,
    p3: Vec<(usize, usize)>,
    p5: Vec<u64>,
    audit: Vec<u64>,
}

fn sizes(quick: bool, n: Option<&[u64]>) -> Sizes {
    let mut s = if quick {
        Sizes {
            p1_flat: vec![5_000],
            p1_shapes: vec![5_000],
            p2: vec![5_000],
            p3: vec![(10, 200)],
            p5: vec![5_000],
            audit: vec![10_000],
        }
    } else {
        Sizes {
            // 300k and 3M so that a cost per resource that grows with the
            // cascade shows as a slope (issue 28: fjall unset went 54 ->
            // 105 -> 195 us per resource at 100k, 300k, 1M).
            p1_flat: vec![10_000, 100_000, 300_000, 1_000_000, 3_000_000],
            p1_shapes: vec![100_000, 300_000, 1_000_000],
            p2: vec![1_000_000],
            p3: vec![(10, 2_000), (50, 2_000)],
            p5: vec![100_000],
            audit: vec![200_000],
        }
    };
    if let Some(n) = n {
        s.p1_flat = n.to_vec();
        s.p1_shapes = n.to_vec();
        s.p2 = n.to_vec();
        s.p5 = n.to_vec();
        s.audit = n.to_vec();
    }
    s
}

fn plan(
    cli: &Cli,
    engines: &[Engine],
    scenarios: &[Scenario],
    shapes: &[Shape],
    pg: Option<&postgres::PgTarget>,
) -> Vec<RowSpec> {
    let s = sizes(cli.quick, cli.n.as_deref());
    let base = |scenario, engine, n, regions| RowSpec {
        scenario,
        engine,
        n,
        regions,
        shape: None,
        samples: 0,
        baseline_of: None,
        deleted: None,
        tick_ms: cli.tick_ms,
        postgres: pg.cloned(),
        delete_probe: !cli.no_delete_probe,
    };
    let mut out = Vec::new();
    for &scenario in scenarios {
        for &engine in engines {
            match scenario {
                Scenario::P1 => {
                    let flat = if shapes.contains(&Shape::Flat) {
                        &s.p1_flat[..]
                    } else {
                        &[]
                    };
                    for &n in flat {
                        out.push(RowSpec {
                            shape: Some(Shape::Flat),
                            ..base(scenario, engine, n, 1)
                        });
                    }
                    for shape in [Shape::Tree, Shape::Unset].into_iter().filter(|s| shapes.contains(s)) {
                        for &n in &s.p1_shapes {
                            out.push(RowSpec {
                                shape: Some(shape),
                                ..base(scenario, engine, n, 1)
                            });
                        }
                    }
                }
                Scenario::P2 => out.extend(s.p2.iter().map(|&n| base(scenario, engine, n, 5))),
                Scenario::P3 => out.extend(s.p3.iter().map(|&(regions, samples)| RowSpec {
                    samples,
                    ..base(scenario, engine, samples as u64, regions)
                })),
                Scenario::P4 => out.push(base(scenario, engine, 0, 1)),
                Scenario::P5 => out.extend(s.p5.iter().map(|&n| base(scenario, engine, n, 2))),
                Scenario::Audit => out.extend(s.audit.iter().map(|&n| base(scenario, engine, n, 1))),
                Scenario::Baseline | Scenario::Native => {}
            }
        }
    }
    out
}

/// Runs one row in a fresh child process and reads its row back.
fn run_child(spec: &RowSpec) -> Row {
    let failed = |why: String| Row {
        error: Some(why),
        ..Row::for_spec(spec)
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return failed(format!("cannot find this executable: {e}")),
    };
    let arg = match serde_json::to_string(spec) {
        Ok(a) => a,
        Err(e) => return failed(e.to_string()),
    };
    let mut child = match Command::new(exe)
        .arg("row")
        .arg(arg)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return failed(format!("cannot start the child: {e}")),
    };
    let mut row = None;
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(std::result::Result::ok) {
            if let Some(json) = line.strip_prefix(ROW_PREFIX) {
                row = Some(serde_json::from_str::<Row>(json).map_err(|e| e.to_string()));
            }
        }
    }
    let status = child.wait();
    match (row, status) {
        (Some(Ok(row)), _) => row,
        (Some(Err(e)), _) => failed(format!("unreadable row: {e}")),
        (None, Ok(s)) => failed(format!("the child printed no row ({s})")),
        (None, Err(e)) => failed(format!("the child printed no row: {e}")),
    }
}

fn describe(spec: &RowSpec) -> String {
    let shape = spec.shape.map(|s| format!(" {}", s.as_str())).unwrap_or_default();
    format!(
        "{}{shape} {} n={} regions={}",
        spec.scenario.as_str(),
        spec.engine,
        spec.n,
        spec.regions
    )
}

fn parent(cli: &Cli) -> Result<()> {
    let all_started = Instant::now();
    let asked = cli.engines.is_some();
    let mut engines: Vec<Engine> = match &cli.engines {
        Some(list) => list
            .iter()
            .map(|e| Engine::parse(e))
            .collect::<std::result::Result<_, _>>()?,
        None => Engine::ALL
            .into_iter()
            .filter(|&e| match harness::engine_available(e) {
                Ok(()) => true,
                Err(why) => {
                    eprintln!("skipping engine {e}: {why}");
                    false
                }
            })
            .collect(),
    };
    // The server postgres rows run on, found once for the whole run (a
    // throwaway one lives as long as this process).
    let pg = if engines.contains(&Engine::Postgres) {
        match postgres::resolve(cli.postgres_url.as_deref()) {
            Ok(target) => {
                let kind = if target.throwaway {
                    "a throwaway server (fsync=off)"
                } else {
                    "--postgres-url"
                };
                eprintln!("engine postgres: {kind}, {}", target.url);
                Some(target)
            }
            Err(why) if asked => return Err(format!("engine postgres: {why}").into()),
            Err(why) => {
                eprintln!("skipping engine postgres: {why}");
                engines.retain(|&e| e != Engine::Postgres);
                None
            }
        }
    } else {
        None
    };
    let scenarios: Vec<Scenario> = match &cli.scenarios {
        Some(list) => list
            .iter()
            .map(|s| Scenario::parse(s))
            .collect::<std::result::Result<_, _>>()?,
        None => Scenario::SELECTABLE.to_vec(),
    };
    let shapes: Vec<Shape> = match &cli.shapes {
        Some(list) => list
            .iter()
            .map(|s| Shape::parse(s))
            .collect::<std::result::Result<_, _>>()?,
        None => Shape::ALL.to_vec(),
    };
    let once = plan(cli, &engines, &scenarios, &shapes, pg.as_ref());
    let plan: Vec<RowSpec> = (0..cli.rounds).flat_map(|_| once.iter().cloned()).collect();
    let out = cli.out.clone().unwrap_or_else(default_out);
    let mut rows = Vec::new();
    let total = plan.len();
    for (i, spec) in plan.iter().enumerate() {
        eprintln!("[{}/{total}] {} ...", i + 1, describe(spec));
        let started = Instant::now();
        let mut row = run_child(spec);
        eprintln!(
            "[{}/{total}] {} done in {:.1} s",
            i + 1,
            describe(spec),
            started.elapsed().as_secs_f64()
        );
        if spec.scenario == Scenario::P1 && row.error.is_none() {
            let figures = WriteFigures {
                key_writes: row.key_writes.unwrap_or(0),
                value_bytes: row.value_bytes.unwrap_or(0),
                batches: row.batches.unwrap_or(1),
            };
            let b = RowSpec {
                scenario: Scenario::Baseline,
                baseline_of: Some(figures),
                deleted: row.deleted,
                ..spec.clone()
            };
            eprintln!("[{}/{total}] {} ...", i + 1, describe(&b));
            let base = run_child(&b);
            if let (Some(p1), Some(bw)) = (row.wall_s, base.wall_s) {
                row.p1_over_baseline = Some(harness::round2(p1 / bw.max(1e-9)));
            }
            let native = (spec.engine == Engine::Postgres).then(|| {
                let n = RowSpec {
                    scenario: Scenario::Native,
                    ..spec.clone()
                };
                eprintln!("[{}/{total}] {} ...", i + 1, describe(&n));
                run_child(&n)
            });
            if let (Some(p1), Some(nw)) = (row.wall_s, native.as_ref().and_then(|n| n.wall_s)) {
                row.p1_over_native = Some(harness::round2(p1 / nw.max(1e-9)));
            }
            rows.push(row);
            rows.push(base);
            rows.extend(native);
        } else {
            rows.push(row);
        }
        // After every row, so a run stopped halfway keeps what it measured.
        report::write_json(&out, &rows)?;
    }
    println!("{}", report::table(&rows));
    let slope = report::slope(&rows);
    if !slope.is_empty() {
        println!("P1 slope: time per touched resource (deleted + unset), us, and its growth:");
        println!("{slope}");
    }
    println!("targets (the issue's; pass/FAIL on this run's rows):");
    println!("{}", report::targets(&rows));
    if rows.iter().any(|r| r.scenario == "p3") {
        println!(
            "P3 ran with the nodes' tick at {} ms (--tick-ms): events travel on watch streams, not on the tick; a 20 ms tick measured no lower.",
            cli.tick_ms
        );
    }
    println!(
        "{} rows written to {} in {:.1} s",
        rows.len(),
        out.display(),
        all_started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Measures one row in this process.
async fn measure(spec: &RowSpec) -> Result<Row> {
    match spec.scenario {
        Scenario::P1 => local::p1(spec).await,
        Scenario::Baseline => match &spec.postgres {
            Some(target) if spec.engine == Engine::Postgres => {
                let schema = postgres::schema_name("baseline");
                let row = tokio::task::block_in_place(|| baseline::run_in(spec, &schema));
                postgres::drop_schemas(target, &[schema]).await?;
                row
            }
            _ => baseline::run(spec),
        },
        Scenario::Native => {
            let target = spec.postgres.as_ref().ok_or("a native row without a database")?;
            postgres::native(spec, target).await
        }
        Scenario::P2 => remote::p2(spec).await,
        Scenario::P3 => remote::p3(spec).await,
        Scenario::P4 => local::p4(spec).await,
        Scenario::P5 => remote::p5(spec).await,
        Scenario::Audit => audit::retention(spec).await,
    }
}

fn child(spec: &str) -> Result<()> {
    let spec: RowSpec = serde_json::from_str(spec)?;
    // The nodes' logs, on the terminal, when asked for (`RUST_LOG=warn`):
    // off by default, since formatting them costs what is measured.
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let row = runtime.block_on(measure(&spec)).unwrap_or_else(|e| Row {
        error: Some(e.to_string()),
        ..Row::for_spec(&spec)
    });
    println!("{ROW_PREFIX}{}", serde_json::to_string(&row)?);
    // Nodes still stopping (a stop that timed out) do not hold the row.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    let result = match &cli.command {
        Some(Cmd::Row { spec }) => child(spec),
        Some(Cmd::Decision { decisions, rules }) => decision::run(*decisions, *rules).and_then(|rows| {
            let out = cli
                .out
                .clone()
                .unwrap_or_else(default_out)
                .with_file_name("decision.json");
            if let Some(dir) = out.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&out, serde_json::to_string_pretty(&rows)?)?;
            eprintln!("wrote {}", out.display());
            Ok(())
        }),
        None => parent(&cli),
    };
    if let Err(e) = result {
        eprintln!("cascade-bench: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests;
