//! The dry run before a delete and its button, over three regions: who
//! sees the button is the API's answer to the caller (the shipped example
//! policy, `deploy/auth/policy.cedar`, decides), a press deletes the
//! cascade bound to the plan shown, a delete posted by hand by a caller
//! who may not is refused by the API and audited, and a plan that changed
//! since the dry run, or a form sent from another page, deletes nothing.
//!
//! The topology (the example schema, `deploy/schemas/neutron.toml`):
//!
//! ```text
//! eu-west   project/p, network/n ─cascade→ p
//! us-east   subnet/s ─cascade→ n
//! ap-south  port/q ─cascade→ n, floating_ip/f ─unset→ q (and ─cascade→ p)
//! ```
//!
//! A cascade from n deletes n, s and q and unsets f's `port`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cascade_client::{AdminClient, Client};
use cascade_proto::v1;
use serde_json::json;

use crate::browser::Browser;
use crate::signed_in::{secured, sign_in, Secured};
use crate::support::{spec_in, start_cluster_with, state, targets};
use crate::{console_of, with_console};

const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

const PROJECT: &str = "eu-west/project/p";
const NETWORK: &str = "eu-west/network/n";
const SUBNET: &str = "us-east/subnet/s";
const PORT: &str = "ap-south/port/q";
const FLOATING_IP: &str = "ap-south/floating_ip/f";

/// In `admins`: may do everything.
const ADMIN_TOKEN: &str = "console-delete-admin-token-4Rt9";
/// alice, in `net-admins`: may cascade networks, may not delete ports.
const ALICE_TOKEN: &str = "console-delete-alice-token-8Vw2";
/// In `readers`: may get, list and watch, nothing else.
const READER_TOKEN: &str = "console-delete-reader-token-1Zx6";
/// The three identities, as the tokens file names them.
const TOKENS: [(&str, &str, &str); 3] = [
    (ADMIN_TOKEN, "admin", "admins"),
    (ALICE_TOKEN, "alice", "net-admins"),
    (READER_TOKEN, "reader", "readers"),
];

impl Secured {
    async fn client(&self, region: &str, token: &str) -> Client {
        Client::connect_with(&self.cluster.node(region).node.endpoint(), Some(&self.pki.client()))
            .await
            .expect("connects")
            .with_token(token)
            .expect("a token")
    }

    async fn admin(&self, region: &str) -> AdminClient {
        AdminClient::connect_with(
            &self.cluster.node(region).node.endpoint(),
            Some(&self.pki.client()),
            Some(ADMIN_TOKEN.to_owned()),
        )
        .await
        .expect("the admin client connects")
    }
}

/// The topology, each resource created through its own region's node.
async fn topology(client: impl Fn(&str) -> Client) {
    for (region, spec) in [
        ("eu-west", spec_in(PROJECT, &[])),
        ("eu-west", spec_in(NETWORK, &[("project", &[PROJECT])])),
        ("us-east", spec_in(SUBNET, &[("network", &[NETWORK])])),
        ("ap-south", spec_in(PORT, &[("network", &[NETWORK])])),
        (
            "ap-south",
            spec_in(FLOATING_IP, &[("project", &[PROJECT]), ("port", &[PORT])]),
        ),
    ] {
        let name = spec.name.clone();
        client(region)
            .create(spec)
            .await
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
    }
}

fn dry_run_of(name: &str) -> v1::DeleteRequest {
    v1::DeleteRequest {
        name: name.to_owned(),
        cascade: true,
        dry_run: true,
        requested_by: "console delete test".to_owned(),
        ..Default::default()
    }
}

fn region_of(name: &str) -> String {
    name.split('/').next().unwrap_or_default().to_owned()
}

/// Region → [deleted, unset, blocked] of an API plan, each member once.
fn plan_counts(plan: &v1::Plan) -> BTreeMap<String, [u64; 3]> {
    let mut members: BTreeMap<String, [std::collections::BTreeSet<String>; 3]> = BTreeMap::new();
    for r in &plan.deleted {
        members.entry(region_of(&r.name)).or_default()[0].insert(r.name.clone());
    }
    for u in &plan.unset {
        let name = u.resource.as_ref().map(|r| r.name.clone()).unwrap_or_default();
        members.entry(region_of(&name)).or_default()[1].insert(format!("{name} {}", u.field));
    }
    for b in &plan.blocked {
        let name = b.resource.as_ref().map(|r| r.name.clone()).unwrap_or_default();
        members.entry(region_of(&name)).or_default()[2].insert(name);
    }
    members
        .into_iter()
        .map(|(region, sets)| (region, sets.map(|s| s.len() as u64)))
        .collect()
}

