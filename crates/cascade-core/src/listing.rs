//! A listing of every region, sans-IO: where each region's listing stands,
//! and one merged page from what the regions answered.
//!
//! Each region pages its own resources by name with its own token (the
//! last name it returned, or the last it examined when a page ran out of
//! its scan budget). The node asks every region that is not finished for
//! a page at once, and [`merge_pages`] keeps the first `page_size` items by
//! name of all the answers and moves each region's position to what was
//! taken from it: after its last item taken, or to its own next token when
//! all of its page was taken. Since every region's positions only move
//! forward over its own name order, a resource present for the whole walk
//! is listed exactly once and one created or deleted meanwhile at most
//! once, whatever the pages' sizes.
//!
//! A region that does not answer is given up for the rest of the walk (so
//! paging ends) and named again on every later page.

use std::collections::BTreeMap;

use crate::limits::cut_stored;

/// Bytes of a given-up region's reason kept in the position (the page
/// token carries it, so later pages can name it again).
pub const MAX_GIVEN_UP_REASON_BYTES: usize = 120;

/// Where one region's listing stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionPosition {
    /// Nothing asked yet.
    Start,
    /// Continue with the region's own page token.
    After(String),
    /// Listed to the end.
    Done,
    /// It did not answer: not asked again, named on every page (why).
    GaveUp(String),
}

impl RegionPosition {
    /// Whether the region is still to be asked.
    pub fn is_open(&self) -> bool {
        matches!(self, RegionPosition::Start | RegionPosition::After(_))
    }

    /// The region's own token to ask with (empty: from its first item).
    pub fn token(&self) -> &str {
        match self {
            RegionPosition::After(t) => t,
            _ => "",
        }
    }
}

/// What one region answered for one page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionAnswer<T> {
    /// Its items in name order and its next token (`None`: the last page).
    Page {
        /// The items, in name order.
        items: Vec<T>,
        /// Its own token to continue with.
        next: Option<String>,
    },
    /// It did not answer (why, for a person).
    Unreachable(String),
}

/// One merged page: the first `page_size` items by name of every region's
/// answer, each region's position moved past what was taken from it.
/// `name` gives an item's name (also the token a region continues after).
/// A region without an answer keeps its position.
pub fn merge_pages<T>(
    positions: &mut BTreeMap<String, RegionPosition>,
    answers: BTreeMap<String, RegionAnswer<T>>,
    page_size: usize,
    name: impl Fn(&T) -> &str,
) -> Vec<T> {
    let mut candidates: Vec<(String, T)> = Vec::new();
    let mut offered: BTreeMap<String, (usize, Option<String>)> = BTreeMap::new();
    for (region, answer) in answers {
        match answer {
            RegionAnswer::Unreachable(why) => {
                positions.insert(
                    region,
                    RegionPosition::GaveUp(cut_stored(&why, MAX_GIVEN_UP_REASON_BYTES)),
                );
            }
            RegionAnswer::Page { items, next } => {
                offered.insert(region.clone(), (items.len(), next));
                candidates.extend(items.into_iter().map(|i| (region.clone(), i)));
            }
        }
    }
    candidates.sort_by(|(_, a), (_, b)| name(a).cmp(name(b)));
    candidates.truncate(page_size);
    let mut taken: BTreeMap<&str, (usize, &str)> = BTreeMap::new();
    for (region, item) in &candidates {
        let entry = taken.entry(region.as_str()).or_insert((0, ""));
        entry.0 += 1;
        entry.1 = name(item);
    }
    for (region, (count, next)) in offered {
        let position = match taken.get(region.as_str()) {
            // All of its page taken: its own token, or the end.
            Some((n, _)) if *n == count => next.map_or(RegionPosition::Done, RegionPosition::After),
            None if count == 0 => next.map_or(RegionPosition::Done, RegionPosition::After),
            // Part of it: after the last one taken.
            Some((_, last)) => RegionPosition::After((*last).to_owned()),
            // None of it: where it was.
            None => continue,
        };
        positions.insert(region, position);
    }
    candidates.into_iter().map(|(_, item)| item).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// A region's listing of `names` from its token: up to `size` names
    /// after it, examining at most `budget` (a page may come back short).
    fn region_page(names: &BTreeSet<String>, token: &str, size: usize, budget: usize) -> RegionAnswer<String> {
        let after: Vec<&String> = names.iter().filter(|n| n.as_str() > token).collect();
        let examined = after.len().min(budget);
        let items: Vec<String> = after[..examined].iter().take(size).map(|n| (*n).clone()).collect();
        let next = if items.len() == size && after.len() > size {
            items.last().cloned()
        } else if items.len() < size && examined < after.len() {
            Some(after[examined - 1].clone())
        } else {
            None
        };
        RegionAnswer::Page { items, next }
    }

    #[test]
    fn a_region_that_does_not_answer_is_given_up_and_the_others_end() {
        let mut positions: BTreeMap<String, RegionPosition> = ["a", "b"]
            .iter()
            .map(|r| ((*r).to_owned(), RegionPosition::Start))
            .collect();
        let answers = BTreeMap::from([
            (
                "a".to_owned(),
                RegionAnswer::Page {
                    items: vec!["a/k/1".to_owned()],
                    next: None,
                },
            ),
            (
                "b".to_owned(),
                RegionAnswer::Unreachable("did not answer within 3s".to_owned()),
            ),
        ]);
        let page = merge_pages(&mut positions, answers, 10, |s: &String| s.as_str());
        assert_eq!(page, vec!["a/k/1".to_owned()]);
        assert_eq!(positions["a"], RegionPosition::Done);
        assert_eq!(
            positions["b"],
            RegionPosition::GaveUp("did not answer within 3s".to_owned())
        );
        assert!(!positions.values().any(RegionPosition::is_open));
    }

    proptest! {
        /// Every name of every region comes exactly once and in each
        /// region's order, whatever the page size and scan budget.
        #[test]
        fn paging_lists_every_name_once(
            regions in prop::collection::vec(prop::collection::btree_set(0u16..400, 0..60), 1..4),
            size in 1usize..20,
            budget in 1usize..30,
        ) {
            let names: Vec<BTreeSet<String>> = regions.iter().enumerate()
                .map(|(r, ids)| ids.iter().map(|i| format!("r{r}/k/{i:04}")).collect())
                .collect();
            let mut positions: BTreeMap<String, RegionPosition> =
                (0..names.len()).map(|r| (format!("r{r}"), RegionPosition::Start)).collect();
            let mut seen = Vec::new();
            for _ in 0..10_000 {
                if !positions.values().any(RegionPosition::is_open) { break }
                let answers = positions.iter().filter(|(_, p)| p.is_open()).map(|(region, p)| {
                    let r: usize = region[1..].parse().unwrap();
                    (region.clone(), region_page(&names[r], p.token(), size, budget))
                }).collect();
                let page = merge_pages(&mut positions, answers, size, |s: &String| s.as_str());
                prop_assert!(page.len() <= size);
                seen.extend(page);
            }
            prop_assert!(!positions.values().any(RegionPosition::is_open), "paging did not end");
            let expected: Vec<String> = names.iter().flatten().cloned().collect();
            let mut got = seen.clone();
            got.sort();
            prop_assert_eq!(got, expected);
        }
    }
}
