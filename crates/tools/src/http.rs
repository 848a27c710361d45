use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use crate::{HttpMethod, HttpToolConfig};
use serde_json::Value;
use toolmesh_core::{
    BackendError, CallContext, ErrorCode, Nesting, Secret, ToolAnnotations, ToolOutput, ToolSource,
    ToolSpec,
};
use toolmesh_workers::LocalTool;

use crate::{CONFIG_SOURCE, addresses::special_purpose, template};

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

impl HttpToolError {
    /// The failure kind: the configuration is not valid.
    pub fn code(&self) -> toolmesh_core::ErrorCode {
        toolmesh_core::ErrorCode::InvalidArgument
    }
}

/// A tool that makes one HTTP request per call, from configuration (`[[tools.http]]`).
///
/// Unless `allow_private_network` is set, it refuses destinations that the IANA
/// special-purpose registries do not mark globally reachable (loopback, private,
/// link-local, shared, documentation, benchmarking, multicast, reserved…): literal IPs are
/// checked before each request; host names are checked when they resolve (every resolved
/// address, and the connection uses only checked addresses), or, through a configured
/// proxy, resolved and checked before the request. Environment proxies are ignored.
/// Redirects are followed by the tool itself, each hop checked the same way, and a redirect
/// to another origin drops the configured headers, so secrets stay with their host.
///
/// The upstream credentials the tool names (`credentials`) go with each call as headers:
/// the calling principal's own secret, or its bearer token where the credential passes it
/// on. A caller without one is refused before any request, and the headers are marked
/// sensitive, so that no log shows them.
#[derive(Debug)]
pub struct HttpTool {
    config: HttpToolConfig,
    client: reqwest::Client,
}

