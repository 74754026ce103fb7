//! A model checker for Cascade's cross-region deletion protocol.
//!
//! The model is a [`stateright::Model`] whose transitions call the core
//! crate's **own** step functions (`protocol::delete`, `protocol::process_work`,
//! `peer::attach`, `peer::release`, `peer::apply_remote_events`, `peer::settle`,
//! `peer::releases_acknowledged`, `peer::standing`) on one [`MemoryState`] per
//! region: there is no second copy of the protocol here, only the network,
//! the clock and the client around it.
//!
//! # The world
//!
//! Three regions (`ra`, `rb`, `rc`) over the example schema
//! ([`cascade_core::schema::EXAMPLE_SCHEMA`]). The initial topology is built
//! through the real create → attach → settle path (see [`Setup`]):
//!
//! ```text
//! ra: project p, network n (→ p), network n2 (→ p), port_group h (ports → [rc/port/x])
//! rb: project q, network m (project → ra/project/p), port pt (network → ra/network/n),
//!     floating_ip f (project → rb/project/q, port → rb/port/pt: unset)
//! rc: project q, port x (network → rb/network/m), port_group g (ports → [rb/port/pt]),
//!     router r (project → rc/project/q, gateway_network → ra/network/n2: block)
//! ```
//!
//! The cascade of `ra/project/p` goes ra → rb → rc → ra (p → m → x → h) and
//! ra → rb → rc (n → pt → g); `f.port` is unset; `n2` is held by the router
//! in rc (blocked, then FAILED after `max_attempts`) until a second client
//! deletes the router.
//!
//! # Actions
//!
//! - the client deletes `ra/project/p` (cascade), once; optionally a second
//!   client deletes the blocker `rc/router/r`, once;
//! - a region runs one `process_work` step (when work is due, or by jumping
//!   its clock to the next scheduled attempt, a bounded number of times);
//! - a watcher applies the next 1 or 2 DELETING/PURGED events of an owner's
//!   outbox after its durable cursor (the Watch stream, resumed from the cursor);
//! - an importer sends its pending releases to an owner; a release request in
//!   flight is delivered, delivered and kept (duplicated), or lost; the
//!   owner's answer (the ack) is delivered (`releases_acknowledged`) or lost;
//! - a region crashes and restarts: its durable state (the `MemoryState`)
//!   survives, every message in flight to it is lost;
//! - the owner's periodic CheckBackrefs (`peer::standing` at the importer,
//!   then `peer::release(None, …, generation u64::MAX)` at the owner);
//! - optionally, a racing create in rb of a port referencing `ra/network/n`
//!   (CREATING, Attach request/answer over the network, `peer::settle`);
//! - optionally (issue 29, [`Config::budget`] and [`Config::controls`]):
//!   the root's delete carries a budget, registered in rb and rc first;
//!   rb or rc leases one unit of it from ra; the root's region tells one
//!   region to pause, resume or cancel its part (each at most once);
//! - optionally (issue 29, [`Config::undelete`], see [`undelete`]): the
//!   client's Undelete of the root's finished soft-deleting operation,
//!   driven by ra region by region and round by round (a lost answer, a
//!   redrive, a crash of ra's driver), racing the expiry (a clock jump), a
//!   second Delete of a restored member and an update of the unset
//!   referrer `f`.
//! - optionally (issue 31, [`Config::schema_change`], see
//!   [`schema_change`]): any region reloads its schema between two steps,
//!   at any moment: a kind added, then the router's `block` gateway made
//!   `unset`; each reload judged by the core's compatibility rules over
//!   the region's stored state, as the node judges it, and a refused one
//!   changes nothing. A region's steps run under the schema it has in
//!   force.
//!
//! Losses, crashes and clock jumps are bounded by the [`Config`]; the
//! undelete run by one fault, three clock jumps per region, a window of
//! 100 ms (longer than the backoff: a jump to a retry does not pass it,
//! one to the expiry does), one undelete, one second Delete, one update.
//!
//! # Properties
//!
//! Always: [`ALWAYS`] (the core checker's dangling, missing back-reference
//! and resurrection findings, over-deletion, leaks at quiescence, the root
//! outliving its closure, the budget; with the undelete: no member both
//! RESTORED and purged, a finished undelete accounting for every member,
//! no name under a new uid, no reference put back after its referrer
//! changed). Eventually: every deletion of the closure finishes or is
//! explained; the undelete ends.
//!
//! Size: about 1,700 lines in one file: one stateright `Model`, whose state,
//! actions and properties share private types; it reads top to bottom (the
//! world, the actions, the properties). The undelete's actions and
//! properties are apart, in [`undelete`].
//!
//! [`lease`] is a second, separate model: one region's writer lease row in
//! PostgreSQL and its nodes, with the fence every commit runs.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::hash::{Hash, Hasher};

use cascade_core::closure::{ClosureCheck, PartAnswer, PartSummary, Phase, Verdict};
use cascade_core::invariants::{self, RegionView, ViolationKind};
use cascade_core::memory::MemoryState;
use cascade_core::peer::{self, PeerBackRef};
use cascade_core::protocol::{self, Ctx, DeleteOutcome, DeleteRequest, Policy, RefRequest, ResourceSpec};
use cascade_core::schema::{Schema, EXAMPLE_SCHEMA};
use cascade_core::state::StateRead;
use cascade_core::{
    BackRefKey, CoreError, DeletionStatus, EventType, IdSource, RefTarget, RegionId, RemoteEvent, Resource,
    ResourceName, ResourceState, SequentialIds, Timestamp, Uid,
};
use stateright::{Model, Property};

pub mod lease;
pub mod schema_change;
pub mod undelete;

/// The properties that must hold in every state (what a depth-bounded search can check).
pub const ALWAYS: [&str; 11] = [
    "1 no dangling reference",
    "1 every live reference has its back-reference at the owner",
    "2 no resurrection",
    "3 no over-deletion",
    "4 no leak at quiescence",
    "the root outlives its closure in every region",
    "no more members than the operation's budget enter deletion",
    "an undeleted member is never also purged",
    "a finished undelete reports every member restored (live) or not restored (with a reason)",
    "no purged name held under a new uid, no reference put back after its referrer changed",
    "no reference's on_delete changed in a region while a deletion of its kinds runs there",
];

/// The regions of the model, by index.
pub const REGIONS: [&str; 3] = ["ra", "rb", "rc"];
const RA: usize = 0;
const RB: usize = 1;
const RC: usize = 2;

/// The root of the client's delete.
pub const ROOT: &str = "ra/project/p";
/// The `block` referrer that holds `ra/network/n2`.
pub const BLOCKER: &str = "rc/router/r";
/// The resource of the racing create.
pub const LATE: &str = "rb/port/late";
/// What the racing create references.
pub const LATE_TARGET: &str = "ra/network/n";

/// The closure of the delete of [`ROOT`], by the schema's semantics (worked
/// out by hand, not by the core's planner).
pub const CLOSURE: [&str; 8] = [
    "ra/project/p",
    "ra/network/n",
    "ra/network/n2",
    "rb/network/m",
    "rb/port/pt",
    "rc/port/x",
    "rc/port_group/g",
    "ra/port_group/h",
];

/// Bounds and switches of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Message losses plus crashes, in total.
    pub faults: u8,
    /// Clock jumps to the next scheduled attempt, per region.
    pub jumps: u8,
    /// A second client may delete the blocker `rc/router/r`.
    pub delete_blocker: bool,
    /// The owner's periodic CheckBackrefs runs.
    pub check_backrefs: bool,
    /// A racing create in rb of a port referencing `ra/network/n`.
    pub racing_create: bool,
    /// Release and attach requests may be delivered twice.
    pub duplicates: bool,
    /// Peer calls are one atomic round trip (request applied and answered
    /// in one action; a fault loses the answer). Otherwise requests and
    /// answers are separate messages that can be delayed, duplicated, lost.
    pub atomic_rpc: bool,
    /// Largest Watch batch (events per delivery).
    pub max_batch: usize,
    /// Policy of every region (small batches and few attempts make more interleavings reachable).
    pub policy: Policy,
    /// The retention of the client's deletes (soft delete, issue 29): 0
    /// purges members as their deletions finish; otherwise they are kept
    /// DELETED until a region's clock passes their expiry (a clock jump
    /// reaches it: the expiry is a queue entry).
    pub retain_ms: u64,
    /// The client's delete carries this budget (`max_deletions`; issue
    /// 29): it registers the operation in rb and rc first, and the other
    /// regions lease units of it from ra (an atomic `Peer.BudgetLease`).
    pub budget: Option<u64>,
    /// The operation may be paused and resumed, and cancelled, in each
    /// region (each region is told on its own: the root's region's calls
    /// arrive in any order with everything else).
    pub controls: bool,
    /// The client undeletes the root's operation once it finished, racing
    /// the expiry, a second Delete of a restored member and an update of
    /// the unset referrer (see [`undelete`]). Needs `retain_ms > 0`.
    pub undelete: bool,
    /// Each region may reload its schema between two steps, at any moment
    /// (issue 31, see [`schema_change`]): a kind added, then a `block`
    /// reference of the cascade changed to `unset`, each judged by the
    /// compatibility check a reload runs.
    pub schema_change: bool,
}

