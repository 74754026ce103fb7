//! Writes committed and not yet landed in the engine, as a reader sees
//! them over the engine's rows: shared by PostgreSQL's staged set
//! (`postgres/staged.rs`) and the embedded engines' pipelined commits
//! (`pipelined.rs`).
//!
//! A staged write of a key answers its reads (a put its value, a removal
//! absent though the engine still has the row), and a scan merges the
//! engine's rows with the staged writes of its range ([`merge`]).

use std::collections::BTreeMap;
use std::ops::Bound;

use super::Entry;

/// Bytes a staged key costs beyond its key and value (its map entry).
pub(crate) const ENTRY_OVERHEAD: usize = 64;

/// How many keys a staged set holds, and their bytes (keys, values and
/// [`ENTRY_OVERHEAD`] each): what its bounds are checked against.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct StagedSize {
    pub(crate) keys: usize,
    pub(crate) bytes: usize,
}

impl StagedSize {
    /// Stages `value` (None: a removal) for `key` in `rows`, the last
    /// write of a key replacing the one before it.
    pub(crate) fn stage(
        &mut self,
        rows: &mut BTreeMap<Vec<u8>, Option<Vec<u8>>>,
        key: Vec<u8>,
        value: Option<Vec<u8>>,
    ) {
        let (key_len, value_len) = (key.len(), value.as_ref().map_or(0, Vec::len));
        match rows.insert(key, value) {
            // The key was staged: only its value changed.
            Some(old) => self.bytes = self.bytes.saturating_sub(old.map_or(0, |v| v.len())) + value_len,
            None => {
                self.keys += 1;
                self.bytes += ENTRY_OVERHEAD + key_len + value_len;
            }
        }
    }
}

/// The staged writes of `rows` (one table's, key → value or None for a
/// removal) within `bounds`, in key order, up to and including the
/// `puts`-th put: a scan of at most `puts` rows needs no staged write
/// after it. `bounds` must not start past their end (`BTreeMap::range`
/// panics on that; [`super::ScanRange`] never gives such bounds).
pub(crate) fn range_of(
    rows: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    bounds: (Bound<&[u8]>, Bound<&[u8]>),
    puts: usize,
) -> Vec<StagedWrite> {
    range_of_layers(rows, &BTreeMap::new(), bounds, puts)
}

/// [`range_of`] over two layers of staged writes of one table: `top`,
/// the later, wins over `below` for a key both hold; the `puts`-th put
/// counted is of what the two layers come to.
pub(crate) fn range_of_layers(
    top: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    below: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    bounds: (Bound<&[u8]>, Bound<&[u8]>),
    puts: usize,
) -> Vec<StagedWrite> {
    let mut found = Vec::new();
    let mut seen_puts = 0;
    let mut top = top.range::<[u8], _>(bounds).peekable();
    let mut below = below.range::<[u8], _>(bounds).peekable();
    loop {
        let next = match (top.peek(), below.peek()) {
            (None, _) => below.next(),
            (Some(_), None) => top.next(),
            (Some((t, _)), Some((b, _))) => match t.cmp(b) {
                std::cmp::Ordering::Less => top.next(),
                std::cmp::Ordering::Greater => below.next(),
                std::cmp::Ordering::Equal => {
                    below.next();
                    top.next()
                }
            },
        };
        let Some((key, value)) = next else {
            break;
        };
        found.push((key.clone(), value.clone()));
        if value.is_some() {
            seen_puts += 1;
            if seen_puts >= puts {
                break;
            }
        }
    }
    found
}

/// A staged write: a key and its value (None: removed).
pub(crate) type StagedWrite = (Vec<u8>, Option<Vec<u8>>);

