//! Output of the CLI: short text for people, JSON (`-o json`) for scripts.
//!
//! Text shows instants as a local time with its age (`21:30:05 (3m 12s
//! ago)`, the date too when not today; `--utc` for UTC) and durations in
//! their two largest units (`3m 4s`, core's `time_text::duration`, the one
//! formatter); never epoch milliseconds. JSON keeps every `*_ms` field
//! and adds next to each instant its RFC 3339 UTC string
//! (`create_time` beside `create_time_ms`): the stable contract of
//! docs/json-output.md.

use std::collections::BTreeMap;

use cascade_proto::v1;
use serde_json::{json, Value};

mod admin;
mod controls;
mod plan;
mod regions;
mod times;
mod undelete;
pub use admin::{
    audit_json, audit_table, cluster_status_json, cluster_status_text, deletion_entry_json, deletion_entry_text,
    deletions_table,
};
pub use plan::plan_summary;
use plan::token_line;
pub use times::{age, table, TimeDisplay};
pub(crate) use times::{rfc3339, rfc3339_or_null};
pub use undelete::{undelete_json, undelete_text};

fn state_name(state: i32) -> &'static str {
    v1::ResourceState::try_from(state)
        .map(|s| match s {
            v1::ResourceState::Unspecified => "UNSPECIFIED",
            v1::ResourceState::Creating => "CREATING",
            v1::ResourceState::Active => "ACTIVE",
            v1::ResourceState::Deleting => "DELETING",
            v1::ResourceState::Deleted => "DELETED",
        })
        .unwrap_or("UNKNOWN")
}

fn op_state_name(state: i32) -> &'static str {
    v1::OperationState::try_from(state)
        .map(|s| match s {
            v1::OperationState::Unspecified => "UNSPECIFIED",
            v1::OperationState::Running => "RUNNING",
            v1::OperationState::Succeeded => "SUCCEEDED",
            v1::OperationState::Failed => "FAILED",
            v1::OperationState::Cancelled => "CANCELLED",
            v1::OperationState::Paused => "PAUSED",
        })
        .unwrap_or("UNKNOWN")
}

fn object_ref(r: &v1::ObjectRef) -> Value {
    let mut v = json!({"name": r.name, "uid": r.uid});
    if r.dangling {
        v["dangling"] = json!(true);
    }
    v
}

fn blocker(b: &v1::Blocker) -> Value {
    json!({"referrer": b.referrer, "field": b.field, "referrer_deleting": b.referrer_deleting})
}

pub fn resource_json(r: &v1::Resource) -> Value {
    let mut attributes: Vec<_> = r.attributes.iter().collect();
    attributes.sort();
    let mut v = json!({
        "name": r.name,
        "uid": r.uid,
        "kind": r.kind,
        "region": r.region,
        "state": state_name(r.state),
        "etag": r.etag,
        "revision": r.revision,
        "attributes": attributes.into_iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "refs": r.refs.iter().map(|f| (f.field.clone(), json!(f.targets.iter().map(object_ref).collect::<Vec<_>>()))).collect::<serde_json::Map<_, _>>(),
        "create_time_ms": r.create_time_ms,
        "create_time": rfc3339(r.create_time_ms),
        "update_time_ms": r.update_time_ms,
        "update_time": rfc3339(r.update_time_ms),
        "finalizers": r.finalizers,
        "liens": r.liens.iter().map(|l| json!({
            "id": l.id,
            "reason": l.reason,
            "origin": l.origin,
            "create_time_ms": l.create_time_ms,
            "create_time": rfc3339(l.create_time_ms),
        })).collect::<Vec<_>>(),
    });
    if r.expire_time_ms > 0 {
        v["soft_deleted"] = json!({
            "delete_time_ms": r.delete_time_ms,
            "delete_time": rfc3339(r.delete_time_ms),
            "expire_time_ms": r.expire_time_ms,
            "expire_time": rfc3339(r.expire_time_ms),
            "operation_id": r.deleted_by_operation,
        });
    }
    if let Some(d) = &r.deletion {
        let status = deletion_status(Some(d));
        v["deletion"] = json!({
            "deleted_at_ms": d.deleted_at_ms,
            "deleted_at": rfc3339(d.deleted_at_ms),
            "reason": d.reason,
            "requested_by": d.requested_by,
            "operation_id": d.operation_id,
            "status": status,
            "blockers": d.blockers.iter().map(blocker).collect::<Vec<_>>(),
            "message": d.message,
            "finalizer_failures": d.finalizer_failures.iter().map(|f| json!({
                "finalizer": f.finalizer,
                "failures": f.failures,
                "last_reason": f.last_reason,
                "last_time_ms": f.last_time_ms,
                "last_time": rfc3339(f.last_time_ms),
                "next_attempt_ms": f.next_attempt_ms,
                "next_attempt": rfc3339_or_null(f.next_attempt_ms),
            })).collect::<Vec<_>>(),
            "forced": d.forced.as_ref().map(|f| json!({
                "by": f.by,
                "reason": f.reason,
                "time_ms": f.time_ms,
                "time": rfc3339(f.time_ms),
            })),
        });
    }
    v
}

