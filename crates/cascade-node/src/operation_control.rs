//! Budgets and controls of running operations across regions (issue 29):
//! the flows around the core's `protocol::control` steps.
//!
//! - A bounded delete (`max_deletions` or a rate) registers its operation
//!   in every other region before its step ([`Node::register_bounded`]),
//!   so no region ever spreads it unbounded: a region that cannot be told
//!   refuses the delete (UNAVAILABLE, nothing written anywhere but the
//!   empty, finished parts of the regions that were told).
//! - The root's region owns the budget; a region whose cascade needs some
//!   says so in its work report, and the reconciler leases it
//!   ([`lease_budgets`], `Peer.BudgetLease`, each call within
//!   [`CONTROL_CALL_TIMEOUT`]). A root region that cannot be asked leases
//!   nothing: the members wait, BLOCKED "waiting for a budget lease".
//! - Pause, resume and cancel are carried out by the root's region and
//!   told to every other region of the cluster (a superset of those the
//!   cascade reached, so a part that starts later starts paused or
//!   cancelled). A region that cannot be told is named in the answer and
//!   told again by the reconciler ([`deliver_controls`]) until it answers.

use std::time::Duration;

use cascade_core::model::{Operation, ResourceState};
use cascade_core::protocol::{self, AdminRequest, BudgetGrant, Control, DeleteRequest, Step};
use cascade_core::state::WriteSet;
use cascade_core::{CoreError, OperationId, RefTarget, ResourceName, Timestamp};
use tracing::{debug, info, warn};

use crate::audit::AuditContext;
use crate::error::Fault;
use crate::log_throttle::Throttle;
use crate::node::Node;
use crate::peers::{ControlAction, ControlToDeliver, RelayedCode, RemoteError};

/// Each call to another region about an operation's budget or controls:
/// within the caller's own deadline too, when it leaves less.
pub(crate) const CONTROL_CALL_TIMEOUT: Duration = Duration::from_secs(2);

impl Node {
    /// Before a bounded delete's step: mints its operation id and registers
    /// the operation in every other region. Nothing for a dry run, an
    /// unbounded delete, or a root that is not there to delete (the step
    /// gives that answer).
    pub(crate) async fn register_bounded(&self, req: &mut DeleteRequest, budget: Duration) -> Result<(), Fault> {
        if req.dry_run || !req.bounds.any() {
            return Ok(());
        }
        req.bounds.check()?;
        let name = ResourceName::parse(&req.name).map_err(|e| CoreError::invalid("name", e.to_string()))?;
        let root = self
            .state()
            .get_resource(&name)?
            .filter(|r| r.state == ResourceState::Active)
            .filter(|r| req.uid.is_none_or(|uid| uid == r.uid));
        let Some(root) = root else {
            return Ok(());
        };
        let root = RefTarget {
            name: root.name,
            uid: root.uid,
        };
        // The writer's id source mints it (a step that writes nothing).
        let id = self
            .writer
            .apply(|_, _, ids| {
                Ok(Step {
                    value: OperationId(ids.next_uuid()),
                    writes: WriteSet::default(),
                })
            })
            .await?;
        let deadline = budget.min(CONTROL_CALL_TIMEOUT);
        let regions: Vec<String> = self.peers.regions().map(str::to_owned).collect();
        let action = ControlAction::Register(req.bounds);
        let who = req.principal.id.clone();
        let answers = futures::future::join_all(regions.iter().map(|region| {
            self.peers
                .operation_control(region, id, action, &root, &who, "", deadline)
        }))
        .await;
        let untold: Vec<String> = regions
            .into_iter()
            .zip(answers)
            .filter_map(|(region, answer)| answer.err().map(|e| format!("{region} ({e})")))
            .collect();
        if !untold.is_empty() {
            return Err(CoreError::RegionUnavailable {
                region: untold.join(", "),
                reason: "a delete with max_deletions or a rate registers its operation in every region before it \
                         starts, and this region could not be told; nothing was deleted"
                    .to_owned(),
            }
            .into());
        }
        req.operation_id = Some(id);
        Ok(())
    }

    /// Pauses, resumes or cancels an operation: its root's region (this
    /// one) first, audited for `audit`, then every other region. Returns
    /// this region's part and the regions that could not be told (told
    /// again by the reconciler). Forwarded by a node that gave up at
    /// `answer_by`, refused past it, changing nothing anywhere.
    pub(crate) async fn control_operation(
        &self,
        id: OperationId,
        control: Control,
        req: AdminRequest,
        audit: AuditContext,
        deadline: Duration,
        answer_by: Option<Timestamp>,
    ) -> Result<(Operation, Vec<String>), Fault> {
        let (who, reason) = (req.who.clone(), req.reason.clone());
        let part = self
            .writer
            .apply_audited(
                move |s, c, ids| {
                    let call = control.action();
                    crate::peers::still_awaited(answer_by, c.now, c.region.as_str(), call)?;
                    protocol::control_operation(s, c, ids, id, control, None, req)
                },
                audit,
                |_| Vec::new(),
            )
            .await?;
        let deliver = ControlToDeliver {
            control,
            root: part.root.clone(),
            who,
            reason,
        };
        let regions: Vec<String> = self.peers.regions().map(str::to_owned).collect();
        let deadline = deadline.min(CONTROL_CALL_TIMEOUT);
        let answers =
            futures::future::join_all(regions.iter().map(|region| self.tell(region, id, &deliver, deadline))).await;
        let mut untold = Vec::new();
        for (region, told) in regions.into_iter().zip(answers) {
            if let Ok(mut owed) = self.undelivered_controls.lock() {
                if told {
                    owed.remove(&(id, region.clone()));
                } else {
                    // The latest control wins: a resume replaces a pause owed.
                    owed.insert((id, region.clone()), deliver.clone());
                }
            }
            if !told {
                untold.push(region);
            }
        }
        Ok((part, untold))
    }

