//! The authentication layer: in front of Resources and Admin (not Peer,
//! health or reflection), with `[auth] mode = "required"`, every call is
//! resolved into a [`Principal`] put in the request's extensions (read by
//! [`crate::api::principal::caller`]) or answered UNAUTHENTICATED without
//! reaching the service.
//!
//! Who the caller is, in this order:
//!
//! 1. A TLS client certificate naming a region of the cluster (this one or
//!    a peer) is another node acting for a client: the caller is the
//!    principal it vouches for in `cascade-principal-bin` (required).
//!    Regions are never principals themselves.
//! 2. A vouching header from anyone else is refused.
//! 3. `authorization: Bearer …`: a JWT or a static token
//!    (`auth/identity.rs`).
//! 4. A client certificate's SAN, with `client_certificates`.
//!
//! While the service handles the call, the principal is in scope for the
//! calls this node makes for it ([`crate::peers::carrying`]): a
//! request forwarded to another region's node, or a standby's to its
//! writer, carries it vouched. Refusals are logged (throttled) and
//! audited (at most [`crate::audit::AUDITED_REFUSALS_PER_SECOND`] a second).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use cascade_core::auth::Principal;
use cascade_core::limits::{cut_stored, quote, MAX_AUDIT_TARGET_BYTES};
use cascade_core::RegionId;
use futures::future::BoxFuture;
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::Status;
use tracing::warn;

use crate::admin::Refusal;
use crate::api::principal::{vouch_value, vouched, PRINCIPAL_HEADER};
use crate::api::tls_accept::RecordRefusal;
use crate::auth::identity::{refuse_region_identity, AuthnError, Identities};
use crate::auth::rate::RateLimiter;
use crate::auth::AuthMode;
use crate::auth::AuthSettings;
use crate::clock::Clock;
use crate::error::Fault;
use crate::log_throttle::Throttle;
use crate::node::{Node, NodeError};
use crate::peers::carrying;

/// Who makes a call, for a writer's [`Gate`] and for a standby (which
/// authenticates the callers it forwards and vouches for them to its
/// writer): the means of `[auth]` and the regions of the cluster.
pub(crate) struct Authenticator {
    identities: Identities,
    region: RegionId,
    /// Whether a region id is one of the cluster's peers.
    is_peer: Box<dyn Fn(&str) -> bool + Send + Sync>,
    /// With TLS, a forwarded call vouches for its caller; in plain text
    /// nobody's vouching can be believed, so it carries the caller's own
    /// `authorization` (the next node checks it again).
    tls: bool,
}

impl Authenticator {
    /// Loads the tokens and JWKS files of `settings` (a missing or
    /// malformed one is an error at start); None with authentication off.
    pub(crate) fn load(
        settings: &AuthSettings,
        clock: Arc<dyn Clock>,
        region: RegionId,
        tls: bool,
        is_peer: Box<dyn Fn(&str) -> bool + Send + Sync>,
    ) -> Result<Option<Authenticator>, NodeError> {
        if settings.mode == AuthMode::Off {
            return Ok(None);
        }
        let identities = Identities::load(settings, clock).map_err(|e| NodeError::Config(format!("[auth]: {e}")))?;
        Ok(Some(Authenticator {
            identities,
            region,
            is_peer,
            tls,
        }))
    }

    fn of_cluster(&self, region: &str) -> bool {
        region == self.region.as_str() || (self.is_peer)(region)
    }

