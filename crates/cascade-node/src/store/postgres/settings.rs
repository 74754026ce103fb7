//! Where the PostgreSQL store connects, how its sessions are bounded, and
//! what its errors say: the target named in every error (host:port,
//! database, user; never the password), and which failures may clear
//! ([`StoreError::Unavailable`], retried by the writer) and which do not.

use std::fmt;
use std::time::Duration;

use tokio_postgres::config::Host;
use tokio_postgres::error::SqlState;

use crate::store::{DiskCondition, StoreError, DEFAULT_CACHE_BYTES};

/// The PostgreSQL schema (namespace) a region's tables live in unless
/// `[storage] schema` names another.
pub const DEFAULT_SCHEMA: &str = "cascade";

/// Opening a TCP connection (and authenticating): an unreachable server
/// is an error within this, not a hang.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Data sent and not acknowledged for this long closes the connection:
/// a server that vanished (no RST) is noticed within it.
pub(super) const TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);
/// TCP keepalive probes start after this much silence.
pub(super) const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
/// The longest a statement of the writer's session runs: inside a default
/// lease TTL (5 s), so a stuck commit cannot outlive the lease by much.
pub(super) const WRITER_STATEMENT_TIMEOUT: Duration = Duration::from_secs(4);
/// The longest a read or a lease statement runs.
pub(super) const READ_STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest any statement waits for a row lock: a takeover waits for
/// a commit in flight (its share lock on the lease row) at most this long
/// per try, and a renew likewise.
pub(super) const LOCK_TIMEOUT: Duration = Duration::from_secs(1);
/// A writer paused inside a transaction (SIGSTOP between statements) has
/// its session ended after this, which releases its share lock on the
/// lease row, so a takeover never waits on it for longer.
pub(super) const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(2);
/// Waiting for a pooled connection, creating one, recycling one.
pub(super) const POOL_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections for reads and the lease's statements (the writer has one of
/// its own, whose session carries the timeouts above).
pub(super) const READ_POOL_SIZE: usize = 4;

/// How a node reaches its region's PostgreSQL (`[storage]` with `engine =
/// "postgres"`).
#[derive(Clone)]
pub struct PostgresSettings {
    /// `postgres://user@host:port/database` or a libpq `key=value` string,
    /// without a password.
    pub url: String,
    /// From `[storage] password_file` or `CASCADE_PG_PASSWORD`; never
    /// shown (not even by `Debug`).
    pub password: Option<String>,
    /// The PostgreSQL schema holding this region's tables.
    pub schema: String,
    /// The read cache's bound, in bytes (`[storage] cache_mb`).
    pub cache_bytes: u64,
}

impl PostgresSettings {
    /// Settings for `url` with the default schema and cache.
    pub fn new(url: impl Into<String>, password: Option<String>) -> Self {
        Self {
            url: url.into(),
            password,
            schema: DEFAULT_SCHEMA.to_owned(),
            cache_bytes: DEFAULT_CACHE_BYTES,
        }
    }
}

impl fmt::Debug for PostgresSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresSettings")
            .field("url", &self.url)
            .field("password", &self.password.as_ref().map(|_| "<hidden>"))
            .field("schema", &self.schema)
            .field("cache_bytes", &self.cache_bytes)
            .finish()
    }
}

/// Why a `[storage] schema` is no PostgreSQL schema name this store uses:
/// lower-case letters, digits and `_`, starting with a letter or `_`, at
/// most 63 bytes (so it needs no quoting anywhere).
pub fn check_schema_name(schema: &str) -> Result<(), String> {
    let mut chars = schema.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if first_ok && rest_ok && schema.len() <= 63 {
        Ok(())
    } else {
        Err(format!(
            "{} is no schema name: lower-case letters, digits and _, starting with a letter or _, at most 63",
            cascade_core::limits::quote(schema)
        ))
    }
}

/// What the store connects to, as errors name it.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub(super) server: String,
    pub(super) database: String,
    pub(super) user: String,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PostgreSQL at {} (database {:?}, user {:?})",
            self.server, self.database, self.user
        )
    }
}

