//! Who calls, and what they may do: the node's side of client identity
//! and authorization (seed 000's tenants; Kubernetes RBAC as the model).
//!
//! - `identity.rs`: credentials (a client certificate's SAN, a bearer JWT
//!   checked against a JWKS file, a static token) → a
//!   [`cascade_core::auth::Principal`].
//! - `policy.rs`: the policy file (Cedar) behind
//!   [`cascade_core::auth::Authorize`], reloaded on change or SIGHUP.
//! - `rate.rs`: a token bucket per principal for mutating calls.
//!
//! The gRPC layer that authenticates every call lives in `api/authn.rs`;
//! this module knows no wire types.

pub mod identity;
pub mod rate;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cascade_core::auth::{AllowAll, Authorize};

pub mod policy;

/// Whether callers are authenticated at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthMode {
    /// Nobody is asked who they are and everybody may do everything
    /// (`[auth] mode = "none"`, chosen explicitly; the node warns at start
    /// and `cascade status` says so). The Admin service keeps its own gate
    /// (`[admin]`).
    #[default]
    Off,
    /// Every call is authenticated by one of the configured means and
    /// authorized by the policy (`[auth] mode = "required"`).
    Required,
}

impl AuthMode {
    /// Its name in the config file and in status.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthMode::Off => "none",
            AuthMode::Required => "required",
        }
    }
}

/// How bearer JWTs are verified (`[auth.jwt]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtSettings {
    /// The JWKS file (re-read when a token names a `kid` not in it).
    pub jwks_file: PathBuf,
    /// The `iss` every token must carry.
    pub issuer: String,
    /// An `aud` every token must carry.
    pub audience: String,
    /// The claim holding the principal's groups (default `groups`).
    pub groups_claim: String,
    /// The skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
}

/// Mutating calls per principal (`[auth.rate]`): a token bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateSettings {
    /// Calls per second, sustained.
    pub per_second: f64,
    /// Calls at once after a quiet spell.
    pub burst: u32,
}

/// `[auth]`, resolved.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AuthSettings {
    pub mode: AuthMode,
    /// With `[tls]`: a client certificate of the cluster's CA (or of
    /// `client_ca`) is an identity, its SAN the principal's id.
    pub client_certificates: bool,
    /// A CA for client certificates besides the cluster's (PEM).
    pub client_ca: Option<PathBuf>,
    /// Static tokens (`tokens_file`): SHA-256 hashes → principal and groups.
    pub tokens_file: Option<PathBuf>,
    /// Bearer JWTs (`[auth.jwt]`).
    pub jwt: Option<JwtSettings>,
    /// The policy (Cedar), required with `mode = "required"`.
    pub policy_file: Option<PathBuf>,
    /// Mutating calls per principal; None: unlimited.
    pub rate: Option<RateSettings>,
    /// Tests of authentication before the policy engine: `required` with
    /// everybody authenticated allowed everything. Never set from a file.
    #[doc(hidden)]
    pub allow_all_for_tests: bool,
}

impl AuthSettings {
    /// What `cascade status` shows: "none", or "required: " and the means
    /// accepted ("certificate, jwt, token").
    pub fn describe(&self) -> String {
        match self.mode {
            AuthMode::Off => "none".to_owned(),
            AuthMode::Required => {
                let means: Vec<&str> = [
                    (self.client_certificates, "certificate"),
                    (self.jwt.is_some(), "jwt"),
                    (self.tokens_file.is_some(), "token"),
                ]
                .into_iter()
                .filter_map(|(on, name)| on.then_some(name))
                .collect();
                format!("required: {}", means.join(", "))
            }
        }
    }
}

/// `[audit]`, resolved: what the audit log keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditSettings {
    /// Entries older than this are pruned (default 90 days).
    pub retain: Duration,
    /// At most this many entries are kept (default 1,000,000): the oldest go first.
    pub max_entries: u64,
}

/// Audit entries are kept this long by default.
pub const DEFAULT_AUDIT_RETAIN: Duration = Duration::from_secs(90 * 24 * 3600);
/// At most this many audit entries are kept by default.
pub const DEFAULT_AUDIT_MAX_ENTRIES: u64 = 1_000_000;

impl Default for AuditSettings {
    fn default() -> Self {
        AuditSettings {
            retain: DEFAULT_AUDIT_RETAIN,
            max_entries: DEFAULT_AUDIT_MAX_ENTRIES,
        }
    }
}

/// Why the node cannot start with its `[auth]` settings.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("[auth] policy_file {0}")]
    Policy(#[from] policy::PolicyError),
    #[error("[auth] mode = \"required\" needs policy_file")]
    NoPolicy,
}

/// The authorizer a node starts with: everybody may do everything with
/// authentication off, the policy file's decisions otherwise (read and
/// validated now: a broken file is an error naming its line; then watched
/// for changes while the authorizer lives). Its metrics go to `registry`.
pub fn build_authorizer(
    settings: &AuthSettings,
    registry: &prometheus::Registry,
) -> Result<Arc<dyn Authorize>, AuthError> {
    match settings.mode {
        AuthMode::Off => Ok(Arc::new(AllowAll)),
        AuthMode::Required if settings.allow_all_for_tests => Ok(Arc::new(AllowAll)),
        AuthMode::Required => {
            let path = settings.policy_file.as_ref().ok_or(AuthError::NoPolicy)?;
            let authorizer = Arc::new(policy::PolicyAuthorizer::load(path, registry)?);
            tracing::info!(path = %path.display(), policies = authorizer.policies_in_force(),
                "policy loaded: {} policies in force", authorizer.policies_in_force());
            policy::watch_policy_file(Arc::downgrade(&authorizer));
            Ok(authorizer)
        }
    }
}
