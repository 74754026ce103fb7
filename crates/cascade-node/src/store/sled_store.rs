//! The sled engine: one tree per table, batches applied in one multi-tree
//! transaction.

use std::path::Path;

use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};

use super::{Batch, Entry, Store, StoreError, Table};

pub struct SledStore {
    /// Kept so `flush` covers every tree.
    db: sled::Db,
    /// Indexed by `Table::index`.
    trees: Vec<sled::Tree>,
}

fn engine(e: impl std::fmt::Display) -> StoreError {
    StoreError::Engine(e.to_string())
}

impl SledStore {
    /// Opens (or creates) the database in `dir`, with the default cache.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_with_cache(dir, super::DEFAULT_CACHE_BYTES)
    }

    /// Opens it with a page cache of `cache_bytes` (sled's own default is
    /// 1 GiB, which a node's resident memory then grows to under load).
    pub fn open_with_cache(dir: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .open()
            .map_err(|e| StoreError::Engine(format!("cannot open sled database at {}: {e}", dir.display())))?;
        let trees = Table::ALL
            .iter()
            .map(|t| db.open_tree(t.name()).map_err(engine))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { db, trees })
    }

    fn tree(&self, table: Table) -> &sled::Tree {
        &self.trees[table.index()]
    }
}

impl Store for SledStore {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.tree(table).get(key).map_err(engine)?.map(|v| v.to_vec()))
    }

    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let tree = self.tree(table);
        let iter = match after {
            Some(a) if a >= prefix => {
                tree.range::<&[u8], _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded))
            }
            _ => tree.range::<&[u8], _>(prefix..),
        };
        let mut out = Vec::new();
        for item in iter {
            let (k, v) = item.map_err(engine)?;
            if !k.starts_with(prefix) || out.len() >= limit {
                break;
            }
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut per_tree: Vec<sled::Batch> = (0..Table::ALL.len()).map(|_| sled::Batch::default()).collect();
        let mut touched = [false; Table::ALL.len()];
        for (table, key, value) in batch.ops {
            touched[table.index()] = true;
            match value {
                Some(v) => per_tree[table.index()].insert(key, v),
                None => per_tree[table.index()].remove(key),
            }
        }
        let trees: Vec<&sled::Tree> = self.trees.iter().collect();
        trees
            .as_slice()
            .transaction(|tx_trees| {
                for (i, tree) in tx_trees.iter().enumerate() {
                    if touched[i] {
                        tree.apply_batch(&per_tree[i])?;
                    }
                }
                Ok::<(), ConflictableTransactionError<()>>(())
            })
            .map_err(|e: TransactionError<()>| engine(format!("{e:?}")))
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map(|_| ()).map_err(engine)
    }
}
