//! Hostile input to the core: arbitrary schema text, arbitrary names and
//! uids, and arbitrary resource specs against a live state. Nothing may
//! panic; every refusal is a schema error that names its place, or a
//! `CoreError` of a class a client can act on.

use std::collections::BTreeMap;

use cascade_core::memory::MemoryState;
use cascade_core::protocol;
use cascade_core::schema::{EXAMPLE_SCHEMA, MAX_KINDS};
use cascade_core::*;
use proptest::prelude::*;

const REGION: &str = "r1";

/// `cases` per property, or `PROPTEST_CASES` for a deeper run.
fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        // Keep the tree clean: no regression files next to the test.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A schema either loads, or says where it is wrong (or that it is no TOML).
fn check_schema_result(text: &str) {
    match Schema::from_toml(text) {
        Ok(schema) => {
            // A loaded schema is usable: its warnings and its check never
            // panic either, and a check's lines name real kinds.
            let _ = schema.warnings();
            let check = schema.check();
            assert!(check.stuck.len() <= 1_000, "the report is bounded");
            for s in &check.stuck {
                assert!(s.path.iter().all(|k| schema.kind(k).is_some()), "{s:?}");
                assert_eq!(s.via.len() + 1, s.path.len(), "{s:?}");
            }
            assert!(schema.kinds().count() >= 1, "a loaded schema has kinds");
        }
        Err(SchemaError::Syntax(message)) => {
            let shown = SchemaError::Syntax(message).to_string();
            assert!(shown.starts_with("schema is not valid TOML"), "{shown}");
        }
        Err(SchemaError::Invalid { path, message }) => {
            assert!(
                path.starts_with("kinds"),
                "error path {path:?} ({message}) for {text:?}"
            );
            assert!(!message.is_empty(), "an empty message at {path}");
        }
    }
}

// ---------------------------------------------------------------------------
// Schemas.
// ---------------------------------------------------------------------------

/// Pieces that make schema-like TOML: good and bad kind names, fields,
/// behaviours and keys.
fn schema_word() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_owned()),
        Just("port".to_owned()),
        Just("Port".to_owned()),
        Just("".to_owned()),
        Just("1x".to_owned()),
        Just("a-b".to_owned()),
        Just("ü".to_owned()),
        Just("x".repeat(64)),
        "[a-z_]{1,8}",
        ".{0,6}",
    ]
}

fn schema_line() -> impl Strategy<Value = String> {
    let behaviour = prop_oneof![
        Just("cascade"),
        Just("unset"),
        Just("block"),
        Just("allow_dangling"),
        Just("explode"),
        Just(""),
    ];
    prop_oneof![
        schema_word().prop_map(|k| format!("[kinds.{k:?}]")),
        schema_word().prop_map(|k| format!("[kinds.{k}]")),
        (schema_word(), schema_word()).prop_map(|(k, f)| format!("[kinds.{k:?}.refs.{f:?}]")),
        schema_word().prop_map(|k| format!("kind = {k:?}")),
        behaviour.prop_map(|b| format!("on_delete = {b:?}")),
        any::<bool>().prop_map(|b| format!("many = {b}")),
        any::<bool>().prop_map(|b| format!("required = {b}")),
        any::<i64>().prop_map(|n| format!("required = {n}")),
        schema_word().prop_map(|k| format!("{k:?} = 1")),
        Just("kinds = 3".to_owned()),
        Just("[kinds]".to_owned()),
        Just("[[kinds.a]]".to_owned()),
        Just("refs = {}".to_owned()),
        ".{0,20}",
    ]
}

