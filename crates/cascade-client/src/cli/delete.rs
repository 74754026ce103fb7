//! `cascade delete`: a cascade is planned before it starts (a member a live
//! blocker would hold is named, and nothing changes without
//! `--allow-blocked`), shown (members per region, their number, the plan's
//! token), confirmed when it is large (`--yes`, or y on a terminal), and
//! then bound to that plan (`DeleteRequest.expect_plan`: the node deletes
//! exactly that closure or refuses, naming what changed); a held deletion
//! says what holds it, and `--wait` stops following a deletion only a
//! person can free, showing why.

use std::io::IsTerminal;
use std::time::Duration;

use cascade_proto::v1;
use clap::Args;
use futures::StreamExt;

use super::{print_json, requester, wall_clock_ms};
use crate::client::{Client, ClientError};
use crate::render::{self, TimeDisplay};

/// Exit status of `cascade delete --cascade` when the plan has members a
/// live blocker outside the cascade would hold: nothing was changed.
pub const EXIT_WOULD_BE_HELD: i32 = 3;
/// Exit status of `cascade delete --wait` when the deletion got stuck
/// (something only a person can free): the explanation is printed.
pub const EXIT_STUCK: i32 = 4;
/// Exit status of `cascade delete --cascade` when the plan is larger than
/// `--confirm-above` and was not confirmed (no `--yes`, and no terminal to
/// ask on, or not answered y): nothing was changed.
pub const EXIT_NOT_CONFIRMED: i32 = 5;
/// The default of `--confirm-above`: a cascade of more members than this
/// is confirmed before it starts.
pub const DEFAULT_CONFIRM_ABOVE: u64 = 25;

/// How often `--wait` asks whether a deletion that stopped moving is stuck.
const STUCK_CHECK_EVERY: Duration = Duration::from_millis(1500);
/// The deadline of each of those asks (the node answers within 2 s).
const EXPLAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How many blocked members the refusal names (the rest are counted).
const MAX_NAMED_BLOCKED: usize = 20;

/// `cascade delete …`.
#[derive(Debug, Clone, Args)]
pub struct DeleteArgs {
    pub name: String,
    /// Also delete the resources that reference it with on_delete =
    /// cascade. The plan is asked first (a dry run): when a live resource
    /// outside the cascade would hold a member (a block reference), they
    /// are named, nothing changes, and the exit status is 3, unless
    /// --allow-blocked.
    #[arg(long, conflicts_with = "orphan")]
    pub cascade: bool,
    /// With --cascade: start it even though members would be held (they
    /// stay DELETING, BLOCKED, until their blockers go).
    #[arg(long, requires = "cascade")]
    pub allow_blocked: bool,
    /// Keep the resources that reference it with on_delete = cascade:
    /// their reference is cleared instead (even a required one).
    #[arg(long)]
    pub orphan: bool,
    /// Show what would be deleted, unset or blocked; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Succeed when the resource does not exist.
    #[arg(long)]
    pub allow_missing: bool,
    #[arg(long)]
    pub etag: Option<String>,
    #[arg(long)]
    pub uid: Option<String>,
    /// Follow the operation to the end, with a progress bar. Exits 1 when
    /// it failed, and 4 when it got stuck (something only a person can
    /// free: a live blocker, a lien, a FAILED deletion), printing what it
    /// waits on as `cascade explain` does.
    #[arg(long)]
    pub wait: bool,
    /// Delete exactly the closure of this plan: the token a dry run
    /// printed (`plan token: p1-…`). The node walks the closure again just
    /// before it starts and refuses (ABORTED, naming the members added and
    /// removed, nothing changed) when it is not that plan any more. Skips
    /// the plan and the question of --cascade: this is the confirmation.
    #[arg(long, value_name = "TOKEN", conflicts_with = "dry_run")]
    pub expect_plan: Option<String>,
    /// With --cascade: start a plan larger than --confirm-above without
    /// asking (needed without a terminal).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// With --cascade: ask before a plan of more members (resources
    /// deleted or unset, every region together) than this.
    #[arg(long, value_name = "N", env = "CASCADE_CONFIRM_ABOVE", default_value_t = DEFAULT_CONFIRM_ABOVE)]
    pub confirm_above: u64,
    /// Soft delete: keep every deleted member, in every region, DELETED
    /// (hidden, its name reserved) for at least this long, then purge it:
    /// `7d`, `12h`, `90s`. `cascade get/list --show-deleted` shows them.
    /// At most the node's [limits] max_retention (default 30d).
    #[arg(long, value_name = "DURATION", value_parser = parse_retention)]
    pub retain: Option<Duration>,
    /// Delete at most N members, the root included, in all regions
    /// together (a referrer that only loses a reference does not count).
    /// Once reached the cascade stops spreading: the members whose
    /// referrers were not started stay DELETING, BLOCKED "budget reached
    /// (N of N)", until `cascade admin extend-budget OPERATION M`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_deletions: Option<u64>,
    /// Enter at most R new members a second, in each region the cascade
    /// reaches (the first at once).
    #[arg(long, value_name = "R", value_parser = clap::value_parser!(u32).range(1..))]
    pub rate: Option<u32>,
}

