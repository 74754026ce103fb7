//! The owner's half of the cross-region protocol: the back-reference rows
//! other regions attach and release, and the rows its periodic check asks
//! an importer about (seed 002). See the parent module for why nothing
//! dangles or resurrects.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::CoreError;
use crate::limits::quote;
use crate::model::{BackRef, RefTarget, ResourceState, Timestamp};
use crate::protocol::{self, Ctx, Step};
use crate::state::{StateRead, Tx};
use crate::{OnDelete, RegionId, Schema, Uid};

use super::PeerBackRef;

/// Owner side of seed 002's periodic check: of `rows` (a page of this
/// region's back-reference table), the ones to ask region `peer` about:
/// owner rows (the target is in `local`) whose referrer lives in `peer`,
/// attached at or before `cutoff` (a younger row's referrer may still be
/// committing). Asked with generation `u64::MAX`, so a row found no longer
/// standing is released whatever generation it was attached with.
pub fn rows_to_check(
    rows: impl IntoIterator<Item = BackRef>,
    local: &str,
    peer: &str,
    cutoff: Timestamp,
) -> Vec<PeerBackRef> {
    rows.into_iter()
        .filter(|row| {
            row.referrer.name.region() == peer && row.target.name.region() == local && row.attached_at <= cutoff
        })
        .map(|row| PeerBackRef {
            generation: u64::MAX,
            ..PeerBackRef::from(row)
        })
        .collect()
}

/// Owner: records back-references from `from_region`, all or none. Each
/// target must be local, ACTIVE, and the incarnation named; the reference
/// must exist in the schema (its `on_delete` is the owner's schema's).
pub fn attach<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    from_region: &str,
    entries: Vec<PeerBackRef>,
) -> Result<Step<usize>, CoreError> {
    let mut tx = Tx::new(state);
    let n = entries.len();
    // Targets already found live in this step. An attach names the same
    // target for every referrer of a batch (P5: a thousand ports on one
    // network), and this step writes no resource: one read and decode of
    // each target per step, not one per row.
    let mut live: BTreeSet<RefTarget> = BTreeSet::new();
    for (i, e) in entries.into_iter().enumerate() {
        // Spelled out only for a refusal (one allocation per row otherwise).
        let at = |field: &str| format!("backrefs[{i}].{field}");
        if e.referrer.name.region() != from_region {
            return Err(CoreError::invalid(
                at("referrer"),
                format!("{} is not in region {from_region}", e.referrer.name),
            ));
        }
        if e.target.name.region() != ctx.region.as_str() {
            return Err(CoreError::WrongRegion {
                name: e.target.name.clone(),
                region: e.target.name.region().to_owned(),
                local: ctx.region.to_string(),
            });
        }
        // The referrer's region validated this reference against its
        // schema: a kind or field this region lacks means the two run
        // different schemas (a rolling change), which a reload here
        // settles; anything else is a malformed request.
        let referrer_kind = e.referrer.name.kind();
        known_kind(ctx.schema, ctx.region, referrer_kind)?;
        if ctx.schema.reference(referrer_kind, &e.field).is_none() {
            return Err(schema_unknown(
                ctx.region,
                format!("reference field {}", quote(&format!("{referrer_kind}.{}", e.field))),
            ));
        }
        known_kind(ctx.schema, ctx.region, e.target.name.kind())?;
        let spec = ctx
            .schema
            .reference(referrer_kind, &e.field)
            .filter(|s| s.kind == e.target.name.kind() && s.on_delete.tracked())
            .ok_or_else(|| {
                CoreError::invalid(
                    at("field"),
                    format!(
                        "kind {:?} has no tracked reference {:?} to a {}",
                        e.referrer.name.kind(),
                        e.field,
                        e.target.name.kind()
                    ),
                )
            })?;
        if !live.contains(&e.target) {
            check_live_target(&tx, &e)?;
            live.insert(e.target.clone());
        }
        let key = e.key();
        let existing = tx.backref(&key)?;
        let generation = existing.map_or(e.generation, |b| b.generation.max(e.generation));
        tx.put_backref(BackRef {
            target: e.target,
            referrer: e.referrer,
            field: e.field,
            on_delete: spec.on_delete,
            generation,
            attached_at: ctx.now,
        });
    }
    Ok(Step {
        value: n,
        writes: tx.finish(),
    })
}

