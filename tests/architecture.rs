//! Dependency rules of the workspace, checked over `cargo metadata` (the
//! "Architecture invariant" callouts of ARCHITECTURE.md that name this
//! test). Each failure names the offending dependency edge.
//!
//! The resolve graph is the one `cargo metadata` computes for the host
//! platform (`--filter-platform`: `uuid` pulls `js-sys` and `futures` into
//! wasm builds only), with features unified across members and
//! dev-dependencies: a closure computed over it is a superset of what any
//! one build of the host links, so the rules err on the strict side.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::process::Command;

use serde::Deserialize;

#[derive(Deserialize)]
struct Metadata {
    packages: Vec<Package>,
    workspace_members: Vec<String>,
    resolve: Resolve,
}

#[derive(Deserialize)]
struct Package {
    id: String,
    name: String,
    /// Declared dependencies, as in the package's Cargo.toml (workspace
    /// inheritance resolved).
    dependencies: Vec<Dependency>,
    /// The package's own `[features]` table.
    features: BTreeMap<String, Vec<String>>,
}

#[derive(Deserialize)]
struct Dependency {
    name: String,
    /// `None` for a normal dependency, `"dev"` or `"build"`.
    kind: Option<String>,
    features: Vec<String>,
}

#[derive(Deserialize)]
struct Resolve {
    nodes: Vec<Node>,
}

#[derive(Deserialize)]
struct Node {
    id: String,
    deps: Vec<NodeDep>,
    /// Features activated on this package (unified over the workspace).
    features: Vec<String>,
}

#[derive(Deserialize)]
struct NodeDep {
    pkg: String,
    dep_kinds: Vec<DepKind>,
}

#[derive(Deserialize)]
struct DepKind {
    kind: Option<String>,
}

struct Workspace {
    meta: Metadata,
    names: BTreeMap<String, String>,
}

/// The host's target triple, from `cargo -vV`.
fn host(cargo: &str) -> String {
    let out = Command::new(cargo).arg("-vV").output().expect("run cargo -vV");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("cargo -vV names the host")
        .to_owned()
}

fn workspace() -> Workspace {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--filter-platform"])
        .arg(host(&cargo))
        .arg("--manifest-path")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    #[allow(clippy::disallowed_methods)] // test code: reads cargo's own output, not stored data
    let meta: Metadata = serde_json::from_slice(&out.stdout).expect("parse cargo metadata");
    let names = meta.packages.iter().map(|p| (p.id.clone(), p.name.clone())).collect();
    Workspace { meta, names }
}

impl Workspace {
    fn name(&self, id: &str) -> &str {
        &self.names[id]
    }

    fn package(&self, name: &str) -> &Package {
        let members: BTreeSet<&str> = self.meta.workspace_members.iter().map(String::as_str).collect();
        self.meta
            .packages
            .iter()
            .find(|p| p.name == name && members.contains(p.id.as_str()))
            .unwrap_or_else(|| panic!("workspace member {name} not found"))
    }

    fn members(&self) -> impl Iterator<Item = &Package> {
        let members: BTreeSet<&str> = self.meta.workspace_members.iter().map(String::as_str).collect();
        self.meta
            .packages
            .iter()
            .filter(move |p| members.contains(p.id.as_str()))
    }

    fn node(&self, id: &str) -> &Node {
        self.meta
            .resolve
            .nodes
            .iter()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("{id} not in the resolve graph"))
    }

    /// Every package reachable from `root` through normal and build edges
    /// (not dev), each with the chain of package names that reaches it.
    fn normal_closure(&self, root: &str) -> BTreeMap<String, Vec<String>> {
        let mut paths: BTreeMap<String, Vec<String>> = BTreeMap::new();
        paths.insert(root.to_owned(), vec![self.name(root).to_owned()]);
        let mut queue = VecDeque::from([root.to_owned()]);
        while let Some(id) = queue.pop_front() {
            for dep in &self.node(&id).deps {
                let non_dev = dep.dep_kinds.iter().any(|k| k.kind.as_deref() != Some("dev"));
                if non_dev && !paths.contains_key(&dep.pkg) {
                    let mut path = paths[&id].clone();
                    path.push(self.name(&dep.pkg).to_owned());
                    paths.insert(dep.pkg.clone(), path);
                    queue.push_back(dep.pkg.clone());
                }
            }
        }
        paths
    }
}

fn kind_of(d: &Dependency) -> &str {
    d.kind.as_deref().unwrap_or("normal")
}

/// Crates that do IO, run async code, store, or speak the wire. None of
/// them may be reachable from the core: it is a library of pure functions.
/// A name matches itself and its `-suffixed` family (`tokio-util`, `hyper-util`).
const NOT_IN_CORE: &[&str] = &[
    "tokio",
    "mio",
    "socket2",
    "futures",
    "async-trait",
    "async-stream",
    "sled",
    "fjall",
    "rocksdb",
    "redb",
    "tonic",
    "prost",
    "hyper",
    "h2",
    "http",
    "tower",
    "rustls",
    "ractor",
    "tracing",
];

fn matches_family(name: &str, family: &str) -> bool {
    name == family || name.strip_prefix(family).is_some_and(|rest| rest.starts_with('-'))
}

