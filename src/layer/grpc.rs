//! gRPC over the layer ([`IdempotencyLayer::grpc`](super::IdempotencyLayer::grpc)): which
//! answers are kept, by their gRPC status, and the layer's refusals as gRPC statuses.
//!
//! A gRPC answer travels as HTTP 200 whatever its outcome: the outcome is the
//! `grpc-status` trailer (or header, in a trailers-only answer). So a layer that keeps
//! answers by HTTP status would keep `UNAVAILABLE`, a failure the client should retry,
//! and replay it to every retry. Invariant: with [`Grpc`] set, an HTTP 200 answer is
//! kept only when its `grpc-status` is one [`Grpc::store_when`] keeps (by default the
//! deterministic ones: retrying the same request would give the same answer), and every
//! other 200 answer (a transient status, or none at all) releases its key; and every
//! refusal is a trailers-only gRPC answer whose status says what the client should do.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};

use super::body::LayerBody;
use super::problem::{Refusal, Refused};

/// A gRPC status code (the `grpc-status` value), as the gRPC specification numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GrpcCode {
    /// 0: success.
    Ok,
    /// 1: the caller cancelled the call.
    Cancelled,
    /// 2: an error with no better code (a handler's unmapped error).
    Unknown,
    /// 3: the request is malformed, whatever the server's state.
    InvalidArgument,
    /// 4: the deadline passed before the call finished; it may still have had effects.
    DeadlineExceeded,
    /// 5: something the request names does not exist.
    NotFound,
    /// 6: what the request would create exists already.
    AlreadyExists,
    /// 7: the caller may not do this.
    PermissionDenied,
    /// 8: a quota or a resource ran out (a message too large).
    ResourceExhausted,
    /// 9: the system is not in a state for this request.
    FailedPrecondition,
    /// 10: the call was aborted (a concurrency conflict); retry it.
    Aborted,
    /// 11: a value past its valid range.
    OutOfRange,
    /// 12: not implemented.
    Unimplemented,
    /// 13: an internal invariant broke.
    Internal,
    /// 14: the service is unavailable for now; retry it.
    Unavailable,
    /// 15: unrecoverable data loss or corruption.
    DataLoss,
    /// 16: no valid credentials.
    Unauthenticated,
}

impl GrpcCode {
    /// The code numbered `code`, or `None` for a number the specification does not define.
    pub fn from_u32(code: u32) -> Option<GrpcCode> {
        use GrpcCode::*;
        Some(match code {
            0 => Ok,
            1 => Cancelled,
            2 => Unknown,
            3 => InvalidArgument,
            4 => DeadlineExceeded,
            5 => NotFound,
            6 => AlreadyExists,
            7 => PermissionDenied,
            8 => ResourceExhausted,
            9 => FailedPrecondition,
            10 => Aborted,
            11 => OutOfRange,
            12 => Unimplemented,
            13 => Internal,
            14 => Unavailable,
            15 => DataLoss,
            16 => Unauthenticated,
            _ => return None,
        })
    }

    /// Its number, as `grpc-status` carries it.
    pub fn as_u32(self) -> u32 {
        self as u32
    }

    /// Whether the same request sent again would get the same answer: `OK` and the
    /// failures that say something about the request or the caller (`INVALID_ARGUMENT`,
    /// `NOT_FOUND`, `ALREADY_EXISTS`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`,
    /// `PERMISSION_DENIED`, `UNAUTHENTICATED`, `UNIMPLEMENTED`). The rest are transient
    /// (`UNAVAILABLE`, `ABORTED`, `RESOURCE_EXHAUSTED`, `DEADLINE_EXCEEDED`, `CANCELLED`)
    /// or say the server failed (`UNKNOWN`, `INTERNAL`, `DATA_LOSS`), as a 5xx does: a
    /// retry should run the request again. [`Grpc`]'s default keeps exactly these.
    pub fn is_deterministic(self) -> bool {
        use GrpcCode::*;
        matches!(
            self,
            Ok | InvalidArgument
                | NotFound
                | AlreadyExists
                | FailedPrecondition
                | OutOfRange
                | PermissionDenied
                | Unauthenticated
                | Unimplemented
        )
    }
}

type GrpcStoreFn = dyn Fn(GrpcCode) -> bool + Send + Sync;

/// How the layer speaks gRPC ([`IdempotencyLayer::grpc`](super::IdempotencyLayer::grpc)):
/// which statuses are kept, and which methods pass through unguarded (streaming ones, and
/// unary ones that change nothing).
///
/// The key is the `idempotency-key` metadata (the `Idempotency-Key` header: HTTP/2
/// header names are lowercase); a replay carries the `idempotent-replayed: true`
/// metadata. A refusal is a trailers-only answer: a status, the `idempotency-refusal`
/// metadata naming the refusal by the HTTP answers' `code`, and `grpc-message` its
/// detail. Which status answers which refusal, and why, is tabled once, in the guide
/// `docs/grpc.md` ("The refusals").
///
/// A handler that writes the record in its own transaction
/// (`layer::InTransaction`, feature `store`) decides what to keep by HTTP
/// status, which gRPC does not set: record only answers whose gRPC status you keep.
#[derive(Clone)]
pub struct Grpc {
    store: Arc<GrpcStoreFn>,
    unguarded: Vec<String>,
}

