//! Credentials → a [`Principal`]: a static token (its SHA-256 in the
//! tokens file, compared in constant time), a bearer JWT (verified against
//! the JWKS file: an asymmetric algorithm the key decides, `iss`, `aud`,
//! `exp`/`nbf` with the configured leeway, a `kid` the file lists), or a
//! client certificate's subject alternative name. No wire types: the gRPC
//! layer (`api/authn.rs`) hands in the header's text or the certificate's
//! bytes and maps [`AuthnError`] to UNAUTHENTICATED.
//!
//! Both files are re-read when they change (checked at most once a
//! second), and the JWKS file also when a token names a `kid` it does not
//! list (at most once a second, then the token is refused). A file that no
//! longer parses keeps the keys or tokens read before, with a warning.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use cascade_core::auth::{Principal, Via};
use cascade_core::limits::quote;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use subtle::ConstantTimeEq;
use tracing::warn;

use super::{AuthSettings, JwtSettings};
use crate::clock::Clock;
use crate::log_throttle::Throttle;

/// A tokens or JWKS file larger than this is refused (and the old one kept).
pub const MAX_AUTH_FILE_BYTES: u64 = 1024 * 1024;
/// At most this many tokens in a tokens file, keys in a JWKS file.
pub const MAX_AUTH_FILE_ENTRIES: usize = 10_000;
/// A principal id (a token's name, a JWT's `sub`, a certificate's SAN) is
/// at most this long.
pub const MAX_PRINCIPAL_ID_BYTES: usize = 256;
/// At most this many groups per principal; each at most [`MAX_PRINCIPAL_ID_BYTES`].
pub const MAX_GROUPS: usize = 64;
/// A bearer credential longer than this is refused unread.
pub const MAX_BEARER_BYTES: usize = 16 * 1024;
/// Files are looked at for changes at most this often.
const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// Why a caller is not authenticated: which means failed and why, in a few
/// words, never the credential itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthnError {
    #[error("no credentials: send `authorization: Bearer <token or JWT>`{0}")]
    Missing(&'static str),
    #[error("the JWT {0}")]
    Jwt(String),
    #[error("the token {0}")]
    Token(String),
    #[error("the client certificate {0}")]
    Certificate(String),
    #[error("{0} is a region's identity, not a principal: regions act for callers only by vouching")]
    RegionIdentity(String),
    #[error("the vouching header {0}")]
    Vouch(String),
    #[error("{0}")]
    Malformed(String),
}

/// The node's means of authentication, loaded from `[auth]`.
pub struct Identities {
    client_certificates: bool,
    tokens: Option<Reloading<TokenTable>>,
    jwt: Option<(JwtSettings, Reloading<Jwks>)>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Identities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identities")
            .field("client_certificates", &self.client_certificates)
            .field("tokens", &self.tokens.is_some())
            .field("jwt", &self.jwt.is_some())
            .finish()
    }
}

/// Why the means cannot be loaded at start.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct IdentityFileError {
    pub path: PathBuf,
    pub message: String,
}

impl Identities {
    /// Loads the tokens and JWKS files `settings` name: a file missing or
    /// malformed at start is an error (later, the old content is kept).
    pub fn load(settings: &AuthSettings, clock: Arc<dyn Clock>) -> Result<Self, IdentityFileError> {
        let tokens = match &settings.tokens_file {
            Some(path) => Some(Reloading::load(path.clone())?),
            None => None,
        };
        let jwt = match &settings.jwt {
            Some(jwt) => Some((jwt.clone(), Reloading::load(jwt.jwks_file.clone())?)),
            None => None,
        };
        Ok(Identities {
            client_certificates: settings.client_certificates,
            tokens,
            jwt,
            clock,
        })
    }

    /// Whether a client certificate is a means here.
    pub fn accepts_certificates(&self) -> bool {
        self.client_certificates
    }

