//! The cross-region flows of the client API: creates and updates whose
//! references reach other regions, dry runs and operations that span
//! regions.
//!
//! A create with a reference into another region (seed 002, DESIGN's
//! CREATING state):
//! 1. resolve each remote target's uid at its owner (`Peer.Lookup`, which
//!    answers NOT_FOUND for a DELETING target: seed 000; its details say
//!    DELETING, so the client is told FAILED_PRECONDITION "is being
//!    deleted" exactly as the owner's own clients are);
//! 2. write the resource durably as CREATING, with its mirror rows;
//! 3. `Peer.Attach` at every owner;
//! 4. ACTIVE — or, if an owner refused or a target was reported DELETING
//!    meanwhile, removed, with releases queued for whatever was attached.
//!
//! A crash between 2 and 4 leaves a `pending_attach` row; the reconciler
//! (see `links.rs`) repeats 3–4, so the resource ends ACTIVE with its
//! back-references or gone without them.
//!
//! Every refusal of a reference names it as the client's request does
//! (`refs.network`, `refs.ports[0]`, `resources[2].refs.network`) whichever
//! region decided it, and every call to another region goes through
//! [`crate::forward`] (UNAVAILABLE when the owner cannot be asked).

use std::collections::{BTreeMap, BTreeSet};

use cascade_core::model::{Resource, ResourceState};
use cascade_core::peer::{self, PeerBackRef};
use cascade_core::plan::PlanDriver;
use cascade_core::protocol::{Plan, ResourceSpec};
use cascade_core::{BackRefKey, CoreError, OnDelete, OperationId, RefTarget, ResourceName, Uid};
use cascade_proto::convert;
use cascade_proto::error_details;
use cascade_proto::page_token::OutcomesPageToken;
use cascade_proto::status::{invalid_field, reason_of};
use cascade_proto::v1::{self, ErrorReason};
use tonic::{Code, Status};
use tracing::{debug, info, warn};

use crate::forward::{call_owner, OwnerError};
use crate::peer_service::read_ctx;
use crate::peers::PEER_CALL_TIMEOUT;
use crate::service::{core_status, parse_name, store_status, writer_status, ResourcesService};

/// The field at fault in `resources[1].refs.ports[0]`: `(Some(1), "ports")`.
fn split_reference_path(path: &str) -> Option<(Option<usize>, &str)> {
    let (member, rest) = match path.strip_prefix("resources[") {
        Some(tail) => {
            let (index, rest) = tail.split_once("].")?;
            (Some(index.parse().ok()?), rest)
        }
        None => (None, path),
    };
    let field = rest.strip_prefix("refs.")?;
    let field = field.split_once('[').map_or(field, |(f, _)| f);
    Some((member, field))
}

/// An owner's refusal of an attach, in the terms the client would hear for
/// a local target: a missing, DELETING or re-created target is the same
/// core error (its field is named in the request's terms by
/// [`ResourcesService::locate`]); another refusal is `AttachRefused`; an
/// owner that cannot serve it now is unavailable (the reconciler retries).
fn attach_refusal(region: &str, sent: &[PeerBackRef], s: &Status) -> CoreError {
    let details = error_details(s).unwrap_or_default();
    let reason = ErrorReason::try_from(details.reason).unwrap_or(ErrorReason::Unspecified);
    let target = details
        .resource
        .as_ref()
        .and_then(|r| ResourceName::parse(&r.name).ok());
    let field = details.field.clone();
    match (s.code(), reason, target) {
        (Code::FailedPrecondition, ErrorReason::Deleting, Some(target)) => CoreError::TargetDeleting { field, target },
        (Code::NotFound, ErrorReason::NotFound, Some(target)) => CoreError::TargetNotFound { field, target },
        (Code::FailedPrecondition, ErrorReason::UidMismatch, Some(target)) => {
            let expected = sent
                .iter()
                .find(|e| e.target.name == target && field == format!("refs.{}", e.field))
                .map(|e| e.target.uid.to_string())
                .unwrap_or_default();
            let actual = details.resource.map(|r| r.uid).unwrap_or_default();
            CoreError::TargetUidMismatch {
                field,
                target,
                expected,
                actual,
            }
        }
        (Code::NotFound | Code::FailedPrecondition | Code::InvalidArgument, ..) => CoreError::AttachRefused {
            region: region.to_owned(),
            reason: s.message().to_owned(),
        },
        _ => CoreError::RegionUnavailable {
            region: region.to_owned(),
            reason: format!("Attach: {:?}: {}", s.code(), s.message()),
        },
    }
}

