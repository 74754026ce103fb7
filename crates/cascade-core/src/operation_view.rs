//! One operation seen from every region: its parts collected, counters
//! summed, outcomes paged across the parts.
//!
//! A deletion's operation has a part in every region its closure reaches
//! (the root's region and each importer that cascaded or unset something).
//! A client asks any node for the operation; that node reads every region's
//! part and merges them. The reading is IO (the node calls `Peer.OperationPart`);
//! what to ask each region for and how the answers combine is here, pure, so
//! it can be tested without a network.
//!
//! # Paging across parts
//!
//! Outcomes page across the parts, which follow each other in a fixed
//! order of regions (the same on every node). A page's cursor
//! ([`OutcomesCursor`]) names the region whose part comes next and that
//! part's own position, so a page fills from one part into the next, every
//! outcome comes once, and any node continues a cursor another node issued.
//! A part that cannot be read now ends the page before it (its region is
//! listed as unreachable, and the cursor points at it): skipping it would
//! lose its outcomes for good.
//!
//! The driver is sans-IO, like [`crate::plan::PlanDriver`]: the caller asks
//! [`OperationAssembler::next_request`] what to read, reads it, and hands the
//! answer back with [`OperationAssembler::answer`], until there is nothing
//! left to ask; [`OperationAssembler::finish`] merges.

use crate::error::CoreError;
use crate::model::{Operation, OperationState, Outcome, Progress};
use crate::name::{OperationId, ResourceName};

/// Where the next page of an operation's outcomes starts: the region whose
/// part comes next, and the last outcome of that part already returned
/// (None: from its first outcome).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutcomesCursor {
    /// The region whose part the next page starts in.
    pub region: String,
    /// The part's own position: the resource name of the last outcome returned.
    pub after: Option<ResourceName>,
}

/// One region's part of an operation, with a page of its outcomes.
#[derive(Debug, Clone, PartialEq)]
pub struct OperationPage {
    /// The region's own record of the operation (its counters, its state).
    pub operation: Operation,
    /// Up to the requested number of outcomes, in resource-name order.
    pub outcomes: Vec<Outcome>,
    /// Set when the part holds more outcomes after these: the last one's name.
    pub next: Option<ResourceName>,
}

/// What to read from one region: its part, with up to `want` outcomes after
/// `after` (0: the counters only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartRequest {
    /// The region to ask.
    pub region: String,
    /// How many outcomes the page still needs from this part.
    pub want: usize,
    /// The part's own position to continue from.
    pub after: Option<ResourceName>,
}

/// What a region answered to a [`PartRequest`].
#[derive(Debug, Clone, PartialEq)]
pub enum PartAnswer {
    /// Its part (boxed: a page is large, the other answers are empty).
    Part(Box<OperationPage>),
    /// The region has no part of this operation (the closure did not reach it).
    NoPart,
    /// The region could not be asked now.
    Unreachable,
}

/// The operation as every region's parts make it up.
#[derive(Debug, Clone, PartialEq)]
pub struct OperationView {
    /// The origin's record (id, root, who asked, when), with the counters
    /// summed over every part, the state of the whole and its end time.
    pub operation: Operation,
    /// True when every part is finished and every region could be read.
    pub done: bool,
    /// This page of outcomes, parts in region order.
    pub outcomes: Vec<Outcome>,
    /// Where the next page starts; None on the last page.
    pub next: Option<OutcomesCursor>,
    /// Regions whose part could not be read.
    pub unreachable: Vec<String>,
    /// Each region's own counters, from the same reads as the sum, in
    /// region order: a region with a part, and a region that could not be
    /// read (`reachable: false`, zero counters). A region without a part is
    /// not listed, so this holds at most one entry per region.
    pub regions: Vec<RegionProgress>,
}

/// One region's part of an operation's progress, as [`OperationView`] lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionProgress {
    /// The region whose part this is.
    pub region: String,
    /// The part's counters (zero when the region could not be read).
    pub progress: Progress,
    /// An undelete's part: members and references it brought back.
    pub restored: u64,
    /// An undelete's part: what it could not bring back.
    pub not_restored: u64,
    /// The part's state; None when the region could not be read.
    pub state: Option<OperationState>,
    /// False when the answering node could not read this region's part.
    pub reachable: bool,
}

impl OperationView {
    /// Names regions that could not be asked although the page went past
    /// them (the node decided they hold no part: see `Node::operation`):
    /// listed as unreachable and among the regions, both in region order.
    pub fn add_unreachable(&mut self, regions: impl IntoIterator<Item = String>) {
        for region in regions {
            if !self.unreachable.contains(&region) {
                self.unreachable.push(region.clone());
            }
            if !self.regions.iter().any(|r| r.region == region) {
                self.regions.push(RegionProgress::unreachable(region));
            }
        }
        self.unreachable.sort();
        self.regions.sort_by(|a, b| a.region.cmp(&b.region));
    }
}

