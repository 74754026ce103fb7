//! Reloading the schema file while the node runs (issue 31): on SIGHUP to
//! `cascade serve` ([`crate::reload_signal::reload_on_sighup`]), when the file changes (a
//! debounced watch of its directory, [`spawn_watch`]), and on a call
//! ([`SchemaReloader::reload`], which both of them call too, as does
//! `RunningNode::reload_schema`).
//!
//! A reload reads the file (at most [`MAX_SCHEMA_FILE_BYTES`]), loads it
//! with the same checks as `cascade schema check` (a file that is not TOML
//! names its line, a broken rule its path: an unknown kind, a cycle of
//! `block` references, an empty file) and the `retain` bound of
//! `[limits] max_retention`, then hands it to the writer, which checks it
//! against the stored data and puts it in force between two steps
//! (`writer/schema_swap.rs`). Every refusal leaves the schema in force as
//! it was, is logged (WARN) and audited for the operator; the node keeps
//! serving.
//!
//! Why a file-watching crate (`notify` with `notify-debouncer-mini`)
//! rather than polling the file as the policy file is: an edit is seen in
//! the debounce window (a quarter of a second), not the next poll, without
//! reading the file every second for a change that comes a few times a
//! year; the debouncer folds an editor's burst of events (write, rename,
//! chmod) into one reload. The directory is watched, not the file: editors
//! replace a file by renaming a new one over it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cascade_core::schema::SchemaDiff;
use cascade_core::{RegionId, Schema, SchemaError};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::codec::StoreState;
use crate::schema_in_force::{InForce, SchemaHolder, SchemaVersion};
use crate::store::{Batch, Store, StoreError, Table};
use crate::writer::{compat_check, Judged, ReloadCause, Swapped, WriterHandle};

/// The largest schema file a reload reads (a schema at its bounds, 1,024
/// kinds of 128 references, is far smaller).
/// `Admin.CheckSchema` takes as much (`cascade_proto::bounds`).
pub const MAX_SCHEMA_FILE_BYTES: u64 = cascade_proto::bounds::MAX_SCHEMA_TEXT_BYTES as u64;

/// How long the watcher waits for a burst of file events to end before it
/// reloads once.
pub const WATCH_DEBOUNCE: Duration = Duration::from_millis(250);

/// A reload that put a schema in force, or found nothing to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// The new schema is in force; `diff` is what changed.
    Applied {
        from: SchemaVersion,
        to: SchemaVersion,
        diff: String,
    },
    /// The file declares the schema in force (same kinds, references and
    /// label).
    Unchanged(SchemaVersion),
}

/// Why a reload was refused: the schema in force stays.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReloadError {
    /// The node was given its schema as data or runs the embedded example.
    #[error(
        "this node has no schema file (it runs the embedded example schema or one given as data): nothing to reload"
    )]
    NoFile,
    /// The file could not be read.
    #[error("{path}: cannot read the schema file: {message}")]
    Read { path: String, message: String },
    /// The file is larger than a schema file may be.
    #[error("{path}: more than {MAX_SCHEMA_FILE_BYTES} bytes, the most a schema file may hold")]
    TooLarge { path: String },
    /// The file does not load: its line (not TOML) or its path (a rule).
    #[error("{path}: {error}")]
    Invalid { path: String, error: SchemaError },
    /// A `retain` longer than `[limits] max_retention`.
    #[error("{path}: kinds.{kind}.retain: {retain} is longer than [limits] max_retention ({max})")]
    Retention {
        path: String,
        kind: String,
        retain: String,
        max: String,
    },
    /// The stored data forbids a change: one reason per change, each with
    /// its count.
    #[error("{path}: refused: {}", .reasons.join("; "))]
    Incompatible { path: String, reasons: Vec<String> },
    /// The writer did not take it (stopped, or the store refused the
    /// audit entry's commit).
    #[error("the writer did not take the schema: {0}")]
    Writer(String),
}

/// What a schema would change against the schema in force, and what the
/// stored data would refuse of it (`Admin.CheckSchema`): nothing changes.
#[derive(Debug, Clone)]
pub struct SchemaCheck {
    pub in_force: SchemaVersion,
    pub checked: SchemaVersion,
    pub diff: SchemaDiff,
    pub judged: Vec<Judged>,
}