impl ResourcesService {
    /// The path of a reference target in a create or update request, as
    /// the core names a local one: `refs.network` for a single reference,
    /// `refs.ports[2]` for an element of a list reference, after
    /// `resources[i].` in a batch of several. The same in every region.
    fn reference_path(&self, member: Option<usize>, kind: &str, field: &str, index: usize) -> String {
        let prefix = member.map(|i| format!("resources[{i}].")).unwrap_or_default();
        if self.schema.reference(kind, field).is_some_and(|r| r.many) {
            format!("{prefix}refs.{field}[{index}]")
        } else {
            format!("{prefix}refs.{field}")
        }
    }

    /// Names a refused reference target in the request's terms (see
    /// [`Self::reference_path`]). The owners, and the core for a remote
    /// target, report `refs.{field}`: they know neither the element's
    /// position in a list nor the batch member.
    fn locate(&self, e: CoreError, specs: &[ResourceSpec]) -> CoreError {
        let place = |path: &str, target: &ResourceName| -> Option<String> {
            let (member, field) = split_reference_path(path)?;
            let batch = specs.len() > 1;
            specs
                .iter()
                .enumerate()
                .filter(|(i, _)| member.is_none_or(|m| m == *i))
                .find_map(|(i, spec)| {
                    let j = spec
                        .refs
                        .get(field)?
                        .iter()
                        .position(|t| ResourceName::parse(&t.name).is_ok_and(|n| n == *target))?;
                    let kind = ResourceName::parse(&spec.name).ok()?;
                    Some(self.reference_path(batch.then_some(i), kind.kind(), field, j))
                })
        };
        match e {
            CoreError::TargetDeleting { field, target } => CoreError::TargetDeleting {
                field: place(&field, &target).unwrap_or(field),
                target,
            },
            CoreError::TargetNotFound { field, target } => CoreError::TargetNotFound {
                field: place(&field, &target).unwrap_or(field),
                target,
            },
            CoreError::TargetUidMismatch {
                field,
                target,
                expected,
                actual,
            } => CoreError::TargetUidMismatch {
                field: place(&field, &target).unwrap_or(field),
                target,
                expected,
                actual,
            },
            other => other,
        }
    }

    /// The uid of a live resource of another region, asked of its owner.
    /// `at` is the request's path of the reference.
    async fn lookup(&self, name: &ResourceName, at: &str) -> Result<Uid, Status> {
        let region = name.region();
        let mut peer = self.peers.peer(region).map_err(core_status)?;
        let call = peer.lookup(v1::LookupRequest { name: name.to_string() });
        match call_owner(region, "Lookup", PEER_CALL_TIMEOUT, call).await {
            Ok(found) => Uid::parse(&found.uid).map_err(|e| {
                Status::internal(format!(
                    "region {region} answered Lookup of {name} with an invalid uid: {e}"
                ))
            }),
            // Seed 000: to a peer, a DELETING resource is NOT_FOUND; the
            // reason in the details tells it from an absent one, so the
            // client hears what the owner's own clients hear.
            Err(OwnerError::Answered(s)) if s.code() == Code::NotFound => {
                let target = name.clone();
                let field = at.to_owned();
                Err(core_status(if reason_of(&s) == ErrorReason::Deleting {
                    CoreError::TargetDeleting { field, target }
                } else {
                    CoreError::TargetNotFound { field, target }
                }))
            }
            Err(OwnerError::Answered(s)) if s.code() == Code::Unavailable => {
                Err(core_status(CoreError::RegionUnavailable {
                    region: region.to_owned(),
                    reason: format!("Lookup: {}", s.message()),
                }))
            }
            Err(e) => Err(e.into_status()),
        }
    }