impl Config {
    /// The bounded check that `cargo test` runs.
    pub fn bounded() -> Self {
        Self {
            faults: 1,
            jumps: 1,
            delete_blocker: true,
            check_backrefs: true,
            racing_create: false,
            duplicates: true,
            atomic_rpc: true,
            max_batch: 2,
            policy: small_policy(),
            retain_ms: 0,
            budget: None,
            controls: false,
            undelete: false,
            schema_change: false,
        }
    }

    /// The bounded configuration with a budget of 4 members (of the 8 of
    /// the closure) and pause, resume and cancel.
    pub fn bounded_with_controls() -> Self {
        Self {
            budget: Some(4),
            controls: true,
            delete_blocker: false,
            ..Self::bounded()
        }
    }

    /// No faults, no duplicates, one event per Watch delivery, no periodic check.
    pub fn minimal() -> Self {
        Self {
            faults: 0,
            duplicates: false,
            check_backrefs: false,
            max_batch: 1,
            ..Self::bounded()
        }
    }

    /// [`Config::bounded`] with soft delete: members are kept DELETED for
    /// a short window (shorter than the backoff, so a clock jump passes it).
    pub fn soft_delete() -> Self {
        Self {
            retain_ms: 5,
            // One more jump per region than `bounded`, and one for the
            // expiries.
            jumps: 3,
            ..Self::bounded()
        }
    }

    /// [`Config::soft_delete`] with the client's Undelete and its races
    /// ([`undelete`]); one fault (a lost `Peer.UndeletePart` answer or a
    /// crash of ra's driver), no duplicates or periodic check (covered by
    /// the other runs; they only add states here). The blocker is deleted:
    /// a deletion held by it never finishes, and only a finished one can
    /// be undone.
    pub fn undelete() -> Self {
        Self {
            undelete: true,
            check_backrefs: false,
            duplicates: false,
            // Longer than the backoff (40 ms at most): a jump to a retry
            // does not pass the window, one to the expiry itself does, so
            // both orders of the race are reachable.
            retain_ms: 100,
            ..Self::soft_delete()
        }
    }

    /// [`Config::bounded`] with schema reloads in every region (see
    /// [`schema_change`]); no duplicates or periodic check (covered by the
    /// other runs; they only add states here).
    pub fn schema_change() -> Self {
        Self {
            schema_change: true,
            duplicates: false,
            check_backrefs: false,
            ..Self::bounded()
        }
    }

    /// The deeper run (the `deep` example / the ignored test).
    pub fn deep() -> Self {
        Self {
            faults: 2,
            jumps: 2,
            racing_create: true,
            atomic_rpc: false,
            ..Self::bounded()
        }
    }
}

/// A policy with small batches, fast backoff and one attempt before FAILED.
pub fn small_policy() -> Policy {
    Policy {
        batch_budget: 3,
        batch_items: 3,
        backoff_base_ms: 10,
        backoff_cap_ms: 40,
        max_attempts: 1,
        ..Policy::default()
    }
}

/// One region: its durable state and its clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Region {
    pub state: MemoryState,
    pub now: Timestamp,
    /// Clock jumps left.
    pub jumps: u8,
}

/// A release request in flight: `from` (importer) asks `to` (owner) to drop rows.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReleaseMsg {
    pub from: usize,
    pub to: usize,
    /// (target, referrer, field, generation).
    pub entries: Vec<(RefTarget, RefTarget, String, u64)>,
    /// This is the second copy of a duplicated message: it is delivered at
    /// most once more, never duplicated again. Unbounded duplication would
    /// let a path deliver the same copy forever (an unfair loop that says
    /// nothing about liveness under fair delivery).
    pub redelivery: bool,
}

/// The owner's answer to a release request, in flight back to the importer.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AckMsg {
    /// The importer.
    pub to: usize,
    /// The owner that answered.
    pub from: usize,
    pub sent: Vec<(BackRefKey, u64)>,
}

/// An attach request of the racing create (rb → ra), or its answer.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AttachMsg {
    Request {
        entries: Vec<(RefTarget, RefTarget, String, u64)>,
        /// As [`ReleaseMsg::redelivery`].
        redelivery: bool,
    },
    Answer {
        keys: Vec<BackRefKey>,
        /// None: attached; Some: the owner's refusal.
        refused: Option<String>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct State {
    pub regions: Vec<Region>,
    pub root_deleted: bool,
    pub blocker_deleted: bool,
    /// The racing create was issued (whatever its outcome).
    pub late_created: bool,
    pub releases: BTreeSet<ReleaseMsg>,
    pub acks: BTreeSet<AckMsg>,
    pub attaches: BTreeSet<AttachMsg>,
    pub faults: u8,
    /// Uids that ever entered DELETING (from the outboxes, before compaction).
    pub ever_deleting: BTreeSet<Uid>,
    /// The root region's check of its cascade's closure, under way (the
    /// node keeps it in memory: a crash of ra loses it).
    pub check: Option<ClosureCheck>,
    /// Every region's change count of the root's operation when the last
    /// check started: a new check starts only once one of them moved (the
    /// node asks again after `closure_check_ms`; here, asking again with
    /// nothing changed would only add a cycle to the state graph).
    pub check_started_at: Option<[u64; 3]>,
    /// The controls each region was told (pause, resume, cancel), at most
    /// once each.
    pub controlled: [[bool; 3]; 3],
    /// The client's undelete, once issued.
    pub undelete: Option<cascade_core::OperationId>,
    /// ra's driver of the undelete (in its memory).
    pub drive: Option<undelete::Drive>,
    /// The second Delete of a member was issued: whether it was accepted.
    pub deleted_again: Option<bool>,
    /// The unset referrer was updated: whether that happened before the
    /// undelete put its reference back (`Some(true)`: it may not be).
    pub touched: Option<bool>,
    /// Uids the undelete brought back (from the outboxes' Undeleted events).
    pub restored: BTreeSet<Uid>,
    /// Each region's schema in force: an index into `CascadeModel::schemas`.
    pub schema_at: [u8; 3],
    /// The region's last reload was refused, and nothing happened since.
    pub reload_refused: [bool; 3],
    /// Some reload was refused.
    pub ever_refused: bool,
    /// The region put the policy change in force while a network or router
    /// was DELETING there.
    pub changed_while_deleting: [bool; 3],
}

/// Feeds `Debug` output into a hasher without allocating.
struct HashWriter<'a, H: Hasher>(&'a mut H);

impl<H: Hasher> fmt::Write for HashWriter<'_, H> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

