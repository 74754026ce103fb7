//! Issue 27 end to end, as a user meets it: three regions with mutual TLS,
//! `[auth] mode = "required"`, a static tokens file written with `cascade
//! auth hash-token` (an administrator `admin` in `admins`, a user `alice`
//! in `net-admins`) and the shipped example policy,
//! `deploy/auth/policy.cedar`, loaded by every node from its file. No test
//! authorizer, no allow-all: what the other security tests checked part by
//! part (identity with an allow-all policy, the closure with a test
//! authorizer, the audit with authentication off) is checked whole here.
//!
//! The topology (its own schema: a network may peer with another, and the
//! peering is `unset` when that one goes):
//!
//! ```text
//! eu-west   network/net1, subnet/s0 ─cascade→ net1
//! us-east   port/p1 ─cascade→ net1   (or subnet/s2 ─cascade→ net1)
//! ap-south  subnet/s1 ─cascade→ net1, network/n2 ─peer (unset)→ net1
//! ```

// Test code: poll deadlines are real time (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_client::check::check_cluster_with_schema;
use cascade_client::{AdminClient, Client, ClientError, ClientTls};
use cascade_core::{RegionId, Schema};
use cascade_node::auth::{AuthMode, AuthSettings};
use cascade_node::{NodeEnv, NodeSettings, RunningNode};
use cascade_proto::v1;
use cascade_tls::DevPki;
use tokio::net::TcpListener;

use crate::support::fault_proxy::{Fault, FaultProxy};
use crate::support::{as_region, eventually, peer_as, start_cluster_tls_with, unquiet, Cluster};

const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

const ADMIN_TOKEN: &str = "across-regions-admin-token-0123456789";
const ALICE_TOKEN: &str = "across-regions-alice-token-0123456789";
/// alice's group in the example policy: networks and subnets, not ports.
const NETWORK_GROUP: &str = "net-admins";

/// A network may peer with another one; the peering is cleared (`unset`)
/// when the other goes. Subnets and ports go with their network.
const SCHEMA: &str = r#"
[kinds.network.refs.peer]
kind = "network"
on_delete = "unset"

[kinds.subnet.refs.network]
kind = "network"
on_delete = "cascade"
required = true

[kinds.port.refs.network]
kind = "network"
on_delete = "cascade"
required = true
"#;

const NET1: &str = "eu-west/network/net1";
const S0: &str = "eu-west/subnet/s0";
const P1: &str = "us-east/port/p1";
const S2: &str = "us-east/subnet/s2";
const S1: &str = "ap-south/subnet/s1";
const N2: &str = "ap-south/network/n2";

/// The files every node reads: the tokens (as `cascade auth hash-token`
/// prints their entries) and the shipped example policy.
struct AuthFiles {
    dir: tempfile::TempDir,
}

impl AuthFiles {
    fn write() -> AuthFiles {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut tokens = String::new();
        tokens += &hash_token(ADMIN_TOKEN, "admin", "admins");
        tokens += &hash_token(ALICE_TOKEN, "alice", NETWORK_GROUP);
        std::fs::write(dir.path().join("tokens.toml"), tokens).expect("tokens file");
        std::fs::write(
            dir.path().join("policy.cedar"),
            include_str!("../../deploy/auth/policy.cedar"),
        )
        .expect("policy file");
        AuthFiles { dir }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// What every node of these tests runs with.
    fn apply(&self, s: &mut NodeSettings) {
        s.schema = Arc::new(Schema::from_toml(SCHEMA).expect("the test schema"));
        s.auth = AuthSettings {
            mode: AuthMode::Required,
            tokens_file: Some(self.path("tokens.toml")),
            policy_file: Some(self.path("policy.cedar")),
            ..AuthSettings::default()
        };
    }
}

/// `echo -n TOKEN | cascade auth hash-token --principal P --group G`.
fn hash_token(token: &str, principal: &str, group: &str) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(["auth", "hash-token", "--principal", principal, "--group", group])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cascade runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(token.as_bytes())
        .expect("token written");
    let out = child.wait_with_output().expect("cascade ends");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8") + "\n"
}

/// A region's node as a client reaches it (TLS, a token).
struct Caller {
    resources: Client,
    admin: AdminClient,
}

