//! Conversions between the core model and the wire types.
//!
//! Decoding a request checks only what the wire format cannot (uids parse);
//! the semantic checks, with field paths, are the core's.
//!
//! Size: one file of about 1,000 lines on purpose: every conversion between a
//! core type and its wire type, each next to its inverse, so that a field
//! added to one side is seen missing on the other in the same read.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use cascade_core::closure::PartSummary;
use cascade_core::invariants::RegionView;
use cascade_core::model::{
    BackRef, BackRefKey, Blocker, DeletionReason, DeletionRecord, DeletionStatus, Event, EventType, FinalizerFailure,
    ForcedPurge, Operation, OperationState, Outcome, OutcomeAction, RefTarget, Resource, ResourceState,
};
use cascade_core::operation_view::{OperationPage, OperationView, RegionProgress};
use cascade_core::protocol::{DeleteRequest, FinalizerReport, Plan, RefRequest, ResourceSpec};
use cascade_core::{OnDelete, OperationId, RegionId, ResourceName, Uid};
use tonic::Status;

use crate::status::invalid_field;
use crate::v1;

/// A timestamp as the wire carries it (milliseconds since the epoch).
pub fn ms(t: cascade_core::Timestamp) -> i64 {
    i64::try_from(t.0).unwrap_or(i64::MAX)
}

/// A reference target on the wire (`dangling` is for the caller to set:
/// only it knows whether the target is gone).
pub fn object_ref(t: &RefTarget) -> v1::ObjectRef {
    v1::ObjectRef {
        name: t.name.to_string(),
        uid: t.uid.to_string(),
        dangling: false,
    }
}

fn optional_uid(raw: &str, field: &str) -> Result<Option<Uid>, Status> {
    if raw.is_empty() {
        return Ok(None);
    }
    Uid::parse(raw).map(Some).map_err(|e| invalid_field(field, e))
}

/// `field` prefixes the paths in errors (`resources[3]` in a batch, empty
/// for a single resource), matching the paths the core reports. A target's
/// uid is named `refs.{field}[j].uid` (see [`resource_spec_with`] for the
/// schema-aware paths the node uses).
pub fn resource_spec(spec: v1::ResourceSpec, field: &str) -> Result<ResourceSpec, Status> {
    resource_spec_with(spec, field, &|_| true)
}

/// [`resource_spec`], naming a target as the core does: `refs.ports[2]`
/// for an element of a list reference (`many(field)` is true) and
/// `refs.network` for a single reference.
pub fn resource_spec_with(
    spec: v1::ResourceSpec,
    field: &str,
    many: &dyn Fn(&str) -> bool,
) -> Result<ResourceSpec, Status> {
    resource_spec_at(spec, &|| field.to_owned(), many)
}

/// [`resource_spec_with`] with the prefix built only for a refusal (a
/// batch's `resources[3]`, formatted per spec, was a format per member
/// that no answer read: docs/BENCHMARKS.md, "P5 (2026-11-27)").
pub fn resource_spec_at(
    spec: v1::ResourceSpec,
    field: &dyn Fn() -> String,
    many: &dyn Fn(&str) -> bool,
) -> Result<ResourceSpec, Status> {
    let at = |path: String| {
        let field = field();
        if field.is_empty() {
            path
        } else {
            format!("{field}.{path}")
        }
    };
    let mut refs: BTreeMap<String, Vec<RefRequest>> = BTreeMap::new();
    for (i, r) in spec.refs.into_iter().enumerate() {
        if refs.contains_key(&r.field) {
            return Err(invalid_field(
                &at(format!("refs[{i}]")),
                format!("field {} is given twice", cascade_core::limits::quote(&r.field)),
            ));
        }
        let mut targets = Vec::with_capacity(r.targets.len());
        for (j, t) in r.targets.into_iter().enumerate() {
            // The path is spelled out only for a bad uid: a batch of a
            // thousand specs formatted two strings per target otherwise
            // (docs/BENCHMARKS.md, "P5 (2026-11-27)").
            let uid = if t.uid.is_empty() {
                None
            } else {
                let target = if many(&r.field) {
                    format!("refs.{}[{j}]", r.field)
                } else {
                    format!("refs.{}", r.field)
                };
                optional_uid(&t.uid, &at(format!("{target}.uid")))?
            };
            targets.push(RefRequest { name: t.name, uid });
        }
        refs.insert(r.field, targets);
    }
    Ok(ResourceSpec {
        name: spec.name,
        attributes: spec.attributes.into_iter().collect(),
        refs,
        finalizers: spec.finalizers,
    })
}

/// Decodes a RemoveFinalizer request (the uid, when given, parsed).
pub fn remove_finalizer_request(req: v1::RemoveFinalizerRequest) -> Result<FinalizerReport, Status> {
    Ok(FinalizerReport {
        uid: optional_uid(&req.uid, "uid")?,
        name: req.name,
        finalizer: req.finalizer,
        reason: String::new(),
    })
}

/// Decodes a ReportFinalizerFailure request (the uid, when given, parsed).
pub fn finalizer_failure_request(req: v1::ReportFinalizerFailureRequest) -> Result<FinalizerReport, Status> {
    Ok(FinalizerReport {
        uid: optional_uid(&req.uid, "uid")?,
        name: req.name,
        finalizer: req.finalizer,
        reason: req.reason,
    })
}

