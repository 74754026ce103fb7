//! The operators' flows, as [`Node`] methods on core types: which
//! deletions of this region do not finish, retrying a failed one, and the
//! audit log. Who may call them is the Admin service's business
//! (`api/admin.rs`); every call it lets through, and every one it refuses,
//! is written to the audit log here, in the step that acts.
//!
//! The audit log also holds every change a client made (the writer appends
//! the entry to the change's own step: `writer.rs`) and every refused call
//! ([`Node::audit_refusal`], rate-limited), read back filtered
//! ([`Node::list_audit`]); the writer prunes it (`writer/audited.rs`).

use cascade_core::model::{AuditEntry, DeletionRecord, DeletionStatus as Held, Resource, WorkItem};
use cascade_core::protocol::{self, AdminRequest};
use cascade_core::state::StateRead;
use cascade_core::{OperationId, Timestamp, Uid};

use crate::audit::AuditContext;
use crate::error::Fault;
use crate::node::Node;
use crate::peers::still_awaited;
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
    /// `protocol::retry_deletion`); logged with `req`, stamped with `audit`.
    pub(crate) async fn retry_deletion(
        &self,
        name: String,
        req: AdminRequest,
        audit: AuditContext,
        answer_by: Option<Timestamp>,
    ) -> Result<DeletionEntry, Fault> {
        let (resource, record) = self
            .writer
            .apply_audited(
                move |s, c, ids| {
                    still_awaited(answer_by, c.now, c.region.as_str(), "RetryDeletion")?;
                    protocol::retry_deletion(s, c, ids, &name, req)
                },
                audit,
                |_| Vec::new(),
            )
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
        audit: AuditContext,
        answer_by: Option<Timestamp>,
    ) -> Result<DeletionEntry, Fault> {
        let min_age_ms = self.admin.force_purge_after_ms;
        let checked = name.clone();
        crate::writer::off_the_workers(self.store.waits_on_io(), || self.regions_apply_forcing(&checked))?;
        let (resource, record) = self
            .writer
            .apply_audited(
                move |s, c, ids| {
                    still_awaited(answer_by, c.now, c.region.as_str(), "ForcePurge")?;
                    protocol::force_purge(s, c, ids, &name, req, min_age_ms, force)
                },
                audit,
                |_| Vec::new(),
            )
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

    /// Writes an Admin action's audit entry on its own (a refused call),
    /// stamped with `audit`.
    pub(crate) async fn audit(&self, req: AdminRequest, outcome: String, audit: AuditContext) -> Result<(), Fault> {
        self.writer
            .apply_audited(
                move |s, c, ids| Ok(protocol::record_audit(s, c, ids, req, outcome)),
                audit,
                |_| Vec::new(),
            )
            .await
    }

    /// Who this node is in the audit log: its `[ha] node_name` (or, in a
    /// region of several nodes without one, its advertised address), else
    /// the address it listens on, else its region (before it serves).
    pub(crate) fn audit_node(&self) -> String {
        self.audit_name.name()
    }

    /// The audit context of a call `principal` made, allowed or refused by
    /// `rule`. `vouched_through`: the region that vouched for the caller
    /// when another region's node made the call for its client (None: a
    /// direct call, through this region).
    pub(crate) fn audit_context(
        &self,
        principal: &cascade_core::auth::Principal,
        rule: &str,
        vouched_through: Option<&str>,
    ) -> AuditContext {
        let through = vouched_through.map_or_else(|| self.region.to_string(), str::to_owned);
        AuditContext::of(principal, self.audit_node(), through, rule.to_owned())
    }

    /// Writes a refused call (authentication, authorization, rate, the
    /// Admin gate) to the audit log in its own step, at most
    /// [`crate::audit::AUDITED_REFUSALS_PER_SECOND`] a second for the whole
    /// node: each is a commit of the one writer, and anyone can make them.
    /// Returns whether it was written (the caller's log line says so; a
    /// store that refuses the commit is logged here, one line a window).
    pub(crate) async fn audit_refusal(&self, refusal: Refusal) -> bool {
        if !self.refusals_audited.admit(self.clock.now()) {
            return false;
        }
        let Refusal {
            context,
            action,
            target,
            outcome,
        } = refusal;
        let written = self
            .writer
            .apply(move |_, c, ids| {
                let entry = context.entry(Uid(ids.next_uuid()), c.now, &action, &target, &outcome);
                Ok(protocol::Step {
                    value: (),
                    writes: cascade_core::state::WriteSet {
                        audit: vec![entry],
                        ..Default::default()
                    },
                })
            })
            .await;
        match written {
            Ok(()) => {
                self.audit_failed.reset();
                true
            }
            Err(e) => {
                if let Some(more) = self.audit_failed.admit() {
                    tracing::warn!(region = %self.region, error = %e, suppressed = more.count(),
                        "could not write a refusal to the audit log{more}");
                }
                false
            }
        }
    }

    /// A page of this region's audit log in time order after `after`,
    /// filtered, with the id to continue after when there may be more.
    ///
    /// The log's keys are its ids, UUID v7s: in time order. A `since`
    /// seeks to its first key and an `until` ends the scan at its own,
    /// so a time window costs what it holds; an entry's id is minted in
    /// its step, a moment after the time it records, so the seek and the
    /// stop leave [`AUDIT_KEY_SKEW_MS`] of margin and the window is then
    /// matched on the recorded time exactly. The other filters are
    /// matched entry by entry: a page examines at most
    /// [`AUDIT_SCANNED_PER_ENTRY`] times its size in entries, then answers
    /// what it found (maybe nothing) with the position to go on from.
    pub(crate) fn list_audit(
        &self,
        filter: &AuditFilter,
        page_size: usize,
        after: Option<Uid>,
    ) -> Result<(Vec<AuditEntry>, Option<Uid>), Fault> {
        let page_size = match page_size {
            0 => self.limits.default_page_size,
            n => n.min(self.limits.max_page_size),
        };
        audit_page(&self.state(), filter, page_size, after)
    }
}

