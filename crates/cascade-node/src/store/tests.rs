//! The conformance suite every engine passes, and the engine selection's tests.

use super::*;

pub(super) fn put(ops: &[(Table, &[u8], &[u8])]) -> Batch {
    let mut b = Batch::default();
    for (t, k, v) in ops {
        b.put(*t, k.to_vec(), v.to_vec());
    }
    b
}

fn keys(entries: &[Entry]) -> Vec<&[u8]> {
    entries.iter().map(|(k, _)| k.as_slice()).collect()
}

/// What every engine must do, on a fresh store. One function over
/// `&dyn Store`, so the engines are held to the same assertions.
pub(super) fn conformance(store: &dyn Store) {
    use Table::*;
    let s = |t, p: &[u8], a: Option<&[u8]>, l| store.scan(t, p, a, l).unwrap();

    // Empty batches and empty tables.
    store.commit(Batch::default()).unwrap();
    assert!(s(Resources, b"", None, 10).is_empty());
    assert_eq!(store.get(Resources, b"a").unwrap(), None);

    // Prefix boundaries: a key equal to the prefix is in it; a shorter
    // key, a key just before and a key just after are not.
    store
        .commit(put(&[
            (Resources, b"a/w/zz", b"before"),
            (Resources, b"a/x", b"shorter"),
            (Resources, b"a/x/", b"equal"),
            (Resources, b"a/x/1", b"1"),
            (Resources, b"a/x/2", b"2"),
            (Resources, b"a/x/3", b"3"),
            (Resources, b"a/x0", b"after"),
            (Resources, b"a/y/1", b"y"),
        ]))
        .unwrap();
    let all: Vec<&[u8]> = vec![b"a/x/", b"a/x/1", b"a/x/2", b"a/x/3"];
    assert_eq!(keys(&s(Resources, b"a/x/", None, 100)), all);
    assert_eq!(
        s(Resources, b"a/x/", None, 100)[1],
        (b"a/x/1".to_vec(), b"1".to_vec()),
        "values come with their keys"
    );
    // `after` before the prefix, equal to it, inside, at the last key, beyond.
    assert_eq!(keys(&s(Resources, b"a/x/", Some(b"a/w/zz"), 100)), all);
    assert_eq!(keys(&s(Resources, b"a/x/", Some(b""), 100)), all);
    assert_eq!(keys(&s(Resources, b"a/x/", Some(b"a/x/"), 100)), all[1..]);
    assert_eq!(keys(&s(Resources, b"a/x/", Some(b"a/x/1"), 100)), all[2..]);
    assert_eq!(
        keys(&s(Resources, b"a/x/", Some(b"a/x/15"), 100)),
        all[2..],
        "an `after` that is no key"
    );
    assert_eq!(keys(&s(Resources, b"a/x/", Some(b"a/x/3"), 100)), Vec::<&[u8]>::new());
    assert_eq!(keys(&s(Resources, b"a/x/", Some(b"a/x0"), 100)), Vec::<&[u8]>::new());
    assert_eq!(keys(&s(Resources, b"a/x/", Some(b"b"), 100)), Vec::<&[u8]>::new());
    // `limit` 0, 1, some, exactly all, more than all.
    assert!(s(Resources, b"a/x/", None, 0).is_empty());
    assert!(s(Resources, b"a/x/", Some(b"a/x/1"), 0).is_empty());
    assert_eq!(keys(&s(Resources, b"a/x/", None, 1)), all[..1]);
    assert_eq!(keys(&s(Resources, b"a/x/", Some(b"a/x/1"), 1)), all[2..3]);
    assert_eq!(keys(&s(Resources, b"a/x/", None, 3)), all[..3]);
    assert_eq!(keys(&s(Resources, b"a/x/", None, 4)), all);
    assert_eq!(
        keys(&s(Resources, b"", None, usize::MAX)).len(),
        8,
        "the empty prefix is the table"
    );
    assert_eq!(keys(&s(Resources, b"", Some(b"a/x0"), 100)), vec![b"a/y/1".as_slice()]);
    assert_eq!(keys(&s(Resources, b"zzz", None, 100)), Vec::<&[u8]>::new());

    // Prefixes of 0xff bytes: no "next prefix" to stop at, the table's end is.
    store
        .commit(put(&[
            (Outbox, &[0xfe, 0xff], b"a"),
            (Outbox, &[0xff], b"b"),
            (Outbox, &[0xff, 0x00], b"c"),
            (Outbox, &[0xff, 0xff], b"d"),
            (Outbox, &[0xff, 0xff, 0x00], b"e"),
            (Outbox, &[0xff, 0xff, 0xff], b"f"),
        ]))
        .unwrap();
    let ff: Vec<&[u8]> = vec![&[0xff, 0xff], &[0xff, 0xff, 0x00], &[0xff, 0xff, 0xff]];
    assert_eq!(keys(&s(Outbox, &[0xff, 0xff], None, 100)), ff);
    assert_eq!(keys(&s(Outbox, &[0xff, 0xff], Some(&[0xff, 0xff, 0x00]), 100)), ff[2..]);
    assert_eq!(
        keys(&s(Outbox, &[0xff, 0xff], Some(&[0xff, 0xff, 0xff]), 100)),
        Vec::<&[u8]>::new()
    );
    assert_eq!(keys(&s(Outbox, &[0xff], None, 100)).len(), 5);
    let first_two: Vec<&[u8]> = vec![&[0xff], &[0xff, 0x00]];
    assert_eq!(keys(&s(Outbox, &[0xff], Some(&[0xfe]), 2)), first_two);
    // `after` at or past the prefix's end: nothing follows it (a range
    // whose start passes its end panics in sled's and std's maps).
    assert_eq!(keys(&s(Outbox, &[0xfe, 0xff], Some(&[0xff]), 10)), Vec::<&[u8]>::new());
    assert_eq!(
        keys(&s(Outbox, &[0xfe, 0xff], Some(&[0xff, 0x00]), 10)),
        Vec::<&[u8]>::new()
    );
    assert_eq!(keys(&s(Resources, b"a/x/", Some(b"a/x0"), 10)), Vec::<&[u8]>::new());
    assert_eq!(keys(&s(Resources, b"a/x/", Some(b"b"), 10)), Vec::<&[u8]>::new());

    // Every table is its own key space: one key, a value per table.
    let mut b = Batch::default();
    for t in Table::ALL {
        b.put(t, b"shared".to_vec(), t.name().as_bytes().to_vec());
    }
    store.commit(b).unwrap();
    for t in Table::ALL {
        assert_eq!(store.get(t, b"shared").unwrap(), Some(t.name().as_bytes().to_vec()));
        let in_t = s(t, b"shared", None, 100);
        assert_eq!(
            in_t,
            vec![(b"shared".to_vec(), t.name().as_bytes().to_vec())],
            "{}",
            t.name()
        );
    }
    let mut b = Batch::default();
    b.remove(Cursors, b"shared".to_vec());
    store.commit(b).unwrap();
    assert_eq!(store.get(Cursors, b"shared").unwrap(), None);
    assert_eq!(store.get(Meta, b"shared").unwrap(), Some(b"meta".to_vec()));
    assert_eq!(
        store.get(PendingAttach, b"shared").unwrap(),
        Some(b"pending_attach".to_vec())
    );

    // Removing a missing key is no error and changes nothing.
    let mut b = Batch::default();
    b.remove(Resources, b"a/x/missing".to_vec());
    b.remove(Deletions, b"never".to_vec());
    store.commit(b).unwrap();
    assert_eq!(keys(&s(Resources, b"a/x/", None, 100)), all);

    // A batch applies in order: the last write of a key wins.
    let mut b = Batch::default();
    b.put(Meta, b"twice".to_vec(), b"first".to_vec());
    b.put(Meta, b"twice".to_vec(), b"second".to_vec());
    b.put(Meta, b"gone".to_vec(), b"x".to_vec());
    b.remove(Meta, b"gone".to_vec());
    b.remove(Resources, b"a/x/2".to_vec());
    b.put(Resources, b"a/x/2".to_vec(), b"back".to_vec());
    store.commit(b).unwrap();
    assert_eq!(store.get(Meta, b"twice").unwrap(), Some(b"second".to_vec()));
    assert_eq!(store.get(Meta, b"gone").unwrap(), None);
    assert_eq!(store.get(Resources, b"a/x/2").unwrap(), Some(b"back".to_vec()));

    // Reads that lend their values (`get_in`, `scan_in`) see what the
    // copies see.
    let mut lent = Vec::new();
    for key in [&b"a/x/2"[..], b"a/x/9", b"twice"] {
        store.get_in(Resources, key, &mut |v| lent.push(v.to_vec())).unwrap();
    }
    assert_eq!(lent, vec![b"back".to_vec()], "an absent key lends nothing");
    for (after, limit) in [(None, 100), (Some(&b"a/x/"[..]), 2), (Some(b"a/x/3"), 5), (None, 0)] {
        let mut scanned = Vec::new();
        store
            .scan_in(Resources, b"a/x/", after, limit, &mut |k, v| {
                scanned.push((k.to_vec(), v.to_vec()))
            })
            .unwrap();
        assert_eq!(
            scanned,
            s(Resources, b"a/x/", after, limit),
            "after {after:?}, limit {limit}"
        );
    }

    // Large values.
    let big = vec![0xa5u8; 1 << 20];
    store.commit(put(&[(Operations, b"big", &big)])).unwrap();
    assert_eq!(store.get(Operations, b"big").unwrap().as_deref(), Some(big.as_slice()));
    assert_eq!(s(Operations, b"big", None, 1), vec![(b"big".to_vec(), big)]);
    store.flush().unwrap();
}

