//! The layouts of a resource's row, and of an outcome's, without the
//! resource's name (issue 28, P4): the
//! resources table is keyed by the name, so the row need not hold it too,
//! and reads it back from the key ([`ResourceV4::with_key`]), as a
//! back-reference row does its uids ([`super::BackRefV2`]). The name (its
//! length and `{region}/{kind}/{id}`) was about 21 bytes of each row of a
//! P1 population: 21 MB of unset's million resources on the memory engine,
//! whose peak went from 584–589 to 546–552 MB (docs/BENCHMARKS.md, "P4: a
//! resource's row without its name").
//!
//! Two layouts, so that neither costs a byte over the other's need:
//! version 4 is version 1 without the name (a resource with no lien and
//! no window: nearly every one), version 5 wraps it with the liens and the
//! window (versions 2 and 3's appendices). A resource encoded on its own,
//! without a key, keeps versions 1 to 3 (`codec/records.rs`).
//!
//! An outcome's row likewise (its key is the operation's id, then the
//! resource's name; a cascade writes one per resource it reaches):
//! version 3 is version 1 without the name ([`OutcomeV3`]), version 4
//! wraps it with an unset's undo record (version 2's appendix).

use std::borrow::Cow;
use std::collections::BTreeMap;

use cascade_core::model;
use serde::{Deserialize, Serialize};

use super::{
    liens_from, liens_to, Id, Lien, Outcome, OutcomeAction, OutcomeV2, RefTarget, Refs, Resource, ResourceState,
    SoftDeletion, UnsetUndo,
};

/// [`model::Resource`], version 4 (see [`crate::codec::VERSION_POSTCARD_V4`]):
/// version 1's fields without the name, which is the row's key. Written
/// for every row of the resources table whose resource holds no lien and
/// no window.
#[derive(Debug, Serialize, Deserialize)]
pub struct ResourceV4<'a> {
    pub uid: Id,
    pub state: ResourceState,
    pub attributes: Cow<'a, BTreeMap<String, String>>,
    pub refs: Refs<'a>,
    pub revision: u64,
    pub create_time: u64,
    pub update_time: u64,
    pub finalizers: Cow<'a, [String]>,
}

impl<'a> From<&'a model::Resource> for ResourceV4<'a> {
    fn from(r: &'a model::Resource) -> Self {
        // Version 1's fields as version 1 builds them, its name left out.
        let Resource {
            name: _,
            uid,
            state,
            attributes,
            refs,
            revision,
            create_time,
            update_time,
            finalizers,
        } = Resource::from(r);
        ResourceV4 {
            uid,
            state,
            attributes,
            refs,
            revision,
            create_time,
            update_time,
            finalizers,
        }
    }
}

/// The name a key's bytes hold: a key that is not UTF-8 is an error
/// quoting (a prefix of) it; whether it is a name is checked by the
/// conversion that reads it (`ResourceName::from_stored`).
fn name_in(key: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(key).map_err(|e| {
        format!(
            "the key {} is not a resource name: {e}",
            cascade_core::limits::quote(&String::from_utf8_lossy(key))
        )
    })
}

impl ResourceV4<'_> {
    /// The resource, named by `key` (its row's key: the name's bytes).
    pub fn with_key(self, key: &[u8]) -> Result<model::Resource, String> {
        let name = name_in(key)?;
        // Version 1's conversion, with the name from the key: one place
        // turns the stored fields into a resource.
        model::Resource::try_from(Resource {
            name: Cow::Borrowed(name),
            uid: self.uid,
            state: self.state,
            attributes: self.attributes,
            refs: self.refs,
            revision: self.revision,
            create_time: self.create_time,
            update_time: self.update_time,
            finalizers: self.finalizers,
        })
        .map_err(|e| e.to_string())
    }
}

/// [`model::Resource`], version 5 (see [`crate::codec::VERSION_POSTCARD_V5`]):
/// version 4's fields, then the liens and the soft-deleted window. Written
/// for a row of the resources table whose resource holds a lien or is
/// DELETED (what versions 2 and 3 add to version 1).
#[derive(Debug, Serialize, Deserialize)]
pub struct ResourceV5<'a> {
    pub v4: ResourceV4<'a>,
    #[serde(borrow)]
    pub liens: Vec<Lien<'a>>,
    pub soft_deleted: Option<SoftDeletion>,
}