impl Hash for State {
    // `MemoryState` is not `Hash`: hash the canonical (BTreeMap-ordered) Debug form of everything.
    fn hash<H: Hasher>(&self, state: &mut H) {
        use fmt::Write;
        let _ = write!(HashWriter(state), "{self:?}");
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    DeleteRoot,
    DeleteBlocker,
    /// One `process_work` step; `jump`: the clock first moves to the next scheduled attempt.
    Work {
        region: usize,
        jump: bool,
    },
    /// `watcher` applies the next `k` DELETING/PURGED events of `owner`'s outbox.
    Watch {
        owner: usize,
        watcher: usize,
        k: usize,
    },
    SendReleases {
        from: usize,
        to: usize,
    },
    DeliverRelease {
        msg: ReleaseMsg,
        duplicate: bool,
    },
    LoseRelease(ReleaseMsg),
    DeliverAck(AckMsg),
    LoseAck(AckMsg),
    Crash(usize),
    CheckBackrefs {
        owner: usize,
        importer: usize,
    },
    CreateLate,
    SendAttach,
    DeliverAttach {
        msg: AttachMsg,
        duplicate: bool,
    },
    LoseAttach(AttachMsg),
    /// Atomic peer calls: the importer's pending releases to `to`, applied
    /// at the owner; `answered`: the acknowledgement came back.
    Release {
        from: usize,
        to: usize,
        answered: bool,
    },
    /// Atomic peer calls: the racing create's attach at ra; `answered`: rb settles with the answer.
    Attach {
        answered: bool,
    },
    /// The root's region starts a check of its cascade's closure
    /// (`cascade_core::closure`): its own part is the root alone.
    CheckStart,
    /// The check reads one region's part of the operation, as it is now
    /// (`Peer.OperationPart` is one read of one region's store). Reads
    /// interleave with everything else, as the node's calls do.
    CheckRead,
    /// The check is done: the root's region confirms (the core's
    /// `confirm_remote_closure`) or drops it.
    CheckConclude,
    /// A region other than the root's leases one unit of the budget from
    /// ra (an atomic `Peer.BudgetLease`), when its part has none left.
    Lease(usize),
    /// The root's region tells `region` to pause, resume or cancel its
    /// part of the root's operation (each at most once per region).
    Control {
        region: usize,
        control: protocol::Control,
    },
    /// The client's Undelete of the root's finished deletion, at ra.
    UndeleteStart,
    /// ra's driver asks its next region for one round
    /// (`Peer.UndeletePart`); `answered`: the answer came back.
    UndeleteAsk {
        answered: bool,
    },
    /// The reconciler drives the undelete again.
    UndeleteRedrive,
    /// A second client deletes a member ([`undelete::AGAIN`]).
    DeleteAgain,
    /// A client updates the unset referrer ([`undelete::REFERRER`]).
    TouchReferrer,
    /// `region` reloads its schema to the next of [`schema_change::schemas`],
    /// between two of its steps; refused (and nothing changes) when its
    /// stored data forbids it.
    ReloadSchema {
        region: usize,
    },
}

/// The model: the schema, policy, config, and what setup produced.
pub struct CascadeModel {
    pub config: Config,
    /// The example schema, which every stored row was attached under (the
    /// invariants' schema).
    pub schema: Schema,
    /// The schemas a region reloads through ([`schema_change`]); the first
    /// is `schema`.
    pub schemas: Vec<Schema>,
    pub region_ids: Vec<RegionId>,
    pub init: State,
    /// Every resource setup created: name → uid.
    pub initial: BTreeMap<ResourceName, Uid>,
    /// Ids after setup (operation ids and the racing create's uid come from clones of it).
    pub ids: SequentialIds,
}

fn rn(name: &str) -> ResourceName {
    ResourceName::parse(name).expect("resource name")
}

fn region_of(name: &ResourceName) -> usize {
    REGIONS.iter().position(|r| *r == name.region()).expect("known region")
}

/// The initial topology, built through the core's create → attach → settle path.
pub struct Setup {
    schema: Schema,
    policy: Policy,
    region_ids: Vec<RegionId>,
    regions: Vec<MemoryState>,
    ids: SequentialIds,
    now: Timestamp,
}

impl Setup {
    fn new(policy: Policy) -> Self {
        Self {
            schema: Schema::from_toml(EXAMPLE_SCHEMA).expect("example schema"),
            policy,
            region_ids: REGIONS.iter().map(|r| RegionId::parse(r).unwrap()).collect(),
            regions: vec![MemoryState::default(); 3],
            // One id source for every region: uids are globally unique.
            ids: SequentialIds::default(),
            now: Timestamp(1_000),
        }
    }

    fn ctx(&self, region: usize) -> Ctx<'_> {
        Ctx {
            schema: &self.schema,
            region: &self.region_ids[region],
            now: self.now,
            policy: &self.policy,
            authorizer: &cascade_core::auth::AllowAll,
        }
    }

    fn uid(&self, name: &str) -> Uid {
        let name = rn(name);
        self.regions[region_of(&name)].resources[&name].uid
    }