/// Region → [deleted, unset, blocked], as the page's table shows them.
async fn shown_counts(browser: &mut Browser) -> BTreeMap<String, [u64; 3]> {
    let rows = browser
        .eval(
            "Array.from(document.querySelectorAll('#plan-regions tbody tr')).map(r => [r.dataset.region, \
             ['deleted', 'unset', 'blocked'].map(k => Number(r.querySelector(`[data-count=${k}]`).textContent))])",
        )
        .await;
    let rows: Vec<(String, [u64; 3])> = serde_json::from_value(rows.clone()).unwrap_or_else(|e| panic!("{e}: {rows}"));
    rows.into_iter().collect()
}

/// A POST of the delete form made by hand from the open page (not its
/// button): the caller's own cookie and this console's origin, so only
/// the API can refuse it. Its status and the page it answered.
async fn post_by_hand(browser: &mut Browser, path: &str, plan: &str) -> (u64, String) {
    let call = format!(
        "(async () => {{ const r = await fetch({path}, {{ method: 'POST', \
         headers: {{ 'content-type': 'application/x-www-form-urlencoded' }}, \
         body: 'plan=' + encodeURIComponent({plan}) }}); return [r.status, await r.text()]; }})()",
        path = json!(path),
        plan = json!(plan),
    );
    let answer = browser.eval(&call).await;
    let status = answer[0].as_u64().unwrap_or_else(|| panic!("no status: {answer}"));
    (status, answer[1].as_str().unwrap_or_default().to_owned())
}