/// Batch `n` of the atomicity tests: `n` under key `n` in Resources first,
/// then under 200 keys of Backrefs, then under `n` in Outbox last.
pub(super) fn batch_numbered(n: u64) -> Batch {
    let mut batch = Batch::default();
    batch.put(Table::Resources, b"n".to_vec(), n.to_be_bytes().to_vec());
    for i in 0..200u32 {
        batch.put(Table::Backrefs, i.to_be_bytes().to_vec(), n.to_be_bytes().to_vec());
    }
    batch.put(Table::Outbox, b"n".to_vec(), n.to_be_bytes().to_vec());
    batch
}

/// A batch over several tables, seen by a concurrent reader: all of it
/// or none of it. Batch n writes n into Resources first and into Outbox
/// last, with many writes between; a reader reads Resources, then Outbox:
/// with atomic batches the later read can never be older.
///
/// A scan also sees one batch whole: on every engine (sled's since a scan
/// holds its batch lock for the page, where its iterators alone read each
/// key as of when they reach it).
pub(super) fn batches_are_atomic_to_readers(store: Arc<dyn Store>) {
    const BATCHES: u64 = 200;
    let writer = {
        let store = store.clone();
        std::thread::spawn(move || {
            for n in 1..=BATCHES {
                store.commit(batch_numbered(n)).unwrap();
            }
        })
    };
    let read = |t| {
        store
            .get(t, b"n")
            .unwrap()
            .map_or(0, |v| u64::from_be_bytes(v.as_slice().try_into().unwrap()))
    };
    let mut checks = 0;
    loop {
        let first = read(Table::Resources);
        let last = read(Table::Outbox);
        assert!(
            last >= first,
            "saw batch {first} in resources but only {last} in outbox"
        );
        let page = store.scan(Table::Backrefs, b"", None, 1000).unwrap();
        let scanned = read(Table::Outbox);
        if let Some((_, v)) = page.first() {
            let n = u64::from_be_bytes(v.as_slice().try_into().unwrap());
            assert!(page.iter().all(|(_, w)| w == v), "a scan saw two batches at once");
            assert_eq!(page.len(), 200, "a scan saw part of batch {n}");
            assert!(scanned >= n, "scanned batch {n}, then read outbox at {scanned}");
        }
        checks += 1;
        if first == BATCHES {
            break;
        }
    }
    writer.join().unwrap();
    assert!(checks > 1);
}

