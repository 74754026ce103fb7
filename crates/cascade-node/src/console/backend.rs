//! The console's calls on its node's API, as the browser's caller (the
//! caller's token, nothing else), each within `CALL_BUDGET`, and what a
//! page needs of their answers.

use std::collections::BTreeMap;
use std::time::Duration;

use cascade_client::ClientTls;
use cascade_proto::v1;
use cascade_proto::v1::admin_client::AdminClient;
use cascade_proto::v1::resources_client::ResourcesClient;
use tokio::sync::OnceCell;
use tonic::transport::Channel;

use super::error::{ConsoleError, Refusal};
use super::session::Caller;

pub(super) mod cluster;

/// How long one call may take. A node that gathers from other regions
/// (an operation, an explanation, a listing) keeps within the caller's
/// deadline and names the regions that did not answer in time, so a page
/// answers within about this long even while a region is unreachable.
pub(crate) const CALL_BUDGET: Duration = Duration::from_millis(900);

/// A resource page reads in two rounds, one after the other (the
/// resource, then its references both ways at once): each round has half
/// the page's budget, so a frozen owner costs the page `CALL_BUDGET`.
const RESOURCE_ROUND: Duration = Duration::from_millis(450);

/// The operations page's `ListOperations` calls: three quarters of the
/// page's budget, so a frozen region, which the node gives up at this
/// deadline, leaves the page time to answer within `CALL_BUDGET`.
const LIST_SHARE: Duration = Duration::from_millis(675);

/// Outcomes per page of an operation.
pub(crate) const OUTCOMES_PAGE: u32 = 50;

/// References per page, each way.
pub(crate) const REFERENCES_PAGE: u32 = 50;

/// Events per page of a resource's history.
pub(crate) const HISTORY_PAGE: u32 = 20;

/// Deletions read per region for the operations page.
pub(crate) const DELETIONS_PER_REGION: u32 = 500;

/// Operations the operations page asks for, per region and per list
/// (running; started within `RECENT`).
pub(crate) const OPERATIONS_SHOWN: usize = 20;

/// How far back the operations page lists finished operations too.
pub(crate) const RECENT: Duration = Duration::from_secs(3600);

/// The `requested_by` of the console's deletes (the operation shows it
/// beside the principal, who is the caller).
const REQUESTED_BY: &str = "cascade console";

/// This node's API, reached as a client: one channel, opened at the first
/// page (tonic redials it when it breaks).
pub(super) struct Backend {
    endpoint: String,
    tls: Option<ClientTls>,
    channel: OnceCell<Channel>,
}

impl Backend {
    pub(super) fn new(endpoint: String, tls: Option<ClientTls>) -> Self {
        Self {
            endpoint,
            tls,
            channel: OnceCell::new(),
        }
    }

    async fn channel(&self) -> Result<Channel, ConsoleError> {
        let channel = self
            .channel
            .get_or_try_init(|| cascade_client::client::connect_channel(&self.endpoint, self.tls.as_ref(), None))
            .await?;
        Ok(channel.clone())
    }

