//! No scan of a node steps again and again over the rows it removed.
//!
//! On an LSM engine (fjall) a removed row stays a tombstone until
//! compaction, and a scan that starts at the first key passes every one of
//! them. Three scans did, each found by a profile and not by a test: the
//! outbox compaction, the reconciler's unsettled creates and the links'
//! queued releases (the last two 84 % of all CPU of a 1M cross-region
//! cascade on fjall, enough to starve the nodes' connections). The memory
//! engine forgets removed keys, so nothing run on it could tell; these
//! nodes run on [`TombstoneStore`], which keeps every tombstone and counts
//! those each scan passes.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cascade_node::store::{Store, Table, TombstoneStore};
use cascade_proto::v1;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_region_create_and_cascade_pass_each_removed_queue_row_at_most_twice() {
    let regions = ["ra", "rb"];
    let stores: BTreeMap<&str, Arc<TombstoneStore>> = regions
        .iter()
        .map(|r| (*r, Arc::new(TombstoneStore::default())))
        .collect();
    let c = start_cluster_on_stores(
        &regions,
        |s| s.tick = Duration::from_millis(10),
        |r| stores.get(r).map(|s| s.clone() as Arc<dyn Store>),
    )
    .await;
    let (a, b) = (c.client("ra"), c.client("rb"));
    a.batch_create(vec![
        spec_in("ra/project/p", &[]),
        spec_in("ra/network/net", &[("project", &["ra/project/p"])]),
    ])
    .await
    .unwrap();
    // Each port is an unsettled create at rb until ra attaches it, then
    // its row is removed; each is released, queued at rb, once deleted.
    for batch in 0..30 {
        let ports = (0..100)
            .map(|i| spec_in(&format!("rb/port/p{batch}-{i}"), &[("network", &["ra/network/net"])]))
            .collect();
        b.batch_create(ports).await.unwrap();
    }
    let done = delete_and_wait(a, "ra/network/net", true).await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    assert_eq!(done.progress.unwrap().deleted, 3_001);
    // The releases are acknowledged before the root goes; their rows at rb
    // go right after.
    eventually(
        Duration::from_secs(30),
        "rb's queued releases to be dropped",
        || async { (stores["rb"].removed(Table::PendingReleases) == 3_000).then_some(()) },
    )
    .await;

    for (region, store) in &stores {
        let every_table = store.passed_by_table();
        for table in [Table::PendingAttach, Table::PendingReleases, Table::Outbox] {
            let (passed, removed) = (store.passed(table), store.removed(table));
            assert!(
                passed <= 2 * removed.max(100),
                "{region}: scans of {} passed {passed} tombstones for {removed} rows removed \
                 (every table: {every_table:?})",
                table.name(),
            );
        }
    }
    assert_eq!(
        stores["rb"].removed(Table::PendingAttach),
        3_000,
        "every create settled"
    );
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

/// A one-region cascade of `population` (created in that order, each
/// phase once the one before is in) from `root`, on a [`TombstoneStore`]:
/// every table's scans must pass at most about twice as many tombstones as
/// rows the cascade removed from it (the walk's pages, then one full pass
/// of what remains). A scan that restarts at its table's first key each
/// step passes every row removed before it: quadratic, the superlinear
/// term of P1 tree and unset on fjall (issue 28).
/// Returns, for the back-reference table, the tombstones its scans
/// passed, the live rows they returned, and the rows removed from it.
async fn a_local_cascade_passes_each_removed_row_at_most_twice(
    population: Vec<Vec<v1::ResourceSpec>>,
    root: &str,
    deleted: u64,
    unset: u64,
    steps: Steps,
) -> (u64, u64, u64) {
    let store = Arc::new(TombstoneStore::default());
    let c = start_cluster_on_stores(
        &["ra"],
        |s| {
            s.tick = Duration::from_millis(10);
            if steps == Steps::Small {
                // Small steps, as on fjall under a large cascade, where the
                // writer shrinks its steps to its flush's cost: with the
                // default bounds and this store's free flush the root's walk
                // fits in one step, and a root that stayed first in the due
                // index while its members were purged behind it went unseen
                // here (P1 unset on fjall, 100k: 8 s became 178 s).
                s.policy.batch_items = 16;
                s.policy.batch_budget = 16;
            }
            if steps == Steps::Large {
                // The writer scales its bounds down to 1/16 when its steps
                // run long (a loaded machine, a debug build): from 16 times
                // the defaults they stay at least the defaults.
                let defaults = cascade_core::Policy::default();
                s.policy.batch_items = 16 * defaults.batch_items;
                s.policy.batch_budget = 16 * defaults.batch_budget;
            }
        },
        |_| Some(store.clone() as Arc<dyn Store>),
    )
    .await;
    let a = c.client("ra");
    for phase in population {
        for chunk in phase.chunks(500) {
            a.batch_create(chunk.to_vec()).await.unwrap();
        }
    }
    let done = delete_and_wait(a, root, true).await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    let progress = done.progress.unwrap();
    assert_eq!((progress.deleted, progress.unset), (deleted, unset));

    // Counted when the operation is done: the dumps that wait for
    // quiescence and check the invariants read whole tables, over every
    // tombstone, and are not the cascade's.
    let every_table = store.passed_by_table();
    for table in Table::ALL {
        let (passed, removed) = (every_table.get(&table).copied().unwrap_or(0), store.removed(table));
        assert!(
            passed <= 2 * removed.max(100),
            "scans of {} passed {passed} tombstones for {removed} rows removed (every table: {every_table:?})",
            table.name(),
        );
    }
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
    (
        every_table.get(&Table::Backrefs).copied().unwrap_or(0),
        store.returned(Table::Backrefs),
        store.removed(Table::Backrefs),
    )
}

/// The step bounds the node runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Steps {
    /// 16 items and 16 referrers a step: every walk of more rows spans steps.
    Small,
    /// At least the policy's defaults, however far the writer scales them
    /// down: a member with fewer referrers than a step's budget is walked
    /// in one step.
    Large,
}

