//! [`IdempotentRetryLayer`]: the same client half as a tower layer, for clients that are
//! tower services of `http::Request`: hyper-util's `Client`, tonic's `Channel` (under
//! which a generated gRPC client is built).
//!
//! Invariant: as the reqwest middleware's. The key is chosen once, before the first
//! attempt ([`crate::failed::key_for`]), and every attempt carries it; the request's
//! body is read once, before the first attempt, and each attempt sends those bytes
//! (unary calls: a body that does not end is never sent); an attempt is repeated only
//! when [`crate::attempt`] says so, within the policy's attempts and deadline
//! ([`Schedule`]). A gRPC answer whose status is in its trailers is read whole before
//! that decision (a unary answer: one message), and handed on as read.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use idemcache::layer::IDEMPOTENCY_KEY;
use tower_layer::Layer;
use tower_service::Service;

use crate::attempt::{self, Next, Schedule};
use crate::failed::key_for;
use crate::{CallFailed, CallKey, RetryPolicy};

/// The error type of [`IdempotentRetryService`], as tower's middleware have it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request body the service can rebuild for each attempt from the bytes it read once.
/// Implemented for `http_body_util::Full<Bytes>`, its boxed forms (`BoxBody`,
/// `UnsyncBoxBody`) and, with the `tonic` feature, `tonic::body::Body` (what a
/// `Channel` takes).
pub trait ResendableBody: Body + Sized {
    /// A body that sends `bytes`.
    fn from_bytes(bytes: Bytes) -> Self;
}

impl ResendableBody for Full<Bytes> {
    fn from_bytes(bytes: Bytes) -> Self {
        Full::new(bytes)
    }
}

impl<E: 'static> ResendableBody for http_body_util::combinators::BoxBody<Bytes, E> {
    fn from_bytes(bytes: Bytes) -> Self {
        Full::new(bytes).map_err(|never: Infallible| match never {}).boxed()
    }
}

impl<E: 'static> ResendableBody for http_body_util::combinators::UnsyncBoxBody<Bytes, E> {
    fn from_bytes(bytes: Bytes) -> Self {
        Full::new(bytes).map_err(|never: Infallible| match never {}).boxed_unsync()
    }
}

/// A tower [`Layer`] wrapping a client in [`IdempotentRetryService`]: every request of
/// the policy's methods (`POST`, `PATCH`; every gRPC call is a `POST`) carries an
/// `Idempotency-Key` (the gRPC `idempotency-key` metadata), the same on every retry,
/// and is retried as `IdempotentRetry` retries over HTTP, and for gRPC by its
/// status: `UNAVAILABLE` and the server's failures retried, the in-progress `ABORTED`
/// after its `grpc-retry-pushback-ms`, `FAILED_PRECONDITION` (a reused key, an unknown
/// outcome) never.
///
/// ```no_run
/// # #[cfg(feature = "tonic")]
/// # async fn channel() -> Result<(), Box<dyn std::error::Error>> {
/// use idemcache_client::IdempotentRetryLayer;
/// use tower_layer::Layer;
///
/// let channel = tonic::transport::Channel::from_static("http://orders.internal:50051")
///     .timeout(std::time::Duration::from_secs(2))
///     .connect_lazy();
/// let orders = tonic::client::Grpc::new(IdempotentRetryLayer::default().layer(channel));
/// // A generated client the same way: `OrdersClient::new(IdempotentRetryLayer::default().layer(channel))`.
/// # let _ = orders;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct IdempotentRetryLayer {
    settings: Arc<Settings>,
}

/// What the layer and its services share.
#[derive(Debug, Clone, Default)]
struct Settings {
    policy: RetryPolicy,
    /// Paths passed through untouched.
    unguarded: Vec<String>,
}

impl Settings {
    /// Whether a request of `method` to `path` is keyed and retried.
    fn guards(&self, method: &http::Method, path: &str) -> bool {
        self.policy.applies_to(method) && !self.unguarded.iter().any(|p| p == path)
    }
}

impl IdempotentRetryLayer {
    /// The layer under `policy`.
    pub fn new(policy: RetryPolicy) -> IdempotentRetryLayer {
        IdempotentRetryLayer { settings: Arc::new(Settings { policy, unguarded: Vec::new() }) }
    }

    /// Paths passed through untouched, by exact path (`/orders.v1.Orders/Watch`; not a
    /// prefix): no key, no retry, the body not read first. Every streaming gRPC method
    /// (the service reads a request whole before its first attempt, which a stream's
    /// is not, and a bidirectional call would never start), and the unary calls that
    /// change nothing and need no key (`/grpc.health.v1.Health/Check`). The server's
    /// layer takes the same list (`Grpc::unguarded`).
    pub fn unguarded(mut self, paths: impl IntoIterator<Item = impl Into<String>>) -> Self {
        let settings = Arc::make_mut(&mut self.settings);
        settings.unguarded.extend(paths.into_iter().map(Into::into));
        self
    }

