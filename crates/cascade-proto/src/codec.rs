//! The gRPC codec of every Cascade service and client: tonic-prost's
//! encoding, with one change on the decoding side.
//!
//! tonic-prost answers a message that does not decode as INTERNAL (gRPC's
//! advice for a *response* a client cannot parse). A request a server
//! cannot parse is the caller's mistake, and ARCHITECTURE.md and README's
//! "Error codes" promise INVALID_ARGUMENT for it, so [`WireCodec`]'s
//! decoder answers INVALID_ARGUMENT. `build.rs` sets it as the generated
//! code's `codec_path`, so it serves every method of `Resources` and
//! `Peer`.
//!
//! Generated clients use the same codec (tonic-prost-build has one codec
//! path for both sides), where the message is a *response*. The status
//! therefore carries an [`Undecodable`] source, which no status received
//! from a server has: [`is_undecodable`] tells a node that forwarded a
//! call that the owner's answer, not its own client's request, was at
//! fault (see `cascade-node`'s `forward.rs`).
//!
//! The size limit is not a codec matter: tonic checks it before the codec
//! sees a byte (see `cascade-node`'s `wire_errors.rs`).

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::ProstEncoder;

/// tonic-prost's codec with INVALID_ARGUMENT for undecodable messages.
#[derive(Debug, Clone)]
pub struct WireCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for WireCodec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

impl<T, U> Codec for WireCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = WireDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        WireDecoder { _pd: PhantomData }
    }
}

/// Decodes with prost; a decode error is INVALID_ARGUMENT (see the module doc).
#[derive(Debug, Clone)]
pub struct WireDecoder<U> {
    _pd: PhantomData<U>,
}

impl<U: Message + Default> Decoder for WireDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(undecodable)
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// The source of a status made by [`WireDecoder`]: marks it as this
/// process's failure to decode a message it received.
#[derive(Debug, thiserror::Error)]
#[error("{status}")]
pub struct Undecodable {
    #[source]
    status: Status,
}

fn undecodable(e: prost::DecodeError) -> Status {
    let status = Status::invalid_argument(format!("the message could not be decoded: {e}"));
    // `from_error` finds the status in the source chain, keeps its code and
    // message, and records the chain as the status's source.
    Status::from_error(Box::new(Undecodable { status }))
}

/// Whether `status` is this process's failure to decode a message it
/// received (rather than a status a server sent).
pub fn is_undecodable(status: &Status) -> bool {
    let mut cause = std::error::Error::source(status);
    while let Some(e) = cause {
        if e.is::<Undecodable>() {
            return true;
        }
        cause = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decode_error_is_invalid_argument_and_marked() {
        let e = crate::v1::GetRequest::decode(&[0x0a, 0xff][..]).unwrap_err();
        let status = undecodable(e);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("could not be decoded"), "{status:?}");
        assert!(is_undecodable(&status));
        assert!(!is_undecodable(&Status::invalid_argument("from a server")));
    }
}
