//! Core errors ↔ gRPC statuses a client can act on.
//!
//! Every refusal carries a [`v1::ErrorDetails`] in the status details, whose
//! `reason` names the condition (one per row of README's "Error codes"
//! table), `field` the request field at fault, `resource` the resource it is
//! about and `region` the region it concerns. The same condition gets the
//! same code and details whichever node answers: forwarded calls pass the
//! owner's status through, and a node resolving a cross-region reference
//! rebuilds the owner's refusal in its own client's terms.
//!
//! | condition | gRPC code | `ErrorDetails` |
//! |---|---|---|
//! | malformed request field (InvalidArgument, WrongRegion) | INVALID_ARGUMENT | `INVALID_FIELD`, `field` |
//! | undecodable request bytes ([`crate::codec`]) | INVALID_ARGUMENT | none; the message says why |
//! | unknown resource or operation | NOT_FOUND | `NOT_FOUND`, `resource` (and `field` for a reference target) |
//! | name taken | ALREADY_EXISTS | `ALREADY_EXISTS`, `resource` |
//! | name of a soft-deleted resource (create); Get of one without `show_deleted` | ALREADY_EXISTS; NOT_FOUND | `SOFT_DELETED`, `resource` (with its uid), `expire_time_ms` |
//! | reference to a DELETING target; update of a DELETING resource | FAILED_PRECONDITION | `DELETING`, `resource` (and `field`) |
//! | reference pinned to a uid the target does not have | FAILED_PRECONDITION | `UID_MISMATCH`, `field`, `resource` (current uid) |
//! | delete refused by blockers or dependents | FAILED_PRECONDITION | `REFERENCED`, `blockers`, `dependents`, `more` |
//! | attach refused by the owner; create aborted | FAILED_PRECONDITION | `REFUSED`, `region` or `resource` |
//! | a reference across regions whose schemas differ: `region` does not know its kind or field yet | FAILED_PRECONDITION | `SCHEMA_UNKNOWN`, `region` |
//! | delete of a resource that holds liens | FAILED_PRECONDITION | `LIENED`, `resource`, `liens` |
//! | RemoveLien of a lien not held / AddLien of a held id with another reason | NOT_FOUND / ALREADY_EXISTS | `LIEN`, `field` = `lien_id`, `resource` |
//! | ReportFinalizerFailure of a finalizer not listed | NOT_FOUND | `FINALIZER`, `field` = `finalizer`, `resource` |
//! | finalizer failure for a resource not DELETING; RetryDeletion of a deletion not FAILED | FAILED_PRECONDITION | `NOT_DELETING`, `resource` |
//! | ForcePurge of a deletion younger than the threshold, without force | FAILED_PRECONDITION | `TOO_EARLY`, `field` = `force`, `resource` |
//! | Pause/Resume/CancelOperation or ExtendBudget of an operation that ended, was cancelled, or has no budget; Undelete of a deletion still running | FAILED_PRECONDITION | `REFUSED` |
//! | etag mismatch | ABORTED | `ETAG_MISMATCH`, `resource` |
//! | plan-bound delete whose closure changed since its dry run | ABORTED | `PLAN_CHANGED`, `resource`, `field` = `expect_plan`, `plan_changes`, `more`, `plan_members` |
//! | cascade above `[limits] confirm_above` without a plan token | FAILED_PRECONDITION | `PLAN_REQUIRED`, `resource`, `field` = `expect_plan`, `plan_members` |
//! | owner region unreachable or timing out | UNAVAILABLE | `REGION_UNAVAILABLE`, `region` |
//! | the caller's deadline ran out waiting for (or before asking) a region its request needed | DEADLINE_EXCEEDED | `REGION_UNAVAILABLE`, `region` |
//! | storage or writer down | UNAVAILABLE | `STORAGE_UNAVAILABLE` |
//! | message over the size limit (the node's server layer) | RESOURCE_EXHAUSTED | none |
//! | watch below the compaction floor, fresh or overtaken (`cascade-node`'s stream; [`compacted`]) | OUT_OF_RANGE | `COMPACTED`, `resume_revision` |
//! | peer call without / with another region's certificate | UNAUTHENTICATED / PERMISSION_DENIED | none |

