//! Dependency rules of the workspace, checked over `cargo metadata` (the
//! "Architecture invariant" callouts of ARCHITECTURE.md that name this
//! test). Each failure names the offending dependency edge.
//!
//! The resolve graph is the one `cargo metadata` computes for the host
//! platform (`--filter-platform`: `uuid` pulls `js-sys` and `futures` into
//! wasm builds only), with features unified across members and
//! dev-dependencies: a closure computed over it is a superset of what any
//! one build of the host links, so the rules err on the strict side.
//!
//! Size: a little over 800 lines: the rules and the small Rust reader they
//! share (the node's module graph, for the floors, `api/` and the
//! console) belong together; split, each half would carry a copy of it.

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
    // tests/oversized_fields.rs decodes `cascade_proto::FILE_DESCRIPTOR_SET`
    // to send every string field of every request oversized, one at a time.
    ("cascade", "prost-types"),
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

// ---------------------------------------------------------------------------
// The node crate's module graph (ARCHITECTURE.md, `crates/cascade-node`,
// "Floors"). Each `.rs` file under `crates/cascade-node/src` is a module
// (`foo.rs` and the files of `foo/` are separate ones); file A depends on
// file B when A's code names a path `crate::…` or `super::…` that resolves
// to B (the longest path prefix that is a file's module; a name of the
// crate root is `lib.rs`). Comments, strings and character literals are
// left out, so a doc that says "see crate::api" names nothing.

/// The node crate's sources.
const NODE_SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/crates/cascade-node/src");

/// One `crate::…` or `super::…` path in a file's code, resolved to the
/// segments it names from the crate root.
struct ModPath {
    line: usize,
    /// From the crate root: `["api", "forward", "call_owner"]`.
    segments: Vec<String>,
}

/// One source file of the node crate.
struct SourceFile {
    /// Relative to `src/`, with `/`: `api/peer_client.rs`.
    name: String,
    /// Its module path from the crate root (`[]` for `lib.rs`).
    module: Vec<String>,
    paths: Vec<ModPath>,
}

fn node_rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read the node's src/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            node_rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file is: `lib.rs` the root, `a/mod.rs` and `a.rs` `a`,
/// `a/b.rs` `a::b`.
fn module_of(name: &str) -> Vec<String> {
    let mut parts: Vec<String> = name.split('/').map(str::to_owned).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if !(stem == "mod" || (stem == "lib" && parts.is_empty())) {
        parts.push(stem.to_owned());
    }
    parts
}

