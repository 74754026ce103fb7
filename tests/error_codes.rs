//! The error-code contract (README, "Error codes"): one test per row, each
//! asserting the gRPC code and the `cascade.v1.ErrorDetails`. Rows about a
//! named resource send the same call to its owner and to the other nodes
//! (which forward it, or resolve a reference at the owner) and require the
//! same code, message and details from all of them.
//!
//! Size: one file of about 900 lines on purpose: it is README's table, a
//! test per row in the table's order, over shared helpers that send one
//! call through every node and compare the answers.

// Test code, not a node: poll deadlines and elapsed times are real time,
// and made-up ids need no IdSource (clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use cascade_client::{Client, ClientError};
use cascade_proto::v1::{self, ErrorReason};
use cascade_tls::DevPki;
use futures::StreamExt;
use prost::Message;
use support::*;

const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

/// What a client can act on in a refusal.
#[derive(Debug, Clone, PartialEq)]
struct Refusal {
    code: tonic::Code,
    message: String,
    details: Option<v1::ErrorDetails>,
}

impl Refusal {
    fn of(s: &tonic::Status) -> Self {
        Self {
            code: s.code(),
            message: s.message().to_owned(),
            details: cascade_proto::error_details(s),
        }
    }

    fn details(&self) -> v1::ErrorDetails {
        self.details
            .clone()
            .unwrap_or_else(|| panic!("no ErrorDetails in {self:?}"))
    }

    fn reason(&self) -> ErrorReason {
        ErrorReason::try_from(self.details().reason).unwrap_or(ErrorReason::Unspecified)
    }

    /// The name and uid of `ErrorDetails.resource`.
    fn resource(&self) -> (String, String) {
        let r = self.details().resource.unwrap_or_default();
        (r.name, r.uid)
    }
}

fn refusal<T: Debug>(what: &str, result: Result<T, ClientError>) -> Refusal {
    match result {
        Ok(v) => panic!("{what}: expected a refusal, got {v:?}"),
        Err(ClientError::Status(s)) => Refusal::of(&s),
        Err(e) => panic!("{what}: not a gRPC status: {e}"),
    }
}

/// Sends `call` through every node of `c` and asserts that every node
/// answers the same refusal; returns it.
async fn same_from_every_node<T, F, Fut>(c: &Cluster, what: &str, call: F) -> Refusal
where
    T: Debug,
    F: Fn(Client) -> Fut,
    Fut: Future<Output = Result<T, ClientError>>,
{
    let mut first: Option<(String, Refusal)> = None;
    for region in REGIONS {
        let got = refusal(
            &format!("{what} through {region}"),
            call(c.client(region).clone()).await,
        );
        match &first {
            None => first = Some((region.to_owned(), got)),
            Some((r0, want)) => assert_eq!(&got, want, "{what}: {region} answered differently from {r0}"),
        }
    }
    first.expect("three regions").1
}

