//! Issue 31: the schema changes under a running cluster. A reload (the
//! node handle's `reload_schema`, which SIGHUP and the file watch call
//! too) puts a schema that adds kinds and references in force without a
//! restart; one that would orphan stored data, or does not load, is
//! refused with the count or the line and path, and the schema in force
//! stays; a reload lands between two writer steps of a running cascade.
//! Rolled out one region at a time (through the files, and by SIGHUP to
//! `cascade serve` processes), a reference into a region that has not
//! reloaded yet is refused FAILED_PRECONDITION naming it, and works once
//! it has.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cascade_client::{AdminClient, Client};
use cascade_core::Schema;
use cascade_node::{NodeSettings, ReloadError, ReloadOutcome};
use cascade_proto::v1;
use support::*;

const TOKEN: &str = "test-admin-token-0123456789";

/// What every region starts with.
const BASE: &str = r#"
[kinds.project]
[kinds.network.refs.project]
kind = "project"
on_delete = "cascade"
required = true
"#;

/// BASE with a kind and reference fields added: a volume belongs to a
/// project (cascade), and a network may name a volume (unset).
const VOLUMES: &str = r#"
label = "volumes"
[kinds.project]
[kinds.network.refs.project]
kind = "project"
on_delete = "cascade"
required = true
[kinds.network.refs.volume]
kind = "volume"
on_delete = "unset"
[kinds.volume.refs.project]
kind = "project"
on_delete = "cascade"
required = true
"#;

/// Settings of a node whose schema is the file `dir/{region}.toml`, written
/// with `text`; with an administrator's token, to read the audit log.
fn schema_file<'a>(dir: &'a Path, text: &'static str) -> impl Fn(&mut NodeSettings) + 'a {
    move |s: &mut NodeSettings| {
        let path = dir.join(format!("{}.toml", s.region));
        std::fs::write(&path, text).expect("schema file written");
        s.schema = Arc::new(Schema::from_toml(text).expect("test schema"));
        s.schema_file = Some(path);
        s.admin.token = Some(TOKEN.to_owned());
    }
}

/// Replaces a schema file whole, as an editor does (a new file renamed
/// over it), so a watcher never reads half of it.
fn rewrite(path: &Path, text: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).expect("new schema written");
    std::fs::rename(&next, path).expect("new schema renamed over the old");
}

fn path_of(dir: &Path, region: &str) -> PathBuf {
    dir.join(format!("{region}.toml"))
}

async fn admin(endpoint: &str) -> AdminClient {
    AdminClient::connect_with(endpoint, None, Some(TOKEN.to_owned()))
        .await
        .expect("admin client connects")
}

/// Each region's schema version as `cascade status` shows it, once every
/// region answered with one.
async fn status_versions(admin: &AdminClient) -> Vec<(String, String, String)> {
    let status = admin.cluster_status().await.expect("cluster status");
    status
        .regions
        .iter()
        .map(|r| {
            let f = r.figures.clone().unwrap_or_default();
            (r.region.clone(), f.schema_version, f.schema_label)
        })
        .collect()
}

/// The audit log's schema reloads of `region`, oldest first.
async fn reload_entries(admin: &AdminClient, region: &str) -> Vec<v1::AuditEntry> {
    let log = admin
        .list_audit(v1::ListAuditRequest {
            region: region.to_owned(),
            action: "schema.reload".to_owned(),
            ..Default::default()
        })
        .await
        .expect("audit log")
        .entries;
    log.into_iter().filter(|e| e.action == "schema.reload").collect()
}

fn network(name: &str, project: &str, volume: Option<&str>) -> v1::ResourceSpec {
    match volume {
        Some(v) => spec_in(name, &[("project", &[project]), ("volume", &[v])]),
        None => spec_in(name, &[("project", &[project])]),
    }
}

/// The regions of the rolling tests, in the order they reload: ap-south last.
const ROLL: [&str; 3] = ["eu-west", "us-east", "ap-south"];

