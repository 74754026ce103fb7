//! The journal entry of a batch being applied (`sled_store.rs`): its
//! writes, in order, each with its table's name, so that an entry written
//! by one build is read right by the next even if the tables were
//! reordered.
//!
//! ```text
//! entry := version:u8=1  count:u32  write*
//! write := name_len:u8  name  kind:u8 (0 remove, 1 put)  key_len:u32  key  [value_len:u32  value]
//! ```
//! Integers are big-endian.

use super::super::{StoreError, Table};
use super::JOURNAL_TREE;

const VERSION: u8 = 1;
const REMOVE: u8 = 0;
const PUT: u8 = 1;

pub(super) type Write = (Table, Vec<u8>, Option<Vec<u8>>);

/// The entry of `writes`.
pub(super) fn encode(writes: &[Write]) -> Vec<u8> {
    let size: usize = writes
        .iter()
        .map(|(table, key, value)| {
            1 + table.name().len() + 1 + 4 + key.len() + value.as_ref().map_or(0, |v| 4 + v.len())
        })
        .sum();
    let mut entry = Vec::with_capacity(1 + 4 + size);
    entry.push(VERSION);
    entry.extend_from_slice(&length(writes.len()).to_be_bytes());
    for (table, key, value) in writes {
        let name = table.name().as_bytes();
        // Table names are short words (`Table::name`).
        entry.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
        entry.extend_from_slice(name);
        entry.push(if value.is_some() { PUT } else { REMOVE });
        entry.extend_from_slice(&length(key.len()).to_be_bytes());
        entry.extend_from_slice(key);
        if let Some(value) = value {
            entry.extend_from_slice(&length(value.len()).to_be_bytes());
            entry.extend_from_slice(value);
        }
    }
    entry
}

/// A length as the entry stores it. A batch's keys and values are bounded
/// far below 4 GiB (the pipelined store stages 32 MiB at most, and every
/// stored field has its limit), so this never saturates in practice; if it
/// did, the entry would not decode and the open would say so.
fn length(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// The writes of an entry [`encode`] wrote.
pub(super) fn decode(entry: &[u8]) -> Result<Vec<Write>, StoreError> {
    let mut reader = Reader(entry);
    let version = reader.byte()?;
    if version != VERSION {
        return Err(corrupt(format!(
            "the entry is of version {version}, this build reads version {VERSION}"
        )));
    }
    let count = reader.length()?;
    // Each write takes 7 bytes at least: a count beyond that is corrupt,
    // and never sizes an allocation.
    if count > entry.len() / 7 {
        return Err(corrupt(format!("it claims {count} writes in {} bytes", entry.len())));
    }
    let mut writes = Vec::with_capacity(count);
    for _ in 0..count {
        let name_len = usize::from(reader.byte()?);
        let name = reader.bytes(name_len)?;
        let table = Table::ALL
            .iter()
            .copied()
            .find(|t| t.name().as_bytes() == name)
            .ok_or_else(|| {
                let shown = String::from_utf8_lossy(&name[..name.len().min(32)]).into_owned();
                corrupt(format!("it names an unknown table {shown:?}"))
            })?;
        let kind = reader.byte()?;
        let key_len = reader.length()?;
        let key = reader.bytes(key_len)?.to_vec();
        let value = match kind {
            PUT => {
                let value_len = reader.length()?;
                Some(reader.bytes(value_len)?.to_vec())
            }
            REMOVE => None,
            other => return Err(corrupt(format!("a write of unknown kind {other}"))),
        };
        writes.push((table, key, value));
    }
    if !reader.0.is_empty() {
        return Err(corrupt(format!("{} bytes follow its last write", reader.0.len())));
    }
    Ok(writes)
}

fn corrupt(message: String) -> StoreError {
    StoreError::Corrupt {
        table: JOURNAL_TREE,
        message: format!("the interrupted batch cannot be read: {message}"),
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn bytes(&mut self, len: usize) -> Result<&'a [u8], StoreError> {
        if self.0.len() < len {
            return Err(corrupt(format!(
                "it ends {} bytes short of a field",
                len - self.0.len()
            )));
        }
        let (taken, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(taken)
    }

    fn byte(&mut self) -> Result<u8, StoreError> {
        Ok(self.bytes(1)?[0])
    }

    fn length(&mut self) -> Result<usize, StoreError> {
        let bytes: [u8; 4] = self
            .bytes(4)?
            .try_into()
            .map_err(|_| corrupt("a short length".into()))?;
        usize::try_from(u32::from_be_bytes(bytes)).map_err(|_| corrupt("a length beyond this machine's".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writes() -> Vec<Write> {
        vec![
            (Table::Resources, b"r/1".to_vec(), Some(b"one".to_vec())),
            (Table::Backrefs, b"b/1".to_vec(), None),
            (Table::Audit, Vec::new(), Some(Vec::new())),
        ]
    }

    #[test]
    fn an_entry_reads_back_as_the_writes_in_their_order() {
        assert_eq!(decode(&encode(&writes())).expect("decodes"), writes());
        assert_eq!(decode(&encode(&[])).expect("decodes"), Vec::<Write>::new());
    }

    /// Every cut of a valid entry, and every other version, is refused
    /// with an error naming the journal, never a panic or a shorter batch.
    #[test]
    fn a_cut_or_foreign_entry_is_refused_naming_the_journal() {
        let entry = encode(&writes());
        for len in 0..entry.len() {
            let e = decode(&entry[..len]).expect_err("a cut entry");
            assert!(e.to_string().contains(JOURNAL_TREE), "{e}");
        }
        let mut foreign = entry.clone();
        foreign[0] = 9;
        assert!(decode(&foreign)
            .expect_err("another version")
            .to_string()
            .contains("version 9"));
        let mut longer = entry;
        longer.push(0);
        assert!(decode(&longer).is_err());
    }
}
