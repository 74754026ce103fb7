//! Who a call relayed by a standby is from.
//!
//! Under mutual TLS the writer of a region sees the certificate of the
//! standby that forwarded a call (a node of its own region), not the
//! caller's. The standby therefore says in [`RELAYED_REGION`] which region
//! the caller's verified client certificate named (empty: none), after
//! removing whatever the caller itself sent under that name
//! (`api/standby.rs`). The writer believes the header only from a node of
//! its own region ([`relayed_caller`]): from anyone else it changes nothing.

use cascade_core::limits::quote;
use cascade_core::RegionId;
use tonic::metadata::MetadataMap;

/// Metadata a standby adds to every call it forwards under mutual TLS: the
/// region the caller's client certificate names, or empty when it
/// presented none (or one naming no region).
pub(crate) const RELAYED_REGION: &str = "cascade-relayed-region";

/// Who a call is from, given the region the TLS caller's certificate names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Relayed {
    /// Not relayed: the certificate's own region (another region's node, a
    /// client with a region's certificate, or a node of this region calling
    /// as itself). A [`RELAYED_REGION`] header from anyone but a node of
    /// this region is ignored.
    Direct(RegionId),
    /// Relayed by a standby of this region for a caller whose certificate
    /// names this region.
    For(RegionId),
    /// Relayed by a standby of this region for a caller that presented no
    /// certificate naming a region.
    Anonymous,
    /// Relayed by a node of this region with a header that is not a region
    /// (quoted): refused, as a certificate naming no region is.
    Unreadable(String),
}

/// Who a call whose TLS caller's certificate names `certified` is from, on
/// the node of region `own` (see the module doc).
pub(crate) fn relayed_caller(metadata: &MetadataMap, certified: &RegionId, own: &RegionId) -> Relayed {
    if certified != own {
        return Relayed::Direct(certified.clone());
    }
    let Some(value) = metadata.get(RELAYED_REGION) else {
        return Relayed::Direct(certified.clone());
    };
    let text = match value.to_str() {
        Ok(text) => text,
        Err(_) => return Relayed::Unreadable(quote(&String::from_utf8_lossy(value.as_bytes()))),
    };
    if text.is_empty() {
        return Relayed::Anonymous;
    }
    match RegionId::parse(text) {
        Ok(region) => Relayed::For(region),
        Err(_) => Relayed::Unreadable(quote(text)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(r: &str) -> RegionId {
        RegionId::parse(r).unwrap()
    }

    fn with(value: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Some(v) = value {
            m.insert(RELAYED_REGION, v.parse().unwrap());
        }
        m
    }

    #[test]
    fn only_a_node_of_the_own_region_relays_a_caller() {
        let own = region("ra");
        // Another region's certificate: the header is ignored.
        assert_eq!(
            relayed_caller(&with(Some("ra")), &region("rb"), &own),
            Relayed::Direct(region("rb"))
        );
        // A node of this region, not relaying.
        assert_eq!(relayed_caller(&with(None), &own, &own), Relayed::Direct(own.clone()));
        assert_eq!(
            relayed_caller(&with(Some("rb")), &own, &own),
            Relayed::For(region("rb"))
        );
        assert_eq!(relayed_caller(&with(Some("")), &own, &own), Relayed::Anonymous);
        assert!(matches!(
            relayed_caller(&with(Some("not a region!")), &own, &own),
            Relayed::Unreadable(q) if q.starts_with("\"not a region")
        ));
    }
}
