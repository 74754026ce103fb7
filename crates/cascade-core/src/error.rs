//! Errors of the protocol, each with the status class a client acts on.

use crate::model::Blocker;
use crate::name::{NameError, ResourceName};

/// The status class of an error, independent of any transport. The proto
/// crate maps it to a `tonic::Code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The request itself is malformed; retrying it unchanged cannot succeed.
    InvalidArgument,
    /// The named resource, reference target or operation does not exist.
    NotFound,
    /// A create named a resource that exists (possibly still DELETING).
    AlreadyExists,
    /// The request is well-formed but the state refuses it (a DELETING
    /// target, live blockers or dependents, an owner's refusal); it may
    /// succeed once the state changes.
    FailedPrecondition,
    /// An optimistic-concurrency check failed (an etag; a plan token whose
    /// closure changed): re-read (plan again) and retry.
    Aborted,
    /// Storage or a peer region could not be reached; the same request may
    /// succeed later.
    Unavailable,
    /// The caller's own deadline left no time for a call to another region
    /// the request needed; retry with a longer one.
    DeadlineExceeded,
    /// A bug: the node broke one of the core's preconditions.
    Internal,
}

/// A resource that keeps a delete from being accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependent {
    /// The resource holding the reference.
    pub referrer: ResourceName,
    /// The referrer's reference field that points at the deleted resource.
    pub field: String,
    /// That field's `on_delete`: `block` refuses any delete, `cascade`
    /// refuses a delete without `cascade`.
    pub on_delete: crate::schema::OnDelete,
}

/// A failure of the storage under the protocol (read or decode).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("storage: {0}")]
pub struct StorageError(pub String);