impl Default for Grpc {
    fn default() -> Self {
        Grpc::new()
    }
}

impl fmt::Debug for Grpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grpc").field("unguarded", &self.unguarded).finish_non_exhaustive()
    }
}

impl Grpc {
    /// The defaults: the deterministic statuses kept ([`GrpcCode::is_deterministic`]),
    /// every method guarded.
    pub fn new() -> Grpc {
        Grpc { store: Arc::new(GrpcCode::is_deterministic), unguarded: Vec::new() }
    }

    /// Which gRPC statuses are kept for replay; the rest release the key, so a retry runs
    /// again. An answer with no `grpc-status` (whatever its HTTP status: a proxy's 429 or
    /// 503, which a client reads as `UNAVAILABLE`), one past the specification's codes,
    /// or one whose headers and trailers name different statuses, is never kept.
    pub fn store_when(mut self, store: impl Fn(GrpcCode) -> bool + Send + Sync + 'static) -> Self {
        self.store = Arc::new(store);
        self
    }

    /// Methods passed through unguarded, by exact path (`/orders.v1.Orders/Watch`; not a
    /// prefix), with no key nor tenant asked and nothing buffered: every streaming
    /// method (the layer guards a call by buffering its request and its answer whole,
    /// which a stream's are not meant to be, and replaying one answer, where a stream
    /// has many), and the unary ones that change nothing and are called without a key
    /// (`/grpc.health.v1.Health/Check`). Every method not listed is guarded as a unary
    /// one.
    pub fn unguarded(mut self, paths: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.unguarded.extend(paths.into_iter().map(Into::into));
        self
    }

    /// Whether the method at `path` is passed through unguarded.
    pub(crate) fn passes(&self, path: &str) -> bool {
        self.unguarded.iter().any(|p| p == path)
    }

    /// Whether an HTTP 200 answer with these headers and trailers is kept.
    pub(crate) fn keeps(&self, headers: &HeaderMap, trailers: Option<&HeaderMap>) -> bool {
        status_of(headers, trailers).is_some_and(|code| (self.store)(code))
    }
}

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
const IDEMPOTENCY_REFUSAL: HeaderName = HeaderName::from_static("idempotency-refusal");

/// The answer's gRPC status: its trailers', or its headers' in a trailers-only answer.
/// None when neither holds a status, or when both do and disagree: clients differ on
/// which one they believe (tonic takes the headers' as final), so no one status says
/// what the client saw.
pub(crate) fn status_of(headers: &HeaderMap, trailers: Option<&HeaderMap>) -> Option<GrpcCode> {
    let in_headers = headers.get(&GRPC_STATUS);
    let in_trailers = trailers.and_then(|t| t.get(&GRPC_STATUS));
    let value = match (in_headers, in_trailers) {
        (Some(h), Some(t)) if code(h)? != code(t)? => return None,
        (_, Some(value)) | (Some(value), None) => value,
        (None, None) => return None,
    };
    code(value)
}

/// One `grpc-status` value's code: digits only (`u32::from_str` would also take a
/// leading `+`), and one the specification defines.
fn code(value: &HeaderValue) -> Option<GrpcCode> {
    let text = value.to_str().ok()?;
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    GrpcCode::from_u32(text.parse().ok()?)
}

/// The gRPC status a refusal is answered with (see [`Grpc`]'s table).
fn code_of(refusal: Refusal) -> GrpcCode {
    match refusal {
        Refusal::MissingKey
        | Refusal::InvalidKey
        | Refusal::ScopeTooLong
        | Refusal::BodyUnreadable => GrpcCode::InvalidArgument,
        Refusal::NoTenant => GrpcCode::Unauthenticated,
        Refusal::BodyTooLarge => GrpcCode::ResourceExhausted,
        Refusal::InProgress => GrpcCode::Aborted,
        Refusal::Mismatch | Refusal::OutcomeUnknown | Refusal::ResponseNotKept => {
            GrpcCode::FailedPrecondition
        }
        Refusal::CacheFull | Refusal::StoreUnavailable => GrpcCode::Unavailable,
        Refusal::RecordCorrupt => GrpcCode::DataLoss,
        Refusal::Internal => GrpcCode::Internal,
    }
}