async fn caller(endpoint: &str, tls: &ClientTls, token: &str) -> Caller {
    Caller {
        resources: Client::connect_with(endpoint, Some(tls))
            .await
            .expect("client connects")
            .with_token(token)
            .expect("a printable token"),
        admin: AdminClient::connect_with(endpoint, Some(tls), Some(token.to_owned()))
            .await
            .expect("admin client connects"),
    }
}

/// Three TLS regions requiring authentication under the example policy.
struct Secured {
    cluster: Cluster,
    pki: DevPki,
    _files: AuthFiles,
}

async fn secured() -> Secured {
    let files = AuthFiles::write();
    let pki = DevPki::generate(&REGIONS).expect("development PKI");
    let cluster = start_cluster_tls_with(&REGIONS, &pki, |s| files.apply(s)).await;
    Secured {
        cluster,
        pki,
        _files: files,
    }
}

impl Secured {
    /// The administrator, calling each region's node.
    async fn admin_in_every_region(&self) -> BTreeMap<&'static str, Caller> {
        let mut admin = BTreeMap::new();
        for region in REGIONS {
            admin.insert(region, self.caller(region, ADMIN_TOKEN).await);
        }
        admin
    }

    fn endpoint(&self, region: &str) -> String {
        self.cluster.node(region).node.endpoint()
    }

    async fn caller(&self, region: &str, token: &str) -> Caller {
        caller(&self.endpoint(region), &self.pki.client(), token).await
    }

    fn endpoints(&self) -> Vec<(String, String)> {
        self.cluster.endpoints()
    }
}

fn spec(name: &str, refs: &[(&str, &str)]) -> v1::ResourceSpec {
    v1::ResourceSpec {
        name: name.to_owned(),
        refs: refs
            .iter()
            .map(|(field, target)| v1::ReferenceField {
                field: (*field).to_owned(),
                targets: vec![v1::ObjectRef {
                    name: (*target).to_owned(),
                    ..Default::default()
                }],
            })
            .collect(),
        ..Default::default()
    }
}

/// net1 with its subnet in eu-west, `us_east` (a port or a subnet on net1)
/// in us-east, a subnet and a peering network in ap-south: each created by
/// the administrator through its own region's node.
async fn topology(admin: &BTreeMap<&str, Caller>, us_east: &str) {
    let create = |region: &str, s: v1::ResourceSpec| {
        let client = admin[region].resources.clone();
        async move {
            let name = s.name.clone();
            client.create(s).await.unwrap_or_else(|e| panic!("create {name}: {e}"))
        }
    };
    create("eu-west", spec(NET1, &[])).await;
    create("eu-west", spec(S0, &[("network", NET1)])).await;
    create("us-east", spec(us_east, &[("network", NET1)])).await;
    create("ap-south", spec(S1, &[("network", NET1)])).await;
    create("ap-south", spec(N2, &[("peer", NET1)])).await;
}

fn cascade_delete(name: &str, dry_run: bool) -> v1::DeleteRequest {
    v1::DeleteRequest {
        name: name.to_owned(),
        cascade: true,
        dry_run,
        requested_by: "across regions test".to_owned(),
        ..Default::default()
    }
}

fn state_of(r: &v1::Resource) -> v1::ResourceState {
    v1::ResourceState::try_from(r.state).unwrap_or(v1::ResourceState::Unspecified)
}

