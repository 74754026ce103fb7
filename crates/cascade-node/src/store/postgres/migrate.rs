//! The region's PostgreSQL schema: created and migrated at open, under an
//! advisory lock (two nodes starting at once must not both create it),
//! with the region and cluster it belongs to recorded on first start and
//! checked at every start after.
//!
//! Versions are numbered from 1; `schema_migrations` holds one row per
//! version applied. A schema at a version above [`SCHEMA_VERSION`] was
//! written by a newer binary and is refused: this one would not know what
//! the newer one keeps there.

use deadpool_postgres::Object;

use super::settings::{describe, Target};
use crate::store::{StoreError, Table};

/// The newest schema version this binary writes and reads.
pub const SCHEMA_VERSION: i32 = 1;

/// Migration `n` (1-based) is `MIGRATIONS[n - 1]`, with `{s}` the schema.
const MIGRATIONS: [&str; SCHEMA_VERSION as usize] = [MIGRATION_1];

/// The lease and the fence (see `lease.rs`), the members, the identity;
/// the tables of the region are added per [`Table`] by [`tables_sql`].
const MIGRATION_1: &str = r#"
CREATE TABLE {s}.identity (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    region text NOT NULL,
    cluster text NOT NULL
);
CREATE TABLE {s}.lease (
    region text PRIMARY KEY,
    epoch bigint NOT NULL DEFAULT 0,
    holder text,
    address text,
    version text,
    holder_pid integer,
    expires_at timestamptz NOT NULL DEFAULT '-infinity'
);
CREATE TABLE {s}.members (
    region text NOT NULL,
    node text NOT NULL,
    address text NOT NULL,
    version text NOT NULL,
    seen_at timestamptz NOT NULL,
    PRIMARY KEY (region, node)
);
-- Every commit's first statement, inside its transaction: the lease row
-- locked FOR SHARE at the writer's epoch. A takeover's UPDATE waits for
-- the lock, and a fence queued behind a takeover re-reads the row and
-- finds another epoch. Raises CF001 (its detail: the epoch now), which
-- aborts the transaction, so nothing pipelined after it lands.
CREATE FUNCTION {s}.fence(p_region text, p_epoch bigint) RETURNS void
LANGUAGE plpgsql AS $fence$
DECLARE
    current_epoch bigint;
BEGIN
    PERFORM 1 FROM {s}.lease WHERE region = p_region AND epoch = p_epoch FOR SHARE;
    IF NOT FOUND THEN
        SELECT epoch INTO current_epoch FROM {s}.lease WHERE region = p_region;
        RAISE EXCEPTION 'fenced: the writer lease of region % is at epoch %, not %',
            p_region, coalesce(current_epoch, 0), p_epoch
            USING ERRCODE = 'CF001', DETAIL = coalesce(current_epoch, 0)::text;
    END IF;
END
$fence$;
"#;

/// SQLSTATE of a fenced commit (raised by `fence`).
pub(super) const FENCED_SQLSTATE: &str = "CF001";

/// The tables of version 1, one per [`Table`] as it was then. Frozen: a
/// table added later is created by a migration of its own, so that a
/// schema of an older version gets it too (the test below fails until
/// then).
const TABLES_OF_VERSION_1: [&str; 16] = [
    "resources",
    "uid_index",
    "backrefs",
    "blocking_backrefs",
    "deletions",
    "operations",
    "outcomes",
    "retry_queue",
    "due_index",
    "outbox",
    "meta",
    "remote_deletions",
    "pending_releases",
    "cursors",
    "pending_attach",
    "audit",
];

/// One `(k bytea PRIMARY KEY, v bytea NOT NULL)` table per table of
/// version 1: bytea compares bytewise, so scans come in sled's and
/// fjall's order.
fn tables_sql(schema: &str) -> String {
    let mut sql = String::new();
    for table in TABLES_OF_VERSION_1 {
        sql.push_str(&format!(
            "CREATE TABLE {schema}.{table} (k bytea PRIMARY KEY, v bytea NOT NULL);\n"
        ));
    }
    // The queues a cascade churns through: vacuumed well before the
    // default 20 % of dead rows.
    for table in [Table::Outbox, Table::Backrefs, Table::DueIndex, Table::RetryQueue] {
        sql.push_str(&format!(
            "ALTER TABLE {schema}.{} SET (autovacuum_vacuum_scale_factor = 0.02);\n",
            table.name()
        ));
    }
    sql
}

