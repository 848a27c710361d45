//! TLS on the front door's listener (`[tls]`), and mutual TLS when `client_ca` names the CAs whose
//! client certificates are accepted:
//!
//! ```toml
//! [tls]
//! cert = "/etc/toolmesh/tls/tls.crt"       # PEM: the server's chain, leaf first
//! key = "/etc/toolmesh/tls/tls.key"        # PEM: its private key (PKCS#8, PKCS#1 or SEC1)
//! client_ca = "/etc/toolmesh/tls/ca.crt"   # PEM: mutual TLS (optional)
//! client_auth = "required"                 # or "optional": a client may come without one
//! ```
//!
//! The handshake happens in the [`Listener`](crate::Listener) within
//! `server.handshake_timeout`, before the HTTP/2 preface; ALPN offers `h2` (gRPC, and MCP
//! clients that speak HTTP/2) and `http/1.1` (the MCP endpoint). A verified client certificate becomes the connection's
//! [`CertificateIdentity`], which `[auth.certificates]` turns into a principal. The files are
//! read at start and again on every reload (SIGHUP, a changed configuration file, or a
//! changed certificate file while `server.reload_poll_ms` is on): a rotated certificate
//! applies to the connections accepted from then on.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::SystemTime,
};

use arc_swap::ArcSwapOption;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
use serde::Deserialize;
use tokio_rustls::rustls;
use toolmesh_config::Config;

/// The configuration section of the listener's TLS.
pub const SECTION: &str = "tls";

/// `[tls]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file with the server's certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM file with the server's private key.
    pub key: PathBuf,
    /// PEM file with the CAs whose client certificates are accepted: mutual TLS.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: whether every client must show a certificate.
    #[serde(default)]
    pub client_auth: ClientAuth,
}

impl toolmesh_config::Section for TlsConfig {
    const NAME: &'static str = SECTION;
    const DEFAULTS: &'static str = include_str!("tls.toml");

    fn read(
        value: toml::Value,
        cx: &toolmesh_config::Reading<'_>,
    ) -> Result<Self, toolmesh_config::ConfigError> {
        cx.deserialize(value)
    }
}

/// `tls.client_auth`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// A client without a certificate from `client_ca` fails the handshake.
    #[default]
    Required,
    /// A client may come without a certificate and authenticate with a bearer credential
    /// (or as the anonymous principal where `[auth]` allows it).
    Optional,
}

impl TlsConfig {
    /// The files this configuration reads.
    fn files(&self) -> impl Iterator<Item = &Path> {
        [Some(self.cert.as_path()), Some(self.key.as_path()), self.client_ca.as_deref()]
            .into_iter()
            .flatten()
    }

    /// Reads the files and builds the server's TLS configuration. `Err` is (key below
    /// `tls`, reason).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, (&'static str, String)> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let chain = certificates(&self.cert).map_err(|reason| ("cert", reason))?;
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(|error| {
            ("key", format!("no private key read from {}: {error}", self.key.display()))
        })?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|error| ("cert", error.to_string()))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                for certificate in certificates(path).map_err(|reason| ("client_ca", reason))? {
                    roots.add(certificate).map_err(|error| {
                        ("client_ca", format!("a certificate of {}: {error}", path.display()))
                    })?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                );
                let verifier = match self.client_auth {
                    ClientAuth::Required => verifier,
                    ClientAuth::Optional => verifier.allow_unauthenticated(),
                };
                builder.with_client_cert_verifier(
                    verifier.build().map_err(|error| ("client_ca", error.to_string()))?,
                )
            }
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|error| {
            ("key", format!("does not go with the certificate of tls.cert: {error}"))
        })?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Every certificate of the PEM file `path`; at least one.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let read =
        |error: rustls_pki_types::pem::Error| format!("cannot read {}: {error}", path.display());
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    if chain.is_empty() {
        return Err(format!("no PEM certificate in {}", path.display()));
    }
    Ok(chain)
}

/// Returns `[tls]` of `config`, its files read: `None` without the section. A bad key,
/// value or file is one line naming `tls.<key>`.
pub fn load(config: &Config) -> anyhow::Result<Option<Loaded>> {
    let Some(tls) = config.find::<TlsConfig>()? else { return Ok(None) };
    let loaded = Loaded::read(tls)
        .map_err(|(key, reason)| config.key_error(&format!("{SECTION}.{key}"), reason))?;
    Ok(Some(loaded))
}

/// `[tls]` and what its files held when they were read.
#[derive(Debug, Clone)]
pub struct Loaded {
    config: TlsConfig,
    server: Arc<rustls::ServerConfig>,
    stamps: Vec<Option<(SystemTime, u64)>>,
}

impl Loaded {
    /// Reads the files of `config`. `Err` is (key below `tls`, reason).
    pub fn read(config: TlsConfig) -> Result<Self, (&'static str, String)> {
        // Stamped first: a file replaced while it is read is read again at the next poll.
        let stamps = stamps(&config);
        let server = config.server_config()?;
        Ok(Loaded { config, server, stamps })
    }
}

fn stamps(config: &TlsConfig) -> Vec<Option<(SystemTime, u64)>> {
    config
        .files()
        .map(|path| {
            let meta = std::fs::metadata(path).ok()?;
            Some((meta.modified().ok()?, meta.len()))
        })
        .collect()
}

/// The TLS in force on the listener (`None`: plaintext), replaced by a reload.
#[derive(Debug, Clone, Default)]
pub struct ListenerTls(Arc<ArcSwapOption<Loaded>>);

impl ListenerTls {
    /// Returns the listener's TLS with `loaded` in force.
    pub fn new(loaded: Option<Loaded>) -> Self {
        ListenerTls(Arc::new(ArcSwapOption::from(loaded.map(Arc::new))))
    }

    /// Returns the acceptor of a connection accepted now; `None`: plaintext.
    pub fn acceptor(&self) -> Option<tokio_rustls::TlsAcceptor> {
        self.0.load().as_ref().map(|loaded| tokio_rustls::TlsAcceptor::from(loaded.server.clone()))
    }

    /// Puts `loaded` in force for the connections accepted from now on.
    pub fn replace(&self, loaded: Option<Loaded>) {
        self.0.store(loaded.map(Arc::new));
    }

    /// Returns whether a file of the TLS in force changed since it was read (a rotated
    /// certificate).
    pub fn files_changed(&self) -> bool {
        self.0.load().as_ref().is_some_and(|loaded| stamps(&loaded.config) != loaded.stamps)
    }
}
