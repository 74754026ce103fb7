//! Links between regions heal and tell the truth, through a real
//! fault-injecting proxy (`support::fault_proxy`) on every link: a TLS
//! handshake that is never answered, a silent partition.
//!
//! Why our own checks missed these: every earlier fault test froze or
//! killed a whole process (SIGSTOP, SIGKILL), which resets or stalls TCP
//! itself; nothing sat between the regions to accept a connection and then
//! say nothing, or to drop packets while both ends stay up.

#![allow(clippy::disallowed_methods)]
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::fault_proxy::{Fault, FaultProxy};
use crate::support::{eventually, spec, start_cluster_tls_with, Cluster};
use cascade_client::AdminClient;
use cascade_tls::DevPki;

/// The proxies of a cluster: (dialling region, peer region, proxy).
type Proxies = Arc<Mutex<Vec<(String, String, Arc<FaultProxy>)>>>;

/// A TLS cluster whose every link (each ordered pair of regions) goes
/// through a proxy of its own.
async fn proxied_cluster(regions: &[&str]) -> (Cluster, Proxies) {
    let pki = DevPki::generate(regions).expect("dev pki");
    let proxies: Proxies = Arc::default();
    let made = proxies.clone();
    let cluster = start_cluster_tls_with(regions, &pki, move |settings| {
        let from = settings.region.to_string();
        for (peer, addresses) in settings.peers.iter_mut() {
            *addresses = addresses.clone().map(|addr| {
                let upstream: std::net::SocketAddr =
                    addr.trim_start_matches("https://").parse().expect("a peer address");
                let proxy = tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current().block_on(FaultProxy::start(upstream))
                });
                let proxied = format!("https://{}", proxy.addr());
                made.lock()
                    .unwrap()
                    .push((from.clone(), peer.to_string(), Arc::new(proxy)));
                proxied
            });
        }
    })
    .await;
    (cluster, proxies)
}

fn proxy(proxies: &Proxies, from: &str, to: &str) -> Arc<FaultProxy> {
    proxies
        .lock()
        .unwrap()
        .iter()
        .find(|(f, t, _)| f == from && t == to)
        .map(|(_, _, p)| p.clone())
        .expect("a proxy on that link")
}

