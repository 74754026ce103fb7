//! Issue 31: `cascade schema diff [OLD] NEW --against ENDPOINT` asks a
//! running node (`Admin.CheckSchema`) what NEW would change against the
//! schema its region has in force, and what its stored data would refuse,
//! with the counts a reload would find; nothing changes.

// Test code: the CLI runs as a child process, waited for with a deadline.
#![allow(clippy::disallowed_methods)]

mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_client::AdminClient;
use cascade_core::Schema;
use cascade_node::NodeSettings;
use support::*;

const TOKEN: &str = "schema-diff-admin-token-0123456789";

/// What the node runs: projects, and networks that belong to one.
const BASE: &str = r#"
[kinds.project]
[kinds.network.refs.project]
kind = "project"
on_delete = "cascade"
required = true
"#;

/// Networks gone, volumes new: refused while networks are stored.
const WITHOUT_NETWORKS: &str = r#"
label = "volumes only"
[kinds.project]
[kinds.volume.refs.project]
kind = "project"
on_delete = "cascade"
"#;

/// BASE with volumes added: nothing stored forbids it.
const WITH_VOLUMES: &str = r#"
[kinds.project]
[kinds.network.refs.project]
kind = "project"
on_delete = "cascade"
required = true
[kinds.volume.refs.project]
kind = "project"
on_delete = "cascade"
"#;

/// A node whose schema file is BASE, with an administrator's token.
async fn node_with_schema_file() -> TestNode {
    start_node_with(BASE, |s: &mut NodeSettings| {
        let dir = s.data_dir.clone().expect("a data directory");
        let path = dir.join("schema.toml");
        std::fs::write(&path, BASE).expect("schema file written");
        s.schema = Arc::new(Schema::from_toml(BASE).expect("test schema"));
        s.schema_file = Some(path);
        s.admin.token = Some(TOKEN.to_owned());
    })
    .await
}

/// `cascade ARGS`, killed (and the test failed) past 60 s.
async fn cascade(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cascade"))
            .args(&args)
            .env_remove("CASCADE_ADMIN_TOKEN")
            .env_remove("CASCADE_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cascade runs");
        let until = Instant::now() + Duration::from_secs(60);
        while child.try_wait().expect("waitable").is_none() {
            if Instant::now() > until {
                let _ = child.kill();
                panic!("cascade {args:?} still ran after 60 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        child.wait_with_output().expect("output")
    })
    .await
    .expect("the CLI's thread")
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("schema written");
    path.display().to_string()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diff_against_a_node_names_what_a_removal_would_orphan_and_changes_nothing() {
    let n = node_with_schema_file().await;
    let endpoint = n.node.endpoint();
    n.client.create(spec_in("eu-west/project/p", &[])).await.unwrap();
    for i in 0..3 {
        let name = format!("eu-west/network/n{i}");
        n.client
            .create(spec_in(&name, &[("project", &["eu-west/project/p"])]))
            .await
            .unwrap();
    }
    let before = n.node.schema_version();
    let files = tempfile::tempdir().unwrap();
    let old = write(files.path(), "old.toml", BASE);
    let new = write(files.path(), "new.toml", WITHOUT_NETWORKS);

    let out = cascade(
        [
            "schema",
            "diff",
            &old,
            &new,
            "--against",
            &endpoint,
            "--admin-token",
            TOKEN,
        ]
        .map(str::to_owned)
        .to_vec(),
    )
    .await;
    let text = stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a refused reload exits 1:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("adds kind volume"), "{text}");
    assert!(text.contains("removes kind network"), "{text}");
    assert!(
        text.contains("would orphan 3 resources of kind network in region eu-west"),
        "{text}"
    );
    assert!(
        text.contains("refused: kinds.network: removed, but 3 stored resources"),
        "{text}"
    );
    assert!(!text.contains("warning:"), "OLD is the schema in force: {text}");

    // The node's schema, its data and its audit log are as they were.
    assert_eq!(n.node.schema_version(), before);
    assert_eq!(
        n.node.reload_schema().await.ok().map(|o| format!("{o:?}")),
        Some(format!("Unchanged({before:?})"))
    );
    for i in 0..3 {
        n.client
            .get(&format!("eu-west/network/n{i}"))
            .await
            .expect("still stored");
    }
    let admin = AdminClient::connect_with(&endpoint, None, Some(TOKEN.to_owned()))
        .await
        .unwrap();
    let reloads = admin
        .list_audit(cascade_proto::v1::ListAuditRequest {
            action: "schema.reload".to_owned(),
            ..Default::default()
        })
        .await
        .unwrap()
        .entries;
    assert!(reloads.is_empty(), "a check is no reload: {reloads:?}");

    // The same answer on the wire, with the versions.
    let answer = admin.check_schema(WITHOUT_NETWORKS.to_owned()).await.unwrap();
    assert!(answer.refused);
    assert_eq!(answer.in_force_version, before.digest);
    assert_eq!(answer.checked_label, "volumes only");
    let counted: Vec<(&str, u64)> = answer.checks.iter().map(|c| (c.path.as_str(), c.count)).collect();
    assert_eq!(counted, [("kinds.network", 3)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_the_data_allows_exits_zero_and_a_file_that_is_not_the_schema_in_force_is_named() {
    let n = node_with_schema_file().await;
    let endpoint = n.node.endpoint();
    let files = tempfile::tempdir().unwrap();
    let new = write(files.path(), "new.toml", WITH_VOLUMES);
    let out = cascade(
        ["schema", "diff", &new, "--against", &endpoint, "--admin-token", TOKEN]
            .map(str::to_owned)
            .to_vec(),
    )
    .await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("adds reference volume.project"), "{text}");
    assert!(text.contains("would be taken in eu-west"), "{text}");
    assert!(!text.contains("would orphan"), "{text}");

    let stale = write(files.path(), "stale.toml", WITHOUT_NETWORKS);
    let out = cascade(
        [
            "schema",
            "diff",
            &stale,
            &new,
            "--against",
            &endpoint,
            "--admin-token",
            TOKEN,
        ]
        .map(str::to_owned)
        .to_vec(),
    )
    .await;
    let text = stdout(&out);
    assert!(
        text.contains(&format!("warning: {stale} is not the schema in force in eu-west")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_schema_is_for_administrators_and_refuses_a_text_that_does_not_load_naming_it() {
    let n = node_with_schema_file().await;
    let endpoint = n.node.endpoint();
    let anyone = AdminClient::connect_with(&endpoint, None, None).await.unwrap();
    let refused = anyone
        .check_schema(WITH_VOLUMES.to_owned())
        .await
        .expect_err("no token");
    assert_eq!(code(&refused), Some(tonic::Code::PermissionDenied), "{refused}");

    let admin = AdminClient::connect_with(&endpoint, None, Some(TOKEN.to_owned()))
        .await
        .unwrap();
    let bad = admin
        .check_schema("[kinds.a.refs.b]\nkind = \"nowhere\"\non_delete = \"cascade\"\n".to_owned())
        .await
        .expect_err("an unknown kind");
    assert_eq!(code(&bad), Some(tonic::Code::InvalidArgument), "{bad}");
    let text = bad.to_string();
    assert!(
        text.contains("schema_text") && text.contains("kinds.a.refs.b"),
        "{text}"
    );
}