impl RegionProgress {
    fn unreachable(region: String) -> Self {
        Self {
            region,
            progress: Progress::default(),
            restored: 0,
            not_restored: 0,
            state: None,
            reachable: false,
        }
    }
}

/// Drives the reading of an operation's parts for one page (see the module doc).
#[derive(Debug)]
pub struct OperationAssembler {
    id: OperationId,
    /// Every region of the cluster, sorted: the order of the parts.
    order: Vec<String>,
    /// Index in `order` of the part the page starts in, and the position in it.
    start_at: usize,
    start_after: Option<ResourceName>,
    /// The next region to ask.
    at: usize,
    /// Outcomes the page still needs.
    left: usize,
    /// Still filling the page (false once it is full, or ended early).
    filling: bool,
    outcomes: Vec<Outcome>,
    next: Option<OutcomesCursor>,
    parts: Vec<(String, Operation)>,
    unreachable: Vec<String>,
    /// The request handed out and not yet answered.
    asked: Option<PartRequest>,
}

impl OperationAssembler {
    /// A page of `page_size` outcomes of operation `id` from the cursor
    /// (None: the first page), over the parts of `regions` (every region of
    /// the cluster, this one included, in any order). A cursor naming a
    /// region outside the cluster is INVALID_ARGUMENT on `outcomes_page_token`.
    pub fn new(
        id: OperationId,
        regions: impl IntoIterator<Item = String>,
        cursor: Option<OutcomesCursor>,
        page_size: usize,
    ) -> Result<Self, CoreError> {
        let mut order: Vec<String> = regions.into_iter().collect();
        order.sort();
        order.dedup();
        let (start_at, start_after) = match cursor {
            None => (0, None),
            Some(c) => {
                let at = order.iter().position(|r| *r == c.region).ok_or_else(|| {
                    CoreError::invalid(
                        "outcomes_page_token",
                        format!("names region {:?}, which is not part of this cluster", c.region),
                    )
                })?;
                (at, c.after)
            }
        };
        Ok(Self {
            id,
            order,
            start_at,
            start_after,
            at: 0,
            left: page_size,
            filling: page_size > 0,
            outcomes: Vec::new(),
            next: None,
            parts: Vec::new(),
            unreachable: Vec::new(),
            asked: None,
        })
    }

    /// The next part to read, or None when every region has been asked.
    /// Each request must be answered before the next is asked for: how many
    /// outcomes a part is asked for depends on what the previous ones gave.
    pub fn next_request(&mut self) -> Option<PartRequest> {
        assert!(self.asked.is_none(), "a part request is still unanswered");
        let region = self.order.get(self.at)?.clone();
        // The outcomes the page still needs (from the cursor's position in
        // the first part); once the page is full, one, to learn whether the
        // next page starts here; else none (its counters only).
        let (want, after) = if !self.filling || self.at < self.start_at {
            (0, None)
        } else if self.left == 0 {
            (1, None)
        } else if self.at == self.start_at {
            (self.left, self.start_after.clone())
        } else {
            (self.left, None)
        };
        let request = PartRequest { region, want, after };
        self.asked = Some(request.clone());
        Some(request)
    }

    /// Takes the answer to the last [`Self::next_request`].
    pub fn answer(&mut self, answer: PartAnswer) {
        let Some(PartRequest { region, want, after }) = self.asked.take() else {
            panic!("an answer to no part request");
        };
        self.at += 1;
        match answer {
            PartAnswer::Part(page) => {
                let mut page = *page;
                if want > 0 && self.left == 0 {
                    // The probe of a full page: does the next page start here?
                    if !page.outcomes.is_empty() {
                        self.end_page(OutcomesCursor {
                            region: region.clone(),
                            after: None,
                        });
                    }
                } else if want > 0 {
                    // A part that returned more than it was asked for (a
                    // peer's answer, so it cannot be trusted) is cut where
                    // the page is full, and the next page resumes there.
                    if page.outcomes.len() > self.left {
                        page.outcomes.truncate(self.left);
                        page.next = page.outcomes.last().map(|o| o.resource.name.clone());
                    }
                    self.left -= page.outcomes.len();
                    self.outcomes.append(&mut page.outcomes);
                    if let Some(after) = page.next.take() {
                        self.end_page(OutcomesCursor {
                            region: region.clone(),
                            after: Some(after),
                        });
                    }
                }
                self.parts.push((region, page.operation));
            }
            PartAnswer::NoPart => {}
            PartAnswer::Unreachable => {
                if want > 0 {
                    self.end_page(OutcomesCursor {
                        region: region.clone(),
                        after,
                    });
                }
                self.unreachable.push(region);
            }
        }
    }

