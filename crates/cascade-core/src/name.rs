//! Identity: region ids, kinds, resource names and uids.
//!
//! A resource name is `{region}/{kind}/{id}`; the region part routes every
//! request to the node that owns the resource. A name can be reused after the
//! resource is purged, so everything that must not confuse two incarnations
//! (references, back-references, events, deletion records) also carries the
//! [`Uid`] minted at creation.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::limits::quote;

/// Why a name, region or kind was refused; the message names the offending part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {value}: {reason}")]
pub struct NameError {
    /// What was being parsed (`region`, `kind`, `resource name`, `uid`, …).
    pub what: &'static str,
    /// The refused input as a message quotes it ([`crate::limits::quote`]:
    /// a short prefix and its length), never the whole of a large input.
    pub value: String,
    /// The rule it breaks.
    pub reason: &'static str,
}

fn is_lower_alnum_dash(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A region id: `[a-z][a-z0-9-]{0,31}`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RegionId(String);

impl RegionId {
    /// Validates a region id; the error names the rule it breaks.
    pub fn parse(value: &str) -> Result<Self, NameError> {
        Self::check(value)?;
        Ok(Self(value.to_owned()))
    }

    /// [`RegionId::parse`]'s rules without the copy: every stored name a
    /// node decodes checks its region (once per referrer of a cascade).
    fn check(value: &str) -> Result<(), NameError> {
        let err = |reason| NameError {
            what: "region",
            value: quote(value),
            reason,
        };
        let first = value.bytes().next().ok_or_else(|| err("must not be empty"))?;
        if !first.is_ascii_lowercase() {
            return Err(err("must start with a lowercase letter"));
        }
        if value.len() > MAX_REGION_LEN {
            return Err(err("must be at most 32 characters"));
        }
        if !is_lower_alnum_dash(value) {
            return Err(err("may only contain a-z, 0-9 and '-'"));
        }
        Ok(())
    }

    /// The id as written (also the prefix of its resources' names).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RegionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for RegionId {
    type Error = NameError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<RegionId> for String {
    fn from(value: RegionId) -> Self {
        value.0
    }
}

/// Checks a kind name as used in schemas and resource names (`[a-z][a-z0-9_]{0,62}`).
pub fn validate_kind(value: &str) -> Result<(), NameError> {
    let err = |reason| NameError {
        what: "kind",
        value: quote(value),
        reason,
    };
    let first = value.bytes().next().ok_or_else(|| err("must not be empty"))?;
    if !first.is_ascii_lowercase() {
        return Err(err("must start with a lowercase letter"));
    }
    if value.len() > MAX_KIND_LEN {
        return Err(err("must be at most 63 characters"));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(err("may only contain a-z, 0-9 and '_'"));
    }
    Ok(())
}

/// The longest region, kind and id of a name, in bytes (all ASCII): what
/// `parse` checks with the characters, and `from_stored` alone.
const MAX_REGION_LEN: usize = 32;
const MAX_KIND_LEN: usize = 63;
const MAX_ID_LEN: usize = 63;

/// `{region}/{kind}/{id}`, validated. Ordered and hashed as its string form,
/// which is also its storage key (so a prefix scan lists one kind of a region).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ResourceName {
    full: String,
    /// Byte offsets of the two slashes, so the parts are borrowed, not re-split.
    kind_start: usize,
    id_start: usize,
}

impl ResourceName {
    /// Validates `{region}/{kind}/{id}` (each part by its own rule). Whether
    /// the kind exists in a schema is the protocol's check, not this one.
    pub fn parse(value: &str) -> Result<Self, NameError> {
        let err = |reason| NameError {
            what: "resource name",
            value: quote(value),
            reason,
        };
        let mut parts = value.split('/');
        let (Some(region), Some(kind), Some(id), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(err("must have the form {region}/{kind}/{id}"));
        };
        RegionId::check(region).map_err(|e| NameError {
            value: quote(value),
            what: "resource name",
            reason: e.reason,
        })?;
        validate_kind(kind).map_err(|e| NameError {
            value: quote(value),
            what: "resource name",
            reason: e.reason,
        })?;
        validate_id(id).map_err(err)?;
        Ok(Self {
            full: value.to_owned(),
            kind_start: region.len() + 1,
            id_start: region.len() + 1 + kind.len() + 1,
        })
    }

    /// A name read back from a store this node's writers filled, where
    /// every name was [`ResourceName::parse`]d before it was written: only
    /// its shape is checked again (two slashes, three non-empty parts
    /// within their lengths), not each character. Decoding re-validated
    /// every stored name on every read, 14 % of a cross-region create's
    /// instructions (docs/BENCHMARKS.md, "Decoding stored records"). A
    /// value that is not a name at all (a cut or foreign record) is still
    /// refused, a [`NameError`] of a resource name quoting it and saying
    /// which rule it breaks; requests use `parse`.
    pub fn from_stored(value: &str) -> Result<Self, NameError> {
        let err = |reason| NameError {
            what: "resource name",
            value: quote(value),
            reason,
        };
        let form = || err("must have the form {region}/{kind}/{id}");
        // One pass over the bytes for both slashes and a third (a name is
        // short: a plain loop costs less than `str::find`'s searcher,
        // called three times).
        let mut slashes = [0usize; 2];
        let mut found = 0;
        for (at, &b) in value.as_bytes().iter().enumerate() {
            if b == b'/' {
                *slashes.get_mut(found).ok_or_else(form)? = at;
                found += 1;
            }
        }
        if found != 2 {
            return Err(form());
        }
        let (kind_start, id_start) = (slashes[0] + 1, slashes[1] + 1);
        let (region_len, kind_len, id_len) = (slashes[0], slashes[1] - kind_start, value.len() - id_start);
        if region_len == 0 || kind_len == 0 || id_len == 0 {
            return Err(err("no part may be empty"));
        }
        if region_len > MAX_REGION_LEN || kind_len > MAX_KIND_LEN || id_len > MAX_ID_LEN {
            return Err(err("a part is longer than its limit"));
        }
        Ok(Self {
            full: value.to_owned(),
            kind_start,
            id_start,
        })
    }

    /// Builds and validates the name of `id` of `kind` in `region`.
    pub fn new(region: &RegionId, kind: &str, id: &str) -> Result<Self, NameError> {
        Self::parse(&format!("{region}/{kind}/{id}"))
    }

    /// The full name, as stored and sent.
    pub fn as_str(&self) -> &str {
        &self.full
    }
    /// The owning region: the node every request about it goes to.
    pub fn region(&self) -> &str {
        &self.full[..self.kind_start - 1]
    }
    /// The kind, which selects its schema entry.
    pub fn kind(&self) -> &str {
        &self.full[self.kind_start..self.id_start - 1]
    }
    /// The id, unique within its region and kind.
    pub fn id(&self) -> &str {
        &self.full[self.id_start..]
    }
}

fn validate_id(id: &str) -> Result<(), &'static str> {
    let first = id.bytes().next().ok_or("id must not be empty")?;
    if !(first.is_ascii_lowercase() || first.is_ascii_digit()) {
        return Err("id must start with a-z or 0-9");
    }
    if id.len() > MAX_ID_LEN {
        return Err("id must be at most 63 characters");
    }
    if !is_lower_alnum_dash(id) {
        return Err("id may only contain a-z, 0-9 and '-'");
    }
    Ok(())
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

impl FromStr for ResourceName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl TryFrom<String> for ResourceName {
    type Error = NameError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<ResourceName> for String {
    fn from(value: ResourceName) -> Self {
        value.full
    }
}

/// The identity of one incarnation of a resource (UUID v7, minted by the node).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Uid(pub Uuid);

impl Uid {
    /// Parses a uid from its hyphenated UUID form (as requests carry it).
    pub fn parse(value: &str) -> Result<Self, NameError> {
        Uuid::parse_str(value).map(Uid).map_err(|_| NameError {
            what: "uid",
            value: quote(value),
            reason: "must be a UUID",
        })
    }
    /// The 16 bytes of the UUID: the storage key form (v7 uids sort by
    /// creation time).
    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }
}

impl fmt::Display for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Identity of a long-running deletion operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OperationId(pub Uuid);

impl OperationId {
    /// Parses an operation id from its hyphenated UUID form.
    pub fn parse(value: &str) -> Result<Self, NameError> {
        Uuid::parse_str(value).map(OperationId).map_err(|_| NameError {
            what: "operation id",
            value: quote(value),
            reason: "must be a UUID",
        })
    }
}

impl fmt::Display for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Source of fresh identities. The core never reads a clock or a random
/// generator itself: the node passes one that mints UUID v7, tests pass a
/// deterministic one.
pub trait IdSource {
    /// A fresh UUID, never returned before by this source.
    fn next_uuid(&mut self) -> Uuid;
}

/// Deterministic ids for tests and simulations: v7-shaped, strictly increasing.
#[derive(Debug, Default, Clone)]
pub struct SequentialIds {
    next: u64,
}

impl IdSource for SequentialIds {
    fn next_uuid(&mut self) -> Uuid {
        self.next += 1;
        uuid::Builder::from_unix_timestamp_millis(self.next, &[0; 10]).into_uuid()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_name_parts() {
        let n = ResourceName::parse("eu-1/port/p-01").unwrap();
        assert_eq!((n.region(), n.kind(), n.id()), ("eu-1", "port", "p-01"));
    }

    #[test]
    fn bad_names_say_why() {
        for (bad, why) in [
            ("eu/port", "form"),
            ("Eu/port/a", "lowercase"),
            ("eu/Port/a", "lowercase"),
            ("eu/port/-a", "start"),
            ("eu/port/a/b", "form"),
            ("eu/port/", "empty"),
        ] {
            let err = ResourceName::parse(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn a_stored_name_reads_back_with_the_same_parts_as_parsed() {
        for valid in ["eu-1/port/p-01", "r0/network/n", "a/b/c"] {
            let parsed = ResourceName::parse(valid).unwrap();
            let stored = ResourceName::from_stored(valid).unwrap();
            assert_eq!(stored, parsed);
            assert_eq!(
                (stored.region(), stored.kind(), stored.id()),
                (parsed.region(), parsed.kind(), parsed.id())
            );
        }
    }

    /// What a cut or foreign value holds instead of a name is refused, not
    /// turned into a name whose parts are wrong.
    #[test]
    fn a_stored_value_that_is_not_a_name_is_refused_with_the_reason() {
        let long = format!("eu/port/{}", "a".repeat(64));
        for (bad, why) in [
            ("no-name", "form"),
            ("eu/port", "form"),
            ("eu/port/a/b", "form"),
            ("eu//a", "empty"),
            ("/port/a", "empty"),
            ("eu/port/", "empty"),
            ("", "form"),
            (long.as_str(), "limit"),
        ] {
            let err = ResourceName::from_stored(bad).unwrap_err();
            assert_eq!(err.what, "resource name");
            assert!(err.to_string().contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn sequential_ids_increase() {
        let mut ids = SequentialIds::default();
        let a = ids.next_uuid();
        let b = ids.next_uuid();
        assert!(a < b);
    }
}
