//! A new schema put in force by the writer (issue 31), between two of its
//! steps: a message of its own (`WriterHandle::swap_schema`), never a
//! shared value that could change under a step. In that message the
//! writer checks the new schema against what the region stores (the
//! core's compatibility rules, `cascade_core::schema::CompatItem`, over
//! bounded counts read here), then either commits the audit entry of the
//! change and swaps the [`SchemaHolder`], or commits the audit entry of
//! the refusal and keeps the schema in force. No create or delete can come
//! between the count and the swap: they are steps of this same writer.
//!
//! The swap happens after the entry's commit and before its group's flush:
//! the schema is the file's, not the store's, so a flush that fails loses
//! at most the entry (as a crash would), never the schema's consistency.

use std::sync::Arc;

use cascade_core::limits::{cut_stored, MAX_AUDIT_OUTCOME_BYTES, MAX_AUDIT_TARGET_BYTES, MAX_REASON_BYTES};
use cascade_core::model::{AuditEntry, DeletionRecord, RemoteDeletion, Resource};
use cascade_core::schema::{StoredQuestion, Tally};
use cascade_core::state::WriteSet;
use cascade_core::{CoreError, IdSource, Uid};
use ractor::ActorRef;

use super::group::Reply;
use super::{WriterHandle, WriterMsg, WriterState};
use crate::codec::StoreState;
use crate::schema_in_force::{InForce, SchemaVersion};
use crate::store::{StoreError, Table};

/// Stored rows one compatibility count reads at most: past it, the count
/// is "at least" what it found (a reload is one writer step, and a
/// client's write waits behind it).
pub(crate) const COMPAT_SCAN_LIMIT: usize = 10_000;

/// Rows read per page of a count.
const PAGE: usize = 1_000;

/// The audit log's action for a schema reload, applied or refused.
pub(crate) const RELOAD_ACTION: &str = "schema.reload";

/// Who a reload is audited for: the node's operator, who edits the file
/// and signals the node; `via` says how the node learnt of it.
pub(crate) const OPERATOR: &str = "operator";

/// What the writer did with a new schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Swapped {
    /// It is in force; `diff` is the short diff the audit entry carries.
    Applied {
        from: SchemaVersion,
        to: SchemaVersion,
        diff: String,
    },
    /// The same kinds, references and label as the schema in force.
    Unchanged(SchemaVersion),
    /// The stored data forbids it: one line per change it refuses, each
    /// with its count. The schema in force stays.
    Refused(Vec<String>),
}

/// How a reload came (the audit entry's `via`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadCause {
    /// SIGHUP to `cascade serve`.
    Signal,
    /// The schema file changed.
    FileChanged,
    /// A call on the node's handle (tests, embedding programs).
    Call,
}

impl ReloadCause {
    pub fn as_str(self) -> &'static str {
        match self {
            ReloadCause::Signal => "signal",
            ReloadCause::FileChanged => "file watch",
            ReloadCause::Call => "call",
        }
    }
}

impl WriterHandle {
    /// Puts `next` in force between two steps, unless the stored data
    /// forbids it (see the module doc); audited either way for the
    /// operator, with `target` (the file) and `cause`.
    pub(crate) async fn swap_schema(
        &self,
        next: Arc<InForce>,
        target: String,
        cause: ReloadCause,
    ) -> Result<Swapped, crate::error::Fault> {
        self.call(|reply| {
            WriterMsg::Apply(Box::new(
                move |state: &mut WriterState, myself: &ActorRef<WriterMsg>| {
                    let result = state.swap_schema(myself, next, &target, cause);
                    Reply::after_flush(reply, result, state.group_committed())
                },
            ))
        })
        .await
    }

    /// Audits a reload refused before it reached the writer (a file that
    /// does not read or does not validate): `reason` is the refusal.
    pub(crate) async fn audit_schema_refusal(
        &self,
        target: String,
        cause: ReloadCause,
        reason: String,
    ) -> Result<(), crate::error::Fault> {
        self.call(|reply| {
            WriterMsg::Apply(Box::new(move |state: &mut WriterState, _: &ActorRef<WriterMsg>| {
                let entry = state.reload_entry(&target, cause, "", &format!("refused: {reason}"));
                let result = state.commit_audit(entry).map(|_| ());
                Reply::after_flush(reply, result, state.group_committed())
            }))
        })
        .await
    }
}

impl WriterState {
    fn swap_schema(
        &mut self,
        myself: &ActorRef<WriterMsg>,
        next: Arc<InForce>,
        target: &str,
        cause: ReloadCause,
    ) -> Result<Swapped, CoreError> {
        let current = self.ctx.schema.current();
        if current.version == next.version {
            return Ok(Swapped::Unchanged(current.version.clone()));
        }
        let diff = current.schema.diff(&next.schema);
        let summary = diff.summary();
        // Read through `reads`: a read the engine refused counts as the
        // store's trouble, as a step's does (`audited.rs`, `retain_audit`).
        let region = self.ctx.region.to_string();
        let judged = super::compat_check(&StoreState { store: &self.reads }, &region, &diff);
        if let Some(refused) = self.reads.take_refused() {
            self.read_refused(&refused);
        }
        let refusals: Vec<String> = judged
            .map_err(storage)?
            .into_iter()
            .filter_map(|judged| judged.refusal)
            .collect();
        if !refusals.is_empty() {
            let outcome = format!("refused: {}", refusals.join("; "));
            let entry = self.reload_entry(target, cause, &summary, &outcome);
            self.commit_audit(entry)?;
            return Ok(Swapped::Refused(refusals));
        }
        let entry = self.reload_entry(target, cause, &summary, "ok");
        // The schema in force is stored in the batch of its audit entry:
        // a restart checks its file against it (`schema_in_force.rs`).
        let mut writes = WriteSet::default();
        writes.audit.push(entry);
        writes.schema_in_force = Some(crate::schema_in_force::stored_form(&next.schema));
        if self.commit(writes)? {
            self.kick(myself);
        }
        self.ctx.schema.put(next.clone());
        Ok(Swapped::Applied {
            from: current.version.clone(),
            to: next.version.clone(),
            diff: summary,
        })
    }

