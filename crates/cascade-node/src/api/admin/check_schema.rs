//! `Admin.CheckSchema` (issue 31, `cascade schema diff OLD NEW --against
//! ENDPOINT`): a schema file's text checked as a reload would check it,
//! against the schema this region has in force and the data it stores,
//! with the counts. The same load and compatibility check as a reload
//! (`schema_reload::check_text`); nothing changes, nothing is audited (it
//! reads, as a listing does). Behind the `[admin]` gate, and
//! `admin.check_schema` under `[auth] mode = "required"`.

use cascade_core::auth::Verb;
use cascade_core::limits::{cut_stored, quote};
use cascade_core::schema::{CompatRule, StoredQuestion};
use cascade_proto::bounds::Bounded;
use cascade_proto::status::invalid_field;
use cascade_proto::v1;
use tonic::{Request, Response, Status};

use super::AdminApi;
use crate::api::principal::caller;
use crate::schema_reload::{ReloadError, SchemaCheck};

/// The most of a load error (the TOML parser's, which shows the line) a
/// refusal carries.
const MAX_LOAD_ERROR_BYTES: usize = 512;

impl AdminApi {
    pub(super) async fn run_check_schema(
        &self,
        request: Request<v1::CheckSchemaRequest>,
    ) -> Result<Response<v1::CheckSchemaResponse>, Status> {
        let region = self.node.region.to_string();
        self.authenticate(&request, "CheckSchema", &region).await?;
        let principal = caller(&request);
        let req = request.into_inner();
        req.check_bounds()?;
        self.authorize_admin(&principal, Verb::AdminCheckSchema)?;
        let node = &self.node;
        let checked = crate::writer::off_the_workers(node.store.waits_on_io(), || {
            crate::schema_reload::check_text(
                &node.schema_in_force,
                node.store.as_ref(),
                node.region.as_str(),
                &req.schema_text,
                "schema_text",
                node.policy.max_retention_ms,
            )
        })
        .map_err(|e| refusal(&req.schema_text, e))?;
        Ok(Response::new(present(region, checked)))
    }
}

/// A text that does not load is the caller's: INVALID_ARGUMENT on
/// `schema_text`, quoting a short prefix of it and a cut of the error.
fn refusal(text: &str, e: ReloadError) -> Status {
    match e {
        ReloadError::Invalid { error, .. } => invalid_field(
            "schema_text",
            format!(
                "{} does not load: {}",
                quote(text),
                cut_stored(&error.to_string(), MAX_LOAD_ERROR_BYTES)
            ),
        ),
        ReloadError::TooLarge { .. } | ReloadError::Retention { .. } => {
            invalid_field("schema_text", cut_stored(&e.to_string(), MAX_LOAD_ERROR_BYTES))
        }
        ReloadError::Read { message, .. } => Status::unavailable(format!("the check could not count: {message}")),
        other => Status::internal(other.to_string()),
    }
}

fn present(region: String, c: SchemaCheck) -> v1::CheckSchemaResponse {
    let refused = c.refused();
    let summary = c.diff.summary();
    let checks = c
        .judged
        .into_iter()
        .map(|j| {
            let rule = match j.item.rule {
                CompatRule::KindRemoved => "kind_removed",
                CompatRule::FieldRemoved => "field_removed",
                CompatRule::FieldRetargeted { .. } => "field_retargeted",
                CompatRule::PolicyChanged { .. } => "policy_changed",
            };
            let kinds = match j.item.question {
                StoredQuestion::KindStored { kind } | StoredQuestion::FieldSet { kind, .. } => vec![kind],
                StoredQuestion::DeletionsOf { kinds } => kinds,
            };
            v1::SchemaCompatCount {
                path: j.item.path,
                rule: rule.to_owned(),
                kinds,
                count: j.tally.count,
                at_least: j.tally.at_least,
                refusal: j.refusal.unwrap_or_default(),
            }
        })
        .collect();
    let d = c.diff;
    v1::CheckSchemaResponse {
        region,
        in_force_version: c.in_force.digest,
        in_force_label: c.in_force.label.unwrap_or_default(),
        checked_version: c.checked.digest,
        checked_label: c.checked.label.unwrap_or_default(),
        kinds_added: d.kinds_added,
        kinds_removed: d.kinds_removed,
        refs_added: d.refs_added,
        refs_removed: d.refs_removed,
        refs_changed: d
            .refs_changed
            .iter()
            .map(|r| format!("{}.{} ({})", r.kind, r.field, r.what()))
            .collect(),
        retain_changed: d.retain_changed,
        summary,
        checks,
        refused,
    }
}