    /// Creates `name` with references (targets resolved to their uids here,
    /// as the node resolves them at their owners), attaches its cross-region
    /// references at each owner, and settles it.
    fn create(&mut self, name: &str, refs: &[(&str, &[&str])]) -> Resource {
        let region = region_of(&rn(name));
        let spec = ResourceSpec {
            name: name.to_owned(),
            refs: refs
                .iter()
                .map(|(field, targets)| {
                    let targets = targets
                        .iter()
                        .map(|t| RefRequest {
                            name: (*t).to_owned(),
                            uid: Some(self.uid(t)),
                        })
                        .collect();
                    ((*field).to_owned(), targets)
                })
                .collect(),
            ..ResourceSpec::default()
        };
        let mut ids = self.ids.clone();
        let step = protocol::create(&self.regions[region], self.ctx(region), &mut ids, vec![spec])
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
        self.ids = ids;
        let resource = step.value[0].clone();
        self.regions[region].apply(step.writes);
        if resource.state == ResourceState::Active {
            return resource;
        }
        // Attach at every owner, from the importer's mirror rows.
        let mut by_owner: BTreeMap<usize, Vec<PeerBackRef>> = BTreeMap::new();
        for row in self.regions[region].backrefs.values() {
            if row.referrer.uid == resource.uid && row.target.name.region() != REGIONS[region] {
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
        for (owner, entries) in by_owner {
            let step = peer::attach(&self.regions[owner], self.ctx(owner), REGIONS[region], entries)
                .unwrap_or_else(|e| panic!("attach {name} at {}: {e}", REGIONS[owner]));
            self.regions[owner].apply(step.writes);
        }
        let keys = self.regions[region].pending_attach[&resource.uid].keys.clone();
        let step = peer::settle(
            &self.regions[region],
            self.ctx(region),
            &resource.name,
            resource.uid,
            &keys,
            Ok(()),
        )
        .unwrap_or_else(|e| panic!("settle {name}: {e}"));
        self.regions[region].apply(step.writes);
        let settled = step.value.unwrap_or_else(|e| panic!("settle {name}: {e}"));
        assert_eq!(settled.state, ResourceState::Active, "{name}");
        settled
    }

    /// Builds the topology of the module doc.
    pub fn build(policy: Policy) -> Self {
        let mut s = Self::new(policy);
        s.create("ra/project/p", &[]);
        s.create("ra/network/n", &[("project", &["ra/project/p"])]);
        s.create("ra/network/n2", &[("project", &["ra/project/p"])]);
        s.create("rb/project/q", &[]);
        s.create("rb/network/m", &[("project", &["ra/project/p"])]);
        s.create("rb/port/pt", &[("network", &["ra/network/n"])]);
        s.create(
            "rb/floating_ip/f",
            &[("project", &["rb/project/q"]), ("port", &["rb/port/pt"])],
        );
        s.create("rc/project/q", &[]);
        s.create("rc/port/x", &[("network", &["rb/network/m"])]);
        s.create("rc/port_group/g", &[("ports", &["rb/port/pt"])]);
        s.create(
            "rc/router/r",
            &[("project", &["rc/project/q"]), ("gateway_network", &["ra/network/n2"])],
        );
        s.create("ra/port_group/h", &[("ports", &["rc/port/x"])]);
        s
    }
}

impl CascadeModel {
    pub fn new(config: Config) -> Self {
        let setup = Setup::build(config.policy.clone());
        let initial = setup
            .regions
            .iter()
            .flat_map(|s| s.resources.values().map(|r| (r.name.clone(), r.uid)))
            .collect();
        let init = State {
            regions: setup
                .regions
                .iter()
                .map(|s| Region {
                    state: s.clone(),
                    now: setup.now,
                    jumps: config.jumps,
                })
                .collect(),
            root_deleted: false,
            blocker_deleted: false,
            late_created: false,
            releases: BTreeSet::new(),
            acks: BTreeSet::new(),
            attaches: BTreeSet::new(),
            faults: config.faults,
            ever_deleting: BTreeSet::new(),
            check: None,
            check_started_at: None,
            controlled: [[false; 3]; 3],
            undelete: None,
            drive: None,
            deleted_again: None,
            touched: None,
            restored: BTreeSet::new(),
            schema_at: [0; 3],
            reload_refused: [false; 3],
            ever_refused: false,
            changed_while_deleting: [false; 3],
        };
        let mut init = init;
        Self::compact(&mut init);
        Self {
            schema: setup.schema,
            schemas: schema_change::schemas(),
            region_ids: setup.region_ids,
            ids: setup.ids,
            initial,
            init,
            config,
        }
    }

    /// A step of `region`, under the schema it has in force.
    fn ctx(&self, s: &State, region: usize) -> Ctx<'_> {
        Ctx {
            schema: &self.schemas[usize::from(s.schema_at[region])],
            region: &self.region_ids[region],
            now: s.regions[region].now,
            policy: &self.config.policy,
            authorizer: &cascade_core::auth::AllowAll,
        }
    }

    /// The events of `owner` that `watcher` has not applied yet and is sent
    /// (`Event::concerns_importers`: not the PURGED of a leaf that skipped
    /// DELETING, which the node leaves out of `Peer.Watch`).
    fn undelivered(s: &State, owner: usize, watcher: usize) -> Vec<RemoteEvent> {
        let cursor = s.regions[watcher].state.cursor(REGIONS[owner]).unwrap_or(0);
        s.regions[owner]
            .state
            .events
            .iter()
            .filter(|e| e.revision > cursor && e.concerns_importers())
            .map(|e| RemoteEvent {
                revision: e.revision,
                event_type: e.event_type,
                resource: e.resource.clone(),
                operation: e.operation,
                no_cascade: e.no_cascade,
                principal: e.principal.clone(),
                retain_ms: e.retain_ms,
            })
            .collect()
    }

    fn release_msg(s: &State, from: usize, to: usize) -> Option<ReleaseMsg> {
        let entries: Vec<_> = s.regions[from]
            .state
            .pending_releases
            .iter()
            .filter(|((region, _), _)| region == REGIONS[to])
            .map(|(_, p)| {
                (
                    p.backref.target.clone(),
                    p.backref.referrer.clone(),
                    p.backref.field.clone(),
                    p.generation,
                )
            })
            .collect();
        (!entries.is_empty()).then_some(ReleaseMsg {
            from,
            to,
            entries,
            redelivery: false,
        })
    }

    /// A release call from `from` to `to` is still open: its request or its
    /// answer is in flight. The peer link sends again only when the call
    /// ended (answered, or failed: a loss here). Resending while an answer
    /// is on its way would also give the checker an unfair cycle (send,
    /// deliver, send, … with the answer never delivered), which it would
    /// report as a liveness violation.
    fn release_call_open(s: &State, from: usize, to: usize) -> bool {
        s.releases.iter().any(|m| m.from == from && m.to == to) || s.acks.iter().any(|a| a.to == from && a.from == to)
    }

    /// Owner rows whose referrer lives in `importer` and no longer stands
    /// there. Which rows are asked about is the node's own choice
    /// (`peer::rows_to_check`); the model's clock never makes a row too
    /// young to check, so the cutoff is the end of time.
    fn not_standing(s: &State, owner: usize, importer: usize) -> Vec<PeerBackRef> {
        let candidates = peer::rows_to_check(
            s.regions[owner].state.backrefs.values().cloned(),
            REGIONS[owner],
            REGIONS[importer],
            Timestamp(u64::MAX),
        );
        if candidates.is_empty() {
            return candidates;
        }
        let keys: Vec<BackRefKey> = candidates.iter().map(PeerBackRef::key).collect();
        let standing = peer::standing(&s.regions[importer].state, &keys).expect("standing");
        candidates
            .into_iter()
            .zip(standing)
            .filter(|(_, stands)| !stands)
            .map(|(c, _)| c)
            .collect()
    }

    fn late_uid(&self) -> Uid {
        let mut ids = self.ids.clone();
        let _operation_root = ids.next_uuid();
        let _operation_blocker = ids.next_uuid();
        Uid(ids.next_uuid())
    }

    fn late_attach_msg(&self, s: &State) -> Option<AttachMsg> {
        let uid = self.late_uid();
        let rb = &s.regions[RB].state;
        rb.pending_attach.get(&uid)?;
        let entries: Vec<_> = rb
            .backrefs
            .values()
            .filter(|b| b.referrer.uid == uid && b.target.name.region() == REGIONS[RA])
            .map(|b| (b.target.clone(), b.referrer.clone(), b.field.clone(), b.generation))
            .collect();
        (!entries.is_empty()).then_some(AttachMsg::Request {
            entries,
            redelivery: false,
        })
    }
}

impl CascadeModel {
    /// The owner applies a release request; returns its answer.
    fn deliver_release(&self, s: &mut State, msg: &ReleaseMsg) -> AckMsg {
        let step = peer::release(
            &s.regions[msg.to].state,
            self.ctx(s, msg.to),
            Some(REGIONS[msg.from]),
            to_peer(&msg.entries),
        )
        .unwrap_or_else(|e| panic!("release at {}: {e}", REGIONS[msg.to]));
        s.regions[msg.to].state.apply(step.writes);
        AckMsg {
            to: msg.from,
            from: msg.to,
            sent: to_peer(&msg.entries).iter().map(|e| (e.key(), e.generation)).collect(),
        }
    }

    /// The importer drops the acknowledged releases.
    fn deliver_ack(s: &mut State, ack: AckMsg) {
        let step = peer::releases_acknowledged(&s.regions[ack.to].state, REGIONS[ack.from], ack.sent)
            .unwrap_or_else(|e| panic!("ack at {}: {e}", REGIONS[ack.to]));
        s.regions[ack.to].state.apply(step.writes);
    }

    /// ra applies the racing create's attach request; returns its answer.
    fn deliver_attach(&self, s: &mut State, entries: &[(RefTarget, RefTarget, String, u64)]) -> AttachMsg {
        let keys = to_peer(entries).iter().map(PeerBackRef::key).collect();
        let refused = match peer::attach(&s.regions[RA].state, self.ctx(s, RA), REGIONS[RB], to_peer(entries)) {
            Ok(step) => {
                s.regions[RA].state.apply(step.writes);
                None
            }
            Err(e) => Some(e.to_string()),
        };
        AttachMsg::Answer { keys, refused }
    }

