//! `cascade schema check`: the deletions a schema can leave stuck, found
//! before any node runs it (seed 002: Goten does not detect deletions stuck
//! by an error in the schema; Cascade explains them statically here, and
//! at run time in a deletion's BLOCKED reason).
//!
//! The cascade graph has an edge from a kind to every kind whose `cascade`
//! reference points at it (deleting a `network` deletes its `port`s). A
//! deletion started at kind R can get stuck at a kind T it reaches when
//! some kind B holds a `block` reference to T and a deletion of R does not
//! also delete B: the T waits, DELETING, until someone deletes B by hand.
//! Every such (R, T, B) is reported once, with the shortest cascade path
//! from R to T. Cycles of cascade references are reported too: they are
//! not errors (a resource entering DELETING releases its own references, so
//! a cycle unwinds), but deleting any member deletes every other one.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::Serialize;

use super::{OnDelete, Schema};

/// Stuck paths reported at most (a bound against hostile schemas).
const MAX_REPORTED: usize = 1_000;

/// A cascade path that can end in a deletion waiting on a `block` reference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StuckPath {
    /// Kinds in cascade order: the deleted kind first, the kind that waits last.
    pub path: Vec<String>,
    /// The reference each step follows (`port.network`: a `port` is
    /// deleted with the `network` it references), one per step.
    pub via: Vec<String>,
    /// The `block` reference that holds the last kind (`router.gateway_network`).
    pub blocked_by: String,
}

/// What [`Schema::check`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SchemaCheck {
    /// Cascade paths that can get stuck, deleted kind and blocker in name order.
    pub stuck: Vec<StuckPath>,
    /// Cycles of cascade references, each from its smallest kind back to it.
    pub cycles: Vec<Vec<String>>,
    /// More stuck paths were found than are listed.
    pub truncated: bool,
}

impl SchemaCheck {
    /// One line per finding, as `cascade schema check` and `cascade serve`
    /// print them.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .stuck
            .iter()
            .map(|s| {
                let (first, last) = (&s.path[0], &s.path[s.path.len() - 1]);
                let blocker = s.blocked_by.split('.').next().unwrap_or_default();
                format!(
                    "stuck: deleting a {first} cascades {} (via {}) to a {last}, which a {blocker} can block ({}); \
                     the {first}'s cascade does not delete the {blocker}, so the {last} waits DELETING until the \
                     {blocker} is deleted or changed by hand",
                    s.path.join(" → "),
                    s.via.join(", "),
                    s.blocked_by
                )
            })
            .collect();
        if self.truncated {
            out.push(format!("stuck: more paths than the {MAX_REPORTED} listed"));
        }
        out.extend(self.cycles.iter().map(|c| {
            format!(
                "cycle: {} (deleting any of them deletes the others; the cascade unwinds it)",
                c.join(" → ")
            )
        }));
        out
    }
}

