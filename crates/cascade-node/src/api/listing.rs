//! `Resources.List` and `Resources.ListReferences` at the wire edge: one
//! region's listing (this node's, or another's forwarded to its node like
//! a Get), and a listing of every region.
//!
//! Every region: each region not yet finished is asked at once for a page
//! (this one locally, the others through their own `Resources.List` with
//! `region` set to them), all within one deadline (`LIST_BUDGET`, or less
//! as the caller's `grpc-timeout` leaves, `budget_within`); the core's
//! `listing::merge_pages` keeps the first `page_size` by name and moves each
//! region's position. The positions and a fingerprint of the selectors are
//! the page token ([`ListPageToken`]). A region that did not answer in time
//! is given up for the rest of the walk and named in `unreachable` on every
//! later page, so paging ends and the client knows the listing is
//! incomplete.

use std::collections::BTreeMap;
use std::time::Duration;

use cascade_core::auth::{Principal, Target, Verb};
use cascade_core::limits::{quote, MAX_LIST_REGIONS};
use cascade_core::listing::{merge_pages, RegionAnswer, RegionPosition};
use cascade_core::selector::Selector;
use cascade_core::{OnDelete, Uid};
use cascade_proto::bounds::fit_page;
use cascade_proto::convert;
use cascade_proto::page_token::{ListPageToken, ReferencesPageToken};
use cascade_proto::status::invalid_field;
use cascade_proto::v1;
use tonic::{Request, Status};

use crate::api::forward::{budget_within, deadline_of};
use crate::api::parse_name;
use crate::api::principal::caller;
use crate::api::resources::{present, ResourcesApi};
use crate::listing::{ListQuery, ReferencesFrom, ReferencesPage};
use crate::peers::Deadline;

/// A listing of every region: one page from every region together, unless
/// the caller's own deadline leaves less.
pub(crate) const LIST_BUDGET: Duration = Duration::from_secs(5);

/// The page a region answered, on the wire (its items and its own token).
type WirePage = (Vec<v1::Resource>, Option<String>);

/// Why a region gave no page: this node's own refusal is the caller's
/// error; another region's failure makes it unreachable (why).
enum PageFailure {
    Own(Status),
    Remote(String),
}

/// The request's filters in the node's terms (INVALID_ARGUMENT naming the
/// field for an unknown state or a selector that does not parse).
fn query_of(req: &v1::ListRequest) -> Result<ListQuery, Status> {
    let state = convert::resource_state_from(
        v1::ResourceState::try_from(req.state).map_err(|_| invalid_field("state", "unknown state"))?,
    );
    let selector =
        Selector::parse(&req.attribute_selector).map_err(|e| invalid_field("attribute_selector", e.to_string()))?;
    Ok(ListQuery {
        kind: (!req.kind.is_empty()).then(|| req.kind.clone()),
        state,
        name_prefix: req.name_prefix.clone(),
        selector,
        show_deleted: req.show_deleted,
    })
}

/// The fingerprint a listing's token carries: every field that selects.
fn selectors_of(req: &v1::ListRequest) -> u64 {
    let state = req.state.to_string();
    // Only a listing that shows deleted ones adds to the fingerprint, so a
    // token from a node before soft delete still reads.
    let show_deleted = if req.show_deleted { "show_deleted" } else { "" };
    let mut fields: Vec<&str> = vec![&req.kind, &state, &req.name_prefix, &req.attribute_selector];
    if req.show_deleted {
        fields.push(show_deleted);
    }
    ListPageToken::fingerprint(&fields)
}

/// A region's page must hold its own resources in strictly increasing
/// name order after the position it was asked from, and its next token
/// must move past that position: otherwise a listing of every region could
/// repeat items or never end. A page that does not is a bad answer (the
/// region is given up, as one that does not answer).
fn moves_forward(region: &str, after: &str, items: &[v1::Resource], next: Option<&str>) -> Result<(), String> {
    let own = format!("{region}/");
    let mut last = after;
    for r in items {
        if !r.name.starts_with(&own) || r.name.as_str() <= last {
            return Err(format!(
                "answered a page out of order or of another region ({})",
                quote(&r.name)
            ));
        }
        last = &r.name;
    }
    match next {
        Some(n) if n <= after => Err(format!("answered a page token that does not move on ({})", quote(n))),
        _ => Ok(()),
    }
}

