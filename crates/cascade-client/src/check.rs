//! `cascade check`: reads every region's `Peer.Dump`, turns each into the
//! core's view of a region (`cascade_proto::convert::region_view`), and runs
//! the core's invariant checker at quiescence
//! ([`cascade_core::invariants::check_quiescent`]; its module doc says what
//! is checked, which references count as tracked, and what quiescence
//! means). Tests call it at quiescence; `cascade check` runs it against a
//! live cluster. This module only fetches, converts and renders; two
//! findings are its own, since only it sees them: a node that answers for
//! another region than asked (`region_mismatch`), and a dump that does not
//! read as core records (`unreadable`).

use cascade_core::invariants::{check_quiescent, Report};
use cascade_core::Schema;
use cascade_proto::convert::region_view;
use cascade_proto::v1;
use cascade_proto::v1::peer_client::PeerClient;

pub use cascade_core::invariants::{Violation, ViolationKind};

use crate::client::{connect_channel, ClientError, ClientTls};

/// What the checker saw and found (the core's [`Report`]).
pub type CheckReport = Report;

/// Reads every region (`(region, endpoint)` pairs) and checks the invariants.
/// Call it at quiescence (see the module doc).
pub async fn check_cluster(regions: &[(String, String)]) -> Result<CheckReport, ClientError> {
    check_cluster_with_schema(regions, None, None).await
}

/// [`check_cluster`] with the cluster's schema, which decides tracked-ness
/// where the rows cannot and enables the schema checks.
pub async fn check_cluster_with_schema(
    regions: &[(String, String)],
    schema: Option<&Schema>,
    tls: Option<&ClientTls>,
) -> Result<CheckReport, ClientError> {
    let dumps = fetch_dumps(regions, tls).await?;
    let mut report = check_dumps_with_schema(&dumps, schema);
    for ((asked, _), d) in regions.iter().zip(&dumps) {
        if *asked != d.region {
            report.violations.push(Violation {
                kind: ViolationKind::RegionMismatch,
                region: asked.clone(),
                message: format!("the node given for region {asked} serves region {}", d.region),
            });
        }
    }
    report.violations.sort();
    Ok(report)
}

/// One `Peer.Dump` per region, in order. With mutual TLS on, `tls` must
/// carry a region identity (a node's certificate), and each node must
/// prove it is the region it is listed as.
pub async fn fetch_dumps(
    regions: &[(String, String)],
    tls: Option<&ClientTls>,
) -> Result<Vec<v1::DumpResponse>, ClientError> {
    if regions.is_empty() {
        return Err(ClientError::Usage("no regions to check".into()));
    }
    let mut out = Vec::with_capacity(regions.len());
    for (region, addr) in regions {
        let channel = connect_channel(addr, tls, Some(region)).await.map_err(|e| match e {
            ClientError::Connect { addr, message } => ClientError::Connect {
                addr: format!("{addr} (region {region})"),
                message,
            },
            other => other,
        })?;
        let mut peer = PeerClient::new(channel).max_decoding_message_size(cascade_proto::MAX_MESSAGE_BYTES);
        let dump = peer.dump(v1::DumpRequest {}).await?.into_inner();
        out.push(dump);
    }
    Ok(out)
}

/// Checks the dumps of every region of a cluster, without a schema.
pub fn check_dumps(dumps: &[v1::DumpResponse]) -> CheckReport {
    check_dumps_with_schema(dumps, None)
}

/// Checks the dumps of every region; `schema` (the nodes' schema) decides
/// tracked-ness where the rows cannot. A dump that does not convert is an
/// `unreadable` violation, and the other regions are checked without it.
pub fn check_dumps_with_schema(dumps: &[v1::DumpResponse], schema: Option<&Schema>) -> CheckReport {
    let mut views = Vec::with_capacity(dumps.len());
    let mut unreadable = Vec::new();
    for d in dumps {
        match region_view(d) {
            Ok(view) => views.push(view),
            Err(status) => unreadable.push(Violation {
                kind: ViolationKind::Unreadable,
                region: d.region.clone(),
                message: format!(
                    "the dump of region {} does not read as core records: {}",
                    d.region,
                    status.message()
                ),
            }),
        }
    }
    let mut report = check_quiescent(&views, schema);
    if !unreadable.is_empty() {
        report.regions = dumps.iter().map(|d| d.region.clone()).collect();
        report.violations.extend(unreadable);
        report.violations.sort();
    }
    report
}