/// A refusal that must be the same whichever of several requests (one per
/// referrer region) and whichever node the request is sent to.
async fn same_for_every_referrer<T, F, Fut>(c: &Cluster, what: &str, call: F) -> Refusal
where
    T: Debug,
    F: Fn(&'static str, Client) -> Fut,
    Fut: Future<Output = Result<T, ClientError>>,
{
    let mut first: Option<(String, Refusal)> = None;
    for referrer in REGIONS {
        for via in REGIONS {
            let label = format!("{what}: referrer in {referrer}, sent to {via}");
            let got = refusal(&label, call(referrer, c.client(via).clone()).await);
            match &first {
                None => first = Some((label, got)),
                Some((l0, want)) => assert_eq!(&got, want, "{label} differs from {l0}"),
            }
        }
    }
    first.expect("nine calls").1
}

fn with_uid(mut s: v1::ResourceSpec, uid: &str) -> v1::ResourceSpec {
    s.refs[0].targets[0].uid = uid.to_owned();
    s
}

fn with_finalizer(mut s: v1::ResourceSpec) -> v1::ResourceSpec {
    s.finalizers = vec!["test/hold".into()];
    s
}

/// us-east/project/p and us-east/network/n on it, `n` with a finalizer
/// so that, deleted, it stays DELETING.
async fn us_east_network(c: &Cluster, finalizer: bool) -> v1::Resource {
    let network = spec_in("us-east/network/n", &[("project", &["us-east/project/p"])]);
    let network = if finalizer { with_finalizer(network) } else { network };
    let created = c
        .client("us-east")
        .batch_create(vec![spec_in("us-east/project/p", &[]), network])
        .await
        .unwrap();
    created[1].clone()
}

/// Deletes us-east/network/n and waits until it reads DELETING.
async fn hold_deleting(c: &Cluster) {
    c.client("us-east")
        .delete(delete_req("us-east/network/n", false))
        .await
        .unwrap();
    let n = c.client("us-east").get("us-east/network/n").await.unwrap();
    assert_eq!(state(&n), v1::ResourceState::Deleting, "{n:?}");
}

// ---------------------------------------------------------------------------
// INVALID_ARGUMENT
// ---------------------------------------------------------------------------

/// A list reference's element is `refs.ports[0]` whichever node decided
/// (the owner's core for a local target, the node resolving a remote one),
/// a single reference `refs.network`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_field_is_invalid_argument_naming_it_the_same_from_every_node() {
    let c = start_cluster(&REGIONS).await;
    us_east_network(&c, false).await;
    let cases: Vec<(&str, v1::ResourceSpec, &str)> = vec![
        // An element in a region that is not part of the cluster (resolved
        // by the referrer's owner before anything is written).
        (
            "an unknown region in a list",
            spec_in("us-east/port_group/g", &[("ports", &["mars/port/x"])]),
            "refs.ports[0]",
        ),
        // An element of the wrong kind (the core).
        (
            "a wrong kind in a list",
            spec_in("us-east/port_group/g", &[("ports", &["us-east/network/n"])]),
            "refs.ports[0]",
        ),
        (
            "an unknown region in a single reference",
            spec_in("us-east/port/q", &[("network", &["mars/network/x"])]),
            "refs.network",
        ),
        (
            "a malformed name in a single reference",
            spec_in("us-east/port/q", &[("network", &["not a name"])]),
            "refs.network",
        ),
        // A target's uid that is no uid (decoded before the core runs).
        (
            "a bad uid in a single reference",
            with_uid(spec_in("us-east/port/q", &[("network", &["us-east/network/n"])]), "xyz"),
            "refs.network.uid",
        ),
        (
            "a bad uid in a list",
            with_uid(
                spec_in("us-east/port_group/g", &[("ports", &["us-east/port/x"])]),
                "xyz",
            ),
            "refs.ports[0].uid",
        ),
    ];
    for (what, s, field) in cases {
        let r = same_from_every_node(&c, what, |client| {
            let s = s.clone();
            async move { client.create(s).await }
        })
        .await;
        assert_eq!(r.code, tonic::Code::InvalidArgument, "{what}: {r:?}");
        assert_eq!(r.reason(), ErrorReason::InvalidField, "{what}: {r:?}");
        assert_eq!(r.details().field, field, "{what}: {r:?}");
        assert!(r.message.starts_with(&format!("{field}: ")), "{what}: {r:?}");
    }
    let r = same_from_every_node(&c, "a malformed name", |client| async move {
        client.get("us-east/network").await
    })
    .await;
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::InvalidArgument, ErrorReason::InvalidField),
        "{r:?}"
    );
    assert_eq!(r.details().field, "name", "{r:?}");
}

/// Bytes that are no protobuf message: INVALID_ARGUMENT (tonic-prost said
/// INTERNAL), on both services of every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_request_bytes_are_invalid_argument_on_both_services_of_every_node() {
    let c = start_cluster(&REGIONS).await;
    // Field 1 (a string) announcing 127 bytes that are not there; then a
    // string that is not UTF-8.
    let garbage: [&[u8]; 2] = [&[0x0a, 0x7f, 0x01], &[0x0a, 0x02, 0xc3, 0x28]];
    for region in REGIONS {
        let endpoint = c.node(region).node.endpoint();
        for path in [
            "/cascade.v1.Resources/Get",
            "/cascade.v1.Resources/Create",
            "/cascade.v1.Peer/Lookup",
        ] {
            for bytes in garbage {
                let s = raw_call(&endpoint, path, bytes.to_vec()).await.unwrap_err();
                let r = Refusal::of(&s);
                assert_eq!(r.code, tonic::Code::InvalidArgument, "{region} {path} {bytes:?}: {s:?}");
                assert!(r.message.contains("could not be decoded"), "{s:?}");
                assert_eq!(r.details, None, "{s:?}");
            }
        }
        // The node still serves.
        c.client(region).get("us-east/project/none").await.unwrap_err();
    }
}

/// Over the size limit: RESOURCE_EXHAUSTED (tonic said OUT_OF_RANGE), on
/// both services, for a resource of the node and of another region.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_size_limit_is_resource_exhausted_on_both_services_of_every_node() {
    let c = start_cluster(&REGIONS).await;
    let huge = |name: &str| {
        let mut s = spec_in(name, &[]);
        s.attributes
            .insert("blob".into(), "x".repeat(cascade_proto::MAX_MESSAGE_BYTES + 1024));
        v1::CreateRequest { resource: Some(s) }.encode_to_vec()
    };
    let attach = v1::AttachRequest {
        from_region: "eu-west".into(),
        backrefs: vec![
            v1::PeerBackRef {
                field: "x".repeat(1024),
                ..Default::default()
            };
            cascade_proto::MAX_MESSAGE_BYTES / 1024 + 1
        ],
    }
    .encode_to_vec();
    for region in REGIONS {
        let endpoint = c.node(region).node.endpoint();
        let calls = [
            ("/cascade.v1.Resources/Create", huge(&format!("{region}/project/huge"))),
            ("/cascade.v1.Resources/Create", huge("us-east/project/huge-forwarded")),
            ("/cascade.v1.Peer/Attach", attach.clone()),
        ];
        for (path, bytes) in calls {
            let s = raw_call(&endpoint, path, bytes).await.unwrap_err();
            assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{region} {path}: {s:?}");
            assert!(s.message().contains("too large"), "{s:?}");
            assert_eq!(cascade_proto::error_details(&s), None, "{s:?}");
        }
        c.client(region).get("us-east/project/none").await.unwrap_err();
    }
}