/// The regions' positions a page token carries (none: the first page),
/// refused when it was issued for other `selectors` (`what`, for the
/// message: the request's fields they fingerprint).
pub(super) fn positions_in_token(
    page_token: &str,
    selectors: u64,
    what: &str,
) -> Result<BTreeMap<String, RegionPosition>, Status> {
    match ListPageToken::decode(page_token).map_err(|e| invalid_field("page_token", e.to_string()))? {
        None => Ok(BTreeMap::new()),
        Some(token) if token.selectors != selectors => Err(invalid_field(
            "page_token",
            format!("was issued for a listing with other {what}"),
        )),
        Some(token) => Ok(token.regions),
    }
}

impl ResourcesApi {
    /// `Resources.List`: this region, another (forwarded), or every region.
    pub(crate) async fn list_resources(&self, request: Request<v1::ListRequest>) -> Result<v1::ListResponse, Status> {
        let budget = budget_within(LIST_BUDGET, request.metadata());
        // A forward to one region keeps to the caller's deadline too.
        let deadline = deadline_of(request.metadata());
        let principal = caller(&request);
        let req = request.into_inner();
        if req.all_regions {
            if !req.region.is_empty() {
                return Err(invalid_field(
                    "region",
                    "name one region or ask for all_regions, not both",
                ));
            }
            return self.list_every_region(&principal, req, budget).await;
        }
        if !req.region.is_empty() && req.region != self.node.region.as_str() {
            if !self.node.peers.knows(&req.region) {
                return Err(invalid_field(
                    "region",
                    format!(
                        "{} is not a region of this cluster ({}; peers: {})",
                        quote(&req.region),
                        self.node.region,
                        self.node.peer_list()
                    ),
                ));
            }
            let region = req.region.clone();
            let mut owner = self.node.peers.resources(&region).map_err(crate::api::refused)?;
            let send = move |r| async move { owner.list(r).await };
            return self.to_owner(&region, "List", &deadline, req, send).await;
        }
        self.authorize_listing(&principal, &req)?;
        let (resources, next) = self.local_page(&req, &deadline).await?;
        Ok(v1::ListResponse {
            resources,
            next_page_token: next.unwrap_or_default(),
            unreachable: Vec::new(),
        })
    }

    /// `list` on this region, of the kind the listing names (every kind: `""`).
    fn authorize_listing(&self, principal: &Principal, req: &v1::ListRequest) -> Result<(), Status> {
        self.authorize(
            principal,
            Verb::List,
            Target::Region {
                region: &self.node.region,
                kind: (!req.kind.is_empty()).then_some(req.kind.as_str()),
            },
        )
    }

    /// One page of this region, cut to the byte budget, with its own token
    /// (the last name it holds or examined).
    /// What a page across regions ends with: the regions that gave up,
    /// each with its last contact, and the next page's token (every
    /// region's position; empty once every region is done). List and
    /// ListOperations end their pages the same way.
    pub(super) fn end_of_page(
        &self,
        selectors: u64,
        positions: BTreeMap<String, RegionPosition>,
    ) -> (Vec<v1::UnreachableRegion>, String) {
        let unreachable = positions
            .iter()
            .filter_map(|(region, p)| match p {
                RegionPosition::GaveUp(reason) => Some(v1::UnreachableRegion {
                    region: region.clone(),
                    last_contact_ms: self
                        .node
                        .metrics
                        .last_contact(region)
                        .map_or(0, |seconds| (seconds * 1000.0) as i64),
                    reason: reason.clone(),
                }),
                _ => None,
            })
            .collect();
        let next_page_token = if positions.values().any(RegionPosition::is_open) {
            ListPageToken {
                selectors,
                regions: positions,
            }
            .encode()
        } else {
            String::new()
        };
        (unreachable, next_page_token)
    }

    /// This region's page; the owners of its remote `allow_dangling`
    /// targets asked within what is left of `deadline`.
    async fn local_page(&self, req: &v1::ListRequest, deadline: &Deadline) -> Result<WirePage, Status> {
        let query = query_of(req)?;
        let after = if req.page_token.is_empty() {
            None
        } else {
            Some(parse_name(&req.page_token, "page_token")?)
        };
        let page = self
            .node
            .list(&query, req.page_size as usize, after.as_ref(), deadline)
            .await?;
        let mut resources: Vec<v1::Resource> = page.items.iter().map(present).collect();
        let mut next = page.next.map(|n| n.to_string());
        if fit_page(&mut resources, self.node.limits.page_bytes()) {
            // The token is the last name the page holds.
            next = resources.last().map(|r| r.name.clone());
        }
        Ok((resources, next))
    }