pub fn resource_text(r: &v1::Resource, times: &TimeDisplay) -> String {
    let mut out = format!("{}  {}  uid={} etag={}\n", r.name, state_name(r.state), r.uid, r.etag);
    out += &format!("  created {}", times.instant(r.create_time_ms));
    if r.update_time_ms > r.create_time_ms {
        out += &format!(", updated {}", times.instant(r.update_time_ms));
    }
    out.push('\n');
    let mut attributes: Vec<_> = r.attributes.iter().collect();
    attributes.sort();
    for (k, v) in attributes {
        out += &format!("  {k} = {v}\n");
    }
    for f in &r.refs {
        let targets: Vec<String> = f
            .targets
            .iter()
            .map(|t| {
                if t.dangling {
                    format!("{} (dangling)", t.name)
                } else {
                    t.name.clone()
                }
            })
            .collect();
        out += &format!("  {} -> {}\n", f.field, targets.join(", "));
    }
    if !r.finalizers.is_empty() {
        out += &format!("  finalizers: {}\n", r.finalizers.join(", "));
    }
    for l in &r.liens {
        out += &format!("  lien {}: {} (by {})\n", l.id, l.reason, l.origin);
    }
    if r.expire_time_ms > 0 {
        out += &format!(
            "  soft-deleted {} by operation {}; purged {}\n",
            times.instant(r.delete_time_ms),
            r.deleted_by_operation,
            times.instant(r.expire_time_ms)
        );
    }
    if let Some(d) = &r.deletion {
        out += &format!(
            "  deleting since {}: {} (by {}), operation {}\n",
            times.instant(d.deleted_at_ms),
            d.reason,
            d.requested_by,
            d.operation_id
        );
        let status = deletion_status(Some(d));
        match (status.is_empty(), d.message.is_empty()) {
            (false, false) => out += &format!("  {status}: {}\n", d.message),
            (false, true) => out += &format!("  {status}\n"),
            (true, false) => out += &format!("  waiting: {}\n", d.message),
            (true, true) => {}
        }
        if let Some(f) = &d.forced {
            out += &format!(
                "  forced through by {} at {}: {}\n",
                f.by,
                times.instant(f.time_ms),
                f.reason
            );
        }
        for f in &d.finalizer_failures {
            let next = match f.next_attempt_ms {
                0 => String::new(),
                at => format!("; asked again at {}", times.instant(at)),
            };
            out += &format!(
                "  finalizer {} failed {} time(s), last: {}{next}\n",
                f.finalizer, f.failures, f.last_reason
            );
        }
    }
    out
}

pub fn operation_json(op: &v1::Operation) -> Value {
    let mut out = operation_json_fields(op);
    if let Some(map) = out.as_object_mut() {
        controls::add_controls_json(op, map);
    }
    out
}