/// Well-formed TOML with arbitrary kinds and references: most load or fail
/// the schema's own checks (not the TOML parser).
fn structured_schema() -> impl Strategy<Value = String> {
    let word = prop_oneof![
        6 => prop::sample::select(vec!["a", "b", "c", "port", "net"]).prop_map(str::to_owned),
        1 => schema_word(),
    ];
    let behaviour = prop_oneof![
        8 => prop::sample::select(vec!["cascade", "unset", "block", "allow_dangling"]),
        1 => Just("explode"),
    ];
    // Maps, so no table is declared twice (that is a TOML error, tested above).
    let reference = (word.clone(), behaviour, any::<bool>(), any::<bool>());
    let refs = prop::collection::btree_map(word.clone(), reference, 0..4);
    prop::collection::btree_map(word, refs, 0..6).prop_map(|kinds| {
        let mut text = String::new();
        for (kind, refs) in kinds {
            text += &format!("[kinds.{kind:?}]\n");
            for (field, (target, on_delete, many, required)) in refs {
                text += &format!(
                    "[kinds.{kind:?}.refs.{field:?}]\nkind = {target:?}\non_delete = {on_delete:?}\nmany = {many}\nrequired = {required}\n"
                );
            }
        }
        text
    })
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn structured_schemas_load_or_name_the_place(text in structured_schema()) {
        check_schema_result(&text);
    }

    #[test]
    fn arbitrary_text_as_schema_never_panics(text in ".{0,200}") {
        check_schema_result(&text);
    }

    #[test]
    fn arbitrary_bytes_as_schema_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        check_schema_result(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn schema_shaped_text_loads_or_names_the_place(lines in prop::collection::vec(schema_line(), 0..16)) {
        check_schema_result(&lines.join("\n"));
    }

    #[test]
    fn names_regions_and_uids_parse_or_refuse(text in ".{0,80}", parts in prop::collection::vec(".{0,12}", 0..5)) {
        check_names(&text);
        check_names(&parts.join("/"));
    }

    #[test]
    fn name_shaped_strings_parse_or_refuse(
        region in "[a-zA-Z0-9_ü-]{0,40}",
        kind in "[a-zA-Z0-9_ü-]{0,70}",
        id in "[a-zA-Z0-9_ü-]{0,70}",
    ) {
        check_names(&format!("{region}/{kind}/{id}"));
        check_names(&region);
    }
}

fn check_names(text: &str) {
    match ResourceName::parse(text) {
        Ok(n) => {
            assert_eq!(n.as_str(), text);
            assert_eq!(format!("{}/{}/{}", n.region(), n.kind(), n.id()), text);
            assert!(RegionId::parse(n.region()).is_ok());
        }
        Err(e) => assert!(e.to_string().starts_with("invalid resource name"), "{e}"),
    }
    if let Ok(r) = RegionId::parse(text) {
        assert_eq!(r.as_str(), text);
        assert!(text.len() <= 32);
    }
    if let Ok(u) = Uid::parse(text) {
        // Every accepted spelling names the same uid as its canonical form.
        assert_eq!(Uid::parse(&u.to_string()), Ok(u));
    }
    let _ = OperationId::parse(text);
}

fn chain_schema(kinds: usize) -> String {
    let mut text = String::from("[kinds.k0]\n");
    for i in 1..kinds {
        text += &format!(
            "[kinds.k{i}.refs.prev]\nkind = \"k{}\"\non_delete = \"cascade\"\nrequired = true\n",
            i - 1
        );
    }
    text
}

#[test]
fn a_chain_of_a_thousand_cascading_kinds_loads_and_cascades() {
    let text = chain_schema(1000);
    let schema = Schema::from_toml(&text).expect("a chain of 1000 kinds loads");
    assert_eq!(schema.kinds().count(), 1000);
    assert!(schema.warnings().is_empty());
    assert!(
        schema.check().lines().is_empty(),
        "no block, no cycle: nothing to report"
    );

    // One resource of every kind, each referencing the previous: deleting
    // the first cascades through all of them.
    let mut w = Core::new(&text);
    w.must_create(ResourceSpec {
        name: format!("{REGION}/k0/x"),
        ..ResourceSpec::default()
    });
    for i in 1..1000 {
        w.must_create(ResourceSpec {
            name: format!("{REGION}/k{i}/x"),
            refs: [(
                "prev".to_owned(),
                vec![RefRequest {
                    name: format!("{REGION}/k{}/x", i - 1),
                    uid: None,
                }],
            )]
            .into(),
            ..ResourceSpec::default()
        });
    }
    let req = DeleteRequest {
        name: format!("{REGION}/k0/x"),
        cascade: true,
        dry_run: false,
        allow_missing: false,
        etag: None,
        uid: None,
        requested_by: "hostile".into(),
        orphan: false,
        remote_kept: Default::default(),
        principal: Default::default(),
        retain_ms: 0,
        bounds: Default::default(),
        operation_id: None,
    };
    w.must_delete(req);
    assert!(w.state.resources.is_empty(), "the whole chain is purged");
    assert!(w.state.backrefs.is_empty());
}

#[test]
fn a_chain_with_a_blocker_at_the_end_is_warned() {
    let mut text = chain_schema(1000);
    text += "[kinds.lock.refs.last]\nkind = \"k999\"\non_delete = \"block\"\n";
    let schema = Schema::from_toml(&text).expect("loads");
    let warnings = schema.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].starts_with("kinds.lock.refs.last:"), "{warnings:?}");
}