    /// rb settles the racing create with ra's answer.
    fn settle_late(&self, s: &mut State, answer: AttachMsg) {
        let AttachMsg::Answer { keys, refused } = answer else {
            return;
        };
        let attached = match refused {
            None => Ok(()),
            Some(reason) => Err(CoreError::AttachRefused {
                region: REGIONS[RA].to_owned(),
                reason,
            }),
        };
        let step = peer::settle(
            &s.regions[RB].state,
            self.ctx(s, RB),
            &rn(LATE),
            self.late_uid(),
            &keys,
            attached,
        )
        .unwrap_or_else(|e| panic!("settle {LATE}: {e}"));
        s.regions[RB].state.apply(step.writes);
    }
}

fn to_peer(entries: &[(RefTarget, RefTarget, String, u64)]) -> Vec<PeerBackRef> {
    entries
        .iter()
        .map(|(target, referrer, field, generation)| PeerBackRef {
            target: target.clone(),
            referrer: referrer.clone(),
            field: field.clone(),
            generation: *generation,
        })
        .collect()
}

/// The index of a control in [`State::controlled`].
fn control_index(control: protocol::Control) -> usize {
    match control {
        protocol::Control::Pause => 0,
        protocol::Control::Resume => 1,
        protocol::Control::Cancel => 2,
    }
}

/// An id source that hands out the ids of a clone of the model's, skipping `skip`.
fn ids_after(ids: &SequentialIds, skip: usize) -> SequentialIds {
    let mut ids = ids.clone();
    for _ in 0..skip {
        ids.next_uuid();
    }
    ids
}

fn user_delete(name: &str, retain_ms: u64) -> DeleteRequest {
    DeleteRequest {
        name: name.to_owned(),
        cascade: true,
        dry_run: false,
        allow_missing: false,
        etag: None,
        uid: None,
        requested_by: "model".to_owned(),
        orphan: false,
        remote_kept: Default::default(),
        principal: Default::default(),
        retain_ms,
        bounds: Default::default(),
        operation_id: None,
    }
}

impl Model for CascadeModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.init.clone()]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if !s.root_deleted {
            actions.push(Action::DeleteRoot);
        }
        if self.config.delete_blocker && !s.blocker_deleted {
            actions.push(Action::DeleteBlocker);
        }
        self.control_actions(s, actions);
        self.undelete_actions(s, actions);
        self.schema_actions(s, actions);
        if self.config.racing_create && !s.late_created {
            actions.push(Action::CreateLate);
        }
        for (i, r) in s.regions.iter().enumerate() {
            if r.state.work.values().any(|w| w.next_attempt_at <= r.now) {
                actions.push(Action::Work { region: i, jump: false });
            } else if r.jumps > 0 && !r.state.work.is_empty() {
                actions.push(Action::Work { region: i, jump: true });
            }
        }
        for owner in 0..3 {
            for watcher in (0..3).filter(|w| *w != owner) {
                let n = Self::undelivered(s, owner, watcher).len();
                for k in 1..=n.min(self.config.max_batch) {
                    actions.push(Action::Watch { owner, watcher, k });
                }
            }
        }
        for from in 0..3 {
            for to in (0..3).filter(|t| *t != from) {
                if self.config.atomic_rpc {
                    if Self::release_msg(s, from, to).is_some() {
                        actions.push(Action::Release {
                            from,
                            to,
                            answered: true,
                        });
                        if s.faults > 0 {
                            actions.push(Action::Release {
                                from,
                                to,
                                answered: false,
                            });
                        }
                    }
                } else if Self::release_msg(s, from, to).is_some() && !Self::release_call_open(s, from, to) {
                    actions.push(Action::SendReleases { from, to });
                }
                if self.config.check_backrefs && !Self::not_standing(s, to, from).is_empty() {
                    actions.push(Action::CheckBackrefs {
                        owner: to,
                        importer: from,
                    });
                }
            }
        }
        for msg in &s.releases {
            actions.push(Action::DeliverRelease {
                msg: msg.clone(),
                duplicate: false,
            });
            if self.config.duplicates && !msg.redelivery {
                actions.push(Action::DeliverRelease {
                    msg: msg.clone(),
                    duplicate: true,
                });
            }
            if s.faults > 0 {
                actions.push(Action::LoseRelease(msg.clone()));
            }
        }
        for ack in &s.acks {
            actions.push(Action::DeliverAck(ack.clone()));
            if s.faults > 0 {
                actions.push(Action::LoseAck(ack.clone()));
            }
        }
        // Like the node's create flow: one attach call at a time.
        if self.late_attach_msg(s).is_some() && s.attaches.is_empty() {
            actions.push(Action::SendAttach);
        }
        for msg in &s.attaches {
            actions.push(Action::DeliverAttach {
                msg: msg.clone(),
                duplicate: false,
            });
            if self.config.duplicates && matches!(msg, AttachMsg::Request { redelivery: false, .. }) {
                actions.push(Action::DeliverAttach {
                    msg: msg.clone(),
                    duplicate: true,
                });
            }
            if s.faults > 0 {
                actions.push(Action::LoseAttach(msg.clone()));
            }
        }
        match &s.check {
            None if self.check_startable(s) => actions.push(Action::CheckStart),
            None => {}
            Some(check) if check.phase() == Phase::Done => actions.push(Action::CheckConclude),
            Some(_) => actions.push(Action::CheckRead),
        }
        if s.faults > 0 && !self.config.atomic_rpc {
            for region in 0..3 {
                let inbound = s.releases.iter().any(|m| m.to == region)
                    || s.acks.iter().any(|a| a.to == region)
                    || s.attaches.iter().any(|a| match a {
                        AttachMsg::Request { .. } => region == RA,
                        AttachMsg::Answer { .. } => region == RB,
                    });
                if inbound {
                    actions.push(Action::Crash(region));
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        if !matches!(action, Action::ReloadSchema { .. }) {
            s.reload_refused = [false; 3];
        }
        match action {
            Action::ReloadSchema { region } => self.reload_step(&mut s, region),
            Action::DeleteRoot => {
                s.root_deleted = true;
                let mut ids = ids_after(&self.ids, 0);
                let mut req = user_delete(ROOT, self.config.retain_ms);
                if let Some(budget) = self.config.budget {
                    // Registered in the other regions before the step, as
                    // the node does (`operation_control.rs`).
                    let id = cascade_core::OperationId(ids_after(&self.ids, 0).next_uuid());
                    let bounds = protocol::Bounds {
                        max_deletions: Some(budget),
                        rate_per_s: None,
                    };
                    let root = s.regions[RA].state.resources.get(&rn(ROOT))?;
                    let root = RefTarget {
                        name: root.name.clone(),
                        uid: root.uid,
                    };
                    for region in [RB, RC] {
                        let step = protocol::register_operation(
                            &s.regions[region].state,
                            self.ctx(&s, region),
                            id,
                            root.clone(),
                            bounds,
                        )
                        .unwrap_or_else(|e| panic!("register the budget: {e}"));
                        s.regions[region].state.apply(step.writes);
                    }
                    req.bounds = bounds;
                    req.operation_id = Some(id);
                }
                let step = protocol::delete(&s.regions[RA].state, self.ctx(&s, RA), &mut ids, req)
                    .unwrap_or_else(|e| panic!("delete {ROOT}: {e}"));
                assert!(matches!(step.value, DeleteOutcome::Accepted(_)), "{:?}", step.value);
                s.regions[RA].state.apply(step.writes);
            }
            Action::DeleteBlocker => {
                s.blocker_deleted = true;
                let mut ids = ids_after(&self.ids, 1);
                let step = protocol::delete(
                    &s.regions[RC].state,
                    self.ctx(&s, RC),
                    &mut ids,
                    user_delete(BLOCKER, self.config.retain_ms),
                )
                .unwrap_or_else(|e| panic!("delete {BLOCKER}: {e}"));
                assert!(matches!(step.value, DeleteOutcome::Accepted(_)), "{:?}", step.value);
                s.regions[RC].state.apply(step.writes);
            }
            Action::CheckStart => {
                let op = Self::waiting_root_operation(&s)?.clone();
                s.check_started_at = Some(Self::part_changes(&s, op.id));
                s.check = Some(ClosureCheck::start(REGIONS[RA], REGIONS[1..].iter().copied(), &op));
            }
            Action::CheckRead => {
                let id = Self::waiting_root_operation(&s)?.id;
                let check = s.check.as_mut()?;
                if check.awaiting().next().is_none() {
                    check.next_round();
                }
                let region = check.awaiting().next()?.to_owned();
                let index = REGIONS
                    .iter()
                    .position(|r| *r == region)
                    .expect("a region of the model");
                let answer = match s.regions[index].state.operations.get(&id) {
                    Some(part) => PartAnswer::Part(PartSummary::of(part)),
                    None => PartAnswer::NoPart,
                };
                if let Some(check) = s.check.as_mut() {
                    check.answer(&region, answer);
                }
            }
            Action::CheckConclude => {
                let check = s.check.take()?;
                if let Some(Verdict::Finished { local_changes, .. }) = check.verdict() {
                    let id = Self::waiting_root_operation(&s)?.id;
                    let step =
                        protocol::confirm_remote_closure(&s.regions[RA].state, self.ctx(&s, RA), id, local_changes)
                            .unwrap_or_else(|e| panic!("confirm closure at ra: {e}"));
                    s.regions[RA].state.apply(step.writes);
                }
            }
            Action::Work { region, jump } => {
                let r = &mut s.regions[region];
                if jump {
                    let next = r.state.work.values().map(|w| w.next_attempt_at).min()?;
                    r.now = r.now.max(next);
                    r.jumps -= 1;
                }
                let step = protocol::process_work(&s.regions[region].state, self.ctx(&s, region))
                    .unwrap_or_else(|e| panic!("process_work at {}: {e}", REGIONS[region]));
                s.regions[region].state.apply(step.writes);
            }
            Action::Watch { owner, watcher, k } => {
                let events: Vec<RemoteEvent> = Self::undelivered(&s, owner, watcher).into_iter().take(k).collect();
                let step =
                    peer::apply_remote_events(&s.regions[watcher].state, self.ctx(&s, watcher), REGIONS[owner], events)
                        .unwrap_or_else(|e| panic!("apply events of {} at {}: {e}", REGIONS[owner], REGIONS[watcher]));
                s.regions[watcher].state.apply(step.writes);
            }
            Action::SendReleases { from, to } => {
                s.releases.insert(Self::release_msg(&s, from, to)?);
            }
            Action::DeliverRelease { msg, duplicate } => {
                s.releases.remove(&msg);
                if duplicate {
                    s.releases.insert(ReleaseMsg {
                        redelivery: true,
                        ..msg.clone()
                    });
                }
                let ack = self.deliver_release(&mut s, &msg);
                s.acks.insert(ack);
            }
            Action::Release { from, to, answered } => {
                let msg = Self::release_msg(&s, from, to)?;
                let ack = self.deliver_release(&mut s, &msg);
                if answered {
                    Self::deliver_ack(&mut s, ack);
                } else {
                    s.faults -= 1;
                }
            }
            Action::LoseRelease(msg) => {
                s.releases.remove(&msg);
                s.faults -= 1;
            }
            Action::DeliverAck(ack) => {
                s.acks.remove(&ack);
                Self::deliver_ack(&mut s, ack);
            }
            Action::LoseAck(ack) => {
                s.acks.remove(&ack);
                s.faults -= 1;
            }
            Action::Crash(region) => {
                // Durable state survives; what was in flight to the region is gone.
                if region == RA {
                    // The check and the undelete's driver live in the node's memory.
                    s.check = None;
                    s.check_started_at = None;
                    s.drive = None;
                }
                s.releases.retain(|m| m.to != region);
                s.acks.retain(|a| a.to != region);
                s.attaches.retain(|a| match a {
                    AttachMsg::Request { .. } => region != RA,
                    AttachMsg::Answer { .. } => region != RB,
                });
                s.faults -= 1;
            }
            Action::CheckBackrefs { owner, importer } => {
                let gone = Self::not_standing(&s, owner, importer);
                let step = peer::release(&s.regions[owner].state, self.ctx(&s, owner), None, gone)
                    .unwrap_or_else(|e| panic!("check at {}: {e}", REGIONS[owner]));
                s.regions[owner].state.apply(step.writes);
            }
            Action::Lease(region) => {
                let id = Self::root_operation_id(&s)?;
                let grant = protocol::grant_budget(&s.regions[RA].state, self.ctx(&s, RA), id, 1)
                    .unwrap_or_else(|e| panic!("grant: {e}"));
                s.regions[RA].state.apply(grant.writes);
                let step =
                    protocol::accept_budget_lease(&s.regions[region].state, self.ctx(&s, region), id, grant.value)
                        .unwrap_or_else(|e| panic!("accept a lease: {e}"));
                s.regions[region].state.apply(step.writes);
                // The held member looks again a second later: that second
                // passes (a node's clock does not stop).
                let later = s.regions[region].now.plus_millis(protocol::HELD_RECHECK_MS);
                s.regions[region].now = later;
            }
            Action::Control { region, control } => {
                let id = Self::root_operation_id(&s)?;
                s.controlled[region][control_index(control)] = true;
                let root = s.regions[RA].state.operations.get(&id)?.root.clone();
                let mut ids = ids_after(&self.ids, 3);
                let req = protocol::AdminRequest {
                    who: "model".to_owned(),
                    action: control.action().to_owned(),
                    target: id.to_string(),
                    reason: String::new(),
                };
                // A refusal (the operation ended here, or was cancelled)
                // changes nothing, as at a node.
                if let Ok(step) = protocol::control_operation(
                    &s.regions[region].state,
                    self.ctx(&s, region),
                    &mut ids,
                    id,
                    control,
                    Some(root),
                    req,
                ) {
                    s.regions[region].state.apply(step.writes);
                }
                if control == protocol::Control::Resume {
                    // The paused items look again a second later: that
                    // second passes (a node's clock does not stop).
                    let later = s.regions[region].now.plus_millis(protocol::PAUSED_RECHECK_MS);
                    s.regions[region].now = later;
                }
            }
            Action::CreateLate => {
                s.late_created = true;
                let uid = s.regions[RA].state.resources.get(&rn(LATE_TARGET)).map(|r| r.uid);
                // The client resolved the target at its owner before (the uid setup gave it).
                let uid = uid.or_else(|| self.initial.get(&rn(LATE_TARGET)).copied());
                let spec = ResourceSpec {
                    name: LATE.to_owned(),
                    refs: [(
                        "network".to_owned(),
                        vec![RefRequest {
                            name: LATE_TARGET.to_owned(),
                            uid,
                        }],
                    )]
                    .into(),
                    ..ResourceSpec::default()
                };
                let mut ids = ids_after(&self.ids, 2);
                // Refused (the rb tombstone of the target): nothing happens.
                if let Ok(step) = protocol::create(&s.regions[RB].state, self.ctx(&s, RB), &mut ids, vec![spec]) {
                    assert_eq!(step.value[0].uid, self.late_uid());
                    s.regions[RB].state.apply(step.writes);
                }
            }
            Action::SendAttach => {
                s.attaches.insert(self.late_attach_msg(&s)?);
            }
            Action::DeliverAttach { msg, duplicate } => {
                s.attaches.remove(&msg);
                match msg {
                    AttachMsg::Request { entries, .. } => {
                        if duplicate {
                            s.attaches.insert(AttachMsg::Request {
                                entries: entries.clone(),
                                redelivery: true,
                            });
                        }
                        let answer = self.deliver_attach(&mut s, &entries);
                        s.attaches.insert(answer);
                    }
                    answer @ AttachMsg::Answer { .. } => self.settle_late(&mut s, answer),
                }
            }
            Action::Attach { answered } => {
                let Some(AttachMsg::Request { entries, .. }) = self.late_attach_msg(&s) else {
                    return None;
                };
                let answer = self.deliver_attach(&mut s, &entries);
                if answered {
                    self.settle_late(&mut s, answer);
                } else {
                    s.faults -= 1;
                }
            }
            Action::LoseAttach(msg) => {
                s.attaches.remove(&msg);
                s.faults -= 1;
            }
            action @ (Action::UndeleteStart
            | Action::UndeleteAsk { .. }
            | Action::UndeleteRedrive
            | Action::DeleteAgain
            | Action::TouchReferrer) => self.undelete_step(&mut s, &action)?,
        }
        Self::compact(&mut s);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ALWAYS[0], |m, s| m.dangling(s).is_empty()),
            Property::always(ALWAYS[1], |m, s| m.uncovered(s).is_empty()),
            Property::always(ALWAYS[2], |m, s| m.resurrected(s).is_empty()),
            Property::always(ALWAYS[3], |m, s| m.over_deleted(s).is_empty()),
            Property::always(ALWAYS[4], |m, s| !m.quiescent(s) || m.leaks(s).is_empty()),
            Property::always(ALWAYS[5], |m, s| m.orphaned_parts(s).is_empty()),
            Property::always(ALWAYS[6], |m, s| m.over_budget(s).is_empty()),
            Property::always(ALWAYS[7], |m, s| m.restored_but_gone(s).is_empty()),
            Property::always(ALWAYS[8], |m, s| m.unaccounted(s).is_empty()),
            Property::always(ALWAYS[9], |m, s| m.restored_wrongly(s).is_empty()),
            Property::always(ALWAYS[10], |m, s| m.changed_under_a_deletion(s).is_empty()),
            // Every maximal path is finite (faults and clock jumps are bounded),
            // so this is checked at the states where nothing more can happen.
            Property::eventually("every deletion of the closure finishes or is explained", |m, s| {
                m.closure_resolved(s)
            }),
            Property::eventually("the undelete ends (or never could start)", |m, s| {
                !m.config.undelete || m.undelete_settled(s)
            }),
            // Coverage of the reloads (trivially found without them).
            Property::sometimes("a reload refused while the cascade ran", |m, s: &State| {
                !m.config.schema_change || s.ever_refused
            }),
            Property::sometimes(
                "a region ran the changed policy while another ran the old one",
                |m, s: &State| {
                    !m.config.schema_change || (s.schema_at.contains(&2) && s.schema_at.iter().any(|a| *a < 2))
                },
            ),
            // Coverage of the races (trivially found without the undelete).
            Property::sometimes("an undelete restored members in two regions", |m, s| {
                !m.config.undelete || m.undelete_restored_across_regions(s)
            }),
            Property::sometimes("an undelete reported expired members", |m, s| {
                !m.config.undelete || m.undelete_met_the_expiry(s)
            }),
            if self.config.delete_blocker {
                Property::sometimes("the whole closure purged", |m, s| m.closure_purged(s))
            } else {
                Property::sometimes("quiescent with the blocked deletion explained", |m, s| {
                    m.quiescent(s)
                        && s.regions.iter().any(|r| {
                            r.state.deletions.values().any(|d| {
                                matches!(d.status, DeletionStatus::Blocked { .. } | DeletionStatus::Failed { .. })
                            })
                        })
                })
            },
        ]
    }
}