impl SchemaCheck {
    /// A reload of it would be refused.
    pub fn refused(&self) -> bool {
        self.judged.iter().any(|j| j.refusal.is_some())
    }
}

/// Loads `text` as a reload loads its file (`shown` names it in errors) and
/// runs the compatibility check against `store` and the schema in force,
/// changing nothing. Reads the store on the calling thread (at most one
/// bounded count per change).
pub(crate) fn check_text(
    holder: &SchemaHolder,
    store: &dyn Store,
    region: &str,
    text: &str,
    shown: &str,
    max_retention_ms: u64,
) -> Result<SchemaCheck, ReloadError> {
    let schema = load_text(text, shown, max_retention_ms)?;
    let current = holder.current();
    let diff = current.schema.diff(&schema);
    let judged = compat_check(&StoreState { store }, region, &diff).map_err(|e| ReloadError::Read {
        path: shown.to_owned(),
        message: format!("the store did not answer the check: {e}"),
    })?;
    Ok(SchemaCheck {
        in_force: current.version.clone(),
        checked: SchemaVersion::of(&schema),
        diff,
        judged,
    })
}

/// What a reload needs of its node; cheap to clone.
#[derive(Clone)]
pub struct SchemaReloader(Arc<Inner>);

struct Inner {
    holder: Arc<SchemaHolder>,
    writer: WriterHandle,
    region: RegionId,
    max_retention_ms: u64,
}

impl SchemaReloader {
    pub(crate) fn new(
        holder: Arc<SchemaHolder>,
        writer: WriterHandle,
        region: RegionId,
        max_retention_ms: u64,
    ) -> SchemaReloader {
        SchemaReloader(Arc::new(Inner {
            holder,
            writer,
            region,
            max_retention_ms,
        }))
    }

    /// The version of the schema in force.
    pub fn version(&self) -> SchemaVersion {
        self.0.holder.version()
    }

    /// Reads the schema file again and puts it in force, or refuses it
    /// (see the module doc). Logged either way; every refusal but
    /// [`ReloadError::NoFile`] is audited.
    pub async fn reload(&self, cause: ReloadCause) -> Result<ReloadOutcome, ReloadError> {
        let region = &self.0.region;
        let result = self.try_reload(cause).await;
        match &result {
            Ok(ReloadOutcome::Applied { from, to, diff }) => {
                info!(%region, via = cause.as_str(), %from, %to, %diff, "schema reloaded: {to} in force");
            }
            Ok(ReloadOutcome::Unchanged(version)) => {
                debug!(%region, via = cause.as_str(), %version, "schema file read again: unchanged");
            }
            Err(e) => {
                warn!(%region, via = cause.as_str(), error = %e, version = %self.version(),
                    "schema reload refused; the schema in force stays");
            }
        }
        result
    }

    async fn try_reload(&self, cause: ReloadCause) -> Result<ReloadOutcome, ReloadError> {
        let Some(path) = self.0.holder.file().map(Path::to_path_buf) else {
            return Err(ReloadError::NoFile);
        };
        let shown = path.display().to_string();
        let max_retention_ms = self.0.max_retention_ms;
        let loaded = tokio::task::spawn_blocking(move || load(&path, max_retention_ms))
            .await
            .unwrap_or_else(|e| {
                Err(ReloadError::Read {
                    path: shown.clone(),
                    message: e.to_string(),
                })
            });
        let schema = match loaded {
            Ok(schema) => schema,
            Err(refused) => {
                if let Err(e) = self
                    .0
                    .writer
                    .audit_schema_refusal(shown.clone(), cause, refused.to_string())
                    .await
                {
                    warn!(region = %self.0.region, error = %e, "a refused schema reload could not be audited");
                }
                return Err(refused);
            }
        };
        let next = Arc::new(InForce::new(Arc::new(schema)));
        // Nothing to ask the writer for: an editor's save of the same text.
        if next.version == self.0.holder.version() {
            return Ok(ReloadOutcome::Unchanged(next.version.clone()));
        }
        let findings = next.schema.check().lines();
        match self.0.writer.swap_schema(next, shown.clone(), cause).await {
            Ok(Swapped::Applied { from, to, diff }) => {
                // The same findings `cascade serve` prints at start.
                for warning in findings {
                    warn!(region = %self.0.region, %warning, "schema check");
                }
                Ok(ReloadOutcome::Applied { from, to, diff })
            }
            Ok(Swapped::Unchanged(version)) => Ok(ReloadOutcome::Unchanged(version)),
            Ok(Swapped::Refused(reasons)) => Err(ReloadError::Incompatible { path: shown, reasons }),
            Err(e) => Err(ReloadError::Writer(e.to_string())),
        }
    }
}

