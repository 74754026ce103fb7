//! A tower layer counting every gRPC call the node serves by method and
//! status code, with its duration, into the node's metrics
//! (`cascade_grpc_server_requests_total`,
//! `cascade_grpc_server_request_duration_seconds`). Here, at the wire
//! edge, because it reads `grpc-status` off the responses.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::metrics::NodeMetrics;

/// A tower layer counting every gRPC call by method and status code, with
/// its duration. The code is the response's `grpc-status`: in its headers
/// (a refusal before any message), else in its trailers (read as the body
/// ends); a body dropped before its trailers counts as CANCELLED.
#[derive(Clone)]
pub(crate) struct GrpcMetricsLayer(pub Arc<NodeMetrics>);

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;
    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetrics {
            inner,
            metrics: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct GrpcMetrics<S> {
    inner: S,
    metrics: Arc<NodeMetrics>,
}

/// The call being measured: its method, when it started, and whether it
/// was counted yet.
struct CallRecord {
    metrics: Arc<NodeMetrics>,
    method: String,
    started: tokio::time::Instant,
    counted: bool,
}

impl CallRecord {
    fn finish(&mut self, code: &str) {
        if !self.counted {
            self.counted = true;
            // A path no service serves is UNIMPLEMENTED: one series for
            // all of them, or any client could add series without end.
            let method = if code == "UNIMPLEMENTED" {
                "unknown"
            } else {
                &self.method
            };
            self.metrics.grpc_call(method, code, self.started.elapsed());
        }
    }
}

impl Drop for CallRecord {
    fn drop(&mut self) {
        self.finish("CANCELLED");
    }
}

/// The name of a `grpc-status` value, as the gRPC spec spells codes.
fn code_name(value: Option<&http::HeaderValue>) -> Option<&'static str> {
    let code: i32 = value?.to_str().ok()?.parse().ok()?;
    Some(match tonic::Code::from_i32(code) {
        tonic::Code::Ok => "OK",
        tonic::Code::Cancelled => "CANCELLED",
        tonic::Code::Unknown => "UNKNOWN",
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::AlreadyExists => "ALREADY_EXISTS",
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::Aborted => "ABORTED",
        tonic::Code::OutOfRange => "OUT_OF_RANGE",
        tonic::Code::Unimplemented => "UNIMPLEMENTED",
        tonic::Code::Internal => "INTERNAL",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::DataLoss => "DATA_LOSS",
        tonic::Code::Unauthenticated => "UNAUTHENTICATED",
    })
}

impl<S, B, ResBody> tower::Service<http::Request<B>> for GrpcMetrics<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<MeteredBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let mut record = CallRecord {
            metrics: self.metrics.clone(),
            method: request.uri().path().to_owned(),
            started: crate::clock::monotonic_now(),
            counted: false,
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = match response.await {
                Ok(r) => r,
                Err(e) => {
                    record.finish("UNAVAILABLE");
                    return Err(e);
                }
            };
            if let Some(code) = code_name(response.headers().get("grpc-status")) {
                record.finish(code);
            }
            Ok(response.map(|inner| MeteredBody { inner, record }))
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body that counts its call when its trailers pass.
    pub(crate) struct MeteredBody<B> {
        #[pin]
        inner: B,
        record: CallRecord,
    }
}

impl<B: http_body::Body> http_body::Body for MeteredBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = this.inner.poll_frame(cx);
        match &frame {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(code) = f.trailers_ref().and_then(|t| code_name(t.get("grpc-status"))) {
                    this.record.finish(code);
                }
            }
            Poll::Ready(Some(Err(_))) => this.record.finish("INTERNAL"),
            // Ended without a status: not a gRPC reply.
            Poll::Ready(None) => this.record.finish("UNKNOWN"),
            Poll::Pending => {}
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