/// A retention as the flag writes it, in whole seconds (the API's unit).
fn parse_retention(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if d.subsec_nanos() != 0 || d.is_zero() {
        return Err("a retention is a whole number of seconds, at least 1s".to_owned());
    }
    Ok(d)
}

impl DeleteArgs {
    fn request(&self, dry_run: bool) -> v1::DeleteRequest {
        v1::DeleteRequest {
            expect_plan: if dry_run {
                String::new()
            } else {
                self.expect_plan.clone().unwrap_or_default()
            },
            name: self.name.clone(),
            cascade: self.cascade,
            dry_run,
            allow_missing: self.allow_missing,
            etag: self.etag.clone().unwrap_or_default(),
            uid: self.uid.clone().unwrap_or_default(),
            requested_by: requester(),
            propagation: if self.orphan {
                v1::PropagationPolicy::Orphan
            } else {
                v1::PropagationPolicy::Unspecified
            } as i32,
            retention_seconds: self.retain.map_or(0, |d| d.as_secs()),
            max_deletions: self.max_deletions.unwrap_or_default(),
            rate_per_second: self.rate.unwrap_or_default(),
        }
    }
}

/// The members of a plan that a blocker outside the cascade holds for good
/// (one being deleted itself only delays them).
fn held_for_good(plan: &v1::Plan) -> Vec<&v1::PlannedBlock> {
    plan.blocked
        .iter()
        .filter(|b| b.blocker.as_ref().is_some_and(|x| !x.referrer_deleting))
        .collect()
}

/// One held member: `eu-west/network/ext is blocked by ap-south/router/edge
/// (region ap-south, field gateway_network)`.
fn held_line(b: &v1::PlannedBlock) -> String {
    let member = b.resource.as_ref().map(|r| r.name.as_str()).unwrap_or("?");
    let blocker = b.blocker.clone().unwrap_or_default();
    let region = blocker.referrer.split('/').next().unwrap_or("?");
    format!(
        "{member} is blocked by {} (region {region}, field {})",
        blocker.referrer, blocker.field
    )
}

