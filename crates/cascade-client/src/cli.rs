//! The client subcommands of the `cascade` binary.

// The command-line front end: its results go to stdout.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::BTreeMap;

use cascade_proto::v1;
use clap::{Args, Subcommand, ValueEnum};
use futures::StreamExt;

mod admin;
mod auth;
mod delete;
mod find;
mod node_config;
mod observe;
mod schema;
mod undelete;
use crate::client::{AdminClient, Client, ClientError, ClientTls};
use crate::render::{self, TimeDisplay};
pub use admin::{AdminArgs, AdminCommand, AuditArgs, DeletionStatusArg};
pub use auth::{random_token, token_entry, AuthArgs, AuthCommand, CanIArgs};
pub use delete::{DeleteArgs, OperationControl, EXIT_NOT_CONFIRMED, EXIT_STUCK, EXIT_WOULD_BE_HELD};
use node_config::run_check;
pub use node_config::CheckArgs;
pub use observe::HealthArgs;
pub use schema::SchemaCommand;
use schema::{run_schema_check, run_schema_diff, run_schema_diff_against};
pub use undelete::UndeleteArgs;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// Options every client command takes.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Address of any node.
    #[arg(
        long,
        global = true,
        env = "CASCADE_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    pub server: String,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value = "text")]
    pub output: Output,
    /// Show times in UTC instead of the local time zone (`TZ`). `-o json`
    /// is always UTC (RFC 3339).
    #[arg(long, global = true)]
    pub utc: bool,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// A bearer credential (a static token of the node's tokens file, or a
    /// JWT) sent with every call, for nodes with `[auth] mode = "required"`.
    /// A client certificate (--cert/--key) is the other way.
    #[arg(
        long,
        global = true,
        env = "CASCADE_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
}

impl ClientArgs {
    /// The caller's bearer credential, if any (an empty `CASCADE_TOKEN` is none).
    pub fn bearer(&self) -> Option<&str> {
        self.token.as_deref().filter(|t| !t.is_empty())
    }

    /// A Resources client of `--server` with these TLS settings and credentials.
    pub async fn resources_client(&self) -> Result<Client, ClientError> {
        let client = Client::connect_with(&self.server, self.tls.load()?.as_ref()).await?;
        match self.bearer() {
            Some(token) => client.with_token(token),
            None => Ok(client),
        }
    }
}

/// TLS for `https://` nodes.
#[derive(Debug, Clone, Default, Args)]
pub struct TlsArgs {
    /// The cluster's CA certificate (PEM); needed for `https://` addresses.
    #[arg(long, global = true, env = "CASCADE_CA_CERT", value_name = "FILE")]
    pub ca_cert: Option<std::path::PathBuf>,
    /// A certificate to present (PEM), with --key: a region's for Peer
    /// calls (`cascade check`), or one `[admin] identities` names for
    /// `cascade admin` (instead of the token).
    #[arg(long, global = true, env = "CASCADE_CERT", value_name = "FILE", requires = "key")]
    pub cert: Option<std::path::PathBuf>,
    /// The private key of --cert (PEM).
    #[arg(long, global = true, env = "CASCADE_KEY", value_name = "FILE", requires = "cert")]
    pub key: Option<std::path::PathBuf>,
    /// The name the server's certificate must carry, when the address is
    /// not one of its names (e.g. `eu-west.cascade`).
    #[arg(long, global = true, value_name = "NAME")]
    pub tls_server_name: Option<String>,
}

impl TlsArgs {
    /// None without --ca-cert (plain text).
    pub fn load(&self) -> Result<Option<ClientTls>, ClientError> {
        let Some(ca) = &self.ca_cert else {
            if self.cert.is_some() {
                return Err(ClientError::Usage("--cert needs --ca-cert (the cluster's CA)".into()));
            }
            return Ok(None);
        };
        let identity = self.cert.as_deref().zip(self.key.as_deref());
        ClientTls::load(ca, identity, self.tls_server_name.clone())
            .map(Some)
            .map_err(|e| ClientError::Usage(e.to_string()))
    }
}

