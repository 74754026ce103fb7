//! The PostgreSQL store over a real server (`cascade-testpg`: one server
//! per test binary, a database per test; skipped, saying so once, when
//! PostgreSQL is not installed).
//!
//! Size: the store's tests over one server share their helpers (a fenced
//! writer, `land`, `eventually`, reading rows behind the store's back);
//! split by topic, each file would repeat them.

// Test code: poll deadlines and waits are real time.
#![allow(clippy::disallowed_methods)]

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use cascade_core::RegionId;
use cascade_testpg::{fresh_database, TestDatabase, TestServer, PASSWORD};

use super::*;
use crate::store::tests::{batches_are_atomic_to_readers, conformance, put, survives_reopen};
use crate::store::{DiskCondition, LeaseHolder, Prefetch, WriterLease};

const CLUSTER: &str = "test";
/// Long enough that no test sees it expire unless it waits for that.
const LONG: Duration = Duration::from_secs(60);
const DEADLINE: Duration = Duration::from_secs(20);

fn region(name: &str) -> RegionId {
    RegionId::parse(name).unwrap()
}

fn settings(db: &TestDatabase) -> PostgresSettings {
    PostgresSettings::new(db.url(), Some(db.password().to_owned()))
}

fn open(db: &TestDatabase) -> Arc<PostgresStore> {
    open_postgres(&settings(db), &region("eu-1"), CLUSTER).unwrap()
}

fn node(name: &str) -> LeaseHolder {
    LeaseHolder {
        node: name.to_owned(),
        address: format!("http://{name}:50051"),
        version: "0.1.0".to_owned(),
    }
}

/// A store that took the lease and is fenced with its epoch.
fn writer(db: &TestDatabase) -> Arc<PostgresStore> {
    let store = open(db);
    let epoch = store.try_acquire(&node("a"), LONG).unwrap().expect("a fresh lease");
    store.fence(epoch);
    store
}

/// Polls `f` until it returns Some, for at most [`DEADLINE`].
fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < DEADLINE, "{what}: not within {DEADLINE:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn meta(store: &PostgresStore, key: &str) -> Option<Vec<u8>> {
    store.get(Table::Meta, key.as_bytes()).unwrap()
}

fn put_meta(key: &str, value: &str) -> Batch {
    put(&[(Table::Meta, key.as_bytes(), value.as_bytes())])
}

/// Commits `batch` and flushes it: what the writer does for a step that
/// is alone in its group.
fn land(store: &PostgresStore, batch: Batch) -> Result<(), StoreError> {
    store.commit(batch).and_then(|()| store.flush())
}

#[test]
fn postgres_store_conforms_and_survives_reopen() {
    let Some(db) = fresh_database("conforms") else { return };
    conformance(&*writer(&db));
    let Some(db) = fresh_database("atomic") else { return };
    batches_are_atomic_to_readers(writer(&db));
    let Some(db) = fresh_database("reopen") else { return };
    survives_reopen(|| writer(&db));
    let Some(db) = fresh_database("schema") else { return };
    crate::schema_reload::the_start_check_stores_and_reads_back_the_schema_on(&*writer(&db));
}

#[test]
fn get_many_answers_in_the_order_asked_from_cache_and_database() {
    let Some(db) = fresh_database("get_many") else { return };
    let store = writer(&db);
    land(
        &store,
        put(&[(Table::Backrefs, b"b", b"2"), (Table::Backrefs, b"a", b"1")]),
    )
    .unwrap();
    let keys = [b"a".to_vec(), b"missing".to_vec(), b"b".to_vec(), b"a".to_vec()];
    let want = vec![Some(b"1".to_vec()), None, Some(b"2".to_vec()), Some(b"1".to_vec())];
    assert_eq!(store.get_many(Table::Backrefs, &keys).unwrap(), want);
    store.fence(store.try_acquire(&node("a"), LONG).unwrap().unwrap());
    assert_eq!(
        store.get_many(Table::Backrefs, &keys).unwrap(),
        want,
        "from the database"
    );
    assert_eq!(store.get_many(Table::Backrefs, &keys).unwrap(), want, "from the cache");
    assert_eq!(store.get_many(Table::Resources, &keys).unwrap(), vec![None; 4]);
}

/// The cache serves what the store committed (rows changed behind its
/// back are not seen while it holds its epoch: nobody else may write
/// them), and is dropped at a fence.
#[test]
fn reads_see_every_commit_and_go_to_the_database_after_a_fence() {
    let Some(db) = fresh_database("cache") else { return };
    let store = writer(&db);
    land(&store, put_meta("k", "1")).unwrap();
    assert_eq!(meta(&store, "k"), Some(b"1".to_vec()));
    assert_eq!(meta(&store, "absent"), None);
    // Behind the store's back: the cache answers.
    db.superuser_sql("UPDATE cascade.meta SET v = '\\x32' WHERE k = '\\x6b'")
        .unwrap();
    db.superuser_sql("INSERT INTO cascade.meta VALUES ('\\x616273656e74', '\\x78')")
        .unwrap();
    assert_eq!(meta(&store, "k"), Some(b"1".to_vec()), "a cached value");
    assert_eq!(meta(&store, "absent"), None, "a cached absence");
    assert!(store.cache.len() >= 2);
    // Its own commits write through.
    land(&store, put_meta("k", "3")).unwrap();
    assert_eq!(meta(&store, "k"), Some(b"3".to_vec()));
    let mut b = Batch::default();
    b.remove(Table::Meta, b"k".to_vec());
    land(&store, b).unwrap();
    assert_eq!(meta(&store, "k"), None);
    // A new epoch: what is in the database now.
    store.fence(store.try_acquire(&node("a"), LONG).unwrap().unwrap());
    assert_eq!(meta(&store, "absent"), Some(b"x".to_vec()));
}

/// What a writer learnt is absent (a key, a prefix a scan found empty,
/// and both read ahead by `prefetch`) answers its reads while it holds its
/// epoch, and is forgotten at a fence: another writer that took over and
/// wrote those rows in between is never hidden from it.
#[test]
fn absences_learnt_before_a_takeover_never_hide_the_next_writers_rows() {
    let Some(db) = fresh_database("absent") else { return };
    let (a, b) = (open(&db), open(&db));
    a.fence(a.try_acquire(&node("a"), LONG).unwrap().unwrap());
    let (scanned, read_ahead) = (b"p/".as_slice(), b"q/".as_slice());
    let mut reads = Prefetch::default();
    reads.key(Table::Backrefs, b"absent".to_vec());
    reads.key(Table::Backrefs, b"q/k".to_vec());
    reads.prefix(Table::Backrefs, read_ahead.to_vec());
    let learn = |a: &PostgresStore| {
        assert!(a.scan(Table::Backrefs, scanned, None, 10).unwrap().is_empty());
        a.prefetch(&reads).unwrap();
        assert_eq!(a.get(Table::Backrefs, b"absent").unwrap(), None);
        assert!(a.scan(Table::Backrefs, read_ahead, None, 10).unwrap().is_empty());
    };
    learn(&a);
    // Cached: rows written behind the writer's back (nobody may, while it
    // holds its epoch) are not seen...
    db.superuser_sql(
        "INSERT INTO cascade.backrefs VALUES ('\\x702f31', '\\x31'), ('\\x712f31', '\\x31'), \
         ('\\x616273656e74', '\\x31')",
    )
    .unwrap();
    assert!(
        a.scan(Table::Backrefs, scanned, None, 10).unwrap().is_empty(),
        "a cached empty scan"
    );
    assert!(
        a.scan(Table::Backrefs, read_ahead, None, 10).unwrap().is_empty(),
        "an empty prefix read ahead"
    );
    assert_eq!(a.get(Table::Backrefs, b"q/k").unwrap(), None, "a key under it");
    assert_eq!(
        a.get(Table::Backrefs, b"absent").unwrap(),
        None,
        "an absence read ahead"
    );
    // ...but its own commits are.
    land(&a, put(&[(Table::Backrefs, b"p/2", b"2")])).unwrap();
    assert_eq!(
        a.scan(Table::Backrefs, scanned, None, 10).unwrap().len(),
        2,
        "a put into it"
    );
    db.superuser_sql("DELETE FROM cascade.backrefs").unwrap();
    // What it knew of the rows deleted behind its back (the scan of p/
    // above is kept whole, as a run) goes with a fence, at any epoch.
    a.fence(1);

    // The takeover: b writes every one of those rows, then a writes again.
    learn(&a);
    a.release(1).unwrap();
    b.fence(b.try_acquire(&node("b"), LONG).unwrap().unwrap());
    land(
        &b,
        put(&[
            (Table::Backrefs, b"p/1", b"b"),
            (Table::Backrefs, b"q/k", b"b"),
            (Table::Backrefs, b"absent", b"b"),
        ]),
    )
    .unwrap();
    b.release(2).unwrap();
    a.fence(a.try_acquire(&node("a"), LONG).unwrap().unwrap());
    let want = vec![(b"p/1".to_vec(), b"b".to_vec())];
    assert_eq!(a.scan(Table::Backrefs, scanned, None, 10).unwrap(), want);
    assert_eq!(a.scan(Table::Backrefs, read_ahead, None, 10).unwrap().len(), 1);
    assert_eq!(a.get(Table::Backrefs, b"q/k").unwrap(), Some(b"b".to_vec()));
    assert_eq!(a.get(Table::Backrefs, b"absent").unwrap(), Some(b"b".to_vec()));
    assert_eq!(
        a.get_many(Table::Backrefs, &[b"absent".to_vec(), b"q/k".to_vec()])
            .unwrap(),
        vec![Some(b"b".to_vec()); 2]
    );
}

