//! The cluster page's calls: the regions as the serving node sees them
//! (`Admin.GetClusterStatus`, the data of `cascade status`) and a page of
//! a region's audit log (`Admin.ListAudit`) with the caller's filters.
//! Both as the caller, each within `CALL_BUDGET`.

use cascade_proto::v1;

use super::{as_caller, Backend};
use crate::console::error::ConsoleError;
use crate::console::session::Caller;

/// Audit entries per page of the cluster page.
pub(in crate::console) const AUDIT_PAGE: u32 = 50;

/// What the caller asked of the audit log (each filter exact, as the API
/// takes it; empty: any).
#[derive(Debug, Default, Clone)]
pub(in crate::console) struct AuditFilter {
    pub region: String,
    pub principal: String,
    pub resource: String,
    pub action: String,
    pub page_token: String,
}

impl Backend {
    pub(in crate::console) async fn cluster_status(&self, caller: &Caller) -> Result<v1::ClusterStatus, ConsoleError> {
        let mut admin = self.admin().await?;
        Ok(admin
            .get_cluster_status(as_caller(caller, v1::GetClusterStatusRequest {})?)
            .await?
            .into_inner())
    }

    pub(in crate::console) async fn audit(
        &self,
        caller: &Caller,
        filter: &AuditFilter,
    ) -> Result<v1::ListAuditResponse, ConsoleError> {
        let mut admin = self.admin().await?;
        let request = v1::ListAuditRequest {
            region: filter.region.clone(),
            page_size: AUDIT_PAGE,
            page_token: filter.page_token.clone(),
            principal: filter.principal.clone(),
            resource: filter.resource.clone(),
            action: filter.action.clone(),
            ..Default::default()
        };
        Ok(admin.list_audit(as_caller(caller, request)?).await?.into_inner())
    }
}
