//! Issue 31: the schema in force survives a restart. A node stores the
//! schema it puts in force (at start and at every accepted reload), and at
//! start checks a schema file that differs from it against the stored data
//! as a reload would: a file the data forbids (one a reload refused) does
//! not start the node, with the reason, the count and the file; the
//! accepted file does; `accept_schema_unchecked` (`cascade serve
//! --accept-schema-unchecked`) starts it anyway, and the audit log says so.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cascade_client::{AdminClient, Client};
use cascade_core::{RegionId, Schema};
use cascade_node::{NodeSettings, ReloadError, RunningNode};
use cascade_proto::v1;
use support::*;
use tokio::net::TcpListener;

const TOKEN: &str = "schema-start-admin-token-0123456789";

const BASE: &str = r#"
[kinds.project]
[kinds.network.refs.project]
kind = "project"
on_delete = "cascade"
required = true
"#;

/// Networks removed: refused while two are stored.
const WITHOUT_NETWORKS: &str = "label = \"no networks\"\n[kinds.project]\n";

/// Settings of a node in `data`, its schema the file `file` holding `text`.
fn settings(data: &Path, file: &Path, text: &str) -> NodeSettings {
    std::fs::write(file, text).expect("schema file written");
    let schema = Schema::from_toml(text).expect("test schema");
    let mut s = NodeSettings::new(
        RegionId::parse(REGION).unwrap(),
        Arc::new(schema),
        Some(data.to_owned()),
    );
    s.schema_file = Some(file.to_owned());
    s.admin.token = Some(TOKEN.to_owned());
    s.tick = Duration::from_millis(50);
    s
}

async fn start(settings: NodeSettings) -> Result<RunningNode, cascade_node::NodeError> {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    RunningNode::start(settings, listener).await
}

fn paths(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("data"), dir.join("schema.toml"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_a_reload_refused_does_not_start_the_node_and_the_accepted_one_does() {
    let dir = tempfile::tempdir().unwrap();
    let (data, file) = paths(dir.path());
    let node = start(settings(&data, &file, BASE)).await.expect("node starts");
    let client = Client::connect(&node.endpoint()).await.unwrap();
    client.create(spec_in("eu-west/project/p", &[])).await.unwrap();
    for id in ["a", "b"] {
        let name = format!("eu-west/network/{id}");
        client
            .create(spec_in(&name, &[("project", &["eu-west/project/p"])]))
            .await
            .unwrap();
    }
    let in_force = node.schema_version();
    // The reload of the edited file is refused: the node keeps BASE.
    std::fs::write(&file, WITHOUT_NETWORKS).unwrap();
    let refused = node.reload_schema().await.expect_err("networks are stored");
    assert!(matches!(refused, ReloadError::Incompatible { .. }), "{refused}");
    drop(client);
    node.stop().await.expect("node stops");

    // Restarted with the refused file (left in place): it does not start.
    let mut next = settings(&data, &file, WITHOUT_NETWORKS);
    let error = match start(next.clone()).await {
        Ok(_) => panic!("a node started on a schema its stored data forbids"),
        Err(e) => e.to_string(),
    };
    let shown = file.display().to_string();
    assert!(error.starts_with(&format!("{shown}: refused at start")), "{error}");
    assert!(error.contains(&in_force.digest), "names the stored schema: {error}");
    assert!(
        error.contains("kinds.network: removed, but 2 stored resources are of kind network"),
        "{error}"
    );
    assert!(error.contains("--accept-schema-unchecked"), "{error}");

    // With the accepted file it starts, and serves what it stored.
    next = settings(&data, &file, BASE);
    let node = start(next).await.expect("the accepted schema starts");
    assert_eq!(node.schema_version(), in_force);
    let client = Client::connect(&node.endpoint()).await.unwrap();
    client.get("eu-west/network/a").await.expect("served");
    node.stop().await.expect("node stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_reload_is_the_schema_the_next_start_checks_against_and_the_override_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let (data, file) = paths(dir.path());
    let node = start(settings(&data, &file, BASE)).await.expect("node starts");
    // Nothing stored yet: the reload to WITHOUT_NETWORKS is taken, and stored.
    std::fs::write(&file, WITHOUT_NETWORKS).unwrap();
    node.reload_schema().await.expect("nothing forbids it");
    let client = Client::connect(&node.endpoint()).await.unwrap();
    client.create(spec_in("eu-west/project/p", &[])).await.unwrap();
    drop(client);
    node.stop().await.expect("node stops");

    // Back to BASE at start: a kind added, checked against the stored
    // WITHOUT_NETWORKS and taken.
    let node = start(settings(&data, &file, BASE)).await.expect("adding a kind starts");
    let client = Client::connect(&node.endpoint()).await.unwrap();
    client
        .create(spec_in("eu-west/network/n", &[("project", &["eu-west/project/p"])]))
        .await
        .unwrap();
    drop(client);
    node.stop().await.expect("node stops");

    // Removing networks again, with n stored: refused, unless overridden.
    assert!(start(settings(&data, &file, WITHOUT_NETWORKS)).await.is_err());
    let mut forced = settings(&data, &file, WITHOUT_NETWORKS);
    forced.accept_schema_unchecked = true;
    let node = start(forced).await.expect("the operator overrides the check");
    assert_eq!(node.schema_version().label.as_deref(), Some("no networks"));
    let admin = AdminClient::connect_with(&node.endpoint(), None, Some(TOKEN.to_owned()))
        .await
        .unwrap();
    let entries = eventually(Duration::from_secs(10), "the override's audit entry", || async {
        let page = admin
            .list_audit(v1::ListAuditRequest {
                action: "schema.reload".to_owned(),
                ..Default::default()
            })
            .await
            .ok()?;
        let overridden: Vec<v1::AuditEntry> = page
            .entries
            .into_iter()
            .filter(|e| e.outcome.contains("--accept-schema-unchecked"))
            .collect();
        (!overridden.is_empty()).then_some(overridden)
    })
    .await;
    assert_eq!(entries[0].who, "operator");
    assert!(
        entries[0].outcome.contains("1 stored resource is of kind network"),
        "{:?}",
        entries[0]
    );
    node.stop().await.expect("node stops");
}