/// Committed and flushed batches survive dropping and reopening.
pub(super) fn survives_reopen(open: impl Fn() -> Arc<dyn Store>) {
    let big = vec![0x5au8; 1 << 20];
    {
        let store = open();
        for n in 0u32..50 {
            let mut b = Batch::default();
            for t in [Table::Resources, Table::UidIndex, Table::Outbox] {
                b.put(t, n.to_be_bytes().to_vec(), format!("{}-{n}", t.name()).into_bytes());
            }
            if n > 0 {
                b.remove(Table::Meta, (n - 1).to_be_bytes().to_vec());
            }
            b.put(Table::Meta, n.to_be_bytes().to_vec(), b"latest".to_vec());
            store.commit(b).unwrap();
        }
        store.commit(put(&[(Table::Operations, b"big", &big)])).unwrap();
        store.flush().unwrap();
    }
    let store = open();
    for t in [Table::Resources, Table::UidIndex, Table::Outbox] {
        let got = store.scan(t, b"", None, 1000).unwrap();
        let want: Vec<Entry> = (0u32..50)
            .map(|n| (n.to_be_bytes().to_vec(), format!("{}-{n}", t.name()).into_bytes()))
            .collect();
        assert_eq!(got, want, "{}", t.name());
    }
    assert_eq!(
        store.scan(Table::Meta, b"", None, 10).unwrap(),
        vec![(49u32.to_be_bytes().to_vec(), b"latest".to_vec())]
    );
    assert_eq!(store.get(Table::Operations, b"big").unwrap(), Some(big));
}

