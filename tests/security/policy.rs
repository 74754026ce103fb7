//! Issue 27, the policy: each region decides every call on its own
//! resources with its Cedar policy file, takes a rewritten file without a
//! restart, refuses a broken one (keeping the previous policy, saying so
//! in a metric and the log), and answers `CanI` from the owner's live policy.
//!
//! Until the identity layer lands these nodes authenticate nobody: every
//! caller is `Cascade::User::"anonymous"`, which the policies here name.

// Test code: real time for deadlines (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use cascade_client::{AdminClient, ClientError};
use cascade_node::auth::AuthMode;
use cascade_node::NodeSettings;
use cascade_proto::v1;

use crate::support::*;

/// The anonymous caller may read, and nothing else.
const READ_ONLY: &str = r#"
@id("anonymous-reads")
permit (
  principal == Cascade::User::"anonymous",
  action in [Cascade::Action::"get", Cascade::Action::"list", Cascade::Action::"watch"],
  resource
);
"#;

/// READ_ONLY, and the anonymous caller may create projects (not networks).
const READ_AND_CREATE_PROJECTS: &str = r#"
@id("anonymous-reads")
permit (
  principal == Cascade::User::"anonymous",
  action in [Cascade::Action::"get", Cascade::Action::"list", Cascade::Action::"watch"],
  resource
);

@id("anonymous-creates-projects")
permit (principal == Cascade::User::"anonymous", action == Cascade::Action::"create", resource)
when { resource.kind == "project" };
"#;

/// The static token these tests call with: it authenticates the principal
/// `anonymous` the policies above name (a token's principal, not the
/// unauthenticated caller, whom `required` refuses before any policy).
const TOKEN: &str = "policy-test-token-0123456789";
/// SHA-256 of [`TOKEN`], as `printf %s TOKEN | sha256sum` prints it.
const TOKEN_SHA256: &str = "b57c84fd3a8a55ea38b08a36540b11b492a443dd1e2852cfa2b12cdb91b51923";

/// A policy file per region in `dir`, required by every node, and the
/// tokens file that makes [`TOKEN`] the principal `anonymous`.
fn require_policy(s: &mut NodeSettings, dir: &Path) {
    s.auth.mode = AuthMode::Required;
    s.auth.policy_file = Some(policy_path(dir, s.region.as_str()));
    let tokens = dir.join("tokens.toml");
    std::fs::write(
        &tokens,
        format!("[[token]]\nprincipal = \"anonymous\"\ngroups = []\nsha256 = \"{TOKEN_SHA256}\"\n"),
    )
    .unwrap();
    s.auth.tokens_file = Some(tokens);
    s.metrics_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
}

fn policy_path(dir: &Path, region: &str) -> PathBuf {
    dir.join(format!("{region}.cedar"))
}

fn denied_message<T: std::fmt::Debug>(result: Result<T, ClientError>) -> String {
    match result {
        Err(ClientError::Status(s)) if s.code() == tonic::Code::PermissionDenied => s.message().to_owned(),
        other => panic!("expected PERMISSION_DENIED, got {other:?}"),
    }
}

