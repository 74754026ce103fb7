//! Multi-region property test of the deletion protocol: three regions
//! (`ra`, `rb`, `rc`), each a [`MemoryState`] driven through the core's own
//! functions, with cross-region creates (CREATING → `peer::attach` at the
//! owners → `peer::settle_batch`), the owners' DELETING/PURGED events
//! delivered with `peer::apply_remote_events` (carrying `no_cascade`),
//! releases delivered with `peer::release` + `peer::releases_acknowledged`,
//! `protocol::process_work` in every region, and the node's double collect
//! of every region's part of an operation before
//! `protocol::confirm_remote_closure` lets a waiting root go — all in
//! random partial orders between random creates and user deletes (with
//! `remote_kept` asked of the list owners' regions, as the node does).
//!
//! What it checks:
//!
//! 1. **Intent oracle** (DESIGN invariant 3, checked at every step that
//!    puts a resource in DELETING, and for everything gone at the end):
//!    every resource that leaves is the root of an accepted delete, or was
//!    reached by a cascade of an operation whose request had
//!    `cascade = true`, through a `cascade` reference it held to a resource
//!    the same operation deleted; a list owner goes only once every target
//!    of its list was deleted; a `cascade = false` operation deletes only
//!    its root. An operation's root is purged only once everything else
//!    it deleted, in every region, is purged or FAILED, and nothing enters
//!    DELETING under an operation whose root is gone. Nothing becomes
//!    ACTIVE again, and no owner attaches a new back-reference to a
//!    DELETING target.
//! 2. **Dry run = real run across regions**: for a delete taken when every
//!    region is quiescent, the dry run the node computes (the owner's
//!    `protocol::delete` with `dry_run`, then [`PlanDriver`] over every
//!    region's `peer::plan_from`) predicts exactly what the real delete does
//!    once run to quiescence: the resources the operation deletes, the
//!    (resource, field) pairs it unsets, and the resources it leaves held by
//!    a blocker; a refused dry run means a refused delete, with the same
//!    error.
//! 3. At quiescence: no dangling reference, every live reference has its
//!    back-reference at the owner (and its mirror at the importer), no
//!    leaked back-reference row, no CREATING resource, pending attach,
//!    pending release or due work left, no tombstone of a purged resource,
//!    every DELETING resource FAILED and held by a live blocker, operation
//!    parts agree with their deletion records.
//!
//! Why it exists: the deterministic simulation and the stateright model
//! check both missed a `cascade = false` over-deletion (two deletes without
//! cascade of a list owner's two owners, racing) and cross-region dry-run
//! mispredictions (a list owner emptied from two regions; a block whose
//! blocker the closure deletes in another region), because neither had an
//! intent oracle nor compared dry runs with real runs across regions.
//!
//! What it does not generate: a policy that refuses. Every generated
//! program runs with an empty [`DenyUpdates`], which allows everything, so
//! no walk ever passes a refused referrer, and a refusal never met a
//! budget smaller than its walk (every program's budget is): that is why
//! this property missed an importer's walk that forgot a refusal when its
//! budget ran out right after it
//! (`importer_retries_a_referrer_refused_before_its_walk_ran_out_of_budget`
//! below, the regression). Generating refusals is not a small change: an
//! owner's deletion held by a refusal turns FAILED after
//! `Policy::max_attempts` looks and stays so once the policy allows it
//! (until a retry or a force), which the quiescence checks (3) read as a
//! FAILED deletion with no live blocker; an importer's refused walk
//! retries for ever, so no program quiesces until the policy changes; and
//! the dry run lists refusals (`Plan::denied`) that the comparison (2)
//! would have to match. It needs ops that refuse and allow, a retry of
//! FAILED deletions before the end, and both checks taught about refused
//! holds; until then refusals are covered by the scenarios here and in
//! `tests/protocol.rs`.
//!
//! `PROPTEST_CASES=2000 cargo test -p cascade-core --test multi_region` for
//! a deeper run; `-- --nocapture` prints what the generated programs
//! covered.
//!
//! Size: about 2,300 lines in one file: the program generator, the three-
//! region driver, the intent oracle and the dry-run comparison share private
//! types and one run's state. If it grows, the generator and the oracle are
//! the first to move into modules of their own.

// Progress and results go to the terminal (`--nocapture`).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use cascade_core::auth::{Authorize, Decision, Principal, Target, Verb};
use cascade_core::closure::{ClosureCheck, PartAnswer, PartSummary, Phase, Verdict};
use cascade_core::invariants::{self, RegionView};
use cascade_core::memory::MemoryState;
use cascade_core::peer::{self, PeerBackRef};
use cascade_core::plan::PlanDriver;
use cascade_core::protocol::{self, Ctx, DeleteOutcome, DeleteRequest, Plan, Policy, RefRequest, ResourceSpec};
use cascade_core::state::{StateRead, WriteSet};
use cascade_core::{
    BackRefKey, CoreError, DeletionReason, DeletionRecord, DeletionStatus, Event, EventType, IdSource, OnDelete,
    OperationId, OperationState, OutcomeAction, RefTarget, RegionId, RemoteEvent, Resource, ResourceName,
    ResourceState, Schema, Timestamp, Uid,
};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestError, TestRunner};

/// Owners (chained across regions by `parent`), their single `cascade`
/// children, list owners (`dep_list`, gone with their last owner), `unset`
/// referrers (a single `note`, a list `tag`), and a `guard` that blocks an
/// owner or a child and is itself cascaded from an owner (so a closure may
/// delete the blocker it meets). Each kind has at most one field that a
/// delete can unset, so an operation's `Unset` outcome (one per resource)
/// names it.
const SCHEMA: &str = r#"
[kinds.owner.refs.parent]
kind = "owner"
on_delete = "cascade"

[kinds.child.refs.owner]
kind = "owner"
on_delete = "cascade"
required = true

[kinds.dep_list.refs.owners]
kind = "owner"
on_delete = "cascade"
many = true

[kinds.note.refs.owner]
kind = "owner"
on_delete = "unset"

[kinds.tag.refs.owners]
kind = "owner"
on_delete = "unset"
many = true

[kinds.guard.refs.owner]
kind = "owner"
on_delete = "block"

[kinds.guard.refs.child]
kind = "child"
on_delete = "block"

[kinds.guard.refs.of]
kind = "owner"
on_delete = "cascade"
"#;

const REGIONS: [&str; 3] = ["ra", "rb", "rc"];
/// Creates favour owners and list owners.
const CREATE_KINDS: [&str; 10] = [
    "owner", "owner", "owner", "dep_list", "dep_list", "child", "note", "tag", "guard", "guard",
];
/// Deletes favour owners (the largest closures, the list owners' targets).
const DELETE_KINDS: [&str; 8] = ["owner", "owner", "owner", "owner", "dep_list", "child", "guard", "note"];
/// Names are drawn from a small pool per (region, kind), so names are reused.
const IDS: u8 = 4;
/// Bounds of the drivers' loops: exceeding one is a failure (no progress).
const MAX_WORK_STEPS: usize = 2_000;
const MAX_QUIESCE_ROUNDS: usize = 400;
const MAX_PLAN_ROUNDS: usize = 64;

// ---------------------------------------------------------------------------
// Programs

/// How far a cross-region create gets before the program goes on: the
/// CREATING commit only, the attach at the owners too, or settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Committed,
    Attached,
    Settled,
}

#[derive(Debug, Clone)]
struct CreateOp {
    region: usize,
    kind: usize,
    id: u8,
    /// Which candidates each reference field picks.
    picks: [u8; 4],
    /// Whether each optional field is set.
    set: [bool; 3],
    stage: Stage,
}

#[derive(Debug, Clone)]
enum Op {
    Create(CreateOp),
    /// A user delete of a resource of `DELETE_KINDS[kind]` (any kind when
    /// there is none), ACTIVE or already DELETING.
    Delete {
        kind: usize,
        pick: u8,
        cascade: bool,
    },
    /// Two user deletes of two owners of one list owner, one right after the
    /// other, before any work or delivery (the race of `cascade = false`).
    RaceListOwners {
        pick: u8,
        first: u8,
        second: u8,
        cascade: [bool; 2],
    },
    /// Up to `steps` `process_work` steps in one region.
    Work {
        region: usize,
        steps: u8,
    },
    /// The watcher applies the owner's next `events` DELETING/PURGED events.
    Deliver {
        owner: usize,
        watcher: usize,
        events: u8,
    },
    /// The importer's pending releases to the owner, applied and acknowledged.
    Release {
        importer: usize,
        owner: usize,
    },
    /// One round of the network: every undelivered event and pending
    /// release delivered, then up to `steps` work steps in every region
    /// (no closure confirmed, no create advanced).
    Pump {
        steps: u8,
    },
    /// The next stage of a pending cross-region create (attach, then settle).
    AdvanceCreate {
        pick: u8,
    },
    /// The clock moves to the next scheduled retry.
    Tick,
    /// Everything delivered and run until nothing is due; invariants checked.
    Quiesce,
    /// Quiesce, dry-run a delete across regions, run it to quiescence and
    /// compare. With `dependents`, of a resource that has `cascade`
    /// referrers (a larger closure), when there is one.
    CheckedDelete {
        kind: usize,
        pick: u8,
        cascade: bool,
        dependents: bool,
    },
    /// The node's closure check for a root that waits for other regions'
    /// parts of its operation, with `between` run at point `at` (0: after
    /// the local read, 1: after the first region's first read, 2: between
    /// the two collects, 3: before the confirm).
    CollectClosure {
        pick: u8,
        at: u8,
        between: Between,
    },
}

/// A step that may run in the middle of a double collect.
#[derive(Debug, Clone, Copy)]
enum Between {
    Nothing,
    Work(usize),
    Deliver { owner: usize, watcher: usize },
    Release { importer: usize, owner: usize },
}

/// A step of the initial forest: a random create, or a motif that builds
/// the shapes the properties are about (fresh names, settled creates).
#[derive(Debug, Clone)]
enum Seed {
    Create(CreateOp),
    /// Owners in each of `owners`' regions, and in `list`'s region a list
    /// owner of all of them (the targets of the `cascade = false` races).
    SharedList {
        owners: Vec<usize>,
        list: usize,
    },
    /// Owner `a` ← owner `b` (`parent` = a) ← child `c` (`owner` = b), and a
    /// guard blocking `c` (or `b`), itself cascaded from `a` (then a delete
    /// of `a` deletes the blocker too) or from an owner of its own.
    BlockedChain {
        regions: [usize; 4],
        block_child: bool,
        of_root: bool,
    },
    /// Owner `r`, two owners with `parent` = r in the `mids` regions, and in
    /// `list`'s region a list owner of those two (and of a third, live
    /// owner when `keeper`): a delete of `r` reaches the list owner from two
    /// regions, so its dry run must re-plan that region from both.
    CrossList {
        root: usize,
        mids: [usize; 2],
        list: usize,
        keeper: bool,
    },
}