    /// Who makes this call (see the module doc).
    pub(crate) fn authenticate(
        &self,
        headers: &http::HeaderMap,
        extensions: &http::Extensions,
    ) -> Result<Principal, AuthnError> {
        let identities = &self.identities;
        let chain = extensions
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(|info| info.peer_certs());
        let leaf = chain.as_deref().and_then(|c| c.first());
        let region = leaf
            .and_then(|l| cascade_tls::peer_region(std::slice::from_ref(l)).ok())
            .filter(|r| self.of_cluster(r.as_str()));
        let vouching_header = headers.get(PRINCIPAL_HEADER).is_some();
        if let Some(region) = region {
            let metadata = MetadataMap::from_headers(headers.clone());
            let principal = vouched(&metadata)
                .map_err(|e| AuthnError::Vouch(format!("from {region}: {e}")))?
                .ok_or_else(|| {
                    AuthnError::Vouch(format!(
                        "is missing: {region}'s certificate is a region's, which calls Resources and Admin \
                         only for a client it vouches for"
                    ))
                })?;
            if principal.is_anonymous() {
                return Err(AuthnError::Vouch(format!(
                    "from {region} vouches for nobody (its authentication is off)"
                )));
            }
            refuse_region_identity(&principal, |r| self.of_cluster(r))?;
            return Ok(principal);
        }
        if vouching_header {
            return Err(AuthnError::Vouch(
                "is accepted only from a region certificate of this cluster".to_owned(),
            ));
        }
        let principal = match headers.get(http::header::AUTHORIZATION) {
            Some(value) => {
                let bearer = value
                    .to_str()
                    .ok()
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .ok_or_else(|| {
                        AuthnError::Malformed("the authorization header is not `Bearer <token or JWT>`".to_owned())
                    })?;
                identities.bearer(bearer.trim())?
            }
            None => match leaf {
                Some(leaf) if identities.accepts_certificates() => identities.certificate(leaf.as_ref())?,
                _ => {
                    return Err(AuthnError::Missing(if identities.accepts_certificates() {
                        " or present a client certificate"
                    } else {
                        ""
                    }))
                }
            },
        };
        refuse_region_identity(&principal, |r| self.of_cluster(r))?;
        Ok(principal)
    }

    /// What the calls made for `principal` carry to the next node: the
    /// vouching header (TLS), or the caller's own `authorization`.
    pub(crate) fn carried(
        &self,
        principal: &Principal,
        headers: &http::HeaderMap,
    ) -> Option<(http::HeaderName, http::HeaderValue)> {
        if self.tls {
            return vouch_value(principal);
        }
        headers
            .get(http::header::AUTHORIZATION)
            .map(|v| (http::header::AUTHORIZATION, v.clone()))
    }
}

/// What the layer of every authenticated service shares.
pub(crate) struct Gate {
    node: Arc<Node>,
    /// None: authentication is off, calls pass unchanged.
    authenticator: Option<Authenticator>,
    /// `[auth.rate]`: mutating calls per principal.
    rate: Option<RateLimiter>,
    refusals_logged: Throttle,
}

impl Gate {
    /// The gate of `node`: loads its tokens and JWKS files under
    /// `required` (a missing or malformed one stops the start).
    pub(crate) fn new(node: &Arc<Node>) -> Result<Arc<Gate>, NodeError> {
        let peers = node.peers.clone();
        let authenticator = Authenticator::load(
            &node.auth,
            node.clock.clone(),
            node.region.clone(),
            node.tls.is_some(),
            Box::new(move |r| peers.knows(r)),
        )?;
        Ok(Arc::new(Gate {
            node: node.clone(),
            authenticator,
            rate: node.auth.rate.map(RateLimiter::new),
            refusals_logged: Throttle::default(),
        }))
    }

    /// `service` behind this gate.
    pub(crate) fn guard<S>(self: &Arc<Self>, service: S) -> Authenticated<S> {
        Authenticated {
            inner: service,
            gate: self.clone(),
        }
    }

    /// Logs (throttled) and audits (bounded: `Node::audit_refusal`) a
    /// refused call: the one place the layer's refusals, and those of a
    /// connection whose certificate is untrusted (`api/tls_accept.rs`),
    /// are written down.
    async fn log_and_audit(&self, method: &str, status: &Status) {
        let code = match status.code() {
            tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            _ => "UNAUTHENTICATED",
        };
        let mut context = self.node.audit_context(&Principal::anonymous(), "", None);
        context.who = describe_presented(status);
        context.via = String::new();
        let refusal = Refusal {
            context,
            action: method.rsplit('/').next().unwrap_or(method).to_owned(),
            target: cut_stored(method, MAX_AUDIT_TARGET_BYTES),
            outcome: format!("{code}: {}", status.message()),
        };
        let audited = self.node.audit_refusal(refusal).await;
        if let Some(more) = self.refusals_logged.admit() {
            warn!(region = %self.node.region, method, reason = %status.message(), audited,
                suppressed = more.count(), "refused an unauthenticated call{more}");
        }
    }
}

