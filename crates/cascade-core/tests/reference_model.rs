//! The core against a deliberately naive reference model of one region.
//!
//! `Naive` is written from DESIGN.md ("Semantics details", the `on_delete`
//! table and the life cycle), not from `protocol.rs`: it keeps a map of
//! resources and computes the whole effect of a delete eagerly and
//! synchronously. Random sequences of creates and deletes run against both
//! the real core (a `MemoryState`, the protocol functions, and the deletion
//! work run to quiescence after every delete) and the model; after every
//! operation the live resources and their references, the DELETING
//! resources, and the answers must agree.
//!
//! The schema covers every behaviour of one region:
//!
//! | kind | field | target | on_delete | |
//! |---|---|---|---|---|
//! | a | | | | a root |
//! | b | parent | a | cascade | required |
//! | c | owner | a | unset | |
//! | d | items | b | cascade | many, required (owned by its list) |
//! | e | guard | b | block | |
//!
//! Size: over 800 lines in one file: the naive model and the property
//! comparing it with the core are meant to be read together.

use std::collections::{BTreeMap, BTreeSet};

use cascade_core::memory::MemoryState;
use cascade_core::protocol;
use cascade_core::*;
use proptest::prelude::*;

const REGION: &str = "r1";

const SCHEMA: &str = r#"
[kinds.a]

[kinds.b.refs.parent]
kind = "a"
on_delete = "cascade"
required = true

[kinds.c.refs.owner]
kind = "a"
on_delete = "unset"

[kinds.d.refs.items]
kind = "b"
on_delete = "cascade"
many = true
required = true

[kinds.e.refs.guard]
kind = "b"
on_delete = "block"
"#;

const KINDS: [&str; 5] = ["a", "b", "c", "d", "e"];
/// Ids per kind: small, so names collide, get re-used and are referenced often.
const IDS: u8 = 3;

fn name(kind: &str, id: u8) -> String {
    format!("{REGION}/{kind}/x{id}")
}

// ---------------------------------------------------------------------------
// The naive model (from DESIGN.md).
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NState {
    Active,
    Deleting,
}

/// One reference field as the schema above declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    Cascade,
    Unset,
    Block,
}

/// `(field, target kind, behaviour, many, required)` of a kind.
fn fields_of(kind: &str) -> &'static [(&'static str, &'static str, Behaviour, bool, bool)] {
    match kind {
        "b" => &[("parent", "a", Behaviour::Cascade, false, true)],
        "c" => &[("owner", "a", Behaviour::Unset, false, false)],
        "d" => &[("items", "b", Behaviour::Cascade, true, true)],
        "e" => &[("guard", "b", Behaviour::Block, false, false)],
        _ => &[],
    }
}

fn behaviour(kind: &str, field: &str) -> Behaviour {
    fields_of(kind)
        .iter()
        .find(|f| f.0 == field)
        .map(|f| f.2)
        .expect("field in the schema")
}

#[derive(Debug, Clone)]
struct NRes {
    /// The incarnation: a fresh number at every create.
    uid: u64,
    kind: &'static str,
    /// field → target names (a list keeps its order); never an empty entry.
    refs: BTreeMap<String, Vec<String>>,
    state: NState,
    /// The delete that took it into DELETING (its root, for the "root goes
    /// last" rule).
    op: u64,
}

/// How a create or delete was answered, at the granularity DESIGN.md fixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Answer {
    Ok,
    /// A delete of a resource that is already DELETING answers OK (seed 000).
    AlreadyDeleting,
    InvalidArgument,
    NotFound,
    AlreadyExists,
    FailedPrecondition,
}

#[derive(Debug, Default)]
struct Naive {
    resources: BTreeMap<String, NRes>,
    next_uid: u64,
    next_op: u64,
    /// op → its root's name (the root is purged only after the rest of the op).
    roots: BTreeMap<u64, String>,
}

