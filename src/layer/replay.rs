//! A stored response answered as a replay: as it was first sent, marked
//! `Idempotent-Replayed: true`, with `Idempotency-Expires` (an HTTP date) saying until
//! when the record is kept.
//!
//! Invariant: a replay is built from a decoded stored response only; a record too large
//! to have been kept, or one that is not a stored response, is refused with a problem
//! answer saying which, never replayed as something else.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::Response;

use super::body::LayerBody;
use super::header::{IDEMPOTENCY_EXPIRES, IDEMPOTENT_REPLAYED};
use super::problem::{refuse, Refusal};
use super::stored_response;

/// A stored response as it was first sent, marked as a replay.
pub(crate) fn replayed<ResB, E>(
    body: Option<Bytes>,
    expires_at: std::time::SystemTime,
) -> Result<Response<LayerBody<ResB>>, E> {
    let Some(body) = &body else {
        let detail = "a request with this key completed, but its response was too large to \
                      keep; it was not executed again";
        return refuse(Refusal::ResponseNotKept, detail, None);
    };
    let Some(stored) = stored_response::decode(body) else {
        let detail = "the result stored under this key is not a stored HTTP response";
        return refuse(Refusal::RecordCorrupt, detail, None);
    };
    // An HTTP/1.1 server sends only the trailers a `Trailer` field announces; it is not
    // stored (it describes this message's framing), so it is announced afresh.
    let announced = stored.trailers.as_ref().and_then(|trailers| {
        let mut names = trailers.keys().map(|name| name.as_str()).collect::<Vec<_>>();
        names.dedup();
        HeaderValue::from_str(&names.join(", ")).ok()
    });
    let mut response = Response::new(LayerBody::buffered(stored.body, stored.trailers));
    *response.status_mut() = stored.status;
    *response.headers_mut() = stored.headers;
    let headers = response.headers_mut();
    if let Some(announced) = announced {
        headers.insert(http::header::TRAILER, announced);
    }
    headers.insert(REPLAYED_NAME, HeaderValue::from_static("true"));
    if let Some(expires) = expires_value(expires_at) {
        headers.insert(EXPIRES_NAME, expires);
    }
    Ok(response)
}

/// The replay headers' names, parsed once (a `&str` name is parsed at every insert).
const REPLAYED_NAME: HeaderName = HeaderName::from_static(IDEMPOTENT_REPLAYED);
const EXPIRES_NAME: HeaderName = HeaderName::from_static(IDEMPOTENCY_EXPIRES);

thread_local! {
    /// The last `Idempotency-Expires` value this thread formatted, by its second: replays
    /// of records completed in the same second (a burst of retries; a popular key) share
    /// one formatting and one buffer.
    static LAST_EXPIRES: std::cell::RefCell<Option<(std::time::SystemTime, HeaderValue)>> =
        const { std::cell::RefCell::new(None) };
}

/// `expires_at` as an `Idempotency-Expires` value (an HTTP date, to the second).
fn expires_value(expires_at: std::time::SystemTime) -> Option<HeaderValue> {
    let second = truncated(expires_at);
    let cached = LAST_EXPIRES
        .try_with(|last| match &*last.borrow() {
            Some((at, value)) if *at == second => Some(value.clone()),
            _ => None,
        })
        .ok()
        .flatten();
    if cached.is_some() {
        return cached;
    }
    let value = HeaderValue::from_str(&http_date(expires_at)).ok()?;
    // A thread being torn down keeps no cache: nothing lost but the reuse.
    let _ = LAST_EXPIRES.try_with(|last| *last.borrow_mut() = Some((second, value.clone())));
    Some(value)
}

/// `at` to the whole second before it (HTTP dates name seconds); before the epoch, as is.
fn truncated(at: std::time::SystemTime) -> std::time::SystemTime {
    match at.duration_since(std::time::UNIX_EPOCH) {
        Ok(since) => std::time::UNIX_EPOCH + std::time::Duration::from_secs(since.as_secs()),
        Err(_) => at,
    }
}

/// The last instant an HTTP date can name: 9999-12-31 23:59:59 UTC.
const LAST_HTTP_DATE: std::time::Duration = std::time::Duration::from_secs(253_402_300_799);

/// `at` as an HTTP date, held within what one can name (the epoch to the end of year
/// 9999): a record an operator pinned "for ever" still replays, as expiring at the last
/// date there is.
fn http_date(at: std::time::SystemTime) -> String {
    let epoch = std::time::SystemTime::UNIX_EPOCH;
    httpdate::fmt_http_date(at.clamp(epoch, epoch + LAST_HTTP_DATE))
}
