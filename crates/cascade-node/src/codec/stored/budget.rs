//! The layout operation budgets and controls (issue 29) append: an
//! operation's budget, rate, pause and cancel. It wraps soft delete's third
//! layout of the operation ([`OperationV3`], its retention) and is written
//! only for an operation that has controls, so every other operation keeps
//! the bytes it always had.

use std::borrow::Cow;

use cascade_core::model;
use cascade_core::name::NameError;
use cascade_core::Timestamp;
use serde::{Deserialize, Serialize};

use super::{string, OperationV3};

/// [`model::OperationControls`].
#[derive(Debug, Serialize, Deserialize)]
pub struct OperationControls<'a> {
    pub max_deletions: Option<u64>,
    pub admitted: u64,
    pub granted: u64,
    pub exhausted: Option<(u64, u64)>,
    pub rate_per_s: Option<u32>,
    pub rate_since: u64,
    pub rate_base: u64,
    pub paused: bool,
    pub cancelled: bool,
    #[serde(borrow)]
    pub by: Cow<'a, str>,
}

impl<'a> From<&'a model::OperationControls> for OperationControls<'a> {
    fn from(c: &'a model::OperationControls) -> Self {
        OperationControls {
            max_deletions: c.max_deletions,
            admitted: c.admitted,
            granted: c.granted,
            exhausted: c.exhausted,
            rate_per_s: c.rate_per_s,
            rate_since: c.rate_since.0,
            rate_base: c.rate_base,
            paused: c.paused,
            cancelled: c.cancelled,
            by: Cow::Borrowed(c.by.as_str()),
        }
    }
}

impl From<OperationControls<'_>> for model::OperationControls {
    fn from(c: OperationControls<'_>) -> Self {
        model::OperationControls {
            max_deletions: c.max_deletions,
            admitted: c.admitted,
            granted: c.granted,
            exhausted: c.exhausted,
            rate_per_s: c.rate_per_s,
            rate_since: Timestamp(c.rate_since),
            rate_base: c.rate_base,
            paused: c.paused,
            cancelled: c.cancelled,
            by: string(c.by),
        }
    }
}

/// [`model::Operation`], version 4 (see [`crate::codec::VERSION_POSTCARD_V4`]):
/// version 3's fields (soft delete's retention), then its controls (issue
/// 29: budget, rate, pause, cancel). Written only for an operation that has
/// controls.
#[derive(Debug, Serialize, Deserialize)]
pub struct OperationV4<'a> {
    #[serde(borrow)]
    pub v3: OperationV3<'a>,
    #[serde(borrow)]
    pub controls: Option<OperationControls<'a>>,
}

impl<'a> From<&'a model::Operation> for OperationV4<'a> {
    fn from(o: &'a model::Operation) -> Self {
        OperationV4 {
            v3: OperationV3::from(o),
            controls: o.controls.as_deref().map(OperationControls::from),
        }
    }
}

impl TryFrom<OperationV4<'_>> for model::Operation {
    type Error = NameError;
    fn try_from(o: OperationV4<'_>) -> Result<Self, NameError> {
        let mut operation = model::Operation::try_from(o.v3)?;
        operation.controls = o.controls.map(|c| Box::new(c.into()));
        Ok(operation)
    }
}
