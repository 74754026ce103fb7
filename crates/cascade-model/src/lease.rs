//! A model of one region's writer lease and the fence inside every commit.
//!
//! Size: one model, its actions, properties and mutants, and the tests
//! that run them: split, the model's steps and the SQL they mirror would
//! be read in separate files.
//!
//! A region of several nodes over one PostgreSQL database has one writer:
//! the holder of a lease row whose epoch goes up at every takeover, expiry
//! by the database's clock. Every commit checks the epoch inside its own
//! transaction, first, under a share lock of the lease row
//! (crates/cascade-node/src/store/lease.rs; the SQL in
//! shared/research/ha-postgres.md §1, as the PostgreSQL store runs it):
//!
//! ```sql
//! -- acquire
//! UPDATE lease SET epoch = epoch + 1, holder = $me, expires_at = clock_timestamp() + $ttl
//!  WHERE region = $1 AND (expires_at <= clock_timestamp() OR holder = $me) RETURNING epoch;
//! -- renew: 0 rows, step down
//! UPDATE lease SET expires_at = clock_timestamp() + $ttl
//!  WHERE region = $1 AND epoch = $e AND holder IS NOT NULL;
//! -- release
//! UPDATE lease SET holder = NULL, expires_at = '-infinity' WHERE region = $1 AND epoch = $e;
//! -- every commit, READ COMMITTED
//! BEGIN;
//! SELECT 1 FROM lease WHERE region = $1 AND epoch = $e FOR SHARE;   -- 0 rows: ROLLBACK, fenced
//! ... the batch ...
//! COMMIT;
//! ```
//!
//! [`LeaseModel`] is that database and 2 or 3 nodes, every step of each
//! interleaved in every order the checker likes.
//!
//! # The database
//!
//! The lease row (epoch, holder, `expires_at` by the database's clock),
//! the row's lock and the committed log. The lock, per node's connections
//! ([`Session`]): the share holders (transactions past their fence, until
//! they end) and the UPDATEs waiting for the row (an acquire or a renew waits while
//! any share lock is held, its own node's commit on its other connection
//! included, and may give up: `lock_timeout`). An UPDATE runs, when it
//! gets the row, as one step: it holds the exclusive lock only inside that
//! step, and a `FOR SHARE` that queued behind it re-evaluates its `WHERE`
//! on the new row (READ COMMITTED's re-check), which is the same as
//! running after it. So a fence never waits across steps, and an UPDATE's
//! `WHERE` is evaluated on the row as it is when it runs, at the
//! database's clock of that moment (`clock_timestamp()`). PostgreSQL does
//! not queue a share locker behind a waiting updater, so commits may
//! starve an acquire: the model lets them (availability, not safety).
//!
//! # A node
//!
//! Follower, acquiring (its UPDATE sent), or writer at the epoch it was
//! granted, with its local deadline: ttl − margin after it sent the acquire
//! or the last renew that held, on its monotonic clock (the database's
//! rate: no drift is modelled). A running writer steps down at its
//! deadline before the clock moves on (a timer that fires on time); a
//! paused one does not. A commit is BEGIN and the fence (one step:
//! pipelined, and BEGIN alone changes nothing the model sees; 0 rows:
//! rolled back, the node steps down), then the batch and COMMIT (one step:
//! the batch writes other tables). In between, the transaction is idle
//! holding the share lock, and the node may pause there. The commit path
//! does not look at the role: a commit begun before a step-down carries on
//! (only the fence decides what lands).
//!
//! Faults: a writer **pauses** (SIGSTOP, a GC pause) for as long as the
//! checker likes while the clock runs and the database serves the others,
//! then resumes; a node **crashes** and restarts as a follower (its open
//! transaction rolls back, its locks go, its waiting UPDATEs are
//! cancelled: a statement that outlived its client would equal one that
//! ran just before the crash with its answer lost, which the model has);
//! the database ends a session idle in its transaction after
//! `idle_in_transaction_session_timeout` (its share lock goes; the node
//! learns it when it sends the batch and COMMIT: the outcome is unknown to
//! it and it steps down).
//!
//! # Properties
//!
//! [`SAFETY`] in every state, and [`WITNESSES`] (that the model is not
//! vacuous: a takeover while the writer is paused, a resumed writer
//! refused, commits at two epochs). [`Fence`] has three wrong ways to
//! fence (a fence without the share lock; check-then-act; the node's local
//! deadline alone), which the checker must find violating safety: that the
//! model catches a fence done wrong is what says it would catch ours. The
//! shortest counterexamples are two: a node that stepped down at its
//! deadline takes its own lease back (`holder = $me`) while its older
//! commit is still in flight, which then lands at the old epoch; and a
//! writer slow between its check and its COMMIT while another node takes
//! over after expiry (Kleppmann's paused lock holder).
//!
//! # Bounds
//!
//! Times are kept relative to the database's clock (a lease's expiry, a
//! node's deadline, a session's idle time, each bounded by the ttl or the
//! idle timeout), so the clock runs without bound. No epoch above
//! [`LeaseConfig::max_epoch`] is granted, no commit begins once
//! [`LeaseConfig::max_commits`] are in the log, and at most
//! [`LeaseConfig::crashes`] crashes happen in a run. The nodes are
//! interchangeable ([`Representative`]: the depth-first search visits one
//! numbering of each state). Not modelled: clock drift between a node and
//! the database, the database's own failure and failover (one database,
//! always durable), more than one region, what the committed batches
//! contain (the store's conformance tests and the real-node tests check
//! that), and liveness under fairness (the witnesses only show that
//! takeovers and refusals are reachable).

