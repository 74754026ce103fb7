//! The cross-region flows of the client API, as [`Node`] methods on core
//! types: creates and updates whose references reach other regions, deletes
//! that ask other regions first, dry runs and operations that span regions.
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
//! Each call of 1 and 3 is within what is left of the client's deadline
//! (`crate::peers::Deadline`): one that runs out of it refuses the create
//! (DEADLINE_EXCEEDED), before 2 for a Lookup, with 4's removal for an
//! Attach. A crash between 2 and 4, or a request cut midway without a
//! deadline this node knows of (a client that gives up on its own, a reset
//! connection), leaves a `pending_attach` row; the reconciler (see
//! `links.rs`) repeats 3–4 for it, so the resource ends ACTIVE with its
//! back-references or gone without them. Until then it is invisible, and a
//! create of its name meets it (`CoreError::CreateUnsettled`): the node
//! finishes that earlier create first, as the reconciler would, and tries
//! again, so a retried create answers what a Get then sees (ALREADY_EXISTS
//! only for a resource a Get returns; a fresh create if the earlier one was
//! refused; UNAVAILABLE naming the region when its owners cannot be asked).
//! Two settlers of one create (a retry, the reconciler, the request itself)
//! are harmless: each settle is one writer step that reads the resource by
//! uid, and a failure undoes only what is still CREATING.
//!
//! Every refusal of a reference names it as the client's request does
//! (`refs.network`, `refs.ports[0]`, `resources[2].refs.network`) whichever
//! region decided it ([`cascade_core::request_path`]), and every call to
//! another region goes through the typed calls of [`crate::peers::Peers`]
//! (UNAVAILABLE when the owner cannot be asked). Merging the regions' parts
//! of a dry run or of an operation is the core's ([`PlanDriver`],
//! [`OperationAssembler`]); here they are only driven.
//!
//! Size: one file on purpose: a delete's closure check (issue 27) is the
//! dry run's drive over the regions (`plan_everywhere`) with a principal,
//! and the delete that runs it; split from them, each half would be read
//! only with the other open.

use std::collections::{BTreeMap, BTreeSet};

use cascade_core::auth::{Principal, Target, Verb};
use cascade_core::model::{Resource, ResourceState};
use cascade_core::operation_view::{OperationAssembler, OperationPage, OperationView, OutcomesCursor, PartAnswer};
use cascade_core::peer::{self, PeerBackRef};
use cascade_core::plan::PlanDriver;
use cascade_core::protocol::{DeleteOutcome, DeleteRequest, Plan, PlannedDenial, ResourceSpec, Step};
use cascade_core::request_path::{locate_refusal, reference_path};
use cascade_core::state::{StateRead, WriteSet};
use cascade_core::{BackRefKey, CoreError, OnDelete, OperationId, RefTarget, ResourceName, Timestamp, Uid};
use tracing::{debug, info, info_span, warn, Instrument};

use crate::error::Fault;
use crate::node::Node;
use crate::peers::{Deadline, LookupAnswer};

/// What an operation's first round of reads (every peer at once,
/// counters only) found: the parts it read, which the page's counters-only
/// reads reuse rather than asking again; the peers that did not answer;
/// and those of them known to hold no part.
#[derive(Default)]
struct FirstRound {
    counters: BTreeMap<String, Option<OperationPage>>,
    unreachable: BTreeSet<String>,
    without_part: BTreeSet<String>,
}

/// One read of another region's part of an operation (GetOperation,
/// WatchOperation): a region that does not answer this soon is listed as
/// unreachable, and the operation is answered with the other parts.
pub(crate) const OPERATION_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Owners asked at once while a create resolves its remote targets: enough
/// to hide the round trips, few enough not to flood one owner.
pub(crate) const CONCURRENT_LOOKUPS: usize = 16;