#[test]
fn too_many_kinds_or_references_name_the_place() {
    let err = Schema::from_toml(&chain_schema(MAX_KINDS + 1)).unwrap_err();
    assert!(
        matches!(&err, SchemaError::Invalid { path, .. } if path == "kinds"),
        "{err}"
    );

    let mut text = String::from("[kinds.a]\n");
    for i in 0..200 {
        text += &format!("[kinds.b.refs.f{i}]\nkind = \"a\"\non_delete = \"unset\"\n");
    }
    let err = Schema::from_toml(&text).unwrap_err();
    assert!(
        matches!(&err, SchemaError::Invalid { path, .. } if path == "kinds.b.refs"),
        "{err}"
    );
}

#[test]
fn cycles_of_kinds_load_and_unwind() {
    // k0 → k1 → … → k9 → k0, all cascading, and a kind referencing itself.
    let mut text = String::new();
    for i in 0..10 {
        text += &format!(
            "[kinds.k{i}.refs.next]\nkind = \"k{}\"\non_delete = \"cascade\"\n",
            (i + 1) % 10
        );
    }
    text += "[kinds.me.refs.me]\nkind = \"me\"\non_delete = \"cascade\"\n";
    text += "[kinds.lock.refs.k]\nkind = \"k3\"\non_delete = \"block\"\n";
    let schema = Schema::from_toml(&text).expect("a cycle of kinds loads");
    let _ = schema.warnings();
    let check = schema.check();
    assert!(
        check.cycles.iter().any(|c| c == &["me".to_owned(), "me".to_owned()]),
        "the self-cascade is a cycle: {:?}",
        check.cycles
    );

    // A resource cycle of those kinds: created open, closed by an update,
    // then deleted from any point.
    let mut w = Core::new(&text);
    for i in (0..10).rev() {
        let refs = if i == 9 {
            BTreeMap::new()
        } else {
            [(
                "next".to_owned(),
                vec![RefRequest {
                    name: format!("{REGION}/k{}/x", i + 1),
                    uid: None,
                }],
            )]
            .into()
        };
        w.must_create(ResourceSpec {
            name: format!("{REGION}/k{i}/x"),
            refs,
            ..ResourceSpec::default()
        });
    }
    let close = ResourceSpec {
        name: format!("{REGION}/k9/x"),
        refs: [(
            "next".to_owned(),
            vec![RefRequest {
                name: format!("{REGION}/k0/x"),
                uid: None,
            }],
        )]
        .into(),
        ..ResourceSpec::default()
    };
    let step = protocol::update(&w.state, w.ctx(), close, None).expect("the cycle closes");
    w.state.apply(step.writes);
    let req = DeleteRequest {
        name: format!("{REGION}/k5/x"),
        cascade: true,
        dry_run: false,
        allow_missing: false,
        etag: None,
        uid: None,
        requested_by: "hostile".into(),
        orphan: false,
        remote_kept: Default::default(),
        principal: Default::default(),
        retain_ms: 0,
        bounds: Default::default(),
        operation_id: None,
    };
    w.must_delete(req);
    assert!(w.state.resources.is_empty(), "the cycle unwinds completely");
}

#[test]
fn deeply_nested_toml_fails_cleanly() {
    for depth in [100, 1_000, 10_000] {
        let arrays = format!("[kinds.a]\nx = {}{}\n", "[".repeat(depth), "]".repeat(depth));
        check_schema_result(&arrays);
        let tables = format!("kinds = {}{}\n", "{ a = ".repeat(depth), "}".repeat(depth));
        check_schema_result(&tables);
        let dotted = format!("[kinds.{}]\n", vec!["a"; depth].join("."));
        check_schema_result(&dotted);
    }
}

// ---------------------------------------------------------------------------
// Arbitrary requests against a live state.
// ---------------------------------------------------------------------------

struct Core {
    state: MemoryState,
    schema: Schema,
    region: RegionId,
    ids: SequentialIds,
    policy: Policy,
}

