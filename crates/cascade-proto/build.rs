//! Compiles `proto/cascade/v1/*.proto` with protox (pure Rust: no `protoc`)
//! and writes the descriptor set that the reflection service serves.

// A build script talks to cargo on stdout (`cargo:rerun-if-changed`).
#![allow(clippy::print_stdout)]

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = [
        root.join("cascade/v1/resources.proto"),
        root.join("cascade/v1/peer.proto"),
        root.join("cascade/v1/admin.proto"),
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("cascade_descriptor.bin"), prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure()
        // INVALID_ARGUMENT, not INTERNAL, for a request that does not decode.
        .codec_path("crate::codec::WireCodec")
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
