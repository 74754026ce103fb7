//! The cross-region flows of the client API: creates and updates whose
//! references reach other regions, dry runs and operations that span
//! regions.
//!
//! A create with a reference into another region (seed 002, DESIGN's
//! CREATING state):
//! 1. resolve each remote target's uid at its owner (`Peer.Lookup`, which
//!    answers NOT_FOUND for a DELETING target: seed 000);
//! 2. write the resource durably as CREATING, with its mirror rows;
//! 3. `Peer.Attach` at every owner;
//! 4. ACTIVE — or, if an owner refused or a target was reported DELETING
//!    meanwhile, removed, with releases queued for whatever was attached.
//!
//! A crash between 2 and 4 leaves a `pending_attach` row; the reconciler
//! (see `links.rs`) repeats 3–4, so the resource ends ACTIVE with its
//! back-references or gone without them.

use std::collections::{BTreeMap, BTreeSet};

use cascade_core::model::{Resource, ResourceState};
use cascade_core::peer::{self, PeerBackRef};
use cascade_core::plan::PlanDriver;
use cascade_core::protocol::{Plan, ResourceSpec};
use cascade_core::{BackRefKey, CoreError, OnDelete, OperationId, RefTarget, ResourceName, Uid};
use cascade_proto::convert;
use cascade_proto::v1;
use tonic::{Code, Status};
use tracing::{info, warn};

use crate::peer_service::read_ctx;
use crate::peers::{unavailable, PEER_CALL_TIMEOUT};
use crate::service::{core_status, store_status, writer_status, ResourcesService};

impl ResourcesService {
    /// The uid of a live resource of another region, asked of its owner.
    async fn lookup(&self, name: &ResourceName, field: &str) -> Result<Uid, CoreError> {
        let region = name.region();
        let mut peer = self.peers.peer(region)?;
        let call = peer.lookup(v1::LookupRequest { name: name.to_string() });
        match tokio::time::timeout(PEER_CALL_TIMEOUT, call).await {
            Ok(Ok(r)) => Uid::parse(&r.into_inner().uid).map_err(|e| CoreError::RegionUnavailable {
                region: region.to_owned(),
                reason: format!("bad uid in lookup answer: {e}"),
            }),
            Ok(Err(s)) if s.code() == Code::NotFound => Err(CoreError::TargetNotFound {
                field: field.to_owned(),
                target: name.clone(),
            }),
            Ok(Err(s)) => Err(unavailable(region, &s)),
            Err(_) => Err(CoreError::RegionUnavailable {
                region: region.to_owned(),
                reason: "lookup timed out".into(),
            }),
        }
    }

