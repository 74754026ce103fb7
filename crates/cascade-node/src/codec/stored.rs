//! The disk format of the store's values: one storage type per core record
//! the node keeps, and the conversions between the two.
//!
//! These types, not the core's, are what a value's body is (postcard 1 of
//! these types after the version byte, see [`super::VERSION_POSTCARD_V1`]).
//! They are kept apart from `cascade_core::model` because the two change for
//! different reasons: the core's types are shaped for the protocol and its
//! JSON (internally tagged enums, `flatten`, defaults), which a
//! non-self-describing format like postcard cannot write or read, and a
//! change of the core must not silently change bytes already on disk. A
//! change of the core that the disk must follow is made here, on purpose,
//! and the conversions below do not compile until it is.
//!
//! The rules that keep old stores readable:
//!
//! - postcard writes fields in declaration order with no names, and enum
//!   variants by index: never reorder, retype or remove a field or a
//!   variant (renaming one is free: names are not written). Fields and
//!   variants are only ever appended. A new variant leaves old values
//!   readable as they are; a new field is a layout change: it gets a new
//!   version byte, and the decoder of version 1 stays (reading a version-1
//!   body and filling the new field in), never a reinterpretation of
//!   version 1's bytes. `codec/tests.rs` pins version 1's bytes.
//! - Plain serde derives only: externally tagged enums, no `flatten`, no
//!   `skip_serializing_if`, no `tag`, no `default` (postcard has no field
//!   names to be absent). `#[serde(borrow)]` only lets a decoded string
//!   borrow from the stored bytes; it does not change the bytes.
//! - Strings are `Cow<'a, str>` (and lists of plain strings `Cow<'a, [String]>`)
//!   so that encoding borrows from the core value instead of cloning it; a
//!   `Cow` is written exactly as the owned value. Uids and operation ids are
//!   their 16 bytes ([`Id`]), timestamps their milliseconds, names their
//!   string form (read back with `ResourceName::from_stored`: its shape
//!   checked, not each character, since every name was validated before
//!   it was written).
//!
//! `From<&core>` builds the storage form for writing (no string is copied);
//! `TryFrom<storage>` rebuilds the core value (it fails only on a name that
//! no longer parses).
//!
//! Size: one file on purpose: it is the whole disk format, each storage
//! type next to its two conversions, to be read and reviewed as one.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use cascade_core::model;
use cascade_core::name::NameError;
use cascade_core::{OnDelete as CoreOnDelete, OperationId, ResourceName as CoreName, Timestamp, Uid};
use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

mod budget;
mod keyed;
mod soft;
mod undelete;
pub use budget::{OperationControls, OperationV4};
pub use keyed::{OutcomeV3, OutcomeV4, ResourceV4, ResourceV5};
pub use soft::{EventV4, OperationV3, OutcomeV2, RemoteDeletionV4, ResourceV3, SoftDeletion, UnsetUndo};
pub use undelete::{OperationV5, Undeletion};

/// A uid or an operation id: the UUID's 16 bytes, no length prefix.
pub type Id = [u8; 16];

fn uid(id: Id) -> Uid {
    Uid(Uuid::from_bytes(id))
}

fn op(id: Id) -> OperationId {
    OperationId(Uuid::from_bytes(id))
}

fn name(s: &str) -> Result<CoreName, NameError> {
    CoreName::from_stored(s)
}

fn strings(v: Cow<'_, [String]>) -> Vec<String> {
    v.into_owned()
}

/// `Cow<str>` → `String` (moves an owned one, copies a borrowed one once).
fn string(s: Cow<'_, str>) -> String {
    s.into_owned()
}

/// A resource name in the uid index (`uid → name`).
#[derive(Debug, Serialize, Deserialize)]
pub struct ResourceName<'a>(#[serde(borrow)] pub Cow<'a, str>);

impl<'a> From<&'a CoreName> for ResourceName<'a> {
    fn from(n: &'a CoreName) -> Self {
        ResourceName(Cow::Borrowed(n.as_str()))
    }
}

impl TryFrom<ResourceName<'_>> for CoreName {
    type Error = NameError;
    fn try_from(n: ResourceName<'_>) -> Result<Self, NameError> {
        name(&n.0)
    }
}

/// [`model::RefTarget`].
#[derive(Debug, Serialize, Deserialize)]
pub struct RefTarget<'a> {
    #[serde(borrow)]
    pub name: Cow<'a, str>,
    pub uid: Id,
}

impl<'a> From<&'a model::RefTarget> for RefTarget<'a> {
    fn from(t: &'a model::RefTarget) -> Self {
        RefTarget {
            name: Cow::Borrowed(t.name.as_str()),
            uid: *t.uid.as_bytes(),
        }
    }
}

impl TryFrom<RefTarget<'_>> for model::RefTarget {
    type Error = NameError;
    fn try_from(t: RefTarget<'_>) -> Result<Self, NameError> {
        Ok(model::RefTarget {
            name: name(&t.name)?,
            uid: uid(t.uid),
        })
    }
}

fn targets(v: Vec<RefTarget<'_>>) -> Result<Vec<model::RefTarget>, NameError> {
    v.into_iter().map(model::RefTarget::try_from).collect()
}

/// A resource's references: the core's field → targets map, written as a
/// list of (field, targets) pairs in field order (postcard writes a map
/// and a list of pairs alike: a length, then the pairs). Written from the
/// resource's own map and read straight into a new one, with no list of
/// pairs in between (the decode of a resource was 15.5 % of a local
/// cascade's samples, much of it in the allocations of such copies).
#[derive(Debug)]
pub enum Refs<'a> {
    /// A resource's map, borrowed to be written.
    Of(&'a BTreeMap<String, Vec<model::RefTarget>>),
    /// The map as read back, or the first target whose name is not one
    /// (the rest of the value is still read past, so that the error is
    /// the name's, not a misaligned read's).
    Read(Result<BTreeMap<String, Vec<model::RefTarget>>, NameError>),
}

impl Serialize for Refs<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let map = match self {
            Refs::Of(map) => *map,
            Refs::Read(Ok(map)) => map,
            Refs::Read(Err(e)) => return Err(serde::ser::Error::custom(e)),
        };
        serializer.collect_seq(map.iter().map(|(field, targets)| (field.as_str(), Targets(targets))))
    }
}

/// One field's targets, written as a list of [`RefTarget`] without
/// building one.
struct Targets<'a>(&'a [model::RefTarget]);

impl Serialize for Targets<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(RefTarget::from))
    }
}

/// At most this many entries are reserved ahead for a list whose length a
/// value states (a corrupt length must not allocate gigabytes; a longer
/// list still reads, growing as it goes).
const RESERVE_AT_MOST: usize = 64;

impl<'de> Deserialize<'de> for Refs<'_> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Pairs;
        impl<'de> Visitor<'de> for Pairs {
            type Value = Result<BTreeMap<String, Vec<model::RefTarget>>, NameError>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of (field, targets) pairs")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut map = Ok(BTreeMap::new());
                while let Some((field, ReadTargets(targets))) = seq.next_element::<(&'de str, ReadTargets)>()? {
                    match (&mut map, targets) {
                        (Ok(map), Ok(targets)) => {
                            map.insert(field.to_owned(), targets);
                        }
                        (Ok(_), Err(e)) => map = Err(e),
                        (Err(_), _) => {}
                    }
                }
                Ok(map)
            }
        }
        deserializer.deserialize_seq(Pairs).map(Refs::Read)
    }
}

/// One field's targets as read: core targets built as they are decoded.
struct ReadTargets(Result<Vec<model::RefTarget>, NameError>);

