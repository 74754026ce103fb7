//! `Admin.Purge` and its peer half `Peer.PurgePart` (issue 29, AIP-165):
//! every ACTIVE resource a filter matches, counted and sampled, or, with
//! `force`, deleted with cascade as one operation.
//!
//! The region that receives the purge drives it, as a listing of every
//! region is driven (`api/listing.rs`):
//!
//! 1. The gate and `admin.purge` on this region, the filter checked
//!    (an empty one refused), a purge of one other region forwarded whole
//!    to its node (which then drives it).
//! 2. Count: this region's scan and every other region's `PurgePart`
//!    without an operation, all at once within one deadline
//!    ([`PURGE_BUDGET`], or less as the caller's `grpc-timeout` leaves). A
//!    region that does not answer, or refuses, is named in the answer,
//!    never skipped silently.
//! 3. Without `force`, that is the answer: the count, the first names, who
//!    did not answer. Nothing is written (like a listing, not audited).
//! 4. With `force`: refused, nothing started, when a region did not
//!    answer (UNAVAILABLE), when a scan stopped at its limit or more than
//!    `[limits] max_purge_members` matched (FAILED_PRECONDITION naming the
//!    count and the option). Else this region's part starts in one writer
//!    step (the operation, its root `{region}/purge/{id}`, the regions with
//!    matches in its `reached`, so the operation reads unfinished while one
//!    of them cannot be read; its members DELETING; the audit entry), then
//!    every other region with matches is asked to start its part of the
//!    same operation (`PurgePart` with the id), all at once. A part that
//!    does not start is named in the answer; what started runs on. Every
//!    refusal is audited with the filter.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use cascade_core::auth::{Principal, Target, Verb};
use cascade_core::limits::{cut_stored, MAX_NAME_BYTES, MAX_REQUESTED_BY_BYTES};
use cascade_core::model::RefTarget;
use cascade_core::protocol::{merge_samples, AdminRequest, PurgeFilter, PurgeTally, StartPurge, PURGE_SAMPLE};
use cascade_core::{CoreError, RegionId};
use cascade_proto::bounds::Bounded;
use cascade_proto::convert;
use cascade_proto::status::invalid_field;
use cascade_proto::v1;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::AdminApi;
use crate::api::forward::{answer_by, budget_within, deadline_of, forward, FORWARD_TIMEOUT};
use crate::api::principal::{caller, from_wire, to_wire};
use crate::api::refused;
use crate::auth::AuthMode;
use crate::node::Node;

/// How long a purge's count (and, with force, its start) may take across
/// every region together, unless the caller's deadline is shorter.
pub(crate) const PURGE_BUDGET: Duration = Duration::from_secs(5);

/// Longest text of a region's error kept in an answer.
const REGION_ERROR_BYTES: usize = 256;

/// One region's count.
#[derive(Debug, Default)]
struct Counted {
    count: u64,
    count_is_lower_bound: bool,
    /// Its first names (at most ten).
    sample: Vec<String>,
    /// This region's own members (a forced purge starts them here).
    members: Vec<RefTarget>,
}

impl From<PurgeTally> for Counted {
    fn from(t: PurgeTally) -> Self {
        Counted {
            count: t.count,
            count_is_lower_bound: t.count_is_lower_bound,
            sample: t.sample.iter().map(ToString::to_string).collect(),
            members: t.members,
        }
    }
}

/// One region's answer to the count (or, after it, to the start).
struct RegionAnswer {
    region: String,
    tally: Result<Counted, String>,
    started: u64,
}

