//! Rate, concurrency and size limits per principal and per tool.

use std::{
    collections::HashMap,
    num::NonZeroU32,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter, clock::Clock as _};
use toolmesh_config::Selector;
use toolmesh_core::{Principal, ToolSpec};

use crate::{
    PolicyError,
    config::{LimitsConfig, PrincipalLimitConfig, ToolLimitConfig},
    who::Who,
};

/// Checks between two sweeps of a limiter's idle keys.
const SWEEP_EVERY: u64 = 4096;

/// Why a call is refused before it runs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// A rate limit is reached; a call may succeed after `retry_after`.
    #[error("the rate limit of {subject} ({rate}) is reached; retry in {} ms", retry_after.as_millis().max(1))]
    Rate {
        /// Whose limit: `principal alice` or `tool search_docs`.
        subject: String,
        /// The limit, as configured (`20/s, burst 40`).
        rate: String,
        /// When a call may succeed again.
        retry_after: Duration,
    },
    /// The principal has as many calls running as it may.
    #[error("principal {principal} has {max} calls running, as many as it may at once")]
    Concurrency {
        /// The principal.
        principal: String,
        /// Its limit.
        max: usize,
    },
}

/// Calls running, per principal with any.
type Running = Arc<Mutex<HashMap<String, usize>>>;

/// The compiled `[policy.limits]`.
pub(crate) struct Limits {
    max_argument_bytes: Option<usize>,
    max_result_bytes: Option<usize>,
    principals: Vec<PrincipalLimit>,
    tools: Vec<ToolLimit>,
}

struct PrincipalLimit {
    who: Who,
    rate: Option<Bucket>,
    max_concurrent: Option<usize>,
    /// Calls running, per principal with any.
    running: Running,
}

struct ToolLimit {
    tools: Vec<Selector>,
    rate: Option<Bucket>,
    max_result_bytes: Option<usize>,
    truncate: bool,
}

/// One token bucket per key.
struct Bucket {
    limiter: DefaultKeyedRateLimiter<String>,
    describe: String,
    checks: AtomicU64,
}

impl Bucket {
    fn new(key: &str, rate: Option<f64>, burst: Option<u32>) -> Result<Option<Self>, PolicyError> {
        let Some(rate) = rate else { return Ok(None) };
        let bad = |reason: String| PolicyError::Rule { key: key.to_owned(), reason };
        if !(rate.is_finite() && rate > 0.0) {
            return Err(bad(format!("rate_per_s must be above 0, not {rate}")));
        }
        let burst = burst.unwrap_or_else(|| rate.ceil().max(1.0) as u32);
        let burst = NonZeroU32::new(burst).ok_or_else(|| bad("burst must be at least 1".into()))?;
        let quota = Quota::with_period(Duration::from_secs_f64(1.0 / rate))
            .ok_or_else(|| bad(format!("rate_per_s {rate} is too high")))?
            .allow_burst(burst);
        Ok(Some(Bucket {
            limiter: RateLimiter::keyed(quota),
            describe: format!("{rate}/s, burst {burst}"),
            checks: AtomicU64::new(0),
        }))
    }

    /// Takes a token of `key`'s bucket, or says when one is there.
    fn take(&self, key: &str, subject: impl FnOnce() -> String) -> Result<(), LimitError> {
        if self.checks.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            // Buckets that are full again hold nothing worth keeping.
            self.limiter.retain_recent();
        }
        self.limiter.check_key(&key.to_owned()).map_err(|not_until| LimitError::Rate {
            subject: subject(),
            rate: self.describe.clone(),
            retry_after: not_until.wait_time_from(self.limiter.clock().now()),
        })
    }
}

