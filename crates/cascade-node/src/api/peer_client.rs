//! The calls this node makes on other regions' `cascade.v1.Peer` service,
//! typed: core values in, core values out.
//!
//! They are an inherent impl of the port's type, [`Peers`] (`crate::peers`,
//! the one way the domain reaches another region), kept here at the wire
//! edge because they speak protobuf: the domain calls them and sees only
//! core types and the port's own ([`LookupAnswer`], [`ExplainPart`],
//! [`RegionFigures`], [`WatchedEvent`], [`WatchEnd`], [`RemoteError`]).
//!
//! Every call goes through [`Peers::call`], which owns the deadline and the
//! classification of what came back (see [`crate::api::forward`]). A call
//! made for a client's request is bounded by what is left of that client's
//! deadline, and at most [`PEER_CALL_TIMEOUT`] ([`Deadline`]: Attach,
//! KeepsAnotherTarget here; the domain does the same for its Lookups); one
//! made by a background task (a link's Watch, ListDeleting, Ack and
//! CheckBackrefs, the outbox's Release, the reconciler's Attach) has no
//! caller and [`PEER_CALL_TIMEOUT`] alone. What came back is: an
//! answer, the owner's own error status, an owner that could not be asked,
//! or an answer that could not be decoded. The methods below then read the
//! answer in the protocol's terms (a Lookup's NOT_FOUND whose details say
//! DELETING is a target being deleted; an Attach refused for a missing
//! target is `TargetNotFound`, …), so the flows in `cluster.rs` and the
//! links never see a wire type.

use std::future::Future;
use std::time::Duration;

use cascade_core::closure::PartAnswer;
use cascade_core::model::RemoteEvent;
use cascade_core::operation_view::OperationPage;
use cascade_core::peer::{PeerBackRef, RemoteDeleting};
use cascade_core::protocol::Plan;
use cascade_core::{CoreError, OperationId, RefTarget, RegionId, ResourceName, Uid};
use cascade_proto::status::reason_of;
use cascade_proto::v1::admin_client::AdminClient;
use cascade_proto::v1::peer_client::PeerClient;
use cascade_proto::v1::resources_client::ResourcesClient;
use cascade_proto::v1::{self, ErrorReason};
use cascade_proto::{convert, error_details};
use futures::{Stream, StreamExt};
use tonic::service::interceptor::InterceptedService;
use tonic::{Code, Response, Status};

use crate::api::forward::{call_owner, relayed_status};
use crate::api::trace_propagation::InjectTraceContext;
use crate::peers::{
    AnnouncingChannel, Deadline, ExplainPart, LookupAnswer, Peers, RegionFigures, RegionNode, RelayedCode, RemoteError,
    WatchEnd, Watched, WatchedEvent, MAX_REGION_NODES, PEER_CALL_TIMEOUT,
};

/// Entries asked for per `Peer.ListDeleting` page (the owner's default
/// `max_page_size`; its byte budget may end a page earlier).
pub(crate) const LIST_DELETING_PAGE: u32 = 1_000;

/// The most entries one resync reads from an owner's `Peer.ListDeleting`
/// listing, its pages together: as many as the rows of one table that a
/// region's `Peer.Dump` reads ([`crate::node::MAX_DUMP_ROWS`]). Every page
/// but the last must hold an entry ([`read_deleting_pages`]), so this
/// bounds the pages as well (one more at most), whatever page size the
/// owner answers with: an owner whose token keeps advancing cannot keep a
/// resync reading, and its memory growing, for ever.
pub(crate) const MAX_LIST_DELETING_ROWS: usize = crate::node::MAX_DUMP_ROWS;

/// A channel to a peer whose calls carry the caller's trace context (and,
/// as every call through the port, this node's protocol version).
pub(crate) type PeerChannel = InterceptedService<AnnouncingChannel, InjectTraceContext>;

fn ended(s: &Status) -> WatchEnd {
    if s.code() == Code::OutOfRange {
        WatchEnd::Compacted
    } else {
        WatchEnd::Failed(format!("{:?}: {}", s.code(), s.message()))
    }
}