impl AdminApi {
    /// `Admin.Purge` (see the module doc).
    pub(super) async fn run_purge(
        &self,
        request: Request<v1::PurgeRequest>,
    ) -> Result<Response<v1::PurgeResponse>, Status> {
        let raw_target = raw_filter(request.get_ref());
        let admin = self.authenticate(&request, "Purge", &raw_target).await?;
        let principal = caller(&request);
        let context = self.admin_context(&request, &admin, Verb::AdminPurge);
        let budget = budget_within(PURGE_BUDGET, request.metadata());
        let deadline = deadline_of(request.metadata());
        // Forwarded: not started, changing nothing, once its forwarder gave up.
        let answer_by = answer_by(request.metadata());
        let req = request.into_inner();
        let mut audit = AdminRequest {
            who: admin.who.clone(),
            action: if req.force { "Purge (force)" } else { "Purge" }.to_owned(),
            target: raw_target,
            reason: req.reason.clone(),
        };
        if let Err(refused) = req.check_bounds() {
            return Err(self.audited_status(audit, context, refused).await);
        }
        if let Some(region) = self.other_region(&req.region, "region")? {
            // That region's node drives it (and is its operation's root).
            let mut client = self.node.peers.admin(&region).map_err(refused)?;
            let (forwarded, now) = (Self::forwarded(req, &admin), self.node.clock.now());
            let send = move |r| async move { client.purge(r).await };
            return Ok(Response::new(
                forward(&region, "Purge", &deadline, FORWARD_TIMEOUT, now, forwarded, send).await?,
            ));
        }
        if let Err(denied) = self.authorize_admin(&principal, Verb::AdminPurge) {
            return Err(self.audited_status(audit, context, denied).await);
        }
        let filter =
            match self
                .node
                .purge_filter(&req.kind, &req.name_prefix, &req.attribute_selector, req.older_than_ms)
            {
                Ok(filter) => filter,
                Err(e) => return Err(self.audited_refusal(audit, context, e).await),
            };
        audit.target = filter.describe();
        let others: Vec<String> = if req.region.is_empty() {
            self.node.peers.regions().map(str::to_owned).collect()
        } else {
            Vec::new()
        };
        let max = self.node.limits.max_purge_members;
        let keep = if req.force { max.saturating_add(1) } else { 0 };
        let mut answers = self
            .count_everywhere(&filter, &others, keep, &req, &principal, budget)
            .await?;
        let mut response = summarize(&answers);
        if !req.force {
            return Ok(Response::new(response));
        }

        // Forced: refused whole unless every region counted, exactly, within the bound.
        if !response.unreachable_regions.is_empty() {
            let reason = answers
                .iter()
                .filter_map(|a| a.tally.as_ref().err().map(|e| format!("{}: {e}", a.region)))
                .collect::<Vec<_>>()
                .join("; ");
            let e = CoreError::RegionUnavailable {
                region: response.unreachable_regions.join(", "),
                reason: format!(
                    "a forced purge counts every region first, and these did not answer ({reason}); nothing was \
                     started (name a region, or retry when they answer)"
                ),
            };
            return Err(self.audited_refusal(audit, context, e.into()).await);
        }
        if response.count_is_lower_bound || response.purge_count > max as u64 {
            let e = CoreError::PurgeTooLarge {
                matched: response.purge_count,
                at_least: response.count_is_lower_bound,
                max: max as u64,
            };
            return Err(self.audited_refusal(audit, context, e.into()).await);
        }
        if response.purge_count == 0 {
            self.audit_ok(audit, "ok: nothing matched".to_owned(), context).await;
            return Ok(Response::new(response));
        }
        let total = response.purge_count;
        let reached: BTreeSet<String> = answers
            .iter()
            .filter(|a| a.region != self.node.region.as_str() && a.tally.as_ref().is_ok_and(|t| t.count > 0))
            .map(|a| a.region.clone())
            .collect();
        let requested_by = cut_stored(
            &format!("purge {} by {}", filter.describe(), admin.who),
            MAX_REQUESTED_BY_BYTES,
        );
        let own = self.node.region.to_string();
        let members = answers
            .iter_mut()
            .find(|a| a.region == own)
            .and_then(|a| a.tally.as_mut().ok())
            .map(|t| std::mem::take(&mut t.members))
            .unwrap_or_default();
        let part = StartPurge {
            operation: None,
            root_region: self.node.region.clone(),
            filter: filter.clone(),
            members,
            reached: reached.clone(),
            requested_by: requested_by.clone(),
            principal: principal.clone(),
            audit: AdminRequest {
                reason: format!("{} (matched {total})", audit.reason),
                ..audit.clone()
            },
        };
        let (node, ctx) = (self.node.clone(), context.clone());
        let start = async move { node.start_purge_part(part, ctx, answer_by).await };
        let started = self.carry_out(answer_by, start, audit.clone(), context).await?;
        let op = started.operation;
        if let Some(a) = answers.iter_mut().find(|a| a.region == own) {
            a.started = started.started.len() as u64;
        }
        let starts = reached.iter().map(|region| {
            let counted = answers
                .iter()
                .find(|a| a.region == *region)
                .and_then(|a| a.tally.as_ref().ok())
                .map_or(0, |t| t.count);
            let part = v1::PurgePartRequest {
                kind: req.kind.clone(),
                name_prefix: req.name_prefix.clone(),
                attribute_selector: req.attribute_selector.clone(),
                older_than_ms: req.older_than_ms,
                operation_id: op.id.to_string(),
                root_region: own.clone(),
                requested_by: requested_by.clone(),
                principal: Some(to_wire(&principal)),
                // The bound across regions holds if its count grew since.
                at_most: (max as u64).saturating_sub(total - counted),
                reason: audit.reason.clone(),
            };
            let region = region.clone();
            async move {
                let answer = ask_part(&self.node, &region, part, budget).await;
                (region, answer)
            }
        });
        for (region, answer) in futures::future::join_all(starts).await {
            let Some(a) = answers.iter_mut().find(|a| a.region == region) else {
                continue;
            };
            match answer {
                Ok(part) => a.started = part.started,
                Err(e) => {
                    warn!(region = %self.node.region, peer = %region, operation = %op.id, error = %e,
                        "a region's part of a forced purge did not start");
                    a.tally = Err(format!("its part did not start: {e}"));
                }
            }
        }
        info!(region = %self.node.region, operation = %op.id, filter = %filter.describe(), matched = total,
            who = %admin.who, "forced purge started");
        response = summarize(&answers);
        response.operation = Some(convert::operation(&op, &[], String::new()));
        Ok(Response::new(response))
    }

