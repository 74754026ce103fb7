//! The wire edge of the node: the only module that knows `cascade.v1`
//! messages.
//!
//! - [`resources`]: `cascade.v1.Resources`, the client API, and
//!   [`peer`]: `cascade.v1.Peer`, what other regions' nodes call. Both are
//!   adapters around [`Node`]: decode the request, call one `Node` method,
//!   encode the answer (or forward a client request for another region's
//!   name to its owner, unchanged).
//! - [`admin`]: `cascade.v1.Admin`, behind its one gate.
//! - [`server`]: serving a [`Node`] on a listener (or any connection stream)
//!   with these services, health, reflection and the tower layers below,
//!   and stopping it; [`RunningNode`](server::RunningNode) for in-process
//!   nodes.
//! - [`standby`]: what a standby node of a region serves instead of a
//!   [`Node`]: every call forwarded unchanged to the region's writer, and
//!   health of its own; [`relay`]: the caller's region a standby passes on
//!   under mutual TLS, and when the writer believes it.
//! - [`peer_client`]: the other direction, this node's typed calls on other
//!   regions' Peer services: the methods of the port `crate::peers::Peers`
//!   that speak protobuf, an inherent impl kept here at the edge.
//! - [`forward`]: the one rule that classifies what came back from another
//!   region's node (its answer, its error, unreachable, undecodable) into
//!   the port's `RemoteError`, and back into a status.
//! - [`stream`]: the outbox as a gRPC stream (replay, then follow), for
//!   both Watch calls.
//! - [`wire_errors`]: tonic's refusals of unreadable requests in the
//!   documented codes; [`grpc_metrics`]: every call counted by method and
//!   code; [`trace_propagation`]: trace context in calls' metadata.
//! - [`writer_health`]: gRPC health checks answered from the writer's
//!   `committing` flag itself, never staler than a refusal already sent.
//!
//! Nothing below this module names it: the domain (`node.rs` and the
//! feature modules above it) reaches other regions only through the port,
//! and `tests/architecture.rs` checks it.
//!
//! Every failure reaches a client through one conversion, `From<Fault> for
//! Status` below, so the same condition gets the same code and details
//! whichever node answers.

pub(crate) mod admin;
pub(crate) mod authn;
pub(crate) mod forward;
pub(crate) mod grpc_metrics;
pub(crate) mod history;
pub(crate) mod limits;
pub(crate) mod list_operations;
pub(crate) mod listing;
pub(crate) mod operation_control;
pub(crate) mod peer;
pub(crate) mod peer_client;
pub(crate) mod principal;
pub(crate) mod relay;
pub(crate) mod resources;
pub(crate) mod roles;
pub(crate) mod server;
pub(crate) mod standby;
pub(crate) mod stream;
pub(crate) mod tls_accept;
pub(crate) mod trace_propagation;
pub(crate) mod undelete;
pub(crate) mod wire_errors;
pub(crate) mod writer_health;

use std::sync::Arc;

use cascade_core::{CoreError, OperationId, ResourceName};
use cascade_proto::status::{invalid_field, storage_unavailable};
use cascade_proto::status_from_core;
use cascade_proto::v1::admin_server::AdminServer;
use cascade_proto::v1::peer_server::PeerServer;
use cascade_proto::v1::resources_server::ResourcesServer;
use tonic::Status;

use crate::error::Fault;
use crate::node::Node;

impl From<Fault> for Status {
    fn from(fault: Fault) -> Self {
        match fault {
            Fault::Refused(e) => status_from_core(&e),
            Fault::Storage(e) => storage_unavailable(e),
            Fault::Writer(e) => storage_unavailable(e),
            Fault::Remote(e) => forward::status_of(e),
            Fault::Denied(denied) => denied_status(&denied),
            Fault::RateLimited { principal, retry_after } => rate_limited(&principal, retry_after),
        }
    }
}

/// RESOURCE_EXHAUSTED for a principal over its rate, saying when to retry
/// twice over: a `google.rpc.RetryInfo` in the details (the standard rich
/// error model, `tonic-types`) and the `grpc-retry-pushback-ms` trailer
/// gRPC's own retry policy honours.
fn rate_limited(principal: &str, retry_after: std::time::Duration) -> Status {
    use tonic_types::{ErrorDetails, StatusExt};
    let message = Fault::RateLimited {
        principal: principal.to_owned(),
        retry_after,
    }
    .to_string();
    let mut status = Status::with_error_details(
        tonic::Code::ResourceExhausted,
        message,
        ErrorDetails::with_retry_info(Some(retry_after)),
    );
    if let Ok(ms) = retry_after.as_millis().to_string().parse() {
        status.metadata_mut().insert("grpc-retry-pushback-ms", ms);
    }
    status
}

