//! [`IdempotentRetry`]: the reqwest middleware that sends one key with every attempt of
//! a call and retries what is safe to retry.
//!
//! Invariant: the key is chosen once, before the first attempt ([`crate::key`]), and
//! every attempt carries it; an attempt is repeated only when [`crate::attempt`] says
//! so, the request's body can be sent again (a stream is sent once), the policy's
//! attempts are not spent and the retry would start within its deadline. A failure the
//! middleware ends with is a [`CallFailed`] that says whether any attempt may have
//! reached the server.

use std::fmt;

use http::{Extensions, HeaderName};
use idemcache::layer::IDEMPOTENCY_KEY;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use crate::attempt::{self, Next as After};
use crate::{CallKey, RetryPolicy};

/// Reqwest middleware: every request of the policy's methods (`POST`, `PATCH`) carries
/// an `Idempotency-Key` (the caller's [`CallKey`], an `Idempotency-Key` header it set,
/// or one generated for the call), the same on every retry; connection failures,
/// timeouts, 5xx, 429 and the in-progress answer (409 with `Retry-After`) are retried
/// with capped exponential backoff and jitter, honouring `Retry-After`, within the
/// policy's deadline; a reused key's 422 and every other 4xx are not. Other methods pass
/// through untouched.
///
/// Read the result with [`CallOutcome::of`](crate::CallOutcome::of).
///
/// ```no_run
/// use idemcache_client::{CallKey, CallOutcome, IdempotentRetry};
/// use reqwest_middleware::ClientBuilder;
///
/// # async fn charge() -> Result<(), Box<dyn std::error::Error>> {
/// let client = ClientBuilder::new(reqwest::Client::new()).with(IdempotentRetry::default()).build();
/// let answer = client
///     .post("http://payments.internal/charges")
///     .body(r#"{"order":42,"amount":1000}"#)
///     .with_extension(CallKey::new("order-42-charge")?)
///     .send()
///     .await;
/// match CallOutcome::of(answer).await {
///     CallOutcome::Executed { response, replayed } => { /* the charge, once */ }
///     CallOutcome::Refused { status, problem } => { /* nothing ran: fix the request */ }
///     CallOutcome::NotSent { .. } => { /* nothing left: give up or try later */ }
///     CallOutcome::Unknown { .. } => { /* mark your claim UNKNOWN; reconcile by the key */ }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct IdempotentRetry {
    policy: RetryPolicy,
}

impl IdempotentRetry {
    /// The middleware under `policy`.
    pub fn new(policy: RetryPolicy) -> IdempotentRetry {
        IdempotentRetry { policy }
    }

    /// The policy it retries under.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }
}