    /// The principal a bearer credential proves: a JWT when `[auth.jwt]`
    /// is configured and it has a JWS's shape, else a static token.
    pub fn bearer(&self, credential: &str) -> Result<Principal, AuthnError> {
        if credential.len() > MAX_BEARER_BYTES {
            return Err(AuthnError::Malformed(format!(
                "the bearer credential is {} bytes: at most {MAX_BEARER_BYTES}",
                credential.len()
            )));
        }
        if let Some((settings, jwks)) = &self.jwt {
            if looks_like_jws(credential) {
                return self.verify_jwt(settings, jwks, credential);
            }
        }
        match &self.tokens {
            Some(tokens) => tokens.with(Refresh::IfChanged, |table| table.find(credential)),
            None if self.jwt.is_some() => Err(AuthnError::Jwt(
                "is malformed (not three base64url segments) and this node has no tokens_file".to_owned(),
            )),
            None => Err(AuthnError::Token(
                "cannot be checked: this node accepts no bearer credentials (no tokens_file, no [auth.jwt])".to_owned(),
            )),
        }
    }

    fn verify_jwt(&self, settings: &JwtSettings, jwks: &Reloading<Jwks>, token: &str) -> Result<Principal, AuthnError> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| {
            AuthnError::Jwt(format!(
                "has an unreadable header ({e}); alg \"none\" and HMAC are refused"
            ))
        })?;
        let kid = header
            .kid
            .ok_or_else(|| AuthnError::Jwt("names no kid: every token must name its key".to_owned()))?;
        let key = match jwks.with(Refresh::IfChanged, |set| set.key(&kid)) {
            Some(key) => key,
            // A key rotated in since the file was read: read it again (at
            // most once a second), then refuse.
            None => jwks
                .with(Refresh::Now, |set| set.key(&kid))
                .ok_or_else(|| AuthnError::Jwt(format!("names no key of the JWKS file (kid {})", quote(&kid))))?,
        };
        if header.alg != key.algorithm {
            return Err(AuthnError::Jwt(format!(
                "says alg {:?} but key {} is {:?}: the key decides the algorithm",
                header.alg,
                quote(&kid),
                key.algorithm
            )));
        }
        let mut validation = Validation::new(key.algorithm);
        // exp, nbf, iss and aud are checked below, on the node's clock and
        // with messages that say what was wrong.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        let claims = jsonwebtoken::decode::<Claims>(token, &key.key, &validation)
            .map_err(|e| AuthnError::Jwt(format!("does not verify against key {}: {e}", quote(&kid))))?
            .claims;
        let now_ms = self.clock.now().0 as f64;
        let leeway_ms = settings.leeway.as_millis() as f64;
        let exp = claims.exp.ok_or_else(|| AuthnError::Jwt("has no exp".to_owned()))?;
        if exp * 1000.0 + leeway_ms < now_ms {
            return Err(AuthnError::Jwt(format!(
                "expired {} s ago",
                ((now_ms - exp * 1000.0) / 1000.0).round()
            )));
        }
        if let Some(nbf) = claims.nbf {
            if nbf * 1000.0 > now_ms + leeway_ms {
                return Err(AuthnError::Jwt(format!(
                    "is not valid for another {} s (nbf)",
                    ((nbf * 1000.0 - now_ms) / 1000.0).round()
                )));
            }
        }
        if claims.iss.as_deref() != Some(settings.issuer.as_str()) {
            return Err(AuthnError::Jwt(format!(
                "was issued by {}, not {}",
                claims
                    .iss
                    .as_deref()
                    .map_or_else(|| "nobody (no iss)".to_owned(), quote),
                quote(&settings.issuer)
            )));
        }
        let audiences = match &claims.aud {
            Some(Audience::One(a)) => vec![a.as_str()],
            Some(Audience::Many(list)) => list.iter().map(String::as_str).collect(),
            None => Vec::new(),
        };
        if !audiences.contains(&settings.audience.as_str()) {
            return Err(AuthnError::Jwt(format!(
                "is not for audience {} (aud {})",
                quote(&settings.audience),
                quote(&audiences.join(", "))
            )));
        }
        let id = principal_id(claims.sub.as_deref().unwrap_or_default(), "its sub").map_err(AuthnError::Jwt)?;
        let groups = match claims.rest.get(&settings.groups_claim) {
            None => Vec::new(),
            Some(serde_json::Value::Array(values)) => {
                let names: Vec<&str> = values.iter().filter_map(serde_json::Value::as_str).collect();
                if names.len() != values.len() {
                    return Err(AuthnError::Jwt(format!(
                        "claim {} holds something other than strings",
                        quote(&settings.groups_claim)
                    )));
                }
                groups(names.into_iter()).map_err(AuthnError::Jwt)?
            }
            Some(serde_json::Value::String(one)) => groups(std::iter::once(one.as_str())).map_err(AuthnError::Jwt)?,
            Some(_) => {
                return Err(AuthnError::Jwt(format!(
                    "claim {} is neither a string nor a list of strings",
                    quote(&settings.groups_claim)
                )))
            }
        };
        Ok(Principal {
            id,
            groups,
            via: Via::Jwt,
        })
    }

    /// The principal a client certificate (already verified against the
    /// cluster's CA) names: its first URI subject alternative name (a
    /// SPIFFE id), else its first DNS name.
    pub fn certificate(&self, leaf_der: &[u8]) -> Result<Principal, AuthnError> {
        if !self.client_certificates {
            return Err(AuthnError::Certificate(
                "is no means here ([auth] client_certificates is off)".to_owned(),
            ));
        }
        let names = cascade_tls::subject_alt_names(leaf_der).map_err(AuthnError::Certificate)?;
        let name = names
            .uris
            .first()
            .or(names.dns.first())
            .ok_or_else(|| AuthnError::Certificate("names no DNS or URI subject alternative name".to_owned()))?;
        Ok(Principal {
            id: principal_id(name, "its subject alternative name").map_err(AuthnError::Certificate)?,
            groups: Vec::new(),
            via: Via::Certificate,
        })
    }
}

