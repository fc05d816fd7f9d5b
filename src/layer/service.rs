//! [`Idempotency`]: one request's way through the layer, from header to stored response.
//!
//! Invariant: a guarded request reaches the handler only holding the key's claim
//! ([`Found::Acquired`]), and that claim always ends in exactly one of complete (the
//! response is stored), release (5xx or a handler error: a retry runs again), mark
//! unknown (the response carries [`OutcomeUnknown`], or its body failed mid-way: the
//! effect may have happened), or its
//! backend's drop rule (the handler panicked). The handler and the settling of its
//! claim run in one [`Detached`] execution, which finishes in a task of its own if the
//! request future is dropped (a client gone), so that changes neither.
//!
//! The size of futures: every request's future is boxed and moved, and an execution's
//! boxed again, so their size is paid per request (a copy at each move; over 1 KiB,
//! glibc's allocator consolidates its free lists at each allocation). Three habits keep
//! them small: the large steps are functions returning an `async move` block rather
//! than `async fn`s (an `async fn` keeps its arguments twice in its state: as given and
//! as moved into its body); a future that is boxed is built outside the `async` code
//! that awaits it (a local moved into a box keeps its room in the awaiting future's
//! state); and the handler's future is pinned where it is made, not passed by value.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::backend::{Found, Held, Records, Settled};
use super::body::LayerBody;
use super::claimed::Claimed;
use super::decision::Decision;
use super::detached::Detached;
use super::grpc::as_grpc;
use super::header;
#[cfg(feature = "store")]
use super::in_transaction::InTransaction;
use super::outcome::OutcomeUnknown;
use super::problem::refuse;
use super::problem::Refusal;
use super::renewal::{Panicked, Read, Renewing};
use super::replay::replayed;
use super::report::Asked;
use super::request_body::{read_body, refuse_body};
use super::settings::Settings;
use super::span::{current_span, in_span};
use super::stored_response;
use crate::fingerprint::WholeRequest;
use crate::{CorrelationId, Fingerprint, Key, KeyError};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The service a guarded request reaches, with what an execution that may finish in a
/// task of its own needs of it (see [`Detached`]): itself, its future and its error sent
/// there.
pub(crate) trait Handler<ReqB, ResB>:
    Service<
        Request<LayerBody<ReqB>>,
        Response = Response<ResB>,
        Future: Send + 'static,
        Error: Send + 'static,
    > + Send
    + 'static
{
}

impl<S, ReqB, ResB> Handler<ReqB, ResB> for S
where
    S: Service<Request<LayerBody<ReqB>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
}

/// What the layer answers a request: the response, or the handler's error.
type Answer<ResB, E> = Result<Response<LayerBody<ResB>>, E>;

/// The service [`IdempotencyLayer`](super::IdempotencyLayer) wraps around yours.
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    settings: Arc<Settings>,
}

impl<S> Idempotency<S> {
    pub(crate) fn new(inner: S, settings: Arc<Settings>) -> Self {
        Idempotency { inner, settings }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("settings", &self.settings)
            .finish()
    }
}

/// Any request body of `Bytes` frames (axum's, hyper's `Incoming`, `Full`, ...) comes
/// in; your service gets the request with a [`LayerBody`]: the body read whole when the
/// layer guarded the request (it was hashed into the fingerprint), else yours, frame by
/// frame, unread.
impl<S, ReqB, ResB> Service<Request<ReqB>> for Idempotency<S>
where
    S: Service<Request<LayerBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<LayerBody<ResB>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // The instance polled ready serves this request; a clone waits for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let answer = guarded(self.settings.clone(), inner, request);
        if self.settings.grpc.is_some() {
            return Box::pin(async move { answer.await.map(as_grpc) });
        }
        Box::pin(answer)
    }
}

/// A request's body before the claim: read already (a key read from it), or not yet.
enum Pending<B> {
    Unread(B),
    Read(Bytes),
}

/// The handler's answer to a request the layer does not guard: its body passed on
/// unread, and the response's frame by frame.
async fn passed<S, ReqB, ResB>(
    mut inner: S,
    request: Request<ReqB>,
) -> Result<Response<LayerBody<ResB>>, S::Error>
where
    S: Service<Request<LayerBody<ReqB>>, Response = Response<ResB>>,
{
    Ok(inner.call(request.map(LayerBody::passed)).await?.map(LayerBody::passed))
}

