//! `cascade list` (one region, another, or every region; selectors; the
//! references into or out of a resource) and `cascade tree` (what a
//! resource owns across regions, drawn as `kubectl tree` draws it).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use cascade_proto::v1;
use clap::Args;
use serde_json::{json, Value};

use super::print_json;
use crate::client::{Client, ClientError};
use crate::render::{self, TimeDisplay};

/// `cascade list`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Only resources of this kind.
    #[arg(long)]
    pub kind: Option<String>,
    /// Only resources in this state (`deleted`: the soft-deleted ones).
    #[arg(long, value_parser = ["active", "deleting", "deleted"])]
    pub state: Option<String>,
    /// Also list soft-deleted (DELETED) resources, with when each is
    /// purged (EXPIRES).
    #[arg(long)]
    pub show_deleted: bool,
    /// Only resources whose id (the part after `region/kind/`) starts with this.
    #[arg(long, value_name = "P")]
    pub prefix: Option<String>,
    /// Only resources whose attributes match, in the Kubernetes
    /// label-selector grammar: `env=staging,tier!=db`, `tier in (web,db)`,
    /// `tier notin (db)`, `tier`, `!tier`.
    #[arg(short = 'l', long = "selector", value_name = "SEL")]
    pub selector: Option<String>,
    /// List this region (the node asked forwards to its node); default:
    /// the region of the node asked.
    #[arg(long, value_name = "R", conflicts_with = "all_regions")]
    pub region: Option<String>,
    /// List every region, merged by name. A region that does not answer
    /// is named on stderr ("the listing is incomplete") and the exit
    /// status is 1.
    #[arg(long)]
    pub all_regions: bool,
    /// Who points at NAME, in every region (REFERRER FIELD POLICY TARGET),
    /// from the back-references its owner keeps.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["referenced_by", "kind", "state", "prefix", "selector", "region", "all_regions"])]
    pub referencing: Option<String>,
    /// What NAME points at (REFERRER FIELD POLICY TARGET).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["kind", "state", "prefix", "selector", "region", "all_regions"])]
    pub referenced_by: Option<String>,
    #[arg(long, default_value_t = 100)]
    pub page_size: u32,
    /// Start from this page token (the one a previous page printed).
    #[arg(long, value_name = "TOKEN")]
    pub page_token: Option<String>,
    /// Follow pages to the end (under selectors a page may hold fewer
    /// items than asked, even none: only an empty token ends a listing).
    #[arg(long)]
    pub all: bool,
    /// The deadline of each call, in seconds (the node's own default
    /// otherwise: 5 s for every region together).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
}

/// `cascade tree`.
#[derive(Debug, Clone, Args)]
pub struct TreeArgs {
    /// The resource at the root, `region/kind/id`.
    pub name: String,
    /// Levels of referrers below the root, at most.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=32))]
    pub depth: u32,
    /// Resources drawn, at most.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=5000))]
    pub max_nodes: u32,
}

/// A state as the API names it, without the enum's prefix (`ACTIVE`).
fn state_name(state: i32) -> String {
    v1::ResourceState::try_from(state)
        .map(|s| s.as_str_name().trim_start_matches("RESOURCE_STATE_").to_owned())
        .unwrap_or_else(|_| state.to_string())
}

/// A header row and the rows under it, aligned (render's one table).
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    let all: Vec<Vec<String>> = std::iter::once(header).chain(rows.iter().cloned()).collect();
    render::table(&all)
}

