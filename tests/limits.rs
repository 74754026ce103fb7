//! README's "Limits" table is the code's limits: every row names a limit
//! the node has, with the default the code has and the key that changes
//! it, and every limit of the code has its row (`cascade_node::limits`,
//! read from the constants and the settings' defaults themselves).
//!
//! Why: a limit is a promise to clients and operators ("a page is at most
//! 4 MiB", "a watcher 100,000 events behind is ended"), and it drifts
//! silently when one side changes. A failure prints the rows as the code
//! has them, ready to paste.

use std::collections::BTreeMap;

const README: &str = include_str!("../README.md");
const START: &str = "<!-- limits-table:start -->";
const END: &str = "<!-- limits-table:end -->";

/// One row as the table writes it: (area, limit) → (default, key).
type Rows = BTreeMap<(String, String), (String, String)>;

fn code_rows() -> (Rows, Vec<String>) {
    let mut rows = Rows::new();
    let mut lines = Vec::new();
    for l in cascade_node::limits() {
        let key = if l.key.is_empty() {
            "-".to_owned()
        } else {
            format!("`{}`", l.key)
        };
        lines.push(format!("| {} | {} | {} | {} |", l.area, l.what, l.default, key));
        rows.insert((l.area.to_owned(), l.what.to_owned()), (l.default.to_string(), key));
    }
    (rows, lines)
}

fn readme_rows() -> Rows {
    let start = README.find(START).expect("README has the limits table's start marker");
    let end = README.find(END).expect("README has the limits table's end marker");
    assert!(start < end, "the limits table's markers are in order");
    let mut rows = Rows::new();
    for line in README[start + START.len()..end].lines() {
        let line = line.trim();
        if !line.starts_with('|') || line.starts_with("|---") || line.starts_with("| area ") {
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 4, "a limits row has four cells: {line}");
        let previous = rows.insert(
            (cells[0].to_owned(), cells[1].to_owned()),
            (cells[2].to_owned(), cells[3].to_owned()),
        );
        assert!(previous.is_none(), "the limits table lists {line:?} twice");
    }
    rows
}

#[test]
fn the_readme_limits_table_is_the_codes_limits() {
    let (code, lines) = code_rows();
    let readme = readme_rows();
    let mut problems = Vec::new();
    for (name, (default, key)) in &code {
        match readme.get(name) {
            None => problems.push(format!("missing from README: {} / {}", name.0, name.1)),
            Some((d, k)) if d != default || k != key => problems.push(format!(
                "{} / {}: README says {d} ({k}), the code says {default} ({key})",
                name.0, name.1
            )),
            Some(_) => {}
        }
    }
    for name in readme.keys().filter(|n| !code.contains_key(*n)) {
        problems.push(format!(
            "README lists a limit the code does not have: {} / {}",
            name.0, name.1
        ));
    }
    assert!(
        problems.is_empty(),
        "README's limits table and the code disagree:\n  {}\n\nThe rows as the code has them:\n\n| area | limit | default | config key |\n|---|---|---|---|\n{}\n",
        problems.join("\n  "),
        lines.join("\n")
    );
}

#[test]
fn every_config_key_in_the_table_is_one_the_node_reads() {
    // The keys of the example config (which `the_example_region_config_is_one_the_node_reads`
    // parses) and the config doc comment: a key in the table must be one of them.
    let example = include_str!("../deploy/region.example.toml");
    for l in cascade_node::limits().iter().filter(|l| !l.key.is_empty()) {
        let (section, name) = l
            .key
            .trim_start_matches('[')
            .split_once("] ")
            .unwrap_or_else(|| panic!("a key is `[section] name`: {}", l.key));
        let header = format!("[{section}]");
        // The section's lines: from its header (commented out or not) to the next header.
        let is_header = |line: &str| line.trim_start_matches('#').trim().starts_with('[');
        let body: Vec<&str> = example
            .lines()
            .skip_while(|line| line.trim_start_matches('#').trim() != header)
            .skip(1)
            .take_while(|line| !is_header(line))
            .collect();
        assert!(
            !body.is_empty(),
            "deploy/region.example.toml has no {header} (for {})",
            l.key
        );
        assert!(
            body.iter().any(|line| {
                let line = line.trim_start_matches('#').trim();
                line.starts_with(name) && line[name.len()..].trim_start().starts_with('=')
            }),
            "deploy/region.example.toml's {header} does not show `{name}` (README's limits table names {})",
            l.key
        );
    }
}