impl<'de> Deserialize<'de> for ReadTargets {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct List;
        impl<'de> Visitor<'de> for List {
            type Value = ReadTargets;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of reference targets")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let reserve = seq.size_hint().unwrap_or(0).min(RESERVE_AT_MOST);
                let mut targets = Ok(Vec::with_capacity(reserve));
                while let Some(target) = seq.next_element::<RefTarget<'de>>()? {
                    if let Ok(list) = &mut targets {
                        match model::RefTarget::try_from(target) {
                            Ok(t) => list.push(t),
                            Err(e) => targets = Err(e),
                        }
                    }
                }
                Ok(ReadTargets(targets))
            }
        }
        deserializer.deserialize_seq(List)
    }
}

/// [`model::ResourceState`].
#[derive(Debug, Serialize, Deserialize)]
pub enum ResourceState {
    Creating,
    Active,
    Deleting,
    /// Appended for soft delete (written with [`ResourceV3`], whose window
    /// a DELETED resource always has).
    Deleted,
}

impl From<model::ResourceState> for ResourceState {
    fn from(s: model::ResourceState) -> Self {
        match s {
            model::ResourceState::Creating => ResourceState::Creating,
            model::ResourceState::Active => ResourceState::Active,
            model::ResourceState::Deleting => ResourceState::Deleting,
            model::ResourceState::Deleted => ResourceState::Deleted,
        }
    }
}

impl From<ResourceState> for model::ResourceState {
    fn from(s: ResourceState) -> Self {
        match s {
            ResourceState::Creating => model::ResourceState::Creating,
            ResourceState::Active => model::ResourceState::Active,
            ResourceState::Deleting => model::ResourceState::Deleting,
            ResourceState::Deleted => model::ResourceState::Deleted,
        }
    }
}

/// [`model::Resource`] without its liens (version 1; see [`ResourceV2`]).
/// A row of the resources table is written without the name since issue
/// 28's P4 ([`ResourceV4`]); this layout is a resource encoded on its own
/// and a store's rows from before. `refs` is the core's field → targets map as a list of pairs in field
/// order (postcard writes a map and a list of pairs alike: a length, then
/// the pairs).
#[derive(Debug, Serialize, Deserialize)]
pub struct Resource<'a> {
    #[serde(borrow)]
    pub name: Cow<'a, str>,
    pub uid: Id,
    pub state: ResourceState,
    pub attributes: Cow<'a, BTreeMap<String, String>>,
    pub refs: Refs<'a>,
    pub revision: u64,
    pub create_time: u64,
    pub update_time: u64,
    pub finalizers: Cow<'a, [String]>,
}

impl<'a> From<&'a model::Resource> for Resource<'a> {
    fn from(r: &'a model::Resource) -> Self {
        Resource {
            name: Cow::Borrowed(r.name.as_str()),
            uid: *r.uid.as_bytes(),
            state: r.state.into(),
            attributes: Cow::Borrowed(&r.attributes),
            refs: Refs::Of(&r.refs),
            revision: r.revision,
            create_time: r.create_time.0,
            update_time: r.update_time.0,
            finalizers: Cow::Borrowed(&r.finalizers),
        }
    }
}

impl TryFrom<Resource<'_>> for model::Resource {
    type Error = NameError;
    fn try_from(r: Resource<'_>) -> Result<Self, NameError> {
        Ok(model::Resource {
            name: name(&r.name)?,
            uid: uid(r.uid),
            state: r.state.into(),
            attributes: r.attributes.into_owned(),
            refs: match r.refs {
                Refs::Read(read) => read?,
                Refs::Of(map) => map.clone(),
            },
            revision: r.revision,
            create_time: Timestamp(r.create_time),
            update_time: Timestamp(r.update_time),
            finalizers: strings(r.finalizers),
            liens: Vec::new(),
            soft_deleted: None,
        })
    }
}

/// [`model::Lien`].
#[derive(Debug, Serialize, Deserialize)]
pub struct Lien<'a> {
    #[serde(borrow)]
    pub id: Cow<'a, str>,
    #[serde(borrow)]
    pub reason: Cow<'a, str>,
    #[serde(borrow)]
    pub origin: Cow<'a, str>,
    pub create_time: u64,
}

fn liens_to(v: &[model::Lien]) -> Vec<Lien<'_>> {
    v.iter()
        .map(|l| Lien {
            id: Cow::Borrowed(l.id.as_str()),
            reason: Cow::Borrowed(l.reason.as_str()),
            origin: Cow::Borrowed(l.origin.as_str()),
            create_time: l.create_time.0,
        })
        .collect()
}

fn liens_from(v: Vec<Lien<'_>>) -> Vec<model::Lien> {
    v.into_iter()
        .map(|l| model::Lien {
            id: string(l.id),
            reason: string(l.reason),
            origin: string(l.origin),
            create_time: Timestamp(l.create_time),
        })
        .collect()
}

/// [`model::Resource`], version 2 (see [`super::VERSION_POSTCARD_V2`]):
/// version 1's fields, then the liens. Written only for a resource that
/// holds a lien, so every other resource keeps version 1's bytes (and its
/// size); version 1 reads back with no lien.
#[derive(Debug, Serialize, Deserialize)]
pub struct ResourceV2<'a> {
    #[serde(borrow)]
    pub v1: Resource<'a>,
    #[serde(borrow)]
    pub liens: Vec<Lien<'a>>,
}

impl<'a> From<&'a model::Resource> for ResourceV2<'a> {
    fn from(r: &'a model::Resource) -> Self {
        ResourceV2 {
            v1: Resource::from(r),
            liens: liens_to(&r.liens),
        }
    }
}

impl TryFrom<ResourceV2<'_>> for model::Resource {
    type Error = NameError;
    fn try_from(r: ResourceV2<'_>) -> Result<Self, NameError> {
        let mut resource = model::Resource::try_from(r.v1)?;
        resource.liens = liens_from(r.liens);
        Ok(resource)
    }
}

/// [`model::BackRefKey`].
#[derive(Debug, Serialize, Deserialize)]
pub struct BackRefKey<'a> {
    pub target: Id,
    pub referrer: Id,
    #[serde(borrow)]
    pub field: Cow<'a, str>,
}

impl<'a> From<&'a model::BackRefKey> for BackRefKey<'a> {
    fn from(k: &'a model::BackRefKey) -> Self {
        BackRefKey {
            target: *k.target.as_bytes(),
            referrer: *k.referrer.as_bytes(),
            field: Cow::Borrowed(k.field.as_str()),
        }
    }
}

impl From<BackRefKey<'_>> for model::BackRefKey {
    fn from(k: BackRefKey<'_>) -> Self {
        model::BackRefKey {
            target: uid(k.target),
            referrer: uid(k.referrer),
            field: string(k.field),
        }
    }
}

/// [`cascade_core::OnDelete`].
#[derive(Debug, Serialize, Deserialize)]
pub enum OnDelete {
    Cascade,
    Unset,
    Block,
    AllowDangling,
}

impl From<CoreOnDelete> for OnDelete {
    fn from(o: CoreOnDelete) -> Self {
        match o {
            CoreOnDelete::Cascade => OnDelete::Cascade,
            CoreOnDelete::Unset => OnDelete::Unset,
            CoreOnDelete::Block => OnDelete::Block,
            CoreOnDelete::AllowDangling => OnDelete::AllowDangling,
        }
    }
}

