//! A thin typed client over the generated `Resources` client.

use cascade_proto::error_details;
use cascade_proto::v1::{self, resources_client::ResourcesClient};
pub use cascade_tls::ClientTls;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid server address {addr:?}: {message}")]
    Address { addr: String, message: String },
    #[error("cannot connect to {addr}: {message} (is a node running there? `cascade demo` starts one)")]
    Connect { addr: String, message: String },
    /// The server refused or failed the call.
    #[error("{}", describe_status(.0))]
    Status(Box<Status>),
    #[error("{0}")]
    Usage(String),
}

impl ClientError {
    pub fn code(&self) -> Option<Code> {
        match self {
            ClientError::Status(s) => Some(s.code()),
            _ => None,
        }
    }
}

impl From<Status> for ClientError {
    fn from(s: Status) -> Self {
        ClientError::Status(Box::new(s))
    }
}

/// `CODE: message`. The server's message already lists blockers and
/// dependents; the structured details only add how many were left out. A
/// PERMISSION_DENIED of several members lists them from the details, one
/// a line ([`crate::render::denied_refusal_text`]).
pub fn describe_status(s: &Status) -> String {
    let details = error_details(s);
    if let Some(d) = details.as_ref().filter(|_| s.code() == Code::PermissionDenied) {
        // A refusal of several members (a cascade's closure): one line each.
        if let Some(text) = crate::render::denied_refusal_text(s.message(), &d.denied, d.more) {
            return format!("{:?}: {text}", s.code());
        }
    }
    let mut out = format!("{:?}: {}", s.code(), s.message());
    if s.code() == Code::Unknown && s.message() == "transport error" {
        // The connection broke before any gRPC answer: say why, and the usual cause.
        out += &format!(
            " ({}; a node serving TLS needs an https:// address and --ca-cert)",
            error_chain(s)
        );
    }
    if let Some(d) = details {
        if d.more > 0 && !s.message().contains("more)") {
            out += &format!(" (and {} more)", d.more);
        }
    }
    if let Some(resume) = cascade_proto::status::resume_revision(s) {
        // A watch the outbox was compacted past: what to run next.
        out += &format!("; events were missed: `cascade list` what you follow, then `cascade watch --from {resume}`");
    }
    out
}

#[derive(Clone)]
pub struct Client {
    inner: ResourcesClient<Channel>,
    /// `authorization: Bearer …` for every call (`--token`, `CASCADE_TOKEN`).
    bearer: Option<tonic::metadata::AsciiMetadataValue>,
}

/// `Bearer <token>` as a header value: a token is printable ASCII.
fn bearer_value(token: &str) -> Result<tonic::metadata::AsciiMetadataValue, ClientError> {
    format!("Bearer {token}")
        .parse()
        .map_err(|_| ClientError::Usage("a token must be printable ASCII, without line breaks".into()))
}

/// Opens a channel to `addr`. `https://` needs `tls` (the cluster's CA);
/// `expected_region`, when known, is what the server's certificate must name.
pub async fn connect_channel(
    addr: &str,
    tls: Option<&ClientTls>,
    expected_region: Option<&str>,
) -> Result<Channel, ClientError> {
    let mut endpoint = Endpoint::from_shared(addr.to_owned()).map_err(|e| ClientError::Address {
        addr: addr.to_owned(),
        message: e.to_string(),
    })?;
    match tls {
        Some(tls) => {
            let mut config = tls.config();
            if let (None, Some(region)) = (&tls.server_name, expected_region) {
                config = config.domain_name(cascade_tls::identity_name(region));
            }
            endpoint = endpoint.tls_config(config).map_err(|e| ClientError::Address {
                addr: addr.to_owned(),
                message: e.to_string(),
            })?;
        }
        None if addr.starts_with("https://") => {
            return Err(ClientError::Usage(format!(
                "{addr}: https:// needs the cluster's CA certificate: --ca-cert FILE (or CASCADE_CA_CERT)"
            )))
        }
        None => {}
    }
    endpoint
        .connect_timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| ClientError::Connect {
            addr: addr.to_owned(),
            message: error_chain(&e),
        })
}

