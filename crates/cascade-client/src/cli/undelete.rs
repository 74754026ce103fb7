//! `cascade undelete`: takes back a soft-deleting operation (issue 29) in
//! every region, or (`--dry-run`) shows what would come back and what
//! would not, changing nothing.

use cascade_proto::v1;
use clap::Args;

use super::{print_json, wall_clock_ms};
use crate::client::{Client, ClientError};
use crate::render::{self, TimeDisplay};

/// `cascade undelete OP_ID|NAME [--dry-run]`.
#[derive(Debug, Clone, Args)]
pub struct UndeleteArgs {
    /// The soft-deleting operation's id, or its root's name
    /// (`region/kind/id`: the operation that buried it).
    pub target: String,
    /// Show what would be restored and what would not (and why); change
    /// nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Exit status of `cascade undelete` when a region could not be asked:
/// the rest is restored, and its part finishes when it returns.
pub const EXIT_REGION_LEFT: i32 = 6;

/// Runs it: exit status 0 when everything was (or would be) restored, 1
/// when something was not (each such outcome says why), or on an error;
/// [`EXIT_REGION_LEFT`] when a region could not be asked.
pub async fn run(client: &Client, args: UndeleteArgs, json: bool, times: &TimeDisplay) -> Result<i32, ClientError> {
    let (operation_id, name) = if args.target.contains('/') {
        (String::new(), args.target)
    } else {
        (args.target, String::new())
    };
    let answer = client
        .undelete(v1::UndeleteRequest {
            operation_id,
            name,
            dry_run: args.dry_run,
        })
        .await?;
    if json {
        print_json(&render::undelete_json(&answer));
    } else {
        print!("{}", render::undelete_text(&answer, &times.at(wall_clock_ms())));
    }
    Ok(exit_status(&answer))
}

fn exit_status(answer: &v1::UndeleteResponse) -> i32 {
    let not_restored = |o: &v1::Outcome| o.action == v1::OutcomeAction::NotRestored as i32;
    let lost = match &answer.operation {
        Some(op) => op.progress.is_some_and(|p| p.not_restored > 0),
        None => answer.planned.iter().any(not_restored),
    };
    if !answer.unreachable_regions.is_empty() {
        EXIT_REGION_LEFT
    } else {
        i32::from(lost)
    }
}
