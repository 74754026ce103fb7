//! A region of several nodes over one database (`[storage] engine =
//! "postgres"`): the `[ha]` settings, when a writer's own clock says its
//! lease may have run out, and what the writer's `Node` knows of its role.
//!
//! The loop that decides whether a process is the writer or a standby is at
//! the wire edge (`api/roles.rs`), since it chooses which server runs; this
//! module is what that loop and the node share, below the node.
//!
//! Safety never depends on this module's timing: every commit is fenced by
//! the lease's epoch inside its own transaction (`store/lease.rs`). The
//! local deadline only makes a writer that cannot renew stop accepting work
//! before the database would refuse it, so that clients are told to go
//! elsewhere instead of waiting on commits that will fail.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use crate::store::{LeaseHolder, WriterLease};

/// The lease's time to live unless `[ha] lease_ttl_ms` says otherwise: a
/// standby takes over about this long after the writer's last renew.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);

/// The shortest and longest time to live accepted: below a second a busy
/// database's latency alone would make writers step down; above five
/// minutes a dead writer stalls its region for as long.
pub const LEASE_TTL_RANGE: std::ops::RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(300);

/// `[ha]`: a node's name and address among its region's nodes, and the
/// lease's timing. Every key optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HaConfig {
    /// Unique within the region (default: the advertised address).
    pub node_name: Option<String>,
    /// Where the region's other nodes and clients reach this node, with
    /// its scheme (`http://10.0.0.7:50051`). Default: the listening
    /// address, which must then not be a wildcard (0.0.0.0, ::).
    pub advertise: Option<String>,
    /// The lease's time to live (default 5000).
    pub lease_ttl_ms: Option<u64>,
    /// How often the writer renews it (default a quarter of the time to
    /// live; at most half of it).
    pub renew_every_ms: Option<u64>,
}

/// `[ha]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaSettings {
    pub node_name: Option<String>,
    pub advertise: Option<String>,
    pub lease_ttl: Duration,
    pub renew_every: Duration,
}

impl Default for HaSettings {
    fn default() -> Self {
        Self {
            node_name: None,
            advertise: None,
            lease_ttl: DEFAULT_LEASE_TTL,
            renew_every: DEFAULT_LEASE_TTL / 4,
        }
    }
}

/// Longest node name and advertised address (they are stored in the
/// lease and members rows and shown by `cascade status`).
pub const MAX_NODE_NAME_BYTES: usize = 128;
pub const MAX_ADVERTISE_BYTES: usize = 256;

/// What is wrong with `[ha]`: the key and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ha.{field}: {message}")]
pub struct HaConfigError {
    pub field: &'static str,
    pub message: String,
}

impl HaSettings {
    pub fn from_config(config: &HaConfig) -> Result<Self, HaConfigError> {
        let invalid = |field, message: String| HaConfigError { field, message };
        let mut settings = HaSettings::default();
        if let Some(ms) = config.lease_ttl_ms {
            let ttl = Duration::from_millis(ms);
            if !LEASE_TTL_RANGE.contains(&ttl) {
                return Err(invalid(
                    "lease_ttl_ms",
                    format!(
                        "{ms} is outside {}..={}",
                        LEASE_TTL_RANGE.start().as_millis(),
                        LEASE_TTL_RANGE.end().as_millis()
                    ),
                ));
            }
            settings.lease_ttl = ttl;
            settings.renew_every = ttl / 4;
        }
        if let Some(ms) = config.renew_every_ms {
            let every = Duration::from_millis(ms);
            // Renewing more often than a tenth of the TTL only loads the
            // database; less often than half leaves one failed renew no room.
            let (low, high) = (settings.lease_ttl / 10, settings.lease_ttl / 2);
            if every < low || every > high {
                return Err(invalid(
                    "renew_every_ms",
                    format!(
                        "{ms} is outside {}..={} (a tenth to a half of lease_ttl_ms)",
                        low.as_millis(),
                        high.as_millis()
                    ),
                ));
            }
            settings.renew_every = every;
        }
        if let Some(name) = &config.node_name {
            if name.is_empty() || name.len() > MAX_NODE_NAME_BYTES || name.chars().any(char::is_control) {
                return Err(invalid(
                    "node_name",
                    format!("must be 1 to {MAX_NODE_NAME_BYTES} bytes without control characters"),
                ));
            }
            settings.node_name = Some(name.clone());
        }
        if let Some(address) = &config.advertise {
            check_advertise(address).map_err(|m| invalid("advertise", m))?;
            settings.advertise = Some(address.clone());
        }
        Ok(settings)
    }

    /// Who this node is among its region's nodes, listening on `bound`
    /// (`tls`: its address is `https://`).
    pub fn holder(&self, bound: std::net::SocketAddr, tls: bool) -> Result<LeaseHolder, HaConfigError> {
        let address = match &self.advertise {
            Some(a) => a.clone(),
            None if bound.ip().is_unspecified() => {
                return Err(HaConfigError {
                    field: "advertise",
                    message: format!(
                        "is required when listening on {bound}: the region's other nodes and its clients \
                         need an address they can reach this node at (e.g. http://10.0.0.7:{})",
                        bound.port()
                    ),
                })
            }
            None => format!("{}://{bound}", if tls { "https" } else { "http" }),
        };
        Ok(LeaseHolder {
            node: self.node_name.clone().unwrap_or_else(|| address.clone()),
            address,
            version: env!("CARGO_PKG_VERSION").to_owned(),
        })
    }

