//! How each stored record becomes a value and back: the version byte and
//! the layout it names (`codec/stored.rs` holds the layouts), and the JSON
//! that versions before the version byte wrote.

use cascade_core::model::*;
use cascade_core::ResourceName;
use postcard::ser_flavors::Size;
use serde::de::DeserializeOwned;

use super::{
    stored, VERSION_POSTCARD_V1, VERSION_POSTCARD_V2, VERSION_POSTCARD_V3, VERSION_POSTCARD_V4, VERSION_POSTCARD_V5,
    VERSION_POSTCARD_V6,
};
use crate::store::{StoreError, Table};

/// A core record the store keeps as a value, through its storage type in
/// [`stored`]. Implemented for exactly the records the tables hold;
/// [`StoreState::scan`] and [`StoreState::all`] decode any of them.
pub trait Record: Sized + DeserializeOwned {
    /// This record's value: the version byte, then the body.
    fn encode(&self, table: Table) -> Result<Vec<u8>, StoreError>;
    /// A body of `version` (without its version byte) back into the record.
    fn decode_body(version: u8, body: &[u8]) -> Result<Self, String>;
    /// A body of `version` stored under `key`: a layout may leave out
    /// what its key holds (a back-reference's version 2). By default the
    /// key is not needed.
    fn decode_keyed(version: u8, key: &[u8], body: &[u8]) -> Result<Self, String> {
        let _ = key;
        Self::decode_body(version, body)
    }
    /// Whether a record read under `key` is the one its key names, for a
    /// record whose value holds what its key holds too (a resource's
    /// name, and an outcome's, in their layouts from before the row left
    /// it out, and in legacy JSON): a row whose key and value disagree is
    /// corruption, never a record read under another's key. By default
    /// nothing is checked.
    fn agrees_with_key(&self, key: &[u8]) -> Result<(), String> {
        let _ = key;
        Ok(())
    }
}

/// Why a value did not encode. It cannot happen: postcard into a `Vec`
/// fails only for a sequence of unknown length or a `Serialize` impl that
/// errs, and the storage types are plain derives over strings, integers,
/// `Vec`s, `BTreeMap`s and `BTreeSet`s (whose lengths are known). Still an
/// error, not a panic or an empty value, should a storage type ever change.
pub(super) fn encode_failed(table: Table, e: postcard::Error) -> StoreError {
    StoreError::Corrupt {
        table: table.name(),
        message: format!("a value does not encode: {e}"),
    }
}

/// Appends postcard's output to a `Vec` a slice at a time (its `to_extend`
/// goes through `Extend` with an iterator of bytes).
struct Append(Vec<u8>);

impl postcard::ser_flavors::Flavor for Append {
    type Output = Vec<u8>;
    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.push(byte);
        Ok(())
    }
    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }
    fn finalize(self) -> postcard::Result<Vec<u8>> {
        Ok(self.0)
    }
}

/// `version`, then postcard of `disk`, in one exact allocation (a cheap
/// counting pass first): the memory engine keeps the Vec as it is, and a
/// disk engine copies it out.
pub(super) fn encode_stored<T: serde::Serialize>(table: Table, version: u8, disk: &T) -> Result<Vec<u8>, StoreError> {
    let size = postcard::serialize_with_flavor(disk, Size::default()).map_err(|e| encode_failed(table, e))?;
    let mut out = Vec::with_capacity(1 + size);
    out.push(version);
    postcard::serialize_with_flavor(disk, Append(out)).map_err(|e| encode_failed(table, e))
}

/// A body as the storage type `D`, which must use every byte of it.
pub(super) fn decode_stored<'de, D: serde::Deserialize<'de>>(body: &'de [u8]) -> Result<D, String> {
    #[allow(clippy::disallowed_methods)] // the sanctioned place: stored values decode here
    let (disk, rest) = postcard::take_from_bytes::<D>(body).map_err(|e| e.to_string())?;
    if !rest.is_empty() {
        return Err(format!("{} bytes past the end of the value", rest.len()));
    }
    Ok(disk)
}

