//! The README's tour, run: every `console` block of "## A five-minute
//! tour" is executed, in order, with the real `cascade` binary against a
//! real `cascade demo` (three regions, mutual TLS), and each command's
//! output must match the sample printed under it. A sample that drifts
//! from the binary fails the build, and so does one that drifts from the
//! demo's data.
//!
//! The format, readable as a terminal session:
//!
//! - `$ cascade ARGS` runs the binary (a line ending in `\` continues);
//!   `$ NAME=VALUE` sets a variable, and `$NAME` in arguments is replaced
//!   by it or by an `export NAME=VALUE` the demo printed.
//! - A trailing `# exits N` comment on a command is its expected exit
//!   status (0 otherwise).
//! - The lines under a command are its stdout then its stderr, compared by
//!   snapbox: `[..]` matches the rest of a line's part, `...` on a line of
//!   its own matches any lines; `[ID]` is an operation id (a UUID),
//!   `[EU_WEST]`/`[US_EAST]`/`[AP_SOUTH]` the regions' addresses, `[CERTS]`
//!   the demo's certificate directory, `[TOKEN]` its administrator's token
//!   (`CASCADE_TOKEN`, which every command sends unless it passes
//!   `--token $ALICE_TOKEN`, the limited user's: `[ALICE_TOKEN]`).
//! - A read-only command (get, list, explain, …) whose output does not
//!   match yet is run again until it does or 20 s pass: the tour shows
//!   asynchronous work settling, and a person would look twice too.
//!
//! `CASCADE_TOUR_README=path` runs another copy of the README (for
//! trying a change to it); `CASCADE_TOUR_RECORD=path` writes what every
//! command printed, with the placeholders above, to `path` instead of
//! failing, to write a new sample from.

#![allow(clippy::disallowed_methods, clippy::print_stdout, clippy::print_stderr)]

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::demo::Demo;

/// One `$ …` line of the tour and the sample under it.
#[derive(Debug, Clone)]
struct Step {
    /// 1-based line of the README the command is on.
    line: usize,
    command: String,
    exit_status: i32,
    expected: String,
}

/// The `console` blocks of the README's tour, as steps.
fn tour_steps(readme: &str) -> Vec<Step> {
    let start = readme
        .find("\n## A five-minute tour")
        .expect("the README has a \"## A five-minute tour\" section");
    let end = readme[start + 1..]
        .find("\n## ")
        .map_or(readme.len(), |e| start + 1 + e);
    // The slice starts with the newline that ends the line before the heading.
    let first_line = readme[..start].lines().count();
    let mut steps: Vec<Step> = Vec::new();
    let mut in_console = false;
    let mut continued: Option<Step> = None;
    for (offset, line) in readme[start..end].lines().enumerate() {
        let number = first_line + offset;
        if !in_console {
            in_console = line.trim_end() == "```console";
            continue;
        }
        if line.trim_end() == "```" {
            in_console = false;
            continue;
        }
        if let Some(mut step) = continued.take() {
            step.command.push(' ');
            step.command.push_str(line.trim().trim_end_matches('\\').trim_end());
            if line.trim_end().ends_with('\\') {
                continued = Some(step);
            } else {
                steps.push(finish(step));
            }
            continue;
        }
        if let Some(command) = line.strip_prefix("$ ") {
            let step = Step {
                line: number,
                command: command.trim_end().trim_end_matches('\\').trim_end().to_owned(),
                exit_status: 0,
                expected: String::new(),
            };
            if command.trim_end().ends_with('\\') {
                continued = Some(step);
            } else {
                steps.push(finish(step));
            }
            continue;
        }
        let step = steps
            .last_mut()
            .unwrap_or_else(|| panic!("README line {number}: output before any `$ ` command"));
        step.expected.push_str(line);
        step.expected.push('\n');
    }
    assert!(!in_console, "README: a ```console block of the tour is not closed");
    steps
}

/// Takes a trailing `# exits N` (or any `# comment`) off a command.
fn finish(mut step: Step) -> Step {
    if let Some((command, comment)) = step.command.split_once(" # ") {
        if let Some(status) = comment.trim().strip_prefix("exits ") {
            step.exit_status = status
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("README line {}: bad `# exits N`", step.line));
        }
        step.command = command.trim_end().to_owned();
    }
    step
}

