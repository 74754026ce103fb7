//! `cascade schema check FILE` and `cascade schema diff [OLD] NEW
//! [--against ENDPOINT]` (issue 31): a schema file checked, two compared
//! without a node, or one checked by a running node against its schema in
//! force and stored data (`Admin.CheckSchema`).

use cascade_proto::v1;
use clap::Subcommand;

use super::{print_json, ClientArgs};
use crate::client::{AdminClient, ClientError};

/// `cascade schema …`.
#[derive(Debug, Clone, Subcommand)]
pub enum SchemaCommand {
    /// Print every cascade path the schema can leave stuck (a kind reached
    /// by a cascade that a kind outside it can block), every cascade cycle,
    /// and every error, each naming its path (a cycle of `block`
    /// references and an empty file are errors). Exit status 1 on an
    /// error; `cascade serve` prints the same findings at start and at
    /// every reload (SIGHUP, a change of the file), and refuses a schema
    /// with errors.
    Check {
        /// The schema file (TOML, `[kinds.KIND.refs.FIELD]`).
        file: std::path::PathBuf,
    },
    /// What changing schema OLD to NEW adds, removes and changes, and which
    /// of its changes a node's reload checks against the data it stores
    /// (refused while they would orphan something). Reads the two files
    /// only: the counts are the node's, at its reload. Exit status 1 when
    /// either file does not load.
    ///
    /// With `--against ENDPOINT`, NEW is checked by that node against the
    /// schema its region has in force and the data it stores, exactly as a
    /// reload would be, and nothing changes: what NEW adds and removes,
    /// and "would orphan N resources of kind X in region R" for each change
    /// the stored data forbids. OLD may then be left out; given, it is
    /// compared with the schema in force (a warning when it is not it).
    /// Exit status 1 when the reload would be refused. An Admin call
    /// (`admin.check_schema`): the admin token (--admin-token,
    /// CASCADE_ADMIN_TOKEN) or --token.
    Diff {
        /// OLD NEW, or (with --against) [OLD] NEW.
        #[arg(num_args = 1..=2, required = true, value_name = "FILE")]
        files: Vec<std::path::PathBuf>,
        /// A node to check NEW against (its region's schema in force and data).
        #[arg(long, value_name = "ENDPOINT")]
        against: Option<String>,
        /// The node's admin token, with --against.
        #[arg(long, env = "CASCADE_ADMIN_TOKEN", hide_env_values = true)]
        admin_token: Option<String>,
    },
}

/// Loads a schema file for `cascade schema diff`: the error names the file.
fn load_schema_file(file: &std::path::Path) -> Result<cascade_core::Schema, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    cascade_core::Schema::from_toml(&text).map_err(|e| format!("{}: {e}", file.display()))
}

/// `cascade schema diff [OLD] NEW --against ENDPOINT`: the node's check of
/// NEW, with its counts; exit status 1 when the reload would be refused.
pub(super) async fn run_schema_diff_against(
    args: &ClientArgs,
    files: &[std::path::PathBuf],
    endpoint: &str,
    admin_token: Option<String>,
    json: bool,
) -> Result<i32, ClientError> {
    let (old, new) = match files {
        [new] => (None, new),
        [old, new] => (Some(old), new),
        _ => return Err(ClientError::Usage("schema diff takes [OLD] NEW with --against".into())),
    };
    // Read whole, at most the limit the node takes (and a byte more, to tell).
    let limit = cascade_proto::bounds::MAX_SCHEMA_TEXT_BYTES;
    let bytes = std::fs::read(new).map_err(|e| ClientError::Usage(format!("cannot read {}: {e}", new.display())))?;
    if bytes.len() > limit {
        return Err(ClientError::Usage(format!(
            "{}: more than {limit} bytes, the most a schema file may hold",
            new.display()
        )));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        ClientError::Usage(format!(
            "{}: not UTF-8 (at byte {})",
            new.display(),
            e.utf8_error().valid_up_to()
        ))
    })?;
    let token = admin_token
        .filter(|t| !t.is_empty())
        .or_else(|| args.bearer().map(str::to_owned));
    let client = AdminClient::connect_with(endpoint, args.tls.load()?.as_ref(), token).await?;
    let checked = client.check_schema(text).await?;
    // OLD is the schema in force when the node finds it the same version.
    let old_is_in_force = match old {
        Some(old) => {
            let text = std::fs::read_to_string(old)
                .map_err(|e| ClientError::Usage(format!("cannot read {}: {e}", old.display())))?;
            let of_old = client.check_schema(text).await?;
            Some(of_old.checked_version == of_old.in_force_version && of_old.checked_label == of_old.in_force_label)
        }
        None => None,
    };
    let orphans: Vec<String> = checked
        .checks
        .iter()
        .filter(|c| c.count > 0)
        .map(|c| orphan_line(c, &checked.region))
        .collect();
    if json {
        print_json(&serde_json::json!({
            "region": checked.region,
            "in_force": {"version": checked.in_force_version, "label": checked.in_force_label},
            "checked": {"version": checked.checked_version, "label": checked.checked_label},
            "old_is_in_force": old_is_in_force,
            "kinds_added": checked.kinds_added,
            "kinds_removed": checked.kinds_removed,
            "refs_added": checked.refs_added,
            "refs_removed": checked.refs_removed,
            "refs_changed": checked.refs_changed,
            "retain_changed": checked.retain_changed,
            "summary": checked.summary,
            "would_orphan": orphans,
            "checks": checked.checks.iter().map(|c| serde_json::json!({
                "path": c.path, "rule": c.rule, "kinds": c.kinds, "count": c.count,
                "at_least": c.at_least, "refusal": c.refusal,
            })).collect::<Vec<_>>(),
            "refused": checked.refused,
        }));
    } else {
        let version = |digest: &str, label: &str| {
            if label.is_empty() {
                digest.to_owned()
            } else {
                format!("{digest} ({label})")
            }
        };
        println!(
            "against {} (region {}): in force {}, checked {}",
            endpoint,
            checked.region,
            version(&checked.in_force_version, &checked.in_force_label),
            version(&checked.checked_version, &checked.checked_label)
        );
        if let (Some(old), Some(false)) = (old, old_is_in_force) {
            println!(
                "warning: {} is not the schema in force in {}",
                old.display(),
                checked.region
            );
        }
        println!("{}", checked.summary);
        for (what, names) in [
            ("adds kind", &checked.kinds_added),
            ("removes kind", &checked.kinds_removed),
            ("adds reference", &checked.refs_added),
            ("removes reference", &checked.refs_removed),
            ("changes reference", &checked.refs_changed),
            ("changes retain of kind", &checked.retain_changed),
        ] {
            for name in names {
                println!("{what} {name}");
            }
        }
        for line in &orphans {
            println!("{line}");
        }
        for c in checked.checks.iter().filter(|c| !c.refusal.is_empty()) {
            println!("refused: {}", c.refusal);
        }
        if checked.refused {
            println!(
                "a reload of {} would be refused in {}: the schema in force would stay",
                new.display(),
                checked.region
            );
        } else {
            println!("a reload of {} would be taken in {}", new.display(), checked.region);
        }
    }
    Ok(i32::from(checked.refused))
}

