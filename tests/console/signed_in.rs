//! What the tests under authentication share: a token file's hashes, a
//! secured three-region cluster under the shipped policy, and the sign-in
//! form filled in a real browser.

use std::path::Path;
use std::time::Duration;

use cascade_node::auth::{AuthMode, AuthSettings};
use cascade_node::NodeSettings;
use cascade_tls::DevPki;

use crate::browser::Browser;
use crate::support::{start_cluster_tls_with, Cluster};
use crate::with_console;

pub const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

/// The SHA-256 of `text` in hex, as a tokens file holds it.
pub fn sha256_hex(text: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, text.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Three TLS regions requiring a token, under the shipped example policy,
/// each serving its console.
pub struct Secured {
    pub cluster: Cluster,
    pub pki: DevPki,
    _files: tempfile::TempDir,
}

/// [`Secured`], with a static token per `(token, principal, group)`.
pub async fn secured(tokens: &[(&str, &str, &str)]) -> Secured {
    let files = tempfile::tempdir().expect("a temporary directory");
    let mut file = String::new();
    for (token, principal, group) in tokens {
        file += &format!(
            "[[token]]\nprincipal = \"{principal}\"\ngroups = [\"{group}\"]\nsha256 = \"{}\"\n\n",
            sha256_hex(token)
        );
    }
    std::fs::write(files.path().join("tokens.toml"), file).expect("the tokens file");
    std::fs::write(
        files.path().join("policy.cedar"),
        include_str!("../../deploy/auth/policy.cedar"),
    )
    .expect("the policy file");
    let pki = DevPki::generate(&REGIONS).expect("a development CA");
    let dir = files.path().to_owned();
    let cluster = start_cluster_tls_with(&REGIONS, &pki, |s| require_tokens(s, &dir)).await;
    Secured {
        cluster,
        pki,
        _files: files,
    }
}

fn require_tokens(s: &mut NodeSettings, dir: &Path) {
    with_console(s);
    s.auth = AuthSettings {
        mode: AuthMode::Required,
        tokens_file: Some(dir.join("tokens.toml")),
        policy_file: Some(dir.join("policy.cedar")),
        ..AuthSettings::default()
    };
}

/// Fills in and submits the sign-in form, to land on `next`.
pub async fn submit_sign_in(browser: &mut Browser, console: &str, token: &str, next: &str) {
    browser.goto(&format!("{console}/login?next={next}")).await;
    let token = serde_json::to_string(token).expect("a string");
    browser
        .eval(&format!(
            "document.querySelector('#token').value = {token}; document.querySelector('form.login').submit(); true"
        ))
        .await;
}

/// [`submit_sign_in`], then waits for the page `next` to have loaded (a
/// `goto` before it would race the form's redirect).
pub async fn sign_in(browser: &mut Browser, console: &str, token: &str, next: &str) {
    submit_sign_in(browser, console, token, next).await;
    let landed = serde_json::to_string(next).expect("a string");
    browser
        .wait_for(
            "the sign-in to land",
            Duration::from_secs(20),
            &format!("location.pathname === {landed} && document.readyState === 'complete'"),
        )
        .await;
}
