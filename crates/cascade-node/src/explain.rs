//! ExplainDeletion, as [`Node`] methods on core types: every region's
//! DELETING resources of one operation, gathered over `Peer.ExplainPart`,
//! what the blockers outside them are (asked of their regions), and the
//! core's [`cascade_core::explain`] to turn it into reasons and a tree.
//!
//! An explanation is what an operator asks for when something is wrong,
//! often because a region is: it answers within one budget ([`EXPLAIN_BUDGET`]
//! or less, as the API derives it from the caller's deadline), with what
//! came back in time. Every peer's part is asked at once, within the first
//! [`PARTS_TENTHS`] tenths of the budget; then the blockers outside the
//! operation are looked up at once (at most [`MAX_BLOCKER_LOOKUPS`],
//! [`LOOKUP_CONCURRENCY`] at a time) within the rest, except in regions that
//! did not give their part (those blockers are unknown). A region that did
//! not answer is listed unreachable, with why and when this node last heard
//! from it (its link's last successful exchange).
//!
//! A region's part ([`ExplainPart`]) and a blocker's lookup
//! ([`LookupAnswer`]) are the port's types (`crate::peers`): this region's
//! own part is built here, every other one comes back from the port.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cascade_core::explain::{self, BlockerState, Explained, Part};
use cascade_core::model::{DeletionStatus as Held, RefTarget, ResourceState};
use cascade_core::{CoreError, OperationId, ResourceName, Timestamp};
use futures::StreamExt;
use tokio::time::Instant;

use crate::admin::DeletionFilter;
use crate::clock::monotonic_now;
use crate::error::Fault;
use crate::node::Node;
use crate::peers::{ExplainPart, LookupAnswer, RemoteError};

/// How long an explanation takes at most when the caller's deadline leaves
/// more (or the caller has none): a frozen region costs this much, no more.
pub(crate) const EXPLAIN_BUDGET: Duration = Duration::from_secs(2);

/// The tenths of the budget the peers have to give their parts; the
/// blocker lookups have the rest.
const PARTS_TENTHS: u32 = 6;

/// Blockers outside the operation asked about, at most, per explanation.
pub(crate) const MAX_BLOCKER_LOOKUPS: usize = 100;

/// Blocker lookups in flight at once.
pub(crate) const LOOKUP_CONCURRENCY: usize = 16;

/// What a deletion waits on, across regions.
#[derive(Debug, Clone)]
pub(crate) struct Explanation {
    pub operation: OperationId,
    pub root: Option<RefTarget>,
    pub deletions: Vec<Explained>,
    /// The regions whose part is missing, by name.
    pub unreachable: BTreeMap<String, Unreachable>,
    pub truncated: bool,
    /// When it was made (this node's clock), to read `last_contact` against.
    pub made_at: Timestamp,
}

/// A region whose part of an explanation is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unreachable {
    /// Why: "did not answer within 1.2s", or what asking it failed with.
    pub reason: String,
    /// The last successful exchange of this node's link with it; None when
    /// there was none since this node started.
    pub last_contact: Option<Timestamp>,
}

impl Node {
    /// This region's part of operation `op`'s explanation.
    pub(crate) fn explain_part(&self, op: OperationId) -> Result<ExplainPart, Fault> {
        let filter = DeletionFilter {
            operation: Some(op),
            ..DeletionFilter::default()
        };
        let (entries, more) = self.list_deletions(&filter, self.limits.max_page_size, None)?;
        let root = self.state().get_operation(op)?.map(|o| o.root);
        Ok(ExplainPart {
            root,
            parts: entries
                .into_iter()
                .map(|e| Part {
                    resource: e.resource,
                    record: e.record,
                })
                .collect(),
            truncated: more.is_some(),
        })
    }

    /// Explains the operation that is deleting `name`, a resource of this
    /// region, within `budget` (see [`Node::explain`]).
    pub(crate) async fn explain_resource(&self, name: &ResourceName, budget: Duration) -> Result<Explanation, Fault> {
        let state = self.state();
        let resource = state
            .get_resource(name)?
            .filter(|r| r.state != ResourceState::Creating)
            .ok_or_else(|| CoreError::NotFound(name.clone()))?;
        let record = match state.get_deletion(resource.uid)? {
            Some(record) if resource.state == ResourceState::Deleting => record,
            _ => {
                return Err(CoreError::NoSuchDeletion {
                    name: name.clone(),
                    why: "is not being deleted: there is no deletion to explain".to_owned(),
                }
                .into())
            }
        };
        self.explain(record.operation, budget).await
    }

