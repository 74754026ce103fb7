//! The schema a node runs now, and its version (issue 31).
//!
//! The schema used to be read once, at start. It now sits in a
//! [`SchemaHolder`] behind an [`ArcSwap`]: the API handlers read it
//! lock-free (`SchemaHolder::schema`), and only the writer swaps it
//! (`writer/schema_swap.rs`), in a message of its own between two steps.
//! A writer step loads it once, when it starts, so a step never sees two
//! schemas; a handler's pre-checks may read the old one just before the
//! swap, and the writer's step checks again with its own.
//!
//! A version is the first 16 hex digits of the SHA-256 of the core's
//! canonical form ([`Schema::canonical_text`]: order, comments and spelled
//! out defaults do not change it) and the file's optional `label`.
//!
//! The schema in force is stored too, in the meta table under
//! [`STORED_SCHEMA`] (every engine: it is a key like the others): a reload
//! writes it in the batch of its audit entry (`writer/schema_swap.rs`),
//! and a node writes it at start. Its stored form is TOML with every kind,
//! reference and attribute spelled out, in name order ([`stored_form`]):
//! it loads back as any schema file does, with the same version. At start
//! a file whose version differs from the stored one goes through the same
//! compatibility check as a reload, against the stored data
//! (`schema_reload::check_at_start`): refused, the node does not start (unless
//! `--accept-schema-unchecked`, which the audit log records).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use cascade_core::schema::KindSpec;
use cascade_core::Schema;

use crate::auth::identity::{hex, sha256};
use crate::codec::{StoreState, SCHEMA_IN_FORCE};
use crate::store::{StoreError, Table};

/// Hex digits of the digest a version shows (64 bits: enough to tell
/// schemas apart at a glance, short enough for a status column).
pub(crate) const VERSION_DIGITS: usize = 16;

/// A schema's version: the digest of its canonical form, and its label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaVersion {
    /// The first [`VERSION_DIGITS`] hex digits of the canonical form's SHA-256.
    pub digest: String,
    /// The file's `label`, if any.
    pub label: Option<String>,
}

impl SchemaVersion {
    /// The version of `schema`.
    pub fn of(schema: &Schema) -> SchemaVersion {
        let mut digest = hex(&sha256(schema.canonical_text().as_bytes()));
        digest.truncate(VERSION_DIGITS);
        SchemaVersion {
            digest,
            label: schema.label().map(str::to_owned),
        }
    }
}

impl fmt::Display for SchemaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.label {
            Some(label) => write!(f, "{} ({label})", self.digest),
            None => f.write_str(&self.digest),
        }
    }
}

/// The schema in force with its version, swapped together.
#[derive(Debug)]
pub struct InForce {
    pub schema: Arc<Schema>,
    pub version: SchemaVersion,
}

impl InForce {
    pub fn new(schema: Arc<Schema>) -> InForce {
        let version = SchemaVersion::of(&schema);
        InForce { schema, version }
    }
}

/// Where the node's schema lives while it runs (see the module doc).
pub struct SchemaHolder {
    current: ArcSwap<InForce>,
    /// The file it was read from (None: the embedded example schema, or
    /// one a test gave as data: nothing to reload).
    file: Option<PathBuf>,
}

impl SchemaHolder {
    pub fn new(schema: Arc<Schema>, file: Option<PathBuf>) -> SchemaHolder {
        SchemaHolder {
            current: ArcSwap::from_pointee(InForce::new(schema)),
            file,
        }
    }

    /// The schema in force and its version.
    pub fn current(&self) -> Arc<InForce> {
        self.current.load_full()
    }

    /// The schema in force.
    pub fn schema(&self) -> Arc<Schema> {
        self.current.load().schema.clone()
    }

    /// Its version.
    pub fn version(&self) -> SchemaVersion {
        self.current.load().version.clone()
    }

    /// The file a reload reads.
    pub fn file(&self) -> Option<&std::path::Path> {
        self.file.as_deref()
    }

    /// Puts `next` in force. Only the writer calls it, between two of its
    /// steps (`writer/schema_swap.rs`).
    pub(crate) fn put(&self, next: Arc<InForce>) {
        self.current.store(next);
    }
}

/// The stored form of `schema`: TOML with its label, every kind and
/// every reference in name order, defaults spelled out. Loads back with
/// [`Schema::from_toml`] to a schema of the same version.
pub(crate) fn stored_form(schema: &Schema) -> String {
    #[derive(serde::Serialize)]
    struct File<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        label: Option<&'a str>,
        kinds: BTreeMap<&'a str, &'a KindSpec>,
    }
    let file = File {
        label: schema.label(),
        kinds: schema.kinds().collect(),
    };
    // Strings, booleans and maps of them: nothing TOML cannot write.
    toml::to_string(&file).unwrap_or_else(|e| format!("# not serializable: {e}\n"))
}

/// Why the stored schema could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum StoredSchemaError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The stored form does not load: the store was written by something else.
    #[error("the schema stored in the region's store does not load: {0}")]
    Invalid(String),
}

/// The schema this region last put in force, if it stored one (a store
/// written before schemas were stored has none).
pub(crate) fn read_stored(store: &StoreState<'_>) -> Result<Option<Schema>, StoredSchemaError> {
    let Some(bytes) = store.store.get(Table::Meta, SCHEMA_IN_FORCE)? else {
        return Ok(None);
    };
    let text = String::from_utf8(bytes).map_err(|e| StoredSchemaError::Invalid(e.to_string()))?;
    Schema::from_toml(&text)
        .map(Some)
        .map_err(|e| StoredSchemaError::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_form_loads_back_to_the_same_version_and_label() {
        let text = "label = \"v2\"\n[kinds.b.refs.a]\nkind = \"a\"\non_delete = \"cascade\"\n\
                    [kinds.a]\nretain = \"7d\"\n";
        let schema = Schema::from_toml(text).unwrap();
        let back = Schema::from_toml(&stored_form(&schema)).unwrap();
        assert_eq!(SchemaVersion::of(&back), SchemaVersion::of(&schema));
        assert_eq!(back.label(), Some("v2"));
    }

    #[test]
    fn a_version_is_a_short_digest_of_the_canonical_form_with_the_label_beside_it() {
        let a = Schema::from_toml("[kinds.a]\n[kinds.b]\n").unwrap();
        let b = Schema::from_toml("label = \"two kinds\"\n# reordered\n[kinds.b]\n[kinds.a]\n").unwrap();
        let (va, vb) = (SchemaVersion::of(&a), SchemaVersion::of(&b));
        assert_eq!(va.digest.len(), VERSION_DIGITS);
        assert!(va.digest.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(
            va.digest, vb.digest,
            "order, comments and the label do not change the digest"
        );
        assert_eq!(vb.to_string(), format!("{} (two kinds)", vb.digest));
        let c = Schema::from_toml("[kinds.a]\n").unwrap();
        assert_ne!(SchemaVersion::of(&c).digest, va.digest);
    }
}
