//! The invariant checker: reads every region (`Peer.Dump`) and reports
//! violations of DESIGN.md's invariants. Tests call it at quiescence;
//! `cascade check` runs it against a live cluster.
//!
//! # Quiescence
//!
//! The checks only hold when nothing is in flight: the caller must wait
//! until no release, attach or deletion step is queued anywhere (tests poll
//! `Peer.Dump` until it is so) before calling [`check_cluster`]. A region
//! with `pending_releases > 0` or `pending_attach > 0` is reported as
//! `not_quiescent`, and its other findings may be transient. Queued work is
//! not counted: a blocked or failed deletion stays queued for its retries,
//! and a dump does not say which work is which.
//!
//! # What is checked (kinds of [`Violation`])
//!
//! - `not_quiescent`: see above.
//! - `dangling`: an ACTIVE or CREATING resource references a uid that no
//!   region holds (or whose name now holds another incarnation), and the
//!   dump does not mark the reference `dangling` (only `allow_dangling`
//!   references are marked so). DELETING resources are exempt: entering
//!   DELETING releases every outgoing reference, so their targets may go.
//! - `resurrection`: a live resource holds a cascade or unset reference to
//!   a DELETING target (the cascade was not applied, or a reference attached
//!   to a deleting resource); a uid held by two resources; a region still
//!   holding a remote deletion of a uid that its owner has live again.
//! - `leaked_backref`: an owner row (target in the dumping region) whose
//!   target incarnation is gone, or whose referrer is not an ACTIVE or
//!   CREATING resource holding the target in that field; an importer mirror
//!   row (target in another region) likewise, or one with no owner row.
//!   Also `stale_remote_deletion`: a remote deletion kept for a uid that its
//!   owner no longer holds at all (the PURGED event was not applied).
//! - `missing_backref`: a live tracked reference without its owner row, or
//!   (remote target) without its importer mirror row.
//! - `unexplained_deletion`: a DELETING resource that is not BLOCKED or
//!   FAILED with a message. A PENDING or WAITING one is excused only when
//!   its operation has a BLOCKED or FAILED member (a root waits for its
//!   closure).
//! - `unsettled_create`: a CREATING resource.
//! - `region_mismatch`: a node answered for another region than asked.
//!
//! # Which references are tracked
//!
//! A dump carries no schema, so a reference's `on_delete` is decided, first
//! rule that applies:
//! 1. a target marked `dangling` is `allow_dangling` (the node marks only
//!    untracked references);
//! 2. a row for exactly this (target uid, referrer uid, field) anywhere: the
//!    row's `on_delete`;
//! 3. the schema, when one is given ([`check_dumps_with_schema`]; `cascade
//!    check --config` uses the node's);
//! 4. any row anywhere of the same (referrer kind, field): its `on_delete`;
//! 5. any reference anywhere of the same (referrer kind, field) marked
//!    `dangling`: `allow_dangling`;
//! 6. otherwise unknown: not checked for rows (counted in
//!    [`CheckReport::unclassified_refs`]); the `dangling` check still applies.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use cascade_core::Schema;
use cascade_proto::v1;
use cascade_proto::v1::peer_client::PeerClient;

use crate::client::{connect_channel, ClientError, ClientTls};

/// One broken invariant, with the resources involved.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Violation {
    /// "dangling", "resurrection", "leaked_backref", "missing_backref",
    /// "unexplained_deletion", "unsettled_create", …
    pub kind: String,
    pub region: String,
    pub message: String,
}

/// What the checker saw and found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CheckReport {
    pub regions: Vec<String>,
    pub resources: usize,
    pub backrefs: usize,
    /// Back-reference rows whose target is in the dumping region.
    pub owner_rows: usize,
    /// Importer mirror rows (target in another region).
    pub mirror_rows: usize,
    /// Resources in DELETING.
    pub deleting: usize,
    /// Live references whose `on_delete` could not be decided (see the
    /// module doc); they were checked for dangling only.
    pub unclassified_refs: usize,
    pub violations: Vec<Violation>,
}

/// Reads every region (`(region, endpoint)` pairs) and checks the invariants.
/// Call it at quiescence (see the module doc).
pub async fn check_cluster(regions: &[(String, String)]) -> Result<CheckReport, ClientError> {
    check_cluster_with_schema(regions, None, None).await
}

/// [`check_cluster`] with the cluster's schema, which decides tracked-ness
/// where the rows cannot.
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
                kind: "region_mismatch".into(),
                region: asked.clone(),
                message: format!("the node given for region {asked} serves region {}", d.region),
            });
        }
    }
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

