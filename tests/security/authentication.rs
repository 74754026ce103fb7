//! Issue 27, authentication: with `[auth] mode = "required"` every call to
//! Resources and Admin is authenticated (a static token, a bearer JWT, a
//! client certificate) or refused UNAUTHENTICATED without changing
//! anything; regions are never principals, and only a region certificate
//! of the cluster may vouch for a caller.
//!
//! The policy engine is another step's: these nodes allow every
//! authenticated caller everything (`allow_all_for_tests`).

#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use cascade_client::ClientTls;
use cascade_node::auth::{AuthMode, AuthSettings, JwtSettings, RateSettings};
use cascade_proto::v1;
use cascade_proto::v1::admin_client::AdminClient;
use cascade_proto::v1::peer_client::PeerClient;
use cascade_proto::v1::resources_client::ResourcesClient;
use cascade_tls::DevPki;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use proptest::strategy::{Strategy, ValueTree};
use ring::signature::{Ed25519KeyPair, KeyPair};
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, BinaryMetadataKey, BinaryMetadataValue};
use tonic::transport::Channel;
use tonic::{Code, Request};

use crate::support::{full, spec, start_cluster_tls_with, Cluster};

const ISSUER: &str = "https://idp.example";
const AUDIENCE: &str = "cascade";
const CI_TOKEN: &str = "ci-token-0123456789abcdef";

/// An Ed25519 signing key and its JWK.
struct SigningKey {
    pkcs8: Vec<u8>,
    public: Vec<u8>,
}

impl SigningKey {
    fn new() -> Self {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap().as_ref().to_vec();
        let public = Ed25519KeyPair::from_pkcs8(&pkcs8)
            .unwrap()
            .public_key()
            .as_ref()
            .to_vec();
        SigningKey { pkcs8, public }
    }

    fn jwk(&self, kid: &str) -> String {
        format!(
            r#"{{"kty":"OKP","crv":"Ed25519","kid":"{kid}","x":"{}"}}"#,
            URL_SAFE_NO_PAD.encode(&self.public)
        )
    }

    fn sign(&self, kid: &str, claims: &serde_json::Value) -> String {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(kid.to_owned());
        jsonwebtoken::encode(&header, claims, &EncodingKey::from_ed_der(&self.pkcs8)).unwrap()
    }
}

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn claims(sub: &str) -> serde_json::Value {
    serde_json::json!({
        "sub": sub,
        "iss": ISSUER,
        "aud": AUDIENCE,
        "exp": now_s() + 600,
        "nbf": now_s() - 60,
        "groups": ["net-admins"],
    })
}

