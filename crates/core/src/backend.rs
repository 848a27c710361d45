use serde_json::Value;

use crate::{BackendError, CallContext, ToolOutput};

/// A place where tools run: the local worker pool, remote workers, an MCP server, a
/// knowledge collection. The registry maps each tool to its backend; the router calls it
/// without knowing which kind it is.
///
/// An implementation returns promptly once `ctx.cancel` is cancelled, stopping the work it
/// started (tasks, processes, requests), and reports progress through `ctx.events`.
#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Runs one call of `ctx.tool` with already validated `arguments`.
    async fn call(&self, ctx: CallContext, arguments: Value) -> Result<ToolOutput, BackendError>;
}

/// How a call whose connection broke is repeated ([`BackendError::Lost`] of a tool that
/// is read-only or idempotent; see [`BackendError::retryable`]).
///
/// [`BackendError::Lost`]: crate::BackendError::Lost
/// [`BackendError::retryable`]: crate::BackendError::retryable
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; 1 never repeats a call.
    pub attempts: std::num::NonZeroU32,
    /// The wait before the second attempt; it doubles with each further one.
    pub backoff: std::time::Duration,
    /// The longest wait between two attempts.
    pub max_backoff: std::time::Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: std::num::NonZeroU32::new(3).unwrap_or(std::num::NonZeroU32::MIN),
            backoff: std::time::Duration::from_millis(100),
            max_backoff: std::time::Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// The wait before attempt `next` (2 for the first repetition): the backoff doubled
    /// per earlier repetition, capped, then a random share of it between a half and the
    /// whole, so that calls that failed together do not come back together.
    pub fn wait(&self, next: u32) -> std::time::Duration {
        use std::hash::BuildHasher as _;
        let doublings = next.saturating_sub(2).min(16);
        let full = self.backoff.saturating_mul(1 << doublings).min(self.max_backoff);
        let random = std::hash::RandomState::new().hash_one(next);
        let share = 0.5 + (random >> 11) as f64 / (1u64 << 53) as f64 / 2.0;
        full.mul_f64(share)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_with_jitter_of_at_most_half() {
        let policy = RetryPolicy::default();
        for _ in 0..100 {
            let second = policy.wait(2);
            assert!(second >= Duration::from_millis(50) && second <= Duration::from_millis(100));
            let third = policy.wait(3);
            assert!(third >= Duration::from_millis(100) && third <= Duration::from_millis(200));
            let late = policy.wait(40);
            assert!(late >= Duration::from_secs(1) && late <= Duration::from_secs(2));
        }
        let waits: std::collections::HashSet<Duration> = (0..20).map(|_| policy.wait(2)).collect();
        assert!(waits.len() > 1, "every wait is the same: no jitter");
    }
}