impl Core {
    fn new(schema: &str) -> Self {
        Core {
            state: MemoryState::default(),
            schema: Schema::from_toml(schema).expect("schema"),
            region: RegionId::parse(REGION).unwrap(),
            ids: SequentialIds::default(),
            policy: Policy::default(),
        }
    }

    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            schema: &self.schema,
            region: &self.region,
            now: Timestamp(1_000_000),
            policy: &self.policy,
            authorizer: &cascade_core::auth::AllowAll,
        }
    }

    fn must_create(&mut self, spec: ResourceSpec) {
        let name = spec.name.clone();
        let ctx = Ctx {
            schema: &self.schema,
            region: &self.region,
            now: Timestamp(1_000_000),
            policy: &self.policy,
            authorizer: &cascade_core::auth::AllowAll,
        };
        let step = protocol::create(&self.state, ctx, &mut self.ids, vec![spec])
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
        self.state.apply(step.writes);
    }

    fn must_delete(&mut self, req: DeleteRequest) {
        let ctx = Ctx {
            schema: &self.schema,
            region: &self.region,
            now: Timestamp(1_000_000),
            policy: &self.policy,
            authorizer: &cascade_core::auth::AllowAll,
        };
        let step = protocol::delete(&self.state, ctx, &mut self.ids, req).expect("delete accepted");
        self.state.apply(step.writes);
        self.run_until_quiet();
    }

    fn run_until_quiet(&mut self) {
        for _ in 0..100_000 {
            let step = protocol::process_work(&self.state, self.ctx()).expect("process_work");
            self.state.apply(step.writes);
            if step.value.items == 0 && !step.value.more {
                return;
            }
        }
        panic!("deletion work did not quiesce");
    }
}

/// Names: mostly valid local names of the example schema (so requests get
/// past the name check), plus other regions, unknown kinds and junk.
fn any_name() -> impl Strategy<Value = String> {
    let kinds = prop::sample::select(vec![
        "project",
        "network",
        "subnet",
        "port",
        "security_group",
        "qos_policy",
        "port_group",
        "router",
        "widget",
    ]);
    prop_oneof![
        12 => (kinds.clone(), 0u8..4).prop_map(|(k, i)| format!("{REGION}/{k}/x{i}")),
        1 => (kinds, 0u8..4).prop_map(|(k, i)| format!("other/{k}/x{i}")),
        1 => ".{0,30}",
        1 => "[a-z0-9/-]{0,80}",
    ]
}

fn any_uid() -> impl Strategy<Value = Option<Uid>> {
    prop_oneof![
        3 => Just(None),
        1 => any::<u128>().prop_map(|n| Some(Uid(uuid::Uuid::from_u128(n)))),
        // The uids SequentialIds mints first: these hit real incarnations.
        1 => (1u64..40).prop_map(|n| Some(Uid(uuid::Builder::from_unix_timestamp_millis(n, &[0; 10]).into_uuid()))),
    ]
}

fn any_field() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => prop::sample::select(vec![
            "project",
            "network",
            "subnet",
            "security_groups",
            "qos_policy",
            "ports",
            "gateway_network",
        ])
        .prop_map(str::to_owned),
        1 => ".{0,12}",
    ]
}

fn any_string(max: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => ".{0,16}",
        1 => (0..=max, any::<char>()).prop_map(|(n, c)| c.to_string().repeat(n / c.len_utf8().max(1))),
    ]
}

fn any_spec() -> impl Strategy<Value = ResourceSpec> {
    (
        any_name(),
        prop_oneof![
            3 => prop::collection::btree_map("[a-z]{1,8}", ".{0,16}", 0..3),
            1 => prop::collection::btree_map(any_string(200), any_string(6000), 0..4),
        ],
        prop_oneof![
            3 => prop::collection::btree_map(
                any_field(),
                prop::collection::vec((any_name(), any_uid()), 1..3),
                0..3,
            ),
            1 => prop::collection::btree_map(
                any_field(),
                prop::collection::vec((any_name(), any_uid()), 0..5),
                0..4,
            ),
        ],
        prop_oneof![
            3 => Just(Vec::new()),
            1 => prop::collection::vec(any_string(200), 0..3),
        ],
        0u16..2000,
    )
        .prop_map(|(name, mut attributes, refs, finalizers, many)| {
            // Now and then more attributes than allowed.
            if many > 1980 {
                for i in 0..(many - 1700) {
                    attributes.insert(format!("k{i}"), String::new());
                }
            }
            ResourceSpec {
                name,
                attributes,
                refs: refs
                    .into_iter()
                    .map(|(f, ts)| (f, ts.into_iter().map(|(name, uid)| RefRequest { name, uid }).collect()))
                    .collect(),
                finalizers,
            }
        })
}

#[derive(Debug, Clone)]
enum Req {
    Create(Vec<ResourceSpec>),
    Update(ResourceSpec, Option<String>),
    Delete(DeleteRequest),
    Work,
}

