//! A resource's history (`Resources.GetHistory`): on its console page,
//! newest first, with the operation that unset a reference from another
//! region; and the call itself, paged and cut to its limit.

use std::time::Duration;

use cascade_proto::v1;

use crate::browser::Browser;
use crate::support::{delete_req, eventually, spec_in, start_cluster_with, start_node, wait_gone};
use crate::{console_of, with_console};

const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

const PORT: &str = "eu-west/port/history-port";
const GROUP: &str = "us-east/security_group/history-sg";

async fn history(client: &cascade_client::Client, name: &str, page_size: u32, token: &str) -> v1::GetHistoryResponse {
    client
        .raw()
        .get_history(v1::GetHistoryRequest {
            name: name.to_owned(),
            page_size,
            page_token: token.to_owned(),
        })
        .await
        .unwrap_or_else(|e| panic!("GetHistory {name}: {e}"))
        .into_inner()
}

fn kinds(page: &v1::GetHistoryResponse) -> Vec<&'static str> {
    page.events.iter().map(|e| e.kind().as_str_name()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resources_page_lists_its_history_down_to_the_unset_by_another_regions_cascade() {
    let Some(mut browser) = Browser::launch("history::unset_by_cascade").await else {
        return;
    };
    let cluster = start_cluster_with(&REGIONS, with_console).await;
    let eu = cluster.client("eu-west");
    let us = cluster.client("us-east");
    us.create(spec_in("us-east/project/history-pr", &[]))
        .await
        .expect("project");
    us.create(spec_in(GROUP, &[("project", &["us-east/project/history-pr"])]))
        .await
        .expect("security group");
    eu.create(spec_in("eu-west/project/history-pe", &[]))
        .await
        .expect("project");
    eu.create(spec_in(
        "eu-west/network/history-net",
        &[("project", &["eu-west/project/history-pe"])],
    ))
    .await
    .expect("network");
    // Created, then an attribute changed, then a reference added.
    let mut port = spec_in(PORT, &[("network", &["eu-west/network/history-net"])]);
    eu.create(port.clone()).await.expect("port");
    port.attributes.insert("mac".into(), "fa:16:3e:00:00:01".into());
    eu.update(port.clone(), "").await.expect("an attribute");
    port.refs.push(v1::ReferenceField {
        field: "security_groups".into(),
        targets: vec![v1::ObjectRef {
            name: GROUP.into(),
            ..Default::default()
        }],
    });
    eu.update(port, "").await.expect("a reference");
    // us-east deletes the group: its cascade unsets the port's reference.
    let operation = us
        .delete(delete_req(GROUP, true))
        .await
        .expect("delete the group")
        .operation
        .expect("an operation")
        .id;
    let unset = eventually(Duration::from_secs(30), "the port's reference unset", || async {
        let page = history(eu, PORT, 0, "").await;
        (page.events.first().map(|e| e.kind()) == Some(v1::HistoryEventKind::UnsetByCascade)).then_some(page)
    })
    .await;
    assert_eq!(
        kinds(&unset),
        [
            "HISTORY_EVENT_KIND_UNSET_BY_CASCADE",
            "HISTORY_EVENT_KIND_REFERENCE_ADDED",
            "HISTORY_EVENT_KIND_UPDATED",
            "HISTORY_EVENT_KIND_CREATED",
        ]
    );
    assert_eq!(unset.events[0].operation_id, operation);

    // The page, through another region's console: the same events, newest
    // first, the unset linking to the cascade's operation.
    let console = console_of(&cluster, "ap-south");
    browser.goto(&format!("{console}/resources/{PORT}")).await;
    browser
        .wait_for(
            "the history table",
            Duration::from_secs(20),
            "document.querySelector('#history table.history') !== null",
        )
        .await;
    let rows = browser
        .eval(
            "Array.from(document.querySelectorAll('#history tbody tr')).map(r => \
             [r.querySelector('.kind').textContent, r.querySelector('a') ? r.querySelector('a').getAttribute('href') : ''])",
        )
        .await;
    let rows: Vec<(String, String)> = serde_json::from_value(rows).expect("rows");
    let shown: Vec<&str> = rows.iter().map(|(kind, _)| kind.as_str()).collect();
    assert_eq!(shown, ["unset by cascade", "reference added", "updated", "created"]);
    assert_eq!(rows[0].1, format!("/operations/{operation}"));
    assert!(rows[1..].iter().all(|(_, link)| link.is_empty()), "{rows:?}");
    // The link opens the operation's page.
    browser
        .eval("document.querySelector('#history tbody tr a').click(); true")
        .await;
    browser
        .wait_for(
            "the operation's page",
            Duration::from_secs(20),
            &format!("location.pathname === '/operations/{operation}' && document.readyState === 'complete'"),
        )
        .await;

    // Deleted (Get answers NOT_FOUND), its page still tells its story.
    eu.delete(delete_req(PORT, false)).await.expect("delete the port");
    wait_gone(eu, PORT).await;
    browser.goto(&format!("{console}/resources/{PORT}")).await;
    let shown = browser
        .wait_for(
            "the history of a resource that is gone",
            Duration::from_secs(20),
            "document.querySelector('.state-gone') !== null && \
             Array.from(document.querySelectorAll('#history .kind')).map(k => k.textContent)",
        )
        .await;
    let shown: Vec<String> = serde_json::from_value(shown).expect("kinds");
    assert!(
        shown.first().is_some_and(|k| k == "deleted" || k == "soft deleted"),
        "{shown:?}"
    );
    assert!(
        shown.ends_with(&["unset by cascade", "reference added", "updated", "created"].map(String::from)),
        "{shown:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn get_history_pages_newest_first_cuts_a_large_page_and_refuses_a_forged_token() {
    let node = start_node().await;
    let client = &node.client;
    client
        .create(spec_in("eu-west/project/many-changes", &[]))
        .await
        .expect("create");
    let mut spec = spec_in("eu-west/project/many-changes", &[]);
    for i in 0..204 {
        spec.attributes.insert("step".into(), i.to_string());
        client.update(spec.clone(), "").await.expect("update");
    }
    // 205 events: one page of 1,000 is cut to 200, the next holds the rest.
    let first = history(client, "eu-west/project/many-changes", 1_000, "").await;
    assert_eq!(first.events.len(), 200);
    assert!(!first.next_page_token.is_empty());
    let rest = history(client, "eu-west/project/many-changes", 1_000, &first.next_page_token).await;
    assert_eq!(rest.events.len(), 5);
    assert!(rest.next_page_token.is_empty(), "nothing older");
    assert_eq!(rest.compacted_before_revision, 0, "nothing was compacted");
    assert_eq!(kinds(&rest).last(), Some(&"HISTORY_EVENT_KIND_CREATED"));
    let revisions: Vec<u64> = first.events.iter().chain(&rest.events).map(|e| e.revision).collect();
    assert!(revisions.windows(2).all(|w| w[0] > w[1]), "newest first, each once");
    // Pages of three walk the same events.
    let mut walked = Vec::new();
    let mut token = String::new();
    loop {
        let page = history(client, "eu-west/project/many-changes", 3, &token).await;
        assert!(page.events.len() <= 3);
        walked.extend(page.events.iter().map(|e| e.revision));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(walked, revisions);
    // No page size: 50.
    assert_eq!(
        history(client, "eu-west/project/many-changes", 0, "")
            .await
            .events
            .len(),
        50
    );
    let forged = client
        .raw()
        .get_history(v1::GetHistoryRequest {
            name: "eu-west/project/many-changes".into(),
            page_size: 3,
            page_token: "<script>".repeat(20),
        })
        .await
        .expect_err("a token no page gave");
    assert_eq!(forged.code(), tonic::Code::InvalidArgument);
    assert!(forged.message().len() < 300, "{}", forged.message());
}
