//! The writer lease on PostgreSQL ([`WriterLease`]): one row per region,
//! its epoch bumped at every takeover, expiry by the database's clock
//! (`clock_timestamp()`, never a node's), and the fence every flush's
//! transaction checks (`fence` in `migrate.rs`, called first in
//! `commit.rs`).
//!
//! The lease's statements run on the read pool, whose sessions have a
//! `lock_timeout`: a takeover's UPDATE waits for a commit in flight (its
//! share lock on the row) at most that long, then reports the lease as
//! held; the caller tries again at its next interval.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_postgres::error::SqlState;

use super::settings::{classify, pool_error};
use super::{PostgresStore, Shared};
use crate::store::{DiskCondition, LeaseHolder, LeaseRecord, RegionMember, StoreError, WriterLease};

/// At most this many members are listed (a region runs a handful).
pub const MAX_MEMBERS: i64 = 256;

/// Why commits stopped until the next fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lost {
    /// A commit was fenced: the lease is at `current` (0: not known).
    Fenced { current: u64 },
    /// A commit's outcome was unknown.
    OutcomeUnknown,
}

/// The epoch commits are fenced with, and whether they stopped.
#[derive(Debug, Default)]
pub(super) struct FenceState {
    epoch: Option<u64>,
    lost: Option<Lost>,
}