/// A fenced writer knows which keys are absent (read absent, or above a
/// table's highest key, learnt by its first flush into the table): their
/// puts are sent as plain INSERTs (half an upsert's cost) and their
/// removals not at all. Counted from the plan, checked against the
/// server: a row written behind the writer's back (nobody may, while it
/// holds its epoch) makes a plain INSERT fail, the flush roll back whole,
/// the cache be dropped, and the next flush land.
#[test]
fn keys_known_absent_are_inserted_without_a_conflict_check() {
    let Some(db) = fresh_database("known_absent") else {
        return;
    };
    let store = writer(&db);
    let outbox = |keys: &[&str]| {
        let mut batch = Batch::default();
        for k in keys {
            batch.put(Table::Outbox, k.as_bytes().to_vec(), b"e".to_vec());
        }
        batch
    };
    // (removed, inserted, upserted) of `table`, and whether the flush
    // would read its highest key, if `batch` were flushed now.
    let counts = |batch: Batch, table: Table| {
        let mut writes = commit::Collapsed::new();
        for (t, key, value) in batch.ops {
            writes.entry(t).or_default().insert(key, value);
        }
        let plan = commit::plan(
            &writes,
            |table, key, _| store.cache.known_absent(table, key),
            |table| store.cache.highest_known(table),
        );
        plan.get(&table).map_or(((0, 0, 0), false), |planned| {
            let n = |kind| planned.sent_as.iter().filter(|s| **s == kind).count();
            (
                (
                    n(commit::SentAs::Delete),
                    n(commit::SentAs::Insert),
                    n(commit::SentAs::Upsert),
                ),
                planned.learn_highest,
            )
        })
    };
    // Nothing known: upserts, and the flush learns the highest key.
    assert_eq!(counts(outbox(&["r1", "r2"]), Table::Outbox), ((0, 0, 2), true));
    land(&store, outbox(&["r1", "r2"])).unwrap();
    assert_eq!(
        counts(outbox(&["r2", "r3", "r4"]), Table::Outbox),
        ((0, 2, 1), false),
        "above the highest: inserted"
    );
    // Removals of keys read absent are not sent; of the others they are.
    assert_eq!(store.get(Table::Meta, b"never").unwrap(), None);
    let mut removals = Batch::default();
    removals.remove(Table::Meta, b"never".to_vec());
    assert_eq!(counts(removals, Table::Meta), ((0, 0, 0), false));
    let mut removals = Batch::default();
    removals.remove(Table::Outbox, b"r1".to_vec());
    assert_eq!(counts(removals, Table::Outbox), ((1, 0, 0), false));
    land(&store, outbox(&["r2", "r3", "r4"])).unwrap();
    let rows = |store: &PostgresStore| store.scan(Table::Outbox, b"r", None, 10).unwrap();
    assert_eq!(rows(&store).len(), 4);

    // A row behind the writer's back, above the highest it knows.
    db.superuser_sql("INSERT INTO cascade.outbox VALUES ('\\x7235', '\\x6f')")
        .unwrap();
    assert_eq!(counts(outbox(&["r5", "r6"]), Table::Outbox), ((0, 2, 0), false));
    assert!(matches!(
        land(&store, outbox(&["r5", "r6"])),
        Err(StoreError::Engine(_))
    ));
    // Asked before any read: a read of r6 would learn it absent again.
    assert_eq!(
        counts(outbox(&["r5", "r6"]), Table::Outbox),
        ((0, 0, 2), true),
        "forgotten"
    );
    assert_eq!(store.get(Table::Outbox, b"r6").unwrap(), None, "rolled back whole");
    land(&store, outbox(&["r5", "r6"])).unwrap();
    assert_eq!(store.get(Table::Outbox, b"r5").unwrap(), Some(b"e".to_vec()));
    assert_eq!(rows(&store).len(), 6);
}

#[test]
fn a_store_never_fenced_refuses_commits() {
    let Some(db) = fresh_database("unfenced") else { return };
    let store = open(&db);
    assert!(matches!(store.commit(put_meta("k", "v")), Err(StoreError::NotFenced)));
    assert!(matches!(store.commit(Batch::default()), Err(StoreError::NotFenced)));
    assert_eq!(db.superuser_sql("SELECT count(*) FROM cascade.meta").unwrap(), "0");
    assert!(!*store.lost().borrow());
}

#[test]
fn a_writer_whose_lease_was_taken_over_can_never_commit_again() {
    let Some(db) = fresh_database("fence") else { return };
    let (a, b) = (open(&db), open(&db));
    let ttl = Duration::from_millis(300);
    assert_eq!(a.try_acquire(&node("a"), ttl).unwrap(), Some(1));
    a.fence(1);
    land(&a, put_meta("first", "a")).unwrap();
    assert_eq!(b.try_acquire(&node("b"), LONG).unwrap(), None, "held until it expires");
    let lease = b.read().unwrap();
    assert_eq!((lease.epoch, lease.holder), (1, Some(node("a"))));
    assert!(lease.expires_in <= ttl);

    let epoch = eventually("b takes the expired lease", || b.try_acquire(&node("b"), LONG).unwrap());
    assert_eq!(epoch, 2);
    let lost = a.lost();
    assert!(!*lost.borrow());
    // Staged without a round trip; its flush is fenced.
    match land(&a, put_meta("late", "a")) {
        Err(StoreError::Fenced { held: 1, current: 2 }) => {}
        other => panic!("a commit at a taken-over epoch: {other:?}"),
    }
    assert!(*lost.borrow(), "lost() turns true");
    // Every later commit fails at once, without asking the database.
    assert!(matches!(
        a.epoch_to_commit(),
        Err(StoreError::Fenced { held: 1, current: 2 })
    ));
    assert!(matches!(
        a.commit(put_meta("later", "a")),
        Err(StoreError::Fenced { .. })
    ));
    a.fence(1);
    assert!(*lost.borrow(), "only a newer epoch clears it");
    assert!(!a.renew(1, LONG).unwrap(), "its renew says it lost the lease");
    assert!(b.renew(2, LONG).unwrap());

    b.fence(2);
    assert_eq!(meta(&b, "first"), Some(b"a".to_vec()));
    assert_eq!(meta(&b, "late"), None, "nothing of the fenced batch landed");
    assert_eq!(meta(&b, "later"), None);
    land(&b, put_meta("second", "b")).unwrap();

    // A clean release lets the other take it at once.
    b.release(2).unwrap();
    assert_eq!(b.read().unwrap().holder, None);
    assert_eq!(a.try_acquire(&node("a"), LONG).unwrap(), Some(3));
    a.fence(3);
    assert!(!*lost.borrow());
    land(&a, put_meta("third", "a")).unwrap();
    assert!(matches!(
        land(&b, put_meta("x", "b")),
        Err(StoreError::Fenced { held: 2, current: 3 })
    ));
}

