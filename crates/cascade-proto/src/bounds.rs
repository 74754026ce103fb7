//! Every string and every list of every request, checked against its limit
//! ([`cascade_core::limits`]) before a node stores, forwards or even parses
//! anything of it: [`Bounded::check_bounds`], called first by each handler
//! of the Resources, Admin and Peer services.
//!
//! Fields a method ignores are checked too (an oversized value is refused
//! wherever it is), and the refusal quotes the value by a short prefix and
//! its length. The error's `field` is the path in the request as protobuf
//! names it (`seeds[0].uid`, `resources[2].refs[0].targets[0].name`; a map
//! is named as a whole, `attributes`, or a value by its key,
//! `attributes.color`; a Create's or Update's resource from the resource,
//! `name`, as the core names it), which
//! `tests/oversized_fields.rs` derives from the descriptor set for every
//! string field of every request: a field added without a limit here
//! fails it.

use cascade_core::limits::{
    quote, MAX_ATTRIBUTES, MAX_ATTRIBUTE_KEY_BYTES, MAX_ATTRIBUTE_VALUE_BYTES, MAX_AUDIT_ACTION_BYTES,
    MAX_AUDIT_TARGET_BYTES, MAX_AUDIT_WHO_BYTES, MAX_ETAG_BYTES, MAX_FINALIZERS, MAX_FINALIZER_BYTES, MAX_KIND_BYTES,
    MAX_LIEN_ID_BYTES, MAX_LIST_PAGE_TOKEN_BYTES, MAX_NAME_BYTES, MAX_NAME_PREFIX_BYTES, MAX_ON_DELETE_BYTES,
    MAX_PAGE_TOKEN_BYTES, MAX_PLAN_SEEDS, MAX_PLAN_TOKEN_BYTES, MAX_REASON_BYTES, MAX_REF_FIELDS, MAX_REGION_BYTES,
    MAX_REQUESTED_BY_BYTES, MAX_SELECTOR_BYTES, MAX_TARGETS_PER_FIELD, MAX_UID_BYTES,
};
use tonic::Status;

use crate::status::invalid_field;
use crate::v1;

/// The longest verb name (`admin.retry_deletion` is 20 bytes).
const MAX_CAN_I_VERB_BYTES: usize = 32;
/// The largest schema file's text `Admin.CheckSchema` takes: the most a
/// schema file may hold (a node's reload reads no more).
pub const MAX_SCHEMA_TEXT_BYTES: usize = 4 * 1024 * 1024;
/// The most groups `cascade auth can-i --group` may name.
const MAX_CAN_I_GROUPS: usize = 64;

/// A request whose every field is within its limit, or INVALID_ARGUMENT
/// naming the first one that is not.
pub trait Bounded {
    /// Checks every string and list of the request against its limit.
    fn check_bounds(&self) -> Result<(), Status>;
}

/// INVALID_ARGUMENT on `field` when `value` is over `max` bytes (the path
/// is only built for a refusal).
fn text(value: &str, max: usize, field: impl FnOnce() -> String) -> Result<(), Status> {
    if value.len() <= max {
        return Ok(());
    }
    Err(invalid_field(
        &field(),
        format!("{} is too long (at most {max} bytes)", quote(value)),
    ))
}

/// INVALID_ARGUMENT on `field` when a list holds more than `max` items.
fn items(len: usize, max: usize, field: impl FnOnce() -> String) -> Result<(), Status> {
    if len <= max {
        return Ok(());
    }
    Err(invalid_field(&field(), format!("holds {len} items (at most {max})")))
}

/// A place in a request, spelled out only for a refusal: a batch of a
/// thousand specs built four paths per reference that no answer read
/// (docs/BENCHMARKS.md, "P5 (2026-11-27)").
type At<'a> = &'a dyn Fn() -> String;

/// `at.field`, or `field` at the top of a request.
fn path(at: At<'_>, field: &str) -> String {
    let at = at();
    if at.is_empty() {
        field.to_owned()
    } else {
        format!("{at}.{field}")
    }
}

fn object_ref(r: &v1::ObjectRef, at: At<'_>) -> Result<(), Status> {
    text(&r.name, MAX_NAME_BYTES, || path(at, "name"))?;
    text(&r.uid, MAX_UID_BYTES, || path(at, "uid"))
}

