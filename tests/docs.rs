//! The docs inside the repository name things that exist.
//!
//! ARCHITECTURE.md and GLOSSARY.md cite files (`crates/cascade-node/src/node.rs`,
//! `api/peer.rs`, `benches/cascade.rs`) and code (`PlanDriver`,
//! `Node::open`, `peer::rows_to_check`). Both drift silently when code moves:
//! ARCHITECTURE.md once named functions that no longer existed. This test
//! reads every `backticked` span and checks:
//!
//! - a span that looks like a path (has a `/` or a file extension) names a
//!   file or directory of the repository: as written from the root, or as the
//!   tail of one (the code map names files relative to their crate);
//! - a span that looks like Rust code (`Name`, `module::name`, `Type::method`,
//!   `snake_name(…)`) has its last segment defined or used as an identifier
//!   somewhere in the Rust sources.
//!
//! Spans that are neither (config keys, wire values, shell commands, prose
//! in code font) are not checked.
//!
//! It also holds the rule on file size: a source file over 800 lines says
//! at its top (a `Size:` paragraph in its module doc) why it is one file.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const DOCS: &[&str] = &["ARCHITECTURE.md", "GLOSSARY.md"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file and directory under the root (relative, `/`-separated),
/// skipping build output and VCS metadata.
fn tree(dir: &Path, base: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "target" || name.starts_with('.') {
            continue;
        }
        let rel = path
            .strip_prefix(base)
            .unwrap_or(&path)
            .to_string_lossy()
            .replace('\\', "/");
        if path.is_dir() {
            out.push(format!("{rel}/"));
            tree(&path, base, out);
        } else {
            out.push(rel);
        }
    }
}

/// Every identifier in the workspace's Rust sources.
fn identifiers(files: &[String]) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for f in files.iter().filter(|f| f.ends_with(".rs")) {
        let text = std::fs::read_to_string(root().join(f)).unwrap_or_default();
        for word in text.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
            if !word.is_empty() {
                ids.insert(word.to_owned());
            }
        }
    }
    ids
}

fn backticked(text: &str) -> Vec<String> {
    let mut spans = Vec::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let mut parts = line.split('`');
        parts.next();
        while let (Some(span), Some(_)) = (parts.next(), parts.next()) {
            spans.push(span.to_owned());
        }
        // An odd count leaves the last span unclosed on this line: ignored.
    }
    spans
}

fn looks_like_path(span: &str) -> bool {
    let ext = [".rs", ".toml", ".proto", ".md", ".sh", ".yaml", ".yml"];
    !span.contains(' ')
        && !span.contains("::")
        && !span.starts_with("--")
        && !span.contains('=')
        && !span.contains('{')
        && !span.contains('*')
        && !span.starts_with("http")
        && !span.starts_with("../")
        && (ext.iter().any(|e| span.ends_with(e)) || (span.contains('/') && span.ends_with('/')))
}

/// The identifier a code span names: its last path segment, without a call
/// or generic tail. None when the span is not Rust-looking code.
fn code_name(span: &str) -> Option<String> {
    let head = span.split(['(', '<', ' ']).next()?.trim_end_matches("()");
    let looks_rust = head.contains("::")
        || (head.chars().next()?.is_ascii_uppercase()
            && head.chars().any(|c| c.is_ascii_lowercase())
            && head.chars().all(|c| c.is_alphanumeric() || c == '_'))
        || (span.contains('(')
            && head
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit()));
    if !looks_rust || head.contains('/') || head.contains('.') || head.contains('-') {
        return None;
    }
    let last = head.rsplit("::").next()?.to_owned();
    (!last.is_empty() && last.chars().all(|c| c.is_alphanumeric() || c == '_')).then_some(last)
}

#[test]
fn every_path_and_name_the_docs_cite_exists() {
    let mut files = Vec::new();
    tree(&root(), &root(), &mut files);
    let ids = identifiers(&files);
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in DOCS {
        let text = std::fs::read_to_string(root().join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"));
        for span in backticked(&text) {
            if looks_like_path(&span) {
                checked += 1;
                let found = files.iter().any(|f| *f == span || f.ends_with(&format!("/{span}")));
                if !found {
                    missing.push(format!("{doc}: path `{span}` is not in the repository"));
                }
            } else if let Some(name) = code_name(&span) {
                checked += 1;
                if !ids.contains(&name) {
                    missing.push(format!("{doc}: `{span}` names `{name}`, which no Rust source mentions"));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} citations checked: is the parser still reading the docs?"
    );
    assert!(missing.is_empty(), "stale citations:\n{}", missing.join("\n"));
}

#[test]
fn the_checker_of_citations_notices_a_stale_one() {
    assert!(looks_like_path("crates/cascade-node/src/service.rs"));
    assert!(looks_like_path("api/"));
    assert!(!looks_like_path("[peers]"));
    assert_eq!(
        code_name("Node::open_with(settings, NodeEnv)").as_deref(),
        Some("open_with")
    );
    assert_eq!(code_name("PlanDriver").as_deref(), Some("PlanDriver"));
    assert_eq!(code_name("cascade = false"), None);
    assert_eq!(code_name("DELETING"), None);
}

/// A source file over this many lines says at its top why it is one file.
const LONG_FILE_LINES: usize = 800;

#[test]
fn a_long_source_file_says_at_its_top_why_it_is_one_file() {
    let mut files = Vec::new();
    tree(&root(), &root(), &mut files);
    let mut unexplained = Vec::new();
    for f in files.iter().filter(|f| f.ends_with(".rs")) {
        let text = std::fs::read_to_string(root().join(f)).unwrap_or_default();
        let lines = text.lines().count();
        if lines <= LONG_FILE_LINES {
            continue;
        }
        let explained = text
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .any(|l| l.starts_with("//! Size:"));
        if !explained {
            unexplained.push(format!(
                "{f}: {lines} lines and no `//! Size:` reason in its module doc"
            ));
        }
    }
    assert!(
        unexplained.is_empty(),
        "split these, or say why not:\n{}",
        unexplained.join("\n")
    );
}