/// A commit in flight (holding the lease row's share lock between its
/// fence and its COMMIT) and a takeover: the takeover waits, so the
/// commit lands before the new epoch is granted, never after it.
#[test]
fn a_commit_in_flight_lands_before_a_takeover_never_after() {
    let Some(db) = fresh_database("inflight") else { return };
    let (a, b) = (open(&db), open(&db));
    assert_eq!(a.try_acquire(&node("a"), Duration::from_millis(200)).unwrap(), Some(1));
    a.fence(1);
    a.pause_after_fence(Some(Duration::from_millis(1200)));
    let committing = {
        let a = a.clone();
        std::thread::spawn(move || land(&a, put_meta("inflight", "a")))
    };
    // The commit is between its fence and its COMMIT, and the lease expired.
    eventually("a's commit holds its transaction open", || {
        let sleeping = db
            .superuser_sql(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(1.2)%' AND pid <> pg_backend_pid()",
            )
            .unwrap();
        (sleeping == "1").then_some(())
    });
    eventually("a's lease expires", || {
        (a.read().unwrap().expires_in == Duration::ZERO).then_some(())
    });
    let epoch = eventually("b takes the lease", || b.try_acquire(&node("b"), LONG).unwrap());
    assert_eq!(epoch, 2);
    b.fence(2);
    let seen_at_takeover = meta(&b, "inflight");
    let committed = committing.join().unwrap();
    // The takeover waited for the commit (its share lock), so the commit
    // landed before epoch 2 was granted.
    assert!(committed.is_ok(), "{committed:?}");
    assert_eq!(
        seen_at_takeover,
        Some(b"a".to_vec()),
        "a commit of epoch 1 landed after epoch 2"
    );
    // And the next one is refused.
    a.pause_after_fence(None);
    assert!(matches!(
        land(&a, put_meta("after", "a")),
        Err(StoreError::Fenced { held: 1, current: 2 })
    ));
    b.fence(2);
    assert_eq!(meta(&b, "after"), None);
}

#[test]
fn stores_acquiring_at_the_same_moment_get_one_epoch() {
    let Some(db) = fresh_database("race") else { return };
    const NODES: usize = 4;
    let stores: Vec<_> = (0..NODES).map(|_| open(&db)).collect();
    for round in 1..=3u64 {
        let barrier = Arc::new(Barrier::new(NODES));
        let tries: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(i, store)| {
                let (store, barrier) = (store.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    store.try_acquire(&node(&format!("n{i}")), LONG).unwrap()
                })
            })
            .collect();
        let granted: Vec<u64> = tries.into_iter().filter_map(|t| t.join().unwrap()).collect();
        assert_eq!(granted, vec![round], "round {round}: exactly one epoch granted");
        stores[0].release(round).unwrap();
        // Whoever won, release it for the next round (release of another's
        // epoch is a no-op, so release it by its epoch from any store).
    }
}

#[test]
fn members_are_listed_until_forgotten() {
    let Some(db) = fresh_database("members") else { return };
    let store = open(&db);
    store.announce(&node("b"), LONG).unwrap();
    store.announce(&node("a"), LONG).unwrap();
    let names: Vec<String> = store.members().unwrap().into_iter().map(|m| m.node.node).collect();
    assert_eq!(names, ["a", "b"]);
    std::thread::sleep(Duration::from_millis(50));
    // b's row is older than 10 ms: a's announce forgets it.
    store.announce(&node("a"), Duration::from_millis(10)).unwrap();
    let members = store.members().unwrap();
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].node, node("a"));
    assert!(members[0].last_seen < LONG);
}

/// Every way of pointing a node at the wrong database is an error at open
/// that names what is wrong, and never shows the password.
#[test]
fn bad_settings_are_refused_at_open_naming_what_is_wrong() {
    let Some(db) = fresh_database("bad") else { return };
    let wrong_password = "not-the-pw-Zq81";
    let refused = |settings: &PostgresSettings, region_name: &str, cluster: &str| -> String {
        let message = match open_postgres(settings, &region(region_name), cluster) {
            Ok(_) => panic!("opened with {settings:?}"),
            Err(e) => e.to_string(),
        };
        assert!(
            !message.contains(PASSWORD) && !message.contains(wrong_password),
            "{message}"
        );
        message
    };
    let with_url = |url: &str| PostgresSettings::new(url, Some(PASSWORD.to_owned()));
    let port = db.server().port();

    let e = refused(&with_url("postgres://[::1"), "eu-1", CLUSTER);
    assert!(
        e.starts_with("storage engine: storage.url is not a PostgreSQL URL"),
        "{e}"
    );
    let e = refused(
        &with_url(&format!("postgres://cascade:{PASSWORD}@127.0.0.1:{port}/x")),
        "eu-1",
        CLUSTER,
    );
    assert!(e.contains("storage.url carries a password"), "{e}");
    let e = refused(
        &with_url("postgres://cascade@no-such-host.invalid:5432/x"),
        "eu-1",
        CLUSTER,
    );
    assert!(
        e.contains("cannot connect to PostgreSQL at no-such-host.invalid:5432 (database \"x\", user \"cascade\")"),
        "{e}"
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = refused(
        &with_url(&format!("postgres://cascade@127.0.0.1:{closed}/x")),
        "eu-1",
        CLUSTER,
    );
    assert!(
        e.contains(&format!("cannot connect to PostgreSQL at 127.0.0.1:{closed}")),
        "{e}"
    );
    assert!(e.contains("is the server up"), "{e}");

    let e = refused(
        &PostgresSettings::new(db.url(), Some(wrong_password.to_owned())),
        "eu-1",
        CLUSTER,
    );
    assert!(e.contains("password authentication failed for user \"cascade\""), "{e}");
    assert!(e.contains("check storage.password_file or CASCADE_PG_PASSWORD"), "{e}");
    let e = refused(&PostgresSettings::new(db.url(), None), "eu-1", CLUSTER);
    assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
    let e = refused(
        &with_url(&format!("postgres://cascade@127.0.0.1:{port}/no_such_db")),
        "eu-1",
        CLUSTER,
    );
    assert!(e.contains("database \"no_such_db\" does not exist"), "{e}");

    // The schema belongs to eu-1 of cluster "test" once eu-1 opened it.
    drop(open(&db));
    let e = refused(&settings(&db), "us-2", CLUSTER);
    assert!(
        e.contains("schema \"cascade\" belongs to region \"eu-1\" of cluster \"test\", not to this node's region \"us-2\" of cluster \"test\""),
        "{e}"
    );
    let e = refused(&settings(&db), "eu-1", "other");
    assert!(
        e.contains("not to this node's region \"eu-1\" of cluster \"other\""),
        "{e}"
    );
    // Another schema of the same database is another region's.
    let us = PostgresSettings {
        schema: "us_2".into(),
        ..settings(&db)
    };
    drop(open_postgres(&us, &region("us-2"), CLUSTER).unwrap());
    let e = refused(
        &PostgresSettings {
            schema: "Bad-Name".into(),
            ..settings(&db)
        },
        "eu-1",
        CLUSTER,
    );
    assert!(e.contains("storage.schema: \"Bad-Name\" is no schema name"), "{e}");

    // A newer binary migrated it.
    db.superuser_sql("INSERT INTO cascade.schema_migrations (version) VALUES (99)")
        .unwrap();
    let e = refused(&settings(&db), "eu-1", CLUSTER);
    assert!(
        e.contains("schema \"cascade\" is at version 99, but this binary knows versions up to 1"),
        "{e}"
    );
}

/// Two nodes opening a fresh database at once: the advisory lock lets one
/// create the schema, the other finds it.
#[test]
fn nodes_opening_a_fresh_database_at_once_both_open_it() {
    let Some(db) = fresh_database("migrate_race") else {
        return;
    };
    let db = Arc::new(db);
    let barrier = Arc::new(Barrier::new(3));
    let opens: Vec<_> = (0..3)
        .map(|_| {
            let (db, barrier) = (db.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                open_postgres(&settings(&db), &region("eu-1"), CLUSTER).map(drop)
            })
        })
        .collect();
    for open in opens {
        open.join().unwrap().unwrap();
    }
    assert_eq!(
        db.superuser_sql("SELECT string_agg(version::text, ',') FROM cascade.schema_migrations")
            .unwrap(),
        "1"
    );
}