    /// The policy it retries under.
    pub fn policy(&self) -> &RetryPolicy {
        &self.settings.policy
    }
}

impl<S> Layer<S> for IdempotentRetryLayer {
    type Service = IdempotentRetryService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotentRetryService { inner, settings: self.settings.clone() }
    }
}

/// A client (a tower service of `http::Request<B>`) whose calls keep one key across
/// their retries: [`IdempotentRetryLayer`]'s service.
///
/// Its error, when a call ends with no answer, is a [`CallFailed`] (found with
/// [`CallFailed::find`]); a gRPC call's, with the `tonic` feature, is the `tonic::Status`
/// tonic would make of the last failure (`UNAVAILABLE` when nothing was sent) holding
/// the `CallFailed` as its source, since tonic hands a `Status` to the caller as it is
/// and would drop any other error's source. Its answers' bodies are [`RetryBody`]s.
#[derive(Debug, Clone)]
pub struct IdempotentRetryService<S> {
    inner: S,
    settings: Arc<Settings>,
}

impl<S> IdempotentRetryService<S> {
    /// `inner` under `policy` (`IdempotentRetryLayer::new(policy).layer(inner)`).
    pub fn new(inner: S, policy: RetryPolicy) -> IdempotentRetryService<S> {
        IdempotentRetryLayer::new(policy).layer(inner)
    }

    /// The wrapped client.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped client, to change.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped client, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B, ResB> Service<Request<B>> for IdempotentRetryService<S>
where
    S: Service<Request<B>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    B: ResendableBody + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + Unpin + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<RetryBody<ResB>>;
    type Error = BoxError;
    type Future = ResponseFuture<ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The service polled ready is the one that takes the first attempt.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if !self.settings.guards(request.method(), request.uri().path()) {
            let answer = inner.call(request);
            return ResponseFuture(Box::pin(async move {
                answer.await.map(|r| r.map(RetryBody::passed)).map_err(Into::into)
            }));
        }
        ResponseFuture(Box::pin(call(inner, self.settings.clone(), request)))
    }
}

/// One call: the key chosen, the body read, then attempts until one is final.
async fn call<S, B, ResB>(
    mut inner: S,
    settings: Arc<Settings>,
    request: Request<B>,
) -> Result<Response<RetryBody<ResB>>, BoxError>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    B: ResendableBody,
    B::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Unpin,
    ResB::Error: Into<BoxError>,
{
    let (mut parts, body) = request.into_parts();
    let grpc = parts
        .headers
        .get(CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"application/grpc"));
    let key = key_for(parts.extensions.get::<CallKey>(), parts.headers.get(IDEMPOTENCY_KEY))
        .map_err(|failed| failure(failed, grpc))?;
    parts.headers.insert(HeaderName::from_static(IDEMPOTENCY_KEY), key.header_value().clone());
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            let why = format!("the request's body could not be read: {}", e.into());
            return Err(failure(CallFailed::before_sending(why), grpc));
        }
    };
    let mut schedule = Schedule::start(&settings.policy);
    loop {
        schedule.attempt();
        let request = Request::from_parts(parts.clone(), B::from_bytes(body.clone()));
        let answer = send(&mut inner, request, grpc).await;
        let (next, reached) = match &answer {
            Ok(response) if grpc => {
                let trailers = response.body().trailers();
                (attempt::of_grpc(response.status(), response.headers(), trailers), true)
            }
            Ok(response) => (attempt::of_response(response.status(), response.headers()), true),
            Err(Unsent(_)) => (Next::Retry { after: None }, false),
            Err(Failed(e)) => (Next::Retry { after: None }, !attempt::never_connected(&**e)),
        };
        let Some(wait) = schedule.retry(next, reached, true) else {
            return answer.map_err(|(Unsent(e) | Failed(e))| {
                let failed = CallFailed {
                    attempts: schedule.attempts,
                    sent: schedule.sent,
                    key: Some(key.clone()),
                    source: e,
                };
                failure(failed, grpc)
            });
        };
        tokio::time::sleep(wait).await;
    }
}

/// Why an attempt has no answer.
enum AttemptError {
    /// The client was not ready to send (nothing was sent).
    Unsent(BoxError),
    /// Sending it, or reading its answer, failed.
    Failed(BoxError),
}
use AttemptError::{Failed, Unsent};