// ---------------------------------------------------------------------------
// NOT_FOUND, ALREADY_EXISTS
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_resource_or_operation_is_not_found_naming_it_from_every_node() {
    let c = start_cluster(&REGIONS).await;
    us_east_network(&c, false).await;
    let missing = "us-east/network/missing";
    let r = same_from_every_node(&c, "get", |client| async move { client.get(missing).await }).await;
    let expect = |r: &Refusal| {
        assert_eq!(
            (r.code, r.reason()),
            (tonic::Code::NotFound, ErrorReason::NotFound),
            "{r:?}"
        );
        assert_eq!(r.resource().0, missing, "{r:?}");
    };
    expect(&r);
    let r = same_from_every_node(&c, "update", |client| async move {
        client
            .update(spec_in(missing, &[("project", &["us-east/project/p"])]), "")
            .await
    })
    .await;
    expect(&r);
    let r = same_from_every_node(&c, "delete", |client| async move {
        client.delete(delete_req(missing, false)).await
    })
    .await;
    expect(&r);
    let id = uuid::Uuid::now_v7().to_string();
    let r = same_from_every_node(&c, "operation", |client| {
        let id = id.clone();
        async move { client.get_operation(&id, 10).await }
    })
    .await;
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::NotFound, ErrorReason::NotFound),
        "{r:?}"
    );
    assert!(r.message.contains(&id), "{r:?}");
}

/// A reference to a target that does not exist: NOT_FOUND naming the
/// field as the request does, whether the target is local to the
/// referrer's owner or resolved at another region.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_to_a_missing_target_is_not_found_naming_the_field_from_every_region() {
    let c = start_cluster(&REGIONS).await;
    let r = same_for_every_referrer(&c, "list element", |referrer, client| async move {
        client
            .create(spec_in(
                &format!("{referrer}/port_group/g"),
                &[("ports", &["us-east/port/missing"])],
            ))
            .await
    })
    .await;
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::NotFound, ErrorReason::NotFound),
        "{r:?}"
    );
    assert_eq!(r.details().field, "refs.ports[0]", "{r:?}");
    assert_eq!(r.resource().0, "us-east/port/missing", "{r:?}");
    let r = same_for_every_referrer(&c, "single reference", |referrer, client| async move {
        client
            .create(spec_in(
                &format!("{referrer}/port/q"),
                &[("network", &["us-east/network/missing"])],
            ))
            .await
    })
    .await;
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::NotFound, ErrorReason::NotFound),
        "{r:?}"
    );
    assert_eq!(r.details().field, "refs.network", "{r:?}");
    assert_eq!(r.message, "refs.network: target us-east/network/missing not found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_name_is_already_exists_naming_it_from_every_node() {
    let c = start_cluster(&REGIONS).await;
    us_east_network(&c, false).await;
    let r = same_from_every_node(&c, "create", |client| async move {
        client.create(spec_in("us-east/project/p", &[])).await
    })
    .await;
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::AlreadyExists, ErrorReason::AlreadyExists),
        "{r:?}"
    );
    assert_eq!(r.resource().0, "us-east/project/p", "{r:?}");
}

// ---------------------------------------------------------------------------
// FAILED_PRECONDITION
// ---------------------------------------------------------------------------

/// Bug 7: a reference to a DELETING target was FAILED_PRECONDITION from
/// its own region and NOT_FOUND "target not found" from the others (whose
/// Lookup answers NOT_FOUND for a DELETING resource, seed 000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_to_a_deleting_target_is_failed_precondition_from_every_region() {
    let c = start_cluster(&REGIONS).await;
    let n = us_east_network(&c, true).await;
    c.client("us-east")
        .create(with_finalizer(spec_in(
            "us-east/port/held",
            &[("network", &["us-east/network/n"])],
        )))
        .await
        .unwrap();
    c.client("us-east")
        .delete(delete_req("us-east/port/held", false))
        .await
        .unwrap();
    hold_deleting(&c).await;

    let expect = |r: &Refusal, field: &str, target: &str| {
        assert_eq!(
            (r.code, r.reason()),
            (tonic::Code::FailedPrecondition, ErrorReason::Deleting),
            "{r:?}"
        );
        assert_eq!(r.details().field, field, "{r:?}");
        assert_eq!(r.resource().0, target, "{r:?}");
        assert_eq!(r.message, format!("{field}: {target} is being deleted"));
    };
    let r = same_for_every_referrer(&c, "by name", |referrer, client| async move {
        client
            .create(spec_in(
                &format!("{referrer}/port/a"),
                &[("network", &["us-east/network/n"])],
            ))
            .await
    })
    .await;
    expect(&r, "refs.network", "us-east/network/n");
    let uid = n.uid.clone();
    let r = same_for_every_referrer(&c, "pinned by uid", |referrer, client| {
        let s = with_uid(
            spec_in(&format!("{referrer}/port/b"), &[("network", &["us-east/network/n"])]),
            &uid,
        );
        async move { client.create(s).await }
    })
    .await;
    expect(&r, "refs.network", "us-east/network/n");
    let r = same_for_every_referrer(&c, "a list element", |referrer, client| async move {
        client
            .create(spec_in(
                &format!("{referrer}/port_group/g"),
                &[("ports", &["us-east/port/held"])],
            ))
            .await
    })
    .await;
    expect(&r, "refs.ports[0]", "us-east/port/held");
    for region in REGIONS {
        for name in ["port/a", "port/b", "port_group/g"] {
            let e = c.client(region).get(&format!("{region}/{name}")).await.unwrap_err();
            assert_eq!(e.code(), Some(tonic::Code::NotFound), "nothing was created: {e}");
        }
    }
}