    /// Tells `region` one control; false when it could not be asked (a
    /// refusal, such as a part that ended, counts as told).
    async fn tell(&self, region: &str, id: OperationId, deliver: &ControlToDeliver, deadline: Duration) -> bool {
        let action = ControlAction::Apply(deliver.control);
        match self
            .peers
            .operation_control(
                region,
                id,
                action,
                &deliver.root,
                &deliver.who,
                &deliver.reason,
                deadline,
            )
            .await
        {
            Ok(()) => true,
            Err(RemoteError::Answered(s)) if s.code != RelayedCode::Unavailable => {
                debug!(region, operation = %id, answer = %s.message, "region refused the control");
                true
            }
            Err(e) => {
                debug!(region, operation = %id, error = %e, "region could not be told the control");
                false
            }
        }
    }

    /// `Peer.OperationControl`: what the root's region tells this one.
    pub(crate) async fn apply_peer_control(
        &self,
        id: OperationId,
        action: ControlAction,
        root: Option<RefTarget>,
        who: String,
        reason: String,
    ) -> Result<Operation, Fault> {
        match action {
            ControlAction::Register(bounds) => {
                let root = root.ok_or_else(|| CoreError::invalid("root", "a registration names the root"))?;
                self.writer
                    .apply(move |s, c, _| protocol::register_operation(s, c, id, root, bounds))
                    .await?;
            }
            ControlAction::Apply(control) => {
                let req = AdminRequest {
                    who,
                    action: control.action().to_owned(),
                    target: id.to_string(),
                    reason,
                };
                self.writer
                    .apply(move |s, c, ids| protocol::control_operation(s, c, ids, id, control, root, req))
                    .await?;
            }
        }
        Ok(self
            .state()
            .get_operation(id)?
            .ok_or_else(|| CoreError::OperationNotFound(id.to_string()))?)
    }

    /// `Peer.BudgetLease` at the root's region.
    pub(crate) async fn grant_budget(&self, id: OperationId, wanted: u64) -> Result<BudgetGrant, Fault> {
        self.writer
            .apply(move |s, c, _| protocol::grant_budget(s, c, id, wanted))
            .await
    }

    /// Admin.ExtendBudget at the root's region, audited.
    pub(crate) async fn extend_budget(
        &self,
        id: OperationId,
        max_deletions: u64,
        req: AdminRequest,
        audit: AuditContext,
        answer_by: Option<Timestamp>,
    ) -> Result<Operation, Fault> {
        self.writer
            .apply_audited(
                move |s, c, ids| {
                    // Forwarded by a node that gave up: refused, as nothing.
                    crate::peers::still_awaited(answer_by, c.now, c.region.as_str(), "ExtendBudget")?;
                    protocol::extend_budget(s, c, ids, id, max_deletions, req)
                },
                audit,
                |_| Vec::new(),
            )
            .await
    }
}

/// The reconciler's turn: leases for the cascades waiting on one, then
/// the controls other regions are still owed.
pub(crate) async fn reconcile(node: &Node, failed: &Throttle) {
    lease_budgets(node, failed).await;
    deliver_controls(node).await;
}

/// Asks the root's region of each bounded operation this region's
/// cascade waits on for budget, and takes what it grants. A root region
/// that cannot be asked grants nothing: the members keep waiting (their
/// reason says from which region), and the writer asks again at their
/// next look.
async fn lease_budgets(node: &Node, failed: &Throttle) {
    let wants: Vec<protocol::LeaseWanted> = match node.budget_wants.lock() {
        Ok(mut wants) => std::mem::take(&mut *wants).into_values().collect(),
        Err(_) => return,
    };
    for want in wants {
        let id = want.operation;
        let grant = match node
            .peers
            .budget_lease(&want.root_region, id, &node.region, want.wanted, CONTROL_CALL_TIMEOUT)
            .await
        {
            Ok(grant) => grant,
            Err(e) => {
                if let Some(more) = failed.admit() {
                    warn!(region = %node.region, operation = %id, root_region = %want.root_region, error = %e,
                        suppressed = more.count(), "no budget lease: the operation's members here wait{more}");
                }
                continue;
            }
        };
        match node
            .writer
            .apply(move |s, c, _| protocol::accept_budget_lease(s, c, id, grant))
            .await
        {
            Ok(()) => {
                failed.reset();
                info!(region = %node.region, operation = %id, granted = grant.granted, used = grant.used,
                    max = grant.max_deletions, "budget leased");
            }
            Err(e) => {
                if let Some(more) = failed.admit() {
                    warn!(region = %node.region, operation = %id, error = %e, suppressed = more.count(),
                        "a budget lease could not be recorded (it is spent at the root's region){more}");
                }
            }
        }
    }
}

/// Tells again the regions a pause, resume or cancel could not reach.
async fn deliver_controls(node: &Node) {
    let owed: Vec<((OperationId, String), ControlToDeliver)> = match node.undelivered_controls.lock() {
        Ok(owed) => owed.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        Err(_) => return,
    };
    for ((id, region), deliver) in owed {
        if node.tell(&region, id, &deliver, CONTROL_CALL_TIMEOUT).await {
            if let Ok(mut owed) = node.undelivered_controls.lock() {
                // Unless a later control replaced it meanwhile.
                if owed
                    .get(&(id, region.clone()))
                    .is_some_and(|d| d.control == deliver.control)
                {
                    owed.remove(&(id, region.clone()));
                }
            }
            info!(region = %region, operation = %id, control = deliver.control.action(), "control delivered late");
        }
    }
}
