//! The operators' flows, as [`Node`] methods on core types: which
//! deletions of this region do not finish, retrying a failed one, and the
//! audit log. Who may call them is the Admin service's business
//! (`api/admin.rs`); every call it lets through, and every one it refuses,
//! is written to the audit log here, in the step that acts.

use cascade_core::model::{AuditEntry, DeletionRecord, DeletionStatus as Held, Resource, WorkItem};
use cascade_core::protocol::{self, AdminRequest};
use cascade_core::state::StateRead;
use cascade_core::{OperationId, Timestamp, Uid};

use crate::error::Fault;
use crate::node::Node;
use crate::store::Table;

/// Which deletions a listing keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DeletionFilter {
    /// Only this status: "PENDING", "BLOCKED", "FAILED", "WAITING".
    pub status: Option<&'static str>,
    /// Only stuck ones (see `protocol::is_stuck`).
    pub stuck: bool,
    /// Only those DELETING for at least this long.
    pub older_than_ms: u64,
    /// Only those of this operation.
    pub operation: Option<OperationId>,
}

/// One deletion as an operator sees it.
#[derive(Debug, Clone)]
pub(crate) struct DeletionEntry {
    pub resource: Resource,
    pub record: DeletionRecord,
    /// Its retry-queue entry, when it is queued.
    pub work: Option<WorkItem>,
    pub stuck: bool,
    pub age_ms: u64,
}

/// Deletion rows read per listing call at most, matched or not: a filter
/// that matches little still answers in bounded time, with a token to go on.
pub(crate) const MAX_SCANNED: usize = 10_000;

impl Node {
    /// A page of this region's deletions in uid order after `after`, with
    /// the uid to continue after when there may be more.
    pub(crate) fn list_deletions(
        &self,
        filter: &DeletionFilter,
        page_size: usize,
        after: Option<Uid>,
    ) -> Result<(Vec<DeletionEntry>, Option<Uid>), Fault> {
        let page_size = match page_size {
            0 => self.limits.default_page_size,
            n => n.min(self.limits.max_page_size),
        };
        let state = self.state();
        let now = self.clock.now();
        let mut cursor = after.map(|u| u.as_bytes().to_vec());
        let mut out = Vec::new();
        let mut scanned = 0;
        loop {
            let chunk = page_size.min(MAX_SCANNED - scanned).max(1);
            let records: Vec<DeletionRecord> = state.scan(Table::Deletions, &[], cursor.as_deref(), chunk)?;
            let exhausted = records.len() < chunk;
            for record in records {
                scanned += 1;
                cursor = Some(record.target.uid.as_bytes().to_vec());
                let Some(entry) = self.deletion_entry(&state, record, now)? else {
                    continue;
                };
                if filter.keeps(&entry) {
                    out.push(entry);
                    if out.len() == page_size {
                        let last = out.last().map(|e| e.record.target.uid);
                        return Ok((out, last));
                    }
                }
            }
            if exhausted {
                return Ok((out, None));
            }
            if scanned >= MAX_SCANNED {
                let last = cursor.as_deref().and_then(|c| uuid::Uuid::from_slice(c).ok()).map(Uid);
                return Ok((out, last));
            }
        }
    }

    /// One deletion of this region, as an operator sees it; None when its
    /// resource is gone (purged between the two reads).
    pub(crate) fn deletion_entry(
        &self,
        state: &crate::codec::StoreState<'_>,
        record: DeletionRecord,
        now: Timestamp,
    ) -> Result<Option<DeletionEntry>, Fault> {
        let uid = record.target.uid;
        let Some(name) = state.name_of(uid)? else {
            return Ok(None);
        };
        let Some(resource) = state.resource(&name)?.filter(|r| r.uid == uid) else {
            return Ok(None);
        };
        let work = state.work(uid)?;
        Ok(Some(DeletionEntry {
            stuck: protocol::is_stuck(&resource, &record),
            age_ms: now.0.saturating_sub(record.deleted_at.0),
            resource,
            record,
            work,
        }))
    }

    /// Starts a FAILED deletion of this region again (see
    /// `protocol::retry_deletion`); logged with `req`.
    pub(crate) async fn retry_deletion(&self, name: String, req: AdminRequest) -> Result<DeletionEntry, Fault> {
        let (resource, record) = self
            .writer
            .apply(move |s, c, ids| protocol::retry_deletion(s, c, ids, &name, req))
            .await?;
        self.entry_after_action(resource, record)
    }

    /// Forces a DELETING resource's deletion through (see
    /// `protocol::force_purge`); logged with `req`.
    pub(crate) async fn force_purge(
        &self,
        name: String,
        req: AdminRequest,
        force: bool,
    ) -> Result<DeletionEntry, Fault> {
        let min_age_ms = self.admin.force_purge_after_ms;
        let checked = name.clone();
        crate::writer::off_the_workers(self.store.waits_on_io(), || self.regions_apply_forcing(&checked))?;
        let (resource, record) = self
            .writer
            .apply(move |s, c, ids| protocol::force_purge(s, c, ids, &name, req, min_age_ms, force))
            .await?;
        self.entry_after_action(resource, record)
    }

