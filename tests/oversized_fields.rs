//! Bounded sizes (issue 24, part 3) over a real node.
//!
//! Why our checks missed it: each decoder checked the fields it used, as it
//! used them, and quoted what it refused whole; a field nobody thought of
//! (a reason audited before its check, a name echoed in a refusal, a field
//! a method ignores) had no limit. So the first test asks the descriptor
//! set, not a list written by hand: every string field of every request of
//! every method of `cascade.v1.Resources`, `Admin` and `Peer` (nested
//! messages, repeated fields and maps included) is sent oversized, one at
//! a time, and must be refused INVALID_ARGUMENT naming that field, in a
//! status under 1 KB, with nothing stored and the node still serving. A
//! field added to a request without a limit fails it. (gRPC health and
//! reflection are left out: they are tonic's.)

// Test code: poll deadlines are real time (clippy.toml).
#![allow(clippy::disallowed_methods)]
// The coverage table goes to the terminal (`--nocapture`).
#![allow(clippy::print_stdout)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use cascade_client::AdminClient;
use cascade_proto::v1;
use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};
use support::*;
use tonic::transport::Channel;

const TOKEN: &str = "oversized-fields-admin-token";

/// Well over every field's own limit, well under the 16 MiB message limit.
const OVERSIZED: usize = 70_000;

/// How deep into nested messages the walk goes (CreateRequest.resource.
/// refs.targets.name is 3 deep).
const MAX_DEPTH: usize = 5;

/// One request with one string field oversized: the field numbers from the
/// request down to the field, and the path the refusal must name.
struct Case {
    service: String,
    method: String,
    streaming: bool,
    numbers: Vec<u32>,
    path: String,
}

fn messages(set: &FileDescriptorSet) -> BTreeMap<String, DescriptorProto> {
    let mut out = BTreeMap::new();
    for file in &set.file {
        let package = file.package();
        for m in &file.message_type {
            collect(&format!(".{package}"), m, &mut out);
        }
    }
    out
}

fn collect(scope: &str, m: &DescriptorProto, out: &mut BTreeMap<String, DescriptorProto>) {
    let name = format!("{scope}.{}", m.name());
    for nested in &m.nested_type {
        collect(&name, nested, out);
    }
    out.insert(name, m.clone());
}

fn join(at: &str, name: &str) -> String {
    if at.is_empty() {
        name.to_owned()
    } else {
        format!("{at}.{name}")
    }
}

/// Every string or bytes field under `type_name`, with its field numbers
/// and the path a refusal names (a repeated field's first element `[0]`;
/// a map as a whole, its key or its value oversized).
fn string_fields(
    all: &BTreeMap<String, DescriptorProto>,
    type_name: &str,
    at: &str,
    numbers: &[u32],
    depth: usize,
    out: &mut Vec<(Vec<u32>, String)>,
) {
    let message = &all[type_name];
    for f in &message.field {
        let repeated = f.label() == Label::Repeated;
        let here = join(at, f.name());
        let mut numbers = numbers.to_vec();
        numbers.push(f.number() as u32);
        match f.r#type() {
            Type::String | Type::Bytes => {
                let path = if repeated { format!("{here}[0]") } else { here };
                out.push((numbers, path));
            }
            Type::Message => {
                let sub = &all[f.type_name()];
                if sub.options.as_ref().is_some_and(|o| o.map_entry()) {
                    for entry_field in &sub.field {
                        if matches!(entry_field.r#type(), Type::String | Type::Bytes) {
                            let mut numbers = numbers.clone();
                            numbers.push(entry_field.number() as u32);
                            out.push((numbers, here.clone()));
                        }
                    }
                } else if depth < MAX_DEPTH {
                    let here = if repeated { format!("{here}[0]") } else { here };
                    string_fields(all, f.type_name(), &here, &numbers, depth + 1, out);
                }
            }
            _ => {}
        }
    }
}

