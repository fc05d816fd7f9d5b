//! [`RetryPolicy`]: which requests are retried, how often and how long apart.
//!
//! Invariant: every delay is at least the server's `Retry-After` when it sent one, at
//! most the cap otherwise, and no retry starts after the call's deadline; the schedule
//! is a pure function of the attempt, the server's answer and a jitter unit, so it is
//! tested without a clock.

use std::fmt;
use std::time::Duration;

use http::Method;

/// How a call is retried: capped exponential backoff with jitter, within a deadline.
///
/// The defaults: the methods that are not idempotent by themselves (`POST`, `PATCH`)
/// carry a key and are retried; the first retry waits about 100 ms, each next one
/// twice as long, at most 5 s; at most 8 attempts, none starting 30 s after the first.
///
/// ```
/// use std::time::Duration;
/// use idemcache_client::RetryPolicy;
///
/// let policy = RetryPolicy::default()
///     .with_deadline(Duration::from_secs(10))?
///     .with_attempts(5)?;
/// assert_eq!(policy.attempts(), 5);
/// # Ok::<(), idemcache_client::PolicyError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    first: Duration,
    cap: Duration,
    deadline: Duration,
    attempts: u32,
    methods: Vec<Method>,
}

/// Why a [`RetryPolicy`] setting was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyError {
    /// A duration of zero where the policy needs time (the deadline, the first delay).
    Zero(&'static str),
    /// Zero attempts: the call would never be sent.
    NoAttempt,
    /// A cap below the first delay.
    CapBelowFirst,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::Zero(what) => write!(f, "the retry policy's {what} is zero"),
            PolicyError::NoAttempt => f.write_str("a retry policy needs at least one attempt"),
            PolicyError::CapBelowFirst => {
                f.write_str("the retry policy's cap is below its first delay")
            }
        }
    }
}

impl std::error::Error for PolicyError {}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            first: Duration::from_millis(100),
            cap: Duration::from_secs(5),
            deadline: Duration::from_secs(30),
            attempts: 8,
            methods: vec![Method::POST, Method::PATCH],
        }
    }
}

impl RetryPolicy {
    /// The first retry's delay before jitter (doubled for each next one).
    pub fn with_first_delay(mut self, first: Duration) -> Result<Self, PolicyError> {
        if first.is_zero() {
            return Err(PolicyError::Zero("first delay"));
        }
        if self.cap < first {
            return Err(PolicyError::CapBelowFirst);
        }
        self.first = first;
        Ok(self)
    }

    /// The longest delay the backoff reaches (a server's `Retry-After` may ask for
    /// more, within the deadline).
    pub fn with_cap(mut self, cap: Duration) -> Result<Self, PolicyError> {
        if cap < self.first {
            return Err(PolicyError::CapBelowFirst);
        }
        self.cap = cap;
        Ok(self)
    }

    /// How long after the first attempt a retry may still start. A call still without
    /// a final answer then is given up.
    pub fn with_deadline(mut self, deadline: Duration) -> Result<Self, PolicyError> {
        if deadline.is_zero() {
            return Err(PolicyError::Zero("deadline"));
        }
        self.deadline = deadline;
        Ok(self)
    }

    /// The most attempts of one call, the first included.
    pub fn with_attempts(mut self, attempts: u32) -> Result<Self, PolicyError> {
        if attempts == 0 {
            return Err(PolicyError::NoAttempt);
        }
        self.attempts = attempts;
        Ok(self)
    }

    /// The methods that carry a key and are retried (`POST` and `PATCH` by default);
    /// the others pass through untouched.
    pub fn with_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// The most attempts of one call.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// How long after the first attempt a retry may still start.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Whether requests of `method` carry a key and are retried.
    pub fn applies_to(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }

    /// The wait before retry number `retry` (1 for the first retry): the backoff
    /// (`first · 2^(retry-1)`, capped) scaled by `0.5 + unit / 2` (`unit` in `[0, 1]`,
    /// the jitter), and never less than the server's `retry_after`.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>, unit: f64) -> Duration {
        let doubling = retry.saturating_sub(1).min(31);
        let backoff = self.first.saturating_mul(1 << doubling).min(self.cap);
        let unit = if unit.is_finite() { unit.clamp(0.0, 1.0) } else { 1.0 };
        let jittered = backoff.mul_f64(0.5 + unit / 2.0);
        retry_after.map_or(jittered, |asked| asked.max(jittered))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_backoff_doubles_to_its_cap_and_jitter_takes_at_most_half() {
        let policy = RetryPolicy::default();
        let full: Vec<_> = (1..=8).map(|n| policy.delay(n, None, 1.0)).collect();
        let caps = [100, 200, 400, 800, 1600, 3200, 5000, 5000].map(ms);
        assert_eq!(full, caps);
        assert_eq!(policy.delay(3, None, 0.0), ms(200), "half the backoff at the least");
        assert_eq!(policy.delay(u32::MAX, None, 1.0), ms(5000), "never past the cap");
        assert_eq!(policy.delay(1, None, f64::NAN), ms(100), "a bad unit is no panic");
    }

    #[test]
    fn a_servers_retry_after_is_the_least_wait() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.delay(1, Some(Duration::from_secs(2)), 1.0), Duration::from_secs(2));
        assert_eq!(policy.delay(4, Some(ms(10)), 1.0), ms(800), "the backoff when longer");
    }

    #[test]
    fn settings_that_cannot_work_are_refused() {
        let p = RetryPolicy::default();
        assert_eq!(p.clone().with_attempts(0), Err(PolicyError::NoAttempt));
        assert_eq!(p.clone().with_deadline(Duration::ZERO), Err(PolicyError::Zero("deadline")));
        assert_eq!(p.clone().with_cap(ms(10)), Err(PolicyError::CapBelowFirst));
        assert_eq!(
            p.clone().with_first_delay(Duration::from_secs(6)),
            Err(PolicyError::CapBelowFirst)
        );
        let said = PolicyError::Zero("deadline").to_string();
        assert_eq!(said, "the retry policy's deadline is zero");
        assert_eq!(PolicyError::NoAttempt.to_string(), "a retry policy needs at least one attempt");
        // A cap equal to the first delay: every retry waits the same.
        let flat = p.clone().with_cap(ms(100)).unwrap().with_first_delay(ms(100)).unwrap();
        assert_eq!(flat.delay(5, None, 1.0), ms(100));
        assert!(p.applies_to(&Method::POST) && !p.applies_to(&Method::GET));
        let all = p.with_methods([Method::PUT]);
        assert!(all.applies_to(&Method::PUT) && !all.applies_to(&Method::POST));
    }
}
