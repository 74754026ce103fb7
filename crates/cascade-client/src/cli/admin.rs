//! `cascade admin …`: the operators' calls (`cascade.v1.Admin`): the
//! deletions that do not finish, retrying a failed one, the audit log, and
//! a filtered purge.

use cascade_proto::v1;
use clap::{Args, Subcommand};

use std::time::Duration;

use super::{print_json, ClientArgs};
use crate::client::{AdminClient, Client, ClientError};
use crate::render::{self, TimeDisplay};

/// How long `force-purge` watches the forced deletion for its purge
/// before it says what the purge still waits for.
const PURGE_WATCH: Duration = Duration::from_secs(3);
/// Between two looks at it.
const PURGE_LOOK_EVERY: Duration = Duration::from_millis(100);

/// `cascade admin …`.
#[derive(Debug, Clone, Args)]
pub struct AdminArgs {
    /// The administrator token the node's `[admin] token` names (without
    /// it, only a client certificate --cert that `[admin] identities` lists
    /// is an administrator).
    #[arg(long, env = "CASCADE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    #[command(subcommand)]
    pub command: AdminCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum AdminCommand {
    /// One region's deletions (DELETING resources), filtered.
    Deletions {
        /// The region (default: the one --server serves).
        #[arg(long)]
        region: Option<String>,
        /// Only this status.
        #[arg(long, value_enum)]
        status: Option<DeletionStatusArg>,
        /// Only stuck ones: FAILED, blocked by a live resource, or held by a lien.
        #[arg(long)]
        stuck: bool,
        /// Only deletions at least this old (`90s`, `10m`, `2h`).
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Option<std::time::Duration>,
        /// At most this many (all pages are read up to it).
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Attempt a FAILED deletion again from zero.
    Retry {
        name: String,
        /// Why (kept in the audit log).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Force a deletion through: drop its finalizers and liens, and let its
    /// block referrers (in every region) lose the reference; it is purged
    /// once the other regions have released.
    ForcePurge {
        name: String,
        /// Why (required; kept in the audit log).
        #[arg(long)]
        reason: String,
        /// Also for a deletion younger than the node's force_purge_after_ms.
        #[arg(long)]
        force: bool,
    },
    /// One region's audit log, oldest first: every change, Admin call and
    /// refusal, with who, the node, the region it came through and the
    /// rule. With `-o json`, one JSON object a line (JSON lines).
    Audit(AuditArgs),
    /// Every ACTIVE resource a filter matches, in one region or in every
    /// region (AIP-165). Without --force nothing changes: how many match
    /// and the first ten by name. With --force every match is deleted with
    /// cascade as one operation (`cascade operation ID` follows it), each
    /// member's cascade following the schema. At least one of --kind,
    /// --prefix and --selector is required; a resource under a lien is never
    /// matched. A region that does not answer is named (a forced purge is
    /// then refused, nothing started); so is a forced purge over
    /// `[limits] max_purge_members` resources. Needs `admin.purge`.
    Purge(PurgeArgs),
    /// Set a bounded operation's budget (`cascade delete --max-deletions`)
    /// to N members, at least what it used: the members it held BLOCKED
    /// "budget reached" go on within a second, in every region.
    ExtendBudget {
        /// The operation id (`cascade delete` printed it).
        operation: String,
        /// The new budget: the most members the operation deletes, its
        /// root included, in all regions together.
        max_deletions: u64,
        /// Why (required; kept in the audit log).
        #[arg(long)]
        reason: String,
    },
}

/// `cascade admin purge`: what to purge.
#[derive(Debug, Clone, Args)]
pub struct PurgeArgs {
    /// Only resources of this kind.
    #[arg(long)]
    pub kind: Option<String>,
    /// Only resources whose id (after `region/kind/`) starts with this.
    #[arg(long)]
    pub prefix: Option<String>,
    /// Only resources whose attributes match this selector (`env=dev`,
    /// `tier in (a,b)`, `!keep`; commas AND), as `cascade list --selector`.
    #[arg(long)]
    pub selector: Option<String>,
    /// Only this region (default: every region).
    #[arg(long)]
    pub region: Option<String>,
    /// Only resources created at least this long ago (`90s`, `12h`, `7d`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub older_than: Option<std::time::Duration>,
    /// Delete what matches (without it, only count and show the first ten).
    #[arg(long)]
    pub force: bool,
    /// Why (kept in the audit log).
    #[arg(long, default_value = "")]
    pub reason: String,
}

/// `cascade admin audit`, also `cascade audit`: which entries of one
/// region's audit log.
#[derive(Debug, Clone, Args)]
pub struct AuditArgs {
    /// The region (default: the one --server serves).
    #[arg(long)]
    pub region: Option<String>,
    /// At most this many entries.
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    /// Only this principal's entries (its exact id: `alice`, `anonymous`).
    #[arg(long)]
    pub principal: Option<String>,
    /// Only entries about this resource (its exact full name).
    #[arg(long)]
    pub resource: Option<String>,
    /// Only this action (exact: `create`, `update`, `delete`, `cascade`,
    /// `orphan`, `add_lien`, `ForcePurge`, ...).
    #[arg(long)]
    pub action: Option<String>,
    /// Only entries at or after this: an RFC 3339 time
    /// (`2026-11-26T04:00:00Z`) or how long ago (`1h`, `30m`).
    #[arg(long, value_parser = parse_audit_time)]
    pub since: Option<AuditTime>,
    /// Only entries before this (same forms as --since).
    #[arg(long, value_parser = parse_audit_time)]
    pub until: Option<AuditTime>,
}

/// A point in time on the command line: when, or how long ago.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditTime {
    /// Milliseconds since the epoch.
    At(i64),
    /// This long before the command runs.
    Ago(std::time::Duration),
}

impl AuditTime {
    /// Milliseconds since the epoch, with `now_ms` the client's clock.
    fn ms(self, now_ms: i64) -> i64 {
        match self {
            AuditTime::At(ms) => ms,
            AuditTime::Ago(d) => now_ms.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        }
    }
}

fn parse_audit_time(text: &str) -> Result<AuditTime, String> {
    if let Ok(at) = humantime::parse_rfc3339_weak(text) {
        let ms = at
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| format!("{text}: before 1970"))?
            .as_millis();
        return Ok(AuditTime::At(i64::try_from(ms).unwrap_or(i64::MAX)));
    }
    humantime::parse_duration(text)
        .map(AuditTime::Ago)
        .map_err(|_| format!("{text}: neither an RFC 3339 time (2026-11-26T04:00:00Z) nor a duration ago (1h)"))
}

/// A deletion status on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeletionStatusArg {
    Pending,
    Blocked,
    Failed,
    Waiting,
}