/// Why a protocol step refused or failed; [`CoreError::code`] gives the
/// status class a client acts on, and the message names what is at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// A resource or region name does not parse.
    #[error(transparent)]
    InvalidName(#[from] NameError),
    /// A request field is wrong; `field` names it.
    #[error("{field}: {message}")]
    InvalidArgument {
        /// The request field at fault (`refs.ports[1]`, `resources[0].name`).
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// The resource a request names does not exist (or is CREATING, which
    /// reads as absent).
    #[error("{0} not found")]
    NotFound(ResourceName),
    /// A soft-deleted resource (DELETED, kept until `expire_time`): a Get
    /// answers NOT_FOUND (`exists` false) and a create of its name
    /// ALREADY_EXISTS (`exists` true, the name stays reserved), both with
    /// when it expires and the operation that deleted it.
    #[error("{}", soft_deleted_message(.name, .expire_time, .operation, .exists))]
    SoftDeleted {
        /// The resource's name.
        name: ResourceName,
        /// Its uid (the buried incarnation).
        uid: crate::name::Uid,
        /// When it is purged.
        expire_time: crate::model::Timestamp,
        /// The operation that deleted it.
        operation: crate::name::OperationId,
        /// A create of the name (ALREADY_EXISTS) rather than a read of it
        /// (NOT_FOUND).
        exists: bool,
    },
    /// A create of a name that is taken.
    #[error("{name} already exists{detail}")]
    AlreadyExists {
        /// The name asked for.
        name: ResourceName,
        /// Empty, or why the name is not free yet (it is being deleted).
        detail: &'static str,
    },
    /// A reference (or a create under a parent) to a target being deleted.
    #[error("{field}: {target} is being deleted")]
    TargetDeleting {
        /// The reference field (or `parent`) naming the target.
        field: String,
        /// The DELETING target.
        target: ResourceName,
    },
    /// A reference to a resource that does not exist.
    #[error("{field}: target {target} not found")]
    TargetNotFound {
        /// The reference field naming the target.
        field: String,
        /// The missing target.
        target: ResourceName,
    },
    /// The message states what is known: the target's uid is not the one
    /// pinned. Whether the pinned uid was an earlier incarnation of the name
    /// (re-created) or was never this resource's is not known here (a purged
    /// uid leaves no record), so the message does not guess.
    #[error("{field}: {target} has uid {actual}, not {expected}")]
    TargetUidMismatch {
        /// The reference field that pins the uid.
        field: String,
        /// The target name, whose current uid differs.
        target: ResourceName,
        /// The uid the request pinned.
        expected: String,
        /// The uid the target has now.
        actual: String,
    },
    /// An update of a DELETING resource that does more than remove
    /// finalizers: a resource being deleted can no longer change.
    #[error("{name} is being deleted")]
    Deleting {
        /// The DELETING resource.
        name: ResourceName,
    },
    /// The request's etag precondition does not match the stored resource.
    #[error("etag mismatch on {name}: expected {expected}, current {actual}")]
    EtagMismatch {
        /// The resource whose etag was checked.
        name: ResourceName,
        /// The etag the request expected.
        expected: String,
        /// The resource's current etag.
        actual: String,
    },
    /// A delete refused because of live references; lists them.
    #[error("{}", describe_refusal(.name, .blockers, .dependents, *.more))]
    DeleteRefused {
        /// The resource the delete named.
        name: ResourceName,
        /// Live `block` referrers: no delete is accepted while they stand.
        blockers: Vec<Dependent>,
        /// `cascade` referrers a delete without `cascade` would have to
        /// delete.
        dependents: Vec<Dependent>,
        /// How many more were found than are listed.
        more: usize,
    },
    /// A user delete of a resource that holds liens; lists them.
    #[error("cannot delete {name}: {}", describe_liens(.liens))]
    Liened {
        /// The protected resource.
        name: ResourceName,
        /// Every lien it holds, with its reason.
        liens: Vec<crate::model::Lien>,
    },
    /// RemoveLien named a lien the resource does not hold.
    #[error("{name} holds no lien {id}")]
    LienNotFound {
        /// The resource.
        name: ResourceName,
        /// The lien id asked for.
        id: String,
    },
    /// AddLien with the id of a lien the resource holds for another reason.
    #[error("{name} already holds lien {id} (reason: {reason})")]
    LienExists {
        /// The resource.
        name: ResourceName,
        /// The lien id.
        id: String,
        /// The reason the existing lien was placed for.
        reason: String,
    },
    /// ReportFinalizerFailure named a finalizer the resource does not list
    /// (its controller removed it, or never was its controller).
    #[error("{name} has no finalizer {finalizer}")]
    FinalizerNotFound {
        /// The resource.
        name: ResourceName,
        /// The finalizer asked for.
        finalizer: String,
    },
    /// A request about a deletion (a finalizer failure, an admin retry)
    /// named a resource that is not in the state it needs: not being
    /// deleted at all, or (a retry) a deletion that has not failed.
    #[error("{name} {why}")]
    NoSuchDeletion {
        /// The resource.
        name: ResourceName,
        /// What it is instead ("is not being deleted", "has not failed: BLOCKED").
        why: String,
    },
    /// ForcePurge of a deletion younger than the configured threshold,
    /// without `force`.
    #[error(
        "{name} has been deleting for {}, less than the {} after which a deletion may be force-purged \
         (pass --force, ForcePurgeRequest.force, to override)",
        crate::time_text::duration(*age_ms),
        crate::time_text::duration(*threshold_ms)
    )]
    ForceTooEarly {
        /// The resource.
        name: ResourceName,
        /// How long it has been DELETING.
        age_ms: u64,
        /// The configured threshold.
        threshold_ms: u64,
    },
    /// ForcePurge of a deletion that a `block` referrer in another region
    /// holds, while that region speaks a protocol version that does not
    /// apply a forced deletion (or has not said which it speaks): it would
    /// keep the reference, and the forced deletion would wait for it for
    /// ever. The node decides this; the protocol never sees versions.
    #[error(
        "{name} cannot be forced through now: {referrer} holds it (block) in region {region}, which {why}; \
         upgrade that region and force again, or remove the reference"
    )]
    ForceNeedsNewerRegion {
        /// The resource.
        name: ResourceName,
        /// The region that would not apply it.
        region: String,
        /// One of its `block` referrers (or, past the rows read, "one of
        /// the N+ block referrers").
        referrer: String,
        /// Which version it speaks ("speaks protocol version 1, ...").
        why: String,
    },
    /// A forced purge (Admin.Purge) matched more resources than one purge
    /// may delete (`[limits] max_purge_members`), or its scan of a region
    /// stopped at `[limits] purge_scan` rows before it could count them all.
    /// Nothing was started.
    #[error("{}", describe_purge_too_large(*.matched, *.at_least, *.max))]
    PurgeTooLarge {
        /// The resources counted.
        matched: u64,
        /// The count is a lower bound: a scan stopped at its limit.
        at_least: bool,
        /// The most one purge may delete.
        max: u64,
    },
    /// A step was asked to act on a resource another region owns (the node
    /// forwards such requests; the core only acts on its own region).
    #[error("{name} belongs to region {region}, this node serves {local}")]
    WrongRegion {
        /// The resource named.
        name: ResourceName,
        /// The region that owns it.
        region: String,
        /// The region this step runs in.
        local: String,
    },
    /// A cross-region target reached the core without its uid (the node
    /// resolves it at the owner first).
    #[error("{field}: cross-region reference to {target} was not resolved at its owner")]
    RemoteReference {
        /// The reference field.
        field: String,
        /// The unresolved cross-region target.
        target: ResourceName,
    },
    /// A cross-region create that could not complete: the owner refused the
    /// attach, or a target was deleted meanwhile.
    #[error("create of {name} was aborted: {reason}")]
    CreateAborted {
        /// The resource whose create was given up.
        name: ResourceName,
        /// Why (the owner's refusal, or the target that went away).
        reason: String,
    },
    /// A create met an earlier create of the same name that is not
    /// settled yet (CREATING: its references into other regions are not
    /// confirmed). Invisible to reads, so not ALREADY_EXISTS: the node
    /// finishes that create first and then tries again (ALREADY_EXISTS if
    /// it became ACTIVE, which a Get now returns; a fresh create if it was
    /// refused), and a client hears this only when the owners of its
    /// references cannot be asked now.
    #[error("an earlier create of {name} is not confirmed yet: its references wait for their owners; retry")]
    CreateUnsettled {
        /// The name asked for.
        name: ResourceName,
        /// The unsettled resource's uid.
        uid: crate::name::Uid,
    },
    /// The owner of a referenced resource refused to record the reference.
    #[error("region {region} refused the reference: {reason}")]
    AttachRefused {
        /// The owner region that refused.
        region: String,
        /// The owner's reason.
        reason: String,
    },
    /// A reference that crosses regions whose schemas differ (a rolling
    /// schema change under way): `region` does not know a kind or a
    /// reference field the request needs. Refused before anything is
    /// written, and FAILED_PRECONDITION rather than INVALID_ARGUMENT: the
    /// same request succeeds once that region reloads its schema.
    #[error(
        "region {region:?} does not know {what} yet{}; reload its schema, then retry",
        version_note(version)
    )]
    SchemaUnknown {
        /// The region whose schema lacks it.
        region: String,
        /// What it lacks: `kind "volume"`, `reference field volume.project`.
        what: String,
        /// That region's schema version (digest and label), filled in by
        /// the node that answers (the core does not compute digests);
        /// empty when unknown.
        version: String,
    },
    /// A peer region could not be reached.
    #[error("region {region} is unavailable: {reason}")]
    RegionUnavailable {
        /// The region that did not answer.
        region: String,
        /// The transport failure or timeout, as the node saw it.
        reason: String,
    },
    /// The caller's deadline ran out before `region` answered `call` (or
    /// left no time to ask it): the request gave up there, as a client's
    /// deadline asks, instead of waiting out the node's own bound on a
    /// call to another region. What the request had written for it is
    /// undone in the same way as when the region is unavailable.
    #[error("the caller's deadline passed before region {region} answered {call}")]
    DeadlineExceeded {
        /// The region that was asked, or about to be.
        region: String,
        /// The call to it (`Attach`, `Lookup`, …).
        call: String,
    },
    /// A control of a running operation (pause, resume, cancel, a budget)
    /// that its state refuses: it ended, was cancelled, has no budget.
    #[error("operation {id} {why}")]
    OperationControl {
        /// The operation.
        id: String,
        /// Why, for a human.
        why: String,
    },
    /// No region knows an operation with this id.
    #[error("operation {0} not found")]
    OperationNotFound(String),
    /// A delete bound to a plan (`expect_plan`, the token of a dry run)
    /// whose closure, walked again just before the delete, is not that
    /// plan: nothing was changed. Names what was added and removed, as far
    /// as the node still holds the plan's members.
    #[error("{}", describe_plan_change(.name, .expected, .why, .diff))]
    PlanChanged {
        /// The resource the delete named.
        name: ResourceName,
        /// The token the delete expected, quoted (a short prefix).
        expected: String,
        /// Why it does not match, in words ("2 members added, 1 removed").
        why: String,
        /// The members added and removed (bounded; boxed: most errors
        /// are small, and every `Result` of the core carries the largest).
        diff: Box<crate::plan::PlanDiff>,
        /// The members the closure has now.
        members: u64,
    },
    /// A cascade larger than the node's `[limits] confirm_above`, asked
    /// without a plan token: it must be confirmed by one.
    #[error(
        "{name}: this cascade changes {}{members} resources, more than this node's [limits] confirm_above = \
         {confirm_above}: confirm it with its plan: run the dry run (cascade delete {name} --cascade --dry-run; \
         DeleteRequest.dry_run) and delete with its token (--expect-plan TOKEN; DeleteRequest.expect_plan)",
        if *.at_least { "at least " } else { "" }
    )]
    PlanRequired {
        /// The resource the delete named.
        name: ResourceName,
        /// The members the walk found (resources deleted or unset).
        members: u64,
        /// The walk stopped at its bound: there are more.
        at_least: bool,
        /// The node's threshold.
        confirm_above: u64,
    },
    /// The state under the step could not be read or decoded.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