/// Decodes a Delete request into the core's terms: the uid precondition
/// parsed, an empty etag as none, an empty `requested_by` as `anonymous`.
/// `remote_kept` is left empty for the node to fill in.
pub fn delete_request(req: v1::DeleteRequest) -> Result<DeleteRequest, Status> {
    Ok(DeleteRequest {
        uid: optional_uid(&req.uid, "uid")?,
        name: req.name,
        cascade: req.cascade,
        orphan: match v1::PropagationPolicy::try_from(req.propagation) {
            Ok(v1::PropagationPolicy::Unspecified) => false,
            Ok(v1::PropagationPolicy::Orphan) => true,
            Err(_) => {
                return Err(crate::status::invalid_field(
                    "propagation",
                    format!("unknown propagation policy {}", req.propagation),
                ))
            }
        },
        dry_run: req.dry_run,
        allow_missing: req.allow_missing,
        etag: (!req.etag.is_empty()).then_some(req.etag),
        requested_by: if req.requested_by.is_empty() {
            "anonymous".to_owned()
        } else {
            req.requested_by
        },
        // Bounded by the core against the node's `[limits] max_retention`.
        retain_ms: req.retention_seconds.saturating_mul(1000),
        // Filled in by the node from the referrers' regions.
        remote_kept: Default::default(),
        // Filled in by the node's handler from who called.
        principal: cascade_core::auth::Principal::anonymous(),
        bounds: cascade_core::protocol::Bounds {
            max_deletions: (req.max_deletions > 0).then_some(req.max_deletions),
            rate_per_s: (req.rate_per_second > 0).then_some(req.rate_per_second),
        },
        // Minted by the node when it registers a bounded operation.
        operation_id: None,
    })
}

/// The wire form of a resource state.
pub fn resource_state(s: ResourceState) -> v1::ResourceState {
    match s {
        ResourceState::Creating => v1::ResourceState::Creating,
        ResourceState::Active => v1::ResourceState::Active,
        ResourceState::Deleting => v1::ResourceState::Deleting,
        ResourceState::Deleted => v1::ResourceState::Deleted,
    }
}

/// A List request's state filter in the core's terms (None: no filter).
pub fn resource_state_from(s: v1::ResourceState) -> Option<ResourceState> {
    match s {
        v1::ResourceState::Unspecified => None,
        v1::ResourceState::Creating => Some(ResourceState::Creating),
        v1::ResourceState::Active => Some(ResourceState::Active),
        v1::ResourceState::Deleting => Some(ResourceState::Deleting),
        v1::ResourceState::Deleted => Some(ResourceState::Deleted),
    }
}

fn blockers(list: &[Blocker]) -> Vec<v1::Blocker> {
    list.iter()
        .map(|b| v1::Blocker {
            referrer: b.referrer.to_string(),
            field: b.field.clone(),
            referrer_deleting: b.referrer_deleting,
        })
        .collect()
}

fn deletion(d: &DeletionRecord) -> v1::Deletion {
    let (status, list, message) = match &d.status {
        DeletionStatus::Pending => (v1::DeletionStatus::Pending, Vec::new(), String::new()),
        DeletionStatus::Blocked { blockers: b, reason } => (v1::DeletionStatus::Blocked, blockers(b), reason.clone()),
        DeletionStatus::Failed { error } => (v1::DeletionStatus::Failed, Vec::new(), error.clone()),
        DeletionStatus::Waiting { reason, .. } => (v1::DeletionStatus::Waiting, Vec::new(), reason.clone()),
    };
    v1::Deletion {
        deleted_at_ms: ms(d.deleted_at),
        reason: match &d.reason {
            DeletionReason::Requested => "requested".to_owned(),
            DeletionReason::Cascade { from, field } => {
                format!("cascade from {from} (field {field})")
            }
        },
        requested_by: d.requested_by.clone(),
        operation_id: d.operation.to_string(),
        status: status as i32,
        blockers: list,
        message,
        finalizer_failures: d
            .finalizer_failures
            .iter()
            .map(|f| v1::FinalizerFailure {
                finalizer: f.finalizer.clone(),
                failures: f.failures,
                last_reason: f.last_reason.clone(),
                last_time_ms: ms(f.last_time),
                next_attempt_ms: f.retry_at.map(ms).unwrap_or(0),
            })
            .collect(),
        forced: d.forced.as_ref().map(|f| v1::ForcedPurge {
            by: f.by.clone(),
            reason: f.reason.clone(),
            time_ms: ms(f.time),
        }),
    }
}

/// A resource as clients see it. `dangling` names the targets of
/// allow_dangling references that no longer exist.
pub fn resource(r: &Resource, record: Option<&DeletionRecord>, dangling: &BTreeSet<Uid>) -> v1::Resource {
    v1::Resource {
        name: r.name.to_string(),
        uid: r.uid.to_string(),
        kind: r.name.kind().to_owned(),
        region: r.name.region().to_owned(),
        state: resource_state(r.state) as i32,
        attributes: r.attributes.clone().into_iter().collect(),
        refs: r
            .refs
            .iter()
            .map(|(field, targets)| v1::ReferenceField {
                field: field.clone(),
                targets: targets
                    .iter()
                    .map(|t| v1::ObjectRef {
                        dangling: dangling.contains(&t.uid),
                        ..object_ref(t)
                    })
                    .collect(),
            })
            .collect(),
        revision: r.revision,
        etag: r.etag(),
        create_time_ms: ms(r.create_time),
        update_time_ms: ms(r.update_time),
        finalizers: r.finalizers.clone(),
        deletion: record.map(deletion),
        liens: r.liens.iter().map(lien).collect(),
        delete_time_ms: r.soft_deleted.map(|s| ms(s.delete_time)).unwrap_or_default(),
        expire_time_ms: r.soft_deleted.map(|s| ms(s.expire_time)).unwrap_or_default(),
        deleted_by_operation: r.soft_deleted.map(|s| s.operation.to_string()).unwrap_or_default(),
    }
}