/// The budget and controls of the root's operation (issue 29).
impl CascadeModel {
    /// The root's operation, once the client deleted it.
    fn root_operation_id(s: &State) -> Option<cascade_core::OperationId> {
        s.regions[RA]
            .state
            .operations
            .values()
            .find(|op| op.root.name.as_str() == ROOT && op.undelete.is_none())
            .map(|op| op.id)
    }

    /// Leases and controls that can happen now.
    fn control_actions(&self, s: &State, actions: &mut Vec<Action>) {
        let Some(id) = Self::root_operation_id(s) else {
            return;
        };
        let root_left = s.regions[RA]
            .state
            .operations
            .get(&id)
            .and_then(|op| op.controls.as_ref())
            .map_or(0, |c| if c.cancelled { 0 } else { c.left() });
        for region in [RB, RC] {
            let part = s.regions[region].state.operations.get(&id);
            let spent = part
                .and_then(|op| op.controls.as_ref())
                .is_some_and(|c| c.max_deletions.is_some() && c.left() == 0);
            // Only while its cascade has work queued that could use it.
            if self.config.budget.is_some() && spent && root_left > 0 && !s.regions[region].state.work.is_empty() {
                actions.push(Action::Lease(region));
            }
        }
        if !self.config.controls {
            return;
        }
        for region in 0..3 {
            let told = s.controlled[region];
            if !told[0] {
                actions.push(Action::Control {
                    region,
                    control: protocol::Control::Pause,
                });
            } else if !told[1] {
                // A pause is always resumed in the end: no path stops paused.
                actions.push(Action::Control {
                    region,
                    control: protocol::Control::Resume,
                });
            }
            if !told[2] {
                actions.push(Action::Control {
                    region,
                    control: protocol::Control::Cancel,
                });
            }
        }
    }