#[test]
fn memory_store_conforms() {
    conformance(&MemoryStore::default());
    batches_are_atomic_to_readers(Arc::new(MemoryStore::default()));
}

#[test]
fn sled_store_conforms_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    conformance(&SledStore::open(&dir.path().join("a")).unwrap());
    batches_are_atomic_to_readers(Arc::new(SledStore::open(&dir.path().join("b")).unwrap()));
    survives_reopen(|| Arc::new(SledStore::open(&dir.path().join("c")).unwrap()));
}

/// CI failed once on `survives_reopen` above: "could not acquire lock",
/// because sled's background threads hold the file a moment after the last
/// handle is dropped. That race is rare, so this test makes it certain: the
/// previous handle is still open when the new open starts, and goes 200 ms
/// later; the open waits for it instead of failing.
#[test]
fn sled_reopen_waits_for_the_lock_its_previous_handles_still_hold() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let previous = SledStore::open(&path).unwrap();
    previous.commit(put(&[(Table::Meta, b"k", b"v")])).unwrap();
    previous.flush().unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        drop(previous);
    });
    let reopened = SledStore::open(&path).unwrap();
    release.join().unwrap();
    assert_eq!(reopened.get(Table::Meta, b"k").unwrap(), Some(b"v".to_vec()));
}

#[test]
fn fjall_store_conforms_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    conformance(&FjallStore::open(&dir.path().join("a")).unwrap());
    batches_are_atomic_to_readers(Arc::new(FjallStore::open(&dir.path().join("b")).unwrap()));
    survives_reopen(|| Arc::new(FjallStore::open(&dir.path().join("c")).unwrap()));
}

/// A node SIGKILLed inside fjall's creation of its database (the journal
/// made, the version marker not yet) must start again: fjall alone
/// answered "File exists" for the journal at every later open
/// (`cross_region_crash` killed a node there in CI).
#[test]
fn a_fjall_database_whose_creation_was_cut_short_opens_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut");
    // What fjall's `create_new` leaves before its marker.
    std::fs::create_dir_all(path.join("keyspaces")).unwrap();
    std::fs::write(path.join("lock"), b"").unwrap();
    std::fs::write(path.join("0.jnl"), b"").unwrap();
    let store = FjallStore::open(&path).expect("a creation cut short is created afresh");
    store.commit(put(&[(Table::Meta, b"k", b"v")])).unwrap();
    store.flush().unwrap();
    drop(store);
    let store = FjallStore::open(&path).expect("and opens as any database after");
    assert_eq!(store.get(Table::Meta, b"k").unwrap(), Some(b"v".to_vec()));
    // A database that was created keeps its data: only a journal without
    // a marker is a creation cut short.
    drop(store);
    assert!(path.join("version").exists());
    let store = FjallStore::open(&path).unwrap();
    assert_eq!(store.get(Table::Meta, b"k").unwrap(), Some(b"v".to_vec()));
}

