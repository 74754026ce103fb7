//! The cross-region half of the protocol (seed 002's owner/importer flow).
//!
//! The **owner** of a resource keeps a back-reference row for every
//! referrer, local or remote. A remote referrer's region *attaches* the row
//! before its reference becomes live, and *releases* it once the reference
//! is gone (cascaded, unset, or dropped by an update). The owner purges a
//! deleting resource only when no row is left.
//!
//! The **importer** (the referrer's region) keeps a mirror of each row it
//! attached, keyed the same way (target uid first). When the owner's outbox
//! reports the target DELETING, the importer records a tombstone, and its
//! ordinary deletion work walks the mirror rows: cascade or unset each local
//! referrer and queue a durable release to the owner. The cursor of the
//! owner's outbox advances in the same step as those effects.
//!
//! Why nothing dangles or resurrects:
//! - The owner refuses to attach to a missing, DELETING or re-created
//!   target, so a new reference only lands on a live incarnation.
//! - An attach accepted just before the owner starts deleting is followed
//!   by the DELETING event; the tombstone it leaves makes the importer refuse
//!   to commit the new reference, and a reference committed before the event
//!   is cascaded or unset by it.
//! - A release carries the importer's generation; the owner ignores a
//!   release older than the row's attach (a late release of an earlier
//!   incarnation of the same reference).
//!
//! # Layout
//!
//! - `owner.rs`: the owner's half: attach, release, and which rows its
//!   periodic check asks an importer about.
//! - `importer.rs`: the importer's half: applying the owner's DELETING and
//!   PURGED events, resync after compaction, settling a CREATING resource,
//!   answering which rows still stand, acknowledged releases.
//! - here: the types both halves exchange, and a region's part of a dry run.

mod importer;
mod owner;
#[cfg(test)]
mod tests;

pub use importer::*;
pub use owner::*;

use crate::error::CoreError;
use crate::model::{BackRef, BackRefKey, RefTarget};
use crate::protocol::{self, Ctx, Plan};
use crate::state::{StateRead, Tx};
use crate::ResourceName;

/// A back-reference as one region asks another to attach or release it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerBackRef {
    /// The owner's resource referred to.
    pub target: RefTarget,
    /// The calling region's resource that holds the reference.
    pub referrer: RefTarget,
    /// The referrer's field.
    pub field: String,
    /// The referrer region's generation (see [`BackRef::generation`]).
    pub generation: u64,
}

impl PeerBackRef {
    /// The key of the row it names at the owner.
    pub fn key(&self) -> BackRefKey {
        BackRefKey {
            target: self.target.uid,
            referrer: self.referrer.uid,
            field: self.field.clone(),
        }
    }
}

impl From<BackRef> for PeerBackRef {
    /// The row as it is named to its referrer's region, with the generation
    /// the row was attached with.
    fn from(row: BackRef) -> Self {
        PeerBackRef {
            target: row.target,
            referrer: row.referrer,
            field: row.field,
            generation: row.generation,
        }
    }
}

/// Any region: the part of a delete's closure that starts from `seeds`
/// (resources of other regions being deleted that resources here reference).
pub fn plan_from<S: StateRead + ?Sized>(
    state: &S,
    ctx: Ctx<'_>,
    seeds: Vec<RefTarget>,
    cascade: bool,
    principal: Option<&crate::auth::Principal>,
) -> Result<Plan, CoreError> {
    protocol::plan_closure(&Tx::new(state), ctx, seeds, cascade, principal)
}

fn is_remote(ctx: Ctx<'_>, name: &ResourceName) -> bool {
    name.region() != ctx.region.as_str()
}
