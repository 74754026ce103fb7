//! The page token of an operation's outcomes, which span regions.
//!
//! Each region keeps its part of an operation and pages its outcomes with
//! its own token (the last name returned). The aggregated listing is the
//! concatenation of the parts in a fixed order — regions sorted by name,
//! the same on every node of a cluster — so a position in it is a region
//! and that part's own token. [`OutcomesPageToken`] is that pair, encoded
//! as a small protobuf message in unpadded URL-safe base64: clients treat
//! it as opaque, and any node can continue a token another node issued.
//!
//! A listing of every region ([`ListPageToken`]) carries each region's
//! position (the core's `listing::RegionPosition`) and a fingerprint of
//! the request's selectors, so that a token used with other selectors is
//! refused instead of continuing another listing. A page of a resource's
//! references ([`ReferencesPageToken`]) carries where its owner stopped.

use std::collections::BTreeMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use cascade_core::listing::RegionPosition;
use prost::Message;

/// The encoding version; a token of another version is refused.
const VERSION: u32 = 1;

/// Where the next page of an operation's outcomes starts.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct OutcomesPageToken {
    /// The region whose part comes next.
    pub region: String,
    /// That part's own page token (empty: from its first outcome).
    pub inner: String,
}

/// The wire form of [`OutcomesPageToken`].
#[derive(Clone, PartialEq, Message)]
struct Encoded {
    #[prost(uint32, tag = "1")]
    version: u32,
    #[prost(string, tag = "2")]
    region: String,
    #[prost(string, tag = "3")]
    inner: String,
}

/// A token that was not issued by a Cascade node (or was altered).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageTokenError {
    /// Not URL-safe base64 without padding.
    #[error("not a page token issued by this API (not URL-safe base64)")]
    Encoding,
    /// Base64, but not the token's protobuf message.
    #[error("not a page token issued by this API (undecodable)")]
    Message,
    /// Issued by another (future) encoding version.
    #[error("page token version {0} is not supported")]
    Version(u32),
    /// The region is empty, so there is no part to continue from.
    #[error("page token names no region")]
    NoRegion,
}

/// Where the next page of a listing of every region starts: each region's
/// position, and the fingerprint of the selectors it was issued for.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ListPageToken {
    /// [`ListPageToken::fingerprint`] of the request's selectors.
    pub selectors: u64,
    /// Each region's position, by region.
    pub regions: BTreeMap<String, RegionPosition>,
}

#[derive(Clone, PartialEq, Message)]
struct EncodedList {
    #[prost(uint32, tag = "1")]
    version: u32,
    #[prost(fixed64, tag = "2")]
    selectors: u64,
    #[prost(message, repeated, tag = "3")]
    regions: Vec<EncodedPosition>,
}

#[derive(Clone, PartialEq, Message)]
struct EncodedPosition {
    #[prost(string, tag = "1")]
    region: String,
    /// 0 start, 1 after `text`, 2 done, 3 given up (`text` says why).
    #[prost(uint32, tag = "2")]
    state: u32,
    #[prost(string, tag = "3")]
    text: String,
}

impl ListPageToken {
    /// A fingerprint of a listing's selectors (FNV-1a over each part and
    /// its length): the same on every node and in every version that
    /// keeps this encoding.
    pub fn fingerprint(parts: &[&str]) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut feed = |bytes: &[u8]| {
            for b in bytes {
                hash ^= u64::from(*b);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        };
        for part in parts {
            feed(&(part.len() as u64).to_le_bytes());
            feed(part.as_bytes());
        }
        hash
    }

    /// The opaque string a client gets as `next_page_token`.
    pub fn encode(&self) -> String {
        let encoded = EncodedList {
            version: VERSION,
            selectors: self.selectors,
            regions: self
                .regions
                .iter()
                .map(|(region, position)| {
                    let (state, text) = match position {
                        RegionPosition::Start => (0, String::new()),
                        RegionPosition::After(t) => (1, t.clone()),
                        RegionPosition::Done => (2, String::new()),
                        RegionPosition::GaveUp(why) => (3, why.clone()),
                    };
                    EncodedPosition {
                        region: region.clone(),
                        state,
                        text,
                    }
                })
                .collect(),
        };
        URL_SAFE_NO_PAD.encode(encoded.encode_to_vec())
    }

    /// `None` for the empty token (the first page).
    pub fn decode(raw: &str) -> Result<Option<Self>, PageTokenError> {
        if raw.is_empty() {
            return Ok(None);
        }
        let bytes = URL_SAFE_NO_PAD.decode(raw).map_err(|_| PageTokenError::Encoding)?;
        let encoded = EncodedList::decode(bytes.as_slice()).map_err(|_| PageTokenError::Message)?;
        if encoded.version != VERSION {
            return Err(PageTokenError::Version(encoded.version));
        }
        let mut regions = BTreeMap::new();
        for p in encoded.regions {
            if p.region.is_empty() {
                return Err(PageTokenError::NoRegion);
            }
            let position = match p.state {
                0 => RegionPosition::Start,
                1 => RegionPosition::After(p.text),
                2 => RegionPosition::Done,
                // Echoed to the client as the region's reason: kept short
                // whatever a tampered token holds.
                3 => RegionPosition::GaveUp(cascade_core::limits::cut_stored(
                    &p.text,
                    cascade_core::listing::MAX_GIVEN_UP_REASON_BYTES,
                )),
                _ => return Err(PageTokenError::Message),
            };
            regions.insert(p.region, position);
        }
        Ok(Some(Self {
            selectors: encoded.selectors,
            regions,
        }))
    }
}