impl From<OnDelete> for CoreOnDelete {
    fn from(o: OnDelete) -> Self {
        match o {
            OnDelete::Cascade => CoreOnDelete::Cascade,
            OnDelete::Unset => CoreOnDelete::Unset,
            OnDelete::Block => CoreOnDelete::Block,
            OnDelete::AllowDangling => CoreOnDelete::AllowDangling,
        }
    }
}

/// [`model::BackRef`].
#[derive(Debug, Serialize, Deserialize)]
pub struct BackRef<'a> {
    #[serde(borrow)]
    pub target: RefTarget<'a>,
    #[serde(borrow)]
    pub referrer: RefTarget<'a>,
    #[serde(borrow)]
    pub field: Cow<'a, str>,
    pub on_delete: OnDelete,
    pub generation: u64,
    pub attached_at: u64,
}

impl<'a> From<&'a model::BackRef> for BackRef<'a> {
    fn from(b: &'a model::BackRef) -> Self {
        BackRef {
            target: (&b.target).into(),
            referrer: (&b.referrer).into(),
            field: Cow::Borrowed(b.field.as_str()),
            on_delete: b.on_delete.into(),
            generation: b.generation,
            attached_at: b.attached_at.0,
        }
    }
}

impl TryFrom<BackRef<'_>> for model::BackRef {
    type Error = NameError;
    fn try_from(b: BackRef<'_>) -> Result<Self, NameError> {
        Ok(model::BackRef {
            target: b.target.try_into()?,
            referrer: b.referrer.try_into()?,
            field: string(b.field),
            on_delete: b.on_delete.into(),
            generation: b.generation,
            attached_at: Timestamp(b.attached_at),
        })
    }
}

/// [`model::BackRef`], version 2 (see [`super::VERSION_POSTCARD_V2`]):
/// version 1 without what its key already holds (the target's uid, the
/// referrer's uid and the field: `codec::backref_key`), which is read back
/// from the key ([`BackRefV2::with_key`]). Written for every row whose key
/// is its own (every row this node writes), 40 bytes fewer for a field
/// of 7 bytes: a back-reference is the most numerous row of a store (one
/// per reference). Version 1 still reads as it is.
#[derive(Debug, Serialize, Deserialize)]
pub struct BackRefV2<'a> {
    #[serde(borrow)]
    pub target: Cow<'a, str>,
    #[serde(borrow)]
    pub referrer: Cow<'a, str>,
    pub on_delete: OnDelete,
    pub generation: u64,
    pub attached_at: u64,
}

impl<'a> From<&'a model::BackRef> for BackRefV2<'a> {
    fn from(b: &'a model::BackRef) -> Self {
        BackRefV2 {
            target: Cow::Borrowed(b.target.name.as_str()),
            referrer: Cow::Borrowed(b.referrer.name.as_str()),
            on_delete: b.on_delete.into(),
            generation: b.generation,
            attached_at: b.attached_at.0,
        }
    }
}

impl BackRefV2<'_> {
    /// The back-reference, with the uids and the field from `key` (its
    /// row's key: the target's 16 bytes, the referrer's, the field).
    pub fn with_key(self, key: &[u8]) -> Result<model::BackRef, String> {
        let short = || format!("a key of {} bytes holds no back-reference (at least 32)", key.len());
        let (target, rest) = key.split_first_chunk::<16>().ok_or_else(short)?;
        let (referrer, field) = rest.split_first_chunk::<16>().ok_or_else(short)?;
        let field = std::str::from_utf8(field).map_err(|e| format!("the key's field is not UTF-8: {e}"))?;
        Ok(model::BackRef {
            target: model::RefTarget {
                name: name(&self.target).map_err(|e| e.to_string())?,
                uid: uid(*target),
            },
            referrer: model::RefTarget {
                name: name(&self.referrer).map_err(|e| e.to_string())?,
                uid: uid(*referrer),
            },
            field: field.to_owned(),
            on_delete: self.on_delete.into(),
            generation: self.generation,
            attached_at: Timestamp(self.attached_at),
        })
    }
}

/// [`model::DeletionReason`].
#[derive(Debug, Serialize, Deserialize)]
pub enum DeletionReason<'a> {
    Requested,
    Cascade {
        #[serde(borrow)]
        from: Cow<'a, str>,
        #[serde(borrow)]
        field: Cow<'a, str>,
    },
}

impl<'a> From<&'a model::DeletionReason> for DeletionReason<'a> {
    fn from(r: &'a model::DeletionReason) -> Self {
        match r {
            model::DeletionReason::Requested => DeletionReason::Requested,
            model::DeletionReason::Cascade { from, field } => DeletionReason::Cascade {
                from: Cow::Borrowed(from.as_str()),
                field: Cow::Borrowed(field.as_str()),
            },
        }
    }
}

impl TryFrom<DeletionReason<'_>> for model::DeletionReason {
    type Error = NameError;
    fn try_from(r: DeletionReason<'_>) -> Result<Self, NameError> {
        Ok(match r {
            DeletionReason::Requested => model::DeletionReason::Requested,
            DeletionReason::Cascade { from, field } => model::DeletionReason::Cascade {
                from: name(&from)?,
                field: string(field),
            },
        })
    }
}

/// [`model::Blocker`].
#[derive(Debug, Serialize, Deserialize)]
pub struct Blocker<'a> {
    #[serde(borrow)]
    pub referrer: Cow<'a, str>,
    #[serde(borrow)]
    pub field: Cow<'a, str>,
    pub referrer_deleting: bool,
}

impl<'a> From<&'a model::Blocker> for Blocker<'a> {
    fn from(b: &'a model::Blocker) -> Self {
        Blocker {
            referrer: Cow::Borrowed(b.referrer.as_str()),
            field: Cow::Borrowed(b.field.as_str()),
            referrer_deleting: b.referrer_deleting,
        }
    }
}

impl TryFrom<Blocker<'_>> for model::Blocker {
    type Error = NameError;
    fn try_from(b: Blocker<'_>) -> Result<Self, NameError> {
        Ok(model::Blocker {
            referrer: name(&b.referrer)?,
            field: string(b.field),
            referrer_deleting: b.referrer_deleting,
        })
    }
}

fn blockers_to(v: &[model::Blocker]) -> Vec<Blocker<'_>> {
    v.iter().map(Blocker::from).collect()
}

fn blockers_from(v: Vec<Blocker<'_>>) -> Result<Vec<model::Blocker>, NameError> {
    v.into_iter().map(model::Blocker::try_from).collect()
}

/// [`model::DeletionStatus`].
#[derive(Debug, Serialize, Deserialize)]
pub enum DeletionStatus<'a> {
    Pending,
    Blocked {
        #[serde(borrow)]
        blockers: Vec<Blocker<'a>>,
        #[serde(borrow)]
        reason: Cow<'a, str>,
    },
    Failed {
        #[serde(borrow)]
        error: Cow<'a, str>,
    },
    Waiting {
        regions: Cow<'a, [String]>,
        #[serde(borrow)]
        reason: Cow<'a, str>,
    },
}

// The variants are named through aliases: `tests/wire_edge.rs` reads any
// `Status::` outside `api/` as a gRPC status.
impl<'a> From<&'a model::DeletionStatus> for DeletionStatus<'a> {
    fn from(s: &'a model::DeletionStatus) -> Self {
        use model::DeletionStatus as Core;
        match s {
            Core::Pending => Self::Pending,
            Core::Blocked { blockers, reason } => Self::Blocked {
                blockers: blockers_to(blockers),
                reason: Cow::Borrowed(reason.as_str()),
            },
            Core::Failed { error } => Self::Failed {
                error: Cow::Borrowed(error.as_str()),
            },
            Core::Waiting { regions, reason } => Self::Waiting {
                regions: Cow::Borrowed(regions),
                reason: Cow::Borrowed(reason.as_str()),
            },
        }
    }
}

