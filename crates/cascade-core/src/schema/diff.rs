//! What changes between two schemas, and which changes the data a region
//! already stores forbids (issue 31: a schema reloaded at run time).
//!
//! [`Schema::diff`] lists what a new schema adds, removes and changes. A
//! change that stored data can forbid is a [`CompatItem`]: it asks the
//! shell one [`StoredQuestion`] (how many stored resources of a kind, how
//! many set a field, how many deletions that reach a kind are running),
//! and [`CompatItem::judge`] turns the count into a refusal, or none. The
//! rules are here, pure; the counting reads the store and is the node's
//! (`schema_reload/` in cascade-node), bounded: a count that stopped at its
//! limit is "at least N" ([`Tally::at_least`]).
//!
//! The rules:
//! - a kind removed while resources of it are stored: refused (they would
//!   be orphaned: no schema says what their references do);
//! - a reference field removed, or pointed at another kind, while stored
//!   resources set it: refused (their back-reference rows would hold
//!   targets for a field nothing reads);
//! - a reference's `on_delete` changed while a deletion that reaches its
//!   kinds is running: refused (the walk would treat some referrers by the
//!   old rule and the rest by the new one).
//!
//! Everything else (kinds and fields added, `many`, `required`, `retain`
//! changed) applies as it comes: new creates and updates are checked
//! against the new rules.

use std::fmt;

use serde::Serialize;

use super::{RefSpec, Schema};

/// A reference field whose spec changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefChange {
    /// The referrer's kind.
    pub kind: String,
    /// The field.
    pub field: String,
    /// The spec before.
    pub old: RefSpec,
    /// The spec after.
    pub new: RefSpec,
}

impl RefChange {
    /// What changed, as `on_delete cascade → block, many false → true`.
    pub fn what(&self) -> String {
        let (o, n) = (&self.old, &self.new);
        let mut parts = Vec::new();
        if o.kind != n.kind {
            parts.push(format!("kind {} → {}", o.kind, n.kind));
        }
        if o.on_delete != n.on_delete {
            parts.push(format!("on_delete {} → {}", o.on_delete, n.on_delete));
        }
        if o.many != n.many {
            parts.push(format!("many {} → {}", o.many, n.many));
        }
        if o.required != n.required {
            parts.push(format!("required {} → {}", o.required, n.required));
        }
        parts.join(", ")
    }
}

/// What a new schema adds, removes and changes against the one in force.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SchemaDiff {
    /// Kinds the new schema declares and the old did not.
    pub kinds_added: Vec<String>,
    /// Kinds the old schema declared and the new does not.
    pub kinds_removed: Vec<String>,
    /// Kinds in both whose `retain` changed.
    pub retain_changed: Vec<String>,
    /// Reference fields added (`kind.field`), of kinds in both or new.
    pub refs_added: Vec<String>,
    /// Reference fields removed (`kind.field`) of kinds the new schema keeps.
    pub refs_removed: Vec<String>,
    /// Reference fields in both whose spec changed.
    pub refs_changed: Vec<RefChange>,
    /// The label, when it changed (old, new).
    pub label: Option<(Option<String>, Option<String>)>,
}

/// What the shell counts in its store for one [`CompatItem`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum StoredQuestion {
    /// Stored resources of `kind`, in any state.
    KindStored {
        /// The kind.
        kind: String,
    },
    /// Stored resources of `kind` whose reference `field` names a target.
    FieldSet {
        /// The referrer's kind.
        kind: String,
        /// The field.
        field: String,
    },
    /// Deletions running in the region (its DELETING resources, and the
    /// remote deletions it is applying) of a resource of one of `kinds`.
    DeletionsOf {
        /// The kinds (the reference's target and referrer).
        kinds: Vec<String>,
    },
}

/// What a change forbids when the count is not zero.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum CompatRule {
    /// A kind removed.
    KindRemoved,
    /// A reference field removed.
    FieldRemoved,
    /// A reference field pointed at another kind.
    FieldRetargeted {
        /// The kind it pointed at.
        from: String,
        /// The kind it points at now.
        to: String,
    },
    /// A reference's `on_delete` changed.
    PolicyChanged {
        /// The policy before.
        from: String,
        /// The policy after.
        to: String,
    },
}

/// One change the stored data may forbid: its place in the schema, the
/// rule, and what to count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CompatItem {
    /// Its TOML path (`kinds.volume`, `kinds.port.refs.network`).
    pub path: String,
    /// What it is.
    pub rule: CompatRule,
    /// What the shell counts.
    pub question: StoredQuestion,
}

/// A count, possibly stopped at its limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    /// What was counted.
    pub count: u64,
    /// The count stopped at its limit: there are at least `count`.
    pub at_least: bool,
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.at_least {
            write!(f, "at least {}", self.count)
        } else {
            write!(f, "{}", self.count)
        }
    }
}

