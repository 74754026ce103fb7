//! The statements of the PostgreSQL store: reads, and the commit of a
//! batch in one pipelined transaction, fenced first.
//!
//! A commit sends, in one write and so in one round trip:
//!
//! ```sql
//! BEGIN; SELECT {schema}.fence('region', epoch);   -- one simple query
//! DELETE FROM {schema}.t WHERE k = ANY($1);        -- per table written, at most one
//! INSERT INTO {schema}.t SELECT * FROM unnest($1::bytea[], $2::bytea[])
//!     ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v; -- per table written, at most one
//! COMMIT;
//! ```
//!
//! The batch is first collapsed to its last write per key (an upsert may
//! not touch a row twice). A fence that fails raises, which aborts the
//! transaction: every statement after it fails and the COMMIT rolls back,
//! so nothing of a fenced batch lands though it was all sent. The outcome
//! is read from the answers in order: a fence error is
//! [`StoreError::Fenced`]; an error the server sent for a statement means
//! the transaction rolled back; a connection lost before the COMMIT's
//! answer is [`StoreError::CommitOutcomeUnknown`] (it may have landed). No
//! COMMIT is ever cut short by a client-side timeout: the session's
//! `statement_timeout` bounds the statements, and TCP's user timeout a dead
//! connection.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::ToSql;

use super::migrate::FENCED_SQLSTATE;
use super::settings::{classify, describe, pool_error};
use super::Shared;
use crate::store::{Entry, StoreError, Table};

/// A batch reduced to the last write of each key, per table (in key
/// order, so two commits would lock rows in the same order).
pub(super) type Collapsed = BTreeMap<Table, BTreeMap<Vec<u8>, Option<Vec<u8>>>>;

/// Keys asked for in one `= ANY($1)` statement.
const KEYS_PER_READ: usize = 1000;

/// The SQL of every statement, per table, with the schema written in.
pub(super) struct Statements {
    get: Vec<String>,
    get_many: Vec<String>,
    occupied_prefixes: Vec<String>,
    scan_bounded: Vec<String>,
    scan_open: Vec<String>,
    delete: Vec<String>,
    upsert: Vec<String>,
}

impl Statements {
    pub(super) fn new(schema: &str) -> Self {
        let per_table = |sql: &dyn Fn(&str) -> String| -> Vec<String> {
            Table::ALL
                .iter()
                .map(|t| sql(&format!("{schema}.{}", t.name())))
                .collect()
        };
        Self {
            get: per_table(&|t| format!("SELECT v FROM {t} WHERE k = $1")),
            get_many: per_table(&|t| format!("SELECT k, v FROM {t} WHERE k = ANY($1::bytea[])")),
            // Each prefix as its range [lo, hi): an index probe per prefix.
            occupied_prefixes: per_table(&|t| {
                format!(
                    "SELECT q.lo FROM unnest($1::bytea[], $2::bytea[]) AS q(lo, hi) \
                     WHERE EXISTS (SELECT 1 FROM {t} WHERE k >= q.lo AND k < q.hi)"
                )
            }),
            scan_bounded: per_table(&|t| format!("SELECT k, v FROM {t} WHERE k >= $1 AND k < $2 ORDER BY k LIMIT $3")),
            scan_open: per_table(&|t| format!("SELECT k, v FROM {t} WHERE k >= $1 ORDER BY k LIMIT $2")),
            delete: per_table(&|t| format!("DELETE FROM {t} WHERE k = ANY($1::bytea[])")),
            upsert: per_table(&|t| {
                format!(
                    "INSERT INTO {t} (k, v) SELECT * FROM unnest($1::bytea[], $2::bytea[]) \
                     ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v"
                )
            }),
        }
    }
}

/// Applies `batch`'s writes in order, keeping the last per key.
pub(super) fn collapse(ops: Vec<(Table, Vec<u8>, Option<Vec<u8>>)>) -> Collapsed {
    let mut writes = Collapsed::new();
    for (table, key, value) in ops {
        writes.entry(table).or_default().insert(key, value);
    }
    writes
}

/// Where a scan of `prefix` strictly after `after` starts (inclusive) and
/// ends (exclusive; None: the table's end, for a prefix of 0xff bytes or
/// an empty one). The smallest key above `after` is `after ‖ 0x00`.
pub(super) fn scan_bounds(prefix: &[u8], after: Option<&[u8]>) -> (Vec<u8>, Option<Vec<u8>>) {
    let start = match after {
        Some(a) if a >= prefix => {
            let mut s = a.to_vec();
            s.push(0);
            s
        }
        _ => prefix.to_vec(),
    };
    let mut end = prefix.to_vec();
    while end.last() == Some(&0xff) {
        end.pop();
    }
    let end = end.last_mut().map(|last| *last += 1).map(|()| end);
    (start, end)
}