    /// This region's tally and every other region's count, at once, within `budget`.
    async fn count_everywhere(
        &self,
        filter: &PurgeFilter,
        others: &[String],
        keep: usize,
        req: &v1::PurgeRequest,
        principal: &Principal,
        budget: Duration,
    ) -> Result<Vec<RegionAnswer>, Status> {
        let asked = others.iter().map(|region| {
            let part = v1::PurgePartRequest {
                kind: req.kind.clone(),
                name_prefix: req.name_prefix.clone(),
                attribute_selector: req.attribute_selector.clone(),
                older_than_ms: req.older_than_ms,
                principal: Some(to_wire(principal)),
                ..Default::default()
            };
            async move {
                let answer = ask_part(&self.node, region, part, budget).await;
                RegionAnswer {
                    region: region.clone(),
                    tally: answer.map(counted_from).map_err(|e| cut_stored(&e, REGION_ERROR_BYTES)),
                    started: 0,
                }
            }
        });
        let mut answers = vec![RegionAnswer {
            region: self.node.region.to_string(),
            tally: Ok(self.node.purge_tally(filter, keep)?.into()),
            started: 0,
        }];
        answers.extend(futures::future::join_all(asked).await);
        answers.sort_by(|a, b| a.region.cmp(&b.region));
        Ok(answers)
    }