/// What a node killed inside its first open leaves when fjall's `version`
/// marker is written and only the first `made` keyspaces are: fjall
/// itself, stopped at that point.
fn fjall_creation_stopped_after(path: &Path, made: usize) {
    let db = fjall::Database::builder(path).open().unwrap();
    for table in &Table::ALL[..made] {
        db.keyspace(table.name(), fjall::KeyspaceCreateOptions::default)
            .unwrap();
    }
}

/// A node killed between fjall's marker and the last of its keyspaces
/// starts again: the database, which never held a row, is created
/// afresh, and every table reads and writes.
#[test]
fn a_fjall_database_cut_between_its_marker_and_its_keyspaces_opens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut");
    fjall_creation_stopped_after(&path, 6);
    let store = FjallStore::open(&path).expect("a creation cut short among its keyspaces opens");
    for table in Table::ALL {
        store.commit(put(&[(table, b"k", table.name().as_bytes())])).unwrap();
    }
    store.flush().unwrap();
    drop(store);
    let store = FjallStore::open(&path).expect("and opens as any database after");
    for table in Table::ALL {
        assert_eq!(store.get(table, b"k").unwrap(), Some(table.name().as_bytes().to_vec()));
    }
}

/// A database that lost a keyspace is refused, naming it, when it may
/// have held data: its other tables hold rows, or its data_dir was opened
/// before (its ENGINE file). Opened, the lost table would read as empty.
#[test]
fn a_fjall_database_that_lost_a_keyspace_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let lose_outcomes = |path: &Path| {
        let db = fjall::Database::builder(path).open().unwrap();
        let outcomes = db
            .keyspace(Table::Outcomes.name(), fjall::KeyspaceCreateOptions::default)
            .unwrap();
        db.delete_keyspace(outcomes).unwrap();
    };

    let with_data = dir.path().join("with_data");
    let store = FjallStore::open(&with_data).unwrap();
    store.commit(put(&[(Table::Resources, b"project/p", b"v")])).unwrap();
    store.flush().unwrap();
    drop(store);
    lose_outcomes(&with_data);
    let refused = FjallStore::open(&with_data)
        .err()
        .expect("a database with data that lost a keyspace");
    let message = refused.to_string();
    assert!(message.contains("no keyspace outcomes"), "{message}");
    assert!(message.contains("it holds data (in resources)"), "{message}");
    assert!(!refused.may_clear(), "{refused:?}");

    let opened_before = dir.path().join("opened_before");
    drop(open_store(StorageEngine::Fjall, Some(&opened_before)).unwrap());
    lose_outcomes(&opened_before);
    let refused = open_store(StorageEngine::Fjall, Some(&opened_before))
        .err()
        .expect("an empty database opened before that lost a keyspace");
    let message = refused.to_string();
    assert!(message.contains("no keyspace outcomes"), "{message}");
    assert!(message.contains("ENGINE file"), "{message}");
}

#[test]
fn engine_names_round_trip_and_sled_is_the_default() {
    assert_eq!(StorageEngine::default(), StorageEngine::Sled);
    for e in StorageEngine::ALL {
        assert_eq!(e.to_string().parse::<StorageEngine>(), Ok(e));
    }
    assert_eq!("fjall".parse(), Ok(StorageEngine::Fjall));
    let e = "Fjall".parse::<StorageEngine>().unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown storage engine \"Fjall\" (expected one of: sled, fjall, postgres)"
    );
}

