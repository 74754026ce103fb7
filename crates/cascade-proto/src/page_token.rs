//! The page token of an operation's outcomes, which span regions.
//!
//! Each region keeps its part of an operation and pages its outcomes with
//! its own token (the last name returned). The aggregated listing is the
//! concatenation of the parts in a fixed order — regions sorted by name,
//! the same on every node of a cluster — so a position in it is a region
//! and that part's own token. [`OutcomesPageToken`] is that pair, encoded
//! as a small protobuf message in unpadded URL-safe base64: clients treat
//! it as opaque, and any node can continue a token another node issued.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
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