impl Naive {
    /// Every reference a live (ACTIVE) resource holds to `target`:
    /// `(referrer, field)`. A DELETING resource released its references
    /// when it entered DELETING (so cycles unwind): it holds nothing.
    fn referrers(&self, target: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (n, r) in &self.resources {
            if r.state != NState::Active {
                continue;
            }
            for (field, ts) in &r.refs {
                if ts.iter().any(|t| t == target) {
                    out.push((n.clone(), field.clone()));
                }
            }
        }
        out
    }

    /// Every answer DESIGN.md allows for this create (the order of the
    /// checks is not specified, so any applicable refusal is right); `Ok`
    /// alone when it must succeed.
    fn create_answers(&self, kind: &'static str, id: u8, refs: &BTreeMap<String, Vec<String>>) -> BTreeSet<Answer> {
        let mut why = BTreeSet::new();
        if self.resources.contains_key(&name(kind, id)) {
            why.insert(Answer::AlreadyExists);
        }
        for &(field, _, _, many, required) in fields_of(kind) {
            let ts = refs.get(field).map(Vec::as_slice).unwrap_or_default();
            if ts.is_empty() {
                if required {
                    why.insert(Answer::InvalidArgument);
                }
                continue;
            }
            if !many && ts.len() > 1 {
                why.insert(Answer::InvalidArgument);
            }
            let unique: BTreeSet<&String> = ts.iter().collect();
            if unique.len() != ts.len() {
                why.insert(Answer::InvalidArgument);
            }
            for t in ts {
                match self.resources.get(t) {
                    None => why.insert(Answer::NotFound),
                    // Nothing attaches to a DELETING resource.
                    Some(r) if r.state == NState::Deleting => why.insert(Answer::FailedPrecondition),
                    Some(_) => false,
                };
            }
        }
        if why.is_empty() {
            why.insert(Answer::Ok);
        }
        why
    }

    fn create(&mut self, kind: &'static str, id: u8, refs: &BTreeMap<String, Vec<String>>) -> BTreeSet<Answer> {
        let answers = self.create_answers(kind, id, refs);
        if answers.contains(&Answer::Ok) {
            self.next_uid += 1;
            let refs = refs
                .iter()
                .filter(|(_, ts)| !ts.is_empty())
                .map(|(f, ts)| (f.clone(), ts.clone()))
                .collect();
            self.resources.insert(
                name(kind, id),
                NRes {
                    uid: self.next_uid,
                    kind,
                    refs,
                    state: NState::Active,
                    op: 0,
                },
            );
        }
        answers
    }

    /// A user delete: refused while a live `block` reference exists, or,
    /// without `cascade`, while a referrer would be cascaded (a list owner
    /// that keeps other elements only loses one, so it is no dependent).
    /// Accepted: the whole closure is computed at once.
    fn delete(&mut self, target: &str, cascade: bool) -> Answer {
        let Some(r) = self.resources.get(target) else {
            return Answer::NotFound;
        };
        if r.state == NState::Deleting {
            return Answer::AlreadyDeleting;
        }
        for (referrer, field) in self.referrers(target) {
            let q = &self.resources[&referrer];
            match behaviour(q.kind, &field) {
                Behaviour::Block => return Answer::FailedPrecondition,
                Behaviour::Cascade if !cascade && q.refs[&field].len() == 1 => return Answer::FailedPrecondition,
                _ => {}
            }
        }
        self.next_op += 1;
        let op = self.next_op;
        self.roots.insert(op, target.to_owned());
        self.mark_deleting(target, op);
        // Breadth first over everything the delete reaches.
        let mut queue = vec![target.to_owned()];
        while let Some(gone) = queue.pop() {
            for (referrer, field) in self.referrers(&gone) {
                let kind = self.resources[&referrer].kind;
                match behaviour(kind, &field) {
                    // The target waits for it (stays DELETING, see `settle`).
                    Behaviour::Block => {}
                    Behaviour::Unset => {
                        self.remove_element(&referrer, &field, &gone);
                    }
                    Behaviour::Cascade => {
                        // A single reference: deleted. A list: the element
                        // goes; the owner is deleted with its last element.
                        if self.remove_element(&referrer, &field, &gone) {
                            self.mark_deleting(&referrer, op);
                            queue.push(referrer);
                        }
                    }
                }
            }
        }
        self.settle();
        Answer::Ok
    }