/// `cascade admin …`: pages through a listing up to its limit.
pub(super) async fn run(
    client: &AdminClient,
    args: &ClientArgs,
    command: AdminCommand,
    json: bool,
    times: &TimeDisplay,
) -> Result<i32, ClientError> {
    match command {
        AdminCommand::Deletions {
            region,
            status,
            stuck,
            older_than,
            limit,
        } => {
            let status = match status {
                None => v1::DeletionStatus::Unspecified,
                Some(DeletionStatusArg::Pending) => v1::DeletionStatus::Pending,
                Some(DeletionStatusArg::Blocked) => v1::DeletionStatus::Blocked,
                Some(DeletionStatusArg::Failed) => v1::DeletionStatus::Failed,
                Some(DeletionStatusArg::Waiting) => v1::DeletionStatus::Waiting,
            };
            let mut all = Vec::new();
            let mut token = String::new();
            loop {
                let page = client
                    .list_deletions(v1::ListDeletionsRequest {
                        region: region.clone().unwrap_or_default(),
                        status: status as i32,
                        stuck,
                        older_than_ms: older_than.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                        page_size: u32::try_from(limit.saturating_sub(all.len()).min(1000)).unwrap_or(1000),
                        page_token: token,
                    })
                    .await?;
                all.extend(page.deletions);
                token = page.next_page_token;
                if token.is_empty() || all.len() >= limit {
                    break;
                }
            }
            if json {
                print_json(&serde_json::Value::Array(
                    all.iter().map(render::deletion_entry_json).collect(),
                ));
            } else if all.is_empty() {
                println!("no deletion matches");
            } else {
                print!("{}", render::deletions_table(&all, times));
            }
        }
        AdminCommand::ExtendBudget {
            operation,
            max_deletions,
            reason,
        } => {
            let op = client
                .extend_budget(v1::ExtendBudgetRequest {
                    operation_id: operation,
                    max_deletions,
                    reason,
                })
                .await?;
            if json {
                print_json(&render::operation_json(&op));
            } else {
                println!(
                    "operation {}: budget {} member(s), {} used",
                    op.id, op.max_deletions, op.budget_used
                );
            }
        }
        AdminCommand::Retry { name, reason } => {
            let e = client.retry_deletion(v1::RetryDeletionRequest { name, reason }).await?;
            if json {
                print_json(&render::deletion_entry_json(&e));
            } else {
                print!("{}", render::deletion_entry_text("retried", &e));
            }
        }
        AdminCommand::ForcePurge { name, reason, force } => {
            let e = client
                .force_purge(v1::ForcePurgeRequest {
                    name: name.clone(),
                    reason,
                    force,
                })
                .await?;
            if json {
                print_json(&render::deletion_entry_json(&e));
            } else {
                let resources = args.resources_client().await?;
                print!("{}", purge_text(&resources, &name).await);
            }
        }
        AdminCommand::Purge(purge) => {
            let force = purge.force;
            let answer = client
                .purge(v1::PurgeRequest {
                    kind: purge.kind.unwrap_or_default(),
                    name_prefix: purge.prefix.unwrap_or_default(),
                    attribute_selector: purge.selector.unwrap_or_default(),
                    region: purge.region.unwrap_or_default(),
                    older_than_ms: purge
                        .older_than
                        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                    force,
                    reason: purge.reason,
                })
                .await?;
            if json {
                print_json(&purge_json(&answer));
            } else {
                print!("{}", purge_answer_text(&answer, force));
            }
        }
        AdminCommand::Audit(AuditArgs {
            region,
            limit,
            principal,
            resource,
            action,
            since,
            until,
        }) => {
            let now_ms = super::wall_clock_ms();
            let mut all = Vec::new();
            let mut token = String::new();
            loop {
                // A selective filter may answer short pages (the node
                // examines a bounded number of entries a page): the token
                // says whether to go on.
                let page = client
                    .list_audit(v1::ListAuditRequest {
                        region: region.clone().unwrap_or_default(),
                        page_size: u32::try_from(limit.saturating_sub(all.len()).min(1000)).unwrap_or(1000),
                        page_token: token,
                        principal: principal.clone().unwrap_or_default(),
                        resource: resource.clone().unwrap_or_default(),
                        action: action.clone().unwrap_or_default(),
                        since_ms: since.map_or(0, |t| t.ms(now_ms)),
                        until_ms: until.map_or(0, |t| t.ms(now_ms)),
                    })
                    .await?;
                all.extend(page.entries);
                token = page.next_page_token;
                if token.is_empty() || all.len() >= limit {
                    break;
                }
            }
            if json {
                // JSON lines: an export streams, and each line stands alone.
                for e in &all {
                    println!("{}", render::audit_json(e));
                }
            } else if all.is_empty() {
                println!("the audit log is empty");
            } else {
                print!("{}", render::audit_table(&all, times));
            }
        }
    }
    Ok(0)
}

