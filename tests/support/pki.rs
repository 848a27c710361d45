//! Certificates made by the tests (rcgen): a certificate authority, and the server and
//! client certificates it signs, written as PEM files.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate authority whose files live in a directory of the test's.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
    name: String,
    /// The CA's certificate (PEM), for `tls.client_ca`, `--ca-cert` and `-cacert`.
    pub cert: PathBuf,
}

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct Pair {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key.
    pub key: PathBuf,
}

impl Ca {
    /// Makes a CA named `name` and writes its certificate into `dir`.
    pub fn new(dir: &Path, name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.distinguished_name.push(DnType::CommonName, format!("{name} test CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("a CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("a self-signed CA");
        let cert = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&cert, issuer.pem()).expect("write the CA certificate");
        Ca { issuer, dir: dir.to_owned(), name: name.to_owned(), cert }
    }

    /// A server certificate for `localhost` and `127.0.0.1`, written as `<file>.pem` and
    /// `<file>-key.pem`.
    pub fn server(&self, file: &str) -> Pair {
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        self.sign(file, names, "localhost", ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate whose DNS name is `name`.
    pub fn client(&self, name: &str) -> Pair {
        let file = format!("{}-client-{name}", self.name);
        self.sign(&file, vec![name.to_owned()], name, ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn sign(
        &self,
        file: &str,
        names: Vec<String>,
        common_name: &str,
        usage: ExtendedKeyUsagePurpose,
    ) -> Pair {
        let mut params = CertificateParams::new(names).expect("parameters");
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().expect("a key");
        let certificate = params.signed_by(&key, &*self.issuer).expect("signed by the CA");
        let pair = Pair {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}-key.pem")),
        };
        std::fs::write(&pair.cert, certificate.pem()).expect("write the certificate");
        std::fs::write(&pair.key, key.serialize_pem()).expect("write the key");
        pair
    }
}