/// An answer that could not be read as the protocol needs it.
fn bad_answer(region: &str, rpc: &'static str, status: Status) -> RemoteError {
    RemoteError::BadAnswer {
        region: region.to_owned(),
        rpc,
        message: status.message().to_owned(),
    }
}

/// An owner's refusal of an attach, in the client's terms: a missing,
/// DELETING or re-created target is the core error a local one gives (its
/// field completed by `cascade_core::request_path`), as is `SchemaUnknown`;
/// else `AttachRefused`, or unavailable (the reconciler retries).
fn attach_refusal(region: &str, sent: &[PeerBackRef], s: &Status) -> CoreError {
    let details = error_details(s).unwrap_or_default();
    let reason = ErrorReason::try_from(details.reason).unwrap_or(ErrorReason::Unspecified);
    let target = details
        .resource
        .as_ref()
        .and_then(|r| ResourceName::parse(&r.name).ok());
    let field = details.field.clone();
    let lacks = (reason == ErrorReason::SchemaUnknown).then(|| CoreError::schema_unknown_from(region, s.message()));
    match (s.code(), reason, target, lacks.flatten()) {
        (.., Some(schema_unknown)) => schema_unknown,
        (Code::FailedPrecondition, ErrorReason::Deleting, Some(target), _) => {
            CoreError::TargetDeleting { field, target }
        }
        (Code::NotFound, ErrorReason::NotFound, Some(target), _) => CoreError::TargetNotFound { field, target },
        (Code::FailedPrecondition, ErrorReason::UidMismatch, Some(target), _) => {
            let expected = sent
                .iter()
                .find(|e| e.target.name == target && field == format!("refs.{}", e.field))
                .map(|e| e.target.uid.to_string())
                .unwrap_or_default();
            let actual = details.resource.map(|r| r.uid).unwrap_or_default();
            CoreError::TargetUidMismatch {
                field,
                target,
                expected,
                actual,
            }
        }
        (Code::NotFound | Code::FailedPrecondition | Code::InvalidArgument, ..) => CoreError::AttachRefused {
            region: region.to_owned(),
            reason: s.message().to_owned(),
        },
        _ => CoreError::RegionUnavailable {
            region: region.to_owned(),
            reason: format!("Attach: {:?}: {}", s.code(), s.message()),
        },
    }
}

/// Whatever the owner answered, the caller cannot go on without its
/// answer: the region counts as unavailable for this call.
fn unavailable_unless_answered(region: &str, rpc: &'static str, e: RemoteError) -> RemoteError {
    match e {
        RemoteError::Answered(s) => RemoteError::Unreachable(CoreError::RegionUnavailable {
            region: region.to_owned(),
            reason: format!("{rpc}: {:?}: {}", s.code, s.message),
        }),
        other => other,
    }
}

impl Peers {
    /// A client of `region`'s Peer service, with the node's message limits.
    pub(crate) fn peer(&self, region: &str) -> Result<PeerClient<PeerChannel>, CoreError> {
        Ok(PeerClient::with_interceptor(self.channel(region)?, InjectTraceContext)
            .max_decoding_message_size(self.max_message_bytes)
            .max_encoding_message_size(self.max_message_bytes))
    }

    /// A client of `region`'s Admin service (forwarding an administrator's call).
    pub(crate) fn admin(&self, region: &str) -> Result<AdminClient<PeerChannel>, CoreError> {
        Ok(AdminClient::with_interceptor(self.channel(region)?, InjectTraceContext)
            .max_decoding_message_size(self.max_message_bytes)
            .max_encoding_message_size(self.max_message_bytes))
    }

    /// A client of `region`'s Resources service (forwarding a client's call).
    pub(crate) fn resources(&self, region: &str) -> Result<ResourcesClient<PeerChannel>, CoreError> {
        Ok(
            ResourcesClient::with_interceptor(self.channel(region)?, InjectTraceContext)
                .max_decoding_message_size(self.max_message_bytes)
                .max_encoding_message_size(self.max_message_bytes),
        )
    }