    /// The audit entry of a reload: the operator's, every field cut to its limit.
    fn reload_entry(&mut self, target: &str, cause: ReloadCause, diff: &str, outcome: &str) -> AuditEntry {
        AuditEntry {
            id: Uid(self.ids.next_uuid()),
            time: self.ctx.clock.now(),
            who: OPERATOR.to_owned(),
            action: RELOAD_ACTION.to_owned(),
            target: cut_stored(target, MAX_AUDIT_TARGET_BYTES),
            reason: cut_stored(diff, MAX_REASON_BYTES),
            outcome: cut_stored(outcome, MAX_AUDIT_OUTCOME_BYTES),
            via: cause.as_str().to_owned(),
            node: cut_stored(&self.ctx.audit_node.name(), MAX_AUDIT_TARGET_BYTES),
            through: self.ctx.region.to_string(),
            ..AuditEntry::default()
        }
    }

    /// Commits one audit entry as its own batch (in the group's flush).
    fn commit_audit(&mut self, entry: AuditEntry) -> Result<bool, CoreError> {
        let mut writes = WriteSet::default();
        writes.audit.push(entry);
        self.commit(writes)
    }
}

fn storage(e: StoreError) -> CoreError {
    CoreError::Storage(cascade_core::error::StorageError(e.to_string()))
}

/// One compatibility count over the store, at most [`COMPAT_SCAN_LIMIT`]
/// rows read: resources of a kind are the range of their names
/// (`{region}/{kind}/`, the resources table's order), deletions are the
/// deletion table and the remote deletions this region applies.
pub(crate) fn count(store: &StoreState<'_>, region: &str, question: &StoredQuestion) -> Result<Tally, StoreError> {
    match question {
        StoredQuestion::KindStored { kind } => {
            let prefix = format!("{region}/{kind}/");
            let mut found = 0usize;
            let mut after: Option<Vec<u8>> = None;
            loop {
                let page = store
                    .store
                    .scan(Table::Resources, prefix.as_bytes(), after.as_deref(), PAGE)?;
                found += page.len();
                if found >= COMPAT_SCAN_LIMIT {
                    return Ok(tally(found, true));
                }
                match page.last() {
                    Some((key, _)) if page.len() == PAGE => after = Some(key.clone()),
                    _ => return Ok(tally(found, false)),
                }
            }
        }
        StoredQuestion::FieldSet { kind, field } => {
            let prefix = format!("{region}/{kind}/");
            let (mut read, mut found) = (0usize, 0usize);
            let mut after: Option<Vec<u8>> = None;
            loop {
                let page: Vec<Resource> = store.scan(Table::Resources, prefix.as_bytes(), after.as_deref(), PAGE)?;
                read += page.len();
                found += page
                    .iter()
                    .filter(|r| r.refs.get(field).is_some_and(|t| !t.is_empty()))
                    .count();
                if read >= COMPAT_SCAN_LIMIT {
                    return Ok(tally(found, true));
                }
                match page.last() {
                    Some(r) if page.len() == PAGE => after = Some(r.name.as_str().as_bytes().to_vec()),
                    _ => return Ok(tally(found, false)),
                }
            }
        }
        StoredQuestion::DeletionsOf { kinds } => {
            let of = |name: &cascade_core::ResourceName| kinds.iter().any(|k| k == name.kind());
            let (mut read, mut found) = (0usize, 0usize);
            let mut after: Option<Vec<u8>> = None;
            loop {
                let page: Vec<DeletionRecord> = store.scan(Table::Deletions, &[], after.as_deref(), PAGE)?;
                read += page.len();
                found += page.iter().filter(|d| of(&d.target.name)).count();
                if read >= COMPAT_SCAN_LIMIT {
                    return Ok(tally(found, true));
                }
                match page.last() {
                    Some(d) if page.len() == PAGE => after = Some(d.target.uid.as_bytes().to_vec()),
                    _ => break,
                }
            }
            after = None;
            loop {
                let page: Vec<RemoteDeletion> = store.scan(Table::RemoteDeletions, &[], after.as_deref(), PAGE)?;
                read += page.len();
                found += page.iter().filter(|d| !d.purged && of(&d.target.name)).count();
                if read >= COMPAT_SCAN_LIMIT {
                    return Ok(tally(found, true));
                }
                match page.last() {
                    Some(d) if page.len() == PAGE => after = Some(d.target.uid.as_bytes().to_vec()),
                    _ => return Ok(tally(found, false)),
                }
            }
        }
    }
}

fn tally(count: usize, at_least: bool) -> Tally {
    Tally {
        count: count as u64,
        at_least,
    }
}
