//! What one attempt's answer means for the call: final, or worth another attempt with
//! the same key (and how long the server asked to wait first); and, for a failure,
//! whether any of the request may have reached the server.
//!
//! Invariant: only what cannot have changed anything, or what the server's key makes
//! safe to repeat, is retried: a connection never made, a timeout or a broken
//! connection (the key turns a repeat into the first one's answer), a 5xx, a 429, and
//! the in-progress answer (409 with `Retry-After`). A reused key's 422, and every other
//! 4xx, is final.

use std::time::Duration;

use http::header::RETRY_AFTER;
use http::{HeaderMap, StatusCode};

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

/// What a failure of the attempt means, and whether the request may have reached the
/// server (`false` only when no connection was made).
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

    #[test]
    fn retry_after_is_read_in_seconds_and_anything_else_is_none() {
        assert_eq!(retry_after(&headers(Some(" 3 "))), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(&headers(Some("Wed, 21 Oct 2015 07:28:00 GMT"))), None);
        assert_eq!(retry_after(&headers(Some("-1"))), None);
        assert_eq!(retry_after(&headers(None)), None);
    }
}