fn describe_purge_too_large(matched: u64, at_least: bool, max: u64) -> String {
    let count = if at_least {
        format!(
            "at least {matched} resources (a region's scan stopped at [limits] purge_scan rows before it could count \
             them all)"
        )
    } else {
        format!("{matched} resources")
    };
    format!(
        "the purge matches {count}, more than the {max} one purge may delete ([limits] max_purge_members): \
         narrow the filter (kind, name_prefix, attribute_selector, region, older_than) or raise the limit; \
         nothing was started"
    )
}

/// The liens of a resource for a human: `held by lien L (reason), ...`.
pub fn describe_liens(liens: &[crate::model::Lien]) -> String {
    let listed: Vec<String> = liens
        .iter()
        .map(|l| format!("held by lien {} ({})", l.id, l.reason))
        .collect();
    listed.join(", ")
}

/// A changed plan for a human: what differs, then at most a few members
/// each way (the details list more), and what to do.
fn describe_plan_change(name: &ResourceName, expected: &str, why: &str, diff: &crate::plan::PlanDiff) -> String {
    const SHOWN: usize = 5;
    let (added, removed, more) = (&diff.added, &diff.removed, diff.more);
    let list = |items: &[crate::plan::PlanMember]| {
        items
            .iter()
            .take(SHOWN)
            .map(|m| format!("{} ({})", m.name, m.action))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut msg = format!("the closure of {name} is not plan {expected} any more ({why})");
    if !added.is_empty() {
        msg += &format!("; added: {}", list(added));
    }
    if !removed.is_empty() {
        msg += &format!("; removed: {}", list(removed));
    }
    let unnamed = more + (added.len().saturating_sub(SHOWN) + removed.len().saturating_sub(SHOWN)) as u64;
    if unnamed > 0 {
        msg += &format!(" (and {unnamed} more)");
    }
    msg + "; nothing was changed: run the dry run again and delete with its new token"
}

fn describe_refusal(name: &ResourceName, blockers: &[Dependent], dependents: &[Dependent], more: usize) -> String {
    let list = |items: &[Dependent]| {
        items
            .iter()
            .map(|d| format!("{} (field {}, {})", d.referrer, d.field, d.on_delete))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut msg = format!("cannot delete {name}: ");
    if !blockers.is_empty() {
        msg += &format!("blocked by {}", list(blockers));
    }
    if !dependents.is_empty() {
        if !blockers.is_empty() {
            msg += "; ";
        }
        msg += &format!(
            "it has dependents that would be deleted, pass --cascade (DeleteRequest.cascade) to delete them: {}",
            list(dependents)
        );
    }
    if more > 0 {
        msg += &format!(" (and {more} more)");
    }
    msg
}

impl CoreError {
    /// The status class of this error (the proto crate turns it into a
    /// gRPC code; README's "Error codes" is the contract).
    pub fn code(&self) -> ErrorCode {
        match self {
            CoreError::InvalidName(_) | CoreError::InvalidArgument { .. } | CoreError::WrongRegion { .. } => {
                ErrorCode::InvalidArgument
            }
            CoreError::NotFound(_)
            | CoreError::TargetNotFound { .. }
            | CoreError::OperationNotFound(_)
            | CoreError::LienNotFound { .. }
            | CoreError::FinalizerNotFound { .. } => ErrorCode::NotFound,
            CoreError::AlreadyExists { .. } | CoreError::LienExists { .. } => ErrorCode::AlreadyExists,
            CoreError::SoftDeleted { exists: true, .. } => ErrorCode::AlreadyExists,
            CoreError::SoftDeleted { exists: false, .. } => ErrorCode::NotFound,
            CoreError::TargetDeleting { .. }
            | CoreError::TargetUidMismatch { .. }
            | CoreError::Deleting { .. }
            | CoreError::DeleteRefused { .. }
            | CoreError::Liened { .. }
            | CoreError::NoSuchDeletion { .. }
            | CoreError::ForceTooEarly { .. }
            | CoreError::ForceNeedsNewerRegion { .. }
            | CoreError::PurgeTooLarge { .. }
            | CoreError::CreateAborted { .. }
            | CoreError::PlanRequired { .. }
            | CoreError::AttachRefused { .. }
            | CoreError::SchemaUnknown { .. }
            | CoreError::OperationControl { .. } => ErrorCode::FailedPrecondition,
            CoreError::RemoteReference { .. } => ErrorCode::Internal,
            CoreError::RegionUnavailable { .. } | CoreError::CreateUnsettled { .. } => ErrorCode::Unavailable,
            CoreError::DeadlineExceeded { .. } => ErrorCode::DeadlineExceeded,
            CoreError::EtagMismatch { .. } | CoreError::PlanChanged { .. } => ErrorCode::Aborted,
            CoreError::Storage(_) => ErrorCode::Unavailable,
        }
    }

    /// The [`CoreError::SchemaUnknown`] whose message another region's node
    /// sent as `message` (its Peer.Attach refusal), to pass it on in the
    /// same terms rather than wrapped as a refused attach; None when the
    /// message is not one (a node of another version), and the caller
    /// keeps the refusal as it came.
    pub fn schema_unknown_from(region: &str, message: &str) -> Option<CoreError> {
        let rest = message.strip_prefix(&format!("region {region:?} does not know "))?;
        let rest = rest.strip_suffix("; reload its schema, then retry")?;
        let (what, version) = match rest.split_once(" yet (its schema version ") {
            Some((what, version)) => (what, version.strip_suffix(')')?),
            None => (rest.strip_suffix(" yet")?, ""),
        };
        Some(CoreError::SchemaUnknown {
            region: region.to_owned(),
            what: what.to_owned(),
            version: version.to_owned(),
        })
    }

    /// An [`CoreError::InvalidArgument`] naming the request `field` at fault.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        CoreError::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// [`CoreError::SchemaUnknown`]'s note of the region's schema version.
fn version_note(version: &str) -> String {
    if version.is_empty() {
        String::new()
    } else {
        format!(" (its schema version {version})")
    }
}

/// [`CoreError::SoftDeleted`]'s message: what was asked of the name, until
/// when it is kept, and what a caller can do.
fn soft_deleted_message(
    name: &ResourceName,
    expire_time: &crate::model::Timestamp,
    operation: &crate::name::OperationId,
    exists: &bool,
) -> String {
    let until = crate::time_text::rfc3339(*expire_time);
    if *exists {
        format!(
            "{name} already exists: soft-deleted by operation {operation} until {until}; \
             the name is free again once it is purged"
        )
    } else {
        format!(
            "{name} not found: soft-deleted by operation {operation} until {until} \
             (Get and List with show_deleted show it)"
        )
    }
}

/// The first [`crate::limits::MAX_REFUSALS_NAMED`] refusals, and how many more there were:
/// one message per referrer a step passed would fill a stored record.
pub fn name_refusals(refusals: &[String]) -> String {
    let mut named = refusals
        .iter()
        .take(crate::limits::MAX_REFUSALS_NAMED)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join("; ");
    if let Some(more) = refusals
        .len()
        .checked_sub(crate::limits::MAX_REFUSALS_NAMED)
        .filter(|&more| more > 0)
    {
        named.push_str(&format!("; and {more} more refused"));
    }
    named
}

/// The human-readable reason of a [`crate::model::DeletionStatus::Blocked`]
/// deletion: each blocker with its field, and whether it is itself being
/// deleted (so will go away) or live (stuck until someone acts).
pub fn describe_blockers(blockers: &[Blocker]) -> String {
    blockers
        .iter()
        .map(|b| {
            let state = if b.referrer_deleting {
                "itself being deleted"
            } else {
                "live, not being deleted: stuck until it is deleted or changed"
            };
            format!("blocked by {} (field {}, {state})", b.referrer, b.field)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_reason_names_the_first_refusals_and_counts_the_rest() {
        let refusals: Vec<String> = (0..1000).map(|i| format!("may not update r/port/p{i}")).collect();
        let named = name_refusals(&refusals);
        assert!(
            named.starts_with("may not update r/port/p0; may not update r/port/p1"),
            "{named}"
        );
        assert!(
            named.ends_with(&format!(
                "; and {} more refused",
                1000 - crate::limits::MAX_REFUSALS_NAMED
            )),
            "{named}"
        );
        assert!(!named.contains("r/port/p4;"), "{named}");
        assert!(named.len() < crate::limits::MAX_REASON_BYTES, "{} bytes", named.len());
        assert_eq!(
            name_refusals(&refusals[..2]),
            "may not update r/port/p0; may not update r/port/p1"
        );
        assert_eq!(
            name_refusals(&refusals[..crate::limits::MAX_REFUSALS_NAMED])
                .matches("; ")
                .count(),
            3
        );
    }

    use super::*;

    /// A node passes another region's schema refusal on in the same words
    /// and class, with or without that region's version; anything else is
    /// not taken for one.
    #[test]
    fn a_schema_unknown_refusal_reads_back_from_its_message() {
        for version in ["b80f49131c008885 \"volumes\"", ""] {
            let sent = CoreError::SchemaUnknown {
                region: "ap-south".into(),
                what: "reference field \"volume.project\"".into(),
                version: version.into(),
            };
            let read = CoreError::schema_unknown_from("ap-south", &sent.to_string());
            assert_eq!(read.as_ref(), Some(&sent), "{sent}");
        }
        let other = CoreError::schema_unknown_from(
            "ap-south",
            "backrefs[0].field: kind \"volume\" has no tracked reference",
        );
        assert_eq!(other, None);
        let elsewhere = CoreError::SchemaUnknown {
            region: "us-east".into(),
            what: "kind \"volume\"".into(),
            version: String::new(),
        };
        assert_eq!(CoreError::schema_unknown_from("ap-south", &elsewhere.to_string()), None);
    }
}