#[derive(Clone)]
struct Program {
    /// `Policy::batch_budget` and `batch_items` of every region: small, so
    /// a deletion takes several steps.
    batch_budget: usize,
    batch_items: usize,
    forest: Vec<Seed>,
    ops: Vec<Op>,
}

impl fmt::Debug for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "Program {{ batch_budget: {}, batch_items: {}",
            self.batch_budget, self.batch_items
        )?;
        writeln!(f, "  forest (created and settled, in order):")?;
        for c in &self.forest {
            writeln!(f, "    {c:?}")?;
        }
        writeln!(f, "  ops:")?;
        for op in &self.ops {
            writeln!(f, "    {op:?}")?;
        }
        write!(f, "}}")
    }
}

fn create_op(stages: bool) -> impl Strategy<Value = CreateOp> {
    let stage = if stages {
        prop_oneof![
            1 => Just(Stage::Committed),
            1 => Just(Stage::Attached),
            3 => Just(Stage::Settled),
        ]
        .boxed()
    } else {
        Just(Stage::Settled).boxed()
    };
    (
        0..REGIONS.len(),
        0..CREATE_KINDS.len(),
        0..IDS,
        any::<[u8; 4]>(),
        any::<[bool; 3]>(),
        stage,
    )
        .prop_map(|(region, kind, id, picks, set, stage)| CreateOp {
            region,
            kind,
            id,
            picks,
            set,
            stage,
        })
}

/// Deletes go without cascade half the time, a race's mostly.
fn op() -> impl Strategy<Value = Op> {
    let pair = (0..REGIONS.len(), 1..REGIONS.len());
    prop_oneof![
        3 => create_op(true).prop_map(Op::Create),
        4 => (0..DELETE_KINDS.len(), any::<u8>(), any::<bool>())
            .prop_map(|(kind, pick, cascade)| Op::Delete { kind, pick, cascade }),
        2 => (any::<u8>(), any::<u8>(), any::<u8>(), prop::array::uniform2(prop::bool::weighted(0.25)))
            .prop_map(|(pick, first, second, cascade)| Op::RaceListOwners { pick, first, second, cascade }),
        4 => (0..REGIONS.len(), 1u8..5).prop_map(|(region, steps)| Op::Work { region, steps }),
        4 => (pair.clone(), 1u8..4).prop_map(|((owner, d), events)| Op::Deliver {
            owner,
            watcher: (owner + d) % REGIONS.len(),
            events,
        }),
        3 => pair.prop_map(|(owner, d)| Op::Release { importer: (owner + d) % REGIONS.len(), owner }),
        2 => (1u8..4).prop_map(|steps| Op::Pump { steps }),
        2 => any::<u8>().prop_map(|pick| Op::AdvanceCreate { pick }),
        1 => Just(Op::Tick),
        1 => Just(Op::Quiesce),
        3 => (0..DELETE_KINDS.len(), any::<u8>(), any::<bool>(), any::<bool>())
            .prop_map(|(kind, pick, cascade, dependents)| Op::CheckedDelete { kind, pick, cascade, dependents }),
        2 => (any::<u8>(), 0u8..4, between()).prop_map(|(pick, at, between)| Op::CollectClosure { pick, at, between }),
    ]
}

fn between() -> impl Strategy<Value = Between> {
    let pair = (0..REGIONS.len(), 1..REGIONS.len());
    prop_oneof![
        1 => Just(Between::Nothing),
        1 => (0..REGIONS.len()).prop_map(Between::Work),
        2 => pair.clone().prop_map(|(owner, d)| Between::Deliver { owner, watcher: (owner + d) % REGIONS.len() }),
        1 => pair.prop_map(|(owner, d)| Between::Release { importer: (owner + d) % REGIONS.len(), owner }),
    ]
}

fn region() -> impl Strategy<Value = usize> {
    0..REGIONS.len()
}

fn seed() -> impl Strategy<Value = Seed> {
    prop_oneof![
        6 => create_op(false).prop_map(Seed::Create),
        2 => (prop::collection::vec(region(), 2..4), region())
            .prop_map(|(owners, list)| Seed::SharedList { owners, list }),
        1 => (prop::array::uniform4(region()), any::<bool>(), any::<bool>()).prop_map(
            |(regions, block_child, of_root)| Seed::BlockedChain { regions, block_child, of_root }
        ),
        1 => (region(), prop::array::uniform2(region()), region(), any::<bool>())
            .prop_map(|(root, mids, list, keeper)| Seed::CrossList { root, mids, list, keeper }),
    ]
}

fn program() -> impl Strategy<Value = Program> {
    (
        1usize..5,
        1usize..5,
        prop::collection::vec(seed(), 1..30),
        prop::collection::vec(op(), 1..70),
    )
        .prop_map(|(batch_budget, batch_items, forest, ops)| Program {
            batch_budget,
            batch_items,
            forest,
            ops,
        })
}

// ---------------------------------------------------------------------------
// The world: three regions and the oracle's records

/// Uids and operation ids of one region: v7-shaped, increasing, and
/// disjoint from the other regions' (`offset` apart).
struct RegionIds {
    offset: u64,
    next: u64,
}

impl IdSource for RegionIds {
    fn next_uuid(&mut self) -> uuid::Uuid {
        self.next += 1;
        uuid::Builder::from_unix_timestamp_millis(self.offset + self.next, &[0; 10]).into_uuid()
    }
}

struct Region {
    id: RegionId,
    state: MemoryState,
    ids: RegionIds,
}

/// An accepted user delete.
struct Accepted {
    /// Its number in the trace (`op#n`).
    n: usize,
    root: RefTarget,
    cascade: bool,
}

/// A resource's entry into DELETING, as its deletion record said.
struct Entered {
    operation: OperationId,
}

/// A cross-region create between its CREATING commit and its settlement.
struct PendingCreate {
    region: usize,
    name: ResourceName,
    uid: Uid,
    /// After the attach: the keys it covered and the owners' answer.
    attached: Option<(Vec<BackRefKey>, Result<(), CoreError>)>,
}

/// What the generated programs covered (printed with `--nocapture`).
#[derive(Debug, Default)]
struct Stats {
    cases: usize,
    resources_created: usize,
    cross_region_creates: usize,
    creates_aborted: usize,
    deletes_accepted_cascade: usize,
    deletes_accepted_no_cascade: usize,
    deletes_refused: usize,
    /// Races by where the two owners and the list owner are: "all in one
    /// region", "owners in one, list in another", "owners in two regions".
    races_both_accepted: BTreeMap<&'static str, usize>,
    races_second_refused: BTreeMap<&'static str, usize>,
    collect_ops_run: usize,
    /// List owners that survived (at the end) with no owner left: the
    /// races in which both deletes without cascade were accepted.
    list_owners_left_empty: usize,
    checked_deletes: usize,
    checked_refused: usize,
    checked_no_cascade: usize,
    checked_spanning_regions: usize,
    checked_with_unset: usize,
    checked_with_blocks: usize,
    checked_list_owner_deleted: usize,
    /// Dry runs in which a region was planned again from grown seeds.
    checked_replanned: usize,
    closures_confirmed: usize,
    closure_confirms_declined: usize,
    /// PURGED events an owner's watch leaves out, applied alone at the
    /// watcher to check that they would have changed nothing there.
    left_out_events_checked: usize,
}

struct World {
    schema: Schema,
    policy: Policy,
    /// Every region's policy (see [`DenyUpdates`]).
    authorizer: DenyUpdates,
    now: Timestamp,
    regions: Vec<Region>,
    creates: Vec<PendingCreate>,
    /// Every resource that was ever ACTIVE, as it was created (no program
    /// updates a resource, so these are all the references it ever held).
    created: BTreeMap<Uid, Resource>,
    /// Every resource that entered DELETING.
    entered: BTreeMap<Uid, Entered>,
    purged: BTreeSet<Uid>,
    accepted: BTreeMap<OperationId, Accepted>,
    /// Operations whose root waits for other regions' parts, by the root's
    /// region (the writer's work reports, as the node collects them).
    awaiting: BTreeSet<(usize, OperationId)>,
    /// What the program did, resolved to names: printed with a failure.
    trace: Vec<String>,
    stats: Stats,
}

/// Every region's policy: the deletion's principal may `update` every
/// resource but those named in `no_update`. Empty (every generated
/// program), it allows everything, as `AllowAll` does, and says so, so the
/// cascade skips its per-member checks exactly as with `AllowAll`.
#[derive(Default)]
struct DenyUpdates {
    no_update: BTreeSet<ResourceName>,
}

impl Authorize for DenyUpdates {
    fn decide(&self, _: &Principal, verb: Verb, target: Target<'_>) -> Decision {
        match target {
            Target::Resource(name) if verb == Verb::Update && self.no_update.contains(name) => {
                Decision::deny("test: no update")
            }
            _ => Decision::allow("test: allowed"),
        }
    }

    fn allows_everything(&self) -> bool {
        self.no_update.is_empty()
    }
}

fn ctx<'a>(
    schema: &'a Schema,
    policy: &'a Policy,
    region: &'a RegionId,
    now: Timestamp,
    authorizer: &'a DenyUpdates,
) -> Ctx<'a> {
    Ctx {
        schema,
        region,
        now,
        policy,
        authorizer,
    }
}

fn region_of(name: &ResourceName) -> usize {
    REGIONS
        .iter()
        .position(|r| *r == name.region())
        .expect("a name of one of the three regions")
}

fn target_of(r: &Resource) -> RefTarget {
    RefTarget {
        name: r.name.clone(),
        uid: r.uid,
    }
}

type Checked<T> = Result<T, String>;