fn optional_ref(r: &Option<v1::ObjectRef>, at: At<'_>) -> Result<(), Status> {
    r.as_ref().map_or(Ok(()), |r| object_ref(r, at))
}

fn resource_spec(spec: &v1::ResourceSpec, at: At<'_>) -> Result<(), Status> {
    text(&spec.name, MAX_NAME_BYTES, || path(at, "name"))?;
    let attributes = || path(at, "attributes");
    items(spec.attributes.len(), MAX_ATTRIBUTES, attributes)?;
    for (key, value) in &spec.attributes {
        text(key, MAX_ATTRIBUTE_KEY_BYTES, attributes)?;
        // A value is named by its key (`attributes.color`), as the core
        // names it, once the key is known to be short.
        text(value, MAX_ATTRIBUTE_VALUE_BYTES, || {
            if key.is_empty() {
                attributes()
            } else {
                path(&attributes, key)
            }
        })?;
    }
    items(spec.refs.len(), MAX_REF_FIELDS, || path(at, "refs"))?;
    for (i, r) in spec.refs.iter().enumerate() {
        let field_at = || path(at, &format!("refs[{i}]"));
        text(&r.field, MAX_KIND_BYTES, || path(&field_at, "field"))?;
        items(r.targets.len(), MAX_TARGETS_PER_FIELD, || path(&field_at, "targets"))?;
        for (j, t) in r.targets.iter().enumerate() {
            object_ref(t, &|| path(&field_at, &format!("targets[{j}]")))?;
        }
    }
    items(spec.finalizers.len(), MAX_FINALIZERS, || path(at, "finalizers"))?;
    for (i, f) in spec.finalizers.iter().enumerate() {
        text(f, MAX_FINALIZER_BYTES, || path(at, &format!("finalizers[{i}]")))?;
    }
    Ok(())
}

fn backrefs(list: &[v1::PeerBackRef]) -> Result<(), Status> {
    // Their number is the node's `[limits] max_batch_create`, checked by
    // the Peer service.
    for (i, b) in list.iter().enumerate() {
        let at = || format!("backrefs[{i}]");
        optional_ref(&b.target, &|| path(&at, "target"))?;
        optional_ref(&b.referrer, &|| path(&at, "referrer"))?;
        text(&b.field, MAX_KIND_BYTES, || path(&at, "field"))?;
        text(&b.on_delete, MAX_ON_DELETE_BYTES, || path(&at, "on_delete"))?;
    }
    Ok(())
}

macro_rules! bounded {
    ($($message:ty => |$r:ident| $check:expr;)*) => {
        $(impl Bounded for $message {
            fn check_bounds(&self) -> Result<(), Status> {
                let $r = self;
                $check
            }
        })*
    };
}

fn name(value: &str) -> Result<(), Status> {
    text(value, MAX_NAME_BYTES, || "name".to_owned())
}

fn uid(value: &str, field: &'static str) -> Result<(), Status> {
    text(value, MAX_UID_BYTES, || field.to_owned())
}

fn region(value: &str, field: &'static str) -> Result<(), Status> {
    text(value, MAX_REGION_BYTES, || field.to_owned())
}

fn page_token(value: &str, field: &'static str) -> Result<(), Status> {
    text(value, MAX_PAGE_TOKEN_BYTES, || field.to_owned())
}

fn short(value: &str, max: usize, field: &'static str) -> Result<(), Status> {
    text(value, max, || field.to_owned())
}