/// A refused call, for [`Node::audit_refusal`].
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    /// Who was refused (what they presented when they proved nothing), by which rule.
    pub context: AuditContext,
    /// The call (`Delete`, `ForcePurge`, ...) or verb refused.
    pub action: String,
    /// The resource or region it was about.
    pub target: String,
    /// The status the caller got (`PERMISSION_DENIED: ...`).
    pub outcome: String,
}

/// How much later than the time it records an entry's id may say it was
/// minted (its step's duration: far less), for the time window's seek.
pub(crate) const AUDIT_KEY_SKEW_MS: u64 = 1_000;

/// Entries a page of [`Node::list_audit`] examines per entry it may hold.
pub(crate) const AUDIT_SCANNED_PER_ENTRY: usize = 10;

/// Which audit entries a listing keeps (every filter optional, all combined).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AuditFilter {
    /// Only this principal's (exact `who`).
    pub principal: Option<String>,
    /// Only about this resource (exact full name).
    pub resource: Option<String>,
    /// Only this action (exact).
    pub action: Option<String>,
    /// Only those written at or after this (ms since the epoch).
    pub since_ms: Option<u64>,
    /// Only those written before this.
    pub until_ms: Option<u64>,
}

impl AuditFilter {
    fn keeps(&self, e: &AuditEntry) -> bool {
        self.principal.as_ref().is_none_or(|p| *p == e.who)
            && self.resource.as_ref().is_none_or(|r| *r == e.target)
            && self.action.as_ref().is_none_or(|a| *a == e.action)
            && self.since_ms.is_none_or(|since| e.time.0 >= since)
            && self.until_ms.is_none_or(|until| e.time.0 < until)
    }
}