impl CompatItem {
    /// The refusal this count makes of the change: None when nothing
    /// stored forbids it. The message names the path, the rule, the count
    /// and what to do.
    pub fn judge(&self, tally: Tally) -> Option<String> {
        if tally.count == 0 {
            return None;
        }
        let path = &self.path;
        let one = tally.count == 1 && !tally.at_least;
        Some(match (&self.rule, &self.question) {
            (CompatRule::KindRemoved, StoredQuestion::KindStored { kind }) => format!(
                "{path}: removed, but {tally} stored {} of kind {kind}: {} would be orphaned (delete {} first)",
                if one { "resource is" } else { "resources are" },
                if one { "it" } else { "they" },
                if one { "it" } else { "them" },
            ),
            (CompatRule::FieldRemoved, StoredQuestion::FieldSet { kind, field }) => format!(
                "{path}: removed, but {tally} stored {kind} {} {field}: {} references would be orphaned \
                 (unset {field} first)",
                if one { "resource sets" } else { "resources set" },
                if one { "its" } else { "their" },
            ),
            (CompatRule::FieldRetargeted { from, to }, StoredQuestion::FieldSet { kind, field }) => format!(
                "{path}: its kind changes from {from} to {to}, but {tally} stored {kind} {} {field} to a {from}: \
                 {} references would be orphaned (unset {field} first)",
                if one { "resource sets" } else { "resources set" },
                if one { "its" } else { "their" },
            ),
            (CompatRule::PolicyChanged { from, to }, StoredQuestion::DeletionsOf { kinds }) => format!(
                "{path}: on_delete changes from {from} to {to} while {tally} {} of {} {} running: the walk would \
                 treat some referrers by the old rule and the rest by the new one (wait for {} to finish)",
                if one { "deletion" } else { "deletions" },
                kinds.join(" or "),
                if one { "is" } else { "are" },
                if one { "it" } else { "them" },
            ),
            // A rule is only ever built with its own question.
            (rule, question) => format!("{path}: {rule:?} refused by {tally} stored ({question:?})"),
        })
    }
}

impl SchemaDiff {
    /// Nothing changes (the label aside).
    pub fn is_empty(&self) -> bool {
        self.kinds_added.is_empty()
            && self.kinds_removed.is_empty()
            && self.retain_changed.is_empty()
            && self.refs_added.is_empty()
            && self.refs_removed.is_empty()
            && self.refs_changed.is_empty()
    }

    /// The short diff an audit entry and a log line carry:
    /// `kinds +volume -legacy; refs +port.volume -port.old ~port.network (on_delete cascade → block)`.
    pub fn summary(&self) -> String {
        fn signed(sign: char, names: &[String]) -> impl Iterator<Item = String> + '_ {
            names.iter().map(move |n| format!("{sign}{n}"))
        }
        let mut parts = Vec::new();
        let kinds: Vec<String> = signed('+', &self.kinds_added)
            .chain(signed('-', &self.kinds_removed))
            .chain(self.retain_changed.iter().map(|k| format!("~{k} (retain)")))
            .collect();
        if !kinds.is_empty() {
            parts.push(format!("kinds {}", kinds.join(" ")));
        }
        let refs: Vec<String> = signed('+', &self.refs_added)
            .chain(signed('-', &self.refs_removed))
            .chain(
                self.refs_changed
                    .iter()
                    .map(|c| format!("~{}.{} ({})", c.kind, c.field, c.what())),
            )
            .collect();
        if !refs.is_empty() {
            parts.push(format!("refs {}", refs.join(" ")));
        }
        if let Some((old, new)) = &self.label {
            parts.push(format!(
                "label {} → {}",
                old.as_deref().unwrap_or("(none)"),
                new.as_deref().unwrap_or("(none)")
            ));
        }
        if parts.is_empty() {
            return "no change".to_owned();
        }
        parts.join("; ")
    }

    /// The changes stored data may forbid, each with what to count.
    pub fn compat_items(&self) -> Vec<CompatItem> {
        let mut items: Vec<CompatItem> = self
            .kinds_removed
            .iter()
            .map(|kind| CompatItem {
                path: format!("kinds.{kind}"),
                rule: CompatRule::KindRemoved,
                question: StoredQuestion::KindStored { kind: kind.clone() },
            })
            .collect();
        for kf in &self.refs_removed {
            let (kind, field) = kf.split_once('.').unwrap_or((kf.as_str(), ""));
            items.push(CompatItem {
                path: format!("kinds.{kind}.refs.{field}"),
                rule: CompatRule::FieldRemoved,
                question: StoredQuestion::FieldSet {
                    kind: kind.to_owned(),
                    field: field.to_owned(),
                },
            });
        }
        for c in &self.refs_changed {
            let path = format!("kinds.{}.refs.{}", c.kind, c.field);
            if c.old.kind != c.new.kind {
                items.push(CompatItem {
                    path: path.clone(),
                    rule: CompatRule::FieldRetargeted {
                        from: c.old.kind.clone(),
                        to: c.new.kind.clone(),
                    },
                    question: StoredQuestion::FieldSet {
                        kind: c.kind.clone(),
                        field: c.field.clone(),
                    },
                });
            }
            if c.old.on_delete != c.new.on_delete {
                let mut kinds = vec![c.old.kind.clone(), c.kind.clone()];
                kinds.dedup();
                items.push(CompatItem {
                    path,
                    rule: CompatRule::PolicyChanged {
                        from: c.old.on_delete.to_string(),
                        to: c.new.on_delete.to_string(),
                    },
                    question: StoredQuestion::DeletionsOf { kinds },
                });
            }
        }
        items
    }
}

