//! Filtered purge (issue 29, item 4; AIP-165's `purge_count`,
//! `purge_sample`, `force`): every ACTIVE resource of a region that a
//! filter matches enters deletion with cascade, as one operation.
//!
//! What the core decides: which resources a filter matches
//! ([`PurgeFilter::matches`]), how a region's scan is counted and sampled
//! ([`PurgeTally`], [`merge_samples`]), and one region's part of a forced
//! purge ([`start_purge`]): in one step, its matched members enter DELETING
//! (each re-checked against the filter and its uid, so a resource changed
//! or re-created since the scan is left alone) under one operation whose
//! root is synthetic ([`purge_root`]: `{region}/purge/{operation id}`, with
//! the operation's id as its uid, so it names no resource and no resource
//! can be it). Nothing is the root of such an operation, so no member waits
//! for the others: each finishes as a cascade member does, and the
//! operation is finished when every region's part is. The node scans,
//! bounds, fans out and asks each other region to start its part with the
//! same operation id (`Peer.PurgePart`).
//!
//! A member's cascade follows the schema as any cascade does (`block`
//! referrers hold it, `unset` ones lose the reference, `cascade` ones are
//! deleted too). A resource under a lien is not matched: a lien protects
//! it from a purge as it does from a Delete (a cascade from a matched
//! member still reaches it and waits, BLOCKED, as every cascade does).

use std::collections::BTreeSet;

use crate::auth::Principal;
use crate::error::CoreError;
use crate::limits::{
    cut_stored, quote, MAX_AUDIT_ACTION_BYTES, MAX_AUDIT_OUTCOME_BYTES, MAX_AUDIT_TARGET_BYTES, MAX_AUDIT_WHO_BYTES,
    MAX_NAME_PREFIX_BYTES, MAX_REQUESTED_BY_BYTES,
};
use crate::model::{
    AuditEntry, DeletionReason, Operation, OperationState, Progress, RefTarget, Resource, ResourceState, Timestamp,
};
use crate::name::{validate_kind, IdSource, OperationId, RegionId, ResourceName, Uid};
use crate::selector::Selector;
use crate::state::{StateRead, Tx};

use super::admin::{AdminRequest, MAX_ADMIN_REASON};
use super::bookkeeping::{after_pending_changed, enter_deleting};
use super::{Ctx, Step};

/// Names a purge answers with at most (`purge_sample`), the first by name.
pub const PURGE_SAMPLE: usize = 10;

/// The kind in the name of a purge operation's synthetic root.
pub const PURGE_ROOT_KIND: &str = "purge";

/// Which resources a purge takes: every condition set must hold. At least
/// one of `kind`, `name_prefix` and `selector` is set ([`PurgeFilter::new`]
/// refuses an empty filter: a purge of everything must be spelled out).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PurgeFilter {
    /// One kind (None: every kind).
    pub kind: Option<String>,
    /// A prefix of the id (the part after `{region}/{kind}/`), as a
    /// listing's `name_prefix`.
    pub name_prefix: String,
    /// The attribute selector, parsed.
    pub selector: Selector,
    /// The selector as the caller wrote it (for the operation and the log).
    pub selector_text: String,
    /// Only resources created at least this long before the step (0: any age).
    pub older_than_ms: u64,
}

impl PurgeFilter {
    /// The filter a request spells, checked: a kind by the name rules, a
    /// prefix within the listing's limit, a selector that parses, and at
    /// least one of the three (INVALID_ARGUMENT on `kind` otherwise).
    /// Whether the kind is in the schema is the caller's check (the node's
    /// `known_kind`).
    pub fn new(kind: &str, name_prefix: &str, selector: &str, older_than_ms: u64) -> Result<Self, CoreError> {
        if kind.is_empty() && name_prefix.is_empty() && selector.trim().is_empty() {
            return Err(CoreError::invalid(
                "kind",
                "a purge needs a kind, a name_prefix or an attribute_selector (an empty filter would match \
                 every resource: name what to purge)",
            ));
        }
        let kind = if kind.is_empty() {
            None
        } else {
            validate_kind(kind).map_err(|e| CoreError::invalid("kind", e.to_string()))?;
            Some(kind.to_owned())
        };
        if name_prefix.len() > MAX_NAME_PREFIX_BYTES {
            return Err(CoreError::invalid(
                "name_prefix",
                format!("{} is longer than {MAX_NAME_PREFIX_BYTES} bytes", quote(name_prefix)),
            ));
        }
        let parsed = Selector::parse(selector).map_err(|e| CoreError::invalid("attribute_selector", e.to_string()))?;
        Ok(PurgeFilter {
            kind,
            name_prefix: name_prefix.to_owned(),
            selector: parsed,
            selector_text: selector.trim().to_owned(),
            older_than_ms,
        })
    }