/// Every entry of a region's audit log, oldest first, page after page.
async fn audit_log(admin: &AdminClient) -> Vec<v1::AuditEntry> {
    let mut all = Vec::new();
    let mut token = String::new();
    for _ in 0..1_000 {
        let page = admin
            .list_audit(v1::ListAuditRequest {
                page_size: 50,
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("ListAudit answers");
        all.extend(page.entries);
        token = page.next_page_token;
        if token.is_empty() {
            return all;
        }
    }
    panic!("ListAudit never ended");
}

/// (action, target) of a region's audit entries, as a test expects them.
type Changes = &'static [(&'static str, &'static str)];

/// A listed principal's id, groups and means.
type PrincipalParts = (String, Vec<String>, String);

/// (action, target) of the entries `who` wrote, in the log's order.
fn changes_by<'a>(log: &'a [v1::AuditEntry], who: &str) -> Vec<(&'a str, &'a str)> {
    log.iter()
        .filter(|e| e.who == who)
        .map(|e| (e.action.as_str(), e.target.as_str()))
        .collect()
}

/// A client presenting `region`'s certificate (what Peer calls need).
/// Waits until every region is quiescent (nothing queued, nothing CREATING
/// or DELETING), then runs the invariant checker over TLS until it finds
/// nothing (a last PURGED event may still be on its way for a moment).
async fn assert_quiet_and_clean(pki: &DevPki, endpoints: &[(String, String)]) {
    let identity = as_region(pki, "eu-west");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut why = Vec::new();
        for (region, endpoint) in endpoints {
            match peer_as(endpoint, &identity, region)
                .await
                .dump(v1::DumpRequest {})
                .await
            {
                Ok(d) => why.extend(unquiet(&d.into_inner())),
                Err(e) => why.push(format!("{region}: dump failed: {e}")),
            }
        }
        if why.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "not quiescent after 30 s: {why:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let schema = Schema::from_toml(SCHEMA).expect("the test schema");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let report = check_cluster_with_schema(endpoints, Some(&schema), Some(&identity))
            .await
            .expect("checker over TLS");
        if report.violations.is_empty() {
            assert_eq!(report.regions.len(), endpoints.len(), "every region read");
            return;
        }
        assert!(Instant::now() < deadline, "{:#?}", report.violations);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn assert_gone(client: &Client, names: &[&str]) {
    for name in names {
        eventually(Duration::from_secs(30), &format!("{name} to be purged"), || async {
            match client.get(name).await {
                Err(e) if e.code() == Some(tonic::Code::NotFound) => Some(()),
                _ => None,
            }
        })
        .await;
    }
}

/// Point 1 of issue 27: alice may delete networks but not ports. Her
/// cascade of net1, asked through us-east (forwarded to eu-west, vouched by
/// us-east's certificate), reaches us-east's port: it is refused before
/// anything changes anywhere, naming the port, its region and the verb;
/// the dry run lists the same; can-i says no, for her and for an
/// administrator asking as her; the refusal is in eu-west's audit log and
/// nothing else of hers is anywhere. The administrator's cascade of the
/// same network, through ap-south, then removes everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_may_not_delete_ports_is_refused_a_cascade_reaching_one_and_an_administrator_is_not() {
    let s = secured().await;
    let admin = s.admin_in_every_region().await;
    topology(&admin, P1).await;
    let alice = s.caller("us-east", ALICE_TOKEN).await;
    let port_refused = (
        "us-east".to_owned(),
        P1.to_owned(),
        "delete".to_owned(),
        "net-admins-no-ports".to_owned(),
    );

    // The dry run: the plan, with the port alice may not delete.
    let plan = alice
        .resources
        .delete(cascade_delete(NET1, true))
        .await
        .expect("alice's dry run")
        .plan
        .expect("a plan");
    let denied: Vec<(String, String, String, String)> = plan
        .denied
        .iter()
        .map(|d| (d.region.clone(), d.name.clone(), d.verb.clone(), d.rule.clone()))
        .collect();
    assert_eq!(denied, vec![port_refused.clone()], "{plan:#?}");
    assert_eq!(plan.denied_more, 0);

    // The delete: PERMISSION_DENIED naming the port and its region.
    let refused = alice
        .resources
        .delete(cascade_delete(NET1, false))
        .await
        .expect_err("alice may not delete the port");
    let ClientError::Status(status) = &refused else {
        panic!("a status, got {refused}");
    };
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains(P1) && status.message().contains("delete"),
        "{}",
        status.message()
    );
    let details = cascade_proto::error_details(status).expect("error details");
    assert_eq!(details.reason, v1::ErrorReason::Denied as i32);
    let named: Vec<(String, String, String, String)> = details
        .denied
        .iter()
        .map(|d| (d.region.clone(), d.name.clone(), d.verb.clone(), d.rule.clone()))
        .collect();
    assert_eq!(named, vec![port_refused]);

    // can-i says no: asked by alice, and by the administrator as alice.
    let ask = v1::CanIRequest {
        verb: "delete".to_owned(),
        name: P1.to_owned(),
        ..Default::default()
    };
    let hers = alice.admin.can_i(ask.clone()).await.expect("alice may ask");
    assert_eq!(
        (
            hers.allowed,
            hers.rule.as_str(),
            hers.principal.as_str(),
            hers.region.as_str()
        ),
        (false, "net-admins-no-ports", "alice", "us-east")
    );
    let as_alice = admin["eu-west"]
        .admin
        .can_i(v1::CanIRequest {
            as_principal: "alice".to_owned(),
            as_groups: vec![NETWORK_GROUP.to_owned()],
            ..ask
        })
        .await
        .expect("an administrator may impersonate");
    assert_eq!(
        (as_alice.allowed, as_alice.rule.as_str(), as_alice.principal.as_str()),
        (false, "net-admins-no-ports", "alice")
    );

    // Nothing changed anywhere: every resource ACTIVE where it lives...
    for (region, name) in [
        ("eu-west", NET1),
        ("eu-west", S0),
        ("us-east", P1),
        ("ap-south", S1),
        ("ap-south", N2),
    ] {
        let r = admin[region].resources.get(name).await.expect("still there");
        assert_eq!(state_of(&r), v1::ResourceState::Active, "{name}");
        if name == N2 {
            assert_eq!(r.refs.len(), 1, "n2 still peers with net1: {r:?}");
        }
    }
    // ...and no change of alice's in any audit log: only the refusal, in
    // the region that decided it, naming the region she called through.
    for region in REGIONS {
        let log = audit_log(&admin[region].admin).await;
        let hers: Vec<&v1::AuditEntry> = log.iter().filter(|e| e.who == "alice").collect();
        if region != "eu-west" {
            assert!(hers.is_empty(), "{region}: {hers:#?}");
            continue;
        }
        let [refusal] = hers.as_slice() else {
            panic!("{region}: one refusal of alice's: {hers:#?}");
        };
        assert_eq!(
            (
                refusal.action.as_str(),
                refusal.target.as_str(),
                refusal.through.as_str()
            ),
            ("cascade", NET1, "us-east"),
            "{refusal:#?}"
        );
        assert!(refusal.outcome.starts_with("PermissionDenied"), "{refusal:#?}");
        assert!(refusal.outcome.contains(P1), "{refusal:#?}");
        assert_eq!(refusal.rule, "net-admins-no-ports", "{refusal:#?}");
    }

    // The administrator's cascade of the same network, through ap-south.
    let op = admin["ap-south"]
        .resources
        .delete(cascade_delete(NET1, false))
        .await
        .expect("the administrator's cascade")
        .operation
        .expect("an operation");
    let done = eventually(Duration::from_secs(60), "the cascade to finish", || async {
        let op = admin["ap-south"].resources.get_operation(&op.id, 100).await.ok()?;
        op.done.then_some(op)
    })
    .await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:#?}");
    for (region, names) in [
        ("eu-west", &[NET1, S0][..]),
        ("us-east", &[P1][..]),
        ("ap-south", &[S1][..]),
    ] {
        assert_gone(&admin[region].resources, names).await;
    }
    let n2 = admin["ap-south"].resources.get(N2).await.expect("n2 stays");
    assert!(n2.refs.is_empty(), "its peering is cleared: {n2:?}");
    assert_quiet_and_clean(&s.pki, &s.endpoints()).await;
}

