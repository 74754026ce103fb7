//! Paging an operation's outcomes across regions' parts, as a property.
//!
//! A client pages through an operation with any page size, asking any node
//! each time, while regions come and go. Whatever happens, reading until no
//! cursor is left must return every outcome of every part exactly once, in
//! the parts' order, and a page must say the operation is done only when
//! every region that may hold a part was read (a region the root's part
//! never reached holds none: see `cascade_core::closure`). `OperationAssembler` decides what each node
//! asks and how the answers merge; the parts here answer like
//! `Node::local_operation` does (outcomes in name order after a cursor, a
//! continuation when more are left).

use cascade_core::model::{Operation, OperationState, Outcome, OutcomeAction, Progress, RefTarget, Timestamp};
use cascade_core::operation_view::{OperationAssembler, OperationPage, PartAnswer, PartRequest};
use cascade_core::{OperationId, ResourceName, Uid};
use proptest::prelude::*;

const REGIONS: [&str; 4] = ["ra", "rb", "rc", "rd"];

fn id() -> OperationId {
    OperationId(uuid::Uuid::from_u128(42))
}

fn outcome(region: &str, i: usize) -> Outcome {
    Outcome {
        resource: RefTarget {
            name: ResourceName::parse(&format!("{region}/port/p{i:03}")).expect("name"),
            uid: Uid(uuid::Uuid::from_u128(i as u128 + 1)),
        },
        action: OutcomeAction::Deleted,
        time: Timestamp(5),
    }
}

/// A region's part as its node answers a request.
fn answer(
    outcomes: &[Outcome],
    state: OperationState,
    reached: &std::collections::BTreeSet<String>,
    req: &PartRequest,
) -> PartAnswer {
    let rest: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| req.after.as_ref().is_none_or(|a| o.resource.name > *a))
        .collect();
    let page: Vec<Outcome> = rest.iter().take(req.want).map(|o| (*o).clone()).collect();
    let next = (req.want > 0 && rest.len() > req.want).then(|| page[page.len() - 1].resource.name.clone());
    PartAnswer::Part(Box::new(OperationPage {
        operation: Operation {
            id: id(),
            root: outcome("ra", 0).resource,
            requested_by: "test".into(),
            cascade: true,
            state,
            progress: Progress {
                deleted: outcomes.len() as u64,
                ..Progress::default()
            },
            create_time: Timestamp(1),
            end_time: (state != OperationState::Running).then_some(Timestamp(9)),
            reached: reached.clone(),
            changes: 0,
            closure_confirmed: false,
            controls: None,
            undelete: None,
            principal: Default::default(),
            retain_ms: 0,
        },
        outcomes: page,
        next,
    }))
}

proptest! {
    #[test]
    fn every_outcome_comes_exactly_once_whatever_the_pages_and_the_failures(
        sizes in proptest::collection::vec(0usize..6, 4),
        has_part in proptest::collection::vec(any::<bool>(), 4),
        page_size in 1usize..5,
        // For each page read, which region (if any) cannot be asked.
        failures in proptest::collection::vec(proptest::option::of(0usize..4), 40),
    ) {
        let parts: Vec<Vec<Outcome>> = REGIONS
            .iter()
            .zip(&sizes)
            .zip(&has_part)
            .map(|((r, n), has)| if *has || *r == "ra" { (0..*n).map(|i| outcome(r, i)).collect() } else { Vec::new() })
            .collect();
        let expected: Vec<String> = parts.iter().flatten().map(|o| o.resource.name.to_string()).collect();
        // The root's part (ra) handed work to every other region with a part.
        let holds_part = |i: usize| i == 0 || has_part[i];
        let reached: std::collections::BTreeSet<String> =
            (1..REGIONS.len()).filter(|i| holds_part(*i)).map(|i| REGIONS[i].to_owned()).collect();
        let nothing = std::collections::BTreeSet::new();
        let mut cursor = None;
        let mut seen = Vec::new();
        let mut pages = 0;
        loop {
            let down = failures.get(pages).copied().flatten();
            pages += 1;
            prop_assert!(pages < 200, "paging does not end");
            let mut a = OperationAssembler::new(id(), REGIONS.map(String::from), cursor.clone(), page_size)
                .expect("a cursor this assembler issued is valid");
            while let Some(req) = a.next_request() {
                let i = REGIONS.iter().position(|r| *r == req.region).expect("a known region");
                let reply = if down == Some(i) {
                    PartAnswer::Unreachable
                } else if !has_part[i] && i != 0 {
                    PartAnswer::NoPart
                } else {
                    answer(&parts[i], OperationState::Succeeded, if i == 0 { &reached } else { &nothing }, &req)
                };
                a.answer(reply);
            }
            let view = match a.finish() {
                Ok(view) => view,
                // Every region with a part was down: UNAVAILABLE, and the
                // client asks again with the same cursor.
                Err(cascade_core::CoreError::RegionUnavailable { .. }) if down.is_some() => continue,
                Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
            };
            prop_assert!(view.outcomes.len() <= page_size);
            // Done unless a region that may hold a part could not be
            // asked; one the cascade never reached is named but holds
            // nothing up (its outcomes: none).
            let waits = view
                .unreachable
                .iter()
                .any(|r| holds_part(REGIONS.iter().position(|x| x == r).expect("a known region")));
            prop_assert_eq!(view.done, !waits);
            seen.extend(view.outcomes.iter().map(|o| o.resource.name.to_string()));
            match view.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        prop_assert_eq!(seen, expected);
    }
}