/// A reference pinned to a uid the target does not have: the owner of the
/// target refuses the attach, and the client hears what a local target
/// gets (the field named, not an empty one; "has uid X, not Y", not a
/// guess that it "was re-created").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_pinned_to_another_uid_is_failed_precondition_naming_the_field_from_every_region() {
    let c = start_cluster(&REGIONS).await;
    let n = us_east_network(&c, false).await;
    let made_up = uuid::Uuid::now_v7().to_string();
    let pinned = made_up.clone();
    let r = same_for_every_referrer(&c, "made-up uid", |referrer, client| {
        let s = with_uid(
            spec_in(&format!("{referrer}/port/a"), &[("network", &["us-east/network/n"])]),
            &pinned,
        );
        async move { client.create(s).await }
    })
    .await;
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::FailedPrecondition, ErrorReason::UidMismatch),
        "{r:?}"
    );
    assert_eq!(r.details().field, "refs.network", "{r:?}");
    assert_eq!(r.resource(), ("us-east/network/n".to_owned(), n.uid.clone()), "{r:?}");
    assert_eq!(
        r.message,
        format!("refs.network: us-east/network/n has uid {}, not {made_up}", n.uid)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_refused_by_dependents_or_blockers_lists_them_from_every_node() {
    let c = start_cluster(&REGIONS).await;
    us_east_network(&c, false).await;
    c.client("us-east")
        .create(spec_in("us-east/port/d0", &[("network", &["us-east/network/n"])]))
        .await
        .unwrap();
    c.client("eu-west")
        .create(spec_in("eu-west/port/d1", &[("network", &["us-east/network/n"])]))
        .await
        .unwrap();
    let r = same_from_every_node(&c, "without cascade", |client| async move {
        client.delete(delete_req("us-east/network/n", false)).await
    })
    .await;
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::FailedPrecondition, ErrorReason::Referenced),
        "{r:?}"
    );
    let mut dependents: Vec<String> = r.details().dependents.into_iter().map(|d| d.referrer).collect();
    dependents.sort();
    assert_eq!(dependents, ["eu-west/port/d1", "us-east/port/d0"], "{r:?}");
    assert_eq!(r.resource().0, "us-east/network/n", "{r:?}");

    c.client("ap-south")
        .batch_create(vec![
            spec_in("ap-south/project/x", &[]),
            spec_in(
                "ap-south/router/r",
                &[
                    ("project", &["ap-south/project/x"]),
                    ("gateway_network", &["us-east/network/n"]),
                ],
            ),
        ])
        .await
        .unwrap();
    let r = same_from_every_node(&c, "blocked", |client| async move {
        client.delete(delete_req("us-east/network/n", true)).await
    })
    .await;
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::FailedPrecondition, ErrorReason::Referenced),
        "{r:?}"
    );
    let blockers: Vec<String> = r.details().blockers.into_iter().map(|d| d.referrer).collect();
    assert_eq!(blockers, ["ap-south/router/r"], "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_of_a_deleting_resource_is_failed_precondition_from_every_node() {
    let c = start_cluster(&REGIONS).await;
    us_east_network(&c, true).await;
    hold_deleting(&c).await;
    let r = same_from_every_node(&c, "update", |client| async move {
        let mut s = with_finalizer(spec_in("us-east/network/n", &[("project", &["us-east/project/p"])]));
        s.attributes.insert("changed".into(), "yes".into());
        client.update(s, "").await
    })
    .await;
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::FailedPrecondition, ErrorReason::Deleting),
        "{r:?}"
    );
    assert_eq!(r.resource().0, "us-east/network/n", "{r:?}");
    assert_eq!(r.message, "us-east/network/n is being deleted");
}

