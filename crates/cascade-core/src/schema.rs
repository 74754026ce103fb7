//! The schema: which kinds exist and, per reference field, what deleting the
//! target does to the referrer.
//!
//! Loaded from TOML:
//!
//! ```toml
//! [kinds.network]
//! [kinds.port.refs.network]
//! kind = "network"
//! on_delete = "cascade"
//! required = true
//! [kinds.port.refs.security_groups]
//! kind = "security_group"
//! on_delete = "unset"
//! many = true
//! [kinds.project]
//! retain = "7d"   # soft delete: kept DELETED for 7 days, then purged
//! ```
//!
//! Every load error names the exact place (`kinds.port.refs.network: unknown
//! kind "netwrk"`). Besides hard errors, [`Schema::check`] names every
//! cascade path this schema can leave stuck and every cascade cycle (seed
//! 002: Goten does not detect them; we do, statically), and
//! [`Schema::warnings`] summarises the stuck ones per `block` reference.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::name::{validate_kind, NameError};

mod check;
pub use check::{SchemaCheck, StuckPath};

/// What happens to the referrer when the target of a reference is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDelete {
    /// The referrer is deleted too (for a list reference: when its last element goes).
    Cascade,
    /// The reference is cleared (for a list reference: the element is removed).
    Unset,
    /// A user delete of the target is refused; a cascade reaching it waits.
    Block,
    /// Nothing happens; the reference may outlive its target and reads as dangling.
    AllowDangling,
}

impl OnDelete {
    /// Its spelling in the schema TOML and on the wire (`allow_dangling`).
    pub fn as_str(self) -> &'static str {
        match self {
            OnDelete::Cascade => "cascade",
            OnDelete::Unset => "unset",
            OnDelete::Block => "block",
            OnDelete::AllowDangling => "allow_dangling",
        }
    }

    /// Whether the owner of the target keeps a back-reference for it. A
    /// dangling-allowed reference needs none: nothing has to happen to it.
    pub fn tracked(self) -> bool {
        self != OnDelete::AllowDangling
    }
}

impl fmt::Display for OnDelete {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One reference field of a kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefSpec {
    /// Kind of the target.
    pub kind: String,
    /// What deleting a target does to the referrer.
    pub on_delete: OnDelete,
    /// A list reference (holds several targets).
    #[serde(default)]
    pub many: bool,
    /// The field must be set (a list: non-empty) at create and update.
    #[serde(default)]
    pub required: bool,
}

/// One kind of resource: its reference fields (a kind without references
/// is a valid leaf, such as a project).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KindSpec {
    /// Field name → what it may point at and its `on_delete`.
    #[serde(default)]
    pub refs: BTreeMap<String, RefSpec>,
    /// Soft delete (issue 29): how long a deleted resource of this kind is
    /// kept DELETED (hidden, its name reserved) before it is purged, as a
    /// duration (`7d`, `12h`; see [`crate::time_text::parse_duration`]).
    /// None: purged as soon as its deletion finishes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain: Option<String>,
}

/// A validated schema. Construct with [`Schema::from_toml`] or [`Schema::new`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Schema {
    kinds: BTreeMap<String, KindSpec>,
    /// Each kind's `retain`, parsed (kinds without one are absent).
    #[serde(skip)]
    retain_ms: BTreeMap<String, u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SchemaFile {
    kinds: BTreeMap<String, KindSpec>,
}

/// A schema that cannot be used, with the path of the offending entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// The text does not parse as a schema file (the TOML parser's message,
    /// with its line and column).
    #[error("schema is not valid TOML: {0}")]
    Syntax(String),
    /// It parses but breaks a rule (unknown kind, bad field name, a
    /// required `unset` reference, a bound exceeded).
    #[error("{path}: {message}")]
    Invalid {
        /// The TOML path of the offending entry (`kinds.port.refs.network`).
        path: String,
        /// The rule it breaks.
        message: String,
    },
}

fn invalid(path: impl Into<String>, message: impl Into<String>) -> SchemaError {
    SchemaError::Invalid {
        path: path.into(),
        message: message.into(),
    }
}