bounded! {
    // cascade.v1.Resources
    // A single resource's fields are named as the core names them, from
    // the resource (`name`, `attributes`), as in a batch (`resources[2].name`).
    v1::CreateRequest => |r| r.resource.as_ref().map_or(Ok(()), |s| resource_spec(s, &String::new));
    v1::BatchCreateRequest => |r| {
        // Their number is the node's `[limits] max_batch_create`.
        for (i, spec) in r.resources.iter().enumerate() {
            resource_spec(spec, &|| format!("resources[{i}]"))?;
        }
        Ok(())
    };
    v1::GetRequest => |r| name(&r.name);
    v1::ListRequest => |r| {
        short(&r.kind, MAX_KIND_BYTES, "kind")?;
        // A listing of every region carries each region's position.
        short(&r.page_token, MAX_LIST_PAGE_TOKEN_BYTES, "page_token")?;
        region(&r.region, "region")?;
        short(&r.name_prefix, MAX_NAME_PREFIX_BYTES, "name_prefix")?;
        short(&r.attribute_selector, MAX_SELECTOR_BYTES, "attribute_selector")
    };
    v1::ListOperationsRequest => |r| {
        // A listing of every region carries each region's position.
        short(&r.page_token, MAX_LIST_PAGE_TOKEN_BYTES, "page_token")?;
        region(&r.region, "region")
    };
    v1::ListReferencesRequest => |r| {
        name(&r.name)?;
        page_token(&r.page_token, "page_token")
    };
    v1::GetHistoryRequest => |r| {
        name(&r.name)?;
        page_token(&r.page_token, "page_token")
    };
    v1::UpdateRequest => |r| {
        r.resource.as_ref().map_or(Ok(()), |s| resource_spec(s, &String::new))?;
        short(&r.etag, MAX_ETAG_BYTES, "etag")
    };
    v1::DeleteRequest => |r| {
        name(&r.name)?;
        short(&r.etag, MAX_ETAG_BYTES, "etag")?;
        uid(&r.uid, "uid")?;
        short(&r.requested_by, MAX_REQUESTED_BY_BYTES, "requested_by")?;
        short(&r.expect_plan, MAX_PLAN_TOKEN_BYTES, "expect_plan")
    };
    v1::GetOperationRequest => |r| {
        uid(&r.id, "id")?;
        page_token(&r.outcomes_page_token, "outcomes_page_token")
    };
    v1::WatchOperationRequest => |r| uid(&r.id, "id");
    v1::WatchRequest => |r| short(&r.kind, MAX_KIND_BYTES, "kind");
    v1::AddLienRequest => |r| {
        name(&r.name)?;
        short(&r.lien_id, MAX_LIEN_ID_BYTES, "lien_id")?;
        short(&r.reason, MAX_REASON_BYTES, "reason")?;
        short(&r.requested_by, MAX_REQUESTED_BY_BYTES, "requested_by")?;
        short(&r.etag, MAX_ETAG_BYTES, "etag")
    };
    v1::RemoveLienRequest => |r| {
        name(&r.name)?;
        short(&r.lien_id, MAX_LIEN_ID_BYTES, "lien_id")?;
        short(&r.etag, MAX_ETAG_BYTES, "etag")
    };
    v1::RemoveFinalizerRequest => |r| {
        name(&r.name)?;
        uid(&r.uid, "uid")?;
        short(&r.finalizer, MAX_FINALIZER_BYTES, "finalizer")
    };
    v1::ReportFinalizerFailureRequest => |r| {
        name(&r.name)?;
        uid(&r.uid, "uid")?;
        short(&r.finalizer, MAX_FINALIZER_BYTES, "finalizer")?;
        short(&r.reason, MAX_REASON_BYTES, "reason")
    };
    v1::ExplainDeletionRequest => |r| {
        name(&r.name)?;
        uid(&r.operation_id, "operation_id")
    };
    v1::PauseOperationRequest => |r| {
        uid(&r.id, "id")?;
        short(&r.reason, MAX_REASON_BYTES, "reason")
    };
    v1::ResumeOperationRequest => |r| {
        uid(&r.id, "id")?;
        short(&r.reason, MAX_REASON_BYTES, "reason")
    };
    v1::CancelOperationRequest => |r| {
        uid(&r.id, "id")?;
        short(&r.reason, MAX_REASON_BYTES, "reason")
    };
    v1::UndeleteRequest => |r| {
        uid(&r.operation_id, "operation_id")?;
        name(&r.name)
    };

    // cascade.v1.Admin
    v1::ListDeletionsRequest => |r| {
        region(&r.region, "region")?;
        page_token(&r.page_token, "page_token")
    };
    v1::RetryDeletionRequest => |r| {
        name(&r.name)?;
        short(&r.reason, MAX_REASON_BYTES, "reason")
    };
    v1::ForcePurgeRequest => |r| {
        name(&r.name)?;
        short(&r.reason, MAX_REASON_BYTES, "reason")
    };
    v1::ListAuditRequest => |r| {
        region(&r.region, "region")?;
        short(&r.principal, MAX_AUDIT_WHO_BYTES, "principal")?;
        short(&r.resource, MAX_AUDIT_TARGET_BYTES, "resource")?;
        short(&r.action, MAX_AUDIT_ACTION_BYTES, "action")?;
        page_token(&r.page_token, "page_token")
    };
    v1::GetClusterStatusRequest => |_r| Ok(());
    v1::CheckSchemaRequest => |r| text(&r.schema_text, MAX_SCHEMA_TEXT_BYTES, || "schema_text".to_owned());
    v1::ExtendBudgetRequest => |r| {
        uid(&r.operation_id, "operation_id")?;
        short(&r.reason, MAX_REASON_BYTES, "reason")
    };
    v1::CanIRequest => |r| {
        short(&r.verb, MAX_CAN_I_VERB_BYTES, "verb")?;
        name(&r.name)?;
        short(&r.as_principal, MAX_AUDIT_WHO_BYTES, "as_principal")?;
        items(r.as_groups.len(), MAX_CAN_I_GROUPS, || "as_groups".to_owned())?;
        for (i, g) in r.as_groups.iter().enumerate() {
            text(g, MAX_AUDIT_WHO_BYTES, || format!("as_groups[{i}]"))?;
        }
        region(&r.region, "region")
    };

    // cascade.v1.Peer
    v1::LookupRequest => |r| name(&r.name);
    v1::AttachRequest => |r| {
        region(&r.from_region, "from_region")?;
        backrefs(&r.backrefs)
    };
    v1::ReleaseRequest => |r| {
        region(&r.from_region, "from_region")?;
        backrefs(&r.backrefs)
    };
    v1::CheckBackrefsRequest => |r| {
        region(&r.from_region, "from_region")?;
        backrefs(&r.backrefs)
    };
    v1::PeerWatchRequest => |r| region(&r.region, "region");
    v1::PeerPlanRequest => |r| {
        items(r.seeds.len(), MAX_PLAN_SEEDS, || "seeds".to_owned())?;
        for (i, s) in r.seeds.iter().enumerate() {
            object_ref(s, &|| format!("seeds[{i}]"))?;
        }
        // The principal the asking region vouches for: an id and groups
        // no longer than the audit log keeps, a means named in a word.
        if let Some(p) = &r.principal {
            text(&p.id, MAX_AUDIT_WHO_BYTES, || "principal.id".to_owned())?;
            items(p.groups.len(), MAX_CAN_I_GROUPS, || "principal.groups".to_owned())?;
            for (i, g) in p.groups.iter().enumerate() {
                text(g, MAX_AUDIT_WHO_BYTES, || format!("principal.groups[{i}]"))?;
            }
            short(&p.via, MAX_CAN_I_VERB_BYTES, "principal.via")?;
        }
        Ok(())
    };
    v1::DumpRequest => |_r| Ok(());
    v1::AckRequest => |r| region(&r.region, "region");
    v1::ListDeletingRequest => |r| {
        region(&r.region, "region")?;
        page_token(&r.page_token, "page_token")
    };
    v1::ExplainPartRequest => |r| uid(&r.operation_id, "operation_id");
    v1::RegionFiguresRequest => |_r| Ok(());
    v1::PurgePartRequest => |r| {
        short(&r.kind, MAX_KIND_BYTES, "kind")?;
        short(&r.name_prefix, MAX_NAME_PREFIX_BYTES, "name_prefix")?;
        short(&r.attribute_selector, MAX_SELECTOR_BYTES, "attribute_selector")?;
        uid(&r.operation_id, "operation_id")?;
        region(&r.root_region, "root_region")?;
        short(&r.requested_by, MAX_REQUESTED_BY_BYTES, "requested_by")?;
        vouched_principal(r.principal.as_ref())?;
        short(&r.reason, MAX_REASON_BYTES, "reason")
    };
    v1::BudgetLeaseRequest => |r| {
        uid(&r.operation_id, "operation_id")?;
        region(&r.from_region, "from_region")
    };
    v1::UndeletePartRequest => |r| {
        uid(&r.operation_id, "operation_id")?;
        uid(&r.undelete_of, "undelete_of")?;
        optional_ref(&r.root, &|| "root".to_owned())?;
        items(r.would_restore.len(), cascade_core::limits::MAX_UNDELETE_LISTED, || "would_restore".to_owned())?;
        for (i, t) in r.would_restore.iter().enumerate() {
            object_ref(t, &|| format!("would_restore[{i}]"))?;
        }
        short(&r.requested_by, MAX_AUDIT_WHO_BYTES, "requested_by")
    };
    v1::OperationControlRequest => |r| {
        uid(&r.operation_id, "operation_id")?;
        if let Some(root) = &r.root {
            object_ref(root, &|| "root".to_owned())?;
        }
        short(&r.requested_by, MAX_AUDIT_WHO_BYTES, "requested_by")?;
        short(&r.reason, MAX_REASON_BYTES, "reason")
    };

    // cascade.v1.Admin, issue 29
    v1::PurgeRequest => |r| {
        short(&r.kind, MAX_KIND_BYTES, "kind")?;
        short(&r.name_prefix, MAX_NAME_PREFIX_BYTES, "name_prefix")?;
        short(&r.attribute_selector, MAX_SELECTOR_BYTES, "attribute_selector")?;
        region(&r.region, "region")?;
        short(&r.reason, MAX_REASON_BYTES, "reason")
    };
}

