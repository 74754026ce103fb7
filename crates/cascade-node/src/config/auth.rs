//! `[auth]` and `[audit]`: how callers prove who they are, the policy that
//! decides what they may do, and what the audit log keeps.
//!
//! ```toml
//! [auth]
//! mode = "required"               # or "none": nobody is asked (must be chosen explicitly)
//! client_certificates = true      # with [tls]: a client certificate's SAN is the principal
//! client_ca = "tls/clients-ca.pem" # optional: a CA for client certificates besides [tls] ca
//! tokens_file = "auth/tokens.toml"
//! policy_file = "auth/policy.cedar"
//!
//! [auth.jwt]                      # optional: bearer JWTs
//! jwks_file = "auth/jwks.json"
//! issuer = "https://idp.example"
//! audience = "cascade"
//! groups_claim = "groups"         # default
//! leeway_ms = 30000               # skew allowed on exp and nbf (default 30 s)
//!
//! [auth.rate]                     # optional: mutating calls per principal
//! per_second = 20
//! burst = 40
//!
//! [audit]                         # all optional
//! retain = "90d"                  # entries older than this are pruned
//! max_entries = 1000000           # and beyond this many, the oldest
//! ```

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use crate::auth::{AuditSettings, AuthMode, AuthSettings, JwtSettings, RateSettings};

/// `[auth]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// `required` or `none`.
    pub mode: Option<String>,
    #[serde(default)]
    pub client_certificates: bool,
    pub client_ca: Option<PathBuf>,
    pub tokens_file: Option<PathBuf>,
    pub policy_file: Option<PathBuf>,
    pub jwt: Option<JwtConfig>,
    pub rate: Option<RateConfig>,
}

/// `[auth.jwt]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    pub jwks_file: Option<PathBuf>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub groups_claim: Option<String>,
    pub leeway_ms: Option<u64>,
}

/// `[auth.rate]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateConfig {
    pub per_second: Option<f64>,
    pub burst: Option<u32>,
}

/// `[audit]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    /// A duration (`90d`, `12h`).
    pub retain: Option<String>,
    pub max_entries: Option<u64>,
}

/// The skew allowed on a JWT's `exp` and `nbf` unless `leeway_ms` says otherwise.
pub const DEFAULT_JWT_LEEWAY: Duration = Duration::from_secs(30);

fn invalid(field: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        message: message.into(),
    }
}

/// What a file without `[auth]` is told: the two choices, by name.
pub const AUTH_REQUIRED_MESSAGE: &str = "is required in a config file: add [auth] with mode = \"required\" \
     (every call authenticated and authorized by policy_file; see README \"Security\") or mode = \"none\" \
     (nobody is asked: anyone who can reach the node may create and delete anything)";

/// `[auth]` resolved. A config file must have `[auth]` (no authentication
/// is a choice made explicitly, never a default); `admin_gate` says the
/// file configures `[admin] token` or `identities`, which `required`
/// replaces and so refuses.
pub(super) fn auth_settings(
    file: Option<&AuthConfig>,
    tls: bool,
    admin_gate: bool,
) -> Result<AuthSettings, ConfigError> {
    let Some(file) = file else {
        return Err(invalid("auth", AUTH_REQUIRED_MESSAGE));
    };
    let mode = match file.mode.as_deref() {
        Some("required") => AuthMode::Required,
        Some("none") => AuthMode::Off,
        Some(other) => {
            return Err(invalid(
                "auth.mode",
                format!(
                    "{} is no mode: \"required\" or \"none\"",
                    cascade_core::limits::quote(other)
                ),
            ))
        }
        None => return Err(invalid("auth.mode", "is required: \"required\" or \"none\"")),
    };
    if let Some(path) = &file.client_ca {
        // Its certificates identify clients only: the node classifies a
        // chain after the handshake (`api/tls_accept.rs`), so a leaf of it
        // naming a region is refused, never taken for that region.
        if !tls {
            return Err(invalid("auth.client_ca", "needs [tls]"));
        }
        if !file.client_certificates {
            return Err(invalid(
                "auth.client_ca",
                "needs client_certificates = true: its certificates identify clients",
            ));
        }
        cascade_tls::ClientCa::load(path).map_err(|e| invalid("auth.client_ca", e.to_string()))?;
    }
    if file.client_certificates && !tls {
        return Err(invalid("auth.client_certificates", "needs [tls]"));
    }
    let jwt = match &file.jwt {
        None => None,
        Some(j) => Some(JwtSettings {
            jwks_file: j
                .jwks_file
                .clone()
                .ok_or_else(|| invalid("auth.jwt.jwks_file", "is required"))?,
            issuer: j
                .issuer
                .clone()
                .ok_or_else(|| invalid("auth.jwt.issuer", "is required"))?,
            audience: j
                .audience
                .clone()
                .ok_or_else(|| invalid("auth.jwt.audience", "is required"))?,
            groups_claim: j.groups_claim.clone().unwrap_or_else(|| "groups".to_owned()),
            leeway: j.leeway_ms.map(Duration::from_millis).unwrap_or(DEFAULT_JWT_LEEWAY),
        }),
    };
    let rate = match &file.rate {
        None => None,
        Some(r) => {
            let per_second = r
                .per_second
                .ok_or_else(|| invalid("auth.rate.per_second", "is required"))?;
            if !(per_second.is_finite() && per_second > 0.0) {
                return Err(invalid("auth.rate.per_second", "must be a positive number"));
            }
            let burst = r.burst.unwrap_or(per_second.ceil().max(1.0) as u32);
            if burst == 0 {
                return Err(invalid("auth.rate.burst", "must be at least 1"));
            }
            Some(RateSettings { per_second, burst })
        }
    };
    let settings = AuthSettings {
        mode,
        client_certificates: file.client_certificates,
        client_ca: file.client_ca.clone(),
        tokens_file: file.tokens_file.clone(),
        jwt,
        policy_file: file.policy_file.clone(),
        rate,
        allow_all_for_tests: false,
    };
    if mode == AuthMode::Required {
        if admin_gate {
            return Err(invalid(
                "admin",
                "token and identities are refused with [auth] mode = \"required\": \
                 use tokens_file/client certificates and the policy (admin.* verbs)",
            ));
        }
        if settings.policy_file.is_none() {
            return Err(invalid("auth.policy_file", "is required with mode = \"required\""));
        }
        if !settings.client_certificates && settings.tokens_file.is_none() && settings.jwt.is_none() {
            return Err(invalid(
                "auth",
                "mode = \"required\" needs a means: client_certificates, tokens_file or [auth.jwt]",
            ));
        }
    }
    Ok(settings)
}

/// `[audit]` resolved.
pub(super) fn audit_settings(file: &AuditConfig) -> Result<AuditSettings, ConfigError> {
    let mut settings = AuditSettings::default();
    if let Some(text) = &file.retain {
        settings.retain = humantime::parse_duration(text).map_err(|e| {
            invalid(
                "audit.retain",
                format!(
                    "{}: {e} (a duration such as 90d or 12h)",
                    cascade_core::limits::quote(text)
                ),
            )
        })?;
    }
    if let Some(n) = file.max_entries {
        if n == 0 {
            return Err(invalid("audit.max_entries", "must be at least 1"));
        }
        settings.max_entries = n;
    }
    Ok(settings)
}