/// Reads and loads the schema file, at most [`MAX_SCHEMA_FILE_BYTES`].
fn load(path: &Path, max_retention_ms: u64) -> Result<Schema, ReloadError> {
    let shown = || path.display().to_string();
    let read = |e: std::io::Error| ReloadError::Read {
        path: shown(),
        message: e.to_string(),
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(read)?
        .take(MAX_SCHEMA_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read)?;
    if bytes.len() as u64 > MAX_SCHEMA_FILE_BYTES {
        return Err(ReloadError::TooLarge { path: shown() });
    }
    let text = String::from_utf8(bytes).map_err(|e| ReloadError::Read {
        path: shown(),
        message: format!("not UTF-8 (at byte {})", e.utf8_error().valid_up_to()),
    })?;
    load_text(&text, &shown(), max_retention_ms)
}

/// Loads a schema file's text with the checks of a reload; `shown` names
/// the file in errors.
fn load_text(text: &str, shown: &str, max_retention_ms: u64) -> Result<Schema, ReloadError> {
    let shown = || shown.to_owned();
    if text.len() as u64 > MAX_SCHEMA_FILE_BYTES {
        return Err(ReloadError::TooLarge { path: shown() });
    }
    let schema = Schema::from_toml(text).map_err(|error| ReloadError::Invalid { path: shown(), error })?;
    if let Some((kind, ms)) = schema.longest_retain().filter(|(_, ms)| *ms > max_retention_ms) {
        return Err(ReloadError::Retention {
            path: shown(),
            kind: kind.to_owned(),
            retain: cascade_core::time_text::duration(ms),
            max: cascade_core::time_text::duration(max_retention_ms),
        });
    }
    Ok(schema)
}

/// Reloads on every [`crate::reload_signal::request_reload`] (SIGHUP) and whenever the schema file
/// changes (debounced by [`WATCH_DEBOUNCE`]), until `stopping` turns true.
/// None when the node has no schema file. A watch that cannot be set up
/// is a warning: SIGHUP still reloads.
///
/// Before it returns (the node serves after), the file is read once: a
/// change between the node's first read and the watch being set up has no
/// event of its own. Unchanged, as it nearly always is, it costs a read
/// and a compare.
pub(crate) async fn spawn_watch(
    reloader: SchemaReloader,
    mut stopping: watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    let file = reloader.0.holder.file()?.to_path_buf();
    let (events_tx, mut file_events) = tokio::sync::mpsc::channel::<()>(1);
    let watcher = match watch_file(&file, events_tx) {
        Ok(watcher) => Some(watcher),
        Err(e) => {
            warn!(file = %file.display(), error = %e, "the schema file is not watched for changes; SIGHUP reloads it");
            None
        }
    };
    let mut requests = crate::reload_signal::subscribe();
    // Logged and audited by the reload itself.
    let _ = reloader.reload(ReloadCause::FileChanged).await;
    Some(tokio::spawn(async move {
        // The watch's thread stops when its debouncer is dropped, with the task.
        let mut watching = watcher.is_some();
        let _watcher = watcher;
        loop {
            let cause = tokio::select! {
                _ = stopping.wait_for(|stop| *stop) => None,
                asked = requests.changed() => asked.ok().map(|()| ReloadCause::Signal),
                event = file_events.recv(), if watching => match event {
                    Some(()) => Some(ReloadCause::FileChanged),
                    // The watch is gone: only SIGHUP is left.
                    None => {
                        watching = false;
                        continue;
                    }
                },
            };
            let Some(cause) = cause else { return };
            // Logged and audited by the reload itself.
            let _ = reloader.reload(cause).await;
        }
    }))
}

type FileWatcher = notify_debouncer_mini::Debouncer<notify::RecommendedWatcher>;

/// A debounced watch of `file`'s directory that sends on `changed` when an
/// event names the file or a `..` entry beside it (a full channel already
/// holds a reload to come).
fn watch_file(file: &Path, changed: tokio::sync::mpsc::Sender<()>) -> Result<FileWatcher, notify::Error> {
    let name = file.file_name().map(|n| n.to_owned());
    let dir: PathBuf = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut debouncer = notify_debouncer_mini::new_debouncer(
        WATCH_DEBOUNCE,
        move |events: notify_debouncer_mini::DebounceEventResult| {
            let ours = match events {
                // The file, or a Kubernetes volume's `..data` link, which
                // a ConfigMap's update swaps (the file is a link through it).
                Ok(events) => events.iter().any(|e| {
                    let event = e.path.file_name();
                    event == name.as_deref() || event.is_some_and(|n| n.to_string_lossy().starts_with(".."))
                }),
                // An error of the watch (a queue overflow): read it again to be sure.
                Err(_) => true,
            };
            if ours {
                let _ = changed.try_send(());
            }
        },
    )?;
    debouncer.watcher().watch(&dir, notify::RecursiveMode::NonRecursive)?;
    Ok(debouncer)
}

/// What the start check decided (see [`check_at_start`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AtStart {
    /// The file declares the stored schema, or nothing was stored yet.
    Same,
    /// The file changes the stored schema and the stored data allows it.
    Changed { from: SchemaVersion, diff: String },
    /// The stored data forbids the change, and the operator said to take
    /// it anyway (`--accept-schema-unchecked`): audited at start.
    Overridden {
        from: SchemaVersion,
        diff: String,
        reasons: Vec<String>,
    },
}