    /// Every region's next page at once, merged (module doc).
    async fn list_every_region(
        &self,
        principal: &Principal,
        req: v1::ListRequest,
        budget: Duration,
    ) -> Result<v1::ListResponse, Status> {
        let own = self.node.region.as_str().to_owned();
        let mut regions: Vec<String> = self.node.peers.regions().map(str::to_owned).collect();
        regions.push(own.clone());
        if regions.len() > MAX_LIST_REGIONS {
            return Err(Status::failed_precondition(format!(
                "all_regions lists at most {MAX_LIST_REGIONS} regions and this cluster has {}: list them one at a time (region)",
                regions.len()
            )));
        }
        // Refuse bad selectors before asking anyone.
        query_of(&req)?;
        let selectors = selectors_of(&req);
        let mut positions = positions_in_token(
            &req.page_token,
            selectors,
            "selectors (kind, state, name_prefix, attribute_selector)",
        )?;
        // A position the token carries must be a name of its own region:
        // anything else was not issued by a node (a region asked with it
        // would refuse it, and be given up instead of the caller told).
        for (region, position) in &positions {
            if let RegionPosition::After(after) = position {
                let name = parse_name(after, "page_token")?;
                if name.region() != region.as_str() {
                    return Err(invalid_field(
                        "page_token",
                        format!("holds a position of region {} under {}", quote(after), quote(region)),
                    ));
                }
            }
        }
        if let Some(stranger) = positions.keys().find(|r| !regions.contains(r)) {
            return Err(invalid_field(
                "page_token",
                format!(
                    "names region {}, which is not a region of this cluster",
                    quote(stranger)
                ),
            ));
        }
        for region in &regions {
            positions.entry(region.clone()).or_insert(RegionPosition::Start);
        }
        let page_size = match req.page_size {
            0 => self.node.limits.default_page_size,
            n => (n as usize).min(self.node.limits.max_page_size),
        };
        let asked = positions.iter().filter(|(_, p)| p.is_open()).map(|(region, position)| {
            let mut one = req.clone();
            one.all_regions = false;
            one.region = region.clone();
            one.page_token = position.token().to_owned();
            let region = region.clone();
            let own = own.clone();
            async move {
                let answer = if region == own {
                    // Each region decides on its own listing: one that
                    // refuses is listed (as another region's refusal is),
                    // and the others are.
                    if let Err(denied) = self.authorize_listing(principal, &one) {
                        return (
                            region,
                            Err(PageFailure::Remote(format!(
                                "answered {:?}: {}",
                                denied.code(),
                                cascade_core::limits::cut_stored(denied.message(), 200)
                            ))),
                        );
                    }
                    // Its lookups within the budget, so that the page is
                    // not cut by it.
                    let within = Deadline::from_caller(Some(budget));
                    match tokio::time::timeout(budget, self.local_page(&one, &within)).await {
                        Ok(page) => page.map_err(PageFailure::Own),
                        // Reading its own page can wait on other regions
                        // (a remote allow_dangling target's lookup): named
                        // like any region late within the budget, and the
                        // others are listed.
                        Err(_) => Err(PageFailure::Remote(format!(
                            "did not read its own page within {budget:?}"
                        ))),
                    }
                } else {
                    self.remote_page(&region, one, budget)
                        .await
                        .map_err(PageFailure::Remote)
                };
                (region, answer)
            }
        });
        // Each region's page is bounded by the budget on its own.
        let gathered = futures::future::join_all(asked).await;
        let mut answers: BTreeMap<String, RegionAnswer<v1::Resource>> = BTreeMap::new();
        for (region, answer) in gathered {
            match answer {
                Ok((items, next)) => answers.insert(region, RegionAnswer::Page { items, next }),
                // This region's own refusal (a bad token, an unknown kind)
                // is the caller's error, not an unreachable region.
                Err(PageFailure::Own(status)) => return Err(status),
                Err(PageFailure::Remote(why)) => answers.insert(region, RegionAnswer::Unreachable(why)),
            };
        }
        let before = positions.clone();
        let mut resources = merge_pages(&mut positions, answers.clone(), page_size, |r| r.name.as_str());
        let mut kept = resources.len();
        if fit_page(&mut resources, self.node.limits.page_bytes()) {
            // Too many bytes: merge again keeping only what fits, so each
            // region's position is after what this page really holds.
            kept = resources.len();
            positions = before;
            resources = merge_pages(&mut positions, answers, kept, |r| r.name.as_str());
        }
        debug_assert_eq!(resources.len(), kept);
        let (unreachable, next_page_token) = self.end_of_page(selectors, positions);
        Ok(v1::ListResponse {
            resources,
            next_page_token,
            unreachable,
        })
    }