use stateright::{Model, Property, Representative};

/// The properties that must hold in every state.
pub const SAFETY: [&str; 5] = [
    "every commit was made at the lease's epoch of its moment",
    "the log's epochs never decrease",
    "no commit of an epoch lands after a greater epoch was granted",
    "at most one node commits at each epoch",
    "no commit lands while another node holds a greater epoch",
];

/// The examples that must be reachable (the model is not vacuous).
pub const WITNESSES: [&str; 3] = [
    "another node takes over while the writer is paused",
    "a paused writer resumes, tries to commit and is refused",
    "commits land at two different epochs",
];

/// A duration on the database's clock, in ticks.
pub type Tick = u8;
/// A lease epoch: 0 before the first takeover.
pub type Epoch = u8;

/// How a commit is fenced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fence {
    /// What the store does: BEGIN, `SELECT … WHERE epoch = $e FOR SHARE`,
    /// the batch, COMMIT: the share lock is held until COMMIT, so a
    /// takeover waits for it.
    InCommit,
    /// Wrong: the same `SELECT` inside the transaction, without `FOR
    /// SHARE` (READ COMMITTED: a plain read takes no lock).
    WithoutShareLock,
    /// Wrong: the epoch is checked in a transaction of its own, before the
    /// write transaction (check-then-act).
    CheckThenAct,
    /// Wrong: no fence; the node checks its own local deadline just before
    /// it sends the batch and COMMIT (a lease alone, as client-go's leader
    /// election).
    LocalDeadlineOnly,
}

/// The bounds and settings of one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    pub nodes: usize,
    pub fence: Fence,
    /// No acquire is granted past this epoch.
    pub max_epoch: Epoch,
    /// No commit begins once the log has this many.
    pub max_commits: usize,
    /// The lease's time to live (at least 1).
    pub ttl: Tick,
    /// How much earlier than the lease's expiry the node's own deadline
    /// is. 0 is the harshest: a node stops just as its lease can be taken.
    pub margin: Tick,
    /// `idle_in_transaction_session_timeout`.
    pub idle_timeout: Tick,
    /// Crashes in one run, in total.
    pub crashes: u8,
}

impl LeaseConfig {
    /// Two nodes and three takeovers (one node writes again after the
    /// other): what `cargo test` checks with two nodes.
    pub fn two_nodes() -> Self {
        Self {
            nodes: 2,
            fence: Fence::InCommit,
            max_epoch: 3,
            max_commits: 2,
            ttl: 1,
            margin: 0,
            idle_timeout: 1,
            crashes: 0,
        }
    }

    /// Three nodes racing for two takeovers, one of them crashing: what
    /// `cargo test` checks with three nodes.
    pub fn three_nodes() -> Self {
        Self {
            nodes: 3,
            max_epoch: 2,
            crashes: 1,
            ..Self::two_nodes()
        }
    }

    /// The deeper check (an ignored test): three nodes, three takeovers, a crash.
    pub fn deep() -> Self {
        Self {
            max_epoch: 3,
            ..Self::three_nodes()
        }
    }

    /// The same bounds with another way of fencing.
    pub fn with_fence(self, fence: Fence) -> Self {
        Self { fence, ..self }
    }
}