/// Point 2 of issue 27: every change of a three-region cascade is in the
/// audit log of the region that made it, with the caller's principal. alice
/// cascades net1 (no port this time: a subnet in us-east), through us-east.
/// Each region's log holds exactly its creates (the administrator's) and
/// its changes (alice's): eu-west the root's `cascade` and its subnet's,
/// us-east its subnet's, ap-south its subnet's `cascade` and n2's `unset`;
/// each names alice, her group, her token, the node that wrote it, the
/// region it came through and the policy rule that allowed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_of_a_three_region_cascade_is_audited_with_its_principal_in_the_region_that_made_it() {
    let s = secured().await;
    let admin = s.admin_in_every_region().await;
    topology(&admin, S2).await;
    let alice = s.caller("us-east", ALICE_TOKEN).await;
    let op = alice
        .resources
        .delete(cascade_delete(NET1, false))
        .await
        .expect("alice may cascade networks and subnets")
        .operation
        .expect("an operation");
    let done = eventually(Duration::from_secs(60), "the cascade to finish", || async {
        let op = alice.resources.get_operation(&op.id, 100).await.ok()?;
        op.done.then_some(op)
    })
    .await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:#?}");
    assert_quiet_and_clean(&s.pki, &s.endpoints()).await;

    let expected: [(&str, Changes, Changes); 3] = [
        (
            "eu-west",
            &[("create", NET1), ("create", S0)],
            &[("cascade", NET1), ("cascade", S0)],
        ),
        ("us-east", &[("create", S2)], &[("cascade", S2)]),
        (
            "ap-south",
            &[("create", S1), ("create", N2)],
            &[("cascade", S1), ("unset", N2)],
        ),
    ];
    for (region, creates, changes) in expected {
        let log = audit_log(&admin[region].admin).await;
        let node = s.endpoint(region);
        assert_eq!(changes_by(&log, "admin"), creates.to_vec(), "{region}: {log:#?}");
        let mut hers = changes_by(&log, "alice");
        hers.sort();
        let mut changes = changes.to_vec();
        changes.sort();
        assert_eq!(hers, changes, "{region}: {log:#?}");
        assert_eq!(log.len(), creates.len() + changes.len(), "{region}: {log:#?}");
        for e in log.iter().filter(|e| e.who == "alice") {
            // The root was asked for through us-east; each member's change
            // came through the region of the deletion that reached it.
            let through = if e.target == NET1 { "us-east" } else { "eu-west" };
            assert_eq!(
                (
                    e.groups.clone(),
                    e.via.as_str(),
                    e.node.as_str(),
                    e.region.as_str(),
                    e.through.as_str(),
                    e.rule.as_str(),
                    e.outcome.as_str()
                ),
                (
                    vec![NETWORK_GROUP.to_owned()],
                    "token",
                    node.as_str(),
                    region,
                    through,
                    "net-admins-networks",
                    "ok"
                ),
                "{region}: {e:#?}"
            );
        }
        for e in log.iter().filter(|e| e.who == "admin") {
            assert_eq!(
                (e.via.as_str(), e.node.as_str(), e.through.as_str(), e.rule.as_str()),
                ("token", node.as_str(), region, "admins"),
                "{region}: {e:#?}"
            );
        }
    }
}

