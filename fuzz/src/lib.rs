//! Fuzz targets of toolmesh's untrusted inputs, in `tests/fuzz.rs`: tool arguments (JSON)
//! checked against tool input schemas, protobuf request messages decoded as the server
//! decodes them, and bearer credentials (API keys and JSON Web Tokens) parsed and verified.
//!
//! `cargo test --workspace --test fuzz` runs each target on generated inputs for
//! `TOOLMESH_FUZZ_SECONDS` seconds (default 5), as the test suite does, and prints the
//! inputs it ran (`-- --nocapture`); with `cargo-bolero` and a nightly toolchain,
//! `cargo bolero test -p toolmesh-fuzz --test fuzz <target>` runs a coverage-guided fuzzer
//! on the same targets.