pub(super) async fn run(
    client: &Client,
    args: DeleteArgs,
    json: bool,
    times: &TimeDisplay,
) -> Result<i32, ClientError> {
    let mut request = args.request(args.dry_run);
    if args.cascade && !args.dry_run && args.expect_plan.is_none() {
        match check_plan(client, &args, json).await? {
            Planned::Stop(code) => return Ok(code),
            Planned::Bind(token) => request.expect_plan = token,
            Planned::Unbound => {}
        }
    }
    let response = client.delete(request).await?;
    if let Some(plan) = &response.plan {
        if json {
            print_json(&render::plan_json(plan));
        } else {
            print!("{}", render::plan_text(plan));
        }
        return Ok(0);
    }
    let name = &args.name;
    let Some(op) = response.operation else {
        if json {
            print_json(&serde_json::json!({"deleted": false, "reason": "not found (allow_missing)"}));
        } else {
            println!("{name} does not exist; nothing to delete");
        }
        return Ok(0);
    };
    if !args.wait {
        if json {
            print_json(&render::operation_json(&op));
        } else {
            print!("{}", accepted_text(client, name, &op, response.already_deleting).await);
        }
        return Ok(0);
    }
    match follow(client, &op.id, json).await? {
        Followed::Done(last) => {
            let full = client.get_operation(&last.id, 1000).await?;
            if json {
                print_json(&render::operation_json(&full));
            } else {
                // Ages as of now, not as of when the wait began.
                print!("{}", render::operation_text(&full, &times.at(wall_clock_ms())));
            }
            Ok(i32::from(full.state == v1::OperationState::Failed as i32))
        }
        Followed::Stuck(explanation) => {
            if json {
                print_json(&serde_json::json!({
                    "stuck": true,
                    "explanation": render::explanation_json(&explanation),
                }));
            } else {
                eprintln!("stopped following: the deletion is stuck, and only a person can free it");
                print!("{}", render::explanation_text(&explanation));
            }
            Ok(EXIT_STUCK)
        }
    }
}

/// What the plan of a cascade says about starting it.
enum Planned {
    /// It must not start: the exit status (nothing was changed).
    Stop(i32),
    /// Start it bound to this token.
    Bind(String),
    /// Start it unbound: there is no plan (already being deleted, or
    /// missing with --allow-missing), or it has no token (the reason was
    /// printed).
    Unbound,
}

/// Asks for the plan of a cascade first. It must not start when members
/// would be held for good (or the plan is incomplete) and no
/// --allow-blocked, or when it is larger than --confirm-above and was not
/// confirmed. Otherwise the plan is shown (text output) and the delete
/// bound to its token.
async fn check_plan(client: &Client, args: &DeleteArgs, json: bool) -> Result<Planned, ClientError> {
    let planned = client.delete(args.request(true)).await?;
    // Already being deleted (its operation answers), or missing with
    // --allow-missing: nothing new would start.
    let Some(plan) = planned.plan else {
        return Ok(Planned::Unbound);
    };
    if let Some(code) = check_held(args, &plan, json) {
        return Ok(Planned::Stop(code));
    }
    if !plan.denied.is_empty() {
        // The delete will be refused before anything changes, naming every
        // member the caller may not change: that is the answer to show.
        return Ok(Planned::Unbound);
    }
    if !json {
        print!("{}", render::plan_summary(&plan));
    }
    if plan.members > args.confirm_above && !args.yes && !confirmed(args, &plan, json) {
        return Ok(Planned::Stop(EXIT_NOT_CONFIRMED));
    }
    if plan.token.is_empty() {
        if !json {
            eprintln!("starting it unbound: the plan has no token ({})", plan.token_missing);
        }
        return Ok(Planned::Unbound);
    }
    Ok(Planned::Bind(plan.token))
}

/// Asks y/N on the terminal for a plan above --confirm-above; without a
/// terminal says how to confirm it. True when the answer is y or yes.
fn confirmed(args: &DeleteArgs, plan: &v1::Plan, json: bool) -> bool {
    let (members, most, name) = (plan.members, args.confirm_above, &args.name);
    if !std::io::stdin().is_terminal() {
        if json {
            print_json(&serde_json::json!({
                "started": false,
                "reason": "not_confirmed",
                "plan": render::plan_json(plan),
            }));
        } else {
            eprintln!(
                "not started: this cascade changes {members} resources, more than --confirm-above {most}, \
                 and there is no terminal to ask on. Nothing was changed. \
                 Pass --yes to start it bound to this plan (cascade delete {name} --cascade --yes)."
            );
        }
        return false;
    }
    // The plan was printed to stdout: show it before the question.
    let _ = std::io::Write::flush(&mut std::io::stdout());
    eprint!("delete {name} and change these {members} resources (more than --confirm-above {most})? [y/N] ");
    let mut answer = String::new();
    // The CLI's one task waits for the person: blocking its thread is what is meant.
    if std::io::stdin().read_line(&mut answer).is_err() {
        return false;
    }
    let yes = matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes");
    if !yes {
        eprintln!("not started: not confirmed. Nothing was changed.");
    }
    yes
}