/// The wire form of a lien.
pub fn lien(l: &cascade_core::model::Lien) -> v1::Lien {
    v1::Lien {
        id: l.id.clone(),
        reason: l.reason.clone(),
        origin: l.origin.clone(),
        create_time_ms: ms(l.create_time),
    }
}

/// One region's part of an operation with a page of its outcomes;
/// `unreachable_regions` is left empty for the node that aggregates parts.
pub fn operation(op: &Operation, outcomes: &[Outcome], next_page_token: String) -> v1::Operation {
    let controls = op.controls.as_deref();
    v1::Operation {
        id: op.id.to_string(),
        root: Some(object_ref(&op.root)),
        requested_by: op.requested_by.clone(),
        cascade: op.cascade,
        state: operation_state(op) as i32,
        progress: Some(v1::Progress {
            deleted: op.progress.deleted,
            unset: op.progress.unset,
            pending: op.progress.pending,
            blocked: op.progress.blocked,
            failed: op.progress.failed,
            restored: op.undelete.as_ref().map_or(0, |u| u.restored),
            not_restored: op.undelete.as_ref().map_or(0, |u| u.not_restored),
        }),
        create_time_ms: ms(op.create_time),
        end_time_ms: op.end_time.map(ms).unwrap_or_default(),
        outcomes: outcomes.iter().map(outcome).collect(),
        next_outcomes_page_token: next_page_token,
        done: op.state != OperationState::Running,
        unreachable_regions: Vec::new(),
        changes: op.changes,
        reached_regions: op.reached.iter().cloned().collect(),
        reports_reached: true,
        retention_seconds: op.retain_ms / 1000,
        max_deletions: controls.and_then(|c| c.max_deletions).unwrap_or_default(),
        budget_used: controls.map(|c| c.used()).unwrap_or_default(),
        rate_per_second: controls.and_then(|c| c.rate_per_s).unwrap_or_default(),
        controlled_by: controls.map(|c| c.by.clone()).unwrap_or_default(),
        undelete_of: op.undelete.as_ref().map(|u| u.of.to_string()).unwrap_or_default(),
        undelete_regions_left: op
            .undelete
            .as_ref()
            .map(|u| u.regions_left.iter().cloned().collect())
            .unwrap_or_default(),
        region_progress: Vec::new(),
    }
}

/// An operation's state as the API names it: a running one that is
/// paused reads PAUSED.
pub fn operation_state(op: &Operation) -> v1::OperationState {
    match op.state {
        OperationState::Running if op.controls.as_ref().is_some_and(|c| c.paused) => v1::OperationState::Paused,
        OperationState::Running => v1::OperationState::Running,
        OperationState::Succeeded => v1::OperationState::Succeeded,
        OperationState::Failed => v1::OperationState::Failed,
        OperationState::Cancelled => v1::OperationState::Cancelled,
    }
}

/// One resource's outcome, with its region and, for blocked, failed and
/// waiting ones, a human-readable message.
pub fn outcome(o: &Outcome) -> v1::Outcome {
    let mut out = v1::Outcome {
        resource: Some(object_ref(&o.resource)),
        time_ms: ms(o.time),
        region: o.resource.name.region().to_owned(),
        ..Default::default()
    };
    let action = match &o.action {
        OutcomeAction::Pending => v1::OutcomeAction::Pending,
        OutcomeAction::Deleted => v1::OutcomeAction::Deleted,
        OutcomeAction::Unset { field, .. } => {
            out.field = field.clone();
            v1::OutcomeAction::Unset
        }
        OutcomeAction::Blocked { blockers: b } => {
            out.blockers = blockers(b);
            out.message = cascade_core::error::describe_blockers(b);
            v1::OutcomeAction::Blocked
        }
        OutcomeAction::Failed { error } => {
            out.message = error.clone();
            v1::OutcomeAction::Failed
        }
        OutcomeAction::Waiting { regions } => {
            out.message = format!("waiting on region {}", regions.join(", "));
            v1::OutcomeAction::Waiting
        }
        OutcomeAction::Held { reason } => {
            out.message = reason.clone();
            v1::OutcomeAction::Blocked
        }
        OutcomeAction::Restored => v1::OutcomeAction::Restored,
        OutcomeAction::NotRestored { reason } => {
            out.message = reason.clone();
            v1::OutcomeAction::NotRestored
        }
    };
    out.action = action as i32;
    out
}

/// An operation with every region's part merged (see
/// `cascade_core::operation_view`); `next_page_token` is the encoded cursor.
pub fn operation_view(view: &OperationView, next_page_token: String) -> v1::Operation {
    let mut out = operation(&view.operation, &view.outcomes, next_page_token);
    out.done = view.done;
    out.unreachable_regions = view.unreachable.clone();
    out.region_progress = view.regions.iter().map(region_progress).collect();
    // What one region's part reached is the closure check's business
    // (`part_summary_from`), not a merged view's.
    out.reached_regions.clear();
    out.reports_reached = false;
    out
}