    /// Another region's page (its `Resources.List` for itself), or why it
    /// did not give one within `budget`.
    async fn remote_page(&self, region: &str, req: v1::ListRequest, budget: Duration) -> Result<WirePage, String> {
        let after = req.page_token.clone();
        let mut owner = self
            .node
            .peers
            .resources(region)
            .map_err(|e| format!("could not be asked: {e}"))?;
        let mut call = Request::new(req);
        call.set_timeout(budget);
        match tokio::time::timeout(budget, owner.list(call)).await {
            Err(_) => Err(format!("did not answer within {budget:?}")),
            // tonic's own end of the call's deadline (`grpc-timeout`).
            Ok(Err(status)) if matches!(status.code(), tonic::Code::Cancelled | tonic::Code::DeadlineExceeded) => {
                Err(format!("did not answer within {budget:?}"))
            }
            Ok(Err(status)) => Err(format!(
                "answered {:?}: {}",
                status.code(),
                cascade_core::limits::cut_stored(status.message(), 200)
            )),
            Ok(Ok(answer)) => {
                let page = answer.into_inner();
                let next = (!page.next_page_token.is_empty()).then_some(page.next_page_token);
                moves_forward(region, &after, &page.resources, next.as_deref())?;
                Ok((page.resources, next))
            }
        }
    }

    /// `Resources.ListReferences`, answered by the owner of `name`.
    pub(crate) async fn list_references_of(
        &self,
        request: Request<v1::ListReferencesRequest>,
    ) -> Result<v1::ListReferencesResponse, Status> {
        let deadline = deadline_of(request.metadata());
        let principal = caller(&request);
        let req = request.into_inner();
        let name = parse_name(&req.name, "name")?;
        if let Some((region, mut owner)) = self.route(&name, "name")? {
            let send = move |r| async move { owner.list_references(r).await };
            return self.to_owner(&region, "ListReferences", &deadline, req, send).await;
        }
        self.authorize(&principal, Verb::List, Target::Resource(&name))?;
        let token = ReferencesPageToken::decode(&req.page_token)
            .map_err(|e| invalid_field("page_token", e.to_string()))?
            .unwrap_or_default();
        let from = match v1::ReferenceDirection::try_from(req.direction) {
            Ok(v1::ReferenceDirection::Referrers) => ReferencesFrom::Referrers {
                after: if token.referrer_uid.is_empty() {
                    None
                } else {
                    let uid = Uid::parse(&token.referrer_uid).map_err(|e| invalid_field("page_token", e))?;
                    Some((uid, token.field))
                },
            },
            Ok(v1::ReferenceDirection::Targets) => ReferencesFrom::Targets {
                offset: usize::try_from(token.offset).unwrap_or(usize::MAX),
            },
            _ => return Err(invalid_field("direction", "REFERRERS or TARGETS")),
        };
        let ReferencesPage { rows, next } = self.node.references(&name, from, req.page_size as usize)?;
        let references = rows
            .into_iter()
            .map(|r| v1::Reference {
                referrer: r.referrer.to_string(),
                target: r.target.to_string(),
                field: r.field,
                on_delete: r.on_delete.map(OnDelete::as_str).unwrap_or_default().to_owned(),
            })
            .collect();
        let next_page_token = match next {
            None => String::new(),
            Some(ReferencesFrom::Referrers { after }) => {
                let (uid, field) = after.map(|(u, f)| (u.to_string(), f)).unwrap_or_default();
                ReferencesPageToken {
                    referrer_uid: uid,
                    field,
                    offset: 0,
                }
                .encode()
            }
            Some(ReferencesFrom::Targets { offset }) => ReferencesPageToken {
                offset: offset as u64,
                ..Default::default()
            }
            .encode(),
        };
        Ok(v1::ListReferencesResponse {
            references,
            next_page_token,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_that_repeats_goes_back_or_names_another_region_is_a_bad_answer() {
        let page = |names: &[&str]| -> Vec<v1::Resource> {
            names
                .iter()
                .map(|n| v1::Resource {
                    name: (*n).to_owned(),
                    ..Default::default()
                })
                .collect()
        };
        let ok = page(&["us/p/b", "us/p/c"]);
        assert!(moves_forward("us", "us/p/a", &ok, Some("us/p/c")).is_ok());
        assert!(moves_forward("us", "", &ok, None).is_ok());
        // An empty page that only moves its position on (a scan budget).
        assert!(moves_forward("us", "us/p/a", &[], Some("us/p/x")).is_ok());
        let back = moves_forward("us", "us/p/b", &ok, None).unwrap_err();
        assert!(back.contains("out of order"), "{back}");
        assert!(moves_forward("us", "", &page(&["eu/p/a"]), None).is_err());
        assert!(moves_forward("us", "", &page(&["us/p/b", "us/p/b"]), None).is_err());
        let stuck = moves_forward("us", "us/p/c", &[], Some("us/p/c")).unwrap_err();
        assert!(stuck.contains("does not move on"), "{stuck}");
    }
}