/// A schema the stored data forbids at start: the node refuses to start.
#[derive(Debug, thiserror::Error)]
pub enum StartRefused {
    #[error(transparent)]
    Stored(#[from] crate::schema_in_force::StoredSchemaError),
    #[error(
        "{file}: refused at start: this region's store holds data of schema {stored}, and {reasons}. \
         Start with the schema in force (or remove what the change orphans first); \
         `cascade serve --accept-schema-unchecked` starts anyway (audited)",
        reasons = .reasons.join("; ")
    )]
    Incompatible {
        file: String,
        stored: SchemaVersion,
        reasons: Vec<String>,
    },
}

/// Checks `schema` (read from `file`, None: the embedded or given one)
/// against the schema the region stored and its data, with the same
/// compatibility check a reload runs; stores it unless refused. Runs
/// before the writer starts (nothing else writes yet).
pub(crate) fn check_at_start(
    store: &StoreState<'_>,
    region: &str,
    schema: &Schema,
    file: Option<&std::path::Path>,
    accept_unchecked: bool,
) -> Result<AtStart, StartRefused> {
    let next = SchemaVersion::of(schema);
    let store_it = |store: &StoreState<'_>| -> Result<(), StoreError> {
        let mut batch = Batch::default();
        batch.put(
            Table::Meta,
            crate::codec::SCHEMA_IN_FORCE.to_vec(),
            crate::schema_in_force::stored_form(schema).into_bytes(),
        );
        // Flushed before the node serves: on PostgreSQL a commit is only
        // staged until a flush, and only the writer's flushes come later.
        store.store.commit(batch).and_then(|()| store.store.flush())
    };
    let Some(stored) = crate::schema_in_force::read_stored(store)? else {
        store_it(store).map_err(crate::schema_in_force::StoredSchemaError::from)?;
        return Ok(AtStart::Same);
    };
    let from = SchemaVersion::of(&stored);
    if from == next {
        return Ok(AtStart::Same);
    }
    let diff = stored.diff(schema);
    let reasons: Vec<String> = compat_check(store, region, &diff)
        .map_err(crate::schema_in_force::StoredSchemaError::from)?
        .into_iter()
        .filter_map(|judged| judged.refusal)
        .collect();
    let summary = diff.summary();
    let outcome = if reasons.is_empty() {
        AtStart::Changed { from, diff: summary }
    } else if accept_unchecked {
        AtStart::Overridden {
            from,
            diff: summary,
            reasons,
        }
    } else {
        return Err(StartRefused::Incompatible {
            file: file.map_or_else(
                || "the schema given to the node".to_owned(),
                |f| f.display().to_string(),
            ),
            stored: from,
            reasons,
        });
    };
    store_it(store).map_err(crate::schema_in_force::StoredSchemaError::from)?;
    Ok(outcome)
}

