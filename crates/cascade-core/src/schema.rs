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
//! An optional top-level `label = "2026-11 volumes"` names a version for
//! people (`cascade status` shows it beside the digest of the canonical
//! form, [`Schema::canonical_text`]).
//!
//! Every load error names the exact place (`kinds.port.refs.network: unknown
//! kind "netwrk"`), or the line for a file that is not TOML. Besides hard errors, [`Schema::check`] names every
//! cascade path this schema can leave stuck and every cascade cycle (seed
//! 002: Goten does not detect them; we do, statically), and
//! [`Schema::warnings`] summarises the stuck ones per `block` reference.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::name::{validate_kind, NameError};

mod check;
mod diff;
pub use check::{SchemaCheck, StuckPath};
pub use diff::{CompatItem, CompatRule, RefChange, SchemaDiff, StoredQuestion, Tally};

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
    /// The file's `label`: a name for people, not part of the canonical
    /// form (two files that differ only in it declare the same schema).
    #[serde(skip)]
    label: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SchemaFile {
    #[serde(default)]
    label: Option<String>,
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
/// The longest `label` (a version's name for people, shown by `cascade status`).
pub const MAX_LABEL_BYTES: usize = 64;

/// A label is for people: printable, short.
fn check_label(label: &str) -> Result<String, SchemaError> {
    if label.is_empty() || label.len() > MAX_LABEL_BYTES {
        return Err(invalid(
            "label",
            format!(
                "{} is {} bytes; a label is 1 to {MAX_LABEL_BYTES}",
                crate::limits::quote(label),
                label.len()
            ),
        ));
    }
    if label.chars().any(char::is_control) {
        return Err(invalid(
            "label",
            format!("{} holds a control character", crate::limits::quote(label)),
        ));
    }
    Ok(label.to_owned())
}

/// A cycle of `block` references through two kinds or more: each resource
/// on it refuses the delete of the next, so none of them can be deleted,
/// and a cascade that reaches one waits for ever. (A kind that blocks
/// itself is a tree, a folder and its parent: children go first, and it is
/// allowed.) The error names the first reference of the cycle from its
/// smallest kind.
fn block_cycle(kinds: &BTreeMap<String, KindSpec>) -> Option<SchemaError> {
    // The kinds `kind` blocks, by which field; a self-reference left out.
    fn blocks<'k>(kinds: &'k BTreeMap<String, KindSpec>, kind: &str) -> Vec<(&'k str, &'k str)> {
        kinds
            .get(kind)
            .map(|spec| {
                spec.refs
                    .iter()
                    .filter(|(_, r)| r.on_delete == OnDelete::Block && r.kind != kind)
                    .map(|(f, r)| (f.as_str(), r.kind.as_str()))
                    .collect()
            })
            .unwrap_or_default()
    }
    // A kind on the search's path: the kinds it blocks (by which field)
    // and the next of them to follow.
    type Visit<'k> = (&'k str, Vec<(&'k str, &'k str)>, usize);
    // Iterative depth-first search: 0 unvisited, 1 on the path, 2 done.
    let mut colour: BTreeMap<&str, u8> = BTreeMap::new();
    for start in kinds.keys() {
        if colour.get(start.as_str()).copied().unwrap_or(0) != 0 {
            continue;
        }
        let mut path: Vec<Visit<'_>> = vec![(start.as_str(), blocks(kinds, start), 0)];
        colour.insert(start.as_str(), 1);
        while let Some((kind, edges, next)) = path.last_mut() {
            let kind = *kind;
            let Some(&(_, target)) = edges.get(*next) else {
                colour.insert(kind, 2);
                path.pop();
                continue;
            };
            *next += 1;
            match colour.get(target).copied().unwrap_or(0) {
                0 => {
                    colour.insert(target, 1);
                    path.push((target, blocks(kinds, target), 0));
                }
                1 => {
                    // The cycle: from `target`'s place on the path to here.
                    let at = path.iter().position(|(k, _, _)| *k == target).unwrap_or(0);
                    let steps: Vec<(&str, &str)> = path[at..]
                        .iter()
                        .filter_map(|(k, edges, next)| Some((*k, edges.get(next.checked_sub(1)?)?.0)))
                        .collect();
                    // Named from its smallest kind, so the message does not
                    // depend on where the search came in.
                    let first = steps
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, (k, _))| *k)
                        .map_or(0, |(i, _)| i);
                    let rotated: Vec<(&str, &str)> = steps[first..].iter().chain(&steps[..first]).copied().collect();
                    let &(kind, field) = rotated.first()?;
                    let mut ring: Vec<&str> = rotated.iter().map(|(k, _)| *k).collect();
                    ring.push(kind);
                    return Some(invalid(
                        format!("kinds.{kind}.refs.{field}"),
                        format!(
                            "a cycle of block references ({}): each of them refuses the delete of the next, so none \
                             can be deleted and a cascade that reaches one waits for ever; make one of them \
                             cascade or unset",
                            ring.join(" → ")
                        ),
                    ));
                }
                _ => {}
            }
        }
    }
    None
}