/// A resource's content on the command line.
#[derive(Debug, Clone, Args)]
pub struct SpecArgs {
    /// `{region}/{kind}/{id}`
    pub name: String,
    /// An attribute, `key=value` (repeatable).
    #[arg(long = "attr", value_name = "KEY=VALUE")]
    pub attributes: Vec<String>,
    /// A reference, `field=target[,target…]` with full target names (repeatable).
    #[arg(long = "ref", value_name = "FIELD=TARGETS")]
    pub refs: Vec<String>,
    /// A finalizer that must be removed before the resource can be purged (repeatable).
    #[arg(long = "finalizer")]
    pub finalizers: Vec<String>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Create a resource.
    Create(SpecArgs),
    /// Show a resource (a DELETING one shows its deletion).
    Get {
        name: String,
        /// Also show a soft-deleted (DELETED) resource, with when it was
        /// deleted and when it is purged (without, it is not found).
        #[arg(long)]
        show_deleted: bool,
    },
    /// List resources: of the node's region, of another (--region), or
    /// of every region (--all-regions); by prefix, state or attribute
    /// selector (-l); or the references into (--referencing) or out of
    /// (--referenced-by) a resource. Exit status 1 when a region did not
    /// answer (the listing is incomplete; stderr names it).
    List(find::ListArgs),
    /// Draw what a resource owns across regions, as `kubectl tree` does:
    /// the resource and, recursively, its referrers, each with its state,
    /// the field and its on_delete policy.
    Tree(find::TreeArgs),
    /// Replace a resource's attributes, references and finalizers.
    Update {
        #[command(flatten)]
        spec: SpecArgs,
        /// Only if the resource still has this etag.
        #[arg(long)]
        etag: Option<String>,
    },
    /// Delete a resource (asynchronous: returns an operation).
    ///
    /// A --cascade shows its plan first (members per region, their number,
    /// its token) and is then bound to it: it deletes exactly that closure
    /// or is refused (ABORTED, naming what changed since), changing
    /// nothing. Above --confirm-above members it asks y/N on a terminal;
    /// without one it needs --yes.
    ///
    /// Exit status: 0 accepted (or done, with --wait), 1 an error (a
    /// changed plan included) or (with --wait) a failed operation, 3 a
    /// --cascade that members would be held in and no --allow-blocked
    /// (nothing changed), 4 (with --wait) a deletion stuck on something
    /// only a person can free, 5 a large cascade not confirmed (no --yes,
    /// no terminal, or not answered y: nothing changed).
    Delete(DeleteArgs),
    /// Take back a soft-deleting operation (a Delete with a retention, or
    /// of kinds with `retain`), in every region it reached: every member
    /// it buried comes back with its uid, attributes and references, and
    /// each reference it unset is put back where the referrer did not
    /// change since. What cannot come back (its window passed, the
    /// referrer changed, a target is gone) is listed NOT_RESTORED with the
    /// reason; the rest is restored. Name the operation by its id or by
    /// its root's name. A region that cannot be asked finishes when it
    /// returns (the node retries). `cascade operation ID` shows it later.
    ///
    /// Exit status: 0 everything restored (or, --dry-run, would be), 1
    /// something not restored or an error, 6 a region not asked yet (the
    /// node finishes its part when it returns).
    Undelete(UndeleteArgs),
    /// Protect a resource against deletion, or lift a protection.
    #[command(subcommand)]
    Lien(LienCommand),
    /// Answer for a finalizer controller: its cleanup is done, or failed.
    #[command(subcommand)]
    Finalizer(FinalizerCommand),
    /// Operators' calls (cascade.v1.Admin): stuck deletions, retry, audit log.
    Admin(AdminArgs),
    /// One region's audit log (the same as `cascade admin audit`): who
    /// changed or was refused what, through which node and region, by
    /// which rule. `-o json` exports JSON lines.
    Audit(AuditArgs),
    /// Credentials for nodes with `[auth] mode = "required"` (`cascade auth
    /// hash-token`), and questions about the policy (`cascade auth can-i
    /// VERB NAME`).
    Auth(AuthArgs),
    /// Ask a node's gRPC health (`grpc.health.v1.Health/Check`) as a load
    /// balancer or a Kubernetes probe does. Prints SERVING or NOT_SERVING
    /// (the node cannot commit); exits 0 only when SERVING, 1 otherwise
    /// (also when the node does not answer).
    Health(HealthArgs),
    /// Every region of the cluster on one screen, as --server sees it:
    /// address, reachable or not (and why), its link, how many events it
    /// is behind, its deletions by status and the oldest one's age.
    /// Exits 1 when a region is unreachable.
    Status,
    /// What a deletion still waits on, in every region, as a tree: a
    /// DELETING resource's operation, or an operation id.
    Explain {
        /// A resource name (`region/kind/id`) or an operation id.
        target: String,
    },
    /// Show a deletion operation and its per-resource outcomes; or pause,
    /// resume or cancel it, in every region (`cascade operation pause ID`).
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Operation {
        #[arg(required = true)]
        id: Option<String>,
        #[arg(long, default_value_t = 100)]
        outcomes: u32,
        #[command(subcommand)]
        control: Option<OperationControl>,
    },
    /// Stream resource events from a revision.
    Watch {
        /// The first revision to show (the last one seen + 1); 0, the
        /// default, is the oldest the node still keeps.
        #[arg(long, default_value_t = 0)]
        from: u64,
        #[arg(long)]
        kind: Option<String>,
        /// Stop after this many events.
        #[arg(long)]
        count: Option<u64>,
    },
    /// Check a schema file, or compare two without a node (does not use
    /// --server), or check one against a running node (`diff --against`).
    #[command(subcommand)]
    Schema(SchemaCommand),
    /// Check the cross-region invariants of a whole cluster (at quiescence).
    ///
    /// Reads every region's `Peer.Dump`; exits 1 when it finds a violation.
    /// Run it when nothing is in flight: findings during a deletion may be
    /// transient (a region with queued releases or attaches is reported as
    /// not quiescent). Does not use --server.
    Check(CheckArgs),
}