    /// Fills in the uid of every remote target the client did not pin.
    /// `held` are the targets the resource already holds (kept as they are);
    /// `member` is the spec's index in a batch of several.
    async fn resolve_remote(
        &self,
        spec: &mut ResourceSpec,
        held: &BTreeMap<String, Vec<RefTarget>>,
        member: Option<usize>,
    ) -> Result<(), Status> {
        let Ok(own) = ResourceName::parse(&spec.name) else {
            return Ok(()); // the core reports it
        };
        for (field, targets) in spec.refs.iter_mut() {
            for (i, t) in targets.iter_mut().enumerate() {
                let Ok(name) = ResourceName::parse(&t.name) else {
                    continue;
                }; // the core reports it
                if name.region() == self.region.as_str() || t.uid.is_some() {
                    continue;
                }
                let at = self.reference_path(member, own.kind(), field, i);
                if !self.peers.knows(name.region()) {
                    return Err(core_status(CoreError::invalid(
                        at,
                        format!(
                            "{name}: region {} is not part of this cluster (peers: {})",
                            name.region(),
                            self.peers.regions().collect::<Vec<_>>().join(", ")
                        ),
                    )));
                }
                if let Some(kept) = held.get(field).and_then(|h| h.iter().find(|h| h.name == name)) {
                    t.uid = Some(kept.uid);
                    continue;
                }
                t.uid = Some(self.lookup(&name, &at).await?);
            }
        }
        Ok(())
    }

    /// Repeats the attach of a resource whose references are not confirmed
    /// (the reconciler, after a crash or an unreachable owner).
    pub(crate) async fn reattach(&self, r: &Resource) -> Result<Result<Resource, CoreError>, Status> {
        self.attach_pending(r).await
    }

    /// Attaches back-references at their owners, grouped per region.
    async fn attach_at_owners(&self, entries: Vec<PeerBackRef>) -> Result<(), CoreError> {
        let mut by_region: BTreeMap<String, Vec<PeerBackRef>> = BTreeMap::new();
        for e in entries {
            by_region.entry(e.target.name.region().to_owned()).or_default().push(e);
        }
        for (region, entries) in by_region {
            let mut peer = self.peers.peer(&region)?;
            for chunk in entries.chunks(self.limits.max_batch_create) {
                let req = v1::AttachRequest {
                    from_region: self.region.to_string(),
                    backrefs: chunk.iter().map(convert::peer_backref).collect(),
                };
                match call_owner(&region, "Attach", PEER_CALL_TIMEOUT, peer.attach(req)).await {
                    Ok(_) => {}
                    Err(OwnerError::Answered(s)) => return Err(attach_refusal(&region, chunk, &s)),
                    Err(OwnerError::Unreachable(e)) => return Err(e),
                    // Attach is idempotent: an answer that could not be read
                    // is settled by asking again (the reconciler).
                    Err(bad @ OwnerError::BadAnswer { .. }) => {
                        return Err(CoreError::RegionUnavailable {
                            region,
                            reason: bad.into_status().message().to_owned(),
                        })
                    }
                }
            }
        }
        Ok(())
    }

    /// What to attach for a resource's pending cross-region references:
    /// each key whose mirror row still exists, with the generation the
    /// writer gave that row.
    fn pending_entries(&self, uid: Uid) -> Result<(Vec<BackRefKey>, Vec<PeerBackRef>), Status> {
        let state = self.state();
        let Some(pending) = state.get_pending_attach(uid).map_err(store_status)? else {
            return Ok((Vec::new(), Vec::new()));
        };
        let mut entries = Vec::new();
        for key in &pending.keys {
            if let Some(row) = state.get_backref(key).map_err(store_status)? {
                entries.push(PeerBackRef {
                    target: row.target,
                    referrer: row.referrer,
                    field: row.field,
                    generation: row.generation,
                });
            }
        }
        Ok((pending.keys, entries))
    }