impl Limits {
    pub(crate) fn new(config: &LimitsConfig) -> Result<Self, PolicyError> {
        let principals = config
            .principals
            .iter()
            .enumerate()
            .map(|(i, limit): (usize, &PrincipalLimitConfig)| {
                Ok(PrincipalLimit {
                    who: Who::new(
                        &format!("limits.principals[{i}]"),
                        &limit.principals,
                        &limit.roles,
                        &limit.agents,
                        &limit.principal_kinds,
                        &limit.issuers,
                    )?,
                    rate: Bucket::new(
                        &format!("limits.principals[{i}].rate_per_s"),
                        limit.rate_per_s,
                        limit.burst,
                    )?,
                    max_concurrent: limit.max_concurrent,
                    running: Arc::default(),
                })
            })
            .collect::<Result<_, PolicyError>>()?;
        let tools = config
            .tools
            .iter()
            .enumerate()
            .map(|(i, limit): (usize, &ToolLimitConfig)| {
                Ok(ToolLimit {
                    tools: limit.tools.clone(),
                    rate: Bucket::new(
                        &format!("limits.tools[{i}].rate_per_s"),
                        limit.rate_per_s,
                        limit.burst,
                    )?,
                    max_result_bytes: limit.max_result_bytes,
                    truncate: limit.truncate_result,
                })
            })
            .collect::<Result<_, PolicyError>>()?;
        Ok(Limits {
            max_argument_bytes: config.max_argument_bytes,
            max_result_bytes: config.max_result_bytes,
            principals,
            tools,
        })
    }

    pub(crate) fn none() -> Self {
        Limits {
            max_argument_bytes: None,
            max_result_bytes: None,
            principals: Vec::new(),
            tools: Vec::new(),
        }
    }

    pub(crate) fn max_argument_bytes(&self) -> Option<usize> {
        self.max_argument_bytes
    }

    /// The largest result of `spec`, and whether a larger one is cut instead of refused.
    pub(crate) fn result_limit(&self, spec: &ToolSpec) -> Option<ResultLimit> {
        let tool = self.tool(spec);
        let max = tool.and_then(|t| t.max_result_bytes).or(self.max_result_bytes)?;
        Some(ResultLimit { max_bytes: max, truncate: tool.is_some_and(|t| t.truncate) })
    }

    fn tool(&self, spec: &ToolSpec) -> Option<&ToolLimit> {
        self.tools.iter().find(|t| t.tools.iter().any(|s| s.selects(spec)))
    }

    /// Admits one call of `spec` by `principal`: a slot of the principal's concurrency, a
    /// token of its bucket and of the tool's. The slot is held until the permit drops.
    pub(crate) fn admit(
        &self,
        principal: &Principal,
        spec: &ToolSpec,
    ) -> Result<Permit, LimitError> {
        let mut permit = Permit { running: None };
        if let Some(limit) = self.principals.iter().find(|l| l.who.matches(principal)) {
            // Kept by the qualified name: a token whose subject is `alice` and the key
            // named `alice` are two principals, each with its own slots and bucket.
            let key = principal.qualified_name();
            if let Some(max) = limit.max_concurrent {
                let mut running = limit.running.lock().unwrap_or_else(PoisonError::into_inner);
                let count = running.entry(key.clone()).or_default();
                if *count >= max {
                    return Err(LimitError::Concurrency { principal: principal.name.clone(), max });
                }
                *count += 1;
                permit.running = Some((limit.running.clone(), key.clone()));
            }
            if let Some(bucket) = &limit.rate {
                bucket.take(&key, || format!("principal {}", principal.name))?;
            }
        }
        if let Some(bucket) = self.tool(spec).and_then(|t| t.rate.as_ref()) {
            bucket.take(&spec.name, || format!("tool {}", spec.name))?;
        }
        Ok(permit)
    }
}

/// The largest result a tool may return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResultLimit {
    /// In bytes of text and structured JSON.
    pub max_bytes: usize,
    /// Cut a larger result, marked, instead of refusing it.
    pub truncate: bool,
}

/// A call's slot of its principal's concurrency, given back on drop.
#[derive(Debug)]
pub struct Permit {
    running: Option<(Running, String)>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let Some((running, principal)) = self.running.take() else { return };
        let mut running = running.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = running.get_mut(&principal) {
            *count -= 1;
            if *count == 0 {
                running.remove(&principal);
            }
        }
    }
}