impl<'a> From<&'a model::Resource> for ResourceV5<'a> {
    fn from(r: &'a model::Resource) -> Self {
        ResourceV5 {
            v4: ResourceV4::from(r),
            liens: liens_to(&r.liens),
            soft_deleted: r.soft_deleted.as_ref().map(SoftDeletion::from),
        }
    }
}

impl ResourceV5<'_> {
    /// The resource, named by `key` ([`ResourceV4::with_key`]).
    pub fn with_key(self, key: &[u8]) -> Result<model::Resource, String> {
        let mut resource = self.v4.with_key(key)?;
        resource.liens = liens_from(self.liens);
        resource.soft_deleted = self.soft_deleted.map(Into::into);
        Ok(resource)
    }
}

/// The resource's name in an outcome row's key (the operation's 16
/// bytes, then the name: `codec::outcome_key`).
fn outcome_name_in(key: &[u8]) -> Result<&str, String> {
    match key.split_first_chunk::<16>() {
        Some((_, name)) => name_in(name),
        None => Err(format!("a key of {} bytes holds no outcome (at least 16)", key.len())),
    }
}

/// [`model::Outcome`], version 3 (see [`crate::codec::VERSION_POSTCARD_V3`]):
/// version 1's fields without the resource's name, which the row's key
/// holds after the operation's id. Written for every row of the outcomes
/// table but an unset's with an undo record ([`OutcomeV4`]).
#[derive(Debug, Serialize, Deserialize)]
pub struct OutcomeV3<'a> {
    pub uid: Id,
    #[serde(borrow)]
    pub action: OutcomeAction<'a>,
    pub time: u64,
}

impl<'a> From<&'a model::Outcome> for OutcomeV3<'a> {
    fn from(o: &'a model::Outcome) -> Self {
        let Outcome { resource, action, time } = Outcome::from(o);
        OutcomeV3 {
            uid: resource.uid,
            action,
            time,
        }
    }
}

impl<'a> OutcomeV3<'a> {
    /// Version 1 of it, with the name `name`.
    fn named<'k>(self, name: &'k str) -> Outcome<'k>
    where
        'a: 'k,
    {
        Outcome {
            resource: RefTarget {
                name: Cow::Borrowed(name),
                uid: self.uid,
            },
            action: self.action,
            time: self.time,
        }
    }

    /// The outcome, its resource named by `key` (its row's key).
    pub fn with_key(self, key: &[u8]) -> Result<model::Outcome, String> {
        let name = outcome_name_in(key)?;
        model::Outcome::try_from(self.named(name)).map_err(|e| e.to_string())
    }
}

/// [`model::Outcome`], version 4 (see [`crate::codec::VERSION_POSTCARD_V4`]):
/// version 3's fields, then an unset's undo record (what version 2 adds
/// to version 1). Written for an unset whose target is kept with a
/// retention.
#[derive(Debug, Serialize, Deserialize)]
pub struct OutcomeV4<'a> {
    #[serde(borrow)]
    pub v3: OutcomeV3<'a>,
    #[serde(borrow)]
    pub undo: Option<UnsetUndo<'a>>,
}

impl<'a> From<&'a model::Outcome> for OutcomeV4<'a> {
    fn from(o: &'a model::Outcome) -> Self {
        let OutcomeV2 { v1: _, undo } = OutcomeV2::from(o);
        OutcomeV4 {
            v3: OutcomeV3::from(o),
            undo,
        }
    }
}

impl OutcomeV4<'_> {
    /// The outcome, its resource named by `key` ([`OutcomeV3::with_key`]).
    pub fn with_key(self, key: &[u8]) -> Result<model::Outcome, String> {
        let name = outcome_name_in(key)?;
        let v2 = OutcomeV2 {
            v1: self.v3.named(name),
            undo: self.undo,
        };
        model::Outcome::try_from(v2).map_err(|e| e.to_string())
    }
}