    /// Whether the root's operation is held by its controls: paused or
    /// cancelled in some region, or its budget spent at the root's region. Its members not yet started
    /// stay ACTIVE, and those in DELETING wait, on purpose.
    fn held_by_controls(s: &State) -> bool {
        let Some(id) = Self::root_operation_id(s) else {
            return false;
        };
        let controls = |r: &Region| r.state.operations.get(&id).and_then(|op| op.controls.clone());
        s.regions
            .iter()
            .any(|r| controls(r).is_some_and(|c| c.cancelled || c.paused))
            || controls(&s.regions[RA]).is_some_and(|c| c.max_deletions.is_some() && c.left() == 0)
    }

    /// Members of the closure that left ACTIVE (DELETING or purged) beyond
    /// the operation's budget.
    pub fn over_budget(&self, s: &State) -> Vec<String> {
        let Some(budget) = self.config.budget else {
            return Vec::new();
        };
        let entered: Vec<&str> = CLOSURE
            .iter()
            .copied()
            .filter(|n| {
                let n = rn(n);
                s.regions[region_of(&n)]
                    .state
                    .resources
                    .get(&n)
                    .is_none_or(|r| r.state != ResourceState::Active)
            })
            .collect();
        if (entered.len() as u64) <= budget {
            return Vec::new();
        }
        vec![format!(
            "{} members entered deletion, budget {budget}: {entered:?}",
            entered.len()
        )]
    }
}

/// The checks behind the properties; each returns what violates it (empty: holds).
impl CascadeModel {
    /// The root's operation while its root waits for other regions' parts.
    fn waiting_root_operation(s: &State) -> Option<&cascade_core::Operation> {
        s.regions[RA].state.operations.values().find(|op| {
            op.root.name.as_str() == ROOT && op.undelete.is_none() && !op.closure_confirmed && !op.reached.is_empty()
        })
    }

    /// Every region's change count of operation `id` (0 without a part).
    fn part_changes(s: &State, id: cascade_core::OperationId) -> [u64; 3] {
        let mut out = [0; 3];
        for (i, r) in s.regions.iter().enumerate() {
            out[i] = r.state.operations.get(&id).map_or(0, |op| op.changes);
        }
        out
    }

    /// Whether the root's region would start a check of its closure now:
    /// its own part is the root alone (the core would accept the
    /// confirmation as far as its own part goes; the node's writer reports
    /// the operation then), and some part changed since the last check
    /// started. Whether the other regions are finished is the check's to
    /// find out.
    fn check_startable(&self, s: &State) -> bool {
        let Some(op) = Self::waiting_root_operation(s) else {
            return false;
        };
        if s.check_started_at == Some(Self::part_changes(s, op.id)) {
            return false;
        }
        let ra = &s.regions[RA].state;
        protocol::confirm_remote_closure(ra, self.ctx(s, RA), op.id, op.changes).is_ok_and(|step| step.value)
    }

    /// Parts of an operation with deletions pending in some region while
    /// the operation's root is already purged (DESIGN: the root stays
    /// readable until its whole closure, in every region, is finished).
    pub fn orphaned_parts(&self, s: &State) -> Vec<String> {
        let mut out = Vec::new();
        for (i, r) in s.regions.iter().enumerate() {
            for part in r.state.operations.values().filter(|p| p.progress.pending > 0) {
                // The origin's record is the one whose root is its own
                // (another region's part names the remote target it came from).
                let origin = s.regions.iter().enumerate().find_map(|(j, other)| {
                    other
                        .state
                        .operations
                        .get(&part.id)
                        .filter(|o| o.root.name.region() == REGIONS[j])
                });
                let Some(origin) = origin else { continue };
                if Self::holds(s, origin.root.uid).is_none() {
                    out.push(format!(
                        "{}: part of operation {} has {} pending, but its root {} is purged",
                        REGIONS[i], part.id, part.progress.pending, origin.root.name
                    ));
                }
            }
        }
        out
    }

    fn holds(s: &State, uid: Uid) -> Option<&Resource> {
        s.regions.iter().find_map(|r| {
            let name = r.state.uid_index.get(&uid)?;
            r.state.resources.get(name).filter(|x| x.uid == uid)
        })
    }

    /// Every region's state as the core checker's view.
    fn views<'s>(&'s self, s: &'s State) -> Vec<RegionView<'s>> {
        s.regions
            .iter()
            .zip(&self.region_ids)
            .map(|(r, id)| RegionView::from_state(id, &r.state))
            .collect()
    }

    /// The core checker's findings of `kind` among the invariants that
    /// hold in every state (messages in flight included).
    fn in_flight(&self, s: &State, kind: ViolationKind) -> Vec<String> {
        invariants::check_in_flight(&self.views(s), Some(&self.schema))
            .of_kind(kind)
            .map(ToString::to_string)
            .collect()
    }

    /// ACTIVE resources with a tracked reference to an incarnation no region
    /// holds (the core checker's `dangling`).
    pub fn dangling(&self, s: &State) -> Vec<String> {
        self.in_flight(s, ViolationKind::Dangling)
    }

    /// Live tracked references to an existing target whose owner keeps no
    /// back-reference row for them, or whose importer keeps no mirror row
    /// (the core checker's `missing_backref`; a gone target is dangling).
    pub fn uncovered(&self, s: &State) -> Vec<String> {
        self.in_flight(s, ViolationKind::MissingBackref)
    }