/// Some(exit status) when the cascade must not start: members would be
/// held for good (or the plan is incomplete) and no --allow-blocked.
fn check_held(args: &DeleteArgs, plan: &v1::Plan, json: bool) -> Option<i32> {
    let held = held_for_good(plan);
    let unknown = &plan.unreachable_regions;
    if held.is_empty() && unknown.is_empty() {
        return None;
    }
    if args.allow_blocked {
        if !json {
            eprintln!(
                "starting anyway (--allow-blocked): {} member(s) will stay DELETING, BLOCKED, until their blockers go",
                held.len()
            );
            for b in held.iter().take(MAX_NAMED_BLOCKED) {
                eprintln!("  {}", held_line(b));
            }
        }
        return None;
    }
    if json {
        print_json(&serde_json::json!({
            "started": false,
            "reason": if held.is_empty() { "plan_incomplete" } else { "would_be_held" },
            "plan": render::plan_json(plan),
        }));
        return Some(EXIT_WOULD_BE_HELD);
    }
    let name = &args.name;
    if held.is_empty() {
        eprintln!(
            "not started: the plan of this cascade is incomplete (regions {} could not be asked), so members there may be held",
            unknown.join(", ")
        );
    } else {
        eprintln!(
            "not started: this cascade would stay DELETING: {} member(s) would be held by a resource outside it that is not being deleted",
            held.len()
        );
        for b in held.iter().take(MAX_NAMED_BLOCKED) {
            eprintln!("  {}", held_line(b));
        }
        if held.len() > MAX_NAMED_BLOCKED {
            eprintln!(
                "  … and {} more (cascade delete {name} --cascade --dry-run)",
                held.len() - MAX_NAMED_BLOCKED
            );
        }
    }
    eprintln!("Nothing was changed. Delete the blockers or change their references first, or pass --allow-blocked to start it anyway.");
    Some(EXIT_WOULD_BE_HELD)
}

/// What an accepted deletion prints: held (and by what) when the resource
/// waits on its finalizers, else accepted; and how to follow it.
async fn accepted_text(client: &Client, name: &str, op: &v1::Operation, already: bool) -> String {
    let note = if already { " (already being deleted)" } else { "" };
    // The deletion's status is decided by the node's next work step, but
    // its finalizers are known now: a purge waits for every one.
    let finalizers = match client.get(name).await {
        Ok(r) => r.finalizers,
        Err(_) => Vec::new(),
    };
    let first = if finalizers.is_empty() {
        format!("accepted: deletion of {name}{note} (operation {})\n", op.id)
    } else {
        format!(
            "held: waiting for finalizers: {} (operation {}){note}\n",
            finalizers.join(", "),
            op.id
        )
    };
    format!("{first}follow it with: cascade operation {}\n", op.id)
}

/// How following an operation ended.
enum Followed {
    /// Its last report, done.
    Done(Box<v1::Operation>),
    /// It stopped moving, and its explanation says only a person frees it.
    Stuck(v1::DeletionExplanation),
}