/// The [`stored::EventHead`] of a stored event, the rest of the value
/// left unread; None for a value in legacy JSON, which has no head to
/// read apart (the caller decodes it whole). A value that is not an
/// event of a known version is corruption, as for [`decode`].
pub(super) fn event_head(bytes: &[u8]) -> Result<Option<stored::EventHead<'_>>, StoreError> {
    event_prefix::<stored::EventHead<'_>>(bytes)
}

/// Whether a stored event's `cause` is set: the event's first layout
/// (which every later one starts with) decoded borrowed, the rest of the
/// value left unread. Errors as [`event_head`]; a value in legacy JSON
/// is decoded whole.
pub(super) fn event_cause_is_set(bytes: &[u8]) -> Result<bool, StoreError> {
    Ok(match event_prefix::<stored::Event<'_>>(bytes)? {
        Some(event) => event.cause.is_some(),
        None => decode_keyed::<Event>(Table::Outbox, &[], bytes)?.cause.is_some(),
    })
}

/// The first fields of a stored event's body, decoded as `P` (every
/// event layout starts with those of the first), the rest left unread;
/// None for legacy JSON.
fn event_prefix<'a, P: serde::Deserialize<'a>>(bytes: &'a [u8]) -> Result<Option<P>, StoreError> {
    let corrupt = |message| StoreError::Corrupt {
        table: Table::Outbox.name(),
        message,
    };
    match bytes.first() {
        Some(
            &version @ (VERSION_POSTCARD_V1 | VERSION_POSTCARD_V2 | VERSION_POSTCARD_V3 | VERSION_POSTCARD_V4
            | VERSION_POSTCARD_V5),
        ) => {
            #[allow(clippy::disallowed_methods)] // the sanctioned place: stored values decode here
            let (prefix, _) = postcard::take_from_bytes::<P>(&bytes[1..])
                .map_err(|e| corrupt(format!("value of version 0x{version:02x}: {e}")))?;
            Ok(Some(prefix))
        }
        Some(b'{' | b'"') => Ok(None),
        Some(v) => Err(corrupt(format!("unknown value version byte 0x{v:02x}"))),
        None => Err(corrupt("an empty value".into())),
    }
}

/// One outbox row's value from the values of its events (each
/// [`Record::encode`]d, in revision order): a single event's value as it
/// is (the bytes every row held before runs), several as a run
/// ([`stored::EventRun`], version 6).
pub(super) fn encode_outbox_row(mut values: Vec<Vec<u8>>) -> Result<Vec<u8>, StoreError> {
    if values.len() == 1 {
        return Ok(values.pop().unwrap_or_default());
    }
    let run = stored::EventRun {
        events: values.iter().map(|v| stored::EventValue(v)).collect(),
    };
    encode_stored(Table::Outbox, VERSION_POSTCARD_V6, &run)
}

/// The events of one outbox row, oldest first: each one's value (version
/// byte and body, or legacy JSON), read with [`event_head`] or
/// [`decode_keyed`]. Nothing of an event is decoded here.
pub(super) enum RowEvents<'a> {
    /// A row of one event (every row written before runs).
    One(std::option::IntoIter<&'a [u8]>),
    /// A run of several ([`stored::EventRun`]).
    Run(std::vec::IntoIter<stored::EventValue<'a>>),
}

impl<'a> Iterator for RowEvents<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        match self {
            RowEvents::One(one) => one.next(),
            RowEvents::Run(run) => run.next().map(|v| v.0),
        }
    }
}

/// The events an outbox row holds ([`encode_outbox_row`]). A run that
/// does not read, or holds no event, is corruption of the outbox.
pub(super) fn outbox_row_events(bytes: &[u8]) -> Result<RowEvents<'_>, StoreError> {
    match bytes.split_first() {
        Some((&VERSION_POSTCARD_V6, body)) => {
            let run: stored::EventRun<'_> = decode_stored(body).map_err(|e| StoreError::Corrupt {
                table: Table::Outbox.name(),
                message: format!("a run of events (version 0x06): {e}"),
            })?;
            if run.events.is_empty() {
                return Err(StoreError::Corrupt {
                    table: Table::Outbox.name(),
                    message: "a run of no events".into(),
                });
            }
            Ok(RowEvents::Run(run.events.into_iter()))
        }
        _ => Ok(RowEvents::One(Some(bytes).into_iter())),
    }
}

