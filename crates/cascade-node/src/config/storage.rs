//! `[storage]`'s keys of the postgres engine and the cluster's name: how
//! a node reaches its region's database, and the name a shared store
//! records with the region.

use super::{ConfigError, StorageConfig};
use crate::store::{check_schema_name, PostgresSettings, StorageEngine, DEFAULT_SCHEMA};

/// The environment variable a PostgreSQL password may come from when
/// `[storage] password_file` is not set.
pub const PG_PASSWORD_ENV: &str = "CASCADE_PG_PASSWORD";

/// The cluster's name unless the file names one.
pub const DEFAULT_CLUSTER: &str = "cascade";

/// The cluster's name: 1 to 63 of `[a-z0-9-]`, as it is recorded in a
/// shared store and compared at every start.
pub(super) fn check_cluster_name(name: &str) -> Result<String, ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(name.to_owned())
    } else {
        Err(ConfigError::Invalid {
            field: "cluster",
            message: format!(
                "{} is no cluster name: 1 to 63 lower-case letters, digits and -",
                cascade_core::limits::quote(name)
            ),
        })
    }
}

/// `[storage]`'s postgres keys: required with `engine = "postgres"` (the
/// url), refused with another engine (they would be silently unused).
/// The password comes from `password_file`, else from `env_password`
/// (`CASCADE_PG_PASSWORD`); it is never part of an error.
pub(super) fn postgres_settings(
    storage: &StorageConfig,
    engine: StorageEngine,
    cache_bytes: u64,
    env_password: Option<String>,
) -> Result<Option<PostgresSettings>, ConfigError> {
    if engine != StorageEngine::Postgres {
        let set = [
            ("storage.url", storage.url.is_some()),
            ("storage.password_file", storage.password_file.is_some()),
            ("storage.schema", storage.schema.is_some()),
        ];
        if let Some((field, _)) = set.into_iter().find(|(_, set)| *set) {
            return Err(ConfigError::Invalid {
                field,
                message: format!("is only used with engine = \"postgres\" (the engine is {engine})"),
            });
        }
        return Ok(None);
    }
    let url = storage.url.clone().ok_or(ConfigError::Invalid {
        field: "storage.url",
        message: "is required with engine = \"postgres\" (postgres://user@host:port/database)".into(),
    })?;
    let password = match &storage.password_file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Invalid {
                field: "storage.password_file",
                message: format!("cannot read {}: {e}", path.display()),
            })?;
            let password = text.lines().next().unwrap_or("").to_owned();
            if password.is_empty() {
                return Err(ConfigError::Invalid {
                    field: "storage.password_file",
                    message: format!("{} is empty: its first line is the password", path.display()),
                });
            }
            Some(password)
        }
        None => env_password.filter(|p| !p.is_empty()),
    };
    let schema = storage.schema.clone().unwrap_or_else(|| DEFAULT_SCHEMA.to_owned());
    check_schema_name(&schema).map_err(|message| ConfigError::Invalid {
        field: "storage.schema",
        message,
    })?;
    Ok(Some(PostgresSettings {
        url,
        password,
        schema,
        cache_bytes,
    }))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::ConfigFile;

    #[test]
    fn postgres_needs_a_url_and_takes_its_password_from_a_file_or_the_environment() {
        let storage =
            |text: &str| ConfigFile::parse(&format!("region = \"eu-1\"\n[storage]\n{text}"), Path::new("n.toml"));
        let resolve = |text: &str, env: Option<&str>| {
            let file = storage(text).unwrap();
            let engine = file.storage.engine.as_deref().unwrap_or("sled").parse().unwrap();
            postgres_settings(&file.storage, engine, 1 << 20, env.map(str::to_owned))
        };
        let message = |r: Result<Option<PostgresSettings>, ConfigError>| r.expect_err("refused").to_string();

        let pg = resolve(
            "engine = \"postgres\"\nurl = \"postgres://c@db:5432/x\"",
            Some("from-env"),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (
                pg.url.as_str(),
                pg.password.as_deref(),
                pg.schema.as_str(),
                pg.cache_bytes
            ),
            ("postgres://c@db:5432/x", Some("from-env"), "cascade", 1 << 20)
        );
        assert!(!format!("{pg:?}").contains("from-env"), "Debug hides the password");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "from-file\n").unwrap();
        let text = format!(
            "engine = \"postgres\"\nurl = \"host=db user=c\"\npassword_file = {:?}\nschema = \"eu_1\"",
            file.display()
        );
        let pg = resolve(&text, Some("from-env")).unwrap().unwrap();
        assert_eq!(
            (pg.password.as_deref(), pg.schema.as_str()),
            (Some("from-file"), "eu_1")
        );

        assert_eq!(
            message(resolve("engine = \"postgres\"", None)),
            "storage.url: is required with engine = \"postgres\" (postgres://user@host:port/database)"
        );
        assert_eq!(
            message(resolve("url = \"postgres://c@db/x\"", None)),
            "storage.url: is only used with engine = \"postgres\" (the engine is sled)"
        );
        assert!(message(resolve("engine = \"fjall\"\nschema = \"s\"", None)).starts_with("storage.schema: "));
        assert!(message(resolve(
            "engine = \"postgres\"\nurl = \"postgres://c@db/x\"\nschema = \"Eu-1\"",
            None
        ))
        .starts_with("storage.schema: \"Eu-1\" is no schema name"));
        let missing = dir.path().join("missing");
        let text = format!(
            "engine = \"postgres\"\nurl = \"postgres://c@db/x\"\npassword_file = {:?}",
            missing.display()
        );
        assert!(message(resolve(&text, None)).starts_with("storage.password_file: cannot read "));
        std::fs::write(&file, "\n").unwrap();
        let text = format!(
            "engine = \"postgres\"\nurl = \"postgres://c@db/x\"\npassword_file = {:?}",
            file.display()
        );
        assert!(message(resolve(&text, None)).contains("is empty"));
    }
}