/// A call on a connection whose client certificate no CA of this node
/// issued: refused before any service, written down like the layer's own
/// refusals, and counted with the calls refused UNAUTHENTICATED.
impl RecordRefusal for Gate {
    fn refused<'a>(&'a self, method: &'a str, status: &'a Status) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            // The path is the client's: one series for every path (as
            // for unknown methods), or any client could add series.
            self.node
                .metrics
                .grpc_call("unknown", "UNAUTHENTICATED", std::time::Duration::ZERO);
            self.log_and_audit(method, status).await;
        })
    }
}

/// Whether a call (by its path) goes to a service behind the gate:
/// Resources and Admin (Peer, health and reflection stay open).
pub(crate) fn is_guarded(path: &str) -> bool {
    use cascade_proto::v1::{admin_server::AdminServer, resources_server::ResourcesServer};
    let service = path.trim_start_matches('/').split('/').next().unwrap_or_default();
    service == <ResourcesServer<crate::api::resources::ResourcesApi> as NamedService>::NAME
        || service == <AdminServer<crate::api::admin::AdminApi> as NamedService>::NAME
}

/// The calls that change something, which `[auth.rate]` limits.
const MUTATING: [&str; 16] = [
    "/cascade.v1.Resources/Create",
    "/cascade.v1.Resources/BatchCreate",
    "/cascade.v1.Resources/Update",
    "/cascade.v1.Resources/Delete",
    "/cascade.v1.Resources/AddLien",
    "/cascade.v1.Resources/RemoveLien",
    "/cascade.v1.Resources/RemoveFinalizer",
    "/cascade.v1.Resources/ReportFinalizerFailure",
    "/cascade.v1.Admin/RetryDeletion",
    "/cascade.v1.Admin/ForcePurge",
    // A count changes nothing, but the call is one (it may force).
    "/cascade.v1.Admin/Purge",
    "/cascade.v1.Resources/PauseOperation",
    "/cascade.v1.Resources/ResumeOperation",
    "/cascade.v1.Resources/CancelOperation",
    "/cascade.v1.Resources/Undelete",
    "/cascade.v1.Admin/ExtendBudget",
];

fn is_mutating(path: &str) -> bool {
    MUTATING.contains(&path)
}

/// Who the audit log says was refused: never the credential, a short
/// reason instead.
fn describe_presented(status: &Status) -> String {
    let what = match status.code() {
        tonic::Code::ResourceExhausted => "rate limited",
        _ => "unauthenticated",
    };
    format!("{what} ({})", quote(status.message()))
}

/// A service behind the [`Gate`].
#[derive(Clone)]
pub(crate) struct Authenticated<S> {
    inner: S,
    gate: Arc<Gate>,
}

impl<S: NamedService> NamedService for Authenticated<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tower::Service<http::Request<Body>> for Authenticated<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        // The clone that was made ready is the one to call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let gate = self.gate.clone();
        Box::pin(async move {
            let principal = match &gate.authenticator {
                None => Principal::anonymous(),
                Some(authenticator) => match authenticator.authenticate(request.headers(), request.extensions()) {
                    Ok(principal) => principal,
                    Err(refusal) => {
                        let status = Status::unauthenticated(refusal.to_string());
                        gate.log_and_audit(request.uri().path(), &status).await;
                        return Ok(status.into_http());
                    }
                },
            };
            if let Some(rate) = &gate.rate {
                if is_mutating(request.uri().path()) {
                    if let Err(retry_after) = rate.admit(&principal.id, crate::clock::monotonic_now()) {
                        let status = Status::from(Fault::RateLimited {
                            principal: quote(&principal.id),
                            retry_after,
                        });
                        gate.log_and_audit(request.uri().path(), &status).await;
                        return Ok(status.into_http());
                    }
                }
            }
            let Some(authenticator) = &gate.authenticator else {
                // Authentication off: nobody is vouched for, the services
                // see the anonymous principal.
                return inner.call(request).await;
            };
            let carried = authenticator.carried(&principal, request.headers());
            request.extensions_mut().insert(principal);
            carrying(carried, inner.call(request)).await
        })
    }
}
