//! Issue 23: ExplainDeletion answers within its budget (2 s) with a region
//! stopped, through any node that can answer, naming the region that did
//! not answer and since when its node has not heard from it.

// Test code: real time, to measure how long an answer takes.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use crate::support::*;
use cascade_client::Client;
use cascade_proto::v1;

/// What the issue states as behaviour: the 2 s budget and a margin for the
/// answer to travel (and a test process on a busy machine).
const WITHIN: Duration = Duration::from_secs(3);

const BLOCKERS: usize = 6;

fn by_operation(op: &str) -> v1::ExplainDeletionRequest {
    v1::ExplainDeletionRequest {
        name: String::new(),
        operation_id: op.to_owned(),
    }
}

fn by_name(name: &str) -> v1::ExplainDeletionRequest {
    v1::ExplainDeletionRequest {
        name: name.to_owned(),
        operation_id: String::new(),
    }
}

fn deletion<'a>(e: &'a v1::DeletionExplanation, name: &str) -> Option<&'a v1::ExplainedDeletion> {
    e.deletions
        .iter()
        .find(|d| d.resource.as_ref().is_some_and(|r| r.name == name))
}

/// `cascade ARGS` through `endpoint`: its exit code, stdout (stderr after
/// it, when there is any) and how long it took (the process's start
/// included).
async fn cascade_explain(endpoint: &str, args: &[&str]) -> (Option<i32>, String, Duration) {
    let started = Instant::now();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(["--server", endpoint])
        .args(args)
        .output()
        .await
        .expect("cascade explain runs");
    let took = started.elapsed();
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.stderr.is_empty() {
        text += &format!("\n(stderr) {}", String::from_utf8_lossy(&out.stderr));
    }
    (out.status.code(), text, took)
}

/// ExplainDeletion by operation id, timed.
async fn timed_explain(client: &Client, op: &str) -> (v1::DeletionExplanation, Duration) {
    let started = Instant::now();
    let e = client
        .explain_deletion(by_operation(op))
        .await
        .unwrap_or_else(|e| panic!("explain {op}: {e}"));
    (e, started.elapsed())
}