    /// Calls `rpc` on `region`'s Peer service within `deadline`, and
    /// classifies the outcome (see [`crate::api::forward`]).
    pub(crate) async fn call<T, F, Fut>(
        &self,
        region: &str,
        rpc: &'static str,
        deadline: Duration,
        call: F,
    ) -> Result<T, RemoteError>
    where
        F: FnOnce(PeerClient<PeerChannel>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let client = self.peer(region).map_err(RemoteError::Unreachable)?;
        call_owner(region, rpc, deadline, call(client)).await
    }

    /// `region`'s own figures, for the cluster status (see `status.rs`).
    pub(crate) async fn region_figures(&self, region: &str, deadline: Duration) -> Result<RegionFigures, RemoteError> {
        let answer = self
            .call(region, "RegionFigures", deadline, |mut c| async move {
                c.region_figures(v1::RegionFiguresRequest {}).await
            })
            .await?;
        Ok(region_figures_from(answer))
    }

    /// `region`'s part of an operation's explanation (see `explain.rs`),
    /// within `deadline` (which the call carries as its `grpc-timeout`).
    pub(crate) async fn explain_part(
        &self,
        region: &str,
        op: OperationId,
        deadline: Duration,
    ) -> Result<ExplainPart, RemoteError> {
        let mut req = tonic::Request::new(v1::ExplainPartRequest {
            operation_id: op.to_string(),
        });
        req.set_timeout(deadline);
        let answer = self
            .call(region, "ExplainPart", deadline, |mut c| async move {
                c.explain_part(req).await
            })
            .await?;
        let mut parts = Vec::with_capacity(answer.deletions.len());
        for (i, r) in answer.deletions.iter().enumerate() {
            let (resource, record, _) = convert::resource_from(r, &format!("deletions[{i}]"))
                .map_err(|s| bad_answer(region, "ExplainPart", s))?;
            let Some(record) = record else {
                return Err(bad_answer(
                    region,
                    "ExplainPart",
                    Status::internal(format!("{} came without its deletion record", resource.name)),
                ));
            };
            parts.push(cascade_core::explain::Part { resource, record });
        }
        let root = match answer.root {
            Some(r) => Some(convert::ref_target(Some(r), "root").map_err(|s| bad_answer(region, "ExplainPart", s))?),
            None => None,
        };
        Ok(ExplainPart {
            root,
            parts,
            truncated: answer.truncated,
        })
    }

    /// Asks a resource's owner whether it lives, and as which incarnation.
    pub(crate) async fn lookup(&self, name: &ResourceName, deadline: Duration) -> Result<LookupAnswer, RemoteError> {
        let region = name.region();
        let req = v1::LookupRequest { name: name.to_string() };
        match self
            .call(region, "Lookup", deadline, |mut c| async move { c.lookup(req).await })
            .await
        {
            Ok(found) => match Uid::parse(&found.uid) {
                Ok(uid) => Ok(LookupAnswer::Live(uid)),
                Err(e) => Err(bad_answer(
                    region,
                    "Lookup",
                    Status::internal(format!("an invalid uid for {name}: {e}")),
                )),
            },
            // Seed 000: to a peer, a DELETING resource is NOT_FOUND; the
            // reason in the details tells it from an absent one.
            Err(RemoteError::Answered(s)) if s.code == RelayedCode::NotFound => {
                Ok(if reason_of(&relayed_status(&s)) == ErrorReason::Deleting {
                    LookupAnswer::Deleting
                } else {
                    LookupAnswer::Absent
                })
            }
            Err(RemoteError::Answered(s)) if s.code == RelayedCode::Unavailable => {
                Err(RemoteError::Unreachable(CoreError::RegionUnavailable {
                    region: region.to_owned(),
                    reason: format!("Lookup: {}", s.message),
                }))
            }
            Err(e) => Err(e),
        }
    }