    /// Uids that ever entered DELETING (from every region's outbox).
    pub fn ever_deleting(s: &State) -> &BTreeSet<Uid> {
        &s.ever_deleting
    }

    /// Records the uids that entered DELETING, then compacts every outbox:
    /// only DELETING/PURGED events that some peer has yet to apply stay (the
    /// node compacts below its peers' acknowledged cursors the same way;
    /// revisions are unaffected, `next_revision` is kept apart).
    fn compact(s: &mut State) {
        Self::record_restored(s);
        for r in &s.regions {
            s.ever_deleting.extend(
                r.state
                    .events
                    .iter()
                    .filter(|e| e.event_type == EventType::Deleting)
                    .map(|e| e.resource.uid),
            );
        }
        for (owner, owner_name) in REGIONS.iter().enumerate() {
            let floor = (0..3)
                .filter(|w| *w != owner)
                .map(|w| s.regions[w].state.cursor(owner_name).unwrap_or(0))
                .min()
                .unwrap_or(0);
            s.regions[owner]
                .state
                .events
                .retain(|e| e.revision > floor && e.concerns_importers());
        }
    }

    /// ACTIVE or CREATING resources under a uid that ever entered DELETING
    /// (history: the model remembers every DELETING event), and the core
    /// checker's `resurrection` findings that hold in every state (a uid
    /// held twice, a tombstone of a uid live again, a row attached to a
    /// DELETING target after it entered DELETING).
    pub fn resurrected(&self, s: &State) -> Vec<String> {
        let deleting = &s.ever_deleting;
        let mut out: Vec<String> = s
            .regions
            .iter()
            .flat_map(|r| r.state.resources.values())
            // Soft-deleted (DELETED) is where a finished deletion may rest
            // with a retention: not live again.
            .filter(|r| {
                !matches!(r.state, ResourceState::Deleting | ResourceState::Deleted)
                    && deleting.contains(&r.uid)
                    // Brought back by the client's Undelete: live again on purpose.
                    && !Self::was_restored(s, r.uid)
            })
            .map(|r| format!("{} is {:?} after DELETING", r.name, r.state))
            .collect();
        let expected = Self::tombstones_awaiting_their_event(s);
        out.extend(
            self.in_flight(s, ViolationKind::Resurrection)
                .into_iter()
                .filter(|finding| {
                    !expected
                        .iter()
                        .any(|(region, name)| finding.contains(&format!("region {region} saw {name} ")))
                }),
        );
        out
    }

    fn allowed_deletions(&self, s: &State) -> BTreeSet<ResourceName> {
        let mut allowed: BTreeSet<ResourceName> = BTreeSet::new();
        if s.root_deleted {
            allowed.extend(CLOSURE.iter().map(|n| rn(n)));
        }
        if s.blocker_deleted {
            allowed.insert(rn(BLOCKER));
        }
        allowed
    }

    /// Resources of the initial topology outside the deletes' closures that are DELETING or gone.
    pub fn over_deleted(&self, s: &State) -> Vec<String> {
        let allowed = self.allowed_deletions(s);
        let mut out = Vec::new();
        for (name, uid) in &self.initial {
            if allowed.contains(name) {
                continue;
            }
            match s.regions[region_of(name)].state.resources.get(name) {
                Some(r) if r.uid == *uid && !matches!(r.state, ResourceState::Deleting | ResourceState::Deleted) => {}
                Some(r) => out.push(format!("{name} is {:?}", r.state)),
                None => out.push(format!("{name} was purged")),
            }
        }
        out
    }

    /// Nothing in flight, nothing to deliver or send, no due work, and the
    /// periodic check (if modelled) would drop nothing.
    pub fn quiescent(&self, s: &State) -> bool {
        if s.drive.is_some() || self.redrive_due(s) {
            return false;
        }
        if !s.releases.is_empty() || !s.acks.is_empty() || !s.attaches.is_empty() {
            return false;
        }
        // With a budget or controls, a member held for a while (a lease
        // just granted, a pause just lifted) looks again later: not quiet
        // while time can still pass for it.
        if (self.config.budget.is_some() || self.config.controls)
            && s.regions.iter().any(|r| r.jumps > 0 && !r.state.work.is_empty())
        {
            return false;
        }
        if s.regions
            .iter()
            .any(|r| !r.state.pending_releases.is_empty() || r.state.work.values().any(|w| w.next_attempt_at <= r.now))
        {
            return false;
        }
        if self.late_attach_msg(s).is_some() || s.check.is_some() || self.check_startable(s) {
            return false;
        }
        for owner in 0..3 {
            for other in (0..3).filter(|o| *o != owner) {
                if !Self::undelivered(s, owner, other).is_empty() {
                    return false;
                }
                if self.config.check_backrefs && !Self::not_standing(s, owner, other).is_empty() {
                    return false;
                }
            }
        }
        true
    }

    /// At quiescence: everything the core checker finds (leaked rows,
    /// unexplained DELETING resources, stale blockers, tombstones of purged
    /// targets, …), and closure members still ACTIVE (intent: what the
    /// client asked for).
    pub fn leaks(&self, s: &State) -> Vec<String> {
        let report = invariants::check_quiescent(&self.views(s), Some(&self.schema));
        let mut out: Vec<String> = report.violations.iter().map(ToString::to_string).collect();
        if s.root_deleted {
            for name in CLOSURE {
                let name = rn(name);
                if let Some(r) = s.regions[region_of(&name)].state.resources.get(&name) {
                    if r.state == ResourceState::Active && !Self::held_by_controls(s) && !Self::was_restored(s, r.uid) {
                        out.push(format!("{name} of the closure is still ACTIVE"));
                    }
                }
            }
        }
        out
    }

    /// A DELETING resource at quiescence is explained if it is BLOCKED (by
    /// blockers that still hold it) or FAILED with a reason, or if it is the
    /// root of its operation and waits for another explained member.
    fn explained(&self, s: &State, region: usize, uid: Uid, depth: usize) -> bool {
        let st = &s.regions[region].state;
        let Some(d) = st.deletions.get(&uid) else { return false };
        match &d.status {
            DeletionStatus::Failed { error } => !error.is_empty(),
            DeletionStatus::Blocked { blockers, reason } => {
                !reason.is_empty()
                    && !blockers.is_empty()
                    && blockers.iter().all(|b| {
                        s.regions[region_of(&b.referrer)]
                            .state
                            .resources
                            .get(&b.referrer)
                            .is_some_and(|x| x.refs.get(&b.field).is_some_and(|ts| ts.iter().any(|t| t.uid == uid)))
                    })
            }
            DeletionStatus::Pending | DeletionStatus::Waiting { .. } => {
                let root = st.operations.get(&d.operation).is_some_and(|op| op.root.uid == uid);
                root && depth == 0
                    && st.deletions.values().any(|o| {
                        o.operation == d.operation && o.target.uid != uid && self.explained(s, region, o.target.uid, 1)
                    })
            }
        }
    }

    /// The root was deleted, all is quiet, and every resource of the closure
    /// is purged or DELETING with an explanation.
    pub fn closure_resolved(&self, s: &State) -> bool {
        s.root_deleted
            && self.quiescent(s)
            && CLOSURE.iter().all(|n| {
                let n = rn(n);
                let region = region_of(&n);
                match s.regions[region].state.resources.get(&n) {
                    None => true,
                    // Soft-deleted: its deletion finished; it waits for its expiry.
                    Some(r) if r.state == ResourceState::Deleted => true,
                    // Brought back by the client's Undelete.
                    Some(r) if r.state == ResourceState::Active && Self::was_restored(s, r.uid) => true,
                    // Held on purpose by its operation's budget or cancel.
                    Some(_) if Self::held_by_controls(s) => true,
                    Some(r) => r.state == ResourceState::Deleting && self.explained(s, region, r.uid, 0),
                }
            })
    }

    /// Every resource of the closure (and the blocker) is purged.
    pub fn closure_purged(&self, s: &State) -> bool {
        s.root_deleted
            && CLOSURE.iter().chain(std::iter::once(&BLOCKER)).all(|n| {
                let n = rn(n);
                !s.regions[region_of(&n)].state.resources.contains_key(&n)
            })
    }
}