fn metric(metrics: &std::collections::BTreeMap<String, f64>, name: &str) -> f64 {
    metrics.get(name).copied().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_call_changes_nothing_and_a_rewritten_policy_decides_without_a_restart() {
    let files = tempfile::tempdir().unwrap();
    std::fs::write(policy_path(files.path(), REGION), READ_ONLY).unwrap();
    let dir = files.path().to_owned();
    let node = start_node_with(cascade_core::schema::EXAMPLE_SCHEMA, |s| require_policy(s, &dir)).await;
    let client = &node.client.clone().with_token(TOKEN).unwrap();
    let metrics_addr = node.node.metrics_addr().expect("metrics served");

    // Allowed to get, not to create: refused naming the verb, the member
    // and the rule, and nothing is created.
    let message = denied_message(client.create(spec("project/p1", &[])).await);
    assert!(message.contains("create"), "{message}");
    assert!(message.contains("eu-west/project/p1"), "{message}");
    assert!(message.contains("default deny"), "{message}");
    let missing = client.get(&full("project/p1")).await.unwrap_err();
    assert_eq!(code(&missing), Some(tonic::Code::NotFound), "{missing:?}");
    let listed = client
        .list(v1::ListRequest::default())
        .await
        .expect("anonymous may list");
    assert!(listed.resources.is_empty(), "{:?}", listed.resources);
    // A batch is refused whole, naming each member.
    let message = denied_message(
        client
            .batch_create(vec![spec("project/p2", &[]), spec("project/p3", &[])])
            .await,
    );
    assert!(
        message.contains("project/p2") && message.contains("project/p3"),
        "{message}"
    );

    // The file rewritten: the node takes it within its poll, no restart.
    std::fs::write(policy_path(files.path(), REGION), READ_AND_CREATE_PROJECTS).unwrap();
    let created = eventually(
        Duration::from_secs(10),
        "the rewritten policy to allow create",
        || async { client.create(spec("project/p1", &[])).await.ok() },
    )
    .await;
    assert_eq!(created.name, full("project/p1"));
    // Only what the new policy allows: projects, not networks.
    let message = denied_message(client.create(spec("network/n1", &[("project", &["project/p1"])])).await);
    assert!(message.contains("eu-west/network/n1"), "{message}");
    let metrics = scrape(metrics_addr).await;
    assert_eq!(metric(&metrics, "cascade_policy_rules"), 2.0);

    // A broken file: refused (the metric says so), and the previous
    // policy still decides.
    std::fs::write(
        policy_path(files.path(), REGION),
        format!("{READ_AND_CREATE_PROJECTS}\npermit (principal, action, resource"),
    )
    .unwrap();
    eventually(
        Duration::from_secs(10),
        "the broken policy file to be refused",
        || async {
            let metrics = scrape(metrics_addr).await;
            (metric(&metrics, "cascade_policy_file_refused") == 1.0).then_some(())
        },
    )
    .await;
    let metrics = scrape(metrics_addr).await;
    assert!(
        metric(&metrics, "cascade_policy_reloads_total{outcome=\"refused\"}") >= 1.0,
        "{metrics:?}"
    );
    assert_eq!(metric(&metrics, "cascade_policy_rules"), 2.0);
    client
        .create(spec("project/p4", &[]))
        .await
        .expect("the previous policy still allows creating projects");

    // Back to read-only: the refusal clears and creating is refused again.
    std::fs::write(policy_path(files.path(), REGION), READ_ONLY).unwrap();
    eventually(
        Duration::from_secs(10),
        "the read-only policy back in force",
        || async {
            match client.create(spec("project/p5", &[])).await {
                Err(e) if code(&e) == Some(tonic::Code::PermissionDenied) => Some(()),
                // The old policy still allowed it (an earlier try created it).
                Err(e) if code(&e) == Some(tonic::Code::AlreadyExists) => None,
                Err(e) => panic!("unexpected {e:?}"),
                Ok(_) => None,
            }
        },
    )
    .await;
    let metrics = scrape(metrics_addr).await;
    assert_eq!(metric(&metrics, "cascade_policy_file_refused"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_policy_file_is_a_start_error_naming_its_line() {
    let files = tempfile::tempdir().unwrap();
    std::fs::write(
        policy_path(files.path(), REGION),
        "@id(\"ok\")\npermit (principal, action, resource);\npermit (principal, action == Cascade::Action::\"destroy\", resource);\n",
    )
    .unwrap();
    let mut settings = NodeSettings::new(
        cascade_core::RegionId::parse(REGION).unwrap(),
        std::sync::Arc::new(cascade_core::Schema::from_toml(cascade_core::schema::EXAMPLE_SCHEMA).unwrap()),
        None,
    );
    require_policy(&mut settings, files.path());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let error = match cascade_node::RunningNode::start(settings, listener).await {
        Ok(_) => panic!("a node started with a policy naming an unknown action"),
        Err(e) => e.to_string(),
    };
    assert!(error.contains("line 3"), "{error}");
    assert!(error.contains("eu-west.cedar"), "{error}");
}

/// `cascade auth can-i` against `endpoint`: its exit code and stdout.
fn can_i(endpoint: &str, args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(["--server", endpoint, "--token", TOKEN, "auth", "can-i"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("cascade runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn can_i_is_answered_by_the_owners_live_policy() {
    let files = tempfile::tempdir().unwrap();
    std::fs::write(policy_path(files.path(), "eu-west"), READ_ONLY).unwrap();
    std::fs::write(
        policy_path(files.path(), "us-east"),
        format!(
            "{READ_AND_CREATE_PROJECTS}\n@id(\"anonymous-impersonates\")\npermit (principal == Cascade::User::\"anonymous\", action == Cascade::Action::\"admin.impersonate\", resource);\n{}",
            include_str!("../../deploy/auth/policy.cedar")
        ),
    )
    .unwrap();
    let dir = files.path().to_owned();
    let c = start_cluster_with(&["eu-west", "us-east"], |s| require_policy(s, &dir)).await;
    let eu = c.node("eu-west").node.endpoint();
    let admin = AdminClient::connect_with(&eu, None, Some(TOKEN.to_owned()))
        .await
        .unwrap();
    let ask = |verb: &str, name: &str| v1::CanIRequest {
        verb: verb.to_owned(),
        name: name.to_owned(),
        ..Default::default()
    };

    // Asked at eu-west about a us-east resource: us-east's policy answers.
    let yes = admin.can_i(ask("create", "us-east/project/p")).await.unwrap();
    assert_eq!(
        (
            yes.allowed,
            yes.rule.as_str(),
            yes.principal.as_str(),
            yes.region.as_str()
        ),
        (true, "anonymous-creates-projects", "anonymous", "us-east")
    );
    let no = admin.can_i(ask("create", "eu-west/project/p")).await.unwrap();
    assert_eq!(
        (no.allowed, no.rule.as_str(), no.region.as_str()),
        (false, "default deny", "eu-west")
    );
    // Another principal: only with admin.impersonate, which us-east grants
    // the anonymous caller and eu-west does not.
    let as_nina = v1::CanIRequest {
        as_principal: "nina".to_owned(),
        as_groups: vec!["net-admins".to_owned()],
        ..ask("delete", "us-east/port/p1")
    };
    let nina = admin.can_i(as_nina.clone()).await.unwrap();
    assert_eq!(
        (nina.allowed, nina.rule.as_str(), nina.principal.as_str()),
        (false, "net-admins-no-ports", "nina")
    );
    let message = denied_message(
        admin
            .can_i(v1::CanIRequest {
                name: "eu-west/port/p1".to_owned(),
                ..as_nina
            })
            .await,
    );
    assert!(message.contains("admin.impersonate"), "{message}");
    let bad = admin.can_i(ask("destroy", "us-east/port/p1")).await.unwrap_err();
    assert_eq!(code(&bad), Some(tonic::Code::InvalidArgument), "{bad:?}");

    // The command line: kubectl's exit codes (0 yes, 1 no, 2 an error).
    let (status, out) = can_i(&eu, &["create", "us-east/project/p"]);
    assert_eq!(status, 0, "{out}");
    assert!(out.starts_with("yes"), "{out}");
    let (status, out) = can_i(&eu, &["create", "eu-west/project/p", "-o", "json"]);
    assert_eq!(status, 1, "{out}");
    assert!(out.contains("\"rule\": \"default deny\""), "{out}");
    let (status, out) = can_i(
        &eu,
        &["delete", "us-east/network/n1", "--as", "nina", "--group", "net-admins"],
    );
    assert_eq!(status, 0, "{out}");
    assert!(out.contains("net-admins-networks"), "{out}");
    let (status, out) = can_i(&eu, &["destroy", "us-east/port/p1"]);
    assert_eq!(status, 2, "{out}");

    // The live policy: a rewrite changes the answer without a restart.
    std::fs::write(policy_path(files.path(), "eu-west"), READ_AND_CREATE_PROJECTS).unwrap();
    eventually(Duration::from_secs(10), "eu-west's new policy to answer", || async {
        let answer = admin.can_i(ask("create", "eu-west/project/p")).await.unwrap();
        answer.allowed.then_some(())
    })
    .await;
}
