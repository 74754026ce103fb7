//! Where a scan of a whole table from its first key may start instead
//! ([`ScanFloors`]).
//!
//! Why: a table whose rows are taken from its front and removed (the due
//! index: a work step reads the first due entries, and each is removed or
//! moved later once processed) is, on an LSM engine, a run of tombstones
//! ahead of its first live row until compaction. A scan from the first key
//! passes every one of them, every step: quadratic in the rows a cascade
//! processed (the due index of P1 unset on fjall, issue 28). On sled the
//! removed keys leave empty leaves that an iterator from the first key
//! walks the same way. The outbox keeps its floor in the store (its
//! compaction owns it, `codec.rs`); these floors are in memory, so after a
//! restart (or a reopen) a scan starts at the first key once and sets the
//! floor again.

use std::sync::Mutex;

use super::{Batch, Entry, Store, StoreError, Table};

/// Where the first live row of a table may be.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Floor {
    /// Not known: from the first key.
    Start,
    /// No live row below this key (the key itself may be one).
    At(Vec<u8>),
    /// The last scan found no row at all, and nothing was put since.
    Empty,
}

#[derive(Debug)]
struct Floors {
    by_table: [Floor; Table::ALL.len()],
    /// Commits that have lowered the floors but not landed yet: a scan
    /// that overlaps one may have read before the commit's rows, so it
    /// raises no floor.
    in_flight: u32,
    /// Commits that landed, so that a scan knows whether one overlapped it.
    landed: u64,
}

/// The floor of each table: a key below which no row is live, lowered by
/// every commit that puts a key below it (before the commit writes, so a
/// commit that fails but lands is covered) and raised by a scan from the
/// floor to the first live row it found, unless a commit overlapped the
/// scan. Only whole-table scans from the first key use it
/// ([`scan_from_floor`]); any scan is still right without it.
#[derive(Debug)]
pub struct ScanFloors(Mutex<Floors>);

impl Default for ScanFloors {
    fn default() -> Self {
        Self(Mutex::new(Floors {
            by_table: std::array::from_fn(|_| Floor::Start),
            in_flight: 0,
            landed: 0,
        }))
    }
}

/// What a scan read of the floors before it scanned: its start, and
/// whether it may raise the floor after (no commit in flight).
#[derive(Debug)]
pub struct FloorTicket {
    floor: Floor,
    landed: Option<u64>,
}

impl ScanFloors {
    /// Before a commit writes: every floor above a key the batch puts goes
    /// down to it. Call [`ScanFloors::landed`] after, whatever the outcome.
    pub fn before_commit(&self, batch: &Batch) {
        let Ok(mut floors) = self.0.lock() else { return };
        floors.in_flight += 1;
        for (table, key, value) in &batch.ops {
            if value.is_none() {
                continue;
            }
            let floor = &mut floors.by_table[table.index()];
            let lower = match floor {
                Floor::Start => false,
                Floor::At(at) => key.as_slice() < at.as_slice(),
                Floor::Empty => true,
            };
            if lower {
                *floor = Floor::At(key.clone());
            }
        }
    }

    /// After a commit, landed or failed (see [`ScanFloors::before_commit`]).
    pub fn landed(&self) {
        if let Ok(mut floors) = self.0.lock() {
            floors.in_flight = floors.in_flight.saturating_sub(1);
            floors.landed += 1;
        }
    }

    /// Forgets every floor: after a reopen, the engine may hold a batch
    /// whose commit reported an error (fjall recovers it from its journal).
    pub fn forget(&self) {
        if let Ok(mut floors) = self.0.lock() {
            floors.by_table = std::array::from_fn(|_| Floor::Start);
            floors.landed += 1;
        }
    }

    fn ticket(&self, table: Table) -> FloorTicket {
        match self.0.lock() {
            Ok(floors) => FloorTicket {
                floor: floors.by_table[table.index()].clone(),
                landed: (floors.in_flight == 0).then_some(floors.landed),
            },
            Err(_) => FloorTicket {
                floor: Floor::Start,
                landed: None,
            },
        }
    }