/// A refusal of a reference into a region that does not know its kind:
/// FAILED_PRECONDITION (the same call succeeds after that region reloads),
/// naming the region and what it lacks.
fn assert_refused_naming(refused: &cascade_client::ClientError, region: &str, what: &str) {
    assert_eq!(code(refused), Some(tonic::Code::FailedPrecondition), "{refused}");
    let says = format!("region \"{region}\" does not know {what} yet (its schema version ");
    let shown = refused.to_string();
    assert!(shown.contains(&says), "{shown} should say {says:?}");
    assert!(shown.contains("reload its schema, then retry"), "{shown}");
    // A client acts on the details, without reading the message.
    let cascade_client::ClientError::Status(status) = refused else {
        panic!("not a status: {refused}");
    };
    let details = cascade_proto::status::error_details(status).expect("error details");
    assert_eq!(details.reason, v1::ErrorReason::SchemaUnknown as i32, "{details:?}");
    assert_eq!(details.region, region);
}

/// Mid-roll (eu-west and us-east reloaded, ap-south not yet): references
/// from a reloaded region into ap-south are refused naming it, both ways
/// (ap-south does not know the referrer's kind; it does not know the
/// target's), and neither region writes anything.
async fn references_into_the_region_not_reloaded_yet_are_refused_naming_it(
    eu: &Client,
    us: &Client,
    ap: &Client,
    ap_endpoint: &str,
) {
    ap.create(spec_in("ap-south/project/q", &[])).await.unwrap();
    let rows_before = dump(ap_endpoint).await.unwrap().backrefs.len();

    // A volume (a kind ap-south does not know) belonging to its project.
    let refused = eu
        .create(spec_in("eu-west/volume/v0", &[("project", &["ap-south/project/q"])]))
        .await
        .expect_err("ap-south cannot hold the back-reference of a volume");
    assert_refused_naming(&refused, "ap-south", "kind \"volume\"");
    // A network naming a volume of ap-south, a kind ap-south does not know.
    let refused = us
        .create(network(
            "us-east/network/n0",
            "eu-west/project/p",
            Some("ap-south/volume/x"),
        ))
        .await
        .expect_err("ap-south holds no volume");
    assert_refused_naming(&refused, "ap-south", "kind \"volume\"");

    // Never accepted and then dropped: nothing at either end.
    for (client, name) in [(eu, "eu-west/volume/v0"), (us, "us-east/network/n0")] {
        let got = client.get(name).await.expect_err("not created");
        assert_eq!(code(&got), Some(tonic::Code::NotFound), "{name}: {got}");
    }
    assert_eq!(dump(ap_endpoint).await.unwrap().backrefs.len(), rows_before);
}

/// After the last reload: the creates refused mid-roll are taken, and
/// deleting the two projects cascades across the three regions.
async fn after_the_roll_volumes_are_created_and_cascade_across_regions(
    eu: &Client,
    us: &Client,
    ap: &Client,
    regions: &[(String, String)],
) {
    us.create(spec_in("us-east/volume/v1", &[("project", &["eu-west/project/p"])]))
        .await
        .unwrap();
    ap.create(network(
        "ap-south/network/n1",
        "eu-west/project/p",
        Some("us-east/volume/v1"),
    ))
    .await
    .unwrap();
    eu.create(spec_in("eu-west/volume/v0", &[("project", &["ap-south/project/q"])]))
        .await
        .expect("ap-south knows volumes now");
    ap.create(spec_in("ap-south/volume/x", &[("project", &["eu-west/project/p"])]))
        .await
        .unwrap();
    us.create(network(
        "us-east/network/n0",
        "eu-west/project/p",
        Some("ap-south/volume/x"),
    ))
    .await
    .expect("ap-south holds the volume now");

    let op = delete_and_wait(eu, "eu-west/project/p", true).await;
    assert_eq!(op.state, v1::OperationState::Succeeded as i32, "{op:?}");
    let op = delete_and_wait(ap, "ap-south/project/q", true).await;
    assert_eq!(op.state, v1::OperationState::Succeeded as i32, "{op:?}");
    for (client, name) in [
        (us, "us-east/volume/v1"),
        (ap, "ap-south/network/n1"),
        (ap, "ap-south/volume/x"),
        (us, "us-east/network/n0"),
        (eu, "eu-west/volume/v0"),
    ] {
        wait_gone(client, name).await;
    }
    wait_quiescent_at(regions).await;
    assert_no_violations_at(regions).await;
}

