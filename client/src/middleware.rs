//! [`IdempotentRetry`]: the reqwest middleware that sends one key with every attempt of
//! a call and retries what is safe to retry.
//!
//! Invariant: the key is chosen once, before the first attempt ([`crate::key`]), and
//! every attempt carries it; an attempt is repeated only when [`crate::attempt`] says
//! so, the request's body can be sent again (a stream is sent once), the policy's
//! attempts are not spent and the retry would start within its deadline. A failure the
//! middleware ends with is a [`CallFailed`] that says whether any attempt may have
//! reached the server.

use http::{Extensions, HeaderName};
use idemcache::layer::IDEMPOTENCY_KEY;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use crate::attempt::{self, Next as After, Schedule};
use crate::failed::key_for;
use crate::{CallFailed, CallKey, RetryPolicy};

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
        let key = key_for(extensions.get::<CallKey>(), request.headers().get(IDEMPOTENCY_KEY))
            .map_err(reqwest_middleware::Error::middleware)?;
        let header = HeaderName::from_static(IDEMPOTENCY_KEY);
        request.headers_mut().insert(header, key.header_value().clone());
        let mut schedule = Schedule::start(&self.policy);
        loop {
            // Kept for a retry before this attempt consumes the request; a streaming body
            // cannot be, and is sent once.
            let spare = request.try_clone();
            schedule.attempt();
            let answer = next.clone().run(request, extensions).await;
            let (after, reached) = match &answer {
                Ok(response) => (attempt::of_response(response.status(), response.headers()), true),
                Err(reqwest_middleware::Error::Reqwest(e)) => attempt::of_error(e),
                // An inner middleware's own failure: nothing says it was not sent.
                Err(reqwest_middleware::Error::Middleware(_)) => (After::Final, true),
            };
            let wait = schedule.retry(after, reached, spare.is_some());
            let (Some(wait), Some(spare)) = (wait, spare) else {
                return answer.map_err(|e| {
                    reqwest_middleware::Error::middleware(CallFailed {
                        attempts: schedule.attempts,
                        sent: schedule.sent,
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
    fn the_middleware_keeps_its_policy() {
        let policy = RetryPolicy::default().with_attempts(2).unwrap();
        assert_eq!(IdempotentRetry::new(policy.clone()).policy(), &policy);
    }
}
