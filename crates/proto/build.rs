//! Generates the gRPC code and the reflection descriptor set from `proto/` without a
//! system `protoc`: protox parses the files, tonic-prost-build generates the code.

use std::{env, fs, path::PathBuf};

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = [root.join("toolmesh/v1/tools.proto")];
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let fds = protox::compile(&files, [&root])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out.join("toolmesh_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure().build_server(true).build_client(true).compile_fds(fds)?;
    Ok(())
}
