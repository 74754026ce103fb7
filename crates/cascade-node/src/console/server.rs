//! The console's listener and routes. HTTP, or HTTPS with the node's own
//! certificate when the node has `[tls]` (the browser checks it against
//! the cluster's CA, like a client); each connection served by hyper
//! (HTTP/1.1 and HTTP/2), stopped with the node: live streams end, and
//! open connections get `DRAIN` to close.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Form;
use axum::Router;
use cascade_client::ClientTls;
use cascade_core::limits::quote;
use cascade_proto::v1;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio_rustls::rustls;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

use super::backend::{Backend, OUTCOMES_PAGE};
use super::context::{operation_id, page_token, resource_name, Console};
use super::delete;
use super::error::ConsoleError;
use super::hosts::{only_own_hosts, AllowedHosts};
use super::live::{self, MAX_LIVE_STREAMS};
use super::pages;
use super::session::{local_path, usable_token, Caller, TOKEN_COOKIE};

/// A TLS handshake that takes longer is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// After the node stops, how long open connections get to close.
const DRAIN: Duration = Duration::from_secs(2);

/// After a failed accept (out of file descriptors, say), before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

const CONSOLE_CSS: &str = include_str!("assets/console.css");
const CONSOLE_JS: &str = include_str!("assets/console.js");

/// Every answer's Content Security Policy: no script but the console's own
/// file, no inline script or style, no other site, no framing.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// What the node hands its console: where its own API is, how to trust
/// it, and the certificate to serve HTTPS with.
pub(crate) struct ConsoleSetup {
    /// This node's API as a client dials it (`http://` or `https://`).
    pub api_endpoint: String,
    /// The cluster's CA and the name the node's certificate must bear;
    /// never a client identity (the console calls as its caller).
    pub client_tls: Option<ClientTls>,
    /// The node's certificate chain and key (PEM): HTTPS with them.
    pub https_identity: Option<(String, String)>,
    /// The region of the node, shown on every page.
    pub region: String,
    /// The console's own listen address: a request may name it as its host.
    pub listen: Option<std::net::SocketAddr>,
    /// `[console] allowed_hosts`: other names a request may give as its
    /// host (`hosts.rs`).
    pub allowed_hosts: Vec<String>,
}

/// Why the console could not start (the node's start fails with it).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConsoleStartError {
    #[error("[console] with [tls]: the node's certificate or key: {0}")]
    Certificate(String),
}