fn add_lien(name: &str, id: &str, reason: &str) -> v1::AddLienRequest {
    v1::AddLienRequest {
        name: name.to_owned(),
        lien_id: id.to_owned(),
        reason: reason.to_owned(),
        requested_by: "test".to_owned(),
        etag: String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_of_a_resource_with_liens_is_failed_precondition_listing_them_from_every_node() {
    let c = start_cluster(&REGIONS).await;
    us_east_network(&c, false).await;
    c.client("eu-west")
        .add_lien(add_lien("us-east/network/n", "legal-hold", "audit 2026"))
        .await
        .unwrap();
    for dry_run in [false, true] {
        let r = same_from_every_node(&c, "delete", |client| async move {
            client
                .delete(v1::DeleteRequest {
                    dry_run,
                    ..delete_req("us-east/network/n", true)
                })
                .await
        })
        .await;
        assert_eq!(
            (r.code, r.reason()),
            (tonic::Code::FailedPrecondition, ErrorReason::Liened),
            "{r:?}"
        );
        assert_eq!(r.resource().0, "us-east/network/n", "{r:?}");
        let liens = r.details().liens;
        assert_eq!(liens.len(), 1, "{r:?}");
        assert_eq!(
            (liens[0].id.as_str(), liens[0].reason.as_str(), liens[0].origin.as_str()),
            ("legal-hold", "audit 2026", "test")
        );
        assert_eq!(
            r.message,
            "cannot delete us-east/network/n: held by lien legal-hold (audit 2026)"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lien_calls_name_lien_id_or_reason_when_refused_from_every_node() {
    let c = start_cluster(&REGIONS).await;
    us_east_network(&c, false).await;
    c.client("us-east")
        .add_lien(add_lien("us-east/network/n", "hold", "first reason"))
        .await
        .unwrap();
    let r = same_from_every_node(&c, "add a held id for another reason", |client| async move {
        client
            .add_lien(add_lien("us-east/network/n", "hold", "second reason"))
            .await
    })
    .await;
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::AlreadyExists, ErrorReason::Lien),
        "{r:?}"
    );
    assert_eq!(
        (r.details().field.as_str(), r.resource().0.as_str()),
        ("lien_id", "us-east/network/n")
    );
    let r = same_from_every_node(&c, "remove a lien not held", |client| async move {
        client
            .remove_lien(v1::RemoveLienRequest {
                name: "us-east/network/n".into(),
                lien_id: "other".into(),
                etag: String::new(),
            })
            .await
    })
    .await;
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::NotFound, ErrorReason::Lien),
        "{r:?}"
    );
    assert_eq!(
        (r.details().field.as_str(), r.resource().0.as_str()),
        ("lien_id", "us-east/network/n")
    );
    let long_id = "i".repeat(129);
    for (id, reason, field) in [
        ("x", "", "reason"),
        ("", "why", "lien_id"),
        (long_id.as_str(), "why", "lien_id"),
    ] {
        let r = same_from_every_node(&c, "a malformed lien", |client| async move {
            client.add_lien(add_lien("us-east/network/n", id, reason)).await
        })
        .await;
        assert_eq!(
            (r.code, r.reason()),
            (tonic::Code::InvalidArgument, ErrorReason::InvalidField),
            "{r:?}"
        );
        assert_eq!(r.details().field, field, "{r:?}");
    }
    for i in 1..16 {
        c.client("us-east")
            .add_lien(add_lien("us-east/network/n", &format!("h{i}"), "many"))
            .await
            .unwrap();
    }
    let r = same_from_every_node(&c, "a 17th lien", |client| async move {
        client
            .add_lien(add_lien("us-east/network/n", "h16", "one too many"))
            .await
    })
    .await;
    assert_eq!(
        (r.code, r.details().field.as_str()),
        (tonic::Code::InvalidArgument, "lien_id"),
        "{r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lien_on_a_deleting_resource_is_failed_precondition_from_every_node() {
    let c = start_cluster(&REGIONS).await;
    us_east_network(&c, true).await;
    hold_deleting(&c).await;
    let r = same_from_every_node(&c, "add a lien", |client| async move {
        client.add_lien(add_lien("us-east/network/n", "late", "too late")).await
    })
    .await;
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::FailedPrecondition, ErrorReason::Deleting),
        "{r:?}"
    );
    assert_eq!(r.resource().0, "us-east/network/n", "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_with_cascade_is_invalid_argument_naming_propagation_from_every_node() {
    let c = start_cluster(&REGIONS).await;
    us_east_network(&c, false).await;
    let r = same_from_every_node(&c, "delete", |client| async move {
        client
            .delete(v1::DeleteRequest {
                propagation: v1::PropagationPolicy::Orphan as i32,
                ..delete_req("us-east/network/n", true)
            })
            .await
    })
    .await;
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::InvalidArgument, ErrorReason::InvalidField),
        "{r:?}"
    );
    assert_eq!(r.details().field, "propagation", "{r:?}");
}

// ---------------------------------------------------------------------------
// ABORTED
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etag_mismatch_is_aborted_from_every_node() {
    let c = start_cluster(&REGIONS).await;
    let n = us_east_network(&c, false).await;
    let r = same_from_every_node(&c, "update", |client| async move {
        client
            .update(
                spec_in("us-east/network/n", &[("project", &["us-east/project/p"])]),
                "stale",
            )
            .await
    })
    .await;
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::Aborted, ErrorReason::EtagMismatch),
        "{r:?}"
    );
    assert_eq!(r.resource().0, "us-east/network/n", "{r:?}");
    assert!(r.message.contains(&n.etag), "{r:?}");
}

