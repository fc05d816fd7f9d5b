//! [`InTransaction`]: the claim the layer hands a handler whose business tables live in
//! the store's database, so that the response is recorded in the handler's own
//! transaction and commits with the business change, or not at all.
//!
//! Invariant: the record the handler writes is exactly what the layer would have stored
//! for that response (the same encoding, the same fields left out), so a replay cannot
//! tell which of the two wrote it; [`InTransaction::record_response`] makes the record
//! and the response it hands back from the same bytes, so the first answer and its
//! replays cannot differ; and once the handler handed the claim over, the layer writes
//! no completion of its own (see [`OpenClaim`]).

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;

use super::body::LayerBody;
use super::stored_response;
use crate::store::OpenClaim;

/// A request extension the layer sets on every request it claimed over a durable store
/// ([`IdempotencyLayer::tiered`](super::IdempotencyLayer::tiered)): the claim, for a
/// handler that records its response inside its own transaction.
///
/// Without it, the layer records the response after the handler returned: a crash
/// between the handler's commit and that write leaves the record PROCESSING, and once
/// its lease lapses a retry runs the handler again (only a `UNIQUE` constraint of your
/// own stops a second order). With it, the order and its record commit together:
///
/// ```ignore
/// async fn create(held: Option<Extension<InTransaction>>, /* ... */) -> Response {
///     let tx = client.transaction().await?;
///     let id = insert_order(&tx, &order).await?;
///     let response = (StatusCode::CREATED, Json(Created { id })).into_response();
///     let response = match &held {
///         Some(Extension(held)) => {
///             let (record, response) = held.record_response(response).await?;
///             let record = record.ok_or("a 5xx: roll back")?;
///             idemcache_postgres::complete_in(&tx, held.claim(), Some(&record)).await?;
///             response.into_response() // what was recorded, byte for byte
///         }
///         None => response,
///     };
///     tx.commit().await?;
///     response
/// }
/// ```
///
/// After a crash at any instant, a retry either runs the handler (nothing committed) or
/// replays (the order and its record committed). A handler that does not use it behaves
/// as before. `complete_in` refuses a claim whose key was taken over (its lease lapsed
/// and another caller claimed it) with `StoreError::LeaseLost`: roll back then.
///
/// Return the response you recorded: repeats replay the record, not what the handler
/// returned. [`record_response`](Self::record_response) takes the response your handler
/// would return, as an `http::Response` (axum's `Json(..)` or a tuple after
/// `.into_response()`), and hands
/// it back with its record, made from the same bytes; [`record`](Self::record) takes the
/// parts, for a response you build yourself. Use it only over a SQL store whose database
/// holds your business tables (`SqliteStore`, `PostgresStore`): over Redis there is no
/// transaction to join, and a `complete_in` into your own database finds no record there
/// (`LeaseLost`). Over SQLite, the renewal needs the write lock your transaction holds:
/// keep the transaction itself shorter than the lease (open it when you start writing).
/// The layer renews the lease until the handler hands the claim over (the first thing
/// `complete_in` does) and not after: commit promptly.
#[derive(Clone)]
pub struct InTransaction {
    claim: OpenClaim,
    replay_set_cookie: bool,
    /// Which statuses the layer keeps ([`IdempotencyLayer::store_when`](super::IdempotencyLayer::store_when)).
    kept: Arc<dyn Fn(StatusCode) -> bool + Send + Sync>,
}

impl std::fmt::Debug for InTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InTransaction")
            .field("claim", &self.claim)
            .field("replay_set_cookie", &self.replay_set_cookie)
            .finish_non_exhaustive()
    }
}

impl InTransaction {
    pub(crate) fn new(
        claim: OpenClaim,
        replay_set_cookie: bool,
        kept: Arc<dyn Fn(StatusCode) -> bool + Send + Sync>,
    ) -> Self {
        InTransaction { claim, replay_set_cookie, kept }
    }

    /// The claim: pass it to the store crate's `complete_in`.
    pub fn claim(&self) -> &OpenClaim {
        &self.claim
    }