/// Whether `from`'s node sees its link to `to` as up (`Admin.GetClusterStatus`,
/// open to every client).
async fn link_up(cluster: &Cluster, from: &str, to: &str) -> Option<bool> {
    let client = AdminClient::connect_with(&cluster.node(from).node.endpoint(), cluster.client_tls.as_ref(), None)
        .await
        .ok()?;
    let status = client.cluster_status().await.ok()?;
    status.regions.iter().find(|r| r.region == to).map(|r| r.link_connected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tls_handshake_never_answered_for_25s_then_answered_the_link_is_back_within_seconds() {
    let (cluster, proxies) = proxied_cluster(&["eu-west", "us-east"]).await;
    let eu = cluster.client("eu-west");
    let us = cluster.client("us-east");
    eu.create(spec("eu-west/project/p", &[])).await.expect("create project");
    us.create(spec("us-east/network/n0", &[("project", &["eu-west/project/p"])]))
        .await
        .expect("a cross-region create before the fault");

    // us-east's dials to eu-west reach a peer that accepts TCP and then
    // never answers the TLS handshake; what was open is reset.
    let link = proxy(&proxies, "us-east", "eu-west");
    link.set(Fault::Tarpit);
    link.reset_all();
    let tarpit_until = Instant::now() + Duration::from_secs(25);
    let mut during = 0;
    while Instant::now() < tarpit_until {
        // Each create needs a Lookup at eu-west: it must fail (the region
        // is unreachable), not hang.
        let asked = Instant::now();
        let r = tokio::time::timeout(
            Duration::from_secs(15),
            us.create(spec(
                &format!("us-east/network/t{during}"),
                &[("project", &["eu-west/project/p"])],
            )),
        )
        .await
        .expect("a create during the tarpit answers within 15 s");
        assert!(r.is_err(), "a create needing the tarpitted region cannot succeed");
        println!(
            "create during the tarpit: {:?} after {:?}",
            r.err().and_then(|e| e.code()),
            asked.elapsed()
        );
        during += 1;
        // The next create waits until the channel has dialled again (each
        // dial is given up after the dial timeout, 3 s): a channel stuck in
        // its first handshake would never dial again.
        let dials = link.accepted();
        eventually(
            Duration::from_secs(15),
            "the channel to dial the tarpitted peer again",
            || async {
                if link.accepted() > dials {
                    return Some(());
                }
                // A call is what makes a lazy channel dial.
                let _ = tokio::time::timeout(Duration::from_millis(200), us.get("eu-west/project/p")).await;
                None
            },
        )
        .await;
    }
    assert!(link.accepted() > 1, "the channel dialled again during the tarpit");

    link.set(Fault::Pass);
    let healed = Instant::now();
    eventually(
        Duration::from_secs(10),
        "a cross-region create after the tarpit",
        || async {
            us.create(spec("us-east/network/after", &[("project", &["eu-west/project/p"])]))
                .await
                .ok()
        },
    )
    .await;
    println!(
        "link back {:?} after the peer answered again ({} dials during the tarpit)",
        healed.elapsed(),
        link.accepted()
    );
    eventually(Duration::from_secs(10), "us-east's link to eu-west up", || async {
        link_up(&cluster, "us-east", "eu-west").await.filter(|up| *up)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_partition_reads_down_in_status_within_the_silence_timeout_and_up_after() {
    let (cluster, proxies) = proxied_cluster(&["eu-west", "us-east"]).await;
    eventually(Duration::from_secs(10), "eu-west's link to us-east up", || async {
        link_up(&cluster, "eu-west", "us-east").await.filter(|up| *up)
    })
    .await;

    // Packets between the two regions vanish both ways; both ends stay up.
    proxy(&proxies, "eu-west", "us-east").set(Fault::Silent);
    proxy(&proxies, "us-east", "eu-west").set(Fault::Silent);
    let started = Instant::now();
    // The silence timeout is 5 s; a status is reused for a second and
    // waits up to 2 s for the region that does not answer.
    eventually(Duration::from_secs(10), "eu-west's link to us-east down", || async {
        link_up(&cluster, "eu-west", "us-east").await.filter(|up| !*up)
    })
    .await;
    println!("link read down {:?} into a silent partition", started.elapsed());
    let partition_ends = started + Duration::from_secs(30);
    tokio::time::sleep_until(partition_ends.into()).await;
    assert_eq!(
        link_up(&cluster, "eu-west", "us-east").await,
        Some(false),
        "still down while the partition lasts"
    );

    proxy(&proxies, "eu-west", "us-east").set(Fault::Pass);
    proxy(&proxies, "us-east", "eu-west").set(Fault::Pass);
    let lifted = Instant::now();
    eventually(
        Duration::from_secs(30),
        "eu-west's link to us-east up again",
        || async { link_up(&cluster, "eu-west", "us-east").await.filter(|up| *up) },
    )
    .await;
    println!("link up {:?} after the partition ended", lifted.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_link_throttled_to_32_kb_s_during_a_5000_member_cascade_closes_no_healthy_connection() {
    let (cluster, proxies) = proxied_cluster(&["eu-west", "us-east"]).await;
    let eu = cluster.client("eu-west");
    let us = cluster.client("us-east");
    eu.create(spec("eu-west/project/big", &[]))
        .await
        .expect("create project");
    const MEMBERS: usize = 5000;
    for chunk in (0..MEMBERS).collect::<Vec<_>>().chunks(1000) {
        let specs = chunk
            .iter()
            .map(|i| {
                spec(
                    &format!("us-east/network/n{i:04}"),
                    &[("project", &["eu-west/project/big"])],
                )
            })
            .collect();
        us.batch_create(specs).await.expect("batch create");
    }
    let before: Vec<(String, String, u64, u64, u64)> = proxies
        .lock()
        .unwrap()
        .iter()
        .map(|(f, t, p)| {
            (
                f.clone(),
                t.clone(),
                p.closed_by_client(),
                p.closed_by_upstream(),
                p.resets_by_proxy(),
            )
        })
        .collect();
    for (_, _, p) in proxies.lock().unwrap().iter() {
        p.set(Fault::Throttle {
            bytes_per_sec: 32 * 1024,
        });
    }
    let started = Instant::now();
    eu.delete(crate::support::delete_req("eu-west/project/big", true))
        .await
        .expect("delete with cascade");
    eventually(
        Duration::from_secs(120),
        "the 5000-member cascade to finish",
        || async {
            match eu.get("eu-west/project/big").await {
                Err(e) if e.code() == Some(tonic::Code::NotFound) => Some(()),
                _ => None,
            }
        },
    )
    .await;
    let took = started.elapsed();
    let mut moved = 0;
    for ((from, to, p), (_, _, by_client, by_upstream, resets)) in proxies.lock().unwrap().iter().zip(&before) {
        moved += p.bytes_to_client() + p.bytes_to_upstream();
        assert_eq!(
            (p.closed_by_client(), p.closed_by_upstream(), p.resets_by_proxy()),
            (*by_client, *by_upstream, *resets),
            "a connection of the {from} -> {to} link was closed while it moved bytes at 32 KB/s"
        );
    }
    println!("{MEMBERS}-member cascade over links throttled to 32 KB/s: {took:?}, {moved} bytes through the proxies, no connection closed");
    let left = us.list(cascade_proto::v1::ListRequest {
        kind: "network".into(),
        ..Default::default()
    });
    let left = left.await.expect("list");
    assert!(
        left.resources.is_empty(),
        "{} networks left in us-east",
        left.resources.len()
    );
}