pub(super) async fn get(shared: Arc<Shared>, table: Table, key: Vec<u8>) -> Result<Option<Vec<u8>>, StoreError> {
    let target = &shared.target;
    let failed = |e: tokio_postgres::Error| classify(&e, &format!("cannot read {}", table.name()), target);
    let client = shared.readers.get().await.map_err(|e| pool_error(e, target))?;
    let statement = client
        .prepare_cached(&shared.sql.get[table as usize])
        .await
        .map_err(failed)?;
    let row = client.query_opt(&statement, &[&key]).await.map_err(failed)?;
    row.map(|row| row.try_get::<_, Vec<u8>>(0))
        .transpose()
        .map_err(|e| corrupt(table, &e))
}

/// The rows of `keys` that exist, in no particular order.
pub(super) async fn get_many(shared: Arc<Shared>, table: Table, keys: Vec<Vec<u8>>) -> Result<Vec<Entry>, StoreError> {
    let target = &shared.target;
    let failed = |e: tokio_postgres::Error| classify(&e, &format!("cannot read {}", table.name()), target);
    let client = shared.readers.get().await.map_err(|e| pool_error(e, target))?;
    let statement = client
        .prepare_cached(&shared.sql.get_many[table as usize])
        .await
        .map_err(failed)?;
    let mut found = Vec::new();
    for chunk in keys.chunks(KEYS_PER_READ) {
        for row in client.query(&statement, &[&chunk]).await.map_err(failed)? {
            found.push(entry(table, &row)?);
        }
    }
    Ok(found)
}

/// What a prefetch found: the rows of the keys asked that exist, and the
/// prefixes asked that hold a row (the others hold none).
#[derive(Default)]
pub(super) struct Prefetched {
    pub(super) rows: Vec<(Table, Entry)>,
    pub(super) occupied: Vec<(Table, Vec<u8>)>,
}

/// Per table, prefixes to probe and the ends of their ranges (in order).
pub(super) type PrefixRanges = Vec<(Table, Vec<Vec<u8>>, Vec<Vec<u8>>)>;

/// A read's future, as a prefetch's pipeline holds them.
type PendingRows<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>> + Send + 'a>>;