fn region_of(name: &str) -> &str {
    name.split('/').next().unwrap_or("")
}

fn kind_of(name: &str) -> &str {
    name.split('/').nth(1).unwrap_or("")
}

fn state_of(r: &v1::Resource) -> v1::ResourceState {
    v1::ResourceState::try_from(r.state).unwrap_or(v1::ResourceState::Unspecified)
}

fn is_live(r: &v1::Resource) -> bool {
    matches!(state_of(r), v1::ResourceState::Active | v1::ResourceState::Creating)
}

fn holds(r: &v1::Resource, field: &str, target_uid: &str) -> bool {
    r.refs
        .iter()
        .filter(|f| f.field == field)
        .any(|f| f.targets.iter().any(|t| t.uid == target_uid))
}

/// (target uid, referrer uid, field)
type RowKey = (String, String, String);

fn row_key(b: &v1::PeerBackRef) -> RowKey {
    (
        b.target.as_ref().map(|t| t.uid.clone()).unwrap_or_default(),
        b.referrer.as_ref().map(|t| t.uid.clone()).unwrap_or_default(),
        b.field.clone(),
    )
}

fn describe(r: &v1::ObjectRef) -> String {
    format!("{} (uid {})", r.name, r.uid)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tracking {
    Tracked,
    Untracked,
    Unknown,
}

/// Checks the dumps of every region; `schema` (the nodes' schema) decides
/// tracked-ness where the rows cannot (see the module doc).
pub fn check_dumps_with_schema(dumps: &[v1::DumpResponse], schema: Option<&Schema>) -> CheckReport {
    let mut report = CheckReport {
        regions: dumps.iter().map(|d| d.region.clone()).collect(),
        ..Default::default()
    };
    let mut v: BTreeSet<Violation> = BTreeSet::new();
    let mut push = |kind: &str, region: &str, message: String| {
        v.insert(Violation {
            kind: kind.to_owned(),
            region: region.to_owned(),
            message,
        });
    };
    let dumped: BTreeSet<&str> = dumps.iter().map(|d| d.region.as_str()).collect();

    // Indexes: uid → (region, resource); owner rows and mirror rows by key.
    let mut by_uid: HashMap<&str, (&str, &v1::Resource)> = HashMap::new();
    let mut owner_rows: BTreeMap<RowKey, (&str, &v1::PeerBackRef)> = BTreeMap::new();
    let mut mirror_rows: BTreeMap<RowKey, (&str, &v1::PeerBackRef)> = BTreeMap::new();
    // (referrer kind, field) → on_delete, learned from rows.
    let mut kind_field: BTreeMap<(String, String), String> = BTreeMap::new();
    // (referrer kind, field) seen with a reference marked dangling.
    let mut dangling_fields: BTreeSet<(String, String)> = BTreeSet::new();

    for d in dumps {
        let region = d.region.as_str();
        if d.pending_releases > 0 || d.pending_attach > 0 {
            push(
                "not_quiescent",
                region,
                format!(
                    "region {region} is not quiescent: pending_releases={} pending_attach={} \
                     (findings may be transient)",
                    d.pending_releases, d.pending_attach
                ),
            );
        }
        report.resources += d.resources.len();
        report.backrefs += d.backrefs.len();
        for r in &d.resources {
            if region_of(&r.name) != region {
                push(
                    "region_mismatch",
                    region,
                    format!(
                        "region {region} holds {} (uid {}), a resource of another region",
                        r.name, r.uid
                    ),
                );
            }
            if let Some((other_region, other)) = by_uid.get(r.uid.as_str()).copied() {
                push(
                    "resurrection",
                    region,
                    format!(
                        "uid {} is held twice: {} in region {other_region} and {} in region {region}",
                        r.uid, other.name, r.name
                    ),
                );
            } else {
                by_uid.insert(r.uid.as_str(), (region, r));
            }
            for f in &r.refs {
                if f.targets.iter().any(|t| t.dangling) {
                    dangling_fields.insert((kind_of(&r.name).to_owned(), f.field.clone()));
                }
            }
        }
        for b in &d.backrefs {
            let target = b.target.clone().unwrap_or_default();
            let referrer = b.referrer.clone().unwrap_or_default();
            kind_field
                .entry((kind_of(&referrer.name).to_owned(), b.field.clone()))
                .or_insert_with(|| b.on_delete.clone());
            let rows = if region_of(&target.name) == region {
                report.owner_rows += 1;
                &mut owner_rows
            } else {
                report.mirror_rows += 1;
                &mut mirror_rows
            };
            if rows.insert(row_key(b), (region, b)).is_some() {
                push(
                    "leaked_backref",
                    region,
                    format!(
                        "region {region} holds two rows for {} → {} (field {})",
                        describe(&referrer),
                        describe(&target),
                        b.field
                    ),
                );
            }
        }
    }

    let find = |t: &v1::ObjectRef| -> Option<&v1::Resource> {
        by_uid.get(t.uid.as_str()).map(|(_, r)| *r).filter(|r| r.name == t.name)
    };

    // Operations with a member that explains why they cannot finish.
    let mut explained_ops: BTreeSet<&str> = BTreeSet::new();
    for d in dumps {
        for r in &d.resources {
            if let Some(del) = &r.deletion {
                let status = v1::DeletionStatus::try_from(del.status).unwrap_or(v1::DeletionStatus::Unspecified);
                if matches!(status, v1::DeletionStatus::Blocked | v1::DeletionStatus::Failed)
                    && !del.message.is_empty()
                    && !del.operation_id.is_empty()
                {
                    explained_ops.insert(del.operation_id.as_str());
                }
            }
        }
    }

    for d in dumps {
        let region = d.region.as_str();
        for r in &d.resources {
            let state = state_of(r);
            // 6. unsettled creates.
            if state == v1::ResourceState::Creating {
                push(
                    "unsettled_create",
                    region,
                    format!("{} (uid {}) in region {region} is still CREATING", r.name, r.uid),
                );
            }
            // 5. unexplained deletions.
            if state == v1::ResourceState::Deleting {
                report.deleting += 1;
                match &r.deletion {
                    None => push(
                        "unexplained_deletion",
                        region,
                        format!(
                            "{} (uid {}) in region {region} is DELETING without a deletion record",
                            r.name, r.uid
                        ),
                    ),
                    Some(del) => {
                        let status =
                            v1::DeletionStatus::try_from(del.status).unwrap_or(v1::DeletionStatus::Unspecified);
                        let explained = match status {
                            v1::DeletionStatus::Blocked | v1::DeletionStatus::Failed => !del.message.is_empty(),
                            _ => explained_ops.contains(del.operation_id.as_str()),
                        };
                        if !explained {
                            push(
                                "unexplained_deletion",
                                region,
                                format!(
                                    "{} (uid {}) in region {region} is DELETING with status {} and message {:?} \
                                     at quiescence (operation {})",
                                    r.name,
                                    r.uid,
                                    status.as_str_name(),
                                    del.message,
                                    del.operation_id
                                ),
                            );
                        }
                    }
                }
            }
            if !is_live(r) {
                continue;
            }
            let kind = kind_of(&r.name);
            for f in &r.refs {
                for t in &f.targets {
                    let here = format!("{} (uid {}) in region {region}", r.name, r.uid);
                    let target_region = region_of(&t.name);
                    let target = find(t);
                    // 1. dangling.
                    if !t.dangling && target.is_none() && dumped.contains(target_region) {
                        push(
                            "dangling",
                            region,
                            format!(
                                "{here} references {} through field {}, which no region holds, \
                                 and the reference is not marked dangling",
                                describe(t),
                                f.field
                            ),
                        );
                    }
                    // Tracked-ness (module doc).
                    let key: RowKey = (t.uid.clone(), r.uid.clone(), f.field.clone());
                    let exact = owner_rows.get(&key).or_else(|| mirror_rows.get(&key));
                    let by_kind = (kind.to_owned(), f.field.clone());
                    let on_delete: Option<String> = if t.dangling {
                        Some("allow_dangling".into())
                    } else if let Some((_, b)) = exact {
                        Some(b.on_delete.clone())
                    } else if let Some(s) = schema.and_then(|s| s.reference(kind, &f.field)) {
                        Some(s.on_delete.as_str().to_owned())
                    } else if let Some(o) = kind_field.get(&by_kind) {
                        Some(o.clone())
                    } else if dangling_fields.contains(&by_kind) {
                        Some("allow_dangling".into())
                    } else {
                        None
                    };
                    let tracking = match on_delete.as_deref() {
                        Some("allow_dangling") => Tracking::Untracked,
                        Some(_) => Tracking::Tracked,
                        None => Tracking::Unknown,
                    };
                    if tracking == Tracking::Unknown {
                        report.unclassified_refs += 1;
                    }
                    if tracking != Tracking::Tracked {
                        continue;
                    }
                    // 2. a live reference to a DELETING target that the cascade should have handled.
                    if let Some(target) = target {
                        let od = on_delete.as_deref().unwrap_or("");
                        if state_of(target) == v1::ResourceState::Deleting && od != "block" {
                            push(
                                "resurrection",
                                region,
                                format!(
                                    "{here} still references DELETING {} through field {} (on_delete {od})",
                                    describe(t),
                                    f.field
                                ),
                            );
                        }
                    }
                    // 4. missing rows.
                    if dumped.contains(target_region) && !owner_rows.contains_key(&key) {
                        push(
                            "missing_backref",
                            target_region,
                            format!(
                                "{here} references {} through field {}, but region {target_region} has no \
                                 owner back-reference for it",
                                describe(t),
                                f.field
                            ),
                        );
                    }
                    if target_region != region && mirror_rows.get(&key).is_none_or(|(at, _)| *at != region) {
                        push(
                            "missing_backref",
                            region,
                            format!(
                                "{here} references {} in region {target_region} through field {}, but region \
                                 {region} has no importer mirror row for it",
                                describe(t),
                                f.field
                            ),
                        );
                    }
                }
            }
        }

        // 2. remote deletions of a uid the owner has live; stale ones.
        for t in &d.remote_deletions {
            let owner = region_of(&t.name);
            if !dumped.contains(owner) {
                continue;
            }
            match find(t) {
                Some(target) if is_live(target) => push(
                    "resurrection",
                    region,
                    format!(
                        "region {region} saw {} enter DELETING, but region {owner} has it {} again",
                        describe(t),
                        state_of(target).as_str_name()
                    ),
                ),
                Some(_) => {}
                None => push(
                    "stale_remote_deletion",
                    region,
                    format!(
                        "region {region} still keeps the remote deletion of {}, which region {owner} no longer holds",
                        describe(t)
                    ),
                ),
            }
        }
    }

    // 3. leaked rows.
    let leak = |b: &v1::PeerBackRef, at: &str, owner: bool| -> Option<String> {
        let target = b.target.clone().unwrap_or_default();
        let referrer = b.referrer.clone().unwrap_or_default();
        let what = format!(
            "{} row in region {at}: {} → {} (field {}, on_delete {})",
            if owner { "owner" } else { "mirror" },
            describe(&referrer),
            describe(&target),
            b.field,
            b.on_delete
        );
        if !owner && region_of(&referrer.name) != at {
            return Some(format!("{what}: the referrer is not local to the importer"));
        }
        if (owner || dumped.contains(region_of(&target.name))) && find(&target).is_none() {
            return Some(format!("{what}: the target incarnation no longer exists"));
        }
        if dumped.contains(region_of(&referrer.name)) {
            match find(&referrer) {
                None => return Some(format!("{what}: the referrer no longer exists")),
                Some(r) if !is_live(r) => {
                    return Some(format!(
                        "{what}: the referrer is {}, and released its references",
                        state_of(r).as_str_name()
                    ))
                }
                Some(r) if !holds(r, &b.field, &target.uid) => {
                    return Some(format!("{what}: the referrer does not hold the target in that field"))
                }
                Some(_) => {}
            }
        }
        None
    };
    for (key, (at, b)) in &owner_rows {
        if let Some(m) = leak(b, at, true) {
            push("leaked_backref", at, m);
            continue;
        }
        // An owner row of a remote referrer needs the importer's mirror.
        let referrer_region = region_of(b.referrer.as_ref().map(|r| r.name.as_str()).unwrap_or(""));
        if referrer_region != *at
            && dumped.contains(referrer_region)
            && mirror_rows.get(key).is_none_or(|(m, _)| *m != referrer_region)
        {
            let referrer = b.referrer.clone().unwrap_or_default();
            let target = b.target.clone().unwrap_or_default();
            push(
                "missing_backref",
                referrer_region,
                format!(
                    "region {at} has an owner row {} → {} (field {}), but region {referrer_region} has no \
                     importer mirror row for it",
                    describe(&referrer),
                    describe(&target),
                    b.field
                ),
            );
        }
    }
    for (key, (at, b)) in &mirror_rows {
        if let Some(m) = leak(b, at, false) {
            push("leaked_backref", at, m);
            continue;
        }
        let target = b.target.clone().unwrap_or_default();
        let owner = region_of(&target.name);
        if dumped.contains(owner) && owner_rows.get(key).is_none_or(|(o, _)| *o != owner) {
            let referrer = b.referrer.clone().unwrap_or_default();
            push(
                "leaked_backref",
                at,
                format!(
                    "mirror row in region {at}: {} → {} (field {}) has no owner row in region {owner}",
                    describe(&referrer),
                    describe(&target),
                    b.field
                ),
            );
        }
    }

    report.violations = v.into_iter().collect();
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
            out += &format!("  {:<22} {:<12} {}\n", v.kind, v.region, v.message);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
            kind: kind_of(name).into(),
            region: region_of(name).into(),
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

    const NET: (&str, &str) = ("ra/network/n1", "u-net");
    const SUB: (&str, &str) = ("rb/subnet/s1", "u-sub");

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
    }

    #[test]
    fn dangling_reference() {
        let mut d = healthy();
        // The network is purged, rows gone, the subnet still references it.
        d[0].resources.clear();
        d[0].backrefs.clear();
        d[1].backrefs.clear();
        let r = check_dumps(&d);
        assert!(kinds(&r).contains(&"dangling"), "{:#?}", r.violations);
        let v = r.violations.iter().find(|v| v.kind == "dangling").unwrap();
        assert_eq!(v.region, "rb");
        assert!(v.message.contains("rb/subnet/s1") && v.message.contains("ra/network/n1"));
        // Marked dangling (allow_dangling): fine.
        d[1].resources[0].refs[0].targets[0].dangling = true;
        assert!(check_dumps(&d).violations.is_empty());
    }

    #[test]
    fn reference_to_a_recreated_name_is_dangling() {
        let mut d = healthy();
        d[0].resources[0].uid = "u-net-2".into();
        let r = check_dumps(&d);
        assert!(kinds(&r).contains(&"dangling"), "{:#?}", r.violations);
        assert!(kinds(&r).contains(&"leaked_backref"), "{:#?}", r.violations);
    }

    #[test]
    fn leaked_backref() {
        let mut d = healthy();
        // The subnet dropped the reference, both rows stayed.
        d[1].resources[0].refs.clear();
        let r = check_dumps(&d);
        let leaks: Vec<_> = r.violations.iter().filter(|v| v.kind == "leaked_backref").collect();
        assert_eq!(leaks.len(), 2, "{:#?}", r.violations);
        assert!(leaks
            .iter()
            .any(|v| v.region == "ra" && v.message.contains("owner row")));
        assert!(leaks
            .iter()
            .any(|v| v.region == "rb" && v.message.contains("mirror row")));
    }

    #[test]
    fn row_of_a_deleting_referrer_is_leaked() {
        let mut d = healthy();
        d[1].resources[0].state = v1::ResourceState::Deleting as i32;
        d[1].resources[0].deletion = Some(v1::Deletion {
            status: v1::DeletionStatus::Blocked as i32,
            message: "finalizer x".into(),
            ..Default::default()
        });
        let r = check_dumps(&d);
        assert_eq!(
            kinds(&r),
            vec!["leaked_backref", "leaked_backref"],
            "{:#?}",
            r.violations
        );
    }

    #[test]
    fn mirror_without_owner_row_is_leaked() {
        let mut d = healthy();
        d[0].backrefs.clear();
        let r = check_dumps(&d);
        // The reference misses its owner row, and the mirror has no owner row.
        assert!(kinds(&r).contains(&"missing_backref"), "{:#?}", r.violations);
        assert!(r
            .violations
            .iter()
            .any(|v| v.kind == "leaked_backref" && v.message.contains("has no owner row in region ra")));
    }

    #[test]
    fn missing_mirror_row() {
        let mut d = healthy();
        d[1].backrefs.clear();
        let r = check_dumps(&d);
        assert!(!r.violations.is_empty());
        assert!(r
            .violations
            .iter()
            .all(|v| v.kind == "missing_backref" && v.region == "rb" && v.message.contains("mirror")));
    }

    #[test]
    fn missing_owner_row_learned_from_another_referrer() {
        let mut d = healthy();
        // A second subnet of the same kind and field, with no rows at all.
        d[1].resources.push(res(
            "rb/subnet/s2",
            "u-sub2",
            v1::ResourceState::Active,
            &[("network", &[NET])],
        ));
        let r = check_dumps(&d);
        let missing: Vec<_> = r.violations.iter().filter(|v| v.kind == "missing_backref").collect();
        assert_eq!(missing.len(), 2, "{:#?}", r.violations);
        assert!(missing.iter().all(|v| v.message.contains("rb/subnet/s2")));
        assert!(missing.iter().any(|v| v.region == "ra"));
    }

    #[test]
    fn unknown_tracking_is_counted_or_decided_by_the_schema() {
        let d = vec![dump(
            "ra",
            vec![
                res("ra/network/n1", "u1", v1::ResourceState::Active, &[]),
                res(
                    "ra/subnet/s1",
                    "u2",
                    v1::ResourceState::Active,
                    &[("network", &[("ra/network/n1", "u1")])],
                ),
            ],
            vec![],
        )];
        let r = check_dumps(&d);
        assert!(r.violations.is_empty(), "{:#?}", r.violations);
        assert_eq!(r.unclassified_refs, 1);
        let schema = Schema::from_toml(cascade_core::schema::EXAMPLE_SCHEMA).unwrap();
        let r = check_dumps_with_schema(&d, Some(&schema));
        assert_eq!(kinds(&r), vec!["missing_backref"], "{:#?}", r.violations);
    }

    #[test]
    fn unexplained_deletion() {
        let mut d = healthy();
        d[0].resources[0].state = v1::ResourceState::Deleting as i32;
        d[0].resources[0].deletion = Some(v1::Deletion {
            status: v1::DeletionStatus::Waiting as i32,
            operation_id: "op1".into(),
            ..Default::default()
        });
        // The subnet was cascaded (DELETING, released) and the rows are gone,
        // but the network stays WAITING.
        d[0].backrefs.clear();
        d[1].backrefs.clear();
        d[1].resources[0].state = v1::ResourceState::Deleting as i32;
        d[1].resources[0].deletion = Some(v1::Deletion {
            status: v1::DeletionStatus::Pending as i32,
            operation_id: "op1".into(),
            ..Default::default()
        });
        let r = check_dumps(&d);
        assert_eq!(
            kinds(&r),
            vec!["unexplained_deletion", "unexplained_deletion"],
            "{:#?}",
            r.violations
        );
        assert!(r.violations[0].message.contains("ra/network/n1"));
        // A blocked member of the operation explains the others.
        d[1].resources[0].deletion = Some(v1::Deletion {
            status: v1::DeletionStatus::Blocked as i32,
            operation_id: "op1".into(),
            message: "blocked by rb/port/p1 (field subnet)".into(),
            ..Default::default()
        });
        let r = check_dumps(&d);
        assert!(r.violations.is_empty(), "{:#?}", r.violations);
        // BLOCKED without a message is not an explanation.
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
    fn unsettled_create() {
        let mut d = healthy();
        d[1].resources[0].state = v1::ResourceState::Creating as i32;
        let r = check_dumps(&d);
        assert_eq!(kinds(&r), vec!["unsettled_create"], "{:#?}", r.violations);
        assert!(r.violations[0].message.contains("rb/subnet/s1"));
    }

    #[test]
    fn resurrection_live_reference_to_deleting_target() {
        let mut d = healthy();
        d[0].resources[0].state = v1::ResourceState::Deleting as i32;
        d[0].resources[0].deletion = Some(v1::Deletion {
            status: v1::DeletionStatus::Blocked as i32,
            message: "held".into(),
            ..Default::default()
        });
        let r = check_dumps(&d);
        assert_eq!(kinds(&r), vec!["resurrection"], "{:#?}", r.violations);
        // A block reference to a BLOCKED target is how blocking looks.
        for x in &mut d {
            x.backrefs[0].on_delete = "block".into();
        }
        assert!(check_dumps(&d).violations.is_empty());
    }

    #[test]
    fn resurrection_duplicate_uid_and_revived_remote_deletion() {
        let mut d = healthy();
        d[1].resources
            .push(res("rb/network/n9", NET.1, v1::ResourceState::Active, &[]));
        d[1].remote_deletions.push(oref(NET.0, NET.1));
        let r = check_dumps(&d);
        let res: Vec<_> = r.violations.iter().filter(|v| v.kind == "resurrection").collect();
        assert_eq!(res.len(), 2, "{:#?}", r.violations);
    }

    #[test]
    fn not_quiescent_and_stale_remote_deletion() {
        let mut d = healthy();
        d[1].pending_releases = 2;
        d[0].remote_deletions.push(oref("rb/subnet/gone", "u-gone"));
        let r = check_dumps(&d);
        assert_eq!(
            kinds(&r),
            vec!["not_quiescent", "stale_remote_deletion"],
            "{:#?}",
            r.violations
        );
        assert!(report_text(&r).contains("violations: 2"));
    }
}
