//! How long a scope's executions take in this process, for the `Retry-After` of a 409.
//!
//! Invariant: an estimate is whole seconds, at least one, and never later than the
//! holder's lease end (but for a lease ending within the second); and the memory it
//! takes is bounded: at most [`MAX_SCOPES`] scopes are tracked (when a new one would
//! pass that, the table starts over), so scopes named by raw paths cannot grow it
//! without bound.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;

/// The most scopes whose execution times are tracked at once.
pub(crate) const MAX_SCOPES: usize = 1024;

/// The shortest `Retry-After` the layer gives for an execution in progress.
const SHORTEST: Duration = Duration::from_secs(1);

/// Recent execution times per scope: an exponentially weighted mean (each new sample
/// counts a quarter), so it follows a scope that slows down or speeds up within a few
/// executions.
#[derive(Debug, Default)]
pub(crate) struct ExecutionTimes {
    // ahash: each execution looks its scope up once; SipHash's DoS resistance buys
    // nothing for a table of at most MAX_SCOPES that starts over when full.
    scopes: Mutex<HashMap<String, Duration, ahash::RandomState>>,
}

impl ExecutionTimes {
    /// One execution of `scope` took `took`, from its handler's start to its response
    /// read whole.
    pub(crate) fn record(&self, scope: &str, took: Duration) {
        let mut scopes = self.scopes.lock();
        if let Some(mean) = scopes.get_mut(scope) {
            *mean = *mean * 3 / 4 + took / 4;
            return;
        }
        if scopes.len() >= MAX_SCOPES {
            scopes.clear();
        }
        scopes.insert(scope.to_owned(), took);
    }

    /// When to try again, in whole seconds (as `Retry-After` says it), for a request of
    /// `scope` whose holder's lease ends in `lease_left`: the scope's recent execution
    /// time rounded up, at least one second, and never past the lease end (rounded
    /// down to it; a lease ending within the second gets one second). A scope with no
    /// execution finished here yet gets one second.
    pub(crate) fn retry_after(&self, scope: &str, lease_left: Duration) -> Duration {
        let estimate = self.scopes.lock().get(scope).copied().unwrap_or(SHORTEST);
        let up = estimate.as_secs() + u64::from(estimate.subsec_nanos() > 0);
        Duration::from_secs(up.min(lease_left.as_secs()).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(60);

    #[test]
    fn the_estimate_is_the_recent_mean_at_least_a_second_and_never_past_the_lease() {
        let times = ExecutionTimes::default();
        assert_eq!(times.retry_after("POST /a", LEASE), SHORTEST, "nothing known yet");
        times.record("POST /a", Duration::from_millis(1500));
        assert_eq!(times.retry_after("POST /a", LEASE), Duration::from_secs(2), "rounded up");
        times.record("POST /a", Duration::from_millis(3500));
        assert_eq!(times.retry_after("POST /a", LEASE), Duration::from_secs(2), "the mean: 2 s");
        times.record("POST /a", Duration::from_secs(20)); // the mean: 6.5 s
        assert_eq!(times.retry_after("POST /a", LEASE), Duration::from_secs(7));
        let left = Duration::from_millis(5500);
        assert_eq!(times.retry_after("POST /a", left), Duration::from_secs(5), "the lease first");
        let within = Duration::from_millis(700);
        assert_eq!(times.retry_after("POST /a", within), SHORTEST, "a lease ending within 1 s");
        times.record("POST /fast", Duration::from_millis(5));
        assert_eq!(times.retry_after("POST /fast", LEASE), SHORTEST);
        assert_eq!(times.retry_after("POST /other", LEASE), SHORTEST, "scopes are apart");
    }

    #[test]
    fn the_table_is_bounded_and_starts_over_when_full() {
        let times = ExecutionTimes::default();
        for i in 0..MAX_SCOPES {
            times.record(&format!("POST /{i}"), Duration::from_secs(5));
        }
        assert_eq!(times.scopes.lock().len(), MAX_SCOPES);
        times.record("POST /0", Duration::from_secs(9)); // a known scope: no start-over
        assert_eq!(times.scopes.lock().len(), MAX_SCOPES);
        times.record("POST /new", Duration::from_secs(5));
        assert_eq!(times.scopes.lock().len(), 1);
        assert_eq!(times.retry_after("POST /new", LEASE), Duration::from_secs(5));
        assert_eq!(times.retry_after("POST /1", LEASE), SHORTEST);
    }
}