#[test]
fn core_depends_only_on_its_allowed_crates() {
    let ws = workspace();
    let core = ws.package("cascade-core");
    let allowed = ["serde", "toml", "uuid", "thiserror"];
    let unexpected: Vec<String> = core
        .dependencies
        .iter()
        .filter(|d| kind_of(d) != "dev" && !allowed.contains(&d.name.as_str()))
        .map(|d| format!("cascade-core -> {} ({})", d.name, kind_of(d)))
        .collect();
    assert!(
        unexpected.is_empty(),
        "cascade-core may depend on {allowed:?} only (ARCHITECTURE.md, cascade-core); found: {unexpected:#?}"
    );
}

#[test]
fn core_closure_has_no_io_async_storage_or_wire_crate() {
    let ws = workspace();
    let core = ws.package("cascade-core");
    let offending: Vec<String> = ws
        .normal_closure(&core.id)
        .into_iter()
        .filter(|(id, _)| NOT_IN_CORE.iter().any(|f| matches_family(ws.name(id), f)))
        .map(|(_, path)| path.join(" -> "))
        .collect();
    assert!(
        offending.is_empty(),
        "cascade-core's dependency closure must not contain IO, async, storage or wire crates; found: {offending:#?}"
    );
}

/// The generated wire types and their codec. Knowing them is the proto
/// crate's job: every other member converts at its edge.
const WIRE_CRATES: &[&str] = &[
    "prost",
    "prost-types",
    "prost-derive",
    "prost-build",
    "tonic-prost",
    "tonic-prost-build",
];

/// Dev-dependencies on a wire crate that a member's tests need, with why.
const WIRE_DEV_EXCEPTIONS: &[(&str, &str)] = &[
    // tests/error_codes.rs encodes requests by hand to send raw (and
    // malformed) protobuf bytes through a gRPC channel: the server's codec
    // is what it tests.
    ("cascade", "prost"),
];

#[test]
fn only_the_proto_crate_depends_on_prost() {
    let ws = workspace();
    let mut offending = Vec::new();
    for member in ws.members().filter(|p| p.name != "cascade-proto") {
        for d in member
            .dependencies
            .iter()
            .filter(|d| WIRE_CRATES.contains(&d.name.as_str()))
        {
            let excepted =
                kind_of(d) == "dev" && WIRE_DEV_EXCEPTIONS.contains(&(member.name.as_str(), d.name.as_str()));
            if !excepted {
                offending.push(format!("{} -> {} ({})", member.name, d.name, kind_of(d)));
            }
        }
    }
    assert!(
        offending.is_empty(),
        "only cascade-proto may depend on prost and its codegen directly (ARCHITECTURE.md, cascade-proto); found: {offending:#?}"
    );
}

/// tokio features that exist for tests (a paused, steppable clock). A
/// production build must not carry them.
const TEST_ONLY_TOKIO_FEATURES: &[&str] = &["test-util"];

#[test]
fn test_only_tokio_features_stay_in_dev_dependencies() {
    let ws = workspace();
    let mut offending = Vec::new();
    // Declared by a member on a normal or build dependency.
    for member in ws.members() {
        for d in member
            .dependencies
            .iter()
            .filter(|d| d.name == "tokio" && kind_of(d) != "dev")
        {
            for f in d
                .features
                .iter()
                .filter(|f| TEST_ONLY_TOKIO_FEATURES.contains(&f.as_str()))
            {
                offending.push(format!("{} -> tokio ({}) enables {f}", member.name, kind_of(d)));
            }
        }
    }
    // Turned on by any package a member reaches without dev edges, through
    // a declared dependency or one of its own activated features.
    let mut reachable: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for member in ws.members() {
        for (id, path) in ws.normal_closure(&member.id) {
            reachable.entry(id).or_insert(path);
        }
    }
    let packages: BTreeMap<&str, &Package> = ws.meta.packages.iter().map(|p| (p.id.as_str(), p)).collect();
    for (id, path) in &reachable {
        let package = packages[id.as_str()];
        if ws.members().any(|m| m.id == *id) {
            continue; // checked above, by declaration
        }
        for d in package
            .dependencies
            .iter()
            .filter(|d| d.name == "tokio" && kind_of(d) != "dev")
        {
            for f in d
                .features
                .iter()
                .filter(|f| TEST_ONLY_TOKIO_FEATURES.contains(&f.as_str()))
            {
                offending.push(format!("{} -> tokio ({}) enables {f}", path.join(" -> "), kind_of(d)));
            }
        }
        for active in &ws.node(id).features {
            for enabled in package.features.get(active).into_iter().flatten() {
                let test_only = TEST_ONLY_TOKIO_FEATURES
                    .iter()
                    .any(|f| *enabled == format!("tokio/{f}") || *enabled == format!("tokio?/{f}"));
                if test_only {
                    offending.push(format!(
                        "{} -> tokio: its feature {active:?} enables {enabled}",
                        path.join(" -> ")
                    ));
                }
            }
        }
    }
    assert!(
        offending.is_empty(),
        "tokio's test-only features belong in [dev-dependencies] (turmoil, a dev-dependency, enables them for test builds); found: {offending:#?}"
    );
}