    async fn resources(&self) -> Result<ResourcesClient<Channel>, ConsoleError> {
        Ok(ResourcesClient::new(self.channel().await?)
            .max_decoding_message_size(cascade_proto::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(cascade_proto::MAX_MESSAGE_BYTES))
    }

    async fn admin(&self) -> Result<AdminClient<Channel>, ConsoleError> {
        Ok(AdminClient::new(self.channel().await?)
            .max_decoding_message_size(cascade_proto::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(cascade_proto::MAX_MESSAGE_BYTES))
    }

    /// An operation with a page of `outcomes` of its outcomes
    /// (`GetOperation`; a live page asks for one, the least there is).
    pub(super) async fn operation(
        &self,
        caller: &Caller,
        id: &str,
        outcomes: u32,
        outcomes_page_token: &str,
    ) -> Result<v1::Operation, ConsoleError> {
        let request = v1::GetOperationRequest {
            id: id.to_owned(),
            outcomes_page_size: outcomes,
            outcomes_page_token: outcomes_page_token.to_owned(),
        };
        Ok(self
            .resources()
            .await?
            .get_operation(as_caller(caller, request)?)
            .await?
            .into_inner())
    }

    /// Every DELETING member of an operation with why it waits
    /// (`ExplainDeletion`, the tree `cascade explain` draws).
    pub(super) async fn explain(&self, caller: &Caller, id: &str) -> Result<v1::DeletionExplanation, ConsoleError> {
        let request = v1::ExplainDeletionRequest {
            name: String::new(),
            operation_id: id.to_owned(),
        };
        Ok(self
            .resources()
            .await?
            .explain_deletion(as_caller(caller, request)?)
            .await?
            .into_inner())
    }

    pub(super) async fn resource(&self, caller: &Caller, name: &str) -> Result<v1::Resource, ConsoleError> {
        let request = v1::GetRequest {
            name: name.to_owned(),
            ..Default::default()
        };
        Ok(self
            .resources()
            .await?
            .get(as_caller_within(caller, request, RESOURCE_ROUND)?)
            .await?
            .into_inner())
    }

    /// The dry run of a cascade from `name` as the caller
    /// (`Delete{dry_run, cascade}`): the plan of every region, its token,
    /// and the members the caller may not change. The API authorizes it
    /// with the verb of the delete itself (`cascade` on the root), so a
    /// caller who may not start that cascade is refused here already.
    pub(super) async fn dry_run(&self, caller: &Caller, name: &str) -> Result<v1::DeleteResponse, ConsoleError> {
        let request = v1::DeleteRequest {
            name: name.to_owned(),
            cascade: true,
            dry_run: true,
            requested_by: REQUESTED_BY.to_owned(),
            ..Default::default()
        };
        Ok(self
            .resources()
            .await?
            .delete(as_caller(caller, request)?)
            .await?
            .into_inner())
    }

    /// The cascade from `name` bound to a dry run's `plan` token
    /// (`Delete{cascade, expect_plan}`), as the caller: the node walks the
    /// closure again and starts the delete only if it is still that plan.
    /// A refusal keeps its status's details (the members that changed, or
    /// those the caller may not change).
    pub(super) async fn delete_bound(
        &self,
        caller: &Caller,
        name: &str,
        plan: &str,
    ) -> Result<v1::DeleteResponse, Refusal> {
        let request = v1::DeleteRequest {
            name: name.to_owned(),
            cascade: true,
            expect_plan: plan.to_owned(),
            requested_by: REQUESTED_BY.to_owned(),
            ..Default::default()
        };
        let mut client = self.resources().await?;
        Ok(client.delete(as_caller(caller, request)?).await?.into_inner())
    }

    /// One page of the references into (referrers) or out of a resource.
    pub(super) async fn references(
        &self,
        caller: &Caller,
        name: &str,
        direction: v1::ReferenceDirection,
        page_token: &str,
    ) -> Result<v1::ListReferencesResponse, ConsoleError> {
        let request = v1::ListReferencesRequest {
            name: name.to_owned(),
            direction: direction as i32,
            page_size: REFERENCES_PAGE,
            page_token: page_token.to_owned(),
        };
        Ok(self
            .resources()
            .await?
            .list_references(as_caller_within(caller, request, RESOURCE_ROUND)?)
            .await?
            .into_inner())
    }

    /// One page of a resource's history, newest first (`GetHistory`,
    /// answered by its owner): read beside `Get`, so a resource that is
    /// gone still shows what its region keeps of it.
    pub(super) async fn history(
        &self,
        caller: &Caller,
        name: &str,
        page_token: &str,
    ) -> Result<v1::GetHistoryResponse, ConsoleError> {
        let request = v1::GetHistoryRequest {
            name: name.to_owned(),
            page_size: HISTORY_PAGE,
            page_token: page_token.to_owned(),
        };
        Ok(self
            .resources()
            .await?
            .get_history(as_caller_within(caller, request, RESOURCE_ROUND)?)
            .await?
            .into_inner())
    }

    /// The operations page: the operations the caller may read that are
    /// running or started within `RECENT`, from `ListOperations` (the
    /// node decides per operation as for `GetOperation`; every caller),
    /// and, where the caller may read them (an administrator), each
    /// region's deletion table from `Admin.ListDeletions` for what is in
    /// flight and stuck. All at once, within one page's budget.
    pub(super) async fn running_operations(&self, caller: &Caller) -> Result<RunningOperations, ConsoleError> {
        let (running, recent, tables) = futures::join!(
            self.list_operations(caller, v1::OperationState::Running, 0),
            self.list_operations(caller, v1::OperationState::Unspecified, RECENT.as_secs() as u32),
            self.deletion_tables(caller),
        );
        let mut page = RunningOperations::default();
        for list in [running?, recent?] {
            for u in list.unreachable {
                if !page.unanswered.iter().any(|(r, _)| *r == u.region) {
                    page.unanswered.push((u.region, u.reason));
                }
            }
            if !list.next_page_token.is_empty() {
                page.more = true;
            }
            for op in list.operations {
                let entry = page.by_operation.entry(op.id.clone()).or_default();
                entry.shown = true;
                entry.operation = Some(op);
            }
        }
        match tables {
            Ok(tables) => page.merge_tables(tables),
            // Not an administrator: the tables are not theirs to read,
            // and the page shows what ListOperations gave.
            Err(ConsoleError::Forbidden(_) | ConsoleError::Unauthenticated(_)) => {}
            Err(e) => page.tables_problem = Some(e.to_string()),
        }
        Ok(page)
    }

    /// One page of `ListOperations` of every region, as the caller.
    async fn list_operations(
        &self,
        caller: &Caller,
        state: v1::OperationState,
        started_within_seconds: u32,
    ) -> Result<v1::ListOperationsResponse, ConsoleError> {
        let request = v1::ListOperationsRequest {
            page_size: OPERATIONS_SHOWN as u32,
            state: state as i32,
            started_within_seconds,
            ..Default::default()
        };
        Ok(self
            .resources()
            .await?
            .list_operations(as_caller_within(caller, request, LIST_SHARE)?)
            .await?
            .into_inner())
    }

    /// Each region's deletion table (`Admin.GetClusterStatus` for the
    /// regions, then `Admin.ListDeletions` of each at once), each round
    /// within two fifths of the page's budget (the two rounds and the
    /// page's rendering within it). Forbidden unless the caller may
    /// (`admin.status`, `admin.list_deletions`).
    async fn deletion_tables(&self, caller: &Caller) -> Result<DeletionTables, ConsoleError> {
        let round = CALL_BUDGET * 2 / 5;
        let admin = self.admin().await?;
        let status = admin
            .clone()
            .get_cluster_status(as_caller_within(caller, v1::GetClusterStatusRequest {}, round)?)
            .await?
            .into_inner();
        let mut tables = DeletionTables::default();
        // A region that did not answer the status is not asked again in
        // the same page: it is named with the status's reason.
        let (asked, silent): (Vec<_>, Vec<_>) = status.regions.iter().partition(|r| r.reachable);
        tables.unanswered = silent
            .into_iter()
            .map(|r| (r.region.clone(), r.error.clone()))
            .collect();
        let asks = asked.into_iter().map(|region| {
            let mut admin = admin.clone();
            let request = v1::ListDeletionsRequest {
                region: region.region.clone(),
                page_size: DELETIONS_PER_REGION,
                ..Default::default()
            };
            async move {
                let answer = match as_caller_within(caller, request, round) {
                    Ok(request) => admin.list_deletions(request).await.map_err(ConsoleError::from),
                    Err(e) => Err(e),
                };
                (region.region.clone(), answer.map(|a| a.into_inner()))
            }
        });
        for (region, answer) in futures::future::join_all(asks).await {
            match answer {
                Ok(page) => {
                    tables.pages.push((region, page));
                }
                Err(ConsoleError::Forbidden(why)) => return Err(ConsoleError::Forbidden(why)),
                Err(e) => tables.unanswered.push((region, e.to_string())),
            }
        }
        Ok(tables)
    }
}

/// The deletion tables an administrator reads: each region's page, and
/// the regions that did not answer.
#[derive(Debug, Default)]
pub(super) struct DeletionTables {
    pages: Vec<(String, v1::ListDeletionsResponse)>,
    unanswered: Vec<(String, String)>,
}

/// `message` as the caller's call: its token as `authorization: Bearer`,
/// and the console's deadline (`grpc-timeout`), which the node keeps to.
fn as_caller<M>(caller: &Caller, message: M) -> Result<tonic::Request<M>, ConsoleError> {
    as_caller_within(caller, message, CALL_BUDGET)
}

/// [`as_caller`] with `timeout` as its deadline (a share of a page's
/// budget; at least a millisecond, as `grpc-timeout` cannot say 0).
fn as_caller_within<M>(caller: &Caller, message: M, timeout: Duration) -> Result<tonic::Request<M>, ConsoleError> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout.max(Duration::from_millis(1)));
    if let Some(token) = &caller.token {
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| ConsoleError::Unauthenticated("the token cannot be sent: sign in again".into()))?;
        request.metadata_mut().insert("authorization", value);
    }
    Ok(request)
}