/// Owner: `kind` (of a name a peer looks up or attaches) is one of this
/// region's schema; otherwise the peer runs a schema this region does not
/// have yet (a rolling change), and the refusal says so rather than "not
/// found" or "malformed": no resource of it can be here, and a reload here
/// settles it.
pub fn known_kind(schema: &Schema, region: &RegionId, kind: &str) -> Result<(), CoreError> {
    match schema.kind(kind) {
        Some(_) => Ok(()),
        None => Err(schema_unknown(region, format!("kind {}", quote(kind)))),
    }
}

/// This region's schema lacks `what` (its version is the node's to add).
fn schema_unknown(region: &RegionId, what: String) -> CoreError {
    CoreError::SchemaUnknown {
        region: region.to_string(),
        what,
        version: String::new(),
    }
}

/// The attach's target must be this region's ACTIVE resource of the
/// incarnation named; otherwise the refusal a local target would give.
fn check_live_target<S: StateRead + ?Sized>(tx: &Tx<'_, S>, e: &PeerBackRef) -> Result<(), CoreError> {
    let field = format!("refs.{}", e.field);
    let target = e.target.name.clone();
    match tx.resource(&e.target.name)? {
        Some(r) if r.state == ResourceState::Active && r.uid == e.target.uid => Ok(()),
        Some(r) if matches!(r.state, ResourceState::Deleting | ResourceState::Deleted) && r.uid == e.target.uid => {
            Err(CoreError::TargetDeleting { field, target })
        }
        Some(r) if r.state != ResourceState::Creating && r.uid != e.target.uid => Err(CoreError::TargetUidMismatch {
            field,
            target,
            expected: e.target.uid.to_string(),
            actual: r.uid.to_string(),
        }),
        _ => Err(CoreError::TargetNotFound { field, target }),
    }
}

/// What a release request did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReleaseReport {
    /// Rows dropped.
    pub released: usize,
    /// Already gone (a repeated release).
    pub absent: usize,
    /// Older than the row's attach: a late release of an earlier reference.
    pub stale: usize,
    /// The row's referrer is not in the releasing region (refused).
    pub foreign: usize,
}

/// Owner: drops back-references that `from_region` released. Idempotent.
pub fn release<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    from_region: Option<&str>,
    entries: Vec<PeerBackRef>,
) -> Result<Step<ReleaseReport>, CoreError> {
    let mut tx = Tx::new(state);
    let mut report = ReleaseReport::default();
    // Per target: the regions whose release may have work of their own in
    // the target's operation. Noted and woken once per target after the
    // rows (the same writes as once per row, without reading the deletion
    // record, the operation and the queue entry again for each of the 500
    // rows of a release: P2's owner receives one release per remote port).
    let mut touched: BTreeMap<Uid, BTreeSet<String>> = BTreeMap::new();
    for e in entries {
        let key = e.key();
        let found = tx.backref(&key)?;
        let Some(row) = found else {
            report.absent += 1;
            continue;
        };
        if from_region.is_some_and(|r| row.referrer.name.region() != r) {
            report.foreign += 1;
            continue;
        }
        if e.generation < row.generation {
            report.stale += 1;
            continue;
        }
        tx.remove_backref(key);
        protocol::forget_released_row(&mut tx, ctx, &row)?;
        let regions = touched.entry(row.target.uid).or_default();
        let referrer_region = row.referrer.name.region();
        if referrer_region != ctx.region.as_str() && matches!(row.on_delete, OnDelete::Cascade | OnDelete::Unset) {
            // The referrer's region acted on this deletion (or, when the
            // periodic check drops the row, its referrer went some other
            // way, possibly by this very cascade): its part of the operation
            // may have work of its own (see `Operation::reached`).
            if !regions.contains(referrer_region) {
                regions.insert(referrer_region.to_owned());
            }
        }
        report.released += 1;
    }
    for (uid, regions) in touched {
        if !regions.is_empty() {
            if let Some(d) = tx.deletion(uid)? {
                protocol::note_reached(&mut tx, d.operation, &regions, true)?;
            }
        }
        wake(&mut tx, ctx, uid)?;
    }
    Ok(Step {
        value: report,
        writes: tx.finish(),
    })
}

fn wake<S: StateRead + ?Sized>(tx: &mut Tx<'_, S>, ctx: Ctx<'_>, uid: Uid) -> Result<(), CoreError> {
    protocol::wake_if_deleting(tx, ctx, uid)
}
