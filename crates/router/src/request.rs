//! One call as the router receives it, and the options it runs calls by.

use std::{sync::Arc, time::Duration};

use toolmesh_core::{Nesting, Principal, RetryPolicy};

/// Timeouts the router applies.
#[derive(Debug, Clone, Copy)]
pub struct RouterOptions {
    /// Timeout of a call when neither the client nor the tool sets one.
    pub default_timeout: Duration,
    /// No call runs longer than this.
    pub max_timeout: Duration,
    /// How calls of read-only and idempotent tools whose connection broke are repeated.
    pub retry: RetryPolicy,
    /// The deepest call nesting accepted.
    pub max_call_depth: u32,
}

impl Default for RouterOptions {
    fn default() -> Self {
        RouterOptions {
            default_timeout: Duration::from_secs(60),
            max_timeout: Duration::from_secs(600),
            retry: RetryPolicy::default(),
            max_call_depth: 3,
        }
    }
}

/// One call as the router receives it.
#[derive(Debug, Clone)]
pub struct CallRequest {
    /// Tool name.
    pub name: String,
    /// Arguments as JSON text; empty means `{}`.
    pub arguments_json: String,
    /// Caller's call id; generated when empty.
    pub call_id: String,
    /// Agent session, if any.
    pub session_id: String,
    /// Routing profile, for the meta-tools; empty: the default profile.
    pub profile: String,
    /// The client's own deadline (from `grpc-timeout`), if any.
    pub client_timeout: Option<Duration>,
    /// Who is calling.
    pub principal: Arc<Principal>,
    /// How deep the call is nested (0: a caller's own call), and the call that made it.
    pub nesting: Option<Nesting>,
}

impl Default for CallRequest {
    fn default() -> Self {
        CallRequest {
            name: String::new(),
            arguments_json: String::new(),
            call_id: String::new(),
            session_id: String::new(),
            profile: String::new(),
            client_timeout: None,
            principal: toolmesh_core::open_principal(),
            nesting: None,
        }
    }
}