/// A record that has no layout but version 1's.
macro_rules! records {
    ($($core:ty => $stored:ident),* $(,)?) => {$(
        impl Record for $core {
            fn encode(&self, table: Table) -> Result<Vec<u8>, StoreError> {
                encode_stored(table, VERSION_POSTCARD_V1, &stored::$stored::from(self))
            }
            fn decode_body(version: u8, body: &[u8]) -> Result<Self, String> {
                if version != VERSION_POSTCARD_V1 {
                    return Err(format!("no layout of version {version} (this node knows 1)"));
                }
                let disk: stored::$stored<'_> = decode_stored(body)?;
                Self::try_from(disk).map_err(|e| e.to_string())
            }
        }
    )*};
}

records! {
    ResourceName => ResourceName,
    PendingRelease => PendingRelease,
    PendingAttach => PendingAttach,
}

/// Written by itself as version 1 (it does not know its key); its table's
/// rows as version 2, without what their key holds ([`encode_backref`]).
impl Record for BackRef {
    fn encode(&self, table: Table) -> Result<Vec<u8>, StoreError> {
        encode_stored(table, VERSION_POSTCARD_V1, &stored::BackRef::from(self))
    }
    fn decode_body(version: u8, body: &[u8]) -> Result<Self, String> {
        match version {
            VERSION_POSTCARD_V1 => decode_stored::<stored::BackRef<'_>>(body)?
                .try_into()
                .map_err(|e: cascade_core::name::NameError| e.to_string()),
            VERSION_POSTCARD_V2 => Err("version 2 of a back-reference is read with its key".into()),
            _ => Err(format!("no layout of version {version} (this node knows 1 and 2)")),
        }
    }
    fn decode_keyed(version: u8, key: &[u8], body: &[u8]) -> Result<Self, String> {
        match version {
            VERSION_POSTCARD_V2 => decode_stored::<stored::BackRefV2<'_>>(body)?.with_key(key),
            _ => Self::decode_body(version, body),
        }
    }
}

/// A back-reference row's value under its key `key`: version 2, which
/// leaves out the uids and the field the key holds, when `key` is the
/// row's own; else version 1, which holds them.
pub(super) fn encode_backref(key: &BackRefKey, row: &BackRef) -> Result<Vec<u8>, StoreError> {
    let own = key.target == row.target.uid && key.referrer == row.referrer.uid && key.field == row.field;
    if own {
        encode_stored(Table::Backrefs, VERSION_POSTCARD_V2, &stored::BackRefV2::from(row))
    } else {
        row.encode(Table::Backrefs)
    }
}

/// Written by itself in version 2 when it has issue 27's fields, else 1
/// (it does not know its key); its table's rows as version 3, without the
/// id their key is ([`encode_audit_row`]).
impl Record for AuditEntry {
    fn encode(&self, table: Table) -> Result<Vec<u8>, StoreError> {
        let issue_27 = !(self.groups.is_empty()
            && self.via.is_empty()
            && self.node.is_empty()
            && self.through.is_empty()
            && self.rule.is_empty());
        if issue_27 {
            encode_stored(table, VERSION_POSTCARD_V2, &stored::AuditEntryV2::from(self))
        } else {
            encode_stored(table, VERSION_POSTCARD_V1, &stored::AuditEntry::from(self))
        }
    }
    fn decode_body(version: u8, body: &[u8]) -> Result<Self, String> {
        let decoded = match version {
            VERSION_POSTCARD_V1 => decode_stored::<stored::AuditEntry<'_>>(body)?.try_into(),
            VERSION_POSTCARD_V2 => decode_stored::<stored::AuditEntryV2<'_>>(body)?.try_into(),
            VERSION_POSTCARD_V3 => return Err("version 3 of an audit entry is read with its key".into()),
            _ => return Err(format!("no layout of version {version} (this node knows 1 to 3)")),
        };
        decoded.map_err(|e: cascade_core::name::NameError| e.to_string())
    }
    fn decode_keyed(version: u8, key: &[u8], body: &[u8]) -> Result<Self, String> {
        match version {
            VERSION_POSTCARD_V3 => decode_stored::<stored::AuditEntryV3<'_>>(body)?.with_key(key),
            _ => Self::decode_body(version, body),
        }
    }
}