/// PostgreSQL stopped under a running store: reads and commits are
/// UNAVAILABLE (an error that may clear, so the writer retries), the
/// writer's reopen fails until the server is back, and then the same
/// store (same epoch) commits again over new connections.
#[test]
fn a_restart_of_postgres_is_unavailable_then_heals() {
    let Some(server) = TestServer::start() else { return };
    let db = server.fresh_database("restart");
    let store = writer(&db);
    land(&store, put_meta("before", "1")).unwrap();
    server.stop_server();
    let unavailable = |e: StoreError| match e {
        StoreError::Unavailable {
            condition: DiskCondition::DatabaseUnreachable,
            ..
        } => assert!(e.may_clear()),
        other => panic!("{other:?}"),
    };
    unavailable(store.scan(Table::Meta, b"", None, 10).unwrap_err());
    unavailable(land(&store, put_meta("during", "1")).unwrap_err());
    unavailable(store.reopen().unwrap_err());
    assert!(!*store.lost().borrow(), "nothing was sent: not a lost commit");
    server.start_server();
    eventually("the store reaches the server again", || store.reopen().ok());
    land(&store, put_meta("after", "1")).unwrap();
    let keys: Vec<Vec<u8>> = store
        .scan(Table::Meta, b"", None, 10)
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(keys, [b"after".to_vec(), b"before".to_vec()]);
}

/// The connection dies while a commit is in flight (between its fence and
/// its COMMIT): the store cannot know whether it landed, says so, and
/// refuses every later commit until it is fenced again.
#[test]
fn a_connection_lost_during_a_commit_is_an_unknown_outcome() {
    let Some(server) = TestServer::start() else { return };
    let db = server.fresh_database("unknown");
    let store = writer(&db);
    land(&store, put_meta("before", "1")).unwrap();
    store.pause_after_fence(Some(Duration::from_millis(1500)));
    let committing = {
        let store = store.clone();
        std::thread::spawn(move || land(&store, put_meta("during", "1")))
    };
    eventually("the commit is in flight", || {
        let sleeping = db
            .superuser_sql(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(1.5)%' AND pid <> pg_backend_pid()",
            )
            .unwrap();
        (sleeping == "1").then_some(())
    });
    server.stop_server();
    match committing.join().unwrap() {
        Err(StoreError::CommitOutcomeUnknown(message)) => {
            assert!(message.contains(&format!("127.0.0.1:{}", server.port())), "{message}")
        }
        other => panic!("a commit whose connection died: {other:?}"),
    }
    assert!(*store.lost().borrow());
    server.start_server();
    store.pause_after_fence(None);
    assert!(matches!(
        store.commit(put_meta("after", "1")),
        Err(StoreError::CommitOutcomeUnknown(_))
    ));
    let epoch = eventually("the lease is taken again", || {
        store.try_acquire(&node("a"), LONG).ok().flatten()
    });
    store.fence(epoch);
    assert!(!*store.lost().borrow());
    land(&store, put_meta("after", "1")).unwrap();
    assert_eq!(
        meta(&store, "during"),
        None,
        "the server rolled back the unfinished transaction"
    );
}

/// What the store costs on this machine (a debug build, loopback): a
/// commit of 500 writes and of one, 10,000 point gets from the database and from the
/// cache, `get_many` of 1,000 keys, a scan of 1,000 rows; and sled's
/// figures for the same, for the ratio. Run with
/// `cargo test -p cascade-node --lib measure_postgres -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check"]
fn measure_postgres_store() {
    let Some(db) = fresh_database("measure") else { return };
    let pg = writer(&db);
    let dir = tempfile::tempdir().unwrap();
    let sled = crate::store::SledStore::open(dir.path()).unwrap();
    let stores: [(&str, &dyn Store); 2] = [("postgres", &*pg), ("sled", &sled)];
    for (name, store) in stores {
        let key = |i: u32| i.to_be_bytes().to_vec();
        let value = vec![0x5a; 200];
        let start = Instant::now();
        for b in 0..20u32 {
            let mut batch = Batch::default();
            for i in 0..250 {
                batch.put(Table::Backrefs, key(b * 250 + i), value.clone());
                batch.put(Table::Outbox, key(b * 250 + i), value.clone());
            }
            store.commit(batch).unwrap();
            if name == "postgres" {
                // Where its transaction is sent.
                store.flush().unwrap();
            }
        }
        let commit = start.elapsed() / 20;
        let start = Instant::now();
        for i in 0..100u32 {
            store.commit(put(&[(Table::Meta, &i.to_be_bytes(), b"1")])).unwrap();
            if name == "postgres" {
                store.flush().unwrap();
            }
        }
        let single = start.elapsed() / 100;
        if name == "postgres" {
            pg.fence(pg.try_acquire(&node("a"), LONG).unwrap().unwrap());
        }
        let start = Instant::now();
        for i in 0..10_000u32 {
            assert!(store
                .get(Table::Backrefs, &key(i % 5000 + 5000 * (i / 5000) % 5000))
                .unwrap()
                .is_some());
        }
        let cold = start.elapsed();
        let start = Instant::now();
        for i in 0..10_000u32 {
            assert!(store.get(Table::Backrefs, &key(i % 5000)).unwrap().is_some());
        }
        let warm = start.elapsed();
        let keys: Vec<Vec<u8>> = (0..1000u32).map(|i| key(i * 5)).collect();
        let start = Instant::now();
        for _ in 0..10 {
            assert_eq!(store.get_many(Table::Outbox, &keys).unwrap().len(), 1000);
        }
        let many = start.elapsed() / 10;
        let start = Instant::now();
        for _ in 0..20 {
            assert_eq!(store.scan(Table::Outbox, b"", None, 1000).unwrap().len(), 1000);
        }
        let scan = start.elapsed() / 20;
        println!(
            "{name}: commit of 500 writes {commit:?}, of 1 write {single:?}; 10,000 gets {cold:?} (first), {warm:?} (again); \
             get_many of 1,000 {many:?}; scan of 1,000 {scan:?}"
        );
    }
}

/// The writer's session is bounded (a paused or stuck writer cannot hold
/// the lease row's share lock for long), and so are the readers'; none
/// plans a sequential scan where a key's index serves (`with_session`).
#[test]
fn every_session_has_its_timeouts() {
    let Some(db) = fresh_database("sessions") else { return };
    let store = open(&db);
    let show = |writer: bool| {
        let shared = store.shared.clone();
        store
            .run(async move {
                let pool = if writer { &shared.writer } else { &shared.readers };
                let client = pool.get().await.unwrap();
                let mut shown = Vec::new();
                for setting in [
                    "statement_timeout",
                    "lock_timeout",
                    "idle_in_transaction_session_timeout",
                    "enable_seqscan",
                ] {
                    let row = client.query_one(&format!("SHOW {setting}"), &[]).await.unwrap();
                    shown.push(row.get::<_, String>(0));
                }
                Ok(shown)
            })
            .unwrap()
    };
    assert_eq!(show(true), ["4s", "1s", "2s", "off"]);
    assert_eq!(show(false), ["10s", "1s", "2s", "off"]);
}

/// How many transactions wrote the rows `sql` selects (`xmin`): rows a
/// transaction inserted or updated carry its id.
fn writing_transactions(db: &TestDatabase, selects: &str) -> String {
    db.superuser_sql(&format!(
        "SELECT count(DISTINCT xmin::text) FROM ({selects}) AS written"
    ))
    .unwrap()
}