/// The plan rows: a cascade above `[limits] confirm_above` without a token
/// (FAILED_PRECONDITION, PLAN_REQUIRED) and a delete bound to a plan whose
/// closure changed since (ABORTED, PLAN_CHANGED, naming the member added),
/// the same from every node: the owner decides both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cascade_needing_a_plan_or_bound_to_a_changed_one_is_refused_from_every_node() {
    let c = start_cluster_with(&REGIONS, |s| s.limits.confirm_above = Some(1)).await;
    us_east_network(&c, false).await;
    let project = "us-east/project/p";
    let r = same_from_every_node(&c, "cascade without a plan", |client| async move {
        client.delete(delete_req(project, true)).await
    })
    .await;
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::FailedPrecondition, ErrorReason::PlanRequired),
        "{r:?}"
    );
    assert_eq!(
        (r.resource().0.as_str(), r.details().field.as_str()),
        (project, "expect_plan"),
        "{r:?}"
    );
    assert_eq!(r.details().plan_members, 2, "{r:?}");
    assert!(
        r.message.contains("more than this node's [limits] confirm_above = 1"),
        "{r:?}"
    );

    let plan = c
        .client("us-east")
        .delete(v1::DeleteRequest {
            dry_run: true,
            ..delete_req(project, true)
        })
        .await
        .unwrap()
        .plan
        .unwrap();
    c.client("eu-west")
        .create(spec_in("eu-west/network/m", &[("project", &[project])]))
        .await
        .unwrap();
    let token = plan.token.clone();
    let r = same_from_every_node(&c, "cascade bound to a changed plan", |client| {
        let token = token.clone();
        async move {
            client
                .delete(v1::DeleteRequest {
                    expect_plan: token,
                    ..delete_req(project, true)
                })
                .await
        }
    })
    .await;
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::Aborted, ErrorReason::PlanChanged),
        "{r:?}"
    );
    let added: Vec<(String, String, bool)> = r
        .details()
        .plan_changes
        .iter()
        .map(|m| (m.region.clone(), m.name.clone(), m.added))
        .collect();
    assert_eq!(
        added,
        [("eu-west".to_owned(), "eu-west/network/m".to_owned(), true)],
        "{r:?}"
    );
    assert_eq!(r.details().plan_members, 3, "{r:?}");
    assert!(r.message.contains("added: eu-west/network/m (delete)"), "{r:?}");
}

// ---------------------------------------------------------------------------
// UNAVAILABLE
// ---------------------------------------------------------------------------

fn assert_region_unavailable(what: &str, result: Result<impl Debug, ClientError>, region: &str) {
    let r = refusal(what, result);
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::Unavailable, ErrorReason::RegionUnavailable),
        "{what}: {r:?}"
    );
    assert_eq!(r.details().region, region, "{what}: {r:?}");
    assert!(r.message.contains(region), "{what}: {r:?}");
}

/// Bug 6: us-east frozen (SIGSTOP), Get/Create/Delete for `us-east/...`
/// (and a create whose reference must be resolved there) sent through the
/// other nodes, us-east killed after a second: UNAVAILABLE, which clients
/// retry, not UNKNOWN "transport error".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_frozen_then_killed_mid_call_is_unavailable_for_forwarded_calls() {
    let mut cluster = ProcCluster::new(&REGIONS, |_| "tick_ms = 50\ncheck_interval_ms = 500".into());
    let us = cluster.client("us-east").await;
    us.batch_create(vec![
        spec_in("us-east/project/p", &[]),
        spec_in("us-east/network/n", &[("project", &["us-east/project/p"])]),
    ])
    .await
    .unwrap();
    let mut forwarders = Vec::new();
    for via in ["eu-west", "ap-south"] {
        let client = cluster.client(via).await;
        // The channel to us-east is open (a forwarded call went through).
        client
            .get("us-east/project/p")
            .await
            .expect("forwarded before the freeze");
        forwarders.push((via, client));
    }
    cluster.freeze("us-east");
    // Each call reports when it is on its way; the owner is killed once all
    // are, so they meet the kill in flight (any interleaving must still be
    // UNAVAILABLE: the owner is unreachable before, during and after).
    let (sent_tx, mut sent_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut calls = Vec::new();
    for (via, client) in &forwarders {
        let via = *via;
        let specs = [
            ("get", None),
            ("create", Some(spec_in(&format!("us-east/project/from-{via}"), &[]))),
            ("delete", None),
            (
                "create with a reference to resolve",
                Some(spec_in(
                    &format!("{via}/network/m"),
                    &[("project", &["us-east/project/p"])],
                )),
            ),
        ];
        for (what, spec) in specs {
            let (c, sent) = (client.clone(), sent_tx.clone());
            calls.push(tokio::spawn(async move {
                let call = async {
                    match (what, spec) {
                        ("get", _) => c.get("us-east/network/n").await.map(|_| ()),
                        ("delete", _) => c.delete(delete_req("us-east/network/n", true)).await.map(|_| ()),
                        (_, Some(spec)) => c.create(spec).await.map(|_| ()),
                        (_, None) => unreachable!("creates carry a spec"),
                    }
                };
                let _ = sent.send(());
                (what, via, call.await)
            }));
        }
    }
    drop(sent_tx);
    for _ in 0..calls.len() {
        tokio::time::timeout(Duration::from_secs(10), sent_rx.recv())
            .await
            .expect("every call starts")
            .expect("a call task reports");
    }
    cluster.kill("us-east");
    for call in calls {
        let (what, via, result) = tokio::time::timeout(Duration::from_secs(40), call)
            .await
            .expect("the call returns")
            .expect("the task runs");
        assert_region_unavailable(&format!("{what} through {via}"), result, "us-east");
    }
    // A dead owner (connection refused) is UNAVAILABLE too.
    for (via, client) in &forwarders {
        assert_region_unavailable(
            &format!("get through {via}, owner dead"),
            client.get("us-east/network/n").await,
            "us-east",
        );
    }
}