/// Done-when 1 of issue 31 over in-process nodes, each watching its own
/// schema file: the files change one region at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_and_references_added_to_the_files_one_region_at_a_time_are_refused_into_the_last_then_cascade() {
    let dir = tempfile::tempdir().unwrap();
    let c = start_cluster_with(&ROLL, schema_file(dir.path(), BASE)).await;
    let (eu, us, ap) = (c.client("eu-west"), c.client("us-east"), c.client("ap-south"));
    let before = c.node("eu-west").node.schema_version();

    // Not yet a kind anywhere.
    eu.create(spec_in("eu-west/project/p", &[])).await.unwrap();
    let refused = us
        .create(spec_in("us-east/volume/v1", &[("project", &["eu-west/project/p"])]))
        .await
        .expect_err("volume is no kind before the reload");
    assert_eq!(code(&refused), Some(tonic::Code::InvalidArgument), "{refused}");

    // A call answered by each node: its watch is set up (see
    // `a_schema_file_rewritten_in_place_is_picked_up_by_the_watch`).
    for region in ROLL {
        status_versions(&admin(&c.node(region).node.endpoint()).await).await;
    }

    // One region at a time, through its file only.
    for region in ROLL {
        if region == "ap-south" {
            let ap_endpoint = c.node("ap-south").node.endpoint();
            references_into_the_region_not_reloaded_yet_are_refused_naming_it(eu, us, ap, &ap_endpoint).await;
        }
        rewrite(&path_of(dir.path(), region), VOLUMES);
        let node = &c.node(region).node;
        eventually(Duration::from_secs(10), "the watch to reload the schema", || async {
            (node.schema_version() != before).then_some(())
        })
        .await;
        assert_eq!(node.schema_version().label.as_deref(), Some("volumes"), "{region}");
    }
    let after = c.node("eu-west").node.schema_version();

    // Status shows the new version in every region (each node reuses its
    // status for a second).
    let status = admin(&c.node("eu-west").node.endpoint()).await;
    eventually(
        Duration::from_secs(10),
        "every region to show the new version",
        || async {
            let versions = status_versions(&status).await;
            versions
                .iter()
                .all(|(_, v, label)| *v == after.digest && label == "volumes")
                .then_some(())
        },
    )
    .await;

    after_the_roll_volumes_are_created_and_cascade_across_regions(eu, us, ap, &c.endpoints()).await;

    // Each region audited its reload once, by the file watch, with the diff.
    for region in ROLL {
        let entries = reload_entries(&admin(&c.node(region).node.endpoint()).await, region).await;
        let applied: Vec<&v1::AuditEntry> = entries.iter().filter(|e| e.outcome == "ok").collect();
        assert_eq!(applied.len(), 1, "{region}: {entries:#?}");
        assert_eq!(
            (applied[0].who.as_str(), applied[0].via.as_str()),
            ("operator", "file watch")
        );
        assert_eq!(
            applied[0].reason,
            "kinds +volume; refs +network.volume +volume.project; label (none) → volumes"
        );
    }
}

