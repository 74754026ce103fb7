//! The README's pictures of the console (issue 30, Done-when 6), taken
//! from the demo a user starts: a cascade in progress (the tour's
//! `eu-west/network/net1`, entered at one member a second so it is seen
//! running) and a stuck one (the demo's project, held by ap-south's
//! router, seed 002's case).
//!
//! With `CASCADE_CONSOLE_SCREENSHOTS=docs/images` the pictures are
//! written as `console-operation.png` and `console-stuck.png` there (a
//! relative directory is the repository's: cargo runs tests in it);
//! without it the test still drives the same pages and checks them.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::browser::Browser;
use crate::support::demo::Demo;

/// The pictures' size (the README shows them at this width).
const WIDTH: u32 = 1200;
const HEIGHT: u32 = 800;

/// The README's pictures stay small enough for a repository.
const MAX_PICTURE_BYTES: u64 = 300 * 1024;

/// Where `name` goes when pictures are asked for.
fn picture(name: &str) -> Option<PathBuf> {
    std::env::var_os("CASCADE_CONSOLE_SCREENSHOTS").map(|dir| PathBuf::from(dir).join(name))
}

async fn take(browser: &mut Browser, name: &str) {
    let Some(path) = picture(name) else { return };
    browser.screenshot_viewport(&path, WIDTH, HEIGHT).await;
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    eprintln!("wrote {} ({size} bytes)", path.display());
    assert!(
        size > 0 && size < MAX_PICTURE_BYTES,
        "{} is {size} bytes (at most {MAX_PICTURE_BYTES})",
        path.display()
    );
}

/// The operation a `cascade -o json delete …` started: its id.
fn started(demo: &Demo, args: &[&str]) -> String {
    let mut all = vec!["-o", "json", "delete"];
    all.extend_from_slice(args);
    let out = demo.cascade_ok(&all);
    let json: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    json["id"]
        .as_str()
        .or_else(|| json["operation"]["id"].as_str())
        .unwrap_or_else(|| panic!("no operation id in {json}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_demo_console_shows_a_cascade_in_progress_and_a_stuck_one_for_the_readme() {
    let Some(mut browser) = Browser::launch("screens::readme_pictures").await else {
        return;
    };
    let demo = tokio::task::spawn_blocking(|| Demo::start(false))
        .await
        .expect("the demo starts");
    let console = demo.console("eu-west").trim_end_matches('/').to_owned();
    browser.goto(&format!("{console}/login?next=/operations")).await;
    browser
        .eval(&format!(
            "document.querySelector('#token').value = {}; document.querySelector('form.login').submit(); true",
            serde_json::to_string(&demo.admin_token).expect("a string")
        ))
        .await;
    browser
        .wait_for(
            "the operations page, signed in",
            Duration::from_secs(20),
            "location.pathname === '/operations' && document.readyState === 'complete'",
        )
        .await;

    // A cascade in progress: one member a second per region.
    let running = started(&demo, &["eu-west/network/net1", "--cascade", "--yes", "--rate", "1"]);
    browser.goto(&format!("{console}/operations/{running}")).await;
    browser
        .wait_for(
            "members deleted while it still runs",
            Duration::from_secs(60),
            "Number(document.querySelector('#count-deleted').textContent) >= 2 && \
             document.querySelector('#state').dataset.state === 'RUNNING'",
        )
        .await;
    assert!(
        browser
            .eval("document.querySelectorAll('li.member').length")
            .await
            .as_u64()
            >= Some(2),
        "the tree shows the members"
    );
    // Held only by its rate, it goes on by itself: not flagged stuck (the
    // first picture was, until explain told a rate from a budget).
    assert_eq!(
        browser.eval("document.querySelector('#stuck') === null").await,
        serde_json::Value::Bool(true),
        "a cascade paced by its rate is flagged stuck"
    );
    take(&mut browser, "console-operation.png").await;
    browser
        .wait_for(
            "the cascade to end SUCCEEDED, live",
            Duration::from_secs(120),
            "document.querySelector('#state').dataset.state === 'SUCCEEDED'",
        )
        .await;

    // A stuck one: the project's cascade reaches the external network,
    // which ap-south's router blocks.
    let stuck = started(
        &demo,
        &["eu-west/project/demo", "--cascade", "--yes", "--allow-blocked"],
    );
    browser.goto(&format!("{console}/operations/{stuck}")).await;
    let network = r#"document.querySelector('li.member[data-name="eu-west/network/ext"]')"#;
    browser
        .wait_for(
            "the external network flagged stuck",
            Duration::from_secs(60),
            &format!("{network}?.classList.contains('stuck') && document.querySelector('#stuck') !== null"),
        )
        .await;
    let held = browser
        .eval(&format!("{network}.querySelector('.reasons').textContent"))
        .await;
    let held = held.as_str().unwrap_or_default();
    for part in ["ap-south/router/edge", "region ap-south", "field gateway_network"] {
        assert!(held.contains(part), "the reason names {part:?}: {held}");
    }
    take(&mut browser, "console-stuck.png").await;
}