    /// Removes `target` from `referrer.field`; true when the field is now empty.
    fn remove_element(&mut self, referrer: &str, field: &str, target: &str) -> bool {
        let r = self.resources.get_mut(referrer).expect("referrer");
        let ts = r.refs.get_mut(field).expect("field");
        ts.retain(|t| t != target);
        let emptied = ts.is_empty();
        if emptied {
            r.refs.remove(field);
        }
        emptied
    }

    fn mark_deleting(&mut self, name: &str, op: u64) {
        let r = self.resources.get_mut(name).expect("resource");
        r.state = NState::Deleting;
        r.op = op;
    }

    /// Purges every DELETING resource that nothing holds any more: no live
    /// `block` referrer, and (for the root of a delete) no other resource
    /// of its delete left. Repeats until nothing changes.
    fn settle(&mut self) {
        loop {
            let deleting: Vec<String> = self
                .resources
                .iter()
                .filter(|(_, r)| r.state == NState::Deleting)
                .map(|(n, _)| n.clone())
                .collect();
            let mut purged = false;
            for n in deleting {
                let blocked = self
                    .referrers(&n)
                    .iter()
                    .any(|(q, f)| behaviour(self.resources[q].kind, f) == Behaviour::Block);
                if blocked {
                    continue;
                }
                let op = self.resources[&n].op;
                let is_root = self.roots.get(&op) == Some(&n);
                let others_left = self
                    .resources
                    .iter()
                    .any(|(m, r)| m != &n && r.state == NState::Deleting && r.op == op);
                if is_root && others_left {
                    continue;
                }
                self.resources.remove(&n);
                purged = true;
            }
            if !purged {
                return;
            }
        }
    }

    fn live(&self) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
        self.resources
            .iter()
            .filter(|(_, r)| r.state == NState::Active)
            .map(|(n, r)| (n.clone(), r.refs.clone()))
            .collect()
    }

    fn deleting(&self) -> BTreeSet<String> {
        self.resources
            .iter()
            .filter(|(_, r)| r.state == NState::Deleting)
            .map(|(n, _)| n.clone())
            .collect()
    }
}

// ---------------------------------------------------------------------------
// The real core, driven step by step.
// ---------------------------------------------------------------------------

struct Real {
    state: MemoryState,
    schema: Schema,
    region: RegionId,
    ids: SequentialIds,
    policy: Policy,
    now: Timestamp,
}

