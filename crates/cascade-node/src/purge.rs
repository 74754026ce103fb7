//! A filtered purge's region-local half, as `Node` methods (issue 29; above
//! the node, like `listing.rs`): the filter checked against this region's
//! schema, this region's scan for it, and this region's part of a forced
//! purge through the writer. The fan-out over regions, the bounds across
//! them and the answer are the wire edge's (`api/admin/purge.rs`), as a
//! listing of every region is.
//!
//! The scan reads the resource table in name order (from
//! `{region}/{kind}/{name_prefix}` when a kind is named, else the whole
//! region) and examines at most `[limits] purge_scan` rows; the core's
//! `PurgeTally` counts and samples what matches.

use cascade_core::limits::quote;
use cascade_core::model::Resource;
use cascade_core::protocol::{self, PurgeFilter, PurgeStarted, PurgeTally, StartPurge};
use cascade_core::Timestamp;

use crate::audit::{AuditContext, Change};
use crate::error::Fault;
use crate::node::Node;
use crate::peers::still_awaited;
use crate::store::Table;

/// Rows a scan reads from the store at once.
const SCAN_CHUNK: usize = 1024;

impl Node {
    /// The filter a request spells (see `PurgeFilter::new`), its kind one
    /// of this region's schema.
    pub(crate) fn purge_filter(
        &self,
        kind: &str,
        name_prefix: &str,
        selector: &str,
        older_than_ms: u64,
    ) -> Result<PurgeFilter, Fault> {
        let filter = PurgeFilter::new(kind, name_prefix, selector, older_than_ms)?;
        if let Some(kind) = &filter.kind {
            self.known_kind(kind, "kind", format_args!("unknown kind {}", quote(kind)))?;
        }
        Ok(filter)
    }

    /// This region's resources that `filter` matches now: counted, the
    /// first sampled, up to `keep` kept as members, from at most `[limits]
    /// purge_scan` rows (then the count is a lower bound).
    pub(crate) fn purge_tally(&self, filter: &PurgeFilter, keep: usize) -> Result<PurgeTally, Fault> {
        let mut prefix = format!("{}/", self.region);
        if let Some(kind) = &filter.kind {
            // With a kind, the id prefix narrows the scan itself.
            prefix.push_str(kind);
            prefix.push('/');
            prefix.push_str(&filter.name_prefix);
        }
        let limit = self.limits.purge_scan;
        let now = self.clock.now();
        let state = self.state();
        let mut tally = PurgeTally::keeping(keep);
        let mut cursor: Option<Vec<u8>> = None;
        let mut scanned = 0usize;
        loop {
            let budget = (limit - scanned).min(SCAN_CHUNK);
            let rows: Vec<Resource> = state.scan(Table::Resources, prefix.as_bytes(), cursor.as_deref(), budget)?;
            scanned += rows.len();
            let complete = rows.len() < budget;
            if let Some(last) = rows.last() {
                cursor = Some(last.name.as_str().as_bytes().to_vec());
            }
            for r in &rows {
                tally.examine(filter, r, now);
            }
            if complete {
                return Ok(tally);
            }
            if scanned >= limit {
                // One more row would say whether there is more: a region
                // of exactly `limit` rows is counted exactly.
                let more: Vec<Resource> = state.scan(Table::Resources, prefix.as_bytes(), cursor.as_deref(), 1)?;
                tally.count_is_lower_bound = !more.is_empty();
                return Ok(tally);
            }
        }
    }

    /// Starts this region's part of a forced purge in one writer step (see
    /// `protocol::start_purge`): the call's audit entry, stamped with
    /// `audit`, and one entry per member started (`purge`), in its commit.
    /// A Purge forwarded by a node that gave up at `answer_by` is refused
    /// past it, starting nothing (`crate::peers::still_awaited`).
    pub(crate) async fn start_purge_part(
        &self,
        req: StartPurge,
        audit: AuditContext,
        answer_by: Option<Timestamp>,
    ) -> Result<PurgeStarted, Fault> {
        self.writer
            .apply_audited(
                move |s, c, ids| {
                    still_awaited(answer_by, c.now, c.region.as_str(), "Purge")?;
                    protocol::start_purge(s, c, ids, req)
                },
                audit,
                |started: &PurgeStarted| {
                    started
                        .started
                        .iter()
                        .map(|name| Change {
                            action: "purge",
                            target: name.to_string(),
                        })
                        .collect()
                },
            )
            .await
    }
}