use cascade_core::limits::cut_stored;
use cascade_core::{CoreError, ErrorCode, ResourceName};
use prost::Message;
use tonic::{Code, Status};

use crate::v1;
use crate::v1::ErrorReason;

/// The gRPC code of a core status class (the module table's second column).
pub fn code_of(code: ErrorCode) -> Code {
    match code {
        ErrorCode::InvalidArgument => Code::InvalidArgument,
        ErrorCode::NotFound => Code::NotFound,
        ErrorCode::AlreadyExists => Code::AlreadyExists,
        ErrorCode::FailedPrecondition => Code::FailedPrecondition,
        ErrorCode::Aborted => Code::Aborted,
        ErrorCode::Unavailable => Code::Unavailable,
        ErrorCode::DeadlineExceeded => Code::DeadlineExceeded,
        ErrorCode::Internal => Code::Internal,
    }
}

fn dependents(list: &[cascade_core::error::Dependent]) -> Vec<v1::Dependent> {
    list.iter()
        .map(|d| v1::Dependent {
            referrer: d.referrer.to_string(),
            field: d.field.clone(),
            on_delete: d.on_delete.to_string(),
        })
        .collect()
}

/// A resource named in the details (its uid only when the error knows it).
fn named(name: &ResourceName, uid: &str) -> Option<v1::ObjectRef> {
    Some(v1::ObjectRef {
        name: name.to_string(),
        uid: uid.to_owned(),
        dangling: false,
    })
}