    /// Whether the purge takes `r` at `now`: ACTIVE (a CREATING resource
    /// is not settled, a DELETING one is on its way already), no lien,
    /// and every condition of the filter.
    pub fn matches(&self, r: &Resource, now: Timestamp) -> bool {
        r.state == ResourceState::Active
            && r.liens.is_empty()
            && self.kind.as_deref().is_none_or(|k| r.name.kind() == k)
            && r.name.id().starts_with(&self.name_prefix)
            && now.0.saturating_sub(r.create_time.0) >= self.older_than_ms
            && self.selector.matches(&r.attributes)
    }

    /// The filter as people read it: `kind=port prefix=web- selector="env=dev"
    /// older_than=7d` (only what is set). Every part is quoted by its
    /// limit, so the text stays short whatever the request held.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(kind) = &self.kind {
            parts.push(format!("kind={kind}"));
        }
        if !self.name_prefix.is_empty() {
            parts.push(format!("prefix={}", self.name_prefix));
        }
        if !self.selector_text.is_empty() {
            parts.push(format!("selector={:?}", cut_stored(&self.selector_text, 128)));
        }
        if self.older_than_ms > 0 {
            parts.push(format!("older_than={}", exact_duration(self.older_than_ms)));
        }
        parts.join(" ")
    }
}

/// A duration in its largest whole unit (`7d`, `36h`, `90s`, `1500ms`):
/// exact, unlike the two-unit reading of `time_text::duration`, since it
/// names what a filter took.
fn exact_duration(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(86_400_000, "d"), (3_600_000, "h"), (60_000, "m"), (1_000, "s")];
    UNITS
        .iter()
        .find(|(size, _)| ms.is_multiple_of(*size))
        .map_or_else(|| format!("{ms}ms"), |(size, unit)| format!("{}{unit}", ms / size))
}

/// The synthetic root of purge operation `id` started in `region`:
/// `{region}/purge/{id}`, uid the operation's id.
pub fn purge_root(region: &RegionId, id: OperationId) -> Result<RefTarget, CoreError> {
    Ok(RefTarget {
        name: ResourceName::parse(&format!("{region}/{PURGE_ROOT_KIND}/{id}"))?,
        uid: Uid(id.0),
    })
}

impl Operation {
    /// Whether this is a purge's operation: its root is the synthetic one
    /// of [`purge_root`] (the operation's own id as the root's uid, which
    /// no resource has), so no resource is its root and none waits for
    /// the rest of it.
    pub fn is_purge(&self) -> bool {
        self.root.uid.0 == self.id.0 && self.root.name.kind() == PURGE_ROOT_KIND
    }
}

/// One region's scan for a purge, fed its resources in name order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PurgeTally {
    /// Resources the filter matched.
    pub count: u64,
    /// The first [`PURGE_SAMPLE`] matched, by name.
    pub sample: Vec<ResourceName>,
    /// Every matched resource, up to `keep` of them (what a forced purge starts).
    pub members: Vec<RefTarget>,
    /// The scan stopped at its limit: `count` is a lower bound.
    pub count_is_lower_bound: bool,
    keep: usize,
}

impl PurgeTally {
    /// A tally that keeps up to `keep` members (0: count only).
    pub fn keeping(keep: usize) -> Self {
        PurgeTally {
            keep,
            ..PurgeTally::default()
        }
    }

    /// Counts `r` if the filter matches it at `now`.
    pub fn examine(&mut self, filter: &PurgeFilter, r: &Resource, now: Timestamp) {
        if !filter.matches(r, now) {
            return;
        }
        self.count += 1;
        if self.sample.len() < PURGE_SAMPLE {
            self.sample.push(r.name.clone());
        }
        if self.members.len() < self.keep {
            self.members.push(RefTarget {
                name: r.name.clone(),
                uid: r.uid,
            });
        }
    }
}

/// The sample of several regions' answers: the first [`PURGE_SAMPLE`]
/// names of them all, by name (each region's sample is its own first
/// names, so this is the first of the whole cluster's matches).
pub fn merge_samples<'a>(samples: impl IntoIterator<Item = &'a [String]>) -> Vec<String> {
    let mut all: Vec<String> = samples.into_iter().flatten().cloned().collect();
    all.sort();
    all.dedup();
    all.truncate(PURGE_SAMPLE);
    all
}

/// One region's part of a forced purge.
#[derive(Debug, Clone)]
pub struct StartPurge {
    /// The operation: None in the region that received the purge (the id
    /// is minted here), the receiving region's id in every other part.
    pub operation: Option<OperationId>,
    /// The region that received the purge: its synthetic root's region.
    pub root_region: RegionId,
    /// What the members must still match.
    pub filter: PurgeFilter,
    /// The members the scan found (this region's; others are ignored).
    pub members: Vec<RefTarget>,
    /// The other regions whose parts the receiving region starts next: the
    /// operation is not finished while one of them cannot be read.
    pub reached: BTreeSet<String>,
    /// Who asked, as the operation and every deletion record keep it.
    pub requested_by: String,
    /// Whom the deletions act for (each member's cascade is authorized for it).
    pub principal: Principal,
    /// The audit entry of the call (its outcome is this step's).
    pub audit: AdminRequest,
}

