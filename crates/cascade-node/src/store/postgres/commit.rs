//! The statements of the PostgreSQL store: reads, and the transaction
//! that lands the staged batches (`staged.rs`), fenced first.
//!
//! A flush sends, in one write and so in one round trip:
//!
//! ```sql
//! BEGIN; SELECT {schema}.fence('region', epoch);   -- one simple query
//! WITH w0 AS (DELETE FROM {schema}.t WHERE k = ANY($1::bytea[])),
//!                                                   -- per table written, at most one
//!      w1 AS (INSERT INTO {schema}.t (k, v) SELECT * FROM unnest($2::bytea[], $3::bytea[])),
//!                                                   -- keys known absent, at most one
//!      w2 AS (INSERT INTO {schema}.t (k, v) SELECT * FROM unnest($4::bytea[], $5::bytea[])
//!             ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v), -- the other puts, at most one
//!      ...                                          -- the same for every table written
//! SELECT 1;
//! SELECT (SELECT k FROM {schema}.t ORDER BY k DESC LIMIT 1); -- tables whose highest key is not known
//! COMMIT;
//! ```
//!
//! The writes are one statement when there are two parts or more
//! ([`Statements::merged`], which says why; a flush of one part, or of a
//! shape past the bound, sends each part as a statement of its own:
//! `DELETE FROM {schema}.t WHERE k = ANY($1::bytea[])`, and so on).
//!
//! What it sends is every batch committed since the last flush, as
//! staging left them: the last write per key, per table (an upsert may
//! not touch a row twice), so a group of steps costs one part of each
//! kind per table, not one per step. It is planned ([`plan`]) against what
//! the server holds: a removal of a key known absent is dropped, and a
//! put of a key known absent is a plain INSERT, which costs PostgreSQL
//! about half of an upsert's (no conflict probe, no speculative insertion
//! and its confirmation record: 3.6 against 6.3 ms for 512 rows of 300
//! bytes on this machine, loaded). What is known comes from the
//! write-through cache (`cache.rs`), which is coherent because only the
//! fenced writer writes, and which takes staged writes only once they
//! landed: a key it read and found absent (a key it removed is
//! forgotten, not kept: `cache.rs`, `commit_ended`), a key under a prefix
//! it knows empty, and a key above the table's highest key (learnt by the
//! first transaction into the table after a fence, kept up by every put
//! since). A fence that fails raises, which aborts the transaction: every
//! statement after it fails and the COMMIT rolls back, so nothing of a
//! fenced flush lands though it was all sent. The outcome is read from the
//! answers in order: a fence error is [`StoreError::Fenced`]; an error the
//! server sent for a statement means the transaction rolled back; a
//! connection lost before the COMMIT's answer is
//! [`StoreError::CommitOutcomeUnknown`] (it may have landed). No COMMIT is
//! ever cut short by a client-side timeout: the session's
//! `statement_timeout` bounds the statements, and TCP's user timeout a
//! dead connection.
//!
//! Size: about 830 lines. The statements' SQL (one per part, or one
//! statement of every part), the parameters each form takes, and the
//! fenced transaction that sends them hold one invariant together: a
//! flush's writes land all in one transaction after the fence, or none.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_postgres::types::ToSql;

use super::migrate::FENCED_SQLSTATE;
use super::settings::{classify, describe, pool_error};
use super::Shared;
use crate::store::{Entry, StoreError, Table};

/// Writes reduced to the last write of each key, per table (in key
/// order, so two transactions would lock rows in the same order): what
/// the staged batches come to (`staged.rs`).
pub(super) type Collapsed = BTreeMap<Table, BTreeMap<Vec<u8>, Option<Vec<u8>>>>;

/// How a flush sends one staged write of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SentAs {
    /// A removal of a key known absent: nothing.
    Nothing,
    Delete,
    /// A put of a key known absent: a plain INSERT.
    Insert,
    /// Any other put.
    Upsert,
}

/// One table's part of a flush's plan: how each of its staged writes is
/// sent, in their (key) order, and whether the transaction also reads the
/// table's highest key (after its writes).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct TablePlan {
    pub(super) sent_as: Vec<SentAs>,
    pub(super) learn_highest: bool,
}

/// A flush's plan, per table of the staged writes.
pub(super) type Plan = BTreeMap<Table, TablePlan>;