impl Real {
    fn new() -> Self {
        Real {
            state: MemoryState::default(),
            schema: Schema::from_toml(SCHEMA).expect("schema loads"),
            region: RegionId::parse(REGION).unwrap(),
            ids: SequentialIds::default(),
            policy: Policy::default(),
            now: Timestamp(1_000_000),
        }
    }

    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            schema: &self.schema,
            region: &self.region,
            now: self.now,
            policy: &self.policy,
            authorizer: &cascade_core::auth::AllowAll,
        }
    }

    fn create(&mut self, name: &str, refs: &BTreeMap<String, Vec<String>>) -> Result<(), CoreError> {
        let spec = ResourceSpec {
            name: name.to_owned(),
            refs: refs
                .iter()
                .map(|(f, ts)| {
                    let ts = ts
                        .iter()
                        .map(|t| RefRequest {
                            name: t.clone(),
                            uid: None,
                        })
                        .collect();
                    (f.clone(), ts)
                })
                .collect(),
            ..ResourceSpec::default()
        };
        let ctx = Ctx {
            schema: &self.schema,
            region: &self.region,
            now: self.now,
            policy: &self.policy,
            authorizer: &cascade_core::auth::AllowAll,
        };
        let step = protocol::create(&self.state, ctx, &mut self.ids, vec![spec])?;
        self.state.apply(step.writes);
        Ok(())
    }

    fn delete(&mut self, name: &str, cascade: bool) -> Result<DeleteOutcome, CoreError> {
        let req = DeleteRequest {
            name: name.to_owned(),
            cascade,
            dry_run: false,
            allow_missing: false,
            etag: None,
            uid: None,
            requested_by: "model".to_owned(),
            orphan: false,
            remote_kept: Default::default(),
            principal: Default::default(),
            retain_ms: 0,
            bounds: Default::default(),
            operation_id: None,
        };
        let ctx = Ctx {
            schema: &self.schema,
            region: &self.region,
            now: self.now,
            policy: &self.policy,
            authorizer: &cascade_core::auth::AllowAll,
        };
        let step = protocol::delete(&self.state, ctx, &mut self.ids, req)?;
        self.state.apply(step.writes);
        self.run_until_quiet();
        Ok(step.value)
    }

    /// Runs due deletion work until a step finds nothing (the clock stays put:
    /// everything here must be woken by the releases themselves).
    fn run_until_quiet(&mut self) {
        for _ in 0..10_000 {
            let step = protocol::process_work(&self.state, self.ctx()).expect("process_work");
            self.state.apply(step.writes);
            if step.value.items == 0 && !step.value.more {
                return;
            }
        }
        panic!("deletion work did not quiesce in 10000 steps");
    }

    fn live(&self) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
        self.state
            .resources
            .values()
            .filter(|r| r.state == ResourceState::Active)
            .map(|r| {
                let refs = r
                    .refs
                    .iter()
                    .map(|(f, ts)| (f.clone(), ts.iter().map(|t| t.name.to_string()).collect()))
                    .collect();
                (r.name.to_string(), refs)
            })
            .collect()
    }

    fn deleting(&self) -> BTreeSet<String> {
        self.state
            .resources
            .values()
            .filter(|r| r.state == ResourceState::Deleting)
            .map(|r| r.name.to_string())
            .collect()
    }
}

fn answer_of(result: Result<(), CoreError>) -> Answer {
    match result {
        Ok(()) => Answer::Ok,
        Err(e) => match e.code() {
            ErrorCode::InvalidArgument => Answer::InvalidArgument,
            ErrorCode::NotFound => Answer::NotFound,
            ErrorCode::AlreadyExists => Answer::AlreadyExists,
            ErrorCode::FailedPrecondition => Answer::FailedPrecondition,
            other => panic!("unexpected error class {other:?}: {e}"),
        },
    }
}

// ---------------------------------------------------------------------------
// Operations and the comparison.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    /// References name ids of the field's target kind; a single reference
    /// uses the first one (none: the field is left out).
    Create {
        kind: usize,
        id: u8,
        targets: Vec<u8>,
    },
    Delete {
        kind: usize,
        id: u8,
        cascade: bool,
    },
}

fn create_op() -> impl Strategy<Value = Op> {
    (0..KINDS.len(), 0..IDS, prop::collection::vec(0..IDS, 0..4), 0..4u8).prop_map(|(kind, id, mut targets, dup)| {
        // Mostly distinct list elements (a list with a duplicate is refused
        // by both sides, so a few are enough).
        if dup != 0 {
            let mut seen = BTreeSet::new();
            targets.retain(|t| seen.insert(*t));
        }
        Op::Create { kind, id, targets }
    })
}

/// Deletes favour the kinds with referrers.
const DELETE_KINDS: [usize; 7] = [0, 0, 1, 1, 1, 3, 4];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => create_op(),
        1 => (0..DELETE_KINDS.len(), 0..IDS, any::<bool>())
            .prop_map(|(k, id, cascade)| Op::Delete { kind: DELETE_KINDS[k], id, cascade }),
    ]
}

