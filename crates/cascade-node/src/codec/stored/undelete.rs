//! The layout undelete (issue 29) appends: what makes an operation an
//! undelete ([`model::Undeletion`]: the deletion it takes back, its
//! counters, the regions still to finish). It wraps the budget's fourth
//! layout of the operation ([`OperationV4`]) and is written only for an
//! undelete, so every deletion keeps the bytes it always had. (The outcome
//! actions RESTORED and NOT_RESTORED and the UNDELETED event type are
//! variants appended to their enums: a record an older node wrote never
//! holds them, so it reads as it always did.)

use std::borrow::Cow;
use std::collections::BTreeSet;

use cascade_core::model;
use cascade_core::name::NameError;
use serde::{Deserialize, Serialize};

use super::{op, Id, OperationV4};

/// [`model::Undeletion`].
#[derive(Debug, Serialize, Deserialize)]
pub struct Undeletion<'a> {
    pub of: Id,
    pub restored: u64,
    pub not_restored: u64,
    pub regions_left: Cow<'a, BTreeSet<String>>,
}

/// [`model::Operation`], version 5 (see [`crate::codec::VERSION_POSTCARD_V5`]):
/// version 4's fields, then the undelete it is. Written only for an
/// undelete.
#[derive(Debug, Serialize, Deserialize)]
pub struct OperationV5<'a> {
    #[serde(borrow)]
    pub v4: OperationV4<'a>,
    #[serde(borrow)]
    pub undelete: Option<Undeletion<'a>>,
}

impl<'a> From<&'a model::Operation> for OperationV5<'a> {
    fn from(o: &'a model::Operation) -> Self {
        OperationV5 {
            v4: OperationV4::from(o),
            undelete: o.undelete.as_deref().map(|u| Undeletion {
                of: *u.of.0.as_bytes(),
                restored: u.restored,
                not_restored: u.not_restored,
                regions_left: Cow::Borrowed(&u.regions_left),
            }),
        }
    }
}

impl TryFrom<OperationV5<'_>> for model::Operation {
    type Error = NameError;
    fn try_from(o: OperationV5<'_>) -> Result<Self, NameError> {
        let mut operation = model::Operation::try_from(o.v4)?;
        operation.undelete = o.undelete.map(|u| {
            Box::new(model::Undeletion {
                of: op(u.of),
                restored: u.restored,
                not_restored: u.not_restored,
                regions_left: u.regions_left.into_owned(),
            })
        });
        Ok(operation)
    }
}