/// Largest schema accepted: a bound against hostile input, far above any real model.
pub const MAX_KINDS: usize = 1024;
/// Most reference fields one kind may declare (same bound, per kind).
pub const MAX_REFS_PER_KIND: usize = 128;

impl Schema {
    /// Parses and validates a schema file (`[kinds.<kind>.refs.<field>]`).
    pub fn from_toml(text: &str) -> Result<Self, SchemaError> {
        let file: SchemaFile = toml::from_str(text).map_err(|e| SchemaError::Syntax(e.to_string()))?;
        Self::new(file.kinds)
    }

    /// Validates kinds given as data; the error names the offending entry
    /// by its TOML path, as [`Schema::from_toml`] would.
    pub fn new(kinds: BTreeMap<String, KindSpec>) -> Result<Self, SchemaError> {
        if kinds.is_empty() {
            return Err(invalid("kinds", "the schema declares no kinds"));
        }
        if kinds.len() > MAX_KINDS {
            return Err(invalid("kinds", format!("more than {MAX_KINDS} kinds")));
        }
        let mut retain_ms = BTreeMap::new();
        for (kind, spec) in &kinds {
            validate_kind(kind).map_err(|e: NameError| invalid(format!("kinds.{kind}"), e.reason))?;
            if let Some(text) = &spec.retain {
                let ms =
                    crate::time_text::parse_duration(text).map_err(|e| invalid(format!("kinds.{kind}.retain"), e))?;
                if ms > 0 {
                    retain_ms.insert(kind.clone(), ms);
                }
            }
            if spec.refs.len() > MAX_REFS_PER_KIND {
                return Err(invalid(
                    format!("kinds.{kind}.refs"),
                    format!("more than {MAX_REFS_PER_KIND} references"),
                ));
            }
            for (field, r) in &spec.refs {
                let path = format!("kinds.{kind}.refs.{field}");
                validate_kind(field).map_err(|e| invalid(&path, format!("field name {}", e.reason)))?;
                if !kinds.contains_key(&r.kind) {
                    return Err(invalid(path, format!("unknown kind {:?}", r.kind)));
                }
                if r.required && r.on_delete == OnDelete::Unset {
                    return Err(invalid(
                        path,
                        "on_delete = \"unset\" on a required reference: clearing it would leave the referrer invalid (use cascade or block)",
                    ));
                }
            }
        }
        Ok(Self { kinds, retain_ms })
    }

    /// How long a deleted resource of `kind` is kept DELETED, in
    /// milliseconds (0: purged at once): its `retain`.
    pub fn retain_ms(&self, kind: &str) -> u64 {
        self.retain_ms.get(kind).copied().unwrap_or(0)
    }

    /// The longest `retain` of any kind, with its kind (the node checks it
    /// against its `[limits] max_retention` at load).
    pub fn longest_retain(&self) -> Option<(&str, u64)> {
        self.retain_ms
            .iter()
            .max_by_key(|(_, ms)| **ms)
            .map(|(k, ms)| (k.as_str(), *ms))
    }

    /// The spec of `kind`, or None when the schema does not declare it.
    pub fn kind(&self, kind: &str) -> Option<&KindSpec> {
        self.kinds.get(kind)
    }