/// An owner whose port accepts connections and never answers: the call
/// ends with UNAVAILABLE (the channel's keepalive or the deadline), not a
/// hang or UNKNOWN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_that_accepts_connections_but_never_answers_is_unavailable() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket); // never read, never written, never closed
        }
    });
    let c = start_cluster_with(&["eu-west"], |s| {
        s.peers.insert(
            cascade_core::RegionId::parse("us-east").unwrap(),
            format!("http://{addr}").into(),
        );
    })
    .await;
    let client = c.client("eu-west");
    assert_region_unavailable("get", client.get("us-east/network/n").await, "us-east");
    let created = client
        .create(spec_in("eu-west/network/m", &[("project", &["us-east/project/p"])]))
        .await;
    assert_region_unavailable("create with a reference to resolve", created, "us-east");
    held.abort();
}

// ---------------------------------------------------------------------------
// OUT_OF_RANGE
// ---------------------------------------------------------------------------

/// The node's own OUT_OF_RANGE (a watch below the compaction floor, reason
/// COMPACTED with the revision to resume from) is kept while tonic's size
/// refusal becomes RESOURCE_EXHAUSTED.
#[tokio::test]
async fn a_watch_below_the_compaction_floor_is_out_of_range() {
    let t = start_node_with(cascade_core::schema::EXAMPLE_SCHEMA, |s| s.outbox_retention = 2).await;
    for i in 0..8 {
        t.client.create(spec(&format!("project/p{i}"), &[])).await.unwrap();
    }
    let status = eventually(Duration::from_secs(20), "the outbox to be compacted", || async {
        let mut stream = t.client.watch(2, "").await.ok()?;
        match stream.next().await {
            Some(Err(s)) => Some(s),
            _ => None,
        }
    })
    .await;
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("compacted"), "{status:?}");
    assert_eq!(
        cascade_proto::status::reason_of(&status),
        cascade_proto::v1::ErrorReason::Compacted,
        "{status:?}"
    );
    let resume = cascade_proto::status::resume_revision(&status).expect("a resume revision");
    assert!(resume > 2, "resume from {resume}, above the revision asked for");
    t.node.stop().await.unwrap();
}

// ---------------------------------------------------------------------------
// UNAUTHENTICATED, PERMISSION_DENIED
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_calls_without_a_region_certificate_or_in_another_regions_name_are_refused() {
    use cascade_client::client::connect_channel;
    use cascade_proto::v1::peer_client::PeerClient;
    let pki = DevPki::generate(&REGIONS).unwrap();
    let c = start_cluster_tls(&REGIONS, &pki).await;
    let endpoint = c.node("us-east").node.endpoint();
    let mut anonymous = PeerClient::new(connect_channel(&endpoint, Some(&pki.client()), None).await.unwrap());
    let s = anonymous
        .lookup(v1::LookupRequest {
            name: "us-east/project/p".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::Unauthenticated, "{s:?}");
    let as_ap = pki.node_tls("ap-south").unwrap().as_client();
    let mut ap = PeerClient::new(connect_channel(&endpoint, Some(&as_ap), Some("us-east")).await.unwrap());
    let s = ap
        .ack(v1::AckRequest {
            region: "eu-west".into(),
            revision: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
    assert!(
        s.message().contains("ap-south") && s.message().contains("eu-west"),
        "{s:?}"
    );
}

fn finalizer_failure(finalizer: &str, reason: &str, uid: &str) -> v1::ReportFinalizerFailureRequest {
    v1::ReportFinalizerFailureRequest {
        name: "us-east/network/n".to_owned(),
        uid: uid.to_owned(),
        finalizer: finalizer.to_owned(),
        reason: reason.to_owned(),
    }
}

/// The finalizer controllers' calls: a failure reported for a resource not
/// being deleted, for a finalizer it does not list, without a reason, or
/// for another incarnation, each refused the same from every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalizer_reports_are_refused_the_same_from_every_node() {
    let c = start_cluster(&REGIONS).await;
    let network = us_east_network(&c, true).await;
    let r = same_from_every_node(&c, "a failure before any deletion", |client| async move {
        client
            .report_finalizer_failure(finalizer_failure("test/hold", "early", ""))
            .await
    })
    .await;
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::FailedPrecondition, ErrorReason::NotDeleting),
        "{r:?}"
    );
    assert_eq!(r.resource().0, "us-east/network/n", "{r:?}");
    hold_deleting(&c).await;
    let r = same_from_every_node(&c, "a finalizer not listed", |client| async move {
        client
            .report_finalizer_failure(finalizer_failure("other", "why", ""))
            .await
    })
    .await;
    assert_eq!(
        (r.code, r.reason(), r.details().field.as_str()),
        (tonic::Code::NotFound, ErrorReason::Finalizer, "finalizer"),
        "{r:?}"
    );
    assert_eq!(r.message, "us-east/network/n has no finalizer other");
    let r = same_from_every_node(&c, "a failure without a reason", |client| async move {
        client
            .report_finalizer_failure(finalizer_failure("test/hold", "", ""))
            .await
    })
    .await;
    assert_eq!(
        (r.code, r.details().field.as_str()),
        (tonic::Code::InvalidArgument, "reason"),
        "{r:?}"
    );
    let r = same_from_every_node(&c, "another incarnation", |client| async move {
        client
            .report_finalizer_failure(finalizer_failure(
                "test/hold",
                "why",
                "01950000-0000-7000-8000-000000000000",
            ))
            .await
    })
    .await;
    assert_eq!(
        (r.code, r.reason()),
        (tonic::Code::NotFound, ErrorReason::NotFound),
        "{r:?}"
    );
    let r = same_from_every_node(&c, "a malformed uid", |client| async move {
        client
            .remove_finalizer(v1::RemoveFinalizerRequest {
                name: "us-east/network/n".into(),
                uid: "not-a-uid".into(),
                finalizer: "test/hold".into(),
            })
            .await
    })
    .await;
    assert_eq!(
        (r.code, r.details().field.as_str()),
        (tonic::Code::InvalidArgument, "uid"),
        "{r:?}"
    );
    // The right incarnation's failure is taken, through any node.
    let held = c
        .client("ap-south")
        .report_finalizer_failure(finalizer_failure("test/hold", "dns zone locked", &network.uid))
        .await
        .unwrap();
    let d = held.deletion.expect("DELETING");
    assert_eq!(d.status, v1::DeletionStatus::Blocked as i32, "{d:?}");
    assert_eq!(d.finalizer_failures.len(), 1);
    assert!(d.message.contains("dns zone locked"), "{d:?}");
}