/// The structured details of a core error.
pub fn details_of(err: &CoreError) -> v1::ErrorDetails {
    let with = |reason: ErrorReason| v1::ErrorDetails {
        reason: reason as i32,
        ..Default::default()
    };
    match err {
        CoreError::InvalidName(_) => with(ErrorReason::InvalidField),
        CoreError::InvalidArgument { field, .. } => v1::ErrorDetails {
            field: field.clone(),
            ..with(ErrorReason::InvalidField)
        },
        CoreError::WrongRegion { .. } => v1::ErrorDetails {
            field: "name".into(),
            ..with(ErrorReason::InvalidField)
        },
        CoreError::NotFound(name) => v1::ErrorDetails {
            resource: named(name, ""),
            ..with(ErrorReason::NotFound)
        },
        CoreError::OperationNotFound(_) => with(ErrorReason::NotFound),
        CoreError::SoftDeleted {
            name, uid, expire_time, ..
        } => v1::ErrorDetails {
            resource: named(name, &uid.to_string()),
            expire_time_ms: crate::convert::ms(*expire_time),
            ..with(ErrorReason::SoftDeleted)
        },
        CoreError::AlreadyExists { name, .. } => v1::ErrorDetails {
            resource: named(name, ""),
            ..with(ErrorReason::AlreadyExists)
        },
        CoreError::TargetDeleting { field, target } => v1::ErrorDetails {
            field: field.clone(),
            resource: named(target, ""),
            ..with(ErrorReason::Deleting)
        },
        CoreError::TargetNotFound { field, target } => v1::ErrorDetails {
            field: field.clone(),
            resource: named(target, ""),
            ..with(ErrorReason::NotFound)
        },
        CoreError::TargetUidMismatch {
            field, target, actual, ..
        } => v1::ErrorDetails {
            field: field.clone(),
            resource: named(target, actual),
            ..with(ErrorReason::UidMismatch)
        },
        CoreError::Deleting { name } => v1::ErrorDetails {
            resource: named(name, ""),
            ..with(ErrorReason::Deleting)
        },
        CoreError::EtagMismatch { name, .. } => v1::ErrorDetails {
            resource: named(name, ""),
            ..with(ErrorReason::EtagMismatch)
        },
        CoreError::DeleteRefused {
            name,
            blockers,
            dependents: deps,
            more,
        } => v1::ErrorDetails {
            blockers: dependents(blockers),
            dependents: dependents(deps),
            more: *more as u64,
            resource: named(name, ""),
            ..with(ErrorReason::Referenced)
        },
        CoreError::Liened { name, liens } => v1::ErrorDetails {
            resource: named(name, ""),
            liens: liens.iter().map(crate::convert::lien).collect(),
            ..with(ErrorReason::Liened)
        },
        CoreError::LienNotFound { name, .. } | CoreError::LienExists { name, .. } => v1::ErrorDetails {
            field: "lien_id".into(),
            resource: named(name, ""),
            ..with(ErrorReason::Lien)
        },
        CoreError::FinalizerNotFound { name, .. } => v1::ErrorDetails {
            field: "finalizer".into(),
            resource: named(name, ""),
            ..with(ErrorReason::Finalizer)
        },
        CoreError::NoSuchDeletion { name, .. } => v1::ErrorDetails {
            resource: named(name, ""),
            ..with(ErrorReason::NotDeleting)
        },
        CoreError::ForceTooEarly { name, .. } => v1::ErrorDetails {
            resource: named(name, ""),
            field: "force".into(),
            ..with(ErrorReason::TooEarly)
        },
        CoreError::ForceNeedsNewerRegion { name, region, .. } => v1::ErrorDetails {
            resource: named(name, ""),
            region: region.clone(),
            ..with(ErrorReason::Refused)
        },
        CoreError::PurgeTooLarge { .. } => with(ErrorReason::Refused),
        CoreError::RemoteReference { field, target } => v1::ErrorDetails {
            field: field.clone(),
            resource: named(target, ""),
            ..Default::default()
        },
        CoreError::CreateAborted { name, .. } => v1::ErrorDetails {
            resource: named(name, ""),
            ..with(ErrorReason::Refused)
        },
        CoreError::CreateUnsettled { name, uid } => v1::ErrorDetails {
            resource: named(name, &uid.to_string()),
            ..with(ErrorReason::Unsettled)
        },
        CoreError::AttachRefused { region, .. } => v1::ErrorDetails {
            region: region.clone(),
            ..with(ErrorReason::Refused)
        },
        CoreError::SchemaUnknown { region, .. } => v1::ErrorDetails {
            region: region.clone(),
            ..with(ErrorReason::SchemaUnknown)
        },
        CoreError::RegionUnavailable { region, .. } | CoreError::DeadlineExceeded { region, .. } => v1::ErrorDetails {
            region: region.clone(),
            ..with(ErrorReason::RegionUnavailable)
        },
        CoreError::Storage(_) => with(ErrorReason::StorageUnavailable),
        CoreError::OperationControl { .. } => with(ErrorReason::Refused),
        CoreError::PlanChanged {
            name, diff, members, ..
        } => v1::ErrorDetails {
            resource: named(name, ""),
            field: "expect_plan".into(),
            plan_changes: diff
                .added
                .iter()
                .map(|m| plan_change(m, true))
                .chain(diff.removed.iter().map(|m| plan_change(m, false)))
                .collect(),
            more: diff.more,
            plan_members: *members,
            ..with(ErrorReason::PlanChanged)
        },
        CoreError::PlanRequired { name, members, .. } => v1::ErrorDetails {
            resource: named(name, ""),
            field: "expect_plan".into(),
            plan_members: *members,
            ..with(ErrorReason::PlanRequired)
        },
    }
}

/// A member of a changed plan, as `ErrorDetails.plan_changes` lists it.
fn plan_change(m: &cascade_core::plan::PlanMember, added: bool) -> v1::PlanChange {
    v1::PlanChange {
        region: m.region.clone(),
        name: m.name.to_string(),
        uid: m.uid.to_string(),
        action: m.action.to_string(),
        added,
    }
}

/// The status for a core error, with structured details where a client can use them.
pub fn status_from_core(err: &CoreError) -> Status {
    let mut details = details_of(err);
    let mut message = err.to_string();
    if err.code() == ErrorCode::InvalidArgument {
        // The same backstop as `invalid_field`: a refusal of input is small.
        details.field = cut_stored(&details.field, MAX_FIELD_PATH_BYTES);
        message = cut_stored(&message, MAX_INVALID_MESSAGE_BYTES);
    }
    Status::with_details(code_of(err.code()), message, details.encode_to_vec().into())
}