impl Schema {
    /// Parses and validates a schema file (`[kinds.<kind>.refs.<field>]`).
    pub fn from_toml(text: &str) -> Result<Self, SchemaError> {
        // An empty file (a truncated write, a wrong path) says so, rather
        // than TOML's "missing field `kinds`".
        let only_comments = text
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'));
        if only_comments {
            return Err(invalid("kinds", "the schema file is empty: it declares no kinds"));
        }
        let file: SchemaFile = toml::from_str(text).map_err(|e| SchemaError::Syntax(e.to_string()))?;
        let mut schema = Self::new(file.kinds)?;
        if let Some(label) = file.label {
            schema.label = Some(check_label(&label)?);
        }
        Ok(schema)
    }

    /// The file's `label`, if it has one.
    pub fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// The schema's canonical form: one line per kind and per reference
    /// field, in name order, every attribute spelled out (a default left
    /// out of the file reads as written). The node's schema version is a
    /// digest of it, so two files that declare the same kinds and
    /// references in another order, spacing or with comments have the same
    /// version. Written here rather than by a serializer, so a library
    /// upgrade cannot change a version. The `label` is not part of it.
    pub fn canonical_text(&self) -> String {
        let mut out = String::from("cascade schema 1\n");
        for (kind, spec) in &self.kinds {
            out += &format!("kind {kind} retain_ms={}\n", self.retain_ms(kind));
            for (field, r) in &spec.refs {
                out += &format!(
                    "ref {kind}.{field} kind={} on_delete={} many={} required={}\n",
                    r.kind, r.on_delete, r.many, r.required
                );
            }
        }
        out
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
        if let Some(message) = block_cycle(&kinds) {
            return Err(message);
        }
        Ok(Self {
            kinds,
            retain_ms,
            label: None,
        })
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
    fn a_cycle_of_block_references_is_refused_naming_its_first_reference() {
        let err = Schema::from_toml(
            r#"
[kinds.b.refs.holds]
kind = "c"
on_delete = "block"
[kinds.c.refs.back]
kind = "b"
on_delete = "block"
"#,
        )
        .unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.starts_with("kinds.b.refs.holds: a cycle of block references (b → c → b)"),
            "{shown}"
        );
        // A kind that blocks itself is a tree (children go first): allowed.
        Schema::from_toml("[kinds.folder.refs.parent]\nkind = \"folder\"\non_delete = \"block\"\n").unwrap();
    }

    #[test]
    fn an_empty_file_says_it_is_empty() {
        for text in ["", "\n  \n", "# nothing yet\n"] {
            let err = Schema::from_toml(text).unwrap_err();
            assert_eq!(err.to_string(), "kinds: the schema file is empty: it declares no kinds");
        }
    }

    #[test]
    fn a_label_is_kept_apart_from_the_kinds_and_bounded() {
        let s = Schema::from_toml("label = \"2026-11 volumes\"\n[kinds.a]\n").unwrap();
        assert_eq!(s.label(), Some("2026-11 volumes"));
        let long = format!("label = \"{}\"\n[kinds.a]\n", "x".repeat(MAX_LABEL_BYTES + 1));
        assert!(Schema::from_toml(&long).unwrap_err().to_string().starts_with("label: "));
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
