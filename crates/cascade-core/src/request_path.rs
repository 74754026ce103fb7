//! Naming a refused reference as the client's request named it.
//!
//! A create or update refused because of one of its reference targets
//! names the field at fault (`ErrorDetails.field`). The client wrote
//! `refs.network` for a single reference, `refs.ports[2]` for the third
//! element of a list, and `resources[1].refs.network` inside a batch of
//! several. Whoever decides the refusal may know less: an owner region
//! answering an attach, and the core for a remote target, know only
//! `refs.{field}`. [`locate_refusal`] completes the path from the request,
//! so the same refusal names the same field whichever region decided it.

use crate::error::CoreError;
use crate::name::ResourceName;
use crate::protocol::ResourceSpec;
use crate::schema::Schema;

/// The path of a reference target in a create or update request:
/// `refs.network` for a single reference, `refs.ports[2]` for an element of
/// a list reference, after `resources[i].` when `member` is the spec's
/// index in a batch of several.
pub fn reference_path(schema: &Schema, member: Option<usize>, kind: &str, field: &str, index: usize) -> String {
    let prefix = member.map(|i| format!("resources[{i}].")).unwrap_or_default();
    if schema.reference(kind, field).is_some_and(|r| r.many) {
        format!("{prefix}refs.{field}[{index}]")
    } else {
        format!("{prefix}refs.{field}")
    }
}

/// The batch member and field at fault in `resources[1].refs.ports[0]`:
/// `(Some(1), "ports")`. None for a path that names no reference.
fn split_reference_path(path: &str) -> Option<(Option<usize>, &str)> {
    let (member, rest) = match path.strip_prefix("resources[") {
        Some(tail) => {
            let (index, rest) = tail.split_once("].")?;
            (Some(index.parse().ok()?), rest)
        }
        None => (None, path),
    };
    let field = rest.strip_prefix("refs.")?;
    let field = field.split_once('[').map_or(field, |(f, _)| f);
    Some((member, field))
}

/// Names a refused reference target in the request's terms (see
/// [`reference_path`]): the refusals about a target (missing, being
/// deleted, another incarnation) get the full path of the element in
/// `specs` that names that target; any other error is returned as it is.
pub fn locate_refusal(schema: &Schema, e: CoreError, specs: &[ResourceSpec]) -> CoreError {
    let place = |path: &str, target: &ResourceName| -> Option<String> {
        let (member, field) = split_reference_path(path)?;
        let batch = specs.len() > 1;
        specs
            .iter()
            .enumerate()
            .filter(|(i, _)| member.is_none_or(|m| m == *i))
            .find_map(|(i, spec)| {
                let j = spec
                    .refs
                    .get(field)?
                    .iter()
                    .position(|t| ResourceName::parse(&t.name).is_ok_and(|n| n == *target))?;
                let kind = ResourceName::parse(&spec.name).ok()?;
                Some(reference_path(schema, batch.then_some(i), kind.kind(), field, j))
            })
    };
    match e {
        CoreError::TargetDeleting { field, target } => CoreError::TargetDeleting {
            field: place(&field, &target).unwrap_or(field),
            target,
        },
        CoreError::TargetNotFound { field, target } => CoreError::TargetNotFound {
            field: place(&field, &target).unwrap_or(field),
            target,
        },
        CoreError::TargetUidMismatch {
            field,
            target,
            expected,
            actual,
        } => CoreError::TargetUidMismatch {
            field: place(&field, &target).unwrap_or(field),
            target,
            expected,
            actual,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::RefRequest;
    use crate::schema::EXAMPLE_SCHEMA;

    fn spec(name: &str, field: &str, targets: &[&str]) -> ResourceSpec {
        let refs = [(
            field.to_owned(),
            targets
                .iter()
                .map(|t| RefRequest {
                    name: (*t).to_owned(),
                    uid: None,
                })
                .collect(),
        )]
        .into_iter()
        .collect();
        ResourceSpec {
            name: name.to_owned(),
            refs,
            ..ResourceSpec::default()
        }
    }

    #[test]
    fn a_remote_refusal_names_the_list_element_and_the_batch_member() {
        let schema = Schema::from_toml(EXAMPLE_SCHEMA).expect("example schema");
        let target = ResourceName::parse("rb/port/p2").expect("name");
        let specs = [
            spec("ra/network/n", "project", &["ra/project/p"]),
            spec("ra/port_group/g", "ports", &["rb/port/p1", "rb/port/p2"]),
        ];
        let e = CoreError::TargetDeleting {
            field: "refs.ports".into(),
            target: target.clone(),
        };
        match locate_refusal(&schema, e, &specs) {
            CoreError::TargetDeleting { field, .. } => assert_eq!(field, "resources[1].refs.ports[1]"),
            other => panic!("{other:?}"),
        }
        // One resource: no batch prefix; a single reference: no index.
        let single = [spec("ra/network/n", "project", &["rb/project/q"])];
        let e = CoreError::TargetNotFound {
            field: "refs.project".into(),
            target: ResourceName::parse("rb/project/q").expect("name"),
        };
        match locate_refusal(&schema, e, &single) {
            CoreError::TargetNotFound { field, .. } => assert_eq!(field, "refs.project"),
            other => panic!("{other:?}"),
        }
    }
}