/// One attempt: sent when the client is ready; a gRPC answer whose status is not in its
/// headers read whole, for its trailers.
async fn send<S, B, ResB>(
    inner: &mut S,
    request: Request<B>,
    grpc: bool,
) -> Result<Response<RetryBody<ResB>>, AttemptError>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Unpin,
    ResB::Error: Into<BoxError>,
{
    std::future::poll_fn(|cx| inner.poll_ready(cx)).await.map_err(|e| Unsent(e.into()))?;
    let response = inner.call(request).await.map_err(|e| Failed(e.into()))?;
    let trailers_only = response.headers().contains_key(attempt::GRPC_STATUS);
    if !grpc || response.status() != StatusCode::OK || trailers_only {
        return Ok(response.map(RetryBody::passed));
    }
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.map_err(|e| Failed(e.into()))?;
    let trailers = collected.trailers().cloned();
    Ok(Response::from_parts(parts, RetryBody::read(collected.to_bytes(), trailers)))
}

/// The error a call with no answer ends with: the `CallFailed`, or for gRPC with the
/// `tonic` feature a `tonic::Status` holding it.
fn failure(failed: CallFailed, grpc: bool) -> BoxError {
    #[cfg(feature = "tonic")]
    if grpc {
        return Box::new(crate::grpc::status_of(failed));
    }
    let _ = grpc;
    Box::new(failed)
}

/// What a call through [`IdempotentRetryService`] ends with.
type Answer<B> = Result<Response<RetryBody<B>>, BoxError>;

/// The future of [`IdempotentRetryService`]'s answer.
pub struct ResponseFuture<B>(Pin<Box<dyn Future<Output = Answer<B>> + Send>>);

impl<B> Future for ResponseFuture<B> {
    type Output = Answer<B>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

impl<B> fmt::Debug for ResponseFuture<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// The body of an answer through [`IdempotentRetryService`]: the client's own, passed
/// on as it comes, or, for a gRPC answer the service read whole to find its status, the
/// bytes and trailers it read.
pub struct RetryBody<B> {
    kind: Kind<B>,
}

enum Kind<B> {
    Passed(B),
    Read { data: Option<Bytes>, trailers: Option<HeaderMap> },
}

impl<B> RetryBody<B> {
    fn passed(body: B) -> RetryBody<B> {
        RetryBody { kind: Kind::Passed(body) }
    }

    fn read(data: Bytes, trailers: Option<HeaderMap>) -> RetryBody<B> {
        let data = (!data.is_empty()).then_some(data);
        RetryBody { kind: Kind::Read { data, trailers } }
    }

    /// The trailers of an answer read whole.
    fn trailers(&self) -> Option<&HeaderMap> {
        match &self.kind {
            Kind::Read { trailers, .. } => trailers.as_ref(),
            Kind::Passed(_) => None,
        }
    }
}

impl<B> fmt::Debug for RetryBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Passed(_) => f.write_str("RetryBody::Passed"),
            Kind::Read { data, trailers } => f
                .debug_struct("RetryBody::Read")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .field("trailers", trailers)
                .finish(),
        }
    }
}

impl<B> Body for RetryBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().kind {
            Kind::Passed(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            Kind::Read { data, trailers } => match data.take() {
                Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                None => Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t)))),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Passed(body) => body.is_end_stream(),
            Kind::Read { data, trailers } => data.is_none() && trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Passed(body) => body.size_hint(),
            Kind::Read { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_read_answer_gives_back_its_bytes_then_its_trailers() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let body: RetryBody<Full<Bytes>> =
            RetryBody::read(Bytes::from_static(b"order"), Some(trailers.clone()));
        assert_eq!(body.size_hint().exact(), Some(5));
        assert_eq!(body.trailers(), Some(&trailers));
        let collected = body.collect().await.unwrap();
        assert_eq!(collected.trailers(), Some(&trailers));
        assert_eq!(collected.to_bytes(), "order");
        let empty: RetryBody<Full<Bytes>> = RetryBody::read(Bytes::new(), None);
        assert!(empty.is_end_stream());
        let passed = RetryBody::passed(Full::new(Bytes::from_static(b"as is")));
        assert_eq!(passed.collect().await.unwrap().to_bytes(), "as is");
    }

    #[test]
    fn the_layer_keeps_its_policy_and_passes_what_it_does_not_guard() {
        let policy = RetryPolicy::default().with_attempts(2).unwrap();
        let layer = IdempotentRetryLayer::new(policy.clone());
        assert_eq!(layer.policy(), &policy);
        let layer = layer.unguarded(["/orders.v1.Orders/Watch"]);
        let settings = &layer.settings;
        assert!(settings.guards(&http::Method::POST, "/orders.v1.Orders/Create"));
        assert!(!settings.guards(&http::Method::POST, "/orders.v1.Orders/Watch"));
        assert!(settings.guards(&http::Method::POST, "/orders.v1.Orders/Watch/more"), "exact");
        assert!(settings.guards(&http::Method::POST, "/orders.v1.Orders/Wat"), "not a prefix");
        assert!(!settings.guards(&http::Method::GET, "/orders.v1.Orders/Create"));
    }
}