/// The transport error with its causes: TLS failures hide two levels down.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut cur = std::error::Error::source(e);
    while let Some(s) = cur {
        parts.push(s.to_string());
        cur = s.source();
    }
    if parts.is_empty() {
        e.to_string()
    } else {
        parts.join(": ")
    }
}

impl Client {
    pub async fn connect(addr: &str) -> Result<Self, ClientError> {
        Self::connect_with(addr, None).await
    }

    /// Connects with TLS when `tls` is given (required for `https://`).
    pub async fn connect_with(addr: &str, tls: Option<&ClientTls>) -> Result<Self, ClientError> {
        let channel = connect_channel(addr, tls, None).await?;
        Ok(Self {
            inner: ResourcesClient::new(channel)
                .max_decoding_message_size(cascade_proto::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(cascade_proto::MAX_MESSAGE_BYTES),
            bearer: None,
        })
    }

    /// The same client sending `token` (a static token or a JWT) as
    /// `authorization: Bearer …` on every call: how a caller authenticates
    /// to a node with `[auth] mode = "required"` (a client certificate, in
    /// the TLS settings, is the other way).
    pub fn with_token(mut self, token: &str) -> Result<Self, ClientError> {
        self.bearer = Some(bearer_value(token)?);
        Ok(self)
    }

    /// `message` with this client's credentials.
    fn authorized<M>(&self, message: M) -> tonic::Request<M> {
        let mut request = tonic::Request::new(message);
        if let Some(bearer) = &self.bearer {
            request.metadata_mut().insert("authorization", bearer.clone());
        }
        request
    }

    /// The generated client, for calls this wrapper does not cover.
    pub fn raw(&self) -> ResourcesClient<Channel> {
        self.inner.clone()
    }

    pub async fn create(&self, spec: v1::ResourceSpec) -> Result<v1::Resource, ClientError> {
        let req = v1::CreateRequest { resource: Some(spec) };
        Ok(self.inner.clone().create(self.authorized(req)).await?.into_inner())
    }

    pub async fn batch_create(&self, specs: Vec<v1::ResourceSpec>) -> Result<Vec<v1::Resource>, ClientError> {
        let req = v1::BatchCreateRequest { resources: specs };
        Ok(self
            .inner
            .clone()
            .batch_create(self.authorized(req))
            .await?
            .into_inner()
            .resources)
    }

    pub async fn get(&self, name: &str) -> Result<v1::Resource, ClientError> {
        self.get_with(name, false).await
    }

    /// A Get that also answers a soft-deleted resource when `show_deleted`.
    pub async fn get_with(&self, name: &str, show_deleted: bool) -> Result<v1::Resource, ClientError> {
        let req = v1::GetRequest {
            name: name.to_owned(),
            show_deleted,
        };
        Ok(self.inner.clone().get(self.authorized(req)).await?.into_inner())
    }

    pub async fn list(&self, req: v1::ListRequest) -> Result<v1::ListResponse, ClientError> {
        Ok(self.inner.clone().list(self.authorized(req)).await?.into_inner())
    }

    /// A List with a deadline the node keeps to (`grpc-timeout`): a listing
    /// of every region names the regions that did not answer within it.
    pub async fn list_within(
        &self,
        req: v1::ListRequest,
        deadline: std::time::Duration,
    ) -> Result<v1::ListResponse, ClientError> {
        let mut request = self.authorized(req);
        request.set_timeout(deadline);
        Ok(self.inner.clone().list(request).await?.into_inner())
    }

    /// One page of the references into (REFERRERS) or out of (TARGETS) a
    /// resource, answered by its owner.
    pub async fn list_references(
        &self,
        req: v1::ListReferencesRequest,
    ) -> Result<v1::ListReferencesResponse, ClientError> {
        Ok(self
            .inner
            .clone()
            .list_references(self.authorized(req))
            .await?
            .into_inner())
    }

    pub async fn update(&self, spec: v1::ResourceSpec, etag: &str) -> Result<v1::Resource, ClientError> {
        let req = v1::UpdateRequest {
            resource: Some(spec),
            etag: etag.to_owned(),
        };
        Ok(self.inner.clone().update(self.authorized(req)).await?.into_inner())
    }

    pub async fn delete(&self, req: v1::DeleteRequest) -> Result<v1::DeleteResponse, ClientError> {
        Ok(self.inner.clone().delete(self.authorized(req)).await?.into_inner())
    }

    /// Undelete: takes back a soft-deleting operation in every region.
    pub async fn undelete(&self, req: v1::UndeleteRequest) -> Result<v1::UndeleteResponse, ClientError> {
        Ok(self.inner.clone().undelete(self.authorized(req)).await?.into_inner())
    }

    /// PauseOperation: no region works on the operation until resumed.
    pub async fn pause_operation(&self, req: v1::PauseOperationRequest) -> Result<v1::Operation, ClientError> {
        Ok(self
            .inner
            .clone()
            .pause_operation(self.authorized(req))
            .await?
            .into_inner())
    }

    /// ResumeOperation.
    pub async fn resume_operation(&self, req: v1::ResumeOperationRequest) -> Result<v1::Operation, ClientError> {
        Ok(self
            .inner
            .clone()
            .resume_operation(self.authorized(req))
            .await?
            .into_inner())
    }

    /// CancelOperation: the operation enters no new member and ends CANCELLED.
    pub async fn cancel_operation(&self, req: v1::CancelOperationRequest) -> Result<v1::Operation, ClientError> {
        Ok(self
            .inner
            .clone()
            .cancel_operation(self.authorized(req))
            .await?
            .into_inner())
    }

    pub async fn add_lien(&self, req: v1::AddLienRequest) -> Result<v1::Resource, ClientError> {
        Ok(self.inner.clone().add_lien(self.authorized(req)).await?.into_inner())
    }

    pub async fn remove_lien(&self, req: v1::RemoveLienRequest) -> Result<v1::Resource, ClientError> {
        Ok(self.inner.clone().remove_lien(self.authorized(req)).await?.into_inner())
    }

    pub async fn remove_finalizer(&self, req: v1::RemoveFinalizerRequest) -> Result<v1::Resource, ClientError> {
        Ok(self
            .inner
            .clone()
            .remove_finalizer(self.authorized(req))
            .await?
            .into_inner())
    }

    pub async fn report_finalizer_failure(
        &self,
        req: v1::ReportFinalizerFailureRequest,
    ) -> Result<v1::Resource, ClientError> {
        Ok(self
            .inner
            .clone()
            .report_finalizer_failure(self.authorized(req))
            .await?
            .into_inner())
    }

    pub async fn explain_deletion(
        &self,
        req: v1::ExplainDeletionRequest,
    ) -> Result<v1::DeletionExplanation, ClientError> {
        Ok(self
            .inner
            .clone()
            .explain_deletion(self.authorized(req))
            .await?
            .into_inner())
    }

    /// A page of the operations the caller may read (`Resources.ListOperations`).
    pub async fn list_operations(
        &self,
        req: v1::ListOperationsRequest,
    ) -> Result<v1::ListOperationsResponse, ClientError> {
        Ok(self
            .inner
            .clone()
            .list_operations(self.authorized(req))
            .await?
            .into_inner())
    }

    pub async fn get_operation(&self, id: &str, outcomes: u32) -> Result<v1::Operation, ClientError> {
        let req = v1::GetOperationRequest {
            id: id.to_owned(),
            outcomes_page_size: outcomes,
            outcomes_page_token: String::new(),
        };
        Ok(self
            .inner
            .clone()
            .get_operation(self.authorized(req))
            .await?
            .into_inner())
    }

    pub async fn watch_operation(&self, id: &str) -> Result<Streaming<v1::Operation>, ClientError> {
        let req = v1::WatchOperationRequest { id: id.to_owned() };
        Ok(self
            .inner
            .clone()
            .watch_operation(self.authorized(req))
            .await?
            .into_inner())
    }

    pub async fn watch(&self, from_revision: u64, kind: &str) -> Result<Streaming<v1::WatchEvent>, ClientError> {
        let req = v1::WatchRequest {
            from_revision,
            kind: kind.to_owned(),
        };
        Ok(self.inner.clone().watch(self.authorized(req)).await?.into_inner())
    }
}

/// A typed client of `cascade.v1.Admin`: every call carries the admin
/// token when one is given (a client certificate, if the TLS settings
/// present one, identifies the caller too).
#[derive(Clone)]
pub struct AdminClient {
    inner: v1::admin_client::AdminClient<Channel>,
    token: Option<String>,
}

impl AdminClient {
    /// Connects with TLS when `tls` is given (required for `https://`).
    pub async fn connect_with(addr: &str, tls: Option<&ClientTls>, token: Option<String>) -> Result<Self, ClientError> {
        let channel = connect_channel(addr, tls, None).await?;
        Ok(Self {
            inner: v1::admin_client::AdminClient::new(channel)
                .max_decoding_message_size(cascade_proto::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(cascade_proto::MAX_MESSAGE_BYTES),
            token,
        })
    }

    fn request<M>(&self, message: M) -> Result<tonic::Request<M>, ClientError> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.token {
            request.metadata_mut().insert("authorization", bearer_value(token)?);
        }
        Ok(request)
    }