/// A writer's group of steps, each committed and then flushed once,
/// lands in one transaction; between the commits and the flush the
/// store's reads see the staged writes, over what the server still holds.
#[test]
fn a_group_of_commits_lands_in_one_transaction_and_reads_see_it_before() {
    let Some(db) = fresh_database("group") else { return };
    let store = writer(&db);
    land(
        &store,
        put(&[
            (Table::Backrefs, b"p/0", b"s"),
            (Table::Backrefs, b"p/1", b"s"),
            (Table::Backrefs, b"p/5", b"s"),
            (Table::Meta, b"kept", b"s"),
        ]),
    )
    .unwrap();
    // Three steps' batches: removals of rows the server has, puts of new
    // and of existing keys, a key put then removed.
    store
        .commit(put(&[(Table::Meta, b"a", b"1"), (Table::Backrefs, b"p/2", b"x")]))
        .unwrap();
    let mut second = put(&[(Table::Meta, b"b", b"2"), (Table::Backrefs, b"p/5", b"y")]);
    second.remove(Table::Backrefs, b"p/1".to_vec());
    store.commit(second).unwrap();
    let mut third = put(&[(Table::Outbox, b"r1", b"e")]);
    third.remove(Table::Backrefs, b"p/0".to_vec());
    third.remove(Table::Meta, b"a".to_vec());
    store.commit(third).unwrap();

    let on_server = |sql: &str| db.superuser_sql(sql).unwrap();
    assert_eq!(
        on_server("SELECT count(*) FROM cascade.backrefs WHERE k IN ('\\x702f30', '\\x702f31')"),
        "2",
        "nothing sent before the flush"
    );
    assert_eq!(on_server("SELECT count(*) FROM cascade.meta WHERE k = '\\x62'"), "0");
    assert_eq!(meta(&store, "b"), Some(b"2".to_vec()), "a staged put");
    assert_eq!(meta(&store, "a"), None, "put, then removed");
    assert_eq!(
        store.get(Table::Backrefs, b"p/1").unwrap(),
        None,
        "a staged removal of a row the server has"
    );
    assert_eq!(meta(&store, "kept"), Some(b"s".to_vec()), "a row only the server has");
    assert_eq!(
        store
            .get_many(Table::Backrefs, &[b"p/0".to_vec(), b"p/2".to_vec(), b"p/5".to_vec()])
            .unwrap(),
        vec![None, Some(b"x".to_vec()), Some(b"y".to_vec())]
    );
    // A scan across staged removals (each hides a server row) with small
    // limits: the server rows it gives are the ones the removals left.
    let scan = |after: Option<&[u8]>, limit| store.scan(Table::Backrefs, b"p/", after, limit).unwrap();
    let row = |k: &str, v: &str| (k.as_bytes().to_vec(), v.as_bytes().to_vec());
    assert_eq!(scan(None, 1), vec![row("p/2", "x")]);
    assert_eq!(scan(None, 2), vec![row("p/2", "x"), row("p/5", "y")]);
    assert_eq!(scan(None, 10), vec![row("p/2", "x"), row("p/5", "y")]);
    assert_eq!(scan(Some(b"p/2"), 1), vec![row("p/5", "y")]);
    assert_eq!(store.scan(Table::Meta, b"", None, 10).unwrap().len(), 2, "b and kept");

    store.flush().unwrap();
    assert_eq!(
        writing_transactions(
            &db,
            "SELECT xmin FROM cascade.meta WHERE k = '\\x62' \
             UNION ALL SELECT xmin FROM cascade.backrefs WHERE k IN ('\\x702f32', '\\x702f35') \
             UNION ALL SELECT xmin FROM cascade.outbox",
        ),
        "1",
        "three batches, one transaction"
    );
    assert_eq!(
        on_server("SELECT string_agg(encode(k, 'escape'), ',' ORDER BY k) FROM cascade.backrefs"),
        "p/2,p/5"
    );
    assert_eq!(on_server("SELECT count(*) FROM cascade.meta WHERE k = '\\x61'"), "0");
    // Read again after the flush (from the cache and the server).
    assert_eq!(scan(None, 10), vec![row("p/2", "x"), row("p/5", "y")]);
    assert_eq!(meta(&store, "b"), Some(b"2".to_vec()));
    assert_eq!(store.get(Table::Backrefs, b"p/1").unwrap(), None);
    // Nothing staged: a flush sends nothing.
    store.flush().unwrap();
}

/// A flush whose lease was taken between the commits and the flush
/// lands none of them (its transaction is fenced), and the store's reads
/// no longer see them; a fence at another epoch drops what is staged,
/// and the flush of the epoch it was staged at says so.
#[test]
fn a_fenced_flush_lands_none_of_its_commits_and_they_are_no_longer_read() {
    let Some(db) = fresh_database("fenced_flush") else {
        return;
    };
    let (a, b) = (open(&db), open(&db));
    a.fence(a.try_acquire(&node("a"), LONG).unwrap().unwrap());
    land(&a, put_meta("landed", "a")).unwrap();
    a.commit(put_meta("first", "a")).unwrap();
    let mut second = put_meta("second", "a");
    second.remove(Table::Meta, b"landed".to_vec());
    a.commit(second).unwrap();
    assert_eq!(meta(&a, "landed"), None, "staged");
    // b takes the lease (a released it: no waiting for its time to live).
    a.release(1).unwrap();
    b.fence(b.try_acquire(&node("b"), LONG).unwrap().unwrap());
    match a.flush() {
        Err(StoreError::Fenced { held: 1, current: 2 }) => {}
        other => panic!("a flush at a taken-over epoch: {other:?}"),
    }
    assert!(*a.lost().borrow());
    for (store, name) in [(&a, "a"), (&b, "b")] {
        assert_eq!(meta(store, "first"), None, "{name}");
        assert_eq!(meta(store, "second"), None, "{name}");
        assert_eq!(meta(store, "landed"), Some(b"a".to_vec()), "{name}: not removed");
    }
    assert_eq!(
        db.superuser_sql("SELECT count(*) FROM cascade.meta").unwrap(),
        "1",
        "only what landed before"
    );

    // A fence at a new epoch in the same process (a takeover by it):
    // what the earlier epoch's writer staged is dropped unsent.
    b.commit(put_meta("staged at 2", "b")).unwrap();
    let old = b.at_epoch(2);
    old.commit(put_meta("also at 2", "b")).unwrap();
    b.release(2).unwrap();
    b.fence(b.try_acquire(&node("b"), LONG).unwrap().unwrap());
    let new = b.at_epoch(3);
    assert_eq!(new.get(Table::Meta, b"staged at 2").unwrap(), None);
    new.flush().unwrap();
    assert!(matches!(old.flush(), Err(StoreError::Fenced { held: 2, current: 3 })));
    assert_eq!(meta(&b, "also at 2"), None);
    assert_eq!(db.superuser_sql("SELECT count(*) FROM cascade.meta").unwrap(), "1");
}

/// The staged set is bounded: a commit that takes it over its bound
/// lands everything staged at once, in one transaction; and if that
/// fails, the next flush fails too (the commits before it were lost
/// with it), and lands nothing.
#[test]
fn a_commit_over_the_staged_bound_lands_at_once() {
    let Some(db) = fresh_database("staged_bound") else {
        return;
    };
    let store = writer(&db);
    store.staged.set_bounds(staged::Bounds {
        keys: 3,
        bytes: 1 << 20,
    });
    let count = || db.superuser_sql("SELECT count(*) FROM cascade.meta").unwrap();
    store.commit(put_meta("1", "v")).unwrap();
    store.commit(put_meta("2", "v")).unwrap();
    store.commit(put_meta("3", "v")).unwrap();
    assert_eq!(count(), "0", "at the bound: staged");
    store.commit(put_meta("4", "v")).unwrap();
    assert_eq!(count(), "4", "over it: sent");
    assert_eq!(writing_transactions(&db, "SELECT xmin FROM cascade.meta"), "1");
    store.flush().unwrap();

    // A row behind the writer's back, so that its INSERT fails.
    store.commit(put_meta("5", "v")).unwrap();
    store.commit(put_meta("6", "v")).unwrap();
    db.superuser_sql("INSERT INTO cascade.meta VALUES ('\\x37', '\\x6f')")
        .unwrap();
    store.commit(put_meta("7", "v")).unwrap();
    assert!(matches!(store.commit(put_meta("8", "v")), Err(StoreError::Engine(_))));
    // Committed after the loss: the flush that reports it lands nothing.
    store.commit(put_meta("9", "v")).unwrap();
    assert!(
        matches!(store.flush(), Err(StoreError::Engine(_))),
        "5 and 6 were committed and did not land"
    );
    assert_eq!(meta(&store, "5"), None);
    assert_eq!(meta(&store, "9"), None);
    store.flush().unwrap();
    land(&store, put_meta("5", "v")).unwrap();
    assert_eq!(count(), "6");
}