/// Serves the console on `listener` until `shutdown` resolves.
pub(crate) async fn serve(
    setup: ConsoleSetup,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ConsoleStartError> {
    let tls = setup
        .https_identity
        .as_ref()
        .map(|(cert, key)| https_config(cert, key).map(TlsAcceptor::from))
        .transpose()?;
    let (stop, stopping) = watch::channel(false);
    let console = Arc::new(Console {
        backend: Backend::new(setup.api_endpoint, setup.client_tls),
        region: setup.region,
        secure: tls.is_some(),
        stopping,
        live_streams: Arc::new(Semaphore::new(MAX_LIVE_STREAMS)),
    });
    let scheme = if tls.is_some() { "https" } else { "http" };
    if let Ok(addr) = listener.local_addr() {
        info!(region = %console.region, url = %format!("{scheme}://{addr}/"), "console serving");
    }
    let hosts = Arc::new(AllowedHosts::new(setup.listen, &setup.allowed_hosts));
    let app = routes(console, hosts);
    let graceful = GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
    tokio::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    warn!(error = %e, "console: accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let acceptor = tls.clone();
        tokio::spawn(async move {
            match acceptor {
                None => {
                    let _ = watcher
                        .watch(builder.serve_connection(TokioIo::new(tcp), service).into_owned())
                        .await;
                }
                Some(acceptor) => {
                    let Ok(Ok(stream)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await else {
                        return;
                    };
                    let _ = watcher
                        .watch(builder.serve_connection(TokioIo::new(stream), service).into_owned())
                        .await;
                }
            }
        });
    }
    let _ = stop.send(true);
    let _ = tokio::time::timeout(DRAIN, graceful.shutdown()).await;
    Ok(())
}

/// The node's certificate for browsers: no client certificate asked
/// (a browser would prompt for one), HTTP/2 or HTTP/1.1.
fn https_config(cert_pem: &str, key_pem: &str) -> Result<Arc<rustls::ServerConfig>, ConsoleStartError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |e: &dyn std::fmt::Display| ConsoleStartError::Certificate(e.to_string());
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&e))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| bad(&e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&e))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| bad(&e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn routes(console: Arc<Console>, hosts: Arc<AllowedHosts>) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/operations") }))
        .route(
            "/assets/console.css",
            get(|| async { asset("text/css; charset=utf-8", CONSOLE_CSS) }),
        )
        .route(
            "/assets/console.js",
            get(|| async { asset("text/javascript; charset=utf-8", CONSOLE_JS) }),
        )
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/find", get(find))
        .route("/operations", get(operations_page))
        .route("/operations/live", get(live::operations))
        .route("/operations/{id}", get(operation_page))
        .route("/operations/{id}/live", get(live::operation))
        // A resource, or with `/delete` after its name its dry run (GET)
        // and the delete (POST): a name never has a fourth segment.
        .route("/resources/{*name}", get(resource_page).post(delete::submit))
        .route("/cluster", get(super::cluster::cluster_page))
        .fallback(not_found)
        // Before any route: a request naming another host is refused.
        .layer(axum::middleware::from_fn_with_state(hosts, only_own_hosts))
        .layer(tower::util::MapResponseLayer::new(protective_headers))
        .with_state(console)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// Headers of every answer: what may run and load, no sniffing, no
/// caching of pages that hold what the caller may read.
fn protective_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    // Unless the page chose otherwise (the dry run's: `delete.rs`).
    headers
        .entry(header::REFERRER_POLICY)
        .or_insert(HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

async fn not_found(State(console): State<Arc<Console>>) -> Response {
    pages::not_found(&console.region)
}

#[derive(Debug, Deserialize)]
struct FindQuery {
    #[serde(default)]
    q: String,
}

/// The search box: an operation id or a resource name, opened.
async fn find(State(console): State<Arc<Console>>, Query(query): Query<FindQuery>) -> Response {
    let q = query.q.trim();
    if let Ok(id) = operation_id(q) {
        return Redirect::to(&pages::operation_href(&id)).into_response();
    }
    match resource_name(q) {
        Ok(name) => Redirect::to(&pages::resource_href(&name)).into_response(),
        Err(_) => pages::failure(
            &console.region,
            &ConsoleError::BadRequest(format!(
                "{} is neither an operation id (a UUID) nor a resource name (region/kind/id)",
                quote(q)
            )),
            "/operations",
        ),
    }
}

async fn operations_page(State(console): State<Arc<Console>>, caller: Caller) -> Response {
    match console.backend.running_operations(&caller).await {
        Ok(running) => {
            let table = pages::operations_table(&running, &|_| None);
            pages::operations(&console.region, table).into_response_with(StatusCode::OK)
        }
        Err(e) => pages::failure(&console.region, &e, "/operations"),
    }
}

#[derive(Debug, Deserialize)]
struct OperationQuery {
    /// A page of outcomes after the first.
    #[serde(default)]
    outcomes: String,
}

async fn operation_page(
    State(console): State<Arc<Console>>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<OperationQuery>,
) -> Response {
    let here = format!("/operations/{}", pages::query_value(&id));
    let page = async {
        let id = operation_id(&id)?;
        let token = page_token(&query.outcomes)?;
        // At once: each within the call budget, so the page too.
        let (op, explained) = futures::join!(
            console.backend.operation(&caller, &id, OUTCOMES_PAGE, token),
            console.backend.explain(&caller, &id)
        );
        let op = op?;
        let explained = (!op.done).then(|| explained.map_err(|e| e.to_string()));
        let rate = if op.done { live::average_rate(&op) } else { None };
        let live_part = pages::live_operation(&op, explained.as_ref().map(|r| r.as_ref().map_err(Clone::clone)), rate);
        Ok::<_, ConsoleError>(pages::operation_page(&console.region, &op, live_part, token))
    };
    match page.await {
        Ok(page) => page.into_response_with(StatusCode::OK),
        Err(e) => pages::failure(&console.region, &e, &here),
    }
}

#[derive(Debug, Deserialize)]
struct ResourceQuery {
    #[serde(default)]
    referrers: String,
    #[serde(default)]
    targets: String,
    /// A page of its history after the newest.
    #[serde(default)]
    history: String,
}

async fn resource_page(
    State(console): State<Arc<Console>>,
    caller: Caller,
    Path(name): Path<String>,
    Query(query): Query<ResourceQuery>,
) -> Response {
    if let Some(root) = name.strip_suffix(pages::DELETE_SUFFIX) {
        return delete::page(&console, &caller, root).await;
    }
    let here = pages::resource_href(&name);
    let page = async {
        let name = resource_name(&name)?;
        let referrers_token = page_token(&query.referrers)?;
        let targets_token = page_token(&query.targets)?;
        let history_token = page_token(&query.history)?;
        // The history beside the resource: a resource that is gone (Get
        // NOT_FOUND) still has the events its region keeps.
        let (resource, history) = futures::join!(
            console.backend.resource(&caller, &name),
            console.backend.history(&caller, &name, history_token),
        );
        let history = history.map_err(|e| e.to_string());
        let resource = match resource {
            Ok(resource) => resource,
            Err(ConsoleError::NotFound(why)) if history.is_ok() => {
                return Ok(pages::resource_gone(
                    &console.region,
                    &name,
                    &why,
                    history.as_ref().map_err(Clone::clone),
                ));
            }
            Err(e) => return Err(e),
        };
        let (referrers, targets) = futures::join!(
            console
                .backend
                .references(&caller, &name, v1::ReferenceDirection::Referrers, referrers_token),
            console
                .backend
                .references(&caller, &name, v1::ReferenceDirection::Targets, targets_token),
        );
        let referrers = referrers.map_err(|e| e.to_string());
        let targets = targets.map_err(|e| e.to_string());
        Ok::<_, ConsoleError>(pages::resource(
            &console.region,
            &resource,
            referrers.as_ref().map_err(Clone::clone),
            targets.as_ref().map_err(Clone::clone),
            history.as_ref().map_err(Clone::clone),
        ))
    };
    match page.await {
        Ok(page) => page.into_response_with(StatusCode::OK),
        // Another region's resource, not read in time: name that region.
        Err(e @ ConsoleError::Unavailable(_)) => match name.split_once('/') {
            Some((owner, _)) if owner != console.region.as_str() => {
                pages::region_failure(&console.region, owner, &e, &here)
            }
            _ => pages::failure(&console.region, &e, &here),
        },
        Err(e) => pages::failure(&console.region, &e, &here),
    }
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    token: String,
    /// The console path to go back to.
    #[serde(default)]
    next: String,
}

#[derive(Debug, Deserialize)]
struct LoginQuery {
    #[serde(default)]
    next: String,
}

async fn login_page(State(console): State<Arc<Console>>, Query(q): Query<LoginQuery>) -> Response {
    pages::login(&console.region, local_path(&q.next), None).into_response_with(StatusCode::OK)
}

async fn login(State(console): State<Arc<Console>>, Form(form): Form<LoginForm>) -> Response {
    let token = form.token.trim();
    let next = local_path(&form.next);
    if let Err(why) = usable_token(token) {
        return pages::login(&console.region, next, Some(&why)).into_response_with(StatusCode::BAD_REQUEST);
    }
    let secure = if console.secure { "; Secure" } else { "" };
    let set = format!("{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict{secure}");
    let mut response = Redirect::to(next).into_response();
    match HeaderValue::from_str(&set) {
        Ok(value) => {
            response.headers_mut().insert(header::SET_COOKIE, value);
            response
        }
        // usable_token let through only header-safe bytes.
        Err(_) => pages::login(&console.region, next, Some("the token cannot be sent as a header"))
            .into_response_with(StatusCode::BAD_REQUEST),
    }
}

async fn logout(State(console): State<Arc<Console>>) -> Response {
    let secure = if console.secure { "; Secure" } else { "" };
    let mut response = Redirect::to("/login").into_response();
    if let Ok(value) = HeaderValue::from_str(&format!(
        "{TOKEN_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}"
    )) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}