fn any_req() -> impl Strategy<Value = Req> {
    prop_oneof![
        4 => prop::collection::vec(any_spec(), 1..3).prop_map(Req::Create),
        2 => (any_spec(), prop::option::of(".{0,20}")).prop_map(|(s, e)| Req::Update(s, e)),
        2 => (any_name(), any::<[bool; 3]>(), prop::option::of(".{0,20}"), any_uid(), ".{0,10}").prop_map(
            |(name, [cascade, dry_run, allow_missing], etag, uid, requested_by)| {
                Req::Delete(DeleteRequest {
                    name,
                    cascade,
                    dry_run,
                    allow_missing,
                    etag,
                    uid,
                    requested_by,
                    orphan: false,
                    remote_kept: Default::default(),
                    principal: Default::default(),
                    retain_ms: 0,
                    bounds: Default::default(),
                    operation_id: None,
                })
            }
        ),
        1 => Just(Req::Work),
    ]
}

/// Only the one refusal that says "the caller skipped a step": a
/// cross-region reference that reached the core without its uid (the node
/// resolves it at the owner first; see `CoreError::RemoteReference`).
fn check_error(req: &Req, e: &CoreError) {
    if let CoreError::RemoteReference { .. } = e {
        assert_eq!(e.code(), ErrorCode::Internal);
        return;
    }
    // A create of a name still CREATING (a cross-region create not settled
    // yet): the node settles it and tries again; only a client whose
    // owners cannot be asked hears it, as UNAVAILABLE.
    if let CoreError::CreateUnsettled { .. } = e {
        assert_eq!(e.code(), ErrorCode::Unavailable);
        return;
    }
    assert!(
        matches!(
            e.code(),
            ErrorCode::InvalidArgument
                | ErrorCode::NotFound
                | ErrorCode::FailedPrecondition
                | ErrorCode::AlreadyExists
                | ErrorCode::Aborted
        ),
        "{req:?}: unexpected class {:?}: {e}",
        e.code()
    );
    assert!(!e.to_string().is_empty());
}

/// A seed forest of the example schema, so arbitrary requests meet real
/// resources, references and deletions.
fn seeded() -> Core {
    let mut w = Core::new(EXAMPLE_SCHEMA);
    let r = |name: &str| RefRequest {
        name: format!("{REGION}/{name}"),
        uid: None,
    };
    let spec = |name: &str, refs: Vec<(&str, Vec<RefRequest>)>| ResourceSpec {
        name: format!("{REGION}/{name}"),
        refs: refs.into_iter().map(|(f, ts)| (f.to_owned(), ts)).collect(),
        ..ResourceSpec::default()
    };
    w.must_create(spec("project/x0", vec![]));
    w.must_create(spec("network/x0", vec![("project", vec![r("project/x0")])]));
    w.must_create(spec("subnet/x0", vec![("network", vec![r("network/x0")])]));
    w.must_create(spec("security_group/x0", vec![("project", vec![r("project/x0")])]));
    w.must_create(spec(
        "port/x0",
        vec![
            ("network", vec![r("network/x0")]),
            ("security_groups", vec![r("security_group/x0")]),
        ],
    ));
    w.must_create(spec("port_group/x0", vec![("ports", vec![r("port/x0")])]));
    w
}

fn run_requests(reqs: Vec<Req>) {
    let mut w = seeded();
    for req in reqs {
        let before = w.state.clone();
        let ctx = Ctx {
            schema: &w.schema,
            region: &w.region,
            now: Timestamp(1_000_000),
            policy: &w.policy,
            authorizer: &cascade_core::auth::AllowAll,
        };
        let result = match req.clone() {
            Req::Create(specs) => protocol::create(&w.state, ctx, &mut w.ids, specs).map(|s| s.writes),
            Req::Update(spec, etag) => protocol::update(&w.state, ctx, spec, etag.as_deref()).map(|s| s.writes),
            Req::Delete(d) => protocol::delete(&w.state, ctx, &mut w.ids, d).map(|s| s.writes),
            Req::Work => protocol::process_work(&w.state, ctx).map(|s| s.writes),
        };
        match result {
            Ok(writes) => w.state.apply(writes),
            Err(e) => {
                check_error(&req, &e);
                assert_eq!(w.state, before, "a refused request changed nothing");
            }
        }
    }
    w.run_until_quiet();
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn arbitrary_requests_never_panic_and_refuse_with_a_client_class(reqs in prop::collection::vec(any_req(), 1..12)) {
        run_requests(reqs);
    }
}