/// One region's counters of an aggregated operation.
fn region_progress(r: &RegionProgress) -> v1::RegionProgress {
    let state = match r.state {
        None => v1::OperationState::Unspecified,
        Some(OperationState::Running) => v1::OperationState::Running,
        Some(OperationState::Succeeded) => v1::OperationState::Succeeded,
        Some(OperationState::Failed) => v1::OperationState::Failed,
        Some(OperationState::Cancelled) => v1::OperationState::Cancelled,
    };
    v1::RegionProgress {
        region: r.region.clone(),
        progress: Some(v1::Progress {
            deleted: r.progress.deleted,
            unset: r.progress.unset,
            pending: r.progress.pending,
            blocked: r.progress.blocked,
            failed: r.progress.failed,
            restored: r.restored,
            not_restored: r.not_restored,
        }),
        reachable: r.reachable,
        state: state as i32,
    }
}

/// What the closure check needs of a region's part (`Peer.OperationPart`):
/// its pending count, change count and the regions it reached (None from a
/// node that does not report them: the check then asks every region).
pub fn part_summary_from(op: &v1::Operation) -> PartSummary {
    PartSummary {
        pending: op.progress.as_ref().map_or(0, |p| p.pending),
        changes: op.changes,
        reached: op.reports_reached.then(|| op.reached_regions.iter().cloned().collect()),
    }
}

fn time_from(ms: i64) -> cascade_core::Timestamp {
    cascade_core::Timestamp(u64::try_from(ms).unwrap_or(0))
}

fn blocker_from(b: v1::Blocker, field: &str) -> Result<Blocker, Status> {
    Ok(Blocker {
        referrer: cascade_core::ResourceName::parse(&b.referrer).map_err(|e| invalid_field(field, e))?,
        field: b.field,
        referrer_deleting: b.referrer_deleting,
    })
}

/// A region's part of an operation as another node answered it
/// (`Peer.OperationPart`): the inverse of [`operation`] and [`outcome`].
/// `next` is the part's own page token (the last outcome's name).
pub fn operation_page_from(op: v1::Operation) -> Result<OperationPage, Status> {
    let paused = op.state == v1::OperationState::Paused as i32;
    let controls =
        (paused || op.max_deletions > 0 || op.rate_per_second > 0 || !op.controlled_by.is_empty()).then(|| {
            Box::new(cascade_core::model::OperationControls {
                max_deletions: (op.max_deletions > 0).then_some(op.max_deletions),
                admitted: op.budget_used,
                rate_per_s: (op.rate_per_second > 0).then_some(op.rate_per_second),
                paused,
                cancelled: op.state == v1::OperationState::Cancelled as i32,
                by: op.controlled_by.clone(),
                ..Default::default()
            })
        });
    let state = match v1::OperationState::try_from(op.state) {
        Ok(v1::OperationState::Running) => OperationState::Running,
        Ok(v1::OperationState::Succeeded) => OperationState::Succeeded,
        Ok(v1::OperationState::Failed) => OperationState::Failed,
        Ok(v1::OperationState::Cancelled) => OperationState::Cancelled,
        // The part's controls are not carried back; paused is running.
        Ok(v1::OperationState::Paused) => OperationState::Running,
        _ => return Err(invalid_field("state", "unknown operation state")),
    };
    let progress = op.progress.unwrap_or_default();
    let mut outcomes = Vec::with_capacity(op.outcomes.len());
    for (i, o) in op.outcomes.into_iter().enumerate() {
        let at = format!("outcomes[{i}]");
        let action = match v1::OutcomeAction::try_from(o.action) {
            Ok(v1::OutcomeAction::Pending) => OutcomeAction::Pending,
            Ok(v1::OutcomeAction::Deleted) => OutcomeAction::Deleted,
            Ok(v1::OutcomeAction::Unset) => OutcomeAction::Unset {
                field: o.field,
                undo: None,
            },
            // A hold by the operation's controls: no blocker, its reason.
            Ok(v1::OutcomeAction::Blocked)
                if o.blockers.is_empty() && cascade_core::protocol::held_by_operation(&o.message) =>
            {
                OutcomeAction::Held { reason: o.message }
            }
            Ok(v1::OutcomeAction::Blocked) => OutcomeAction::Blocked {
                blockers: o
                    .blockers
                    .into_iter()
                    .map(|b| blocker_from(b, &format!("{at}.blockers")))
                    .collect::<Result<_, _>>()?,
            },
            Ok(v1::OutcomeAction::Failed) => OutcomeAction::Failed { error: o.message },
            Ok(v1::OutcomeAction::Waiting) => OutcomeAction::Waiting {
                regions: o
                    .message
                    .strip_prefix("waiting on region ")
                    .unwrap_or(&o.message)
                    .split(", ")
                    .filter(|r| !r.is_empty())
                    .map(str::to_owned)
                    .collect(),
            },
            Ok(v1::OutcomeAction::Restored) => OutcomeAction::Restored,
            Ok(v1::OutcomeAction::NotRestored) => OutcomeAction::NotRestored { reason: o.message },
            _ => return Err(invalid_field(&format!("{at}.action"), "unknown outcome action")),
        };
        outcomes.push(Outcome {
            resource: ref_target(o.resource, &format!("{at}.resource"))?,
            action,
            time: time_from(o.time_ms),
        });
    }
    let next = if op.next_outcomes_page_token.is_empty() {
        None
    } else {
        Some(
            cascade_core::ResourceName::parse(&op.next_outcomes_page_token)
                .map_err(|e| invalid_field("next_outcomes_page_token", e))?,
        )
    };
    Ok(OperationPage {
        operation: Operation {
            id: cascade_core::OperationId::parse(&op.id).map_err(|e| invalid_field("id", e))?,
            root: ref_target(op.root, "root")?,
            requested_by: op.requested_by,
            cascade: op.cascade,
            state,
            progress: cascade_core::model::Progress {
                deleted: progress.deleted,
                unset: progress.unset,
                pending: progress.pending,
                blocked: progress.blocked,
                failed: progress.failed,
            },
            create_time: time_from(op.create_time_ms),
            end_time: (op.end_time_ms > 0).then(|| time_from(op.end_time_ms)),
            reached: op.reached_regions.iter().cloned().collect(),
            changes: op.changes,
            closure_confirmed: false,
            controls,
            undelete: undelete_from(&op.undelete_of, &progress, op.undelete_regions_left)?,
            principal: Default::default(),
            retain_ms: op.retention_seconds.saturating_mul(1000),
        },
        outcomes,
        next,
    })
}