/// Keys, or keys and their values as two arrays (the statements'
/// parameters), borrowed from the staged writes.
#[derive(Debug, Default)]
struct Rows<'a> {
    keys: Vec<&'a [u8]>,
    values: Vec<&'a [u8]>,
}

/// One table's statements (keys in order within each part).
#[derive(Debug, Default)]
struct TableWrites<'a> {
    removed: Vec<&'a [u8]>,
    inserted: Rows<'a>,
    upserted: Rows<'a>,
    learn_highest: bool,
}

/// What a commit learnt: per table whose highest key it read, that key
/// (None: the table is empty).
pub(super) type Learnt = Vec<(Table, Option<Vec<u8>>)>;

/// What a plan asks about a key it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Asked {
    /// A put: known absent, it is a plain INSERT (half an upsert's cost
    /// to the server), worth a lookup of the cache.
    Put,
    /// A removal: known absent, it is dropped. The cache answers only
    /// what it knows without a lookup of the key (above the table's
    /// highest): a cascade removes rows the writer read, so its removals
    /// are nearly never absent (1.5 of 2,066 keys a flight of a P1 flat),
    /// and a lookup per removal was two thirds of the plan, on the
    /// writer's thread between two flights, while the server waited
    /// (docs/BENCHMARKS.md, "PostgreSQL: the gap between two flights").
    Removal,
}

/// Decides how each of `writes` is sent: `absent` says whether a key is
/// known not to be in the table on the server (as of the last flush),
/// as far as the cache looks for what is [`Asked`], and `highest_known`
/// whether the table's highest key is known.
pub(super) fn plan(
    writes: &Collapsed,
    absent: impl Fn(Table, &[u8], Asked) -> bool,
    highest_known: impl Fn(Table) -> bool,
) -> Plan {
    writes
        .iter()
        .map(|(table, rows)| {
            let sent_as: Vec<SentAs> = rows
                .iter()
                .map(|(key, value)| match value {
                    None if absent(*table, key, Asked::Removal) => SentAs::Nothing,
                    None => SentAs::Delete,
                    Some(_) if absent(*table, key, Asked::Put) => SentAs::Insert,
                    Some(_) => SentAs::Upsert,
                })
                .collect();
            let puts_something = sent_as.iter().any(|s| matches!(s, SentAs::Insert | SentAs::Upsert));
            let learn_highest = puts_something && !highest_known(*table);
            (*table, TablePlan { sent_as, learn_highest })
        })
        .collect()
}

/// The statements' parameters of `plan` (made by [`plan`] from `writes`).
fn table_writes<'a>(writes: &'a Collapsed, plan: &Plan) -> Vec<(Table, TableWrites<'a>)> {
    writes
        .iter()
        .zip(plan.values())
        .map(|((table, rows), planned)| {
            let mut sent = TableWrites {
                learn_highest: planned.learn_highest,
                ..TableWrites::default()
            };
            for ((key, value), send) in rows.iter().zip(&planned.sent_as) {
                match (send, value) {
                    (SentAs::Delete, _) => sent.removed.push(key),
                    (SentAs::Insert, Some(value)) => {
                        sent.inserted.keys.push(key);
                        sent.inserted.values.push(value);
                    }
                    (SentAs::Upsert, Some(value)) => {
                        sent.upserted.keys.push(key);
                        sent.upserted.values.push(value);
                    }
                    _ => {}
                }
            }
            (*table, sent)
        })
        .collect()
}

/// Every write `plan` sends of `writes`, as the cache takes them once
/// they landed (a removal of a key known absent is not one).
pub(super) fn sent<'a>(
    writes: &'a Collapsed,
    plan: &'a Plan,
) -> impl Iterator<Item = (Table, &'a [u8], Option<&'a [u8]>)> + 'a {
    writes.iter().zip(plan.values()).flat_map(|((table, rows), planned)| {
        rows.iter()
            .zip(&planned.sent_as)
            .filter(|(_, send)| **send != SentAs::Nothing)
            .map(|((key, value), _)| (*table, key.as_slice(), value.as_deref()))
    })
}

/// Keys asked for in one `= ANY($1)` statement.
const KEYS_PER_READ: usize = 1000;