fn operation_json_fields(op: &v1::Operation) -> Value {
    let p = op.progress.unwrap_or_default();
    json!({
        "id": op.id,
        "root": op.root.as_ref().map(object_ref),
        "state": op_state_name(op.state),
        "done": op.done,
        "cascade": op.cascade,
        "requested_by": op.requested_by,
        "progress": {"deleted": p.deleted, "unset": p.unset, "pending": p.pending, "blocked": p.blocked, "failed": p.failed,
            "restored": p.restored, "not_restored": p.not_restored},
        "undelete_of": op.undelete_of,
        "undelete_regions_left": op.undelete_regions_left,
        "create_time_ms": op.create_time_ms,
        "create_time": rfc3339_or_null(op.create_time_ms),
        "end_time_ms": op.end_time_ms,
        "end_time": rfc3339_or_null(op.end_time_ms),
        "outcomes": op.outcomes.iter().map(|o| {
            let action = v1::OutcomeAction::try_from(o.action)
                .map(|a| a.as_str_name().trim_start_matches("OUTCOME_ACTION_").to_owned())
                .unwrap_or_default();
            json!({
                "resource": o.resource.as_ref().map(object_ref),
                "action": action,
                "field": o.field,
                "message": o.message,
                "region": o.region,
                "blockers": o.blockers.iter().map(blocker).collect::<Vec<_>>(),
            })
        }).collect::<Vec<_>>(),
        "next_outcomes_page_token": op.next_outcomes_page_token,
        "unreachable_regions": op.unreachable_regions,
        "region_progress": regions::region_progress_json(op),
    })
}

pub fn progress_text(op: &v1::Operation) -> String {
    let p = op.progress.unwrap_or_default();
    if !op.undelete_of.is_empty() {
        return format!(
            "undelete of {}: {} restored, {} not restored",
            op.undelete_of, p.restored, p.not_restored
        );
    }
    format!(
        "{} deleted, {} unset, {} pending ({} blocked), {} failed",
        p.deleted, p.unset, p.pending, p.blocked, p.failed
    )
}

pub fn operation_text(op: &v1::Operation, times: &TimeDisplay) -> String {
    let root = op.root.as_ref().map(|r| r.name.as_str()).unwrap_or("");
    let mut out = format!("operation {} on {root}: {}\n", op.id, op_state_name(op.state));
    let mut when = Vec::new();
    if op.create_time_ms > 0 {
        when.push(format!("started {}", times.instant(op.create_time_ms)));
    }
    if op.end_time_ms > 0 {
        when.push(format!(
            "ended {}, after {}",
            times.instant(op.end_time_ms),
            age(op.end_time_ms.saturating_sub(op.create_time_ms))
        ));
    }
    if !when.is_empty() {
        out += &format!("  {}\n", when.join("; "));
    }
    out += &format!("  {}\n", progress_text(op));
    out += &regions::region_progress_text(op);
    if let Some(line) = controls::controls_text(op) {
        out += &format!("  {line}\n");
    }
    if !op.unreachable_regions.is_empty() {
        out += &format!(
            "  regions that could not be asked (their part is unknown): {}\n",
            op.unreachable_regions.join(", ")
        );
    }
    let mut rows = Vec::new();
    for o in &op.outcomes {
        let action = v1::OutcomeAction::try_from(o.action)
            .map(|a| a.as_str_name().trim_start_matches("OUTCOME_ACTION_").to_owned())
            .unwrap_or_default();
        let name = o.resource.as_ref().map(|r| r.name.as_str()).unwrap_or("");
        let detail = match (o.field.is_empty(), o.message.is_empty()) {
            (false, _) => format!("(field {})", o.field),
            (true, false) => o.message.clone(),
            _ => String::new(),
        };
        rows.push(vec![format!("  {action}"), name.to_owned(), detail]);
    }
    out += &table(&rows);
    out
}

pub fn plan_json(p: &v1::Plan) -> Value {
    json!({
        "deleted": p.deleted.iter().map(object_ref).collect::<Vec<_>>(),
        "unset": p.unset.iter().map(|u| json!({"resource": u.resource.as_ref().map(object_ref), "field": u.field})).collect::<Vec<_>>(),
        "blocked": p.blocked.iter().map(|b| json!({"resource": b.resource.as_ref().map(object_ref), "blocker": b.blocker.as_ref().map(blocker)})).collect::<Vec<_>>(),
        "truncated": p.truncated,
        "unreachable_regions": p.unreachable_regions,
        "denied": p.denied.iter().map(|d| json!({"region": d.region, "name": d.name, "verb": d.verb, "rule": d.rule})).collect::<Vec<_>>(),
        "denied_more": p.denied_more,
        "members": p.members,
        "token": p.token,
        "token_missing": p.token_missing,
    })
}