    /// How long before the lease's expiry (by the database's clock) the
    /// writer stops on its own clock: a tenth of the time to live, at
    /// least 100 ms, for clocks that run at slightly different rates.
    pub fn margin(&self) -> Duration {
        (self.lease_ttl / 10).max(Duration::from_millis(100))
    }

    /// The writer's own deadline for a lease granted or renewed by a
    /// request sent at `sent_at`: the database set its expiry after it
    /// received the request, so `sent_at + ttl` is never later than the
    /// real expiry, less the margin for clock rates.
    pub fn valid_until(&self, sent_at: Instant) -> Instant {
        sent_at + self.lease_ttl.saturating_sub(self.margin())
    }
}

fn check_advertise(address: &str) -> Result<(), String> {
    let prefix: String = address.chars().take(64).collect();
    if address.len() > MAX_ADVERTISE_BYTES {
        return Err(format!("{prefix:?}… is longer than {MAX_ADVERTISE_BYTES} bytes"));
    }
    let rest = address
        .strip_prefix("http://")
        .or_else(|| address.strip_prefix("https://"))
        .ok_or_else(|| format!("{prefix:?} must start with http:// or https://"))?;
    if rest.is_empty() || rest.contains(char::is_whitespace) {
        return Err(format!("{prefix:?} has no host:port"));
    }
    http::Uri::try_from(address).map_err(|e| format!("{prefix:?}: {e}"))?;
    Ok(())
}

/// What the writer's `Node` knows of its role: shown by `cascade status`
/// and the metrics, and how it reads the region's other nodes.
#[derive(Clone)]
pub struct WriterRole {
    /// This node.
    pub me: LeaseHolder,
    /// The epoch it holds: every commit is fenced with it.
    pub epoch: u64,
    /// The region's lease (its members rows, for status).
    pub lease: Arc<dyn WriterLease>,
    /// Times this process took the lease over since it started.
    pub takeovers: Arc<AtomicU64>,
}

impl WriterRole {
    pub fn takeovers(&self) -> u64 {
        self.takeovers.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for WriterRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterRole")
            .field("me", &self.me)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(ttl: Option<u64>, renew: Option<u64>) -> HaConfig {
        HaConfig {
            lease_ttl_ms: ttl,
            renew_every_ms: renew,
            ..HaConfig::default()
        }
    }

    #[test]
    fn the_lease_renews_well_inside_its_time_to_live() {
        let s = HaSettings::from_config(&HaConfig::default()).unwrap();
        assert_eq!(
            (s.lease_ttl, s.renew_every),
            (Duration::from_secs(5), Duration::from_millis(1250))
        );
        let s = HaSettings::from_config(&config(Some(10_000), None)).unwrap();
        assert_eq!(s.renew_every, Duration::from_millis(2500));
        let s = HaSettings::from_config(&config(Some(10_000), Some(1_000))).unwrap();
        assert_eq!(s.renew_every, Duration::from_secs(1));
        let e = HaSettings::from_config(&config(Some(10_000), Some(6_000))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ha.renew_every_ms: 6000 is outside 1000..=5000 (a tenth to a half of lease_ttl_ms)"
        );
        let e = HaSettings::from_config(&config(Some(500), None)).unwrap_err();
        assert_eq!(e.to_string(), "ha.lease_ttl_ms: 500 is outside 1000..=300000");
    }

    #[test]
    // A fixed instant to add to; no time passes.
    #[allow(clippy::disallowed_methods)]
    fn the_writers_own_deadline_comes_before_the_databases() {
        let s = HaSettings::from_config(&config(Some(5_000), None)).unwrap();
        let sent = Instant::now();
        assert_eq!(s.valid_until(sent) - sent, Duration::from_millis(4_500));
        let s = HaSettings::from_config(&config(Some(1_000), None)).unwrap();
        assert_eq!(s.valid_until(sent) - sent, Duration::from_millis(900));
    }

    #[test]
    fn a_wildcard_listener_needs_an_advertised_address() {
        let s = HaSettings::default();
        let e = s.holder("0.0.0.0:50051".parse().unwrap(), false).unwrap_err();
        assert_eq!(e.field, "advertise");
        assert!(e.message.contains("is required when listening on 0.0.0.0:50051"), "{e}");
        let me = s.holder("127.0.0.1:50051".parse().unwrap(), true).unwrap();
        assert_eq!(me.address, "https://127.0.0.1:50051");
        assert_eq!(me.node, me.address);
        let named = HaSettings::from_config(&HaConfig {
            node_name: Some("eu-west-0".into()),
            advertise: Some("http://eu-west-0.cascade:50051".into()),
            ..HaConfig::default()
        })
        .unwrap();
        let me = named.holder("0.0.0.0:50051".parse().unwrap(), false).unwrap();
        assert_eq!(
            (me.node.as_str(), me.address.as_str()),
            ("eu-west-0", "http://eu-west-0.cascade:50051")
        );
    }

    #[test]
    fn bad_names_and_addresses_are_refused_quoting_a_prefix() {
        let bad = |advertise: &str| {
            HaSettings::from_config(&HaConfig {
                advertise: Some(advertise.into()),
                ..HaConfig::default()
            })
            .unwrap_err()
            .to_string()
        };
        assert!(bad("10.0.0.7:50051").contains("must start with http:// or https://"));
        assert!(bad("http://").contains("has no host:port"));
        let long = format!("http://{}", "a".repeat(1000));
        let e = bad(&long);
        assert!(e.contains("longer than 256 bytes") && e.len() < 200, "{e}");
        let e = HaSettings::from_config(&HaConfig {
            node_name: Some("a\nb".into()),
            ..HaConfig::default()
        })
        .unwrap_err();
        assert_eq!(e.field, "node_name");
    }
}