// An async block, not an `async fn`: see the module docs on the size of futures.
#[allow(clippy::manual_async_fn)]
fn guarded<S, ReqB, ResB>(
    settings: Arc<Settings>,
    mut inner: S,
    request: Request<ReqB>,
) -> impl Future<Output = Result<Response<LayerBody<ResB>>, S::Error>>
where
    S: Handler<ReqB, ResB>,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
{
    async move {
        let streaming = settings.grpc.as_ref().is_some_and(|g| g.passes(request.uri().path()));
        // gRPC: every call is guarded whatever its HTTP method (tonic serves a unary call sent
        // with PUT as one sent with POST); over HTTP, the methods configured.
        let method_guarded = settings.grpc.is_some() || settings.methods.contains(request.method());
        if streaming || !method_guarded {
            return passed(inner, request).await;
        }
        let (parts, body) = request.into_parts();
        // A key the application reads from the request (`key_from`) needs the body first.
        let body = match &settings.key_from {
            None => Pending::Unread(body),
            Some(_) => match read_body(&parts, body, settings.max_request_body).await {
                Ok(read) => Pending::Read(read),
                Err(refusal) => return refuse_body(settings.max_request_body, refusal),
            },
        };
        let client_key: Result<Option<Cow<'_, [u8]>>, String> = match (&settings.key_from, &body) {
            (Some(key_from), Pending::Read(read)) => {
                key_from(&parts, read).map(|k| k.map(Cow::Owned))
            }
            _ => match header::borrowed_key(&parts.headers) {
                Ok(Some(Cow::Borrowed(k))) => Ok(Some(Cow::Borrowed(k.as_bytes()))),
                Ok(Some(Cow::Owned(k))) => Ok(Some(Cow::Owned(k.into_bytes()))),
                Ok(None) => Ok(None),
                Err(e) => Err(e.to_string()),
            },
        };
        // Unguarded (no key, none required): passed on before anything else is asked of it.
        if matches!(client_key, Ok(None)) && !settings.require_key {
            drop(client_key);
            return match body {
                Pending::Unread(body) => passed(inner, Request::from_parts(parts, body)).await,
                Pending::Read(read) => {
                    let request = Request::from_parts(parts, LayerBody::buffered(read, None));
                    Ok(inner.call(request).await?.map(LayerBody::passed))
                }
            };
        }
        let tenant = match &settings.tenant {
            // An empty tenant names nobody: unauthenticated, like none.
            Some(tenant) => match tenant(&parts).filter(|t| !t.is_empty()) {
                Some(t) => Some(t),
                None => return refuse(Refusal::NoTenant, "this request needs credentials", None),
            },
            None => None,
        };
        let client_key = match client_key {
            Ok(Some(k)) => k,
            Ok(None) if settings.key_from.is_some() => {
                return refuse(
                    Refusal::MissingKey,
                    "this request carries no idempotency key",
                    None,
                );
            }
            Ok(None) => {
                let missing = header::KeyHeaderError::Missing.to_string();
                return refuse(Refusal::MissingKey, &missing, None);
            }
            Err(e) => return refuse(Refusal::InvalidKey, &e, None),
        };
        let scope = (settings.scope)(&parts);
        let key = match &tenant {
            Some(tenant) => Key::new(&scope, tenant, &client_key),
            None => Key::without_tenant(&scope, &client_key),
        };
        // The key owns its bytes now: the header's borrow ends here.
        drop(client_key);
        let key = match key {
            Ok(key) => key,
            // The scope (method and route or path) and tenant are the request's, not the
            // client key's: a path too long for a scope is not the key's fault.
            Err(KeyError::ScopeAndTenantTooLong { len }) => {
                let detail = format!(
                    "the request's scope (method and path) and tenant are {len} bytes together; \
                 at most {} are accepted",
                    crate::MAX_SCOPE_AND_TENANT_LEN
                );
                return refuse(Refusal::ScopeTooLong, &detail, None);
            }
            Err(e @ KeyError::EmptyScope) => {
                return refuse(Refusal::Internal, &e.to_string(), None)
            }
            Err(e) => return refuse(Refusal::InvalidKey, &e.to_string(), None),
        };
        let body = match body {
            Pending::Read(read) => read,
            Pending::Unread(unread) => {
                match read_body(&parts, unread, settings.max_request_body).await {
                    Ok(body) => body,
                    Err(refusal) => return refuse_body(settings.max_request_body, refusal),
                }
            }
        };
        let fingerprint = fingerprint(&settings, &parts, &body);
        let (correlation_id, probed) = match probe(&settings, &parts, &key, fingerprint) {
            Probe::Replayed { body, expires_at } => {
                Asked::new(scope, key, None).report(&settings, Decision::Replayed, None);
                return replayed(body, expires_at);
            }
            Probe::Missed(id) => (id, true),
            Probe::NotAsked(id) => (id, false),
        };
        let asked = Asked::new(scope, key, correlation_id);
        let request = Request::from_parts(parts, LayerBody::<ReqB>::buffered(body, None));
        match &settings.records {
            // Cancelling the cache's claim is safe (it is synchronous, or a wait that
            // withdraws); the handler's execution is detached once the key is held.
            Records::Memory(_) => {
                let span = asked.span();
                in_span(span, decide(settings.clone(), inner, request, asked, fingerprint, probed))
                    .await
            }
            // A store commits a claim before its answer arrives: a request future dropped in
            // between (a client gone) would leave the key held with nobody to run it. The
            // claim and the handler run in one detached execution.
            #[cfg(feature = "store")]
            Records::Durable(_) => {
                joined(detached_decision(&settings, inner, request, asked, fingerprint).await)
            }
        }
    }
}

/// The claim and execution over a durable store, detached, in the request's span; built
/// outside [`guarded`] so that its state is not laid out in every request's future too
/// (see the module docs on the size of futures).
#[cfg(feature = "store")]
fn detached_decision<S, ReqB, ResB>(
    settings: &Arc<Settings>,
    inner: S,
    request: Request<LayerBody<ReqB>>,
    asked: Asked,
    fingerprint: Fingerprint,
) -> Detached<impl Future<Output = Answer<ResB, S::Error>> + Send + 'static>
where
    S: Handler<ReqB, ResB>,
    ReqB: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
{
    let span = asked.span();
    let decided = decide(settings.clone(), inner, request, asked, fingerprint, false);
    Detached::boxed(Box::pin(in_span(span, decided)))
}

/// What [`probe`] found before the claim.
enum Probe {
    /// The cache's read lock answered a replay (its result, and until when it is kept):
    /// no claim, and no correlation id read.
    Replayed { body: Option<Bytes>, expires_at: std::time::SystemTime },
    /// The read lock had no replay; the request's correlation id.
    Missed(Option<CorrelationId>),
    /// The read lock was not asked (the claim will); the request's correlation id.
    NotAsked(Option<CorrelationId>),
}

