//! What `cascade` prints, over the real `cascade demo` (three regions):
//! times as people read them, never epoch milliseconds (issue 25, part 3);
//! a cascade that would be held is named before anything changes, and
//! `--wait` on a stuck deletion ends with its explanation (part 5); a
//! cascade shows its plan and is bound to it, a large one confirmed
//! (issue 29); shell completions.

// Test code: deadlines are real time (clippy.toml).
#![allow(clippy::disallowed_methods)]
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod support;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::demo::Demo;

const FINALIZER: &str = "billing.example.com/close-account";

/// stdout and stderr of one run, as one text.
fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// What in `text` reads like a raw epoch-millisecond time: a run of 13 or
/// more digits, or a number followed by " ms".
fn raw_times(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if !chars[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && chars[i].is_ascii_digit() {
            i += 1;
        }
        let digits: String = chars[start..i].iter().collect();
        let after: String = chars[i..chars.len().min(i + 4)].iter().collect();
        let unit_ms = after.starts_with(" ms") && !after[3..].starts_with(|c: char| c.is_alphanumeric());
        if digits.len() >= 13 || unit_ms {
            let line_start = chars[..start].iter().rposition(|&c| c == '\n').map_or(0, |p| p + 1);
            let line_end = chars[i..]
                .iter()
                .position(|&c| c == '\n')
                .map_or(chars.len(), |p| i + p);
            found.push(chars[line_start..line_end].iter().collect());
        }
    }
    found
}

#[test]
fn the_checker_of_raw_times_notices_them() {
    assert_eq!(raw_times("deleting since 1795597638546 ms: requested").len(), 1);
    assert_eq!(raw_times("has been deleting for 170 ms, less").len(), 1);
    assert_eq!(raw_times("asked again at 1795597639745").len(), 1);
    assert!(
        raw_times("deleting since 21:30:05 (3m 12s ago), operation 01a214b0-e815-775a-b37c-8d2cbcfa2ae3").is_empty()
    );
    assert!(raw_times("http://127.0.0.1:41019  12 msgs").is_empty());
}