/// What one counted change would orphan (or hold up), as a line.
fn orphan_line(c: &v1::SchemaCompatCount, region: &str) -> String {
    let n = if c.at_least {
        format!("at least {}", c.count)
    } else {
        c.count.to_string()
    };
    let kinds = c.kinds.join(" or ");
    match c.rule.as_str() {
        "kind_removed" => format!("would orphan {n} resources of kind {kinds} in region {region}"),
        "field_removed" | "field_retargeted" => {
            let field = c.path.rsplit('.').next().unwrap_or_default();
            format!("would orphan {n} resources of kind {kinds} in region {region} (their {field} references)")
        }
        _ => format!(
            "would change {} under {n} running deletions of {kinds} in region {region}",
            c.path
        ),
    }
}

/// `cascade schema diff OLD NEW`: the diff and what a reload would check.
pub(super) fn run_schema_diff(files: &[std::path::PathBuf], json: bool) -> Result<i32, ClientError> {
    let [old, new] = files else {
        return Err(ClientError::Usage(
            "schema diff takes OLD NEW (or, with --against ENDPOINT, [OLD] NEW)".into(),
        ));
    };
    let load = load_schema_file;
    let (old_schema, new_schema) = match (load(old), load(new)) {
        (Ok(o), Ok(n)) => (o, n),
        (o, n) => {
            let errors: Vec<String> = [o.err(), n.err()].into_iter().flatten().collect();
            if json {
                print_json(&serde_json::json!({"errors": errors}));
            } else {
                for e in &errors {
                    println!("error: {e}");
                }
            }
            return Ok(1);
        }
    };
    let diff = old_schema.diff(&new_schema);
    let checked: Vec<String> = diff
        .compat_items()
        .iter()
        .map(|item| {
            let what = match &item.question {
                cascade_core::schema::StoredQuestion::KindStored { kind } => {
                    format!("refused while resources of kind {kind} are stored")
                }
                cascade_core::schema::StoredQuestion::FieldSet { kind, field } => {
                    format!("refused while stored {kind} resources set {field}")
                }
                cascade_core::schema::StoredQuestion::DeletionsOf { kinds } => {
                    format!("refused while deletions of {} are running", kinds.join(" or "))
                }
            };
            format!("{}: {what}", item.path)
        })
        .collect();
    if json {
        print_json(&serde_json::json!({
            "diff": diff,
            "summary": diff.summary(),
            "checked_against_stored_data": checked,
        }));
    } else {
        println!("{}", diff.summary());
        if checked.is_empty() {
            println!("nothing a reload checks against stored data: every change is taken");
        } else {
            println!("a reload checks against the data each region stores:");
            for line in &checked {
                println!("  {line}");
            }
        }
    }
    Ok(0)
}

/// `cascade schema check FILE`: the findings, and the exit status.
pub(super) fn run_schema_check(file: &std::path::Path, json: bool) -> Result<i32, ClientError> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| ClientError::Usage(format!("cannot read {}: {e}", file.display())))?;
    match cascade_core::Schema::from_toml(&text) {
        Err(e) => {
            if json {
                print_json(&serde_json::json!({"file": file, "errors": [e.to_string()], "stuck": [], "cycles": []}));
            } else {
                println!("error: {}: {e}", file.display());
            }
            Ok(1)
        }
        Ok(schema) => {
            let check = schema.check();
            if json {
                print_json(&serde_json::json!({
                    "file": file,
                    "errors": [],
                    "stuck": check.stuck,
                    "cycles": check.cycles,
                    "truncated": check.truncated,
                }));
            } else {
                let lines = check.lines();
                for line in &lines {
                    println!("{line}");
                }
                let kinds = schema.kinds().count();
                if lines.is_empty() {
                    println!("ok: {kinds} kinds; no cascade path can get stuck, no cascade cycle");
                } else {
                    println!(
                        "{} stuck path(s), {} cycle(s) in {kinds} kinds; no error",
                        check.stuck.len(),
                        check.cycles.len()
                    );
                }
            }
            Ok(0)
        }
    }
}