/// A page of the audit log `state` holds (see [`Node::list_audit`]).
fn audit_page(
    state: &crate::codec::StoreState<'_>,
    filter: &AuditFilter,
    page_size: usize,
    after: Option<Uid>,
) -> Result<(Vec<AuditEntry>, Option<Uid>), Fault> {
    let page_size = page_size.max(1);
    let budget = page_size.saturating_mul(AUDIT_SCANNED_PER_ENTRY);
    // Where to start: after the token, or at `since` when that is later.
    let since = filter
        .since_ms
        .map(|since| crate::audit::first_key_at(since.saturating_sub(AUDIT_KEY_SKEW_MS)));
    let stop_ms = filter.until_ms.map(|until| until.saturating_add(AUDIT_KEY_SKEW_MS));
    let mut cursor: Option<Vec<u8>> = match (after, since) {
        (Some(a), Some(s)) => Some(a.as_bytes().as_slice().max(s.as_slice()).to_vec()),
        (Some(a), None) => Some(a.as_bytes().to_vec()),
        (None, Some(s)) => Some(s.to_vec()),
        (None, None) => None,
    };
    let mut out = Vec::new();
    let mut examined = 0;
    loop {
        let chunk = page_size.min(budget - examined).max(1);
        let entries: Vec<AuditEntry> = state.scan(Table::Audit, &[], cursor.as_deref(), chunk)?;
        let exhausted = entries.len() < chunk;
        for entry in entries {
            let at = crate::audit::key_time_ms(entry.id.as_bytes()).unwrap_or(entry.time.0);
            if stop_ms.is_some_and(|stop| at >= stop) {
                return Ok((out, None));
            }
            examined += 1;
            cursor = Some(entry.id.as_bytes().to_vec());
            let id = entry.id;
            if filter.keeps(&entry) {
                out.push(entry);
                if out.len() == page_size {
                    return Ok((out, Some(id)));
                }
            }
        }
        if exhausted {
            return Ok((out, None));
        }
        if examined >= budget {
            let last = cursor.as_deref().and_then(|c| uuid::Uuid::from_slice(c).ok()).map(Uid);
            return Ok((out, last));
        }
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

#[cfg(test)]
mod tests {
    use cascade_core::model::AuditEntry;
    use cascade_core::{Timestamp, Uid};

    use super::{audit_page, AuditFilter, AUDIT_SCANNED_PER_ENTRY};
    use crate::codec::{Record, StoreState};
    use crate::store::{Batch, MemoryStore, Store, Table};

    /// Entry `i` of a log written one a second from t = 1,000 s: alice's
    /// on even seconds, bob's on odd ones; every third about network n.
    fn entry(i: u64) -> AuditEntry {
        let ms = 1_000_000 + i * 1000;
        AuditEntry {
            id: Uid(uuid::Builder::from_unix_timestamp_millis(ms, &[i as u8; 10]).into_uuid()),
            time: Timestamp(ms),
            who: if i.is_multiple_of(2) { "alice" } else { "bob" }.to_owned(),
            action: if i.is_multiple_of(3) { "delete" } else { "create" }.to_owned(),
            target: if i.is_multiple_of(3) {
                "eu-west/network/n"
            } else {
                "eu-west/port/p"
            }
            .to_owned(),
            outcome: "ok".to_owned(),
            ..AuditEntry::default()
        }
    }

    fn log_of(n: u64) -> MemoryStore {
        let store = MemoryStore::default();
        let mut batch = Batch::default();
        for i in 0..n {
            let e = entry(i);
            batch.put(
                Table::Audit,
                e.id.as_bytes().to_vec(),
                e.encode(Table::Audit).expect("encodes"),
            );
        }
        store.commit(batch).expect("commits");
        store
    }

    /// Every page of `filter`, concatenated, and the pages' sizes.
    fn all_pages(store: &MemoryStore, filter: &AuditFilter, page_size: usize) -> (Vec<u64>, Vec<usize>) {
        let state = StoreState { store };
        let (mut seen, mut sizes, mut after) = (Vec::new(), Vec::new(), None);
        loop {
            let (page, next) = audit_page(&state, filter, page_size, after).expect("reads");
            sizes.push(page.len());
            seen.extend(page.iter().map(|e| (e.time.0 - 1_000_000) / 1000));
            match next {
                Some(n) => after = Some(n),
                None => return (seen, sizes),
            }
        }
    }

    #[test]
    fn each_filter_keeps_exactly_its_entries_across_pages() {
        let store = log_of(100);
        let expect = |keep: &dyn Fn(u64) -> bool| (0..100).filter(|i| keep(*i)).collect::<Vec<u64>>();
        let alice = AuditFilter {
            principal: Some("alice".into()),
            ..AuditFilter::default()
        };
        assert_eq!(all_pages(&store, &alice, 7).0, expect(&|i| i.is_multiple_of(2)));
        let network = AuditFilter {
            resource: Some("eu-west/network/n".into()),
            ..AuditFilter::default()
        };
        assert_eq!(all_pages(&store, &network, 5).0, expect(&|i| i.is_multiple_of(3)));
        let deletes_by_bob = AuditFilter {
            principal: Some("bob".into()),
            action: Some("delete".into()),
            ..AuditFilter::default()
        };
        assert_eq!(all_pages(&store, &deletes_by_bob, 4).0, expect(&|i| i % 6 == 3));
        // Seconds 20 to 49: the window is a seek and a stop, not a filter.
        let window = AuditFilter {
            since_ms: Some(1_020_000),
            until_ms: Some(1_050_000),
            ..AuditFilter::default()
        };
        assert_eq!(all_pages(&store, &window, 8).0, expect(&|i| (20..50).contains(&i)));
        assert_eq!(all_pages(&store, &AuditFilter::default(), 100).0, expect(&|_| true));
    }

    #[test]
    fn a_selective_filter_examines_a_bounded_number_of_entries_a_page() {
        let store = log_of(200);
        // Entry 150 alone: a page of 2 examines at most 20 entries, so
        // the pages before it come back empty, each with a token.
        let one = AuditFilter {
            principal: Some("alice".into()),
            since_ms: Some(1_150_000),
            until_ms: Some(1_151_000),
            ..AuditFilter::default()
        };
        assert_eq!(all_pages(&store, &one, 2), (vec![150], vec![1]));
        let rare = AuditFilter {
            action: Some("delete".into()),
            principal: Some("nobody".into()),
            ..AuditFilter::default()
        };
        let (seen, sizes) = all_pages(&store, &rare, 2);
        assert!(seen.is_empty());
        // Ten pages of 20 entries examined, and one that finds the end.
        assert_eq!(sizes.len(), 200 / (2 * AUDIT_SCANNED_PER_ENTRY) + 1, "{sizes:?}");
    }

    #[test]
    fn a_retention_step_removes_the_oldest_within_its_limit_and_keeps_the_count() {
        let store = log_of(50);
        let state = StoreState { store: &store };
        // One step, committed as the writer commits it.
        let prune = |cutoff, max, limit| {
            let (batch, pruned) = state.prune_audit(cutoff, max, limit).expect("prunes");
            store.commit(batch).expect("commits");
            pruned
        };
        assert_eq!(
            state.audit_count().expect("reads"),
            None,
            "not counted before the first step"
        );
        // By count: 50 entries, 20 kept, 10 a step.
        let first = prune(None, Some(20), 10);
        assert_eq!((first.removed, first.entries, first.more), (10, 40, true));
        let second = prune(None, Some(20), 10);
        assert_eq!((second.removed, second.entries), (10, 30));
        let third = prune(None, Some(20), 100);
        assert_eq!((third.removed, third.entries, third.more), (10, 20, false));
        let left: Vec<AuditEntry> = state.scan(Table::Audit, &[], None, 100).expect("reads");
        assert_eq!(
            left,
            (30..50).map(entry).collect::<Vec<_>>(),
            "the oldest went, nothing else"
        );
        // By age: entries of seconds 30 to 39 are before the cutoff.
        let aged = prune(Some(1_040_000), None, 100);
        assert_eq!((aged.removed, aged.entries), (10, 10));
        assert_eq!(state.audit_count().expect("reads"), Some(10));
        let nothing = prune(Some(1_040_000), Some(10), 100);
        assert_eq!(nothing.removed, 0);
    }
}