fn cases() -> Vec<Case> {
    let set = FileDescriptorSet::decode(cascade_proto::FILE_DESCRIPTOR_SET).expect("descriptor set");
    let all = messages(&set);
    let mut out = Vec::new();
    for file in &set.file {
        for service in &file.service {
            let full = format!("{}.{}", file.package(), service.name());
            if !["cascade.v1.Resources", "cascade.v1.Admin", "cascade.v1.Peer"].contains(&full.as_str()) {
                continue;
            }
            for method in &service.method {
                let mut fields = Vec::new();
                string_fields(&all, method.input_type(), "", &[], 0, &mut fields);
                if fields.is_empty() {
                    // Still called once (an empty request), for the table.
                    out.push(Case {
                        service: full.clone(),
                        method: method.name().to_owned(),
                        streaming: method.server_streaming(),
                        numbers: Vec::new(),
                        path: String::new(),
                    });
                }
                for (numbers, path) in fields {
                    out.push(Case {
                        service: full.clone(),
                        method: method.name().to_owned(),
                        streaming: method.server_streaming(),
                        numbers,
                        path,
                    });
                }
            }
        }
    }
    out
}

fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// A length-delimited field (a string, bytes or a message).
fn delimited(number: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 8);
    varint(u64::from(number) << 3 | 2, &mut out);
    varint(body.len() as u64, &mut out);
    out.extend_from_slice(body);
    out
}

/// The request's bytes: every field empty but the one, oversized.
fn request_bytes(numbers: &[u32]) -> Vec<u8> {
    let Some((last, outer)) = numbers.split_last() else {
        return Vec::new();
    };
    let mut bytes = delimited(*last, "x".repeat(OVERSIZED).as_bytes());
    for n in outer.iter().rev() {
        bytes = delimited(*n, &bytes);
    }
    bytes
}

/// Calls a method with raw request bytes (the admin token attached; other
/// services ignore it); a streaming method's answer is its first message.
async fn call(channel: &Channel, case: &Case, bytes: Vec<u8>) -> Result<(), tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone())
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(usize::MAX);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path: tonic::codegen::http::uri::PathAndQuery =
        format!("/{}/{}", case.service, case.method).parse().expect("path");
    let mut request = tonic::Request::new(bytes);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().expect("metadata"));
    if case.streaming {
        let mut stream = grpc.server_streaming(request, path, RawCodec).await?.into_inner();
        match tokio::time::timeout(Duration::from_secs(5), stream.message()).await {
            Ok(first) => first.map(|_| ()),
            Err(_) => Err(tonic::Status::deadline_exceeded("no first message in 5 s")),
        }
    } else {
        grpc.unary(request, path, RawCodec).await.map(|_| ())
    }
}

/// Why a refusal is not the one expected, if it is not.
fn wrong_refusal(case: &Case, answer: Result<(), tonic::Status>) -> Option<String> {
    let status = match answer {
        Ok(()) => return Some("answered OK".to_owned()),
        Err(s) => s,
    };
    let size = status.message().len() + status.details().len();
    let field = cascade_proto::error_details(&status).map(|d| d.field);
    // A Create's or Update's resource is named from the resource, as the
    // core names it (`name`, not `resource.name`).
    let expected = case.path.strip_prefix("resource.").unwrap_or(&case.path);
    let mut wrong = Vec::new();
    if status.code() != tonic::Code::InvalidArgument {
        wrong.push(format!("code {:?}", status.code()));
    }
    if size >= 1024 {
        wrong.push(format!("status of {size} bytes"));
    }
    if field.as_deref() != Some(expected) {
        wrong.push(format!("field {field:?}"));
    }
    if !status.message().contains("bytes") {
        wrong.push("the message gives no length".to_owned());
    }
    (!wrong.is_empty()).then(|| {
        let start: String = status.message().chars().take(120).collect();
        format!("{}: {start}", wrong.join(", "))
    })
}