/// Commands that change nothing, so running one again is harmless.
fn read_only(args: &[String]) -> bool {
    let words: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with('-'))
        .collect();
    matches!(
        words.as_slice(),
        ["get", ..]
            | ["list", ..]
            | ["tree", ..]
            | ["explain", ..]
            | ["operation", ..]
            | ["status", ..]
            | ["check", ..]
            | ["admin", "deletions", ..]
            | ["admin", "audit", ..]
    )
}

/// `$NAME` and `${NAME}` in `word`, from `vars`.
fn expand(word: &str, vars: &BTreeMap<String, String>, line: usize) -> String {
    let mut out = String::new();
    let mut rest = word;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, tail) = if let Some(braced) = after.strip_prefix('{') {
            let close = braced
                .find('}')
                .unwrap_or_else(|| panic!("README line {line}: unclosed ${{"));
            (&braced[..close], &braced[close + 1..])
        } else {
            let len = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..len], &after[len..])
        };
        let value = vars
            .get(name)
            .unwrap_or_else(|| panic!("README line {line}: ${name} is not set (set it with `$ {name}=…`)"));
        out.push_str(value);
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// How the tour's output is compared: snapbox, with the demo's own
/// addresses, paths and ids as placeholders.
fn assert_for(demo: &Demo) -> snapbox::Assert {
    let mut redactions = snapbox::Redactions::new();
    for (placeholder, region) in [
        ("[EU_WEST]", "eu-west"),
        ("[US_EAST]", "us-east"),
        ("[AP_SOUTH]", "ap-south"),
    ] {
        redactions
            .insert(placeholder, demo.endpoint(region).to_owned())
            .expect("a placeholder");
    }
    if let Some(certs) = &demo.certs {
        redactions
            .insert("[CERTS]", certs.display().to_string())
            .expect("a placeholder");
    }
    redactions
        .insert("[TOKEN]", demo.admin_token.clone())
        .expect("a placeholder");
    redactions
        .insert("[ALICE_TOKEN]", demo.alice_token.clone())
        .expect("a placeholder");
    redactions
        .insert(
            "[ID]",
            regex::Regex::new("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").expect("a regex"),
        )
        .expect("a placeholder");
    snapbox::Assert::new()
        .redact_with(redactions)
        .palette(snapbox::report::Palette::plain())
}

/// Why the tour failed: the step and what differed.
#[derive(Debug)]
struct Drift {
    line: usize,
    report: String,
}

/// Runs `steps` against `demo`, stopping at the first that does not match.
fn run_tour(steps: &[Step], demo: &Demo) -> Result<(), Drift> {
    let assert = assert_for(demo);
    // A person reads times and ages, never epoch milliseconds (13 digits
    // from 2001 to 2286): in no command of the tour.
    let epoch_ms = regex::Regex::new(r"(^|[^0-9])1[0-9]{12}([^0-9]|$)").expect("a regex");
    let mut record = std::env::var_os("CASCADE_TOUR_RECORD").map(|path| (path, String::new()));
    let mut vars: BTreeMap<String, String> = demo.env().into_iter().collect();
    vars.extend(demo.exported.clone());
    for step in steps {
        let words = shlex::split(&step.command).unwrap_or_else(|| {
            panic!(
                "README line {}: cannot split {:?} as a shell would",
                step.line, step.command
            )
        });
        if let [assignment] = words.as_slice() {
            if let Some((name, value)) = assignment.split_once('=') {
                vars.insert(name.to_owned(), expand(value, &vars, step.line));
                continue;
            }
        }
        let Some((program, args)) = words.split_first() else {
            continue;
        };
        assert_eq!(
            program, "cascade",
            "README line {}: the tour runs only `cascade`",
            step.line
        );
        let args: Vec<String> = args.iter().map(|a| expand(a, &vars, step.line)).collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = demo.cascade(&args.iter().map(String::as_str).collect::<Vec<_>>());
            let mut actual = String::from_utf8_lossy(&out.stdout).into_owned();
            actual.push_str(&String::from_utf8_lossy(&out.stderr));
            let status = out.status.code().unwrap_or(-1);
            assert!(
                !epoch_ms.is_match(&actual),
                "`{}` (README line {}) printed epoch milliseconds:\n{actual}",
                step.command,
                step.line
            );
            let compared = assert.try_eq(
                Some(&format!("README line {}", step.line)),
                snapbox::Data::text(actual.clone()),
                snapbox::Data::text(step.expected.clone()),
            );
            let drift = match (status == step.exit_status, compared) {
                (true, Ok(())) => None,
                (same_status, compared) => Some(format!(
                    "`{}` (README line {}) {}\n{}\nits whole output:\n{actual}",
                    step.command,
                    step.line,
                    if same_status {
                        format!("exited {status} as expected, but its output differs:")
                    } else {
                        format!("exited {status}, the README says {}", step.exit_status)
                    },
                    compared.err().map(|e| e.to_string()).unwrap_or_default(),
                )),
            };
            if let Some((path, recorded)) = &mut record {
                if drift.is_none() || !read_only(&args) || Instant::now() >= deadline {
                    let redacted = assert.redactions().redact(&actual);
                    recorded.push_str(&format!("$ {}  # exits {status}\n{redacted}", step.command));
                    std::fs::write(&*path, &*recorded).expect("the record is written");
                    break;
                }
            }
            match drift {
                None => break,
                Some(report) if !read_only(&args) || Instant::now() >= deadline => {
                    return Err(Drift {
                        line: step.line,
                        report,
                    })
                }
                Some(_) => std::thread::sleep(Duration::from_millis(250)),
            }
        }
    }
    Ok(())
}

