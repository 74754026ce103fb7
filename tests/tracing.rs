//! One deletion is one trace across regions: trace context travels in gRPC
//! metadata on calls between nodes and with the owner's events on
//! `Peer.Watch`, and every region's spans of the cascade share the trace id
//! of the Delete call. Spans are collected in memory, as an OTLP collector
//! would receive them.
//!
//! Its own test binary: it installs the process-wide subscriber and
//! propagator.

// Test code: real time for deadlines.
#![allow(clippy::disallowed_methods)]

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use opentelemetry::trace::{TraceId, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use support::*;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

/// The regions whose spans belong to `trace`.
fn regions_in(spans: &[SpanData], trace: TraceId) -> BTreeSet<String> {
    spans
        .iter()
        .filter(|s| s.span_context.trace_id() == trace)
        .filter_map(|s| attribute(s, "region"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_region_cascade_is_one_trace_in_every_region() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("info"))
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
        .init();

    // One referrer per step: the network's deletion, one level below the
    // project, is committed by a background work step, not by the call.
    let cluster = start_cluster_with(&["eu-west", "us-east", "ap-south"], |s| s.policy.batch_budget = 1).await;
    let client = cluster.client("eu-west");
    client
        .batch_create(vec![
            spec_in("eu-west/project/p", &[]),
            spec_in("eu-west/network/n", &[("project", &["eu-west/project/p"])]),
        ])
        .await
        .expect("eu-west's resources");
    client
        .batch_create(vec![spec_in("us-east/port/a", &[("network", &["eu-west/network/n"])])])
        .await
        .expect("us-east's port");
    client
        .batch_create(vec![
            spec_in("ap-south/project/ops", &[]),
            spec_in(
                "ap-south/floating_ip/f",
                &[("project", &["ap-south/project/ops"]), ("port", &["us-east/port/a"])],
            ),
        ])
        .await
        .expect("ap-south's floating IP on us-east's port");

    // eu-west's project goes, and its network with it (a work step's);
    // us-east's port cascades; ap-south's floating IP loses its port
    // (unset).
    let op = delete_and_wait(client, "eu-west/project/p", true).await;
    assert!(op.done);
    eventually(Duration::from_secs(20), "ap-south to unset the port", || async {
        let fip = client.get("ap-south/floating_ip/f").await.ok()?;
        targets(&fip, "port").is_empty().then_some(())
    })
    .await;

    let spans = eventually(Duration::from_secs(10), "spans of all three regions", || async {
        let _ = provider.force_flush();
        let spans = exporter.get_finished_spans().ok()?;
        let delete = spans
            .iter()
            .find(|s| s.name == "delete" && attribute(s, "region").as_deref() == Some("eu-west"))?;
        let trace = delete.span_context.trace_id();
        (regions_in(&spans, trace).len() == 3).then_some(spans)
    })
    .await;
    let delete = spans
        .iter()
        .find(|s| s.name == "delete" && attribute(s, "region").as_deref() == Some("eu-west"))
        .expect("the Delete step's span");
    let trace = delete.span_context.trace_id();
    assert_ne!(trace, TraceId::INVALID);
    // Each region applied the event that made it act in a span of that
    // trace: us-east eu-west's network (deleted by a work step), ap-south
    // us-east's port (deleted by us-east's step).
    eventually(Duration::from_secs(10), "the importers' steps in the trace", || async {
        let _ = provider.force_flush();
        let spans = exporter.get_finished_spans().ok()?;
        let seen = |region: &str, first: &str| {
            spans.iter().any(|s| {
                s.name == "apply_peer_events"
                    && s.span_context.trace_id() == trace
                    && attribute(s, "region").as_deref() == Some(region)
                    && attribute(s, "first").as_deref() == Some(first)
            })
        };
        (seen("us-east", "eu-west/network/n") && seen("ap-south", "us-east/port/a")).then_some(())
    })
    .await;
    // The Delete call's own span is the trace's root, served by eu-west.
    let root = spans
        .iter()
        .find(|s| s.span_context.trace_id() == trace && s.parent_span_id == opentelemetry::trace::SpanId::INVALID)
        .expect("a root span");
    assert_eq!(root.name, "grpc", "{root:?}");
    assert_eq!(
        attribute(root, "method").as_deref(),
        Some("/cascade.v1.Resources/Delete")
    );
    let _ = provider.shutdown();
}
