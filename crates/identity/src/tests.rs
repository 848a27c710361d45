use std::{
    path::Path,
    time::{SystemTime, UNIX_EPOCH},
};

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

use super::*;

const ISSUER: &str = "https://idp.test/";
const AUDIENCE: &str = "toolmesh";
const SECRET: &str = "a-test-secret-of-enough-length-for-hs256";

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs() as i64
}

fn claims(sub: &str) -> Value {
    json!({"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "exp": now() + 300, "roles": ["reader"]})
}

/// A key as an operator's Secret would hold it.
const ENV_KEY: &str = "tm_kX1y9cQ0a8s7d6f5g4h3j2k1l0zZyYxXwWvVuUtTsS";

fn env(name: &str) -> Option<String> {
    match name {
        "TEST_JWT_SECRET" => Some(SECRET.to_owned()),
        "TEST_WORKER_KEY" => Some(format!("{ENV_KEY}\n")),
        "TEST_SHORT_KEY" => Some("change-me".to_owned()),
        _ => None,
    }
}

fn jwt(issuer: &str) -> JwtConfig {
    JwtConfig {
        issuer: issuer.into(),
        audiences: vec![AUDIENCE.into()],
        algorithms: Vec::new(),
        secret_env: None,
        public_key_file: None,
        jwks_file: None,
        jwks_url: None,
        jwks_max_age_s: 300,
        principal_claim: "sub".into(),
        roles_claim: "roles".into(),
        roles: Vec::new(),
        attribute_claims: vec!["agent".into()],
    }
}

async fn authenticator(config: AuthConfig) -> Authenticator {
    Authenticator::new(&config, &env).await.expect("valid [auth]")
}

fn hs256(claims: &Value) -> String {
    let key = EncodingKey::from_secret(SECRET.as_bytes()).expect("a key");
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &key).expect("encodes")
}

async fn hs256_authenticator() -> Authenticator {
    let config = AuthConfig {
        jwt: vec![JwtConfig { secret_env: Some("TEST_JWT_SECRET".into()), ..jwt(ISSUER) }],
        ..AuthConfig::default()
    };
    authenticator(config).await
}

async fn bearer(auth: &Authenticator, token: &str) -> Result<Arc<Principal>, AuthError> {
    auth.authenticate(Some(&format!("Bearer {token}")), None).await
}

#[tokio::test]
async fn an_api_key_is_its_principal_and_an_unknown_one_is_refused() {
    let key = new_key();
    assert!(key.starts_with("tm_") && key.len() == 46, "{key}");
    let config = AuthConfig {
        api_keys: vec![ApiKeyConfig {
            principal: "ci-bot".into(),
            sha256: key_digest(&key),
            key_env: None,
            roles: vec!["ops".into()],
            attributes: [("agent".to_owned(), "deployer".to_owned())].into(),
        }],
        ..AuthConfig::default()
    };
    let auth = authenticator(config).await;
    let principal = bearer(&auth, &key).await.expect("a known key");
    assert_eq!(principal.name, "ci-bot");
    assert_eq!(principal.kind, PrincipalKind::ApiKey);
    assert_eq!(principal.roles, ["ops"]);
    assert_eq!(principal.attributes["agent"], "deployer");
    assert_eq!(principal.credential.as_ref().map(Secret::expose), Some(key.as_str()));
    // The scheme in any case; every request with the key is the same principal, shared.
    let again = auth.authenticate(Some(&format!("bearer {key}")), None).await.expect("again");
    assert!(Arc::ptr_eq(&principal, &again));

    assert_eq!(bearer(&auth, &new_key()).await, Err(AuthError::Invalid));
    assert_eq!(auth.authenticate(Some("Basic abc"), None).await, Err(AuthError::NotBearer));
    assert_eq!(auth.authenticate(Some("Bearer "), None).await, Err(AuthError::NotBearer));
    assert_eq!(auth.authenticate(None, None).await, Err(AuthError::Missing));
}

#[tokio::test]
async fn anonymous_access_is_an_explicit_principal() {
    let refused = authenticator(AuthConfig::default()).await;
    assert_eq!(refused.authenticate(None, None).await, Err(AuthError::Missing));
    assert!(refused.is_public("grpc.health.v1.Health"));
    assert!(!refused.is_public("toolmesh.v1.ToolService"));

    let config = AuthConfig {
        anonymous: Some("guest".into()),
        anonymous_roles: vec!["visitor".into()],
        ..AuthConfig::default()
    };
    let guest = authenticator(config).await.authenticate(None, None).await.expect("allowed");
    assert_eq!((guest.name.as_str(), guest.kind), ("guest", PrincipalKind::Anonymous));
    assert_eq!(guest.roles, ["visitor"]);

    // Without [auth], every caller is `anonymous`, whatever it sends.
    let open = Authenticator::open();
    assert!(!open.enforced());
    assert_eq!(
        open.authenticate(Some("Bearer nonsense"), None).await.expect("open").name,
        "anonymous"
    );
}

#[tokio::test]
async fn a_token_is_checked_for_signature_expiry_not_before_audience_and_issuer() {
    let auth = hs256_authenticator().await;
    let mut good = claims("alice");
    good["agent"] = json!("support-bot");
    let principal = bearer(&auth, &hs256(&good)).await.expect("a valid token");
    assert_eq!(principal.name, "alice");
    assert_eq!(principal.kind, PrincipalKind::Jwt);
    assert_eq!(principal.roles, ["reader"]);
    assert_eq!(principal.attributes["agent"], "support-bot");

    let with = |field: &str, value: Value| {
        let mut claims = claims("alice");
        claims[field] = value;
        hs256(&claims)
    };
    // Within the 30 s leeway an expired token still passes; beyond it, not.
    assert!(bearer(&auth, &with("exp", json!(now() - 10))).await.is_ok());
    assert_eq!(bearer(&auth, &with("exp", json!(now() - 120))).await, Err(AuthError::Expired));
    assert_eq!(bearer(&auth, &with("nbf", json!(now() + 120))).await, Err(AuthError::NotYetValid));
    assert_eq!(bearer(&auth, &with("aud", json!("someone-else"))).await, Err(AuthError::Audience));
    assert_eq!(
        bearer(&auth, &with("iss", json!("https://other.test/"))).await,
        Err(AuthError::Issuer)
    );
    let mut no_sub = claims("alice");
    no_sub.as_object_mut().expect("object").remove("sub");
    assert_eq!(bearer(&auth, &hs256(&no_sub)).await, Err(AuthError::MissingClaim("sub".into())));
    let mut no_exp = claims("alice");
    no_exp.as_object_mut().expect("object").remove("exp");
    assert_eq!(bearer(&auth, &hs256(&no_exp)).await, Err(AuthError::MissingClaim("exp".into())));

    // Signed with another secret.
    let other = EncodingKey::from_secret(b"another-secret-entirely-of-some-length").expect("a key");
    let forged =
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &good, &other).expect("encodes");
    assert_eq!(bearer(&auth, &forged).await, Err(AuthError::Signature));
    // The payload changed after signing.
    let token = hs256(&good);
    let parts: Vec<&str> = token.split('.').collect();
    let tampered_claims = URL_SAFE_NO_PAD.encode(claims("mallory").to_string());
    let tampered = format!("{}.{tampered_claims}.{}", parts[0], parts[2]);
    assert_eq!(bearer(&auth, &tampered).await, Err(AuthError::Signature));
    // `alg: none` is no algorithm at all.
    let none_header = URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#);
    let unsigned = format!("{none_header}.{}.", parts[1]);
    assert!(matches!(bearer(&auth, &unsigned).await, Err(AuthError::Malformed(_))));
    assert!(matches!(bearer(&auth, "a.b.c").await, Err(AuthError::Malformed(_))));
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("writes");
    path
}