/// The Admin service's refusals, the same from every node (a node forwards
/// an administrator's call to the region it is about): PERMISSION_DENIED
/// for anyone else; RetryDeletion of a deletion that has not failed,
/// FAILED_PRECONDITION `NOT_DELETING`; ForcePurge of a deletion younger
/// than the threshold without `force`, FAILED_PRECONDITION `TOO_EARLY` on
/// `force`; without a reason, INVALID_ARGUMENT on `reason`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_refusals_are_the_same_from_every_node() {
    const TOKEN: &str = "error-codes-admin-token";
    let c = start_cluster_with(&REGIONS, |s| s.admin.token = Some(TOKEN.to_owned())).await;
    us_east_network(&c, true).await;
    hold_deleting(&c).await;
    let admin = |region: &str, token: Option<&str>| {
        let endpoint = c.node(region).node.endpoint();
        let token = token.map(str::to_owned);
        async move {
            cascade_client::AdminClient::connect_with(&endpoint, None, token)
                .await
                .expect("admin client")
        }
    };
    let mut first: Option<Refusal> = None;
    for region in REGIONS {
        let anyone = admin(region, None).await;
        let got = refusal(
            "a retry without credentials",
            anyone
                .retry_deletion(v1::RetryDeletionRequest {
                    name: "us-east/network/n".into(),
                    reason: String::new(),
                })
                .await,
        );
        assert_eq!(got.code, tonic::Code::PermissionDenied, "{got:?}");
        let root = admin(region, Some(TOKEN)).await;
        let not_failed = refusal(
            "a retry of a blocked deletion",
            root.retry_deletion(v1::RetryDeletionRequest {
                name: "us-east/network/n".into(),
                reason: String::new(),
            })
            .await,
        );
        assert_eq!(
            (not_failed.code, not_failed.reason(), not_failed.resource().0.as_str()),
            (
                tonic::Code::FailedPrecondition,
                ErrorReason::NotDeleting,
                "us-east/network/n"
            ),
            "{not_failed:?}"
        );
        let too_early = refusal(
            "a force purge before the threshold",
            root.force_purge(v1::ForcePurgeRequest {
                name: "us-east/network/n".into(),
                reason: "stuck".into(),
                force: false,
            })
            .await,
        );
        assert_eq!(
            (too_early.code, too_early.reason(), too_early.details().field.as_str()),
            (tonic::Code::FailedPrecondition, ErrorReason::TooEarly, "force"),
            "{too_early:?}"
        );
        let no_reason = refusal(
            "a force purge without a reason",
            root.force_purge(v1::ForcePurgeRequest {
                name: "us-east/network/n".into(),
                reason: String::new(),
                force: true,
            })
            .await,
        );
        assert_eq!(
            (no_reason.code, no_reason.details().field.as_str()),
            (tonic::Code::InvalidArgument, "reason"),
            "{no_reason:?}"
        );
        // The same answers through every node (only the message's age may differ).
        let comparable = Refusal {
            message: not_failed.message.clone(),
            ..too_early.clone()
        };
        match &first {
            None => first = Some(comparable),
            Some(want) => assert_eq!(&comparable, want, "{region} answered differently"),
        }
    }
}