/// A forest first (creates in kind order, so most references find their
/// target), then a random mix: at most 30 operations.
fn script() -> impl Strategy<Value = Vec<Op>> {
    (
        prop::collection::vec(create_op(), 8..18),
        prop::collection::vec(op(), 1..13),
    )
        .prop_map(|(mut forest, rest)| {
            forest.sort_by_key(|o| match o {
                Op::Create { kind, .. } => *kind,
                Op::Delete { .. } => usize::MAX,
            });
            forest.extend(rest);
            forest
        })
}

/// The references a create asks for: a single field takes the first id; a
/// list takes them all (duplicates included: both sides must refuse them).
fn requested_refs(kind: &str, targets: &[u8]) -> BTreeMap<String, Vec<String>> {
    let mut refs = BTreeMap::new();
    for &(field, target_kind, _, many, _) in fields_of(kind) {
        let ts: Vec<String> = if many {
            targets.iter().map(|&i| name(target_kind, i)).collect()
        } else {
            targets.first().map(|&i| name(target_kind, i)).into_iter().collect()
        };
        if !ts.is_empty() {
            refs.insert(field.to_owned(), ts);
        }
    }
    refs
}

/// The uids of both sides name the same incarnations: a re-created name has
/// a fresh uid on both sides, and every reference points at the current
/// incarnation of its target.
fn check_incarnations(real: &Real, naive: &Naive, uids: &mut BTreeMap<u64, Uid>, history: &[String]) {
    for (n, nr) in &naive.resources {
        let rr = real
            .state
            .resources
            .get(&ResourceName::parse(n).unwrap())
            .unwrap_or_else(|| panic!("{n} missing in the core\n{}", history.join("\n")));
        let known = *uids.entry(nr.uid).or_insert(rr.uid);
        assert_eq!(known, rr.uid, "{n}: the core's uid changed\n{}", history.join("\n"));
        if nr.state != NState::Active {
            continue;
        }
        for ts in rr.refs.values() {
            for t in ts {
                let current = real.state.resources.get(&t.name).map(|r| r.uid);
                assert_eq!(
                    current,
                    Some(t.uid),
                    "{n} references a stale incarnation of {}\n{}",
                    t.name,
                    history.join("\n")
                );
            }
        }
    }
    let distinct: BTreeSet<&Uid> = uids.values().collect();
    assert_eq!(
        distinct.len(),
        uids.len(),
        "two incarnations share a uid\n{}",
        history.join("\n")
    );
}

fn run(ops: &[Op]) {
    let mut real = Real::new();
    let mut naive = Naive::default();
    let mut uids: BTreeMap<u64, Uid> = BTreeMap::new();
    let mut history = Vec::new();
    for op in ops {
        match *op {
            Op::Create { kind, id, ref targets } => {
                let kind = KINDS[kind];
                let refs = requested_refs(kind, targets);
                let n = name(kind, id);
                history.push(format!("create {n} {refs:?}"));
                let expected = naive.create(kind, id, &refs);
                let got = answer_of(real.create(&n, &refs));
                assert!(
                    expected.contains(&got),
                    "create {n} {refs:?}: the model allows {expected:?}, the core answered {got:?}\n{}",
                    history.join("\n")
                );
            }
            Op::Delete { kind, id, cascade } => {
                let n = name(KINDS[kind], id);
                history.push(format!("delete {n} cascade={cascade}"));
                let expected = naive.delete(&n, cascade);
                let got = match real.delete(&n, cascade) {
                    Ok(DeleteOutcome::Accepted(_)) => Answer::Ok,
                    Ok(DeleteOutcome::AlreadyDeleting(_)) => Answer::AlreadyDeleting,
                    Ok(other) => panic!("delete {n}: unexpected {other:?}"),
                    Err(e) => answer_of(Err(e)),
                };
                assert_eq!(
                    got,
                    expected,
                    "delete {n} cascade={cascade}: the core answered {got:?}, the model {expected:?}\n{}",
                    history.join("\n")
                );
            }
        }
        assert_eq!(
            real.live(),
            naive.live(),
            "live resources and references differ (left: core, right: model)\n{}",
            history.join("\n")
        );
        assert_eq!(
            real.deleting(),
            naive.deleting(),
            "DELETING resources differ (left: core, right: model)\n{}",
            history.join("\n")
        );
        assert!(
            real.state
                .resources
                .values()
                .all(|r| r.state != ResourceState::Creating),
            "a one-region create left a CREATING resource"
        );
        check_incarnations(&real, &naive, &mut uids, &history);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases_or(64),
        // Keep the tree clean: no regression files next to the test.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn core_matches_naive_reference_model(ops in script()) {
        run(&ops);
    }
}

