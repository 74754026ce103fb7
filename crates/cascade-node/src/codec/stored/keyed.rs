//! The layouts of a resource's row without its name (issue 28, P4): the
//! resources table is keyed by the name, so the row need not hold it too,
//! and reads it back from the key ([`ResourceV4::with_key`]), as a
//! back-reference row does its uids ([`super::BackRefV2`]). The name was
//! 19 bytes of each row of a P1 population (its length and
//! `{region}/{kind}/{id}`), 18 MB of a million resources on the memory
//! engine (docs/BENCHMARKS.md, "P4: a resource's row without its name").
//!
//! Two layouts, so that neither costs a byte over the other's need:
//! version 4 is version 1 without the name (a resource with no lien and
//! no window: nearly every one), version 5 wraps it with the liens and the
//! window (versions 2 and 3's appendices). A resource encoded on its own,
//! without a key, keeps versions 1 to 3 (`codec/records.rs`).

use std::borrow::Cow;
use std::collections::BTreeMap;

use cascade_core::model;
use serde::{Deserialize, Serialize};

use super::{liens_from, liens_to, Id, Lien, Refs, Resource, ResourceState, SoftDeletion};

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

impl ResourceV4<'_> {
    /// The resource, named by `key` (its row's key: the name's bytes). A
    /// key that is not a name is an error quoting (a prefix of) it.
    pub fn with_key(self, key: &[u8]) -> Result<model::Resource, String> {
        let name = std::str::from_utf8(key).map_err(|e| {
            format!(
                "the key {} is not a resource name: {e}",
                cascade_core::limits::quote(&String::from_utf8_lossy(key))
            )
        })?;
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
