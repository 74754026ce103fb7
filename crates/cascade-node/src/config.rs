//! Node configuration: a TOML file, overridden by flags and environment
//! (the binary does that), resolved into [`NodeSettings`].
//!
//! ```toml
//! region = "eu-1"
//! listen = "127.0.0.1:50051"
//! data_dir = "data/eu-1"
//! schema = "deploy/schemas/neutron.toml"   # optional: the embedded example
//!
//! [peers]             # the other regions of the cluster
//! us-east = "http://127.0.0.1:50052"
//!
//! [deletion]          # all optional
//! batch_budget = 512
//! max_attempts = 20
//! backoff_base_ms = 1000
//! backoff_cap_ms = 60000
//! tick_ms = 200
//! check_interval_ms = 30000   # re-check remote back-references of waiting deletions
//! outbox_retention = 100000   # events kept after every peer acknowledged them
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cascade_core::schema::EXAMPLE_SCHEMA;
use cascade_core::{Policy, RegionId, Schema};
use serde::Deserialize;

use crate::service::ApiLimits;

/// The file as written. Every field may also come from a flag or the environment.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub region: Option<String>,
    pub listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub schema: Option<PathBuf>,
    /// Region → gRPC address of the node that owns it.
    #[serde(default)]
    pub peers: BTreeMap<String, String>,
    #[serde(default)]
    pub deletion: DeletionConfig,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeletionConfig {
    pub batch_budget: Option<usize>,
    pub max_attempts: Option<u32>,
    pub backoff_base_ms: Option<u64>,
    pub backoff_cap_ms: Option<u64>,
    pub tick_ms: Option<u64>,
    pub check_interval_ms: Option<u64>,
    pub outbox_retention: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{field}: {message}")]
    Invalid { field: &'static str, message: String },
}

impl ConfigFile {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })
    }
}

/// Everything a node needs to start, validated.
#[derive(Clone)]
pub struct NodeSettings {
    pub region: RegionId,
    pub schema: Arc<Schema>,
    /// None: in-memory store (simulation and quick experiments; nothing survives).
    pub data_dir: Option<PathBuf>,
    pub policy: Policy,
    pub tick: Duration,
    pub limits: ApiLimits,
    /// Other regions and their addresses.
    pub peers: BTreeMap<RegionId, String>,
    /// How long a cross-region back-reference of a waiting deletion may go
    /// unreleased before the owner asks the importer whether it still stands.
    pub check_interval: Duration,
    /// Outbox events kept even when every peer has acknowledged them.
    pub outbox_retention: u64,
}

impl NodeSettings {
    /// Settings with the embedded example schema and default tunables.
    pub fn new(region: RegionId, schema: Arc<Schema>, data_dir: Option<PathBuf>) -> Self {
        Self {
            region,
            schema,
            data_dir,
            policy: Policy::default(),
            tick: Duration::from_millis(200),
            limits: ApiLimits::default(),
            peers: BTreeMap::new(),
            check_interval: Duration::from_secs(30),
            outbox_retention: 100_000,
        }
    }

    pub fn from_file(file: &ConfigFile) -> Result<Self, ConfigError> {
        let region = file.region.as_deref().ok_or(ConfigError::Invalid {
            field: "region",
            message: "is required".into(),
        })?;
        let region = RegionId::parse(region).map_err(|e| ConfigError::Invalid {
            field: "region",
            message: e.to_string(),
        })?;
        let schema = load_schema(file.schema.as_deref())?;
        let mut settings = Self::new(region, Arc::new(schema), file.data_dir.clone());
        let d = &file.deletion;
        if let Some(v) = d.batch_budget {
            if v == 0 {
                return Err(ConfigError::Invalid {
                    field: "deletion.batch_budget",
                    message: "must be at least 1".into(),
                });
            }
            settings.policy.batch_budget = v;
        }
        if let Some(v) = d.max_attempts {
            settings.policy.max_attempts = v;
        }
        if let Some(v) = d.backoff_base_ms {
            settings.policy.backoff_base_ms = v;
        }
        if let Some(v) = d.backoff_cap_ms {
            settings.policy.backoff_cap_ms = v;
        }
        if let Some(v) = d.tick_ms {
            settings.tick = Duration::from_millis(v.max(10));
        }
        if let Some(v) = d.outbox_retention {
            settings.outbox_retention = v;
        }
        if let Some(v) = d.check_interval_ms {
            settings.check_interval = Duration::from_millis(v.max(10));
        }
        for (region, addr) in &file.peers {
            let id = RegionId::parse(region).map_err(|e| ConfigError::Invalid {
                field: "peers",
                message: e.to_string(),
            })?;
            if id == settings.region {
                return Err(ConfigError::Invalid {
                    field: "peers",
                    message: format!("{region} is this node's own region"),
                });
            }
            if !(addr.starts_with("http://") || addr.starts_with("https://")) {
                return Err(ConfigError::Invalid {
                    field: "peers",
                    message: format!("{region}: address {addr:?} must start with http:// or https://"),
                });
            }
            settings.peers.insert(id, addr.clone());
        }
        Ok(settings)
    }
}

/// Loads a schema file, or the embedded example when none is given.
pub fn load_schema(path: Option<&Path>) -> Result<Schema, ConfigError> {
    let (text, path) = match path {
        Some(p) => (
            std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.to_owned(),
                source,
            })?,
            p.to_owned(),
        ),
        None => (EXAMPLE_SCHEMA.to_owned(), PathBuf::from("<embedded example schema>")),
    };
    Schema::from_toml(&text).map_err(|e| ConfigError::Parse {
        path,
        message: e.to_string(),
    })
}