    pub async fn list_deletions(
        &self,
        req: v1::ListDeletionsRequest,
    ) -> Result<v1::ListDeletionsResponse, ClientError> {
        Ok(self
            .inner
            .clone()
            .list_deletions(self.request(req)?)
            .await?
            .into_inner())
    }

    pub async fn retry_deletion(&self, req: v1::RetryDeletionRequest) -> Result<v1::DeletionEntry, ClientError> {
        Ok(self
            .inner
            .clone()
            .retry_deletion(self.request(req)?)
            .await?
            .into_inner())
    }

    /// ExtendBudget: a bounded operation's new budget.
    pub async fn extend_budget(&self, req: v1::ExtendBudgetRequest) -> Result<v1::Operation, ClientError> {
        Ok(self.inner.clone().extend_budget(self.request(req)?).await?.into_inner())
    }

    pub async fn force_purge(&self, req: v1::ForcePurgeRequest) -> Result<v1::DeletionEntry, ClientError> {
        Ok(self.inner.clone().force_purge(self.request(req)?).await?.into_inner())
    }

    pub async fn list_audit(&self, req: v1::ListAuditRequest) -> Result<v1::ListAuditResponse, ClientError> {
        Ok(self.inner.clone().list_audit(self.request(req)?).await?.into_inner())
    }

