//! The PostgreSQL store over a real server (`cascade-testpg`: one server
//! per test binary, a database per test; skipped, saying so once, when
//! PostgreSQL is not installed).

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

#[test]
fn postgres_store_conforms_and_survives_reopen() {
    let Some(db) = fresh_database("conforms") else { return };
    conformance(&*writer(&db));
    let Some(db) = fresh_database("atomic") else { return };
    batches_are_atomic_to_readers(writer(&db), true);
    let Some(db) = fresh_database("reopen") else { return };
    survives_reopen(|| writer(&db));
    let Some(db) = fresh_database("schema") else { return };
    crate::schema_reload::the_start_check_stores_and_reads_back_the_schema_on(&*writer(&db));
}

#[test]
fn get_many_answers_in_the_order_asked_from_cache_and_database() {
    let Some(db) = fresh_database("get_many") else { return };
    let store = writer(&db);
    store
        .commit(put(&[(Table::Backrefs, b"b", b"2"), (Table::Backrefs, b"a", b"1")]))
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
    store.commit(put_meta("k", "1")).unwrap();
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
    store.commit(put_meta("k", "3")).unwrap();
    assert_eq!(meta(&store, "k"), Some(b"3".to_vec()));
    let mut b = Batch::default();
    b.remove(Table::Meta, b"k".to_vec());
    store.commit(b).unwrap();
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
    a.commit(put(&[(Table::Backrefs, b"p/2", b"2")])).unwrap();
    assert_eq!(
        a.scan(Table::Backrefs, scanned, None, 10).unwrap().len(),
        2,
        "a put into it"
    );
    db.superuser_sql("DELETE FROM cascade.backrefs").unwrap();

    // The takeover: b writes every one of those rows, then a writes again.
    learn(&a);
    a.release(1).unwrap();
    b.fence(b.try_acquire(&node("b"), LONG).unwrap().unwrap());
    b.commit(put(&[
        (Table::Backrefs, b"p/1", b"b"),
        (Table::Backrefs, b"q/k", b"b"),
        (Table::Backrefs, b"absent", b"b"),
    ]))
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
/// table's highest key, learnt by its first commit into the table): their
/// puts are sent as plain INSERTs (half an upsert's cost) and their
/// removals not at all. Counted from the plan, checked against the
/// server: a row written behind the writer's back (nobody may, while it
/// holds its epoch) makes a plain INSERT fail, the commit roll back whole,
/// the cache be dropped, and the next commit land.
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
    let counts = |planned: &commit::Planned, table: Table| {
        planned.get(&table).map_or((0, 0, 0), |w| {
            (w.removed.len(), w.inserted.keys.len(), w.upserted.keys.len())
        })
    };
    // Nothing known: upserts, and the commit learns the highest key.
    let first = store.plan(outbox(&["r1", "r2"]));
    assert_eq!(counts(&first, Table::Outbox), (0, 0, 2));
    assert!(first[&Table::Outbox].learn_highest);
    store.commit(outbox(&["r1", "r2"])).unwrap();
    let next = store.plan(outbox(&["r2", "r3", "r4"]));
    assert_eq!(counts(&next, Table::Outbox), (0, 2, 1), "above the highest: inserted");
    assert!(!next[&Table::Outbox].learn_highest);
    // Removals of keys read absent are not sent; of the others they are.
    assert_eq!(store.get(Table::Meta, b"never").unwrap(), None);
    let mut removals = Batch::default();
    removals.remove(Table::Meta, b"never".to_vec());
    removals.remove(Table::Outbox, b"r1".to_vec());
    let planned = store.plan(removals);
    assert!(!planned.contains_key(&Table::Meta));
    assert_eq!(counts(&planned, Table::Outbox), (1, 0, 0));
    store.commit(outbox(&["r2", "r3", "r4"])).unwrap();
    let rows = |store: &PostgresStore| store.scan(Table::Outbox, b"r", None, 10).unwrap();
    assert_eq!(rows(&store).len(), 4);

    // A row behind the writer's back, above the highest it knows.
    db.superuser_sql("INSERT INTO cascade.outbox VALUES ('\\x7235', '\\x6f')")
        .unwrap();
    let conflicting = outbox(&["r5", "r6"]);
    assert_eq!(counts(&store.plan(outbox(&["r5", "r6"])), Table::Outbox), (0, 2, 0));
    assert!(matches!(store.commit(conflicting), Err(StoreError::Engine(_))));
    // Asked before any read: a read of r6 would learn it absent again.
    assert_eq!(
        counts(&store.plan(outbox(&["r5", "r6"])), Table::Outbox),
        (0, 0, 2),
        "forgotten"
    );
    assert_eq!(store.get(Table::Outbox, b"r6").unwrap(), None, "rolled back whole");
    store.commit(outbox(&["r5", "r6"])).unwrap();
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
    a.commit(put_meta("first", "a")).unwrap();
    assert_eq!(b.try_acquire(&node("b"), LONG).unwrap(), None, "held until it expires");
    let lease = b.read().unwrap();
    assert_eq!((lease.epoch, lease.holder), (1, Some(node("a"))));
    assert!(lease.expires_in <= ttl);

    let epoch = eventually("b takes the expired lease", || b.try_acquire(&node("b"), LONG).unwrap());
    assert_eq!(epoch, 2);
    let lost = a.lost();
    assert!(!*lost.borrow());
    match a.commit(put_meta("late", "a")) {
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
    b.commit(put_meta("second", "b")).unwrap();

    // A clean release lets the other take it at once.
    b.release(2).unwrap();
    assert_eq!(b.read().unwrap().holder, None);
    assert_eq!(a.try_acquire(&node("a"), LONG).unwrap(), Some(3));
    a.fence(3);
    assert!(!*lost.borrow());
    a.commit(put_meta("third", "a")).unwrap();
    assert!(matches!(
        b.commit(put_meta("x", "b")),
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
        std::thread::spawn(move || a.commit(put_meta("inflight", "a")))
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
        a.commit(put_meta("after", "a")),
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
    store.commit(put_meta("before", "1")).unwrap();
    server.stop_server();
    let unavailable = |e: StoreError| match e {
        StoreError::Unavailable {
            condition: DiskCondition::DatabaseUnreachable,
            ..
        } => assert!(e.may_clear()),
        other => panic!("{other:?}"),
    };
    unavailable(store.scan(Table::Meta, b"", None, 10).unwrap_err());
    unavailable(store.commit(put_meta("during", "1")).unwrap_err());
    unavailable(store.reopen().unwrap_err());
    assert!(!*store.lost().borrow(), "nothing was sent: not a lost commit");
    server.start_server();
    eventually("the store reaches the server again", || store.reopen().ok());
    store.commit(put_meta("after", "1")).unwrap();
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
    store.commit(put_meta("before", "1")).unwrap();
    store.pause_after_fence(Some(Duration::from_millis(1500)));
    let committing = {
        let store = store.clone();
        std::thread::spawn(move || store.commit(put_meta("during", "1")))
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
    store.commit(put_meta("after", "1")).unwrap();
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
        }
        let commit = start.elapsed() / 20;
        let start = Instant::now();
        for i in 0..100u32 {
            store.commit(put(&[(Table::Meta, &i.to_be_bytes(), b"1")])).unwrap();
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
/// the lease row's share lock for long), and so are the readers'.
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
                ] {
                    let row = client.query_one(&format!("SHOW {setting}"), &[]).await.unwrap();
                    shown.push(row.get::<_, String>(0));
                }
                Ok(shown)
            })
            .unwrap()
    };
    assert_eq!(show(true), ["4s", "1s", "2s"]);
    assert_eq!(show(false), ["10s", "1s", "2s"]);
}