/// Every engine keeps the schema in force as the start check needs it
/// (the memory store, sled and fjall here; PostgreSQL in
/// `store/postgres/tests.rs`): nothing stored, the first start stores its
/// schema; the same schema again is the same; a change the (empty) data
/// allows is taken and stored, and reads back with its version.
#[cfg(test)]
pub(crate) fn the_start_check_stores_and_reads_back_the_schema_on(store: &dyn Store) {
    let state = StoreState { store };
    let first = Schema::from_toml(
        "[kinds.project]\n[kinds.network.refs.project]\nkind = \"project\"\non_delete = \"cascade\"\n",
    )
    .expect("a schema");
    let second = Schema::from_toml("label = \"projects\"\n[kinds.project]\n").expect("a schema");
    assert_eq!(crate::schema_in_force::read_stored(&state).unwrap(), None);
    assert_eq!(
        check_at_start(&state, "eu-west", &first, None, false).unwrap(),
        AtStart::Same
    );
    let stored = crate::schema_in_force::read_stored(&state)
        .unwrap()
        .expect("stored at the first start");
    assert_eq!(SchemaVersion::of(&stored), SchemaVersion::of(&first));
    assert_eq!(
        check_at_start(&state, "eu-west", &first, None, false).unwrap(),
        AtStart::Same
    );
    match check_at_start(&state, "eu-west", &second, None, false).unwrap() {
        AtStart::Changed { from, diff } => {
            assert_eq!(from, SchemaVersion::of(&first));
            assert_eq!(diff, "kinds -network; label (none) → projects");
        }
        other => panic!("{other:?}"),
    }
    let stored = crate::schema_in_force::read_stored(&state).unwrap().expect("stored");
    assert_eq!(SchemaVersion::of(&stored), SchemaVersion::of(&second));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_in_force_is_stored_and_checked_at_start_on_sled_fjall_and_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        the_start_check_stores_and_reads_back_the_schema_on(&crate::store::MemoryStore::default());
        for engine in [crate::store::StorageEngine::Sled, crate::store::StorageEngine::Fjall] {
            let store = crate::store::open_store(engine, Some(&dir.path().join(engine.to_string()))).unwrap();
            the_start_check_stores_and_reads_back_the_schema_on(store.as_ref());
        }
    }

    #[test]
    fn a_file_that_is_missing_too_large_not_utf8_or_keeps_too_long_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("schema.toml");
        let shown = path.display().to_string();
        let refused = |max_retention_ms| load(&path, max_retention_ms).unwrap_err().to_string();

        assert!(refused(u64::MAX).starts_with(&format!("{shown}: cannot read the schema file: ")));
        std::fs::write(&path, vec![b'#'; MAX_SCHEMA_FILE_BYTES as usize + 1]).unwrap();
        assert_eq!(
            refused(u64::MAX),
            format!("{shown}: more than {MAX_SCHEMA_FILE_BYTES} bytes, the most a schema file may hold")
        );
        std::fs::write(&path, b"[kinds.a]\n\xff\n").unwrap();
        assert_eq!(
            refused(u64::MAX),
            format!("{shown}: cannot read the schema file: not UTF-8 (at byte 10)")
        );
        std::fs::write(&path, "[kinds.a]\nretain = \"40d\"\n").unwrap();
        assert_eq!(
            refused(30 * 86_400_000),
            format!("{shown}: kinds.a.retain: 40d is longer than [limits] max_retention (30d)")
        );
        assert!(load(&path, 40 * 86_400_000).is_ok());
    }
}
