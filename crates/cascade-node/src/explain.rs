//! ExplainDeletion, as [`Node`] methods on core types: every region's
//! DELETING resources of one operation, gathered over `Peer.ExplainPart`,
//! what the blockers outside them are (asked of their regions), and the
//! core's [`cascade_core::explain`] to turn it into reasons and a tree.
//!
//! A region's part ([`ExplainPart`]) and a blocker's lookup
//! ([`LookupAnswer`]) are the port's types (`crate::peers`): this region's
//! own part is built here, every other one comes back from the port.

use std::collections::{BTreeMap, BTreeSet};

use cascade_core::explain::{self, BlockerState, Explained, Part};
use cascade_core::model::{DeletionStatus as Held, RefTarget, ResourceState};
use cascade_core::{CoreError, OperationId, ResourceName};

use crate::admin::DeletionFilter;
use crate::error::Fault;
use crate::node::Node;
use crate::peers::{ExplainPart, LookupAnswer, PEER_CALL_TIMEOUT};

/// Blockers outside the operation asked about, at most, per explanation.
const MAX_BLOCKER_LOOKUPS: usize = 100;

/// What a deletion waits on, across regions.
#[derive(Debug, Clone)]
pub(crate) struct Explanation {
    pub operation: OperationId,
    pub root: Option<RefTarget>,
    pub deletions: Vec<Explained>,
    pub unreachable: BTreeSet<String>,
    pub truncated: bool,
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

    /// Explains the operation that is deleting `name`, a resource of this region.
    pub(crate) async fn explain_resource(&self, name: &ResourceName) -> Result<Explanation, Fault> {
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
        self.explain(record.operation).await
    }

    /// Explains operation `op`: every region's part, the blockers outside
    /// it, and the reasons.
    pub(crate) async fn explain(&self, op: OperationId) -> Result<Explanation, Fault> {
        let mut unreachable = BTreeSet::new();
        let mut gathered = vec![self.explain_part(op)?];
        for region in self.peers.regions().map(str::to_owned).collect::<Vec<_>>() {
            match self.peers.explain_part(&region, op).await {
                Ok(part) => gathered.push(part),
                Err(_) => {
                    unreachable.insert(region);
                }
            }
        }
        let root = gathered.iter().find_map(|p| p.root.clone());
        let truncated = gathered.iter().any(|p| p.truncated);
        let parts: Vec<Part> = gathered.into_iter().flat_map(|p| p.parts).collect();
        if root.is_none() && parts.is_empty() && unreachable.is_empty() {
            return Err(CoreError::OperationNotFound(op.to_string()).into());
        }
        let blockers = self.blocker_states(&parts).await?;
        Ok(Explanation {
            operation: op,
            root,
            deletions: explain::explain(parts, &blockers, &unreachable),
            unreachable,
            truncated,
        })
    }

    /// Whether each blocker outside the operation is being deleted, lives,
    /// or is gone, as its own region says.
    async fn blocker_states(&self, parts: &[Part]) -> Result<BTreeMap<ResourceName, BlockerState>, Fault> {
        let closure: BTreeSet<&ResourceName> = parts.iter().map(|p| &p.resource.name).collect();
        let mut states = BTreeMap::new();
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
        for name in outside.into_iter().take(MAX_BLOCKER_LOOKUPS) {
            let state = if name.region() == self.region.as_str() {
                match self.state().get_resource(&name)? {
                    Some(r) if r.state == ResourceState::Deleting => BlockerState::Deleting,
                    Some(_) => BlockerState::Live,
                    None => BlockerState::Absent,
                }
            } else {
                match self.peers.lookup(&name, PEER_CALL_TIMEOUT).await {
                    Ok(LookupAnswer::Live(_)) => BlockerState::Live,
                    Ok(LookupAnswer::Deleting) => BlockerState::Deleting,
                    Ok(LookupAnswer::Absent) => BlockerState::Absent,
                    Err(_) => BlockerState::Unknown,
                }
            };
            states.insert(name, state);
        }
        Ok(states)
    }
}