impl TryFrom<DeletionStatus<'_>> for model::DeletionStatus {
    type Error = NameError;
    fn try_from(s: DeletionStatus<'_>) -> Result<Self, NameError> {
        use DeletionStatus as Stored;
        Ok(match s {
            Stored::Pending => Self::Pending,
            Stored::Blocked { blockers, reason } => Self::Blocked {
                blockers: blockers_from(blockers)?,
                reason: string(reason),
            },
            Stored::Failed { error } => Self::Failed { error: string(error) },
            Stored::Waiting { regions, reason } => Self::Waiting {
                regions: strings(regions),
                reason: string(reason),
            },
        })
    }
}

/// [`model::DeletionRecord`].
#[derive(Debug, Serialize, Deserialize)]
pub struct DeletionRecord<'a> {
    #[serde(borrow)]
    pub target: RefTarget<'a>,
    pub deleted_at: u64,
    #[serde(borrow)]
    pub reason: DeletionReason<'a>,
    #[serde(borrow)]
    pub requested_by: Cow<'a, str>,
    pub operation: Id,
    #[serde(borrow)]
    pub status: DeletionStatus<'a>,
}

impl<'a> From<&'a model::DeletionRecord> for DeletionRecord<'a> {
    fn from(d: &'a model::DeletionRecord) -> Self {
        DeletionRecord {
            target: (&d.target).into(),
            deleted_at: d.deleted_at.0,
            reason: (&d.reason).into(),
            requested_by: Cow::Borrowed(d.requested_by.as_str()),
            operation: *d.operation.0.as_bytes(),
            status: (&d.status).into(),
        }
    }
}

impl TryFrom<DeletionRecord<'_>> for model::DeletionRecord {
    type Error = NameError;
    fn try_from(d: DeletionRecord<'_>) -> Result<Self, NameError> {
        Ok(model::DeletionRecord {
            target: d.target.try_into()?,
            deleted_at: Timestamp(d.deleted_at),
            reason: d.reason.try_into()?,
            requested_by: string(d.requested_by),
            operation: op(d.operation),
            status: d.status.try_into()?,
            finalizer_failures: Vec::new(),
            forced: None,
            principal: cascade_core::auth::Principal::anonymous(),
        })
    }
}

/// [`model::FinalizerFailure`].
#[derive(Debug, Serialize, Deserialize)]
pub struct FinalizerFailure<'a> {
    #[serde(borrow)]
    pub finalizer: Cow<'a, str>,
    pub failures: u32,
    #[serde(borrow)]
    pub last_reason: Cow<'a, str>,
    pub last_time: u64,
    pub retry_at: Option<u64>,
}

/// [`model::ForcedPurge`].
#[derive(Debug, Serialize, Deserialize)]
pub struct ForcedPurge<'a> {
    #[serde(borrow)]
    pub by: Cow<'a, str>,
    #[serde(borrow)]
    pub reason: Cow<'a, str>,
    pub time: u64,
}

/// [`model::DeletionRecord`], version 2 (see [`super::VERSION_POSTCARD_V2`]):
/// version 1's fields, then the finalizer failures and the force purge.
/// Written only for a deletion a finalizer controller reported a failure
/// for or an administrator forced, so every other record keeps version 1's
/// bytes; version 1 reads back with neither.
#[derive(Debug, Serialize, Deserialize)]
pub struct DeletionRecordV2<'a> {
    #[serde(borrow)]
    pub v1: DeletionRecord<'a>,
    #[serde(borrow)]
    pub finalizer_failures: Vec<FinalizerFailure<'a>>,
    #[serde(borrow)]
    pub forced: Option<ForcedPurge<'a>>,
}

impl<'a> From<&'a model::DeletionRecord> for DeletionRecordV2<'a> {
    fn from(d: &'a model::DeletionRecord) -> Self {
        DeletionRecordV2 {
            v1: DeletionRecord::from(d),
            finalizer_failures: d
                .finalizer_failures
                .iter()
                .map(|f| FinalizerFailure {
                    finalizer: Cow::Borrowed(f.finalizer.as_str()),
                    failures: f.failures,
                    last_reason: Cow::Borrowed(f.last_reason.as_str()),
                    last_time: f.last_time.0,
                    retry_at: f.retry_at.map(|t| t.0),
                })
                .collect(),
            forced: d.forced.as_ref().map(|f| ForcedPurge {
                by: Cow::Borrowed(f.by.as_str()),
                reason: Cow::Borrowed(f.reason.as_str()),
                time: f.time.0,
            }),
        }
    }
}

impl TryFrom<DeletionRecordV2<'_>> for model::DeletionRecord {
    type Error = NameError;
    fn try_from(d: DeletionRecordV2<'_>) -> Result<Self, NameError> {
        let mut record = model::DeletionRecord::try_from(d.v1)?;
        record.finalizer_failures = d
            .finalizer_failures
            .into_iter()
            .map(|f| model::FinalizerFailure {
                finalizer: string(f.finalizer),
                failures: f.failures,
                last_reason: string(f.last_reason),
                last_time: Timestamp(f.last_time),
                retry_at: f.retry_at.map(Timestamp),
            })
            .collect();
        record.forced = d.forced.map(|f| model::ForcedPurge {
            by: string(f.by),
            reason: string(f.reason),
            time: Timestamp(f.time),
        });
        Ok(record)
    }
}

/// [`model::OperationState`].
#[derive(Debug, Serialize, Deserialize)]
pub enum OperationState {
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl From<model::OperationState> for OperationState {
    fn from(s: model::OperationState) -> Self {
        match s {
            model::OperationState::Running => OperationState::Running,
            model::OperationState::Succeeded => OperationState::Succeeded,
            model::OperationState::Failed => OperationState::Failed,
            model::OperationState::Cancelled => OperationState::Cancelled,
        }
    }
}

impl From<OperationState> for model::OperationState {
    fn from(s: OperationState) -> Self {
        match s {
            OperationState::Running => model::OperationState::Running,
            OperationState::Succeeded => model::OperationState::Succeeded,
            OperationState::Failed => model::OperationState::Failed,
            OperationState::Cancelled => model::OperationState::Cancelled,
        }
    }
}

/// [`model::Progress`].
#[derive(Debug, Serialize, Deserialize)]
pub struct Progress {
    pub deleted: u64,
    pub unset: u64,
    pub pending: u64,
    pub blocked: u64,
    pub failed: u64,
}

impl From<&model::Progress> for Progress {
    fn from(p: &model::Progress) -> Self {
        Progress {
            deleted: p.deleted,
            unset: p.unset,
            pending: p.pending,
            blocked: p.blocked,
            failed: p.failed,
        }
    }
}

impl From<Progress> for model::Progress {
    fn from(p: Progress) -> Self {
        model::Progress {
            deleted: p.deleted,
            unset: p.unset,
            pending: p.pending,
            blocked: p.blocked,
            failed: p.failed,
        }
    }
}

/// [`model::Operation`].
#[derive(Debug, Serialize, Deserialize)]
pub struct Operation<'a> {
    pub id: Id,
    #[serde(borrow)]
    pub root: RefTarget<'a>,
    #[serde(borrow)]
    pub requested_by: Cow<'a, str>,
    pub cascade: bool,
    pub state: OperationState,
    pub progress: Progress,
    pub create_time: u64,
    pub end_time: Option<u64>,
    pub reached: Cow<'a, BTreeSet<String>>,
    pub changes: u64,
    pub closure_confirmed: bool,
}