    /// Attaches a resource's pending cross-region references at their
    /// owners and settles it: confirmed, or (refused) taken back / removed.
    async fn attach_pending(&self, r: &Resource) -> Result<Result<Resource, CoreError>, Status> {
        let (keys, entries) = self.pending_entries(r.uid)?;
        if keys.is_empty() {
            return Ok(Ok(r.clone()));
        }
        let attached = self.attach_at_owners(entries).await;
        if let Err(e @ CoreError::RegionUnavailable { .. }) = &attached {
            if r.state == ResourceState::Active {
                // The reference is committed and the intent durable: the
                // reconciler attaches it once the region is back. Taking it
                // back here could race a slow attach that did land.
                return Ok(Err(e.clone()));
            }
        }
        self.settle(r, keys, attached).await
    }

    /// Confirms or takes back after the owners answered.
    async fn settle(
        &self,
        r: &Resource,
        keys: Vec<BackRefKey>,
        attached: Result<(), CoreError>,
    ) -> Result<Result<Resource, CoreError>, Status> {
        let (name, uid) = (r.name.clone(), r.uid);
        if let Err(e) = &attached {
            info!(region = %self.region, name = %name, %uid, error = %e, "cross-region references refused");
        }
        self.writer
            .apply(move |s, c, _| peer::settle(s, c, &name, uid, &keys, attached))
            .await
            .map_err(writer_status)?
            .map_err(core_status)
    }

    /// Creates resources of this region. A batch with cross-region
    /// references is committed CREATING (invisible), attached at the
    /// owners, and settled in one step, all or nothing.
    pub(crate) async fn create_flow(&self, mut specs: Vec<ResourceSpec>) -> Result<Vec<Resource>, Status> {
        let batch = specs.len() > 1;
        for (i, spec) in specs.iter_mut().enumerate() {
            self.resolve_remote(spec, &BTreeMap::new(), batch.then_some(i)).await?;
        }
        // Kept to name a refused reference in the request's terms.
        let requested = specs.clone();
        let refused = |e: CoreError| core_status(self.locate(e, &requested));
        let created = self
            .writer
            .create(specs)
            .await
            .map_err(writer_status)?
            .map_err(refused)?;
        if created.iter().all(|r| r.state != ResourceState::Creating) {
            return Ok(created);
        }
        let mut members = Vec::with_capacity(created.len());
        let mut entries = Vec::new();
        for r in &created {
            let (keys, mut e) = self.pending_entries(r.uid)?;
            entries.append(&mut e);
            members.push((r.name.clone(), r.uid, keys));
        }
        let attached = self.attach_at_owners(entries).await;
        if let Err(e) = &attached {
            info!(region = %self.region, count = members.len(), error = %e, "cross-region create aborted");
        }
        self.writer
            .apply(move |s, c, _| peer::settle_batch(s, c, members, attached))
            .await
            .map_err(writer_status)?
            .map_err(core_status)?
            .map_err(refused)
    }

    /// Updates a resource of this region. New cross-region references are
    /// committed first (with a durable intent) and then attached; an owner
    /// that refuses gets its reference taken back and the call fails.
    pub(crate) async fn update_flow(&self, mut spec: ResourceSpec, etag: Option<String>) -> Result<Resource, Status> {
        let name = parse_name(&spec.name, "name")?;
        let held = self
            .state()
            .get_resource(&name)
            .map_err(store_status)?
            .map(|r| r.refs)
            .unwrap_or_default();
        self.resolve_remote(&mut spec, &held, None).await?;
        let requested = [spec.clone()];
        let refused = |e: CoreError| core_status(self.locate(e, &requested));
        let updated = self
            .writer
            .update(spec, etag)
            .await
            .map_err(writer_status)?
            .map_err(refused)?;
        match self.attach_pending(&updated).await? {
            Ok(r) => Ok(r),
            Err(e @ CoreError::RegionUnavailable { .. }) => {
                // Committed; confirmed later by the reconciler.
                warn!(region = %self.region, name = %updated.name, error = %e, "update committed; its cross-region attach will be retried");
                Ok(updated)
            }
            Err(e) => Err(refused(e)),
        }
    }