/// What makes a part read from the wire an undelete (its `undelete_of`),
/// with its counters; None for a deletion.
fn undelete_from(
    of: &str,
    progress: &v1::Progress,
    regions_left: Vec<String>,
) -> Result<Option<Box<cascade_core::model::Undeletion>>, Status> {
    if of.is_empty() {
        return Ok(None);
    }
    Ok(Some(Box::new(cascade_core::model::Undeletion {
        of: cascade_core::OperationId::parse(of).map_err(|e| invalid_field("undelete_of", e))?,
        restored: progress.restored,
        not_restored: progress.not_restored,
        regions_left: regions_left.into_iter().collect(),
    })))
}

/// A dry run's plan (or a region's part of one) on the wire.
pub fn plan(p: &Plan) -> v1::Plan {
    v1::Plan {
        deleted: p.deleted.iter().map(object_ref).collect(),
        unset: p
            .unset
            .iter()
            .map(|u| v1::PlannedUnset {
                resource: Some(object_ref(&u.resource)),
                field: u.field.clone(),
            })
            .collect(),
        blocked: p
            .blocked
            .iter()
            .map(|b| v1::PlannedBlock {
                resource: Some(object_ref(&b.resource)),
                blocker: blockers(std::slice::from_ref(&b.blocker)).pop(),
            })
            .collect(),
        truncated: p.truncated,
        remote_seeds: p
            .remote_seeds
            .iter()
            .flat_map(|(region, targets)| {
                targets.iter().map(move |t| v1::RemoteSeed {
                    region: region.clone(),
                    target: Some(object_ref(t)),
                })
            })
            .collect(),
        unreachable_regions: Vec::new(),
        denied: p.denied.iter().map(denied_member).collect(),
        denied_more: p.denied_more,
        // A merged plan's token and size are the node's to add (a
        // region's part has neither).
        token: String::new(),
        token_missing: String::new(),
        members: 0,
    }
}

/// The wire form of a member the closure check refused.
pub fn denied_member(d: &cascade_core::protocol::PlannedDenial) -> v1::DeniedMember {
    v1::DeniedMember {
        region: d.resource.region().to_owned(),
        name: d.resource.to_string(),
        verb: d.verb.as_str().to_owned(),
        rule: d.rule.clone(),
    }
}

/// A wire object reference with both parts, as peers exchange them.
pub fn ref_target(r: Option<v1::ObjectRef>, field: &str) -> Result<RefTarget, Status> {
    ref_target_at(r, &|| field.to_owned())
}

/// [`ref_target`] with its path built only for a refusal.
fn ref_target_at(r: Option<v1::ObjectRef>, field: &dyn Fn() -> String) -> Result<RefTarget, Status> {
    let r = r.ok_or_else(|| invalid_field(&field(), "is required"))?;
    let name =
        cascade_core::ResourceName::parse(&r.name).map_err(|e| invalid_field(&format!("{}.name", field()), e))?;
    let uid = Uid::parse(&r.uid).map_err(|e| invalid_field(&format!("{}.uid", field()), e))?;
    Ok(RefTarget { name, uid })
}

/// Decodes a back-reference of a Peer request; `field` prefixes the path
/// named in an INVALID_ARGUMENT refusal.
pub fn peer_backref_from(b: v1::PeerBackRef, field: &str) -> Result<cascade_core::peer::PeerBackRef, Status> {
    peer_backref_at(b, &|| field.to_owned())
}

/// [`peer_backref_from`] with the prefix built only for a refusal.
pub fn peer_backref_at(
    b: v1::PeerBackRef,
    field: &dyn Fn() -> String,
) -> Result<cascade_core::peer::PeerBackRef, Status> {
    Ok(cascade_core::peer::PeerBackRef {
        // The paths are built only for a refusal: an Attach of a thousand
        // rows built two per row (docs/BENCHMARKS.md, "P5 (2026-11-27)").
        target: ref_target_at(b.target, &|| format!("{}.target", field()))?,
        referrer: ref_target_at(b.referrer, &|| format!("{}.referrer", field()))?,
        field: b.field,
        generation: b.generation,
    })
}

/// A back-reference as an importer sends it in Attach or Release (the owner
/// knows `on_delete` from its own schema, so it is left empty).
pub fn peer_backref(b: &cascade_core::peer::PeerBackRef) -> v1::PeerBackRef {
    v1::PeerBackRef {
        target: Some(object_ref(&b.target)),
        referrer: Some(object_ref(&b.referrer)),
        field: b.field.clone(),
        generation: b.generation,
        on_delete: String::new(),
    }
}

/// A stored back-reference row, for dumps.
pub fn backref_row(b: &cascade_core::model::BackRef) -> v1::PeerBackRef {
    v1::PeerBackRef {
        target: Some(object_ref(&b.target)),
        referrer: Some(object_ref(&b.referrer)),
        field: b.field.clone(),
        generation: b.generation,
        on_delete: b.on_delete.to_string(),
    }
}