/// `cascade finalizer …`: what a finalizer controller calls.
#[derive(Debug, Clone, Subcommand)]
pub enum FinalizerCommand {
    /// The cleanup is done: remove the finalizer (a deletion it held goes
    /// on, even a FAILED one). Removing one the resource no longer lists
    /// changes nothing.
    Remove {
        name: String,
        finalizer: String,
        /// Only this incarnation of the resource (NOT_FOUND otherwise).
        #[arg(long)]
        uid: Option<String>,
    },
    /// The cleanup failed: the deletion stays BLOCKED and the controller is
    /// asked again (an EVENT_TYPE_FINALIZER_RETRY event) after the backoff;
    /// at the maximum of failures the deletion is FAILED with this reason.
    Fail {
        name: String,
        finalizer: String,
        /// Why it failed (required).
        #[arg(long)]
        reason: String,
        /// Only this incarnation of the resource (NOT_FOUND otherwise).
        #[arg(long)]
        uid: Option<String>,
    },
}

/// `cascade lien …`.
#[derive(Debug, Clone, Subcommand)]
pub enum LienCommand {
    /// Place a lien: deleting the resource is refused, and a cascade that
    /// reaches it waits, until the lien is removed.
    Add {
        name: String,
        /// The lien's id (unique on the resource).
        id: String,
        /// Why the resource is protected (required).
        #[arg(long)]
        reason: String,
    },
    /// Remove a lien; a deletion it held goes on.
    Remove { name: String, id: String },
}

