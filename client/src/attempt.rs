//! What one attempt's answer means for the call: final, or worth another attempt with
//! the same key (and how long the server asked to wait first); and, for a failure,
//! whether any of the request may have reached the server.
//!
//! Invariant: only what cannot have changed anything, or what the server's key makes
//! safe to repeat, is retried: a connection never made, a timeout or a broken
//! connection (the key turns a repeat into the first one's answer), a 5xx, a 429, and
//! the in-progress answer (409 with `Retry-After`). A reused key's 422, and every other
//! 4xx, is final. A gRPC answer (HTTP 200 whatever happened) is read by its
//! `grpc-status` instead ([`of_grpc`]), by the same rule: `UNAVAILABLE`, the in-progress
//! `ABORTED`, and the server failures a key makes safe to repeat are retried;
//! `FAILED_PRECONDITION` (a reused key, an unknown outcome) and every status that says
//! something about the request are final. The HTTP middleware and the tower service
//! both decide here, and both count attempts and waits with one [`Schedule`].

// Each client form (the `reqwest`, `tower` and `tonic` features) reads part of this.
#![cfg_attr(not(all(feature = "reqwest", feature = "tonic")), allow(dead_code))]

use std::time::Duration;

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName, StatusCode};
use idemcache::layer::GrpcCode;

use crate::RetryPolicy;

/// What the call does after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// The attempt's answer is the call's.
    Final,
    /// Another attempt, with the same key, after at least `after` if the server said.
    Retry {
        /// The server's `Retry-After`, if it sent one.
        after: Option<Duration>,
    },
}

/// What an answer of `status` with `headers` means.
pub(crate) fn of_response(status: StatusCode, headers: &HeaderMap) -> Next {
    let after = retry_after(headers);
    match status {
        // The key's first execution is still running: its answer comes later.
        StatusCode::CONFLICT if after.is_some() => Next::Retry { after },
        StatusCode::TOO_MANY_REQUESTS => Next::Retry { after },
        s if s.is_server_error() => Next::Retry { after },
        _ => Next::Final,
    }
}

/// A gRPC answer's status, in the headers of a trailers-only answer or in the trailers.
pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// How long a gRPC server asks the client to wait before it retries, in milliseconds.
pub(crate) const GRPC_PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
/// The metadata naming the idempotency layer's refusal (its HTTP problem's `code`).
pub(crate) const IDEMPOTENCY_REFUSAL: &str = "idempotency-refusal";
/// The refusals that say the key's execution may have run: the outcome is unknown.
const MAY_HAVE_RUN: [&str; 2] = ["outcome_unknown", "response_not_kept"];

/// What a gRPC answer means: with HTTP status `status` and `headers`, and the trailers
/// once its body is read (`None` for a trailers-only answer, whose status is in its
/// headers). An HTTP status other than 200 is read as an HTTP answer (a proxy's 503).
///
/// | status | |
/// |---|---|
/// | `UNAVAILABLE`, `INTERNAL`, `UNKNOWN`, `DEADLINE_EXCEEDED` | retried (the key turns a repeat into the first one's answer, or the server released it) |
/// | `ABORTED` (the key's first execution still running) | retried, after at least `grpc-retry-pushback-ms` |
/// | `RESOURCE_EXHAUSTED` | retried only with a pushback (a quota that refills); a message too large stays too large |
/// | every other status, none at all, a pushback that is not a number (the server says: do not retry) | final |
pub(crate) fn of_grpc(
    status: StatusCode,
    headers: &HeaderMap,
    trailers: Option<&HeaderMap>,
) -> Next {
    if status != StatusCode::OK {
        return of_response(status, headers);
    }
    let fields = trailers.filter(|t| t.contains_key(GRPC_STATUS)).unwrap_or(headers);
    let Some(code) = grpc_code(fields) else { return Next::Final };
    of_grpc_code(code, fields)
}

/// What an answer of gRPC status `code`, with `fields` (its trailers or its metadata),
/// means: [`of_grpc`]'s table.
pub(crate) fn of_grpc_code(code: GrpcCode, fields: &HeaderMap) -> Next {
    let after = match fields.get(GRPC_PUSHBACK) {
        None => None,
        Some(value) => match value.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()) {
            Some(ms) => Some(Duration::from_millis(ms)),
            // The specification: a negative or unreadable pushback means "do not retry".
            None => return Next::Final,
        },
    };
    match code {
        GrpcCode::Unavailable
        | GrpcCode::Internal
        | GrpcCode::Unknown
        | GrpcCode::DeadlineExceeded
        | GrpcCode::Aborted => Next::Retry { after },
        GrpcCode::ResourceExhausted if after.is_some() => Next::Retry { after },
        _ => Next::Final,
    }
}

