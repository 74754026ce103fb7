use std::sync::atomic::{AtomicU64, Ordering};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use cascade_core::Timestamp;
use jsonwebtoken::{EncodingKey, Header};
use ring::signature::{Ed25519KeyPair, KeyPair};

use super::*;
use crate::auth::AuthMode;

const NOW_MS: u64 = 1_800_000_000_000;

struct FixedClock(AtomicU64);

impl Clock for FixedClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

/// An Ed25519 key: its PKCS#8 (to sign) and its JWK (to verify).
struct TestKey {
    pkcs8: Vec<u8>,
    public: Vec<u8>,
}

impl TestKey {
    fn new() -> Self {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap().as_ref().to_vec();
        let public = Ed25519KeyPair::from_pkcs8(&pkcs8)
            .unwrap()
            .public_key()
            .as_ref()
            .to_vec();
        TestKey { pkcs8, public }
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

struct Fixture {
    _dir: tempfile::TempDir,
    jwks: PathBuf,
    tokens: PathBuf,
    identities: Identities,
    clock: Arc<FixedClock>,
}

fn claims() -> serde_json::Value {
    let now = (NOW_MS / 1000) as i64;
    serde_json::json!({
        "sub": "alice@example.com",
        "iss": "https://idp.example",
        "aud": ["cascade", "other"],
        "exp": now + 600,
        "nbf": now - 60,
        "groups": ["net-admins"],
    })
}

fn fixture(key: &TestKey) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, format!(r#"{{"keys":[{}]}}"#, key.jwk("k1"))).unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\nprincipal = \"ci-bot\"\ngroups = [\"deployers\"]\nsha256 = \"{}\"\n",
            hex(&sha256(b"s3cret-token-of-ci"))
        ),
    )
    .unwrap();
    let settings = AuthSettings {
        mode: AuthMode::Required,
        tokens_file: Some(tokens.clone()),
        jwt: Some(JwtSettings {
            jwks_file: jwks.clone(),
            issuer: "https://idp.example".to_owned(),
            audience: "cascade".to_owned(),
            groups_claim: "groups".to_owned(),
            leeway: Duration::from_secs(30),
        }),
        ..AuthSettings::default()
    };
    let clock = Arc::new(FixedClock(AtomicU64::new(NOW_MS)));
    let identities = Identities::load(&settings, clock.clone()).unwrap();
    Fixture {
        _dir: dir,
        jwks,
        tokens,
        identities,
        clock,
    }
}