/// A refusal as a trailers-only gRPC answer: HTTP 200, `content-type: application/grpc`,
/// the status, the detail as `grpc-message`, the refusal's code as
/// `idempotency-refusal`, and `grpc-retry-pushback-ms` when the client should wait.
pub(crate) fn refusal(
    refusal: Refusal,
    detail: &str,
    retry_after: Option<Duration>,
) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(GRPC_STATUS, HeaderValue::from(code_of(refusal).as_u32()));
    if let Ok(message) = HeaderValue::from_str(&percent_encoded(detail)) {
        headers.insert(GRPC_MESSAGE, message);
    }
    headers.insert(IDEMPOTENCY_REFUSAL, HeaderValue::from_static(refusal.code()));
    if let Some(after) = retry_after {
        let millis = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        headers.insert(GRPC_PUSHBACK, HeaderValue::from(millis));
    }
    response
}

/// `text` as `grpc-message` carries it: each byte outside printable ASCII, and `%`,
/// percent-encoded (the gRPC specification's rule).
fn percent_encoded(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for &b in text.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A refusal answered as a gRPC status (the layer speaks gRPC); any other answer as it is.
pub(crate) fn as_grpc<ResB>(mut response: Response<LayerBody<ResB>>) -> Response<LayerBody<ResB>> {
    match response.extensions_mut().remove::<Refused>() {
        Some(Refused { refusal, detail, retry_after }) => {
            self::refusal(refusal, &detail, retry_after).map(|body| LayerBody::buffered(body, None))
        }
        None => response,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(n, v)| (HeaderName::from_static(n), HeaderValue::from_static(v)))
            .collect()
    }

    #[test]
    fn codes_round_trip_and_stop_at_sixteen() {
        for n in 0..=16 {
            assert_eq!(GrpcCode::from_u32(n).map(GrpcCode::as_u32), Some(n));
        }
        assert_eq!(GrpcCode::from_u32(17), None);
        let kept: Vec<u32> =
            (0..=16).filter(|&n| GrpcCode::from_u32(n).unwrap().is_deterministic()).collect();
        assert_eq!(kept, [0, 3, 5, 6, 7, 9, 11, 12, 16]);
    }

    #[test]
    fn the_status_is_the_trailers_or_the_headers_and_only_digits() {
        let ok = headers(&[("grpc-status", "0")]);
        let unavailable = headers(&[("grpc-status", "14")]);
        assert_eq!(status_of(&HeaderMap::new(), Some(&unavailable)), Some(GrpcCode::Unavailable));
        assert_eq!(status_of(&ok, None), Some(GrpcCode::Ok));
        assert_eq!(status_of(&ok, Some(&ok)), Some(GrpcCode::Ok), "both, agreeing");
        assert_eq!(status_of(&ok, Some(&unavailable)), None, "both, disagreeing: no status");
        assert_eq!(status_of(&unavailable, Some(&ok)), None, "either way round");
        let bad = headers(&[("grpc-status", "x")]);
        assert_eq!(status_of(&bad, Some(&ok)), None, "one unreadable: no status");
        assert_eq!(status_of(&HeaderMap::new(), Some(&HeaderMap::new())), None);
        for bad in ["", "+0", "0x0", " 0", "17", "99999999999"] {
            let h: HeaderMap =
                [(GRPC_STATUS, HeaderValue::from_str(bad).unwrap())].into_iter().collect();
            assert_eq!(status_of(&h, None), None, "{bad:?}");
        }
    }

    #[test]
    fn keeps_what_store_when_says_and_never_a_missing_status() {
        let grpc = Grpc::new();
        assert!(grpc.keeps(&HeaderMap::new(), Some(&headers(&[("grpc-status", "3")]))));
        assert!(!grpc.keeps(&HeaderMap::new(), Some(&headers(&[("grpc-status", "14")]))));
        assert!(!grpc.keeps(&HeaderMap::new(), None));
        let only_ok = Grpc::new().store_when(|code| code == GrpcCode::Ok);
        assert!(!only_ok.keeps(&headers(&[("grpc-status", "3")]), None));
    }

    #[test]
    fn a_refusal_is_trailers_only_with_its_code_and_pushback() {
        let r =
            refusal(Refusal::InProgress, "running: 100% \u{e9}", Some(Duration::from_millis(1500)));
        assert_eq!(r.status(), StatusCode::OK);
        assert!(r.body().is_empty());
        let h = r.headers();
        assert_eq!(h[CONTENT_TYPE], "application/grpc");
        assert_eq!(h[&GRPC_STATUS], "10");
        assert_eq!(h[&GRPC_MESSAGE], "running: 100%25 %C3%A9");
        assert_eq!(h[&GRPC_PUSHBACK], "1500");
        assert_eq!(h[&IDEMPOTENCY_REFUSAL], "request_in_progress");
        let reused = refusal(Refusal::Mismatch, "", None);
        assert_eq!(reused.headers()[&GRPC_STATUS], "9");
        assert!(reused.headers().get(&GRPC_PUSHBACK).is_none());
    }
}