#[tokio::test]
async fn an_rs256_token_verifies_with_the_issuers_public_key_and_not_as_an_hmac_secret() {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("an RSA key");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let public = write(dir.path(), "issuer.pem", &key.public_key_pem());
    let config = AuthConfig {
        jwt: vec![JwtConfig { public_key_file: Some(public), ..jwt(ISSUER) }],
        ..AuthConfig::default()
    };
    let auth = authenticator(config).await;
    let signing = EncodingKey::from_rsa_pem(key.serialize_pem().as_bytes()).expect("a PEM key");
    let token = jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims("bob"), &signing)
        .expect("encodes");
    assert_eq!(bearer(&auth, &token).await.expect("valid").name, "bob");

    // The public key used as an HMAC secret (the algorithm-confusion attack).
    let confused = EncodingKey::from_secret(key.public_key_pem().as_bytes()).expect("a key");
    let token = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims("bob"), &confused)
        .expect("encodes");
    assert!(matches!(bearer(&auth, &token).await, Err(AuthError::Algorithm(_))));
}

/// An ES256 key and its JWK.
fn es256(kid: &str) -> (EncodingKey, Value) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("an EC key");
    let point = key.public_key_raw();
    assert_eq!((point.len(), point[0]), (65, 4), "an uncompressed P-256 point");
    let jwk = json!({
        "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
        "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
        "y": URL_SAFE_NO_PAD.encode(&point[33..]),
    });
    let signing = EncodingKey::from_ec_pem(key.serialize_pem().as_bytes()).expect("a PEM key");
    (signing, jwk)
}

fn es256_token(key: &EncodingKey, kid: &str, sub: &str) -> String {
    let header = Header { kid: Some(kid.into()), ..Header::new(Algorithm::ES256) };
    jsonwebtoken::encode(&header, &claims(sub), key).expect("encodes")
}