/// The driver's configuration for `settings` (the password set from the
/// settings, never from the URL), and the target it names.
pub(super) fn connection_config(settings: &PostgresSettings) -> Result<(tokio_postgres::Config, Target), StoreError> {
    let mut config: tokio_postgres::Config = settings.url.parse().map_err(|e| {
        StoreError::Engine(format!(
            "storage.url is not a PostgreSQL URL (postgres://user@host:port/database) \
             or key=value string: {e}"
        ))
    })?;
    if config.get_password().is_some() {
        return Err(StoreError::Engine(
            "storage.url carries a password: put it in storage.password_file or CASCADE_PG_PASSWORD, \
             which are never logged"
                .into(),
        ));
    }
    let hosts = config.get_hosts();
    let Some(host) = hosts.first() else {
        return Err(StoreError::Engine("storage.url names no host".into()));
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let server = match host {
        Host::Tcp(name) if name.contains(':') => format!("[{name}]:{port}"),
        Host::Tcp(name) => format!("{name}:{port}"),
        Host::Unix(dir) => format!("{}/.s.PGSQL.{port}", dir.display()),
    };
    let user = config.get_user().unwrap_or("").to_owned();
    if user.is_empty() {
        return Err(StoreError::Engine(format!(
            "storage.url names no user (postgres://USER@{server}/database)"
        )));
    }
    let database = config.get_dbname().unwrap_or(&user).to_owned();
    if let Some(password) = &settings.password {
        config.password(password.as_bytes());
    }
    config
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_user_timeout(TCP_USER_TIMEOUT)
        .keepalives(true)
        .keepalives_idle(KEEPALIVE_IDLE)
        .application_name("cascade");
    Ok((config, Target { server, database, user }))
}

/// `config` with session settings added to what its URL set (`options`),
/// and sequential scans off.
///
/// Why: every statement of the store reads or writes by key or key range
/// of a table's primary key, and each is prepared once per connection,
/// so after five runs PostgreSQL keeps a generic plan, planned once. One
/// planned while a table was empty was a sequential scan (cheapest
/// then), kept while the table grew: a read-ahead's `outcomes` read
/// (a cascade fills that table from empty) took over 3 ms at a time, and
/// P1 at 1M spent 37–63 % of its wall in read-aheads. Off, a sequential
/// scan is only planned where no index serves.
pub(super) fn with_session(config: &tokio_postgres::Config, settings: &[(&str, Duration)]) -> tokio_postgres::Config {
    let mut config = config.clone();
    let mut options = config.get_options().unwrap_or("").to_owned();
    for (name, value) in settings {
        options.push_str(&format!(" -c {name}={}", value.as_millis()));
    }
    options.push_str(" -c enable_seqscan=off");
    config.options(options.trim_start().to_owned());
    config
}

/// A driver error while the store runs: [`StoreError::Unavailable`] when it
/// may clear (the server unreachable, restarting or shutting down, a
/// timeout, a lock not granted in time), else [`StoreError::Engine`].
pub(super) fn classify(e: &tokio_postgres::Error, doing: &str, target: &Target) -> StoreError {
    let message = format!("{target}: {doing}: {}", describe(e));
    if may_clear(e) {
        StoreError::Unavailable {
            condition: DiskCondition::DatabaseUnreachable,
            message,
        }
    } else {
        StoreError::Engine(message)
    }
}

fn may_clear(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        Some(code) => {
            let class = &code.code()[..2];
            // 08: connection exception; 57: operator intervention
            // (shutdown, statement timeout); 53: insufficient resources
            // (too many connections); 55P03: lock not available; 40:
            // serialization failure or deadlock.
            matches!(class, "08" | "57" | "53" | "40") || *code == SqlState::LOCK_NOT_AVAILABLE
        }
        // No answer from the server at all: a connection that closed or
        // could not be made.
        None => true,
    }
}

/// The driver's error with the server's own message and detail when it
/// sent one (the driver's Display says only "db error").
pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => match db.detail() {
            Some(detail) => format!("{} ({detail}; SQLSTATE {})", db.message(), db.code().code()),
            None => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        },
        None => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                let more = s.to_string();
                if !text.contains(&more) {
                    text.push_str(": ");
                    text.push_str(&more);
                }
                source = s.source();
            }
            text
        }
    }
}

/// The error of the first connection, at open: what is wrong, named.
pub(super) fn open_error(e: &tokio_postgres::Error, target: &Target) -> StoreError {
    let code = e.code();
    let hint =
        if code == Some(&SqlState::INVALID_PASSWORD) || code == Some(&SqlState::INVALID_AUTHORIZATION_SPECIFICATION) {
            " (check storage.password_file or CASCADE_PG_PASSWORD)"
        } else if code == Some(&SqlState::INVALID_CATALOG_NAME) {
            " (create the database, or fix storage.url)"
        } else if code.is_none() {
            " (is the server up, and the host and port in storage.url right?)"
        } else {
            ""
        };
    StoreError::Engine(format!("cannot connect to {target}: {}{hint}", describe(e)))
}

/// A pool's failure to hand out a connection.
pub(super) fn pool_error(e: deadpool_postgres::PoolError, target: &Target) -> StoreError {
    use deadpool_postgres::PoolError;
    match e {
        PoolError::Backend(e) => classify(&e, "cannot connect", target),
        PoolError::Timeout(kind) => StoreError::Unavailable {
            condition: DiskCondition::DatabaseUnreachable,
            message: format!("{target}: no connection within {POOL_TIMEOUT:?} ({kind:?})"),
        },
        other => StoreError::Engine(format!("{target}: connection pool: {other}")),
    }
}