impl Schema {
    /// What `new` adds, removes and changes against this schema.
    pub fn diff(&self, new: &Schema) -> SchemaDiff {
        let mut d = SchemaDiff::default();
        for (kind, spec) in new.kinds() {
            match self.kind(kind) {
                None => {
                    d.kinds_added.push(kind.to_owned());
                    d.refs_added
                        .extend(spec.refs.keys().map(|field| format!("{kind}.{field}")));
                }
                Some(old) => {
                    if self.retain_ms(kind) != new.retain_ms(kind) {
                        d.retain_changed.push(kind.to_owned());
                    }
                    for (field, r) in &spec.refs {
                        match old.refs.get(field) {
                            None => d.refs_added.push(format!("{kind}.{field}")),
                            Some(o) if o != r => d.refs_changed.push(RefChange {
                                kind: kind.to_owned(),
                                field: field.clone(),
                                old: o.clone(),
                                new: r.clone(),
                            }),
                            Some(_) => {}
                        }
                    }
                    d.refs_removed.extend(
                        old.refs
                            .keys()
                            .filter(|f| !spec.refs.contains_key(*f))
                            .map(|field| format!("{kind}.{field}")),
                    );
                }
            }
        }
        d.kinds_removed = self
            .kinds()
            .filter(|(k, _)| new.kind(k).is_none())
            .map(|(k, _)| k.to_owned())
            .collect();
        if self.label() != new.label() {
            d.label = Some((self.label().map(str::to_owned), new.label().map(str::to_owned)));
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = r#"
[kinds.network]
[kinds.legacy]
[kinds.port.refs.network]
kind = "network"
on_delete = "cascade"
[kinds.port.refs.old]
kind = "legacy"
on_delete = "unset"
"#;

    const NEW: &str = r#"
label = "volumes"
[kinds.network]
[kinds.volume]
[kinds.port.refs.network]
kind = "network"
on_delete = "block"
[kinds.port.refs.volume]
kind = "volume"
on_delete = "cascade"
"#;

    #[test]
    fn a_diff_names_what_is_added_removed_and_changed() {
        let (old, new) = (Schema::from_toml(OLD).unwrap(), Schema::from_toml(NEW).unwrap());
        let d = old.diff(&new);
        assert_eq!(d.kinds_added, ["volume"]);
        assert_eq!(d.kinds_removed, ["legacy"]);
        assert_eq!(d.refs_added, ["port.volume"]);
        assert_eq!(d.refs_removed, ["port.old"]);
        assert_eq!(
            d.summary(),
            "kinds +volume -legacy; refs +port.volume -port.old ~port.network (on_delete cascade → block); \
             label (none) → volumes"
        );
        assert!(old.diff(&old).is_empty());
        assert_eq!(old.diff(&old).summary(), "no change");
    }

    #[test]
    fn each_forbidding_change_asks_its_count_and_is_refused_only_when_it_is_not_zero() {
        let (old, new) = (Schema::from_toml(OLD).unwrap(), Schema::from_toml(NEW).unwrap());
        let items = old.diff(&new).compat_items();
        let paths: Vec<&str> = items.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(
            paths,
            ["kinds.legacy", "kinds.port.refs.old", "kinds.port.refs.network"]
        );
        assert_eq!(items[0].judge(Tally::default()), None);
        assert_eq!(
            items[0]
                .judge(Tally {
                    count: 3,
                    at_least: false
                })
                .unwrap(),
            "kinds.legacy: removed, but 3 stored resources are of kind legacy: they would be orphaned \
             (delete them first)"
        );
        let field = items[1]
            .judge(Tally {
                count: 10_000,
                at_least: true,
            })
            .unwrap();
        assert!(
            field.starts_with("kinds.port.refs.old: removed, but at least 10000 stored port resources set old"),
            "{field}"
        );
        let policy = items[2]
            .judge(Tally {
                count: 1,
                at_least: false,
            })
            .unwrap();
        assert!(
            policy.starts_with(
                "kinds.port.refs.network: on_delete changes from cascade to block while 1 deletion of network or \
                 port is running"
            ),
            "{policy}"
        );
    }

    #[test]
    fn the_canonical_form_ignores_order_comments_defaults_and_the_label() {
        let a = Schema::from_toml(OLD).unwrap();
        let b = Schema::from_toml(
            "label = \"x\"\n# same kinds, other order\n[kinds.port.refs.old]\nkind = \"legacy\"\non_delete = \"unset\"\n\
             many = false\n[kinds.port.refs.network]\nkind = \"network\"\non_delete = \"cascade\"\n[kinds.legacy]\n\
             [kinds.network]\n",
        )
        .unwrap();
        assert_eq!(a.canonical_text(), b.canonical_text());
        let c = Schema::from_toml(NEW).unwrap();
        assert_ne!(a.canonical_text(), c.canonical_text());
    }
}