/// Only the writer's view reads what it staged: every other reader (the
/// API's, peers', links') reads what landed, since a flush that fails
/// drops what it staged and a write seen by a client must not be taken
/// back by a routine error. And the flush of an older epoch's step, once
/// this process took the lease again, fails without dropping what the new
/// epoch's writer staged meanwhile (a review found that it wiped them,
/// and the new writer's flush then answered for commits that never
/// landed).
#[test]
fn only_the_writers_view_reads_what_is_staged_and_an_older_epochs_flush_keeps_the_newer_ones() {
    let Some(db) = fresh_database("writers_view") else {
        return;
    };
    let store = open(&db);
    let first = store.try_acquire(&node("a"), LONG).unwrap().expect("a fresh lease");
    store.fence(first);
    let readers = store.at_epoch(first);
    let writer = readers
        .writers_view()
        .expect("postgres gives its writer a view of its own");
    writer.commit(put_meta("landed", "1")).unwrap();
    writer.flush().unwrap();
    writer.commit(put_meta("staged", "1")).unwrap();
    let mut removal = put_meta("also staged", "1");
    removal.remove(Table::Meta, b"landed".to_vec());
    writer.commit(removal).unwrap();

    let keys = |store: &Arc<dyn Store>| -> Vec<Vec<u8>> {
        let rows = store.scan(Table::Meta, b"", None, 10).unwrap();
        rows.into_iter().map(|(key, _)| key).collect()
    };
    assert_eq!(writer.get(Table::Meta, b"staged").unwrap(), Some(b"1".to_vec()));
    assert_eq!(writer.get(Table::Meta, b"landed").unwrap(), None, "removed, staged");
    assert_eq!(keys(&writer), vec![b"also staged".to_vec(), b"staged".to_vec()]);
    assert_eq!(readers.get(Table::Meta, b"staged").unwrap(), None, "not landed yet");
    assert_eq!(readers.get(Table::Meta, b"landed").unwrap(), Some(b"1".to_vec()));
    assert_eq!(
        readers
            .get_many(Table::Meta, &[b"staged".to_vec(), b"landed".to_vec()])
            .unwrap(),
        vec![None, Some(b"1".to_vec())]
    );
    assert_eq!(keys(&readers), vec![b"landed".to_vec()]);
    writer.flush().unwrap();
    assert_eq!(keys(&readers), vec![b"also staged".to_vec(), b"staged".to_vec()]);

    // A takeover by this same process while the first epoch's writer had
    // a commit staged; the new writer stages one before the old one's
    // flush comes.
    writer.commit(put_meta("old", "1")).unwrap();
    store.release(first).unwrap();
    let second = store.try_acquire(&node("a"), LONG).unwrap().expect("released");
    store.fence(second);
    let new_writer = store.at_epoch(second).writers_view().expect("a writer's view");
    new_writer.commit(put_meta("new", "2")).unwrap();
    assert!(matches!(
        writer.flush(),
        Err(StoreError::Fenced { held, current }) if held == first && current == second
    ));
    new_writer.flush().expect("the new epoch's commits are its own");
    assert_eq!(
        db.superuser_sql("SELECT count(*) FROM cascade.meta").unwrap(),
        "3",
        "'also staged', 'staged' and 'new'; never 'old'"
    );
    assert_eq!(
        store.at_epoch(second).get(Table::Meta, b"new").unwrap(),
        Some(b"2".to_vec())
    );
    assert_eq!(store.at_epoch(second).get(Table::Meta, b"old").unwrap(), None);
}

/// A walk's pages after the first read ahead, and what they read is kept
/// as a run: the next pages come from it, with the store's own writes
/// that landed in it since (a row put behind its back is not seen: nobody
/// else may write while it holds its epoch), until a fence drops it.
#[test]
fn a_walks_next_pages_come_from_what_it_read_ahead_with_the_writes_landed_since() {
    let Some(db) = fresh_database("runs") else { return };
    let store = writer(&db);
    let key = |i: usize| format!("t/{i:04}").into_bytes();
    let mut rows = Batch::default();
    for i in 0..6000 {
        rows.put(Table::Backrefs, key(i), b"v".to_vec());
    }
    rows.put(Table::Backrefs, b"u/0".to_vec(), b"v".to_vec());
    land(&store, rows).unwrap();
    let page = |after: usize| -> Vec<Vec<u8>> {
        let rows = store.scan(Table::Backrefs, b"t/", Some(&key(after)), 100).unwrap();
        rows.into_iter().map(|(key, _)| key).collect()
    };
    assert_eq!(page(99), (100..200).map(key).collect::<Vec<_>>());
    db.superuser_sql("INSERT INTO cascade.backrefs VALUES (convert_to('t/0250x', 'UTF8'), '\\x76')")
        .unwrap();
    let mut writes = Batch::default();
    writes.remove(Table::Backrefs, key(200));
    writes.put(Table::Backrefs, b"t/0201a".to_vec(), b"v".to_vec());
    land(&store, writes).unwrap();
    let mut want: Vec<Vec<u8>> = (201..300).map(key).collect();
    want.insert(1, b"t/0201a".to_vec());
    assert_eq!(page(199), want, "its own writes, landed");
    assert_eq!(
        page(249)[..2].to_vec(),
        vec![key(250), key(251)],
        "read ahead, not asked again"
    );
    // Past what it read ahead (t/0100 to t/4195): the server, read ahead
    // again.
    assert_eq!(page(4249), (4250..4350).map(key).collect::<Vec<_>>());
    store.fence(store.try_acquire(&node("a"), LONG).unwrap().unwrap());
    assert_eq!(
        page(249)[..2].to_vec(),
        vec![key(250), b"t/0250x".to_vec()],
        "a fence drops it"
    );
}

/// A walk that starts from its prefix at every step, its rows removed as
/// it goes (a cascade's target: each step's page is the first one left):
/// the first read asks for its page only, and once what it read is used
/// up the next read reads ahead, so the pages after it come from memory
/// (a row put behind the store's back there is not seen).
#[test]
fn a_walk_from_its_prefix_reads_ahead_once_its_first_page_is_used_up() {
    let Some(db) = fresh_database("runs_used_up") else {
        return;
    };
    let store = writer(&db);
    let key = |i: usize| format!("u/{i:04}").into_bytes();
    let mut rows = Batch::default();
    for i in 0..600 {
        rows.put(Table::Backrefs, key(i), b"v".to_vec());
    }
    land(&store, rows).unwrap();
    let first_page = || -> Vec<Vec<u8>> {
        let rows = store.scan(Table::Backrefs, b"u/", None, 100).unwrap();
        rows.into_iter().map(|(key, _)| key).collect()
    };
    let remove = |keys: std::ops::Range<usize>| {
        let mut batch = Batch::default();
        for i in keys {
            batch.remove(Table::Backrefs, key(i));
        }
        land(&store, batch).unwrap();
    };
    assert_eq!(first_page(), (0..100).map(key).collect::<Vec<_>>());
    remove(0..100);
    assert_eq!(first_page(), (100..200).map(key).collect::<Vec<_>>(), "read ahead");
    db.superuser_sql("INSERT INTO cascade.backrefs VALUES (convert_to('u/0250x', 'UTF8'), '\\x76')")
        .unwrap();
    remove(100..200);
    assert_eq!(first_page(), (200..300).map(key).collect::<Vec<_>>(), "from memory");
}

/// Waits until a transaction of the store's writer sleeps in its pause
/// after the fence (`pause_after_fence` of `seconds`): a flight is on the
/// server.
fn wait_for_paused_transaction(db: &TestDatabase, seconds: &str) {
    eventually("the flight's transaction is on the server", || {
        let sleeping = db
            .superuser_sql(&format!(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep({seconds})%' AND pid <> pg_backend_pid()"
            ))
            .unwrap();
        (sleeping == "1").then_some(())
    });
}

/// Ends the session of the flight paused in `pg_sleep(seconds)` on the
/// server (a connection lost mid-flight, before its COMMIT).
fn kill_paused_transaction(db: &TestDatabase, seconds: &str) {
    db.superuser_sql(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%pg_sleep({seconds})%' AND pid <> pg_backend_pid()"
    ))
    .unwrap();
}

/// A group's flush in flight (`flush.rs`): `start_flush` returns while
/// the transaction is on the server; the writer's view reads the flight's
/// writes (a removal too) and any other key meanwhile, the node's other
/// readers only what landed; landed, the cache holds the writes and every
/// view reads them.
#[test]
fn a_flight_is_read_by_the_writer_while_in_flight_and_lands_into_the_cache() {
    let Some(db) = fresh_database("flight_lands") else {
        return;
    };
    let store = writer(&db);
    land(&store, put_meta("before", "a")).unwrap();
    land(&store, put_meta("untouched", "a")).unwrap();
    let landed_view = store.at_epoch(1);
    store.pause_after_fence(Some(Duration::from_millis(700)));
    let mut batch = put_meta("flown", "a");
    batch.remove(Table::Meta, b"before".to_vec());
    store.commit(batch).unwrap();
    store.start_flush().unwrap();
    wait_for_paused_transaction(&db, "0.7");
    assert_eq!(meta(&store, "flown"), Some(b"a".to_vec()), "the flight's put");
    assert_eq!(meta(&store, "before"), None, "the flight's removal");
    assert_eq!(
        meta(&store, "untouched"),
        Some(b"a".to_vec()),
        "a key it does not write"
    );
    assert_eq!(meta(&store, "never"), None);
    assert_eq!(
        store.scan(Table::Meta, b"", None, 10).unwrap(),
        vec![
            (b"flown".to_vec(), b"a".to_vec()),
            (b"untouched".to_vec(), b"a".to_vec())
        ]
    );
    assert_eq!(landed_view.get(Table::Meta, b"flown").unwrap(), None, "not landed yet");
    assert_eq!(landed_view.get(Table::Meta, b"before").unwrap(), Some(b"a".to_vec()));
    assert_eq!(
        db.superuser_sql("SELECT count(*) FROM cascade.meta WHERE k = 'flown'::bytea")
            .unwrap(),
        "0",
        "still in flight"
    );
    store.finish_flush().unwrap();
    store.pause_after_fence(None);
    assert!(
        matches!(store.cache.lookup(Table::Meta, b"flown"), Lookup::Hit(Some(_))),
        "landed into the cache"
    );
    assert_eq!(landed_view.get(Table::Meta, b"flown").unwrap(), Some(b"a".to_vec()));
    assert_eq!(landed_view.get(Table::Meta, b"before").unwrap(), None);
    assert_eq!(
        db.superuser_sql("SELECT count(*) FROM cascade.meta").unwrap(),
        "2",
        "flown and untouched"
    );
    store.finish_flush().unwrap();
    assert!(store.overlaps_flushes() && landed_view.overlaps_flushes());
}

