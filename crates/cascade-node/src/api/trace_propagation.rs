//! Trace context on the wire: the interceptor that puts the current span's
//! context in the metadata of every call to a peer, and the span a served
//! call runs in, a child of the caller's. The rest of the propagation
//! (peer events, the writer's steps) is `trace_context.rs`.

use opentelemetry::propagation::Injector;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Adds the current span's context to every call on a channel to a peer.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct InjectTraceContext;

impl tonic::service::Interceptor for InjectTraceContext {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let context = Span::current().context();
        opentelemetry::global::get_text_map_propagator(|propagator| {
            propagator.inject_context(&context, &mut MetadataInjector(request.metadata_mut()))
        });
        Ok(request)
    }
}

/// Writes a propagator's fields into gRPC metadata (tonic's metadata is not
/// an `http::HeaderMap` that `opentelemetry-http` writes into).
struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(key, value);
        }
    }
}

/// The span a served gRPC call runs in: a child of the caller's span when
/// the call carries a trace context, with the method as a field.
pub(crate) fn request_span(request: &http::Request<()>) -> Span {
    let span = tracing::info_span!("grpc", method = %request.uri().path());
    let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&opentelemetry_http::HeaderExtractor(request.headers()))
    });
    let _ = span.set_parent(parent);
    span
}
