//! The client subcommands of the `cascade` binary.

use std::collections::BTreeMap;
use std::io::IsTerminal;

use cascade_proto::v1;
use clap::{Args, Subcommand, ValueEnum};
use futures::StreamExt;

use crate::client::{Client, ClientError};
use crate::render;

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
    Get { name: String },
    /// List resources of the node's region.
    List {
        #[arg(long)]
        kind: Option<String>,
        /// Only resources in this state.
        #[arg(long, value_parser = ["active", "deleting"])]
        state: Option<String>,
        #[arg(long, default_value_t = 100)]
        page_size: u32,
        /// Follow pages to the end.
        #[arg(long)]
        all: bool,
    },
    /// Replace a resource's attributes, references and finalizers.
    Update {
        #[command(flatten)]
        spec: SpecArgs,
        /// Only if the resource still has this etag.
        #[arg(long)]
        etag: Option<String>,
    },
    /// Delete a resource (asynchronous: returns an operation).
    Delete {
        name: String,
        /// Also delete the resources that reference it with on_delete = cascade.
        #[arg(long)]
        cascade: bool,
        /// Show what would be deleted, unset or blocked; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Succeed when the resource does not exist.
        #[arg(long)]
        allow_missing: bool,
        #[arg(long)]
        etag: Option<String>,
        #[arg(long)]
        uid: Option<String>,
        /// Follow the operation to the end, with a progress bar.
        #[arg(long)]
        wait: bool,
    },
    /// Show a deletion operation and its per-resource outcomes.
    Operation {
        id: String,
        #[arg(long, default_value_t = 100)]
        outcomes: u32,
    },
    /// Stream resource events from a revision.
    Watch {
        #[arg(long, default_value_t = 0)]
        from: u64,
        #[arg(long)]
        kind: Option<String>,
        /// Stop after this many events.
        #[arg(long)]
        count: Option<u64>,
    },
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

fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// Runs one client command. Returns the process exit code for outcomes
/// that are not errors of the call (a waited-for operation that failed).
pub async fn run(args: &ClientArgs, command: Command) -> Result<i32, ClientError> {
    let client = Client::connect(&args.server).await?;
    let json = args.output == Output::Json;
    match command {
        Command::Create(spec) => {
            let r = client.create(parse_spec(&spec)?).await?;
            if json {
                print_json(&render::resource_json(&r));
            } else {
                print!("{}", render::resource_text(&r));
            }
        }
        Command::Get { name } => {
            let r = client.get(&name).await?;
            if json {
                print_json(&render::resource_json(&r));
            } else {
                print!("{}", render::resource_text(&r));
            }
        }
        Command::List {
            kind,
            state,
            page_size,
            all,
        } => {
            let state = match state.as_deref() {
                Some("active") => v1::ResourceState::Active,
                Some("deleting") => v1::ResourceState::Deleting,
                _ => v1::ResourceState::Unspecified,
            };
            let mut token = String::new();
            let mut items = Vec::new();
            loop {
                let page = client
                    .list(v1::ListRequest {
                        kind: kind.clone().unwrap_or_default(),
                        state: state as i32,
                        page_size,
                        page_token: token,
                    })
                    .await?;
                items.extend(page.resources);
                token = page.next_page_token;
                if !all || token.is_empty() {
                    break;
                }
            }
            if json {
                print_json(&serde_json::json!({
                    "resources": items.iter().map(render::resource_json).collect::<Vec<_>>(),
                    "next_page_token": token,
                }));
            } else {
                for r in &items {
                    println!(
                        "{:<9} {}",
                        render::resource_json(r)["state"].as_str().unwrap_or(""),
                        r.name
                    );
                }
                if !token.is_empty() {
                    println!("(more: --all, or page token {token})");
                }
            }
        }
        Command::Update { spec, etag } => {
            let r = client.update(parse_spec(&spec)?, etag.as_deref().unwrap_or("")).await?;
            if json {
                print_json(&render::resource_json(&r));
            } else {
                print!("{}", render::resource_text(&r));
            }
        }
        Command::Delete {
            name,
            cascade,
            dry_run,
            allow_missing,
            etag,
            uid,
            wait,
        } => {
            let response = client
                .delete(v1::DeleteRequest {
                    name: name.clone(),
                    cascade,
                    dry_run,
                    allow_missing,
                    etag: etag.unwrap_or_default(),
                    uid: uid.unwrap_or_default(),
                    requested_by: std::env::var("USER").unwrap_or_else(|_| "cli".to_owned()),
                })
                .await?;
            if let Some(plan) = &response.plan {
                if json {
                    print_json(&render::plan_json(plan));
                } else {
                    print!("{}", render::plan_text(plan));
                }
                return Ok(0);
            }
            let Some(op) = response.operation else {
                if json {
                    print_json(&serde_json::json!({"deleted": false, "reason": "not found (allow_missing)"}));
                } else {
                    println!("{name} does not exist; nothing to delete");
                }
                return Ok(0);
            };
            if !wait {
                if json {
                    print_json(&render::operation_json(&op));
                } else {
                    let note = if response.already_deleting {
                        " (already being deleted)"
                    } else {
                        ""
                    };
                    println!("deletion of {name} accepted{note}: operation {}", op.id);
                    println!("follow it with: cascade operation {}", op.id);
                }
                return Ok(0);
            }
            let last = follow(&client, &op.id, json).await?;
            let full = client.get_operation(&last.id, 1000).await?;
            if json {
                print_json(&render::operation_json(&full));
            } else {
                print!("{}", render::operation_text(&full));
            }
            return Ok(if full.state == v1::OperationState::Failed as i32 {
                1
            } else {
                0
            });
        }
        Command::Operation { id, outcomes } => {
            let op = client.get_operation(&id, outcomes).await?;
            if json {
                print_json(&render::operation_json(&op));
            } else {
                print!("{}", render::operation_text(&op));
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

/// Follows an operation to its end, drawing a progress bar on a terminal.
async fn follow(client: &Client, id: &str, quiet: bool) -> Result<v1::Operation, ClientError> {
    let bar = if quiet || !std::io::stderr().is_terminal() {
        indicatif::ProgressBar::hidden()
    } else {
        let bar = indicatif::ProgressBar::new(1);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} [{bar:40}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    };
    let mut stream = client.watch_operation(id).await?;
    let mut last = None;
    while let Some(op) = stream.next().await {
        let op = op?;
        let p = op.progress.unwrap_or_default();
        bar.set_length((p.deleted + p.pending + p.failed).max(1));
        bar.set_position(p.deleted + p.failed);
        bar.set_message(render::progress_text(&op));
        let done = op.done;
        last = Some(op);
        if done {
            break;
        }
    }
    bar.finish_and_clear();
    match last {
        Some(op) => Ok(op),
        None => Err(ClientError::Usage(format!(
            "the watch of operation {id} ended without a report"
        ))),
    }
}
