//! The writer lease of a region whose nodes share one database: which node
//! may commit, and the epoch every one of its commits is fenced with.
//!
//! Several `cascade serve` processes of one region may share its store
//! (PostgreSQL). Exactly one of them writes: the holder of the lease, a
//! row in the same database with an epoch that goes up at every takeover.
//! Expiry is the database's clock, never a node's. The store checks the
//! epoch inside every commit's own transaction ([`WriterLease::fence`]),
//! so a writer that was paused, partitioned or slow and lost the lease can
//! never commit afterwards: its commit fails with [`StoreError::Fenced`]
//! (Temporal's range id, Kleppmann's fencing token). Timing decides only
//! who is available, never what lands.
//!
//! The embedded engines (sled, fjall, memory) keep one process per data
//! directory (the engine's own file lock), so they have no lease.

use std::time::Duration;

use super::StoreError;

/// Who asks for the lease: what standbys and `cascade status` show of the
/// writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHolder {
    /// The node's name, unique within its region (`[ha] node_name`; by
    /// default the host name and the listening port).
    pub node: String,
    /// Where the other nodes of the region, and its clients, reach it
    /// (`http://host:port` or `https://…`): standbys forward to it.
    pub address: String,
    /// The binary's version (`CARGO_PKG_VERSION`), shown by `cascade
    /// status` beside each node of a region.
    pub version: String,
}

/// A node of the region as it last announced itself
/// ([`WriterLease::announce`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionMember {
    /// Its name, address and version.
    pub node: LeaseHolder,
    /// How long ago it last announced itself, by the database's clock.
    pub last_seen: Duration,
}

/// The lease as the database holds it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Goes up by one at every takeover; 0 before the first.
    pub epoch: u64,
    /// The node that holds it, if anyone does (None after a clean release).
    pub holder: Option<LeaseHolder>,
    /// How long until it expires by the database's clock; zero when it has.
    pub expires_in: Duration,
}

/// A region's writer lease, kept in the region's store.
///
/// Every method is one short transaction; none waits on a commit in flight
/// longer than the session's `lock_timeout`. The calls are blocking, like
/// the [`super::Store`] methods: call them off the runtime's workers.
pub trait WriterLease: Send + Sync + 'static {
    /// Takes the lease if it has expired or was released (or if `me`
    /// already holds it: a node that restarts within its own TTL takes it
    /// back at once), for `ttl` by the database's clock. The new epoch, one
    /// above the last; None while another node holds it.
    fn try_acquire(&self, me: &LeaseHolder, ttl: Duration) -> Result<Option<u64>, StoreError>;
    /// Extends the lease held at `epoch` by `ttl` from now (database
    /// clock). Ok(false): it is no longer held at that epoch (another node
    /// took it over): step down.
    fn renew(&self, epoch: u64, ttl: Duration) -> Result<bool, StoreError>;
    /// Gives the lease up at once (clean shutdown), so that a standby need
    /// not wait out the TTL. Nothing if it moved on already.
    fn release(&self, epoch: u64) -> Result<(), StoreError>;
    /// The lease as it stands.
    fn read(&self) -> Result<LeaseRecord, StoreError>;
    /// From now on every commit of this store checks, in its own
    /// transaction, that the lease is still at `epoch`, and fails with
    /// [`StoreError::Fenced`] otherwise. Before the first call the store
    /// refuses every commit (a node that never held the lease must not
    /// write). After a commit was fenced, or its outcome was unknown
    /// ([`StoreError::CommitOutcomeUnknown`]), every later commit fails at
    /// once, without asking the database, until `fence` is called again
    /// with a newer epoch.
    fn fence(&self, epoch: u64);
    /// Turns true once a commit of this store was fenced or its outcome
    /// was unknown (the node must step down), and false again at the next
    /// [`WriterLease::fence`].
    fn lost(&self) -> tokio::sync::watch::Receiver<bool>;
    /// Records that `me` is up (a row per node, its time by the database's
    /// clock), so that `cascade status` lists a region's standbys too.
    /// Rows not renewed for `forget_after` are removed by this call.
    fn announce(&self, me: &LeaseHolder, forget_after: Duration) -> Result<(), StoreError>;
    /// Every node that announced itself and was not forgotten, by name.
    fn members(&self) -> Result<Vec<RegionMember>, StoreError>;
}
