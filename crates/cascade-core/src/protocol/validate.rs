//! Checks on what a client sends, before anything is written: a name in
//! this region of a known kind, attribute and finalizer limits, the etag,
//! and references resolved against the schema to live targets.
//!
//! They are one place so that create, update and delete refuse bad input
//! the same way, and the limits are written down once.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::CoreError;
use crate::model::{RefTarget, Resource, ResourceState};
use crate::name::{ResourceName, Uid};
use crate::schema::OnDelete;
use crate::state::{StateRead, Tx};

use super::{is_remote, Ctx, RefRequest};

use crate::limits::{
    quote, MAX_ATTRIBUTES, MAX_ATTRIBUTE_KEY_BYTES as MAX_ATTRIBUTE_KEY,
    MAX_ATTRIBUTE_VALUE_BYTES as MAX_ATTRIBUTE_VALUE, MAX_ETAG_BYTES, MAX_FINALIZERS, MAX_FINALIZER_BYTES,
    MAX_KIND_BYTES, MAX_TARGETS_PER_FIELD,
};

/// Where a checked value sits in the request, for the refusal that names
/// it: spelled out only when a refusal does. A create of a thousand
/// members formatted four paths per member (`resources[7].name`, …) and
/// one per reference that no answer ever read (P5's profile,
/// docs/BENCHMARKS.md "P5 (2026-11-27)").
pub(super) trait FieldPath {
    /// The path as the client's request names it.
    fn path(&self) -> String;
}

impl FieldPath for str {
    fn path(&self) -> String {
        self.to_owned()
    }
}

/// `field` of a create's member: `resources[{member}].{field}` in a batch,
/// `{field}` alone in a single create.
#[derive(Debug, Clone, Copy)]
pub(super) struct MemberField<'a> {
    pub(super) member: Option<usize>,
    pub(super) field: &'a str,
}

impl FieldPath for MemberField<'_> {
    fn path(&self) -> String {
        match self.member {
            Some(i) => format!("resources[{i}].{}", self.field),
            None => self.field.to_owned(),
        }
    }
}

/// Parses a name that must be of this region and of a kind of the schema.
pub(super) fn local_name(
    ctx: Ctx<'_>,
    raw: &str,
    field: &(impl FieldPath + ?Sized),
) -> Result<ResourceName, CoreError> {
    let name = ResourceName::parse(raw).map_err(|e| CoreError::invalid(field.path(), e.to_string()))?;
    if name.region() != ctx.region.as_str() {
        return Err(CoreError::WrongRegion {
            region: name.region().to_owned(),
            local: ctx.region.to_string(),
            name,
        });
    }
    if ctx.schema.kind(name.kind()).is_none() {
        return Err(CoreError::invalid(
            field.path(),
            format!("unknown kind {} in {name}", quote(name.kind())),
        ));
    }
    Ok(name)
}

/// INVALID_ARGUMENT on `field`: `value` is over its limit of `max` bytes
/// (quoted by a prefix and its length).
pub(super) fn too_long(field: &str, value: &str, max: usize) -> CoreError {
    CoreError::invalid(field, format!("{} is too long (at most {max} bytes)", quote(value)))
}

/// Refuses a write whose etag (when given and not empty) is not the current one.
pub(super) fn check_etag(resource: &Resource, etag: Option<&str>) -> Result<(), CoreError> {
    match etag {
        Some(expected) if expected.len() > MAX_ETAG_BYTES => Err(too_long("etag", expected, MAX_ETAG_BYTES)),
        Some(expected) if !expected.is_empty() && expected != resource.etag() => Err(CoreError::EtagMismatch {
            name: resource.name.clone(),
            expected: expected.to_owned(),
            actual: resource.etag(),
        }),
        _ => Ok(()),
    }
}

/// Bounds the number and sizes of attributes.
pub(super) fn validate_attributes(
    attributes: &BTreeMap<String, String>,
    field: &(impl FieldPath + ?Sized),
) -> Result<(), CoreError> {
    if attributes.len() > MAX_ATTRIBUTES {
        return Err(CoreError::invalid(
            field.path(),
            format!("more than {MAX_ATTRIBUTES} attributes"),
        ));
    }
    for (k, v) in attributes {
        if k.is_empty() || k.len() > MAX_ATTRIBUTE_KEY {
            // The key is not named in the path: it is the input at fault.
            return Err(CoreError::invalid(
                field.path(),
                format!("attribute key {} must be 1 to {MAX_ATTRIBUTE_KEY} bytes", quote(k)),
            ));
        }
        if v.len() > MAX_ATTRIBUTE_VALUE {
            return Err(CoreError::invalid(
                format!("{}.{k}", field.path()),
                format!("attribute values must be at most {MAX_ATTRIBUTE_VALUE} bytes"),
            ));
        }
    }
    Ok(())
}