impl Schema {
    /// The cascade paths that can get stuck and the cascade cycles (see
    /// the module doc of `schema::check`).
    pub fn check(&self) -> SchemaCheck {
        // kind → (referrer kind, field) deleted with it.
        let mut cascades_to: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
        let mut blocks: Vec<(&str, &str, &str)> = Vec::new(); // (blocker, field, target)
        for (kind, spec) in self.kinds() {
            for (field, r) in &spec.refs {
                match r.on_delete {
                    OnDelete::Cascade => cascades_to.entry(r.kind.as_str()).or_default().push((kind, field)),
                    OnDelete::Block => blocks.push((kind, field, r.kind.as_str())),
                    OnDelete::Unset | OnDelete::AllowDangling => {}
                }
            }
        }
        let mut check = SchemaCheck::default();
        let mut cycle_members: BTreeSet<String> = BTreeSet::new();
        for (start, _) in self.kinds() {
            // Shortest cascade paths from `start`: kind → (previous kind, field).
            let mut previous: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
            let mut queue = VecDeque::from([start]);
            let mut reached = BTreeSet::from([start]);
            let mut back_to_start: Option<&str> = None;
            while let Some(k) = queue.pop_front() {
                for &(next, field) in cascades_to.get(k).map(Vec::as_slice).unwrap_or_default() {
                    if next == start && back_to_start.is_none() {
                        back_to_start = Some(k);
                    }
                    if reached.insert(next) {
                        previous.insert(next, (k, field));
                        queue.push_back(next);
                    }
                }
            }
            let path_to = |end: &str| -> (Vec<String>, Vec<String>) {
                let (mut kinds, mut via) = (vec![end.to_owned()], Vec::new());
                let mut at = end;
                while let Some(&(prev, field)) = previous.get(at) {
                    kinds.push(prev.to_owned());
                    via.push(format!("{at}.{field}"));
                    at = prev;
                }
                kinds.reverse();
                via.reverse();
                (kinds, via)
            };
            if let Some(last) = back_to_start {
                if !cycle_members.contains(start) {
                    let (mut kinds, _) = path_to(last);
                    kinds.push(start.to_owned());
                    cycle_members.extend(kinds.iter().cloned());
                    check.cycles.push(kinds);
                }
            }
            for &(blocker, field, target) in &blocks {
                if target == start || !previous.contains_key(target) || reached.contains(blocker) {
                    continue;
                }
                if check.stuck.len() >= MAX_REPORTED {
                    check.truncated = true;
                    continue;
                }
                let (path, via) = path_to(target);
                check.stuck.push(StuckPath {
                    path,
                    via,
                    blocked_by: format!("{blocker}.{field}"),
                });
            }
        }
        check
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seed 002's example: deleting an `a` cascades to its `c`s; a `d`,
    /// which no cascade from an `a` deletes, may block a `c`.
    const SEED_002: &str = r#"
[kinds.a]
[kinds.d]
[kinds.c.refs.a]
kind = "a"
on_delete = "cascade"
[kinds.d.refs.c]
kind = "c"
on_delete = "block"
"#;

    #[test]
    fn seed_002_names_the_path_from_a_to_c_blocked_by_d() {
        let check = Schema::from_toml(SEED_002).expect("loads").check();
        assert_eq!(
            check.stuck,
            vec![StuckPath {
                path: vec!["a".into(), "c".into()],
                via: vec!["c.a".into()],
                blocked_by: "d.c".into(),
            }]
        );
        assert!(check.cycles.is_empty());
        let lines = check.lines();
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].starts_with("stuck: deleting a a cascades a → c (via c.a) to a c, which a d can block (d.c)"),
            "{}",
            lines[0]
        );
    }

    #[test]
    fn a_blocker_the_same_cascade_deletes_is_not_stuck_and_the_example_schema_is_clean() {
        let with_d_in_the_cascade = format!("{SEED_002}\n[kinds.d.refs.a]\nkind = \"a\"\non_delete = \"cascade\"\n");
        assert_eq!(
            Schema::from_toml(&with_d_in_the_cascade).expect("loads").check(),
            SchemaCheck::default()
        );
        let example = Schema::from_toml(crate::schema::EXAMPLE_SCHEMA).expect("loads");
        assert_eq!(example.check(), SchemaCheck::default());
    }

    #[test]
    fn the_longest_way_is_named_step_by_step_and_cycles_are_reported_once() {
        let text = r#"
[kinds.root]
[kinds.mid.refs.root]
kind = "root"
on_delete = "cascade"
[kinds.leaf.refs.mid]
kind = "mid"
on_delete = "cascade"
[kinds.guard.refs.leaf]
kind = "leaf"
on_delete = "block"
[kinds.x.refs.y]
kind = "y"
on_delete = "cascade"
[kinds.y.refs.x]
kind = "x"
on_delete = "cascade"
[kinds.self_ref.refs.parent]
kind = "self_ref"
on_delete = "cascade"
"#;
        let check = Schema::from_toml(text).expect("loads").check();
        let paths: Vec<(Vec<String>, Vec<String>)> =
            check.stuck.iter().map(|s| (s.path.clone(), s.via.clone())).collect();
        assert_eq!(
            paths,
            vec![
                (vec!["mid".to_owned(), "leaf".to_owned()], vec!["leaf.mid".to_owned()]),
                (
                    vec!["root".to_owned(), "mid".to_owned(), "leaf".to_owned()],
                    vec!["mid.root".to_owned(), "leaf.mid".to_owned()]
                ),
            ]
        );
        assert!(check.stuck.iter().all(|s| s.blocked_by == "guard.leaf"));
        assert_eq!(
            check.cycles,
            vec![
                vec!["self_ref".to_owned(), "self_ref".to_owned()],
                vec!["x".to_owned(), "y".to_owned(), "x".to_owned()],
            ]
        );
    }
}