/// The first `limit` rows of a scan: `rows`, the engine's (or server's) answer to a
/// scan of at most `asked` rows, merged with `staged`, the staged writes
/// of the same range (see [`Staged::range`]). A staged write of a key
/// wins over the server's row; a staged removal hides it.
///
/// Why `asked` must be `limit` plus the removals in `staged`: each can
/// hide one of the server's rows, and a staged write past the server's
/// last row is only known to come next when the server had no more.
pub(crate) fn merge(rows: Vec<Entry>, staged: Vec<StagedWrite>, asked: usize, limit: usize) -> Vec<Entry> {
    let server_had_more = rows.len() >= asked;
    let last_row = rows.last().map(|(key, _)| key.clone());
    let mut merged = Vec::with_capacity(limit.min(rows.len() + staged.len()));
    let mut rows = rows.into_iter().peekable();
    let mut staged = staged.into_iter().peekable();
    while merged.len() < limit {
        let staged_first = match (rows.peek(), staged.peek()) {
            (None, None) => break,
            (Some(_), None) => false,
            (None, Some((key, _))) => {
                if server_had_more && last_row.as_ref().is_some_and(|last| key > last) {
                    // Rows the server was not asked for may come first.
                    break;
                }
                true
            }
            (Some((row, _)), Some((key, _))) => match row.cmp(key) {
                std::cmp::Ordering::Less => false,
                std::cmp::Ordering::Greater => true,
                std::cmp::Ordering::Equal => {
                    // Replaced or removed by the staged write.
                    rows.next();
                    true
                }
            },
        };
        if staged_first {
            if let Some((key, Some(value))) = staged.next() {
                merged.push((key, value));
            }
        } else if let Some(row) = rows.next() {
            merged.push(row);
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(keys: &[(&str, &str)]) -> Vec<Entry> {
        keys.iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    fn staged(writes: &[(&str, Option<&str>)]) -> Vec<StagedWrite> {
        writes
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec())))
            .collect()
    }

    #[test]
    fn a_merge_replaces_and_hides_the_servers_rows_and_keeps_key_order() {
        let rows = entries(&[("a", "s"), ("b", "s"), ("d", "s")]);
        let writes = staged(&[("a", None), ("b", Some("x")), ("c", Some("y")), ("e", Some("z"))]);
        // The server was asked for 10 (more than it had): everything after
        // its last row is known.
        assert_eq!(
            merge(rows.clone(), writes.clone(), 10, 10),
            entries(&[("b", "x"), ("c", "y"), ("d", "s"), ("e", "z")])
        );
        assert_eq!(merge(rows, writes, 10, 2), entries(&[("b", "x"), ("c", "y")]));
    }

    #[test]
    fn a_merge_never_passes_rows_the_server_was_not_asked_for() {
        // Asked for 2, got 2: a staged put after "b" may have server rows
        // before it, so it is not given.
        let rows = entries(&[("a", "s"), ("b", "s")]);
        assert_eq!(
            merge(rows, staged(&[("a", None), ("z", Some("y"))]), 2, 5),
            entries(&[("b", "s")])
        );
    }

    fn layer(writes: &[(&str, Option<&str>)]) -> BTreeMap<Vec<u8>, Option<Vec<u8>>> {
        staged(writes).into_iter().collect()
    }

    /// Two layers read as the one they come to: the later wins a key
    /// both hold (a removal over a put, a put over a removal), and the
    /// puts counted to the bound are the merged layer's.
    #[test]
    fn a_range_of_two_layers_is_the_range_of_what_they_come_to() {
        let below = layer(&[("a", Some("1")), ("b", Some("1")), ("c", None), ("e", Some("1"))]);
        let top = layer(&[("b", None), ("c", Some("2")), ("d", Some("2"))]);
        let all = (Bound::Unbounded, Bound::Unbounded);
        // What the two come to, in key order: b removed, c and d put
        // on top, a and e from below.
        let merged = staged(&[
            ("a", Some("1")),
            ("b", None),
            ("c", Some("2")),
            ("d", Some("2")),
            ("e", Some("1")),
        ]);
        let up_to_put = |n: usize| {
            let end = merged
                .iter()
                .filter(|(_, v)| v.is_some())
                .nth(n - 1)
                .map(|(k, _)| k.clone());
            merged
                .iter()
                .filter(|(k, _)| end.as_ref().is_none_or(|end| k <= end))
                .cloned()
                .collect::<Vec<_>>()
        };
        for puts in 1..=5 {
            assert_eq!(
                range_of_layers(&top, &below, all, puts),
                up_to_put(puts),
                "up to the put number {puts}"
            );
        }
        assert_eq!(range_of(&below, all, 2), staged(&[("a", Some("1")), ("b", Some("1"))]));
        assert_eq!(
            range_of_layers(
                &top,
                &below,
                (Bound::Included(b"b".as_slice()), Bound::Excluded(b"e".as_slice())),
                9
            ),
            staged(&[("b", None), ("c", Some("2")), ("d", Some("2"))])
        );
        assert_eq!(
            range_of_layers(&top, &BTreeMap::new(), all, 1),
            staged(&[("b", None), ("c", Some("2"))])
        );
    }
}