    fn end_page(&mut self, next: OutcomesCursor) {
        self.next = Some(next);
        self.filling = false;
    }

    /// Merges the parts read. NOT_FOUND when no region has a part; UNAVAILABLE
    /// (naming them) when none was found but some regions could not be asked.
    pub fn finish(self) -> Result<OperationView, CoreError> {
        assert!(self.asked.is_none(), "finished with a part request unanswered");
        if self.parts.is_empty() {
            return Err(if self.unreachable.is_empty() {
                CoreError::OperationNotFound(self.id.to_string())
            } else {
                CoreError::RegionUnavailable {
                    region: self.unreachable.join(", "),
                    reason: format!(
                        "operation {} is not known here and these regions could not be asked",
                        self.id
                    ),
                }
            });
        }
        // The origin's part (its root is its own) gives the operation's header.
        let lead = self
            .parts
            .iter()
            .position(|(region, op)| op.root.name.region() == region)
            .unwrap_or(0);
        let mut merged = self.parts[lead].1.clone();
        let mut progress = Progress::default();
        let mut any_running = false;
        let mut any_failed = false;
        let mut any_cancelled = false;
        for (_, part) in &self.parts {
            progress.deleted += part.progress.deleted;
            progress.unset += part.progress.unset;
            progress.pending += part.progress.pending;
            progress.blocked += part.progress.blocked;
            progress.failed += part.progress.failed;
            any_running |= part.state == OperationState::Running;
            any_failed |= part.state == OperationState::Failed;
            any_cancelled |= part.state == OperationState::Cancelled;
            merged.end_time = merged.end_time.max(part.end_time);
        }
        // A region that could not be asked holds the operation open only
        // if it may hold a part: it is the root's, or a part that was read
        // reached it (see `crate::closure`: every region with a part is in
        // some part's `reached`). A stopped region the cascade never
        // touched is listed as unreachable, but the operation is done.
        let root_region = merged.root.name.region().to_owned();
        let touched: std::collections::BTreeSet<&str> = self
            .parts
            .iter()
            .flat_map(|(_, part)| part.reached.iter().map(String::as_str))
            .collect();
        let waits_on_unreachable = self
            .unreachable
            .iter()
            .any(|r| *r == root_region || touched.contains(r.as_str()));
        let done = !any_running && !waits_on_unreachable;
        merged.state = if any_cancelled {
            // Cancelled in one region is cancelled everywhere (the root's
            // region tells the others); members already DELETING finish.
            OperationState::Cancelled
        } else if !done {
            OperationState::Running
        } else if any_failed {
            OperationState::Failed
        } else {
            OperationState::Succeeded
        };
        if !done {
            merged.end_time = None;
        }
        merged.progress = progress;
        // Parts are read in region order, and an unreachable region is
        // asked once: one entry per region, sorted.
        let mut regions: Vec<RegionProgress> = self
            .parts
            .iter()
            .map(|(region, part)| RegionProgress {
                region: region.clone(),
                progress: part.progress,
                restored: part.undelete.as_ref().map_or(0, |u| u.restored),
                not_restored: part.undelete.as_ref().map_or(0, |u| u.not_restored),
                state: Some(part.state),
                reachable: true,
            })
            .chain(self.unreachable.iter().cloned().map(RegionProgress::unreachable))
            .collect();
        regions.sort_by(|a, b| a.region.cmp(&b.region));
        if let Some(u) = merged.undelete.as_mut() {
            // An undelete's counters, summed over its parts like a deletion's.
            let parts = self.parts.iter().filter_map(|(_, p)| p.undelete.as_deref());
            (u.restored, u.not_restored) = parts.fold((0, 0), |(r, n), p| (r + p.restored, n + p.not_restored));
        }
        Ok(OperationView {
            operation: merged,
            done,
            outcomes: self.outcomes,
            next: self.next,
            unreachable: self.unreachable,
            regions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{OutcomeAction, RefTarget, Timestamp};
    use crate::name::Uid;

    fn name(s: &str) -> ResourceName {
        ResourceName::parse(s).expect("test name")
    }

    fn target(s: &str) -> RefTarget {
        RefTarget {
            name: name(s),
            uid: Uid(uuid::Uuid::from_u128(1)),
        }
    }

    fn op(root: &str, state: OperationState, deleted: u64) -> Operation {
        Operation {
            id: OperationId(uuid::Uuid::from_u128(7)),
            root: target(root),
            requested_by: String::new(),
            cascade: true,
            state,
            progress: Progress {
                deleted,
                ..Progress::default()
            },
            create_time: Timestamp(1),
            end_time: (state != OperationState::Running).then_some(Timestamp(deleted + 10)),
            // The root's part in ra handed work to rb and rc.
            reached: ["rb", "rc"].map(String::from).into(),
            changes: 0,
            closure_confirmed: false,
            controls: None,
            undelete: None,
            principal: Default::default(),
            retain_ms: 0,
        }
    }

    /// A region's part holding `names` as outcomes, answering a request like a node does.
    fn serve(request: &PartRequest, root: &str, state: OperationState, names: &[&str]) -> PartAnswer {
        let all: Vec<Outcome> = names
            .iter()
            .map(|n| Outcome {
                resource: target(n),
                action: OutcomeAction::Deleted,
                time: Timestamp(2),
            })
            .collect();
        let from = all
            .iter()
            .position(|o| request.after.as_ref().is_none_or(|a| o.resource.name > *a))
            .unwrap_or(all.len());
        let rest = &all[from..];
        let page: Vec<Outcome> = rest.iter().take(request.want).cloned().collect();
        let next = (rest.len() > request.want && request.want > 0).then(|| page[page.len() - 1].resource.name.clone());
        PartAnswer::Part(Box::new(OperationPage {
            operation: op(root, state, names.len() as u64),
            outcomes: page,
            next,
        }))
    }

    fn read_all_pages(page_size: usize, unreachable_once: Option<&str>) -> (Vec<String>, Vec<OperationView>) {
        let parts: [(&str, &[&str]); 3] = [
            ("ra", &["ra/port/a1", "ra/port/a2", "ra/port/a3"]),
            ("rb", &[]),
            ("rc", &["rc/port/c1", "rc/port/c2"]),
        ];
        let mut failed_once = unreachable_once.map(str::to_owned);
        let mut cursor = None;
        let mut seen = Vec::new();
        let mut views = Vec::new();
        for _ in 0..20 {
            let mut a = OperationAssembler::new(
                OperationId(uuid::Uuid::from_u128(7)),
                ["rc", "ra", "rb"].map(String::from),
                cursor.clone(),
                page_size,
            )
            .expect("cursor");
            while let Some(req) = a.next_request() {
                // The region fails the first time it is asked for outcomes.
                let answer = if req.want > 0 && failed_once.as_deref() == Some(req.region.as_str()) {
                    failed_once = None;
                    PartAnswer::Unreachable
                } else if req.region == "rb" {
                    PartAnswer::NoPart
                } else {
                    let (_, names) = parts.iter().find(|(r, _)| *r == req.region).expect("region");
                    serve(&req, "ra/project/p", OperationState::Succeeded, names)
                };
                a.answer(answer);
            }
            let view = a.finish().expect("view");
            seen.extend(view.outcomes.iter().map(|o| o.resource.name.to_string()));
            cursor = view.next.clone();
            views.push(view);
            if cursor.is_none() {
                break;
            }
        }
        (seen, views)
    }

    #[test]
    fn every_outcome_comes_once_across_parts_whatever_the_page_size() {
        for page_size in 1..=6 {
            let (seen, views) = read_all_pages(page_size, None);
            assert_eq!(
                seen,
                ["ra/port/a1", "ra/port/a2", "ra/port/a3", "rc/port/c1", "rc/port/c2"],
                "page size {page_size}"
            );
            let last = views.last().expect("a page");
            assert!(last.done && last.operation.state == OperationState::Succeeded);
            assert_eq!(last.operation.progress.deleted, 5, "counters summed over the parts");
        }
    }

    #[test]
    fn an_unreachable_part_ends_the_page_before_it_and_loses_nothing() {
        let (seen, views) = read_all_pages(2, Some("rc"));
        assert_eq!(
            seen,
            ["ra/port/a1", "ra/port/a2", "ra/port/a3", "rc/port/c1", "rc/port/c2"]
        );
        let cut = views
            .iter()
            .find(|v| !v.unreachable.is_empty())
            .expect("a page with rc unreachable");
        assert!(!cut.done && cut.operation.state == OperationState::Running && cut.operation.end_time.is_none());
        assert_eq!(cut.next.as_ref().map(|c| c.region.as_str()), Some("rc"));
    }

    #[test]
    fn an_unreachable_region_the_cascade_never_touched_is_named_but_does_not_hold_the_operation_open() {
        let mut a = OperationAssembler::new(
            OperationId(uuid::Uuid::from_u128(7)),
            ["ra", "rb", "rc", "rd"].map(String::from),
            None,
            10,
        )
        .expect("new");
        while let Some(req) = a.next_request() {
            let answer = match req.region.as_str() {
                "ra" => serve(&req, "ra/project/p", OperationState::Succeeded, &["ra/port/a1"]),
                "rc" => serve(&req, "ra/project/p", OperationState::Succeeded, &["rc/port/c1"]),
                "rb" => PartAnswer::NoPart,
                _ => PartAnswer::Unreachable, // rd: stopped, and in nobody's `reached`
            };
            a.answer(answer);
        }
        let view = a.finish().expect("view");
        assert_eq!(view.unreachable, ["rd"]);
        assert!(view.done, "{view:?}");
        assert_eq!(view.operation.state, OperationState::Succeeded);
    }

    #[test]
    fn each_region_has_its_own_counters_which_sum_to_the_whole_and_an_unread_region_is_named_unreachable() {
        let mut a = OperationAssembler::new(
            OperationId(uuid::Uuid::from_u128(7)),
            ["rd", "rc", "rb", "ra"].map(String::from),
            None,
            10,
        )
        .expect("new");
        while let Some(req) = a.next_request() {
            let answer = match req.region.as_str() {
                "ra" => serve(
                    &req,
                    "ra/project/p",
                    OperationState::Running,
                    &["ra/port/a1", "ra/port/a2"],
                ),
                "rb" => PartAnswer::Unreachable,
                "rc" => serve(&req, "ra/project/p", OperationState::Succeeded, &["rc/port/c1"]),
                _ => PartAnswer::NoPart,
            };
            a.answer(answer);
        }
        let mut view = a.finish().expect("view");
        // The node names a region it went past (decided to hold no part).
        view.add_unreachable(["re".to_owned()]);
        let listed: Vec<(&str, u64, bool)> = view
            .regions
            .iter()
            .map(|r| (r.region.as_str(), r.progress.deleted, r.reachable))
            .collect();
        assert_eq!(
            listed,
            [("ra", 2, true), ("rb", 0, false), ("rc", 1, true), ("re", 0, false)],
            "rd had no part: not listed"
        );
        let sum: u64 = view.regions.iter().map(|r| r.progress.deleted).sum();
        assert_eq!(sum, view.operation.progress.deleted);
        assert_eq!(view.regions[0].state, Some(OperationState::Running));
        assert_eq!(view.regions[1].state, None);
        assert_eq!(view.unreachable, ["rb", "re"]);
    }

    #[test]
    fn no_part_anywhere_is_not_found_and_unreadable_regions_make_it_unavailable() {
        let mut a =
            OperationAssembler::new(OperationId(uuid::Uuid::from_u128(7)), ["ra".to_owned()], None, 10).expect("new");
        let _ = a.next_request();
        a.answer(PartAnswer::NoPart);
        assert!(matches!(a.finish(), Err(CoreError::OperationNotFound(_))));
        let mut a =
            OperationAssembler::new(OperationId(uuid::Uuid::from_u128(7)), ["ra".to_owned()], None, 10).expect("new");
        let _ = a.next_request();
        a.answer(PartAnswer::Unreachable);
        assert!(matches!(a.finish(), Err(CoreError::RegionUnavailable { .. })));
    }

    #[test]
    fn a_cursor_naming_a_region_outside_the_cluster_is_refused() {
        let cursor = OutcomesCursor {
            region: "zz".into(),
            after: None,
        };
        let err = OperationAssembler::new(
            OperationId(uuid::Uuid::from_u128(7)),
            ["ra".to_owned()],
            Some(cursor),
            10,
        )
        .unwrap_err();
        assert!(
            matches!(err, CoreError::InvalidArgument { ref field, .. } if field == "outcomes_page_token"),
            "{err:?}"
        );
    }

    #[test]
    fn a_running_part_keeps_the_whole_running() {
        let mut a = OperationAssembler::new(
            OperationId(uuid::Uuid::from_u128(7)),
            ["ra", "rb"].map(String::from),
            None,
            0,
        )
        .expect("new");
        while let Some(req) = a.next_request() {
            let state = if req.region == "rb" {
                OperationState::Running
            } else {
                OperationState::Failed
            };
            a.answer(serve(&req, "ra/project/p", state, &[]));
        }
        let view = a.finish().expect("view");
        assert!(!view.done);
        assert_eq!(view.operation.state, OperationState::Running);
        assert!(view.outcomes.is_empty() && view.next.is_none());
    }
}