#[tokio::test]
async fn a_rotated_key_set_is_read_again_for_an_unknown_kid_and_the_old_key_stops_working() {
    let (first, first_jwk) = es256("k1");
    let (second, second_jwk) = es256("k2");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let jwks = write(dir.path(), "jwks.json", &json!({"keys": [first_jwk]}).to_string());
    let config = AuthConfig {
        jwt: vec![JwtConfig { jwks_file: Some(jwks.clone()), ..jwt(ISSUER) }],
        ..AuthConfig::default()
    };
    let auth = authenticator(config).await;
    assert_eq!(bearer(&auth, &es256_token(&first, "k1", "carol")).await.expect("k1").name, "carol");
    assert_eq!(
        bearer(&auth, &es256_token(&second, "k2", "carol")).await,
        Err(AuthError::UnknownKey("k2".into())),
        "k2 is not published yet"
    );

    // The issuer rotates: k2 published, k1 withdrawn.
    write(dir.path(), "jwks.json", &json!({"keys": [second_jwk]}).to_string());
    // Within the cooldown of the last read for an unknown kid, the set is not read again.
    assert_eq!(
        bearer(&auth, &es256_token(&second, "k2", "carol")).await,
        Err(AuthError::UnknownKey("k2".into()))
    );
    tokio::time::sleep(jwt::UNKNOWN_KID_COOLDOWN).await;
    assert_eq!(bearer(&auth, &es256_token(&second, "k2", "dave")).await.expect("k2").name, "dave");
    assert_eq!(
        bearer(&auth, &es256_token(&first, "k1", "carol")).await,
        Err(AuthError::UnknownKey("k1".into())),
        "the withdrawn key no longer verifies"
    );
    // A token signed by k1's key but naming k2 fails its signature.
    assert_eq!(bearer(&auth, &es256_token(&first, "k2", "carol")).await, Err(AuthError::Signature));
}

#[tokio::test]
async fn a_key_set_is_fetched_from_a_url_and_tokens_are_routed_to_their_issuer() {
    let (key, jwk) = es256("url-key");
    let body = json!({"keys": [jwk]}).to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let url = format!("http://{}/jwks.json", listener.local_addr().expect("an address"));
    let fetches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let served = fetches.clone();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut request = [0u8; 2048];
            let _ = stream.read(&mut request).await;
            served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        }
    });
    let other = "https://other-idp.test/";
    let config = AuthConfig {
        jwt: vec![
            JwtConfig { secret_env: Some("TEST_JWT_SECRET".into()), ..jwt(other) },
            JwtConfig { jwks_url: Some(url), ..jwt(ISSUER) },
        ],
        ..AuthConfig::default()
    };
    let auth = authenticator(config).await;
    assert_eq!(fetches.load(std::sync::atomic::Ordering::SeqCst), 1, "read at start");
    for _ in 0..3 {
        let principal = bearer(&auth, &es256_token(&key, "url-key", "erin")).await.expect("valid");
        assert_eq!(principal.name, "erin");
    }
    assert_eq!(fetches.load(std::sync::atomic::Ordering::SeqCst), 1, "the set is kept");
    // The HS256 issuer's token goes to that issuer.
    let mut theirs = claims("frank");
    theirs["iss"] = json!(other);
    assert_eq!(bearer(&auth, &hs256(&theirs)).await.expect("valid").name, "frank");
    let mut unknown = claims("frank");
    unknown["iss"] = json!("https://nobody.test/");
    assert_eq!(bearer(&auth, &hs256(&unknown)).await, Err(AuthError::Issuer));
}

#[tokio::test]
async fn a_key_from_the_environment_is_known_by_its_digest() {
    let config = AuthConfig {
        api_keys: vec![ApiKeyConfig {
            principal: "workers".into(),
            sha256: String::new(),
            key_env: Some("TEST_WORKER_KEY".into()),
            roles: vec!["worker".into()],
            attributes: Default::default(),
        }],
        ..AuthConfig::default()
    };
    let auth = authenticator(config).await;
    // The Secret's trailing newline is not part of the key.
    let principal = bearer(&auth, ENV_KEY).await.expect("the key of the variable");
    assert_eq!(principal.name, "workers");
    assert_eq!(principal.roles, ["worker"]);
    let unknown = bearer(&auth, &new_key()).await;
    assert_eq!(unknown, Err(AuthError::Invalid), "an unknown key is no credential");
}