pub fn plan_text(p: &v1::Plan) -> String {
    let mut out = format!(
        "dry run: {} would be deleted, {} unset, {} blocked\n",
        p.deleted.len(),
        p.unset.len(),
        p.blocked.len()
    );
    for d in &p.deleted {
        out += &format!("  delete  {}\n", d.name);
    }
    for u in &p.unset {
        out += &format!(
            "  unset   {} (field {})\n",
            u.resource.as_ref().map(|r| r.name.as_str()).unwrap_or(""),
            u.field
        );
    }
    for b in &p.blocked {
        let blocker = b.blocker.clone().unwrap_or_default();
        out += &format!(
            "  blocked {} by {} (field {}){}\n",
            b.resource.as_ref().map(|r| r.name.as_str()).unwrap_or(""),
            blocker.referrer,
            blocker.field,
            if blocker.referrer_deleting {
                ""
            } else {
                ": stuck until the blocker is deleted or changed"
            }
        );
    }
    // What the caller may not change: the delete itself would be refused.
    for d in &p.denied {
        out += &denied_line(d);
    }
    if p.denied_more > 0 {
        out += &format!("  denied  ... and {} more\n", p.denied_more);
    }
    if !p.denied.is_empty() {
        out += "  (the delete would be refused: PERMISSION_DENIED, nothing changed)\n";
    }
    if p.truncated {
        out += "  (plan truncated)\n";
    }
    if !p.unreachable_regions.is_empty() {
        out += &format!(
            "  incomplete: regions {} could not be asked for their part\n",
            p.unreachable_regions.join(", ")
        );
    }
    // A region's part (Peer.Plan) has neither; a client's dry run always one.
    if !p.token.is_empty() || !p.token_missing.is_empty() {
        out += &token_line(p);
    }
    out
}