/// The principal an asking region vouches for (as `PeerPlanRequest`'s):
/// an id and groups no longer than the audit log keeps, a means in a word.
fn vouched_principal(p: Option<&v1::Principal>) -> Result<(), Status> {
    if let Some(p) = p {
        text(&p.id, MAX_AUDIT_WHO_BYTES, || "principal.id".to_owned())?;
        items(p.groups.len(), MAX_CAN_I_GROUPS, || "principal.groups".to_owned())?;
        for (i, g) in p.groups.iter().enumerate() {
            text(g, MAX_AUDIT_WHO_BYTES, || format!("principal.groups[{i}]"))?;
        }
        short(&p.via, MAX_CAN_I_VERB_BYTES, "principal.via")?;
    }
    Ok(())
}

/// Keeps the longest prefix of a page's `items` whose encoded size stays
/// within `budget_bytes` (at least one item, so a page always advances),
/// and says whether it dropped any: the caller then continues its page
/// token after the last item kept, so nothing is skipped.
pub fn fit_page<T: prost::Message>(items: &mut Vec<T>, budget_bytes: usize) -> bool {
    let mut used = 0usize;
    for (i, item) in items.iter().enumerate() {
        // As a repeated field encodes it: the item, its length and a tag.
        let len = item.encoded_len();
        used = used.saturating_add(prost::length_delimiter_len(len) + len + 1);
        if used > budget_bytes && i > 0 {
            items.truncate(i);
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_field_is_refused_by_its_path_with_a_short_message() {
        let mut spec = v1::ResourceSpec {
            name: "eu-west/port/p1".into(),
            ..Default::default()
        };
        spec.refs.push(v1::ReferenceField {
            field: "network".into(),
            targets: vec![v1::ObjectRef {
                name: "x".repeat(100_000),
                ..Default::default()
            }],
        });
        let status = v1::CreateRequest { resource: Some(spec) }.check_bounds().unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().starts_with("refs[0].targets[0].name: \"xxx"),
            "{}",
            status.message()
        );
        assert!(status
            .message()
            .contains("(100000 bytes) is too long (at most 160 bytes)"));
        assert!(status.message().len() + status.details().len() < 300);
    }

    #[test]
    fn a_page_is_cut_to_its_byte_budget_and_keeps_at_least_one_item() {
        let entry = |n: usize| v1::AuditEntry {
            reason: "r".repeat(n),
            ..Default::default()
        };
        let mut page: Vec<v1::AuditEntry> = (0..10).map(|_| entry(1000)).collect();
        assert!(fit_page(&mut page, 3500));
        assert_eq!(page.len(), 3);
        let mut one = vec![entry(10_000), entry(1)];
        assert!(fit_page(&mut one, 100));
        assert_eq!(one.len(), 1);
        let mut small: Vec<v1::AuditEntry> = (0..10).map(|_| entry(10)).collect();
        assert!(!fit_page(&mut small, 3500));
        assert_eq!(small.len(), 10);
    }

    #[test]
    fn fields_within_their_limits_pass() {
        let req = v1::AddLienRequest {
            name: "eu-west/port/p1".into(),
            lien_id: "l".repeat(MAX_LIEN_ID_BYTES),
            reason: "r".repeat(MAX_REASON_BYTES),
            requested_by: "alice".into(),
            etag: "12".into(),
        };
        assert!(req.check_bounds().is_ok());
    }
}