    /// This region's part of a dry run started elsewhere.
    pub(crate) fn plan_part(&self, seeds: Vec<RefTarget>, cascade: bool) -> Result<Plan, Status> {
        let state = self.state();
        peer::plan_from(&state, read_ctx(self, self.clock.now()), seeds, cascade).map_err(core_status)
    }

    /// Completes a local dry run with every region's part: regions are
    /// re-planned from every seed they were handed until nothing grows
    /// (see `cascade_core::plan`), then the parts are merged.
    pub(crate) async fn plan_everywhere(&self, plan: Plan, cascade: bool) -> v1::Plan {
        let Some(root) = plan.deleted.first().cloned() else {
            return convert::plan(&plan);
        };
        let mut driver = PlanDriver::new(self.region.as_str(), root, plan);
        loop {
            let round = driver.next_round();
            if round.is_empty() {
                break;
            }
            for (region, seeds) in round {
                let part = if region == self.region.as_str() {
                    self.plan_part(seeds.clone(), cascade).ok()
                } else {
                    self.peer_plan(&region, seeds.clone(), cascade).await
                };
                driver.answer(&region, seeds, part);
            }
        }
        let unreachable: Vec<String> = driver.unreachable().map(str::to_owned).collect();
        let mut out = convert::plan(&driver.finish());
        out.unreachable_regions = unreachable;
        out
    }

    /// For a delete without cascade: which of the target's `cascade`
    /// referrers in other regions keep another live target in their list
    /// (their regions answer; see `peer::keeps_another_target`). The core
    /// refuses the delete for every other remote `cascade` referrer. A
    /// region that cannot be asked makes the delete UNAVAILABLE: refusing
    /// would list dependents that may not be, accepting could cascade.
    pub(crate) async fn remote_kept(&self, name: &ResourceName) -> Result<BTreeSet<BackRefKey>, Status> {
        let state = self.state();
        let Some(target) = state.get_resource(name).map_err(store_status)? else {
            return Ok(BTreeSet::new());
        };
        let mut by_region: BTreeMap<String, Vec<PeerBackRef>> = BTreeMap::new();
        for row in state.backrefs_of(target.uid).map_err(store_status)? {
            // Only a list owner can keep another owner: a single `cascade`
            // reference is a dependent whatever its region would say.
            let list_owner = self
                .schema
                .reference(row.referrer.name.kind(), &row.field)
                .is_some_and(|r| r.many);
            if row.on_delete == OnDelete::Cascade && list_owner && row.referrer.name.region() != self.region.as_str() {
                by_region
                    .entry(row.referrer.name.region().to_owned())
                    .or_default()
                    .push(PeerBackRef {
                        target: row.target,
                        referrer: row.referrer,
                        field: row.field,
                        generation: row.generation,
                    });
            }
        }
        let mut kept = BTreeSet::new();
        for (region, rows) in by_region {
            let mut peer = self.peers.peer(&region).map_err(core_status)?;
            for chunk in rows.chunks(self.limits.max_batch_create) {
                let req = v1::CheckBackrefsRequest {
                    from_region: self.region.to_string(),
                    backrefs: chunk.iter().map(convert::peer_backref).collect(),
                };
                let answer = call_owner(
                    &region,
                    "KeepsAnotherTarget",
                    PEER_CALL_TIMEOUT,
                    peer.keeps_another_target(req),
                )
                .await
                .map_err(|e| match e {
                    // Whatever the region answered, the delete cannot be
                    // decided without its answer.
                    OwnerError::Answered(s) => core_status(CoreError::RegionUnavailable {
                        region: region.clone(),
                        reason: format!("KeepsAnotherTarget: {:?}: {}", s.code(), s.message()),
                    }),
                    other => other.into_status(),
                })?
                .standing;
                kept.extend(
                    chunk
                        .iter()
                        .zip(answer)
                        .filter(|(_, keeps)| *keeps)
                        .map(|(row, _)| row.key()),
                );
            }
        }
        Ok(kept)
    }