/// The SQL of every statement, per table, with the schema written in.
pub(super) struct Statements {
    schema: String,
    /// The one-statement forms of a flush's writes ([`Statements::merged`]),
    /// by shape; at most [`MAX_MERGED_SHAPES`].
    merged: Mutex<HashMap<Shape, Arc<str>>>,
    get: Vec<String>,
    get_many: Vec<String>,
    occupied_prefixes: Vec<String>,
    scan_bounded: Vec<String>,
    scan_open: Vec<String>,
    delete: Vec<String>,
    insert: Vec<String>,
    upsert: Vec<String>,
    highest: Vec<String>,
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
            schema: schema.to_owned(),
            merged: Mutex::new(HashMap::new()),
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
            insert: per_table(&|t| format!("INSERT INTO {t} (k, v) SELECT * FROM unnest($1::bytea[], $2::bytea[])")),
            highest: per_table(&|t| format!("SELECT (SELECT k FROM {t} ORDER BY k DESC LIMIT 1)")),
            upsert: per_table(&|t| {
                format!(
                    "INSERT INTO {t} (k, v) SELECT * FROM unnest($1::bytea[], $2::bytea[]) \
                     ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v"
                )
            }),
        }
    }
}

/// A flush's writes of one table, of one kind: a statement of their own,
/// or a part of the flush's one statement ([`Statements::merged`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Kind {
    Delete,
    Insert,
    Upsert,
}

/// Which tables a flush writes, and how, in the order it sends them.
type Shape = Vec<(Table, Kind)>;

/// Shapes (which tables a flush writes, and how) whose one-statement form
/// is kept: a connection prepares each once and keeps it, so the shapes
/// are bounded; a flush of another shape sends a statement per part, as
/// before. A P1's steps come in a handful of shapes.
const MAX_MERGED_SHAPES: usize = 64;

impl Statements {
    /// The SQL of one statement doing every part of `shape` (in order;
    /// its parameters are each part's arrays in that order, one for a
    /// removal, two for a put), or None once [`MAX_MERGED_SHAPES`] other
    /// shapes are kept.
    ///
    /// Why one statement: each statement costs the server about 20–25 µs
    /// of CPU whatever it writes (bind, executor start and end, the
    /// statistics, a `Sync` and its answer: measured with pgbench on the
    /// long-running server, docs/BENCHMARKS.md "PostgreSQL: where the CPU
    /// of a deletion goes"), and a P1 step's flush sent about ten of them.
    /// Why it is the same transaction's writes: data-modifying `WITH`
    /// parts all run, to completion, in the one statement; the parts
    /// touch disjoint rows (a flush sends one write per key and table:
    /// `Collapsed`), so no part depends on another's effect, and an error
    /// in any part aborts the statement and so the transaction, as an
    /// error in a statement of its own did. The tables' highest keys,
    /// which must see the writes, are still read by statements after it.
    fn merged(&self, shape: &[(Table, Kind)]) -> Option<Arc<str>> {
        let mut merged = self.merged.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sql) = merged.get(shape) {
            return Some(sql.clone());
        }
        if merged.len() >= MAX_MERGED_SHAPES {
            return None;
        }
        let mut parts = Vec::with_capacity(shape.len());
        let mut param = 1;
        for (i, (table, kind)) in shape.iter().enumerate() {
            let t = format!("{}.{}", self.schema, table.name());
            parts.push(match kind {
                Kind::Delete => {
                    param += 1;
                    format!("w{i} AS (DELETE FROM {t} WHERE k = ANY(${}::bytea[]))", param - 1)
                }
                Kind::Insert | Kind::Upsert => {
                    param += 2;
                    let on_conflict = if *kind == Kind::Upsert {
                        " ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v"
                    } else {
                        ""
                    };
                    format!(
                        "w{i} AS (INSERT INTO {t} (k, v) SELECT * FROM unnest(${}::bytea[], ${}::bytea[]){on_conflict})",
                        param - 2,
                        param - 1
                    )
                }
            });
        }
        let sql: Arc<str> = format!("WITH {} SELECT 1", parts.join(", ")).into();
        merged.insert(shape.to_vec(), sql.clone());
        Some(sql)
    }
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
    (start, crate::store::prefix_end(prefix))
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

/// What a prefetch found: the rows of the keys asked that exist, the
/// prefixes asked that hold a row (the others hold none), and the highest
/// key of the tables asked for it.
#[derive(Default)]
pub(super) struct Prefetched {
    pub(super) rows: Vec<(Table, Entry)>,
    pub(super) occupied: Vec<(Table, Vec<u8>)>,
    pub(super) highest: Learnt,
}

