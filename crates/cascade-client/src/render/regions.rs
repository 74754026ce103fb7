//! An operation's progress per region (`Operation.region_progress`): the
//! lines `cascade operation` prints under the totals, and the JSON field.

use cascade_proto::v1;
use serde_json::{json, Value};

use super::{op_state_name, table};

/// One line per region of `Operation.region_progress`, under the totals
/// and with the same words; nothing when the node sent none (one region).
pub(super) fn region_progress_text(op: &v1::Operation) -> String {
    if op.region_progress.len() < 2 {
        return String::new();
    }
    let rows: Vec<Vec<String>> = op
        .region_progress
        .iter()
        .map(|r| {
            let said = if r.reachable {
                let p = r.progress.unwrap_or_default();
                if op.undelete_of.is_empty() {
                    format!(
                        "{} deleted, {} unset, {} pending ({} blocked), {} failed",
                        p.deleted, p.unset, p.pending, p.blocked, p.failed
                    )
                } else {
                    format!("{} restored, {} not restored", p.restored, p.not_restored)
                }
            } else {
                "unreachable (its part is unknown)".to_owned()
            };
            vec![format!("    {}", r.region), said]
        })
        .collect();
    table(&rows)
}

/// Each region's counters as JSON, with whether it could be read.
pub(super) fn region_progress_json(op: &v1::Operation) -> Value {
    Value::Array(
        op.region_progress
            .iter()
            .map(|r| {
                let p = r.progress.unwrap_or_default();
                json!({
                    "region": r.region,
                    "reachable": r.reachable,
                    "state": op_state_name(r.state),
                    "progress": {"deleted": p.deleted, "unset": p.unset, "pending": p.pending, "blocked": p.blocked,
                        "failed": p.failed, "restored": p.restored, "not_restored": p.not_restored},
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_region_is_a_line_under_the_totals_and_an_unreachable_one_says_so() {
        let op = v1::Operation {
            region_progress: vec![
                v1::RegionProgress {
                    region: "ap-south".into(),
                    progress: Some(v1::Progress {
                        deleted: 1,
                        unset: 1,
                        ..Default::default()
                    }),
                    reachable: true,
                    state: v1::OperationState::Succeeded as i32,
                },
                v1::RegionProgress {
                    region: "eu-west".into(),
                    reachable: false,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            region_progress_text(&op),
            "    ap-south  1 deleted, 1 unset, 0 pending (0 blocked), 0 failed\n    eu-west   unreachable (its part is unknown)\n"
        );
        let one = v1::Operation {
            region_progress: op.region_progress[..1].to_vec(),
            ..Default::default()
        };
        assert_eq!(region_progress_text(&one), "", "one region: the totals say it all");
    }
}