/// Where the next page of a resource's references starts.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct ReferencesPageToken {
    /// Referrers: the uid of the last referrer returned.
    pub referrer_uid: String,
    /// Referrers: the field of the last row returned.
    pub field: String,
    /// Targets: how many rows were returned before.
    pub offset: u64,
}

#[derive(Clone, PartialEq, Message)]
struct EncodedReferences {
    #[prost(uint32, tag = "1")]
    version: u32,
    #[prost(string, tag = "2")]
    referrer_uid: String,
    #[prost(string, tag = "3")]
    field: String,
    #[prost(uint64, tag = "4")]
    offset: u64,
}

impl ReferencesPageToken {
    /// The opaque string a client gets as `next_page_token`.
    pub fn encode(&self) -> String {
        let encoded = EncodedReferences {
            version: VERSION,
            referrer_uid: self.referrer_uid.clone(),
            field: self.field.clone(),
            offset: self.offset,
        };
        URL_SAFE_NO_PAD.encode(encoded.encode_to_vec())
    }

    /// `None` for the empty token (the first page).
    pub fn decode(raw: &str) -> Result<Option<Self>, PageTokenError> {
        if raw.is_empty() {
            return Ok(None);
        }
        let bytes = URL_SAFE_NO_PAD.decode(raw).map_err(|_| PageTokenError::Encoding)?;
        let encoded = EncodedReferences::decode(bytes.as_slice()).map_err(|_| PageTokenError::Message)?;
        if encoded.version != VERSION {
            return Err(PageTokenError::Version(encoded.version));
        }
        Ok(Some(Self {
            referrer_uid: encoded.referrer_uid,
            field: encoded.field,
            offset: encoded.offset,
        }))
    }
}

impl OutcomesPageToken {
    /// The opaque string a client gets as `next_outcomes_page_token`.
    pub fn encode(&self) -> String {
        let encoded = Encoded {
            version: VERSION,
            region: self.region.clone(),
            inner: self.inner.clone(),
        };
        URL_SAFE_NO_PAD.encode(encoded.encode_to_vec())
    }

    /// `None` for the empty token (the first page).
    pub fn decode(raw: &str) -> Result<Option<Self>, PageTokenError> {
        if raw.is_empty() {
            return Ok(None);
        }
        let bytes = URL_SAFE_NO_PAD.decode(raw).map_err(|_| PageTokenError::Encoding)?;
        let encoded = Encoded::decode(bytes.as_slice()).map_err(|_| PageTokenError::Message)?;
        if encoded.version != VERSION {
            return Err(PageTokenError::Version(encoded.version));
        }
        if encoded.region.is_empty() {
            return Err(PageTokenError::NoRegion);
        }
        Ok(Some(Self {
            region: encoded.region,
            inner: encoded.inner,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_token_round_trips_and_stays_within_its_limit() {
        let name = format!("ap-south/{}/{}", "k".repeat(63), "i".repeat(63));
        let regions: BTreeMap<String, RegionPosition> = (0..cascade_core::limits::MAX_LIST_REGIONS)
            .map(|i| (format!("{}{i:02}", "r".repeat(30)), RegionPosition::After(name.clone())))
            .collect();
        let t = ListPageToken {
            selectors: ListPageToken::fingerprint(&["port", "web-", "env=staging"]),
            regions,
        };
        let raw = t.encode();
        assert!(
            raw.len() <= cascade_core::limits::MAX_LIST_PAGE_TOKEN_BYTES,
            "{}",
            raw.len()
        );
        assert_eq!(ListPageToken::decode(&raw), Ok(Some(t)));
        assert_ne!(
            ListPageToken::fingerprint(&["port", "web-"]),
            ListPageToken::fingerprint(&["portweb-", ""])
        );
        let refs = ReferencesPageToken {
            referrer_uid: "u".into(),
            field: "network".into(),
            offset: 3,
        };
        assert_eq!(ReferencesPageToken::decode(&refs.encode()), Ok(Some(refs)));
        assert_eq!(ListPageToken::decode("%%"), Err(PageTokenError::Encoding));
    }

    #[test]
    fn round_trips_and_refuses_what_it_did_not_issue() {
        let t = OutcomesPageToken {
            region: "us-east".into(),
            inner: "us-east/port/p1".into(),
        };
        let raw = t.encode();
        assert!(
            raw.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "{raw}"
        );
        assert_eq!(OutcomesPageToken::decode(&raw), Ok(Some(t)));
        assert_eq!(OutcomesPageToken::decode(""), Ok(None));
        assert_eq!(
            OutcomesPageToken::decode("us-east/port/p1"),
            Err(PageTokenError::Encoding)
        );
        assert_eq!(OutcomesPageToken::decode("_w"), Err(PageTokenError::Message));
        let no_region = URL_SAFE_NO_PAD.encode(
            Encoded {
                version: VERSION,
                region: String::new(),
                inner: String::new(),
            }
            .encode_to_vec(),
        );
        assert_eq!(OutcomesPageToken::decode(&no_region), Err(PageTokenError::NoRegion));
        let v2 = URL_SAFE_NO_PAD.encode(
            Encoded {
                version: 2,
                region: "x".into(),
                inner: String::new(),
            }
            .encode_to_vec(),
        );
        assert_eq!(OutcomesPageToken::decode(&v2), Err(PageTokenError::Version(2)));
    }
}