/// P1's tree: a project, networks in it, subnets spread over the networks.
fn tree_population(networks: usize, subnets: usize) -> Vec<Vec<v1::ResourceSpec>> {
    let mut population = vec![vec![spec_in("ra/project/p", &[])]];
    population.push(
        (0..networks)
            .map(|j| spec_in(&format!("ra/network/n{j}"), &[("project", &["ra/project/p"])]))
            .collect(),
    );
    population.push(
        (0..subnets)
            .map(|i| {
                let network = format!("ra/network/n{}", i % networks);
                spec_in(&format!("ra/subnet/s{i}"), &[("network", &[network.as_str()])])
            })
            .collect(),
    );
    population
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_cascade_passes_each_removed_row_at_most_twice() {
    let (networks, subnets) = (30, 2_970);
    a_local_cascade_passes_each_removed_row_at_most_twice(
        tree_population(networks, subnets),
        "ra/project/p",
        (1 + networks + subnets) as u64,
        0,
        Steps::Small,
    )
    .await;
}

/// A member whose walk starts and ends in one step is not read again by a
/// full pass: that step saw every row, and what is left is what it
/// counted. Each network's pass read all its subnets' rows a second time
/// (in the same step they are not tombstones yet, but rows the engine
/// returns and the step's own removals then hide: on fjall a second seek
/// and merge over them; P1 tree at 1M spent 9 % of its CPU in the walk's
/// scans). The tombstone counts above could not see it. Most networks here
/// (99 subnets each, against a step's 512 or more) are walked in one step;
/// the ones a step boundary cuts keep their full pass. With the default
/// bounds a loaded machine once failed it: the writer had scaled its steps
/// down until most walks were cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_member_walked_in_one_step_is_not_read_again() {
    let (networks, subnets) = (30, 2_970);
    let (_, returned, removed) = a_local_cascade_passes_each_removed_row_at_most_twice(
        tree_population(networks, subnets),
        "ra/project/p",
        (1 + networks + subnets) as u64,
        0,
        Steps::Large,
    )
    .await;
    assert_eq!(
        removed,
        (networks + subnets) as u64,
        "every row of the tree was removed"
    );
    assert!(
        returned <= removed + removed / 2,
        "the back-reference scans returned {returned} rows for {removed} rows removed: \
         members walked in one step were read again"
    );
}

/// P1's unset: a network, ports on it, and as many floating IPs each
/// referencing a port with `on_delete = "unset"` (they stay, emptied).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unset_cascade_passes_each_removed_row_at_most_twice() {
    let ports = 1_500;
    let population = vec![
        vec![
            spec_in("ra/project/p", &[]),
            spec_in("ra/network/n", &[("project", &["ra/project/p"])]),
        ],
        (0..ports)
            .map(|i| spec_in(&format!("ra/port/p{i}"), &[("network", &["ra/network/n"])]))
            .collect(),
        (0..ports)
            .map(|i| {
                let port = format!("ra/port/p{i}");
                spec_in(
                    &format!("ra/floating_ip/f{i}"),
                    &[("project", &["ra/project/p"]), ("port", &[port.as_str()])],
                )
            })
            .collect(),
    ];
    a_local_cascade_passes_each_removed_row_at_most_twice(
        population,
        "ra/network/n",
        (1 + ports) as u64,
        ports as u64,
        Steps::Small,
    )
    .await;
}