    /// Attaches back-references at their owner `region`, as `from`, within
    /// what is left of `deadline` (the client's whose create or update this
    /// is; [`Deadline::NONE`] for the reconciler) and at most
    /// [`PEER_CALL_TIMEOUT`]. A refusal comes back in the protocol's terms
    /// (see [`attach_refusal`]); an owner that does not answer before the
    /// client's deadline is `CoreError::DeadlineExceeded`, and one that
    /// leaves no time is not asked.
    pub(crate) async fn attach(
        &self,
        region: &str,
        from: &RegionId,
        chunk: &[PeerBackRef],
        deadline: &Deadline,
    ) -> Result<(), CoreError> {
        let within = deadline.for_call(region, "Attach")?;
        let req = v1::AttachRequest {
            from_region: from.to_string(),
            backrefs: chunk.iter().map(convert::peer_backref).collect(),
        };
        let attached = match self
            .call(region, "Attach", within, |mut c| async move { c.attach(req).await })
            .await
        {
            Ok(_) => Ok(()),
            Err(RemoteError::Answered(s)) => Err(attach_refusal(region, chunk, &relayed_status(&s))),
            Err(RemoteError::Unreachable(e)) => Err(e),
            // Attach is idempotent: an answer that could not be read is
            // settled by asking again (the reconciler).
            Err(bad @ RemoteError::BadAnswer { .. }) => Err(CoreError::RegionUnavailable {
                region: region.to_owned(),
                reason: bad.to_string(),
            }),
        };
        attached.map_err(|e| deadline.blame(region, "Attach", e))
    }

    /// `region`'s part of a dry run from `seeds`; None when it cannot be
    /// asked or does not answer with a plan (reported as unreachable).
    pub(crate) async fn plan(
        &self,
        region: &str,
        seeds: &[RefTarget],
        cascade: bool,
        principal: &cascade_core::auth::Principal,
        deadline: Duration,
    ) -> Option<Plan> {
        let req = v1::PeerPlanRequest {
            seeds: seeds.iter().map(convert::object_ref).collect(),
            cascade,
            principal: Some(crate::api::principal::to_wire(principal)),
        };
        let answer = self
            .call(region, "Plan", deadline, |mut c| async move { c.plan(req).await })
            .await
            .ok()?;
        convert::plan_from(answer).ok()
    }

    /// `region`'s part of operation `id` with up to `want` outcomes after
    /// `after`; None when it has no part.
    pub(crate) async fn operation_part(
        &self,
        region: &str,
        id: OperationId,
        want: usize,
        after: Option<&ResourceName>,
        deadline: Duration,
    ) -> Result<Option<OperationPage>, RemoteError> {
        match self.raw_operation_part(region, id, want, after, deadline).await? {
            Some(part) => convert::operation_page_from(part)
                .map(Some)
                .map_err(|s| bad_answer(region, "OperationPart", s)),
            None => Ok(None),
        }
    }

    /// What the closure check needs of `region`'s part of operation `id`
    /// (its counters and the regions it reached), within `deadline`.
    pub(crate) async fn closure_part(&self, region: &str, id: OperationId, deadline: Duration) -> PartAnswer {
        match self.raw_operation_part(region, id, 0, None, deadline).await {
            Ok(Some(part)) => PartAnswer::Part(convert::part_summary_from(&part)),
            Ok(None) => PartAnswer::NoPart,
            Err(e) => PartAnswer::Unreachable(e.to_string()),
        }
    }