/// The request's correlation id, read now when something reports it or a store keeps
/// it. Over the cache alone with nothing reporting, only once a claim may acquire: a
/// replay the read lock can answer is answered first, without it, so replays there cost
/// no header lookup for it. (Not the first replay of a result just packed, which only a
/// claim can share: that one reads it.)
// Without the `store` feature the cache is the only kind of records.
#[allow(irrefutable_let_patterns)]
fn probe(settings: &Settings, parts: &Parts, key: &Key, fingerprint: Fingerprint) -> Probe {
    if let Records::Memory(cache) = &settings.records {
        if !settings.observes_correlation() {
            if let Some(replay) = cache.replay_hit(key, fingerprint) {
                let expires_at = cache.system_time(replay.expires_at);
                return Probe::Replayed { body: replay.body, expires_at };
            }
            return Probe::Missed((settings.correlation_id)(parts));
        }
    }
    Probe::NotAsked((settings.correlation_id)(parts))
}

/// Claims `key` and answers: the handler's response (over the cache its execution is
/// [`Detached`]: it finishes even if this future is dropped), a replay, or a refusal.
/// `probed`: the cache's read lock was asked for a replay just before, and had none.
// An async block, not an `async fn`: see the module docs on the size of futures.
#[allow(clippy::manual_async_fn)]
fn decide<S, ReqB, ResB>(
    settings: Arc<Settings>,
    inner: S,
    mut request: Request<LayerBody<ReqB>>,
    mut asked: Asked,
    fingerprint: Fingerprint,
    probed: bool,
) -> impl Future<Output = Result<Response<LayerBody<ResB>>, S::Error>>
where
    S: Handler<ReqB, ResB>,
    ReqB: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
{
    async move {
        let started = Asked::timed(&settings).then(std::time::Instant::now);
        let detach = matches!(settings.records, Records::Memory(_));
        let correlation_id = asked.correlation_id.as_ref();
        let claiming =
            settings.records.claim(&asked.key, fingerprint, correlation_id, settings.wait, probed);
        // A claim that waits for a duplicate can be dropped mid-wait (its client gone): it is
        // reported `in_progress` then, the answer it would have had at that instant.
        let gone = ReportIfDropped { settings: &settings, asked: &asked, started };
        let (found, waited) = claiming.await;
        std::mem::forget(gone);
        asked.claim_time = started.map_or(std::time::Duration::ZERO, |s| s.elapsed());
        asked.waited = waited;
        let decision = match found {
            Found::Acquired(held) => {
                let (key, correlation_id) = (asked.key.clone(), asked.correlation_id.clone());
                let claimed = Claimed::new(key, fingerprint, correlation_id, held.took_over());
                request.extensions_mut().insert(claimed);
                // Reported when the execution settles its claim.
                let run = execution(&settings, inner, request, held, asked);
                if !detach {
                    return run.await;
                }
                return joined(Detached::boxed(run).await);
            }
            Found::Completed { body, expires_at } => {
                let replay = if waited { Decision::ReplayedAfterWait } else { Decision::Replayed };
                asked.report(&settings, replay, None);
                return replayed(body, expires_at);
            }
            Found::InProgress { retry_after } => {
                asked.report(&settings, Decision::InProgress, None);
                let detail = "a request with this key is executing; retry after it finishes";
                let retry_after = settings.times.retry_after(&asked.scope, retry_after);
                return refuse(Refusal::InProgress, detail, Some(retry_after));
            }
            Found::Unknown => {
                let detail =
                    "an earlier request with this key has an unknown outcome; it is being \
                          checked and will not be executed again blindly";
                (Decision::Unknown, refuse(Refusal::OutcomeUnknown, detail, None))
            }
            Found::Mismatch => {
                let detail = "this key was used for a different request (method, path, headers \
                          or body differ)";
                (Decision::Mismatch, refuse(Refusal::Mismatch, detail, None))
            }
            Found::Full => {
                let detail = "too many requests are executing; not executed";
                let retry_after = Some(std::time::Duration::from_secs(1));
                (Decision::CapacityRefused, refuse(Refusal::CacheFull, detail, retry_after))
            }
            Found::Unavailable(why) => {
                let detail = format!("the idempotency store is unavailable; not executed: {why}");
                let retry_after = Some(std::time::Duration::from_secs(1));
                (Decision::StoreError, refuse(Refusal::StoreUnavailable, &detail, retry_after))
            }
            Found::Corrupt(why) => {
                let detail = format!(
                    "the idempotency record of this key is unreadable; not executed: {why}"
                );
                (Decision::StoreError, refuse(Refusal::RecordCorrupt, &detail, None))
            }
            Found::Refused(why) => (Decision::StoreError, refuse(Refusal::Internal, &why, None)),
        };
        let (decision, answer) = decision;
        asked.report(&settings, decision, None);
        answer
    }
}

/// The execution of a claim just acquired, in the request's span (the caller runs in
/// it; carried along if the execution moves to a task of its own), on the heap.
///
/// Boxed, and built here rather than in [`decide`] (see the module docs on the size of
/// futures): inline, the execution's state would make every request's future, replays
/// too, that much larger.
fn execution<S, ReqB, ResB>(
    settings: &Arc<Settings>,
    inner: S,
    request: Request<LayerBody<ReqB>>,
    held: Held,
    asked: Asked,
) -> Pin<Box<impl Future<Output = Answer<ResB, S::Error>> + Send + 'static>>
where
    S: Handler<ReqB, ResB>,
    ReqB: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
{
    Box::pin(in_span(current_span(), execute(settings.clone(), inner, request, held, asked)))
}