#[cfg(test)]
impl Identities {
    /// As if both files were last read over a second ago.
    fn backdate(&self) {
        if let Some(tokens) = &self.tokens {
            tokens.backdate();
        }
        if let Some((_, jwks)) = &self.jwt {
            jwks.backdate();
        }
    }
}

/// Refuses a principal whose id is a region's identity (`<region>.cascade`,
/// or a region id `is_region` knows): regions are never principals.
pub fn refuse_region_identity(principal: &Principal, is_region: impl Fn(&str) -> bool) -> Result<(), AuthnError> {
    let id = principal.id.as_str();
    let region = id
        .strip_suffix(cascade_tls::IDENTITY_SUFFIX)
        .filter(|r| cascade_core::RegionId::parse(r).is_ok());
    if region.is_some() || is_region(id) {
        return Err(AuthnError::RegionIdentity(quote(id)));
    }
    Ok(())
}

/// A JWS compact serialization: three base64url segments.
fn looks_like_jws(text: &str) -> bool {
    let segments: Vec<&str> = text.split('.').collect();
    segments.len() == 3
        && segments[..2].iter().all(|s| !s.is_empty())
        && segments
            .iter()
            .all(|s| s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
}

fn principal_id(raw: &str, what: &str) -> Result<String, String> {
    if raw.is_empty() {
        return Err(format!("has no principal: {what} is empty"));
    }
    if raw.len() > MAX_PRINCIPAL_ID_BYTES || raw.chars().any(char::is_control) {
        return Err(format!(
            "{what} {} is no principal id (at most {MAX_PRINCIPAL_ID_BYTES} bytes, no control characters)",
            quote(raw)
        ));
    }
    Ok(raw.to_owned())
}

fn groups<'a>(names: impl Iterator<Item = &'a str>) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for name in names {
        if out.len() == MAX_GROUPS {
            return Err(format!("names more than {MAX_GROUPS} groups"));
        }
        out.push(principal_id(name, "a group")?);
    }
    Ok(out)
}