    async fn peer_plan(&self, region: &str, seeds: Vec<RefTarget>, cascade: bool) -> Option<Plan> {
        let mut peer = self.peers.peer(region).ok()?;
        let req = v1::PeerPlanRequest {
            seeds: seeds.iter().map(convert::object_ref).collect(),
            cascade,
        };
        // A region that cannot be asked (or answers with an error) is
        // reported in the plan's `unreachable_regions`.
        let answer = call_owner(region, "Plan", PEER_CALL_TIMEOUT, peer.plan(req))
            .await
            .ok()?;
        convert::plan_from(answer).ok()
    }

    /// Every region of the cluster, in the fixed order in which the
    /// aggregated outcomes list their parts (the same on every node).
    fn regions_in_order(&self) -> Vec<String> {
        let mut all: Vec<String> = self.peers.regions().map(str::to_owned).collect();
        all.push(self.region.to_string());
        all.sort();
        all.dedup();
        all
    }

    /// One region's part of an operation, with up to `page_size` outcomes
    /// from its own `inner` page token; `None` when it has no part.
    async fn operation_part(
        &self,
        region: &str,
        id: OperationId,
        page_size: usize,
        inner: &str,
    ) -> Result<Option<v1::Operation>, OwnerError> {
        if region == self.region.as_str() {
            return match self.local_operation(id, page_size, inner) {
                Ok(op) => Ok(Some(op)),
                Err(s) if s.code() == Code::NotFound => Ok(None),
                Err(s) => Err(OwnerError::Answered(s)),
            };
        }
        let mut peer = self.peers.peer(region).map_err(OwnerError::Unreachable)?;
        let req = v1::GetOperationRequest {
            id: id.to_string(),
            outcomes_page_size: u32::try_from(page_size).unwrap_or(u32::MAX),
            outcomes_page_token: inner.to_owned(),
        };
        match call_owner(region, "OperationPart", PEER_CALL_TIMEOUT, peer.operation_part(req)).await {
            Ok(op) => Ok(Some(op)),
            Err(OwnerError::Answered(s)) if s.code() == Code::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// An operation with every region's part: counters summed, outcomes
    /// listed with the region they are in, unreachable regions named.
    ///
    /// Outcomes page across the parts, which follow each other in
    /// [`Self::regions_in_order`]: the page token ([`OutcomesPageToken`])
    /// names the region whose part comes next and that part's own token, so
    /// a page fills from one part into the next, every outcome comes once,
    /// and any node continues a token another node issued. A part that
    /// cannot be read now ends the page before it (its region is listed as
    /// unreachable, and the token points at it): skipping it would lose its
    /// outcomes for good.
    pub(crate) async fn operation(
        &self,
        id: OperationId,
        page_size: usize,
        page_token: &str,
    ) -> Result<v1::Operation, Status> {
        let order = self.regions_in_order();
        let malformed = |why: String| invalid_field("outcomes_page_token", why);
        let (start_at, start_inner) =
            match OutcomesPageToken::decode(page_token).map_err(|e| malformed(e.to_string()))? {
                None => (0, String::new()),
                Some(t) => {
                    let at = order.iter().position(|r| *r == t.region).ok_or_else(|| {
                        malformed(format!(
                            "names region {:?}, which is not part of this cluster",
                            t.region
                        ))
                    })?;
                    if !t.inner.is_empty() {
                        // The part's own token: the last outcome's resource name.
                        parse_name(&t.inner, "outcomes_page_token")?;
                    }
                    (at, t.inner)
                }
            };
        let page_size = page_size.min(self.limits.max_page_size);
        let mut left = page_size;
        let mut filling = page_size > 0;
        let mut outcomes = Vec::new();
        let mut next: Option<OutcomesPageToken> = None;
        let mut parts: Vec<(String, v1::Operation)> = Vec::new();
        let mut unreachable = Vec::new();
        for (i, region) in order.iter().enumerate() {
            // What this part is asked for: the outcomes the page still needs
            // (from the token's position in the first one); once the page is
            // full, one, to learn whether the next page starts here; else
            // none (its counters only).
            let (want, inner) = if !filling || i < start_at {
                (0, "")
            } else if left == 0 {
                (1, "")
            } else if i == start_at {
                (left, start_inner.as_str())
            } else {
                (left, "")
            };
            match self.operation_part(region, id, want, inner).await {
                Ok(Some(mut part)) => {
                    let got = std::mem::take(&mut part.outcomes);
                    if want > 0 && left == 0 {
                        if !got.is_empty() {
                            next = Some(OutcomesPageToken {
                                region: region.clone(),
                                inner: String::new(),
                            });
                            filling = false;
                        }
                    } else if want > 0 {
                        left = left.saturating_sub(got.len());
                        outcomes.extend(got);
                        if !part.next_outcomes_page_token.is_empty() {
                            next = Some(OutcomesPageToken {
                                region: region.clone(),
                                inner: std::mem::take(&mut part.next_outcomes_page_token),
                            });
                            filling = false;
                        }
                    }
                    part.next_outcomes_page_token.clear();
                    parts.push((region.clone(), part));
                }
                Ok(None) => {}
                // This node's own failures, and a part's refusal of the
                // token, are the answer.
                Err(OwnerError::Answered(s)) if region == self.region.as_str() || s.code() == Code::InvalidArgument => {
                    return Err(s)
                }
                Err(e) => {
                    debug!(region = %self.region, part = %region, operation = %id, error = ?e, "operation part not read");
                    unreachable.push(region.clone());
                    if want > 0 {
                        next = Some(OutcomesPageToken {
                            region: region.clone(),
                            inner: inner.to_owned(),
                        });
                        filling = false;
                    }
                }
            }
        }
        if parts.is_empty() {
            return Err(if unreachable.is_empty() {
                core_status(CoreError::OperationNotFound(id.to_string()))
            } else {
                core_status(CoreError::RegionUnavailable {
                    region: unreachable.join(", "),
                    reason: format!("operation {id} is not known here and these regions could not be asked"),
                })
            });
        }
        // The origin's part (its root is its own) gives the operation's header.
        let lead = parts
            .iter()
            .position(|(region, op)| {
                op.root
                    .as_ref()
                    .is_some_and(|r| r.name.starts_with(&format!("{region}/")))
            })
            .unwrap_or(0);
        let mut merged = parts[lead].1.clone();
        let mut progress = v1::Progress::default();
        let mut any_running = false;
        let mut any_failed = false;
        for (_, part) in &parts {
            let p = part.progress.unwrap_or_default();
            progress.deleted += p.deleted;
            progress.unset += p.unset;
            progress.pending += p.pending;
            progress.blocked += p.blocked;
            progress.failed += p.failed;
            any_running |= !part.done;
            any_failed |= part.state == v1::OperationState::Failed as i32;
            merged.end_time_ms = merged.end_time_ms.max(part.end_time_ms);
        }
        let done = !any_running && unreachable.is_empty();
        merged.state = if !done {
            v1::OperationState::Running
        } else if any_failed {
            v1::OperationState::Failed
        } else {
            v1::OperationState::Succeeded
        } as i32;
        merged.done = done;
        if !done {
            merged.end_time_ms = 0;
        }
        merged.progress = Some(progress);
        merged.outcomes = outcomes;
        merged.next_outcomes_page_token = next.map(|t| t.encode()).unwrap_or_default();
        merged.unreachable_regions = unreachable;
        Ok(merged)
    }
}
