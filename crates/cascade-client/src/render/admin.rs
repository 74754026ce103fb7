//! What the operators' commands print: deletion entries (`admin
//! deletions|retry|force-purge`), the audit log, the cluster status.

use cascade_proto::v1;
use serde_json::{json, Value};

use super::times::{age, rfc3339, rfc3339_or_null, table, TimeDisplay};
use super::{deletion_status, resource_json};

pub fn deletion_entry_json(e: &v1::DeletionEntry) -> Value {
    json!({
        "resource": e.resource.as_ref().map(resource_json),
        "attempts": e.attempts,
        "next_attempt_ms": e.next_attempt_ms,
        "next_attempt": rfc3339_or_null(e.next_attempt_ms),
        "last_error": e.last_error,
        "stuck": e.stuck,
        "age_ms": e.age_ms,
        "age": age(e.age_ms),
    })
}

/// The answering node's time of an entry: when it entered DELETING plus
/// its age (ages and next looks are then read against the node's clock).
fn entry_now(e: &v1::DeletionEntry) -> Option<i64> {
    let d = e.resource.as_ref()?.deletion.as_ref()?;
    Some(d.deleted_at_ms.saturating_add(e.age_ms))
}

/// `admin deletions`: one row per deletion, aligned.
pub fn deletions_table(entries: &[v1::DeletionEntry], times: &TimeDisplay) -> String {
    let mut rows = vec![[
        "NAME",
        "STATUS",
        "STUCK",
        "AGE",
        "ATTEMPTS",
        "NEXT LOOK",
        "OPERATION",
        "WAITING ON",
    ]
    .map(str::to_owned)
    .to_vec()];
    for e in entries {
        let Some(r) = &e.resource else { continue };
        let d = r.deletion.as_ref();
        let times = entry_now(e).map_or_else(|| times.clone(), |now| times.at(now));
        rows.push(vec![
            r.name.clone(),
            deletion_status(d),
            if e.stuck { "yes" } else { "-" }.to_owned(),
            age(e.age_ms),
            e.attempts.to_string(),
            match e.next_attempt_ms {
                0 => "-".to_owned(),
                at => times.relative(at),
            },
            d.map(|d| d.operation_id.clone()).unwrap_or_default(),
            d.map(|d| d.message.clone()).unwrap_or_default(),
        ]);
    }
    table(&rows)
}

/// One deletion an administrator acted on: `{verb}: NAME is STATUS: why`,
/// then its operation.
pub fn deletion_entry_text(verb: &str, e: &v1::DeletionEntry) -> String {
    let Some(r) = &e.resource else {
        return format!("{verb}\n");
    };
    let d = r.deletion.as_ref();
    let status = match deletion_status(d) {
        s if s.is_empty() => "DELETING".to_owned(),
        s => s,
    };
    let mut out = format!(
        "{verb}: {} is {status}{}, deleting for {}",
        r.name,
        if e.stuck { " (stuck)" } else { "" },
        age(e.age_ms)
    );
    if let Some(message) = d.map(|d| d.message.as_str()).filter(|m| !m.is_empty()) {
        out += &format!(": {message}");
    }
    out.push('\n');
    if let Some(d) = d {
        out += &format!("  operation {} ({}, by {})\n", d.operation_id, d.reason, d.requested_by);
    }
    out
}

pub fn audit_json(e: &v1::AuditEntry) -> Value {
    json!({
        "id": e.id,
        "time_ms": e.time_ms,
        "time": rfc3339(e.time_ms),
        "region": e.region,
        "who": e.who,
        "action": e.action,
        "target": e.target,
        "reason": e.reason,
        "outcome": e.outcome,
        "groups": e.groups,
        "via": e.via,
        "node": e.node,
        "through": e.through,
        "rule": e.rule,
    })
}

/// `admin audit`: one row per entry, oldest first, aligned; the outcome
/// (an error message when refused) last.
pub fn audit_table(entries: &[v1::AuditEntry], times: &TimeDisplay) -> String {
    let mut rows = vec![["TIME", "REGION", "WHO", "ACTION", "TARGET", "REASON", "OUTCOME"]
        .map(str::to_owned)
        .to_vec()];
    for e in entries {
        rows.push(vec![
            times.instant(e.time_ms),
            e.region.clone(),
            e.who.clone(),
            e.action.clone(),
            e.target.clone(),
            if e.reason.is_empty() {
                "-".to_owned()
            } else {
                format!("{:?}", e.reason)
            },
            e.outcome.clone(),
        ]);
    }
    table(&rows)
}

fn figures_json(f: &v1::RegionFigures) -> Value {
    json!({
        "resources": {
            "creating": f.resources_creating,
            "active": f.resources_active,
            "deleting": f.resources_deleting,
        },
        "deletions": {
            "pending": f.deletions_pending,
            "blocked": f.deletions_blocked,
            "waiting": f.deletions_waiting,
            "failed": f.deletions_failed,
        },
        "oldest_deletion_age_ms": f.oldest_deletion_age_ms,
        "last_revision": f.last_revision,
        "truncated": f.truncated,
        "protocol_version": f.protocol_version,
        "binary_version": f.binary_version,
        "writer_epoch": f.writer_epoch,
        "authentication": f.authentication,
        "schema_version": f.schema_version,
        "schema_label": f.schema_label,
        "nodes": f.nodes.iter().map(|n| json!({
            "node": n.node,
            "address": n.address,
            "role": n.role,
            "binary_version": n.binary_version,
            "last_seen_ms": n.last_seen_ms,
        })).collect::<Vec<Value>>(),
    })
}