#[derive(Deserialize)]
struct Claims {
    sub: Option<String>,
    iss: Option<String>,
    aud: Option<Audience>,
    exp: Option<f64>,
    nbf: Option<f64>,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

/// One verification key of the JWKS file, with the algorithm it decides.
#[derive(Clone)]
struct JwtKey {
    algorithm: Algorithm,
    key: DecodingKey,
}

/// The JWKS file's usable keys, by kid.
struct Jwks {
    keys: Vec<(String, JwtKey)>,
}

impl Jwks {
    fn key(&self, kid: &str) -> Option<JwtKey> {
        self.keys.iter().find(|(k, _)| k == kid).map(|(_, key)| key.clone())
    }
}

/// The algorithm a JWK allows: its `alg` when it says one, else the one its
/// key type and curve imply. HMAC (`oct`) keys are refused: a shared
/// secret in a file every node reads is no identity provider's key.
fn key_algorithm(params: &AlgorithmParameters, said: Option<KeyAlgorithm>) -> Result<Algorithm, String> {
    let implied = match params {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => Algorithm::ES256,
            EllipticCurve::P384 => Algorithm::ES384,
            _ => return Err("an EC key on a curve other than P-256 or P-384".to_owned()),
        },
        AlgorithmParameters::OctetKeyPair(_) => Algorithm::EdDSA,
        AlgorithmParameters::OctetKey(_) => return Err("a symmetric (oct) key: HMAC is refused".to_owned()),
    };
    let Some(said) = said else { return Ok(implied) };
    let algorithm = match said {
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        other => return Err(format!("alg {other:?} is not an asymmetric signature algorithm")),
    };
    let same_family = matches!(
        (implied, algorithm),
        (
            Algorithm::RS256,
            Algorithm::RS256
                | Algorithm::RS384
                | Algorithm::RS512
                | Algorithm::PS256
                | Algorithm::PS384
                | Algorithm::PS512
        ) | (Algorithm::ES256, Algorithm::ES256)
            | (Algorithm::ES384, Algorithm::ES384)
            | (Algorithm::EdDSA, Algorithm::EdDSA)
    );
    if !same_family {
        return Err(format!("alg {algorithm:?} does not fit its key type"));
    }
    Ok(algorithm)
}

/// One static token: the SHA-256 of its secret and who it proves.
struct TokenEntry {
    sha256: [u8; 32],
    principal: Principal,
}

struct TokenTable {
    entries: Vec<TokenEntry>,
}

impl TokenTable {
    /// Every entry is compared (in constant time), so how long it takes
    /// says nothing about which one matched.
    fn find(&self, presented: &str) -> Result<Principal, AuthnError> {
        let digest = sha256(presented.as_bytes());
        let mut found = None;
        for entry in &self.entries {
            if bool::from(entry.sha256.ct_eq(&digest)) {
                found = Some(&entry.principal);
            }
        }
        found
            .cloned()
            .ok_or_else(|| AuthnError::Token("is not in the tokens file".to_owned()))
    }
}

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// Lower-case hex of `bytes` (the tokens file's `sha256`).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// A file that `T` is parsed from, re-read when it changes.
trait AuthFile: Sized {
    fn parse(text: &str) -> Result<Self, String>;
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFileText {
    #[serde(default)]
    token: Vec<TokenText>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenText {
    principal: String,
    #[serde(default)]
    groups: Vec<String>,
    sha256: String,
}

impl AuthFile for TokenTable {
    fn parse(text: &str) -> Result<Self, String> {
        let file: TokensFileText = toml::from_str(text).map_err(|e| e.to_string())?;
        if file.token.len() > MAX_AUTH_FILE_ENTRIES {
            return Err(format!("{} tokens: at most {MAX_AUTH_FILE_ENTRIES}", file.token.len()));
        }
        let mut entries = Vec::with_capacity(file.token.len());
        for (i, t) in file.token.into_iter().enumerate() {
            let at = |m: String| format!("token {}: {m}", i + 1);
            let sha256 = unhex(&t.sha256.to_ascii_lowercase())
                .ok_or_else(|| at("sha256 is not 64 hex digits (`cascade auth hash-token`)".to_owned()))?;
            let principal = Principal {
                id: principal_id(&t.principal, "principal").map_err(at)?,
                groups: groups(t.groups.iter().map(String::as_str)).map_err(at)?,
                via: Via::Token,
            };
            refuse_region_identity(&principal, |_| false).map_err(|e| at(e.to_string()))?;
            entries.push(TokenEntry { sha256, principal });
        }
        Ok(TokenTable { entries })
    }
}

impl AuthFile for Jwks {
    fn parse(text: &str) -> Result<Self, String> {
        // The sanctioned place for a JWKS file: not stored data, and a
        // parse error is reported with the file's path by the caller.
        #[allow(clippy::disallowed_methods)]
        let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("not a JWKS document: {e}"))?;
        if set.keys.len() > MAX_AUTH_FILE_ENTRIES {
            return Err(format!("{} keys: at most {MAX_AUTH_FILE_ENTRIES}", set.keys.len()));
        }
        let mut keys = Vec::new();
        for (i, jwk) in set.keys.iter().enumerate() {
            let at = |m: String| format!("key {}: {m}", i + 1);
            let kid = jwk.common.key_id.clone().ok_or_else(|| at("has no kid".to_owned()))?;
            let algorithm = key_algorithm(&jwk.algorithm, jwk.common.key_algorithm).map_err(at)?;
            let key = DecodingKey::from_jwk(jwk).map_err(|e| at(format!("unusable: {e}")))?;
            keys.push((kid, JwtKey { algorithm, key }));
        }
        Ok(Jwks { keys })
    }
}

/// Whether to look at the file before using what was read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Refresh {
    /// If a second has passed since the last look and it changed.
    IfChanged,
    /// Re-read it now unless it was read less than a second ago.
    Now,
}