/// An event type from the wire; None for UNSPECIFIED or a value this build
/// does not know (a newer peer's), which the caller skips.
pub fn event_type_from(t: i32) -> Option<EventType> {
    Some(match v1::EventType::try_from(t).ok()? {
        v1::EventType::Unspecified => return None,
        v1::EventType::Created => EventType::Created,
        v1::EventType::Updated => EventType::Updated,
        v1::EventType::Deleting => EventType::Deleting,
        v1::EventType::Purged => EventType::Purged,
        v1::EventType::DeletionBlocked => EventType::DeletionBlocked,
        v1::EventType::DeletionFailed => EventType::DeletionFailed,
        v1::EventType::FinalizerRetry => EventType::FinalizerRetry,
        v1::EventType::DeletionForced => EventType::DeletionForced,
        v1::EventType::SoftDeleted => EventType::SoftDeleted,
        v1::EventType::Undeleted => EventType::Undeleted,
    })
}

/// A plan from the wire (a peer's part), back into the core's terms.
pub fn plan_from(p: v1::Plan) -> Result<Plan, Status> {
    let mut out = Plan {
        truncated: p.truncated,
        ..Plan::default()
    };
    for d in p.deleted {
        out.deleted.push(ref_target(Some(d), "deleted")?);
    }
    for u in p.unset {
        out.unset.push(cascade_core::protocol::PlannedUnset {
            resource: ref_target(u.resource, "unset.resource")?,
            field: u.field,
        });
    }
    for b in p.blocked {
        let blocker = b.blocker.unwrap_or_default();
        out.blocked.push(cascade_core::protocol::PlannedBlock {
            resource: ref_target(b.resource, "blocked.resource")?,
            blocker: Blocker {
                referrer: cascade_core::ResourceName::parse(&blocker.referrer)
                    .map_err(|e| invalid_field("blocked.blocker", e))?,
                field: blocker.field,
                referrer_deleting: blocker.referrer_deleting,
            },
        });
    }
    for seed in p.remote_seeds {
        let target = ref_target(seed.target, "remote_seeds.target")?;
        out.remote_seeds.entry(seed.region).or_default().push(target);
    }
    for d in p.denied {
        out.denied.push(cascade_core::protocol::PlannedDenial {
            resource: cascade_core::ResourceName::parse(&d.name).map_err(|e| invalid_field("denied.name", e))?,
            verb: cascade_core::auth::Verb::parse(&d.verb).ok_or_else(|| {
                invalid_field(
                    "denied.verb",
                    format!("unknown verb {}", cascade_core::limits::quote(&d.verb)),
                )
            })?,
            rule: d.rule,
        });
    }
    out.denied_more = p.denied_more;
    Ok(out)
}

/// The wire form of an event type.
pub fn event_type(t: EventType) -> v1::EventType {
    match t {
        EventType::Created => v1::EventType::Created,
        EventType::Updated => v1::EventType::Updated,
        EventType::Deleting => v1::EventType::Deleting,
        EventType::Purged => v1::EventType::Purged,
        EventType::DeletionBlocked => v1::EventType::DeletionBlocked,
        EventType::DeletionFailed => v1::EventType::DeletionFailed,
        EventType::FinalizerRetry => v1::EventType::FinalizerRetry,
        EventType::DeletionForced => v1::EventType::DeletionForced,
        EventType::SoftDeleted => v1::EventType::SoftDeleted,
        EventType::Undeleted => v1::EventType::Undeleted,
    }
}

/// An outbox event as Watch and Peer.Watch send it (the snapshot without
/// deletion record or dangling marks).
pub fn event(e: &Event) -> v1::WatchEvent {
    v1::WatchEvent {
        revision: e.revision,
        r#type: event_type(e.event_type) as i32,
        resource: Some(object_ref(&e.resource)),
        snapshot: e.snapshot.as_ref().map(|r| resource(r, None, &BTreeSet::new())),
        operation_id: e.operation.map(|o| o.to_string()).unwrap_or_default(),
        message: e.message.clone(),
        time_ms: ms(e.time),
    }
}

/// The `on_delete` a dump's row carries (`OnDelete::as_str`).
fn on_delete_from(value: &str, field: &str) -> Result<OnDelete, Status> {
    [
        OnDelete::Cascade,
        OnDelete::Unset,
        OnDelete::Block,
        OnDelete::AllowDangling,
    ]
    .into_iter()
    .find(|o| o.as_str() == value)
    .ok_or_else(|| {
        invalid_field(
            field,
            format!("unknown on_delete {}", cascade_core::limits::quote(value)),
        )
    })
}

fn timestamp_from(ms: i64) -> cascade_core::Timestamp {
    cascade_core::Timestamp(u64::try_from(ms).unwrap_or(0))
}