    /// A forced deletion makes the `block` referrers in every region lose
    /// the reference, through the DELETION_FORCED event, which only
    /// importers from protocol version 2 apply (`cascade_proto::
    /// PROTOCOL_VERSION`); an older one skips it, so its `block` referrers
    /// would hold the deletion for ever. Refused, naming the region, while
    /// a region that holds a `block` referrer of `name` has not announced
    /// version 2 (a region not heard from counts as the oldest). Nothing
    /// can attach to a DELETING resource, so the rows read here are all
    /// there will be. Anything else (a name that does not parse, a
    /// resource that is not DELETING) is left to the step to refuse.
    fn regions_apply_forcing(&self, name: &str) -> Result<(), Fault> {
        /// Enough `block` rows to name a holder; past that many, a region
        /// that could hold one is refused without reading further.
        const READ_AT_MOST: usize = 10_000;
        let Ok(name) = cascade_core::ResourceName::parse(name) else {
            return Ok(());
        };
        let state = self.state();
        let Some(resource) = state.resource(&name)? else {
            return Ok(());
        };
        if resource.state != cascade_core::model::ResourceState::Deleting {
            return Ok(());
        }
        let needed = cascade_proto::DELETION_FORCED_SINCE;
        let why = |region: &str| match self.peers.version_of(region) {
            Some(v) => format!("speaks protocol version {v}, before {needed}: it does not apply a forced deletion"),
            None => format!(
                "has not announced its protocol version yet (it counts as version 1, before {needed}: \
                 it would not apply a forced deletion)"
            ),
        };
        let rows = state.blocking_backrefs(resource.uid, READ_AT_MOST)?;
        let holder = rows.iter().find(|b| {
            let region = b.referrer.name.region();
            region != self.region.as_str() && !self.peers.speaks_at_least(region, needed)
        });
        if let Some(b) = holder {
            let region = b.referrer.name.region().to_owned();
            return Err(Fault::Refused(cascade_core::CoreError::ForceNeedsNewerRegion {
                name,
                why: why(&region),
                region,
                referrer: b.referrer.name.to_string(),
            }));
        }
        if rows.len() >= READ_AT_MOST {
            if let Some(region) = self.peers.regions().find(|r| !self.peers.speaks_at_least(r, needed)) {
                return Err(Fault::Refused(cascade_core::CoreError::ForceNeedsNewerRegion {
                    why: why(region),
                    region: region.to_owned(),
                    referrer: format!("one of its {READ_AT_MOST}+ block referrers (not all read)"),
                    name,
                }));
            }
        }
        Ok(())
    }

    /// The entry an action answers with: its resource and record as the
    /// action left them, and its queue entry as it stands now.
    fn entry_after_action(&self, resource: Resource, record: DeletionRecord) -> Result<DeletionEntry, Fault> {
        Ok(DeletionEntry {
            stuck: protocol::is_stuck(&resource, &record),
            age_ms: self.clock.now().0.saturating_sub(record.deleted_at.0),
            work: self.state().work(resource.uid)?,
            resource,
            record,
        })
    }

    /// Writes an audit entry on its own (a listing, or a refused call).
    pub(crate) async fn audit(&self, req: AdminRequest, outcome: String) -> Result<(), Fault> {
        self.writer
            .apply(move |s, c, ids| Ok(protocol::record_audit(s, c, ids, req, outcome)))
            .await
    }

    /// A page of this region's audit log in time order after `after`, with
    /// the id to continue after when there may be more.
    pub(crate) fn list_audit(
        &self,
        page_size: usize,
        after: Option<Uid>,
    ) -> Result<(Vec<AuditEntry>, Option<Uid>), Fault> {
        let page_size = match page_size {
            0 => self.limits.default_page_size,
            n => n.min(self.limits.max_page_size),
        };
        let after = after.map(|u| u.as_bytes().to_vec());
        let entries: Vec<AuditEntry> = self.state().scan(Table::Audit, &[], after.as_deref(), page_size)?;
        let next = (entries.len() == page_size)
            .then(|| entries.last().map(|e| e.id))
            .flatten();
        Ok((entries, next))
    }
}

impl DeletionFilter {
    fn keeps(&self, e: &DeletionEntry) -> bool {
        let status = match &e.record.status {
            Held::Pending => "PENDING",
            Held::Blocked { .. } => "BLOCKED",
            Held::Failed { .. } => "FAILED",
            Held::Waiting { .. } => "WAITING",
        };
        self.status.is_none_or(|s| s == status)
            && (!self.stuck || e.stuck)
            && e.age_ms >= self.older_than_ms
            && self.operation.is_none_or(|op| op == e.record.operation)
    }
}