#[test]
fn open_store_without_a_directory_is_in_memory() {
    for e in StorageEngine::ALL.into_iter().filter(|e| e.embedded()) {
        let store = open_store(e, None).unwrap();
        store.commit(put(&[(Table::Meta, b"k", b"v")])).unwrap();
        assert_eq!(store.get(Table::Meta, b"k").unwrap(), Some(b"v".to_vec()));
    }
    // postgres is opened by open_postgres, with its connection settings.
    let data_dir = tempfile::tempdir().unwrap();
    for dir in [None, Some(data_dir.path())] {
        match open_store(StorageEngine::Postgres, dir) {
            Ok(_) => panic!("postgres opened without its connection settings"),
            Err(e) => assert!(e.to_string().contains("open it with open_postgres"), "{e}"),
        }
    }
    assert!(!data_dir.path().join(ENGINE_MARKER).exists());
}

fn wrong_engine(dir: &Path, engine: StorageEngine) -> (StorageEngine, String) {
    match open_store(engine, Some(dir)) {
        Ok(_) => panic!("{} opened with {engine}", dir.display()),
        Err(e @ StoreError::WrongEngine { found, configured, .. }) => {
            assert_eq!(configured, engine);
            (found, e.to_string())
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn a_data_dir_remembers_its_engine() {
    use StorageEngine::*;
    let root = tempfile::tempdir().unwrap();
    for (engine, other) in [(Sled, Fjall), (Fjall, Sled)] {
        let dir = root.path().join(engine.name()).join("nested");
        {
            let store = open_store(engine, Some(&dir)).unwrap();
            store.commit(put(&[(Table::Meta, b"k", b"v")])).unwrap();
            store.flush().unwrap();
        }
        let marker = std::fs::read_to_string(dir.join(ENGINE_MARKER)).unwrap();
        assert_eq!(marker, format!("{engine}\n"));
        let (found, message) = wrong_engine(&dir, other);
        assert_eq!(found, engine);
        assert_eq!(
            message,
            format!(
                "data_dir {} holds a {engine} database, but the storage engine is {other}: \
                 set `[storage] engine = \"{engine}\"` (or --storage-engine {engine}) to open it, \
                 or use a fresh data_dir for {other}",
                dir.display()
            )
        );
        // The refusal touched nothing: the right engine still reads it.
        let store = open_store(engine, Some(&dir)).unwrap();
        assert_eq!(store.get(Table::Meta, b"k").unwrap(), Some(b"v".to_vec()));
    }
}

#[test]
fn a_data_dir_in_use_is_refused() {
    let root = tempfile::tempdir().unwrap();
    for engine in StorageEngine::ALL.into_iter().filter(|e| e.embedded()) {
        let dir = root.path().join(engine.name());
        let _open = open_store(engine, Some(&dir)).unwrap();
        let err = open_store(engine, Some(&dir)).err().expect("opened twice").to_string();
        assert!(err.contains(&dir.display().to_string()), "{engine}: {err}");
    }
}

#[test]
fn a_data_dir_without_a_marker_is_known_by_its_files() {
    use StorageEngine::*;
    let root = tempfile::tempdir().unwrap();
    // Written before markers existed (sled), or the process died between
    // the engine creating its files and the marker (either engine).
    let sled_dir = root.path().join("sled");
    drop(SledStore::open(&sled_dir).unwrap());
    let fjall_dir = root.path().join("fjall");
    drop(FjallStore::open(&fjall_dir).unwrap());
    for (dir, engine, other) in [(&sled_dir, Sled, Fjall), (&fjall_dir, Fjall, Sled)] {
        assert!(!dir.join(ENGINE_MARKER).exists());
        assert_eq!(wrong_engine(dir, other).0, engine);
        drop(open_store(engine, Some(dir)).unwrap());
        assert_eq!(
            std::fs::read_to_string(dir.join(ENGINE_MARKER)).unwrap(),
            format!("{engine}\n"),
            "the marker is written on the first open"
        );
    }
    // A marker that names no engine is an error that says what the file is.
    std::fs::write(sled_dir.join(ENGINE_MARKER), "rocksdb\n").unwrap();
    let err = open_store(Sled, Some(&sled_dir)).err().unwrap().to_string();
    assert!(
        err.contains("unknown storage engine \"rocksdb\"") && err.contains("names the engine that wrote"),
        "{err}"
    );
}