impl<'a> From<&'a model::Operation> for Operation<'a> {
    fn from(o: &'a model::Operation) -> Self {
        Operation {
            id: *o.id.0.as_bytes(),
            root: (&o.root).into(),
            requested_by: Cow::Borrowed(o.requested_by.as_str()),
            cascade: o.cascade,
            state: o.state.into(),
            progress: (&o.progress).into(),
            create_time: o.create_time.0,
            end_time: o.end_time.map(|t| t.0),
            reached: Cow::Borrowed(&o.reached),
            changes: o.changes,
            closure_confirmed: o.closure_confirmed,
        }
    }
}

impl TryFrom<Operation<'_>> for model::Operation {
    type Error = NameError;
    fn try_from(o: Operation<'_>) -> Result<Self, NameError> {
        Ok(model::Operation {
            id: op(o.id),
            root: o.root.try_into()?,
            requested_by: string(o.requested_by),
            cascade: o.cascade,
            state: o.state.into(),
            progress: o.progress.into(),
            create_time: Timestamp(o.create_time),
            end_time: o.end_time.map(Timestamp),
            reached: o.reached.into_owned(),
            changes: o.changes,
            closure_confirmed: o.closure_confirmed,
            principal: cascade_core::auth::Principal::anonymous(),
            retain_ms: 0,
            controls: None,
            undelete: None,
        })
    }
}

/// [`model::OutcomeAction`].
#[derive(Debug, Serialize, Deserialize)]
pub enum OutcomeAction<'a> {
    Pending,
    Deleted,
    Unset {
        #[serde(borrow)]
        field: Cow<'a, str>,
    },
    Blocked {
        #[serde(borrow)]
        blockers: Vec<Blocker<'a>>,
    },
    Failed {
        #[serde(borrow)]
        error: Cow<'a, str>,
    },
    Waiting {
        regions: Cow<'a, [String]>,
    },
    /// Appended (issue 29): held by its operation's controls.
    Held {
        #[serde(borrow)]
        reason: Cow<'a, str>,
    },
    /// Appended (issue 29): an undelete brought it back.
    Restored,
    /// Appended (issue 29): an undelete could not bring it back.
    NotRestored {
        #[serde(borrow)]
        reason: Cow<'a, str>,
    },
}

impl<'a> From<&'a model::OutcomeAction> for OutcomeAction<'a> {
    fn from(a: &'a model::OutcomeAction) -> Self {
        match a {
            model::OutcomeAction::Pending => OutcomeAction::Pending,
            model::OutcomeAction::Deleted => OutcomeAction::Deleted,
            model::OutcomeAction::Unset { field, .. } => OutcomeAction::Unset {
                field: Cow::Borrowed(field.as_str()),
            },
            model::OutcomeAction::Blocked { blockers } => OutcomeAction::Blocked {
                blockers: blockers_to(blockers),
            },
            model::OutcomeAction::Failed { error } => OutcomeAction::Failed {
                error: Cow::Borrowed(error.as_str()),
            },
            model::OutcomeAction::Waiting { regions } => OutcomeAction::Waiting {
                regions: Cow::Borrowed(regions),
            },
            model::OutcomeAction::Held { reason } => OutcomeAction::Held {
                reason: Cow::Borrowed(reason.as_str()),
            },
            model::OutcomeAction::Restored => OutcomeAction::Restored,
            model::OutcomeAction::NotRestored { reason } => OutcomeAction::NotRestored {
                reason: Cow::Borrowed(reason.as_str()),
            },
        }
    }
}

impl TryFrom<OutcomeAction<'_>> for model::OutcomeAction {
    type Error = NameError;
    fn try_from(a: OutcomeAction<'_>) -> Result<Self, NameError> {
        Ok(match a {
            OutcomeAction::Pending => model::OutcomeAction::Pending,
            OutcomeAction::Deleted => model::OutcomeAction::Deleted,
            OutcomeAction::Unset { field } => model::OutcomeAction::Unset {
                field: string(field),
                undo: None,
            },
            OutcomeAction::Blocked { blockers } => model::OutcomeAction::Blocked {
                blockers: blockers_from(blockers)?,
            },
            OutcomeAction::Failed { error } => model::OutcomeAction::Failed { error: string(error) },
            OutcomeAction::Waiting { regions } => model::OutcomeAction::Waiting {
                regions: strings(regions),
            },
            OutcomeAction::Held { reason } => model::OutcomeAction::Held { reason: string(reason) },
            OutcomeAction::Restored => model::OutcomeAction::Restored,
            OutcomeAction::NotRestored { reason } => model::OutcomeAction::NotRestored { reason: string(reason) },
        })
    }
}

/// [`model::Outcome`] (the core flattens `action` into the outcome; here it
/// is a field of its own). A row of the outcomes table is written without
/// the resource's name since issue 28's P4 ([`OutcomeV3`]).
#[derive(Debug, Serialize, Deserialize)]
pub struct Outcome<'a> {
    #[serde(borrow)]
    pub resource: RefTarget<'a>,
    #[serde(borrow)]
    pub action: OutcomeAction<'a>,
    pub time: u64,
}

impl<'a> From<&'a model::Outcome> for Outcome<'a> {
    fn from(o: &'a model::Outcome) -> Self {
        Outcome {
            resource: (&o.resource).into(),
            action: (&o.action).into(),
            time: o.time.0,
        }
    }
}

impl TryFrom<Outcome<'_>> for model::Outcome {
    type Error = NameError;
    fn try_from(o: Outcome<'_>) -> Result<Self, NameError> {
        Ok(model::Outcome {
            resource: o.resource.try_into()?,
            action: o.action.try_into()?,
            time: Timestamp(o.time),
        })
    }
}

/// [`model::WorkItem`] as version 1 wrote it, before the walk's position
/// (read only: a version-1 item resumes with a walk from the first row).
#[derive(Debug, Serialize, Deserialize)]
pub struct WorkItemV1<'a> {
    #[serde(borrow)]
    pub target: RefTarget<'a>,
    pub next_attempt_at: u64,
    pub attempts: u32,
    #[serde(borrow)]
    pub last_error: Option<Cow<'a, str>>,
}

impl TryFrom<WorkItemV1<'_>> for model::WorkItem {
    type Error = NameError;
    fn try_from(w: WorkItemV1<'_>) -> Result<Self, NameError> {
        Ok(model::WorkItem {
            target: w.target.try_into()?,
            next_attempt_at: Timestamp(w.next_attempt_at),
            attempts: w.attempts,
            last_error: w.last_error.map(string),
            walk: model::Walk::default(),
        })
    }
}

/// [`model::WorkItem`], version 2 (see [`super::VERSION_POSTCARD_V2`]):
/// version 1's fields, then the walk.
#[derive(Debug, Serialize, Deserialize)]
pub struct WorkItem<'a> {
    #[serde(borrow)]
    pub target: RefTarget<'a>,
    pub next_attempt_at: u64,
    pub attempts: u32,
    #[serde(borrow)]
    pub last_error: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub walk: Walk<'a>,
}

/// [`model::Walk`].
#[derive(Debug, Serialize, Deserialize)]
pub struct Walk<'a> {
    #[serde(borrow)]
    pub after: Option<BackRefKey<'a>>,
    pub finished: bool,
    #[serde(borrow)]
    pub remote: Vec<(Cow<'a, str>, u64)>,
    pub blocking: u64,
    pub recount_at: u64,
}