impl FenceState {
    /// The epoch to commit at, or why no commit may be sent.
    fn epoch_to_commit(&self) -> Result<u64, StoreError> {
        let Some(epoch) = self.epoch else {
            return Err(StoreError::NotFenced);
        };
        match self.lost {
            None => Ok(epoch),
            Some(Lost::Fenced { current }) => Err(StoreError::Fenced { held: epoch, current }),
            Some(Lost::OutcomeUnknown) => Err(StoreError::CommitOutcomeUnknown(format!(
                "an earlier commit at epoch {epoch} may or may not have landed; \
                 nothing more is committed before the lease is taken again"
            ))),
        }
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn from_ms(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn epoch_of(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

impl PostgresStore {
    /// The epoch the next commit is fenced with, or why it may not be sent
    /// (never fenced; fenced out or unknown since: no round trip).
    pub(super) fn epoch_to_commit(&self) -> Result<u64, StoreError> {
        self.fence_state().epoch_to_commit()
    }

    /// The epoch the store was last fenced at (lost since or not).
    pub(super) fn fenced_epoch(&self) -> Option<u64> {
        self.fence_state().epoch
    }

    /// A commit sent at `epoch` failed: a fenced one or one of unknown
    /// outcome stops every later commit until the next fence, and says so
    /// through `lost()`. A failure of a commit of an earlier epoch that
    /// arrives after a newer fence says nothing of the newer one: ignored.
    pub(super) fn commit_failed(&self, e: &StoreError, epoch: u64) {
        let lost = match e {
            StoreError::Fenced { current, .. } => Lost::Fenced { current: *current },
            StoreError::CommitOutcomeUnknown(_) => Lost::OutcomeUnknown,
            _ => return,
        };
        let mut state = self.fence_state();
        if state.epoch != Some(epoch) {
            return;
        }
        state.lost.get_or_insert(lost);
        // Under the fence's lock: a `fence` of a newer epoch cannot clear
        // it between the two.
        self.lost.send_replace(true);
    }

    fn fence_state(&self) -> std::sync::MutexGuard<'_, FenceState> {
        self.fence.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs a lease statement that must be answered (one that gave up on
    /// a row lock counts as the database not answering).
    fn lease_rows(
        &self,
        sql: String,
        doing: &'static str,
        params: Params,
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        self.run(lease_statement(self.shared.clone(), sql, doing, params))
            .and_then(|answer| answered(answer, &self.shared))
    }

    fn lease_sql(&self, sql: &str) -> String {
        sql.replace("{s}", &self.shared.schema)
    }
}

/// A lease statement's parameters.
type Params = Vec<Box<dyn tokio_postgres::types::ToSql + Send + Sync>>;

async fn lease_statement(
    shared: Arc<Shared>,
    sql: String,
    doing: &'static str,
    params: Params,
) -> Result<Option<Vec<tokio_postgres::Row>>, StoreError> {
    let target = &shared.target;
    let client = shared.readers.get().await.map_err(|e| pool_error(e, target))?;
    let failed = |e: tokio_postgres::Error| classify(&e, doing, target);
    let statement = client.prepare_cached(&sql).await.map_err(failed)?;
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params
        .iter()
        .map(|p| p.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect();
    match client.query(&statement, &params).await {
        Ok(rows) => Ok(Some(rows)),
        // A commit in flight holds the row (its fence's share lock)
        // longer than the session's `lock_timeout`.
        Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => Ok(None),
        Err(e) => Err(failed(e)),
    }
}

/// The rows of a lease statement that must not give up on a busy row.
fn answered(answer: Option<Vec<tokio_postgres::Row>>, shared: &Shared) -> Result<Vec<tokio_postgres::Row>, StoreError> {
    answer.ok_or_else(|| StoreError::Unavailable {
        condition: DiskCondition::DatabaseUnreachable,
        message: format!(
            "{}: the lease row of region {:?} stayed locked by a commit in flight",
            shared.target, shared.region
        ),
    })
}

fn column<'a, T: tokio_postgres::types::FromSql<'a>>(row: &'a tokio_postgres::Row, i: usize) -> Result<T, StoreError> {
    row.try_get(i)
        .map_err(|e| StoreError::Engine(format!("the lease table has an unexpected column {i}: {e}")))
}

impl WriterLease for PostgresStore {
    fn try_acquire(&self, me: &LeaseHolder, ttl: Duration) -> Result<Option<u64>, StoreError> {
        let sql = self.lease_sql(
            "UPDATE {s}.lease SET epoch = epoch + 1, holder = $2, address = $3, version = $4, \
             holder_pid = pg_backend_pid(), expires_at = clock_timestamp() + $5::bigint * interval '1 millisecond' \
             WHERE region = $1 AND (expires_at <= clock_timestamp() OR holder = $2) RETURNING epoch",
        );
        let params: Params = vec![
            Box::new(self.shared.region.clone()),
            Box::new(me.node.clone()),
            Box::new(me.address.clone()),
            Box::new(me.version.clone()),
            Box::new(ms(ttl)),
        ];
        // A row locked by a commit in flight: the lease is in use.
        let Some(rows) = self.run(lease_statement(
            self.shared.clone(),
            sql,
            "cannot take the lease",
            params,
        ))?
        else {
            return Ok(None);
        };
        rows.first().map(|r| column::<i64>(r, 0).map(epoch_of)).transpose()
    }

    fn renew(&self, epoch: u64, ttl: Duration) -> Result<bool, StoreError> {
        let sql = self.lease_sql(
            "UPDATE {s}.lease SET expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond' \
             WHERE region = $1 AND epoch = $2 AND holder IS NOT NULL RETURNING epoch",
        );
        let params: Params = vec![
            Box::new(self.shared.region.clone()),
            Box::new(i64::try_from(epoch).unwrap_or(i64::MAX)),
            Box::new(ms(ttl)),
        ];
        let rows = self.lease_rows(sql, "cannot renew the lease", params)?;
        Ok(!rows.is_empty())
    }

    fn release(&self, epoch: u64) -> Result<(), StoreError> {
        let sql = self.lease_sql(
            "UPDATE {s}.lease SET holder = NULL, holder_pid = NULL, expires_at = '-infinity' \
             WHERE region = $1 AND epoch = $2 RETURNING epoch",
        );
        let params: Params = vec![
            Box::new(self.shared.region.clone()),
            Box::new(i64::try_from(epoch).unwrap_or(i64::MAX)),
        ];
        self.lease_rows(sql, "cannot release the lease", params).map(drop)
    }

    fn read(&self) -> Result<LeaseRecord, StoreError> {
        let sql = self.lease_sql(
            "SELECT epoch, holder, address, version, \
             CASE WHEN expires_at > clock_timestamp() \
                  THEN (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint ELSE 0 END \
             FROM {s}.lease WHERE region = $1",
        );
        let params: Params = vec![Box::new(self.shared.region.clone())];
        let rows = self.lease_rows(sql, "cannot read the lease", params)?;
        let Some(row) = rows.first() else {
            return Err(StoreError::Engine(format!(
                "{}: the lease row of region {:?} is missing from schema {:?}",
                self.shared.target, self.shared.region, self.shared.schema
            )));
        };
        let holder = column::<Option<String>>(row, 1)?.map(|node| -> Result<LeaseHolder, StoreError> {
            Ok(LeaseHolder {
                node,
                address: column::<Option<String>>(row, 2)?.unwrap_or_default(),
                version: column::<Option<String>>(row, 3)?.unwrap_or_default(),
            })
        });
        Ok(LeaseRecord {
            epoch: epoch_of(column(row, 0)?),
            holder: holder.transpose()?,
            expires_in: from_ms(column(row, 4)?),
        })
    }

    fn fence(&self, epoch: u64) {
        {
            let mut state = self.fence_state();
            // Once lost, only a newer epoch commits again.
            let stays_lost = state.lost.is_some() && state.epoch.is_some_and(|held| epoch <= held);
            if stays_lost {
                return;
            }
            *state = FenceState {
                epoch: Some(epoch),
                lost: None,
            };
            // Another node may have written since this one last did.
            self.cache.clear();
            // Commits staged at an earlier epoch never land, and the
            // writer of this one must not read them.
            self.staged.fenced(epoch);
            // Under the lock, as `commit_failed` sends true: a failure of
            // the new epoch is never hidden by this reset.
            self.lost.send_replace(false);
        }
    }

    fn lost(&self) -> tokio::sync::watch::Receiver<bool> {
        self.lost.subscribe()
    }

    fn announce(&self, me: &LeaseHolder, forget_after: Duration) -> Result<(), StoreError> {
        let sql = self.lease_sql(
            "WITH forgotten AS (DELETE FROM {s}.members WHERE region = $1 AND node <> $2 \
                 AND seen_at < clock_timestamp() - $5::bigint * interval '1 millisecond') \
             INSERT INTO {s}.members (region, node, address, version, seen_at) \
             VALUES ($1, $2, $3, $4, clock_timestamp()) \
             ON CONFLICT (region, node) DO UPDATE \
             SET address = EXCLUDED.address, version = EXCLUDED.version, seen_at = EXCLUDED.seen_at \
             RETURNING node",
        );
        let params: Params = vec![
            Box::new(self.shared.region.clone()),
            Box::new(me.node.clone()),
            Box::new(me.address.clone()),
            Box::new(me.version.clone()),
            Box::new(ms(forget_after)),
        ];
        self.lease_rows(sql, "cannot announce this node", params).map(drop)
    }

    fn members(&self) -> Result<Vec<RegionMember>, StoreError> {
        let sql = self.lease_sql(&format!(
            "SELECT node, address, version, \
             greatest((extract(epoch FROM clock_timestamp() - seen_at) * 1000)::bigint, 0) \
             FROM {{s}}.members WHERE region = $1 ORDER BY node LIMIT {MAX_MEMBERS}"
        ));
        let params: Params = vec![Box::new(self.shared.region.clone())];
        let rows = self.lease_rows(sql, "cannot list the members", params)?;
        rows.iter()
            .map(|row| {
                Ok(RegionMember {
                    node: LeaseHolder {
                        node: column(row, 0)?,
                        address: column(row, 1)?,
                        version: column(row, 2)?,
                    },
                    last_seen: from_ms(column(row, 3)?),
                })
            })
            .collect()
    }
}

/// Shared with the store: the fence state is behind its own lock.
pub(super) type Fence = Mutex<FenceState>;