    /// Explains operation `op` within `budget`: every region's part, the
    /// blockers outside it, and the reasons, from what came back in time
    /// (see the module doc).
    pub(crate) async fn explain(&self, op: OperationId, budget: Duration) -> Result<Explanation, Fault> {
        let start = monotonic_now();
        let deadline = start + budget;
        let share = budget * PARTS_TENTHS / 10;
        let parts_until = start + share;
        let own = self.explain_part(op)?;
        let asked = self.peers.regions().map(|region| async move {
            // The call's own deadline is the whole rest, so the round's
            // timer is the one that fires and says so.
            let call = self
                .peers
                .explain_part(region, op, deadline.saturating_duration_since(monotonic_now()));
            let answer = match tokio::time::timeout_at(parts_until, call).await {
                Ok(Ok(part)) => Ok(part),
                Ok(Err(e)) => Err(why_unreachable(e)),
                Err(_) => Err(format!("did not answer within {share:?}")),
            };
            (region, answer)
        });
        let answers = futures::future::join_all(asked).await;
        let mut unreachable = BTreeMap::new();
        let mut gathered = vec![own];
        for (region, answer) in answers {
            match answer {
                Ok(part) => gathered.push(part),
                Err(reason) => {
                    let last_contact = self
                        .metrics
                        .last_contact(region)
                        .map(|seconds| Timestamp((seconds * 1000.0) as u64));
                    unreachable.insert(region.to_owned(), Unreachable { reason, last_contact });
                }
            }
        }
        let root = gathered.iter().find_map(|p| p.root.clone());
        let truncated = gathered.iter().any(|p| p.truncated);
        let parts: Vec<Part> = gathered.into_iter().flat_map(|p| p.parts).collect();
        if root.is_none() && parts.is_empty() && unreachable.is_empty() {
            return Err(CoreError::OperationNotFound(op.to_string()).into());
        }
        let silent: BTreeSet<String> = unreachable.keys().cloned().collect();
        let blockers = self.blocker_states(&parts, &silent, deadline).await?;
        let now = self.clock.now();
        Ok(Explanation {
            operation: op,
            root,
            deletions: explain::explain(parts, &blockers, &silent, now),
            unreachable,
            truncated,
            made_at: now,
        })
    }

    /// Whether each blocker outside the operation is being deleted, lives,
    /// or is gone, as its own region says by `deadline`: asked all at once
    /// ([`LOOKUP_CONCURRENCY`] in flight), except in the `silent` regions,
    /// which did not give their part (their blockers are unknown, as are
    /// those whose answer did not come in time).
    async fn blocker_states(
        &self,
        parts: &[Part],
        silent: &BTreeSet<String>,
        deadline: Instant,
    ) -> Result<BTreeMap<ResourceName, BlockerState>, Fault> {
        let closure: BTreeSet<&ResourceName> = parts.iter().map(|p| &p.resource.name).collect();
        let outside = parts
            .iter()
            .filter_map(|p| match &p.record.status {
                Held::Blocked { blockers, .. } => Some(blockers),
                _ => None,
            })
            .flatten()
            .filter(|b| !b.referrer_deleting && !closure.contains(&b.referrer))
            .map(|b| b.referrer.clone())
            .collect::<BTreeSet<_>>();
        let mut states = BTreeMap::new();
        let mut remote = Vec::new();
        for name in outside.into_iter().take(MAX_BLOCKER_LOOKUPS) {
            if name.region() == self.region.as_str() {
                let state = match self.state().get_resource(&name)? {
                    Some(r) if r.state == ResourceState::Deleting => BlockerState::Deleting,
                    Some(_) => BlockerState::Live,
                    None => BlockerState::Absent,
                };
                states.insert(name, state);
            } else if silent.contains(name.region()) {
                states.insert(name, BlockerState::Unknown);
            } else {
                remote.push(name);
            }
        }
        let looked_up: Vec<(ResourceName, BlockerState)> = futures::stream::iter(remote)
            .map(|name| async move {
                let left = deadline.saturating_duration_since(monotonic_now());
                let state = if left.is_zero() {
                    BlockerState::Unknown
                } else {
                    match self.peers.lookup(&name, left).await {
                        Ok(LookupAnswer::Live(_)) => BlockerState::Live,
                        Ok(LookupAnswer::Deleting) => BlockerState::Deleting,
                        Ok(LookupAnswer::Absent) => BlockerState::Absent,
                        Err(_) => BlockerState::Unknown,
                    }
                };
                (name, state)
            })
            .buffer_unordered(LOOKUP_CONCURRENCY)
            .collect()
            .await;
        states.extend(looked_up);
        Ok(states)
    }
}

/// Why a region's part is missing, when asking it failed before the round's
/// time was up.
fn why_unreachable(e: RemoteError) -> String {
    match e {
        RemoteError::Unreachable(CoreError::RegionUnavailable { reason, .. }) => {
            format!("could not be asked: {reason}")
        }
        other => other.to_string(),
    }
}