/// An audit row's key and value: the id, and version 3, which leaves it out.
pub(super) fn encode_audit_row(entry: &AuditEntry) -> Result<(Vec<u8>, Vec<u8>), StoreError> {
    let value = encode_stored(Table::Audit, VERSION_POSTCARD_V3, &stored::AuditEntryV3::from(entry))?;
    Ok((entry.id.as_bytes().to_vec(), value))
}

/// A record whose versions 2 and 3 each append a field that is usually
/// empty: written in the earliest layout that holds what it has to say
/// (version 3 only for a principal other than the anonymous one, so a node
/// without authentication writes the bytes it always wrote).
macro_rules! records_with_optional_later_layouts {
    ($($core:ty => $one:ident, $two:ident, $three:ident, $needs_two:expr, $needs_three:expr);* $(;)?) => {$(
        impl Record for $core {
            fn encode(&self, table: Table) -> Result<Vec<u8>, StoreError> {
                let needs_two: fn(&$core) -> bool = $needs_two;
                let needs_three: fn(&$core) -> bool = $needs_three;
                if needs_three(self) {
                    encode_stored(table, VERSION_POSTCARD_V3, &stored::$three::from(self))
                } else if needs_two(self) {
                    encode_stored(table, VERSION_POSTCARD_V2, &stored::$two::from(self))
                } else {
                    encode_stored(table, VERSION_POSTCARD_V1, &stored::$one::from(self))
                }
            }
            fn decode_body(version: u8, body: &[u8]) -> Result<Self, String> {
                let decoded = match version {
                    VERSION_POSTCARD_V1 => decode_stored::<stored::$one<'_>>(body)?.try_into(),
                    VERSION_POSTCARD_V2 => decode_stored::<stored::$two<'_>>(body)?.try_into(),
                    VERSION_POSTCARD_V3 => decode_stored::<stored::$three<'_>>(body)?.try_into(),
                    _ => return Err(format!("no layout of version {version} (this node knows 1 to 3)")),
                };
                decoded.map_err(|e: cascade_core::name::NameError| e.to_string())
            }
        }
    )*};
}

records_with_optional_later_layouts! {
    DeletionRecord => DeletionRecord, DeletionRecordV2, DeletionRecordV3,
        |d| !d.finalizer_failures.is_empty() || d.forced.is_some(),
        |d| stored::names_a_principal(&d.principal);
}