    /// `Peer.OperationPart` as it came: None when `region` has no part.
    async fn raw_operation_part(
        &self,
        region: &str,
        id: OperationId,
        want: usize,
        after: Option<&ResourceName>,
        deadline: Duration,
    ) -> Result<Option<v1::Operation>, RemoteError> {
        let req = v1::GetOperationRequest {
            id: id.to_string(),
            outcomes_page_size: u32::try_from(want).unwrap_or(u32::MAX),
            outcomes_page_token: after.map(ResourceName::to_string).unwrap_or_default(),
        };
        match self
            .call(region, "OperationPart", deadline, |mut c| async move {
                c.operation_part(req).await
            })
            .await
        {
            Ok(part) => Ok(Some(part)),
            Err(RemoteError::Answered(s)) if s.code == RelayedCode::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Asks `region` a yes/no question about each of `rows` (one call of
    /// the CheckBackrefs shape) within `within`, answered in the same order.
    async fn ask_about_rows<F, Fut>(
        &self,
        region: &str,
        rpc: &'static str,
        from: &RegionId,
        rows: &[PeerBackRef],
        within: Duration,
        call: F,
    ) -> Result<Vec<bool>, RemoteError>
    where
        F: FnOnce(PeerClient<PeerChannel>, v1::CheckBackrefsRequest) -> Fut,
        Fut: Future<Output = Result<Response<v1::CheckBackrefsResponse>, Status>>,
    {
        let req = v1::CheckBackrefsRequest {
            from_region: from.to_string(),
            backrefs: rows.iter().map(convert::peer_backref).collect(),
        };
        self.call(region, rpc, within, |c| call(c, req))
            .await
            .map(|r| r.standing)
    }

    /// Asks `region` which of its list owners named by `rows` keep another
    /// live target (before a delete without cascade), within what is left
    /// of the client's `deadline` and at most [`PEER_CALL_TIMEOUT`]. Any
    /// answer but the list is unavailable (the delete cannot be decided
    /// without it), or the caller's deadline once that passed.
    pub(crate) async fn keeps_another_target(
        &self,
        region: &str,
        from: &RegionId,
        rows: &[PeerBackRef],
        deadline: &Deadline,
    ) -> Result<Vec<bool>, RemoteError> {
        let rpc = "KeepsAnotherTarget";
        let within = deadline.for_call(region, rpc).map_err(RemoteError::Unreachable)?;
        self.ask_about_rows(region, rpc, from, rows, within, |mut c, req| async move {
            c.keeps_another_target(req).await
        })
        .await
        .map_err(|e| deadline.blame_remote(region, rpc, e))
        .map_err(|e| unavailable_unless_answered(region, rpc, e))
    }

    /// Importer side of seed 002's periodic check, asked by the owner: which
    /// of `rows` still stand at `region`. A link's background task: no
    /// caller's deadline, [`PEER_CALL_TIMEOUT`].
    pub(crate) async fn check_backrefs(
        &self,
        region: &str,
        from: &RegionId,
        rows: &[PeerBackRef],
    ) -> Result<Vec<bool>, RemoteError> {
        self.ask_about_rows(
            region,
            "CheckBackrefs",
            from,
            rows,
            PEER_CALL_TIMEOUT,
            |mut c, req| async move { c.check_backrefs(req).await },
        )
        .await
    }

    /// Sends released back-references to their owner `region`. The outbox
    /// of releases sends them in the background, for no caller: the fixed
    /// [`PEER_CALL_TIMEOUT`] is its bound.
    pub(crate) async fn release(&self, region: &str, from: &RegionId, rows: &[PeerBackRef]) -> Result<(), RemoteError> {
        let req = v1::ReleaseRequest {
            from_region: from.to_string(),
            backrefs: rows.iter().map(convert::peer_backref).collect(),
        };
        self.call(region, "Release", PEER_CALL_TIMEOUT, |mut c| async move {
            c.release(req).await
        })
        .await
        .map(|_| ())
    }

    /// Tells `region` how far `from` applied its outbox (a link's
    /// background task: no caller, [`PEER_CALL_TIMEOUT`]).
    pub(crate) async fn ack(&self, region: &str, from: &RegionId, revision: u64) -> Result<(), RemoteError> {
        let req = v1::AckRequest {
            region: from.to_string(),
            revision,
        };
        self.call(
            region,
            "Ack",
            PEER_CALL_TIMEOUT,
            |mut c| async move { c.ack(req).await },
        )
        .await
        .map(|_| ())
    }

    /// The DELETING resources of `region` that `from` references, and the
    /// revision to resume watching after (the resync after compaction),
    /// read page by page (each answer bounded in bytes by the owner; see
    /// [`read_deleting_pages`] for what makes a listing unusable);
    /// the revision is the first page's, taken before any was read, so an
    /// entry that changes between pages comes again as an event. Entries
    /// that do not decode are skipped. A link's resync, for no caller:
    /// each page within [`PEER_CALL_TIMEOUT`].
    pub(crate) async fn list_deleting(
        &self,
        region: &str,
        from: &RegionId,
    ) -> Result<(Vec<RemoteDeleting>, u64), RemoteError> {
        // A node made to speak version 1 reads no `forced`, as such a node did not.
        let reads_forced = self.own_version >= cascade_proto::DELETION_FORCED_SINCE;
        read_deleting_pages(region, MAX_LIST_DELETING_ROWS, reads_forced, |page_token| {
            let req = v1::ListDeletingRequest {
                region: from.to_string(),
                page_size: LIST_DELETING_PAGE,
                page_token,
            };
            self.call(region, "ListDeleting", PEER_CALL_TIMEOUT, |mut c| async move {
                c.list_deleting(req).await
            })
        })
        .await
    }

    /// Follows `region`'s outbox from revision `from_revision`, as `watcher`:
    /// its DELETING and PURGED events (an event that does not decode is
    /// skipped), until the stream ends. A link's, for no caller: the stream
    /// opens within [`PEER_CALL_TIMEOUT`] and then lasts as long as the
    /// link (its silence timeout ends it).
    pub(crate) async fn watch(
        &self,
        region: &str,
        watcher: &RegionId,
        from_revision: u64,
    ) -> Result<impl Stream<Item = Result<Option<Watched>, WatchEnd>> + Send + Unpin + 'static, WatchEnd> {
        let req = v1::PeerWatchRequest {
            region: watcher.to_string(),
            from_revision,
        };
        let mut client = self.peer(region).map_err(|e| WatchEnd::Failed(e.to_string()))?;
        let stream = match tokio::time::timeout(PEER_CALL_TIMEOUT, client.watch(req)).await {
            Ok(Ok(s)) => s.into_inner(),
            Ok(Err(s)) => return Err(ended(&s)),
            Err(_) => return Err(WatchEnd::Failed("watch call timed out".into())),
        };
        Ok(stream.map(|item| match item {
            Ok(e) => Ok(remote_event(e)),
            Err(s) => Err(ended(&s)),
        }))
    }
}

/// Reads an owner's `Peer.ListDeleting` listing to its end: `fetch` asks
/// for the page after a token (empty: the first page). The DELETING
/// entries (those that decode) and the first page's revision.
///
/// The owner's token is the uid of the last entry its page holds
/// (`api/peer.rs`), and it pages in uid order, so a next token must be a
/// uid above the one before: a token that does not advance would end the
/// resync silently incomplete (a DELETING resource missed for good) if
/// taken as the end, and one that goes back (A, B, A) would read for
/// ever. Such a listing, a page without entries that is not the last, and
/// one of more than `max_rows` entries are [`RemoteError::BadAnswer`]:
/// the resync fails, and the link tries again when it reconnects, as
/// after any failed call (`links.rs`).
async fn read_deleting_pages<F, Fut>(
    region: &str,
    max_rows: usize,
    reads_forced: bool,
    mut fetch: F,
) -> Result<(Vec<RemoteDeleting>, u64), RemoteError>
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Result<v1::ListDeletingResponse, RemoteError>>,
{
    let bad = |message: String| RemoteError::BadAnswer {
        region: region.to_owned(),
        rpc: "ListDeleting",
        message,
    };
    let mut deleting = Vec::new();
    let mut revision = None;
    let mut rows = 0usize;
    let mut page_token = String::new();
    let mut after: Option<Uid> = None;
    let mut page = 0usize;
    loop {
        page += 1;
        let listing = fetch(std::mem::take(&mut page_token)).await?;
        let revision = *revision.get_or_insert(listing.revision);
        let entries = listing.deleting.len();
        rows = rows.saturating_add(entries);
        if rows > max_rows {
            return Err(bad(format!(
                "the listing holds more than {max_rows} entries (page {page}): not read further"
            )));
        }
        deleting.extend(listing.deleting.into_iter().filter_map(|d| {
            Some(RemoteDeleting {
                target: convert::ref_target(d.resource, "resource").ok()?,
                operation: OperationId::parse(&d.operation_id).ok()?,
                no_cascade: d.no_cascade,
                forced: d.forced && reads_forced,
                // As from a DELETING event: absent or unreadable, the
                // anonymous principal, whom a policy may refuse.
                principal: d
                    .principal
                    .and_then(crate::api::principal::from_wire)
                    .unwrap_or_else(cascade_core::auth::Principal::anonymous),
                retain_ms: d.retain_ms,
            })
        }));
        if listing.next_page_token.is_empty() {
            return Ok((deleting, revision));
        }
        if entries == 0 {
            return Err(bad(format!("page {page} holds no entry, yet names a next page")));
        }
        let next = Uid::parse(&listing.next_page_token).map_err(|_| {
            bad(format!(
                "page {page}'s next_page_token {} is not a uid",
                cascade_core::limits::quote(&listing.next_page_token)
            ))
        })?;
        if let Some(previous) = after.filter(|previous| next <= *previous) {
            return Err(bad(format!(
                "page {page}'s next_page_token {next} does not advance past the previous one, {previous}"
            )));
        }
        after = Some(next);
        page_token = listing.next_page_token;
    }
}

/// An item of a peer's watch stream; None for an event that does not decode.
fn remote_event(e: v1::PeerEvent) -> Option<Watched> {
    if e.heartbeat {
        // The link is alive; with a revision, the peer passed through it.
        return Some(Watched::Beat {
            passed_through: e.revision,
        });
    }
    let resource = convert::ref_target(e.resource, "resource").ok()?;
    Some(Watched::Event(WatchedEvent {
        event: RemoteEvent {
            revision: e.revision,
            event_type: convert::event_type_from(e.r#type)?,
            resource,
            operation: OperationId::parse(&e.operation_id).ok(),
            no_cascade: e.no_cascade,
            // An unreadable principal acts as the anonymous one, whom a
            // policy may refuse (the member is then held, not changed).
            principal: e
                .principal
                .and_then(crate::api::principal::from_wire)
                .unwrap_or_else(cascade_core::auth::Principal::anonymous),
            // The importer bounds it by this region's own maximum.
            retain_ms: e.retain_ms,
        },
        traceparent: Some(e.traceparent).filter(|t| !t.is_empty()),
    }))
}

/// A peer's figures from the wire.
fn region_figures_from(f: v1::RegionFigures) -> RegionFigures {
    RegionFigures {
        resources_creating: f.resources_creating,
        resources_active: f.resources_active,
        resources_deleting: f.resources_deleting,
        deletions_pending: f.deletions_pending,
        deletions_blocked: f.deletions_blocked,
        deletions_waiting: f.deletions_waiting,
        deletions_failed: f.deletions_failed,
        oldest_deletion_age_ms: f.oldest_deletion_age_ms,
        last_revision: f.last_revision,
        truncated: f.truncated,
        protocol_version: f.protocol_version,
        binary_version: f.binary_version,
        nodes: f
            .nodes
            .into_iter()
            .take(MAX_REGION_NODES)
            .map(|n| RegionNode {
                writer: n.role == "writer",
                node: n.node,
                address: n.address,
                binary_version: n.binary_version,
                last_seen_ms: n.last_seen_ms,
            })
            .collect(),
        writer_epoch: f.writer_epoch,
        authentication: cascade_core::limits::cut_stored(&f.authentication, 64),
        schema_version: cascade_core::limits::cut_stored(&f.schema_version, 64),
        schema_label: cascade_core::limits::cut_stored(&f.schema_label, cascade_core::schema::MAX_LABEL_BYTES),
    }
}

#[cfg(test)]
mod tests;