impl Node {
    /// Names a refused reference target in the terms of `requested`.
    fn located(&self, requested: &[ResourceSpec]) -> impl Fn(Fault) -> Fault + '_ {
        let requested = requested.to_vec();
        move |e| self.locate(&requested, e)
    }

    /// [`Self::located`] for one fault, with the request at hand (a create
    /// keeps its specs, so it needs no copy of a thousand of them made in
    /// case one is refused).
    fn locate(&self, requested: &[ResourceSpec], e: Fault) -> Fault {
        match e {
            Fault::Refused(e) => Fault::Refused(locate_refusal(&self.schema(), e, requested)),
            other => other,
        }
    }

    /// The uid of a live resource of another region, asked of its owner
    /// within what is left of the client's `deadline` (at most
    /// `PEER_CALL_TIMEOUT`; not asked when nothing is left). `at` is the
    /// request's path of the reference.
    async fn lookup(&self, name: &ResourceName, at: &str, deadline: &Deadline) -> Result<Uid, Fault> {
        let field = at.to_owned();
        let target = name.clone();
        let region = name.region();
        let within = deadline.for_call(region, "Lookup")?;
        let answer = self.peers.lookup(name, within).await;
        match answer.map_err(|e| deadline.blame_remote(region, "Lookup", e))? {
            LookupAnswer::Live(uid) => Ok(uid),
            // The client hears what the owner's own clients hear.
            LookupAnswer::Deleting => Err(CoreError::TargetDeleting { field, target }.into()),
            LookupAnswer::Absent => Err(CoreError::TargetNotFound { field, target }.into()),
        }
    }

    /// Fills in the uid of every remote target the client did not pin, in
    /// every spec of a request. `held` are the targets a resource already
    /// holds (an update keeps them as they are). Each distinct target is
    /// asked of its owner once per request, up to [`CONCURRENT_LOOKUPS`] at
    /// a time: a batch of a thousand ports on one remote network is one
    /// lookup, not a thousand in a row. A refusal names the first
    /// reference, in request order, that asked for the target. Each lookup
    /// is within what is left of the client's `deadline`.
    async fn resolve_remote(
        &self,
        specs: &mut [ResourceSpec],
        held: &BTreeMap<String, Vec<RefTarget>>,
        deadline: &Deadline,
    ) -> Result<(), Fault> {
        let batch = specs.len() > 1;
        // Each distinct target string parsed once per request (None: not a
        // name, the core reports it): a batch of a thousand ports names one
        // network a thousand times, and P5's profile had the request parse
        // every reference's target twice and every spec's name once (1.6 %
        // of its instructions).
        let mut parsed: BTreeMap<String, Option<ResourceName>> = BTreeMap::new();
        // Target → the path of the first reference that names it.
        let mut wanted: BTreeMap<ResourceName, String> = BTreeMap::new();
        let mut order: Vec<ResourceName> = Vec::new();
        for (member, spec) in specs.iter().enumerate() {
            for (field, targets) in &spec.refs {
                for (i, t) in targets.iter().enumerate() {
                    if t.uid.is_some() {
                        continue;
                    }
                    let name = match parsed.get(&t.name) {
                        Some(known) => known.clone(),
                        None => {
                            let name = ResourceName::parse(&t.name).ok();
                            parsed.insert(t.name.clone(), name.clone());
                            name
                        }
                    };
                    let Some(name) = name else {
                        continue; // the core reports it
                    };
                    if name.region() == self.region.as_str() || wanted.contains_key(&name) {
                        continue;
                    }
                    if held.get(field).is_some_and(|h| h.iter().any(|h| h.name == name)) {
                        continue;
                    }
                    let Ok(own) = ResourceName::parse(&spec.name) else {
                        continue; // the core reports it
                    };
                    let at = || reference_path(&self.schema(), batch.then_some(member), own.kind(), field, i);
                    if !self.peers.knows(name.region()) {
                        return Err(CoreError::invalid(
                            at(),
                            format!(
                                "{name}: region {} is not part of this cluster (peers: {})",
                                name.region(),
                                self.peer_list()
                            ),
                        )
                        .into());
                    }
                    order.push(name.clone());
                    wanted.insert(name, at());
                }
            }
        }
        let mut uids: BTreeMap<&ResourceName, Uid> = BTreeMap::new();
        for chunk in order.chunks(CONCURRENT_LOOKUPS) {
            let mut asks = Vec::with_capacity(chunk.len());
            for name in chunk {
                asks.push(self.lookup(name, &wanted[name], deadline));
            }
            for (name, answer) in chunk.iter().zip(futures::future::join_all(asks).await) {
                uids.insert(name, answer?);
            }
        }
        for spec in specs.iter_mut() {
            for (field, targets) in spec.refs.iter_mut() {
                for t in targets.iter_mut().filter(|t| t.uid.is_none()) {
                    let Some(Some(name)) = parsed.get(&t.name) else {
                        continue;
                    };
                    t.uid = match held.get(field).and_then(|h| h.iter().find(|h| h.name == *name)) {
                        Some(kept) => Some(kept.uid),
                        None => uids.get(name).copied(),
                    };
                }
            }
        }
        Ok(())
    }

    /// The reconciler's settle of one resource whose references are not
    /// confirmed (after a crash, a request cut midway, or an unreachable
    /// owner): attach again (idempotent at the owner), then confirmed,
    /// removed (CREATING) or taken back (ACTIVE). True when the resource
    /// needs no more attention of its own: no longer CREATING (confirmed,
    /// removed) or refused; false while it still waits (an owner that
    /// cannot be asked, a batch sibling not settled yet, a local failure).
    pub(crate) async fn reconcile(&self, r: &Resource) -> bool {
        let span = info_span!("reconcile_create", region = %self.region, name = %r.name, uid = %r.uid);
        async {
            // The reconciler's own work, for no caller: each attach bounded
            // by PEER_CALL_TIMEOUT alone.
            match self.attach_pending(r, &Deadline::NONE).await {
                Ok(Ok(now)) if now.state == ResourceState::Creating => {
                    debug!("attached; waits for a batch sibling it references");
                    false
                }
                Ok(Ok(_)) => {
                    info!("cross-region references confirmed");
                    true
                }
                Ok(Err(e @ CoreError::RegionUnavailable { .. })) if r.state != ResourceState::Creating => {
                    debug!(error = %e, "owner unreachable; will retry");
                    false
                }
                Ok(Err(e)) => {
                    info!(reason = %e, "cross-region references refused: create removed or references taken back");
                    true
                }
                Err(e) => {
                    debug!(error = %e, "not settled yet; will retry");
                    false
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Attaches back-references at their owners, grouped per region. The
    /// regions are asked at once, so an attach takes as long as its slowest
    /// owner (one peer-call deadline per chunk, or what is left of the
    /// client's `deadline` when that is shorter), not the sum; the first
    /// refusal in region order is the answer.
    pub(crate) async fn attach_at_owners(
        &self,
        entries: Vec<PeerBackRef>,
        deadline: &Deadline,
    ) -> Result<(), CoreError> {
        let mut by_region: BTreeMap<String, Vec<PeerBackRef>> = BTreeMap::new();
        for e in entries {
            by_region.entry(e.target.name.region().to_owned()).or_default().push(e);
        }
        let asks = by_region.iter().map(|(region, entries)| async move {
            for chunk in entries.chunks(self.limits.max_batch_create) {
                self.peers.attach(region, &self.region, chunk, deadline).await?;
            }
            Ok(())
        });
        futures::future::join_all(asks).await.into_iter().collect()
    }

    /// What to attach for a resource's pending cross-region references:
    /// each key whose mirror row still exists, with the generation the
    /// writer gave that row.
    pub(crate) fn pending_entries(&self, uid: Uid) -> Result<(Vec<BackRefKey>, Vec<PeerBackRef>), Fault> {
        let state = self.state();
        let Some(pending) = state.get_pending_attach(uid)? else {
            return Ok((Vec::new(), Vec::new()));
        };
        let mut entries = Vec::new();
        for key in &pending.keys {
            if let Some(row) = state.get_backref(key)? {
                entries.push(PeerBackRef::from(row));
            }
        }
        Ok((pending.keys, entries))
    }

    /// What to attach for a resource the create step just committed
    /// CREATING: each tracked reference into another region (exactly the
    /// keys that step recorded as pending, `protocol::create`), with the
    /// generation the writer gave its mirror row. The same answer as
    /// [`Self::pending_entries`] without reading the pending row back: one
    /// read per reference instead of two (P5 read both for every port).
    fn created_entries(&self, r: &Resource) -> Result<(Vec<BackRefKey>, Vec<PeerBackRef>), Fault> {
        let state = self.state();
        let mut keys = BTreeSet::new();
        for (field, targets) in &r.refs {
            let tracked = self
                .schema()
                .reference(r.kind(), field)
                .is_some_and(|spec| spec.on_delete.tracked());
            if !tracked {
                continue;
            }
            for t in targets.iter().filter(|t| t.name.region() != self.region.as_str()) {
                keys.insert(BackRefKey {
                    target: t.uid,
                    referrer: r.uid,
                    field: field.clone(),
                });
            }
        }
        let mut entries = Vec::with_capacity(keys.len());
        for key in &keys {
            if let Some(row) = state.get_backref(key)? {
                entries.push(PeerBackRef::from(row));
            }
        }
        Ok((keys.into_iter().collect(), entries))
    }

    /// Attaches a resource's pending cross-region references at their
    /// owners and settles it: confirmed, or (refused) taken back / removed.
    ///
    /// A CREATING resource is settled even with nothing left to attach: a
    /// batch member whose only remote references are `allow_dangling` (no
    /// back-reference, so no key), or whose keys an earlier settle
    /// confirmed while it waited for a sibling, has an empty key list, and
    /// returning it unchanged left it CREATING for ever (issue 23: the
    /// reconciler called it confirmed on every pass).
    async fn attach_pending(&self, r: &Resource, deadline: &Deadline) -> Result<Result<Resource, CoreError>, Fault> {
        let (keys, entries) = self.pending_entries(r.uid)?;
        if keys.is_empty() && r.state != ResourceState::Creating {
            return Ok(Ok(r.clone()));
        }
        let attached = self.attach_at_owners(entries, deadline).await;
        if let Some(e) = attached.as_ref().err().filter(|e| unanswered(e)) {
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
    ) -> Result<Result<Resource, CoreError>, Fault> {
        if let Err(e) = &attached {
            info!(region = %self.region, name = %r.name, uid = %r.uid, error = %e, "cross-region references refused");
        }
        let members = vec![(r.name.clone(), r.uid, keys)];
        let settled = self
            .settle_members(members, r.state == ResourceState::Creating, attached, None)
            .await?;
        Ok(settled.and_then(|mut v| {
            v.pop()
                .ok_or_else(|| CoreError::invalid("resources", "nothing settled"))
        }))
    }

    /// Settles the members of one create (`peer::settle_batch`, one writer
    /// step) after their owners answered. `were_creating`: the members were
    /// read CREATING before the attach. Another settler may have finished
    /// them since (a retry of the same create, the reconciler, the request
    /// that made them): a failure then undoes only the members still
    /// CREATING, never references another settle confirmed, and when every
    /// member was confirmed meanwhile the create went through. A create
    /// forwarded by a node that gave up at `answer_by` settles past it as
    /// refused (`crate::peers::still_awaited`), in the same step.
    async fn settle_members(
        &self,
        members: Vec<(ResourceName, Uid, Vec<BackRefKey>)>,
        were_creating: bool,
        attached: Result<(), CoreError>,
        answer_by: Option<Timestamp>,
    ) -> Result<Result<Vec<Resource>, CoreError>, Fault> {
        self.writer
            .apply(move |s, c, _| {
                let attached = match attached {
                    Ok(()) => crate::peers::still_awaited(answer_by, c.now, c.region.as_str(), "Create"),
                    failed => failed,
                };
                let Err(failure) = &attached else {
                    return peer::settle_batch(s, c, members, attached);
                };
                if !were_creating {
                    return peer::settle_batch(s, c, members, attached);
                }
                let (mut still, mut confirmed, mut gone) = (Vec::new(), Vec::new(), false);
                for member in members {
                    match by_uid(s, member.1)? {
                        Some(r) if r.state == ResourceState::Creating => still.push(member),
                        Some(r) => confirmed.push(r),
                        None => gone = true,
                    }
                }
                if !still.is_empty() {
                    return peer::settle_batch(s, c, still, attached);
                }
                let value = if gone { Err(failure.clone()) } else { Ok(confirmed) };
                Ok(Step {
                    value,
                    writes: WriteSet::default(),
                })
            })
            .await
    }

    /// Creates resources of this region. A batch with cross-region
    /// references is committed CREATING (invisible), attached at the
    /// owners, and settled in one step, all or nothing.
    ///
    /// A name held by an unsettled create (`CoreError::CreateUnsettled`:
    /// CREATING, its request cut midway) is settled here first and the
    /// create tried again, at most once per spec and once more: ACTIVE then
    /// answers ALREADY_EXISTS (a Get returns it), refused and removed
    /// leaves the name free, and owners that cannot be asked make this
    /// create UNAVAILABLE naming their region.
    /// Each resource created is audited for `audit`, in the step that
    /// commits it (CREATING or ACTIVE).
    ///
    /// Every call to another region is within what is left of the client's
    /// `deadline`: a lookup that runs out of it refuses the create before
    /// anything is written, and so does a deadline that leaves no time to
    /// attach; an attach that runs out of it removes the CREATING resources
    /// as a refusal does (`CoreError::DeadlineExceeded` either way).
    ///
    /// A create forwarded by a node that gave up at `answer_by` is refused
    /// past it: by its write step (nothing written), or, CREATING already,
    /// by the step that would settle it ACTIVE (removed as for a refusal),
    /// so that a create its client was answered DEADLINE_EXCEEDED for does
    /// not appear later.
    pub(crate) async fn create(
        &self,
        mut specs: Vec<ResourceSpec>,
        audit: crate::audit::AuditContext,
        deadline: &Deadline,
        answer_by: Option<Timestamp>,
    ) -> Result<Vec<Resource>, Fault> {
        self.resolve_remote(&mut specs, &BTreeMap::new(), deadline).await?;
        if let Some(region) = self.first_attach_region(&specs) {
            // Not written at all when it could not be attached in time.
            deadline.for_call(&region, "Attach")?;
        }
        let mut rounds = specs.len() + 1;
        let created = loop {
            rounds -= 1;
            match self.writer.create(specs.clone(), Some(audit.clone()), answer_by).await {
                Err(Fault::Refused(CoreError::CreateUnsettled { name, uid })) if rounds > 0 => {
                    debug!(region = %self.region, %name, %uid, "an earlier create of the name is unsettled; settling it first");
                    self.finish_unsettled(&specs, &name, uid, deadline).await?;
                }
                other => break other.map_err(|e| self.locate(&specs, e))?,
            }
        };
        if created.iter().all(|r| r.state != ResourceState::Creating) {
            return Ok(created);
        }
        let mut members = Vec::with_capacity(created.len());
        let mut entries = Vec::new();
        for r in &created {
            let (keys, mut e) = self.created_entries(r)?;
            entries.append(&mut e);
            members.push((r.name.clone(), r.uid, keys));
        }
        let attached = self.attach_at_owners(entries, deadline).await;
        if let Err(e) = &attached {
            info!(region = %self.region, count = members.len(), error = %e, "cross-region create aborted");
        }
        self.settle_members(members, true, attached, answer_by)
            .await?
            .map_err(|e| self.locate(&specs, e.into()))
    }

    /// Finishes the unsettled creates a new create met: `name` (CREATING as
    /// `uid`; nothing to do if it settled meanwhile), every other name of
    /// the request that is CREATING, and the CREATING resources of this
    /// region they reference (batch siblings), as the reconciler would:
    /// attach what they hold, then settle them together in one step, each
    /// after the siblings it references — all confirmed, or all removed, so
    /// a batch retried as it was sent stays all or nothing. Ok once they are
    /// confirmed, removed or refused (the caller tries its create again);
    /// owners that cannot be asked now (`RegionUnavailable`, or
    /// `DeadlineExceeded` within what is left of the client's `deadline`;
    /// the earlier create removed with it) are the caller's answer.
    async fn finish_unsettled(
        &self,
        specs: &[ResourceSpec],
        name: &ResourceName,
        uid: Uid,
        deadline: &Deadline,
    ) -> Result<(), Fault> {
        let Some(met) = self.creating(name)?.filter(|r| r.uid == uid) else {
            return Ok(()); // settled meanwhile
        };
        let mut roots = vec![met];
        for spec in specs {
            let Ok(other) = ResourceName::parse(&spec.name) else {
                continue;
            };
            if other != *name {
                roots.extend(self.creating(&other)?);
            }
        }
        let mut members = Vec::new();
        let mut entries = Vec::new();
        for r in self.creating_targets_first(roots)? {
            let (keys, mut e) = self.pending_entries(r.uid)?;
            entries.append(&mut e);
            members.push((r.name, r.uid, keys));
        }
        let count = members.len();
        let attached = self.attach_at_owners(entries, deadline).await;
        match self.settle_members(members, true, attached, None).await? {
            Ok(settled) => {
                debug!(region = %self.region, count, active = settled.iter().filter(|r| r.state == ResourceState::Active).count(), "earlier create settled");
                Ok(())
            }
            Err(e) if unanswered(&e) => Err(e.into()),
            Err(e) => {
                info!(region = %self.region, count, reason = %e, "earlier create refused and removed");
                Ok(())
            }
        }
    }

    /// The region of the first reference of `specs` a create would attach
    /// at its owner (a tracked one into another region), if any.
    fn first_attach_region(&self, specs: &[ResourceSpec]) -> Option<String> {
        let schema = self.schema();
        specs.iter().find_map(|spec| {
            let own = ResourceName::parse(&spec.name).ok()?;
            spec.refs.iter().find_map(|(field, targets)| {
                let tracked = schema
                    .reference(own.kind(), field)
                    .is_some_and(|r| r.on_delete.tracked());
                if !tracked {
                    return None;
                }
                targets
                    .iter()
                    .filter_map(|t| ResourceName::parse(&t.name).ok())
                    .map(|t| t.region().to_owned())
                    .find(|region| region != self.region.as_str())
            })
        })
    }

    /// The resource of `name` if it is CREATING.
    fn creating(&self, name: &ResourceName) -> Result<Option<Resource>, Fault> {
        Ok(self
            .state()
            .get_resource(name)?
            .filter(|r| r.state == ResourceState::Creating))
    }

    /// `roots` and the CREATING resources of this region they reference,
    /// transitively (batch siblings: only they can reference a CREATING
    /// resource), once each, every one after those it references. Bounded
    /// by the batch limit.
    fn creating_targets_first(&self, roots: Vec<Resource>) -> Result<Vec<Resource>, Fault> {
        let state = self.state();
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        let mut stack: Vec<(Resource, bool)> = roots.into_iter().rev().map(|r| (r, false)).collect();
        while let Some((r, expanded)) = stack.pop() {
            if expanded {
                out.push(r);
                continue;
            }
            if seen.len() > self.limits.max_batch_create || !seen.insert(r.uid) {
                continue;
            }
            let local: Vec<Uid> = r
                .refs
                .values()
                .flatten()
                .filter(|t| t.name.region() == self.region.as_str() && !seen.contains(&t.uid))
                .map(|t| t.uid)
                .collect();
            stack.push((r, true));
            for uid in local {
                if let Some(t) = by_uid(&state, uid)?.filter(|t| t.state == ResourceState::Creating) {
                    stack.push((t, false));
                }
            }
        }
        Ok(out)
    }

    /// Updates a resource of this region. New cross-region references are
    /// committed first (with a durable intent) and then attached; an owner
    /// that refuses gets its reference taken back and the call fails; one
    /// that does not answer within `PEER_CALL_TIMEOUT`, or what is left of
    /// the client's `deadline`, leaves the update committed and its attach
    /// to the reconciler. Audited for `audit` in the step that commits it,
    /// which refuses an update forwarded by a node that gave up at
    /// `answer_by` past it (nothing committed).
    pub(crate) async fn update(
        &self,
        mut spec: ResourceSpec,
        etag: Option<String>,
        audit: crate::audit::AuditContext,
        deadline: &Deadline,
        answer_by: Option<Timestamp>,
    ) -> Result<Resource, Fault> {
        let held = match ResourceName::parse(&spec.name) {
            Ok(name) => self.state().get_resource(&name)?.map(|r| r.refs).unwrap_or_default(),
            Err(_) => BTreeMap::new(), // the core reports it
        };
        self.resolve_remote(std::slice::from_mut(&mut spec), &held, deadline)
            .await?;
        let refused = self.located(std::slice::from_ref(&spec));
        let updated = self
            .writer
            .update(spec, etag, Some(audit), answer_by)
            .await
            .map_err(&refused)?;
        match self.attach_pending(&updated, deadline).await? {
            Ok(r) => Ok(r),
            Err(e) if unanswered(&e) => {
                // Committed; confirmed later by the reconciler.
                // Every update meets it while an owner is away: one line a window.
                static ATTACH_DEFERRED: crate::log_throttle::Throttle =
                    crate::log_throttle::Throttle::new(crate::log_throttle::DEFAULT_WINDOW);
                if let Some(more) = ATTACH_DEFERRED.admit() {
                    warn!(region = %self.region, name = %updated.name, error = %e, suppressed = more.count(),
                        "update committed; its cross-region attach will be retried{more}");
                }
                Ok(updated)
            }
            Err(e) => Err(refused(e.into())),
        }
    }

    /// Deletes a resource of this region (or plans it: a dry run, then
    /// completed with every region's part; the regions that could not be
    /// asked come back with it). A delete without cascade first asks the
    /// regions of remote list owners whether they keep another target.
    ///
    /// Under a policy that may refuse, the delete is first checked over its
    /// whole closure (see [`Self::check_closure`]) and refused, with
    /// nothing written, when its principal may not change a member.
    ///
    /// With `expect_plan` (a dry run's token) the delete is bound to that
    /// plan: the same walk, made for it even when the policy allows
    /// everything, must find exactly that plan; and a cascade above
    /// `[limits] confirm_above` needs one (see `plan_bound.rs`).
    ///
    /// The regions asked before a delete without cascade are asked within
    /// what is left of the client's `deadline` (at most `PEER_CALL_TIMEOUT`).
    /// A delete forwarded by a node that gave up at `answer_by` is refused
    /// past it by its step (nothing starts).
    pub(crate) async fn delete(
        &self,
        mut req: DeleteRequest,
        expect_plan: Option<&str>,
        budget: std::time::Duration,
        deadline: &Deadline,
        audit: crate::audit::AuditContext,
        answer_by: Option<Timestamp>,
    ) -> Result<(DeleteOutcome, Vec<String>), Fault> {
        // An orphan delete refuses for no `cascade` referrer: nothing to ask.
        if !req.cascade && !req.orphan {
            let name = ResourceName::parse(&req.name).map_err(|e| CoreError::invalid("name", e.to_string()))?;
            req.remote_kept = self.remote_kept(&name, deadline).await?;
        }
        let cascade = req.cascade && !req.orphan;
        let principal = req.principal.clone();
        let root_denied = self.root_denials(&req)?;
        let for_plan = self.walks_for_plan(&req, expect_plan);
        if !req.dry_run && (for_plan || !self.authorizer.allows_everything()) {
            // One walk for both: the policy's members, then the plan.
            if let Some(walked) = self.check_closure(&req, root_denied.clone(), budget).await? {
                if for_plan {
                    self.check_walked(&req, expect_plan, &walked)?;
                }
            }
        }
        // A bounded delete is registered in every region first (issue 29,
        // `operation_control.rs`).
        self.register_bounded(&mut req, budget).await?;
        // A deletion that starts is audited (`delete`, `cascade` or
        // `orphan`) in its step; a dry run changes nothing and is not.
        match self.writer.delete(req, Some(audit), answer_by).await? {
            DeleteOutcome::DryRun(plan) => {
                let (mut plan, unreachable) = self.plan_everywhere(plan, cascade, &principal, budget).await;
                prepend_denials(&mut plan, root_denied);
                Ok((DeleteOutcome::DryRun(plan), unreachable))
            }
            other => Ok((other, Vec::new())),
        }
    }

    /// The verbs the root needs beyond `delete` (which the closure check
    /// decides with every member): `cascade` with a cascade, `orphan` with
    /// an orphan delete. Refusals, not errors, so that the check and the
    /// dry run list them with the members.
    fn root_denials(&self, req: &DeleteRequest) -> Result<Vec<PlannedDenial>, Fault> {
        if self.authorizer.allows_everything() {
            return Ok(Vec::new());
        }
        let name = ResourceName::parse(&req.name).map_err(|e| CoreError::invalid("name", e.to_string()))?;
        let verbs = [(req.cascade, Verb::Cascade), (req.orphan, Verb::Orphan)];
        Ok(verbs
            .into_iter()
            .filter(|(asked, _)| *asked)
            .filter_map(|(_, verb)| {
                let decision = self.authorizer.decide(&req.principal, verb, Target::Resource(&name));
                (!decision.allowed).then(|| PlannedDenial {
                    resource: name.clone(),
                    verb,
                    rule: decision.rule,
                })
            })
            .collect())
    }

    /// The closure check: the delete's dry run for its principal, every
    /// region deciding on its own members (`Plan::denied`), before anything
    /// is written. Any refusal (the root's own verbs included) is
    /// [`Fault::Denied`] listing the members; a region that cannot be asked
    /// is UNAVAILABLE (its members were not checked). A member refused
    /// after this check, by a policy changed meanwhile, is held BLOCKED by
    /// the cascade itself (`cascade_core::protocol::process_work`).
    ///
    /// Returns the merged plan it walked (None when the root is not ACTIVE:
    /// the writer's step answers), which a plan-bound delete checks.
    async fn check_closure(
        &self,
        req: &DeleteRequest,
        root_denied: Vec<PlannedDenial>,
        budget: std::time::Duration,
    ) -> Result<Option<Plan>, Fault> {
        let cascade = req.cascade && !req.orphan;
        let name = ResourceName::parse(&req.name).map_err(|e| CoreError::invalid("name", e.to_string()))?;
        // Read outside the writer (nothing is decided on its path): a root
        // that is missing, not this uid, or already leaving is the delete's
        // own answer to give.
        let root = self
            .state()
            .get_resource(&name)?
            .filter(|r| r.state == ResourceState::Active)
            .filter(|r| req.uid.is_none_or(|uid| uid == r.uid));
        let Some(root) = root else {
            return Ok(None);
        };
        let seeds = vec![RefTarget {
            name: root.name.clone(),
            uid: root.uid,
        }];
        let plan = self.plan_part(seeds, cascade, &req.principal)?;
        let (mut plan, unreachable) = self.plan_everywhere(plan, cascade, &req.principal, budget).await;
        if let Some(region) = unreachable.first() {
            return Err(CoreError::RegionUnavailable {
                region: region.clone(),
                reason: "its part of the closure could not be walked: its members could not be checked (against its policy, or a plan)".to_owned(),
            }
            .into());
        }
        prepend_denials(&mut plan, root_denied);
        if plan.denied.is_empty() {
            return Ok(Some(plan));
        }
        Err(Fault::Denied(crate::error::Denied {
            principal: req.principal.id.clone(),
            members: plan
                .denied
                .iter()
                .take(crate::error::Denied::MAX_MEMBERS)
                .map(|d| crate::error::DeniedMember {
                    region: d.resource.region().to_owned(),
                    name: d.resource.to_string(),
                    verb: d.verb,
                    rule: d.rule.clone(),
                })
                .collect(),
            more: plan.denied_more + plan.denied.len().saturating_sub(crate::error::Denied::MAX_MEMBERS) as u64,
        }))
    }

    /// This region's part of a dry run started elsewhere, with the members
    /// `principal` may not change under this region's policy.
    pub(crate) fn plan_part(&self, seeds: Vec<RefTarget>, cascade: bool, principal: &Principal) -> Result<Plan, Fault> {
        let schema = self.schema();
        Ok(peer::plan_from(
            &self.state(),
            self.read_ctx(&schema),
            seeds,
            cascade,
            Some(principal),
        )?)
    }

    /// Completes a local dry run with every region's part: regions are
    /// re-planned from every seed they were handed until nothing grows
    /// (see `cascade_core::plan`), then the parts are merged. Also returns
    /// the regions that could not be asked.
    async fn plan_everywhere(
        &self,
        plan: Plan,
        cascade: bool,
        principal: &Principal,
        budget: std::time::Duration,
    ) -> (Plan, Vec<String>) {
        let Some(root) = plan.deleted.first().cloned() else {
            return (plan, Vec::new());
        };
        let deadline = crate::clock::monotonic_now() + budget;
        let mut driver = PlanDriver::new(self.region.as_str(), root, plan);
        loop {
            let round = driver.next_round();
            if round.is_empty() {
                break;
            }
            // A round's regions at once, within what is left of the budget:
            // a region that does not answer in time is listed unreachable.
            let left = deadline.saturating_duration_since(crate::clock::monotonic_now());
            let parts = futures::future::join_all(round.iter().map(|(region, seeds)| async move {
                if region == self.region.as_str() {
                    self.plan_part(seeds.clone(), cascade, principal).ok()
                } else if left.is_zero() {
                    None
                } else {
                    self.peers.plan(region, seeds, cascade, principal, left).await
                }
            }))
            .await;
            for ((region, seeds), part) in round.into_iter().zip(parts) {
                driver.answer(&region, seeds, part);
            }
        }
        let unreachable: Vec<String> = driver.unreachable().map(str::to_owned).collect();
        (driver.finish(), unreachable)
    }

    /// For a delete without cascade: which of the target's `cascade`
    /// referrers in other regions keep another live target in their list
    /// (their regions answer; see `peer::keeps_another_target`). The core
    /// refuses the delete for every other remote `cascade` referrer. A
    /// region that cannot be asked makes the delete UNAVAILABLE: refusing
    /// would list dependents that may not be, accepting could cascade.
    async fn remote_kept(&self, name: &ResourceName, deadline: &Deadline) -> Result<BTreeSet<BackRefKey>, Fault> {
        let state = self.state();
        let Some(target) = state.get_resource(name)? else {
            return Ok(BTreeSet::new());
        };
        let mut by_region: BTreeMap<String, Vec<PeerBackRef>> = BTreeMap::new();
        for row in state.backrefs_of(target.uid)? {
            // Only a list owner can keep another owner: a single `cascade`
            // reference is a dependent whatever its region would say.
            let list_owner = self
                .schema()
                .reference(row.referrer.name.kind(), &row.field)
                .is_some_and(|r| r.many);
            if row.on_delete == OnDelete::Cascade && list_owner && row.referrer.name.region() != self.region.as_str() {
                by_region
                    .entry(row.referrer.name.region().to_owned())
                    .or_default()
                    .push(PeerBackRef::from(row));
            }
        }
        let mut kept = BTreeSet::new();
        for (region, rows) in by_region {
            for chunk in rows.chunks(self.limits.max_batch_create) {
                let answer = self
                    .peers
                    .keeps_another_target(&region, &self.region, chunk, deadline)
                    .await?;
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

    /// Every region of the cluster (the order of the parts is the core's).
    fn all_regions(&self) -> impl Iterator<Item = String> + '_ {
        self.peers
            .regions()
            .map(str::to_owned)
            .chain(std::iter::once(self.region.to_string()))
    }

    /// One region's part of an operation, as the assembler takes it. This
    /// node's own failures, and a part's refusal of the cursor
    /// (INVALID_ARGUMENT), are the caller's answer.
    async fn read_part(
        &self,
        id: OperationId,
        want: usize,
        region: &str,
        after: Option<&ResourceName>,
        first: &mut FirstRound,
        read_timeout: std::time::Duration,
    ) -> Result<PartAnswer, Fault> {
        if first.without_part.contains(region) {
            return Ok(PartAnswer::NoPart);
        }
        if first.unreachable.contains(region) {
            return Ok(PartAnswer::Unreachable);
        }
        if want == 0 {
            if let Some(read) = first.counters.remove(region) {
                return Ok(match read {
                    Some(page) => PartAnswer::Part(Box::new(page)),
                    None => PartAnswer::NoPart,
                });
            }
        }
        if region == self.region.as_str() {
            return match self.local_operation(id, want, after) {
                Ok(page) => Ok(PartAnswer::Part(Box::new(page))),
                Err(Fault::Refused(CoreError::OperationNotFound(_))) => Ok(PartAnswer::NoPart),
                Err(e) => Err(e),
            };
        }
        match self.peers.operation_part(region, id, want, after, read_timeout).await {
            Ok(Some(page)) => Ok(PartAnswer::Part(Box::new(page))),
            Ok(None) => Ok(PartAnswer::NoPart),
            Err(e) if e.refused_the_request() => Err(e.into()),
            Err(e) => {
                debug!(region = %self.region, part = %region, operation = %id, error = %e, "operation part not read");
                Ok(PartAnswer::Unreachable)
            }
        }
    }

    /// An operation with every region's part: counters summed, outcomes
    /// listed with the region they are in, unreachable regions named; a
    /// page of outcomes from `cursor` (see `cascade_core::operation_view`).
    pub(crate) async fn operation(
        &self,
        id: OperationId,
        page_size: usize,
        cursor: Option<OutcomesCursor>,
    ) -> Result<OperationView, Fault> {
        self.operation_within(id, page_size, cursor, OPERATION_READ_TIMEOUT)
            .await
    }

    /// [`Node::operation`], each read of another region's part bounded by
    /// `read_timeout` (a client's GetOperation derives it from its deadline).
    pub(crate) async fn operation_within(
        &self,
        id: OperationId,
        page_size: usize,
        cursor: Option<OutcomesCursor>,
        read_timeout: std::time::Duration,
    ) -> Result<OperationView, Fault> {
        let page_size = page_size.min(self.limits.max_page_size);
        let mut assembler = OperationAssembler::new(id, self.all_regions(), cursor, page_size)?;
        // Every peer at once first, counters only, under one deadline: a
        // region that does not answer it is not waited for again below, so
        // a stopped region costs the call one read timeout, not one each
        // time the page reaches it.
        let peers: Vec<String> = self.peers.regions().map(str::to_owned).collect();
        let probes = futures::future::join_all(
            peers
                .iter()
                .map(|region| self.peers.operation_part(region, id, 0, None, read_timeout)),
        )
        .await;
        let mut first = FirstRound::default();
        let mut parts = Vec::new();
        for (region, answer) in peers.into_iter().zip(probes) {
            match answer {
                Ok(read) => {
                    parts.extend(read.as_ref().map(|page| page.operation.clone()));
                    first.counters.insert(region, read);
                }
                Err(e) if e.refused_the_request() => {}
                Err(_) => {
                    first.unreachable.insert(region);
                }
            }
        }
        if let Ok(local) = self.local_operation(id, 0, None) {
            parts.push(local.operation);
        }
        // Once every part that could be read is finished, a region that
        // could not be asked holds no part unless it is the root's or a
        // part reached it (`cascade_core::closure`): the page goes past it
        // instead of ending before it, so the outcomes of the regions after
        // a stopped one that the cascade never touched are listed too. It
        // is still named as unreachable.
        let finished = parts.iter().all(|p| p.state != cascade_core::OperationState::Running);
        if finished {
            if let Some(root_region) = parts.first().map(|p| p.root.name.region().to_owned()) {
                let touched: BTreeSet<&String> = parts.iter().flat_map(|p| p.reached.iter()).collect();
                first.without_part = first
                    .unreachable
                    .iter()
                    .filter(|r| **r != root_region && !touched.contains(r))
                    .cloned()
                    .collect();
            }
        }
        while let Some(request) = assembler.next_request() {
            let answer = self
                .read_part(
                    id,
                    request.want,
                    &request.region,
                    request.after.as_ref(),
                    &mut first,
                    read_timeout,
                )
                .await?;
            assembler.answer(answer);
        }
        let mut view = assembler.finish()?;
        view.add_unreachable(first.without_part);
        Ok(view)
    }
}

/// Stored operations examined at most for one page of ListOperations.
pub(crate) const MAX_OPERATIONS_SCANNED: usize = 10_000;

/// One region's page of the operations whose root it owns
/// ([`Node::origin_operations`]).
#[derive(Debug, Default)]
pub(crate) struct OriginPage {
    /// Their ids, in the order they started (ids are time-ordered).
    pub ids: Vec<OperationId>,
    /// The last operation examined, when the table goes on after it.
    pub next: Option<OperationId>,
}

impl Node {
    /// Up to `limit` operations whose root this region owns (the origin's
    /// record; other regions' parts are read through it), after `after`,
    /// or from the first started at or after `from_ms` (ids are UUIDv7:
    /// their first six bytes are the start's unix milliseconds, so the
    /// walk starts there). At most [`MAX_OPERATIONS_SCANNED`] stored
    /// operations are examined; `next` says where to go on.
    pub(crate) fn origin_operations(
        &self,
        after: Option<OperationId>,
        from_ms: Option<u64>,
        limit: usize,
    ) -> Result<OriginPage, Fault> {
        let mut position: Option<Vec<u8>> = match (after, from_ms) {
            (Some(id), _) => Some(id.0.as_bytes().to_vec()),
            // The smallest id of that millisecond, less one: the scan is
            // after its key, and no real id is all zeros after the time.
            (None, Some(ms)) => {
                let mut key = [0u8; 16];
                key[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
                Some(key.to_vec())
            }
            (None, None) => None,
        };
        let state = self.state();
        let mut page = OriginPage::default();
        let mut scanned = 0;
        while page.ids.len() < limit && scanned < MAX_OPERATIONS_SCANNED {
            let chunk = (limit - page.ids.len()).max(64).min(MAX_OPERATIONS_SCANNED - scanned);
            let rows: Vec<cascade_core::model::Operation> =
                state.scan(crate::store::Table::Operations, &[], position.as_deref(), chunk)?;
            let Some(last) = rows.last() else {
                return Ok(page);
            };
            position = Some(last.id.0.as_bytes().to_vec());
            let full = rows.len() == chunk;
            for op in rows {
                scanned += 1;
                if op.root.name.region() == self.region.as_str() {
                    page.ids.push(op.id);
                    if page.ids.len() == limit {
                        // The table may go on: the next page starts after it.
                        page.next = Some(op.id);
                        return Ok(page);
                    }
                }
            }
            if !full {
                return Ok(page);
            }
        }
        page.next = position.and_then(|k| uuid::Uuid::from_slice(&k).ok()).map(OperationId);
        Ok(page)
    }
}

/// An owner that did not answer: unavailable, or not within the client's
/// deadline. Either leaves a committed reference to the reconciler, and
/// is the answer of a create that could not finish an earlier one.
fn unanswered(e: &CoreError) -> bool {
    matches!(
        e,
        CoreError::RegionUnavailable { .. } | CoreError::DeadlineExceeded { .. }
    )
}

/// The resource with this uid (through the uid index), in any state.
fn by_uid<S: StateRead + ?Sized>(s: &S, uid: Uid) -> Result<Option<Resource>, cascade_core::error::StorageError> {
    let Some(name) = s.name_of(uid)? else {
        return Ok(None);
    };
    Ok(s.resource(&name)?.filter(|r| r.uid == uid))
}

/// The root's own refusals first, then the members', within the bound a
/// plan lists (the rest counted).
fn prepend_denials(plan: &mut Plan, root: Vec<PlannedDenial>) {
    if root.is_empty() {
        return;
    }
    let mut denied = root;
    denied.append(&mut plan.denied);
    let most = cascade_core::protocol::MAX_DENIED_LISTED;
    if denied.len() > most {
        plan.denied_more += (denied.len() - most) as u64;
        denied.truncate(most);
    }
    plan.denied = denied;
}