fn sha256_hex(text: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, text.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A two-region TLS cluster whose nodes require authentication: a tokens
/// file (`ci-bot`), a JWKS file (kid `k1`) and client certificates.
struct Secured {
    cluster: Cluster,
    pki: DevPki,
    key: SigningKey,
    _files: tempfile::TempDir,
}

const REGIONS: [&str; 2] = ["eu-west", "us-east"];

async fn secured() -> Secured {
    secured_with(None, None).await
}

/// `client_ca`: the PEM of a CA for client certificates (`[auth] client_ca`).
async fn secured_with(rate: Option<RateSettings>, client_ca: Option<&str>) -> Secured {
    let files = tempfile::tempdir().unwrap();
    let client_ca = client_ca.map(|pem| {
        let path = files.path().join("clients-ca.pem");
        std::fs::write(&path, pem).unwrap();
        path
    });
    let key = SigningKey::new();
    let jwks = files.path().join("jwks.json");
    std::fs::write(&jwks, format!(r#"{{"keys":[{}]}}"#, key.jwk("k1"))).unwrap();
    let tokens = files.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\nprincipal = \"ci-bot\"\ngroups = [\"deployers\"]\nsha256 = \"{}\"\n",
            sha256_hex(CI_TOKEN)
        ),
    )
    .unwrap();
    let pki = DevPki::generate(&REGIONS).unwrap();
    let cluster = start_cluster_tls_with(&REGIONS, &pki, |s| {
        s.auth = AuthSettings {
            mode: AuthMode::Required,
            client_certificates: true,
            tokens_file: Some(tokens.clone()),
            jwt: Some(JwtSettings {
                jwks_file: jwks.clone(),
                issuer: ISSUER.to_owned(),
                audience: AUDIENCE.to_owned(),
                groups_claim: "groups".to_owned(),
                leeway: Duration::from_secs(5),
            }),
            allow_all_for_tests: true,
            rate,
            client_ca: client_ca.clone(),
            ..AuthSettings::default()
        };
    })
    .await;
    Secured {
        cluster,
        pki,
        key,
        _files: files,
    }
}

impl Secured {
    /// A raw Resources client of `region`'s node presenting `identity`.
    async fn client(&self, region: &str, identity: Option<(String, String)>) -> ResourcesClient<Channel> {
        ResourcesClient::new(self.channel(region, identity).await)
    }

    /// A connection to `region`'s node presenting `identity` (its TLS
    /// handshake succeeds whoever issued the certificate).
    async fn channel(&self, region: &str, identity: Option<(String, String)>) -> Channel {
        let tls = ClientTls {
            identity,
            ..self.pki.client()
        };
        let endpoint = self.cluster.node(region).node.endpoint();
        cascade_client::client::connect_channel(&endpoint, Some(&tls), None)
            .await
            .expect("the TLS handshake succeeds")
    }

    /// `region`'s audit log, read with the CI token.
    async fn audit_log(&self, region: &str) -> Vec<v1::AuditEntry> {
        let mut admin = AdminClient::new(self.channel(region, None).await);
        admin
            .list_audit(with_bearer(
                v1::ListAuditRequest {
                    page_size: 1000,
                    ..Default::default()
                },
                CI_TOKEN,
            ))
            .await
            .expect("ListAudit")
            .into_inner()
            .entries
    }
}

/// A Resources, an Admin and a Peer call on `channel`, each refused
/// UNAUTHENTICATED (a valid token does not help); their messages.
async fn refused_everywhere(channel: &Channel, what: &str) -> Vec<String> {
    let resources = ResourcesClient::new(channel.clone())
        .delete(with_bearer(delete("project/kept"), CI_TOKEN))
        .await;
    let admin = AdminClient::new(channel.clone())
        .list_audit(with_bearer(v1::ListAuditRequest::default(), CI_TOKEN))
        .await;
    // What only a region may do: attach back-references in its own name.
    let peer = PeerClient::new(channel.clone())
        .attach(v1::AttachRequest {
            from_region: "us-east".to_owned(),
            backrefs: Vec::new(),
        })
        .await;
    vec![
        unauthenticated(resources, &format!("{what}: Resources")),
        unauthenticated(admin, &format!("{what}: Admin")),
        unauthenticated(peer, &format!("{what}: Peer")),
    ]
}

/// Whether `project/kept` is still there, ACTIVE, and `project/new` is not.
async fn nothing_changed(s: &Secured) {
    let mut client = s.client("eu-west", None).await;
    let kept = client
        .get(with_bearer(get("project/kept"), CI_TOKEN))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(kept.state(), v1::ResourceState::Active);
    let absent = client.get(with_bearer(get("project/new"), CI_TOKEN)).await.unwrap_err();
    assert_eq!(absent.code(), Code::NotFound);
}

fn with_bearer<M>(message: M, bearer: &str) -> Request<M> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {bearer}").parse().unwrap());
    request
}

fn create(name: &str) -> v1::CreateRequest {
    v1::CreateRequest {
        resource: Some(spec(name, &[])),
    }
}

fn delete(name: &str) -> v1::DeleteRequest {
    crate::support::delete_req(name, true)
}

fn get(name: &str) -> v1::GetRequest {
    v1::GetRequest {
        name: full(name),
        show_deleted: false,
    }
}