/// What the operations page shows.
#[derive(Debug, Default)]
pub(super) struct RunningOperations {
    /// Operation id (time-ordered: the order they started) → the
    /// operation, and what the regions' deletion tables hold of it.
    pub by_operation: BTreeMap<String, RunningOperation>,
    /// `ListOperations` had more than one page of them.
    pub more: bool,
    /// The deletion tables could not be read (an administrator's page).
    pub tables_problem: Option<String>,
    /// Regions whose deletion table did not fit one read: their counts
    /// are lower bounds.
    pub cut_regions: Vec<String>,
    /// Regions that did not answer, and why.
    pub unanswered: Vec<(String, String)>,
}

impl RunningOperations {
    /// Adds what the deletion tables hold: per operation, its members in
    /// flight per region and status, and how many are stuck.
    fn merge_tables(&mut self, tables: DeletionTables) {
        for (region, why) in tables.unanswered {
            if !self.unanswered.iter().any(|(r, _)| *r == region) {
                self.unanswered.push((region, why));
            }
        }
        for (region, page) in tables.pages {
            if !page.next_page_token.is_empty() {
                self.cut_regions.push(region.clone());
            }
            for entry in page.deletions {
                let Some(deletion) = entry.resource.as_ref().and_then(|r| r.deletion.as_ref()) else {
                    continue;
                };
                let status = enum_word(deletion.status().as_str_name(), "DELETION_STATUS_").to_owned();
                let operation = self.by_operation.entry(deletion.operation_id.clone()).or_default();
                *operation
                    .in_flight
                    .entry(region.clone())
                    .or_default()
                    .entry(status)
                    .or_default() += 1;
                operation.members += 1;
                if entry.stuck {
                    operation.stuck += 1;
                }
            }
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct RunningOperation {
    /// Region → deletion status (PENDING, BLOCKED, WAITING, FAILED) → members.
    pub in_flight: BTreeMap<String, BTreeMap<String, u64>>,
    pub members: usize,
    pub stuck: usize,
    /// Listed by `ListOperations` (so the caller may read it).
    pub shown: bool,
    pub operation: Option<v1::Operation>,
}

/// The name of a prost enum value without its type's prefix:
/// `OPERATION_STATE_RUNNING` → `RUNNING`.
pub(super) fn enum_word<'a>(name: &'a str, prefix: &str) -> &'a str {
    name.strip_prefix(prefix).unwrap_or(name)
}