impl<'a> From<&'a model::WorkItem> for WorkItem<'a> {
    fn from(w: &'a model::WorkItem) -> Self {
        WorkItem {
            target: (&w.target).into(),
            next_attempt_at: w.next_attempt_at.0,
            attempts: w.attempts,
            last_error: w.last_error.as_deref().map(Cow::Borrowed),
            walk: Walk {
                after: w.walk.after.as_ref().map(BackRefKey::from),
                finished: w.walk.finished,
                remote: w
                    .walk
                    .remote
                    .iter()
                    .map(|(region, n)| (Cow::Borrowed(region.as_str()), *n))
                    .collect(),
                blocking: w.walk.blocking,
                recount_at: w.walk.recount_at.0,
            },
        }
    }
}

impl TryFrom<WorkItem<'_>> for model::WorkItem {
    type Error = NameError;
    fn try_from(w: WorkItem<'_>) -> Result<Self, NameError> {
        Ok(model::WorkItem {
            target: w.target.try_into()?,
            next_attempt_at: Timestamp(w.next_attempt_at),
            attempts: w.attempts,
            last_error: w.last_error.map(string),
            walk: model::Walk {
                after: w.walk.after.map(model::BackRefKey::from),
                finished: w.walk.finished,
                remote: w
                    .walk
                    .remote
                    .into_iter()
                    .map(|(region, n)| (string(region), n))
                    .collect(),
                blocking: w.walk.blocking,
                recount_at: Timestamp(w.walk.recount_at),
            },
        })
    }
}

/// [`model::EventType`].
#[derive(Debug, Serialize, Deserialize)]
pub enum EventType {
    Created,
    Updated,
    Deleting,
    Purged,
    DeletionBlocked,
    DeletionFailed,
    FinalizerRetry,
    DeletionForced,
    /// Appended for soft delete.
    SoftDeleted,
    /// Appended for undelete.
    Undeleted,
}

impl From<model::EventType> for EventType {
    fn from(t: model::EventType) -> Self {
        match t {
            model::EventType::Created => EventType::Created,
            model::EventType::Updated => EventType::Updated,
            model::EventType::Deleting => EventType::Deleting,
            model::EventType::Purged => EventType::Purged,
            model::EventType::DeletionBlocked => EventType::DeletionBlocked,
            model::EventType::DeletionFailed => EventType::DeletionFailed,
            model::EventType::FinalizerRetry => EventType::FinalizerRetry,
            model::EventType::DeletionForced => EventType::DeletionForced,
            model::EventType::SoftDeleted => EventType::SoftDeleted,
            model::EventType::Undeleted => EventType::Undeleted,
        }
    }
}

impl From<EventType> for model::EventType {
    fn from(t: EventType) -> Self {
        match t {
            EventType::Created => model::EventType::Created,
            EventType::Updated => model::EventType::Updated,
            EventType::Deleting => model::EventType::Deleting,
            EventType::Purged => model::EventType::Purged,
            EventType::DeletionBlocked => model::EventType::DeletionBlocked,
            EventType::DeletionFailed => model::EventType::DeletionFailed,
            EventType::FinalizerRetry => model::EventType::FinalizerRetry,
            EventType::DeletionForced => model::EventType::DeletionForced,
            EventType::SoftDeleted => model::EventType::SoftDeleted,
            EventType::Undeleted => model::EventType::Undeleted,
        }
    }
}

/// [`model::Event`].
#[derive(Debug, Serialize, Deserialize)]
pub struct Event<'a> {
    pub revision: u64,
    pub event_type: EventType,
    #[serde(borrow)]
    pub resource: RefTarget<'a>,
    #[serde(borrow)]
    pub snapshot: Option<Resource<'a>>,
    pub operation: Option<Id>,
    #[serde(borrow)]
    pub message: Cow<'a, str>,
    pub time: u64,
    pub no_cascade: bool,
    #[serde(borrow)]
    pub cause: Option<DeletionReason<'a>>,
}

impl<'a> From<&'a model::Event> for Event<'a> {
    fn from(e: &'a model::Event) -> Self {
        Event {
            revision: e.revision,
            event_type: e.event_type.into(),
            resource: (&e.resource).into(),
            snapshot: e.snapshot.as_ref().map(Resource::from),
            operation: e.operation.map(|o| *o.0.as_bytes()),
            message: Cow::Borrowed(e.message.as_str()),
            time: e.time.0,
            no_cascade: e.no_cascade,
            cause: e.cause.as_ref().map(DeletionReason::from),
        }
    }
}

impl TryFrom<Event<'_>> for model::Event {
    type Error = NameError;
    fn try_from(e: Event<'_>) -> Result<Self, NameError> {
        Ok(model::Event {
            revision: e.revision,
            event_type: e.event_type.into(),
            resource: e.resource.try_into()?,
            snapshot: e.snapshot.map(model::Resource::try_from).transpose()?,
            operation: e.operation.map(op),
            message: string(e.message),
            time: Timestamp(e.time),
            no_cascade: e.no_cascade,
            cause: e.cause.map(model::DeletionReason::try_from).transpose()?,
            principal: cascade_core::auth::Principal::anonymous(),
            retain_ms: 0,
        })
    }
}

/// The first fields of every layout of an event (each later layout wraps
/// [`Event`], so its body starts with these): what a Watch filters on,
/// read without the rest of the value (`StoreState::events_wanted`).
#[derive(Debug, Deserialize)]
pub struct EventHead<'a> {
    pub revision: u64,
    pub event_type: EventType,
    #[serde(borrow)]
    pub resource: RefTarget<'a>,
}

/// [`model::Event`], version 2 (see [`super::VERSION_POSTCARD_V2`]):
/// version 1's fields, then the liens of its snapshot. Written only when
/// the snapshot holds a lien, like [`ResourceV2`].
#[derive(Debug, Serialize, Deserialize)]
pub struct EventV2<'a> {
    #[serde(borrow)]
    pub v1: Event<'a>,
    #[serde(borrow)]
    pub snapshot_liens: Vec<Lien<'a>>,
}

impl<'a> From<&'a model::Event> for EventV2<'a> {
    fn from(e: &'a model::Event) -> Self {
        EventV2 {
            v1: Event::from(e),
            snapshot_liens: e.snapshot.as_ref().map(|r| liens_to(&r.liens)).unwrap_or_default(),
        }
    }
}

impl TryFrom<EventV2<'_>> for model::Event {
    type Error = NameError;
    fn try_from(e: EventV2<'_>) -> Result<Self, NameError> {
        let mut event = model::Event::try_from(e.v1)?;
        if let Some(snapshot) = event.snapshot.as_mut() {
            snapshot.liens = liens_from(e.snapshot_liens);
        }
        Ok(event)
    }
}

/// An outbox row of several events, one commit's (version 6, see
/// [`super::VERSION_POSTCARD_V6`]): each event's own value, its version
/// byte and body exactly as a row of one event holds it, in revision
/// order. Postcard writes it as the count, then each value's length and
/// bytes, so a reader takes each event's head ([`EventHead`]) without
/// decoding the rest of it. A row of one event is that event's value
/// alone, as every row was before runs.
#[derive(Debug, Serialize, Deserialize)]
pub struct EventRun<'a> {
    #[serde(borrow)]
    pub events: Vec<EventValue<'a>>,
}

/// One event's stored value inside an [`EventRun`], borrowed: written as
/// bytes (a length, then the bytes in one copy), read back without one.
#[derive(Debug, Deserialize)]
#[serde(transparent)]
pub struct EventValue<'a>(#[serde(borrow)] pub &'a [u8]);

impl Serialize for EventValue<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

