//! Generates the gRPC code and the reflection descriptor set from `proto/` without a
//! system `protoc`: protox parses the files, tonic-prost-build generates the code.

use std::{env, fs, path::PathBuf};

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files =
        ["tools", "knowledge", "worker"].map(|name| root.join(format!("toolmesh/v1/{name}.proto")));
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let fds = protox::compile(&files, [&root])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out.join("toolmesh_descriptor.bin"), fds.encode_to_vec())?;
    // The server decodes requests with the API's own codec (a request that is not valid
    // protobuf is the caller's fault: INVALID_ARGUMENT); the client keeps prost's codec, for
    // which an undecodable response is INTERNAL. Two passes, so each side gets its codec;
    // the client pass takes the messages of the first.
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(false)
        .codec_path("crate::codec::ServerCodec")
        .compile_fds(fds.clone())?;
    let client = out.join("client");
    fs::create_dir_all(&client)?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .extern_path(".toolmesh.v1", "crate::v1")
        .out_dir(&client)
        .compile_fds(fds)?;
    Ok(())
}