/// Done-when 1 of issue 31 over three `cascade serve` processes, reloaded
/// by SIGHUP one at a time. Each schema file is a symlink into another
/// directory whose target is rewritten: the file watch (of the link's
/// directory) does not see it, so only the signal reloads it.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_and_references_reloaded_by_sighup_one_process_at_a_time_are_refused_into_the_last_then_cascade() {
    let dir = tempfile::tempdir().unwrap();
    let (links, targets) = (dir.path().join("etc"), dir.path().join("versions"));
    std::fs::create_dir_all(&links).unwrap();
    std::fs::create_dir_all(&targets).unwrap();
    let ports = free_ports(ROLL.len());
    let endpoint_of = |i: usize| format!("http://127.0.0.1:{}", ports[i]);
    let mut servers = Vec::new();
    for (i, region) in ROLL.iter().enumerate() {
        let target = targets.join(format!("{region}.toml"));
        std::fs::write(&target, BASE).unwrap();
        let schema = links.join(format!("{region}.toml"));
        std::os::unix::fs::symlink(&target, &schema).unwrap();
        let mut text = format!(
            "region = \"{region}\"\nlisten = \"127.0.0.1:{}\"\ndata_dir = \"{}\"\nschema = \"{}\"\n\n\
             [auth]\nmode = \"none\"\n\n[admin]\ntoken = \"{TOKEN}\"\n\n[deletion]\ntick_ms = 50\n\n[peers]\n",
            ports[i],
            dir.path().join(region).display(),
            schema.display()
        );
        for (j, peer) in ROLL.iter().enumerate().filter(|(j, _)| *j != i) {
            text += &format!("{peer} = \"{}\"\n", endpoint_of(j));
        }
        let config = dir.path().join(format!("{region}-config.toml"));
        std::fs::write(&config, text).unwrap();
        servers.push(spawn_server(&config));
    }
    let regions: Vec<(String, String)> = ROLL
        .iter()
        .enumerate()
        .map(|(i, r)| (r.to_string(), endpoint_of(i)))
        .collect();
    let mut clients = Vec::new();
    for (_, endpoint) in &regions {
        clients.push(Client::connect(endpoint).await.expect("client connects"));
    }
    let (eu, us, ap) = (&clients[0], &clients[1], &clients[2]);
    eu.create(spec_in("eu-west/project/p", &[])).await.unwrap();
    // A process reads its file once more as it starts serving (audited as
    // the file watch's): a call answered by each means that read is done,
    // and the only reload left to come is the signal's.
    for (_, endpoint) in &regions {
        status_versions(&admin(endpoint).await).await;
    }

    for (i, region) in ROLL.iter().enumerate() {
        if *region == "ap-south" {
            references_into_the_region_not_reloaded_yet_are_refused_naming_it(eu, us, ap, &regions[2].1).await;
        }
        std::fs::write(targets.join(format!("{region}.toml")), VOLUMES).unwrap();
        let status = std::process::Command::new("kill")
            .args(["-HUP", &servers[i].pid().to_string()])
            .status()
            .expect("kill(1) runs");
        assert!(status.success(), "kill -HUP: {status}");
        let admin = admin(&regions[i].1).await;
        let entry = eventually(Duration::from_secs(10), "the SIGHUP reload to be audited", || async {
            reload_entries(&admin, region)
                .await
                .into_iter()
                .find(|e| e.outcome == "ok")
        })
        .await;
        assert_eq!(
            (entry.who.as_str(), entry.via.as_str()),
            ("operator", "signal"),
            "{entry:?}"
        );
        assert!(entry.reason.starts_with("kinds +volume;"), "{entry:?}");
    }

    after_the_roll_volumes_are_created_and_cascade_across_regions(eu, us, ap, &regions).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_would_orphan_stored_data_is_refused_with_the_count_and_the_schema_stays() {
    let dir = tempfile::tempdir().unwrap();
    let c = start_cluster_with(&["eu-west"], schema_file(dir.path(), VOLUMES)).await;
    let node = &c.node("eu-west").node;
    let eu = c.client("eu-west");
    let before = node.schema_version();
    eu.create(spec_in("eu-west/project/p", &[])).await.unwrap();
    for i in 0..3 {
        eu.create(spec_in(
            &format!("eu-west/volume/v{i}"),
            &[("project", &["eu-west/project/p"])],
        ))
        .await
        .unwrap();
    }
    eu.create(network(
        "eu-west/network/a",
        "eu-west/project/p",
        Some("eu-west/volume/v0"),
    ))
    .await
    .unwrap();
    eu.create(network(
        "eu-west/network/b",
        "eu-west/project/p",
        Some("eu-west/volume/v1"),
    ))
    .await
    .unwrap();
    eu.create(network("eu-west/network/c", "eu-west/project/p", None))
        .await
        .unwrap();

    // BASE removes the kind volume (3 stored) and network.volume (2 set).
    rewrite(&path_of(dir.path(), "eu-west"), BASE);
    let refused = node.reload_schema().await.expect_err("the reload is refused");
    let ReloadError::Incompatible { reasons, .. } = &refused else {
        panic!("refused for another reason: {refused}");
    };
    assert_eq!(reasons.len(), 2, "{reasons:#?}");
    assert!(
        reasons[0].starts_with("kinds.volume: removed, but 3 stored resources are of kind volume"),
        "{reasons:#?}"
    );
    assert!(
        reasons[1].starts_with("kinds.network.refs.volume: removed, but 2 stored network resources set volume"),
        "{reasons:#?}"
    );

    // The old schema stays, and the node serves with it.
    assert_eq!(node.schema_version(), before);
    eu.create(spec_in("eu-west/volume/v9", &[("project", &["eu-west/project/p"])]))
        .await
        .expect("volume is still a kind");
    let admin = admin(&node.endpoint()).await;
    let versions = status_versions(&admin).await;
    assert_eq!(
        versions,
        [("eu-west".to_owned(), before.digest.clone(), "volumes".to_owned())]
    );
    let entries = reload_entries(&admin, "eu-west").await;
    assert!(
        entries
            .iter()
            .any(|e| e.who == "operator" && e.outcome.starts_with("refused: kinds.volume: removed, but 3")),
        "{entries:#?}"
    );

    // Once nothing stored needs them, the same file is taken.
    for name in ["eu-west/network/a", "eu-west/network/b"] {
        eu.update(network(name, "eu-west/project/p", None), "").await.unwrap();
    }
    for i in [0, 1, 2, 9] {
        delete_and_wait(eu, &format!("eu-west/volume/v{i}"), true).await;
    }
    let outcome = node.reload_schema().await.expect("nothing orphaned now");
    assert!(
        matches!(&outcome, ReloadOutcome::Applied { .. } | ReloadOutcome::Unchanged(_)),
        "{outcome:?}"
    );
    assert_ne!(node.schema_version(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_a_cyclic_and_an_empty_schema_file_are_refused_with_the_line_or_path_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let c = start_cluster_with(&["eu-west"], schema_file(dir.path(), BASE)).await;
    let node = &c.node("eu-west").node;
    let path = path_of(dir.path(), "eu-west");
    let before = node.schema_version();
    let cases: [(&str, &str); 3] = [
        (
            "[kinds.project]\n[kinds.network.refs.project]\nkind = project\n",
            "TOML parse error at line 3",
        ),
        (
            "[kinds.b.refs.holds]\nkind = \"c\"\non_delete = \"block\"\n[kinds.c.refs.back]\nkind = \"b\"\non_delete = \"block\"\n",
            "kinds.b.refs.holds: a cycle of block references (b → c → b)",
        ),
        ("", "kinds: the schema file is empty"),
    ];
    for (text, says) in cases {
        rewrite(&path, text);
        let refused = node.reload_schema().await.expect_err("refused");
        let shown = refused.to_string();
        assert!(matches!(refused, ReloadError::Invalid { .. }), "{shown}");
        assert!(
            shown.starts_with(&path.display().to_string()),
            "names the file: {shown}"
        );
        assert!(shown.contains(says), "{shown} should say {says:?}");
        assert_eq!(node.schema_version(), before, "nothing changes: {shown}");
    }
    // The node serves on with the schema it had.
    c.client("eu-west")
        .create(spec_in("eu-west/project/still", &[]))
        .await
        .expect("the node serves");
    let entries = reload_entries(&admin(&node.endpoint()).await, "eu-west").await;
    for says in [
        "TOML parse error",
        "a cycle of block references",
        "the schema file is empty",
    ] {
        assert!(
            entries
                .iter()
                .any(|e| e.outcome.starts_with("refused: ") && e.outcome.contains(says)),
            "no audited refusal saying {says:?}: {entries:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_file_rewritten_in_place_is_picked_up_by_the_watch() {
    let dir = tempfile::tempdir().unwrap();
    let c = start_cluster_with(&["eu-west"], schema_file(dir.path(), BASE)).await;
    let node = &c.node("eu-west").node;
    let before = node.schema_version();
    // A node reads its file once more as it starts serving: a call
    // answered means the watch is set up, and this change is the watch's.
    let admin = admin(&node.endpoint()).await;
    status_versions(&admin).await;
    rewrite(&path_of(dir.path(), "eu-west"), VOLUMES);
    eventually(Duration::from_secs(10), "the watch to reload the schema", || async {
        (node.schema_version() != before).then_some(())
    })
    .await;
    assert_eq!(node.schema_version().label.as_deref(), Some("volumes"));
    let entries = reload_entries(&admin, "eu-west").await;
    assert!(
        entries.iter().any(|e| e.outcome == "ok" && e.via == "file watch"),
        "{entries:#?}"
    );
    c.client("eu-west")
        .create(spec_in("eu-west/project/p", &[]))
        .await
        .unwrap();
    c.client("eu-west")
        .create(spec_in("eu-west/volume/v", &[("project", &["eu-west/project/p"])]))
        .await
        .expect("the watched change is in force");
}

/// SIGHUP to a real `cascade serve`. Its schema file is a symlink whose
/// target lives in another directory: the watch (of the link's directory)
/// does not see the target change, so only the signal can reload it.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_to_cascade_serve_reloads_the_schema_file() {
    let dir = tempfile::tempdir().unwrap();
    let (links, targets) = (dir.path().join("etc"), dir.path().join("versions"));
    std::fs::create_dir_all(&links).unwrap();
    std::fs::create_dir_all(&targets).unwrap();
    let target = targets.join("schema.toml");
    std::fs::write(&target, BASE).unwrap();
    let schema = links.join("schema.toml");
    std::os::unix::fs::symlink(&target, &schema).unwrap();
    let config = dir.path().join("region.toml");
    std::fs::write(
        &config,
        format!(
            "region = \"{REGION}\"\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nschema = \"{}\"\n\n\
             [auth]\nmode = \"none\"\n\n[admin]\ntoken = \"{TOKEN}\"\n",
            dir.path().join("data").display(),
            schema.display()
        ),
    )
    .unwrap();
    let server = spawn_server(&config);
    let client = Client::connect(&server.endpoint).await.unwrap();
    let admin = admin(&server.endpoint).await;
    let [(_, before, _)] = <[_; 1]>::try_from(status_versions(&admin).await).expect("one region");

    std::fs::write(&target, VOLUMES).unwrap();
    let status = std::process::Command::new("kill")
        .args(["-HUP", &server.pid().to_string()])
        .status()
        .expect("kill(1) runs");
    assert!(status.success(), "kill -HUP: {status}");
    let entry = eventually(Duration::from_secs(10), "the SIGHUP reload to be audited", || async {
        reload_entries(&admin, REGION)
            .await
            .into_iter()
            .find(|e| e.outcome == "ok")
    })
    .await;
    assert_eq!(
        (entry.who.as_str(), entry.via.as_str()),
        ("operator", "signal"),
        "{entry:?}"
    );
    assert!(entry.reason.starts_with("kinds +volume;"), "{entry:?}");
    eventually(Duration::from_secs(10), "status to show the new version", || async {
        let [(_, now, label)] = <[_; 1]>::try_from(status_versions(&admin).await).ok()?;
        (now != before && label == "volumes").then_some(())
    })
    .await;
    client.create(spec("project/p", &[])).await.unwrap();
    client
        .create(spec("volume/v", &[("project", &["project/p"])]))
        .await
        .expect("the reloaded schema is in force");
}

/// A reload lands between two writer steps of a running cascade: one that
/// changes the policy of the reference the cascade walks is refused with
/// the count of running deletions; one that only adds is applied, and the
/// cascade finishes with the invariant checker clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_during_a_ten_thousand_member_cascade_lets_it_finish_clean() {
    const MEMBERS: usize = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let regions = ["eu-west", "us-east", "ap-south"];
    let files = schema_file(dir.path(), BASE);
    let c = start_cluster_with(&regions, |s| {
        files(s);
        // Small steps, so the reload lands mid-cascade.
        s.policy.batch_budget = 20;
    })
    .await;
    let eu = c.client("eu-west");
    eu.create(spec_in("eu-west/project/p", &[])).await.unwrap();
    for (region, share) in [("us-east", MEMBERS / 2), ("ap-south", MEMBERS - MEMBERS / 2)] {
        let ids: Vec<usize> = (0..share).collect();
        for chunk in ids.chunks(1000) {
            let specs = chunk
                .iter()
                .map(|i| {
                    spec_in(
                        &format!("{region}/network/n{i}"),
                        &[("project", &["eu-west/project/p"])],
                    )
                })
                .collect();
            c.client(region).batch_create(specs).await.unwrap();
        }
    }
    let op = eu
        .delete(delete_req("eu-west/project/p", true))
        .await
        .unwrap()
        .operation
        .expect("operation");
    // Under way, and us-east applying its part (the project's tombstone).
    let us_east = c.node("us-east").node.endpoint();
    eventually(
        Duration::from_secs(60),
        "the cascade to be under way in us-east",
        || async {
            let p = eu.get_operation(&op.id, 0).await.ok()?.progress?;
            let applying = !dump(&us_east).await.ok()?.remote_deletions.is_empty();
            (p.deleted >= 100 && applying).then_some(())
        },
    )
    .await;

    // network.project turned to block while networks are being deleted
    // by it: refused, with how many deletions run.
    let policy_change = BASE.replace("on_delete = \"cascade\"", "on_delete = \"block\"");
    rewrite(&path_of(dir.path(), "us-east"), &policy_change);
    let refused = c
        .node("us-east")
        .node
        .reload_schema()
        .await
        .expect_err("refused mid-cascade");
    assert!(
        refused
            .to_string()
            .contains("kinds.network.refs.project: on_delete changes from cascade to block while"),
        "{refused}"
    );

    // A kind added: applied in every region while the cascade runs.
    for region in regions {
        rewrite(&path_of(dir.path(), region), VOLUMES);
        c.node(region)
            .node
            .reload_schema()
            .await
            .unwrap_or_else(|e| panic!("{region}: {e}"));
        assert_eq!(c.node(region).node.schema_version().label.as_deref(), Some("volumes"));
    }
    let mid = eu.get_operation(&op.id, 0).await.unwrap();
    assert!(!mid.done, "the reloads should land mid-cascade: {:?}", mid.progress);

    let done = wait_operation(eu, &op.id).await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    assert_eq!(done.progress.unwrap().deleted, MEMBERS as u64 + 1);
    wait_quiescent(&c).await;
    assert_no_violations(&c).await;
}

#[test]
fn schema_diff_names_what_a_change_removes_and_what_a_reload_checks_against_stored_data() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (dir.path().join("old.toml"), dir.path().join("new.toml"));
    std::fs::write(&old, VOLUMES).unwrap();
    std::fs::write(&new, BASE).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(["schema", "diff"])
        .arg(&old)
        .arg(&new)
        .output()
        .expect("cascade schema diff runs");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "kinds -volume; refs -network.volume; label volumes → (none)",
            "a reload checks against the data each region stores:",
            "  kinds.volume: refused while resources of kind volume are stored",
            "  kinds.network.refs.volume: refused while stored network resources set volume",
        ]
    );
}