/// (a) Every string field of every request of every RPC, oversized.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_string_field_of_every_rpc_is_refused_when_oversized_and_nothing_is_stored() {
    let n = start_node_with(cascade_core::schema::EXAMPLE_SCHEMA, |s| {
        s.admin.token = Some(TOKEN.to_owned());
    })
    .await;
    let endpoint = n.node.endpoint();
    let project = full("project/p1");
    n.client.create(spec(&project, &[])).await.expect("create");
    let before = dump(&endpoint).await.expect("dump");
    let channel = Channel::from_shared(endpoint.clone())
        .expect("endpoint")
        .connect()
        .await
        .expect("channel");

    let cases = cases();
    let mut covered: BTreeMap<String, (BTreeMap<String, usize>, usize)> = BTreeMap::new();
    let mut failures = Vec::new();
    for case in &cases {
        let (methods, fields) = covered.entry(case.service.clone()).or_default();
        *methods.entry(case.method.clone()).or_default() += usize::from(!case.path.is_empty());
        if case.path.is_empty() {
            continue;
        }
        *fields += 1;
        let answer = call(&channel, case, request_bytes(&case.numbers)).await;
        if let Some(why) = wrong_refusal(case, answer) {
            failures.push(format!("{}/{} {}: {why}", case.service, case.method, case.path));
        }
        let after = dump(&endpoint).await.expect("the node still serves Dump");
        if after != before {
            failures.push(format!(
                "{}/{} {}: the node stored something",
                case.service, case.method, case.path
            ));
        }
        n.client
            .get(&project)
            .await
            .unwrap_or_else(|e| panic!("the node still serves after {}: {e}", case.path));
    }

    println!(
        "{:<22} {:>8} {:>22} {:>14}",
        "service", "methods", "methods with strings", "fields sent"
    );
    for (service, (methods, fields)) in &covered {
        let with_strings = methods.values().filter(|n| **n > 0).count();
        println!("{service:<22} {:>8} {with_strings:>22} {fields:>14}", methods.len());
    }
    println!(
        "{} of {} oversized fields refused as expected",
        cases.iter().filter(|c| !c.path.is_empty()).count() - failures.len(),
        cases.iter().filter(|c| !c.path.is_empty()).count()
    );
    assert!(
        covered.len() == 3 && covered.values().all(|(methods, _)| methods.len() >= 5),
        "the walk found the three services and their methods: {:?}",
        covered.keys().collect::<Vec<_>>()
    );
    assert!(
        failures.is_empty(),
        "{} fields:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// (b) The audit log stays readable: refused ForcePurges with a 1 MB
/// reason are audited with the reason cut (and its length), and ListAudit
/// with the default page size answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_refused_force_purges_with_a_megabyte_reason_leave_the_audit_log_readable() {
    let n = start_node_with(cascade_core::schema::EXAMPLE_SCHEMA, |s| {
        s.admin.token = Some(TOKEN.to_owned());
    })
    .await;
    let admin = AdminClient::connect_with(&n.node.endpoint(), None, Some(TOKEN.to_owned()))
        .await
        .expect("admin client");
    let reason = "r".repeat(1 << 20);
    for _ in 0..100 {
        let refused = admin
            .force_purge(v1::ForcePurgeRequest {
                name: full("project/p1"),
                reason: reason.clone(),
                force: true,
            })
            .await
            .expect_err("a 1 MB reason is refused");
        let cascade_client::ClientError::Status(s) = refused else {
            panic!("expected a status, got {refused:?}");
        };
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{}", s.message());
        assert!(s.message().len() < 1024, "{} bytes", s.message().len());
    }
    let page = admin
        .list_audit(v1::ListAuditRequest::default())
        .await
        .expect("ListAudit with the default page size answers");
    assert_eq!(page.entries.len(), 100, "every refusal is audited");
    for e in &page.entries {
        assert_eq!(e.action, "ForcePurge (force)");
        assert!(e.reason.len() <= 1024, "reason of {} bytes", e.reason.len());
        assert!(
            e.reason.starts_with("rrrr") && e.reason.ends_with("…[truncated, 1048576 bytes]"),
            "{}",
            &e.reason[e.reason.len().saturating_sub(60)..]
        );
        assert!(
            e.outcome.starts_with("InvalidArgument: reason: \"rrrr"),
            "{}",
            e.outcome
        );
        assert!(e.outcome.len() < 1024);
    }
}