    /// The record of a response with `status`, `headers` and `body`, as the layer stores
    /// responses (the fields never replayed, such as `Set-Cookie` unless the layer was
    /// told otherwise, left out): the bytes to pass to `complete_in`. `None` for a
    /// status the layer does not keep (5xx by default,
    /// [`store_when`](super::IdempotencyLayer::store_when)): record nothing then, and
    /// roll back; the layer releases the key so a retry runs again.
    pub fn record(&self, status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Option<Bytes> {
        (self.kept)(status)
            .then(|| stored_response::encode(status, headers, self.replay_set_cookie, body, None))
    }

    /// The record of `response`, and `response` itself to return: its body is read whole
    /// (trailers included, as the layer reads every response), recorded, and handed back
    /// as the same bytes, so what the client gets first is what its retries replay. The
    /// record is as [`record`](Self::record)'s: `None` for a status the layer does not
    /// keep (record nothing then, and roll back; the response is still handed back).
    ///
    /// A body that fails while being read is its error: nothing was recorded; roll back
    /// and answer an error (a 5xx releases the key, so a retry runs again).
    pub async fn record_response<B>(
        &self,
        response: Response<B>,
    ) -> Result<(Option<Bytes>, Response<LayerBody<B>>), B::Error>
    where
        B: Body<Data = Bytes>,
    {
        let (parts, body) = response.into_parts();
        let collected = body.collect().await?;
        let trailers = collected.trailers().cloned();
        let data = collected.to_bytes();
        let record = (self.kept)(parts.status).then(|| {
            let (headers, set_cookie) = (&parts.headers, self.replay_set_cookie);
            stored_response::encode(parts.status, headers, set_cookie, &data, trailers.as_ref())
        });
        Ok((record, Response::from_parts(parts, LayerBody::buffered(data, trailers))))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::header::{CONTENT_TYPE, SET_COOKIE};
    use http::HeaderValue;
    use http_body_util::Full;

    use super::*;
    use crate::store::block_on;
    use crate::{FencingToken, Key};

    fn held() -> InTransaction {
        let key = Key::new("POST /orders", "u", "k").unwrap();
        let claim = OpenClaim::new(key, FencingToken::new(1), Duration::from_secs(60));
        InTransaction::new(claim, false, Arc::new(|status: StatusCode| !status.is_server_error()))
    }

    /// A response of `status` with a JSON body, a cookie (never replayed) and a trailer.
    fn response(status: StatusCode) -> Response<LayerBody<Full<Bytes>>> {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", HeaderValue::from_static("abc"));
        let body = LayerBody::buffered(Bytes::from_static(b"{\"id\":7}"), Some(trailers));
        let mut response = Response::new(body);
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(SET_COOKIE, HeaderValue::from_static("session=s"));
        response
    }

    /// `response` read whole: its parts, data and trailers.
    fn read<B: Body<Data = Bytes>>(
        response: Response<B>,
    ) -> (http::response::Parts, Bytes, Option<HeaderMap>)
    where
        B::Error: std::fmt::Debug,
    {
        let (parts, body) = response.into_parts();
        let collected = block_on(body.collect()).unwrap();
        let trailers = collected.trailers().cloned();
        (parts, collected.to_bytes(), trailers)
    }

    #[test]
    fn the_recorded_response_is_the_one_handed_back() {
        let (record, handed) =
            block_on(held().record_response(response(StatusCode::CREATED))).unwrap();
        let stored = stored_response::decode(&record.unwrap()).unwrap();
        let (parts, body, trailers) = read(handed);
        assert_eq!((stored.status, &stored.body[..]), (parts.status, &body[..]));
        assert_eq!(&body[..], b"{\"id\":7}");
        assert_eq!(stored.trailers, trailers);
        assert_eq!(trailers.unwrap().get("x-checksum").unwrap(), "abc");
        // The first answer carries every header; the record all but the cookie, as the
        // layer stores responses.
        assert_eq!(parts.headers.get(SET_COOKIE).unwrap(), "session=s");
        let mut replayed = parts.headers.clone();
        replayed.remove(SET_COOKIE);
        assert_eq!(stored.headers, replayed);
    }

    /// A body streamed frame by frame: its data, trailers, or an error, in order.
    struct Frames(std::collections::VecDeque<Result<http_body::Frame<Bytes>, &'static str>>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = &'static str;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, &'static str>>> {
            std::task::Poll::Ready(self.0.pop_front())
        }
    }

    fn streamed(frames: Vec<Result<http_body::Frame<Bytes>, &'static str>>) -> Response<Frames> {
        let mut response = Response::new(Frames(frames.into()));
        *response.status_mut() = StatusCode::CREATED;
        response.headers_mut().insert(http::header::DATE, HeaderValue::from_static("x"));
        response
    }

    #[test]
    fn a_streamed_body_is_recorded_whole_with_its_trailers_or_not_at_all() {
        use http_body::Frame;
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", HeaderValue::from_static("abc"));
        trailers.insert(SET_COOKIE, HeaderValue::from_static("late=1"));
        let frames = vec![
            Ok(Frame::data(Bytes::from_static(b"{\"id\":"))),
            Ok(Frame::data(Bytes::from_static(b"7}"))),
            Ok(Frame::trailers(trailers)),
        ];
        let (record, handed) = block_on(held().record_response(streamed(frames))).unwrap();
        let stored = stored_response::decode(&record.unwrap()).unwrap();
        let (parts, body, sent_trailers) = read(handed);
        assert_eq!((&body[..], &stored.body[..]), (&b"{\"id\":7}"[..], &b"{\"id\":7}"[..]));
        // The first answer as the handler made it; the record without the fields a
        // replay never repeats (Date; a cookie, even one sent as a trailer).
        assert_eq!(parts.headers.get(http::header::DATE).unwrap(), "x");
        assert!(stored.headers.get(http::header::DATE).is_none());
        assert_eq!(sent_trailers.as_ref().unwrap().get(SET_COOKIE).unwrap(), "late=1");
        let kept = stored.trailers.unwrap();
        assert_eq!(kept.get("x-checksum").unwrap(), "abc");
        assert!(kept.get(SET_COOKIE).is_none(), "{kept:?}");
        // An error mid-stream is the body's error: no record to write.
        let failing = vec![Ok(Frame::data(Bytes::from_static(b"{\"id\""))), Err("reset")];
        let failed = block_on(held().record_response(streamed(failing)));
        assert_eq!(failed.err(), Some("reset"));
    }

    #[test]
    fn a_status_not_kept_is_not_recorded_but_still_handed_back() {
        let (record, handed) =
            block_on(held().record_response(response(StatusCode::SERVICE_UNAVAILABLE))).unwrap();
        assert_eq!(record, None);
        let (parts, body, _) = read(handed);
        assert_eq!(
            (parts.status, &body[..]),
            (StatusCode::SERVICE_UNAVAILABLE, &b"{\"id\":7}"[..])
        );
    }
}