pub fn cluster_status_json(s: &v1::ClusterStatus) -> Value {
    let regions: Vec<Value> = s
        .regions
        .iter()
        .map(|r| {
            json!({
                "region": r.region,
                "address": r.address,
                "reachable": r.reachable,
                "error": r.error,
                "link_connected": r.link_connected,
                "events_behind": r.events_behind,
                "last_contact_ms": r.last_contact_ms,
                "last_contact": rfc3339_or_null(r.last_contact_ms),
                "figures": r.figures.as_ref().map(figures_json),
                "protocol_version": r.protocol_version,
            })
        })
        .collect();
    json!({
        "answered_by": s.answered_by,
        "answered_by_node": s.answered_by_node,
        "time_ms": s.time_ms,
        "time": rfc3339_or_null(s.time_ms),
        "regions": regions,
        "schemas_differ": schemas_differ(s),
    })
}

/// The PROTOCOL column: the version the answering node last heard on the
/// link (`heard`, 0: none yet), and what the region says of itself when
/// it answered (`says`, 0: a node that says none, version 1) when the two
/// differ (the region was upgraded or rolled back since).
fn protocol_text(heard: u32, says: Option<u32>) -> String {
    match (heard, says.filter(|s| *s > 0)) {
        (0, Some(says)) => says.to_string(),
        (0, None) => "?".to_owned(),
        (heard, Some(says)) if says != heard => format!("{heard} (says {says})"),
        (heard, _) => heard.to_string(),
    }
}

/// The nodes of the regions that have several (over PostgreSQL), a row
/// each: which one writes, at what epoch, and when each standby last said
/// it was up. Empty when no region has several nodes.
fn region_nodes_text(s: &v1::ClusterStatus) -> String {
    let mut rows = vec![["REGION", "NODE", "ROLE", "EPOCH", "ADDRESS", "BINARY", "SEEN"]
        .map(str::to_owned)
        .to_vec()];
    for r in &s.regions {
        let Some(f) = r.figures.as_ref() else { continue };
        for n in &f.nodes {
            let writer = n.role == "writer";
            rows.push(vec![
                r.region.clone(),
                n.node.clone(),
                n.role.clone(),
                if writer {
                    f.writer_epoch.to_string()
                } else {
                    "-".to_owned()
                },
                n.address.clone(),
                n.binary_version.clone(),
                match n.last_seen_ms {
                    _ if writer => "-".to_owned(),
                    // As `relative` reads it: "0s ago" would look odd.
                    ms if ms < 1000 => "just now".to_owned(),
                    ms => format!("{} ago", age(ms)),
                },
            ]);
        }
    }
    if rows.len() == 1 {
        return String::new();
    }
    format!("\n{}", table(&rows))
}

/// A region's schema as the SCHEMA column shows it: the version's digest
/// and its label (`?` from a node too old to say).
fn schema_text(f: &v1::RegionFigures) -> String {
    match (f.schema_version.as_str(), f.schema_label.as_str()) {
        ("", _) => "?".to_owned(),
        (digest, "") => digest.to_owned(),
        (digest, label) => format!("{digest} ({label})"),
    }
}

/// Whether the regions that answered run schemas of different versions
/// (a region that does not say is left out: it cannot be compared).
fn schemas_differ(s: &v1::ClusterStatus) -> bool {
    let mut versions = s
        .regions
        .iter()
        .filter_map(|r| r.figures.as_ref())
        .map(|f| f.schema_version.as_str())
        .filter(|v| !v.is_empty());
    let first = versions.next();
    versions.any(|v| Some(v) != first)
}