/// `cascade ARGS` with the demo's environment, killed at `deadline`
/// (a --wait that spins fails the test instead of hanging it).
fn cascade_within(demo: &Demo, args: &[&str], deadline: Duration) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cascade"));
    command
        .args(args)
        .envs(demo.env())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("cascade runs");
    let until = Instant::now() + deadline;
    while child.try_wait().expect("waitable").is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!("cascade {args:?} still ran after {deadline:?}:\n{}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

/// Polls `check` every 100 ms until it is Some, at most `limit`.
fn eventually<T>(limit: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < until, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The README's finalizer walkthrough and the other text commands, with a
/// deletion DELETING, held, FAILED, retried, forced and audited: nothing
/// they print is an epoch-millisecond time.
#[test]
fn no_text_output_carries_raw_epoch_milliseconds() {
    let demo = Demo::start(true);
    let mut printed: Vec<(String, String)> = Vec::new();
    let mut run = |args: &[&str]| {
        let out = demo.cascade(args);
        let t = text(&out);
        printed.push((args.join(" "), t.clone()));
        (out.status.code(), t)
    };
    let legacy = "eu-west/project/legacy";
    let (code, held) = run(&["delete", legacy]);
    assert_eq!(code, Some(0), "{held}");
    assert!(
        held.starts_with(&format!("held: waiting for finalizers: {FINALIZER} (operation ")),
        "{held}"
    );
    run(&["get", legacy]);
    // A failure within its backoff shows when the controller is asked again.
    let (_, failed) = run(&["finalizer", "fail", legacy, FINALIZER, "--reason", "billing API down"]);
    assert!(failed.contains("; asked again at "), "{failed}");
    run(&["get", legacy]);
    run(&["explain", legacy]);
    run(&["admin", "deletions"]);
    for _ in 0..2 {
        run(&["finalizer", "fail", legacy, FINALIZER, "--reason", "billing API down"]);
    }
    let (code, stuck) = run(&["admin", "deletions", "--stuck"]);
    assert_eq!(code, Some(0), "{stuck}");
    assert!(
        stuck.lines().any(|l| l.starts_with(legacy) && l.contains("FAILED")),
        "{stuck}"
    );
    let (_, explained) = run(&["explain", legacy]);
    assert!(explained.contains("STUCK"), "{explained}");
    let op = demo.cascade_ok(&["-o", "json", "get", legacy]);
    let op: serde_json::Value = serde_json::from_str(&op).expect("json");
    let op = op["deletion"]["operation_id"]
        .as_str()
        .expect("operation id")
        .to_owned();
    run(&["operation", &op]);
    run(&["explain", &op]);
    run(&["admin", "retry", legacy, "--reason", "billing API is back"]);
    run(&["get", legacy]);
    let (code, early) = run(&["admin", "force-purge", legacy, "--reason", "account closed by hand"]);
    assert_eq!(code, Some(1), "{early}");
    assert!(early.contains("pass --force"), "{early}");
    let (code, purged) = run(&[
        "admin",
        "force-purge",
        legacy,
        "--force",
        "--reason",
        "account closed by hand",
    ]);
    assert_eq!(code, Some(0), "{purged}");
    assert_eq!(purged.trim(), format!("purged: {legacy}"), "{purged}");
    let (_, audit) = run(&["admin", "audit"]);
    assert!(audit.starts_with("TIME "), "{audit}");
    // `cascade audit` is the same call; `-o json` exports JSON lines,
    // one entry a line, the force purge's among them.
    let exported = demo.cascade_ok(&["-o", "json", "audit", "--resource", legacy]);
    let entries: Vec<serde_json::Value> = exported
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    assert!(
        entries
            .iter()
            .any(|e| e["action"] == "ForcePurge (force)" && e["who"] == "admin" && e["target"] == legacy),
        "{exported}"
    );
    run(&["status"]);
    run(&["get", "us-east/port/p1"]);
    run(&["delete", "eu-west/network/net1", "--cascade", "--dry-run"]);
    let (code, done) = run(&["delete", "eu-west/network/net1", "--cascade", "--wait"]);
    assert_eq!(code, Some(0), "{done}");
    assert!(done.contains(": SUCCEEDED") && done.contains("ended "), "{done}");
    // Every event eu-west keeps (a --count past the last would wait for more).
    let status: serde_json::Value = serde_json::from_str(&demo.cascade_ok(&["-o", "json", "status"])).expect("json");
    let last = status["regions"]
        .as_array()
        .and_then(|regions| regions.iter().find(|r| r["region"] == "eu-west"))
        .and_then(|r| r["figures"]["last_revision"].as_u64())
        .unwrap_or_else(|| panic!("eu-west's last revision in {status}"));
    let (code, events) = run(&["watch", "--from", "1", "--count", &last.to_string()]);
    assert_eq!(code, Some(0), "{events}");
    assert!(events.contains("PURGED"), "{events}");
    let mut raw = Vec::new();
    for (args, out) in &printed {
        for line in raw_times(out) {
            raw.push(format!("cascade {args}: {line}"));
        }
    }
    assert!(
        raw.is_empty(),
        "raw epoch milliseconds in text output:\n{}",
        raw.join("\n")
    );
    assert!(printed.len() > 20, "{} commands", printed.len());
}

/// The demo's project cascades to eu-west/network/ext, which ap-south's
/// router blocks: the plan says so before anything changes (exit 3), and
/// with --allow-blocked it starts; --wait on it then ends on its own,
/// printing what holds it (exit 4), instead of following it forever.
#[test]
fn a_cascade_that_would_be_held_is_named_before_it_starts_and_a_stuck_wait_ends() {
    let demo = Demo::start(true);
    let project = "eu-west/project/demo";
    let out = demo.cascade(&["delete", project, "--cascade"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(
        said.contains(
            "eu-west/network/ext is blocked by ap-south/router/edge (region ap-south, field gateway_network)"
        ),
        "{said}"
    );
    assert!(said.contains("--allow-blocked"), "{said}");
    let got = demo.cascade_ok(&["get", project]);
    assert!(
        got.starts_with(&format!("{project}  ACTIVE")),
        "nothing changed:\n{got}"
    );
    let json = demo.cascade(&["-o", "json", "delete", project, "--cascade"]);
    assert_eq!(json.status.code(), Some(3), "{}", text(&json));
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    assert_eq!(json["started"], false, "{json}");
    assert_eq!(
        json["plan"]["blocked"][0]["blocker"]["referrer"], "ap-south/router/edge",
        "{json}"
    );

    let out = demo.cascade(&["delete", project, "--cascade", "--allow-blocked"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("starting anyway (--allow-blocked)"), "{said}");
    assert!(
        said.contains("accepted: deletion of eu-west/project/demo (operation "),
        "{said}"
    );
    let got = demo.cascade_ok(&["get", project]);
    assert!(got.starts_with(&format!("{project}  DELETING")), "{got}");

    // Before this fix --wait followed it until the demo's third attempt
    // failed the held member (about 7 s; with more attempts, far longer),
    // then exited 1 without saying what held it.
    let started = Instant::now();
    let out = cascade_within(
        &demo,
        &["delete", project, "--cascade", "--wait"],
        Duration::from_secs(30),
    );
    let said = text(&out);
    println!("--wait on a stuck deletion ended after {:?}", started.elapsed());
    assert_eq!(out.status.code(), Some(4), "{said}");
    assert!(said.contains("the deletion is stuck"), "{said}");
    assert!(said.contains(": STUCK (something below waits on a person)"), "{said}");
    assert!(
        said.contains("└─ eu-west/network/ext (via project)  BLOCKED  [stuck]")
            && said.contains("blocked by ap-south/router/edge (region ap-south, field gateway_network)"),
        "{said}"
    );
}

/// `delete --cascade` shows its plan (members per region, their number,
/// the token) and binds the delete to it; above --confirm-above, without a
/// terminal, it needs --yes (exit 5, nothing changed); a dry run prints the
/// token, and `--expect-plan` passes one: a token that is not the
/// closure's is refused ABORTED with nothing changed.
#[test]
fn a_cascade_shows_its_plan_and_a_large_one_needs_yes_without_a_terminal() {
    let demo = Demo::start(true);
    let net = "eu-west/network/net1";
    let out = demo.cascade(&["delete", net, "--cascade", "--confirm-above", "5"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(5), "{said}");
    assert!(
        said.contains("plan: 15 members (14 deleted, 1 unset) in 3 region(s)\n")
            && said.contains("  ap-south  1 deleted, 1 unset\n")
            && said.contains("  us-east   9 deleted\n")
            && said.contains("plan token: p1-"),
        "{said}"
    );
    assert!(
        said.contains("not started: this cascade changes 15 resources, more than --confirm-above 5")
            && said.contains("Pass --yes"),
        "{said}"
    );
    let json = demo.cascade(&["-o", "json", "delete", net, "--cascade", "--confirm-above", "5"]);
    assert_eq!(json.status.code(), Some(5), "{}", text(&json));
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    assert_eq!(json["started"], false, "{json}");
    assert_eq!(json["reason"], "not_confirmed", "{json}");
    assert_eq!(json["plan"]["members"], 15, "{json}");
    assert!(
        demo.cascade_ok(&["get", net]).starts_with(&format!("{net}  ACTIVE")),
        "nothing changed"
    );

    // --yes confirms a plan above the threshold without a terminal (the
    // trunk first: net1's cascade would reach it through its parent port).
    let out = demo.cascade(&[
        "delete",
        "us-east/trunk/t1",
        "--cascade",
        "--confirm-above",
        "2",
        "--yes",
    ]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(
        said.contains("plan: 3 members (3 deleted, 0 unset) in 1 region(s)"),
        "{said}"
    );
    assert!(said.contains("accepted: deletion of us-east/trunk/t1"), "{said}");

    let dry = demo.cascade_ok(&["delete", net, "--cascade", "--dry-run"]);
    let token = dry
        .lines()
        .find_map(|l| l.strip_prefix("plan token: "))
        .unwrap_or_else(|| panic!("no token in:\n{dry}"))
        .to_owned();
    let stale = format!("p1-{}", ["00000000"; 8].join("-"));
    let out = demo.cascade(&["delete", net, "--cascade", "--expect-plan", &stale]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("Aborted: the closure of eu-west/network/net1 is not plan \"p1-00000000-00000000\"… any more"),
        "{said}"
    );
    assert!(
        demo.cascade_ok(&["get", net]).starts_with(&format!("{net}  ACTIVE")),
        "nothing changed"
    );
    // The refusal is in the audit log, with what the node said.
    let exported = demo.cascade_ok(&["-o", "json", "audit", "--resource", net]);
    assert!(
        exported.lines().any(|line| {
            let entry: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
            entry["action"] == "cascade"
                && entry["outcome"]
                    .as_str()
                    .is_some_and(|o| o.starts_with("Aborted: the closure"))
        }),
        "{exported}"
    );
    let out = demo.cascade(&["delete", net, "--cascade", "--expect-plan", &token]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("accepted: deletion of eu-west/network/net1"),
        "{}",
        text(&out)
    );
}

#[test]
fn completions_name_the_subcommands_in_every_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(env!("CARGO_BIN_EXE_cascade"))
            .args(["completions", shell])
            .output()
            .expect("cascade runs");
        assert!(out.status.success(), "{shell}: {}", text(&out));
        let script = String::from_utf8_lossy(&out.stdout);
        for word in [
            "delete",
            "explain",
            "admin",
            "force-purge",
            "completions",
            "allow-blocked",
            "expect-plan",
        ] {
            assert!(script.contains(word), "{shell}'s script does not name {word}");
        }
    }
}

/// The wall-clock time `HH:MM:SS` after "created " in `get`'s text, in
/// seconds of the day.
fn created_clock(get: &str) -> u32 {
    let rest = get
        .split("  created ")
        .nth(1)
        .unwrap_or_else(|| panic!("no created line:\n{get}"));
    let clock = rest.split_whitespace().next().expect("a time");
    let parts: Vec<u32> = clock.split(':').map(|p| p.parse().expect("a number")).collect();
    assert_eq!(parts.len(), 3, "{clock}");
    parts[0] * 3600 + parts[1] * 60 + parts[2]
}

/// In TZ=Asia/Kolkata, `get` and `get --utc` show the same instant 5h30m
/// apart; -o json carries it as RFC 3339 beside the milliseconds.
#[test]
fn times_show_in_the_local_zone_or_utc_and_json_carries_rfc3339() {
    let demo = Demo::start(true);
    let name = "us-east/port/p1";
    let in_kolkata = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_cascade"))
            .args(args)
            .envs(demo.env())
            .env("TZ", "Asia/Kolkata")
            .output()
            .expect("cascade runs");
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let utc = in_kolkata(&["--utc", "get", name]);
    assert!(utc.contains(" UTC ("), "{utc}");
    let kolkata = in_kolkata(&["get", name]);
    let offset = (created_clock(&kolkata) + 86_400 - created_clock(&utc)) % 86_400;
    assert_eq!(offset, 5 * 3600 + 30 * 60, "UTC:\n{utc}\nAsia/Kolkata:\n{kolkata}");

    let json: serde_json::Value = serde_json::from_str(&demo.cascade_ok(&["-o", "json", "get", name])).expect("json");
    for field in ["create_time", "update_time"] {
        let text = json[field].as_str().unwrap_or_else(|| panic!("{field} in {json}"));
        let parsed: jiff::Timestamp = text.parse().unwrap_or_else(|e| panic!("{field} {text:?}: {e}"));
        assert_eq!(
            parsed.as_millisecond(),
            json[format!("{field}_ms")].as_i64().expect("ms"),
            "{json}"
        );
    }
    // An operation's and an audit entry's instants too.
    demo.cascade_ok(&["delete", "eu-west/project/legacy"]);
    let legacy: serde_json::Value =
        serde_json::from_str(&demo.cascade_ok(&["-o", "json", "get", "eu-west/project/legacy"])).expect("json");
    let deleted_at: jiff::Timestamp = legacy["deletion"]["deleted_at"]
        .as_str()
        .expect("deleted_at")
        .parse()
        .expect("RFC 3339");
    assert_eq!(
        deleted_at.as_millisecond(),
        legacy["deletion"]["deleted_at_ms"].as_i64().expect("ms")
    );
    let op = legacy["deletion"]["operation_id"].as_str().expect("operation");
    let operation: serde_json::Value =
        serde_json::from_str(&demo.cascade_ok(&["-o", "json", "operation", op])).expect("json");
    let created: jiff::Timestamp = operation["create_time"]
        .as_str()
        .expect("create_time")
        .parse()
        .expect("RFC 3339");
    assert_eq!(
        created.as_millisecond(),
        operation["create_time_ms"].as_i64().expect("ms")
    );
    let deletions = eventually(Duration::from_secs(10), "the held deletion listed", || {
        let listed: serde_json::Value =
            serde_json::from_str(&demo.cascade_ok(&["-o", "json", "admin", "deletions"])).expect("json");
        (listed.as_array().is_some_and(|a| !a.is_empty())).then_some(listed)
    });
    assert!(deletions[0]["age"].is_string(), "{deletions}");
}