fn jwt_error(f: &Fixture, token: &str) -> String {
    match f.identities.bearer(token) {
        Ok(p) => panic!("accepted as {p:?}"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn a_valid_jwt_is_its_subject_with_its_groups() {
    let key = TestKey::new();
    let f = fixture(&key);
    let principal = f.identities.bearer(&key.sign("k1", &claims())).unwrap();
    assert_eq!(
        principal,
        Principal {
            id: "alice@example.com".to_owned(),
            groups: vec!["net-admins".to_owned()],
            via: Via::Jwt
        }
    );
}

#[tokio::test]
async fn expired_and_not_yet_valid_jwts_are_refused_beyond_the_leeway() {
    let key = TestKey::new();
    let f = fixture(&key);
    let now = (NOW_MS / 1000) as i64;
    let mut expired = claims();
    expired["exp"] = (now - 31).into();
    assert_eq!(jwt_error(&f, &key.sign("k1", &expired)), "the JWT expired 31 s ago");
    // Within the 30 s leeway: still good.
    expired["exp"] = (now - 29).into();
    assert!(f.identities.bearer(&key.sign("k1", &expired)).is_ok());
    let mut early = claims();
    early["nbf"] = (now + 120).into();
    assert_eq!(
        jwt_error(&f, &key.sign("k1", &early)),
        "the JWT is not valid for another 120 s (nbf)"
    );
    let mut no_exp = claims();
    no_exp.as_object_mut().unwrap().remove("exp");
    assert_eq!(jwt_error(&f, &key.sign("k1", &no_exp)), "the JWT has no exp");
    // The node's clock decides, not the machine's.
    let token = key.sign("k1", &claims());
    f.clock.0.store(NOW_MS + 3_600_000, Ordering::SeqCst);
    assert!(jwt_error(&f, &token).contains("expired"));
}

#[tokio::test]
async fn wrong_issuer_audience_or_subject_is_refused() {
    let key = TestKey::new();
    let f = fixture(&key);
    let mut wrong = claims();
    wrong["iss"] = "https://evil.example".into();
    assert!(jwt_error(&f, &key.sign("k1", &wrong)).contains("was issued by \"https://evil.example\""));
    let mut wrong = claims();
    wrong["aud"] = "billing".into();
    assert!(jwt_error(&f, &key.sign("k1", &wrong)).contains("is not for audience \"cascade\""));
    let mut wrong = claims();
    wrong["sub"] = "".into();
    assert!(jwt_error(&f, &key.sign("k1", &wrong)).contains("sub is empty"));
}

#[tokio::test]
async fn alg_none_hmac_with_the_public_key_and_foreign_keys_are_refused() {
    let key = TestKey::new();
    let f = fixture(&key);
    let b64 = |v: &serde_json::Value| URL_SAFE_NO_PAD.encode(v.to_string());
    let none = format!(
        "{}.{}.",
        b64(&serde_json::json!({"alg": "none", "kid": "k1", "typ": "JWT"})),
        b64(&claims())
    );
    assert!(
        jwt_error(&f, &none).contains("unreadable header"),
        "{}",
        jwt_error(&f, &none)
    );
    // The classic confusion: HS256 keyed with the verification key's bytes.
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("k1".to_owned());
    let hmac = jsonwebtoken::encode(&header, &claims(), &EncodingKey::from_secret(&key.public)).unwrap();
    assert!(jwt_error(&f, &hmac).contains("the key decides the algorithm"));
    // Signed by a key the file does not list under that kid.
    let other = TestKey::new();
    assert!(jwt_error(&f, &other.sign("k1", &claims())).contains("does not verify"));
    assert!(jwt_error(&f, &other.sign("k9", &claims())).contains("names no key of the JWKS file (kid \"k9\")"));
    // No kid at all.
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = None;
    let no_kid = jsonwebtoken::encode(&header, &claims(), &EncodingKey::from_ed_der(&key.pkcs8)).unwrap();
    assert!(jwt_error(&f, &no_kid).contains("names no kid"));
    // Malformed: three segments of garbage, then one.
    assert!(jwt_error(&f, "a.b.c").starts_with("the JWT"));
    assert!(f.identities.bearer("not-a-jwt").is_err());
}

#[tokio::test]
async fn a_rotated_key_is_found_by_re_reading_the_jwks_file() {
    let key = TestKey::new();
    let f = fixture(&key);
    let rotated = TestKey::new();
    std::fs::write(
        &f.jwks,
        format!(r#"{{"keys":[{},{}]}}"#, key.jwk("k1"), rotated.jwk("k2")),
    )
    .unwrap();
    // As if the file was read over a second ago (it is read at most once a second).
    f.identities.backdate();
    let principal = f.identities.bearer(&rotated.sign("k2", &claims())).unwrap();
    assert_eq!(principal.id, "alice@example.com");
    // A broken file keeps the keys read before.
    std::fs::write(&f.jwks, "{ not json").unwrap();
    f.identities.backdate();
    assert!(f.identities.bearer(&rotated.sign("k2", &claims())).is_ok());
}

#[tokio::test]
async fn a_static_token_is_found_by_its_hash_and_the_file_is_re_read() {
    let key = TestKey::new();
    let f = fixture(&key);
    let ci = f.identities.bearer("s3cret-token-of-ci").unwrap();
    assert_eq!(
        (ci.id.as_str(), ci.groups.clone(), ci.via),
        ("ci-bot", vec!["deployers".to_owned()], Via::Token)
    );
    assert_eq!(
        f.identities.bearer("s3cret-token-of-cj").unwrap_err(),
        AuthnError::Token("is not in the tokens file".to_owned())
    );
    std::fs::write(
        &f.tokens,
        format!(
            "[[token]]\nprincipal = \"bob\"\nsha256 = \"{}\"\n",
            hex(&sha256(b"bobs-token"))
        ),
    )
    .unwrap();
    f.identities.backdate();
    assert_eq!(f.identities.bearer("bobs-token").unwrap().id, "bob");
    assert!(f.identities.bearer("s3cret-token-of-ci").is_err());
}

#[test]
fn a_tokens_file_naming_a_region_or_without_a_hash_is_refused() {
    let region = format!(
        "[[token]]\nprincipal = \"eu-west.cascade\"\nsha256 = \"{}\"\n",
        hex(&sha256(b"x"))
    );
    assert!(TokenTable::parse(&region).err().unwrap().contains("region's identity"));
    assert!(TokenTable::parse("[[token]]\nprincipal = \"a\"\nsha256 = \"abc\"\n")
        .err()
        .unwrap()
        .contains("64 hex digits"));
}

#[test]
fn a_symmetric_key_in_the_jwks_file_is_refused() {
    let oct = r#"{"keys":[{"kty":"oct","kid":"h","k":"c2VjcmV0"}]}"#;
    assert!(Jwks::parse(oct).err().unwrap().contains("HMAC is refused"));
}

#[test]
fn region_identities_are_not_principals() {
    let as_id = |id: &str| Principal {
        id: id.to_owned(),
        groups: Vec::new(),
        via: Via::Jwt,
    };
    assert!(refuse_region_identity(&as_id("us-east.cascade"), |_| false).is_err());
    assert!(refuse_region_identity(&as_id("us-east"), |r| r == "us-east").is_err());
    assert!(refuse_region_identity(&as_id("alice"), |r| r == "us-east").is_ok());
}