impl World {
    fn new(batch_budget: usize, batch_items: usize) -> Self {
        World {
            schema: Schema::from_toml(SCHEMA).expect("test schema"),
            policy: Policy {
                batch_budget,
                batch_items,
                backoff_base_ms: 10,
                backoff_cap_ms: 40,
                max_attempts: 2,
                ..Policy::default()
            },
            authorizer: DenyUpdates::default(),
            now: Timestamp(1_000_000),
            regions: REGIONS
                .iter()
                .enumerate()
                .map(|(i, r)| Region {
                    id: RegionId::parse(r).unwrap(),
                    state: MemoryState::default(),
                    ids: RegionIds {
                        offset: 1_000_000_000 * (i as u64 + 1),
                        next: 0,
                    },
                })
                .collect(),
            creates: Vec::new(),
            created: BTreeMap::new(),
            entered: BTreeMap::new(),
            purged: BTreeSet::new(),
            accepted: BTreeMap::new(),
            awaiting: BTreeSet::new(),
            trace: Vec::new(),
            stats: Stats::default(),
        }
    }

    fn ctx(&self, r: usize) -> Ctx<'_> {
        ctx(
            &self.schema,
            &self.policy,
            &self.regions[r].id,
            self.now,
            &self.authorizer,
        )
    }

    fn note(&mut self, line: String) {
        self.trace.push(line);
    }

    /// The failure message: what failed, then what the program did.
    fn failure(&self, what: &str) -> String {
        let skip = self.trace.len().saturating_sub(150);
        let mut msg = format!(
            "{what}\n--- trace (the last {} of {} lines) ---\n",
            self.trace.len() - skip,
            self.trace.len()
        );
        for line in &self.trace[skip..] {
            msg += line;
            msg.push('\n');
        }
        msg
    }

    /// The incarnation `uid` of `name`, if its region still holds it.
    fn find(&self, name: &ResourceName, uid: Uid) -> Option<&Resource> {
        self.regions[region_of(name)]
            .state
            .resources
            .get(name)
            .filter(|r| r.uid == uid)
    }

    fn op_label(&self, id: OperationId) -> String {
        match self.accepted.get(&id) {
            Some(a) => format!("op#{} (delete {} cascade={})", a.n, a.root.name, a.cascade),
            None => format!("unknown operation {id}"),
        }
    }

    // -- commits and the checks made at every step ---------------------------

    /// Applies one step's writes to region `r`, after checking what they
    /// do against the oracle.
    fn commit(&mut self, r: usize, writes: WriteSet) -> Checked<()> {
        let region = REGIONS[r];
        for (key, row) in &writes.backrefs {
            let Some(row) = row else { continue };
            if row.target.name.region() != region || self.regions[r].state.backrefs.contains_key(key) {
                continue;
            }
            let target = self.find(&row.target.name, row.target.uid);
            if target.is_some_and(|t| t.state == ResourceState::Deleting) {
                return Err(format!(
                    "(2) {region} attached a new back-reference from {} ({}) to DELETING {}",
                    row.referrer.name, row.field, row.target.name
                ));
            }
        }
        for e in &writes.events {
            match e.event_type {
                EventType::Created => {
                    let snap = e
                        .snapshot
                        .clone()
                        .ok_or_else(|| format!("CREATED event of {} without a snapshot", e.resource.name))?;
                    if self.entered.contains_key(&snap.uid) {
                        return Err(format!("(2) {} created again under a uid that was DELETING", snap.name));
                    }
                    self.stats.resources_created += 1;
                    self.created.insert(snap.uid, snap);
                }
                EventType::Updated => {
                    if let Some(snap) = &e.snapshot {
                        if snap.state == ResourceState::Active && self.entered.contains_key(&snap.uid) {
                            return Err(format!("(2) {} ACTIVE again after DELETING", snap.name));
                        }
                    }
                }
                EventType::Deleting => {
                    let ended_here = writes.events.iter().any(|p| {
                        matches!(p.event_type, EventType::Purged | EventType::SoftDeleted)
                            && p.resource.uid == e.resource.uid
                    });
                    let record = match writes.deletions.get(&e.resource.uid) {
                        Some(Some(d)) => d.clone(),
                        // A root nothing references ends in the step that
                        // accepts it (`work::finish_accepted`): its record is
                        // written and removed in that one step, its end's
                        // event follows this one, and the DELETING event
                        // carries the record's operation and cause.
                        Some(None) if ended_here => {
                            let (Some(operation), Some(reason)) = (e.operation, e.cause.clone()) else {
                                return Err(format!(
                                    "{} entered and left DELETING in one step, and its event names no operation and cause",
                                    e.resource.name
                                ));
                            };
                            record_of_event(e, operation, reason)
                        }
                        _ => {
                            return Err(format!(
                                "{} entered DELETING without its deletion record in the same step",
                                e.resource.name
                            ))
                        }
                    };
                    if e.operation != Some(record.operation) {
                        return Err(format!("DELETING event of {} names another operation", e.resource.name));
                    }
                    self.check_entered(region, &record)?;
                    let no_cascade = self.accepted.get(&record.operation).is_some_and(|a| !a.cascade);
                    if e.no_cascade != no_cascade {
                        return Err(format!(
                            "DELETING event of {} says no_cascade={} for {}",
                            e.resource.name,
                            e.no_cascade,
                            self.op_label(record.operation)
                        ));
                    }
                    self.entered.insert(
                        record.target.uid,
                        Entered {
                            operation: record.operation,
                        },
                    );
                }
                EventType::Purged => {
                    if !self.entered.contains_key(&e.resource.uid) {
                        // An unreferenced leaf a cascade purged at once
                        // (`purge_leaf`): it never entered DELETING, so its
                        // event carries the cause a deletion record would.
                        // The same rules hold for it as for any deletion.
                        let (Some(operation), Some(reason)) = (e.operation, e.cause.clone()) else {
                            return Err(format!(
                                "{} purged without entering DELETING, and its event names no operation and cause",
                                e.resource.name
                            ));
                        };
                        if writes.deletions.get(&e.resource.uid).is_some_and(Option::is_some) {
                            return Err(format!("{} purged with a deletion record left", e.resource.name));
                        }
                        let record = record_of_event(e, operation, reason);
                        self.check_entered(region, &record)?;
                        self.entered.insert(e.resource.uid, Entered { operation });
                    }
                    self.purged.insert(e.resource.uid);
                }
                _ => {}
            }
        }
        let roots: Vec<OperationId> = writes
            .events
            .iter()
            .filter(|e| e.event_type == EventType::Purged)
            .filter_map(|e| {
                self.accepted
                    .iter()
                    .find(|(_, a)| a.root.uid == e.resource.uid)
                    .map(|(id, _)| *id)
            })
            .collect();
        self.regions[r].state.apply(writes);
        for op in roots {
            self.check_root_purge(op)?;
        }
        Ok(())
    }

    /// The root of an operation is purged only once every other resource
    /// the operation deleted, in every region, is purged or FAILED.
    fn check_root_purge(&self, op: OperationId) -> Checked<()> {
        for (uid, e) in &self.entered {
            if e.operation != op || *uid == self.accepted[&op].root.uid || self.purged.contains(uid) {
                continue;
            }
            let name = &self.created[uid].name;
            let status = self.regions[region_of(name)]
                .state
                .deletions
                .get(uid)
                .map(|d| &d.status);
            if !matches!(status, Some(DeletionStatus::Failed { .. })) {
                return Err(format!(
                    "the root of {} was purged while {name} of its closure is {status:?}",
                    self.op_label(op)
                ));
            }
        }
        Ok(())
    }

    /// The intent oracle, at the step that puts a resource in DELETING.
    fn check_entered(&self, region: &str, record: &DeletionRecord) -> Checked<()> {
        let name = &record.target.name;
        let uid = record.target.uid;
        let op = self.accepted.get(&record.operation).ok_or_else(|| {
            format!(
                "(3) {region}: {name} entered DELETING under operation {} that no accepted delete started",
                record.operation
            )
        })?;
        let label = self.op_label(record.operation);
        if self.purged.contains(&op.root.uid) {
            return Err(format!(
                "{name} entered DELETING under {label}, whose root was already purged"
            ));
        }
        let original = self
            .created
            .get(&uid)
            .ok_or_else(|| format!("{name} entered DELETING but was never ACTIVE"))?;
        match &record.reason {
            DeletionReason::Requested => {
                if op.root.uid != uid {
                    return Err(format!("(3) {name} entered DELETING as requested by {label}"));
                }
            }
            DeletionReason::Cascade { from, field } => {
                if !op.cascade {
                    return Err(format!(
                        "(3) over-deletion: {name} deleted by a cascade (from {from}, field {field}) of {label}, \
                         a delete without cascade"
                    ));
                }
                let spec = self.schema.reference(name.kind(), field);
                if spec.is_none_or(|s| s.on_delete != OnDelete::Cascade) {
                    return Err(format!(
                        "(3) {name} deleted by {label} through {field}, not a cascade reference"
                    ));
                }
                let targets = original.refs.get(field).cloned().unwrap_or_default();
                let Some(source) = targets.iter().find(|t| t.name == *from) else {
                    return Err(format!(
                        "(3) {name} deleted by {label} as a cascade from {from} through {field}, which it never held"
                    ));
                };
                match self.entered.get(&source.uid) {
                    Some(e) if e.operation == record.operation => {}
                    Some(e) => {
                        return Err(format!(
                            "(3) {name} deleted by {label} as a cascade from {from}, which {} deleted",
                            self.op_label(e.operation)
                        ))
                    }
                    None => {
                        return Err(format!(
                            "(3) {name} deleted by {label} as a cascade from {from}, which is not being deleted"
                        ))
                    }
                }
                for t in &targets {
                    if !self.entered.contains_key(&t.uid) {
                        return Err(format!(
                            "(3) list owner {name} deleted by {label} through {field} while its target {} \
                             was never deleted",
                            t.name
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    // -- the client: creates and deletes -------------------------------------

    /// References for a new resource of `kind`, chosen among resources
    /// ACTIVE at their owners (as the node resolves a remote target by
    /// asking its owner, which answers NOT_FOUND for a DELETING one). None
    /// when a required field has no candidate.
    fn pick_refs(&self, kind: &str, picks: [u8; 4], set: [bool; 3]) -> Option<BTreeMap<String, Vec<RefTarget>>> {
        let spec = self.schema.kind(kind).expect("kind of the schema");
        let mut out = BTreeMap::new();
        for (i, (field, r)) in spec.refs.iter().enumerate() {
            // A list owner always gets its list.
            let required = r.required || (r.many && r.on_delete == OnDelete::Cascade);
            if !required && !set[i % 3] {
                continue;
            }
            let candidates: Vec<RefTarget> = self
                .regions
                .iter()
                .flat_map(|reg| reg.state.resources.values())
                .filter(|c| c.kind() == r.kind && c.state == ResourceState::Active)
                .map(target_of)
                .collect();
            if candidates.is_empty() {
                if required {
                    return None;
                }
                continue;
            }
            let mut chosen: Vec<RefTarget> = Vec::new();
            let wanted = if r.many { 3 } else { 1 };
            for k in 0..wanted {
                let c = &candidates[picks[(i + k) % 4] as usize % candidates.len()];
                if !chosen.contains(c) {
                    chosen.push(c.clone());
                }
            }
            out.insert(field.clone(), chosen);
        }
        Some(out)
    }

    fn create(&mut self, c: &CreateOp) -> Checked<()> {
        let kind = CREATE_KINDS[c.kind];
        let Some(refs) = self.pick_refs(kind, c.picks, c.set) else {
            return Ok(());
        };
        let name = ResourceName::parse(&format!("{}/{kind}/x{}", REGIONS[c.region], c.id)).unwrap();
        self.create_with(name, refs, c.stage).map(|_| ())
    }

    /// Builds a motif of the forest (names `m{i}-…`, never reused).
    fn seed(&mut self, i: usize, seed: &Seed) -> Checked<()> {
        let name = |region: usize, kind: &str, id: &str| {
            ResourceName::parse(&format!("{}/{kind}/m{i}-{id}", REGIONS[region])).unwrap()
        };
        let refs = |fields: &[(&str, &[&RefTarget])]| -> BTreeMap<String, Vec<RefTarget>> {
            fields
                .iter()
                .map(|(f, ts)| ((*f).to_owned(), ts.iter().map(|t| (*t).clone()).collect()))
                .collect()
        };
        match seed {
            Seed::Create(c) => self.create(c),
            Seed::SharedList { owners, list } => {
                let mut made = Vec::new();
                for (k, r) in owners.iter().enumerate() {
                    made.extend(self.create_with(
                        name(*r, "owner", &format!("o{k}")),
                        BTreeMap::new(),
                        Stage::Settled,
                    )?);
                }
                let targets: Vec<&RefTarget> = made.iter().collect();
                self.create_with(
                    name(*list, "dep_list", "d"),
                    refs(&[("owners", &targets)]),
                    Stage::Settled,
                )?;
                Ok(())
            }
            Seed::BlockedChain {
                regions: [ra, rb, rc, rg],
                block_child,
                of_root,
            } => {
                let Some(a) = self.create_with(name(*ra, "owner", "a"), BTreeMap::new(), Stage::Settled)? else {
                    return Ok(());
                };
                let Some(b) = self.create_with(name(*rb, "owner", "b"), refs(&[("parent", &[&a])]), Stage::Settled)?
                else {
                    return Ok(());
                };
                let Some(c) = self.create_with(name(*rc, "child", "c"), refs(&[("owner", &[&b])]), Stage::Settled)?
                else {
                    return Ok(());
                };
                let of = if *of_root {
                    a
                } else {
                    let own = self.create_with(name(*rg, "owner", "g"), BTreeMap::new(), Stage::Settled)?;
                    let Some(own) = own else { return Ok(()) };
                    own
                };
                let (field, target) = if *block_child { ("child", &c) } else { ("owner", &b) };
                self.create_with(
                    name(*rg, "guard", "g"),
                    refs(&[(field, &[target]), ("of", &[&of])]),
                    Stage::Settled,
                )?;
                Ok(())
            }
            Seed::CrossList {
                root,
                mids,
                list,
                keeper,
            } => {
                let Some(r) = self.create_with(name(*root, "owner", "r"), BTreeMap::new(), Stage::Settled)? else {
                    return Ok(());
                };
                let mut owners = Vec::new();
                for (k, m) in mids.iter().enumerate() {
                    let mid = self.create_with(
                        name(*m, "owner", &format!("m{k}")),
                        refs(&[("parent", &[&r])]),
                        Stage::Settled,
                    )?;
                    owners.extend(mid);
                }
                if *keeper {
                    owners.extend(self.create_with(name(*list, "owner", "k"), BTreeMap::new(), Stage::Settled)?);
                }
                let targets: Vec<&RefTarget> = owners.iter().collect();
                self.create_with(
                    name(*list, "dep_list", "d"),
                    refs(&[("owners", &targets)]),
                    Stage::Settled,
                )?;
                Ok(())
            }
        }
    }

    /// Creates `name` with these references; a cross-region create goes to
    /// `stage`. Returns the resource when it was created ACTIVE or settled.
    fn create_with(
        &mut self,
        name: ResourceName,
        refs: BTreeMap<String, Vec<RefTarget>>,
        stage: Stage,
    ) -> Checked<Option<RefTarget>> {
        let spec = ResourceSpec {
            name: name.to_string(),
            refs: refs
                .iter()
                .map(|(field, ts)| {
                    let ts = ts
                        .iter()
                        .map(|t| RefRequest {
                            name: t.name.to_string(),
                            uid: Some(t.uid),
                        })
                        .collect();
                    (field.clone(), ts)
                })
                .collect(),
            ..ResourceSpec::default()
        };
        let described: Vec<String> = refs
            .iter()
            .map(|(f, ts)| {
                format!(
                    "{f}=[{}]",
                    ts.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(",")
                )
            })
            .collect();
        let r = region_of(&name);
        let Region { id, state, ids } = &mut self.regions[r];
        let step = protocol::create(
            state,
            ctx(&self.schema, &self.policy, id, self.now, &self.authorizer),
            ids,
            vec![spec],
        );
        let step = match step {
            Ok(step) => step,
            // The name is taken, by a live resource or by a create not
            // settled yet (CreateUnsettled: the node would settle that one
            // first; here the program's own stages settle it).
            Err(
                e @ (CoreError::AlreadyExists { .. }
                | CoreError::CreateUnsettled { .. }
                | CoreError::TargetDeleting { .. }),
            ) => {
                self.note(format!("create {name} {}: refused: {e}", described.join(" ")));
                return Ok(None);
            }
            Err(e) => return Err(format!("create {name}: unexpected error {e:?}")),
        };
        let created = target_of(&step.value[0]);
        let active = step.value[0].state == ResourceState::Active;
        self.commit(r, step.writes)?;
        if active {
            self.note(format!("create {name} {}: ACTIVE", described.join(" ")));
            return Ok(Some(created));
        }
        self.stats.cross_region_creates += 1;
        self.note(format!("create {name} {}: CREATING ({stage:?})", described.join(" ")));
        self.creates.push(PendingCreate {
            region: r,
            name: name.clone(),
            uid: created.uid,
            attached: None,
        });
        let i = self.creates.len() - 1;
        if stage != Stage::Committed {
            self.advance_create(i)?;
        }
        if stage == Stage::Settled {
            self.advance_create(i)?;
        }
        let settled = self
            .find(&name, created.uid)
            .is_some_and(|x| x.state == ResourceState::Active);
        Ok(settled.then_some(created))
    }

    /// Attaches a pending create at its owners (as the node does: the
    /// pending keys and the rows still there), or settles it with their
    /// answer.
    fn advance_create(&mut self, i: usize) -> Checked<()> {
        let (r, name, uid) = {
            let p = &self.creates[i];
            (p.region, p.name.clone(), p.uid)
        };
        match self.creates[i].attached.take() {
            None => {
                let state = &self.regions[r].state;
                let keys = state
                    .pending_attach
                    .get(&uid)
                    .map(|p| p.keys.clone())
                    .unwrap_or_default();
                let mut by_owner: BTreeMap<usize, Vec<PeerBackRef>> = BTreeMap::new();
                for key in &keys {
                    if let Some(row) = state.backrefs.get(key) {
                        by_owner
                            .entry(region_of(&row.target.name))
                            .or_default()
                            .push(PeerBackRef {
                                target: row.target.clone(),
                                referrer: row.referrer.clone(),
                                field: row.field.clone(),
                                generation: row.generation,
                            });
                    }
                }
                let mut answer = Ok(());
                for (owner, entries) in by_owner {
                    match peer::attach(&self.regions[owner].state, self.ctx(owner), REGIONS[r], entries) {
                        Ok(step) => self.commit(owner, step.writes)?,
                        Err(
                            e @ (CoreError::TargetDeleting { .. }
                            | CoreError::TargetNotFound { .. }
                            | CoreError::TargetUidMismatch { .. }),
                        ) => {
                            answer = Err(CoreError::AttachRefused {
                                region: REGIONS[owner].to_owned(),
                                reason: e.to_string(),
                            });
                            break;
                        }
                        Err(e) => return Err(format!("attach of {name} at {}: unexpected {e:?}", REGIONS[owner])),
                    }
                }
                self.note(format!("attach {name}: {answer:?}"));
                self.creates[i].attached = Some((keys, answer));
            }
            Some((keys, answer)) => {
                let step = peer::settle_batch(
                    &self.regions[r].state,
                    self.ctx(r),
                    vec![(name.clone(), uid, keys)],
                    answer,
                )
                .map_err(|e| format!("settle {name}: {e}"))?;
                self.commit(r, step.writes)?;
                match step.value {
                    Ok(_) => self.note(format!("settle {name}: ok")),
                    Err(e) => {
                        self.stats.creates_aborted += 1;
                        self.note(format!("settle {name}: aborted: {e}"));
                    }
                }
                self.creates.remove(i);
            }
        }
        Ok(())
    }

    /// `DeleteRequest::remote_kept` as the node computes it before a delete
    /// without cascade: each `cascade` back-reference of the target whose
    /// referrer is remote, asked of the referrer's region.
    fn remote_kept(&self, r: usize, name: &ResourceName) -> Checked<BTreeSet<BackRefKey>> {
        let state = &self.regions[r].state;
        let Some(target) = state.resources.get(name) else {
            return Ok(BTreeSet::new());
        };
        let mut by_region: BTreeMap<usize, Vec<BackRefKey>> = BTreeMap::new();
        for row in state.backrefs.values() {
            if row.target.uid == target.uid
                && row.on_delete == OnDelete::Cascade
                && row.referrer.name.region() != REGIONS[r]
            {
                by_region
                    .entry(region_of(&row.referrer.name))
                    .or_default()
                    .push(row.key());
            }
        }
        let mut kept = BTreeSet::new();
        for (region, keys) in by_region {
            let answer = peer::keeps_another_target(&self.regions[region].state, self.ctx(region), &keys)
                .map_err(|e| format!("keeps_another_target at {}: {e}", REGIONS[region]))?;
            kept.extend(keys.into_iter().zip(answer).filter(|(_, k)| *k).map(|(k, _)| k));
        }
        Ok(kept)
    }

    /// A user delete at the owner (a dry run writes nothing). An accepted
    /// one is recorded before its step is committed.
    fn user_delete(
        &mut self,
        name: &ResourceName,
        cascade: bool,
        dry_run: bool,
    ) -> Checked<Result<DeleteOutcome, CoreError>> {
        let r = region_of(name);
        let remote_kept = if cascade {
            BTreeSet::new()
        } else {
            self.remote_kept(r, name)?
        };
        let req = DeleteRequest {
            name: name.to_string(),
            cascade,
            dry_run,
            allow_missing: false,
            etag: None,
            uid: None,
            requested_by: "proptest".to_owned(),
            orphan: false,
            remote_kept: remote_kept.clone(),
            principal: Default::default(),
            retain_ms: 0,
            bounds: Default::default(),
            operation_id: None,
        };
        let Region { id, state, ids } = &mut self.regions[r];
        let step = match protocol::delete(
            state,
            ctx(&self.schema, &self.policy, id, self.now, &self.authorizer),
            ids,
            req,
        ) {
            Ok(step) => step,
            Err(e @ CoreError::DeleteRefused { .. }) => {
                if !dry_run {
                    self.stats.deletes_refused += 1;
                    self.note(format!(
                        "delete {name} cascade={cascade} kept={}: refused: {e}",
                        remote_kept.len()
                    ));
                }
                return Ok(Err(e));
            }
            Err(e) => return Err(format!("delete {name} cascade={cascade}: unexpected error {e:?}")),
        };
        if dry_run {
            if !step.writes.is_empty() {
                return Err(format!("dry run of {name} wrote {:?}", step.writes));
            }
            return Ok(Ok(step.value));
        }
        match &step.value {
            DeleteOutcome::Accepted(op) => {
                let n = self.accepted.len() + 1;
                self.accepted.insert(
                    op.id,
                    Accepted {
                        n,
                        root: op.root.clone(),
                        cascade,
                    },
                );
                if cascade {
                    self.stats.deletes_accepted_cascade += 1;
                } else {
                    self.stats.deletes_accepted_no_cascade += 1;
                }
                self.note(format!(
                    "delete {name} cascade={cascade} kept={}: accepted as op#{n}",
                    remote_kept.len()
                ));
            }
            DeleteOutcome::AlreadyDeleting(op) => {
                let uid = self.regions[r].state.resources[name].uid;
                let recorded = self.regions[r].state.deletions.get(&uid).map(|d| d.operation);
                if recorded != Some(op.id) {
                    return Err(format!("delete of DELETING {name} answered another operation"));
                }
                self.note(format!("delete {name}: already deleting ({})", self.op_label(op.id)));
            }
            other => return Err(format!("delete {name}: unexpected outcome {other:?}")),
        }
        self.commit(r, step.writes)?;
        Ok(Ok(step.value))
    }

    /// Resources of `kind` (any kind when there is none) in every region,
    /// not CREATING; only ACTIVE ones with `active_only`.
    fn delete_candidates(&self, kind: &str, active_only: bool) -> Vec<ResourceName> {
        let all: Vec<&Resource> = self
            .regions
            .iter()
            .flat_map(|reg| reg.state.resources.values())
            .filter(|r| {
                if active_only {
                    r.state == ResourceState::Active
                } else {
                    r.state != ResourceState::Creating
                }
            })
            .collect();
        let of_kind: Vec<&Resource> = all.iter().copied().filter(|r| r.kind() == kind).collect();
        let chosen = if of_kind.is_empty() { all } else { of_kind };
        chosen.into_iter().map(|r| r.name.clone()).collect()
    }

    fn race_list_owners(&mut self, pick: u8, first: u8, second: u8, cascade: [bool; 2]) -> Checked<()> {
        let lists: Vec<&Resource> = self
            .regions
            .iter()
            .flat_map(|reg| reg.state.resources.values())
            .filter(|r| {
                r.kind() == "dep_list"
                    && r.state == ResourceState::Active
                    && r.refs.get("owners").is_some_and(|o| o.len() >= 2)
            })
            .collect();
        if lists.is_empty() {
            return Ok(());
        }
        let list = lists[pick as usize % lists.len()].clone();
        let owners = &list.refs["owners"];
        let i = first as usize % owners.len();
        let mut j = second as usize % owners.len();
        if j == i {
            j = (i + 1) % owners.len();
        }
        let (a, b) = (owners[i].name.clone(), owners[j].name.clone());
        self.note(format!("race on {}: delete {a} then {b}", list.name));
        let x = self.user_delete(&a, cascade[0], false)?;
        let y = self.user_delete(&b, cascade[1], false)?;
        let shape = if a.region() != b.region() {
            "owners in two regions"
        } else if a.region() == list.name.region() {
            "all in one region"
        } else {
            "owners in one region, list in another"
        };
        if matches!(x, Ok(DeleteOutcome::Accepted(_))) {
            match y {
                Ok(DeleteOutcome::Accepted(_)) => *self.stats.races_both_accepted.entry(shape).or_default() += 1,
                Err(_) => *self.stats.races_second_refused.entry(shape).or_default() += 1,
                _ => {}
            }
        }
        Ok(())
    }

    // -- the network and the deletion engines ---------------------------------

    /// The owner's DELETING/PURGED events after the watcher's cursor that
    /// it is sent (`Event::concerns_importers`), or those it is not.
    fn undelivered(&self, owner: usize, watcher: usize) -> Vec<RemoteEvent> {
        self.after_cursor(owner, watcher, true)
    }

    fn after_cursor(&self, owner: usize, watcher: usize, sent: bool) -> Vec<RemoteEvent> {
        let cursor = self.regions[watcher].state.cursor(REGIONS[owner]).unwrap();
        self.regions[owner]
            .state
            .events
            .iter()
            .filter(|e| e.revision > cursor && matches!(e.event_type, EventType::Deleting | EventType::Purged))
            .filter(|e| e.concerns_importers() == sent)
            .map(|e| RemoteEvent {
                revision: e.revision,
                event_type: e.event_type,
                resource: e.resource.clone(),
                operation: e.operation,
                no_cascade: e.no_cascade,
                principal: e.principal.clone(),
                retain_ms: 0,
            })
            .collect()
    }

    fn deliver_events(&mut self, owner: usize, watcher: usize, max: usize) -> Checked<usize> {
        let events: Vec<RemoteEvent> = self.undelivered(owner, watcher).into_iter().take(max).collect();
        if events.is_empty() {
            return Ok(0);
        }
        // The events the owner's watch leaves out would change nothing
        // here but the cursor, whatever this region's state: applied alone
        // now, not committed (the node never sends them).
        for skipped in self.after_cursor(owner, watcher, false) {
            let name = skipped.resource.name.clone();
            let step = peer::apply_remote_events(
                &self.regions[watcher].state,
                self.ctx(watcher),
                REGIONS[owner],
                vec![skipped],
            )
            .map_err(|e| {
                format!(
                    "apply a left-out event of {} at {}: {e}",
                    REGIONS[owner], REGIONS[watcher]
                )
            })?;
            self.stats.left_out_events_checked += 1;
            if step.value.applied != 0 || step.value.needs_flush {
                return Err(format!(
                    "{} would have acted on the PURGED of {name}, which {}'s watch leaves out: {:?}",
                    REGIONS[watcher], REGIONS[owner], step.value
                ));
            }
        }
        let n = events.len();
        let step = peer::apply_remote_events(&self.regions[watcher].state, self.ctx(watcher), REGIONS[owner], events)
            .map_err(|e| format!("apply events of {} at {}: {e}", REGIONS[owner], REGIONS[watcher]))?;
        self.commit(watcher, step.writes)?;
        Ok(n)
    }

    fn deliver_releases(&mut self, importer: usize, owner: usize) -> Checked<bool> {
        let entries: Vec<PeerBackRef> = self.regions[importer]
            .state
            .pending_releases
            .iter()
            .filter(|((region, _), _)| region == REGIONS[owner])
            .map(|(_, p)| PeerBackRef {
                target: p.backref.target.clone(),
                referrer: p.backref.referrer.clone(),
                field: p.backref.field.clone(),
                generation: p.generation,
            })
            .collect();
        if entries.is_empty() {
            return Ok(false);
        }
        let sent: Vec<(BackRefKey, u64)> = entries.iter().map(|e| (e.key(), e.generation)).collect();
        let step = peer::release(
            &self.regions[owner].state,
            self.ctx(owner),
            Some(REGIONS[importer]),
            entries,
        )
        .map_err(|e| format!("release at {}: {e}", REGIONS[owner]))?;
        if step.value.foreign > 0 {
            return Err(format!(
                "release from {} refused as foreign: {:?}",
                REGIONS[importer], step.value
            ));
        }
        self.commit(owner, step.writes)?;
        let step = peer::releases_acknowledged(&self.regions[importer].state, REGIONS[owner], sent)
            .map_err(|e| format!("ack at {}: {e}", REGIONS[importer]))?;
        self.commit(importer, step.writes)?;
        Ok(true)
    }

    /// Runs `process_work` in region `r` until it finds nothing due or
    /// `max` steps ran; returns (steps that wrote something, found idle).
    fn work(&mut self, r: usize, max: usize) -> Checked<(usize, bool)> {
        let mut busy = 0;
        for _ in 0..max {
            let step = protocol::process_work(&self.regions[r].state, self.ctx(r))
                .map_err(|e| format!("process_work at {}: {e}", REGIONS[r]))?;
            let idle = step.value.items == 0 && !step.value.more;
            if !step.writes.is_empty() {
                busy += 1;
            }
            self.awaiting
                .extend(step.value.awaiting_closure.iter().map(|id| (r, *id)));
            self.commit(r, step.writes)?;
            if idle {
                return Ok((busy, true));
            }
        }
        Ok((busy, false))
    }

    fn next_due(&self) -> Option<Timestamp> {
        self.regions
            .iter()
            .flat_map(|r| r.state.work.values())
            .map(|w| w.next_attempt_at)
            .min()
    }

    /// Delivers everything, settles every pending create, and runs every
    /// region's work, moving the clock to the next retry whenever nothing
    /// else is left, until no work is left at all.
    fn quiesce(&mut self) -> Checked<()> {
        for _ in 0..MAX_QUIESCE_ROUNDS {
            let mut busy = false;
            while !self.creates.is_empty() {
                self.advance_create(0)?;
                busy = true;
            }
            for owner in 0..REGIONS.len() {
                for watcher in (0..REGIONS.len()).filter(|w| *w != owner) {
                    busy |= self.deliver_events(owner, watcher, usize::MAX)? > 0;
                }
            }
            for importer in 0..REGIONS.len() {
                for owner in (0..REGIONS.len()).filter(|o| *o != importer) {
                    busy |= self.deliver_releases(importer, owner)?;
                }
            }
            for (r, region) in REGIONS.iter().enumerate() {
                let (steps, idle) = self.work(r, MAX_WORK_STEPS)?;
                if !idle {
                    return Err(format!("{region}: work not idle after {MAX_WORK_STEPS} steps"));
                }
                busy |= steps > 0;
            }
            for (r, id) in std::mem::take(&mut self.awaiting) {
                busy |= self.collect_closure(r, id, 0, Between::Nothing)?;
            }
            if !busy {
                match self.next_due() {
                    Some(t) => self.now = Timestamp(self.now.0.max(t.0)),
                    None => return Ok(()),
                }
            }
        }
        let left: Vec<String> = self
            .regions
            .iter()
            .flat_map(|r| r.state.work.values())
            .map(|w| {
                let status = self.regions[region_of(&w.target.name)]
                    .state
                    .deletions
                    .get(&w.target.uid)
                    .map(|d| format!("{:?}", d.status));
                format!("{} (attempts {}, {status:?})", w.target.name, w.attempts)
            })
            .collect();
        Err(format!(
            "no quiescence after {MAX_QUIESCE_ROUNDS} rounds; work left: {}",
            left.join("; ")
        ))
    }

    /// Every other region's part of an operation: (pending, changes), a
    /// region without a part reading (0, 0) (the node's `collect_parts`).
    /// `o`'s part of operation `id`, as `Peer.OperationPart` reads it.
    fn read_part(&self, o: usize, id: OperationId) -> PartAnswer {
        match self.regions[o].state.operations.get(&id) {
            Some(op) => PartAnswer::Part(PartSummary::of(op)),
            None => PartAnswer::NoPart,
        }
    }

    fn run_between(&mut self, between: Between) -> Checked<()> {
        match between {
            Between::Nothing => {}
            Between::Work(r) => {
                self.work(r, 1)?;
            }
            Between::Deliver { owner, watcher } => {
                self.deliver_events(owner, watcher, 1)?;
            }
            Between::Release { importer, owner } => {
                self.deliver_releases(importer, owner)?;
            }
        }
        Ok(())
    }

    /// The node's closure check (`links.rs`): the core's `ClosureCheck`
    /// driven over the regions the cascade touched, then
    /// `protocol::confirm_remote_closure`; `between` runs at point `at`
    /// (0: before the first read, 1: after the first read, 2: between the
    /// two collects, 3: before confirming). Returns whether the closure was
    /// confirmed.
    fn collect_closure(&mut self, r: usize, id: OperationId, at: u8, between: Between) -> Checked<bool> {
        let Some(local_op) = self.regions[r].state.operations.get(&id).cloned() else {
            return Ok(false);
        };
        if at == 0 {
            self.run_between(between)?;
        }
        let peers: Vec<&str> = REGIONS.iter().copied().filter(|o| *o != REGIONS[r]).collect();
        let mut check = ClosureCheck::start(REGIONS[r], peers, &local_op);
        let (mut reads, mut ran) = (0usize, at == 0);
        let mut second_started = false;
        while check.phase() != Phase::Done {
            if check.phase() == Phase::Second && !second_started {
                second_started = true;
                if at == 2 && !ran {
                    ran = true;
                    self.run_between(between)?;
                }
            }
            let round = check.next_round();
            if round.is_empty() {
                return Err(format!("closure check at {}: a round with nothing to ask", REGIONS[r]));
            }
            for region in round {
                let o = REGIONS
                    .iter()
                    .position(|x| *x == region)
                    .ok_or_else(|| format!("unknown region {region}"))?;
                let answer = self.read_part(o, id);
                check.answer(&region, answer);
                reads += 1;
                if at == 1 && reads == 1 && !ran {
                    ran = true;
                    self.run_between(between)?;
                }
            }
        }
        let Some(Verdict::Finished {
            local_changes: local, ..
        }) = check.verdict()
        else {
            return Ok(false);
        };
        if at >= 1 && !ran {
            self.run_between(between)?;
        }
        let step = protocol::confirm_remote_closure(&self.regions[r].state, self.ctx(r), id, local)
            .map_err(|e| format!("confirm_remote_closure at {}: {e}", REGIONS[r]))?;
        let confirmed = step.value;
        self.commit(r, step.writes)?;
        if confirmed {
            self.stats.closures_confirmed += 1;
            self.note(format!("{}: closure of {} confirmed", REGIONS[r], self.op_label(id)));
        } else {
            self.stats.closure_confirms_declined += 1;
        }
        Ok(confirmed)
    }

    // -- the dry run across regions -------------------------------------------

    /// The node's cross-region dry run: the owner's plan, then every region
    /// re-planned from the seeds it is handed, to a fixpoint, merged.
    fn plan_everywhere(&mut self, origin: usize, root: RefTarget, plan: Plan, cascade: bool) -> Checked<Plan> {
        let mut driver = PlanDriver::new(REGIONS[origin], root, plan);
        // Regions asked so far (the origin answered with `plan`).
        let mut asked = BTreeSet::from([REGIONS[origin].to_owned()]);
        let mut replanned = false;
        for _ in 0..MAX_PLAN_ROUNDS {
            let round = driver.next_round();
            if round.is_empty() {
                self.stats.checked_replanned += usize::from(replanned);
                if let Some(r) = driver.unreachable().next() {
                    return Err(format!("dry run: region {r} unreachable"));
                }
                return Ok(driver.finish());
            }
            for (region, seeds) in round {
                let r = REGIONS
                    .iter()
                    .position(|x| *x == region)
                    .ok_or_else(|| format!("dry run handed seeds to unknown region {region}"))?;
                let part = peer::plan_from(&self.regions[r].state, self.ctx(r), seeds.clone(), cascade, None)
                    .map_err(|e| format!("plan_from at {region}: {e}"))?;
                driver.answer(&region, seeds, Some(part));
                if !asked.insert(region) {
                    replanned = true;
                }
            }
        }
        Err(format!("dry run did not finish in {MAX_PLAN_ROUNDS} rounds"))
    }

    fn checked_delete(&mut self, kind: usize, pick: u8, cascade: bool, dependents: bool) -> Checked<()> {
        self.quiesce()?;
        let mut candidates = Vec::new();
        if dependents {
            for reg in &self.regions {
                let with_dependents: BTreeSet<Uid> = reg
                    .state
                    .backrefs
                    .values()
                    .filter(|b| b.on_delete == OnDelete::Cascade)
                    .map(|b| b.target.uid)
                    .collect();
                candidates.extend(
                    reg.state
                        .resources
                        .values()
                        .filter(|r| r.state == ResourceState::Active && with_dependents.contains(&r.uid))
                        .map(|r| r.name.clone()),
                );
            }
        }
        if candidates.is_empty() {
            candidates = self.delete_candidates(DELETE_KINDS[kind], true);
        }
        if candidates.is_empty() {
            return Ok(());
        }
        let name = candidates[pick as usize % candidates.len()].clone();
        let r = region_of(&name);
        let root = target_of(&self.regions[r].state.resources[&name]);
        self.stats.checked_deletes += 1;
        let planned = match self.user_delete(&name, cascade, true)? {
            Err(refused) => {
                self.stats.checked_refused += 1;
                let real = self.user_delete(&name, cascade, false)?;
                return match real {
                    Err(e) if e == refused => Ok(()),
                    other => Err(format!(
                        "dry run of delete {name} cascade={cascade} refused ({refused}), the delete answered {other:?}"
                    )),
                };
            }
            Ok(DeleteOutcome::DryRun(plan)) => self.plan_everywhere(r, root.clone(), plan, cascade)?,
            Ok(other) => return Err(format!("dry run of {name}: {other:?}")),
        };
        if planned.truncated {
            return Err(format!("dry run of {name} truncated: {planned:?}"));
        }
        let op = match self.user_delete(&name, cascade, false)? {
            Ok(DeleteOutcome::Accepted(op)) => op.id,
            other => {
                return Err(format!(
                    "dry run of delete {name} cascade={cascade} accepted, the delete answered {other:?}"
                ))
            }
        };
        self.note(format!("  (checked against its dry run: {})", describe_plan(&planned)));
        self.quiesce()?;
        self.compare_with_plan(op, &name, cascade, &planned)?;
        self.check_quiescent()
    }

    /// Dry run vs. real run, once the real run is quiescent.
    fn compare_with_plan(&mut self, op: OperationId, name: &ResourceName, cascade: bool, plan: &Plan) -> Checked<()> {
        let what = format!("delete {name} cascade={cascade}");
        let names = |uids: &BTreeSet<Uid>| -> Vec<String> {
            uids.iter()
                .map(|u| {
                    self.created
                        .get(u)
                        .map_or_else(|| u.to_string(), |r| r.name.to_string())
                })
                .collect()
        };
        let planned: BTreeSet<Uid> = plan.deleted.iter().map(|t| t.uid).collect();
        if planned.len() != plan.deleted.len() {
            return Err(format!("dry run of {what} lists a resource twice: {plan:?}"));
        }
        let deleted: BTreeSet<Uid> = self
            .entered
            .iter()
            .filter(|(_, e)| e.operation == op)
            .map(|(uid, _)| *uid)
            .collect();
        if planned != deleted {
            return Err(format!(
                "dry run vs real run of {what}: planned deleted {:?}, the operation deleted {:?} \
                 (planned only: {:?}; deleted only: {:?})",
                names(&planned),
                names(&deleted),
                names(&planned.difference(&deleted).copied().collect()),
                names(&deleted.difference(&planned).copied().collect()),
            ));
        }
        // What the run left held, by resource, with its explanation.
        let mut left: BTreeMap<Uid, String> = BTreeMap::new();
        for uid in &deleted {
            let resource = self.created[uid].clone();
            if let Some(now) = self.find(&resource.name, *uid) {
                let record = self.regions[region_of(&resource.name)].state.deletions.get(uid);
                let text = match record.map(|d| &d.status) {
                    Some(DeletionStatus::Failed { error }) => error.clone(),
                    Some(DeletionStatus::Blocked { reason, .. }) => reason.clone(),
                    other => format!("{:?} is {:?}, status {other:?}", now.name, now.state),
                };
                left.insert(*uid, text);
            }
        }
        let mut planned_blocks: BTreeMap<Uid, BTreeSet<ResourceName>> = BTreeMap::new();
        for b in &plan.blocked {
            planned_blocks
                .entry(b.resource.uid)
                .or_default()
                .insert(b.blocker.referrer.clone());
        }
        let left_uids: BTreeSet<Uid> = left.keys().copied().collect();
        let blocked_uids: BTreeSet<Uid> = planned_blocks.keys().copied().collect();
        if left_uids != blocked_uids {
            return Err(format!(
                "dry run vs real run of {what}: planned blocked {:?}, the run left {:?} held",
                plan.blocked
                    .iter()
                    .map(|b| format!("{} by {}", b.resource.name, b.blocker.referrer))
                    .collect::<Vec<_>>(),
                left.iter()
                    .map(|(u, why)| format!("{}: {why}", names(&BTreeSet::from([*u]))[0]))
                    .collect::<Vec<_>>()
            ));
        }
        for (uid, blockers) in &planned_blocks {
            let why = &left[uid];
            for b in blockers {
                if !why.contains(b.as_str()) {
                    return Err(format!(
                        "dry run vs real run of {what}: {} planned blocked by {b}, held for: {why}",
                        self.created[uid].name
                    ));
                }
            }
        }
        let planned_unset: BTreeSet<(Uid, String)> =
            plan.unset.iter().map(|u| (u.resource.uid, u.field.clone())).collect();
        if planned_unset.len() != plan.unset.len() {
            return Err(format!("dry run of {what} lists an unset twice: {plan:?}"));
        }
        let unset: BTreeSet<(Uid, String)> = self
            .regions
            .iter()
            .flat_map(|r| r.state.outcomes.iter())
            .filter(|((id, _), _)| *id == op)
            .filter_map(|(_, o)| match &o.action {
                OutcomeAction::Unset { field, .. } => Some((o.resource.uid, field.clone())),
                _ => None,
            })
            .collect();
        if planned_unset != unset {
            let show = |s: &BTreeSet<(Uid, String)>| -> Vec<String> {
                s.iter()
                    .map(|(u, f)| format!("{}.{f}", names(&BTreeSet::from([*u]))[0]))
                    .collect()
            };
            return Err(format!(
                "dry run vs real run of {what}: planned unset {:?}, the operation unset {:?}",
                show(&planned_unset),
                show(&unset)
            ));
        }
        // Stats: what this comparison covered.
        if !cascade {
            self.stats.checked_no_cascade += 1;
        }
        if plan
            .deleted
            .iter()
            .chain(plan.unset.iter().map(|u| &u.resource))
            .any(|t| t.name.region() != name.region())
        {
            self.stats.checked_spanning_regions += 1;
        }
        if !plan.unset.is_empty() {
            self.stats.checked_with_unset += 1;
        }
        if !plan.blocked.is_empty() {
            self.stats.checked_with_blocks += 1;
        }
        if plan.deleted.iter().any(|t| t.name.kind() == "dep_list") {
            self.stats.checked_list_owner_deleted += 1;
        }
        Ok(())
    }

    // -- invariants at quiescence ---------------------------------------------

    fn check_quiescent(&mut self) -> Checked<()> {
        let violations = self.quiescent_violations();
        if violations.is_empty() {
            Ok(())
        } else {
            Err(format!("at quiescence:\n  {}", violations.join("\n  ")))
        }
    }

    fn quiescent_violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.creates.is_empty() {
            out.push(format!("{} creates not settled", self.creates.len()));
        }
        // The core's checker over every region (pending releases and
        // attaches are `not_quiescent`, CREATING resources
        // `unsettled_create`, tombstones of purged resources
        // `stale_remote_deletion`, operation counters `operation_mismatch`, …).
        let views: Vec<RegionView> = self
            .regions
            .iter()
            .enumerate()
            .map(|(r, reg)| RegionView::from_state(&RegionId::parse(REGIONS[r]).unwrap(), &reg.state))
            .collect();
        let report = invariants::check_quiescent(&views, Some(&self.schema));
        out.extend(report.violations.iter().map(|v| v.to_string()));
        // Stronger than the checker, because this driver runs every clock
        // to the end: no work is left, every event is delivered, and every
        // DELETING resource has FAILED, held by a live blocker it names.
        for (r, reg) in self.regions.iter().enumerate() {
            let region = REGIONS[r];
            let st = &reg.state;
            for w in st.work.values() {
                out.push(format!("{region}: work left for {}", w.target.name));
            }
            for owner in (0..REGIONS.len()).filter(|o| *o != r) {
                let n = self.undelivered(owner, r).len();
                if n > 0 {
                    out.push(format!("{region}: {n} events of {} undelivered", REGIONS[owner]));
                }
            }
            for res in st.resources.values() {
                match res.state {
                    ResourceState::Active => self.check_required(res, &mut out),
                    ResourceState::Deleting => self.check_held(r, res, &mut out),
                    ResourceState::Creating | ResourceState::Deleted => {}
                }
            }
        }
        // Everything that is gone or DELETING entered DELETING (and passed
        // the oracle then); everything gone was purged.
        for (uid, res) in &self.created {
            let now = self.find(&res.name, *uid);
            if now.is_some_and(|x| x.state == ResourceState::Active) {
                continue;
            }
            if !self.entered.contains_key(uid) {
                out.push(format!("(3) {} is gone without ever entering DELETING", res.name));
            }
            if now.is_none() && !self.purged.contains(uid) {
                out.push(format!("{} is gone without a PURGED event", res.name));
            }
        }
        out
    }

    /// A live resource holds its required fields. Not a cluster invariant
    /// (a race can empty one: ARCHITECTURE.md), but this test's workload
    /// has no such race: its only list reference is not required, and it
    /// makes no updates.
    fn check_required(&self, res: &Resource, out: &mut Vec<String>) {
        let kind = self.schema.kind(res.kind()).expect("kind");
        for (field, spec) in &kind.refs {
            if spec.required && !res.refs.contains_key(field) {
                out.push(format!("{}: required {field} missing", res.name));
            }
        }
    }

    /// A DELETING resource at quiescence: FAILED, and held by a live
    /// blocker that the error names.
    fn check_held(&self, r: usize, res: &Resource, out: &mut Vec<String>) {
        let status = self.regions[r].state.deletions.get(&res.uid).map(|d| &d.status);
        let Some(DeletionStatus::Failed { error }) = status else {
            out.push(format!("{} DELETING at quiescence: {status:?}", res.name));
            return;
        };
        let held_by = self
            .regions
            .iter()
            .flat_map(|reg| reg.state.resources.values())
            .filter(|b| b.state == ResourceState::Active)
            .any(|b| {
                b.refs.iter().any(|(field, ts)| {
                    self.schema
                        .reference(b.kind(), field)
                        .is_some_and(|s| s.on_delete == OnDelete::Block)
                        && ts.iter().any(|t| t.uid == res.uid)
                        && error.contains(b.name.as_str())
                })
            });
        if !held_by {
            out.push(format!(
                "{} FAILED at quiescence, but no live blocker it names holds it: {error}",
                res.name
            ));
        }
    }
}

fn describe_plan(p: &Plan) -> String {
    let deleted: Vec<&str> = p.deleted.iter().map(|t| t.name.as_str()).collect();
    let unset: Vec<String> = p
        .unset
        .iter()
        .map(|u| format!("{}.{}", u.resource.name, u.field))
        .collect();
    let blocked: Vec<String> = p
        .blocked
        .iter()
        .map(|b| format!("{} by {}", b.resource.name, b.blocker.referrer))
        .collect();
    format!("deleted {deleted:?}, unset {unset:?}, blocked {blocked:?}")
}

// ---------------------------------------------------------------------------
// Running a program

fn run_op(w: &mut World, op: &Op) -> Checked<()> {
    w.now = w.now.plus_millis(1);
    match op {
        Op::Create(c) => w.create(c),
        Op::Delete { kind, pick, cascade } => {
            let candidates = w.delete_candidates(DELETE_KINDS[*kind], false);
            if candidates.is_empty() {
                return Ok(());
            }
            let name = candidates[*pick as usize % candidates.len()].clone();
            w.user_delete(&name, *cascade, false).map(|_| ())
        }
        Op::RaceListOwners {
            pick,
            first,
            second,
            cascade,
        } => w.race_list_owners(*pick, *first, *second, *cascade),
        Op::Work { region, steps } => {
            let (busy, _) = w.work(*region, *steps as usize)?;
            if busy > 0 {
                w.note(format!("work {}: {busy} step(s)", REGIONS[*region]));
            }
            Ok(())
        }
        Op::Deliver { owner, watcher, events } => {
            let n = w.deliver_events(*owner, *watcher, *events as usize)?;
            if n > 0 {
                w.note(format!(
                    "{} applies {n} event(s) of {}",
                    REGIONS[*watcher], REGIONS[*owner]
                ));
            }
            Ok(())
        }
        Op::Release { importer, owner } => {
            if w.deliver_releases(*importer, *owner)? {
                w.note(format!("{} releases at {}", REGIONS[*importer], REGIONS[*owner]));
            }
            Ok(())
        }
        Op::Pump { steps } => {
            w.note("pump".to_owned());
            for owner in 0..REGIONS.len() {
                for other in (0..REGIONS.len()).filter(|o| *o != owner) {
                    w.deliver_events(owner, other, usize::MAX)?;
                    w.deliver_releases(other, owner)?;
                }
            }
            for r in 0..REGIONS.len() {
                w.work(r, *steps as usize)?;
            }
            Ok(())
        }
        Op::AdvanceCreate { pick } => {
            if w.creates.is_empty() {
                return Ok(());
            }
            let i = *pick as usize % w.creates.len();
            w.advance_create(i)
        }
        Op::Tick => {
            if let Some(t) = w.next_due() {
                w.now = Timestamp(w.now.0.max(t.0));
                w.note(format!("clock → {}", w.now.0));
            }
            Ok(())
        }
        Op::Quiesce => {
            w.note("quiesce".to_owned());
            w.quiesce()?;
            w.check_quiescent()
        }
        Op::CheckedDelete {
            kind,
            pick,
            cascade,
            dependents,
        } => w.checked_delete(*kind, *pick, *cascade, *dependents),
        Op::CollectClosure { pick, at, between } => {
            let awaiting: Vec<(usize, OperationId)> = w.awaiting.iter().copied().collect();
            if awaiting.is_empty() {
                return Ok(());
            }
            let (r, id) = awaiting[*pick as usize % awaiting.len()];
            w.awaiting.remove(&(r, id));
            w.stats.collect_ops_run += 1;
            w.note(format!(
                "{}: double collect of {} ({between:?} at {at})",
                REGIONS[r],
                w.op_label(id)
            ));
            w.collect_closure(r, id, *at, *between).map(|_| ())
        }
    }
}

fn run(p: &Program, stats: &RefCell<Stats>) -> Result<(), String> {
    let mut w = World::new(p.batch_budget, p.batch_items);
    let result = (|| -> Checked<()> {
        for (i, seed) in p.forest.iter().enumerate() {
            w.seed(i, seed)?;
        }
        w.quiesce()?;
        w.check_quiescent()?;
        for (i, op) in p.ops.iter().enumerate() {
            w.note(format!("-- op {i}: {op:?}"));
            run_op(&mut w, op)?;
        }
        w.note("-- end: quiesce".to_owned());
        w.quiesce()?;
        w.check_quiescent()?;
        w.stats.list_owners_left_empty = w
            .regions
            .iter()
            .flat_map(|r| r.state.resources.values())
            .filter(|r| r.kind() == "dep_list" && r.state == ResourceState::Active && !r.refs.contains_key("owners"))
            .count();
        Ok(())
    })();
    if let Err(what) = result {
        return Err(w.failure(&what));
    }
    let mut s = stats.borrow_mut();
    let c = &w.stats;
    s.cases += 1;
    s.resources_created += c.resources_created;
    s.cross_region_creates += c.cross_region_creates;
    s.creates_aborted += c.creates_aborted;
    s.deletes_accepted_cascade += c.deletes_accepted_cascade;
    s.deletes_accepted_no_cascade += c.deletes_accepted_no_cascade;
    s.deletes_refused += c.deletes_refused;
    for (k, v) in &c.races_both_accepted {
        *s.races_both_accepted.entry(k).or_default() += v;
    }
    for (k, v) in &c.races_second_refused {
        *s.races_second_refused.entry(k).or_default() += v;
    }
    s.collect_ops_run += c.collect_ops_run;
    s.list_owners_left_empty += c.list_owners_left_empty;
    s.checked_deletes += c.checked_deletes;
    s.checked_refused += c.checked_refused;
    s.checked_no_cascade += c.checked_no_cascade;
    s.checked_spanning_regions += c.checked_spanning_regions;
    s.checked_with_unset += c.checked_with_unset;
    s.checked_with_blocks += c.checked_with_blocks;
    s.checked_list_owner_deleted += c.checked_list_owner_deleted;
    s.checked_replanned += c.checked_replanned;
    s.closures_confirmed += c.closures_confirmed;
    s.closure_confirms_declined += c.closure_confirms_declined;
    s.left_out_events_checked += c.left_out_events_checked;
    Ok(())
}

/// Cases: `PROPTEST_CASES` for a deeper run, else the default.
fn cases_or(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn three_regions_delete_only_what_was_asked_and_as_the_dry_run_said() {
    let defaults = ProptestConfig::default();
    let mut runner = TestRunner::new(ProptestConfig {
        cases: cases_or(128),
        // Programs are cheap to run: shrink them all the way (unless
        // PROPTEST_MAX_SHRINK_ITERS says otherwise).
        max_shrink_iters: if std::env::var_os("PROPTEST_MAX_SHRINK_ITERS").is_some() {
            defaults.max_shrink_iters
        } else {
            20_000
        },
        // Keep the tree clean: no regression files next to the test.
        failure_persistence: None,
        ..defaults
    });
    let stats = RefCell::new(Stats::default());
    let result = runner.run(&program(), |p| run(&p, &stats).map_err(TestCaseError::fail));
    match result {
        Ok(()) => {
            eprintln!("multi_region coverage: {:#?}", stats.borrow());
            assert!(
                stats.borrow().left_out_events_checked > 0,
                "no case had an owner's watch leave out a leaf's PURGED: the check above never ran"
            );
        }
        Err(TestError::Fail(why, program)) => {
            // The minimal program's own failure, with its trace.
            let why = run(&program, &RefCell::default())
                .err()
                .unwrap_or_else(|| why.to_string());
            panic!("{why}\n--- minimal failing program ---\n{program:?}")
        }
        Err(e) => panic!("{e}"),
    }
}

// ---------------------------------------------------------------------------
// Minimal scenarios of core bugs the property found (regression tests)

fn rn(name: &str) -> ResourceName {
    ResourceName::parse(name).unwrap()
}

fn accepted(w: &mut World, name: &ResourceName, cascade: bool) -> OperationId {
    match w.user_delete(name, cascade, false).unwrap() {
        Ok(DeleteOutcome::Accepted(op)) => op.id,
        other => panic!("delete {name}: {other:?}"),
    }
}

/// Regression (found by this property): an importer's part of an
/// operation stayed RUNNING (with nothing pending) forever when the owner's PURGED event arrives after the importer's walk
/// of the deletion used up its batch budget on the last referrer: the walk
/// stopped before it saw that no row was left, and the PURGED event, seeing
/// no mirror row left, dropped the tombstone and the work item, so the walk
/// never finishes and the part is never marked finished. The node reports
/// an operation `done` only when every region's part is, so the operation
/// never completes (`delete --wait` does not return).
#[test]
fn importer_part_finishes_when_purged_follows_a_walk_cut_by_the_budget() {
    let (ra, rb) = (0, 1);
    let mut w = World::new(1, 3);
    let m = w
        .create_with(rn("rb/owner/m"), BTreeMap::new(), Stage::Settled)
        .unwrap()
        .expect("m");
    w.create_with(
        rn("ra/note/n"),
        BTreeMap::from([("owner".to_owned(), vec![m.clone()])]),
        Stage::Settled,
    )
    .unwrap()
    .expect("n");
    let op = accepted(&mut w, &m.name, true);
    w.work(rb, 10).unwrap(); // m waits for ra to release n's reference
    assert_eq!(w.deliver_events(rb, ra, 10).unwrap(), 1, "DELETING of m");
    // One step with a budget of one: n loses its owner (ra's part of the
    // operation is created), and the walk stops there.
    w.work(ra, 1).unwrap();
    assert!(w.regions[ra].state.resources[&rn("ra/note/n")].refs.is_empty());
    assert!(w.deliver_releases(ra, rb).unwrap());
    // rb purges m (confirming first, when the root waits for ra's part).
    for _ in 0..3 {
        w.work(rb, 10).unwrap();
        for (r, id) in std::mem::take(&mut w.awaiting) {
            w.collect_closure(r, id, 0, Between::Nothing).unwrap();
        }
    }
    assert!(!w.regions[rb].state.resources.contains_key(&m.name), "m purged");
    assert!(w.deliver_events(rb, ra, 10).unwrap() >= 1, "PURGED of m");
    w.quiesce().unwrap();
    let part = &w.regions[ra].state.operations[&op];
    assert_eq!(part.progress.pending, 0);
    assert_ne!(
        part.state,
        OperationState::Running,
        "ra's part of the operation is finished: {part:?}"
    );
}

/// Regression (found in review): the importer's walk of a remote
/// deletion forgot a referrer its principal may not update when the
/// step's budget ran out after it. The refused referrer keeps its row and
/// its reference, but the next step resumed past it, reached the end with
/// no refusal of its own and ended the importer's part: nothing looked at
/// the refused referrer again, its release was never sent, and the owner's
/// deletion waited for it forever, even once the policy allowed it.
#[test]
fn importer_retries_a_referrer_refused_before_its_walk_ran_out_of_budget() {
    let (ra, rb) = (0, 1);
    // A budget of 2 referrers a step, 5 notes: the walk takes 3 steps.
    let mut w = World::new(2, 3);
    let m = w
        .create_with(rn("rb/owner/m"), BTreeMap::new(), Stage::Settled)
        .unwrap()
        .expect("m");
    for i in 0..5 {
        w.create_with(
            rn(&format!("ra/note/n{i}")),
            BTreeMap::from([("owner".to_owned(), vec![m.clone()])]),
            Stage::Settled,
        )
        .unwrap()
        .expect("a note");
    }
    // The first row the importer's walk meets is refused: the budget runs
    // out right after it.
    let refused = w.regions[ra]
        .state
        .backrefs
        .values()
        .find(|b| b.target.uid == m.uid)
        .map(|b| b.referrer.name.clone())
        .expect("a mirror row of m at ra");
    w.authorizer.no_update.insert(refused.clone());
    let op = accepted(&mut w, &m.name, true);
    w.work(rb, 10).unwrap(); // m waits for ra to release the notes' references
    assert_eq!(w.deliver_events(rb, ra, 10).unwrap(), 1, "DELETING of m");
    // ra's walk, over several steps and retries, while the refusal holds.
    for _ in 0..5 {
        w.work(ra, 10).unwrap();
        w.now = w.now.plus_millis(w.policy.backoff_cap_ms);
    }
    let notes_left: Vec<String> = w.regions[ra]
        .state
        .resources
        .values()
        .filter(|r| r.refs.contains_key("owner"))
        .map(|r| r.name.to_string())
        .collect();
    assert_eq!(
        notes_left,
        vec![refused.to_string()],
        "only the refused note keeps its reference to m"
    );
    let work = w.regions[ra].state.work.get(&m.uid);
    assert!(
        work.is_some_and(|item| item.last_error.as_deref().is_some_and(|e| e.contains(refused.as_str()))),
        "ra's part of the deletion of m is not over while {refused} holds m, and says why: {work:?}"
    );
    // The policy allows it now: the walk's retry unsets it, the release
    // goes, and m is purged.
    w.authorizer.no_update.clear();
    w.quiesce().unwrap();
    assert!(
        w.regions[ra].state.resources[&refused].refs.is_empty(),
        "{refused} unset"
    );
    assert!(!w.regions[rb].state.resources.contains_key(&m.name), "m purged");
    let part = &w.regions[ra].state.operations[&op];
    assert_ne!(part.state, OperationState::Running, "ra's part is finished: {part:?}");
}

/// The deletion record an event stands for when none was left in the
/// step's writes (a leaf purged by a cascade at once, or a root that nothing
/// references, ended in the step that accepted it): what the checks of an
/// entered deletion read.
fn record_of_event(e: &Event, operation: OperationId, reason: DeletionReason) -> DeletionRecord {
    DeletionRecord {
        target: e.resource.clone(),
        deleted_at: e.time,
        reason,
        requested_by: String::new(),
        operation,
        status: DeletionStatus::Pending,
        finalizer_failures: Vec::new(),
        forced: None,
        principal: Default::default(),
    }
}
