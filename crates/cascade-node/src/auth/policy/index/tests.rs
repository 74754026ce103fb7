//! The index decides as the whole set does: the same allow or deny and the
//! same rule, over random policies (permits and forbids of every principal,
//! action and resource scope the schema allows, with conditions) and random
//! requests (principals, groups, verbs, kinds, names, regions, resources and
//! whole regions); and a decision reads only the policies that can match it.

use std::path::Path;

use cascade_core::auth::{Authorize, Principal, Target, Verb, Via};
use cascade_core::{RegionId, ResourceName};
use prometheus::Registry;
use proptest::prelude::*;

use super::super::PolicyAuthorizer;

const EXAMPLE: &str = include_str!("../../../../../../deploy/auth/policy.cedar");

const USERS: [&str; 4] = ["u0", "u1", "u2", "anonymous"];
const GROUPS: [&str; 4] = ["g0", "g1", "admins", "net-admins"];
const REGIONS: [&str; 3] = ["r0", "r1", "eu"];
const KINDS: [&str; 3] = ["network", "port", "subnet"];
const IDS: [&str; 3] = ["prod-1", "svc-2", "n3"];

fn authorizer(text: &str) -> PolicyAuthorizer {
    match PolicyAuthorizer::from_text(Path::new("generated.cedar"), text, &Registry::new()) {
        Ok(a) => a,
        Err(e) => panic!("the generated policy does not load: {e}\n{text}"),
    }
}

fn action(verb: usize) -> String {
    format!("Cascade::Action::\"{}\"", Verb::ALL[verb % Verb::ALL.len()].as_str())
}

/// One generated policy, as small numbers the strategy draws.
#[derive(Debug, Clone)]
struct Shape {
    forbid: bool,
    /// Its `@id`: one of a few names, so several policies share one.
    id: Option<u8>,
    principal: (u8, u8),
    /// Kind of action scope, and the verbs it names (1 to 6, across
    /// `MAX_VERBS_FILED`).
    action: (u8, Vec<u8>),
    resource: (u8, u8),
    when: u8,
    unless: u8,
}

impl Shape {
    fn text(&self) -> String {
        let (p, k) = (self.principal.0, usize::from(self.principal.1));
        let principal = match p % 6 {
            0 => "principal".to_owned(),
            1 => format!("principal == Cascade::User::\"{}\"", USERS[k % USERS.len()]),
            2 => format!("principal in Cascade::User::\"{}\"", USERS[k % USERS.len()]),
            3 => format!("principal in Cascade::Group::\"{}\"", GROUPS[k % GROUPS.len()]),
            4 => "principal is Cascade::User".to_owned(),
            _ => format!(
                "principal is Cascade::User in Cascade::Group::\"{}\"",
                GROUPS[k % GROUPS.len()]
            ),
        };
        let verbs: Vec<usize> = self.action.1.iter().map(|v| usize::from(*v)).collect();
        let action = match self.action.0 % 3 {
            0 => "action".to_owned(),
            1 => format!("action == {}", action(verbs[0])),
            _ => format!(
                "action in [{}]",
                verbs.iter().map(|v| action(*v)).collect::<Vec<_>>().join(", ")
            ),
        };
        let (r, k) = (self.resource.0, usize::from(self.resource.1));
        let resource = match r % 5 {
            0 => "resource".to_owned(),
            1 => format!("resource in Cascade::Region::\"{}\"", REGIONS[k % REGIONS.len()]),
            2 => format!(
                "resource == Cascade::Resource::\"{}/{}/{}\"",
                REGIONS[k % REGIONS.len()],
                KINDS[k % KINDS.len()],
                IDS[k % IDS.len()]
            ),
            3 => "resource is Cascade::Resource".to_owned(),
            _ => "resource is Cascade::Region".to_owned(),
        };
        let when = match self.when % 6 {
            0 => String::new(),
            1 => format!(
                " when {{ resource.kind == \"{}\" }}",
                KINDS[usize::from(self.when) % KINDS.len()]
            ),
            2 => " when { resource.name like \"prod-*\" }".to_owned(),
            3 => format!(
                " when {{ resource.region == \"{}\" }}",
                REGIONS[usize::from(self.when) % REGIONS.len()]
            ),
            4 => format!(
                " when {{ principal in Cascade::Group::\"{}\" }}",
                GROUPS[usize::from(self.when) % GROUPS.len()]
            ),
            _ => " when { resource.name == \"\" }".to_owned(),
        };
        let unless = match self.unless % 3 {
            0 => String::new(),
            1 => format!(
                " unless {{ principal in Cascade::Group::\"{}\" }}",
                GROUPS[usize::from(self.unless) % GROUPS.len()]
            ),
            _ => " unless { resource.kind == \"port\" }".to_owned(),
        };
        let id = self
            .id
            .map_or_else(String::new, |i| format!("@id(\"rule-{}\")\n", i % 5));
        let effect = if self.forbid { "forbid" } else { "permit" };
        format!("{id}{effect} ({principal}, {action}, {resource}){when}{unless};\n")
    }
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        prop::bool::weighted(0.3),
        prop::option::of(any::<u8>()),
        (any::<u8>(), any::<u8>()),
        (any::<u8>(), prop::collection::vec(0..16u8, 1..7)),
        (any::<u8>(), any::<u8>()),
        any::<u8>(),
        any::<u8>(),
    )
        .prop_map(|(forbid, id, principal, action, resource, when, unless)| Shape {
            forbid,
            id,
            principal,
            action,
            resource,
            when,
            unless,
        })
}