struct Loaded<T> {
    value: T,
    /// The file's modification time and length when read.
    stamp: Option<(SystemTime, u64)>,
    /// When it was last looked at (monotonic).
    looked: tokio::time::Instant,
    /// When it was last read (monotonic).
    read: tokio::time::Instant,
}

struct Reloading<T> {
    path: PathBuf,
    loaded: Mutex<Loaded<T>>,
    /// A file that stopped parsing: one warning a window.
    broken: Throttle,
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

fn read_bounded(path: &Path) -> Result<String, String> {
    let len = std::fs::metadata(path).map_err(|e| e.to_string())?.len();
    if len > MAX_AUTH_FILE_BYTES {
        return Err(format!("{len} bytes: at most {MAX_AUTH_FILE_BYTES}"));
    }
    std::fs::read_to_string(path).map_err(|e| e.to_string())
}

impl<T: AuthFile> Reloading<T> {
    fn load(path: PathBuf) -> Result<Self, IdentityFileError> {
        let error = |message| IdentityFileError {
            path: path.clone(),
            message,
        };
        let stamp = stamp(&path);
        let value = T::parse(&read_bounded(&path).map_err(error)?).map_err(error)?;
        let now = crate::clock::monotonic_now();
        Ok(Reloading {
            loaded: Mutex::new(Loaded {
                value,
                stamp,
                looked: now,
                read: now,
            }),
            path,
            broken: Throttle::default(),
        })
    }

    #[cfg(test)]
    fn backdate(&self) {
        if let Ok(mut loaded) = self.loaded.lock() {
            let earlier = |t: tokio::time::Instant| t.checked_sub(RELOAD_EVERY).unwrap_or(t);
            loaded.looked = earlier(loaded.looked);
            loaded.read = earlier(loaded.read);
        }
    }

    /// Runs `f` on the file's content, re-read first when `refresh` says so.
    fn with<R>(&self, refresh: Refresh, f: impl FnOnce(&T) -> R) -> R {
        let mut loaded = match self.loaded.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let now = crate::clock::monotonic_now();
        let reread = match refresh {
            Refresh::IfChanged => {
                now.duration_since(loaded.looked) >= RELOAD_EVERY && {
                    loaded.looked = now;
                    stamp(&self.path) != loaded.stamp
                }
            }
            Refresh::Now => now.duration_since(loaded.read) >= RELOAD_EVERY,
        };
        if reread {
            loaded.read = now;
            loaded.looked = now;
            let stamp = stamp(&self.path);
            match read_bounded(&self.path).and_then(|text| T::parse(&text)) {
                Ok(value) => {
                    loaded.value = value;
                    loaded.stamp = stamp;
                    self.broken.reset();
                }
                Err(message) => {
                    // Not again until it changes once more.
                    loaded.stamp = stamp;
                    if let Some(more) = self.broken.admit() {
                        warn!(path = %self.path.display(), error = %message, suppressed = more.count(),
                            "an authentication file no longer reads; keeping what was read before{more}");
                    }
                }
            }
        }
        f(&loaded.value)
    }
}

#[cfg(test)]
mod tests;