/// [`model::RemoteDeletion`].
#[derive(Debug, Serialize, Deserialize)]
pub struct RemoteDeletion<'a> {
    #[serde(borrow)]
    pub target: RefTarget<'a>,
    pub operation: Id,
    pub seen_at: u64,
    pub purged: bool,
    pub no_cascade: bool,
}

impl<'a> From<&'a model::RemoteDeletion> for RemoteDeletion<'a> {
    fn from(r: &'a model::RemoteDeletion) -> Self {
        RemoteDeletion {
            target: (&r.target).into(),
            operation: *r.operation.0.as_bytes(),
            seen_at: r.seen_at.0,
            purged: r.purged,
            no_cascade: r.no_cascade,
        }
    }
}

impl TryFrom<RemoteDeletion<'_>> for model::RemoteDeletion {
    type Error = NameError;
    fn try_from(r: RemoteDeletion<'_>) -> Result<Self, NameError> {
        Ok(model::RemoteDeletion {
            target: r.target.try_into()?,
            operation: op(r.operation),
            seen_at: Timestamp(r.seen_at),
            purged: r.purged,
            no_cascade: r.no_cascade,
            forced: false,
            principal: cascade_core::auth::Principal::anonymous(),
            retain_ms: 0,
        })
    }
}

/// [`model::RemoteDeletion`], version 2 (see [`super::VERSION_POSTCARD_V2`]):
/// version 1's fields, then whether the owner forced the deletion. Written
/// only for a forced one.
#[derive(Debug, Serialize, Deserialize)]
pub struct RemoteDeletionV2<'a> {
    #[serde(borrow)]
    pub v1: RemoteDeletion<'a>,
    pub forced: bool,
}

impl<'a> From<&'a model::RemoteDeletion> for RemoteDeletionV2<'a> {
    fn from(r: &'a model::RemoteDeletion) -> Self {
        RemoteDeletionV2 {
            v1: RemoteDeletion::from(r),
            forced: r.forced,
        }
    }
}

impl TryFrom<RemoteDeletionV2<'_>> for model::RemoteDeletion {
    type Error = NameError;
    fn try_from(r: RemoteDeletionV2<'_>) -> Result<Self, NameError> {
        let mut tombstone = model::RemoteDeletion::try_from(r.v1)?;
        tombstone.forced = r.forced;
        Ok(tombstone)
    }
}

/// [`model::PendingAttach`].
#[derive(Debug, Serialize, Deserialize)]
pub struct PendingAttach<'a> {
    #[serde(borrow)]
    pub resource: RefTarget<'a>,
    #[serde(borrow)]
    pub keys: Vec<BackRefKey<'a>>,
}

impl<'a> From<&'a model::PendingAttach> for PendingAttach<'a> {
    fn from(p: &'a model::PendingAttach) -> Self {
        PendingAttach {
            resource: (&p.resource).into(),
            keys: p.keys.iter().map(BackRefKey::from).collect(),
        }
    }
}

impl TryFrom<PendingAttach<'_>> for model::PendingAttach {
    type Error = NameError;
    fn try_from(p: PendingAttach<'_>) -> Result<Self, NameError> {
        Ok(model::PendingAttach {
            resource: p.resource.try_into()?,
            keys: p.keys.into_iter().map(model::BackRefKey::from).collect(),
        })
    }
}

/// [`model::PendingRelease`].
#[derive(Debug, Serialize, Deserialize)]
pub struct PendingRelease<'a> {
    #[serde(borrow)]
    pub backref: BackRef<'a>,
    pub generation: u64,
}

impl<'a> From<&'a model::PendingRelease> for PendingRelease<'a> {
    fn from(p: &'a model::PendingRelease) -> Self {
        PendingRelease {
            backref: (&p.backref).into(),
            generation: p.generation,
        }
    }
}

impl TryFrom<PendingRelease<'_>> for model::PendingRelease {
    type Error = NameError;
    fn try_from(p: PendingRelease<'_>) -> Result<Self, NameError> {
        Ok(model::PendingRelease {
            backref: p.backref.try_into()?,
            generation: p.generation,
        })
    }
}

/// [`model::AuditEntry`], version 1: an administrator's action, before
/// the principal's groups, how it proved itself, the node, the region it
/// came through and the rule were kept (read as empty).
#[derive(Debug, Serialize, Deserialize)]
pub struct AuditEntry<'a> {
    pub id: Id,
    pub time: u64,
    #[serde(borrow)]
    pub who: Cow<'a, str>,
    #[serde(borrow)]
    pub action: Cow<'a, str>,
    #[serde(borrow)]
    pub target: Cow<'a, str>,
    #[serde(borrow)]
    pub reason: Cow<'a, str>,
    #[serde(borrow)]
    pub outcome: Cow<'a, str>,
}

impl<'a> From<&'a model::AuditEntry> for AuditEntry<'a> {
    fn from(e: &'a model::AuditEntry) -> Self {
        AuditEntry {
            id: *e.id.as_bytes(),
            time: e.time.0,
            who: Cow::Borrowed(e.who.as_str()),
            action: Cow::Borrowed(e.action.as_str()),
            target: Cow::Borrowed(e.target.as_str()),
            reason: Cow::Borrowed(e.reason.as_str()),
            outcome: Cow::Borrowed(e.outcome.as_str()),
        }
    }
}

impl TryFrom<AuditEntry<'_>> for model::AuditEntry {
    type Error = NameError;
    fn try_from(e: AuditEntry<'_>) -> Result<Self, NameError> {
        Ok(model::AuditEntry {
            id: uid(e.id),
            time: Timestamp(e.time),
            who: string(e.who),
            action: string(e.action),
            target: string(e.target),
            reason: string(e.reason),
            outcome: string(e.outcome),
            ..model::AuditEntry::default()
        })
    }
}

/// [`model::AuditEntry`], version 2: version 1's fields, then the
/// principal's groups, how it proved itself (`via`), the node that wrote
/// it, the region the call came through and the deciding rule (issue 27).
/// Written whenever one of these is set (every entry a node of this
/// version writes); an entry without them keeps version 1's bytes.
#[derive(Debug, Serialize, Deserialize)]
pub struct AuditEntryV2<'a> {
    pub id: Id,
    pub time: u64,
    #[serde(borrow)]
    pub who: Cow<'a, str>,
    #[serde(borrow)]
    pub action: Cow<'a, str>,
    #[serde(borrow)]
    pub target: Cow<'a, str>,
    #[serde(borrow)]
    pub reason: Cow<'a, str>,
    #[serde(borrow)]
    pub outcome: Cow<'a, str>,
    #[serde(borrow)]
    pub groups: Cow<'a, [String]>,
    #[serde(borrow)]
    pub via: Cow<'a, str>,
    #[serde(borrow)]
    pub node: Cow<'a, str>,
    #[serde(borrow)]
    pub through: Cow<'a, str>,
    #[serde(borrow)]
    pub rule: Cow<'a, str>,
}

impl<'a> From<&'a model::AuditEntry> for AuditEntryV2<'a> {
    fn from(e: &'a model::AuditEntry) -> Self {
        AuditEntryV2 {
            id: *e.id.as_bytes(),
            time: e.time.0,
            who: Cow::Borrowed(e.who.as_str()),
            action: Cow::Borrowed(e.action.as_str()),
            target: Cow::Borrowed(e.target.as_str()),
            reason: Cow::Borrowed(e.reason.as_str()),
            outcome: Cow::Borrowed(e.outcome.as_str()),
            groups: Cow::Borrowed(e.groups.as_slice()),
            via: Cow::Borrowed(e.via.as_str()),
            node: Cow::Borrowed(e.node.as_str()),
            through: Cow::Borrowed(e.through.as_str()),
            rule: Cow::Borrowed(e.rule.as_str()),
        }
    }
}