/// Runs `cascade list`; exit status 1 when a region did not answer.
pub async fn run_list(client: &Client, args: ListArgs, json: bool, times: &TimeDisplay) -> Result<i32, ClientError> {
    if let Some(name) = args.referencing.clone() {
        return run_references(client, &args, name, v1::ReferenceDirection::Referrers, json).await;
    }
    if let Some(name) = args.referenced_by.clone() {
        return run_references(client, &args, name, v1::ReferenceDirection::Targets, json).await;
    }
    let state = match args.state.as_deref() {
        Some("active") => v1::ResourceState::Active,
        Some("deleting") => v1::ResourceState::Deleting,
        Some("deleted") => v1::ResourceState::Deleted,
        _ => v1::ResourceState::Unspecified,
    };
    let deadline = deadline_of(&args)?;
    let mut token = args.page_token.clone().unwrap_or_default();
    let mut items = Vec::new();
    let mut unreachable: BTreeMap<String, v1::UnreachableRegion> = BTreeMap::new();
    loop {
        let req = v1::ListRequest {
            kind: args.kind.clone().unwrap_or_default(),
            state: state as i32,
            page_size: args.page_size,
            page_token: token.clone(),
            region: args.region.clone().unwrap_or_default(),
            all_regions: args.all_regions,
            name_prefix: args.prefix.clone().unwrap_or_default(),
            attribute_selector: args.selector.clone().unwrap_or_default(),
            show_deleted: args.show_deleted,
        };
        let page = match deadline {
            Some(d) => client.list_within(req, d).await?,
            None => client.list(req).await?,
        };
        items.extend(page.resources);
        for u in page.unreachable {
            unreachable.insert(u.region.clone(), u);
        }
        moves_on(&token, &page.next_page_token)?;
        token = page.next_page_token;
        if !args.all || token.is_empty() {
            break;
        }
    }
    if json {
        print_json(&json!({
            "resources": items.iter().map(render::resource_json).collect::<Vec<_>>(),
            "next_page_token": token,
            "unreachable": unreachable.values().map(|u| json!({
                "region": u.region,
                "reason": u.reason,
                "last_contact_ms": u.last_contact_ms,
                "last_contact": render::rfc3339_or_null(u.last_contact_ms),
            })).collect::<Vec<Value>>(),
        }));
    } else {
        let soft_deleted = items.iter().any(|r| r.expire_time_ms > 0);
        let rows: Vec<Vec<String>> = items
            .iter()
            .map(|r| {
                let mut row = vec![r.name.clone(), state_name(r.state), times.age_of(r.create_time_ms)];
                if soft_deleted {
                    row.push(if r.expire_time_ms > 0 {
                        times.relative(r.expire_time_ms)
                    } else {
                        String::new()
                    });
                }
                row
            })
            .collect();
        let header: &[&str] = if soft_deleted {
            &["NAME", "STATE", "AGE", "EXPIRES"]
        } else {
            &["NAME", "STATE", "AGE"]
        };
        print!("{}", table(header, &rows));
        if !token.is_empty() {
            println!("(more: --all, or --page-token {token})");
        }
    }
    for u in unreachable.values() {
        eprintln!(
            "warning: region {} did not answer: {}; the listing is incomplete",
            u.region, u.reason
        );
    }
    Ok(if unreachable.is_empty() { 0 } else { 1 })
}

/// A next token equal to the one just sent would page for ever (`--all`):
/// the node is at fault, and the command says so instead of looping.
fn moves_on(sent: &str, next: &str) -> Result<(), ClientError> {
    if !next.is_empty() && next == sent {
        return Err(ClientError::Usage(
            "the node answered the page token it was sent: paging would not end".to_owned(),
        ));
    }
    Ok(())
}

fn deadline_of(args: &ListArgs) -> Result<Option<Duration>, ClientError> {
    args.timeout
        .map(|s| {
            Duration::try_from_secs_f64(s)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| ClientError::Usage(format!("--timeout {s}: a positive number of seconds")))
        })
        .transpose()
}

/// Every reference of `name` in one direction (all pages with `--all`).
async fn run_references(
    client: &Client,
    args: &ListArgs,
    name: String,
    direction: v1::ReferenceDirection,
    json: bool,
) -> Result<i32, ClientError> {
    let mut token = args.page_token.clone().unwrap_or_default();
    let mut references = Vec::new();
    loop {
        let page = client
            .list_references(v1::ListReferencesRequest {
                name: name.clone(),
                direction: direction as i32,
                page_size: args.page_size,
                page_token: token.clone(),
            })
            .await?;
        references.extend(page.references);
        moves_on(&token, &page.next_page_token)?;
        token = page.next_page_token;
        if !args.all || token.is_empty() {
            break;
        }
    }
    if json {
        print_json(&json!({
            "references": references.iter().map(|r| json!({
                "referrer": r.referrer,
                "field": r.field,
                "on_delete": r.on_delete,
                "target": r.target,
            })).collect::<Vec<_>>(),
            "next_page_token": token,
        }));
    } else {
        let rows: Vec<Vec<String>> = references
            .iter()
            .map(|r| {
                vec![
                    r.referrer.clone(),
                    r.field.clone(),
                    r.on_delete.clone(),
                    r.target.clone(),
                ]
            })
            .collect();
        print!("{}", table(&["REFERRER", "FIELD", "POLICY", "TARGET"], &rows));
        if !token.is_empty() {
            println!("(more: --all, or --page-token {token})");
        }
    }
    Ok(0)
}

/// One resource of a tree: its state, and the referrers below it.
struct TreeNode {
    state: String,
    children: Vec<(String, String, String)>,
}