/// PERMISSION_DENIED with the refused members machine-readable too, as a
/// refused delete's blockers are: `ErrorDetails` with reason `DENIED`,
/// `denied` (region, name, verb, rule each) and `more`.
fn denied_status(denied: &crate::error::Denied) -> Status {
    use cascade_proto::v1;
    let details = v1::ErrorDetails {
        reason: v1::ErrorReason::Denied as i32,
        more: denied.more,
        denied: denied
            .members
            .iter()
            .map(|m| v1::DeniedMember {
                region: m.region.clone(),
                name: m.name.clone(),
                verb: m.verb.as_str().to_owned(),
                rule: m.rule.clone(),
            })
            .collect(),
        ..Default::default()
    };
    cascade_proto::status::with_details(tonic::Code::PermissionDenied, denied.to_string(), &details)
}

/// A core refusal as a status (for `map_err`).
pub(crate) fn refused(e: CoreError) -> Status {
    status_from_core(&e)
}

/// A resource name from a request, or INVALID_ARGUMENT naming `field`.
pub(crate) fn parse_name(raw: &str, field: &str) -> Result<ResourceName, Status> {
    ResourceName::parse(raw).map_err(|e| invalid_field(field, e))
}

/// An operation id from a request, or INVALID_ARGUMENT naming `field`.
pub(crate) fn parse_operation_id(raw: &str, field: &str) -> Result<OperationId, Status> {
    OperationId::parse(raw).map_err(|e| invalid_field(field, e))
}

/// The node's gRPC services, with the message size limits applied.
pub(crate) struct Services {
    pub(crate) resources: ResourcesServer<resources::ResourcesApi>,
    pub(crate) peer: PeerServer<peer::PeerApi>,
    pub(crate) admin: AdminServer<admin::AdminApi>,
}

/// The node's gRPC services, with the message size limits applied.
pub(crate) fn services(node: &Arc<Node>) -> Services {
    let max_message = node.limits.max_message_bytes;
    Services {
        resources: ResourcesServer::new(resources::ResourcesApi { node: node.clone() })
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_message),
        peer: PeerServer::new(peer::PeerApi {
            node: node.clone(),
            refusals_logged: Arc::default(),
        })
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(max_message),
        admin: AdminServer::new(admin::AdminApi {
            node: node.clone(),
            refusals_logged: crate::log_throttle::Throttle::default(),
        })
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(max_message),
    }
}

/// The services gRPC health reports on, by name, beside the server as a
/// whole (`""`).
pub(crate) const HEALTH_SERVICES: [&str; 3] = [
    <ResourcesServer<resources::ResourcesApi> as tonic::server::NamedService>::NAME,
    <PeerServer<peer::PeerApi> as tonic::server::NamedService>::NAME,
    <AdminServer<admin::AdminApi> as tonic::server::NamedService>::NAME,
];

/// Reports the server and each of its services as SERVING, or NOT_SERVING
/// (the writer cannot commit: nothing can be created or deleted, and a
/// load balancer or a Kubernetes probe should send clients elsewhere).
pub(crate) async fn report_health(health: &tonic_health::server::HealthReporter, serving: bool) {
    let status = if serving {
        tonic_health::ServingStatus::Serving
    } else {
        tonic_health::ServingStatus::NotServing
    };
    health.set_service_status("", status).await;
    for service in HEALTH_SERVICES {
        health.set_service_status(service, status).await;
    }
}

/// gRPC reflection over every service in `proto/`, as `grpc.reflection.v1`.
pub(crate) fn reflection() -> Result<
    tonic_reflection::server::v1::ServerReflectionServer<impl tonic_reflection::server::v1::ServerReflection>,
    tonic_reflection::server::Error,
> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(cascade_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
}

/// The same as `grpc.reflection.v1alpha`: grpcurl, Postman and grpcio's
/// reflection client still ask this one first (or only).
pub(crate) fn reflection_v1alpha() -> Result<
    tonic_reflection::server::v1alpha::ServerReflectionServer<impl tonic_reflection::server::v1alpha::ServerReflection>,
    tonic_reflection::server::Error,
> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(cascade_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
}
