//! The policy engine with named principals: what each rule of the shipped
//! example allows and refuses, the rule a decision names, name patterns,
//! regions, reloads, and files refused with their line and column.

use std::path::{Path, PathBuf};

use cascade_core::auth::{Principal, Target, Verb, Via};
use cascade_core::{RegionId, ResourceName};
use prometheus::Registry;

use super::*;

const EXAMPLE: &str = include_str!("../../../../../deploy/auth/policy.cedar");

fn user(id: &str, groups: &[&str]) -> Principal {
    Principal {
        id: id.to_owned(),
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        via: Via::Token,
    }
}

fn name(full: &str) -> ResourceName {
    ResourceName::parse(full).unwrap()
}

fn region(id: &str) -> RegionId {
    RegionId::parse(id).unwrap()
}

/// A policy file in a fresh directory, loaded.
fn load(text: &str) -> (tempfile::TempDir, PathBuf, PolicyAuthorizer) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.cedar");
    std::fs::write(&path, text).unwrap();
    let authorizer = PolicyAuthorizer::load(&path, &Registry::new()).unwrap();
    (dir, path, authorizer)
}

fn refusal(text: &str) -> PolicyError {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.cedar");
    std::fs::write(&path, text).unwrap();
    PolicyAuthorizer::load(&path, &Registry::new()).unwrap_err()
}

fn on(a: &PolicyAuthorizer, who: &Principal, verb: Verb, full: &str) -> Decision {
    a.decide(who, verb, Target::Resource(&name(full)))
}

#[test]
fn the_shipped_schema_names_every_verb_as_an_action() {
    for verb in Verb::ALL {
        assert!(
            SCHEMA.contains(&format!("\"{}\"", verb.as_str())),
            "deploy/auth/cascade.cedarschema lacks the action {verb}"
        );
    }
    // And every verb can be permitted (the schema lets each action apply).
    let (_dir, _path, a) = load("@id(\"all\") permit (principal, action, resource);");
    for verb in Verb::ALL {
        assert_eq!(
            a.decide(&user("x", &[]), verb, Target::Resource(&name("eu/network/n1"))),
            Decision::allow("all")
        );
        assert_eq!(
            a.decide(
                &user("x", &[]),
                verb,
                Target::Region {
                    region: &region("eu"),
                    kind: None
                }
            ),
            Decision::allow("all")
        );
    }
}

#[test]
fn the_example_policy_lets_each_group_do_what_it_says() {
    let (_dir, _path, a) = load(EXAMPLE);
    let admin = user("root", &["admins"]);
    let net = user("nina", &["net-admins"]);
    let reader = user("rita", &["readers"]);
    let nobody = user("mallory", &[]);

    // Administrators: everything, admin verbs included.
    assert_eq!(on(&a, &admin, Verb::Delete, "eu/port/p1"), Decision::allow("admins"));
    assert_eq!(
        a.decide(
            &admin,
            Verb::AdminForcePurge,
            Target::Region {
                region: &region("eu"),
                kind: None
            }
        ),
        Decision::allow("admins")
    );
    // Network administrators: networks and subnets, not ports.
    assert_eq!(
        on(&a, &net, Verb::Cascade, "us/network/n1"),
        Decision::allow("net-admins-networks")
    );
    assert_eq!(
        on(&a, &net, Verb::Delete, "us/subnet/s1"),
        Decision::allow("net-admins-networks")
    );
    assert_eq!(
        on(&a, &net, Verb::Delete, "ap/port/p1"),
        Decision::deny("net-admins-no-ports")
    );
    assert_eq!(on(&a, &net, Verb::Create, "ap/port/p1"), Decision::deny(DEFAULT_DENY));
    assert_eq!(
        on(&a, &net, Verb::Get, "ap/port/p1"),
        Decision::allow("net-admins-read")
    );
    // Readers read, and nothing else.
    for verb in [Verb::Get, Verb::List, Verb::Watch] {
        assert_eq!(on(&a, &reader, verb, "eu/port/p1"), Decision::allow("readers"));
    }
    assert_eq!(
        a.decide(
            &reader,
            Verb::List,
            Target::Region {
                region: &region("eu"),
                kind: Some("port")
            }
        ),
        Decision::allow("readers")
    );
    for verb in [Verb::Create, Verb::Update, Verb::Delete, Verb::Lien, Verb::Finalize] {
        assert_eq!(
            on(&a, &reader, verb, "eu/port/p1"),
            Decision::deny(DEFAULT_DENY),
            "{verb}"
        );
    }
    // Someone in no group: the status and nothing else.
    assert_eq!(on(&a, &nobody, Verb::Get, "eu/port/p1"), Decision::deny(DEFAULT_DENY));
    assert_eq!(
        a.decide(
            &nobody,
            Verb::AdminClusterStatus,
            Target::Region {
                region: &region("eu"),
                kind: None
            }
        ),
        Decision::allow("status")
    );
    assert_eq!(
        a.decide(
            &nobody,
            Verb::AdminListAudit,
            Target::Region {
                region: &region("eu"),
                kind: None
            }
        ),
        Decision::deny(DEFAULT_DENY)
    );
}

