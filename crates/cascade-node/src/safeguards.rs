//! What holds or allows a change of one resource, as `Node` methods: the
//! policy's decision for a principal (issue 27), liens (seed 000's
//! protection against deletion) and finalizer controllers' answers (seed
//! 004), each audited in the step that makes the change.
//!
//! A feature module above the spine (`node.rs`), like `cluster.rs`.

use cascade_core::model::Resource;
use cascade_core::protocol::FinalizerReport;
use cascade_core::Timestamp;

use crate::audit::{AuditContext, Change};
use crate::error::Fault;
use crate::node::Node;
use crate::peers::still_awaited;

/// The audit log's line for one resource a step changed.
fn changed(action: &'static str, r: &Resource) -> Vec<Change> {
    vec![Change {
        action,
        target: r.name.to_string(),
    }]
}

impl Node {
    /// May `principal` do `verb` to `target` under this region's policy in
    /// force? The decision (with the rule that allowed it) for the audit
    /// log, or [`Fault::Denied`] naming the member and the missing verb.
    /// In memory and cheap: callers ask before the writer's step, never in it.
    pub(crate) fn authorize(
        &self,
        principal: &cascade_core::auth::Principal,
        verb: cascade_core::auth::Verb,
        target: cascade_core::auth::Target<'_>,
    ) -> Result<cascade_core::auth::Decision, Fault> {
        let decision = self.authorizer.decide(principal, verb, target);
        if decision.allowed {
            return Ok(decision);
        }
        let (region, name) = match target {
            cascade_core::auth::Target::Resource(name) => (name.region().to_string(), name.to_string()),
            cascade_core::auth::Target::Region { region, .. } => (region.to_string(), String::new()),
        };
        Err(Fault::Denied(crate::error::Denied::one(
            &principal.id,
            &region,
            &name,
            verb,
            &decision.rule,
        )))
    }

    /// Places a lien on a resource of this region (see `protocol::lien`);
    /// audited for `audit` in the same step. Like every change of this
    /// module, refused past `answer_by`, changing nothing, when a node that
    /// forwarded it gave up then (`crate::peers::still_awaited`).
    pub(crate) async fn add_lien(
        &self,
        req: cascade_core::protocol::AddLien,
        audit: AuditContext,
        answer_by: Option<Timestamp>,
    ) -> Result<Resource, Fault> {
        self.writer
            .apply_audited(
                move |s, c, _| {
                    still_awaited(answer_by, c.now, c.region.as_str(), "AddLien")?;
                    cascade_core::protocol::add_lien(s, c, req)
                },
                audit,
                |r: &Resource| changed("add_lien", r),
            )
            .await
    }

    /// Removes a lien from a resource of this region; a deletion it held
    /// goes on. Audited for `audit` in the same step.
    pub(crate) async fn remove_lien(
        &self,
        name: String,
        id: String,
        etag: Option<String>,
        audit: AuditContext,
        answer_by: Option<Timestamp>,
    ) -> Result<Resource, Fault> {
        self.writer
            .apply_audited(
                move |s, c, _| {
                    still_awaited(answer_by, c.now, c.region.as_str(), "RemoveLien")?;
                    cascade_core::protocol::remove_lien(s, c, &name, &id, etag.as_deref())
                },
                audit,
                |r: &Resource| changed("remove_lien", r),
            )
            .await
    }

    /// A finalizer controller's cleanup is done (see `protocol::finalizer`);
    /// audited for `audit` in the same step.
    pub(crate) async fn remove_finalizer(
        &self,
        req: FinalizerReport,
        audit: AuditContext,
        answer_by: Option<Timestamp>,
    ) -> Result<Resource, Fault> {
        self.writer
            .apply_audited(
                move |s, c, _| {
                    still_awaited(answer_by, c.now, c.region.as_str(), "RemoveFinalizer")?;
                    cascade_core::protocol::remove_finalizer(s, c, req)
                },
                audit,
                |r: &Resource| changed("remove_finalizer", r),
            )
            .await
    }

    /// A finalizer controller's cleanup failed (see `protocol::finalizer`);
    /// audited for `audit` in the same step.
    pub(crate) async fn report_finalizer_failure(
        &self,
        req: FinalizerReport,
        audit: AuditContext,
        answer_by: Option<Timestamp>,
    ) -> Result<Resource, Fault> {
        self.writer
            .apply_audited(
                move |s, c, _| {
                    still_awaited(answer_by, c.now, c.region.as_str(), "ReportFinalizerFailure")?;
                    cascade_core::protocol::report_finalizer_failure(s, c, req)
                },
                audit,
                |r: &Resource| changed("report_finalizer_failure", r),
            )
            .await
    }
}