/// Creates or migrates the schema, checks (or records) whose it is, and
/// makes sure the region's lease row exists; one transaction.
pub(super) async fn migrate(
    client: &mut Object,
    schema: &str,
    region: &str,
    cluster: &str,
    target: &Target,
) -> Result<(), StoreError> {
    let failed = |doing: &str, e: tokio_postgres::Error| {
        StoreError::Engine(format!("{target}: {doing} schema {schema:?}: {}", describe(&e)))
    };
    let tx = client
        .transaction()
        .await
        .map_err(|e| failed("cannot begin to migrate", e))?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext($1))",
        &[&format!("cascade migrate {schema}")],
    )
    .await
    .map_err(|e| failed("cannot lock, to migrate,", e))?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
         CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
             version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
    ))
    .await
    .map_err(|e| failed("cannot create", e))?;
    let row = tx
        .query_one(
            &format!("SELECT coalesce(max(version), 0) FROM {schema}.schema_migrations"),
            &[],
        )
        .await
        .map_err(|e| failed("cannot read the version of", e))?;
    let found: i32 = row.get(0);
    if found > SCHEMA_VERSION {
        return Err(StoreError::Engine(format!(
            "{target}: schema {schema:?} is at version {found}, but this binary knows versions up to \
             {SCHEMA_VERSION}: a newer cascade wrote it; run that version (or newer) on this database"
        )));
    }
    for version in found + 1..=SCHEMA_VERSION {
        let mut sql = MIGRATIONS[(version - 1) as usize].replace("{s}", schema);
        if version == 1 {
            sql.push_str(&tables_sql(schema));
        }
        tx.batch_execute(&sql)
            .await
            .map_err(|e| failed(&format!("cannot migrate to version {version}"), e))?;
        tx.execute(
            &format!("INSERT INTO {schema}.schema_migrations (version) VALUES ($1)"),
            &[&version],
        )
        .await
        .map_err(|e| failed("cannot record the version of", e))?;
    }
    let recorded = tx
        .query_opt(&format!("SELECT region, cluster FROM {schema}.identity"), &[])
        .await
        .map_err(|e| failed("cannot read whose is", e))?;
    match recorded {
        Some(row) => {
            let (owner, owner_cluster): (String, String) = (row.get(0), row.get(1));
            if owner != region || owner_cluster != cluster {
                return Err(StoreError::Engine(format!(
                    "{target}: schema {schema:?} belongs to region {owner:?} of cluster {owner_cluster:?}, \
                     not to this node's region {region:?} of cluster {cluster:?}: give each region its own \
                     schema ([storage] schema) and check the cluster name"
                )));
            }
        }
        None => {
            tx.execute(
                &format!("INSERT INTO {schema}.identity (region, cluster) VALUES ($1, $2)"),
                &[&region, &cluster],
            )
            .await
            .map_err(|e| failed("cannot record whose is", e))?;
        }
    }
    tx.execute(
        &format!("INSERT INTO {schema}.lease (region) VALUES ($1) ON CONFLICT DO NOTHING"),
        &[&region],
    )
    .await
    .map_err(|e| failed("cannot create the lease row in", e))?;
    tx.commit()
        .await
        .map_err(|e| failed("cannot commit the migration of", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_is_created_by_a_migration() {
        let created: Vec<&str> = TABLES_OF_VERSION_1.to_vec();
        let missing: Vec<&str> = Table::ALL
            .iter()
            .map(|t| t.name())
            .filter(|name| !created.contains(name))
            .collect();
        assert!(
            missing.is_empty(),
            "{missing:?} need a migration that creates them (and SCHEMA_VERSION + 1)"
        );
    }
}
