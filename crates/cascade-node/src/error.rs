//! Why a node operation did not produce its value: one type for every
//! flow, converted into a gRPC status in one place (`api/mod.rs`).
//!
//! The protocol's refusals keep their [`CoreError`] (its class decides the
//! code: NOT_FOUND, FAILED_PRECONDITION with blockers, INVALID_ARGUMENT
//! with the field, ABORTED, UNAVAILABLE); storage and writer failures are
//! transient (UNAVAILABLE); what another region's node said or failed to
//! say keeps its classification, a [`RemoteError`] of the port for calls to
//! other regions (`crate::peers`).

use cascade_core::CoreError;

use crate::peers::RemoteError;
use crate::store::StoreError;

/// Why a node operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Fault {
    /// The protocol refused, or a region it needs is unavailable.
    #[error(transparent)]
    Refused(#[from] CoreError),
    /// The store could not be read or written.
    #[error(transparent)]
    Storage(#[from] StoreError),
    /// The writer is restarting or the node is stopping.
    #[error(transparent)]
    Writer(#[from] WriterUnavailable),
    /// Another region's node answered with an error, could not be asked,
    /// or gave an answer this node cannot read.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// The policy of this region (or of another region a cascade reaches)
    /// does not let the caller do this (PERMISSION_DENIED).
    #[error(transparent)]
    Denied(#[from] Denied),
    /// The caller sent more mutating calls than `[auth.rate]` allows
    /// (RESOURCE_EXHAUSTED, with the delay to retry after).
    #[error("{principal} is over its rate of mutating calls: retry in {} ms", retry_after.as_millis())]
    RateLimited {
        principal: String,
        retry_after: std::time::Duration,
    },
}

/// What the policy refused: one entry per member (a resource, or the
/// region for a call on the region as a whole), at most
/// [`Denied::MAX_MEMBERS`] of them, with how many more there were.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct Denied {
    /// The principal refused.
    pub principal: String,
    /// What it may not do, in the order found.
    pub members: Vec<DeniedMember>,
    /// Refused members beyond `members`.
    pub more: u64,
}

/// One refused member: which resource, where, and the verb that was missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeniedMember {
    /// The region whose policy refused.
    pub region: String,
    /// The resource's full name (empty for a call on a region as a whole).
    pub name: String,
    /// The verb the principal lacks.
    pub verb: cascade_core::auth::Verb,
    /// The rule that refused it (`default deny` when none permitted it).
    pub rule: String,
}

impl Denied {
    /// The most members a refusal lists (the rest are counted).
    pub const MAX_MEMBERS: usize = 100;

    /// `principal` may not do `verb` to `name` in `region`.
    pub fn one(principal: &str, region: &str, name: &str, verb: cascade_core::auth::Verb, rule: &str) -> Denied {
        Denied {
            principal: principal.to_owned(),
            members: vec![DeniedMember {
                region: region.to_owned(),
                name: name.to_owned(),
                verb,
                rule: rule.to_owned(),
            }],
            more: 0,
        }
    }

    /// The message a caller reads: the principal and the first members.
    fn describe(&self) -> String {
        const SHOWN: usize = 5;
        let listed: Vec<String> = self
            .members
            .iter()
            .take(SHOWN)
            .map(|m| {
                let what = if m.name.is_empty() {
                    format!("region {}", m.region)
                } else {
                    m.name.clone()
                };
                format!("{} on {what} (rule: {})", m.verb, m.rule)
            })
            .collect();
        let rest = (self.members.len().saturating_sub(SHOWN) as u64) + self.more;
        let more = if rest > 0 {
            format!(" and {rest} more")
        } else {
            String::new()
        };
        format!("{} may not: {}{more}", self.principal, listed.join("; "))
    }
}

/// The writer is not answering (restarting, or the node is shutting down).
#[derive(Debug, thiserror::Error)]
#[error("the node's writer is unavailable: {0}")]
pub struct WriterUnavailable(pub(crate) String);

/// A read through the core's `StateRead` over the store failed: the
/// storage is unavailable, as for any other step.
impl From<cascade_core::error::StorageError> for Fault {
    fn from(e: cascade_core::error::StorageError) -> Self {
        Fault::Refused(CoreError::Storage(e))
    }
}