/// Regions on 127.0.0.1:0 with mutual TLS, each dialling every other
/// through a [`FaultProxy`] (one per ordered pair), requiring
/// authentication under the example policy.
struct Proxied {
    nodes: BTreeMap<String, (RunningNode, tempfile::TempDir)>,
    /// (from, to) → the proxy `from` dials `to` through.
    proxies: BTreeMap<(String, String), FaultProxy>,
    pki: DevPki,
    _files: AuthFiles,
}

impl Proxied {
    async fn start() -> Proxied {
        let files = AuthFiles::write();
        let pki = DevPki::generate(&REGIONS).expect("development PKI");
        let mut listeners = Vec::new();
        for _ in REGIONS {
            listeners.push(TcpListener::bind("127.0.0.1:0").await.expect("bind"));
        }
        let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().expect("address")).collect();
        let mut proxies = BTreeMap::new();
        for (i, from) in REGIONS.iter().enumerate() {
            for (j, to) in REGIONS.iter().enumerate() {
                if i != j {
                    proxies.insert((from.to_string(), to.to_string()), FaultProxy::start(addrs[j]).await);
                }
            }
        }
        let mut nodes = BTreeMap::new();
        for (i, listener) in listeners.into_iter().enumerate() {
            let dir = tempfile::tempdir().expect("temp dir");
            let region = REGIONS[i];
            let mut settings = NodeSettings::new(
                RegionId::parse(region).expect("region"),
                Arc::new(Schema::from_toml(SCHEMA).expect("schema")),
                Some(dir.path().to_owned()),
            );
            settings.tick = Duration::from_millis(50);
            settings.check_interval = Duration::from_millis(500);
            for to in REGIONS.iter().filter(|to| **to != region) {
                let proxy = &proxies[&(region.to_owned(), to.to_string())];
                settings.peers.insert(
                    RegionId::parse(to).expect("region"),
                    format!("https://{}", proxy.addr()).into(),
                );
            }
            settings.tls = Some(pki.node_tls(region).expect("region certificate"));
            files.apply(&mut settings);
            let node = RunningNode::start_with(settings, NodeEnv::default(), listener)
                .await
                .expect("node starts");
            nodes.insert(region.to_owned(), (node, dir));
        }
        Proxied {
            nodes,
            proxies,
            pki,
            _files: files,
        }
    }

    fn endpoint(&self, region: &str) -> String {
        self.nodes[region].0.endpoint()
    }

    fn endpoints(&self) -> Vec<(String, String)> {
        REGIONS.iter().map(|r| (r.to_string(), self.endpoint(r))).collect()
    }

    fn proxy(&self, from: &str, to: &str) -> &FaultProxy {
        &self.proxies[&(from.to_owned(), to.to_owned())]
    }

    async fn caller(&self, region: &str, token: &str) -> Caller {
        caller(&self.endpoint(region), &self.pki.client(), token).await
    }
}