    /// After a scan from the ticket's floor: `first` is the first live row
    /// it found (None: none at all). Raises the floor unless a commit
    /// overlapped the scan.
    fn raise(&self, table: Table, ticket: &FloorTicket, first: Option<&[u8]>) {
        let Ok(mut floors) = self.0.lock() else { return };
        if floors.in_flight != 0 || ticket.landed != Some(floors.landed) {
            return;
        }
        floors.by_table[table.index()] = match first {
            Some(key) => Floor::At(key.to_vec()),
            None => Floor::Empty,
        };
    }
}

/// The greatest key we can name that is strictly below `key` with nothing
/// between it and `key` but longer keys starting with it (none, for the
/// fixed-width keys this serves): the `after` of a scan that must include
/// `key`.
fn just_below(key: &[u8]) -> Option<Vec<u8>> {
    let (&last, head) = key.split_last()?;
    let mut out = head.to_vec();
    if last > 0 {
        out.push(last - 1);
    }
    Some(out)
}

/// The first `limit` rows of `table` (limit above 0), as
/// `store.scan(table, &[], None, limit)` answers them, but starting at the
/// table's floor when the store keeps one ([`Store::scan_floors`]), and
/// raising it to the first row found.
pub fn scan_from_floor(store: &dyn Store, table: Table, limit: usize) -> Result<Vec<Entry>, StoreError> {
    let Some(floors) = store.scan_floors() else {
        return store.scan(table, &[], None, limit);
    };
    let ticket = floors.ticket(table);
    let after = match &ticket.floor {
        Floor::Start => None,
        Floor::At(key) => just_below(key),
        Floor::Empty => return Ok(Vec::new()),
    };
    let page = store.scan(table, &[], after.as_deref(), limit)?;
    if limit > 0 {
        floors.raise(table, &ticket, page.first().map(|(k, _)| k.as_slice()));
    }
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn put(store: &dyn Store, key: &[u8]) {
        let mut b = Batch::default();
        b.put(Table::DueIndex, key.to_vec(), Vec::new());
        store.commit(b).unwrap();
    }

    fn remove(store: &dyn Store, key: &[u8]) {
        let mut b = Batch::default();
        b.remove(Table::DueIndex, key.to_vec());
        store.commit(b).unwrap();
    }

    fn first(store: &dyn Store) -> Option<Vec<u8>> {
        scan_from_floor(store, Table::DueIndex, 1)
            .unwrap()
            .first()
            .map(|(k, _)| k.clone())
    }

    #[test]
    fn a_key_put_below_the_floor_is_found() {
        let store = MemoryStore::default();
        for k in [[5u8, 0], [6, 1], [7, 255]] {
            put(&store, &k);
        }
        assert_eq!(first(&store), Some(vec![5, 0]));
        remove(&store, &[5, 0]);
        assert_eq!(first(&store), Some(vec![6, 1]));
        put(&store, &[1, 0]);
        assert_eq!(first(&store), Some(vec![1, 0]), "a put below the floor lowers it");
        for k in [[1u8, 0], [6, 1], [7, 255]] {
            remove(&store, &k);
        }
        assert_eq!(first(&store), None);
        assert_eq!(first(&store), None, "an empty table answers without a scan");
        put(&store, &[9, 9]);
        assert_eq!(first(&store), Some(vec![9, 9]), "a put into an empty table is found");
    }

    #[test]
    fn a_scan_that_overlapped_a_commit_raises_nothing() {
        let store = MemoryStore::default();
        put(&store, &[5]);
        let floors = store.scan_floors().unwrap();
        let ticket = floors.ticket(Table::DueIndex);
        // A commit lands between the scan's read of the floor and its raise.
        put(&store, &[3]);
        floors.raise(Table::DueIndex, &ticket, Some(&[5u8][..]));
        assert_eq!(first(&store), Some(vec![3]));
    }

    #[test]
    fn just_below_is_below_and_names_no_shorter_key_between() {
        assert_eq!(just_below(&[]), None);
        assert_eq!(just_below(&[4, 0]), Some(vec![4]));
        assert_eq!(just_below(&[4, 7]), Some(vec![4, 6]));
    }
}