/// `code` with comments, string contents and character literals blanked
/// out (line breaks kept, so line numbers hold).
fn strip_comments_and_literals(code: &str) -> String {
    let chars: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c == 'r' && matches!(next, Some('"' | '#')) && (i == 0 || !ident(chars[i - 1])) {
            // A raw string: r"…", r#"…"#, …
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match chars.get(j) {
                    None => break,
                    Some('"') if (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    Some('\n') => out.push('\n'),
                    Some(_) => {}
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                if chars.get(i) == Some(&'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && next == Some('\\') {
            // An escaped character literal: '\n', '\'', '\u{7f}'.
            i += 2;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            // A character literal ('{'); anything else is a lifetime.
            i += 3;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// A token of stripped code, with its line.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

fn tokens(code: &str) -> Vec<(Tok, usize)> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push((Tok::Ident(chars[start..i].iter().collect()), line));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push((Tok::PathSep, line));
            i += 2;
        } else {
            out.push((Tok::Punct(c), line));
            i += 1;
        }
    }
    out
}

/// The paths of a `use` tree or a path expression starting at `toks[i]`
/// (just after `prefix::`), and the index after it.
fn path_tree(toks: &[(Tok, usize)], mut i: usize, prefix: Vec<String>) -> (Vec<Vec<String>>, usize) {
    let mut path = prefix;
    loop {
        match toks.get(i).map(|t| &t.0) {
            Some(Tok::Ident(name)) => {
                path.push(name.clone());
                i += 1;
                if toks.get(i).map(|t| &t.0) == Some(&Tok::PathSep) {
                    i += 1;
                    continue;
                }
                return (vec![path], i);
            }
            Some(Tok::Punct('{')) => {
                // A use group: each item a tree of its own.
                i += 1;
                let mut all = Vec::new();
                loop {
                    match toks.get(i).map(|t| &t.0) {
                        None => return (all, i),
                        Some(Tok::Punct('}')) => return (all, i + 1),
                        Some(Tok::Punct(',')) => i += 1,
                        Some(Tok::Ident(_) | Tok::Punct('{')) => {
                            let (mut inner, next) = path_tree(toks, i, path.clone());
                            all.append(&mut inner);
                            // Skip `as alias` and anything else up to the item's end.
                            i = next;
                            while let Some(t) = toks.get(i).map(|t| &t.0) {
                                if matches!(t, Tok::Punct(',' | '}')) {
                                    break;
                                }
                                i += 1;
                            }
                        }
                        Some(_) => i += 1,
                    }
                }
            }
            _ => return (vec![path], i),
        }
    }
}

/// Every `crate::…` and `super::…` path in `code`, from the crate root, for
/// a file that is module `module` (`super` inside an inline `mod tests { … }`
/// is the file itself).
fn module_paths(code: &str, module: &[String]) -> Vec<ModPath> {
    let toks = tokens(&strip_comments_and_literals(code));
    let mut out = Vec::new();
    let mut depth = 0usize;
    // Inline modules open in this file: (name, depth inside its braces).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let (tok, line) = (&toks[i].0, toks[i].1);
        match tok {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let (Some((Tok::Ident(name), _)), Some((Tok::Punct('{'), _))) = (toks.get(i + 1), toks.get(i + 2)) {
                    depth += 1;
                    inline.push((name.clone(), depth));
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(kw)
                if (kw == "crate" || kw == "super") && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::PathSep) =>
            {
                let after_sep = i > 0 && toks[i - 1].0 == Tok::PathSep; // `$crate::`, `a::super::`
                if !after_sep {
                    let mut base: Vec<String> = Vec::new();
                    let mut j = i;
                    if kw == "super" {
                        base = module.to_vec();
                        base.extend(inline.iter().map(|(n, _)| n.clone()));
                        while toks.get(j).map(|t| &t.0) == Some(&Tok::Ident("super".into()))
                            && toks.get(j + 1).map(|t| &t.0) == Some(&Tok::PathSep)
                        {
                            base.pop();
                            j += 2;
                        }
                    } else {
                        j += 2;
                    }
                    let (paths, next) = path_tree(&toks, j, base);
                    out.extend(paths.into_iter().map(|segments| ModPath { line, segments }));
                    i = next.max(i + 1);
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

fn node_sources() -> Vec<SourceFile> {
    let src = std::path::Path::new(NODE_SRC);
    let mut files = Vec::new();
    node_rust_files(src, &mut files);
    assert!(
        files.len() > 10,
        "found only {} source files under {src:?}",
        files.len()
    );
    let mut out: Vec<SourceFile> = files
        .iter()
        .map(|f| {
            let name = f
                .strip_prefix(src)
                .expect("under src/")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            let module = module_of(&name);
            let code = std::fs::read_to_string(f).expect("read a source file");
            let paths = module_paths(&code, &module);
            SourceFile { name, module, paths }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// File → the files it depends on (see above), each with the first line
/// that names it.
fn node_module_graph(files: &[SourceFile]) -> BTreeMap<String, BTreeMap<String, usize>> {
    let by_module: BTreeMap<&[String], &str> = files.iter().map(|f| (f.module.as_slice(), f.name.as_str())).collect();
    let mut graph: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for f in files {
        let edges = graph.entry(f.name.clone()).or_default();
        for p in &f.paths {
            let target = (0..=p.segments.len())
                .rev()
                .find_map(|n| by_module.get(&p.segments[..n]).copied())
                .expect("the crate root is a file");
            if target != f.name {
                edges.entry(target.to_owned()).or_insert(p.line);
            }
        }
    }
    graph
}

/// One cycle of `graph`, as the files on it (the first repeated at the end).
fn find_cycle(graph: &BTreeMap<String, BTreeMap<String, usize>>) -> Option<Vec<String>> {
    fn visit<'g>(
        node: &'g str,
        graph: &'g BTreeMap<String, BTreeMap<String, usize>>,
        done: &mut BTreeSet<&'g str>,
        stack: &mut Vec<&'g str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| *n == node) {
            let mut cycle: Vec<String> = stack[at..].iter().map(|n| (*n).to_owned()).collect();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node);
        for next in graph.get(node).into_iter().flat_map(|e| e.keys()) {
            if let Some(cycle) = visit(next, graph, done, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node);
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, graph, &mut done, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}

#[test]
fn node_modules_outside_api_never_import_api() {
    let mut offending = Vec::new();
    for f in node_sources().iter().filter(|f| !f.name.starts_with("api/")) {
        for p in f
            .paths
            .iter()
            .filter(|p| p.segments.first().is_some_and(|s| s == "api"))
        {
            offending.push(format!("{}:{}: crate::{}", f.name, p.line, p.segments.join("::")));
        }
    }
    assert!(
        offending.is_empty(),
        "only api/ may name crate::api: the domain reaches other regions through the port, crate::peers \
         (ARCHITECTURE.md, cascade-node, \"Floors\"); found in crates/cascade-node/src:\n{}",
        offending.join("\n")
    );
}

/// The console (`console.rs`, `console/`) reads the node only through its
/// API, as a client (ARCHITECTURE.md, "Console"): it names no module of
/// the crate but its own, so a page can never read the store, the writer or
/// a `Node` around the services, their authentication and policy.
#[test]
fn the_console_reads_only_through_the_api() {
    let files = node_sources();
    let console: Vec<&SourceFile> = files
        .iter()
        .filter(|f| f.name == "console.rs" || f.name.starts_with("console/"))
        .collect();
    assert!(
        console.len() >= 3,
        "the console's files were not found: {:?}",
        console.iter().map(|f| &f.name).collect::<Vec<_>>()
    );
    let mut offending = Vec::new();
    for f in &console {
        for p in f
            .paths
            .iter()
            .filter(|p| p.segments.first().is_none_or(|s| s != "console"))
        {
            offending.push(format!("{}:{}: crate::{}", f.name, p.line, p.segments.join("::")));
        }
    }
    assert!(
        offending.is_empty(),
        "the console may name only its own modules: it reads through the node's API as a client \
         (ARCHITECTURE.md, \"Console\"); found in crates/cascade-node/src:\n{}",
        offending.join("\n")
    );
}

#[test]
fn node_modules_form_no_cycle() {
    let files = node_sources();
    let graph = node_module_graph(&files);
    // The test must see the graph it guards: the spine and the port are in it.
    assert!(
        graph
            .get("cluster.rs")
            .is_some_and(|e| e.contains_key("node.rs") && e.contains_key("peers/mod.rs")),
        "the module graph lost cluster.rs -> node.rs, peers/mod.rs: {graph:#?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        let lines: Vec<String> = cycle
            .windows(2)
            .map(|w| format!("  {}:{} names {}", w[0], graph[&w[0]][&w[1]], w[1]))
            .collect();
        panic!(
            "the node's modules must read top-down, without a cycle (ARCHITECTURE.md, cascade-node, \"Floors\"); \
             in crates/cascade-node/src: {}\n{}",
            cycle.join(" -> "),
            lines.join("\n")
        );
    }
}

#[test]
fn the_module_graph_reader_ignores_comments_and_literals_and_follows_super() {
    let code = r#"
//! see crate::api
/// and crate::api::peer_client
use crate::{codec::StoreState, error::{Fault, WriterUnavailable as W}};
use super::Batch;
fn f() -> &'static str { let _c = '{'; "crate::api" }
/* crate::api */
#[cfg(test)]
mod tests {
    use super::*;
    use super::super::node::Node;
}
"#;
    let paths: Vec<String> = module_paths(code, &["store".to_owned(), "memory".to_owned()])
        .into_iter()
        .map(|p| format!("{}:{}", p.line, p.segments.join("::")))
        .collect();
    assert_eq!(
        paths,
        [
            "4:codec::StoreState",
            "4:error::Fault",
            "4:error::WriterUnavailable",
            "5:store::Batch",
            "10:store::memory",
            "11:store::node::Node",
        ]
        .map(str::to_owned)
    );
}