async fn assert_still_there(client: &Client, names: &[&str]) {
    for name in names {
        let r = client
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{name} is still there: {e}"));
        assert_eq!(state(&r), v1::ResourceState::Active, "{name}: {r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_caller_who_may_delete_sees_the_plan_and_the_button_whose_press_deletes_the_cascade() {
    let Some(mut browser) = Browser::launch("delete::press_deletes").await else {
        return;
    };
    let secured = secured(&TOKENS).await;
    let mut admins = BTreeMap::new();
    for region in REGIONS {
        admins.insert(region, secured.client(region, ADMIN_TOKEN).await);
    }
    topology(|region| admins[region].clone()).await;
    let api_plan = admins["us-east"]
        .delete(dry_run_of(NETWORK))
        .await
        .expect("the administrator's dry run")
        .plan
        .expect("a plan");
    assert!(!api_plan.token.is_empty(), "{api_plan:?}");

    // Through another region's node than the network's.
    let console = console_of(&secured.cluster, "us-east");
    sign_in(&mut browser, &console, ADMIN_TOKEN, "/operations").await;
    // The resource page links to the dry run.
    browser.goto(&format!("{console}/resources/{NETWORK}")).await;
    let opened = Instant::now();
    browser
        .eval("document.querySelector('#delete-link').click(); true")
        .await;
    browser
        .wait_for(
            "the dry run's page",
            Duration::from_secs(20),
            "document.querySelector('#plan-regions')",
        )
        .await;
    eprintln!("the dry run's page loaded in {:?}", opened.elapsed());
    browser.screenshot("delete-dry-run").await;
    assert_eq!(
        browser.eval("location.pathname").await,
        json!(format!("/resources/{NETWORK}/delete"))
    );
    // The API's plan, region by region, its size and its token.
    let expected = plan_counts(&api_plan);
    assert_eq!(
        expected,
        BTreeMap::from([
            ("ap-south".to_owned(), [1, 1, 0]),
            ("eu-west".to_owned(), [1, 0, 0]),
            ("us-east".to_owned(), [1, 0, 0]),
        ]),
        "the topology's plan: {api_plan:?}"
    );
    assert_eq!(shown_counts(&mut browser).await, expected);
    assert_eq!(
        browser.text("#plan-members").await.as_deref(),
        Some(api_plan.members.to_string().as_str())
    );
    assert_eq!(
        browser.text("#plan-token").await.as_deref(),
        Some(api_plan.token.as_str())
    );
    for name in [NETWORK, SUBNET, PORT] {
        let selector = format!("li.member[data-name='{name}'][data-action='delete']");
        assert_eq!(
            browser
                .eval(&format!("document.querySelector({}) !== null", json!(selector)))
                .await,
            json!(true),
            "{name} listed as deleted"
        );
    }
    let unset = browser
        .text(&format!(
            "li.member[data-name='{FLOATING_IP}'][data-action='unset'] .field"
        ))
        .await;
    assert_eq!(unset.as_deref(), Some("field port"));

    // The press: the operation's page, followed to its end.
    let pressed = Instant::now();
    browser
        .eval("document.querySelector('#delete-button').click(); true")
        .await;
    let id = browser
        .wait_for(
            "the operation's page",
            Duration::from_secs(20),
            "location.pathname.startsWith('/operations/') && document.querySelector('#operation-id')?.textContent",
        )
        .await;
    let id = id.as_str().expect("an operation id").to_owned();
    browser
        .wait_for(
            "the operation to succeed on its page",
            Duration::from_secs(60),
            "document.querySelector('#state')?.dataset.state === 'SUCCEEDED'",
        )
        .await;
    eprintln!(
        "pressed, the operation page showed SUCCEEDED after {:?}",
        pressed.elapsed()
    );
    let op = admins["eu-west"].get_operation(&id, 100).await.expect("the operation");
    assert_eq!(op.root.as_ref().map(|r| r.name.as_str()), Some(NETWORK));
    assert!(op.cascade, "{op:?}");
    assert_eq!(op.state(), v1::OperationState::Succeeded, "{op:?}");
    // Gone through the API, in every region; the floating IP lost its port.
    for name in [NETWORK, SUBNET, PORT] {
        let e = admins[region_of(name).as_str()].get(name).await.expect_err("deleted");
        assert_eq!(e.code(), Some(tonic::Code::NotFound), "{name}: {e}");
    }
    let f = admins["ap-south"]
        .get(FLOATING_IP)
        .await
        .expect("the floating IP stays");
    assert!(targets(&f, "port").is_empty(), "{f:?}");
    assert_still_there(&admins["eu-west"], &[PROJECT]).await;

    // Its dry run now: the API's NOT_FOUND on the page, and no button.
    browser.goto(&format!("{console}/resources/{NETWORK}/delete")).await;
    let gone = browser.text("#refusal").await.unwrap_or_default();
    assert!(gone.starts_with("NotFound"), "{gone}");
    assert_eq!(
        browser
            .eval("document.querySelector('#delete-button, #plan-regions') === null")
            .await,
        json!(true)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_caller_who_may_not_delete_sees_no_button_and_a_delete_posted_by_hand_is_refused_by_the_api_and_audited() {
    let Some(mut browser) = Browser::launch("delete::refused_by_the_api").await else {
        return;
    };
    let secured = secured(&TOKENS).await;
    let mut admins = BTreeMap::new();
    for region in REGIONS {
        admins.insert(region, secured.client(region, ADMIN_TOKEN).await);
    }
    topology(|region| admins[region].clone()).await;
    let audit = secured.admin("eu-west").await;
    let refusals_of = |who: &'static str| {
        let audit = audit.clone();
        async move {
            audit
                .list_audit(v1::ListAuditRequest {
                    region: "eu-west".into(),
                    resource: NETWORK.into(),
                    action: "cascade".into(),
                    page_size: 100,
                    ..Default::default()
                })
                .await
                .expect("ListAudit answers")
                .entries
                .into_iter()
                .filter(|e| e.who == who)
                .collect::<Vec<_>>()
        }
    };
    let console = console_of(&secured.cluster, "us-east");
    let page = format!("/resources/{NETWORK}/delete");

    // alice may start a cascade from a network, not delete its port: the
    // dry run answers her, naming the port, and the page has no button.
    sign_in(&mut browser, &console, ALICE_TOKEN, "/operations").await;
    browser.goto(&format!("{console}{page}")).await;
    browser
        .wait_for(
            "alice's dry run",
            Duration::from_secs(20),
            "document.querySelector('#plan-regions')",
        )
        .await;
    browser.screenshot("delete-not-allowed").await;
    assert_eq!(
        browser
            .eval("document.querySelector('#delete-button, #delete-form') === null")
            .await,
        json!(true),
        "a button for a caller the API would refuse"
    );
    let why = browser.text("#no-delete").await.unwrap_or_default();
    assert!(why.contains("may not delete"), "{why}");
    let denied = browser
        .text(&format!("#denied li[data-name='{PORT}']"))
        .await
        .unwrap_or_else(|| panic!("the port is not named as refused"));
    assert!(
        denied.contains("delete") && denied.contains("net-admins-no-ports"),
        "{denied}"
    );
    let token = browser.text("#plan-token").await.expect("her dry run's token");

    // Her delete posted by hand, with her cookie and the plan: the
    // console lets it through and the API refuses it.
    assert!(refusals_of("alice").await.is_empty());
    let (status, answer) = post_by_hand(&mut browser, &page, &token).await;
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("PermissionDenied"), "{answer}");
    assert!(answer.contains(PORT), "{answer}");
    assert!(answer.contains("Nothing was deleted."), "{answer}");
    let [refusal]: [v1::AuditEntry; 1] = refusals_of("alice")
        .await
        .try_into()
        .unwrap_or_else(|log: Vec<v1::AuditEntry>| panic!("one refusal of alice's in eu-west's audit log: {log:#?}"));
    assert!(refusal.outcome.starts_with("PermissionDenied"), "{refusal:#?}");
    assert!(refusal.outcome.contains(PORT), "{refusal:#?}");
    // Through the console's node, as its caller.
    assert_eq!(refusal.through, "us-east", "{refusal:#?}");

    // A reader may not even plan it: the API refuses the dry run (it is
    // authorized as the delete is), the page says so, and has no button.
    sign_in(&mut browser, &console, READER_TOKEN, "/operations").await;
    browser.goto(&format!("{console}{page}")).await;
    let refused = browser
        .wait_for(
            "the reader's refusal",
            Duration::from_secs(20),
            "document.querySelector('#refusal')?.textContent",
        )
        .await;
    assert!(
        refused.as_str().is_some_and(|r| r.contains("PermissionDenied")),
        "{refused}"
    );
    assert_eq!(
        browser
            .eval("document.querySelector('#delete-button, #delete-form, #plan-regions') === null")
            .await,
        json!(true)
    );
    let before = refusals_of("reader").await.len();
    assert!(before >= 1, "the refused dry run is audited");
    let (status, answer) = post_by_hand(&mut browser, &page, &token).await;
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("PermissionDenied"), "{answer}");
    let after = refusals_of("reader").await;
    assert_eq!(after.len(), before + 1, "{after:#?}");
    assert!(
        after.iter().all(|e| e.outcome.starts_with("PermissionDenied")),
        "{after:#?}"
    );

    // Nothing of it was deleted, in any region.
    for name in [PROJECT, NETWORK, SUBNET, PORT, FLOATING_IP] {
        assert_still_there(&admins[region_of(name).as_str()], &[name]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delete_sent_from_another_page_or_after_the_plan_changed_deletes_nothing() {
    let Some(mut browser) = Browser::launch("delete::plan_changed").await else {
        return;
    };
    // Authentication off: anyone may delete, so only the console's own
    // checks stand between another site's form and a delete.
    let cluster = start_cluster_with(&REGIONS, with_console).await;
    topology(|region| cluster.client(region).clone()).await;
    let console = console_of(&cluster, "ap-south");
    let page = format!("{console}/resources/{NETWORK}/delete");
    browser.goto(&page).await;
    browser
        .wait_for(
            "the dry run's button",
            Duration::from_secs(20),
            "document.querySelector('#delete-button')",
        )
        .await;
    let token = browser.text("#plan-token").await.expect("a plan token");

    // The same form, sent from a page that is not the console's: refused
    // by the console before the API is asked.
    browser.goto("about:blank").await;
    browser
        .eval(&format!(
            "const f = document.createElement('form'); f.method = 'post'; f.action = {action}; \
             const i = document.createElement('input'); i.type = 'hidden'; i.name = 'plan'; i.value = {token}; \
             f.appendChild(i); document.body.appendChild(f); f.submit(); true",
            action = json!(page),
            token = json!(token),
        ))
        .await;
    let refused = browser
        .wait_for(
            "the console's refusal",
            Duration::from_secs(20),
            "document.querySelector('h1')?.textContent === 'Refused' && document.querySelector('.problem')?.textContent",
        )
        .await;
    assert!(
        refused
            .as_str()
            .is_some_and(|r| r.contains("not sent from a page of this console")),
        "{refused}"
    );
    assert_still_there(cluster.client("eu-west"), &[NETWORK]).await;

    // The dry run again, then a new dependent in another region before the press.
    browser.goto(&page).await;
    browser
        .wait_for(
            "the dry run's button",
            Duration::from_secs(20),
            "document.querySelector('#delete-button')",
        )
        .await;
    let late = "us-east/port/late";
    cluster
        .client("us-east")
        .create(spec_in(late, &[("network", &[NETWORK])]))
        .await
        .expect("a new port on the network");
    browser
        .eval("document.querySelector('#delete-button').click(); true")
        .await;
    let heading = browser
        .wait_for(
            "the refusal of the changed plan",
            Duration::from_secs(20),
            "document.querySelector('#refusal') && document.querySelector('h1').textContent",
        )
        .await;
    browser.screenshot("delete-plan-changed").await;
    assert_eq!(heading, json!("Not deleted: the plan changed"));
    let refusal = browser.text("#refusal").await.unwrap_or_default();
    assert!(refusal.starts_with("Aborted"), "{refusal}");
    let change = browser
        .eval(&format!(
            "document.querySelector({})?.innerText ?? null",
            json!(format!("#plan-changes tr[data-name='{late}']"))
        ))
        .await;
    let change = change
        .as_str()
        .unwrap_or_else(|| panic!("{late} is not named as a change"));
    assert!(change.contains("added") && change.contains("delete"), "{change}");
    assert_eq!(
        browser.text("#nothing-deleted").await.as_deref(),
        Some("Nothing was deleted.")
    );
    assert_still_there(cluster.client("eu-west"), &[PROJECT, NETWORK]).await;
    assert_still_there(cluster.client("us-east"), &[SUBNET, late]).await;
    assert_still_there(cluster.client("ap-south"), &[PORT, FLOATING_IP]).await;
}
