//! The table on stdout, the targets of the issue checked against the rows,
//! and the JSON file.

use std::fmt::Write as _;
use std::path::Path;

use crate::harness::Result;
use crate::spec::Row;

fn num(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(x) if x.abs() >= 1e5 => format!("{x:.0}"),
        Some(x) if x.abs() >= 100.0 => format!("{x:.0}"),
        Some(x) if x.abs() >= 10.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.2}"),
    }
}

/// The rows as a fixed-width table, with the errors below it.
pub fn table(rows: &[Row]) -> String {
    let header = [
        "scenario",
        "shape",
        "engine",
        "n",
        "regions",
        "wall_s",
        "rate/s",
        "p50_ms",
        "p99_ms",
        "delete_ms",
        "cw_p99_ms",
        "kw/deleted",
        "peak_mb",
        "after_mb",
        "p1/base",
        "p1/native",
    ];
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(|s| (*s).to_owned()).collect()];
    for r in rows {
        lines.push(vec![
            r.scenario.clone(),
            r.shape.clone().unwrap_or_else(|| "-".into()),
            r.engine.clone(),
            r.n.to_string(),
            r.regions.to_string(),
            num(r.wall_s),
            num(r.rate_per_s),
            num(r.p50_ms),
            num(r.p99_ms),
            num(r.delete_call_ms),
            num(r.concurrent_write_p99_ms),
            num(r.key_writes_per_deleted),
            num(r.peak_rss_mb.or(r.rss_idle_mb)),
            num(r.rss_after_mb.or(r.rss_idle_mb.filter(|_| r.scenario == "p4"))),
            num(r.p1_over_baseline),
            num(r.p1_over_native),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| lines.iter().map(|l| l[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (i, l) in lines.iter().enumerate() {
        let cells: Vec<String> = l
            .iter()
            .enumerate()
            .map(|(c, s)| {
                if c < 3 {
                    format!("{s:<w$}", w = widths[c])
                } else {
                    format!("{s:>w$}", w = widths[c])
                }
            })
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
        if i == 0 {
            let _ = writeln!(
                out,
                "{}",
                "-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1))
            );
        }
    }
    for r in rows {
        if let Some(profile) = &r.store_profile {
            let shape = r.shape.as_deref().unwrap_or("-");
            let _ = writeln!(
                out,
                "store calls: {} {shape} {} n={}: {profile}",
                r.scenario, r.engine, r.n
            );
        }
        if let Some(v) = r.vacuum_s {
            let shape = r.shape.as_deref().unwrap_or("-");
            let _ = writeln!(out, "native {shape} n={}: VACUUM after the DELETE {v:.3} s", r.n);
        }
    }
    for r in rows {
        if let Some(e) = &r.error {
            let _ = writeln!(out, "error: {} {} n={}: {e}", r.scenario, r.engine, r.n);
        }
        if let Some(state) = r.operation_state.as_deref().filter(|s| *s != "SUCCEEDED") {
            let _ = writeln!(out, "warning: {} {} n={}: operation {state}", r.scenario, r.engine, r.n);
        }
    }
    out
}

struct Check {
    target: &'static str,
    engine: String,
    measured: String,
    verdict: &'static str,
}

/// pass/FAIL when the row has the size the target names; otherwise the
/// figure is only an indication (`info`).
fn verdict(ok: bool, at_size: bool) -> &'static str {
    match (at_size, ok) {
        (false, _) => "info",
        (true, true) => "pass",
        (true, false) => "FAIL",
    }
}

fn ok_rows<'a>(rows: &'a [Row], engine: &'a str, scenario: &'a str) -> impl Iterator<Item = &'a Row> + 'a {
    rows.iter()
        .filter(move |r| r.engine == engine && r.scenario == scenario && r.error.is_none())
}

fn flat<'a>(rows: &'a [Row], engine: &'a str) -> impl Iterator<Item = &'a Row> + 'a {
    ok_rows(rows, engine, "p1").filter(|r| r.shape.as_deref() == Some("flat"))
}

fn max_of(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    values.flatten().fold(None, |m, v| Some(m.map_or(v, |m: f64| m.max(v))))
}

/// The targets, per engine, from whatever rows this run has.
fn checks(rows: &[Row]) -> Vec<Check> {
    let mut engines: Vec<String> = rows.iter().map(|r| r.engine.clone()).collect();
    engines.dedup();
    engines.sort();
    engines.dedup();
    let mut out = Vec::new();
    for e in &engines {
        let e = e.as_str();
        let mut add = |target, measured: String, ok: bool, at_size: bool| {
            out.push(Check {
                target,
                engine: e.to_owned(),
                measured,
                verdict: verdict(ok, at_size),
            })
        };
        let deletes = || ok_rows(rows, e, "p1").chain(ok_rows(rows, e, "p2"));
        if let Some(v) = max_of(deletes().map(|r| r.delete_call_ms)) {
            add(
                "Delete answers in <= 10 ms (max over P1/P2)",
                format!("{v:.2} ms"),
                v <= 10.0,
                true,
            );
        }
        if let Some(v) = max_of(deletes().map(|r| r.concurrent_write_p99_ms)) {
            add(
                "other writes not held: concurrent Create p99 <= 10 ms (max over P1/P2)",
                format!("{v:.2} ms"),
                v <= 10.0,
                true,
            );
        }
        if let Some(p2) = ok_rows(rows, e, "p2").max_by_key(|r| r.n) {
            // P1 flat at the same n; else the nearest (then only an indication).
            let p1 = flat(rows, e).min_by_key(|r| r.n.abs_diff(p2.n));
            if let (Some(p1), Some(a), Some(b)) = (p1, p2.rate_per_s, p1.and_then(|r| r.rate_per_s)) {
                add(
                    "P2 aggregate rate >= 0.5x P1 (same n)",
                    format!(
                        "{:.2}x ({a:.0}/s at n={} vs P1 flat {b:.0}/s at n={})",
                        a / b,
                        p2.n,
                        p1.n
                    ),
                    a >= 0.5 * b,
                    p1.n == p2.n,
                );
            }
        }
        if let Some(p3) = ok_rows(rows, e, "p3").max_by_key(|r| r.regions) {
            if let Some(v) = p3.p99_ms {
                add(
                    "P3 p99 at 50 regions <= 5 ms",
                    format!("{v:.2} ms at {} regions", p3.regions),
                    v <= 5.0,
                    p3.regions >= 50,
                );
            }
        }
        if let Some(v) = ok_rows(rows, e, "p4").find_map(|r| r.rss_idle_mb) {
            add("P4 idle RSS <= 40 MB", format!("{v:.1} MB"), v <= 40.0, true);
        }
        if let Some(r) = flat(rows, e).max_by_key(|r| r.n) {
            if let Some(v) = r.cascade_peak_rss_mb {
                add(
                    "P4 peak RSS during a 1M cascade <= 600 MB",
                    format!("{v:.1} MB at n={}", r.n),
                    v <= 600.0,
                    r.n >= 1_000_000,
                );
            }
        }
        if let Some(v) = ok_rows(rows, e, "p5").filter_map(|r| r.rate_per_s).reduce(f64::max) {
            add("P5 >= 200k references/s", format!("{v:.0}/s"), v >= 200_000.0, true);
        }
        if let Some(v) = max_of(flat(rows, e).map(|r| r.key_writes_per_deleted)) {
            add(
                "key writes per deleted leaf <= 5 (P1 flat)",
                format!("{v:.2}"),
                v <= 5.0,
                true,
            );
        }
        if e == "postgres" {
            if let Some(r) = flat(rows, e).max_by_key(|r| r.n) {
                if let Some(v) = r.rate_per_s {
                    let native = r
                        .p1_over_native
                        .map(|x| format!(", {x:.1}x the native ON DELETE CASCADE's time"))
                        .unwrap_or_default();
                    add(
                        "P1 flat on postgres: 1M dependents at >= 50k deleted/s",
                        format!("{v:.0}/s at n={}{native}", r.n),
                        v >= 50_000.0,
                        r.n >= 1_000_000,
                    );
                }
            }
        }
        let at = |n| flat(rows, e).find(|r| r.n == n).and_then(|r| r.wall_s);
        if let (Some(m), Some(h)) = (at(1_000_000), at(100_000)) {
            add(
                "time at 1M <= 11x time at 100k (P1 flat)",
                format!("{:.1}x ({m:.1} s / {h:.1} s)", m / h),
                m <= 11.0 * h,
                true,
            );
        }
    }
    out
}

/// The targets as lines of text, with what this run measured.
pub fn targets(rows: &[Row]) -> String {
    let checks = checks(rows);
    let w = checks.iter().map(|c| c.target.len()).max().unwrap_or(0);
    let mut out = String::new();
    for c in checks {
        let _ = writeln!(
            out,
            "{:<w$}  {:<8}  {:<4}  {}",
            c.target, c.engine, c.verdict, c.measured
        );
    }
    out
}

/// Writes the rows as a JSON list, creating the directory.
pub fn write_json(path: &Path, rows: &[Row]) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(rows)? + "\n")?;
    Ok(())
}