/// A record whose later layouts each wrap the one before: written in the
/// latest layout whose condition holds (they are listed latest first), else
/// in the first; each version read back by its own layout.
macro_rules! layered_records {
    ($($core:ty => [$($version:ident => $layout:ident if $needs:expr),+] else $first:ident);* $(;)?) => {$(
        impl Record for $core {
            fn encode(&self, table: Table) -> Result<Vec<u8>, StoreError> {
                $(
                    let needs: fn(&$core) -> bool = $needs;
                    if needs(self) {
                        return encode_stored(table, $version, &stored::$layout::from(self));
                    }
                )+
                encode_stored(table, VERSION_POSTCARD_V1, &stored::$first::from(self))
            }
            fn decode_body(version: u8, body: &[u8]) -> Result<Self, String> {
                let decoded = match version {
                    VERSION_POSTCARD_V1 => decode_stored::<stored::$first<'_>>(body)?.try_into(),
                    $($version => decode_stored::<stored::$layout<'_>>(body)?.try_into(),)+
                    _ => return Err(format!("no layout of version {version} for this record")),
                };
                decoded.map_err(|e: cascade_core::name::NameError| e.to_string())
            }
        }
    )*};
}

// Soft delete's layouts (`stored/soft.rs`) come first in each list: a
// record without a retention or a window keeps the layout it had before.
// An operation's budget and controls (`stored/budget.rs`, issue 29) are its
// fourth layout, wrapping soft delete's third: written only for an
// operation that has them. An undelete (`stored/undelete.rs`) is its fifth,
// wrapping the fourth.
layered_records! {
    Operation => [
        VERSION_POSTCARD_V5 => OperationV5 if |o| o.undelete.is_some(),
        VERSION_POSTCARD_V4 => OperationV4 if |o| o.controls.is_some(),
        VERSION_POSTCARD_V3 => OperationV3 if |o| o.retain_ms > 0,
        VERSION_POSTCARD_V2 => OperationV2 if |o| stored::names_a_principal(&o.principal)
    ] else Operation;
    Event => [
        VERSION_POSTCARD_V4 => EventV4 if |e| e.retain_ms > 0 || e.snapshot.as_ref().is_some_and(|r| r.soft_deleted.is_some()),
        VERSION_POSTCARD_V3 => EventV3 if |e| stored::names_a_principal(&e.principal),
        VERSION_POSTCARD_V2 => EventV2 if |e| e.snapshot.as_ref().is_some_and(|r| !r.liens.is_empty())
    ] else Event;
    RemoteDeletion => [
        VERSION_POSTCARD_V4 => RemoteDeletionV4 if |r| r.retain_ms > 0,
        VERSION_POSTCARD_V3 => RemoteDeletionV3 if |r| stored::names_a_principal(&r.principal),
        VERSION_POSTCARD_V2 => RemoteDeletionV2 if |r| r.forced
    ] else RemoteDeletion;
}

/// Whether an outcome is an unset's with an undo record (the second
/// layout's, and the fourth's, appendix).
fn has_undo(o: &Outcome) -> bool {
    matches!(o.action, OutcomeAction::Unset { undo: Some(_), .. })
}

/// Written by itself in the layouts that hold its resource's name (it
/// does not know its key): version 1, or 2 with an unset's undo record;
/// its table's rows in version 3 or 4, without the name their key holds
/// ([`encode_outcome_row`]). A row of 1 or 2 (or legacy JSON) reads only
/// under a key of its own name.
impl Record for Outcome {
    fn encode(&self, table: Table) -> Result<Vec<u8>, StoreError> {
        if has_undo(self) {
            encode_stored(table, VERSION_POSTCARD_V2, &stored::OutcomeV2::from(self))
        } else {
            encode_stored(table, VERSION_POSTCARD_V1, &stored::Outcome::from(self))
        }
    }
    fn decode_body(version: u8, body: &[u8]) -> Result<Self, String> {
        let decoded = match version {
            VERSION_POSTCARD_V1 => decode_stored::<stored::Outcome<'_>>(body)?.try_into(),
            VERSION_POSTCARD_V2 => decode_stored::<stored::OutcomeV2<'_>>(body)?.try_into(),
            VERSION_POSTCARD_V3 | VERSION_POSTCARD_V4 => {
                return Err(format!("version {version} of an outcome is read with its key"))
            }
            _ => return Err(format!("no layout of version {version} (this node knows 1 to 4)")),
        };
        decoded.map_err(|e: cascade_core::name::NameError| e.to_string())
    }
    fn decode_keyed(version: u8, key: &[u8], body: &[u8]) -> Result<Self, String> {
        match version {
            VERSION_POSTCARD_V3 => decode_stored::<stored::OutcomeV3<'_>>(body)?.with_key(key),
            VERSION_POSTCARD_V4 => decode_stored::<stored::OutcomeV4<'_>>(body)?.with_key(key),
            _ => Self::decode_body(version, body),
        }
    }
    fn agrees_with_key(&self, key: &[u8]) -> Result<(), String> {
        let name = key.get(16..).unwrap_or_default();
        if self.resource.name.as_str().as_bytes() == name {
            return Ok(());
        }
        Err(format!(
            "the outcome of {} is filed under the key of {}",
            cascade_core::limits::quote(self.resource.name.as_str()),
            cascade_core::limits::quote(&String::from_utf8_lossy(name))
        ))
    }
}

/// An outcome row's value under the key of operation `op` and `name`
/// (`codec::outcome_key`): version 3, or 4 with an undo record, neither
/// of which holds the name. An outcome of another resource is refused.
pub(super) fn encode_outcome_row(name: &ResourceName, outcome: &Outcome) -> Result<Vec<u8>, StoreError> {
    if *name != outcome.resource.name {
        return Err(StoreError::Corrupt {
            table: Table::Outcomes.name(),
            message: format!(
                "the outcome of {} to be written under the key of {}",
                cascade_core::limits::quote(outcome.resource.name.as_str()),
                cascade_core::limits::quote(name.as_str())
            ),
        });
    }
    if has_undo(outcome) {
        encode_stored(Table::Outcomes, VERSION_POSTCARD_V4, &stored::OutcomeV4::from(outcome))
    } else {
        encode_stored(Table::Outcomes, VERSION_POSTCARD_V3, &stored::OutcomeV3::from(outcome))
    }
}

/// Written by itself in the layouts that hold its name (it does not know
/// its key): version 1, 2 with a lien, 3 with a window (soft delete's,
/// wrapping 2); its table's rows in version 4 or 5, without the name
/// their key is ([`encode_resource_row`]). Every version reads; a row of
/// 1 to 3 (or legacy JSON) only under the key of its own name.
impl Record for Resource {
    fn encode(&self, table: Table) -> Result<Vec<u8>, StoreError> {
        if self.soft_deleted.is_some() {
            encode_stored(table, VERSION_POSTCARD_V3, &stored::ResourceV3::from(self))
        } else if !self.liens.is_empty() {
            encode_stored(table, VERSION_POSTCARD_V2, &stored::ResourceV2::from(self))
        } else {
            encode_stored(table, VERSION_POSTCARD_V1, &stored::Resource::from(self))
        }
    }
    fn decode_body(version: u8, body: &[u8]) -> Result<Self, String> {
        let decoded = match version {
            VERSION_POSTCARD_V1 => decode_stored::<stored::Resource<'_>>(body)?.try_into(),
            VERSION_POSTCARD_V2 => decode_stored::<stored::ResourceV2<'_>>(body)?.try_into(),
            VERSION_POSTCARD_V3 => decode_stored::<stored::ResourceV3<'_>>(body)?.try_into(),
            VERSION_POSTCARD_V4 | VERSION_POSTCARD_V5 => {
                return Err(format!("version {version} of a resource is read with its key"))
            }
            _ => return Err(format!("no layout of version {version} (this node knows 1 to 5)")),
        };
        decoded.map_err(|e: cascade_core::name::NameError| e.to_string())
    }
    fn decode_keyed(version: u8, key: &[u8], body: &[u8]) -> Result<Self, String> {
        match version {
            VERSION_POSTCARD_V4 => decode_stored::<stored::ResourceV4<'_>>(body)?.with_key(key),
            VERSION_POSTCARD_V5 => decode_stored::<stored::ResourceV5<'_>>(body)?.with_key(key),
            _ => Self::decode_body(version, body),
        }
    }
    fn agrees_with_key(&self, key: &[u8]) -> Result<(), String> {
        if self.name.as_str().as_bytes() == key {
            return Ok(());
        }
        Err(format!(
            "the row of {} is filed under the key {}",
            cascade_core::limits::quote(self.name.as_str()),
            cascade_core::limits::quote(&String::from_utf8_lossy(key))
        ))
    }
}

/// A resource row's value under the key of `name`: version 4, or 5 with
/// a lien or a window, neither of which holds the name (the key does).
/// A resource to be filed under another name is refused: its row would
/// read back as the resource of its key.
pub(super) fn encode_resource_row(name: &ResourceName, resource: &Resource) -> Result<Vec<u8>, StoreError> {
    if *name != resource.name {
        return Err(StoreError::Corrupt {
            table: Table::Resources.name(),
            message: format!(
                "the resource {} to be written under the key of {}",
                cascade_core::limits::quote(resource.name.as_str()),
                cascade_core::limits::quote(name.as_str())
            ),
        });
    }
    if resource.soft_deleted.is_some() || !resource.liens.is_empty() {
        encode_stored(
            Table::Resources,
            VERSION_POSTCARD_V5,
            &stored::ResourceV5::from(resource),
        )
    } else {
        encode_stored(
            Table::Resources,
            VERSION_POSTCARD_V4,
            &stored::ResourceV4::from(resource),
        )
    }
}

/// Written as version 2 (with the walk); version 1 still read.
impl Record for WorkItem {
    fn encode(&self, table: Table) -> Result<Vec<u8>, StoreError> {
        encode_stored(table, VERSION_POSTCARD_V2, &stored::WorkItem::from(self))
    }
    fn decode_body(version: u8, body: &[u8]) -> Result<Self, String> {
        let decoded = match version {
            VERSION_POSTCARD_V1 => decode_stored::<stored::WorkItemV1<'_>>(body)?.try_into(),
            VERSION_POSTCARD_V2 => decode_stored::<stored::WorkItem<'_>>(body)?.try_into(),
            _ => return Err(format!("no layout of version {version} (this node knows 1 and 2)")),
        };
        decoded.map_err(|e: cascade_core::name::NameError| e.to_string())
    }
}

/// A value read without its key (a layout that needs it fails as
/// corrupt; one that holds what a key would is not checked against one).
#[cfg(test)]
pub(super) fn decode<T: Record>(table: Table, bytes: &[u8]) -> Result<T, StoreError> {
    decode_value(table, bytes, T::decode_body)
}

/// A value stored under `key`, which it must agree with
/// ([`Record::agrees_with_key`]).
pub(super) fn decode_keyed<T: Record>(table: Table, key: &[u8], bytes: &[u8]) -> Result<T, StoreError> {
    let record: T = decode_value(table, bytes, |version, body| T::decode_keyed(version, key, body))?;
    record.agrees_with_key(key).map_err(|message| StoreError::Corrupt {
        table: table.name(),
        message,
    })?;
    Ok(record)
}

/// A value by its first byte: a version's body read by `body`, or legacy
/// JSON.
fn decode_value<T: DeserializeOwned>(
    table: Table,
    bytes: &[u8],
    body: impl FnOnce(u8, &[u8]) -> Result<T, String>,
) -> Result<T, StoreError> {
    let corrupt = |message| StoreError::Corrupt {
        table: table.name(),
        message,
    };
    match bytes.first() {
        Some(
            &version @ (VERSION_POSTCARD_V1 | VERSION_POSTCARD_V2 | VERSION_POSTCARD_V3 | VERSION_POSTCARD_V4
            | VERSION_POSTCARD_V5),
        ) => body(version, &bytes[1..]).map_err(|e| corrupt(format!("value of version 0x{version:02x}: {e}"))),
        Some(b'{' | b'"') => decode_legacy_json(table, bytes),
        Some(v) => Err(corrupt(format!("unknown value version byte 0x{v:02x}"))),
        None => Err(corrupt("an empty value".into())),
    }
}

// The sanctioned place: stored JSON (written by nodes before the binary
// encoding) is decoded here, where a bad value is reported as corruption of
// its table.
#[allow(clippy::disallowed_methods)]
pub(super) fn decode_legacy_json<T: DeserializeOwned>(table: Table, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        table: table.name(),
        message: format!("legacy JSON value: {e}"),
    })
}
