//! The layer's own answers (RFC 9457 `application/problem+json`), one per refusal.
//!
//! Invariant: every answer the layer makes instead of running the handler says why in a
//! machine-readable `code` and a human `detail`, and carries the headers that tell a
//! client what to do next (`Retry-After` on 409 in progress and 503).

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};

use super::body::LayerBody;

/// Why the layer answered instead of the handler (the `code` member of its problem body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    MissingKey,
    InvalidKey,
    ScopeTooLong,
    NoTenant,
    BodyTooLarge,
    BodyUnreadable,
    InProgress,
    OutcomeUnknown,
    Mismatch,
    ResponseNotKept,
    CacheFull,
    StoreUnavailable,
    RecordCorrupt,
    Internal,
}

/// A refusal's parts, carried in the extensions of the layer's answer: a layer speaking
/// gRPC answers it as a gRPC status instead (`grpc::refusal`).
#[derive(Debug, Clone)]
pub(crate) struct Refused {
    pub(crate) refusal: Refusal,
    pub(crate) detail: Box<str>,
    pub(crate) retry_after: Option<Duration>,
}

impl Refusal {
    /// Its machine-readable code (the problem body's `code` member).
    pub(crate) fn code(self) -> &'static str {
        self.status_and_code().1
    }

    fn status_and_code(self) -> (StatusCode, &'static str) {
        match self {
            Refusal::MissingKey => (StatusCode::BAD_REQUEST, "missing_idempotency_key"),
            Refusal::InvalidKey => (StatusCode::BAD_REQUEST, "invalid_idempotency_key"),
            Refusal::ScopeTooLong => (StatusCode::URI_TOO_LONG, "request_scope_too_long"),
            Refusal::NoTenant => (StatusCode::UNAUTHORIZED, "unauthenticated"),
            Refusal::BodyTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "request_body_too_large"),
            Refusal::BodyUnreadable => (StatusCode::BAD_REQUEST, "request_body_unreadable"),
            Refusal::InProgress => (StatusCode::CONFLICT, "request_in_progress"),
            Refusal::OutcomeUnknown => (StatusCode::CONFLICT, "outcome_unknown"),
            Refusal::Mismatch => (StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused"),
            Refusal::ResponseNotKept => (StatusCode::CONFLICT, "response_not_kept"),
            Refusal::CacheFull => (StatusCode::SERVICE_UNAVAILABLE, "idempotency_cache_full"),
            Refusal::StoreUnavailable => {
                (StatusCode::SERVICE_UNAVAILABLE, "idempotency_store_unavailable")
            }
            Refusal::RecordCorrupt => {
                (StatusCode::INTERNAL_SERVER_ERROR, "idempotency_record_corrupt")
            }
            Refusal::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
        }
    }

    /// The answer, with `Retry-After` (whole seconds, at least 1) if given.
    pub(crate) fn answer(self, detail: &str, retry_after: Option<Duration>) -> Response<Bytes> {
        let (status, code) = self.status_and_code();
        let title = status.canonical_reason().unwrap_or("Error");
        let body = format!(
            "{{\"type\":\"about:blank\",\"title\":{},\"status\":{},\"code\":{},\"detail\":{}}}",
            json_string(title),
            status.as_u16(),
            json_string(code),
            json_string(detail),
        );
        let mut response = Response::new(Bytes::from(body));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if let Some(after) = retry_after {
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            headers.insert(RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        response
    }
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The layer's own answer.
pub(crate) fn refuse<ResB, E>(
    refusal: Refusal,
    detail: &str,
    retry_after: Option<std::time::Duration>,
) -> Result<Response<LayerBody<ResB>>, E> {
    let mut answer = refusal.answer(detail, retry_after);
    // For a layer speaking gRPC, which answers it as a gRPC status instead (`call`).
    answer.extensions_mut().insert(Refused { refusal, detail: detail.into(), retry_after });
    Ok(answer.map(|body| LayerBody::buffered(body, None)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_body_is_json_with_code_and_escaped_detail() {
        let r = Refusal::InvalidKey.answer("bad \"key\"\n", None);
        assert_eq!(r.status(), 400);
        assert_eq!(r.headers()[CONTENT_TYPE], "application/problem+json");
        assert_eq!(
            r.body(),
            r#"{"type":"about:blank","title":"Bad Request","status":400,"code":"invalid_idempotency_key","detail":"bad \"key\"\u000a"}"#
        );
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        let r = Refusal::InProgress.answer("", Some(Duration::from_millis(1500)));
        assert_eq!(r.headers()[RETRY_AFTER], "2");
        let r = Refusal::CacheFull.answer("", Some(Duration::ZERO));
        assert_eq!(r.headers()[RETRY_AFTER], "1");
    }
}
