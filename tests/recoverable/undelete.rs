//! Undelete of a whole cascade (issue 29), over real nodes in three
//! regions: a soft-deleted cascade comes back with its uids and references
//! (and its unset fields), except where a referrer changed since; a region
//! that is stopped finishes when it returns; after the window, the undelete
//! says the members were purged. The checker is clean before and after.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cascade_client::Client;
use cascade_proto::v1;
use futures::StreamExt;

use crate::soft_delete::{build, delete_with_retention, list_all, port, reason};
use crate::support::*;

/// Every member and unset referrer of `build`'s cascade, by name, as it is
/// now: its uid and references.
async fn snapshot(c: &Cluster, members: &[String]) -> BTreeMap<String, (String, Vec<(String, Vec<String>)>)> {
    let mut out = BTreeMap::new();
    for name in members {
        let region = name.split('/').next().unwrap();
        let r = c.client(region).get_with(name, true).await.unwrap();
        out.insert(name.clone(), (r.uid.clone(), refs_of(&r)));
    }
    for region in ["ra", "rb", "rc"] {
        for r in list_all(c.client(region), region, "port", false).await {
            if r.name.contains("/port/u") {
                out.insert(r.name.clone(), (r.uid.clone(), refs_of(&r)));
            }
        }
    }
    out
}

fn refs_of(r: &v1::Resource) -> Vec<(String, Vec<String>)> {
    let mut refs: Vec<(String, Vec<String>)> = r
        .refs
        .iter()
        .map(|f| {
            (
                f.field.clone(),
                f.targets.iter().map(|t| format!("{}@{}", t.name, t.uid)).collect(),
            )
        })
        .collect();
    refs.sort();
    refs
}

async fn undelete(client: &Client, target: &str, dry_run: bool) -> v1::UndeleteResponse {
    let (operation_id, name) = if target.contains('/') {
        (String::new(), target.to_owned())
    } else {
        (target.to_owned(), String::new())
    };
    client
        .undelete(v1::UndeleteRequest {
            operation_id,
            name,
            dry_run,
        })
        .await
        .unwrap_or_else(|e| panic!("undelete {target}: {e}"))
}

fn action(o: &v1::Outcome) -> v1::OutcomeAction {
    v1::OutcomeAction::try_from(o.action).unwrap_or(v1::OutcomeAction::Unspecified)
}