fn parse_spec(args: &SpecArgs) -> Result<v1::ResourceSpec, ClientError> {
    let mut attributes = std::collections::HashMap::new();
    for a in &args.attributes {
        let (k, v) = a
            .split_once('=')
            .ok_or_else(|| ClientError::Usage(format!("--attr {a:?}: expected KEY=VALUE")))?;
        attributes.insert(k.to_owned(), v.to_owned());
    }
    let mut refs: BTreeMap<String, Vec<v1::ObjectRef>> = BTreeMap::new();
    for r in &args.refs {
        let (field, targets) = r
            .split_once('=')
            .ok_or_else(|| ClientError::Usage(format!("--ref {r:?}: expected FIELD=TARGET[,TARGET…]")))?;
        let entry = refs.entry(field.to_owned()).or_default();
        for t in targets.split(',').filter(|t| !t.is_empty()) {
            entry.push(v1::ObjectRef {
                name: t.to_owned(),
                ..Default::default()
            });
        }
    }
    Ok(v1::ResourceSpec {
        name: args.name.clone(),
        attributes,
        refs: refs
            .into_iter()
            .map(|(field, targets)| v1::ReferenceField { field, targets })
            .collect(),
        finalizers: args.finalizers.clone(),
    })
}

/// Who the CLI says is asking: the login name.
pub(crate) fn requester() -> String {
    std::env::var("USER").unwrap_or_else(|_| "cli".to_owned())
}