/// Reads `keys` and whether each of `prefixes` (with its range's end)
/// holds a row, on one connection, every statement sent before the first
/// answer is awaited: one round trip for all (a statement per table and
/// kind, and per [`KEYS_PER_READ`] keys).
pub(super) async fn prefetch(
    shared: Arc<Shared>,
    keys: Vec<(Table, Vec<Vec<u8>>)>,
    prefixes: PrefixRanges,
) -> Result<Prefetched, StoreError> {
    let target = &shared.target;
    let failed = |e: tokio_postgres::Error| classify(&e, "cannot read ahead", target);
    let client = shared.readers.get().await.map_err(|e| pool_error(e, target))?;
    // Prepared first (a round trip each, once per connection).
    let mut key_reads = Vec::new();
    for (table, keys) in &keys {
        let statement = client
            .prepare_cached(&shared.sql.get_many[*table as usize])
            .await
            .map_err(failed)?;
        for chunk in keys.chunks(KEYS_PER_READ) {
            key_reads.push((*table, statement.clone(), chunk));
        }
    }
    let mut prefix_reads = Vec::new();
    for (table, lows, highs) in &prefixes {
        let statement = client
            .prepare_cached(&shared.sql.occupied_prefixes[*table as usize])
            .await
            .map_err(failed)?;
        for (lows, highs) in lows.chunks(KEYS_PER_READ).zip(highs.chunks(KEYS_PER_READ)) {
            prefix_reads.push((*table, statement.clone(), lows, highs));
        }
    }
    let key_params: Vec<[&(dyn ToSql + Sync); 1]> = key_reads.iter().map(|(_, _, chunk)| [chunk as _]).collect();
    let prefix_params: Vec<[&(dyn ToSql + Sync); 2]> = prefix_reads
        .iter()
        .map(|(_, _, lows, highs)| [lows as _, highs as _])
        .collect();
    let key_pending: Vec<PendingRows<'_>> = key_reads
        .iter()
        .zip(&key_params)
        .map(|((_, statement, _), params)| -> PendingRows<'_> { Box::pin(client.query(statement, params)) })
        .collect();
    let prefix_pending: Vec<PendingRows<'_>> = prefix_reads
        .iter()
        .zip(&prefix_params)
        .map(|((_, statement, _, _), params)| -> PendingRows<'_> { Box::pin(client.query(statement, params)) })
        .collect();
    let (key_rows, prefix_rows) = futures::join!(
        futures::future::join_all(key_pending),
        futures::future::join_all(prefix_pending)
    );
    let mut found = Prefetched::default();
    for ((table, _, _), rows) in key_reads.iter().zip(key_rows) {
        for row in rows.map_err(failed)? {
            found.rows.push((*table, entry(*table, &row)?));
        }
    }
    for ((table, _, _, _), rows) in prefix_reads.iter().zip(prefix_rows) {
        for row in rows.map_err(failed)? {
            let prefix = row.try_get::<_, Vec<u8>>(0).map_err(|e| corrupt(*table, &e))?;
            found.occupied.push((*table, prefix));
        }
    }
    Ok(found)
}

pub(super) async fn scan(
    shared: Arc<Shared>,
    table: Table,
    start: Vec<u8>,
    end: Option<Vec<u8>>,
    limit: usize,
) -> Result<Vec<Entry>, StoreError> {
    let target = &shared.target;
    let failed = |e: tokio_postgres::Error| classify(&e, &format!("cannot scan {}", table.name()), target);
    let client = shared.readers.get().await.map_err(|e| pool_error(e, target))?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = match &end {
        Some(end) => {
            let statement = client
                .prepare_cached(&shared.sql.scan_bounded[table as usize])
                .await
                .map_err(failed)?;
            client.query(&statement, &[&start, end, &limit]).await
        }
        None => {
            let statement = client
                .prepare_cached(&shared.sql.scan_open[table as usize])
                .await
                .map_err(failed)?;
            client.query(&statement, &[&start, &limit]).await
        }
    }
    .map_err(failed)?;
    rows.iter().map(|row| entry(table, row)).collect()
}

fn entry(table: Table, row: &tokio_postgres::Row) -> Result<Entry, StoreError> {
    let key = row.try_get::<_, Vec<u8>>(0).map_err(|e| corrupt(table, &e))?;
    let value = row.try_get::<_, Vec<u8>>(1).map_err(|e| corrupt(table, &e))?;
    Ok((key, value))
}

fn corrupt(table: Table, e: &tokio_postgres::Error) -> StoreError {
    StoreError::Corrupt {
        table: table.name(),
        message: format!("a row that is no (bytea, bytea): {}", describe(e)),
    }
}

/// A statement's future, as the pipeline holds them.
type Pending<'a> = Pin<Box<dyn Future<Output = Result<u64, tokio_postgres::Error>> + Send + 'a>>;

/// Commits `writes` at `epoch` in one pipelined transaction (the module's
/// doc); gives the writes back for the cache. `pause` (tests only) holds
/// the transaction, and so the lease row's share lock, after the fence.
pub(super) async fn commit(
    shared: Arc<Shared>,
    epoch: u64,
    writes: Collapsed,
    pause: Option<Duration>,
) -> (Collapsed, Result<(), StoreError>) {
    let result = commit_writes(&shared, epoch, &writes, pause).await;
    (writes, result)
}

async fn commit_writes(
    shared: &Shared,
    epoch: u64,
    writes: &Collapsed,
    pause: Option<Duration>,
) -> Result<(), StoreError> {
    let target = &shared.target;
    let client = shared.writer.get().await.map_err(|e| pool_error(e, target))?;
    // Everything that may take a round trip of its own (preparing a
    // statement, once per connection) happens before the transaction.
    let mut statements = Vec::new();
    for (table, rows) in writes {
        let deleted: Vec<&[u8]> = rows
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.as_slice())
            .collect();
        let (keys, values): (Vec<&[u8]>, Vec<&[u8]>) = rows
            .iter()
            .filter_map(|(k, v)| v.as_deref().map(|v| (k.as_slice(), v)))
            .unzip();
        let prepare_failed = |e: tokio_postgres::Error| classify(&e, "cannot prepare a commit", target);
        if !deleted.is_empty() {
            let statement = client
                .prepare_cached(&shared.sql.delete[*table as usize])
                .await
                .map_err(prepare_failed)?;
            statements.push((statement, deleted, None));
        }
        if !keys.is_empty() {
            let statement = client
                .prepare_cached(&shared.sql.upsert[*table as usize])
                .await
                .map_err(prepare_failed)?;
            statements.push((statement, keys, Some(values)));
        }
    }
    // The region is a region id ([a-z][a-z0-9-]*) and the epoch a number:
    // safe to write into the text of the simple query that opens the
    // transaction, so BEGIN and the fence are one message, and no
    // statement can ever run outside the transaction.
    let mut head = format!(
        "BEGIN; SELECT {}.fence('{}', {epoch})",
        shared.schema,
        shared.region.replace('\'', "''")
    );
    if let Some(pause) = pause {
        head.push_str(&format!("; SELECT pg_sleep({})", pause.as_secs_f64()));
    }
    let params: Vec<Vec<&(dyn ToSql + Sync)>> = statements
        .iter()
        .map(|(_, keys, values)| {
            let mut params: Vec<&(dyn ToSql + Sync)> = vec![keys];
            if let Some(values) = values {
                params.push(values);
            }
            params
        })
        .collect();
    let pending: Vec<Pending<'_>> = statements
        .iter()
        .zip(&params)
        .map(|((statement, _, _), params)| -> Pending<'_> { Box::pin(client.execute(statement, params.as_slice())) })
        .collect();
    // Polled in order, so sent in order, in one write.
    let (begun, applied, committed) = futures::join!(
        client.batch_execute(&head),
        futures::future::join_all(pending),
        client.batch_execute("COMMIT")
    );
    let unknown = |e: &tokio_postgres::Error| {
        StoreError::CommitOutcomeUnknown(format!(
            "{target}: the connection failed during a commit: {}",
            describe(e)
        ))
    };
    // The fence (or BEGIN) refused: the transaction is aborted, the COMMIT
    // rolled it back.
    if let Err(e) = &begun {
        if let Some(db) = e.as_db_error() {
            if db.code().code() == FENCED_SQLSTATE {
                let current = db.detail().and_then(|d| d.parse().ok()).unwrap_or(0);
                return Err(StoreError::Fenced { held: epoch, current });
            }
            return Err(classify(e, "a commit was refused", target));
        }
        return Err(unknown(e));
    }
    for result in &applied {
        if let Err(e) = result {
            if e.as_db_error().is_some() {
                // The transaction aborted; the COMMIT rolled it back.
                return Err(classify(e, "a commit was refused", target));
            }
            return Err(unknown(e));
        }
    }
    match committed {
        Ok(()) => Ok(()),
        Err(e) if e.as_db_error().is_some() => Err(classify(&e, "a COMMIT was refused", target)),
        Err(e) => Err(unknown(&e)),
    }
}

/// A statement that needs nothing but a connection: whether the server
/// answers (what a reopen checks before the writer retries).
pub(super) async fn ping(shared: Arc<Shared>) -> Result<(), StoreError> {
    let target = &shared.target;
    let client = shared.writer.get().await.map_err(|e| pool_error(e, target))?;
    client
        .batch_execute("SELECT 1")
        .await
        .map_err(|e| classify(&e, "the server does not answer", target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_bounds_exclude_after_and_stop_at_the_prefix_successor() {
        assert_eq!(scan_bounds(b"a/x/", None), (b"a/x/".to_vec(), Some(b"a/x0".to_vec())));
        assert_eq!(
            scan_bounds(b"a/x/", Some(b"a/x/1")),
            (b"a/x/1\0".to_vec(), Some(b"a/x0".to_vec()))
        );
        assert_eq!(
            scan_bounds(b"a/x/", Some(b"a/w")),
            (b"a/x/".to_vec(), Some(b"a/x0".to_vec()))
        );
        assert_eq!(scan_bounds(b"", None), (Vec::new(), None));
        assert_eq!(scan_bounds(&[0xff, 0xff], None), (vec![0xff, 0xff], None));
        assert_eq!(scan_bounds(&[0x01, 0xff], None), (vec![0x01, 0xff], Some(vec![0x02])));
    }

    #[test]
    fn a_batch_collapses_to_its_last_write_per_key() {
        let writes = collapse(vec![
            (Table::Meta, b"k".to_vec(), Some(b"1".to_vec())),
            (Table::Meta, b"k".to_vec(), None),
            (Table::Meta, b"j".to_vec(), None),
            (Table::Meta, b"j".to_vec(), Some(b"2".to_vec())),
            (Table::Outbox, b"k".to_vec(), Some(b"3".to_vec())),
        ]);
        let meta = &writes[&Table::Meta];
        assert_eq!(meta[b"k".as_slice()], None);
        assert_eq!(meta[b"j".as_slice()], Some(b"2".to_vec()));
        assert_eq!(writes[&Table::Outbox][b"k".as_slice()], Some(b"3".to_vec()));
    }
}