/// Per table, prefixes to probe and the ends of their ranges (in order).
pub(super) type PrefixRanges = Vec<(Table, Vec<Vec<u8>>, Vec<Vec<u8>>)>;

/// A read's future, as a prefetch's pipeline holds them.
type PendingRows<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>> + Send + 'a>>;

/// Reads `keys`, whether each of `prefixes` (with its range's end) holds
/// a row, and the highest key of each of `highest`, on one connection,
/// every statement sent before the first answer is awaited: one round
/// trip for all (a statement per table and kind, and per
/// [`KEYS_PER_READ`] keys).
pub(super) async fn prefetch(
    shared: Arc<Shared>,
    keys: Arc<Vec<(Table, Vec<Vec<u8>>)>>,
    prefixes: Arc<PrefixRanges>,
    highest: Vec<Table>,
) -> Result<Prefetched, StoreError> {
    let target = &shared.target;
    let failed = |e: tokio_postgres::Error| classify(&e, "cannot read ahead", target);
    let client = shared.readers.get().await.map_err(|e| pool_error(e, target))?;
    // Prepared first (a round trip each, once per connection).
    let mut key_reads = Vec::new();
    for (table, keys) in keys.iter() {
        let statement = client
            .prepare_cached(&shared.sql.get_many[*table as usize])
            .await
            .map_err(failed)?;
        for chunk in keys.chunks(KEYS_PER_READ) {
            key_reads.push((*table, statement.clone(), chunk));
        }
    }
    let mut prefix_reads = Vec::new();
    for (table, lows, highs) in prefixes.iter() {
        let statement = client
            .prepare_cached(&shared.sql.occupied_prefixes[*table as usize])
            .await
            .map_err(failed)?;
        for (lows, highs) in lows.chunks(KEYS_PER_READ).zip(highs.chunks(KEYS_PER_READ)) {
            prefix_reads.push((*table, statement.clone(), lows, highs));
        }
    }
    let mut highest_reads = Vec::new();
    for table in &highest {
        let statement = client
            .prepare_cached(&shared.sql.highest[*table as usize])
            .await
            .map_err(failed)?;
        highest_reads.push((*table, statement));
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
    let highest_pending: Vec<PendingRows<'_>> = highest_reads
        .iter()
        .map(|(_, statement)| -> PendingRows<'_> { Box::pin(client.query(statement, &[])) })
        .collect();
    let (key_rows, prefix_rows, highest_rows) = futures::join!(
        futures::future::join_all(key_pending),
        futures::future::join_all(prefix_pending),
        futures::future::join_all(highest_pending)
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
    for ((table, _), rows) in highest_reads.iter().zip(highest_rows) {
        for row in rows.map_err(failed)? {
            let key = row.try_get::<_, Option<Vec<u8>>>(0).map_err(|e| corrupt(*table, &e))?;
            found.highest.push((*table, key));
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

/// A statement's future, as the pipeline holds them: rows affected, or
/// (the highest-key reads) the key.
type Pending<'a> = Pin<Box<dyn Future<Output = Result<Answer, tokio_postgres::Error>> + Send + 'a>>;

/// What a statement of a commit answered.
enum Answer {
    Applied,
    /// The table's highest key (None: no row), or, None, an answer that
    /// did not decode (nothing learnt).
    Highest(Table, Option<Option<Vec<u8>>>),
}

/// Commits `writes` as `plan` says, at `epoch`, in one pipelined
/// transaction (the module's doc); gives the plan back (the cache takes
/// what it sent), and the highest keys read. `pause` (tests only) holds
/// the transaction, and so the lease row's share lock, after the fence.
/// What [`commit`] gives back.
pub(super) type Outcome = (Plan, Result<Learnt, StoreError>);

/// A [`commit`] running on the store's runtime.
pub(super) type Task = tokio::task::JoinHandle<Outcome>;

pub(super) async fn commit(
    shared: Arc<Shared>,
    epoch: u64,
    writes: Arc<Collapsed>,
    plan: Plan,
    pause: Option<Duration>,
) -> Outcome {
    let result = commit_writes(&shared, epoch, &table_writes(&writes, &plan), pause).await;
    (plan, result)
}

/// What one statement of a commit sends.
#[derive(Clone)]
enum Sent<'a> {
    Keys(&'a Vec<&'a [u8]>),
    Rows(&'a Rows<'a>),
    Highest(Table),
    /// The parameters of every part of a merged statement, in order.
    Merged(Vec<Sent<'a>>),
}

impl<'a> Sent<'a> {
    /// The statement's parameters, appended to `params`.
    fn params(&self, params: &mut Vec<&'a (dyn ToSql + Sync)>) {
        match self {
            Sent::Keys(keys) => params.push(*keys as &(dyn ToSql + Sync)),
            Sent::Rows(rows) => {
                params.push(&rows.keys as &(dyn ToSql + Sync));
                params.push(&rows.values);
            }
            Sent::Highest(_) => {}
            Sent::Merged(parts) => parts.iter().for_each(|part| part.params(params)),
        }
    }
}

async fn commit_writes(
    shared: &Shared,
    epoch: u64,
    writes: &[(Table, TableWrites<'_>)],
    pause: Option<Duration>,
) -> Result<Learnt, StoreError> {
    let target = &shared.target;
    let client = shared.writer.get().await.map_err(|e| pool_error(e, target))?;
    let prepare_failed = |e: tokio_postgres::Error| classify(&e, "cannot prepare a commit", target);
    // Everything that may take a round trip of its own (preparing a
    // statement, once per connection) happens before the transaction.
    let mut parts = Vec::new();
    let mut highest = Vec::new();
    for (table, rows) in writes {
        let sql = &shared.sql;
        let t = *table as usize;
        let table_parts = [
            (!rows.removed.is_empty()).then(|| (Kind::Delete, &sql.delete[t], Sent::Keys(&rows.removed))),
            (!rows.inserted.keys.is_empty()).then(|| (Kind::Insert, &sql.insert[t], Sent::Rows(&rows.inserted))),
            (!rows.upserted.keys.is_empty()).then(|| (Kind::Upsert, &sql.upsert[t], Sent::Rows(&rows.upserted))),
        ];
        parts.extend(
            table_parts
                .into_iter()
                .flatten()
                .map(|(kind, text, sent)| (*table, kind, text, sent)),
        );
        if rows.learn_highest {
            highest.push((&sql.highest[t], Sent::Highest(*table)));
        }
    }
    // Two parts or more: one statement for all of them (`Statements::merged`).
    let shape: Shape = parts.iter().map(|(table, kind, _, _)| (*table, *kind)).collect();
    let merged = (parts.len() >= 2).then(|| shared.sql.merged(&shape)).flatten();
    let mut statements = Vec::new();
    match &merged {
        Some(text) => {
            let statement = client.prepare_cached(text).await.map_err(prepare_failed)?;
            let sent = parts.iter().map(|(_, _, _, sent)| sent.clone()).collect();
            statements.push((statement, Sent::Merged(sent)));
        }
        None => {
            for (_, _, text, sent) in parts {
                let statement = client.prepare_cached(text).await.map_err(prepare_failed)?;
                statements.push((statement, sent));
            }
        }
    }
    for (text, sent) in highest {
        let statement = client.prepare_cached(text).await.map_err(prepare_failed)?;
        statements.push((statement, sent));
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
        .map(|(_, sent)| {
            let mut params = Vec::new();
            sent.params(&mut params);
            params
        })
        .collect();
    let client = &client;
    let pending: Vec<Pending<'_>> = statements
        .iter()
        .zip(&params)
        .map(|((statement, sent), params)| -> Pending<'_> {
            match sent {
                Sent::Highest(table) => {
                    let table = *table;
                    Box::pin(async move {
                        let row = client.query_one(statement, &[]).await?;
                        Ok(Answer::Highest(table, row.try_get::<_, Option<Vec<u8>>>(0).ok()))
                    })
                }
                _ => Box::pin(async move {
                    client.execute(statement, params.as_slice()).await?;
                    Ok(Answer::Applied)
                }),
            }
        })
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
    let mut learnt = Learnt::new();
    for result in applied {
        match result {
            Ok(Answer::Applied | Answer::Highest(_, None)) => {}
            Ok(Answer::Highest(table, Some(key))) => learnt.push((table, key)),
            // The transaction aborted; the COMMIT rolled it back.
            Err(e) if e.as_db_error().is_some() => return Err(classify(&e, "a commit was refused", target)),
            Err(e) => return Err(unknown(&e)),
        }
    }
    match committed {
        Ok(()) => Ok(learnt),
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

    /// Writes as staging leaves them: the last per key, per table.
    fn collapsed(ops: &[(Table, &str, Option<&str>)]) -> Collapsed {
        let mut writes = Collapsed::new();
        for (table, key, value) in ops {
            writes
                .entry(*table)
                .or_default()
                .insert(key.as_bytes().to_vec(), value.map(|v| v.as_bytes().to_vec()));
        }
        writes
    }

    #[test]
    fn a_plan_inserts_and_drops_what_is_known_absent_and_upserts_the_rest() {
        let writes = collapsed(&[
            (Table::Outbox, "9", Some("e")),
            (Table::Outbox, "3", Some("e")),
            (Table::Resources, "gone", None),
            (Table::Resources, "never", None),
            (Table::Resources, "new", Some("r")),
            (Table::Resources, "old", Some("r")),
            (Table::Meta, "absent", None),
        ]);
        // Known: outbox keys above "5"; "never", "new" and "absent" absent.
        let absent = |table: Table, key: &[u8], _| match table {
            Table::Outbox => key > b"5".as_slice(),
            _ => [b"never".as_slice(), b"new", b"absent"].contains(&key),
        };
        let plan = plan(&writes, absent, |table| table == Table::Outbox);
        let statements = table_writes(&writes, &plan);
        let of = |table: Table| &statements.iter().find(|(t, _)| *t == table).unwrap().1;
        let outbox = of(Table::Outbox);
        assert_eq!(outbox.inserted.keys, vec![b"9".as_slice()]);
        assert_eq!(outbox.upserted.keys, vec![b"3".as_slice()]);
        assert!(!outbox.learn_highest, "known already");
        let resources = of(Table::Resources);
        assert_eq!(
            resources.removed,
            vec![b"gone".as_slice()],
            "a removal of an absent key is dropped"
        );
        assert_eq!(resources.inserted.keys, vec![b"new".as_slice()]);
        assert_eq!(resources.inserted.values, vec![b"r".as_slice()]);
        assert_eq!(resources.upserted.keys, vec![b"old".as_slice()]);
        assert!(resources.learn_highest);
        let meta = of(Table::Meta);
        assert!(
            meta.removed.is_empty() && meta.inserted.keys.is_empty() && meta.upserted.keys.is_empty(),
            "nothing left to send"
        );
        let cached: Vec<_> = sent(&writes, &plan)
            .filter(|(t, _, _)| *t == Table::Resources)
            .collect();
        assert_eq!(cached.len(), 3, "the cache takes what was sent");
    }

    /// A merged statement numbers each part's arrays in order, and the
    /// shapes kept are bounded: past the bound a new shape gets none (its
    /// parts are sent one by one) while a shape kept still gets its own.
    #[test]
    fn a_merged_flush_numbers_its_parts_in_order_and_its_shapes_are_bounded() {
        let statements = Statements::new("s");
        let shape = [
            (Table::Resources, Kind::Delete),
            (Table::Outcomes, Kind::Insert),
            (Table::Meta, Kind::Upsert),
        ];
        let sql = statements.merged(&shape).expect("room for it");
        assert_eq!(
            &*sql,
            "WITH w0 AS (DELETE FROM s.resources WHERE k = ANY($1::bytea[])), \
             w1 AS (INSERT INTO s.outcomes (k, v) SELECT * FROM unnest($2::bytea[], $3::bytea[])), \
             w2 AS (INSERT INTO s.meta (k, v) SELECT * FROM unnest($4::bytea[], $5::bytea[]) \
             ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v) SELECT 1"
        );
        // Fill the bound with other shapes.
        let mut kept = 1;
        'fill: for a in Table::ALL {
            for b in Table::ALL {
                if kept == MAX_MERGED_SHAPES {
                    break 'fill;
                }
                if statements.merged(&[(a, Kind::Insert), (b, Kind::Delete)]).is_some() {
                    kept += 1;
                }
            }
        }
        assert!(statements
            .merged(&[(Table::Audit, Kind::Upsert), (Table::Meta, Kind::Upsert)])
            .is_none());
        assert_eq!(statements.merged(&shape), Some(sql), "a kept shape");
    }
}
