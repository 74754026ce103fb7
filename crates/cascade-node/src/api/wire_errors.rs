//! tonic's own refusals of a request it could not read, in the codes the
//! API documents (README, "Error codes").
//!
//! tonic reads a request's gRPC frame before any Cascade code runs
//! (`tonic::server::Grpc::map_request_unary`) and answers a frame it
//! refuses with a trailers-only response:
//!
//! | what tonic saw | tonic's code | ours |
//! |---|---|---|
//! | a message over the size limit (`Streaming::decode_chunk`) | OUT_OF_RANGE | RESOURCE_EXHAUSTED (the gRPC convention for a message over a limit) |
//! | a request body with no message | INTERNAL | INVALID_ARGUMENT |
//! | a request body that ends inside a message | INTERNAL | INVALID_ARGUMENT |
//!
//! Bytes that are a whole frame but no valid protobuf message are the
//! codec's, which already answers INVALID_ARGUMENT
//! (`cascade_proto::codec`). Everything else tonic may answer (an
//! unsupported compression, a compressed-flag without an encoding: INTERNAL
//! by the gRPC spec; UNIMPLEMENTED for an unknown method) is left alone.
//!
//! [`rewrite`] runs on every response of the server (a tower layer) and
//! touches only trailers-only responses whose status is one of the three
//! above, recognised by its code and tonic's own message. A handler's
//! errors never look like that: a stream's errors (the watch below the
//! compaction floor, OUT_OF_RANGE) travel in the trailers after the
//! response headers, and no handler builds these messages.

use tonic::codegen::http;
use tonic::{Code, Status};

/// The start of tonic 0.14's message for a request over
/// `max_decoding_message_size` (`tonic::codec::decode`).
const TOO_LARGE: &str = "Error, decoded message length too large";
/// tonic 0.14's messages for a request body without a whole message.
const NO_MESSAGE: &str = "Missing request message.";
const TRUNCATED: &str = "Unexpected EOF decoding stream.";

/// The code tonic's refusal should have had, if `status` is one of them.
fn corrected(status: &Status) -> Option<Code> {
    match status.code() {
        Code::OutOfRange if status.message().starts_with(TOO_LARGE) => Some(Code::ResourceExhausted),
        Code::Internal if matches!(status.message(), NO_MESSAGE | TRUNCATED) => Some(Code::InvalidArgument),
        _ => None,
    }
}

/// Rewrites a trailers-only response of one of tonic's request refusals
/// (see the module doc); returns every other response unchanged.
pub fn rewrite<B>(mut response: http::Response<B>) -> http::Response<B> {
    // A trailers-only response: the status is in the headers (tonic also
    // keeps the `Status` it came from in the extensions, which is where the
    // unencoded message is).
    if !response.headers().contains_key(Status::GRPC_STATUS) {
        return response;
    }
    let Some(code) = response.extensions().get::<Status>().and_then(corrected) else {
        return response;
    };
    let message = response
        .extensions()
        .get::<Status>()
        .map(|s| s.message().to_owned())
        .unwrap_or_default();
    let status = Status::new(code, message);
    if status.add_header(response.headers_mut()).is_err() {
        // Cannot happen: the message was a valid header value already.
        // Keep at least the code right.
        response
            .headers_mut()
            .insert(Status::GRPC_STATUS, http::HeaderValue::from(code as i32));
    }
    response.extensions_mut().insert(status);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code_of<B>(r: &http::Response<B>) -> Option<String> {
        r.headers()
            .get(Status::GRPC_STATUS)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    #[test]
    fn only_tonics_refusals_are_rewritten() {
        let too_large: http::Response<()> = Status::out_of_range(format!(
            "{TOO_LARGE}: found 20971540 bytes, the limit is: 16777216 bytes"
        ))
        .into_http();
        assert_eq!(code_of(&rewrite(too_large)).as_deref(), Some("8"));
        for m in [NO_MESSAGE, TRUNCATED] {
            let r: http::Response<()> = Status::internal(m).into_http();
            assert_eq!(code_of(&rewrite(r)).as_deref(), Some("3"), "{m}");
        }
        // A handler's own statuses keep their code.
        let floor: http::Response<()> =
            Status::out_of_range("revision 3 was compacted; the outbox starts at 9").into_http();
        assert_eq!(code_of(&rewrite(floor)).as_deref(), Some("11"));
        let internal: http::Response<()> = Status::internal("corrupt resource record").into_http();
        assert_eq!(code_of(&rewrite(internal)).as_deref(), Some("13"));
        // A response with a body (its status comes in the trailers) is untouched.
        let ok = http::Response::new(());
        assert_eq!(code_of(&rewrite(ok)), None);
    }
}