/// A deletion in eu-west that six `block` referrers in ap-south hold, and
/// that cascaded into us-east; ap-south frozen (SIGSTOP). Asked by
/// operation through eu-west or us-east, ExplainDeletion answers within
/// the budget with what eu-west and us-east hold, names ap-south
/// unreachable with when it was last heard from, and reports its blockers
/// as unknown; the CLI prints it. By name, through a node that forwards
/// it, the owner explains within the same deadline; a name of the frozen
/// region itself is UNAVAILABLE naming it, within the budget too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_answers_within_its_budget_with_a_region_frozen_naming_it_and_since_when() {
    let cluster = ProcCluster::new(&["eu-west", "us-east", "ap-south"], |_| "tick_ms = 50".into());
    let (eu_addr, us_addr) = (cluster.endpoint("eu-west"), cluster.endpoint("us-east"));
    let eu = cluster.client("eu-west").await;
    let us = cluster.client("us-east").await;
    let ap = cluster.client("ap-south").await;

    eu.batch_create(vec![
        spec_in("eu-west/project/p", &[]),
        spec_in("eu-west/network/n", &[("project", &["eu-west/project/p"])]),
    ])
    .await
    .expect("eu-west's project and network");
    // The cascade reaches us-east, where a finalizer keeps the subnet DELETING.
    let mut subnet = spec_in("us-east/subnet/s", &[("network", &["eu-west/network/n"])]);
    subnet.finalizers = vec!["dns".into()];
    us.create(subnet).await.expect("us-east's subnet");
    // Six routers in ap-south use the network as their gateway: `block`.
    let mut ap_specs = vec![spec_in("ap-south/project/q", &[])];
    for i in 0..BLOCKERS {
        ap_specs.push(spec_in(
            &format!("ap-south/router/r{i}"),
            &[
                ("project", &["ap-south/project/q"]),
                ("gateway_network", &["eu-west/network/n"]),
            ],
        ));
    }
    ap.batch_create(ap_specs).await.expect("ap-south's routers");

    let op = eu
        .delete(delete_req("eu-west/project/p", true))
        .await
        .expect("delete accepted")
        .operation
        .expect("an operation")
        .id;
    // Settled: the network blocked by the six routers (live: stuck), the
    // subnet waiting on its finalizer in us-east.
    let before = eventually(
        Duration::from_secs(30),
        "the network blocked by six routers",
        || async {
            let e = eu.explain_deletion(by_operation(&op)).await.ok()?;
            let n = deletion(&e, "eu-west/network/n")?;
            let live = n
                .reasons
                .iter()
                .filter(|r| r.contains(": live, not being deleted"))
                .count();
            (live == BLOCKERS && deletion(&e, "us-east/subnet/s").is_some()).then_some(e)
        },
    )
    .await;
    assert!(
        before.unreachable.is_empty() && before.unreachable_regions.is_empty(),
        "{before:?}"
    );
    assert!(before.stuck, "{before:?}");
    // Both nodes that will be asked have heard from ap-south.
    for endpoint in [&eu_addr, &us_addr] {
        eventually(Duration::from_secs(20), "a last contact with ap-south", || async {
            let (_, status) = crate::support::cascade_status(endpoint).await;
            let contact = status["regions"]
                .as_array()?
                .iter()
                .find(|r| r["region"] == "ap-south")?["last_contact_ms"]
                .as_i64()?;
            (contact > 0).then_some(())
        })
        .await;
    }

    cluster.freeze("ap-south");
    // Every answer comes within the bound and names ap-south; on a loaded
    // machine another region may miss its time too, so the content is
    // checked on an answer that misses ap-south only.
    let measured = std::cell::RefCell::new(Vec::new());
    for (region, client) in [("eu-west", &eu), ("us-east", &us)] {
        let e = eventually(Duration::from_secs(20), "an answer missing ap-south only", || async {
            let (e, took) = timed_explain(client, &op).await;
            println!("ExplainDeletion by operation through {region} with ap-south frozen: {took:?}");
            measured.borrow_mut().push(took);
            assert!(took < WITHIN, "through {region}: {took:?}");
            assert!(
                e.unreachable_regions.iter().any(|r| r == "ap-south"),
                "through {region}: {e:?}"
            );
            let frozen = e
                .unreachable
                .iter()
                .find(|u| u.region == "ap-south")
                .unwrap_or_else(|| panic!("through {region}: {e:?}"));
            assert!(frozen.reason.contains("did not answer within"), "{frozen:?}");
            assert!(
                frozen.last_contact_ms > 0 && frozen.last_contact_ms <= e.time_ms,
                "through {region}: {frozen:?} at {}",
                e.time_ms
            );
            (e.unreachable.len() == 1 && e.unreachable_regions.len() == 1).then_some(e)
        })
        .await;
        // What eu-west and us-east hold is there; ap-south's blockers are unknown.
        let n = deletion(&e, "eu-west/network/n").expect("the network is explained");
        let unknown = n
            .reasons
            .iter()
            .filter(|r| r.contains("(region ap-south, field gateway_network): its region could not be asked"))
            .count();
        assert_eq!(unknown, BLOCKERS, "{n:?}");
        let s = deletion(&e, "us-east/subnet/s").expect("us-east's part is there");
        assert!(s.reasons.iter().any(|r| r.contains("finalizer dns pending")), "{s:?}");
        assert!(deletion(&e, "eu-west/project/p").is_some(), "{e:?}");
    }

    // The CLI, through us-east: by operation, and by name (forwarded to
    // eu-west, which explains within the forwarded deadline).
    for target in [op.as_str(), "eu-west/project/p"] {
        eventually(Duration::from_secs(20), "the CLI to explain", || async {
            let (code, text, took) = cascade_explain(&us_addr, &["explain", target]).await;
            println!("cascade explain {target} through us-east with ap-south frozen: {took:?}\n{text}");
            assert!(matches!(code, Some(0 | 1)), "{code:?}: {text}");
            assert!(took < WITHIN + Duration::from_secs(1), "{took:?}: {text}");
            let mut lines = text.lines().skip(1);
            let header = lines.next().unwrap_or_default();
            assert!(
                header.starts_with("region ap-south did not answer within")
                    && header.contains("; last heard from ")
                    && header.contains(" ago"),
                "{text}"
            );
            let others_answered = !lines.next().unwrap_or_default().starts_with("region ");
            (others_answered && text.contains("└─ eu-west/network/n (via project)")).then_some(())
        })
        .await;
    }
    let (_, json, took) = cascade_explain(&eu_addr, &["-o", "json", "explain", &op]).await;
    println!("cascade -o json explain through eu-west with ap-south frozen: {took:?}");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(json["unreachable"][0]["region"], "ap-south", "{json}");
    assert!(json["unreachable"][0]["last_heard_ago"].is_string(), "{json}");

    // A name of the frozen region: its data cannot be read, so UNAVAILABLE
    // naming it, within the budget.
    let started = Instant::now();
    let refused = eu
        .explain_deletion(by_name("ap-south/router/r0"))
        .await
        .expect_err("the owner is frozen");
    let took = started.elapsed();
    println!("ExplainDeletion of an ap-south name through eu-west with ap-south frozen: {took:?}");
    assert_eq!(refused.code(), Some(tonic::Code::Unavailable), "{refused}");
    assert!(refused.to_string().contains("ap-south"), "{refused}");
    assert!(took < WITHIN, "{took:?}");

    // A client's own shorter deadline bounds the explanation too.
    let mut short = tonic::Request::new(by_operation(&op));
    short.set_timeout(Duration::from_millis(800));
    let mut raw = v1::resources_client::ResourcesClient::connect(eu_addr.clone())
        .await
        .expect("connects");
    let started = Instant::now();
    let e = raw
        .explain_deletion(short)
        .await
        .expect("answered within the client's deadline")
        .into_inner();
    let took = started.elapsed();
    println!("ExplainDeletion with an 800ms client deadline through eu-west with ap-south frozen: {took:?}");
    assert!(took < Duration::from_millis(800), "{took:?}");
    assert_eq!(e.unreachable_regions, ["ap-south"], "{e:?}");

    cluster.thaw("ap-south");
    println!("explain times with ap-south frozen: {:?}", measured.borrow());
    // Thawed, it gives its part again: the routers are live, the network stuck.
    eventually(Duration::from_secs(30), "ap-south to answer again", || async {
        let e = eu.explain_deletion(by_operation(&op)).await.ok()?;
        (e.unreachable.is_empty() && e.stuck).then_some(())
    })
    .await;
}