pub fn event_json(e: &v1::WatchEvent) -> Value {
    let kind = v1::EventType::try_from(e.r#type)
        .map(|t| t.as_str_name().trim_start_matches("EVENT_TYPE_").to_owned())
        .unwrap_or_default();
    json!({
        "revision": e.revision,
        "type": kind,
        "resource": e.resource.as_ref().map(object_ref),
        "snapshot": e.snapshot.as_ref().map(resource_json),
        "operation_id": e.operation_id,
        "message": e.message,
        "time_ms": e.time_ms,
        "time": rfc3339_or_null(e.time_ms),
    })
}

pub fn event_text(e: &v1::WatchEvent) -> String {
    let kind = v1::EventType::try_from(e.r#type)
        .map(|t| t.as_str_name().trim_start_matches("EVENT_TYPE_").to_owned())
        .unwrap_or_default();
    let name = e.resource.as_ref().map(|r| r.name.as_str()).unwrap_or("");
    format!("{:>8} {kind:<16} {name}  {}", e.revision, e.message)
}

/// The explanation's deletions as a forest: the children of each name (by
/// `parent`), and the roots (no parent among them), the operation's root first.
fn explanation_tree(e: &v1::DeletionExplanation) -> (Vec<usize>, BTreeMap<String, Vec<usize>>) {
    let names: std::collections::BTreeSet<&str> = e
        .deletions
        .iter()
        .filter_map(|d| d.resource.as_ref().map(|r| r.name.as_str()))
        .collect();
    let mut children: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut roots = Vec::new();
    for (i, d) in e.deletions.iter().enumerate() {
        if !d.parent.is_empty() && names.contains(d.parent.as_str()) {
            children.entry(d.parent.clone()).or_default().push(i);
        } else {
            roots.push(i);
        }
    }
    let root_name = e.root.as_ref().map(|r| r.name.as_str()).unwrap_or_default();
    roots.sort_by_key(|&i| e.deletions[i].resource.as_ref().is_none_or(|r| r.name != root_name));
    (roots, children)
}

fn explained_json(e: &v1::DeletionExplanation, i: usize, children: &BTreeMap<String, Vec<usize>>) -> Value {
    let d = &e.deletions[i];
    let name = d.resource.as_ref().map(|r| r.name.clone()).unwrap_or_default();
    let status = deletion_status(d.resource.as_ref().and_then(|r| r.deletion.as_ref()));
    json!({
        "name": name,
        "status": status,
        "field": d.field,
        "stuck": d.stuck,
        "reasons": d.reasons,
        "children": children
            .get(&name)
            .map(|c| c.iter().map(|&j| explained_json(e, j, children)).collect::<Vec<_>>())
            .unwrap_or_default(),
    })
}

/// The regions whose part of an explanation is missing: each with why and
/// since when the answering node has not heard from it (an older server
/// names them only).
fn unreachable_of(e: &v1::DeletionExplanation) -> Vec<v1::UnreachableRegion> {
    if !e.unreachable.is_empty() {
        return e.unreachable.clone();
    }
    e.unreachable_regions
        .iter()
        .map(|r| v1::UnreachableRegion {
            region: r.clone(),
            ..Default::default()
        })
        .collect()
}

/// How long ago the answering node last heard from `u` ("41s"), read
/// against the answer's own time (no clock skew between client and node);
/// None when it never did since it started.
fn last_heard(e: &v1::DeletionExplanation, u: &v1::UnreachableRegion) -> Option<String> {
    match u.last_contact_ms {
        0 => None,
        ms => Some(age(e.time_ms.saturating_sub(ms))),
    }
}

pub fn explanation_json(e: &v1::DeletionExplanation) -> Value {
    let (roots, children) = explanation_tree(e);
    json!({
        "operation_id": e.operation_id,
        "root": e.root.as_ref().map(object_ref),
        "stuck": e.stuck,
        "truncated": e.truncated,
        "unreachable_regions": e.unreachable_regions,
        "unreachable": unreachable_of(e)
            .iter()
            .map(|u| json!({
                "region": u.region,
                "reason": u.reason,
                "last_contact_ms": u.last_contact_ms,
                "last_contact": rfc3339_or_null(u.last_contact_ms),
                "last_heard_ago": last_heard(e, u),
            }))
            .collect::<Vec<_>>(),
        "time_ms": e.time_ms,
        "time": rfc3339_or_null(e.time_ms),
        "deletions": roots.iter().map(|&i| explained_json(e, i, &children)).collect::<Vec<_>>(),
    })
}

/// kubectl-tree style: one line per DELETING resource under the one whose
/// cascade reached it, its reasons beneath it.
pub fn explanation_text(e: &v1::DeletionExplanation) -> String {
    let root = e.root.as_ref().map(|r| r.name.as_str()).unwrap_or("?");
    let mut out = format!("operation {} on {root}", e.operation_id);
    // The regions whose part is missing, under the header: what is below
    // is what the others said.
    let mut missing = String::new();
    for u in unreachable_of(e) {
        let reason = if u.reason.is_empty() {
            "could not be asked".to_owned()
        } else {
            u.reason.clone()
        };
        let heard = match last_heard(e, &u) {
            Some(ago) => format!("; last heard from {ago} ago"),
            // An older node says neither.
            None if e.time_ms == 0 => String::new(),
            None => "; not heard from since the answering node started".to_owned(),
        };
        missing += &format!("region {} {reason}{heard}: its part is missing\n", u.region);
    }
    if e.deletions.is_empty() {
        out += if missing.is_empty() {
            ": nothing is waiting (the deletion is done)\n"
        } else {
            ": nothing is waiting in the regions that answered\n"
        };
        out += &missing;
        return out;
    }
    out += if e.stuck {
        ": STUCK (something below waits on a person)\n"
    } else {
        ": in progress\n"
    };
    out += &missing;
    let (roots, children) = explanation_tree(e);
    fn line(
        e: &v1::DeletionExplanation,
        i: usize,
        children: &BTreeMap<String, Vec<usize>>,
        prefix: &str,
        last: bool,
        out: &mut String,
    ) {
        let d = &e.deletions[i];
        let name = d.resource.as_ref().map(|r| r.name.clone()).unwrap_or_default();
        let status = deletion_status(d.resource.as_ref().and_then(|r| r.deletion.as_ref()));
        let branch = if last { "└─ " } else { "├─ " };
        let via = if d.field.is_empty() {
            String::new()
        } else {
            format!(" (via {})", d.field)
        };
        *out += &format!(
            "{prefix}{branch}{name}{via}  {status}{}\n",
            if d.stuck { "  [stuck]" } else { "" }
        );
        let inner = format!("{prefix}{}", if last { "   " } else { "│  " });
        let kids = children.get(&name).cloned().unwrap_or_default();
        for r in &d.reasons {
            *out += &format!("{inner}{}  · {r}\n", if kids.is_empty() { "" } else { "│" });
        }
        for (k, &j) in kids.iter().enumerate() {
            line(e, j, children, &inner, k + 1 == kids.len(), out);
        }
    }
    for (k, &i) in roots.iter().enumerate() {
        line(e, i, &children, "", k + 1 == roots.len(), &mut out);
    }
    if e.truncated {
        out += "(some region has more deletions of this operation than one answer holds)\n";
    }
    out
}

/// A deletion's status as the API names it, without the enum's prefix
/// (`BLOCKED`); empty without a deletion.
pub(crate) fn deletion_status(d: Option<&v1::Deletion>) -> String {
    d.and_then(|x| v1::DeletionStatus::try_from(x.status).ok())
        .map(|s| s.as_str_name().trim_start_matches("DELETION_STATUS_").to_owned())
        .unwrap_or_default()
}

/// One member the policy refuses, as the dry run and a refusal list it:
/// `  denied  us-east/port/p1 (region us-east): may not delete (rule net-admins-no-ports)`.
fn denied_line(d: &v1::DeniedMember) -> String {
    format!(
        "  denied  {} (region {}): may not {} (rule {})\n",
        d.name, d.region, d.verb, d.rule
    )
}

/// A PERMISSION_DENIED refusal of several members (a cascade's closure, a
/// batch), from the status's message and `ErrorDetails.denied`: who was
/// refused and how many members, that nothing changed, then each member
/// as the dry run lists it (sorted by region and name, so a long refusal
/// reads like the plan), instead of the message's one long line. None for
/// a refusal of one member: its message already says it in one line.
pub fn denied_refusal_text(message: &str, denied: &[v1::DeniedMember], more: u64) -> Option<String> {
    if denied.len() < 2 && more == 0 {
        return None;
    }
    // The node's message starts with the principal: "alice may not: …".
    let who = message
        .split_once(" may not: ")
        .map_or("the caller", |(principal, _)| principal);
    let total = denied.len() as u64 + more;
    let mut out = format!("{who} may not do this: {total} member(s) refused by policy; nothing was changed\n");
    let mut sorted: Vec<&v1::DeniedMember> = denied.iter().collect();
    sorted.sort_by(|a, b| {
        a.region
            .cmp(&b.region)
            .then_with(|| a.name.cmp(&b.name))
            .then_with(|| a.verb.cmp(&b.verb))
    });
    for d in sorted {
        out += &denied_line(d);
    }
    if more > 0 {
        out += &format!("  denied  ... and {more} more\n");
    }
    Some(out.trim_end().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn explanation() -> v1::DeletionExplanation {
        v1::DeletionExplanation {
            operation_id: "op".into(),
            root: Some(v1::ObjectRef {
                name: "eu-west/project/p".into(),
                ..Default::default()
            }),
            deletions: vec![v1::ExplainedDeletion {
                resource: Some(v1::Resource {
                    name: "eu-west/project/p".into(),
                    ..Default::default()
                }),
                reasons: vec!["region ap-south is unreachable: it acts once it is back".into()],
                ..Default::default()
            }],
            unreachable_regions: vec!["ap-south".into(), "us-east".into()],
            unreachable: vec![
                v1::UnreachableRegion {
                    region: "ap-south".into(),
                    last_contact_ms: 1_000_000 - 41_000,
                    reason: "did not answer within 1.2s".into(),
                },
                v1::UnreachableRegion {
                    region: "us-east".into(),
                    last_contact_ms: 0,
                    reason: "could not be asked: connection refused".into(),
                },
            ],
            time_ms: 1_000_000,
            ..Default::default()
        }
    }

    #[test]
    fn an_explanation_says_under_its_header_which_regions_did_not_answer_and_since_when() {
        let text = explanation_text(&explanation());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "operation op on eu-west/project/p: in progress", "{text}");
        assert_eq!(
            lines[1], "region ap-south did not answer within 1.2s; last heard from 41s ago: its part is missing",
            "{text}"
        );
        assert_eq!(
            lines[2],
            "region us-east could not be asked: connection refused; not heard from since the answering node started: its part is missing",
            "{text}"
        );
        assert!(
            text.contains("· region ap-south is unreachable: it acts once it is back"),
            "{text}"
        );

        let json = explanation_json(&explanation());
        assert_eq!(json["unreachable_regions"], json!(["ap-south", "us-east"]));
        assert_eq!(json["unreachable"][0]["region"], "ap-south");
        assert_eq!(json["unreachable"][0]["last_heard_ago"], "41s");
        assert_eq!(json["unreachable"][0]["last_contact_ms"], 959_000);
        assert_eq!(json["unreachable"][1]["last_heard_ago"], Value::Null);
    }

    #[test]
    fn an_older_servers_explanation_names_its_unreachable_regions_only() {
        let mut e = explanation();
        e.unreachable.clear();
        e.time_ms = 0;
        let text = explanation_text(&e);
        assert!(
            text.contains("region ap-south could not be asked: its part is missing\n"),
            "{text}"
        );
        assert_eq!(explanation_json(&e)["unreachable"][1]["region"], "us-east");
    }

    #[test]
    fn a_dry_run_lists_the_members_the_caller_may_not_change() {
        let plan = v1::Plan {
            deleted: vec![v1::ObjectRef {
                name: "ra/network/n".into(),
                ..Default::default()
            }],
            denied: vec![v1::DeniedMember {
                region: "rb".into(),
                name: "rb/port/p1".into(),
                verb: "delete".into(),
                rule: "default deny".into(),
            }],
            denied_more: 2,
            ..Default::default()
        };
        let text = plan_text(&plan);
        assert!(
            text.contains("denied  rb/port/p1 (region rb): may not delete (rule default deny)"),
            "{text}"
        );
        assert!(
            text.contains("and 2 more") && text.contains("PERMISSION_DENIED"),
            "{text}"
        );
        let json = plan_json(&plan);
        assert_eq!(json["denied"][0]["name"], "rb/port/p1");
        assert_eq!(json["denied_more"], 2);
    }

    fn denied(region: &str, name: &str, verb: &str, rule: &str) -> v1::DeniedMember {
        v1::DeniedMember {
            region: region.into(),
            name: name.into(),
            verb: verb.into(),
            rule: rule.into(),
        }
    }

    /// The README tour's refused cascade: the node's message lists five
    /// members on one line; the CLI lists every member the details carry,
    /// one a line with its region and missing verb, and says nothing changed.
    #[test]
    fn a_refused_cascade_lists_every_denied_member_with_its_region_and_verb() {
        let members: Vec<v1::DeniedMember> = (1..=6)
            .rev()
            .map(|i| {
                denied(
                    "us-east",
                    &format!("us-east/port/p{i}"),
                    "delete",
                    "net-admins-no-ports",
                )
            })
            .chain([denied(
                "ap-south",
                "ap-south/floating_ip/fip1",
                "update",
                "default deny",
            )])
            .collect();
        let message = "alice may not: delete on us-east/port/p6 (rule: net-admins-no-ports); … and 2 more";
        let text = describe_denied(message, &members, 3);
        assert_eq!(
            text.lines().next(),
            Some("alice may not do this: 10 member(s) refused by policy; nothing was changed"),
            "{text}"
        );
        let lines: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(
            lines.first().copied(),
            Some("  denied  ap-south/floating_ip/fip1 (region ap-south): may not update (rule default deny)"),
            "{text}"
        );
        // The sixth port, which the one-line message left out, is named too.
        assert!(
            lines.contains(&"  denied  us-east/port/p1 (region us-east): may not delete (rule net-admins-no-ports)"),
            "{text}"
        );
        assert_eq!(lines.len(), 8, "seven members and the rest counted:\n{text}");
        assert_eq!(lines[7], "  denied  ... and 3 more", "{text}");
        // One member: the message says it all.
        assert_eq!(denied_refusal_text(message, &members[..1], 0), None);
    }

    fn describe_denied(message: &str, members: &[v1::DeniedMember], more: u64) -> String {
        denied_refusal_text(message, members, more).expect("several members")
    }
}