/// One generated request: who (with which groups, duplicates included),
/// which verb, on a resource or a whole region (of one kind or every kind).
#[derive(Debug, Clone)]
struct Asked {
    user: u8,
    groups: Vec<u8>,
    verb: u8,
    target: (u8, u8, u8, u8),
}

fn asked() -> impl Strategy<Value = Asked> {
    (
        any::<u8>(),
        prop::collection::vec(any::<u8>(), 0..4),
        0..16u8,
        (any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>()),
    )
        .prop_map(|(user, groups, verb, target)| Asked {
            user,
            groups,
            verb,
            target,
        })
}

/// Whether the index and the whole set agree on `request`; the two
/// decisions when they do not.
fn agree(a: &PolicyAuthorizer, request: &Asked) -> Result<(), String> {
    let principal = Principal {
        id: USERS[usize::from(request.user) % USERS.len()].to_owned(),
        groups: request
            .groups
            .iter()
            .map(|g| GROUPS[usize::from(*g) % GROUPS.len()].to_owned())
            .collect(),
        via: Via::Token,
    };
    let verb = Verb::ALL[usize::from(request.verb) % Verb::ALL.len()];
    let (shape, r, k, i) = request.target;
    let region = RegionId::parse(REGIONS[usize::from(r) % REGIONS.len()]).map_err(|e| e.to_string())?;
    let kind = KINDS[usize::from(k) % KINDS.len()];
    let name = ResourceName::parse(&format!("{region}/{kind}/{}", IDS[usize::from(i) % IDS.len()]))
        .map_err(|e| e.to_string())?;
    let target = match shape % 3 {
        0 => Target::Resource(&name),
        1 => Target::Region {
            region: &region,
            kind: Some(kind),
        },
        _ => Target::Region {
            region: &region,
            kind: None,
        },
    };
    let (indexed, whole) = (
        a.decide(&principal, verb, target),
        a.decide_whole_set(&principal, verb, target),
    );
    if indexed == whole {
        Ok(())
    } else {
        Err(format!(
            "{principal:?} {verb} {target:?}: the index says {indexed:?}, the whole set {whole:?}"
        ))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn the_index_decides_as_the_whole_set(
        shapes in prop::collection::vec(shape(), 1..24),
        requests in prop::collection::vec(asked(), 64),
    ) {
        let text: String = shapes.iter().map(Shape::text).collect();
        let a = authorizer(&text);
        for request in &requests {
            if let Err(e) = agree(&a, request) {
                prop_assert!(false, "{e}\npolicy:\n{text}");
            }
        }
    }
}

/// The example policy and the benchmark's shape of many rules, for every
/// verb, principal of the example's groups and target kind: the same
/// decisions and rules, and a decision that reads a handful of policies.
#[test]
fn the_example_and_a_thousand_team_rules_decide_as_the_whole_set_reading_a_few() {
    let mut text = String::from(EXAMPLE);
    for i in 0..1_000 {
        text.push_str(&format!(
            "@id(\"team-{i}\")\npermit (principal in Cascade::Group::\"team-{i}\", \
             action in [Cascade::Action::\"create\", Cascade::Action::\"update\", Cascade::Action::\"delete\"], \
             resource in Cascade::Region::\"r{}\")\nwhen {{ resource.kind == \"network\" && resource.name like \"svc-{i}-*\" }};\n",
            i % 5
        ));
    }
    let a = authorizer(&text);
    let who = [
        ("root", vec!["admins"]),
        ("nina", vec!["net-admins", "team-7"]),
        ("rita", vec!["readers"]),
        ("tom", vec!["team-7"]),
        ("tess", vec!["team-8", "others"]),
        ("nobody", vec![]),
    ];
    let names = [
        "r2/network/svc-7-a",
        "r3/network/svc-8-b",
        "r2/port/prod-1",
        "eu/subnet/s",
    ];
    let mut allowed = 0;
    for (id, groups) in &who {
        let principal = Principal {
            id: (*id).to_owned(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            via: Via::Token,
        };
        for verb in Verb::ALL {
            for name in names {
                let name = ResourceName::parse(name).unwrap();
                let indexed = a.decide(&principal, verb, Target::Resource(&name));
                assert_eq!(indexed, a.decide_whole_set(&principal, verb, Target::Resource(&name)));
                allowed += usize::from(indexed.allowed);
            }
            // What the index reads: the example's few rules and the
            // principal's own team's, never the other 999.
            let in_force = a.in_force.load();
            let read: usize = in_force.index.sets(&principal, verb).map(|s| s.num_of_policies()).sum();
            assert!(
                read <= 4,
                "{id} {verb}: {read} policies read of {}",
                in_force.rules.len()
            );
        }
    }
    // Spot checks a reader can follow: a team member creates its own
    // service's network in its region, not another team's.
    let tom = Principal {
        id: "tom".to_owned(),
        groups: vec!["team-7".to_owned()],
        via: Via::Token,
    };
    let own = ResourceName::parse("r2/network/svc-7-a").unwrap();
    let other = ResourceName::parse("r3/network/svc-8-b").unwrap();
    assert_eq!(
        a.decide(&tom, Verb::Create, Target::Resource(&own)),
        cascade_core::auth::Decision::allow("team-7")
    );
    assert_eq!(
        a.decide(&tom, Verb::Create, Target::Resource(&other)),
        cascade_core::auth::Decision::deny(super::super::DEFAULT_DENY)
    );
    assert!(allowed > 0);
}

/// A policy is filed once per verb it names, at most `MAX_VERBS_FILED`
/// times; one of more verbs, or of none, once.
#[test]
fn a_policy_is_filed_once_per_verb_it_names_up_to_the_bound() {
    let three = "permit (principal, action in [Cascade::Action::\"get\", Cascade::Action::\"list\", Cascade::Action::\"watch\"], resource);\n";
    let six = format!(
        "permit (principal, action in [{}], resource);\n",
        (0..6).map(action).collect::<Vec<_>>().join(", ")
    );
    let any = "forbid (principal in Cascade::Group::\"g\", action, resource);\n";
    let a = authorizer(&format!("{three}{six}{any}"));
    assert_eq!(a.in_force.load().index.filed(), 3 + 1 + 1);
}
