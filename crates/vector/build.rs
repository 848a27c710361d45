//! Server tests run when `QDRANT_URL` names a Qdrant server at build time; otherwise they are
//! listed as ignored with the reason.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(qdrant_url)");
    println!("cargo::rerun-if-env-changed=QDRANT_URL");
    if std::env::var("QDRANT_URL").is_ok_and(|url| !url.is_empty()) {
        println!("cargo::rustc-cfg=qdrant_url");
    }
}