/// Bounds finalizers: few, unique, non-empty, short.
pub(super) fn validate_finalizers(finalizers: &[String], field: &(impl FieldPath + ?Sized)) -> Result<(), CoreError> {
    if finalizers.len() > MAX_FINALIZERS {
        return Err(CoreError::invalid(
            field.path(),
            format!("more than {MAX_FINALIZERS} finalizers"),
        ));
    }
    let unique: BTreeSet<&String> = finalizers.iter().collect();
    if unique.len() != finalizers.len() || finalizers.iter().any(|f| f.is_empty() || f.len() > MAX_FINALIZER_BYTES) {
        return Err(CoreError::invalid(
            field.path(),
            format!("finalizers must be unique, non-empty, at most {MAX_FINALIZER_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// Validates requested references against the schema and resolves them to
/// live targets. Every target must exist, be ACTIVE, and (if pinned) have
/// the given uid: nothing attaches to a DELETING resource. An
/// `allow_dangling` target that an update keeps (`existing`) stays pinned
/// to its incarnation, even when it is gone or its name was re-used.
///
/// `deleting` keeps, for the step, whether each remote target was seen
/// enter DELETING: a batch of a thousand members mostly names the same few
/// remote targets, and nothing in a create or an update step writes that
/// table, so one read per target per step answers for every member.
pub(super) fn resolve_refs<S: StateRead + ?Sized>(
    tx: &Tx<'_, S>,
    ctx: Ctx<'_>,
    kind: &str,
    requested: &BTreeMap<String, Vec<RefRequest>>,
    field_prefix: &(impl FieldPath + ?Sized),
    existing: Option<&BTreeMap<String, Vec<RefTarget>>>,
    deleting: &mut BTreeMap<Uid, bool>,
) -> Result<BTreeMap<String, Vec<RefTarget>>, CoreError> {
    let kind_spec = ctx
        .schema
        .kind(kind)
        .ok_or_else(|| CoreError::invalid("name", format!("unknown kind {kind:?}")))?;
    let mut out = BTreeMap::new();
    for (field, targets) in requested {
        let Some(spec) = kind_spec.refs.get(field) else {
            // A field name no schema could declare is not put in the path.
            let path = if field.len() <= MAX_KIND_BYTES {
                format!("{}.{field}", field_prefix.path())
            } else {
                field_prefix.path()
            };
            return Err(CoreError::invalid(
                path,
                format!("kind {kind:?} has no reference field {}", quote(field)),
            ));
        };
        let path = || format!("{}.{field}", field_prefix.path());
        if targets.is_empty() {
            continue;
        }
        if !spec.many && targets.len() > 1 {
            return Err(CoreError::invalid(
                path(),
                "takes one target (it is not a list reference)",
            ));
        }
        if targets.len() > MAX_TARGETS_PER_FIELD {
            return Err(CoreError::invalid(
                path(),
                format!("more than {MAX_TARGETS_PER_FIELD} targets"),
            ));
        }
        let mut resolved: Vec<RefTarget> = Vec::with_capacity(targets.len());
        for (i, t) in targets.iter().enumerate() {
            let at = || {
                if spec.many {
                    format!("{}[{i}]", path())
                } else {
                    path()
                }
            };
            let name = ResourceName::parse(&t.name).map_err(|e| CoreError::invalid(at(), e.to_string()))?;
            if name.kind() != spec.kind {
                return Err(CoreError::invalid(
                    at(),
                    format!("must reference a {}, not a {}", spec.kind, name.kind()),
                ));
            }
            if is_remote(ctx, &name) {
                // The node resolved it at its owner (which refuses missing
                // and DELETING targets); here we only refuse one we saw
                // enter DELETING since.
                let Some(uid) = t.uid else {
                    return Err(CoreError::RemoteReference {
                        field: at(),
                        target: name,
                    });
                };
                let seen_deleting = match deleting.get(&uid) {
                    Some(known) => *known,
                    None => {
                        let known = tx.remote_deletion(uid)?.is_some();
                        deleting.insert(uid, known);
                        known
                    }
                };
                if seen_deleting {
                    return Err(CoreError::TargetDeleting {
                        field: at(),
                        target: name,
                    });
                }
                if resolved.iter().any(|r| r.name == name) {
                    return Err(CoreError::invalid(at(), format!("{name} is listed twice")));
                }
                resolved.push(RefTarget { name, uid });
                continue;
            }
            if resolved.iter().any(|r| r.name == name) {
                return Err(CoreError::invalid(at(), format!("{name} is listed twice")));
            }
            if spec.on_delete == OnDelete::AllowDangling {
                let kept = existing
                    .and_then(|e| e.get(field))
                    .and_then(|old| old.iter().find(|o| o.name == name && t.uid.is_none_or(|u| u == o.uid)));
                if let Some(kept) = kept {
                    resolved.push(kept.clone());
                    continue;
                }
            }
            let target = match tx.resource(&name)? {
                None => {
                    return Err(CoreError::TargetNotFound {
                        field: at(),
                        target: name,
                    })
                }
                // Only a member of the same batch may reference a CREATING
                // resource (it is settled together with it).
                Some(r) if r.state == ResourceState::Creating && !tx.is_written(&name) => {
                    return Err(CoreError::TargetNotFound {
                        field: at(),
                        target: name,
                    })
                }
                // A soft-deleted target is refused like a DELETING one: it
                // may come back (Undelete), but it is no target meanwhile.
                Some(r) if matches!(r.state, ResourceState::Deleting | ResourceState::Deleted) => {
                    return Err(CoreError::TargetDeleting {
                        field: at(),
                        target: name,
                    })
                }
                Some(r) => r,
            };
            if let Some(uid) = t.uid {
                if uid != target.uid {
                    return Err(CoreError::TargetUidMismatch {
                        field: at(),
                        target: name,
                        expected: uid.to_string(),
                        actual: target.uid.to_string(),
                    });
                }
            }
            resolved.push(RefTarget { name, uid: target.uid });
        }
        out.insert(field.clone(), resolved);
    }
    for (field, spec) in &kind_spec.refs {
        if spec.required && !out.contains_key(field) {
            return Err(CoreError::invalid(
                format!("{}.{field}", field_prefix.path()),
                format!("required reference to a {} is missing", spec.kind),
            ));
        }
    }
    Ok(out)
}
