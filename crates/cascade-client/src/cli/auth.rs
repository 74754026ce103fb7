//! `cascade auth …`: questions about the authorization policy.
//!
//! `cascade auth can-i VERB NAME` asks the region owning NAME whether the
//! caller (or, with `--as`, another principal: the caller needs
//! admin.impersonate) may do VERB to it, from that region's live policy,
//! and prints yes or no with the rule that decided. The exit status is
//! kubectl's: 0 yes, 1 no, 2 the question could not be answered.

use cascade_proto::v1;
use clap::{Args, Subcommand};

use super::{print_json, ClientArgs};
use crate::client::{AdminClient, ClientError};

/// `cascade auth can-i` exit status when the answer is no.
pub const EXIT_NO: i32 = 1;
/// `cascade auth can-i` exit status when the question could not be answered.
pub const EXIT_ERROR: i32 = 2;

/// `cascade auth …`.
#[derive(Debug, Clone, Args)]
pub struct AuthArgs {
    #[command(subcommand)]
    pub command: AuthCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum AuthCommand {
    /// May I (or --as another principal) do VERB to NAME? Answered by the
    /// region owning NAME, from its live policy, with the rule that
    /// decided. Exit status 0 yes, 1 no, 2 an error.
    CanI(CanIArgs),
}

/// `cascade auth can-i VERB NAME`.
#[derive(Debug, Clone, Args)]
pub struct CanIArgs {
    /// get, list, watch, create, update, delete, cascade, orphan, lien,
    /// finalize, or an Admin verb (admin.list_deletions, admin.retry_deletion,
    /// admin.force_purge, admin.list_audit, admin.cluster_status,
    /// admin.impersonate).
    pub verb: String,
    /// A resource's full name `{region}/{kind}/{id}`; omitted for a verb on
    /// a region as a whole (a listing, a watch, an Admin call: see --region).
    pub name: Option<String>,
    /// Without NAME: the region asked about (default: the one --server serves).
    #[arg(long)]
    pub region: Option<String>,
    /// Ask for this principal instead of yourself (needs admin.impersonate).
    #[arg(long = "as", value_name = "PRINCIPAL")]
    pub as_principal: Option<String>,
    /// A group of --as (repeatable).
    #[arg(long = "group", value_name = "GROUP")]
    pub groups: Vec<String>,
}

/// The request `cascade auth can-i` sends.
pub fn can_i_request(args: &CanIArgs) -> v1::CanIRequest {
    v1::CanIRequest {
        verb: args.verb.clone(),
        name: args.name.clone().unwrap_or_default(),
        as_principal: args.as_principal.clone().unwrap_or_default(),
        as_groups: args.groups.clone(),
        region: args.region.clone().unwrap_or_default(),
    }
}

/// Runs `cascade auth …`: the exit status (errors are printed and are 2,
/// so a script can tell "no" from "could not ask").
pub async fn run(client_args: &ClientArgs, args: &AuthArgs, json: bool) -> i32 {
    match &args.command {
        AuthCommand::CanI(can_i) => match ask(client_args, can_i).await {
            Ok(answer) => {
                print_answer(&answer, json);
                if answer.allowed {
                    0
                } else {
                    EXIT_NO
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                EXIT_ERROR
            }
        },
    }
}

async fn ask(client_args: &ClientArgs, args: &CanIArgs) -> Result<v1::CanIResponse, ClientError> {
    let client = AdminClient::connect_with(&client_args.server, client_args.tls.load()?.as_ref(), None).await?;
    client.can_i(can_i_request(args)).await
}

fn print_answer(answer: &v1::CanIResponse, json: bool) {
    if json {
        print_json(&serde_json::json!({
            "allowed": answer.allowed,
            "rule": answer.rule,
            "principal": answer.principal,
            "region": answer.region,
        }));
    } else {
        let word = if answer.allowed { "yes" } else { "no" };
        println!(
            "{word} (rule: {}; principal {} in region {})",
            answer.rule, answer.principal, answer.region
        );
    }
}
