//! Architecture invariant: `api/` is the node's only wire edge.
//!
//! Only the modules under `src/api/` (and the web console's, `src/console/`,
//! a client of the API) may name a `cascade.v1` message or a gRPC status; the spine (`node.rs`), its cross-region flows
//! (`cluster.rs`), the links, the writer and the store work on core types.
//! Without this test the rule erodes one convenient `v1::` at a time (it
//! had: `cluster.rs` summed `v1::Operation`s and compared enums `as i32`).

use std::path::{Path, PathBuf};

/// What a file outside `api/` must not contain, and why.
const FORBIDDEN: &[(&str, &str)] = &[
    ("cascade_proto::v1", "a wire message type"),
    ("v1::", "a wire message type"),
    ("cascade_proto::convert", "wire conversion"),
    ("cascade_proto::status", "a gRPC status"),
    ("tonic::Status", "a gRPC status"),
    ("tonic::Code", "a gRPC status code"),
    ("Status::", "a gRPC status"),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn only_the_api_modules_know_wire_types() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.len() > 10,
        "found only {} source files under {src:?}",
        files.len()
    );
    let mut offences = Vec::new();
    // The console (`console/`) is the other edge, on the client side: it
    // builds API requests and reads their answers as a client does
    // (`tests/architecture.rs`, `the_console_reads_only_through_the_api`).
    for file in files
        .iter()
        .filter(|f| !f.starts_with(src.join("api")) && !f.starts_with(src.join("console")))
    {
        let text = std::fs::read_to_string(file).expect("read source");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for (pattern, what) in FORBIDDEN {
                if code.contains(pattern) {
                    offences.push(format!(
                        "{}:{}: {what} (`{pattern}`) outside api/: {}",
                        file.strip_prefix(&src).unwrap_or(file).display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        offences.is_empty(),
        "wire types outside the api/ edge:\n{}",
        offences.join("\n")
    );
}