    /// A purge's audit entry when it was not refused (a forced purge that
    /// matched nothing); a log line when the entry cannot be written.
    async fn audit_ok(&self, audit: AdminRequest, outcome: String, context: crate::audit::AuditContext) {
        if let Err(e) = self.node.audit(audit, outcome, context).await {
            if let Some(more) = self.node.audit_failed.admit() {
                warn!(region = %self.node.region, error = %e, suppressed = more.count(), "could not write the audit log{more}");
            }
        }
    }
}

/// The filter as the request spells it, for the log of a call refused
/// before the filter is checked (each part cut; the core cuts the whole).
fn raw_filter(req: &v1::PurgeRequest) -> String {
    let cut = |s: &str| cut_stored(s, 128);
    format!(
        "kind={} prefix={} selector={:?} older_than_ms={} region={}",
        cut(&req.kind),
        cut(&req.name_prefix),
        cut(&req.attribute_selector),
        req.older_than_ms,
        cut(&req.region)
    )
}

/// `region`'s `PurgePart`, within `budget` (which the call carries as its
/// `grpc-timeout`); its error as text.
async fn ask_part(
    node: &Arc<Node>,
    region: &str,
    part: v1::PurgePartRequest,
    budget: Duration,
) -> Result<v1::PurgePartResponse, String> {
    let mut request = Request::new(part);
    request.set_timeout(budget);
    node.peers
        .call(region, "PurgePart", budget, |mut c| async move {
            c.purge_part(request).await
        })
        .await
        .map_err(|e| e.to_string())
}

/// A peer's count. Its names are shown, never acted on: at most ten are
/// kept, each cut to a name's length (the merge takes the first ten of all).
fn counted_from(part: v1::PurgePartResponse) -> Counted {
    Counted {
        count: part.purge_count,
        count_is_lower_bound: part.count_is_lower_bound,
        sample: part
            .purge_sample
            .iter()
            .take(PURGE_SAMPLE)
            .map(|n| cut_stored(n, MAX_NAME_BYTES))
            .collect(),
        members: Vec::new(),
    }
}

/// The answer from every region's count: sums, the merged sample, and
/// each region's line (in region order).
fn summarize(answers: &[RegionAnswer]) -> v1::PurgeResponse {
    let mut response = v1::PurgeResponse::default();
    let mut samples = Vec::new();
    for a in answers {
        let mut line = v1::PurgeRegionCount {
            region: a.region.clone(),
            started: a.started,
            ..Default::default()
        };
        match &a.tally {
            Ok(t) => {
                response.purge_count += t.count;
                response.count_is_lower_bound |= t.count_is_lower_bound;
                samples.push(t.sample.as_slice());
                line.purge_count = t.count;
                line.count_is_lower_bound = t.count_is_lower_bound;
            }
            Err(e) => {
                response.unreachable_regions.push(a.region.clone());
                line.error = e.clone();
            }
        }
        response.regions.push(line);
    }
    response.purge_sample = merge_samples(samples);
    response
}

