//! Issue 27, the closure: a cascade never deletes what its caller may not.
//! Two real regions, each deciding with its own deny-set (a test policy
//! given to the node through `NodeEnv::authorizer`, which is not
//! `AllowAll`, so the closure check runs): a cascade from a network in
//! `ra` that reaches a port in `rb` the caller may not delete is refused
//! before anything changes, naming the port and its region, and the dry run
//! shows it; allowed, the same cascade succeeds; a refusal that appears
//! after the check holds the port BLOCKED, explain shows why, the rest of
//! the cascade finishes, and an administrator's force purge ends it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cascade_client::{AdminClient, Client};
use cascade_core::auth::{Authorize, Decision, Principal, Target, Verb};
use cascade_node::NodeEnv;
use cascade_proto::v1;

use crate::support::{eventually, start_cluster_with_env, wait_gone, Cluster};

const ADMIN_TOKEN: &str = "closure-admin-token-0123456789";
const DENY_RULE: &str = "closure test deny-set";

/// A region's test policy: everything is allowed but the refused
/// `(verb, name)` pairs; a pair may be allowed a number of times first (a
/// policy that changes between the closure check and the cascade).
#[derive(Default)]
struct DenySet {
    /// (verb, full name) → how many more decisions allow it before it is refused.
    refused: Mutex<BTreeMap<(Verb, String), usize>>,
}

impl DenySet {
    fn refuse(&self, verb: Verb, name: &str, after_allowing: usize) {
        self.refused
            .lock()
            .unwrap()
            .insert((verb, name.to_owned()), after_allowing);
    }

    fn clear(&self) {
        self.refused.lock().unwrap().clear();
    }
}

impl Authorize for DenySet {
    fn decide(&self, _: &Principal, verb: Verb, target: Target<'_>) -> Decision {
        let Target::Resource(name) = target else {
            return Decision::allow("closure test allow");
        };
        match self.refused.lock().unwrap().get_mut(&(verb, name.to_string())) {
            Some(0) => Decision::deny(DENY_RULE),
            Some(allowed) => {
                *allowed -= 1;
                Decision::allow("closure test allow")
            }
            None => Decision::allow("closure test allow"),
        }
    }
}

/// A cluster of one node per region on 127.0.0.1:0, each node deciding
/// with its own [`DenySet`].
struct Regions {
    cluster: Cluster,
    policies: BTreeMap<String, Arc<DenySet>>,
}

impl Regions {
    fn client(&self, region: &str) -> &Client {
        self.cluster.client(region)
    }

    fn policy(&self, region: &str) -> &DenySet {
        &self.policies[region]
    }
}

async fn start(regions: &[&str]) -> Regions {
    let policies: BTreeMap<String, Arc<DenySet>> = regions
        .iter()
        .map(|r| (r.to_string(), Arc::new(DenySet::default())))
        .collect();
    let cluster = start_cluster_with_env(
        regions,
        |s| s.admin.token = Some(ADMIN_TOKEN.to_owned()),
        |region| NodeEnv {
            authorizer: Some(policies[region].clone()),
            ..Default::default()
        },
    )
    .await;
    Regions { cluster, policies }
}

fn spec(name: &str, refs: &[(&str, &str)]) -> v1::ResourceSpec {
    v1::ResourceSpec {
        name: name.to_owned(),
        refs: refs
            .iter()
            .map(|(field, target)| v1::ReferenceField {
                field: field.to_string(),
                targets: vec![v1::ObjectRef {
                    name: target.to_string(),
                    ..Default::default()
                }],
            })
            .collect(),
        ..Default::default()
    }
}

fn cascade_delete(name: &str, dry_run: bool) -> v1::DeleteRequest {
    v1::DeleteRequest {
        name: name.to_owned(),
        cascade: true,
        dry_run,
        requested_by: "closure test".into(),
        ..Default::default()
    }
}

/// `ra/network/n` (with its project), and ports in `rb` on it.
async fn network_with_ports_in_rb(regions: &Regions, ports: &[&str]) {
    let ra = regions.client("ra");
    ra.create(spec("ra/project/p", &[])).await.expect("project");
    ra.create(spec("ra/network/n", &[("project", "ra/project/p")]))
        .await
        .expect("network");
    for port in ports {
        regions
            .client("rb")
            .create(spec(port, &[("network", "ra/network/n")]))
            .await
            .expect("port in rb");
    }
}