/// What a force purge came to: `purged: NAME` once a Get no longer finds
/// it (within [`PURGE_WATCH`]), else what its purge still waits for
/// (`purging: waiting on region ap-south to release 1 reference(s)`).
async fn purge_text(resources: &Client, name: &str) -> String {
    let mut waiting = String::new();
    for _ in 0..PURGE_WATCH.as_millis() / PURGE_LOOK_EVERY.as_millis() {
        match resources.get(name).await {
            Err(e) if e.code() == Some(tonic::Code::NotFound) => return format!("purged: {name}\n"),
            Ok(r) => {
                waiting = r.deletion.map(|d| d.message).unwrap_or_default();
            }
            Err(_) => {}
        }
        tokio::time::sleep(PURGE_LOOK_EVERY).await;
    }
    if waiting.is_empty() {
        waiting = "waiting for its cascade and for the other regions to release it".to_owned();
    }
    format!("purging: {name}: {waiting} (forced through; `cascade get {name}` shows it until it is purged)\n")
}

/// `cascade admin purge`'s answer for people: the count (and whether it is
/// a lower bound), the first names, the regions not counted, and with
/// --force the operation.
fn purge_answer_text(answer: &v1::PurgeResponse, force: bool) -> String {
    let mut out = String::new();
    let count = if answer.count_is_lower_bound {
        format!("at least {}", answer.purge_count)
    } else {
        answer.purge_count.to_string()
    };
    match &answer.operation {
        Some(op) if force => {
            out += &format!(
                "{count} match; deleting them in operation {} (`cascade operation {}` follows it)\n",
                op.id, op.id
            );
        }
        _ if answer.purge_count == 0 => out += "nothing matches\n",
        _ => {
            out += &format!("{count} match (first by name):\n");
            for name in &answer.purge_sample {
                out += &format!("  {name}\n");
            }
        }
    }
    for region in answer.regions.iter().filter(|r| !r.error.is_empty()) {
        out += &format!("not counted: region {}: {}\n", region.region, region.error);
    }
    out
}

fn purge_json(answer: &v1::PurgeResponse) -> serde_json::Value {
    serde_json::json!({
        "purge_count": answer.purge_count,
        "purge_sample": answer.purge_sample,
        "count_is_lower_bound": answer.count_is_lower_bound,
        "unreachable_regions": answer.unreachable_regions,
        "regions": answer.regions.iter().map(|r| serde_json::json!({
            "region": r.region,
            "purge_count": r.purge_count,
            "count_is_lower_bound": r.count_is_lower_bound,
            "error": r.error,
            "started": r.started,
        })).collect::<Vec<_>>(),
        "operation": answer.operation.as_ref().map(render::operation_json),
    })
}