/// The `grpc-status` in `fields`: digits only, one the specification defines.
pub(crate) fn grpc_code(fields: &HeaderMap) -> Option<GrpcCode> {
    let text = fields.get(GRPC_STATUS)?.to_str().ok()?;
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    GrpcCode::from_u32(text.parse().ok()?)
}

/// Whether a final gRPC failure of `code`, with the `idempotency-refusal` metadata
/// `refusal` if it had one, says nothing ran (a refusal):
/// the deterministic statuses (the server keeps and replays them: the request is wrong
/// whatever the state), except the idempotency layer's `FAILED_PRECONDITION` for a key
/// whose execution may have run (`outcome_unknown`, `response_not_kept`). The key
/// reused with another request (`idempotency_key_reused`) is a refusal.
pub(crate) fn grpc_refused(code: GrpcCode, refusal: Option<&str>) -> bool {
    code != GrpcCode::Ok
        && code.is_deterministic()
        && !refusal.is_some_and(|r| MAY_HAVE_RUN.contains(&r))
}

/// Whether the failure `error` (or one it was caused by) shows that no connection was
/// made, so nothing was sent: a connection refused, or a connector's failure
/// (`tonic::ConnectError`, with the `tonic` feature). Anything else may have reached
/// the server.
pub(crate) fn never_connected(error: &(dyn std::error::Error + 'static)) -> bool {
    causes(error).any(|e| {
        #[cfg(feature = "tonic")]
        if e.is::<tonic::ConnectError>() {
            return true;
        }
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
    })
}

/// `error` and every error it was caused by, in order: its `source` chain, through the
/// error an `io::Error` wraps (whose own `source` skips it).
pub(crate) fn causes<'e>(
    error: &'e (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'e (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(error), |e| match e.downcast_ref::<std::io::Error>() {
        Some(io) => io.get_ref().map(|inner| inner as &(dyn std::error::Error + 'static)),
        None => e.source(),
    })
}

/// One call's attempts under a policy: how many were made, whether any may have reached
/// the server, and whether (and after how long) the next may start.
#[derive(Debug)]
pub(crate) struct Schedule<'p> {
    policy: &'p RetryPolicy,
    started: tokio::time::Instant,
    /// The attempts made so far.
    pub(crate) attempts: u32,
    /// Whether any of them may have reached the server.
    pub(crate) sent: bool,
}

impl<'p> Schedule<'p> {
    /// A call starting now.
    pub(crate) fn start(policy: &'p RetryPolicy) -> Schedule<'p> {
        Schedule { policy, started: tokio::time::Instant::now(), attempts: 0, sent: false }
    }

    /// Counts an attempt about to be made.
    pub(crate) fn attempt(&mut self) {
        self.attempts += 1;
    }

    /// After an attempt whose answer means `next` and which may have reached the server
    /// (`reached`): the wait before the next attempt, or `None` when this one's answer is
    /// the call's (final, the request cannot be sent again, the attempts are spent, or
    /// the retry would start past the deadline).
    pub(crate) fn retry(
        &mut self,
        next: Next,
        reached: bool,
        can_repeat: bool,
    ) -> Option<Duration> {
        self.sent |= reached;
        let Next::Retry { after } = next else { return None };
        if !can_repeat || self.attempts >= self.policy.attempts() {
            return None;
        }
        let wait = self.policy.delay(self.attempts, after, jitter());
        let within = self.started.elapsed().saturating_add(wait) <= self.policy.deadline();
        within.then_some(wait)
    }
}

/// A jitter unit in `[0, 1)`, from the system's randomness.
pub(crate) fn jitter() -> f64 {
    unit(uuid::Uuid::new_v4().as_u64_pair().0)
}

/// `bits` as a number in `[0, 1)`: its top 53 bits over 2^53 (every value exact in an
/// `f64`).
pub(crate) fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// What a failure of the attempt means, and whether the request may have reached the
/// server (`false` only when no connection was made).
#[cfg(feature = "reqwest")]
pub(crate) fn of_error(error: &reqwest::Error) -> (Next, bool) {
    if error.is_builder() {
        // The request could not be built: nothing was sent, and no repeat will do.
        return (Next::Final, false);
    }
    if error.is_connect() {
        return (Next::Retry { after: None }, false);
    }
    // A timeout, a connection broken while sending or reading, a body that failed:
    // the server may have the request.
    (Next::Retry { after: None }, true)
}

/// The server's `Retry-After` in whole seconds, if it sent one in that form (an
/// HTTP date is left to the backoff).
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(retry_after: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(v) = retry_after {
            h.insert(RETRY_AFTER, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn in_progress_throttled_and_server_errors_are_retried_with_the_servers_wait() {
        let two = Some(Duration::from_secs(2));
        assert_eq!(
            of_response(StatusCode::CONFLICT, &headers(Some("2"))),
            Next::Retry { after: two }
        );
        assert_eq!(
            of_response(StatusCode::TOO_MANY_REQUESTS, &headers(None)),
            Next::Retry { after: None }
        );
        for s in [500, 502, 503, 504] {
            let s = StatusCode::from_u16(s).unwrap();
            assert_eq!(of_response(s, &headers(Some("2"))), Next::Retry { after: two }, "{s}");
        }
    }

    #[test]
    fn a_reused_key_a_plain_conflict_and_other_answers_are_final() {
        for s in [200, 201, 204, 301, 400, 401, 404, 409, 422] {
            let s = StatusCode::from_u16(s).unwrap();
            assert_eq!(of_response(s, &headers(None)), Next::Final, "{s}");
        }
        assert_eq!(of_response(StatusCode::UNPROCESSABLE_ENTITY, &headers(Some("1"))), Next::Final);
    }

    fn grpc(code: &'static str, more: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(GRPC_STATUS, code.parse().unwrap());
        for (name, value) in more {
            h.insert(*name, value.parse().unwrap());
        }
        h
    }

    #[test]
    fn grpc_unavailable_aborted_and_server_failures_are_retried_after_the_pushback() {
        let ok = StatusCode::OK;
        let half = Some(Duration::from_millis(500));
        let pushback = [("grpc-retry-pushback-ms", "500")];
        for code in ["14", "13", "2", "4", "10"] {
            assert_eq!(of_grpc(ok, &grpc(code, &[]), None), Next::Retry { after: None }, "{code}");
            let trailers = grpc(code, &pushback);
            let retried = of_grpc(ok, &HeaderMap::new(), Some(&trailers));
            assert_eq!(retried, Next::Retry { after: half }, "{code} in the trailers");
        }
        assert_eq!(of_grpc(ok, &grpc("8", &[]), None), Next::Final, "too large stays so");
        assert_eq!(of_grpc(ok, &grpc("8", &pushback), None), Next::Retry { after: half });
        let refused = grpc("14", &[("grpc-retry-pushback-ms", "-1")]);
        assert_eq!(of_grpc(ok, &refused, None), Next::Final, "a negative pushback: never");
        // Not gRPC's 200: read as HTTP (a proxy's 503).
        assert_eq!(
            of_grpc(StatusCode::SERVICE_UNAVAILABLE, &HeaderMap::new(), None),
            Next::Retry { after: None }
        );
    }

    #[test]
    fn grpc_success_a_reused_key_and_request_errors_are_final() {
        let ok = StatusCode::OK;
        for code in ["0", "1", "3", "5", "6", "7", "9", "11", "12", "15", "16"] {
            assert_eq!(of_grpc(ok, &grpc(code, &[]), None), Next::Final, "{code}");
        }
        assert_eq!(of_grpc(ok, &HeaderMap::new(), None), Next::Final, "no status at all");
        assert_eq!(of_grpc(ok, &grpc("+14", &[]), None), Next::Final, "not a status");
        let failed = GrpcCode::FailedPrecondition;
        assert!(grpc_refused(failed, Some("idempotency_key_reused")));
        assert!(grpc_refused(failed, None), "the handler's own: kept and replayed");
        for may_have_run in ["outcome_unknown", "response_not_kept"] {
            assert!(!grpc_refused(failed, Some(may_have_run)), "{may_have_run}");
        }
        assert!(grpc_refused(GrpcCode::InvalidArgument, None));
        assert!(!grpc_refused(GrpcCode::Unavailable, None));
        assert!(!grpc_refused(GrpcCode::Ok, None));
    }

    #[test]
    fn only_a_refused_connection_is_never_sent() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(never_connected(&refused));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(!never_connected(&reset));
        let wrapped = std::io::Error::other(refused);
        assert!(never_connected(&wrapped), "found in the chain");
    }

    #[test]
    fn a_schedule_stops_at_its_attempts_and_at_a_final_answer() {
        let policy = RetryPolicy::default().with_attempts(2).unwrap();
        let mut s = Schedule::start(&policy);
        s.attempt();
        assert_eq!(s.retry(Next::Final, true, true), None);
        assert!(s.sent);
        let mut s = Schedule::start(&policy);
        s.attempt();
        assert!(s.retry(Next::Retry { after: None }, false, false).is_none(), "cannot repeat");
        let wait = s.retry(Next::Retry { after: Some(Duration::from_secs(1)) }, false, true);
        assert_eq!(wait, Some(Duration::from_secs(1)));
        assert!(!s.sent);
        s.attempt();
        assert_eq!(s.retry(Next::Retry { after: None }, false, true), None, "spent");
    }

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
    fn retry_after_is_read_in_seconds_and_anything_else_is_none() {
        assert_eq!(retry_after(&headers(Some(" 3 "))), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(&headers(Some("Wed, 21 Oct 2015 07:28:00 GMT"))), None);
        assert_eq!(retry_after(&headers(Some("-1"))), None);
        assert_eq!(retry_after(&headers(None)), None);
    }
}
