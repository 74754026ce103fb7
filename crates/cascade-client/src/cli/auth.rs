//! `cascade auth …`: helpers for `[auth] mode = "required"` that need no
//! node.

use std::io::Read;

use clap::Subcommand;

use super::ClientError;

/// `cascade auth …`.
#[derive(Debug, Clone, Subcommand)]
pub enum AuthCommand {
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

/// A token read on stdin is at most this long (a JWT is no static token).
const MAX_TOKEN_BYTES: usize = 4096;

/// A random token's bytes (printed as 64 hex digits).
const RANDOM_TOKEN_BYTES: usize = 32;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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

pub(super) fn run(command: &AuthCommand) -> Result<i32, ClientError> {
    match command {
        AuthCommand::HashToken { principal, groups } => {
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
                let mut bytes = [0u8; RANDOM_TOKEN_BYTES];
                ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
                    .map_err(|_| ClientError::Usage("no randomness for a new token".into()))?;
                (hex(&bytes), true)
            } else {
                (token.to_owned(), false)
            };
            #[allow(clippy::print_stdout)]
            {
                print!("{}", token_entry(&token, principal, groups, generated));
            }
            Ok(0)
        }
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
