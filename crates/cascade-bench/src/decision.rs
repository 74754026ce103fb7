//! `cascade-bench decision`: the cost of one authorization decision (issue
//! 27), in process: the policy engine a node asks before each call and for
//! each member of a cascade (`cascade_node::auth::policy`), with the
//! example policy (`deploy/auth/policy.cedar`) and with a policy of many
//! rules, each decided twice in turn: as a node decides (the policies its
//! index selects for the verb and principal) and over the whole set (every
//! policy, as Cedar alone would), so both rows see the same load. No node,
//! no gRPC: a decision never leaves memory.

use std::path::Path;
use std::time::{Duration, Instant};

use cascade_core::auth::{Authorize, Principal, Target, Verb, Via};
use cascade_core::ResourceName;
use cascade_node::auth::policy::PolicyAuthorizer;

use crate::harness::Result;

const EXAMPLE: &str = include_str!("../../../deploy/auth/policy.cedar");

/// One measured policy: its size and the decision times.
#[derive(Debug, serde::Serialize)]
pub struct DecisionRow {
    pub policy: String,
    /// `index` (what a node does) or `whole set` (every policy evaluated).
    pub evaluated: &'static str,
    pub rules: usize,
    pub decisions: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    pub per_second: f64,
    pub allowed: usize,
}

/// The example policy and `rules` more, one per team: a group may manage
/// its own services' networks (`svc-<i>-*`) in one region.
fn large_policy(rules: usize) -> String {
    let mut text = String::from(EXAMPLE);
    for i in 0..rules {
        text.push_str(&format!(
            "@id(\"team-{i}\")\npermit (principal in Cascade::Group::\"team-{i}\", action in [Cascade::Action::\"create\", Cascade::Action::\"update\", Cascade::Action::\"delete\"], resource in Cascade::Region::\"r{}\")\nwhen {{ resource.kind == \"network\" && resource.name like \"svc-{i}-*\" }};\n",
            i % 5
        ));
    }
    text
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)].as_secs_f64() * 1e6
}

/// The times of one way of deciding.
#[derive(Default)]
struct Timed {
    times: Vec<Duration>,
    total: Duration,
    allowed: usize,
}

impl Timed {
    fn row(mut self, policy: &str, evaluated: &'static str, rules: usize) -> DecisionRow {
        let decisions = self.times.len();
        self.times.sort_unstable();
        DecisionRow {
            policy: policy.to_owned(),
            evaluated,
            rules,
            decisions,
            p50_us: percentile(&self.times, 0.50),
            p99_us: percentile(&self.times, 0.99),
            mean_us: self.total.as_secs_f64() * 1e6 / decisions.max(1) as f64,
            per_second: decisions as f64 / self.total.as_secs_f64().max(1e-9),
            allowed: self.allowed,
        }
    }
}

fn measure(label: &str, text: &str, decisions: usize, teams: usize) -> Result<[DecisionRow; 2]> {
    let registry = prometheus::Registry::new();
    let authorizer = PolicyAuthorizer::from_text(Path::new(label), text, &registry)?;
    let principals: Vec<Principal> = (0..64)
        .map(|i| Principal {
            id: format!("user-{i}"),
            groups: match i % 4 {
                0 => vec!["admins".to_owned()],
                1 => vec!["net-admins".to_owned(), format!("team-{}", i % teams.max(1))],
                2 => vec!["readers".to_owned()],
                _ => vec![format!("team-{}", i % teams.max(1)), "others".to_owned()],
            },
            via: Via::Token,
        })
        .collect();
    let names: Vec<ResourceName> = (0..256)
        .map(|i| {
            let kind = ["network", "port", "subnet"][i % 3];
            let id = if i % 2 == 0 {
                format!("svc-{}-{i}", i % teams.max(1))
            } else {
                format!("prod-{i}")
            };
            ResourceName::parse(&format!("r{}/{kind}/{id}", i % 5))
        })
        .collect::<std::result::Result<_, _>>()?;
    let verbs = [Verb::Get, Verb::Create, Verb::Delete, Verb::Cascade, Verb::Update];
    // Warm the allocator and caches: the first calls are not the steady state.
    for i in 0..1_000 {
        let _ = authorizer.decide(&principals[i % 64], verbs[i % 5], Target::Resource(&names[i % 256]));
    }
    // Each request decided both ways, one after the other: the two rows
    // share the machine's load, and must agree.
    let (mut indexed, mut whole) = (Timed::default(), Timed::default());
    for i in 0..decisions {
        let (who, verb, name) = (&principals[i % 64], verbs[(i / 64) % 5], &names[(i * 7) % 256]);
        let t = Instant::now();
        let by_index = authorizer.decide(who, verb, Target::Resource(name));
        let took = t.elapsed();
        indexed.times.push(took);
        indexed.total += took;
        indexed.allowed += usize::from(by_index.allowed);
        let t = Instant::now();
        let by_whole_set = authorizer.decide_whole_set(who, verb, Target::Resource(name));
        let took = t.elapsed();
        whole.times.push(took);
        whole.total += took;
        whole.allowed += usize::from(by_whole_set.allowed);
        if by_index != by_whole_set {
            return Err(format!(
                "{label}: {} {verb} {name}: the index decided {by_index:?}, the whole set {by_whole_set:?}",
                who.id
            )
            .into());
        }
    }
    let rules = authorizer.policies_in_force();
    Ok([indexed.row(label, "index", rules), whole.row(label, "whole set", rules)])
}

/// Measures the example policy and one of `rules` more rules, `decisions`
/// decisions each; prints a table and returns the rows.
pub fn run(decisions: usize, rules: usize) -> Result<Vec<DecisionRow>> {
    let mut rows = Vec::new();
    rows.extend(measure("example (deploy/auth/policy.cedar)", EXAMPLE, decisions, 1)?);
    rows.extend(measure(
        &format!("example + {rules} rules"),
        &large_policy(rules),
        decisions,
        rules,
    )?);
    println!(
        "{:<40} {:<9} {:>6} {:>9} {:>9} {:>9} {:>9} {:>12}",
        "policy", "evaluated", "rules", "decisions", "p50 µs", "p99 µs", "mean µs", "decisions/s"
    );
    for r in &rows {
        println!(
            "{:<40} {:<9} {:>6} {:>9} {:>9.2} {:>9.2} {:>9.2} {:>12.0}",
            r.policy, r.evaluated, r.rules, r.decisions, r.p50_us, r.p99_us, r.mean_us, r.per_second
        );
    }
    Ok(rows)
}