/// The region's lease row.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeaseRow {
    pub epoch: Epoch,
    pub holder: Option<usize>,
    /// `expires_at − now()`; None once `expires_at <= now()` (or
    /// `-infinity`: never taken, or released).
    pub expires_in: Option<Tick>,
}

/// An UPDATE of the lease row, sent and waiting for the row.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Update {
    Acquire { node: usize },
    Renew { node: usize, epoch: Epoch },
}

impl Update {
    fn node(&self) -> usize {
        match self {
            Update::Acquire { node } | Update::Renew { node, .. } => *node,
        }
    }
}

/// One committed transaction of the log.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Commit {
    pub node: usize,
    /// The epoch the node committed with (the one it was fenced with).
    pub epoch: Epoch,
    /// The lease row's epoch and holder when the COMMIT ran.
    pub lease_epoch: Epoch,
    pub lease_holder: Option<usize>,
    /// The greatest epoch ever granted when the COMMIT ran (history).
    pub granted: Epoch,
}

/// The database's side of one node's connections: the row's locks it
/// holds or waits for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Session {
    /// Its open transaction holds the row's share lock.
    pub share_lock: bool,
    /// Its acquire UPDATE was sent and has not run.
    pub acquire_waiting: bool,
    /// Its renew UPDATE (of this epoch) was sent and has not run.
    pub renew_waiting: Option<Epoch>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Database {
    pub lease: LeaseRow,
    /// By node.
    pub sessions: Vec<Session>,
    pub log: Vec<Commit>,
}

impl Database {
    fn share_locked(&self) -> bool {
        self.sessions.iter().any(|s| s.share_lock)
    }

    /// The UPDATEs sent and not yet run.
    fn waiting(&self) -> impl Iterator<Item = Update> + '_ {
        self.sessions.iter().enumerate().flat_map(|(node, s)| {
            let acquire = s.acquire_waiting.then_some(Update::Acquire { node });
            let renew = s.renew_waiting.map(|epoch| Update::Renew { node, epoch });
            acquire.into_iter().chain(renew)
        })
    }

    fn remove_waiting(&mut self, update: &Update) {
        let session = &mut self.sessions[update.node()];
        match update {
            Update::Acquire { .. } => session.acquire_waiting = false,
            Update::Renew { .. } => session.renew_waiting = None,
        }
    }
}

/// What a node thinks it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    Follower,
    /// Its acquire was sent; granted, it writes until `deadline_in` ticks
    /// from now (ttl − margin after it sent it).
    Acquiring {
        deadline_in: Tick,
    },
    /// It holds the lease at `epoch`, it believes, until its own deadline,
    /// `deadline_in` ticks from now (0: due).
    Writer {
        epoch: Epoch,
        deadline_in: Tick,
    },
}

/// A commit under way, between its two steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Committing {
    /// [`Fence::InCommit`] and [`Fence::WithoutShareLock`]: BEGIN and the
    /// fence ran; the transaction is idle until the batch and COMMIT.
    Fenced {
        epoch: Epoch,
        /// Ticks since the fence ran, up to the idle timeout.
        idle_for: Tick,
        /// The database ended the session; the node does not know yet.
        killed: bool,
    },
    /// [`Fence::CheckThenAct`]: a transaction of its own found the epoch
    /// current, and ended.
    Checked { epoch: Epoch },
    /// [`Fence::LocalDeadlineOnly`]: the node found itself before its deadline.
    BeforeDeadline { epoch: Epoch },
}

