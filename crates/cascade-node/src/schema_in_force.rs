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

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use cascade_core::Schema;

use crate::auth::identity::{hex, sha256};

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

#[cfg(test)]
mod tests {
    use super::*;

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