/// `start_flush_then` on PostgreSQL: the callback (the writer answering
/// its group's clients) runs once the flight's COMMIT returned, before
/// the writer asks, and what it answers is then read by every reader; a
/// flight that fails never runs it.
///
/// Why: the writer answered a client group only when its next step
/// finished the flight, a step's length after it landed (issue 28's
/// small-write p99 during a cascade).
#[test]
fn a_flights_callback_runs_once_it_landed_and_never_when_it_failed() {
    let Some(db) = fresh_database("flight_callback") else {
        return;
    };
    let store = writer(&db);
    let landed_view = store.at_epoch(1);
    let (told, heard) = std::sync::mpsc::channel();
    store.pause_after_fence(Some(Duration::from_millis(1100)));
    store.commit(put_meta("answered", "a")).unwrap();
    store
        .start_flush_then(Box::new(move || told.send(()).unwrap()))
        .unwrap();
    wait_for_paused_transaction(&db, "1.1");
    assert!(heard.try_recv().is_err(), "not before its COMMIT returned");
    heard
        .recv_timeout(Duration::from_secs(30))
        .expect("the callback runs without the writer asking");
    assert_eq!(
        landed_view.get(Table::Meta, b"answered").unwrap(),
        Some(b"a".to_vec()),
        "whoever it answers reads the flight's writes before the writer finished it"
    );
    store.finish_flush().unwrap();

    let (told, heard) = std::sync::mpsc::channel::<()>();
    store.pause_after_fence(Some(Duration::from_millis(1100)));
    store.commit(put_meta("failed", "a")).unwrap();
    store
        .start_flush_then(Box::new(move || told.send(()).unwrap()))
        .unwrap();
    wait_for_paused_transaction(&db, "1.1");
    kill_paused_transaction(&db, "1.1");
    store.pause_after_fence(None);
    assert!(store.finish_flush().is_err(), "the flight failed");
    assert_eq!(
        heard.recv_timeout(Duration::from_secs(30)),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected),
        "dropped, never run"
    );
}

/// A flight that fails (its session killed on the server mid-flight):
/// its writes are dropped from the staged set and the cache, so no view
/// reads them again; a commit staged on top of it meanwhile goes with it
/// and the next flush says so, once; a commit once it ended is refused
/// and leaves the failure to the writer; the writer's `finish_flush`
/// reports it once, and the store commits again afterwards.
///
/// Bug 1 of the first overlapped build's review: a path other than the
/// writer's wait that noticed the failure consumed it, and the writer's
/// wait then read Ok.
#[test]
fn a_flight_that_fails_drops_its_writes_and_only_the_writers_finish_reports_it_once() {
    let Some(db) = fresh_database("flight_fails") else {
        return;
    };
    let store = writer(&db);
    land(&store, put_meta("landed", "a")).unwrap();
    store.pause_after_fence(Some(Duration::from_millis(1100)));
    let mut batch = put_meta("flown", "a");
    batch.remove(Table::Meta, b"landed".to_vec());
    store.commit(batch).unwrap();
    store.start_flush().unwrap();
    wait_for_paused_transaction(&db, "1.1");
    assert_eq!(meta(&store, "flown"), Some(b"a".to_vec()));
    kill_paused_transaction(&db, "1.1");
    store.pause_after_fence(None);
    // A commit is staged on top of the flight without waiting for it,
    // and rests on it.
    store.commit(put_meta("on top", "a")).unwrap();
    assert_eq!(meta(&store, "on top"), Some(b"a".to_vec()));
    {
        let flights = store.landed_flight();
        assert!(flights.untold(), "the failure is still the writer's to take");
    }
    // Once it ended, a commit is refused while the writer was not told.
    assert!(
        store.commit(put_meta("later", "a")).is_err(),
        "a commit after a failed flight nobody was told of"
    );
    assert_eq!(meta(&store, "flown"), None, "dropped: read from the server");
    assert_eq!(
        meta(&store, "landed"),
        Some(b"a".to_vec()),
        "its removal is dropped too"
    );
    assert_eq!(meta(&store, "on top"), None, "dropped with the flight it rests on");
    let reported = store.finish_flush();
    assert!(reported.is_err(), "the writer is told: {reported:?}");
    assert!(store.finish_flush().is_ok(), "once");
    assert!(
        store.flush().is_err(),
        "the flush after it says the commit staged on top did not land"
    );
    assert!(store.flush().is_ok(), "once");
    // The session was killed before its COMMIT: a routine failure, and
    // the store commits again (or, had the outcome been unknown, after
    // the next fence).
    if !*store.lost().borrow() {
        land(&store, put_meta("after", "a")).unwrap();
        assert_eq!(meta(&store, "after"), Some(b"a".to_vec()));
    }
    assert_eq!(
        db.superuser_sql("SELECT count(*) FROM cascade.meta WHERE k = 'flown'::bytea")
            .unwrap(),
        "0"
    );
}

/// A commit staged on top of a flight (the writer's next group, while
/// the server works on the flight) is read over the flight's writes, by
/// point reads and scans, before and after the flight landed, and the
/// next flush lands it: a removal on top hides the flight's put, a put on
/// top replaces it.
#[test]
fn a_commit_on_top_of_a_flight_reads_over_it_and_lands_with_the_next_flush() {
    let Some(db) = fresh_database("flight_on_top") else {
        return;
    };
    let store = writer(&db);
    land(&store, put_meta("k1", "old")).unwrap();
    store.pause_after_fence(Some(Duration::from_millis(300)));
    let mut flown = put_meta("k2", "flown");
    flown.put(Table::Meta, b"k3".to_vec(), b"flown".to_vec());
    flown.remove(Table::Meta, b"k1".to_vec());
    store.commit(flown).unwrap();
    store.start_flush().unwrap();
    store.pause_after_fence(None);
    let mut on_top = put_meta("k3", "top");
    on_top.remove(Table::Meta, b"k2".to_vec());
    on_top.put(Table::Meta, b"k4".to_vec(), b"top".to_vec());
    store.commit(on_top).unwrap();
    assert!(
        store.landed_flight_is_running(),
        "the commit did not wait for the flight (nobody ended it)"
    );
    let expected = |store: &PostgresStore, when: &str| {
        assert_eq!(meta(store, "k1"), None, "{when}");
        assert_eq!(meta(store, "k2"), None, "{when}: removed on top of the flight's put");
        assert_eq!(meta(store, "k3"), Some(b"top".to_vec()), "{when}");
        assert_eq!(meta(store, "k4"), Some(b"top".to_vec()), "{when}");
        let scanned: Vec<_> = store
            .scan(Table::Meta, b"k", None, 10)
            .unwrap()
            .into_iter()
            .map(|(key, value)| (String::from_utf8(key).unwrap(), String::from_utf8(value).unwrap()))
            .collect();
        assert_eq!(
            scanned,
            [("k3".to_owned(), "top".to_owned()), ("k4".to_owned(), "top".to_owned())],
            "{when}"
        );
    };
    expected(&store, "while the flight flies");
    store.finish_flush().unwrap();
    expected(&store, "once it landed");
    store.flush().unwrap();
    expected(&store, "once the commit on top landed");
    assert_eq!(
        db.superuser_sql("SELECT string_agg(convert_from(k, 'UTF8') || '=' || convert_from(v, 'UTF8'), ',' ORDER BY k) FROM cascade.meta WHERE k >= 'k'::bytea AND k < 'l'::bytea")
            .unwrap(),
        "k3=top,k4=top"
    );
}

