//! Durability: SIGKILL a real `cascade serve` process in the middle of a
//! 10,000-dependent cascade, restart it on the same data directory, and the
//! deletion completes with nothing else lost. Once per storage engine.

mod support;

use std::time::Duration;

use cascade_client::Client;
use cascade_node::store::StorageEngine;
use cascade_proto::v1;
use support::*;

const PORTS: usize = 10_000;

async fn progress(client: &Client, id: &str) -> v1::Operation {
    client.get_operation(id, 0).await.expect("operation readable")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_cascade_then_restart_finishes_the_deletion_on_sled() {
    sigkill_mid_cascade_then_restart_finishes_the_deletion(StorageEngine::Sled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_cascade_then_restart_finishes_the_deletion_on_fjall() {
    sigkill_mid_cascade_then_restart_finishes_the_deletion(StorageEngine::Fjall).await;
}

async fn sigkill_mid_cascade_then_restart_finishes_the_deletion(engine: StorageEngine) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("region.toml");
    let data_dir = dir.path().join("data");
    std::fs::write(
        &config,
        format!(
            "region = \"{REGION}\"\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n[auth]\nmode = \"none\"\n\n[deletion]\n# small steps, so the kill lands mid-cascade\nbatch_budget = 40\ntick_ms = 50\n\n[storage]\nengine = \"{engine}\"\n",
            data_dir.display()
        ),
    )
    .unwrap();

    let server = spawn_server(&config);
    let client = Client::connect(&server.endpoint).await.unwrap();
    client
        .batch_create(vec![
            spec("project/p", &[]),
            spec("network/doomed", &[("project", &["project/p"])]),
            spec("network/bystander", &[("project", &["project/p"])]),
            spec("port/bystander-port", &[("network", &["network/bystander"])]),
            spec("floating_ip/fip", &[("project", &["project/p"])]),
        ])
        .await
        .unwrap();
    for chunk in (0..PORTS).collect::<Vec<_>>().chunks(1000) {
        let specs = chunk
            .iter()
            .map(|i| spec(&format!("port/p{i}"), &[("network", &["network/doomed"])]))
            .collect();
        client.batch_create(specs).await.unwrap();
    }
    let fip = client
        .update(
            spec(
                "floating_ip/fip",
                &[("project", &["project/p"]), ("port", &["port/p5000"])],
            ),
            "",
        )
        .await
        .unwrap();
    assert_eq!(targets(&fip, "port"), vec!["eu-west/port/p5000"]);

    let op = client
        .delete(delete_req("network/doomed", true))
        .await
        .unwrap()
        .operation
        .expect("operation");

    // Kill as soon as the cascade is visibly under way.
    eventually(Duration::from_secs(60), "the cascade to make progress", || async {
        let p = progress(&client, &op.id).await.progress.unwrap();
        (p.deleted >= 100).then_some(())
    })
    .await;
    drop(client);
    drop(server); // SIGKILL, no chance to flush or finish

    let server = spawn_server(&config);
    let client = Client::connect(&server.endpoint).await.unwrap();
    let after_restart = progress(&client, &op.id).await;
    let p = after_restart.progress.unwrap();
    assert!(
        !after_restart.done && p.deleted < (PORTS as u64 + 1),
        "the kill should land mid-cascade, but the operation was already done: {p:?}"
    );
    assert!(
        p.deleted >= 100,
        "progress acknowledged before the kill survives: {p:?}"
    );

    let done = wait_operation(&client, &op.id).await;
    assert_eq!(
        v1::OperationState::try_from(done.state),
        Ok(v1::OperationState::Succeeded)
    );
    let p = done.progress.unwrap();
    assert_eq!(
        p.deleted,
        PORTS as u64 + 1,
        "every port and the network, each once: {p:?}"
    );
    assert_eq!((p.pending, p.failed), (0, 0));
    assert_eq!(p.unset, 1, "the floating ip, once: {p:?}");

    // The closure is gone, nothing else is.
    wait_gone(&client, "network/doomed").await;
    let ports = client
        .list(v1::ListRequest {
            kind: "port".into(),
            page_size: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    let names: Vec<_> = ports.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, vec!["eu-west/port/bystander-port"]);
    for kept in ["project/p", "network/bystander", "port/bystander-port"] {
        assert_eq!(
            state(&client.get(&full(kept)).await.unwrap()),
            v1::ResourceState::Active,
            "{kept}"
        );
    }
    let fip = client.get(&full("floating_ip/fip")).await.unwrap();
    assert!(targets(&fip, "port").is_empty());
    let deleting = client
        .list(v1::ListRequest {
            state: v1::ResourceState::Deleting as i32,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(deleting.resources.is_empty(), "no deletion left behind");
    // The server ran the engine the file named.
    let marker = std::fs::read_to_string(data_dir.join(cascade_node::store::ENGINE_MARKER)).unwrap();
    assert_eq!(marker.trim(), engine.name());
}