/// A deletion as [`resource`] presents it, back into the record (a
/// WAITING one without the regions it waits on: the wire does not carry
/// them).
fn deletion_record_from(target: RefTarget, d: &v1::Deletion, field: &str) -> Result<DeletionRecord, Status> {
    let reason = if d.reason == "requested" {
        DeletionReason::Requested
    } else {
        let cascade = d
            .reason
            .strip_prefix("cascade from ")
            .and_then(|rest| rest.strip_suffix(')'))
            .and_then(|rest| rest.split_once(" (field "));
        let (from, via) = cascade.ok_or_else(|| invalid_field(&format!("{field}.reason"), "not a deletion reason"))?;
        DeletionReason::Cascade {
            from: ResourceName::parse(from).map_err(|e| invalid_field(&format!("{field}.reason"), e))?,
            field: via.to_owned(),
        }
    };
    let status = match v1::DeletionStatus::try_from(d.status) {
        Ok(v1::DeletionStatus::Pending) => DeletionStatus::Pending,
        Ok(v1::DeletionStatus::Blocked) => DeletionStatus::Blocked {
            blockers: d
                .blockers
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    Ok(Blocker {
                        referrer: ResourceName::parse(&b.referrer)
                            .map_err(|e| invalid_field(&format!("{field}.blockers[{i}].referrer"), e))?,
                        field: b.field.clone(),
                        referrer_deleting: b.referrer_deleting,
                    })
                })
                .collect::<Result<_, Status>>()?,
            reason: d.message.clone(),
        },
        Ok(v1::DeletionStatus::Failed) => DeletionStatus::Failed {
            error: d.message.clone(),
        },
        Ok(v1::DeletionStatus::Waiting) => DeletionStatus::Waiting {
            regions: Vec::new(),
            reason: d.message.clone(),
        },
        Ok(v1::DeletionStatus::Unspecified) | Err(_) => {
            return Err(invalid_field(&format!("{field}.status"), "not a deletion status"))
        }
    };
    Ok(DeletionRecord {
        target,
        deleted_at: timestamp_from(d.deleted_at_ms),
        reason,
        requested_by: d.requested_by.clone(),
        operation: OperationId::parse(&d.operation_id)
            .map_err(|e| invalid_field(&format!("{field}.operation_id"), e))?,
        status,
        finalizer_failures: d
            .finalizer_failures
            .iter()
            .map(|f| FinalizerFailure {
                finalizer: f.finalizer.clone(),
                failures: f.failures,
                last_reason: f.last_reason.clone(),
                last_time: timestamp_from(f.last_time_ms),
                retry_at: (f.next_attempt_ms > 0).then(|| timestamp_from(f.next_attempt_ms)),
            })
            .collect(),
        forced: d.forced.as_ref().map(|f| ForcedPurge {
            by: f.by.clone(),
            reason: f.reason.clone(),
            time: timestamp_from(f.time_ms),
        }),
        principal: Default::default(),
    })
}

/// A resource from the wire (as `Get`, `Dump` or `ExplainPart` send it),
/// with its deletion record when it has one and the back-reference keys of
/// the references it marks dangling. `at` names it in errors.
pub fn resource_from(
    r: &v1::Resource,
    at: &str,
) -> Result<(Resource, Option<DeletionRecord>, Vec<BackRefKey>), Status> {
    let name = ResourceName::parse(&r.name).map_err(|e| invalid_field(&format!("{at}.name"), e))?;
    let uid = Uid::parse(&r.uid).map_err(|e| invalid_field(&format!("{at}.uid"), e))?;
    let state = v1::ResourceState::try_from(r.state)
        .ok()
        .and_then(resource_state_from)
        .ok_or_else(|| invalid_field(&format!("{at}.state"), "not a resource state"))?;
    let mut marks = Vec::new();
    let mut refs = BTreeMap::new();
    for (j, f) in r.refs.iter().enumerate() {
        let mut targets = Vec::with_capacity(f.targets.len());
        for (k, t) in f.targets.iter().enumerate() {
            let target = ref_target(Some(t.clone()), &format!("{at}.refs[{j}].targets[{k}]"))?;
            if t.dangling {
                marks.push(BackRefKey {
                    target: target.uid,
                    referrer: uid,
                    field: f.field.clone(),
                });
            }
            targets.push(target);
        }
        refs.insert(f.field.clone(), targets);
    }
    let record = match &r.deletion {
        Some(del) => {
            let target = RefTarget {
                name: name.clone(),
                uid,
            };
            Some(deletion_record_from(target, del, &format!("{at}.deletion"))?)
        }
        None => None,
    };
    let resource = Resource {
        name,
        uid,
        state,
        attributes: r.attributes.clone().into_iter().collect(),
        refs,
        revision: r.revision,
        create_time: timestamp_from(r.create_time_ms),
        update_time: timestamp_from(r.update_time_ms),
        finalizers: r.finalizers.clone(),
        liens: r
            .liens
            .iter()
            .map(|l| cascade_core::model::Lien {
                id: l.id.clone(),
                reason: l.reason.clone(),
                origin: l.origin.clone(),
                create_time: timestamp_from(l.create_time_ms),
            })
            .collect(),
        soft_deleted: match (state, OperationId::parse(&r.deleted_by_operation)) {
            (ResourceState::Deleted, Ok(operation)) => Some(cascade_core::model::SoftDeletion {
                delete_time: timestamp_from(r.delete_time_ms),
                expire_time: timestamp_from(r.expire_time_ms),
                operation,
            }),
            _ => None,
        },
    };
    Ok((resource, record, marks))
}