#[test]
fn a_name_pattern_and_a_forbid_decide_over_a_permit() {
    let (_dir, _path, a) = load(EXAMPLE);
    let net = user("nina", &["net-admins"]);
    // `resource.name like "prod-*"`: the id part, in any region.
    assert_eq!(
        on(&a, &net, Verb::Delete, "eu/network/prod-core"),
        Decision::deny("prod-protected")
    );
    assert_eq!(
        on(&a, &net, Verb::Delete, "eu/network/dev-core"),
        Decision::allow("net-admins-networks")
    );
    // An administrator is excepted from the forbid.
    let both = user("root", &["net-admins", "admins"]);
    assert_eq!(
        on(&a, &both, Verb::Delete, "eu/network/prod-core"),
        Decision::allow("admins")
    );
}

#[test]
fn principals_regions_and_kinds_are_matched_by_id() {
    let (_dir, _path, a) = load(
        r#"
        @id("alice-eu")
        permit (principal == Cascade::User::"alice", action == Cascade::Action::"create", resource in Cascade::Region::"eu");
        @id("list-networks")
        permit (principal, action == Cascade::Action::"list", resource)
          when { resource.kind == "network" };
        permit (principal == Cascade::User::"anonymous", action == Cascade::Action::"get", resource)
          when { resource.region == "us" };
        "#,
    );
    let alice = user("alice", &[]);
    assert_eq!(
        on(&a, &alice, Verb::Create, "eu/network/n1"),
        Decision::allow("alice-eu")
    );
    assert_eq!(
        on(&a, &alice, Verb::Create, "us/network/n1"),
        Decision::deny(DEFAULT_DENY)
    );
    assert_eq!(
        on(&a, &user("bob", &[]), Verb::Create, "eu/network/n1"),
        Decision::deny(DEFAULT_DENY)
    );
    // A listing of one kind is the region with that kind; of every kind, kind "".
    let eu = region("eu");
    let listing = |kind| Target::Region { region: &eu, kind };
    assert_eq!(
        a.decide(&alice, Verb::List, listing(Some("network"))),
        Decision::allow("list-networks")
    );
    assert_eq!(
        a.decide(&alice, Verb::List, listing(None)),
        Decision::deny(DEFAULT_DENY)
    );
    // A policy without @id is named by Cedar's id (its position in the file).
    assert_eq!(
        on(&a, &Principal::anonymous(), Verb::Get, "us/port/p1"),
        Decision::allow("policy2")
    );
}

#[test]
fn a_malformed_policy_is_refused_with_its_line_and_column() {
    let e = refusal("@id(\"ok\")\npermit (principal, action, resource);\n\npermit (principal, action resource);\n");
    match &e {
        PolicyError::Syntax { line, column, .. } => {
            assert_eq!(*line, 4, "{e}");
            assert!(*column > 1, "{e}");
        }
        other => panic!("expected a syntax error, got {other}"),
    }
    assert!(e.to_string().contains("line 4, column"), "{e}");
}

