//! The writer under load: a client's write during a long cascade waits
//! for at most one work step (`held_writes`), and client writes that queue
//! meanwhile share one flush (`group_commit`). Both count what the writer
//! committed instead of timing it, so they hold on any machine.
//!
//! One test binary for both: each links the whole node, and a binary of
//! its own costs CI a link and a start.

#[path = "../support/mod.rs"]
mod support;

mod group_commit;
mod held_writes;

/// The cascade both tests delete: a project, `network/n` in it, and
/// `ports` ports on the network, created a thousand at a time.
async fn a_network_with_ports(client: &cascade_client::Client, ports: usize) {
    use support::spec;
    client
        .batch_create(vec![
            spec("project/p", &[]),
            spec("network/n", &[("project", &["project/p"])]),
        ])
        .await
        .unwrap();
    for chunk in (0..ports).collect::<Vec<_>>().chunks(1_000) {
        let specs = chunk
            .iter()
            .map(|i| spec(&format!("port/p{i}"), &[("network", &["network/n"])]))
            .collect();
        client.batch_create(specs).await.unwrap();
    }
}