fn state_of(r: &v1::Resource) -> v1::ResourceState {
    v1::ResourceState::try_from(r.state).unwrap_or(v1::ResourceState::Unspecified)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cascade_reaching_a_port_its_caller_may_not_delete_in_another_region_is_refused_before_anything_changes() {
    let regions = start(&["ra", "rb"]).await;
    network_with_ports_in_rb(&regions, &["rb/port/p1"]).await;
    regions.policy("rb").refuse(Verb::Delete, "rb/port/p1", 0);
    let ra = regions.client("ra");

    // The dry run lists it, decided by rb's policy.
    let plan = ra
        .delete(cascade_delete("ra/network/n", true))
        .await
        .expect("dry run")
        .plan
        .expect("a plan");
    let denied: Vec<(String, String, String, String)> = plan
        .denied
        .iter()
        .map(|d| (d.region.clone(), d.name.clone(), d.verb.clone(), d.rule.clone()))
        .collect();
    assert_eq!(
        denied,
        vec![(
            "rb".to_owned(),
            "rb/port/p1".to_owned(),
            "delete".to_owned(),
            DENY_RULE.to_owned()
        )]
    );

    // The delete is refused, naming the port and its region, in the message
    // and machine-readably in the details.
    let refused = ra
        .delete(cascade_delete("ra/network/n", false))
        .await
        .expect_err("refused");
    let cascade_client::ClientError::Status(status) = &refused else {
        panic!("a status, got {refused}");
    };
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("rb/port/p1") && status.message().contains("rb"),
        "{}",
        status.message()
    );
    let details = cascade_proto::error_details(status).expect("details");
    assert_eq!(details.reason, v1::ErrorReason::Denied as i32);
    let named: BTreeSet<(String, String, String)> = details
        .denied
        .iter()
        .map(|d| (d.region.clone(), d.name.clone(), d.verb.clone()))
        .collect();
    assert_eq!(
        named,
        BTreeSet::from([("rb".to_owned(), "rb/port/p1".to_owned(), "delete".to_owned())])
    );
    // Nothing changed anywhere.
    let network = ra.get("ra/network/n").await.expect("network still there");
    assert_eq!(state_of(&network), v1::ResourceState::Active);
    let port = regions.client("rb").get("rb/port/p1").await.expect("port still there");
    assert_eq!(state_of(&port), v1::ResourceState::Active);

    // A caller allowed everything: the same cascade goes through.
    regions.policy("rb").clear();
    let op = ra
        .delete(cascade_delete("ra/network/n", false))
        .await
        .expect("allowed")
        .operation
        .expect("an operation");
    assert!(!op.id.is_empty());
    wait_gone(regions.client("rb"), "rb/port/p1").await;
    wait_gone(ra, "ra/network/n").await;
    let mut cluster = regions.cluster;
    for region in ["ra", "rb"] {
        cluster.stop(region).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_after_the_check_holds_the_port_blocked_explain_shows_it_and_a_force_purge_ends_it() {
    let regions = start(&["ra", "rb"]).await;
    network_with_ports_in_rb(&regions, &["rb/port/p1", "rb/port/p2"]).await;
    // rb's policy allows p1's deletion once (the closure check) and refuses
    // it from then on: the policy changed after the start.
    regions.policy("rb").refuse(Verb::Delete, "rb/port/p1", 1);
    let ra = regions.client("ra");
    let rb = regions.client("rb");
    let op = ra
        .delete(cascade_delete("ra/network/n", false))
        .await
        .expect("the check passes")
        .operation
        .expect("an operation");

    // The rest of the cascade finishes; p1 is held with the reason.
    wait_gone(rb, "rb/port/p2").await;
    let explained = eventually(Duration::from_secs(30), "explain to show p1 refused", || async {
        let explanation = ra
            .explain_deletion(v1::ExplainDeletionRequest {
                operation_id: op.id.clone(),
                ..Default::default()
            })
            .await
            .ok()?;
        let p1 = explanation
            .deletions
            .iter()
            .find(|d| d.resource.as_ref().is_some_and(|r| r.name == "rb/port/p1"))?;
        p1.reasons
            .iter()
            .find(|r| r.contains("refused by policy"))
            .map(|r| (r.clone(), p1.stuck))
    })
    .await;
    let (reason, stuck) = explained;
    assert!(
        reason.contains("anonymous may not delete rb/port/p1") && reason.contains(DENY_RULE),
        "{reason}"
    );
    assert!(stuck, "only a person frees it");
    assert_eq!(
        state_of(&rb.get("rb/port/p1").await.expect("p1 held")),
        v1::ResourceState::Deleting
    );
    assert_eq!(
        state_of(&ra.get("ra/network/n").await.expect("root waits")),
        v1::ResourceState::Deleting,
        "the root goes last"
    );

    // An administrator forces it through: the cascade finishes.
    let admin = AdminClient::connect_with(
        &regions.cluster.node("rb").node.endpoint(),
        None,
        Some(ADMIN_TOKEN.to_owned()),
    )
    .await
    .expect("admin connects");
    admin
        .force_purge(v1::ForcePurgeRequest {
            name: "rb/port/p1".to_owned(),
            reason: "approved by the network's owner".to_owned(),
            force: true,
        })
        .await
        .expect("force purge");
    wait_gone(rb, "rb/port/p1").await;
    wait_gone(ra, "ra/network/n").await;
    let mut cluster = regions.cluster;
    for region in ["ra", "rb"] {
        cluster.stop(region).await;
    }
}