/// One screen: a row per region, then why each unreachable one is.
pub fn cluster_status_text(s: &v1::ClusterStatus) -> String {
    let mut rows = vec![[
        "REGION",
        "ADDRESS",
        "REACHABLE",
        "LINK",
        "BEHIND",
        "LAST CONTACT",
        "RESOURCES",
        "PENDING",
        "BLOCKED",
        "FAILED",
        "OLDEST DELETION",
        "PROTOCOL",
        "BINARY",
        "SCHEMA",
    ]
    .map(str::to_owned)];
    for r in &s.regions {
        let own = r.region == s.answered_by;
        let link = match (own, r.link_connected) {
            (true, _) => "self",
            (false, true) => "up",
            (false, false) => "down",
        };
        let behind = match r.events_behind {
            n if n < 0 => "?".to_owned(),
            n => n.to_string(),
        };
        let contact = match r.last_contact_ms {
            _ if own => "-".to_owned(),
            0 => "never".to_owned(),
            ms => format!("{} ago", age(s.time_ms.saturating_sub(ms))),
        };
        let dash = || "-".to_owned();
        let f = r.figures.as_ref();
        rows.push([
            r.region.clone(),
            r.address.clone(),
            if r.reachable { "yes" } else { "NO" }.to_owned(),
            link.to_owned(),
            behind,
            contact,
            f.map_or_else(dash, |f| {
                (f.resources_creating + f.resources_active + f.resources_deleting).to_string()
            }),
            f.map_or_else(dash, |f| (f.deletions_pending + f.deletions_waiting).to_string()),
            f.map_or_else(dash, |f| f.deletions_blocked.to_string()),
            f.map_or_else(dash, |f| f.deletions_failed.to_string()),
            f.map_or_else(dash, |f| match f.oldest_deletion_age_ms {
                0 => "-".to_owned(),
                ms => age(ms),
            }),
            protocol_text(r.protocol_version, f.map(|f| f.protocol_version)),
            f.map_or_else(dash, |f| match f.binary_version.as_str() {
                "" => "?".to_owned(),
                v => v.to_owned(),
            }),
            f.map_or_else(dash, schema_text),
        ]);
    }
    let rows: Vec<Vec<String>> = rows.into_iter().map(Vec::from).collect();
    let mut out = match s.answered_by_node.as_str() {
        "" => format!("cluster status as seen by {}\n\n", s.answered_by),
        node => format!("cluster status as seen by {} (node {node})\n\n", s.answered_by),
    };
    out += &table(&rows);
    out += &region_nodes_text(s);
    // A region that asks nobody who they are is worth a line of its own.
    let open: Vec<&str> = s
        .regions
        .iter()
        .filter(|r| r.figures.as_ref().is_some_and(|f| f.authentication == "none"))
        .map(|r| r.region.as_str())
        .collect();
    if !open.is_empty() {
        out.push('\n');
        for region in open {
            out += &format!(
                "WARNING: {region} has authentication off ([auth] mode = \"none\"): anyone who can reach it may create and delete anything\n"
            );
        }
    }
    if schemas_differ(s) {
        out += "\nNOTE: the regions run different schemas (see SCHEMA): a rolling change is under way, or a region \
                was not reloaded; README \"Changing the schema\"\n";
    }
    let unreachable: Vec<&v1::RegionStatus> = s.regions.iter().filter(|r| !r.reachable).collect();
    if !unreachable.is_empty() {
        out.push('\n');
        for r in unreachable {
            out += &format!("{} is unreachable: {}\n", r.region, r.error);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(name: &str, authentication: &str) -> v1::RegionStatus {
        v1::RegionStatus {
            region: name.to_owned(),
            reachable: true,
            figures: Some(v1::RegionFigures {
                authentication: authentication.to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn status_warns_of_every_region_without_authentication() {
        let status = v1::ClusterStatus {
            answered_by: "eu-west".to_owned(),
            regions: vec![
                region("eu-west", "required: certificate, token"),
                region("us-east", "none"),
                // A node from before issue 27 says nothing: no warning.
                region("ap-south", ""),
            ],
            ..Default::default()
        };
        let text = cluster_status_text(&status);
        let warnings: Vec<&str> = text.lines().filter(|l| l.starts_with("WARNING:")).collect();
        assert_eq!(
            warnings,
            ["WARNING: us-east has authentication off ([auth] mode = \"none\"): anyone who can reach it may create and delete anything"]
        );
        let json = cluster_status_json(&status);
        assert_eq!(json["regions"][1]["figures"]["authentication"], "none");
    }

    fn with_schema(name: &str, version: &str, label: &str) -> v1::RegionStatus {
        let mut r = region(name, "required: token");
        if let Some(f) = r.figures.as_mut() {
            f.schema_version = version.to_owned();
            f.schema_label = label.to_owned();
        }
        r
    }

    #[test]
    fn status_shows_each_regions_schema_and_notes_when_they_differ() {
        let mut status = v1::ClusterStatus {
            answered_by: "eu-west".to_owned(),
            regions: vec![
                with_schema("eu-west", "0123456789abcdef", "volumes"),
                with_schema("us-east", "0123456789abcdef", "volumes"),
                // A node from before issue 31 says nothing: not compared.
                with_schema("ap-south", "", ""),
            ],
            ..Default::default()
        };
        let text = cluster_status_text(&status);
        assert!(text.contains("SCHEMA"), "{text}");
        assert!(text.contains("0123456789abcdef (volumes)"), "{text}");
        assert!(!text.contains("NOTE: the regions run different schemas"), "{text}");
        assert_eq!(cluster_status_json(&status)["schemas_differ"], false);

        status.regions[1] = with_schema("us-east", "fedcba9876543210", "");
        let text = cluster_status_text(&status);
        assert!(text.contains("NOTE: the regions run different schemas"), "{text}");
        let json = cluster_status_json(&status);
        assert_eq!(json["schemas_differ"], true);
        assert_eq!(json["regions"][1]["figures"]["schema_version"], "fedcba9876543210");
    }
}