#[tokio::test]
async fn a_bad_section_names_its_key() {
    let bad = |config: AuthConfig| async move {
        Authenticator::new(&config, &env).await.expect_err("refused")
    };
    let key = ApiKeyConfig {
        principal: "p".into(),
        sha256: "xyz".into(),
        key_env: None,
        roles: Vec::new(),
        attributes: Default::default(),
    };
    let (at, reason) =
        bad(AuthConfig { api_keys: vec![key.clone()], ..AuthConfig::default() }).await;
    assert_eq!(at, "api_keys[0].sha256", "{reason}");
    // Exactly one of sha256 and key_env; the variable set, and long enough to be a secret.
    let both = ApiKeyConfig { key_env: Some("TEST_WORKER_KEY".into()), ..key.clone() };
    let (at, reason) = bad(AuthConfig { api_keys: vec![both], ..AuthConfig::default() }).await;
    assert_eq!(at, "api_keys[0].sha256", "{reason}");
    assert!(reason.contains("exactly one of sha256 and key_env"), "{reason}");
    for (name, says) in
        [("UNSET_VARIABLE", "UNSET_VARIABLE is not set"), ("TEST_SHORT_KEY", "at least 32")]
    {
        let from_env =
            ApiKeyConfig { sha256: String::new(), key_env: Some(name.into()), ..key.clone() };
        let (at, reason) =
            bad(AuthConfig { api_keys: vec![from_env], ..AuthConfig::default() }).await;
        assert_eq!(at, "api_keys[0].key_env", "{reason}");
        assert!(reason.contains(says), "{reason}");
    }
    let (key, _) = bad(AuthConfig { jwt: vec![jwt(ISSUER)], ..AuthConfig::default() }).await;
    assert_eq!(key, "jwt[0].issuer");
    let missing = JwtConfig { secret_env: Some("UNSET_VARIABLE".into()), ..jwt(ISSUER) };
    let (key, reason) = bad(AuthConfig { jwt: vec![missing], ..AuthConfig::default() }).await;
    assert_eq!(key, "jwt[0].secret_env");
    assert!(reason.contains("UNSET_VARIABLE"), "{reason}");
    let file = JwtConfig { jwks_file: Some("/nonexistent/jwks.json".into()), ..jwt(ISSUER) };
    let (key, _) = bad(AuthConfig { jwt: vec![file], ..AuthConfig::default() }).await;
    assert_eq!(key, "jwt[0].jwks_file");
}

/// A certificate with `names` as subject alternative names (DNS, or URI with a scheme) and
/// `common_name` as its subject's CN, in DER.
fn certificate(names: &[&str], common_name: Option<&str>) -> Vec<u8> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    for name in names {
        params.subject_alt_names.push(if name.contains("://") {
            rcgen::SanType::URI((*name).try_into().expect("an URI"))
        } else {
            rcgen::SanType::DnsName((*name).try_into().expect("a DNS name"))
        });
    }
    params.distinguished_name = rcgen::DistinguishedName::new();
    if let Some(cn) = common_name {
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
    }
    let key = rcgen::KeyPair::generate().expect("a key");
    params.self_signed(&key).expect("signed").der().to_vec()
}

#[test]
fn a_client_certificate_names_its_principal_by_dns_name_then_uri_then_common_name() {
    let name = |der: Vec<u8>| CertificateIdentity::from_der(&der).map(|id| id.name);
    let spiffe = "spiffe://example.org/ns/agents/sa/support";
    assert_eq!(
        name(certificate(&[spiffe, "agent.example", "other.example"], Some("cn"))).as_deref(),
        Some("agent.example"),
        "the first DNS name, wherever it stands"
    );
    assert_eq!(name(certificate(&[spiffe], Some("cn"))).as_deref(), Some(spiffe));
    assert_eq!(name(certificate(&[], Some("support-bot"))).as_deref(), Some("support-bot"));
    assert_eq!(name(certificate(&[], None)), None, "a certificate naming nobody");
    assert_eq!(name(b"not a certificate".to_vec()), None);
}

#[tokio::test]
async fn a_certificate_principal_takes_the_roles_of_its_name() {
    let config = AuthConfig {
        certificates: Some(CertificatesConfig {
            roles: vec!["client".into()],
            principals: [("agent.example".to_owned(), vec!["admin".to_owned()])].into(),
        }),
        ..AuthConfig::default()
    };
    let auth = authenticator(config).await;
    let agent = CertificateIdentity { name: "agent.example".into() };
    let principal = auth.authenticate(None, Some(&agent)).await.expect("accepted");
    assert_eq!(principal.name, "agent.example");
    assert_eq!(principal.kind, PrincipalKind::Certificate);
    assert_eq!(principal.roles, ["client", "admin"]);
    let other = CertificateIdentity { name: "other.example".into() };
    assert_eq!(auth.authenticate(None, Some(&other)).await.expect("accepted").roles, ["client"]);
    // Without a certificate and without anonymous access: refused.
    assert_eq!(auth.authenticate(None, None).await, Err(AuthError::Missing));
}