pub(crate) fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// The client's wall clock, read once per command: text output counts ages
/// against it (against the server's own time where an answer carries one).
// The CLI is not a node: this reading only labels output and decides
// nothing (clippy.toml keeps the clock out of the nodes).
#[allow(clippy::disallowed_methods)]
pub(crate) fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Runs one client command. Returns the process exit code for outcomes
/// that are not errors of the call (a waited-for operation that failed).
pub async fn run(args: &ClientArgs, command: Command) -> Result<i32, ClientError> {
    let json = args.output == Output::Json;
    let times = TimeDisplay::new(args.utc, wall_clock_ms());
    if let Command::Check(check_args) = &command {
        // Reads every region itself: no --server connection.
        return run_check(check_args, &args.tls, json).await;
    }
    if let Command::Schema(SchemaCommand::Check { file }) = &command {
        return run_schema_check(file, json);
    }
    if let Command::Schema(SchemaCommand::Diff {
        files,
        against,
        admin_token,
    }) = &command
    {
        return match against {
            Some(endpoint) => run_schema_diff_against(args, files, endpoint, admin_token.clone(), json).await,
            None => run_schema_diff(files, json),
        };
    }
    if let Command::Health(health) = &command {
        return observe::run_health(health, args, json).await;
    }
    let admin_call = match &command {
        Command::Admin(admin) => Some((admin.admin_token.clone(), admin.command.clone())),
        Command::Audit(audit) => Some((
            std::env::var("CASCADE_ADMIN_TOKEN").ok(),
            AdminCommand::Audit(audit.clone()),
        )),
        _ => None,
    };
    if let Some((admin_token, admin_command)) = admin_call {
        // An empty CASCADE_ADMIN_TOKEN is no token; without one, the
        // caller's credential (`--token`, `[auth] mode = "required"`).
        let token = admin_token
            .filter(|t| !t.is_empty())
            .or_else(|| args.bearer().map(str::to_owned));
        let client = AdminClient::connect_with(&args.server, args.tls.load()?.as_ref(), token).await?;
        return admin::run(&client, args, admin_command, json, &times).await;
    }
    if let Command::Auth(auth) = &command {
        return auth::run(args, auth, json).await;
    }
    if let Command::Status = &command {
        return observe::run_status(args, json).await;
    }
    let client = args.resources_client().await?;
    match command {
        Command::Check(_)
        | Command::Schema(_)
        | Command::Auth(_)
        | Command::Admin(_)
        | Command::Audit(_)
        | Command::Status
        | Command::Health(_) => {
            unreachable!("handled above")
        }
        Command::Create(spec) => {
            let r = client.create(parse_spec(&spec)?).await?;
            if json {
                print_json(&render::resource_json(&r));
            } else {
                print!("{}", render::resource_text(&r, &times));
            }
        }
        Command::Get { name, show_deleted } => {
            let r = client.get_with(&name, show_deleted).await?;
            if json {
                print_json(&render::resource_json(&r));
            } else {
                print!("{}", render::resource_text(&r, &times));
            }
        }
        Command::List(list) => return find::run_list(&client, list, json, &times).await,
        Command::Tree(tree) => return find::run_tree(&client, tree, json).await,
        Command::Update { spec, etag } => {
            let r = client.update(parse_spec(&spec)?, etag.as_deref().unwrap_or("")).await?;
            if json {
                print_json(&render::resource_json(&r));
            } else {
                print!("{}", render::resource_text(&r, &times));
            }
        }
        Command::Finalizer(command) => {
            let r = match command {
                FinalizerCommand::Remove { name, finalizer, uid } => {
                    client
                        .remove_finalizer(v1::RemoveFinalizerRequest {
                            name,
                            uid: uid.unwrap_or_default(),
                            finalizer,
                        })
                        .await?
                }
                FinalizerCommand::Fail {
                    name,
                    finalizer,
                    reason,
                    uid,
                } => {
                    client
                        .report_finalizer_failure(v1::ReportFinalizerFailureRequest {
                            name,
                            uid: uid.unwrap_or_default(),
                            finalizer,
                            reason,
                        })
                        .await?
                }
            };
            if json {
                print_json(&render::resource_json(&r));
            } else {
                print!("{}", render::resource_text(&r, &times));
            }
        }
        Command::Lien(lien) => {
            let r = match lien {
                LienCommand::Add { name, id, reason } => {
                    client
                        .add_lien(v1::AddLienRequest {
                            name,
                            lien_id: id,
                            reason,
                            requested_by: requester(),
                            etag: String::new(),
                        })
                        .await?
                }
                LienCommand::Remove { name, id } => {
                    client
                        .remove_lien(v1::RemoveLienRequest {
                            name,
                            lien_id: id,
                            etag: String::new(),
                        })
                        .await?
                }
            };
            if json {
                print_json(&render::resource_json(&r));
            } else {
                print!("{}", render::resource_text(&r, &times));
            }
        }
        Command::Delete(delete) => return delete::run(&client, delete, json, &times).await,
        Command::Undelete(args) => return undelete::run(&client, args, json, &times).await,
        Command::Explain { target } => {
            let req = if target.contains('/') {
                v1::ExplainDeletionRequest {
                    name: target,
                    operation_id: String::new(),
                }
            } else {
                v1::ExplainDeletionRequest {
                    name: String::new(),
                    operation_id: target,
                }
            };
            let e = client.explain_deletion(req).await?;
            if json {
                print_json(&render::explanation_json(&e));
            } else {
                print!("{}", render::explanation_text(&e));
            }
            return Ok(i32::from(e.stuck));
        }
        Command::Operation {
            control: Some(control), ..
        } => {
            let op = control.run(&client).await?;
            if json {
                print_json(&render::operation_json(&op));
            } else {
                print!("{}", control.text(&op));
            }
        }
        Command::Operation { id, outcomes, .. } => {
            let id = id.ok_or_else(|| ClientError::Usage("cascade operation ID (or pause|resume|cancel ID)".into()))?;
            let op = client.get_operation(&id, outcomes).await?;
            if json {
                print_json(&render::operation_json(&op));
            } else {
                print!("{}", render::operation_text(&op, &times));
            }
        }
        Command::Watch { from, kind, count } => {
            let mut stream = client.watch(from, kind.as_deref().unwrap_or("")).await?;
            let mut seen = 0u64;
            while let Some(e) = stream.next().await {
                let e = e?;
                if json {
                    println!("{}", render::event_json(&e));
                } else {
                    println!("{}", render::event_text(&e));
                }
                seen += 1;
                if count.is_some_and(|c| seen >= c) {
                    break;
                }
            }
        }
    }
    Ok(0)
}
