//! `cascade delete`: a cascade is planned before it starts (a member a live
//! blocker would hold is named, and nothing changes without
//! `--allow-blocked`), a held deletion says what holds it, and `--wait`
//! stops following a deletion only a person can free, showing why.

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

impl DeleteArgs {
    fn request(&self, dry_run: bool) -> v1::DeleteRequest {
        v1::DeleteRequest {
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
    if args.cascade && !args.dry_run {
        if let Some(code) = check_plan(client, &args, json).await? {
            return Ok(code);
        }
    }
    let response = client.delete(args.request(args.dry_run)).await?;
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

/// Asks for the plan of a cascade first. Some(exit status) when it must not
/// start: members would be held for good (or the plan is incomplete) and
/// no --allow-blocked.
async fn check_plan(client: &Client, args: &DeleteArgs, json: bool) -> Result<Option<i32>, ClientError> {
    let planned = client.delete(args.request(true)).await?;
    // Already being deleted (its operation answers), or missing with
    // --allow-missing: nothing new would start.
    let Some(plan) = planned.plan else {
        return Ok(None);
    };
    let held = held_for_good(&plan);
    let unknown = &plan.unreachable_regions;
    if held.is_empty() && unknown.is_empty() {
        return Ok(None);
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
        return Ok(None);
    }
    if json {
        print_json(&serde_json::json!({
            "started": false,
            "reason": if held.is_empty() { "plan_incomplete" } else { "would_be_held" },
            "plan": render::plan_json(&plan),
        }));
        return Ok(Some(EXIT_WOULD_BE_HELD));
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
    Ok(Some(EXIT_WOULD_BE_HELD))
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
    Done(v1::Operation),
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
                    break last.take().map(Followed::Done);
                }
            }
            Ok(None) => break last.take().map(Followed::Done),
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