/// A region's `Peer.Dump` as the invariant checker's view: the references
/// the node marks `dangling` become the view's read marks, the queues are
/// counts, rows carry no attach time (0), and there is no store part (see
/// `cascade_core::invariants`). A malformed dump (a name, uid or record
/// that does not parse, a resource or row listed twice) is refused, naming
/// the field.
pub fn region_view(d: &v1::DumpResponse) -> Result<RegionView<'static>, Status> {
    let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let mut view = RegionView {
        region: RegionId::parse(&d.region).map_err(|e| invalid_field("region", e))?,
        resources: Cow::Owned(BTreeMap::new()),
        backrefs: Cow::Owned(BTreeMap::new()),
        deletions: Cow::Owned(BTreeMap::new()),
        remote_deletions: Vec::new(),
        pending_releases: count(d.pending_releases),
        pending_attach: count(d.pending_attach),
        queued_work: count(d.queued_work),
        dangling: Some(BTreeSet::new()),
        store: None,
    };
    let mut marks = BTreeSet::new();
    for (i, r) in d.resources.iter().enumerate() {
        let at = format!("resources[{i}]");
        let (resource, record, dangling) = resource_from(r, &at)?;
        marks.extend(dangling);
        if let Some(record) = record {
            view.deletions.to_mut().insert(resource.uid, record);
        }
        let name = resource.name.clone();
        if view.resources.to_mut().insert(name, resource).is_some() {
            return Err(invalid_field(
                &format!("{at}.name"),
                format!("{} is listed twice", r.name),
            ));
        }
    }
    for (i, b) in d.backrefs.iter().enumerate() {
        let at = format!("backrefs[{i}]");
        let row = BackRef {
            target: ref_target(b.target.clone(), &format!("{at}.target"))?,
            referrer: ref_target(b.referrer.clone(), &format!("{at}.referrer"))?,
            field: b.field.clone(),
            on_delete: on_delete_from(&b.on_delete, &format!("{at}.on_delete"))?,
            generation: b.generation,
            attached_at: cascade_core::Timestamp(0),
        };
        if view.backrefs.to_mut().insert(row.key(), row).is_some() {
            return Err(invalid_field(
                &at,
                "a second row for the same (target, referrer, field)",
            ));
        }
    }
    for (i, t) in d.remote_deletions.iter().enumerate() {
        view.remote_deletions
            .push(ref_target(Some(t.clone()), &format!("remote_deletions[{i}]"))?);
    }
    view.dangling = Some(marks);
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid(n: u128) -> Uid {
        Uid(uuid::Uuid::from_u128(n))
    }

    fn target(name: &str, n: u128) -> RefTarget {
        RefTarget {
            name: ResourceName::parse(name).unwrap(),
            uid: uid(n),
        }
    }

    /// A dump made of the node's own presentations reads back as the
    /// records it was made of (less what the wire does not carry).
    #[test]
    fn region_view_reads_back_what_a_dump_presents() {
        let net = target("ra/network/n", 1);
        let port = target("ra/port/p", 2);
        let qos = target("rc/qos_policy/q", 3);
        let record_of = |t: &RefTarget, state, refs: Vec<(&str, RefTarget)>| Resource {
            name: t.name.clone(),
            uid: t.uid,
            state,
            attributes: [("k".to_string(), "v".to_string())].into(),
            refs: refs.into_iter().map(|(f, t)| (f.to_owned(), vec![t])).collect(),
            revision: 7,
            create_time: cascade_core::Timestamp(10),
            update_time: cascade_core::Timestamp(11),
            finalizers: vec!["f".into()],
            liens: vec![cascade_core::model::Lien {
                id: "legal-hold".into(),
                reason: "audit 2026".into(),
                origin: "alice".into(),
                create_time: cascade_core::Timestamp(9),
            }],
            soft_deleted: None,
        };
        let net_r = record_of(&net, ResourceState::Deleting, vec![]);
        let port_r = record_of(
            &port,
            ResourceState::Active,
            vec![("network", net.clone()), ("qos_policy", qos.clone())],
        );
        let record = DeletionRecord {
            target: net.clone(),
            deleted_at: cascade_core::Timestamp(12),
            reason: DeletionReason::Cascade {
                from: ResourceName::parse("ra/project/x").unwrap(),
                field: "project".into(),
            },
            requested_by: "someone".into(),
            operation: OperationId(uuid::Uuid::from_u128(9)),
            status: DeletionStatus::Blocked {
                blockers: vec![Blocker {
                    referrer: port.name.clone(),
                    field: "network".into(),
                    referrer_deleting: false,
                }],
                reason: "blocked by ra/port/p".into(),
            },
            finalizer_failures: Vec::new(),
            forced: None,
            principal: Default::default(),
        };
        let row = BackRef {
            target: net.clone(),
            referrer: port.clone(),
            field: "network".into(),
            on_delete: OnDelete::Block,
            generation: 4,
            attached_at: cascade_core::Timestamp(0),
        };
        let dump = v1::DumpResponse {
            region: "ra".into(),
            resources: vec![
                resource(&net_r, Some(&record), &BTreeSet::new()),
                resource(&port_r, None, &[qos.uid].into()),
            ],
            backrefs: vec![backref_row(&row)],
            pending_releases: 1,
            queued_work: 2,
            pending_attach: 3,
            remote_deletions: vec![object_ref(&qos)],
            ..Default::default()
        };
        let view = region_view(&dump).unwrap();
        assert_eq!(view.region.as_str(), "ra");
        assert_eq!(view.resources[&net.name], net_r);
        assert_eq!(view.resources[&port.name], port_r);
        assert_eq!(view.deletions[&net.uid], record);
        assert_eq!(view.backrefs[&row.key()], row);
        assert_eq!(view.remote_deletions, vec![qos.clone()]);
        assert_eq!(
            (view.pending_releases, view.queued_work, view.pending_attach),
            (1, 2, 3)
        );
        let mark = BackRefKey {
            target: qos.uid,
            referrer: port.uid,
            field: "qos_policy".into(),
        };
        assert_eq!(view.dangling, Some([mark].into()));
        assert!(view.store.is_none());
    }
}