#[test]
fn a_policy_the_schema_refuses_is_refused_naming_the_policy_and_its_line() {
    // An action the schema does not know, and an attribute no resource has.
    let e = refusal(
        "permit (principal, action, resource);\n@id(\"typo\")\npermit (principal, action == Cascade::Action::\"destroy\", resource);\n",
    );
    match &e {
        PolicyError::Invalid { line, policy, .. } => {
            assert_eq!(*line, 3, "{e}");
            assert_eq!(policy, "typo");
        }
        other => panic!("expected a validation error, got {other}"),
    }
    let e = refusal("permit (principal, action, resource)\n  when { resource.owner == \"me\" };\n");
    assert!(
        matches!(e, PolicyError::Invalid { line: 2, .. }),
        "expected line 2, got {e}"
    );
}

#[test]
fn templates_and_oversized_files_are_refused() {
    let e = refusal("permit (principal == ?principal, action, resource);");
    assert!(matches!(e, PolicyError::Templates { .. }), "{e}");
    let huge = "// padding\n".repeat((MAX_POLICY_BYTES as usize) / 11 + 1);
    let e = refusal(&huge);
    assert!(matches!(e, PolicyError::TooLarge { .. }), "{e}");
}

fn rewrite(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_reload_takes_a_changed_file_and_keeps_the_old_policy_when_the_new_one_is_broken() {
    let (_dir, path, a) = load("@id(\"get\") permit (principal, action == Cascade::Action::\"get\", resource);");
    let who = user("u", &[]);
    assert_eq!(
        on(&a, &who, Verb::Create, "eu/network/n1"),
        Decision::deny(DEFAULT_DENY)
    );
    // Unchanged: nothing to do.
    assert!(a.reload(false).unwrap().is_none());
    rewrite(
        &path,
        "@id(\"get\") permit (principal, action == Cascade::Action::\"get\", resource);\n@id(\"create\") permit (principal, action == Cascade::Action::\"create\", resource);",
    );
    assert_eq!(a.reload(false).unwrap(), Some(2));
    assert_eq!(on(&a, &who, Verb::Create, "eu/network/n1"), Decision::allow("create"));
    // Broken: refused, and the previous policy still decides.
    rewrite(&path, "permit (principal, action, resource");
    let e = a.reload(false).unwrap_err();
    assert!(e.to_string().contains("line 1"), "{e}");
    assert_eq!(a.policies_in_force(), 2);
    assert_eq!(on(&a, &who, Verb::Create, "eu/network/n1"), Decision::allow("create"));
    assert_eq!(a.metrics.refused.get(), 1);
    // The same broken file is not parsed (nor logged) again each second...
    assert!(a.reload(false).unwrap().is_none());
    // ...but a SIGHUP reads it again.
    assert!(a.reload(true).is_err());
    // A file that disappears is refused too.
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(a.reload(false), Err(PolicyError::Read { .. })));
    assert_eq!(on(&a, &who, Verb::Get, "eu/network/n1"), Decision::allow("get"));
    rewrite(&path, "@id(\"none\") forbid (principal, action, resource);");
    assert_eq!(a.reload(false).unwrap(), Some(1));
    assert_eq!(a.metrics.refused.get(), 0);
    assert_eq!(on(&a, &who, Verb::Get, "eu/network/n1"), Decision::deny("none"));
}

#[test]
fn the_rule_of_several_permits_does_not_depend_on_their_order() {
    let text = "@id(\"b\") permit (principal, action, resource);\n@id(\"a\") permit (principal, action, resource);";
    let (_dir, _path, a) = load(text);
    for _ in 0..20 {
        assert_eq!(
            on(&a, &user("u", &[]), Verb::Get, "eu/network/n1"),
            Decision::allow("a")
        );
    }
}

#[test]
fn line_and_column_count_characters_from_one() {
    assert_eq!(line_column("ab\ncd", 0), (1, 1));
    assert_eq!(line_column("ab\ncd", 4), (2, 2));
    assert_eq!(line_column("é\nx", 3), (2, 1));
    assert_eq!(line_column("ab", 99), (1, 3));
}
