//! A schema reload during the cascade (issue 31, behind
//! [`Config::schema_change`]): any region reloads its schema between two
//! of its steps, at any moment of the cascade, as the node's writer does
//! (`cascade-node`'s `writer/schema_swap.rs`, one message between two
//! steps). Each region goes, one reload at a time, through
//! [`SCHEMAS`]: the example schema, then the same with a kind `volume` and
//! its reference `volume.project` added, then with
//! `router.gateway_network` (the `block` reference that holds
//! `ra/network/n2`) changed to `unset`.
//!
//! A reload is judged as the node judges it: the core's
//! [`cascade_core::schema::SchemaDiff::compat_items`], each counted over
//! the region's stored state as the node counts its store (resources of a
//! kind, resources setting a field, the region's deletions and unpurged
//! remote deletions of the kinds) and [`CompatItem::judge`]d. A refused
//! reload changes nothing (the schema in force stays): in the model it is
//! a step that only notes the refusal, never one that applies the schema.
//! So the policy change lands in a region only before the cascade reaches
//! a network or router there, or after it finished there; the kind added
//! lands any time. From its next step, the region runs under the new
//! schema (`CascadeModel::ctx`), while the others run the old one.
//!
//! Back-reference rows keep the `on_delete` they were attached with (a
//! reload does not rewrite them; README "Changing the schema"), so the
//! invariants are checked against the example schema, which every stored
//! row was attached under: no reference is created here after a reload.

use cascade_core::schema::{CompatItem, Schema, StoredQuestion, Tally, EXAMPLE_SCHEMA};
use cascade_core::ResourceState;

use super::{Action, CascadeModel, State};

/// The schemas a region goes through, in order (see the module doc).
pub const SCHEMAS: usize = 3;

/// The example schema with `volume` added, and with the router's gateway
/// `unset` instead of `block`.
pub(crate) fn schemas() -> Vec<Schema> {
    let base = EXAMPLE_SCHEMA.to_owned();
    let volume = "\n[kinds.volume.refs.project]\nkind = \"project\"\non_delete = \"cascade\"\nrequired = true\n";
    let added = format!("label = \"volumes\"\n{base}{volume}");
    let unset = added.replace(
        "[kinds.router.refs.gateway_network]\nkind = \"network\"\non_delete = \"block\"",
        "[kinds.router.refs.gateway_network]\nkind = \"network\"\non_delete = \"unset\"",
    );
    assert_ne!(
        unset, added,
        "the example schema's gateway_network is a block reference"
    );
    [base, added, unset]
        .iter()
        .map(|text| Schema::from_toml(text).expect("a schema of the model"))
        .collect()
}

/// A region's count of what `question` asks, over its stored state (the
/// node's `writer/schema_swap.rs` `count`, over `MemoryState`).
fn count(s: &State, region: usize, question: &StoredQuestion) -> Tally {
    let st = &s.regions[region].state;
    let n = match question {
        StoredQuestion::KindStored { kind } => st.resources.keys().filter(|n| n.kind() == kind).count(),
        StoredQuestion::FieldSet { kind, field } => st
            .resources
            .values()
            .filter(|r| r.name.kind() == kind && r.refs.get(field).is_some_and(|t| !t.is_empty()))
            .count(),
        StoredQuestion::DeletionsOf { kinds } => {
            let of = |kind: &str| kinds.iter().any(|k| k == kind);
            st.deletions.values().filter(|d| of(d.target.name.kind())).count()
                + st.remote_deletions
                    .values()
                    .filter(|d| !d.purged && of(d.target.name.kind()))
                    .count()
        }
    };
    Tally {
        count: n as u64,
        at_least: false,
    }
}

impl CascadeModel {
    /// A region may reload to its next schema while it has one.
    pub(crate) fn schema_actions(&self, s: &State, actions: &mut Vec<Action>) {
        if !self.config.schema_change {
            return;
        }
        for (region, at) in s.schema_at.iter().enumerate() {
            // A refused reload is asked again once something else happened
            // (the operator's next SIGHUP): asked again in the same state,
            // it would be a loop that changes nothing.
            if usize::from(*at) + 1 < SCHEMAS && !s.reload_refused[region] {
                actions.push(Action::ReloadSchema { region });
            }
        }
    }

    /// The reload's refusals, judged as the node judges them.
    pub fn reload_refusals(&self, s: &State, region: usize) -> Vec<String> {
        let at = usize::from(s.schema_at[region]);
        let diff = self.schemas[at].diff(&self.schemas[at + 1]);
        diff.compat_items()
            .iter()
            .filter_map(|item: &CompatItem| item.judge(count(s, region, &item.question)))
            .collect()
    }

    pub(crate) fn reload_step(&self, s: &mut State, region: usize) {
        if self.reload_refusals(s, region).is_empty() {
            s.schema_at[region] += 1;
            if usize::from(s.schema_at[region]) + 1 == SCHEMAS {
                s.changed_while_deleting[region] = Self::deleting_there(s, region);
            }
        } else {
            s.reload_refused[region] = true;
            s.ever_refused = true;
        }
    }

    /// A region put the policy change in force while a network or router
    /// of the cascade was DELETING there (what the compatibility check
    /// refuses): never, if the check is the node's.
    pub fn changed_under_a_deletion(&self, s: &State) -> Vec<String> {
        (0..3)
            .filter(|r| usize::from(s.schema_at[*r]) + 1 == SCHEMAS && s.changed_while_deleting[*r])
            .map(|r| {
                format!(
                    "{} changed router.gateway_network under a running deletion",
                    super::REGIONS[r]
                )
            })
            .collect()
    }

    /// Whether a network or router is DELETING in `region` (read from its
    /// resources, not the check's counts).
    pub(crate) fn deleting_there(s: &State, region: usize) -> bool {
        s.regions[region]
            .state
            .resources
            .values()
            .any(|r| matches!(r.name.kind(), "network" | "router") && r.state == ResourceState::Deleting)
    }
}