/// The error a call ends with when it has no answer: the last attempt's failure, the
/// number of attempts, and whether any may have reached the server.
#[derive(Debug)]
pub struct CallFailed {
    /// The attempts made (0 when the call was refused before its first).
    pub attempts: u32,
    /// Whether any attempt may have reached the server: `false` means no connection
    /// was ever made (nothing can have run).
    pub sent: bool,
    /// The call's key, if one was chosen.
    pub key: Option<CallKey>,
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl CallFailed {
    /// The `CallFailed` inside `error`, if the middleware ended the call with one (a
    /// `reqwest_middleware::Error::Middleware` holding it).
    pub fn of(error: &reqwest_middleware::Error) -> Option<&CallFailed> {
        match error {
            reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<CallFailed>(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }
}

/// Says what the call came to; the last attempt's failure is its
/// [`source`](std::error::Error::source), not repeated here.
impl fmt::Display for CallFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = self.key.as_ref().map_or("no key", CallKey::as_str);
        let sent = if self.sent { "may have reached the server" } else { "was never sent" };
        write!(f, "the call ({key}) {sent}, after {} attempts", self.attempts)
    }
}

impl std::error::Error for CallFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// The key of the call `request` begins: the caller's [`CallKey`] extension, else an
/// `Idempotency-Key` header it set (checked), else a new one.
fn key_for(request: &Request, extensions: &Extensions) -> Result<CallKey, CallFailed> {
    if let Some(key) = extensions.get::<CallKey>() {
        return Ok(key.clone());
    }
    let Some(set) = request.headers().get(IDEMPOTENCY_KEY) else { return Ok(CallKey::generate()) };
    let refused = |why: String| CallFailed {
        attempts: 0,
        sent: false,
        key: None,
        source: format!("the request's Idempotency-Key header {why}").into(),
    };
    let text = set.to_str().map_err(|_| refused("is not visible ASCII".into()))?;
    CallKey::new(text).map_err(|e| refused(e.to_string()))
}

/// A jitter unit in `[0, 1)`, from the system's randomness.
fn jitter() -> f64 {
    unit(uuid::Uuid::new_v4().as_u64_pair().0)
}

/// `bits` as a number in `[0, 1)`: its top 53 bits over 2^53 (every value exact in an
/// `f64`).
fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[async_trait::async_trait]
impl Middleware for IdempotentRetry {
    async fn handle(
        &self,
        mut request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        if !self.policy.applies_to(request.method()) {
            return next.run(request, extensions).await;
        }
        let key = key_for(&request, extensions).map_err(reqwest_middleware::Error::middleware)?;
        let header = HeaderName::from_static(IDEMPOTENCY_KEY);
        request.headers_mut().insert(header, key.header_value().clone());
        let started = tokio::time::Instant::now();
        let (mut attempts, mut sent) = (0, false);
        loop {
            // Kept for a retry before this attempt consumes the request; a streaming body
            // cannot be, and is sent once.
            let spare = request.try_clone();
            attempts += 1;
            let answer = next.clone().run(request, extensions).await;
            let (after, reached) = match &answer {
                Ok(response) => (attempt::of_response(response.status(), response.headers()), true),
                Err(reqwest_middleware::Error::Reqwest(e)) => attempt::of_error(e),
                // An inner middleware's own failure: nothing says it was not sent.
                Err(reqwest_middleware::Error::Middleware(_)) => (After::Final, true),
            };
            sent |= reached;
            let retry = match (after, spare) {
                (After::Retry { after }, Some(spare)) if attempts < self.policy.attempts() => {
                    let wait = self.policy.delay(attempts, after, jitter());
                    let within = started.elapsed().saturating_add(wait) <= self.policy.deadline();
                    within.then_some((spare, wait))
                }
                _ => None,
            };
            let Some((spare, wait)) = retry else {
                return answer.map_err(|e| {
                    reqwest_middleware::Error::middleware(CallFailed {
                        attempts,
                        sent,
                        key: Some(key.clone()),
                        source: Box::new(e),
                    })
                });
            };
            tokio::time::sleep(wait).await;
            request = spare;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jitter_unit_spans_zero_to_below_one() {
        assert_eq!(unit(0), 0.0);
        assert_eq!(unit(1 << 63), 0.5);
        let top = unit(u64::MAX);
        assert!(top < 1.0 && top > 0.999_999, "{top}");
        assert!((0.0..1.0).contains(&jitter()));
        // From the system's randomness: two draws meet with odds of 2^-53.
        assert_ne!(jitter(), jitter());
    }

    #[test]
    fn a_failed_call_says_whether_it_was_sent_and_keeps_its_cause() {
        use std::error::Error as _;
        let failed = CallFailed {
            attempts: 3,
            sent: false,
            key: Some(CallKey::new("k-1").unwrap()),
            source: "connection refused".into(),
        };
        let said = failed.to_string();
        assert_eq!(said, "the call (k-1) was never sent, after 3 attempts");
        assert_eq!(failed.source().unwrap().to_string(), "connection refused");
        let sent = CallFailed { sent: true, key: None, ..failed };
        assert!(sent.to_string().starts_with("the call (no key) may have reached the server"));
    }

    #[test]
    fn the_middleware_keeps_its_policy() {
        let policy = RetryPolicy::default().with_attempts(2).unwrap();
        assert_eq!(IdempotentRetry::new(policy.clone()).policy(), &policy);
    }
}