/// The node's shutdown flush (`api/server.rs`, after `writer.stop()`
/// gave up waiting) runs while the writer is stuck in a step holding a
/// flight that failed: the flush is refused with a copy and takes
/// nothing, and the writer's `finish_flush` still reports the failure.
/// And a writer whose flight's outcome was taken anyway is told it is
/// unknown, never Ok.
///
/// Review finding S1 of the overlapped flush: `flush_at` took the
/// outcome, and `finish_flush_at` could not tell "no flight" from "my
/// flight's outcome is gone", so the writer answered OK and published a
/// group that never landed. The earlier tests only had a commit (which
/// refused with a copy) race the writer's wait, never a flush.
#[test]
fn a_shutdown_flush_during_a_failed_flight_leaves_its_failure_to_the_writer() {
    let Some(db) = fresh_database("flight_shutdown_flush") else {
        return;
    };
    let store = writer(&db);
    store.pause_after_fence(Some(Duration::from_millis(1100)));
    store.commit(put_meta("flown", "a")).unwrap();
    store.start_flush().unwrap();
    wait_for_paused_transaction(&db, "1.1");
    kill_paused_transaction(&db, "1.1");
    store.pause_after_fence(None);
    assert!(store.flush().is_err(), "the shutdown flush is refused");
    assert!(store.flush().is_err(), "with a copy: the failure stays");
    assert!(store.finish_flush().is_err(), "the writer is told");
    assert!(store.finish_flush().is_ok(), "once");

    // Its outcome taken by another path (none does now): unknown, not Ok.
    if !*store.lost().borrow() {
        store.commit(put_meta("second", "a")).unwrap();
        store.start_flush().unwrap();
        let taken = store.landed_flight().lose_outcome();
        assert!(matches!(taken, Some(Ok(()))), "it landed: {taken:?}");
        assert!(matches!(store.finish_flush(), Err(StoreError::CommitOutcomeUnknown(_))));
        assert!(store.finish_flush().is_ok(), "no flight owed any more");
    }
    assert_eq!(
        db.superuser_sql("SELECT count(*) FROM cascade.meta WHERE k = 'flown'::bytea")
            .unwrap(),
        "0"
    );
}

/// A flight whose lease was taken over before its transaction fenced
/// lands nothing and reports the fence, never Ok: to its writer's view
/// of that epoch, and again to a writer of that epoch that asks once its
/// outcome was taken and the process holds a newer epoch.
///
/// Bug 2 of the first overlapped build's review (second half): a flight
/// whose epoch was lost reported Ok.
#[test]
fn a_flight_whose_lease_was_taken_over_lands_nothing_and_never_reports_ok() {
    let Some(db) = fresh_database("flight_fenced") else {
        return;
    };
    let (a, b) = (open(&db), open(&db));
    a.fence(a.try_acquire(&node("a"), LONG).unwrap().unwrap());
    let writer_view = a.at_epoch(1).writers_view().expect("a writer's view");
    writer_view.commit(put_meta("flown", "a")).unwrap();
    a.release(1).unwrap();
    b.fence(b.try_acquire(&node("b"), LONG).unwrap().unwrap());
    writer_view.start_flush().unwrap();
    assert!(matches!(
        writer_view.finish_flush(),
        Err(StoreError::Fenced { held: 1, current: 2 })
    ));
    assert!(*a.lost().borrow());
    assert_eq!(meta(&b, "flown"), None);

    // Asked again (its outcome taken) once this process holds a newer
    // epoch: still fenced, never Ok.
    b.release(2).unwrap();
    let taken = eventually("a takes the lease again", || a.try_acquire(&node("a"), LONG).unwrap());
    a.fence(taken);
    let old = a.at_epoch(1).writers_view().expect("a writer's view");
    assert!(matches!(old.finish_flush(), Err(StoreError::Fenced { held: 1, .. })));
    assert!(matches!(old.start_flush(), Err(StoreError::Fenced { held: 1, .. })));
}

/// A flush writing several tables sends their writes as one statement
/// (`commit::Statements::merged`): all of them land in one transaction,
/// and a part the server refuses (an INSERT of a key the writer took for
/// absent, written behind its back) lands none of the other parts, and
/// neither does the statement after it.
#[test]
fn a_flush_in_one_statement_lands_all_its_parts_or_none() {
    let Some(db) = fresh_database("merged_flush") else {
        return;
    };
    let store = writer(&db);
    land(
        &store,
        put(&[
            (Table::Outbox, b"r1", b"e"),
            (Table::Backrefs, b"p/1", b"s"),
            (Table::Meta, b"m", b"1"),
        ]),
    )
    .unwrap();
    // Removals, inserts (above the outbox's highest key) and upserts of
    // three tables in one flush.
    let mut batch = put(&[
        (Table::Outbox, b"r2", b"e"),
        (Table::Meta, b"m", b"2"),
        (Table::Backrefs, b"p/2", b"t"),
    ]);
    batch.remove(Table::Backrefs, b"p/1".to_vec());
    land(&store, batch).unwrap();
    let on_server = |sql: &str| db.superuser_sql(sql).unwrap();
    assert_eq!(
        on_server("SELECT string_agg(encode(k, 'escape'), ',' ORDER BY k) FROM cascade.backrefs"),
        "p/2"
    );
    assert_eq!(
        on_server("SELECT encode(v, 'escape') FROM cascade.meta WHERE k = '\\x6d'"),
        "2"
    );
    assert_eq!(on_server("SELECT count(*) FROM cascade.outbox"), "2");
    assert_eq!(
        writing_transactions(
            &db,
            "SELECT xmin FROM cascade.meta UNION ALL SELECT xmin FROM cascade.backrefs \
             UNION ALL SELECT xmin FROM cascade.outbox WHERE k = '\\x7232'",
        ),
        "1",
        "one transaction"
    );

    // r3 is above the highest outbox key the writer knows, so it is sent
    // as a plain INSERT; a row behind its back makes that INSERT fail.
    db.superuser_sql("INSERT INTO cascade.outbox VALUES ('\\x7233', '\\x6f')")
        .unwrap();
    let mut batch = put(&[
        (Table::Outbox, b"r3", b"e"),
        (Table::Meta, b"m", b"3"),
        (Table::Backrefs, b"p/3", b"u"),
    ]);
    batch.remove(Table::Backrefs, b"p/2".to_vec());
    assert!(matches!(land(&store, batch), Err(StoreError::Engine(_))));
    assert_eq!(
        on_server("SELECT encode(v, 'escape') FROM cascade.meta WHERE k = '\\x6d'"),
        "2"
    );
    assert_eq!(
        on_server("SELECT string_agg(encode(k, 'escape'), ',' ORDER BY k) FROM cascade.backrefs"),
        "p/2",
        "neither the removal nor the put of the refused flush"
    );
    assert_eq!(
        meta(&store, "m"),
        Some(b"2".to_vec()),
        "the store reads what the server has"
    );
}

/// The writer on a thread of its own calls the store from a task of a
/// current-thread runtime (`writer/handle.rs`), often after that task
/// spent tokio's cooperative budget on its channels. The store's tests
/// called it from plain threads only, so a wait that stalls on a spent
/// budget passed them, and the first sign was a region whose writer hung
/// at the read after its first group (`tests/high_availability.rs`).
#[test]
fn a_task_that_spent_its_tokio_budget_still_reads_and_commits() {
    let Some(db) = fresh_database("budget") else { return };
    let store = writer(&db);
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let answered = runtime.block_on(async {
            // Each receive spends a unit of the task's budget and this loop
            // never yields while one is ready: past the budget's size, the
            // store is called with none left.
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            for i in 0..300 {
                tx.send(i).unwrap();
            }
            for _ in 0..300 {
                let i = rx.recv().await.unwrap();
                assert_eq!(
                    meta(&store, &format!("absent-{i}")),
                    None,
                    "a read that misses the cache"
                );
                land(&store, put_meta(&format!("k{i}"), "v")).unwrap();
            }
            300
        });
        let _ = done_tx.send(answered);
    });
    let answered = done
        .recv_timeout(DEADLINE)
        .unwrap_or_else(|_| panic!("the store did not answer a task with a spent budget within {DEADLINE:?}"));
    assert_eq!(answered, 300);
}