impl HttpTool {
    /// Builds the tool and its HTTP client.
    pub fn new(config: HttpToolConfig) -> Result<Self, HttpToolError> {
        let failed = |reason: String| HttpToolError { tool: config.common.name.clone(), reason };
        let builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("toolmesh/", env!("CARGO_PKG_VERSION")));
        let builder = match &config.proxy {
            // The proxy resolves destinations; `check_destination` checks them first. The
            // proxy itself is the operator's choice and may well be on a private network.
            Some(proxy) => builder.proxy(
                reqwest::Proxy::all(proxy).map_err(|e| failed(format!("proxy {proxy}: {e}")))?,
            ),
            None => builder.no_proxy().dns_resolver(Arc::new(GuardedResolver {
                allow_private: config.allow_private_network,
            })),
        };
        let client = builder.build().map_err(|error| failed(error.to_string()))?;
        Ok(HttpTool { config, client })
    }

    /// Refuses a destination the tool may not reach.
    async fn check_destination(&self, url: &reqwest::Url) -> Result<(), String> {
        if self.config.allow_private_network {
            return Ok(());
        }
        let refused = |ip: IpAddr, reason: &str| {
            format!(
                "request to {ip} refused: {reason} is not a destination for this tool \
                 (allow_private_network = false)"
            )
        };
        match url.host() {
            Some(url::Host::Ipv4(ip)) => match special_purpose(IpAddr::V4(ip)) {
                Some(reason) => Err(refused(IpAddr::V4(ip), reason)),
                None => Ok(()),
            },
            Some(url::Host::Ipv6(ip)) => match special_purpose(IpAddr::V6(ip)) {
                Some(reason) => Err(refused(IpAddr::V6(ip), reason)),
                None => Ok(()),
            },
            // Without a proxy the resolver checks every address at connect time.
            Some(url::Host::Domain(_)) if self.config.proxy.is_none() => Ok(()),
            Some(url::Host::Domain(host)) => {
                let port = url.port_or_known_default().unwrap_or(80);
                let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
                    .await
                    .map_err(|e| format!("{host} does not resolve: {e}"))?
                    .collect();
                if resolved.is_empty() {
                    return Err(format!("{host} does not resolve"));
                }
                match resolved.iter().find_map(|a| special_purpose(a.ip()).map(|r| (a.ip(), r))) {
                    Some((ip, reason)) => {
                        Err(format!("{host} resolves to {}", refused(ip, reason)))
                    }
                    None => Ok(()),
                }
            }
            None => Err(format!("{url} has no host")),
        }
    }

    async fn request(
        &self,
        url: String,
        arguments: &Value,
        nesting: &Nesting,
        credentials: &[(String, Secret)],
    ) -> Result<ToolOutput, String> {
        let mut url =
            reqwest::Url::parse(&url).map_err(|error| format!("invalid URL {url}: {error}"))?;
        let mut method = match self.config.method {
            HttpMethod::Get => reqwest::Method::GET,
            HttpMethod::Post => reqwest::Method::POST,
            HttpMethod::Put => reqwest::Method::PUT,
            HttpMethod::Patch => reqwest::Method::PATCH,
            HttpMethod::Delete => reqwest::Method::DELETE,
        };
        let mut body =
            self.config.body.as_ref().map(|b| template::fill_body(b, arguments).to_string());
        // The configured headers go to the tool's own origin only.
        let mut with_headers = true;
        for hop in 0..=MAX_REDIRECTS {
            self.check_destination(&url).await?;
            let mut request = self.client.request(method.clone(), url.clone());
            if with_headers {
                for (name, value) in &self.config.headers {
                    request = request.header(name, value);
                }
                for (name, secret) in credentials {
                    let mut value = reqwest::header::HeaderValue::from_str(secret.expose())
                        .map_err(|_| {
                            format!("the credential of header {name} is not a header value")
                        })?;
                    value.set_sensitive(true);
                    request = request.header(name, value);
                }
                // A service that calls back into toolmesh sends these with its calls.
                for (name, value) in nesting.pairs(Nesting::DEPTH_HEADER, Nesting::PARENT_HEADER) {
                    request = request.header(name, value);
                }
            }
            if let Some(body) = &body {
                request = request
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone());
            }
            let response = request.send().await.map_err(describe_send_error)?;
            let status = response.status();
            let location = response.headers().get(reqwest::header::LOCATION);
            let follow = matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308);
            let Some(location) = location.filter(|_| follow) else {
                return self.read(response).await;
            };
            if hop == MAX_REDIRECTS {
                return Err(format!("more than {MAX_REDIRECTS} redirects"));
            }
            let next = location
                .to_str()
                .ok()
                .and_then(|location| url.join(location).ok())
                .filter(|next| matches!(next.scheme(), "http" | "https"))
                .ok_or_else(|| format!("redirect to an invalid location {location:?}"))?;
            // As browsers do: 303, and 301/302 after anything but GET or HEAD, become a GET
            // without a body; 307 and 308 repeat the request as it was.
            let to_get = status == reqwest::StatusCode::SEE_OTHER
                || (matches!(status.as_u16(), 301 | 302)
                    && method != reqwest::Method::GET
                    && method != reqwest::Method::HEAD);
            if to_get {
                method = reqwest::Method::GET;
                body = None;
            }
            if next.origin() != url.origin() {
                with_headers = false;
            }
            url = next;
        }
        unreachable!("the loop returns by its last hop")
    }

    /// Reads the answer within `max_response_bytes` and shapes it into the tool's output.
    async fn read(&self, mut response: reqwest::Response) -> Result<ToolOutput, String> {
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
        // A GET reads; what the file declares wins.
        let read_only = self.config.method == HttpMethod::Get;
        let declared = common.annotations;
        spec.annotations = ToolAnnotations {
            read_only: declared.read_only.or(Some(read_only)),
            destructive: declared.destructive,
            idempotent: declared.idempotent.or(Some(read_only)),
            open_world: declared.open_world.or(Some(true)),
        };
        spec
    }

    async fn call(&self, ctx: &CallContext, arguments: Value) -> Result<ToolOutput, BackendError> {
        let url = template::fill_url(&self.config.url, &arguments)
            .map_err(BackendError::InvalidArguments)?;
        let nesting = Nesting::of(ctx);
        let credentials = self.config.credentials.headers(&ctx.principal).map_err(|message| {
            BackendError::Remote { code: ErrorCode::FailedPrecondition, message }
        })?;
        let output = self.request(url, &arguments, &nesting, &credentials).await;
        Ok(output.unwrap_or_else(ToolOutput::error))
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
            let allowed: Vec<SocketAddr> = resolved
                .iter()
                .copied()
                .filter(|a| allow_private || special_purpose(a.ip()).is_none())
                .collect();
            if allowed.is_empty() {
                let reason = if resolved.is_empty() {
                    format!("{host} does not resolve")
                } else {
                    format!(
                        "{host} resolves only to private, loopback, link-local or other \
                         special-purpose addresses; refused (allow_private_network = false)"
                    )
                };
                return Err(reason.into());
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}
