//! The caller of a call, as the authentication layer (`api/authn.rs`)
//! found it, and the vouching header that carries a caller from one node
//! to another.
//!
//! Handlers never read an identity from a request field: they ask
//! [`caller`], which returns what the layer put in the request's
//! extensions. A node that calls another for a client (forwarding, a
//! standby relaying, a plan, a deletion's events) vouches for the client in
//! [`PRINCIPAL_HEADER`]; the receiving node believes it only from a peer
//! that presented a region certificate of the cluster (`api/authn.rs`).

use cascade_core::auth::{Principal, Via};
use cascade_proto::v1;
use tonic::metadata::{BinaryMetadataValue, MetadataMap};
use tonic::Request;

/// Binary metadata: a [`v1::Principal`], protobuf-encoded, that the calling
/// node vouches for.
pub(crate) const PRINCIPAL_HEADER: &str = "cascade-principal-bin";

/// Who made this call: what the authentication layer found. A request that
/// did not pass the layer (a node with authentication off builds none)
/// is the anonymous principal, whom only [`cascade_core::auth::AllowAll`]
/// lets do anything.
pub(crate) fn caller<T>(request: &Request<T>) -> Principal {
    request
        .extensions()
        .get::<Principal>()
        .cloned()
        .unwrap_or_else(Principal::anonymous)
}

/// The region whose node made this call for its caller (a request it
/// forwarded, vouching for the caller in [`PRINCIPAL_HEADER`]): the region
/// its TLS certificate names. None for a direct call. The authentication
/// layer refuses that header from anything but a region certificate of
/// the cluster, so under `required` a call that passed it and carries the
/// header came through that region; with authentication off nobody
/// vouches, and the caller is anonymous wherever it came from.
pub(crate) fn vouching_region<T>(request: &Request<T>) -> Option<String> {
    request.metadata().get_bin(PRINCIPAL_HEADER)?;
    let chain = request.peer_certs()?;
    cascade_tls::peer_region(&chain).ok().map(|region| region.to_string())
}

/// The wire form of a principal.
pub(crate) fn to_wire(principal: &Principal) -> v1::Principal {
    v1::Principal {
        id: principal.id.clone(),
        groups: principal.groups.clone(),
        via: principal.via.as_str().to_owned(),
    }
}

/// A principal from its wire form; None when `via` names no means.
pub(crate) fn from_wire(wire: v1::Principal) -> Option<Principal> {
    Some(Principal {
        id: wire.id,
        groups: wire.groups,
        via: Via::parse(&wire.via)?,
    })
}

/// Vouches for `principal` on an outgoing call (replacing whatever was there).
pub(crate) fn vouch(metadata: &mut MetadataMap, principal: &Principal) {
    let bytes = cascade_proto::principal_to_bytes(&to_wire(principal));
    metadata.insert_bin(PRINCIPAL_HEADER, BinaryMetadataValue::from_bytes(&bytes));
}

/// The header that vouches for `principal` on calls this node makes for it
/// (`crate::peers::carrying`).
pub(crate) fn vouch_value(principal: &Principal) -> Option<(http::HeaderName, http::HeaderValue)> {
    let mut metadata = MetadataMap::new();
    vouch(&mut metadata, principal);
    let value = metadata.into_headers().remove(PRINCIPAL_HEADER)?;
    Some((http::HeaderName::from_static(PRINCIPAL_HEADER), value))
}

/// What an incoming call's [`PRINCIPAL_HEADER`] says, without judging
/// whether its sender may vouch: None when absent, Err when unreadable.
pub(crate) fn vouched(metadata: &MetadataMap) -> Result<Option<Principal>, &'static str> {
    let Some(value) = metadata.get_bin(PRINCIPAL_HEADER) else {
        return Ok(None);
    };
    let bytes = value.to_bytes().map_err(|_| "the vouched principal is not base64")?;
    let wire =
        cascade_proto::principal_from_bytes(bytes.as_ref()).map_err(|_| "the vouched principal does not decode")?;
    from_wire(wire)
        .map(Some)
        .ok_or("the vouched principal names no known means")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vouched_principal_reads_back_as_written() {
        let alice = Principal {
            id: "alice@example.com".to_owned(),
            groups: vec!["network-admins".to_owned()],
            via: Via::Jwt,
        };
        let mut metadata = MetadataMap::new();
        assert_eq!(vouched(&metadata), Ok(None));
        vouch(&mut metadata, &alice);
        assert_eq!(vouched(&metadata), Ok(Some(alice)));
    }

    #[test]
    fn a_garbled_vouching_header_is_an_error_not_a_principal() {
        let mut metadata = MetadataMap::new();
        metadata.insert_bin(PRINCIPAL_HEADER, BinaryMetadataValue::from_bytes(b"\xff\xff\xff"));
        assert!(vouched(&metadata).is_err());
    }
}