    /// Every declared kind with its spec, in name order.
    pub fn kinds(&self) -> impl Iterator<Item = (&str, &KindSpec)> {
        self.kinds.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The reference field `field` of `kind`, if both are declared.
    pub fn reference(&self, kind: &str, field: &str) -> Option<&RefSpec> {
        self.kinds.get(kind)?.refs.get(field)
    }

    /// Deletions this schema can leave stuck, explained (seed 002's "errors in
    /// the schema"). A kind that a cascade can reach, but that another kind
    /// may `block`, waits for that blocker to be deleted by hand whenever the
    /// blocker is not itself in the same cascade.
    pub fn warnings(&self) -> Vec<String> {
        // kinds reachable by a cascade: any kind with a cascade reference is
        // deleted when its target is.
        let cascaded: BTreeSet<&str> = self
            .kinds
            .iter()
            .filter(|(_, spec)| spec.refs.values().any(|r| r.on_delete == OnDelete::Cascade))
            .map(|(k, _)| k.as_str())
            .collect();
        let mut out = Vec::new();
        for (blocker, spec) in &self.kinds {
            for (field, r) in &spec.refs {
                if r.on_delete == OnDelete::Block && cascaded.contains(r.kind.as_str()) {
                    let blocker_cascades_with_target = self
                        .reference_kinds_cascading(blocker)
                        .iter()
                        .any(|k| self.cascade_reaches(k, &r.kind));
                    if !blocker_cascades_with_target {
                        out.push(format!(
                            "kinds.{blocker}.refs.{field}: a {target} reached by a cascade stays DELETING while a {blocker} blocks it, and no cascade that deletes the {target} deletes the {blocker}; such deletions wait for the {blocker} to be deleted by hand",
                            target = r.kind
                        ));
                    }
                }
            }
        }
        out
    }

    /// Kinds whose deletion cascades into `kind` directly.
    fn reference_kinds_cascading(&self, kind: &str) -> Vec<&str> {
        self.kinds
            .get(kind)
            .map(|s| {
                s.refs
                    .values()
                    .filter(|r| r.on_delete == OnDelete::Cascade)
                    .map(|r| r.kind.as_str())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether deleting a `from` can cascade into deleting a `to`.
    fn cascade_reaches(&self, from: &str, to: &str) -> bool {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from];
        while let Some(k) = stack.pop() {
            if k == to {
                return true;
            }
            if !seen.insert(k) {
                continue;
            }
            for (child, spec) in &self.kinds {
                if spec
                    .refs
                    .values()
                    .any(|r| r.on_delete == OnDelete::Cascade && r.kind == k)
                {
                    stack.push(child.as_str());
                }
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_kind_names_the_place() {
        let err = Schema::from_toml(
            r#"
[kinds.network]
[kinds.port.refs.network]
kind = "netwrk"
on_delete = "cascade"
"#,
        )
        .unwrap_err();
        assert_eq!(err.to_string(), r#"kinds.port.refs.network: unknown kind "netwrk""#);
    }

    #[test]
    fn unset_on_required_is_refused() {
        let err = Schema::from_toml(
            r#"
[kinds.network]
[kinds.port.refs.network]
kind = "network"
on_delete = "unset"
required = true
"#,
        )
        .unwrap_err();
        assert!(err
            .to_string()
            .starts_with("kinds.port.refs.network: on_delete = \"unset\" on a required"));
    }

    #[test]
    fn bad_on_delete_and_unknown_keys_are_syntax_errors() {
        let err = Schema::from_toml("[kinds.a.refs.b]\nkind = \"a\"\non_delete = \"explode\"\n").unwrap_err();
        assert!(err.to_string().contains("explode"), "{err}");
        let err = Schema::from_toml("[kinds.a]\ncolour = 1\n").unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");
    }

    #[test]
    fn blocked_cascade_is_warned() {
        let s = Schema::from_toml(
            r#"
[kinds.network]
[kinds.port.refs.network]
kind = "network"
on_delete = "cascade"
[kinds.lock.refs.port]
kind = "port"
on_delete = "block"
"#,
        )
        .unwrap();
        let w = s.warnings();
        assert_eq!(w.len(), 1);
        assert!(w[0].starts_with("kinds.lock.refs.port:"), "{w:?}");
    }
}

/// The example schema shipped in `deploy/schemas/neutron.toml` (seed 001),
/// embedded so `cascade demo` and tests run without files.
pub const EXAMPLE_SCHEMA: &str = include_str!("../../../deploy/schemas/neutron.toml");

#[cfg(test)]
mod example_tests {
    #[test]
    fn example_schema_loads_without_warnings() {
        let schema = super::Schema::from_toml(super::EXAMPLE_SCHEMA).unwrap();
        assert!(schema.kind("floating_ip").is_some());
        assert_eq!(schema.warnings(), Vec::<String>::new());
    }
}
