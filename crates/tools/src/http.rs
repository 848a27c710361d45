use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::Arc,
};

use serde_json::Value;
use toolmesh_config::{HttpMethod, HttpToolConfig};
use toolmesh_core::{BackendError, CallContext, ToolAnnotations, ToolOutput, ToolSource, ToolSpec};
use toolmesh_workers::LocalTool;

use crate::{CONFIG_SOURCE, template};

/// Longest excerpt of an error body put into an error result.
const EXCERPT_CHARS: usize = 300;
/// Redirects followed at most.
const MAX_REDIRECTS: usize = 5;

/// An HTTP tool could not be built.
#[derive(Debug, thiserror::Error)]
#[error("http tool {tool}: {reason}")]
pub struct HttpToolError {
    tool: String,
    reason: String,
}

/// A tool that makes one HTTP request per call, from configuration (`[[tools.http]]`).
///
/// Unless `allow_private_network` is set, it refuses destinations on loopback, private,
/// link-local, shared (CGNAT), multicast and unspecified addresses: literal IPs are checked
/// before the request, host names when they resolve (every resolved address is checked,
/// and the connection uses only checked addresses), and redirects are checked the same way.
#[derive(Debug)]
pub struct HttpTool {
    config: HttpToolConfig,
    client: reqwest::Client,
}

impl HttpTool {
    /// Builds the tool and its HTTP client.
    pub fn new(config: HttpToolConfig) -> Result<Self, HttpToolError> {
        let allow_private = config.allow_private_network;
        let redirect = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
            }
            match literal_ip(attempt.url()).filter(|ip| !allow_private && is_private(*ip)) {
                Some(ip) => attempt.error(format!("redirect to private address {ip} refused")),
                None => attempt.follow(),
            }
        });
        let client = reqwest::Client::builder()
            .redirect(redirect)
            .dns_resolver(Arc::new(GuardedResolver { allow_private }))
            .user_agent(concat!("toolmesh/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| HttpToolError {
                tool: config.common.name.clone(),
                reason: error.to_string(),
            })?;
        Ok(HttpTool { config, client })
    }

    async fn request(&self, arguments: &Value) -> Result<ToolOutput, String> {
        let url = template::fill_url(&self.config.url, arguments);
        let url =
            reqwest::Url::parse(&url).map_err(|error| format!("invalid URL {url}: {error}"))?;
        if let Some(ip) = literal_ip(&url)
            && !self.config.allow_private_network
            && is_private(ip)
        {
            return Err(format!(
                "request to {ip} refused: private, loopback and link-local destinations are not \
                 allowed for this tool (allow_private_network = false)"
            ));
        }
        let method = match self.config.method {
            HttpMethod::Get => reqwest::Method::GET,
            HttpMethod::Post => reqwest::Method::POST,
            HttpMethod::Put => reqwest::Method::PUT,
            HttpMethod::Patch => reqwest::Method::PATCH,
            HttpMethod::Delete => reqwest::Method::DELETE,
        };
        let mut request = self.client.request(method, url);
        for (name, value) in &self.config.headers {
            request = request.header(name, value);
        }
        if let Some(body) = &self.config.body {
            let body = template::fill_body(body, arguments);
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_string());
        }
        let mut response = request.send().await.map_err(describe_send_error)?;
        let status = response.status();
        let limit = self.config.max_response_bytes;
        let mut body = Vec::new();
        while let Some(chunk) =
            response.chunk().await.map_err(|e| format!("reading the response: {e}"))?
        {
            if body.len() + chunk.len() > limit {
                return Err(format!("response larger than max_response_bytes ({limit} bytes)"));
            }
            body.extend_from_slice(&chunk);
        }
        let text = String::from_utf8_lossy(&body);
        if !status.is_success() {
            let excerpt: String = text.chars().take(EXCERPT_CHARS).collect();
            return Err(format!("HTTP {status}: {excerpt}"));
        }
        let json = serde_json::from_slice::<Value>(&body).ok();
        match (&self.config.extract, json) {
            (Some(path), Some(json)) => match template::extract(&json, path) {
                Some(Value::String(s)) => Ok(ToolOutput::text(s.clone())),
                Some(value) => Ok(ToolOutput::json(value.clone())),
                None => Err(format!("the response has nothing at {path:?}")),
            },
            (Some(path), None) => Err(format!("cannot extract {path:?}: the response is not JSON")),
            (None, Some(json)) => Ok(ToolOutput::json(json)),
            (None, None) => Ok(ToolOutput::text(text.into_owned())),
        }
    }
}

#[async_trait::async_trait]
impl LocalTool for HttpTool {
    fn spec(&self) -> ToolSpec {
        let common = &self.config.common;
        let mut spec = ToolSpec::new(
            &common.name,
            &common.description,
            common.parameters.clone(),
            ToolSource::local(CONFIG_SOURCE),
        );
        spec.tags = common.tags.clone();
        spec.timeout = Some(common.timeout);
        let read_only = self.config.method == HttpMethod::Get;
        spec.annotations = ToolAnnotations {
            read_only: Some(read_only),
            destructive: None,
            idempotent: Some(read_only),
            open_world: Some(true),
        };
        spec
    }

    async fn call(&self, _ctx: &CallContext, arguments: Value) -> Result<ToolOutput, BackendError> {
        Ok(self.request(&arguments).await.unwrap_or_else(ToolOutput::error))
    }
}

fn describe_send_error(error: reqwest::Error) -> String {
    // The resolver's refusal sits deep in the source chain; show the whole chain.
    let mut message = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

fn literal_ip(url: &reqwest::Url) -> Option<IpAddr> {
    match url.host()? {
        url::Host::Ipv4(ip) => Some(IpAddr::V4(ip)),
        url::Host::Ipv6(ip) => Some(IpAddr::V6(ip)),
        url::Host::Domain(_) => None,
    }
}

/// Returns whether `ip` is an address an HTTP tool may not reach without
/// `allow_private_network`.
pub(crate) fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => is_private_v4(ip),
        IpAddr::V6(ip) => match ip.to_ipv4_mapped() {
            Some(v4) => is_private_v4(v4),
            None => is_private_v6(ip),
        },
    }
}

fn is_private_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
}

fn is_private_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00 // unique local
        || (first & 0xffc0) == 0xfe80 // link-local
}

/// Resolves host names and keeps only addresses the tool may reach.
struct GuardedResolver {
    allow_private: bool,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_private = self.allow_private;
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed: Vec<SocketAddr> =
                resolved.iter().copied().filter(|a| allow_private || !is_private(a.ip())).collect();
            if allowed.is_empty() {
                let reason = if resolved.is_empty() {
                    format!("{host} does not resolve")
                } else {
                    format!(
                        "{host} resolves only to private, loopback or link-local addresses; \
                         refused (allow_private_network = false)"
                    )
                };
                return Err(reason.into());
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_ranges_are_recognised() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            assert!(is_private(ip.parse().unwrap()), "{ip} is private");
        }
        for ip in ["8.8.8.8", "1.1.1.1", "100.128.0.1", "2606:4700::1111"] {
            assert!(!is_private(ip.parse().unwrap()), "{ip} is public");
        }
    }
}