/// Reports a request whose claim was dropped while it waited (see [`decide`]); forgotten
/// once the claim answers.
struct ReportIfDropped<'a> {
    settings: &'a Settings,
    asked: &'a Asked,
    started: Option<std::time::Instant>,
}

impl Drop for ReportIfDropped<'_> {
    fn drop(&mut self) {
        let mut asked = self.asked.clone();
        asked.claim_time = self.started.map_or(std::time::Duration::ZERO, |s| s.elapsed());
        asked.waited = true;
        asked.report(self.settings, Decision::InProgress, None);
    }
}

/// Method, path and query, the selected headers (every value, in order) and the body (or
/// what `fingerprint_body` selects of it).
fn fingerprint(settings: &Settings, parts: &Parts, body: &[u8]) -> Fingerprint {
    let target = parts.uri.path_and_query().map_or(parts.uri.path(), |pq| pq.as_str());
    let mut request = WholeRequest::new();
    request.method(parts.method.as_str());
    request.path(target);
    for name in &settings.fingerprint_headers {
        for value in parts.headers.get_all(name) {
            request.header(name.as_str(), value.as_bytes());
        }
    }
    match &settings.fingerprint_body {
        Some(select) => request.finish_with_body(&select(parts, body)),
        None => request.finish_with_body(body),
    }
}

/// Runs the handler holding `held` and settles the claim by the response; [`Detached`],
/// so it finishes whatever happens to the request that started it.
///
/// The execution is the handler *and* its response body: until both are done the lease
/// is renewed ([`Renewing`]), so neither a slow handler nor a body that streams for
/// longer than the lease is taken over and run a second time by a duplicate. (An
/// execution that never finishes therefore holds its key; bound it with a timeout
/// inside the layer.) A panic in either is caught and the claim settled as the
/// backend's drop policy says, in the store too.
// An async block, not an `async fn`: see the module docs on the size of futures.
#[allow(clippy::manual_async_fn)]
fn execute<S, ReqB, ResB>(
    settings: Arc<Settings>,
    mut inner: S,
    #[cfg_attr(not(feature = "store"), allow(unused_mut))] mut request: Request<LayerBody<ReqB>>,
    held: Held,
    asked: Asked,
) -> impl Future<Output = Result<Response<LayerBody<ResB>>, S::Error>>
where
    S: Service<Request<LayerBody<ReqB>>, Response = Response<ResB>>,
    ResB: Body<Data = Bytes>,
{
    async move {
        let started = tokio::time::Instant::now();
        let mut renewing = Renewing::new(held, started);
        #[cfg(feature = "store")]
        {
            if let Some(claim) = renewing.open_claim() {
                let kept = settings.store.clone();
                let handed = InTransaction::new(claim.clone(), settings.replay_set_cookie, kept);
                request.extensions_mut().insert(handed);
            }
            renewing.lend(request.extensions_mut());
        }
        let answered = renewing.run(std::pin::pin!(inner.call(request))).await;
        let read = match answered {
            Ok(Ok(response)) => {
                let (parts, body) = response.into_parts();
                renewing.read(body).await.map(|read| (parts, read))
            }
            Ok(Err(e)) => {
                let released = renewing.into_held().release().await;
                let decision = released.reported_as(Decision::Released);
                asked.report(&settings, decision, Some(started.elapsed()));
                return Err(e);
            }
            Err(panicked) => Err(panicked),
        };
        let handed_over = renewing.handed_over();
        let held = renewing.into_held();
        let (parts, read) = match read {
            Ok(done) => done,
            Err(Panicked) => {
                let detail = match held.rolls_back() {
                    true => {
                        "the handler or its response body panicked; its transaction was \
                         rolled back"
                    }
                    false => {
                        "the handler or its response body panicked; the key was settled as \
                          the cache's drop policy settles an abandoned claim"
                    }
                };
                let settled = held.abandon().await;
                asked.report(&settings, settled, Some(started.elapsed()));
                return refuse(Refusal::Internal, detail, None);
            }
        };
        let took = started.elapsed();
        settings.times.record(&asked.scope, took);
        let took = Some(took);
        if held.rolls_back()
            && (parts.extensions.get::<OutcomeUnknown>().is_some() || read.failed())
        {
            // One commit keeps no UNKNOWN: what the handler wrote is rolled back, so nothing
            // happened in the database, and the client must not be told otherwise.
            let decision = held.release().await.reported_as(Decision::Released);
            asked.report(&settings, decision, took);
            let detail = "the outcome could not be recorded (the handler marked it unknown, or \
                      its response failed while being sent): the transaction holding its \
                      changes was rolled back; a retry runs again";
            return refuse(Refusal::Internal, detail, None);
        }
        if parts.extensions.get::<OutcomeUnknown>().is_some() {
            // The handler cannot tell whether its effect happened: never re-run blindly,
            // never replay this answer as if it had.
            let decision = held.mark_unknown().await.reported_as(Decision::MarkedUnknown);
            asked.report(&settings, decision, took);
            let (body, trailers) = match read {
                Read::Whole(body, trailers) => (body, trailers),
                Read::Failed => (Bytes::new(), None),
            };
            return Ok(Response::from_parts(parts, LayerBody::buffered(body, trailers)));
        }
        // `store_when` is the application's code: a panic in it is caught as a handler's is,
        // so that the claim is settled by the drop policy and the request still reported.
        let asked_store = std::panic::AssertUnwindSafe(|| match (&settings.grpc, &read) {
            // A gRPC answer's outcome is its status (a 200 whatever it is, and no status at
            // all for a proxy's 429 or 503), read whole. One whose body failed is kept or not
            // by its HTTP status, as any other: its effect may have happened.
            (Some(grpc), Read::Whole(_, trailers)) => grpc.keeps(&parts.headers, trailers.as_ref()),
            _ => (settings.store)(parts.status),
        });
        let Ok(stored) = std::panic::catch_unwind(asked_store) else {
            let settled = held.abandon().await;
            asked.report(&settings, settled, took);
            let detail = "the layer's store_when panicked; the key was settled as the cache's \
                      drop policy settles an abandoned claim";
            return refuse(Refusal::Internal, detail, None);
        };
        let (body, trailers) = match read {
            Read::Whole(body, trailers) => (body, trailers),
            // A response that is not kept (a 5xx) releases its key whatever its body does.
            Read::Failed if !stored => {
                let decision = held.release().await.reported_as(Decision::Released);
                asked.report(&settings, decision, took);
                let detail = "the response failed while being sent; it was not kept";
                return refuse(Refusal::Internal, detail, None);
            }
            Read::Failed => {
                // The handler answered, so its effect may have happened: never re-run blindly.
                let decision = held.mark_unknown().await.reported_as(Decision::MarkedUnknown);
                asked.report(&settings, decision, took);
                let detail = "the response failed while being sent; its outcome is unknown";
                return refuse(Refusal::Internal, detail, None);
            }
        };
        if handed_over {
            // The handler wrote the record in its own transaction: committed, it stands (and
            // this fenced release is refused); rolled back, the record is still PROCESSING
            // under this claim, and releasing it lets a retry run (nothing committed). The
            // decision is what the release found, not what the handler meant to do.
            let decision = match held.release().await {
                Settled::Recorded => Decision::Released,
                Settled::LeaseLost => Decision::Acquired,
                Settled::Failed | Settled::NotCommitted(_) => Decision::NotSettled,
            };
            asked.report(&settings, decision, took);
        } else if stored {
            let set_cookie = settings.replay_set_cookie;
            let record = stored_response::encode(
                parts.status,
                &parts.headers,
                set_cookie,
                &body,
                trailers.as_ref(),
            );
            let decision = match held.complete(record).await {
                Settled::Recorded => Decision::Acquired,
                // Ran past its lease and someone else owns the key now: answer this client,
                // record nothing (the new owner's outcome stands).
                Settled::LeaseLost => Decision::LeaseLost,
                // The store failed to record it: answer this client (the effect happened);
                // the store keeps the key from running again (see the module docs).
                Settled::Failed => Decision::NotSettled,
                // One commit: the handler's change did not commit with the record, so it
                // did not happen; the client is told so, never the handler's answer.
                Settled::NotCommitted(decision) => {
                    asked.report(&settings, decision, took);
                    let detail = "the transaction holding this request's change and its record \
                              did not commit (or its commit was not confirmed); retry: a \
                              retry replays what committed, or runs again";
                    let retry_after = Some(std::time::Duration::from_secs(1));
                    return refuse(Refusal::StoreUnavailable, detail, retry_after);
                }
            };
            asked.report(&settings, decision, took);
        } else {
            let decision = held.release().await.reported_as(Decision::Released);
            asked.report(&settings, decision, took);
        }
        Ok(Response::from_parts(parts, LayerBody::buffered(body, trailers)))
    }
}