/// A link that heals carries the principal: the administrator's cascade
/// of net1 starts while us-east cannot reach eu-west (its watch of
/// eu-west's events is cut, and so is every new connection), so the port's
/// deletion reaches us-east only after the link comes back. Meanwhile
/// eu-west's listing of what us-east must resync from (`Peer.ListDeleting`,
/// what a watcher reads when its cursor was compacted away) names the
/// administrator too. After the heal the cascade finishes, and us-east's
/// audit names the administrator for the port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cascade_across_a_link_that_heals_acts_for_its_principal_in_the_region_behind_it() {
    let c = Proxied::start().await;
    let mut admin = BTreeMap::new();
    for region in REGIONS {
        admin.insert(region, c.caller(region, ADMIN_TOKEN).await);
    }
    topology(&admin, P1).await;

    // us-east → eu-west cut: nothing of eu-west's reaches us-east. eu-west
    // still reaches us-east (the closure check asks it for its part).
    let link = c.proxy("us-east", "eu-west");
    link.set(Fault::Refuse);
    link.reset_all();
    eventually(Duration::from_secs(10), "us-east to find the link cut", || async {
        (link.refused() > 0).then_some(())
    })
    .await;
    let op = admin["eu-west"]
        .resources
        .delete(cascade_delete(NET1, false))
        .await
        .expect("the administrator's cascade")
        .operation
        .expect("an operation");
    // ap-south's part finishes; the port waits behind the cut link.
    assert_gone(&admin["ap-south"].resources, &[S1]).await;
    let port = admin["us-east"].resources.get(P1).await.expect("the port waits");
    assert_eq!(state_of(&port), v1::ResourceState::Active);

    // What us-east would resync from names the administrator.
    let identity = as_region(&c.pki, "us-east");
    let listing = peer_as(&c.endpoint("eu-west"), &identity, "eu-west")
        .await
        .list_deleting(v1::ListDeletingRequest {
            region: "us-east".to_owned(),
            ..Default::default()
        })
        .await
        .expect("eu-west lists its deletions for us-east")
        .into_inner();
    let listed: Vec<(String, Option<PrincipalParts>)> = listing
        .deleting
        .iter()
        .map(|d| {
            (
                d.resource.as_ref().map(|r| r.name.clone()).unwrap_or_default(),
                d.principal
                    .as_ref()
                    .map(|p| (p.id.clone(), p.groups.clone(), p.via.clone())),
            )
        })
        .collect();
    assert_eq!(
        listed,
        vec![(
            NET1.to_owned(),
            Some(("admin".to_owned(), vec!["admins".to_owned()], "token".to_owned()))
        )]
    );

    // The link heals: the cascade finishes, acting for the administrator.
    link.set(Fault::Pass);
    let done = eventually(Duration::from_secs(60), "the cascade to finish", || async {
        let op = admin["eu-west"].resources.get_operation(&op.id, 100).await.ok()?;
        op.done.then_some(op)
    })
    .await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:#?}");
    assert_gone(&admin["us-east"].resources, &[P1]).await;
    assert_gone(&admin["eu-west"].resources, &[NET1, S0]).await;
    let log = audit_log(&admin["us-east"].admin).await;
    let port_entries: Vec<(&str, &str, &str, &str)> = log
        .iter()
        .filter(|e| e.target == P1)
        .map(|e| (e.action.as_str(), e.who.as_str(), e.via.as_str(), e.rule.as_str()))
        .collect();
    assert_eq!(
        port_entries,
        vec![
            ("create", "admin", "token", "admins"),
            ("cascade", "admin", "token", "admins")
        ],
        "{log:#?}"
    );
    assert_quiet_and_clean(&c.pki, &c.endpoints()).await;
}