/// Runs `cascade tree`: the resource and, recursively, its referrers in
/// every region with their states, within `--depth` and `--max-nodes`.
pub async fn run_tree(client: &Client, args: TreeArgs, json: bool) -> Result<i32, ClientError> {
    let root = client.get(&args.name).await?;
    let max_nodes = args.max_nodes as usize;
    let mut nodes: BTreeMap<String, TreeNode> = BTreeMap::new();
    let mut queue: VecDeque<(String, u32)> = VecDeque::from([(root.name.clone(), 0)]);
    nodes.insert(
        root.name.clone(),
        TreeNode {
            state: state_name(root.state),
            children: Vec::new(),
        },
    );
    let mut cut = Vec::new();
    let mut at_depth_limit = false;
    let mut over_max_nodes = false;
    while let Some((name, depth)) = queue.pop_front() {
        let mut children = Vec::new();
        let mut token = String::new();
        loop {
            let page = client
                .list_references(v1::ListReferencesRequest {
                    name: name.clone(),
                    direction: v1::ReferenceDirection::Referrers as i32,
                    page_size: 0,
                    page_token: token.clone(),
                })
                .await;
            let page = match page {
                Ok(p) => p,
                // Gone since it was listed (purged, or its region stopped):
                // drawn with what is known.
                Err(e) => {
                    cut.push(format!("{name}: {e}"));
                    break;
                }
            };
            children.extend(page.references.into_iter().map(|r| (r.referrer, r.field, r.on_delete)));
            moves_on(&token, &page.next_page_token)?;
            token = page.next_page_token;
            if token.is_empty() || children.len() >= max_nodes {
                break;
            }
        }
        for (child, _, _) in &children {
            if nodes.contains_key(child) {
                continue;
            }
            if nodes.len() >= max_nodes {
                over_max_nodes = true;
                break;
            }
            let state = match client.get(child).await {
                Ok(r) => state_name(r.state),
                Err(e) if e.code() == Some(tonic::Code::NotFound) => "NOT_FOUND".to_owned(),
                Err(e) => format!("? ({e})"),
            };
            nodes.insert(
                child.clone(),
                TreeNode {
                    state,
                    children: Vec::new(),
                },
            );
            if depth + 1 < args.depth {
                queue.push_back((child.clone(), depth + 1));
            } else {
                at_depth_limit = true;
            }
        }
        if let Some(node) = nodes.get_mut(&name) {
            node.children = children;
        }
    }
    if over_max_nodes {
        cut.push(format!("more than {max_nodes} resources (--max-nodes)"));
    }
    if at_depth_limit {
        cut.push(format!(
            "the referrers of resources {} levels down were not asked (--depth)",
            args.depth
        ));
    }
    if json {
        print_json(&json!({
            "root": root.name,
            "resources": nodes.iter().map(|(name, n)| json!({
                "name": name,
                "state": n.state,
                "referrers": n.children.iter().map(|(c, f, p)| json!({"name": c, "field": f, "on_delete": p})).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "cut": cut,
        }));
    } else {
        print!("{}", tree_text(&root.name, &nodes));
        for why in &cut {
            println!("(cut: {why})");
        }
    }
    Ok(0)
}

/// The tree drawn from `root`, each resource once (a second path to it
/// says so instead of drawing it again).
fn tree_text(root: &str, nodes: &BTreeMap<String, TreeNode>) -> String {
    fn draw(
        name: &str,
        nodes: &BTreeMap<String, TreeNode>,
        prefix: &str,
        drawn: &mut BTreeSet<String>,
        out: &mut String,
    ) {
        let Some(node) = nodes.get(name) else { return };
        let shown: Vec<&(String, String, String)> =
            node.children.iter().filter(|(c, _, _)| nodes.contains_key(c)).collect();
        for (k, (child, field, policy)) in shown.iter().enumerate() {
            let last = k + 1 == shown.len();
            let branch = if last { "└─ " } else { "├─ " };
            let state = nodes.get(child).map(|n| n.state.as_str()).unwrap_or("?");
            let again = !drawn.insert(child.clone());
            *out += &format!(
                "{prefix}{branch}{child}  {state}  ({field}, {policy}){}\n",
                if again { "  (drawn above)" } else { "" }
            );
            if !again {
                let inner = format!("{prefix}{}", if last { "   " } else { "│  " });
                draw(child, nodes, &inner, drawn, out);
            }
        }
    }
    let mut out = String::new();
    let state = nodes.get(root).map(|n| n.state.as_str()).unwrap_or("?");
    out += &format!("{root}  {state}\n");
    let mut drawn = BTreeSet::from([root.to_owned()]);
    draw(root, nodes, "", &mut drawn, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_draws_each_referrer_once_with_its_state_and_policy() {
        let node = |state: &str, children: &[(&str, &str, &str)]| TreeNode {
            state: state.to_owned(),
            children: children
                .iter()
                .map(|(a, b, c)| ((*a).to_owned(), (*b).to_owned(), (*c).to_owned()))
                .collect(),
        };
        let nodes = BTreeMap::from([
            (
                "n".to_owned(),
                node("ACTIVE", &[("s", "network", "cascade"), ("p", "network", "cascade")]),
            ),
            ("s".to_owned(), node("ACTIVE", &[("p", "subnet", "cascade")])),
            ("p".to_owned(), node("DELETING", &[])),
        ]);
        assert_eq!(
            tree_text("n", &nodes),
            "n  ACTIVE\n├─ s  ACTIVE  (network, cascade)\n│  └─ p  DELETING  (subnet, cascade)\n└─ p  DELETING  (network, cascade)  (drawn above)\n"
        );
    }
}
