//! The ListDeleting reader's tests: an owner's pages served from a queue.

use std::cell::RefCell;
use std::collections::VecDeque;

use super::*;

/// A uid that sorts by `n`.
fn uid(n: u128) -> String {
    uuid::Uuid::from_u128(n).to_string()
}

fn page(uids: &[u128], next: Option<u128>, revision: u64) -> v1::ListDeletingResponse {
    v1::ListDeletingResponse {
        deleting: uids
            .iter()
            .map(|&n| v1::DeletingEntry {
                resource: Some(v1::ObjectRef {
                    name: format!("ra/project/p{n}"),
                    uid: uid(n),
                    dangling: false,
                }),
                operation_id: uid(1000 + n),
                no_cascade: false,
                forced: false,
                principal: None,
                retain_ms: 0,
            })
            .collect(),
        revision,
        next_page_token: next.map(uid).unwrap_or_default(),
    }
}

/// The owner's pages, served in order; the tokens asked for are kept.
/// Asked once more than it has pages, it fails the test: the reader
/// would otherwise go on for ever.
struct Owner {
    pages: RefCell<VecDeque<v1::ListDeletingResponse>>,
    asked: RefCell<Vec<String>>,
}

impl Owner {
    fn new(pages: Vec<v1::ListDeletingResponse>) -> Self {
        Self {
            pages: RefCell::new(pages.into()),
            asked: RefCell::default(),
        }
    }

    async fn read(&self, max_rows: usize) -> Result<(Vec<RemoteDeleting>, u64), RemoteError> {
        read_deleting_pages("ra", max_rows, true, |token| {
            self.asked.borrow_mut().push(token);
            let next = self.pages.borrow_mut().pop_front();
            let asked = self.asked.borrow().len();
            async move { Ok(next.unwrap_or_else(|| panic!("page {asked} asked for: the reader does not stop"))) }
        })
        .await
    }
}

fn names(listing: &[RemoteDeleting]) -> Vec<String> {
    listing.iter().map(|d| d.target.name.to_string()).collect()
}

fn refused(answer: Result<(Vec<RemoteDeleting>, u64), RemoteError>, says: &str) {
    match answer {
        Err(RemoteError::BadAnswer { region, rpc, message }) => {
            assert_eq!((region.as_str(), rpc), ("ra", "ListDeleting"));
            assert!(message.contains(says), "{message:?} does not say {says:?}");
        }
        other => panic!("expected a BadAnswer saying {says:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_listing_is_read_to_its_last_page_with_the_first_pages_revision() {
    let owner = Owner::new(vec![
        page(&[1, 2], Some(2), 40),
        page(&[5], Some(5), 41),
        page(&[9], None, 42),
    ]);
    let (listing, revision) = owner.read(MAX_LIST_DELETING_ROWS).await.expect("the whole listing");
    assert_eq!(
        names(&listing),
        ["ra/project/p1", "ra/project/p2", "ra/project/p5", "ra/project/p9"]
    );
    assert_eq!(revision, 40);
    assert_eq!(*owner.asked.borrow(), [String::new(), uid(2), uid(5)]);
}

/// A resync acts for each deletion's principal, as its DELETING event
/// would have (the listing used to carry none: anonymous, refused).
#[tokio::test]
async fn a_resync_listing_carries_each_deletions_principal() {
    use cascade_core::auth::{Principal, Via};
    let mut listed = page(&[1, 2], None, 40);
    let (id, groups) = ("admin".to_owned(), vec!["admins".to_owned()]);
    let admin = Principal {
        id,
        groups,
        via: Via::Token,
    };
    listed.deleting[0].principal = Some(crate::api::principal::to_wire(&admin));
    let owner = Owner::new(vec![listed]);
    let (listing, _) = owner.read(MAX_LIST_DELETING_ROWS).await.expect("the whole listing");
    let principals: Vec<Principal> = listing.into_iter().map(|d| d.principal).collect();
    assert_eq!(principals, [admin, Principal::anonymous()]);
}

/// A token that does not advance used to end the listing there, as if
/// it were the last page: the DELETING resources after it were never
/// seen by this region.
#[tokio::test]
async fn a_next_token_that_repeats_fails_the_listing_instead_of_ending_it() {
    let owner = Owner::new(vec![
        page(&[1, 2], Some(2), 40),
        page(&[2], Some(2), 40),
        page(&[7], None, 40),
    ]);
    refused(owner.read(MAX_LIST_DELETING_ROWS).await, "does not advance");
}

/// A token that goes back (A, B, A) used to be followed for ever.
#[tokio::test]
async fn a_next_token_that_goes_back_fails_the_listing_instead_of_looping() {
    let cycle = || vec![page(&[1], Some(1), 40), page(&[3], Some(3), 40)];
    let owner = Owner::new([cycle(), cycle(), cycle(), cycle()].concat());
    refused(owner.read(MAX_LIST_DELETING_ROWS).await, "does not advance");
    assert_eq!(
        owner.asked.borrow().len(),
        3,
        "refused at the first token that went back"
    );
}

#[tokio::test]
async fn a_token_that_is_no_uid_or_an_empty_page_that_is_not_the_last_fails_the_listing() {
    let mut garbage = page(&[1], None, 40);
    garbage.next_page_token = "x".repeat(10_000);
    let owner = Owner::new(vec![garbage]);
    refused(owner.read(MAX_LIST_DELETING_ROWS).await, "is not a uid");
    assert_eq!(owner.asked.borrow().len(), 1);

    let owner = Owner::new(vec![
        page(&[1], Some(1), 40),
        page(&[], Some(4), 40),
        page(&[5], None, 40),
    ]);
    refused(owner.read(MAX_LIST_DELETING_ROWS).await, "holds no entry");
}

/// Tokens that keep advancing cannot keep the reader going past its
/// bound on entries, which bounds the pages too.
#[tokio::test]
async fn a_listing_longer_than_its_bound_is_refused() {
    let pages = (1..=20).map(|n| page(&[n], Some(n), 40)).collect();
    let owner = Owner::new(pages);
    refused(owner.read(10).await, "more than 10 entries");
    assert_eq!(owner.asked.borrow().len(), 11);
}