fn readme() -> (String, String) {
    let path = std::env::var("CASCADE_TOUR_README")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/README.md").to_owned());
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    (path, text)
}

#[test]
fn the_readme_tour_runs_as_written_against_a_real_demo() {
    let (path, text) = readme();
    let steps = tour_steps(&text);
    assert!(steps.len() >= 20, "{path}: the tour has only {} commands", steps.len());
    let demo = Demo::start(false);
    let started = Instant::now();
    if let Err(drift) = run_tour(&steps, &demo) {
        panic!(
            "{path} drifted from the binary at line {}:\n{}",
            drift.line, drift.report
        );
    }
    println!("{} tour commands matched in {:?}", steps.len(), started.elapsed());
}

/// Why would the tour test pass on a wrong README? Only if it did not
/// compare. So: a scratch copy with one sample changed must fail, at that
/// sample's command.
#[test]
fn a_wrong_sample_in_a_scratch_copy_of_the_readme_fails_the_tour() {
    let (_, text) = readme();
    let steps = tour_steps(&text);
    // The first sample of a command that changes something (so it runs
    // once, not again until a deadline) with a line of plain text (no
    // wildcard) to change.
    let (step, line) = steps
        .iter()
        .filter(|s| !read_only(&shlex::split(&s.command).unwrap_or_default()[1..]))
        .find_map(|s| {
            s.expected
                .lines()
                .find(|l| !l.trim().is_empty() && !l.contains("[..]") && !l.contains('['))
                .map(|l| (s.clone(), l.to_owned()))
        })
        .expect("a sample with a literal line");
    let wrong = text.replacen(&format!("\n{line}\n"), &format!("\n{line} (not what it prints)\n"), 1);
    assert_ne!(wrong, text, "the sample line {line:?} is found");
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let copy = scratch.path().join("README.md");
    std::fs::write(&copy, &wrong).expect("the scratch copy is written");
    let wrong_steps = tour_steps(&std::fs::read_to_string(&copy).expect("readable"));
    // Only as far as the changed sample: the steps before it must pass.
    let upto = wrong_steps
        .iter()
        .position(|s| s.line == step.line)
        .expect("the changed step");
    let demo = Demo::start(false);
    let drift = run_tour(&wrong_steps[..=upto], &demo).expect_err("a wrong sample fails the tour");
    assert_eq!(drift.line, step.line, "{}", drift.report);
    assert!(drift.report.contains("(not what it prints)"), "{}", drift.report);
}

#[test]
fn the_tour_parser_reads_commands_statuses_continuations_and_samples() {
    let readme = "intro\n## A five-minute tour\n```sh\ncargo run\n```\n```console\n$ cascade get a \\\n  --x   # exits 5\nout 1\n...\n$ F=x\n$ cascade list\n```\n## Next\n```console\n$ cascade no\n```\n";
    let steps = tour_steps(readme);
    let commands: Vec<(&str, i32, &str)> = steps
        .iter()
        .map(|s| (s.command.as_str(), s.exit_status, s.expected.as_str()))
        .collect();
    assert_eq!(
        commands,
        vec![
            ("cascade get a --x", 5, "out 1\n...\n"),
            ("F=x", 0, ""),
            ("cascade list", 0, "")
        ]
    );
    assert_eq!(steps[0].line, 7);
    let vars = BTreeMap::from([("F".to_owned(), "v".to_owned())]);
    assert_eq!(expand("a$F/${F}b", &vars, 1), "av/vb");
}
