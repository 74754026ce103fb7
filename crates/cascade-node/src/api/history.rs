//! `Resources.GetHistory` at the wire edge: forwarded to the owner like
//! Get, authorized like Get, the page read by `history.rs` and put in
//! `cascade.v1` terms here. The page token is the revision the next page
//! stops below, as decimal text.

use cascade_core::auth::{Target, Verb};
use cascade_core::history::{HistoryEntry, HistoryKind};
use cascade_core::limits::quote;
use cascade_proto::convert;
use cascade_proto::status::invalid_field;
use cascade_proto::v1;
use tonic::{Request, Status};

use crate::api::forward::deadline_of;
use crate::api::parse_name;
use crate::api::principal::caller;
use crate::api::resources::ResourcesApi;
use crate::history::{HISTORY_PAGE_DEFAULT, MAX_HISTORY_PAGE};

impl ResourcesApi {
    /// `Resources.GetHistory`, answered by the owner of `name`.
    pub(crate) async fn history_of(
        &self,
        request: Request<v1::GetHistoryRequest>,
    ) -> Result<v1::GetHistoryResponse, Status> {
        let deadline = deadline_of(request.metadata());
        let principal = caller(&request);
        let req = request.into_inner();
        let name = parse_name(&req.name, "name")?;
        if let Some((region, mut owner)) = self.route(&name, "name")? {
            let send = move |r| async move { owner.get_history(r).await };
            return self.to_owner(&region, "GetHistory", &deadline, req, send).await;
        }
        self.authorize(&principal, Verb::Get, Target::Resource(&name))?;
        let page_size = match req.page_size as usize {
            0 => HISTORY_PAGE_DEFAULT,
            // Larger asks are cut, as a List's are.
            n => n.min(MAX_HISTORY_PAGE),
        };
        let before = match req.page_token.as_str() {
            "" => None,
            token => Some(token.parse::<u64>().map_err(|_| {
                invalid_field(
                    "page_token",
                    format!("{} is not a page token of GetHistory", quote(token)),
                )
            })?),
        };
        let page = self.node.history(&name, before, page_size)?;
        Ok(v1::GetHistoryResponse {
            events: page.entries.iter().map(present_entry).collect(),
            next_page_token: page.next_before.map(|r| r.to_string()).unwrap_or_default(),
            compacted_before_revision: page.compacted_before.unwrap_or_default(),
        })
    }
}

fn present_entry(entry: &HistoryEntry) -> v1::HistoryEvent {
    use v1::HistoryEventKind as K;
    let kind = match entry.kind {
        HistoryKind::Created => K::Created,
        HistoryKind::Updated => K::Updated,
        HistoryKind::ReferenceAdded => K::ReferenceAdded,
        HistoryKind::ReferenceRemoved => K::ReferenceRemoved,
        HistoryKind::UnsetByCascade => K::UnsetByCascade,
        HistoryKind::DeletionRequested => K::DeletionRequested,
        HistoryKind::DeletionBlocked => K::DeletionBlocked,
        HistoryKind::DeletionFailed => K::DeletionFailed,
        HistoryKind::FinalizerRetry => K::FinalizerRetry,
        HistoryKind::DeletionForced => K::DeletionForced,
        HistoryKind::SoftDeleted => K::SoftDeleted,
        HistoryKind::Deleted => K::Deleted,
        HistoryKind::Undeleted => K::Undeleted,
    };
    v1::HistoryEvent {
        revision: entry.revision,
        time_ms: convert::ms(entry.time),
        kind: kind as i32,
        message: entry.message.clone(),
        by: entry.by.clone().unwrap_or_default(),
        operation_id: entry.operation.map(|o| o.to_string()).unwrap_or_default(),
    }
}