/// Hand-written scenarios through the same comparison, so the rules the
/// model encodes are exercised even when the random sequences miss them.
#[test]
fn reference_model_scenarios() {
    use Op::*;
    const A: usize = 0;
    const B: usize = 1;
    const C: usize = 2;
    const D: usize = 3;
    const E: usize = 4;
    let scenarios: Vec<Vec<Op>> = vec![
        // A cascade through a list owner that keeps one element, and one that loses all.
        vec![
            Create {
                kind: A,
                id: 0,
                targets: vec![],
            },
            Create {
                kind: B,
                id: 0,
                targets: vec![0],
            },
            Create {
                kind: B,
                id: 1,
                targets: vec![0],
            },
            Create {
                kind: A,
                id: 1,
                targets: vec![],
            },
            Create {
                kind: B,
                id: 2,
                targets: vec![1],
            },
            Create {
                kind: D,
                id: 0,
                targets: vec![0, 2],
            },
            Create {
                kind: D,
                id: 1,
                targets: vec![0, 1],
            },
            Create {
                kind: C,
                id: 0,
                targets: vec![0],
            },
            Delete {
                kind: A,
                id: 0,
                cascade: false,
            },
            Delete {
                kind: B,
                id: 2,
                cascade: false,
            },
            Delete {
                kind: A,
                id: 0,
                cascade: true,
            },
        ],
        // A blocked cascade waits for its blocker; the root waits for it; the
        // blocker's own deletion releases both.
        vec![
            Create {
                kind: A,
                id: 0,
                targets: vec![],
            },
            Create {
                kind: B,
                id: 0,
                targets: vec![0],
            },
            Create {
                kind: E,
                id: 0,
                targets: vec![0],
            },
            Delete {
                kind: B,
                id: 0,
                cascade: true,
            },
            Delete {
                kind: A,
                id: 0,
                cascade: true,
            },
            Delete {
                kind: A,
                id: 0,
                cascade: true,
            },
            Create {
                kind: A,
                id: 0,
                targets: vec![],
            },
            Create {
                kind: E,
                id: 1,
                targets: vec![0],
            },
            Delete {
                kind: E,
                id: 0,
                cascade: false,
            },
            Create {
                kind: A,
                id: 0,
                targets: vec![],
            },
            Create {
                kind: B,
                id: 0,
                targets: vec![0],
            },
        ],
        // Re-created names get fresh incarnations.
        vec![
            Create {
                kind: A,
                id: 0,
                targets: vec![],
            },
            Create {
                kind: C,
                id: 0,
                targets: vec![0],
            },
            Delete {
                kind: A,
                id: 0,
                cascade: false,
            },
            Create {
                kind: A,
                id: 0,
                targets: vec![],
            },
            Create {
                kind: C,
                id: 1,
                targets: vec![0],
            },
            Delete {
                kind: C,
                id: 0,
                cascade: false,
            },
        ],
    ];
    for ops in scenarios {
        run(&ops);
    }
}

/// Cases per property: `PROPTEST_CASES` for a deeper run, else the default.
fn cases_or(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