/// Follows an operation to its end, drawing a progress bar on a terminal,
/// and asks every [`STUCK_CHECK_EVERY`] without a report whether it is
/// stuck: twice in a row with the same progress ends the wait (once could
/// be a cascade that has not reached a blocker yet in another region).
async fn follow(client: &Client, id: &str, quiet: bool) -> Result<Followed, ClientError> {
    let bar = if quiet || !std::io::stderr().is_terminal() {
        indicatif::ProgressBar::hidden()
    } else {
        let bar = indicatif::ProgressBar::new(1);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} [{bar:40}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    };
    let mut stream = client.watch_operation(id).await?;
    let mut last: Option<v1::Operation> = None;
    // The progress at the last look that found it stuck.
    let mut stuck_seen: Option<Option<v1::Progress>> = None;
    let outcome = loop {
        let next = tokio::time::timeout(STUCK_CHECK_EVERY, stream.next()).await;
        match next {
            Ok(Some(op)) => {
                let op = op?;
                let p = op.progress.unwrap_or_default();
                bar.set_length((p.deleted + p.pending + p.failed).max(1));
                bar.set_position(p.deleted + p.failed);
                bar.set_message(render::progress_text(&op));
                let done = op.done;
                last = Some(op);
                if done {
                    break last.take().map(|op| Followed::Done(Box::new(op)));
                }
            }
            Ok(None) => break last.take().map(|op| Followed::Done(Box::new(op))),
            Err(_quiet_for_a_while) => {
                let progress = last.as_ref().and_then(|op| op.progress);
                let request = v1::ExplainDeletionRequest {
                    name: String::new(),
                    operation_id: id.to_owned(),
                };
                let explained = tokio::time::timeout(EXPLAIN_TIMEOUT, client.explain_deletion(request)).await;
                match explained {
                    Ok(Ok(e)) if e.stuck => {
                        if stuck_seen == Some(progress) {
                            break Some(Followed::Stuck(e));
                        }
                        stuck_seen = Some(progress);
                    }
                    // Not stuck, or it could not be asked now: keep following.
                    _ => stuck_seen = None,
                }
            }
        }
    };
    bar.finish_and_clear();
    outcome.ok_or_else(|| ClientError::Usage(format!("the watch of operation {id} ended without a report")))
}

/// `cascade operation pause|resume|cancel ID`: act on a running operation
/// in every region it reached (the root's region carries it out and tells
/// the others; a region it cannot tell is named, and told later).
#[derive(Debug, Clone, clap::Subcommand)]
pub enum OperationControl {
    /// No region works on it (nothing of it is deleted, spread or purged)
    /// until `cascade operation resume ID`.
    Pause {
        id: String,
        /// Why (kept in the audit log).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Let a paused operation go on.
    Resume {
        id: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Enter no new member into deletion; members already DELETING finish
    /// where they need no new member, the others stay DELETING, BLOCKED
    /// "operation cancelled". The operation ends CANCELLED.
    Cancel {
        id: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
}

impl OperationControl {
    /// Asks the node; the root region's part comes back.
    pub(super) async fn run(&self, client: &Client) -> Result<v1::Operation, ClientError> {
        match self.clone() {
            OperationControl::Pause { id, reason } => {
                client.pause_operation(v1::PauseOperationRequest { id, reason }).await
            }
            OperationControl::Resume { id, reason } => {
                client.resume_operation(v1::ResumeOperationRequest { id, reason }).await
            }
            OperationControl::Cancel { id, reason } => {
                client.cancel_operation(v1::CancelOperationRequest { id, reason }).await
            }
        }
    }

    /// What was done, for a human: `operation X paused` and the regions
    /// that are told later.
    pub(super) fn text(&self, op: &v1::Operation) -> String {
        let done = match self {
            OperationControl::Pause { .. } => "paused",
            OperationControl::Resume { .. } => "resumed",
            OperationControl::Cancel { .. } => "cancelled",
        };
        let mut out = format!("operation {} {done} in every region", op.id);
        if !op.unreachable_regions.is_empty() {
            out += &format!(
                " but {} (unreachable: told as soon as it answers)",
                op.unreachable_regions.join(", ")
            );
        }
        out.push('\n');
        out
    }
}
