//! The storage engines under a real node: on each engine a node creates,
//! cascades a delete to SUCCEEDED, restarts on the same data directory and
//! reads back what it answered before; the data directory then refuses the
//! other engine. And `cascade serve` takes the engine from its config file,
//! its flag and its environment variable, in that order of precedence.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use cascade_client::Client;
use cascade_core::{RegionId, Schema};
use cascade_node::store::{StorageEngine, ENGINE_MARKER};
use cascade_node::{NodeSettings, RunningNode};
use cascade_proto::v1;
use support::*;
use tokio::net::TcpListener;

const PORTS: usize = 20;

fn settings(data_dir: &Path, engine: StorageEngine) -> NodeSettings {
    let schema = Schema::from_toml(cascade_core::schema::EXAMPLE_SCHEMA).unwrap();
    let mut settings = NodeSettings::new(
        RegionId::parse(REGION).unwrap(),
        Arc::new(schema),
        Some(data_dir.to_owned()),
    );
    settings.engine = engine;
    settings.tick = Duration::from_millis(50);
    settings
}

async fn start(data_dir: &Path, engine: StorageEngine) -> (RunningNode, Client) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let node = RunningNode::start(settings(data_dir, engine), listener)
        .await
        .unwrap_or_else(|e| panic!("{engine} node starts: {e}"));
    let client = Client::connect(&node.endpoint()).await.unwrap();
    (node, client)
}