/// What a region's part of a purge started.
#[derive(Debug, Clone, PartialEq)]
pub struct PurgeStarted {
    /// The part's operation record as the step left it.
    pub operation: Operation,
    /// The members that entered DELETING, by name.
    pub started: Vec<ResourceName>,
    /// Members of the scan left alone: gone, re-created, changed so that
    /// they no longer match, already deleting, or another region's.
    pub skipped: usize,
    /// The part had been started before (a retried call): nothing changed.
    pub already_started: bool,
}

/// Starts this region's part of a purge, in one step: the operation part
/// (SUCCEEDED at once when no member is left to start), every member that
/// still matches entering DELETING with cascade as if a Delete had named
/// it, and the call's audit entry. Idempotent by operation id: a part
/// already started is answered as it stands. A part that a cascade from
/// another region's member of the same purge made here first (its root
/// that member) is this purge's part: it takes the synthetic root and its
/// members start in it. An operation of this region that is not a purge's
/// is refused.
pub fn start_purge<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    ids: &mut dyn IdSource,
    req: StartPurge,
) -> Result<Step<PurgeStarted>, CoreError> {
    let mut tx = Tx::new(state);
    let id = req.operation.unwrap_or_else(|| OperationId(ids.next_uuid()));
    let requested_by = cut_stored(&req.requested_by, MAX_REQUESTED_BY_BYTES);
    let mut reached = req.reached;
    reached.remove(ctx.region.as_str());
    let root = purge_root(&req.root_region, id)?;
    match tx.operation(id)? {
        Some(existing) if existing.is_purge() => {
            return Ok(Step {
                value: PurgeStarted {
                    operation: existing,
                    started: Vec::new(),
                    skipped: 0,
                    already_started: true,
                },
                writes: Default::default(),
            });
        }
        // Another region's member cascaded here before this part was
        // asked for (its part started first): the part the cascade made
        // is this purge's, and takes its root.
        Some(mut existing) if existing.root.name.region() != ctx.region.as_str() => {
            existing.root = root;
            existing.requested_by = requested_by.clone();
            existing.reached.extend(reached);
            existing.changes += 1;
            tx.put_operation(existing);
        }
        Some(existing) => {
            return Err(CoreError::invalid(
                "operation_id",
                format!("operation {id} is not a purge's (its root is {})", existing.root.name),
            ));
        }
        None => tx.put_operation(Operation {
            id,
            root,
            requested_by: requested_by.clone(),
            cascade: true,
            state: OperationState::Running,
            progress: Progress::default(),
            create_time: ctx.now,
            end_time: None,
            reached,
            changes: 0,
            closure_confirmed: false,
            principal: req.principal.clone(),
            // A purge asks for no retention of its own: each member keeps
            // what its kind's `retain` says.
            retain_ms: 0,
            // Nor a budget: its members are counted and capped before it
            // starts (`[limits] max_purge_members`).
            controls: None,
            undelete: None,
        }),
    }
    let mut started = Vec::new();
    let mut skipped = 0;
    let mut seen = BTreeSet::new();
    for member in req.members {
        if member.name.region() != ctx.region.as_str() || !seen.insert(member.name.clone()) {
            skipped += 1;
            continue;
        }
        let found = tx
            .resource(&member.name)?
            .filter(|r| r.uid == member.uid && req.filter.matches(r, ctx.now));
        let Some(resource) = found else {
            skipped += 1;
            continue;
        };
        started.push(resource.name.clone());
        enter_deleting(
            &mut tx,
            ctx,
            resource,
            DeletionReason::Requested,
            id,
            &requested_by,
            &req.principal,
        )?;
    }
    // Nothing started (and nothing pending from a cascade that reached
    // here first): the part is finished at once.
    after_pending_changed(&mut tx, ctx, id)?;
    let outcome = format!("ok: {} started in operation {id}", started.len());
    tx.put_audit(AuditEntry {
        id: Uid(ids.next_uuid()),
        time: ctx.now,
        who: cut_stored(&req.audit.who, MAX_AUDIT_WHO_BYTES),
        action: cut_stored(&req.audit.action, MAX_AUDIT_ACTION_BYTES),
        target: cut_stored(&req.audit.target, MAX_AUDIT_TARGET_BYTES),
        reason: cut_stored(&req.audit.reason, MAX_ADMIN_REASON),
        outcome: cut_stored(&outcome, MAX_AUDIT_OUTCOME_BYTES),
        ..AuditEntry::default()
    });
    let operation = tx
        .operation(id)?
        .ok_or_else(|| CoreError::OperationNotFound(id.to_string()))?;
    Ok(Step {
        value: PurgeStarted {
            operation,
            started,
            skipped,
            already_started: false,
        },
        writes: tx.finish(),
    })
}

#[cfg(test)]
mod tests;
