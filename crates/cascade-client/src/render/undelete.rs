//! An Undelete's answer (issue 29): the undelete operation, in the style of
//! an accepted delete's, or a dry run's decisions.

use cascade_proto::v1;
use serde_json::{json, Value};

use super::{object_ref, operation_json, operation_text, table, TimeDisplay};

pub fn undelete_json(u: &v1::UndeleteResponse) -> Value {
    json!({
        "undelete_of": u.undelete_of,
        "operation": u.operation.as_ref().map(operation_json),
        "planned": u.planned.iter().map(|o| json!({
            "resource": o.resource.as_ref().map(object_ref),
            "action": action_name(o),
            "message": o.message,
            "region": o.region,
        })).collect::<Vec<_>>(),
        "planned_more": u.planned_more,
        "unreachable_regions": u.unreachable_regions,
    })
}

pub fn undelete_text(u: &v1::UndeleteResponse, times: &TimeDisplay) -> String {
    let mut out = String::new();
    if let Some(op) = &u.operation {
        out += &format!("undelete of {}\n", u.undelete_of);
        out += &operation_text(op, times);
        if !op.undelete_regions_left.is_empty() {
            out += &format!(
                "  still to finish (the node retries until they answer): {}\n",
                op.undelete_regions_left.join(", ")
            );
        }
        return out;
    }
    let restored = u
        .planned
        .iter()
        .filter(|o| o.action == v1::OutcomeAction::Restored as i32)
        .count();
    out += &format!(
        "dry run: undelete of {} would restore {restored}, not {}{}\n",
        u.undelete_of,
        u.planned.len() - restored,
        if u.planned_more > 0 {
            format!(" (and {} more not listed)", u.planned_more)
        } else {
            String::new()
        }
    );
    if !u.unreachable_regions.is_empty() {
        out += &format!(
            "  regions that could not be asked (their part is unknown): {}\n",
            u.unreachable_regions.join(", ")
        );
    }
    let rows: Vec<Vec<String>> = u
        .planned
        .iter()
        .map(|o| {
            vec![
                format!("  {}", action_name(o)),
                o.resource.as_ref().map(|r| r.name.clone()).unwrap_or_default(),
                o.message.clone(),
            ]
        })
        .collect();
    out += &table(&rows);
    out
}

fn action_name(o: &v1::Outcome) -> String {
    v1::OutcomeAction::try_from(o.action)
        .map(|a| a.as_str_name().trim_start_matches("OUTCOME_ACTION_").to_owned())
        .unwrap_or_default()
}