/// Everything the node shows of its state: its resources, every page.
async fn all_resources(client: &Client) -> Vec<v1::Resource> {
    client
        .list(v1::ListRequest {
            page_size: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .resources
}

async fn create_cascade_restart_and_read(engine: StorageEngine) {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (node, client) = start(&data_dir, engine).await;
    let mut specs = vec![
        spec("project/p", &[]),
        spec("network/doomed", &[("project", &["project/p"])]),
        spec("network/kept", &[("project", &["project/p"])]),
        spec("port/kept-port", &[("network", &["network/kept"])]),
    ];
    specs.extend((0..PORTS).map(|i| spec(&format!("port/p{i}"), &[("network", &["network/doomed"])])));
    client.batch_create(specs).await.unwrap();
    client
        .create(spec(
            "floating_ip/fip",
            &[("project", &["project/p"]), ("port", &["port/p3"])],
        ))
        .await
        .unwrap();

    let done = delete_and_wait(&client, "network/doomed", true).await;
    assert_eq!(
        v1::OperationState::try_from(done.state),
        Ok(v1::OperationState::Succeeded),
        "{done:?}"
    );
    let p = done.progress.unwrap();
    assert_eq!(
        (p.deleted, p.unset, p.pending, p.failed),
        (PORTS as u64 + 1, 1, 0, 0),
        "{p:?}"
    );
    let before = all_resources(&client).await;
    assert_eq!(
        before.len(),
        4,
        "project, kept network and port, floating ip: {before:?}"
    );
    drop(client);
    node.stop().await.unwrap();
    assert_eq!(
        std::fs::read_to_string(data_dir.join(ENGINE_MARKER)).unwrap().trim(),
        engine.name()
    );

    // Restarted on the same directory: the same answers.
    let (node, client) = start(&data_dir, engine).await;
    assert_eq!(all_resources(&client).await, before);
    let after = client.get_operation(&done.id, 1000).await.unwrap();
    assert_eq!(
        after, done,
        "the operation and its outcomes, as answered before the restart"
    );
    wait_gone(&client, "network/doomed").await;
    let fip = client.get(&full("floating_ip/fip")).await.unwrap();
    assert_eq!(state(&fip), v1::ResourceState::Active);
    assert!(targets(&fip, "port").is_empty(), "{fip:?}");
    // And it keeps working: a new resource, a new revision after the old ones.
    let created = client
        .create(spec("port/new", &[("network", &["network/kept"])]))
        .await
        .unwrap();
    assert!(before.iter().all(|r| r.uid != created.uid));
    drop(client);
    node.stop().await.unwrap();

    // The other engine is refused, naming both, and changes nothing.
    let other = StorageEngine::ALL.into_iter().find(|e| *e != engine).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let Err(e) = RunningNode::start(settings(&data_dir, other), listener).await else {
        panic!("a {engine} data_dir opened with {other}");
    };
    let e = e.to_string();
    assert!(
        e.contains(&format!("holds a {engine} database, but the storage engine is {other}"))
            && e.contains(&format!("[storage] engine = \"{engine}\"")),
        "{e}"
    );
    let (node, client) = start(&data_dir, engine).await;
    assert_eq!(all_resources(&client).await.len(), before.len() + 1);
    drop(client);
    node.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_cascade_restart_and_read_on_sled() {
    create_cascade_restart_and_read(StorageEngine::Sled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_cascade_restart_and_read_on_fjall() {
    create_cascade_restart_and_read(StorageEngine::Fjall).await;
}

/// `cascade serve --config <config> <args>` with `env` added (and
/// `CASCADE_STORAGE_ENGINE` unset unless `env` sets it).
fn spawn_serve(config: &Path, args: &[&str], env: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cascade"));
    cmd.args(["serve", "--config"])
        .arg(config)
        .args(args)
        .env_remove("CASCADE_STORAGE_ENGINE")
        .env("CASCADE_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("cascade serve starts")
}

/// Polls every 50 ms for up to 30 s until `done` says so.
fn poll_until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..600 {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

/// The engine a server started with these settings chose: the marker it
/// writes into `data` once its store is open (it prints its address before
/// it opens the store, so that line says nothing yet).
fn engine_chosen(config: &Path, args: &[&str], env: &[(&str, &str)], data: &Path) -> String {
    let mut child = spawn_serve(config, args, env);
    let marker = data.join(ENGINE_MARKER);
    poll_until("the ENGINE marker", || {
        if let Ok(Some(_)) = child.try_wait() {
            let mut stderr = String::new();
            let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr);
            panic!("cascade serve exited: {stderr}");
        }
        marker.exists()
    });
    let _ = child.kill();
    let _ = child.wait();
    std::fs::read_to_string(marker).unwrap().trim().to_owned()
}

/// What a server that must refuse these settings says on stderr.
fn refusal(config: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut child = spawn_serve(config, args, env);
    let mut status = None;
    poll_until("cascade serve to exit", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    assert!(!status.unwrap().success());
    let output = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A case's name (and data directory), the file's engine ("": no
/// `[storage]`), flags, environment, and the engine the server must choose.
type Case = (
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
    &'static str,
);

#[test]
fn serve_takes_the_engine_from_the_file_the_flag_and_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let config = |name: &str, engine: &str| {
        let path = dir.path().join(format!("{name}.toml"));
        let data = dir.path().join(name);
        let storage = if engine.is_empty() {
            String::new()
        } else {
            format!("\n[storage]\nengine = \"{engine}\"\n")
        };
        let text = format!(
            "region = \"{REGION}\"\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[auth]\nmode = \"none\"\n{storage}",
            data.display()
        );
        std::fs::write(&path, text).unwrap();
        (path, data)
    };

    // No [storage]: sled. The file's engine. The environment over the
    // file, the flag over both.
    let cases: [Case; 4] = [
        ("default", "", &[], &[], "sled"),
        ("file", "fjall", &[], &[], "fjall"),
        ("env", "sled", &[], &[("CASCADE_STORAGE_ENGINE", "fjall")], "fjall"),
        (
            "flag",
            "sled",
            &["--storage-engine", "fjall"],
            &[("CASCADE_STORAGE_ENGINE", "sled")],
            "fjall",
        ),
    ];
    for (name, in_file, args, env, expected) in cases {
        let (path, data) = config(name, in_file);
        assert_eq!(engine_chosen(&path, args, env, &data), expected, "{name}");
    }

    // Bad values are refused, naming what is valid.
    let (path, _) = config("bad-file", "rocksdb");
    let e = refusal(&path, &[], &[]);
    assert!(
        e.contains("storage.engine: unknown storage engine \"rocksdb\" (expected one of: sled, fjall, postgres)"),
        "{e}"
    );
    let (path, _) = config("bad-flag", "");
    let e = refusal(&path, &["--storage-engine", "rocks"], &[]);
    assert!(
        e.contains("--storage-engine") && e.contains("expected one of: sled, fjall, postgres"),
        "{e}"
    );

    // A data_dir of one engine refuses the other, naming both.
    let (path, _) = config("file", "sled");
    let e = refusal(&path, &[], &[]);
    assert!(
        e.contains("holds a fjall database, but the storage engine is sled")
            && e.contains("[storage] engine = \"fjall\""),
        "{e}"
    );
}