    /// A schema file's text checked against the node's schema in force and
    /// stored data, changing nothing (`cascade schema diff --against`).
    pub async fn check_schema(&self, schema_text: String) -> Result<v1::CheckSchemaResponse, ClientError> {
        let req = v1::CheckSchemaRequest { schema_text };
        Ok(self.inner.clone().check_schema(self.request(req)?).await?.into_inner())
    }

    /// May the caller (or another principal) do a verb to a resource
    /// (`cascade auth can-i`)? The owner's live policy answers.
    pub async fn can_i(&self, req: v1::CanIRequest) -> Result<v1::CanIResponse, ClientError> {
        Ok(self.inner.clone().can_i(self.request(req)?).await?.into_inner())
    }

    /// Counts and samples what a filter matches, or with `force` deletes it
    /// as one operation (`cascade admin purge`).
    pub async fn purge(&self, req: v1::PurgeRequest) -> Result<v1::PurgeResponse, ClientError> {
        Ok(self.inner.clone().purge(self.request(req)?).await?.into_inner())
    }

    /// Every region as the node sees it (open to every client: no token needed).
    pub async fn cluster_status(&self) -> Result<v1::ClusterStatus, ClientError> {
        Ok(self
            .inner
            .clone()
            .get_cluster_status(self.request(v1::GetClusterStatusRequest {})?)
            .await?
            .into_inner())
    }
}