impl Committing {
    fn epoch(&self) -> Epoch {
        match self {
            Committing::Fenced { epoch, .. } | Committing::Checked { epoch } | Committing::BeforeDeadline { epoch } => {
                *epoch
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeState {
    pub role: Role,
    /// A renew was sent: if it holds, the node's deadline becomes this
    /// many ticks from now (ttl − margin after it sent it).
    pub renewing: Option<Tick>,
    pub committing: Option<Committing>,
    pub paused: bool,
    /// History: it was paused as a writer since its last grant.
    pub paused_as_writer: bool,
}

impl NodeState {
    fn new() -> Self {
        Self {
            role: Role::Follower,
            renewing: None,
            committing: None,
            paused: false,
            paused_as_writer: false,
        }
    }
}

/// The database and the nodes. Times are relative to the database's clock
/// now, each bounded by the ttl or the idle timeout: the clock runs without
/// bound while the state space stays finite.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeaseState {
    pub db: Database,
    pub nodes: Vec<NodeState>,
    pub crashes_left: u8,
    /// History: the greatest epoch granted so far.
    pub granted: Epoch,
    /// History: a node paused as a writer was later refused by the fence.
    pub refused_after_pause: bool,
}

/// The nodes are interchangeable: a state and the same state with its nodes
/// renumbered are one (symmetry reduction of the depth-first search).
/// Every field that names a node is renumbered here.
impl Representative for LeaseState {
    fn representative(&self) -> Self {
        let mut order: Vec<usize> = (0..self.nodes.len()).collect();
        // Everything that tells a node apart (its first commit in the log
        // orders nodes that are otherwise equal); nodes equal in all of it
        // are interchangeable, so their order does not matter.
        order.sort_by_key(|&i| {
            let first_commit = self.db.log.iter().position(|c| c.node == i);
            (
                self.nodes[i],
                self.db.sessions[i],
                self.db.lease.holder == Some(i),
                first_commit.unwrap_or(usize::MAX),
            )
        });
        let mut renumbered = vec![0; order.len()];
        for (new, &old) in order.iter().enumerate() {
            renumbered[old] = new;
        }
        let mut s = self.clone();
        for (new, &old) in order.iter().enumerate() {
            s.nodes[new] = self.nodes[old];
            s.db.sessions[new] = self.db.sessions[old];
        }
        s.db.lease.holder = self.db.lease.holder.map(|i| renumbered[i]);
        for c in &mut s.db.log {
            c.node = renumbered[c.node];
            c.lease_holder = c.lease_holder.map(|i| renumbered[i]);
        }
        s
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LeaseAction {
    /// The database's clock (and the nodes' monotonic clocks) advance a tick.
    Tick,
    /// The node sends its acquire UPDATE.
    SendAcquire(usize),
    /// The node sends a renew of its epoch.
    SendRenew(usize),
    /// The database runs a waiting UPDATE (no share lock is held). Its
    /// answer reaches the node: an acquire makes it writer or follower; a
    /// renew that held moves its deadline, one that did not makes it step
    /// down. (A node that reads a renew's answer later is a node that
    /// renewed later: a failed renew changes no row.)
    RunUpdate(Update),
    /// A waiting UPDATE gives up (`lock_timeout`): an error to its node.
    UpdateTimesOut(Update),
    /// The node's own deadline passed: it steps down.
    StepDown(usize),
    /// Clean shutdown: the node releases the lease and steps down.
    Release(usize),
    /// BEGIN and `SELECT … WHERE epoch = $e FOR SHARE` (without `FOR
    /// SHARE` under [`Fence::WithoutShareLock`]).
    BeginAndFence(usize),
    /// [`Fence::CheckThenAct`]: the epoch checked in a transaction of its own.
    Check(usize),
    /// [`Fence::LocalDeadlineOnly`]: the node compares its clock with its deadline.
    CheckDeadline(usize),
    /// The batch and COMMIT (and BEGIN, when there is no fence before them).
    Commit(usize),
    /// The database ends a session idle in its transaction.
    IdleTimeout(usize),
    /// The node sends its batch and COMMIT on a session the database ended:
    /// the outcome is unknown to it, it steps down.
    SessionLost(usize),
    Pause(usize),
    Resume(usize),
    /// The node crashes and restarts as a follower.
    Crash(usize),
}

/// The model of one region's lease row and its nodes.
pub struct LeaseModel {
    pub config: LeaseConfig,
}

impl LeaseModel {
    pub fn new(config: LeaseConfig) -> Self {
        Self { config }
    }

    /// A node's deadline after a statement sent now: ttl − margin.
    fn deadline_in(&self) -> Tick {
        self.config.ttl.saturating_sub(self.config.margin)
    }

    fn tick(&self, s: &mut LeaseState) {
        s.db.lease.expires_in = s.db.lease.expires_in.and_then(|t| t.checked_sub(1)).filter(|t| *t > 0);
        for n in &mut s.nodes {
            match &mut n.role {
                Role::Follower => {}
                Role::Acquiring { deadline_in } | Role::Writer { deadline_in, .. } => {
                    *deadline_in = deadline_in.saturating_sub(1)
                }
            }
            if let Some(deadline_in) = &mut n.renewing {
                *deadline_in = deadline_in.saturating_sub(1);
            }
            if let Some(Committing::Fenced { idle_for, .. }) = &mut n.committing {
                *idle_for = (*idle_for + 1).min(self.config.idle_timeout);
            }
        }
    }

    /// A running writer at its deadline steps down before the clock moves on.
    fn step_down_due(s: &LeaseState) -> bool {
        (s.nodes.iter()).any(|n| !n.paused && matches!(n.role, Role::Writer { deadline_in: 0, .. }))
    }

    /// The acquire's `WHERE`, on the row as it is now.
    fn acquire_matches(s: &LeaseState, node: usize) -> bool {
        s.db.lease.expires_in.is_none() || s.db.lease.holder == Some(node)
    }

    fn node_actions(&self, s: &LeaseState, i: usize, actions: &mut Vec<LeaseAction>) {
        let n = &s.nodes[i];
        match n.role {
            Role::Follower => actions.push(LeaseAction::SendAcquire(i)),
            Role::Acquiring { .. } => {}
            Role::Writer { deadline_in, .. } => {
                if deadline_in == 0 {
                    actions.push(LeaseAction::StepDown(i));
                }
                if n.renewing.is_none() {
                    actions.push(LeaseAction::SendRenew(i));
                }
                // An UPDATE: it runs once no share lock is held (the
                // node's own commit is over; nobody else holds one at its epoch).
                if n.committing.is_none() && !s.db.share_locked() {
                    actions.push(LeaseAction::Release(i));
                }
                // Only a writer's pause differs from a slow node: a running
                // writer steps down at its deadline, a paused one does not.
                actions.push(LeaseAction::Pause(i));
                if n.committing.is_none() && s.db.log.len() < self.config.max_commits {
                    match self.config.fence {
                        Fence::InCommit | Fence::WithoutShareLock => actions.push(LeaseAction::BeginAndFence(i)),
                        Fence::CheckThenAct => actions.push(LeaseAction::Check(i)),
                        Fence::LocalDeadlineOnly if deadline_in > 0 => actions.push(LeaseAction::CheckDeadline(i)),
                        Fence::LocalDeadlineOnly => {}
                    }
                }
            }
        }
        match n.committing {
            Some(Committing::Fenced { killed: true, .. }) => actions.push(LeaseAction::SessionLost(i)),
            Some(_) => actions.push(LeaseAction::Commit(i)),
            None => {}
        }
    }

    /// The node steps down: it no longer believes it writes.
    fn step_down(node: &mut NodeState) {
        if matches!(node.role, Role::Writer { .. }) {
            node.role = Role::Follower;
        }
    }

    /// The node's commit ends without committing.
    fn roll_back(s: &mut LeaseState, i: usize) {
        s.nodes[i].committing = None;
        s.db.sessions[i].share_lock = false;
    }

    /// The fence found another epoch: rolled back, the node steps down.
    fn refused(s: &mut LeaseState, i: usize) {
        Self::roll_back(s, i);
        Self::step_down(&mut s.nodes[i]);
        if s.nodes[i].paused_as_writer {
            s.refused_after_pause = true;
        }
    }

    fn run_update(&self, s: &mut LeaseState, update: &Update) {
        s.db.remove_waiting(update);
        match *update {
            Update::Acquire { node } => {
                let Role::Acquiring { deadline_in } = s.nodes[node].role else {
                    return;
                };
                if Self::acquire_matches(s, node) {
                    let row = &mut s.db.lease;
                    row.epoch += 1;
                    row.holder = Some(node);
                    row.expires_in = Some(self.config.ttl);
                    s.granted = s.granted.max(row.epoch);
                    let n = &mut s.nodes[node];
                    n.role = Role::Writer {
                        epoch: row.epoch,
                        deadline_in,
                    };
                    n.paused_as_writer = false;
                } else {
                    s.nodes[node].role = Role::Follower;
                }
            }
            Update::Renew { node, epoch } => {
                let held = s.db.lease.epoch == epoch && s.db.lease.holder.is_some();
                if held {
                    s.db.lease.expires_in = Some(self.config.ttl);
                }
                let n = &mut s.nodes[node];
                if let (
                    Some(renewed),
                    Role::Writer {
                        epoch: holding,
                        deadline_in,
                    },
                ) = (n.renewing, &n.role)
                {
                    if *holding == epoch {
                        n.role = if held {
                            Role::Writer {
                                epoch,
                                deadline_in: renewed.max(*deadline_in),
                            }
                        } else {
                            Role::Follower
                        };
                    }
                }
                n.renewing = None;
            }
        }
    }

    /// Some node is paused as a writer of an epoch another node has taken since.
    pub fn paused_writer_overtaken(s: &LeaseState) -> bool {
        s.nodes.iter().enumerate().any(|(i, n)| {
            n.paused
                && matches!(n.role, Role::Writer { epoch, .. }
                    if s.db.lease.epoch > epoch && s.db.lease.holder != Some(i))
        })
    }

    /// Every commit ran at the lease row's epoch of that moment.
    pub fn commits_at_lease_epoch(s: &LeaseState) -> bool {
        s.db.log.iter().all(|c| c.epoch == c.lease_epoch)
    }

    pub fn log_epochs_monotonic(s: &LeaseState) -> bool {
        s.db.log.windows(2).all(|w| w[0].epoch <= w[1].epoch)
    }

    pub fn no_commit_after_greater_grant(s: &LeaseState) -> bool {
        s.db.log.iter().all(|c| c.epoch >= c.granted)
    }

    pub fn one_node_per_epoch(s: &LeaseState) -> bool {
        (s.db.log.iter()).all(|a| s.db.log.iter().all(|b| a.epoch != b.epoch || a.node == b.node))
    }

    /// Kleppmann's paused lock holder: a commit of an old epoch after
    /// another node took the lease over.
    pub fn no_commit_over_another_writer(s: &LeaseState) -> bool {
        (s.db.log.iter()).all(|c| c.epoch >= c.lease_epoch || c.lease_holder.is_none_or(|h| h == c.node))
    }

    pub fn commits_at_two_epochs(s: &LeaseState) -> bool {
        s.db.log.windows(2).any(|w| w[0].epoch != w[1].epoch)
    }
}

impl Model for LeaseModel {
    type State = LeaseState;
    type Action = LeaseAction;

    fn init_states(&self) -> Vec<LeaseState> {
        vec![LeaseState {
            db: Database {
                lease: LeaseRow {
                    epoch: 0,
                    holder: None,
                    expires_in: None,
                },
                sessions: vec![Session::default(); self.config.nodes],
                log: Vec::new(),
            },
            nodes: vec![NodeState::new(); self.config.nodes],
            crashes_left: self.config.crashes,
            granted: 0,
            refused_after_pause: false,
        }]
    }

    fn actions(&self, s: &LeaseState, actions: &mut Vec<LeaseAction>) {
        if !Self::step_down_due(s) {
            actions.push(LeaseAction::Tick);
        }
        for update in s.db.waiting() {
            if s.db.share_locked() {
                actions.push(LeaseAction::UpdateTimesOut(update));
                continue;
            }
            // The search grants no epoch past max_epoch: such an acquire stays waiting.
            let past_the_bound = matches!(update, Update::Acquire { node } if Self::acquire_matches(s, node))
                && s.db.lease.epoch >= self.config.max_epoch;
            if !past_the_bound {
                actions.push(LeaseAction::RunUpdate(update));
            }
        }
        for (i, n) in s.nodes.iter().enumerate() {
            if let Some(Committing::Fenced {
                idle_for,
                killed: false,
                ..
            }) = n.committing
            {
                if idle_for >= self.config.idle_timeout {
                    actions.push(LeaseAction::IdleTimeout(i));
                }
            }
            if s.crashes_left > 0 {
                actions.push(LeaseAction::Crash(i));
            }
            if n.paused {
                actions.push(LeaseAction::Resume(i));
            } else {
                self.node_actions(s, i, actions);
            }
        }
    }

    fn next_state(&self, last: &LeaseState, action: LeaseAction) -> Option<LeaseState> {
        let mut s = last.clone();
        match action {
            LeaseAction::Tick => self.tick(&mut s),
            LeaseAction::SendAcquire(i) => {
                s.nodes[i].role = Role::Acquiring {
                    deadline_in: self.deadline_in(),
                };
                s.db.sessions[i].acquire_waiting = true;
            }
            LeaseAction::SendRenew(i) => {
                let Role::Writer { epoch, .. } = s.nodes[i].role else {
                    return None;
                };
                s.nodes[i].renewing = Some(self.deadline_in());
                s.db.sessions[i].renew_waiting = Some(epoch);
            }
            LeaseAction::RunUpdate(update) => self.run_update(&mut s, &update),
            LeaseAction::UpdateTimesOut(update) => {
                s.db.remove_waiting(&update);
                let n = &mut s.nodes[update.node()];
                match update {
                    Update::Acquire { .. } => n.role = Role::Follower,
                    Update::Renew { .. } => n.renewing = None,
                }
            }
            LeaseAction::StepDown(i) => Self::step_down(&mut s.nodes[i]),
            LeaseAction::Release(i) => {
                let Role::Writer { epoch, .. } = s.nodes[i].role else {
                    return None;
                };
                if s.db.lease.epoch == epoch {
                    s.db.lease.holder = None;
                    s.db.lease.expires_in = None;
                }
                s.nodes[i].role = Role::Follower;
            }
            LeaseAction::BeginAndFence(i) => {
                let Role::Writer { epoch, .. } = s.nodes[i].role else {
                    return None;
                };
                if s.db.lease.epoch == epoch {
                    if self.config.fence == Fence::InCommit {
                        s.db.sessions[i].share_lock = true;
                    }
                    s.nodes[i].committing = Some(Committing::Fenced {
                        epoch,
                        idle_for: 0,
                        killed: false,
                    });
                } else {
                    Self::refused(&mut s, i);
                }
            }
            LeaseAction::Check(i) => {
                let Role::Writer { epoch, .. } = s.nodes[i].role else {
                    return None;
                };
                if s.db.lease.epoch == epoch {
                    s.nodes[i].committing = Some(Committing::Checked { epoch });
                } else {
                    Self::refused(&mut s, i);
                }
            }
            LeaseAction::CheckDeadline(i) => {
                let Role::Writer { epoch, .. } = s.nodes[i].role else {
                    return None;
                };
                s.nodes[i].committing = Some(Committing::BeforeDeadline { epoch });
            }
            LeaseAction::Commit(i) => {
                let epoch = s.nodes[i].committing.as_ref()?.epoch();
                s.db.log.push(Commit {
                    node: i,
                    epoch,
                    lease_epoch: s.db.lease.epoch,
                    lease_holder: s.db.lease.holder,
                    granted: s.granted,
                });
                Self::roll_back(&mut s, i);
            }
            LeaseAction::IdleTimeout(i) => {
                if let Some(Committing::Fenced { killed, .. }) = &mut s.nodes[i].committing {
                    *killed = true;
                }
                s.db.sessions[i].share_lock = false;
            }
            LeaseAction::SessionLost(i) => {
                Self::roll_back(&mut s, i);
                Self::step_down(&mut s.nodes[i]);
            }
            LeaseAction::Pause(i) => {
                s.nodes[i].paused = true;
                s.nodes[i].paused_as_writer = true;
            }
            LeaseAction::Resume(i) => s.nodes[i].paused = false,
            LeaseAction::Crash(i) => {
                s.crashes_left -= 1;
                s.db.sessions[i] = Session::default();
                s.nodes[i] = NodeState::new();
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(SAFETY[0], |_, s| Self::commits_at_lease_epoch(s)),
            Property::always(SAFETY[1], |_, s| Self::log_epochs_monotonic(s)),
            Property::always(SAFETY[2], |_, s| Self::no_commit_after_greater_grant(s)),
            Property::always(SAFETY[3], |_, s| Self::one_node_per_epoch(s)),
            Property::always(SAFETY[4], |_, s| Self::no_commit_over_another_writer(s)),
            Property::sometimes(WITNESSES[0], |_, s| Self::paused_writer_overtaken(s)),
            Property::sometimes(WITNESSES[1], |_, s: &LeaseState| s.refused_after_pause),
            Property::sometimes(WITNESSES[2], |_, s| Self::commits_at_two_epochs(s)),
        ]
    }
}

#[cfg(test)]
mod tests {
    // Test code: elapsed times are real time (clippy.toml).
    #![allow(clippy::disallowed_methods)]

    use std::time::Instant;

    use stateright::{Checker, HasDiscoveries};

    use super::*;

    fn report(checker: &impl Checker<LeaseModel>, label: &str, started: Instant) {
        println!(
            "lease model ({label}): {} states ({} unique), depth {}, {:.1?}",
            checker.state_count(),
            checker.unique_state_count(),
            checker.max_depth(),
            started.elapsed()
        );
    }

    fn fenced_in_the_commit_is_safe(config: LeaseConfig) {
        let started = Instant::now();
        let label = format!("{config:?}");
        // Depth-first with the nodes' symmetry: the whole space, every witness.
        let checker = LeaseModel::new(config)
            .checker()
            .threads(2)
            .symmetry()
            .spawn_dfs()
            .join();
        report(&checker, &label, started);
        assert!(checker.is_done());
        // Safety everywhere, and every witness reached (not vacuous).
        checker.assert_properties();
    }

    #[test]
    fn two_nodes_never_commit_under_interleaved_epochs() {
        fenced_in_the_commit_is_safe(LeaseConfig::two_nodes());
    }

    #[test]
    fn three_nodes_never_commit_under_interleaved_epochs() {
        fenced_in_the_commit_is_safe(LeaseConfig::three_nodes());
    }

    #[test]
    #[ignore = "deeper bounds (6.4 million states, 5 minutes in a debug build): cargo test -p cascade-model --lib lease -- --ignored"]
    fn deep() {
        fenced_in_the_commit_is_safe(LeaseConfig::deep());
    }

    /// Nodes 0 and 1 exchanged, every field that names a node included.
    fn exchanged(s: &LeaseState) -> LeaseState {
        let other = |i: usize| [1, 0, 2][i];
        let mut t = s.clone();
        t.nodes.swap(0, 1);
        t.db.sessions.swap(0, 1);
        t.db.lease.holder = s.db.lease.holder.map(other);
        for c in &mut t.db.log {
            c.node = other(c.node);
            c.lease_holder = c.lease_holder.map(other);
        }
        t
    }

    #[test]
    fn renumbered_nodes_are_one_state() {
        // A stale writer's commit landed under the other node's lease
        // (reachable without the fence), so the log names both nodes.
        let model = LeaseModel::new(LeaseConfig::two_nodes().with_fence(Fence::WithoutShareLock));
        let mut s = model.init_states().remove(0);
        for action in [
            LeaseAction::SendAcquire(1),
            LeaseAction::RunUpdate(Update::Acquire { node: 1 }),
            LeaseAction::Tick,
            LeaseAction::BeginAndFence(1),
            LeaseAction::StepDown(1),
            LeaseAction::SendAcquire(0),
            LeaseAction::RunUpdate(Update::Acquire { node: 0 }),
            LeaseAction::Commit(1),
            LeaseAction::SendRenew(0),
        ] {
            s = model
                .next_state(&s, action.clone())
                .unwrap_or_else(|| panic!("{action:?} applies"));
        }
        assert_eq!(s.db.log[0].node, 1);
        assert_eq!(s.db.log[0].lease_holder, Some(0));
        let t = exchanged(&s);
        assert_ne!(s, t);
        assert_eq!(s.representative(), t.representative());
        // The representative is the same state renumbered: it still says
        // that a node committed under the other's lease.
        let r = s.representative();
        assert!(r.db.log.iter().all(|c| c.lease_holder.is_some_and(|h| h != c.node)));
        assert!(!LeaseModel::no_commit_over_another_writer(&r));
    }

    /// The checker finds a commit landing at a stale epoch when the fence
    /// is done wrong (the node's own older commit after it took the lease
    /// back, and another node's lease overwritten by a stale writer), and
    /// prints the paths (`--nocapture`).
    fn wrong_fence_is_caught(fence: Fence) {
        let started = Instant::now();
        // Breadth-first: the shortest counterexamples.
        let checker = LeaseModel::new(LeaseConfig::two_nodes().with_fence(fence))
            .checker()
            .threads(2)
            .finish_when(HasDiscoveries::AllOf([SAFETY[0], SAFETY[4]].into()))
            .spawn_bfs()
            .join();
        report(&checker, &format!("{fence:?}"), started);
        for property in [SAFETY[0], SAFETY[4]] {
            let path = checker.assert_any_discovery(property);
            println!("{fence:?}: counterexample to \"{property}\":\n{path}");
            let last = path.last_state();
            assert!(
                last.db.log.iter().any(|c| c.epoch < c.lease_epoch),
                "a commit at an epoch older than the lease's: {:?}",
                last.db.log
            );
        }
    }

    #[test]
    fn a_fence_without_the_share_lock_lets_a_stale_writer_commit() {
        wrong_fence_is_caught(Fence::WithoutShareLock);
    }

    #[test]
    fn check_then_act_lets_a_stale_writer_commit() {
        wrong_fence_is_caught(Fence::CheckThenAct);
    }

    #[test]
    fn a_local_deadline_alone_lets_a_stale_writer_commit() {
        wrong_fence_is_caught(Fence::LocalDeadlineOnly);
    }
}