/// `Peer.PurgePart` (the peer service's adapter checked the request's
/// bounds and that `root_region` is the caller's own): this region's count,
/// or its part of the purge operation the request names, for the
/// administrator the asking region vouches for, under this region's own
/// policy (`admin.purge`; a refusal is audited here).
pub(crate) async fn purge_part(node: &Node, req: v1::PurgePartRequest) -> Result<v1::PurgePartResponse, Status> {
    let principal = match req.principal {
        Some(wire) => from_wire(wire).ok_or_else(|| invalid_field("principal.via", "names no known means"))?,
        None => Principal::anonymous(),
    };
    let root_region = if req.root_region.is_empty() {
        None
    } else {
        Some(RegionId::parse(&req.root_region).map_err(|e| invalid_field("root_region", e))?)
    };
    let through = root_region.as_ref().map(ToString::to_string);
    let region = &node.region;
    let decision = node
        .authorizer
        .decide(&principal, Verb::AdminPurge, Target::Region { region, kind: None });
    let context = node.audit_context(&principal, &decision.rule, through.as_deref());
    let filter_text = format!(
        "kind={} prefix={} selector={:?} older_than_ms={}",
        cut_stored(&req.kind, 128),
        cut_stored(&req.name_prefix, 128),
        cut_stored(&req.attribute_selector, 128),
        req.older_than_ms
    );
    let audit = AdminRequest {
        who: principal.id.clone(),
        action: "Purge (force)".to_owned(),
        target: filter_text,
        reason: req.reason.clone(),
    };
    let forced = !req.operation_id.is_empty();
    // Refusals of a part that would change something are audited here; a
    // count changes nothing and is answered as a listing is.
    let refusal = Refusing {
        node,
        forced,
        audit: &audit,
        context: &context,
    };
    if node.auth.mode == AuthMode::Required {
        if let Err(denied) = node.authorize(&principal, Verb::AdminPurge, Target::Region { region, kind: None }) {
            return Err(refusal.refuse(denied).await);
        }
    }
    let filter = match node.purge_filter(&req.kind, &req.name_prefix, &req.attribute_selector, req.older_than_ms) {
        Ok(filter) => filter,
        Err(e) => return Err(refusal.refuse(e).await),
    };
    if !forced {
        let tally = node.purge_tally(&filter, 0)?;
        return Ok(v1::PurgePartResponse {
            purge_count: tally.count,
            purge_sample: tally.sample.iter().map(ToString::to_string).collect(),
            count_is_lower_bound: tally.count_is_lower_bound,
            started: 0,
        });
    }
    let id = crate::api::parse_operation_id(&req.operation_id, "operation_id")?;
    let Some(root_region) = root_region else {
        return Err(invalid_field(
            "root_region",
            "a part of a purge operation names the region it started in",
        ));
    };
    let at_most = usize::try_from(req.at_most).unwrap_or(usize::MAX);
    let tally = node.purge_tally(&filter, at_most.saturating_add(1))?;
    if tally.count_is_lower_bound || tally.count > req.at_most {
        let e = CoreError::PurgeTooLarge {
            matched: tally.count,
            at_least: tally.count_is_lower_bound,
            max: req.at_most,
        };
        return Err(refusal.refuse(e.into()).await);
    }
    let count = tally.count;
    let part = StartPurge {
        operation: Some(id),
        root_region,
        filter: filter.clone(),
        members: tally.members,
        reached: BTreeSet::new(),
        requested_by: req.requested_by,
        principal,
        audit: AdminRequest {
            target: filter.describe(),
            ..audit.clone()
        },
    };
    // Asked by the root's region for its purge, not forwarded for a client.
    match node.start_purge_part(part, context.clone(), None).await {
        Ok(started) => {
            info!(region = %node.region, operation = %id, matched = count, started = started.started.len(),
                "started this region's part of a forced purge");
            Ok(v1::PurgePartResponse {
                purge_count: count,
                purge_sample: tally.sample.iter().map(ToString::to_string).collect(),
                count_is_lower_bound: false,
                started: started.started.len() as u64,
            })
        }
        Err(e) => Err(refusal.refuse(e).await),
    }
}

/// How `Peer.PurgePart` refuses: the status, audited when the part would
/// have changed something.
struct Refusing<'a> {
    node: &'a Node,
    forced: bool,
    audit: &'a AdminRequest,
    context: &'a crate::audit::AuditContext,
}

impl Refusing<'_> {
    async fn refuse(&self, e: crate::error::Fault) -> Status {
        let status = Status::from(e);
        if self.forced {
            let outcome = format!("{:?}: {}", status.code(), status.message());
            if let Err(e) = self.node.audit(self.audit.clone(), outcome, self.context.clone()).await {
                if let Some(more) = self.node.audit_failed.admit() {
                    warn!(region = %self.node.region, error = %e, suppressed = more.count(), "could not write the audit log{more}");
                }
            }
        }
        status
    }
}