impl TryFrom<AuditEntryV2<'_>> for model::AuditEntry {
    type Error = NameError;
    fn try_from(e: AuditEntryV2<'_>) -> Result<Self, NameError> {
        Ok(model::AuditEntry {
            id: uid(e.id),
            time: Timestamp(e.time),
            who: string(e.who),
            action: string(e.action),
            target: string(e.target),
            reason: string(e.reason),
            outcome: string(e.outcome),
            groups: strings(e.groups),
            via: string(e.via),
            node: string(e.node),
            through: string(e.through),
            rule: string(e.rule),
        })
    }
}

/// [`model::AuditEntry`], version 3 (see [`super::VERSION_POSTCARD_V3`]):
/// version 2 without its id, which is the row's key and is read back from
/// it ([`AuditEntryV3::with_key`]). Written for every row of the audit
/// table (the log keeps up to `[audit] max_entries`, a million by
/// default: 16 bytes each); versions 1 and 2 still read as they are.
#[derive(Debug, Serialize, Deserialize)]
pub struct AuditEntryV3<'a> {
    pub time: u64,
    #[serde(borrow)]
    pub who: Cow<'a, str>,
    #[serde(borrow)]
    pub action: Cow<'a, str>,
    #[serde(borrow)]
    pub target: Cow<'a, str>,
    #[serde(borrow)]
    pub reason: Cow<'a, str>,
    #[serde(borrow)]
    pub outcome: Cow<'a, str>,
    #[serde(borrow)]
    pub groups: Cow<'a, [String]>,
    #[serde(borrow)]
    pub via: Cow<'a, str>,
    #[serde(borrow)]
    pub node: Cow<'a, str>,
    #[serde(borrow)]
    pub through: Cow<'a, str>,
    #[serde(borrow)]
    pub rule: Cow<'a, str>,
}

impl<'a> From<&'a model::AuditEntry> for AuditEntryV3<'a> {
    fn from(e: &'a model::AuditEntry) -> Self {
        AuditEntryV3 {
            time: e.time.0,
            who: Cow::Borrowed(e.who.as_str()),
            action: Cow::Borrowed(e.action.as_str()),
            target: Cow::Borrowed(e.target.as_str()),
            reason: Cow::Borrowed(e.reason.as_str()),
            outcome: Cow::Borrowed(e.outcome.as_str()),
            groups: Cow::Borrowed(e.groups.as_slice()),
            via: Cow::Borrowed(e.via.as_str()),
            node: Cow::Borrowed(e.node.as_str()),
            through: Cow::Borrowed(e.through.as_str()),
            rule: Cow::Borrowed(e.rule.as_str()),
        }
    }
}

impl AuditEntryV3<'_> {
    /// The entry, with its id from `key` (its row's key: the id's 16 bytes).
    pub fn with_key(self, key: &[u8]) -> Result<model::AuditEntry, String> {
        let id: Id = key
            .try_into()
            .map_err(|_| format!("a key of {} bytes is no audit entry's id (16)", key.len()))?;
        Ok(model::AuditEntry {
            id: uid(id),
            time: Timestamp(self.time),
            who: string(self.who),
            action: string(self.action),
            target: string(self.target),
            reason: string(self.reason),
            outcome: string(self.outcome),
            groups: strings(self.groups),
            via: string(self.via),
            node: string(self.node),
            through: string(self.through),
            rule: string(self.rule),
        })
    }
}

/// [`cascade_core::auth::Via`].
#[derive(Debug, Serialize, Deserialize)]
pub enum Via {
    Certificate,
    Jwt,
    Token,
    Unauthenticated,
}

/// [`cascade_core::auth::Principal`]: who a deletion acts for.
#[derive(Debug, Serialize, Deserialize)]
pub struct Principal<'a> {
    #[serde(borrow)]
    pub id: Cow<'a, str>,
    #[serde(borrow)]
    pub groups: Cow<'a, [String]>,
    pub via: Via,
}

impl<'a> From<&'a cascade_core::auth::Principal> for Principal<'a> {
    fn from(p: &'a cascade_core::auth::Principal) -> Self {
        use cascade_core::auth::Via as Core;
        Principal {
            id: Cow::Borrowed(p.id.as_str()),
            groups: Cow::Borrowed(p.groups.as_slice()),
            via: match p.via {
                Core::Certificate => Via::Certificate,
                Core::Jwt => Via::Jwt,
                Core::Token => Via::Token,
                Core::Unauthenticated => Via::Unauthenticated,
            },
        }
    }
}

impl From<Principal<'_>> for cascade_core::auth::Principal {
    fn from(p: Principal<'_>) -> Self {
        use cascade_core::auth::Via as Core;
        cascade_core::auth::Principal {
            id: string(p.id),
            groups: strings(p.groups),
            via: match p.via {
                Via::Certificate => Core::Certificate,
                Via::Jwt => Core::Jwt,
                Via::Token => Core::Token,
                Via::Unauthenticated => Core::Unauthenticated,
            },
        }
    }
}

/// Whether a record must store its principal: any but the anonymous one
/// (what every earlier layout reads back as), so a node without
/// authentication keeps writing the bytes it always wrote.
pub fn names_a_principal(p: &cascade_core::auth::Principal) -> bool {
    *p != cascade_core::auth::Principal::anonymous()
}

/// A record's layout that appends the principal its deletion acts for to
/// the previous version's fields (`$prev`, in the field `$field`), with the
/// conversions from and to `$model`. Such a layout is written only when
/// the principal is not the anonymous one; the earlier versions read back
/// as anonymous.
macro_rules! with_principal {
    ($(#[$doc:meta])* $name:ident { $field:ident: $prev:ident } for $model:ty) => {
        $(#[$doc])*
        #[derive(Debug, Serialize, Deserialize)]
        pub struct $name<'a> {
            #[serde(borrow)]
            pub $field: $prev<'a>,
            #[serde(borrow)]
            pub principal: Principal<'a>,
        }

        impl<'a> From<&'a $model> for $name<'a> {
            fn from(record: &'a $model) -> Self {
                $name {
                    $field: $prev::from(record),
                    principal: (&record.principal).into(),
                }
            }
        }

        impl TryFrom<$name<'_>> for $model {
            type Error = NameError;
            fn try_from(stored: $name<'_>) -> Result<Self, NameError> {
                let mut record = <$model>::try_from(stored.$field)?;
                record.principal = stored.principal.into();
                Ok(record)
            }
        }
    };
}

with_principal! {
    /// [`model::DeletionRecord`], version 3 (see [`super::VERSION_POSTCARD_V3`]):
    /// version 2's fields, then the principal the deletion acts for.
    DeletionRecordV3 { v2: DeletionRecordV2 } for model::DeletionRecord
}

with_principal! {
    /// [`model::Operation`], version 2 (see [`super::VERSION_POSTCARD_V2`]):
    /// version 1's fields, then the principal its cascade acts for.
    OperationV2 { v1: Operation } for model::Operation
}

with_principal! {
    /// [`model::Event`], version 3 (see [`super::VERSION_POSTCARD_V3`]):
    /// version 2's fields, then the principal a DELETING or DELETION_FORCED
    /// event carries to importers.
    EventV3 { v2: EventV2 } for model::Event
}

with_principal! {
    /// [`model::RemoteDeletion`], version 3 (see [`super::VERSION_POSTCARD_V3`]):
    /// version 2's fields, then the principal the owner's deletion acts for.
    RemoteDeletionV3 { v2: RemoteDeletionV2 } for model::RemoteDeletion
}