/// The structured details a Cascade server put in a status, if any.
pub fn error_details(status: &Status) -> Option<v1::ErrorDetails> {
    if status.details().is_empty() {
        return None;
    }
    v1::ErrorDetails::decode(status.details()).ok()
}

/// The reason in a status's details (UNSPECIFIED when there are none).
pub fn reason_of(status: &Status) -> ErrorReason {
    error_details(status)
        .and_then(|d| ErrorReason::try_from(d.reason).ok())
        .unwrap_or(ErrorReason::Unspecified)
}

/// A status with `details` encoded in its details.
pub fn with_details(code: Code, message: impl Into<String>, details: &v1::ErrorDetails) -> Status {
    Status::with_details(code, message, details.encode_to_vec().into())
}

/// Bytes of an INVALID_ARGUMENT's field path and message kept, at most: a
/// backstop under the quoting of input ([`cascade_core::limits::quote`]),
/// so a refusal stays well under the 1 KB a status may take in metadata.
pub const MAX_FIELD_PATH_BYTES: usize = 256;
/// See [`MAX_FIELD_PATH_BYTES`].
pub const MAX_INVALID_MESSAGE_BYTES: usize = 512;

/// A request field that could not be decoded.
pub fn invalid_field(field: &str, message: impl std::fmt::Display) -> Status {
    let field = cut_stored(field, MAX_FIELD_PATH_BYTES);
    let message = cut_stored(&format!("{field}: {message}"), MAX_INVALID_MESSAGE_BYTES);
    let details = v1::ErrorDetails {
        field,
        reason: ErrorReason::InvalidField as i32,
        ..Default::default()
    };
    Status::with_details(Code::InvalidArgument, message, details.encode_to_vec().into())
}

/// UNAVAILABLE: this node's storage or writer cannot serve the call now.
pub fn storage_unavailable<M: std::fmt::Display>(message: M) -> Status {
    let details = v1::ErrorDetails {
        reason: ErrorReason::StorageUnavailable as i32,
        ..Default::default()
    };
    Status::with_details(Code::Unavailable, message.to_string(), details.encode_to_vec().into())
}

/// The trailer (ASCII metadata) that repeats `ErrorDetails.resume_revision`
/// of a COMPACTED status as decimal text, for clients that read metadata
/// more easily than status details (grpcurl prints it).
pub const RESUME_REVISION_METADATA: &str = "cascade-resume-revision";

/// OUT_OF_RANGE: a watch asked for (or a running one reached) `asked`,
/// which the outbox was compacted past; it can resume from `resume` (the
/// oldest retained revision). The same status for a fresh watch and an
/// overtaken one, so a client handles both alike.
pub fn compacted(asked: u64, resume: u64) -> Status {
    let details = v1::ErrorDetails {
        reason: ErrorReason::Compacted as i32,
        resume_revision: resume,
        ..Default::default()
    };
    let mut status = Status::with_details(
        Code::OutOfRange,
        format!(
            "revision {asked} was compacted; the oldest revision to resume from is {resume} \
             (re-list, then watch from {resume})"
        ),
        details.encode_to_vec().into(),
    );
    status
        .metadata_mut()
        .insert(RESUME_REVISION_METADATA, tonic::metadata::MetadataValue::from(resume));
    status
}

/// The revision a COMPACTED status says to resume from, from its details
/// (or, failing that, its `cascade-resume-revision` trailer).
pub fn resume_revision(status: &Status) -> Option<u64> {
    if status.code() != Code::OutOfRange {
        return None;
    }
    error_details(status)
        .filter(|d| d.reason == ErrorReason::Compacted as i32)
        .map(|d| d.resume_revision)
        .or_else(|| {
            status
                .metadata()
                .get(RESUME_REVISION_METADATA)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
        })
}
