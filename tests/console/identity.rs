//! Who the console acts for, over mutual TLS with authentication
//! required: a page needs a token the node accepts (the console has no
//! rights of its own), the sign-in form sets it, a wrong one is refused by
//! the node; and what a resource holds, however hostile, is shown as text
//! (no script of it runs).

use std::time::Duration;

use cascade_client::Client;
use cascade_node::auth::{AuthMode, AuthSettings};
use cascade_tls::DevPki;
use serde_json::Value;

use crate::browser::Browser;
use crate::signed_in::{sha256_hex, submit_sign_in};
use crate::support::{spec_in, start_cluster_tls_with};
use crate::{console_of, with_console};

const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

/// The static token of the tests' one identity.
const TOKEN: &str = "console-test-token-7Hq2";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_page_shows_what_the_callers_token_may_read_and_hostile_values_only_as_text() {
    let Some(mut browser) = Browser::launch("identity::token_and_hostile_values").await else {
        return;
    };
    let files = tempfile::tempdir().expect("a temporary directory");
    let tokens = files.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\nprincipal = \"operator\"\ngroups = []\nsha256 = \"{}\"\n",
            sha256_hex(TOKEN)
        ),
    )
    .expect("the tokens file");
    let pki = DevPki::generate(&REGIONS).expect("a development CA");
    let cluster = start_cluster_tls_with(&REGIONS, &pki, |s| {
        with_console(s);
        s.auth = AuthSettings {
            mode: AuthMode::Required,
            tokens_file: Some(tokens.clone()),
            allow_all_for_tests: true,
            ..AuthSettings::default()
        };
    })
    .await;
    let client = Client::connect_with(&cluster.node("eu-west").node.endpoint(), Some(&pki.client()))
        .await
        .expect("connects")
        .with_token(TOKEN)
        .expect("a token");
    let hostile = format!(
        "<img src=x onerror=\"window.ran = 1\"><script>window.ran = 2</script>{}",
        "&lt;long&gt;".repeat(300)
    );
    let mut project = spec_in("eu-west/project/p", &[]);
    project.attributes.insert("note".into(), hostile.clone());
    client.create(project).await.expect("the project");
    client
        .create(spec_in("us-east/network/n", &[("project", &["eu-west/project/p"])]))
        .await
        .expect("a referrer in another region");

    // HTTPS with the node's certificate, like its API.
    let console = console_of(&cluster, "us-east");
    assert!(console.starts_with("https://"), "{console}");
    let page = "/resources/eu-west/project/p";
    browser.goto(&format!("{console}{page}")).await;
    assert_eq!(
        browser.text("h1").await.as_deref(),
        Some("Sign in"),
        "no token: the node refused the page's call"
    );
    assert_eq!(
        browser.eval("document.body.innerText.includes('window.ran')").await,
        Value::Bool(false),
        "nothing of the resource is shown without a token"
    );

    // A token the node does not accept: the node refuses, not the console.
    submit_sign_in(&mut browser, &console, "not-a-token-of-this-cluster", page).await;
    browser
        .wait_for(
            "a refusal",
            Duration::from_secs(20),
            "document.querySelector('.problem')?.textContent.includes('nauthenticated')",
        )
        .await;

    submit_sign_in(&mut browser, &console, TOKEN, page).await;
    browser
        .wait_for(
            "the resource page",
            Duration::from_secs(20),
            "document.querySelector('h1 code.name')?.textContent === 'eu-west/project/p'",
        )
        .await;
    // The hostile attribute is shown as the text it is; none of it ran.
    let shown = browser
        .eval("document.querySelector('table.attributes td').textContent")
        .await;
    assert_eq!(shown, Value::String(hostile.clone()));
    assert_eq!(
        browser.eval("window.ran === undefined").await,
        Value::Bool(true),
        "a script of the value ran"
    );
    assert_eq!(
        browser
            .eval("document.querySelectorAll('main img, main script').length")
            .await,
        serde_json::json!(0)
    );
    // Its referrer in another region, with its field and policy.
    let referrers = browser
        .eval("Array.from(document.querySelectorAll('table.references tbody tr')).map(r => r.innerText)")
        .await;
    let referrers = referrers.to_string();
    for part in ["us-east/network/n", "project", "cascade"] {
        assert!(referrers.contains(part), "{part} in {referrers}");
    }
}