/// The report as text: counts, then one line per violation.
pub fn report_text(report: &CheckReport) -> String {
    let mut out = format!(
        "regions: {}\nresources: {} ({} deleting)\nback-references: {} ({} owner, {} mirror)\n",
        report.regions.join(", "),
        report.resources,
        report.deleting,
        report.backrefs,
        report.owner_rows,
        report.mirror_rows,
    );
    if report.unclassified_refs > 0 {
        out += &format!(
            "unclassified references (on_delete unknown, checked for dangling only): {}\n",
            report.unclassified_refs
        );
    }
    if report.violations.is_empty() {
        out += "violations: none\n";
    } else {
        out += &format!("violations: {}\n", report.violations.len());
        for v in &report.violations {
            out += &format!("  {v}\n");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    //! The checks themselves are tested in `cascade_core::invariants`; these
    //! test what a dump brings to them (read marks, deletion records, rows'
    //! `on_delete`) and what this module adds.

    use super::*;

    const U_NET: &str = "00000000-0000-7000-8000-000000000001";
    const U_SUB: &str = "00000000-0000-7000-8000-000000000002";
    const U_QOS: &str = "00000000-0000-7000-8000-000000000003";
    const OP: &str = "00000000-0000-7000-8000-0000000000aa";

    fn oref(name: &str, uid: &str) -> v1::ObjectRef {
        v1::ObjectRef {
            name: name.into(),
            uid: uid.into(),
            dangling: false,
        }
    }

    fn res(name: &str, uid: &str, state: v1::ResourceState, refs: &[(&str, &[(&str, &str)])]) -> v1::Resource {
        v1::Resource {
            name: name.into(),
            uid: uid.into(),
            state: state as i32,
            refs: refs
                .iter()
                .map(|(field, ts)| v1::ReferenceField {
                    field: field.to_string(),
                    targets: ts.iter().map(|(n, u)| oref(n, u)).collect(),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn row(target: (&str, &str), referrer: (&str, &str), field: &str, on_delete: &str) -> v1::PeerBackRef {
        v1::PeerBackRef {
            target: Some(oref(target.0, target.1)),
            referrer: Some(oref(referrer.0, referrer.1)),
            field: field.into(),
            generation: 1,
            on_delete: on_delete.into(),
        }
    }

    fn dump(region: &str, resources: Vec<v1::Resource>, backrefs: Vec<v1::PeerBackRef>) -> v1::DumpResponse {
        v1::DumpResponse {
            region: region.into(),
            resources,
            backrefs,
            ..Default::default()
        }
    }

    const NET: (&str, &str) = ("ra/network/n1", U_NET);
    const SUB: (&str, &str) = ("rb/subnet/s1", U_SUB);

    /// ra/network/n1 ← rb/subnet/s1 (field network, cascade): owner row in
    /// ra, mirror row in rb.
    fn healthy() -> Vec<v1::DumpResponse> {
        vec![
            dump(
                "ra",
                vec![res(NET.0, NET.1, v1::ResourceState::Active, &[])],
                vec![row(NET, SUB, "network", "cascade")],
            ),
            dump(
                "rb",
                vec![res(SUB.0, SUB.1, v1::ResourceState::Active, &[("network", &[NET])])],
                vec![row(NET, SUB, "network", "cascade")],
            ),
        ]
    }

    fn kinds(r: &CheckReport) -> Vec<&str> {
        r.violations.iter().map(|v| v.kind.as_str()).collect()
    }

    #[test]
    fn a_healthy_cluster_has_no_violations() {
        let r = check_dumps(&healthy());
        assert!(r.violations.is_empty(), "{:#?}", r.violations);
        assert_eq!((r.resources, r.backrefs, r.owner_rows, r.mirror_rows), (2, 2, 1, 1));
        assert_eq!(r.unclassified_refs, 0);
        assert!(report_text(&r).contains("violations: none"));
    }

    #[test]
    fn a_reference_marked_dangling_is_allow_dangling() {
        let mut d = healthy();
        d[1].resources[0].refs.push(v1::ReferenceField {
            field: "qos".into(),
            targets: vec![oref("ra/qos_policy/q", U_QOS)],
        });
        // Unmarked, its gone target dangles.
        assert_eq!(kinds(&check_dumps(&d)), vec!["dangling"]);
        d[1].resources[0].refs[1].targets[0].dangling = true;
        let r = check_dumps(&d);
        assert!(r.violations.is_empty(), "{:#?}", r.violations);
        assert_eq!(r.unclassified_refs, 0);
    }

    #[test]
    fn rows_on_delete_decides_tracked_ness() {
        let mut d = healthy();
        // The mirror row dropped: missing, since the owner row says cascade.
        d[1].backrefs.clear();
        let r = check_dumps(&d);
        assert_eq!(
            kinds(&r),
            vec!["missing_backref", "missing_backref"],
            "{:#?}",
            r.violations
        );
        assert!(r
            .violations
            .iter()
            .all(|v| v.region == "rb" && v.message.contains("mirror")));
    }

    #[test]
    fn deletion_records_read_from_the_dump() {
        let mut d = healthy();
        d[0].backrefs.clear();
        d[1].backrefs.clear();
        d[1].resources[0].refs.clear();
        d[0].resources[0].state = v1::ResourceState::Deleting as i32;
        d[0].resources[0].deletion = Some(v1::Deletion {
            reason: "requested".into(),
            status: v1::DeletionStatus::Waiting as i32,
            operation_id: OP.into(),
            ..Default::default()
        });
        d[1].resources[0].state = v1::ResourceState::Deleting as i32;
        d[1].resources[0].deletion = Some(v1::Deletion {
            reason: "cascade from ra/network/n1 (field network)".into(),
            status: v1::DeletionStatus::Failed as i32,
            operation_id: OP.into(),
            message: "finalizer x failed".into(),
            ..Default::default()
        });
        // The root waits for a failed member: explained.
        let r = check_dumps(&d);
        assert!(r.violations.is_empty(), "{:#?}", r.violations);
        assert_eq!(r.deleting, 2);
        // FAILED without a message explains nothing.
        d[1].resources[0].deletion.as_mut().unwrap().message.clear();
        let r = check_dumps(&d);
        assert_eq!(
            kinds(&r),
            vec!["unexplained_deletion", "unexplained_deletion"],
            "{:#?}",
            r.violations
        );
    }

    #[test]
    fn a_dump_that_does_not_read_is_unreadable() {
        let mut d = healthy();
        d[1].resources[0].uid = "not-a-uid".into();
        let r = check_dumps(&d);
        assert_eq!(kinds(&r), vec!["unreadable"], "{:#?}", r.violations);
        assert!(
            r.violations[0].message.contains("resources[0].uid"),
            "{:#?}",
            r.violations
        );
        assert_eq!(r.regions, vec!["ra", "rb"]);
        let mut d = healthy();
        let again = d[0].backrefs[0].clone();
        d[0].backrefs.push(again);
        assert_eq!(kinds(&check_dumps(&d)), vec!["unreadable"]);
    }

    #[test]
    fn json_and_text_name_kinds_as_before() {
        let mut d = healthy();
        d[1].pending_releases = 2;
        d[0].remote_deletions.push(oref("rb/subnet/gone", U_QOS));
        let r = check_dumps(&d);
        assert_eq!(
            kinds(&r),
            vec!["not_quiescent", "stale_remote_deletion"],
            "{:#?}",
            r.violations
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["violations"][0]["kind"], "not_quiescent");
        assert_eq!(json["violations"][0]["region"], "rb");
        assert_eq!(json["owner_rows"], 1);
        let text = report_text(&r);
        assert!(text.contains("violations: 2"), "{text}");
        assert!(text.contains("  not_quiescent "), "{text}");
    }
}