/// A call refused UNAUTHENTICATED, with its message.
fn unauthenticated<T: std::fmt::Debug>(result: Result<tonic::Response<T>, tonic::Status>, what: &str) -> String {
    match result {
        Ok(answer) => panic!("{what}: accepted: {answer:?}"),
        Err(status) => {
            assert_eq!(status.code(), Code::Unauthenticated, "{what}: {status:?}");
            status.message().to_owned()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_credential_is_unauthenticated_and_changes_nothing() {
    let s = secured().await;
    let mut client = s.client("eu-west", None).await;
    client
        .create(with_bearer(create("project/kept"), CI_TOKEN))
        .await
        .expect("the CI token creates");
    let now = now_s();
    let with = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut c = claims("alice@example.com");
        edit(&mut c);
        s.key.sign("k1", &c)
    };
    let b64 = |v: serde_json::Value| URL_SAFE_NO_PAD.encode(v.to_string());
    let mut hs256 = Header::new(Algorithm::HS256);
    hs256.kid = Some("k1".to_owned());
    let cases: Vec<(&str, String, &str)> = vec![
        ("expired", with(&|c| c["exp"] = (now - 120).into()), "expired"),
        (
            "not yet valid",
            with(&|c| c["nbf"] = (now + 600).into()),
            "not valid for another",
        ),
        (
            "wrong issuer",
            with(&|c| c["iss"] = "https://evil.example".into()),
            "was issued by",
        ),
        (
            "wrong audience",
            with(&|c| c["aud"] = "billing".into()),
            "not for audience",
        ),
        (
            "alg none",
            format!(
                "{}.{}.",
                b64(serde_json::json!({"alg": "none", "kid": "k1"})),
                b64(claims("alice@example.com"))
            ),
            "unreadable header",
        ),
        (
            "HS256 keyed with the public key",
            jsonwebtoken::encode(
                &hs256,
                &claims("alice@example.com"),
                &EncodingKey::from_secret(&s.key.public),
            )
            .unwrap(),
            "the key decides the algorithm",
        ),
        (
            "unknown kid",
            SigningKey::new().sign("k9", &claims("alice@example.com")),
            "kid \"k9\"",
        ),
        (
            "another key under kid k1",
            SigningKey::new().sign("k1", &claims("alice@example.com")),
            "does not verify",
        ),
        ("malformed JWT", "eyJhbGciOi.eyJzdWIi.c2ln".to_owned(), "the JWT"),
        (
            "wrong static token",
            "ci-token-0123456789abcdeX".to_owned(),
            "not in the tokens file",
        ),
    ];
    for (what, bearer, says) in &cases {
        let why = unauthenticated(client.delete(with_bearer(delete("project/kept"), bearer)).await, what);
        assert!(why.contains(says), "{what}: {why}");
        assert!(
            !why.contains(bearer.as_str()),
            "{what}: the credential is repeated: {why}"
        );
        unauthenticated(client.create(with_bearer(create("project/new"), bearer)).await, what);
    }
    let mut none = Request::new(delete("project/kept"));
    none.metadata_mut()
        .insert("authorization", "Basic YWxpY2U6cHc=".parse().unwrap());
    assert!(unauthenticated(client.delete(none).await, "basic").contains("not `Bearer"));
    assert!(unauthenticated(client.delete(delete("project/kept")).await, "no credentials").contains("no credentials"));
    // Nothing changed: the project is there, the new one is not.
    let kept = client
        .get(with_bearer(get("project/kept"), CI_TOKEN))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(kept.name, full("project/kept"));
    assert_eq!(kept.state(), v1::ResourceState::Active);
    let absent = client.get(with_bearer(get("project/new"), CI_TOKEN)).await.unwrap_err();
    assert_eq!(absent.code(), Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_a_jwt_and_a_certificate_each_authenticate_also_through_another_region() {
    let s = secured().await;
    let mut plain = s.client("eu-west", None).await;
    plain
        .create(with_bearer(create("project/by-token"), CI_TOKEN))
        .await
        .expect("a static token");
    plain
        .create(with_bearer(
            create("project/by-jwt"),
            &s.key.sign("k1", &claims("alice@example.com")),
        ))
        .await
        .expect("a JWT");
    let mut alice = s
        .client("eu-west", Some(s.pki.issue_client("alice.example").unwrap()))
        .await;
    alice
        .create(create("project/by-cert"))
        .await
        .expect("a client certificate");
    // A us-east name asked of eu-west: forwarded, eu-west vouching for the
    // caller it authenticated, which us-east believes from eu-west's
    // region certificate.
    let remote = "us-east/project/far";
    // `spec` names the resource with the region it is given.
    let forwarded = create(remote);
    plain
        .create(with_bearer(forwarded, CI_TOKEN))
        .await
        .expect("a create forwarded to us-east");
    let mut far = s.client("us-east", None).await;
    let found = far
        .get(with_bearer(
            v1::GetRequest {
                name: remote.to_owned(),
                show_deleted: false,
            },
            CI_TOKEN,
        ))
        .await
        .expect("us-east has it");
    assert_eq!(found.into_inner().name, remote);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_are_not_principals_and_only_regions_vouch() {
    let s = secured().await;
    let mut client = s.client("eu-west", None).await;
    client
        .create(with_bearer(create("project/kept"), CI_TOKEN))
        .await
        .unwrap();
    for sub in ["us-east", "us-east.cascade", "eu-west"] {
        let jwt = s.key.sign("k1", &claims(sub));
        let why = unauthenticated(client.delete(with_bearer(delete("project/kept"), &jwt)).await, sub);
        assert!(why.contains("region's identity"), "{sub}: {why}");
    }
    // A client certificate whose name is a region id of the cluster.
    let mut posing = s.client("eu-west", Some(s.pki.issue_client("us-east").unwrap())).await;
    assert!(unauthenticated(posing.delete(delete("project/kept")).await, "cert us-east").contains("region's identity"));
    // A region's own certificate, vouching for nobody.
    let mut region = s.client("eu-west", Some(s.pki.regions["us-east"].clone())).await;
    assert!(unauthenticated(region.delete(delete("project/kept")).await, "region cert").contains("vouching header"));
    // A client forging the vouching header, with a token or a certificate.
    let forged = |mut request: Request<v1::DeleteRequest>| {
        // v1::Principal {id: "root", groups: ["admins"], via: "certificate"}.
        let principal = cascade_proto::principal_to_bytes(&v1::Principal {
            id: "root".to_owned(),
            groups: vec!["admins".to_owned()],
            via: "certificate".to_owned(),
        });
        request
            .metadata_mut()
            .insert_bin("cascade-principal-bin", BinaryMetadataValue::from_bytes(&principal));
        request
    };
    let why = unauthenticated(
        client
            .delete(forged(with_bearer(delete("project/kept"), CI_TOKEN)))
            .await,
        "forged with a token",
    );
    assert!(why.contains("only from a region certificate"), "{why}");
    let mut alice = s
        .client("eu-west", Some(s.pki.issue_client("alice.example").unwrap()))
        .await;
    unauthenticated(
        alice.delete(forged(Request::new(delete("project/kept")))).await,
        "forged with a certificate",
    );
    let kept = client
        .get(with_bearer(get("project/kept"), CI_TOKEN))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(kept.state(), v1::ResourceState::Active);
}

/// A certificate of another CA: the handshake succeeds (the client proves
/// it holds the key), then every call on the connection is answered
/// UNAUTHENTICATED by the node, saying what to fix, whatever the service;
/// nothing changes and the refusal is in the audit log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_of_another_ca_is_unauthenticated_and_changes_nothing() {
    let s = secured().await;
    let mut client = s.client("eu-west", None).await;
    client
        .create(with_bearer(create("project/kept"), CI_TOKEN))
        .await
        .unwrap();
    let stranger = DevPki::generate(&[]).unwrap().issue_client("alice.example").unwrap();
    let channel = s.channel("eu-west", Some(stranger)).await;
    for why in refused_everywhere(&channel, "another CA's certificate").await {
        assert!(
            why.contains("the client certificate (subject \"CN=alice.example\", SAN \"alice.example\")")
                && why.contains("is not issued by a CA this node trusts")
                && why.contains("connect with a certificate of the cluster's CA ([tls] ca), or with none"),
            "{why}"
        );
    }
    let create_refused = ResourcesClient::new(channel.clone())
        .create(with_bearer(create("project/new"), CI_TOKEN))
        .await;
    unauthenticated(create_refused, "another CA's certificate: Create");
    nothing_changed(&s).await;
    let log = s.audit_log("eu-west").await;
    let refusal = log
        .iter()
        .find(|e| e.target == "/cascade.v1.Resources/Delete")
        .unwrap_or_else(|| panic!("the refusal is not in the audit log: {log:#?}"));
    assert_eq!(refusal.action, "Delete");
    assert!(
        refusal.outcome.starts_with("UNAUTHENTICATED: the client certificate")
            && refusal.outcome.contains("alice.example"),
        "{refusal:?}"
    );
}

/// `[auth] client_ca`: its certificates are clients, each its SAN; one of
/// them naming a region is no region (refused on every service); a third
/// CA's is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_ca_certificate_is_its_san_and_never_a_region() {
    // A CA for clients, with a certificate of its own naming eu-west.
    let clients = DevPki::generate(&["eu-west"]).unwrap();
    let s = secured_with(None, Some(&clients.ca_cert_pem)).await;
    let mut client = s.client("eu-west", None).await;
    client
        .create(with_bearer(create("project/kept"), CI_TOKEN))
        .await
        .unwrap();
    let mut bob = s
        .client("eu-west", Some(clients.issue_client("bob.example").unwrap()))
        .await;
    let kept = bob.get(get("project/kept")).await.expect("bob reads").into_inner();
    assert_eq!(kept.name, full("project/kept"));
    bob.create(create("project/bobs")).await.expect("bob creates");
    let log = s.audit_log("eu-west").await;
    let created = log
        .iter()
        .find(|e| e.action == "create" && e.target == full("project/bobs"))
        .unwrap_or_else(|| panic!("bob's create is not audited: {log:#?}"));
    assert_eq!(
        (created.who.as_str(), created.via.as_str()),
        ("bob.example", "certificate")
    );

    let posing = s.channel("us-east", Some(clients.regions["eu-west"].clone())).await;
    for why in refused_everywhere(&posing, "a client_ca certificate naming eu-west").await {
        assert!(
            why.contains("names a region (\"eu-west.cascade\") but is issued by [auth] client_ca"),
            "{why}"
        );
    }
    let third = DevPki::generate(&[]).unwrap().issue_client("carol.example").unwrap();
    let third = s.channel("eu-west", Some(third)).await;
    for why in refused_everywhere(&third, "a third CA's certificate").await {
        assert!(
            why.contains("is not issued by a CA this node trusts")
                && why.contains("of the cluster's CA ([tls] ca) or of [auth] client_ca"),
            "{why}"
        );
    }
    nothing_changed(&s).await;
}

/// Clients that open TCP and never finish a handshake (one silent, one
/// that stops inside its ClientHello) hold only their own handshake:
/// another client connects and calls meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_says_hello_does_not_hold_the_others() {
    let s = secured().await;
    let addr = s.cluster.node("eu-west").node.addr;
    let silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
    // A TLS record header promising a handshake message, and nothing more.
    tokio::io::AsyncWriteExt::write_all(&mut stalled, &[0x16, 0x03, 0x01, 0x02, 0x00])
        .await
        .unwrap();
    // Well within the handshake deadline (10 s) the stalled ones have.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let created = loop {
        let attempt = tokio::time::timeout(Duration::from_secs(1), async {
            let mut client = s.client("eu-west", None).await;
            client.create(with_bearer(create("project/meanwhile"), CI_TOKEN)).await
        })
        .await;
        match attempt {
            Ok(Ok(created)) => break created.into_inner(),
            other if std::time::Instant::now() > deadline => {
                panic!("no call got through beside the stalled handshakes: {other:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    assert_eq!(created.name, full("project/meanwhile"));
    drop((silent, stalled));
}

/// Random header names and values (bounded cases): the node never panics
/// and answers either UNAUTHENTICATED or, for a caller with the CI token,
/// what it answers anyone (here: the resource).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_headers_get_unauthenticated_or_a_normal_answer() {
    let s = secured().await;
    let mut client = s.client("eu-west", None).await;
    client
        .create(with_bearer(create("project/kept"), CI_TOKEN))
        .await
        .unwrap();
    let header = (
        proptest::prop_oneof![
            proptest::string::string_regex("[a-z][a-z0-9-]{0,24}").unwrap(),
            proptest::strategy::Just("authorization".to_owned()),
            proptest::strategy::Just("cascade-principal-bin".to_owned()),
            proptest::strategy::Just("cascade-admin-for".to_owned()),
            proptest::strategy::Just("cascade-relayed-region".to_owned()),
        ],
        proptest::string::string_regex("[ -~]{0,300}").unwrap(),
        proptest::collection::vec(proptest::num::u8::ANY, 0..300),
    );
    let case = (proptest::collection::vec(header, 1..6), proptest::bool::ANY);
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut answered = (0, 0);
    for _ in 0..96 {
        let (headers, with_token) = case.new_tree(&mut runner).unwrap().current();
        let mut request = if with_token {
            with_bearer(get("project/kept"), CI_TOKEN)
        } else {
            Request::new(get("project/kept"))
        };
        for (name, text, bytes) in &headers {
            if name.ends_with("-bin") {
                if let Ok(key) = BinaryMetadataKey::from_bytes(name.as_bytes()) {
                    request
                        .metadata_mut()
                        .insert_bin(key, BinaryMetadataValue::from_bytes(bytes));
                }
            } else if let (Ok(key), Ok(value)) = (
                AsciiMetadataKey::from_bytes(name.as_bytes()),
                AsciiMetadataValue::try_from(text.as_str()),
            ) {
                if name == "authorization" && with_token {
                    continue;
                }
                request.metadata_mut().insert(key, value);
            }
        }
        let vouched = headers.iter().any(|(n, _, _)| n == "cascade-principal-bin");
        match client.get(request).await {
            Ok(found) => {
                assert!(with_token && !vouched, "{headers:?}: answered without a token");
                assert_eq!(found.into_inner().name, full("project/kept"));
                answered.0 += 1;
            }
            Err(status) => {
                assert_eq!(status.code(), Code::Unauthenticated, "{headers:?}: {status:?}");
                assert!(!with_token || vouched, "{headers:?}: refused the token: {status:?}");
                answered.1 += 1;
            }
        }
    }
    // Both kinds of answer were seen.
    assert!(answered.0 > 0 && answered.1 > 0, "{answered:?}");
    // Still serving.
    client.get(with_bearer(get("project/kept"), CI_TOKEN)).await.unwrap();
}

/// `[auth.rate]`: a principal's mutating calls beyond its burst are
/// RESOURCE_EXHAUSTED with the delay to retry after; reads and other
/// principals are not held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutating_calls_beyond_a_principals_rate_are_resource_exhausted_with_a_retry_delay() {
    let s = secured_with(
        Some(RateSettings {
            per_second: 0.2,
            burst: 2,
        }),
        None,
    )
    .await;
    let mut client = s.client("eu-west", None).await;
    for name in ["project/a", "project/b"] {
        client.create(with_bearer(create(name), CI_TOKEN)).await.unwrap();
    }
    let limited = client
        .create(with_bearer(create("project/c"), CI_TOKEN))
        .await
        .unwrap_err();
    assert_eq!(limited.code(), Code::ResourceExhausted, "{limited:?}");
    assert!(limited.message().contains("\"ci-bot\" is over its rate"), "{limited:?}");
    let pushback: u64 = limited
        .metadata()
        .get("grpc-retry-pushback-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("a retry delay");
    assert!((1..=5000).contains(&pushback), "{pushback}");
    // google.rpc.Status with a RetryInfo in the details.
    assert!(!limited.details().is_empty());
    // Reads are not limited, nor is another principal.
    client.get(with_bearer(get("project/a"), CI_TOKEN)).await.unwrap();
    let jwt = s.key.sign("k1", &claims("alice@example.com"));
    client.create(with_bearer(create("project/c"), &jwt)).await.unwrap();
}