/// Every outcome of operation `id`, every page.
async fn outcomes(client: &Client, id: &str) -> Vec<v1::Outcome> {
    let mut all = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .raw()
            .get_operation(v1::GetOperationRequest {
                id: id.to_owned(),
                outcomes_page_size: 1000,
                outcomes_page_token: token,
            })
            .await
            .unwrap_or_else(|e| panic!("GetOperation {id}: {e:?}"))
            .into_inner();
        all.extend(page.outcomes);
        if page.next_outcomes_page_token.is_empty() {
            return all;
        }
        token = page.next_outcomes_page_token;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undelete_restores_a_three_region_cascade_with_its_uids_and_references() {
    const PER_REGION: usize = 333;
    const UNSET_PER_REGION: usize = 5;
    let c = start_cluster(&["ra", "rb", "rc"]).await;
    let a = c.client("ra");
    let members = build(&c, PER_REGION, UNSET_PER_REGION).await;
    let before = snapshot(&c, &members).await;
    let deletion = delete_with_retention(a, "ra/project/p", 3600).await;
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
    let mut watch = c.client("rb").watch(0, "port").await.unwrap();

    // A dry run from another region's node: every member and unset
    // referrer would come back; nothing changes.
    let dry = undelete(c.client("rc"), "ra/project/p", true).await;
    assert!(dry.operation.is_none());
    assert_eq!(dry.undelete_of, deletion.id);
    let would: Vec<&v1::Outcome> = dry
        .planned
        .iter()
        .filter(|o| action(o) == v1::OutcomeAction::Restored)
        .collect();
    assert_eq!(
        would.len(),
        before.len(),
        "{:?}",
        dry.planned.iter().find(|o| action(o) != v1::OutcomeAction::Restored)
    );
    let e = c.client("rb").get("rb/port/m0007").await.unwrap_err();
    assert_eq!(code(&e), Some(tonic::Code::NotFound), "a dry run changes nothing: {e}");

    // The undelete, by the deletion's id, asked of rb's node.
    let started = Instant::now();
    let answer = undelete(c.client("rb"), &deletion.id, false).await;
    eprintln!(
        "undeleted {} members and referrers in {:?}",
        before.len(),
        started.elapsed()
    );
    let op = answer.operation.expect("an operation");
    assert!(answer.unreachable_regions.is_empty());
    assert_eq!(op.undelete_of, deletion.id);
    let op = wait_operation(a, &op.id).await;
    assert_eq!(
        v1::OperationState::try_from(op.state),
        Ok(v1::OperationState::Succeeded),
        "{op:?}"
    );
    let progress = op.progress.unwrap();
    assert_eq!(progress.restored, before.len() as u64);
    assert_eq!(progress.not_restored, 0);
    assert!(outcomes(a, &op.id)
        .await
        .iter()
        .all(|o| action(o) == v1::OutcomeAction::Restored));

    // Every member is back, live, with its uid and references; every
    // unset referrer has its security group again.
    wait_quiescent(&c).await;
    let after = snapshot(&c, &members).await;
    assert_eq!(after, before, "same uids and references");
    for name in &members {
        let region = name.split('/').next().unwrap();
        let r = c.client(region).get(name).await.unwrap();
        assert_eq!(state(&r), v1::ResourceState::Active, "{name}");
    }
    assert_no_violations(&c).await;

    // UNDELETED on the watch stream of the member's region.
    let seen = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(e) = watch.next().await {
            let e = e.unwrap();
            if e.r#type == v1::EventType::Undeleted as i32 && e.resource.as_ref().unwrap().name == "rb/port/m0007" {
                return e;
            }
        }
        panic!("the watch ended");
    })
    .await
    .expect("an UNDELETED event");
    assert_eq!(seen.operation_id, op.id);

    // The references are attached again: a new delete cascades through them.
    let again = delete_and_wait(a, "ra/network/n", true).await;
    assert_eq!(again.progress.unwrap().deleted, 1 + 3 * PER_REGION as u64);
    let e = c.client("rc").get("rc/port/m0300").await.unwrap_err();
    assert_eq!(code(&e), Some(tonic::Code::NotFound), "{e}");
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_referrer_changed_since_the_unset_keeps_its_change_and_the_outcome_says_why() {
    let c = start_cluster(&["ra", "rb", "rc"]).await;
    let a = c.client("ra");
    let members = build(&c, 10, 2).await;
    let deletion = delete_with_retention(a, "ra/project/p", 3600).await;
    // rb/port/u0 changes after the unset: a new attribute.
    let mut spec = port("rb/port/u0", "ra/network/n2", &[]);
    spec.attributes.insert("touched".into(), "after the delete".into());
    c.client("rb").update(spec, "").await.unwrap();

    let answer = undelete(c.client("ra"), "ra/project/p", false).await;
    let op = wait_operation(a, &answer.operation.unwrap().id).await;
    assert_eq!(
        v1::OperationState::try_from(op.state),
        Ok(v1::OperationState::Failed),
        "{op:?}"
    );
    let progress = op.progress.unwrap();
    assert_eq!(
        progress.restored,
        members.len() as u64 + 5,
        "the members and the other unset referrers"
    );
    assert_eq!(progress.not_restored, 1);
    let all = outcomes(a, &op.id).await;
    let u0 = all
        .iter()
        .find(|o| o.resource.as_ref().unwrap().name == "rb/port/u0")
        .expect("an outcome for rb/port/u0");
    assert_eq!(action(u0), v1::OutcomeAction::NotRestored);
    assert!(u0.message.contains("changed since the unset"), "{}", u0.message);
    assert_eq!(u0.region, "rb");

    let u0 = c.client("rb").get("rb/port/u0").await.unwrap();
    assert!(
        targets(&u0, "security_groups").is_empty(),
        "not restored over the change"
    );
    assert_eq!(
        u0.attributes.get("touched").map(String::as_str),
        Some("after the delete")
    );
    let u1 = c.client("rb").get("rb/port/u1").await.unwrap();
    assert_eq!(targets(&u1, "security_groups"), ["ra/security_group/sg"]);
    assert_eq!(
        state(&c.client("rc").get("rc/port/m0003").await.unwrap()),
        v1::ResourceState::Active
    );
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
    let _ = deletion;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_region_stopped_the_others_are_restored_and_it_finishes_when_it_returns() {
    let mut c = start_cluster(&["ra", "rb", "rc"]).await;
    let members = build(&c, 20, 2).await;
    let deletion = delete_with_retention(c.client("ra"), "ra/project/p", 3600).await;
    wait_quiescent(&c).await;
    c.stop("rc").await;

    let answer = undelete(c.client("ra"), &deletion.id, false).await;
    assert_eq!(answer.unreachable_regions, ["rc"]);
    let op = answer.operation.unwrap();
    assert_eq!(op.undelete_regions_left, ["rc"], "rc is left to finish");
    assert_ne!(
        v1::OperationState::try_from(op.state),
        Ok(v1::OperationState::Succeeded)
    );
    // The regions that answered are restored.
    for name in ["ra/project/p", "ra/network/n", "rb/port/m0000", "rb/port/m0019"] {
        let region = name.split('/').next().unwrap();
        let r = c.client(region).get(name).await.unwrap();
        assert_eq!(state(&r), v1::ResourceState::Active, "{name}");
    }
    let viewed = c.client("ra").get_operation(&op.id, 10).await.unwrap();
    assert!(!viewed.done, "not done while rc is away");
    assert_eq!(viewed.unreachable_regions, ["rc"]);

    // rc returns: the reconciler drives its part to the end.
    c.restart("rc").await;
    let op = wait_operation(c.client("ra"), &op.id).await;
    assert_eq!(
        v1::OperationState::try_from(op.state),
        Ok(v1::OperationState::Succeeded),
        "{op:?}"
    );
    assert_eq!(op.progress.unwrap().restored, members.len() as u64 + 6);
    for name in members.iter().filter(|m| m.starts_with("rc/")) {
        let r = c.client("rc").get(name).await.unwrap();
        assert_eq!(state(&r), v1::ResourceState::Active, "{name}");
        assert_eq!(targets(&r, "network"), ["ra/network/n"]);
    }
    let u = c.client("rc").get("rc/port/u1").await.unwrap();
    assert_eq!(targets(&u, "security_groups"), ["ra/security_group/sg"]);
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_window_the_members_are_purged_and_undelete_says_so() {
    let c = start_cluster(&["ra", "rb", "rc"]).await;
    let members = build(&c, 5, 1).await;
    let deletion = delete_with_retention(c.client("ra"), "ra/project/p", 2).await;
    for name in &members {
        let region = name.split('/').next().unwrap();
        let client = c.client(region);
        eventually(
            Duration::from_secs(30),
            &format!("{name} purged at its expiry"),
            || async {
                match client.get_with(name, true).await {
                    Err(e) if reason(&e) == v1::ErrorReason::NotFound => Some(()),
                    _ => None,
                }
            },
        )
        .await;
    }
    // By the root's name: nothing is buried under it any more.
    let e = c
        .client("ra")
        .undelete(v1::UndeleteRequest {
            name: "ra/project/p".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(code(&e), Some(tonic::Code::NotFound), "{e}");
    // By the operation: every member NOT_RESTORED, saying when it was purged.
    let answer = undelete(c.client("rb"), &deletion.id, false).await;
    let op = wait_operation(c.client("ra"), &answer.operation.unwrap().id).await;
    assert_eq!(
        v1::OperationState::try_from(op.state),
        Ok(v1::OperationState::Failed),
        "{op:?}"
    );
    let progress = op.progress.unwrap();
    assert_eq!(progress.restored, 0);
    let all = outcomes(c.client("ra"), &op.id).await;
    for name in &members {
        let o = all
            .iter()
            .find(|o| o.resource.as_ref().unwrap().name == *name)
            .unwrap_or_else(|| panic!("no outcome for {name}"));
        assert_eq!(action(o), v1::OutcomeAction::NotRestored, "{name}");
        assert!(o.message.starts_with("expired: purged at"), "{name}: {}", o.message);
    }
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

/// Members of `members` whose window passed and that are purged (not even
/// `show_deleted` reads them).
async fn purged(c: &Cluster, members: &[String]) -> usize {
    let mut n = 0;
    for name in members {
        let region = name.split('/').next().unwrap();
        if let Err(e) = c.client(region).get_with(name, true).await {
            if reason(&e) == v1::ErrorReason::NotFound {
                n += 1;
            }
        }
    }
    n
}

/// A 2 s window; the undelete is issued once `purged_first` members are
/// purged (0: as soon as the deletion finished), so it meets the expiry
/// before, during or after the members' purges. Whatever the order, each
/// member ends one way: RESTORED and live with its uid, or NOT_RESTORED
/// with a reason and purged; never RESTORED and gone, never missing.
async fn undelete_around_the_expiry(purged_first: usize) {
    let c = start_cluster(&["ra", "rb", "rc"]).await;
    let members = build(&c, 3, 1).await;
    let mut uids = BTreeMap::new();
    for name in &members {
        let region = name.split('/').next().unwrap();
        uids.insert(name.clone(), c.client(region).get(name).await.unwrap().uid);
    }
    let deletion = delete_with_retention(c.client("ra"), "ra/project/p", 2).await;
    if purged_first > 0 {
        eventually(
            Duration::from_secs(30),
            &format!("{purged_first} members purged at their expiry"),
            || async { (purged(&c, &members).await >= purged_first).then_some(()) },
        )
        .await;
    }
    let answer = undelete(c.client("ra"), &deletion.id, false).await;
    let op = wait_operation(c.client("ra"), &answer.operation.unwrap().id).await;
    let all = outcomes(c.client("ra"), &op.id).await;
    wait_quiescent(&c).await;
    let (mut restored, mut not_restored) = (0, 0);
    for name in &members {
        let region = name.split('/').next().unwrap();
        let o = all
            .iter()
            .find(|o| o.resource.as_ref().unwrap().name == *name)
            .unwrap_or_else(|| panic!("round {purged_first}: no outcome for {name}"));
        match action(o) {
            v1::OutcomeAction::Restored => {
                restored += 1;
                let r = c
                    .client(region)
                    .get(name)
                    .await
                    .unwrap_or_else(|e| panic!("round {purged_first}: {name} RESTORED but not readable: {e}"));
                assert_eq!(state(&r), v1::ResourceState::Active, "round {purged_first}: {name}");
                assert_eq!(r.uid, uids[name], "round {purged_first}: {name} restored with its uid");
            }
            v1::OutcomeAction::NotRestored => {
                not_restored += 1;
                assert!(!o.message.is_empty(), "round {purged_first}: {name} without a reason");
                // Expired (or held by an expired target): purged at its expiry.
                let client = c.client(region);
                eventually(
                    Duration::from_secs(30),
                    &format!("round {purged_first}: NOT_RESTORED {name} purged"),
                    || async {
                        match client.get_with(name, true).await {
                            Err(e) if reason(&e) == v1::ErrorReason::NotFound => Some(()),
                            _ => None,
                        }
                    },
                )
                .await;
            }
            other => panic!("round {purged_first}: {name} is {other:?}"),
        }
    }
    assert_eq!(restored + not_restored, members.len());
    let expected = if not_restored == 0 {
        v1::OperationState::Succeeded
    } else {
        v1::OperationState::Failed
    };
    assert_eq!(v1::OperationState::try_from(op.state), Ok(expected), "{op:?}");
    assert_no_violations(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undelete_racing_the_expiry_resolves_one_way_for_every_member() {
    // Before any purge, after the first, and after half the members: the
    // undelete meets the expiry at different points of its round.
    for purged_first in [0, 1, 6] {
        undelete_around_the_expiry(purged_first).await;
    }
}
