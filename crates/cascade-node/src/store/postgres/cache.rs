//! The PostgreSQL store's write-through read cache: point lookups, found
//! and not found, bounded in bytes.
//!
//! Why: the core reads key by key, and over a network each read is a
//! round trip (tens of µs on loopback, more across hosts); a cascade reads
//! the same few rows (its operation, counters, the targets it walks) over
//! and over. Why it is coherent: only the fenced writer's process reads
//! and writes the region's tables (standbys read the lease and members
//! rows only), so every change to them goes through this store's commits,
//! which write through. At every `fence` (a new epoch; another node may
//! have written in between) the cache is dropped.
//!
//! Reads and commits race (the conformance test reads while a thread
//! commits), so: a commit marks the cache busy before its COMMIT and
//! writes through after it, both under the lock; a lookup while it is busy
//! goes to the database (the cache may be a batch behind it); and a value
//! read from the database is kept only if no commit started since the read
//! began (a generation count), so an older value never overwrites a newer
//! one.

use std::sync::{PoisonError, RwLock};

use quick_cache::unsync::Cache;
use quick_cache::Weighter;

use crate::store::Table;

/// A cached lookup: the value, or None for a key known to be absent.
type Cached = Option<Vec<u8>>;

/// Bytes an entry costs beyond its key and value (map slot, vectors'
/// headers): a rough figure, so that many absent keys still count.
const ENTRY_OVERHEAD: u64 = 64;

#[derive(Clone, Default)]
struct ByteWeighter;

impl Weighter<(Table, Vec<u8>), Cached> for ByteWeighter {
    fn weight(&self, key: &(Table, Vec<u8>), value: &Cached) -> u64 {
        ENTRY_OVERHEAD + key.1.len() as u64 + value.as_ref().map_or(0, |v| v.len() as u64)
    }
}

struct State {
    entries: Cache<(Table, Vec<u8>), Cached, ByteWeighter>,
    /// Odd while a commit is in flight; changes at every commit's start
    /// and end and at every clear.
    generation: u64,
}

/// The cache. A zero capacity keeps nothing (every lookup a miss).
pub(super) struct ReadCache {
    state: RwLock<State>,
}

/// What a lookup found.
pub(super) enum Lookup {
    /// The key's value (or its absence), as of the last commit.
    Hit(Cached),
    /// Not cached: read the database, then [`ReadCache::remember`] with
    /// this generation.
    Miss(u64),
}

impl ReadCache {
    pub(super) fn new(capacity_bytes: u64) -> Self {
        // An estimate of the entries it will hold, for its tables only.
        let estimated_items = usize::try_from(capacity_bytes / 512).unwrap_or(usize::MAX).max(16);
        Self {
            state: RwLock::new(State {
                entries: Cache::with_weighter(estimated_items, capacity_bytes, ByteWeighter),
                generation: 0,
            }),
        }
    }

    pub(super) fn lookup(&self, table: Table, key: &[u8]) -> Lookup {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        if state.generation & 1 == 1 {
            // A commit in flight: the database may be ahead of the cache.
            return Lookup::Miss(state.generation);
        }
        match state.entries.get(&(table, key.to_vec())) {
            Some(value) => Lookup::Hit(value.clone()),
            None => Lookup::Miss(state.generation),
        }
    }

    /// Keeps what a read of the database found, unless a commit started
    /// (or the cache was cleared) since the read began at `generation`.
    pub(super) fn remember(&self, generation: u64, table: Table, key: Vec<u8>, value: Cached) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if state.generation == generation && generation & 1 == 0 {
            state.entries.insert((table, key), value);
        }
    }

    /// A commit is about to be sent.
    pub(super) fn commit_started(&self) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        state.generation = state.generation.wrapping_add(1) | 1;
    }

    /// The commit ended: `writes` (the batch's last write per key) landed,
    /// or, None, the commit failed (maybe landed: the cache is dropped).
    pub(super) fn commit_ended<'a>(&self, writes: Option<impl Iterator<Item = (Table, &'a [u8], Option<&'a [u8]>)>>) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        match writes {
            Some(writes) => {
                for (table, key, value) in writes {
                    state.entries.insert((table, key.to_vec()), value.map(<[u8]>::to_vec));
                }
            }
            None => state.entries.clear(),
        }
        state.generation = (state.generation | 1).wrapping_add(1);
    }

    /// Drops everything (a new epoch: another node may have written).
    pub(super) fn clear(&self) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        state.entries.clear();
        // Different from every read begun before, and as odd or even as
        // it was (a commit in flight stays in flight).
        state.generation = state.generation.wrapping_add(2);
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.state.read().unwrap_or_else(PoisonError::into_inner).entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(cache: &ReadCache, key: &[u8]) -> Option<Cached> {
        match cache.lookup(Table::Meta, key) {
            Lookup::Hit(value) => Some(value),
            Lookup::Miss(_) => None,
        }
    }

    fn generation(cache: &ReadCache, key: &[u8]) -> u64 {
        match cache.lookup(Table::Meta, key) {
            Lookup::Miss(generation) => generation,
            Lookup::Hit(_) => panic!("cached"),
        }
    }

    fn landed(cache: &ReadCache, key: &[u8], value: Option<&[u8]>) {
        cache.commit_ended(Some(std::iter::once((Table::Meta, key, value))));
    }

    #[test]
    fn a_read_begun_before_a_commit_never_overwrites_what_it_wrote() {
        let cache = ReadCache::new(1 << 20);
        let before = generation(&cache, b"k");
        cache.commit_started();
        // While the commit is in flight the cache is bypassed.
        assert!(hit(&cache, b"k").is_none());
        landed(&cache, b"k", Some(b"new"));
        // The old read comes back with the old value: not kept.
        cache.remember(before, Table::Meta, b"k".to_vec(), Some(b"old".to_vec()));
        assert_eq!(hit(&cache, b"k"), Some(Some(b"new".to_vec())));
        // A read begun after the commit is kept, absent keys too.
        let after = generation(&cache, b"gone");
        cache.remember(after, Table::Meta, b"gone".to_vec(), None);
        assert_eq!(hit(&cache, b"gone"), Some(None));
    }

    #[test]
    fn a_failed_commit_or_a_fence_drops_everything() {
        let cache = ReadCache::new(1 << 20);
        landed(&cache, b"k", Some(b"v"));
        let stale = generation(&cache, b"other");
        cache.commit_started();
        cache.commit_ended(None::<std::iter::Empty<(Table, &[u8], Option<&[u8]>)>>);
        assert!(hit(&cache, b"k").is_none(), "a commit that may have landed");
        cache.remember(stale, Table::Meta, b"other".to_vec(), None);
        assert!(hit(&cache, b"other").is_none());
        landed(&cache, b"k", Some(b"v"));
        let before_fence = generation(&cache, b"other");
        cache.clear();
        assert!(hit(&cache, b"k").is_none());
        cache.remember(before_fence, Table::Meta, b"other".to_vec(), None);
        assert!(hit(&cache, b"other").is_none(), "a read begun before the fence");
    }

    #[test]
    fn the_cache_holds_at_most_its_bytes() {
        let cache = ReadCache::new(64 * 1024);
        for i in 0..10_000u32 {
            let g = generation(&cache, &i.to_be_bytes());
            cache.remember(g, Table::Meta, i.to_be_bytes().to_vec(), Some(vec![0; 100]));
        }
        let state = cache.state.read().unwrap();
        assert!(state.entries.weight() <= 64 * 1024, "{}", state.entries.weight());
        assert!(state.entries.len() > 100, "{}", state.entries.len());
    }
}