/// (c) A page that would exceed the byte budget (a quarter of
/// `max_message_bytes`) ends early and continues with its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_over_the_byte_budget_ends_early_and_its_token_continues_it() {
    let n = start_node_with(cascade_core::schema::EXAMPLE_SCHEMA, |s| {
        s.limits.max_message_bytes = 1 << 20;
    })
    .await;
    // 12 projects of 15 attributes of 4000 bytes: 60 KB each, 720 KB in
    // all, over the budget of 256 KiB and under the 1 MiB message limit.
    let mut names = Vec::new();
    for i in 0..12 {
        let name = full(&format!("project/big-{i:02}"));
        let mut s = spec(&name, &[]);
        for a in 0..15 {
            s.attributes.insert(format!("a{a:02}"), "v".repeat(4000));
        }
        n.client.create(s).await.expect("create");
        names.push(name);
    }
    let mut token = String::new();
    let mut seen = Vec::new();
    let mut pages = Vec::new();
    loop {
        let page = n
            .client
            .list(v1::ListRequest {
                kind: "project".into(),
                page_size: 100,
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("list");
        let bytes = page.encoded_len();
        assert!(bytes <= (1 << 20) / 4 + 70_000, "a page of {bytes} bytes");
        pages.push(page.resources.len());
        seen.extend(page.resources.into_iter().map(|r| r.name));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    println!("List pages of 100 under a 256 KiB budget: {pages:?}");
    assert!(pages.len() > 1 && pages[0] < 12, "the first page ends early: {pages:?}");
    assert_eq!(seen, names, "every resource once, in order");
}

/// (c) continued: an operation's outcomes and the audit log end their
/// pages at the byte budget too (a 64 KiB message limit: 16 KiB a page),
/// and their tokens continue them with every item once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_and_audit_pages_over_the_byte_budget_end_early_and_continue() {
    let n = start_node_with(cascade_core::schema::EXAMPLE_SCHEMA, |s| {
        s.limits.max_message_bytes = 64 << 10;
        s.admin.token = Some(TOKEN.to_owned());
    })
    .await;
    let budget = (64 << 10) / 4;
    n.client.create(spec("project/p", &[])).await.expect("project");
    // 300 networks cascaded from the project: 301 outcomes of about 100
    // bytes, about twice the budget.
    for chunk in 0..3 {
        let specs = (0..100)
            .map(|i| spec(&format!("network/n{chunk}-{i:03}"), &[("project", &["project/p"])]))
            .collect();
        n.client.batch_create(specs).await.expect("networks");
    }
    let op = delete_and_wait(&n.client, "project/p", true).await;
    let mut raw = n.client.raw();
    let mut token = String::new();
    let mut seen = Vec::new();
    let mut pages = Vec::new();
    loop {
        let page = raw
            .get_operation(v1::GetOperationRequest {
                id: op.id.clone(),
                outcomes_page_size: 1000,
                outcomes_page_token: token,
            })
            .await
            .expect("GetOperation")
            .into_inner();
        assert!(
            page.encoded_len() <= budget + 1024,
            "a page of {} bytes",
            page.encoded_len()
        );
        pages.push(page.outcomes.len());
        seen.extend(
            page.outcomes
                .into_iter()
                .map(|o| o.resource.map(|r| r.name).unwrap_or_default()),
        );
        token = page.next_outcomes_page_token;
        if token.is_empty() {
            break;
        }
    }
    println!("GetOperation outcome pages of 1000 under a 16 KiB budget: {pages:?}");
    assert!(pages.len() > 1, "the first page ends early: {pages:?}");
    let unique: std::collections::BTreeSet<&String> = seen.iter().collect();
    assert_eq!((seen.len(), unique.len()), (301, 301), "every outcome once");

    // 20 refused ForcePurges with a 3000-byte reason: audited with the
    // reason cut to 1024 bytes, about 24 KB of log.
    let admin = AdminClient::connect_with(&n.node.endpoint(), None, Some(TOKEN.to_owned()))
        .await
        .expect("admin client");
    for _ in 0..20 {
        admin
            .force_purge(v1::ForcePurgeRequest {
                name: full("project/p"),
                reason: "r".repeat(3000),
                force: true,
            })
            .await
            .expect_err("a 3000-byte reason is refused");
    }
    let mut token = String::new();
    let mut ids = Vec::new();
    let mut pages = Vec::new();
    loop {
        let page = admin
            .list_audit(v1::ListAuditRequest {
                page_size: 1000,
                page_token: token,
                // The creates and the cascade above are audited too.
                action: "ForcePurge (force)".into(),
                ..Default::default()
            })
            .await
            .expect("ListAudit");
        assert!(
            page.encoded_len() <= budget + 2048,
            "a page of {} bytes",
            page.encoded_len()
        );
        pages.push(page.entries.len());
        ids.extend(page.entries.into_iter().map(|e| e.id));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    println!("ListAudit pages of 1000 under a 16 KiB budget: {pages:?}");
    assert!(pages.len() > 1, "the first page ends early: {pages:?}");
    let unique: std::collections::BTreeSet<&String> = ids.iter().collect();
    assert_eq!((ids.len(), unique.len()), (20, 20), "every entry once");
}

/// (c) continued: `Peer.ListDeleting`, the resync listing after outbox
/// compaction, pages by items and by bytes; its tokens continue it with
/// every DELETING resource the asking region references once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resync_listing_pages_by_items_and_bytes() {
    let mut c = start_cluster_with(&["ra", "rb"], |s| s.limits.max_message_bytes = 64 << 10).await;
    let a = c.client("ra").clone();
    a.create(spec_in("ra/project/p", &[])).await.expect("project");
    let groups: Vec<String> = (0..200).map(|i| format!("ra/security_group/sg-{i:03}")).collect();
    for chunk in groups.chunks(100) {
        let specs = chunk
            .iter()
            .map(|g| spec_in(g, &[("project", &["ra/project/p"])]))
            .collect();
        a.batch_create(specs).await.expect("security groups");
    }
    // rb's ports reference them (unset): rows that hold the deletions while
    // rb is down.
    let b = c.client("rb").clone();
    b.create(spec_in("rb/project/q", &[])).await.expect("project q");
    b.create(spec_in("rb/network/n", &[("project", &["rb/project/q"])]))
        .await
        .expect("network");
    for (k, chunk) in groups.chunks(100).enumerate() {
        let specs = chunk
            .iter()
            .enumerate()
            .map(|(i, g)| {
                spec_in(
                    &format!("rb/port/p{k}-{i:03}"),
                    &[("network", &["rb/network/n"]), ("security_groups", &[g.as_str()])],
                )
            })
            .collect();
        b.batch_create(specs).await.expect("ports");
    }
    c.stop("rb").await;
    a.delete(v1::DeleteRequest {
        name: "ra/project/p".into(),
        cascade: true,
        ..Default::default()
    })
    .await
    .expect("delete");

    let endpoint = c.node("ra").node.endpoint();
    let list = |page_size: u32| {
        let endpoint = endpoint.clone();
        async move {
            let mut peer = peer_client(&endpoint).await;
            let mut token = String::new();
            let mut names = Vec::new();
            let mut pages = Vec::new();
            loop {
                let page = peer
                    .list_deleting(v1::ListDeletingRequest {
                        region: "rb".into(),
                        page_size,
                        page_token: token,
                    })
                    .await
                    .expect("ListDeleting")
                    .into_inner();
                assert!(
                    page.encoded_len() <= (64 << 10) / 4 + 1024,
                    "{} bytes",
                    page.encoded_len()
                );
                pages.push(page.deleting.len());
                names.extend(page.deleting.into_iter().map(|d| d.resource.unwrap_or_default().name));
                token = page.next_page_token;
                if token.is_empty() {
                    return (names, pages);
                }
            }
        }
    };
    eventually(Duration::from_secs(30), "every security group DELETING", || async {
        (list(1000).await.0.len() == 200).then_some(())
    })
    .await;
    for page_size in [7, 1000] {
        let (mut names, pages) = list(page_size).await;
        println!("ListDeleting pages of {page_size}: {pages:?}");
        assert!(pages.len() > 1 && pages[0] <= page_size as usize, "{pages:?}");
        names.sort();
        names.dedup();
        let mut expected = groups.clone();
        expected.sort();
        assert_eq!(names, expected, "every DELETING resource rb references, once");
    }
}