/// The answer of a [`Detached`] execution; one that panicked outside the handler (which
/// [`execute`] catches) is a 500 saying so.
fn joined<ResB, E>(
    joined: Result<Result<Response<LayerBody<ResB>>, E>, Panicked>,
) -> Result<Response<LayerBody<ResB>>, E> {
    joined.unwrap_or_else(|Panicked| {
        refuse(Refusal::Internal, "the idempotency layer failed mid-request", None)
    })
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::future::Ready;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll};

    use http::HeaderValue;
    use http_body_util::{BodyExt, Full};
    use tower_layer::Layer;

    use super::*;
    use crate::layer::IdempotencyLayer;
    use crate::{Cache, EntryState};

    /// A handler that answers 201.
    #[derive(Clone)]
    struct Created;

    impl<B> Service<Request<B>> for Created {
        type Response = Response<Full<Bytes>>;
        type Error = Infallible;
        type Future = Ready<Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<B>) -> Self::Future {
            let created = Response::builder().status(201).body(Full::new(Bytes::from("{}")));
            std::future::ready(Ok(created.expect("a valid response")))
        }
    }

    const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// A handler that answers with the status it is told, after noting the `charge`
    /// downstream key of the claim it runs under; the 3rd answer carries OutcomeUnknown.
    #[derive(Clone)]
    struct Charging {
        statuses: Arc<std::sync::Mutex<Vec<u16>>>,
        seen: Arc<std::sync::Mutex<Vec<String>>>,
    }

    impl<B> Service<Request<B>> for Charging {
        type Response = Response<Full<Bytes>>;
        type Error = Infallible;
        type Future = Ready<Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: Request<B>) -> Self::Future {
            let claimed = request.extensions().get::<Claimed>().expect("behind the layer");
            let charge = claimed.downstream_key("charge").unwrap();
            let mut seen = self.seen.lock().unwrap();
            seen.push(charge.as_str().to_owned());
            let status = self.statuses.lock().unwrap().remove(0);
            let response = Response::builder().status(status).body(Full::new(Bytes::new()));
            let mut response = response.expect("a valid response");
            if seen.len() == 3 {
                response.extensions_mut().insert(crate::layer::OutcomeUnknown);
            }
            std::future::ready(Ok(response))
        }
    }

    /// Each execution of one intent hands the provider the same `charge` key: the first
    /// and each retry after a 503 released the key; and the reconciler asks about that
    /// same key for the UNKNOWN entry the last one left.
    #[test]
    fn every_execution_of_an_intent_and_its_reconciler_name_one_downstream_key() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let cache = Cache::builder().build().unwrap();
        let handler = Charging {
            statuses: Arc::new(std::sync::Mutex::new(vec![503, 503, 201])),
            seen: Arc::new(std::sync::Mutex::new(Vec::new())),
        };
        let mut service = IdempotencyLayer::new(cache.clone()).layer(handler.clone());
        let mut send = |key: &str, body: &'static str| {
            let request = Request::post("/orders")
                .header("idempotency-key", key)
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            runtime.block_on(service.call(request)).unwrap().status().as_u16()
        };
        assert_eq!(send("k1", "{\"amount\":100}"), 503);
        assert_eq!(send("k1", "{\"amount\":100}"), 503);
        assert_eq!(send("k1", "{\"amount\":100}"), 201);
        let seen = handler.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 3);
        assert!(seen.iter().all(|k| *k == seen[0]), "{seen:?}");
        assert!(seen[0].starts_with("charge-"));
        let unknown = cache.list_unknown(10);
        assert_eq!(unknown.len(), 1, "the third answer's outcome is unknown");
        assert_eq!(unknown[0].downstream_key("charge").unwrap().as_str(), seen[0]);
        // Another request under another key, or another body under a reused one after the
        // first is forgotten, is another call.
        cache.forget(&unknown[0].key).unwrap();
        handler.statuses.lock().unwrap().extend([201, 201]);
        assert_eq!(send("k2", "{\"amount\":100}"), 201);
        assert_eq!(send("k1", "{\"amount\":200}"), 201);
        let seen = handler.seen.lock().unwrap().clone();
        assert!(seen[3] != seen[0] && seen[4] != seen[0] && seen[3] != seen[4], "{seen:?}");
    }

    /// Over the cache alone the key's entry keeps the request's trace id, through the
    /// completion, whichever way the claim acquires; with nothing reporting it (no hook,
    /// neither `metrics` nor `tracing`), it is read for a claim that may acquire only, not
    /// for the replays a duplicate gets.
    #[test]
    fn over_the_cache_the_entry_keeps_the_trace_id_read_only_when_a_claim_may_acquire() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        for wait in [None, Some(std::time::Duration::from_secs(5))] {
            let cache = Cache::builder().build().unwrap();
            let reads = Arc::new(AtomicUsize::new(0));
            let counted = reads.clone();
            let mut layer = IdempotencyLayer::new(cache.clone()).correlation_id(move |parts| {
                counted.fetch_add(1, Ordering::SeqCst);
                crate::layer::trace_id(&parts.headers)
            });
            if let Some(wait) = wait {
                layer = layer.wait(wait);
            }
            let mut service = layer.layer(Created);
            let mut send = |key: &str| {
                let request = Request::post("/orders")
                    .header("idempotency-key", key)
                    .header("traceparent", TRACE)
                    .body(Full::new(Bytes::from("{}")))
                    .unwrap();
                let response = runtime.block_on(service.call(request)).unwrap();
                (response.status().as_u16(), response.headers().contains_key("idempotent-replayed"))
            };
            assert_eq!(send("k1"), (201, false), "wait: {wait:?}");
            assert_eq!(send("k1"), (201, true), "wait: {wait:?}");
            assert_eq!(send("k1"), (201, true), "wait: {wait:?}");
            let entry = cache.peek(&Key::without_tenant("POST /orders", "k1").unwrap()).unwrap();
            assert!(matches!(entry.state, EntryState::Completed(_)));
            let kept = entry.correlation_id.expect("the entry keeps the trace id");
            assert_eq!(kept.as_str(), "4bf92f3577b34da6a3ce929d0e0e4736");
            let read = reads.load(Ordering::SeqCst);
            if cfg!(any(feature = "metrics", feature = "tracing")) {
                assert_eq!(read, 3, "read for every request it reports");
            } else {
                // The first execution's, and the first replay's: a result just packed is
                // shared under the write lock (see `Cache::replay_hit`); never again.
                assert_eq!(read, 2, "wait: {wait:?}");
            }
        }
    }

    /// A gRPC answer's body: a message, then the trailers (none in a trailers-only one).
    struct GrpcBody {
        data: Option<Bytes>,
        trailers: Option<http::HeaderMap>,
    }

    impl Body for GrpcBody {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
            if let Some(data) = self.data.take() {
                return Poll::Ready(Some(Ok(http_body::Frame::data(data))));
            }
            Poll::Ready(self.trailers.take().map(|t| Ok(http_body::Frame::trailers(t))))
        }
    }

    /// How a gRPC handler answers: a status in the trailers, in the headers
    /// (trailers-only), or none at all.
    #[derive(Clone, Copy)]
    enum GrpcAnswer {
        Trailers(u32),
        TrailersOnly(u32),
        NoStatus,
    }

    /// A gRPC handler: HTTP 200 with the answers it is given in turn, counting its runs.
    #[derive(Clone)]
    struct GrpcHandler {
        answers: Arc<std::sync::Mutex<Vec<GrpcAnswer>>>,
        runs: Arc<AtomicUsize>,
    }

    impl GrpcHandler {
        fn new(answers: &[GrpcAnswer]) -> GrpcHandler {
            GrpcHandler {
                answers: Arc::new(std::sync::Mutex::new(answers.to_vec())),
                runs: Arc::new(AtomicUsize::new(0)),
            }
        }
    }

    impl<B> Service<Request<B>> for GrpcHandler {
        type Response = Response<GrpcBody>;
        type Error = Infallible;
        type Future = Ready<Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<B>) -> Self::Future {
            self.runs.fetch_add(1, Ordering::SeqCst);
            let status = |code: u32| {
                let mut map = http::HeaderMap::new();
                map.insert("grpc-status", HeaderValue::from(code));
                map
            };
            let message = Bytes::from_static(b"\0\0\0\0\x02ok");
            let (data, trailers, headers) = match self.answers.lock().unwrap().remove(0) {
                GrpcAnswer::Trailers(code) => (Some(message), Some(status(code)), None),
                GrpcAnswer::TrailersOnly(code) => (None, None, Some(status(code))),
                GrpcAnswer::NoStatus => (Some(message), None, None),
            };
            let mut response = Response::new(GrpcBody { data, trailers });
            let content_type = HeaderValue::from_static("application/grpc");
            response.headers_mut().insert(http::header::CONTENT_TYPE, content_type);
            response.headers_mut().extend(headers.unwrap_or_default());
            std::future::ready(Ok(response))
        }
    }

    /// A unary call's answer through `service`: its headers, body and trailers.
    fn grpc_call<S>(
        runtime: &tokio::runtime::Runtime,
        service: &mut S,
        path: &str,
        key: Option<&str>,
        message: &'static str,
    ) -> (http::HeaderMap, Bytes, Option<http::HeaderMap>)
    where
        S: Service<Request<Full<Bytes>>, Response = Response<LayerBody<GrpcBody>>>,
        S::Error: std::fmt::Debug,
    {
        let mut request = Request::post(path).header("content-type", "application/grpc");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let request = request.body(Full::new(Bytes::from(message))).unwrap();
        let response = runtime.block_on(service.call(request)).unwrap();
        assert_eq!(response.status(), 200, "gRPC answers are HTTP 200");
        let (parts, body) = response.into_parts();
        let collected = runtime.block_on(body.collect()).unwrap();
        let trailers = collected.trailers().cloned();
        (parts.headers, collected.to_bytes(), trailers)
    }

    /// The `grpc-status` of an answer: its trailers', or its headers'.
    fn grpc_status(headers: &http::HeaderMap, trailers: &Option<http::HeaderMap>) -> String {
        let value = trailers.as_ref().and_then(|t| t.get("grpc-status"));
        let value = value.or_else(|| headers.get("grpc-status")).expect("a grpc-status");
        value.to_str().unwrap().to_owned()
    }

    const CREATE: &str = "/orders.v1.Orders/Create";

    /// A transient status releases the key (the retry runs again) though it is HTTP 200;
    /// a deterministic one is kept and replayed with its trailers, byte for byte, whether
    /// it came in the trailers or alone in the headers; an answer with no status is not
    /// kept.
    #[test]
    fn over_grpc_the_status_decides_what_is_kept() {
        use GrpcAnswer::*;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let handler = GrpcHandler::new(&[
            Trailers(14),
            Trailers(0),
            TrailersOnly(3),
            NoStatus,
            Trailers(13),
            Trailers(5),
        ]);
        let layer = IdempotencyLayer::new(Cache::builder().build().unwrap())
            .grpc(crate::layer::Grpc::new());
        let mut service = layer.layer(handler.clone());
        let mut call = |key: &str| grpc_call(&runtime, &mut service, CREATE, Some(key), "m");
        let runs = || handler.runs.load(Ordering::SeqCst);

        let (h, _, t) = call("k1");
        assert_eq!((grpc_status(&h, &t), runs()), ("14".to_owned(), 1), "UNAVAILABLE answered");
        let (h, body, t) = call("k1");
        assert_eq!((grpc_status(&h, &t), runs()), ("0".to_owned(), 2), "released: ran again");
        let (h2, body2, t2) = call("k1");
        assert_eq!(runs(), 2, "OK kept");
        assert_eq!(h2["idempotent-replayed"], "true");
        assert_eq!((body2, t2.clone()), (body, t), "replayed byte for byte, trailers too");

        let (h, _, t) = call("k2");
        assert_eq!((grpc_status(&h, &t), runs()), ("3".to_owned(), 3));
        let (h, body, t) = call("k2");
        assert_eq!((grpc_status(&h, &t), runs()), ("3".to_owned(), 3), "trailers-only kept");
        assert_eq!(h["idempotent-replayed"], "true");
        assert!(body.is_empty() && t.is_none());

        call("k3");
        let (h, _, t) = call("k3");
        assert_eq!((grpc_status(&h, &t), runs()), ("13".to_owned(), 5), "no status: ran again");
        let (h, _, t) = call("k3");
        assert_eq!((grpc_status(&h, &t), runs()), ("5".to_owned(), 6), "INTERNAL released");
        let (_, _, _) = call("k3");
        assert_eq!(runs(), 6, "NOT_FOUND kept");
    }

    /// Refusals are gRPC statuses, with the refusal's code as metadata; a streaming
    /// method is passed through unguarded, with no key.
    #[test]
    fn over_grpc_refusals_are_statuses_and_streams_pass() {
        use GrpcAnswer::*;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let handler = GrpcHandler::new(&[Trailers(0), Trailers(0), Trailers(0)]);
        let grpc = crate::layer::Grpc::new().unguarded(["/orders.v1.Orders/Watch"]);
        let layer = IdempotencyLayer::new(Cache::builder().build().unwrap()).grpc(grpc);
        let mut service = layer.layer(handler.clone());

        let (h, body, t) = grpc_call(&runtime, &mut service, CREATE, None, "m");
        assert_eq!(grpc_status(&h, &t), "3", "no key: INVALID_ARGUMENT");
        assert_eq!(h["idempotency-refusal"], "missing_idempotency_key");
        assert_eq!(h["content-type"], "application/grpc");
        assert!(body.is_empty() && t.is_none(), "trailers-only");
        assert!(h.contains_key("grpc-message"));

        grpc_call(&runtime, &mut service, CREATE, Some("k1"), "one");
        let (h, _, t) = grpc_call(&runtime, &mut service, CREATE, Some("k1"), "another");
        assert_eq!(grpc_status(&h, &t), "9", "reused key: FAILED_PRECONDITION");
        assert_eq!(h["idempotency-refusal"], "idempotency_key_reused");

        for _ in 0..2 {
            let (h, _, t) = grpc_call(&runtime, &mut service, "/orders.v1.Orders/Watch", None, "w");
            assert_eq!(grpc_status(&h, &t), "0");
            assert!(!h.contains_key("idempotent-replayed"));
        }
        assert_eq!(handler.runs.load(Ordering::SeqCst), 3, "k1 once, the stream twice");
    }

    /// Without `grpc`, HTTP 200 is kept whatever its `grpc-status` (what the layer did
    /// before it spoke gRPC, and why it must be told).
    #[test]
    fn over_http_a_grpc_status_is_not_read() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let handler = GrpcHandler::new(&[GrpcAnswer::Trailers(14)]);
        let mut service =
            IdempotencyLayer::new(Cache::builder().build().unwrap()).layer(handler.clone());
        grpc_call(&runtime, &mut service, CREATE, Some("k1"), "m");
        let (h, _, _) = grpc_call(&runtime, &mut service, CREATE, Some("k1"), "m");
        assert_eq!(h["idempotent-replayed"], "true");
    }

    /// A handler that answers 201, counting its runs and the body sizes it was handed.
    #[derive(Clone, Default)]
    struct Counting {
        bodies: Arc<std::sync::Mutex<Vec<u64>>>,
    }

    impl<B: Body> Service<Request<B>> for Counting {
        type Response = Response<Full<Bytes>>;
        type Error = Infallible;
        type Future = Ready<Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: Request<B>) -> Self::Future {
            let size = request.body().size_hint().exact().unwrap_or(u64::MAX);
            self.bodies.lock().unwrap().push(size);
            let created = Response::builder().status(201).body(Full::new(Bytes::new()));
            std::future::ready(Ok(created.expect("a valid response")))
        }
    }

    /// `key=K;rest`: the key is what follows `key=` up to `;`.
    fn key_field(_: &Parts, body: &[u8]) -> Result<Option<Vec<u8>>, String> {
        let Some(rest) = body.strip_prefix(b"key=") else { return Ok(None) };
        let key = rest.split(|&b| b == b';').next().unwrap_or_default();
        if key.is_empty() {
            return Err("an empty key field".into());
        }
        Ok(Some(key.to_vec()))
    }

    /// The key read from a body field instead of the header: a repeat is replayed, the
    /// header is not read, no key is refused (or passed on, body whole, when not
    /// required), a malformed one refused with the closure's reason.
    #[test]
    fn a_key_read_from_the_body_guards_as_the_header_does() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        for required in [true, false] {
            let handler = Counting::default();
            let layer = IdempotencyLayer::new(Cache::builder().build().unwrap())
                .key_from(key_field)
                .require_key(required);
            let mut service = layer.layer(handler.clone());
            let mut send = |body: &'static str| {
                let request = Request::post("/orders")
                    .header("idempotency-key", "from-the-header")
                    .body(Full::new(Bytes::from(body)))
                    .unwrap();
                let response = runtime.block_on(service.call(request)).unwrap();
                let detail = runtime.block_on(response.into_body().collect()).unwrap().to_bytes();
                String::from_utf8(detail.to_vec()).unwrap()
            };
            assert_eq!(send("key=k1;a"), "");
            assert_eq!(send("key=k1;a"), "", "replayed");
            assert_eq!(send("key=k2;a"), "", "another key from the body, same header");
            assert!(send("key=;a").contains("an empty key field"), "invalid, with the reason");
            let missing = send("no key here");
            assert_eq!(missing.contains("missing_idempotency_key"), required, "{missing}");
            let bodies = handler.bodies.lock().unwrap().clone();
            let expected: &[u64] = if required { &[8, 8] } else { &[8, 8, 11] };
            assert_eq!(bodies, expected, "k1 once, k2 once (and the unguarded one, whole)");
        }
    }

    /// The fingerprint over a selection of the body: a repeat differing elsewhere is a
    /// replay, one differing in the selection a reused key.
    #[test]
    fn the_fingerprint_covers_what_fingerprint_body_selects() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let handler = Counting::default();
        let layer = IdempotencyLayer::new(Cache::builder().build().unwrap())
            .fingerprint_body(|_, body| body.split(|&b| b == b'\n').next().unwrap().to_vec());
        let mut service = layer.layer(handler.clone());
        let mut send = |body: &'static str| {
            let request = Request::post("/orders")
                .header("idempotency-key", "k1")
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            runtime.block_on(service.call(request)).unwrap().status().as_u16()
        };
        assert_eq!(send("amount=5\nsent-at=1"), 201);
        assert_eq!(send("amount=5\nsent-at=2"), 201, "the same selection: replayed");
        assert_eq!(send("amount=6\nsent-at=1"), 422, "another selection: a reused key");
        assert_eq!(handler.bodies.lock().unwrap().len(), 1);
    }
}
