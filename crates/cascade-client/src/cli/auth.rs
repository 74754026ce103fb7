//! `cascade auth …`: credentials for nodes with `[auth] mode =
//! "required"`, and questions about the authorization policy.
//!
//! `cascade auth hash-token` prints a static token's `[[token]]` entry for
//! a node's `tokens_file` (no node is asked). `cascade auth can-i VERB NAME`
//! asks the region owning NAME whether the caller (or, with `--as`, another
//! principal: the caller needs admin.impersonate) may do VERB to it, from
//! that region's live policy, and prints yes or no with the rule that
//! decided. Its exit status is kubectl's: 0 yes, 1 no, 2 the question could
//! not be answered.

use std::io::Read;

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
    /// Print the `[[token]]` entry of a static token for a node's
    /// `tokens_file`: the token is read from stdin (a new random one is made
    /// and printed, once, when stdin is empty). Only its SHA-256 goes into
    /// the file; the caller sends the token (`--token`, `CASCADE_TOKEN`).
    /// Does not use --server.
    HashToken {
        /// The principal the token proves.
        #[arg(long, default_value = "CHANGE-ME")]
        principal: String,
        /// A group of the principal (repeatable).
        #[arg(long = "group")]
        groups: Vec<String>,
    },
}

/// `cascade auth can-i VERB NAME`.
#[derive(Debug, Clone, Args)]
pub struct CanIArgs {
    /// get, list, watch, create, update, delete, cascade, orphan, lien,
    /// finalize, operation.pause, operation.resume, operation.cancel (on an
    /// operation's root), undelete (on a deletion's root), or an Admin verb (admin.list_deletions,
    /// admin.retry_deletion, admin.force_purge, admin.list_audit,
    /// admin.cluster_status, admin.impersonate, admin.purge,
    /// admin.extend_budget, admin.check_schema).
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

/// A token read on stdin is at most this long (a JWT is no static token).
const MAX_TOKEN_BYTES: usize = 4096;

/// A random token's bytes (printed as 64 hex digits).
const RANDOM_TOKEN_BYTES: usize = 32;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new random static token (64 hex digits, from the system's secure
/// random source): what `cascade auth hash-token` makes on empty stdin,
/// and the demo's tokens.
pub fn random_token() -> Result<String, ClientError> {
    let mut bytes = [0u8; RANDOM_TOKEN_BYTES];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| ClientError::Usage("no randomness for a new token".into()))?;
    Ok(hex(&bytes))
}

/// The text `cascade auth hash-token` prints for `token` (and says the
/// token too when it was made here).
pub fn token_entry(token: &str, principal: &str, groups: &[String], generated: bool) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let quoted = |s: &str| toml::Value::String(s.to_owned()).to_string();
    let groups: Vec<String> = groups.iter().map(|g| quoted(g)).collect();
    let mut out = String::new();
    if generated {
        out += &format!("# the new token (give it to {principal}; it is stored nowhere): {token}\n");
    }
    out += &format!(
        "[[token]]\nprincipal = {}\ngroups = [{}]\nsha256 = \"{}\"\n",
        quoted(principal),
        groups.join(", "),
        hex(digest.as_ref())
    );
    out
}

/// Runs `cascade auth …`: the exit status (errors of can-i are printed
/// and are 2, so a script can tell "no" from "could not ask").
pub async fn run(client_args: &ClientArgs, args: &AuthArgs, json: bool) -> Result<i32, ClientError> {
    match &args.command {
        AuthCommand::HashToken { principal, groups } => hash_token(principal, groups),
        AuthCommand::CanI(can_i) => Ok(match ask(client_args, can_i).await {
            Ok(answer) => {
                print_answer(&answer, json);
                if answer.allowed {
                    0
                } else {
                    EXIT_NO
                }
            }
            Err(e) => {
                #[allow(clippy::print_stderr)]
                {
                    eprintln!("error: {e}");
                }
                EXIT_ERROR
            }
        }),
    }
}

fn hash_token(principal: &str, groups: &[String]) -> Result<i32, ClientError> {
    let mut input = String::new();
    std::io::stdin()
        .take(MAX_TOKEN_BYTES as u64 + 1)
        .read_to_string(&mut input)
        .map_err(|e| ClientError::Usage(format!("reading the token from stdin: {e}")))?;
    let token = input.trim();
    if token.len() > MAX_TOKEN_BYTES {
        return Err(ClientError::Usage(format!(
            "a token is at most {MAX_TOKEN_BYTES} bytes"
        )));
    }
    let (token, generated) = if token.is_empty() {
        (random_token()?, true)
    } else {
        (token.to_owned(), false)
    };
    #[allow(clippy::print_stdout)]
    {
        print!("{}", token_entry(&token, principal, groups, generated));
    }
    Ok(0)
}

async fn ask(client_args: &ClientArgs, args: &CanIArgs) -> Result<v1::CanIResponse, ClientError> {
    let client = AdminClient::connect_with(
        &client_args.server,
        client_args.tls.load()?.as_ref(),
        client_args.bearer().map(str::to_owned),
    )
    .await?;
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
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entry_holds_the_hash_never_the_token() {
        let entry = token_entry("s3cret", "ci-bot", &["deployers".to_owned()], false);
        // SHA-256("s3cret"), as `printf s3cret | sha256sum` prints it.
        let expected = "1ec1c26b50d5d3c58d9583181af8076655fe00756bf7285940ba3670f99fcba0";
        assert_eq!(
            entry,
            format!("[[token]]\nprincipal = \"ci-bot\"\ngroups = [\"deployers\"]\nsha256 = \"{expected}\"\n")
        );
        assert!(!entry.contains("s3cret"));
        // Whatever the principal holds, the entry reads back as it (TOML quoting).
        let odd: toml::Table = toml::from_str(&token_entry("t", "a\"b'c", &[], true)).unwrap();
        assert_eq!(odd["token"][0]["principal"].as_str(), Some("a\"b'c"));
    }
}