    /// Fills in the uid of every remote target the client did not pin.
    /// `held` are the targets the resource already holds (kept as they are).
    async fn resolve_remote(
        &self,
        spec: &mut ResourceSpec,
        held: &BTreeMap<String, Vec<RefTarget>>,
    ) -> Result<(), CoreError> {
        for (field, targets) in spec.refs.iter_mut() {
            let targets_len = targets.len();
            for (i, t) in targets.iter_mut().enumerate() {
                let Ok(name) = ResourceName::parse(&t.name) else {
                    continue;
                }; // the core reports it
                if name.region() == self.region.as_str() || t.uid.is_some() {
                    continue;
                }
                if !self.peers.knows(name.region()) {
                    return Err(CoreError::invalid(
                        format!("refs.{field}"),
                        format!(
                            "{name}: region {} is not part of this cluster (peers: {})",
                            name.region(),
                            self.peers.regions().collect::<Vec<_>>().join(", ")
                        ),
                    ));
                }
                if let Some(kept) = held.get(field).and_then(|h| h.iter().find(|h| h.name == name)) {
                    t.uid = Some(kept.uid);
                    continue;
                }
                let at = if targets_len > 1 {
                    format!("refs.{field}[{i}]")
                } else {
                    format!("refs.{field}")
                };
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
                match tokio::time::timeout(PEER_CALL_TIMEOUT, peer.attach(req)).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(s))
                        if matches!(
                            s.code(),
                            Code::NotFound | Code::FailedPrecondition | Code::InvalidArgument
                        ) =>
                    {
                        return Err(CoreError::AttachRefused {
                            region,
                            reason: s.message().to_owned(),
                        });
                    }
                    Ok(Err(s)) => return Err(unavailable(&region, &s)),
                    Err(_) => {
                        return Err(CoreError::RegionUnavailable {
                            region,
                            reason: "attach timed out".into(),
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
        for spec in &mut specs {
            self.resolve_remote(spec, &BTreeMap::new()).await.map_err(core_status)?;
        }
        let created = self
            .writer
            .create(specs)
            .await
            .map_err(writer_status)?
            .map_err(core_status)?;
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
            .map_err(core_status)
    }

    /// Updates a resource of this region. New cross-region references are
    /// committed first (with a durable intent) and then attached; an owner
    /// that refuses gets its reference taken back and the call fails.
    pub(crate) async fn update_flow(&self, mut spec: ResourceSpec, etag: Option<String>) -> Result<Resource, Status> {
        let name =
            ResourceName::parse(&spec.name).map_err(|e| core_status(CoreError::invalid("name", e.to_string())))?;
        let held = self
            .state()
            .get_resource(&name)
            .map_err(store_status)?
            .map(|r| r.refs)
            .unwrap_or_default();
        self.resolve_remote(&mut spec, &held).await.map_err(core_status)?;
        let updated = self
            .writer
            .update(spec, etag)
            .await
            .map_err(writer_status)?
            .map_err(core_status)?;
        match self.attach_pending(&updated).await? {
            Ok(r) => Ok(r),
            Err(e @ CoreError::RegionUnavailable { .. }) => {
                // Committed; confirmed later by the reconciler.
                warn!(region = %self.region, name = %updated.name, error = %e, "update committed; its cross-region attach will be retried");
                Ok(updated)
            }
            Err(e) => Err(core_status(e)),
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
            if row.on_delete == OnDelete::Cascade && row.referrer.name.region() != self.region.as_str() {
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
                let answer = match tokio::time::timeout(PEER_CALL_TIMEOUT, peer.keeps_another_target(req)).await {
                    Ok(Ok(r)) => r.into_inner().standing,
                    Ok(Err(s)) => return Err(core_status(unavailable(&region, &s))),
                    Err(_) => {
                        return Err(core_status(CoreError::RegionUnavailable {
                            region,
                            reason: "asking whether list owners keep another owner timed out".into(),
                        }))
                    }
                };
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
        let answer = tokio::time::timeout(PEER_CALL_TIMEOUT, peer.plan(req))
            .await
            .ok()?
            .ok()?;
        convert::plan_from(answer.into_inner()).ok()
    }

    /// An operation with every region's part: counters summed, outcomes
    /// listed with the region they are in, unreachable regions named.
    pub(crate) async fn operation(
        &self,
        id: OperationId,
        page_size: usize,
        page_token: &str,
    ) -> Result<v1::Operation, Status> {
        let mut parts: Vec<(String, v1::Operation)> = Vec::new();
        match self.local_operation(id, page_size, page_token) {
            Ok(op) => parts.push((self.region.to_string(), op)),
            Err(s) if s.code() == Code::NotFound => {}
            Err(s) => return Err(s),
        }
        let mut unreachable = Vec::new();
        for region in self.peers.regions() {
            let Ok(mut peer) = self.peers.peer(region) else {
                continue;
            };
            let req = v1::GetOperationRequest {
                id: id.to_string(),
                outcomes_page_size: page_size as u32,
                outcomes_page_token: String::new(),
            };
            match tokio::time::timeout(PEER_CALL_TIMEOUT, peer.operation_part(req)).await {
                Ok(Ok(op)) => parts.push((region.to_owned(), op.into_inner())),
                Ok(Err(s)) if s.code() == Code::NotFound => {}
                _ => unreachable.push(region.to_owned()),
            }
        }
        if parts.is_empty() {
            return Err(if unreachable.is_empty() {
                core_status(CoreError::OperationNotFound(id.to_string()))
            } else {
                Status::unavailable(format!(
                    "operation {id} not found here; regions {} could not be asked",
                    unreachable.join(", ")
                ))
            });
        }
        // The origin's part (its root is its own) leads.
        parts.sort_by_key(|(region, op)| {
            op.root
                .as_ref()
                .is_none_or(|r| !r.name.starts_with(&format!("{region}/")))
        });
        let mut merged = parts[0].1.clone();
        let mut progress = v1::Progress::default();
        let mut any_running = false;
        let mut any_failed = false;
        let mut outcomes = Vec::new();
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
            outcomes.extend(part.outcomes.iter().cloned());
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
        merged.unreachable_regions = unreachable;
        Ok(merged)
    }
}
