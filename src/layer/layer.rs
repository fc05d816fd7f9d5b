//! [`IdempotencyLayer`]: the builder of the layer's settings, and the `Layer` that wraps a
//! service in [`Idempotency`](super::Idempotency).
//!
//! Invariant: each builder method sets one setting and checks nothing it cannot check
//! alone; the settings it builds are shared, fixed, by every service it wraps
//! (`settings.rs`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderName, CONTENT_TYPE};
use http::request::Parts;
use http::{Method, StatusCode};

use super::backend::Records;
use super::decision::DecisionEvent;
use super::grpc::Grpc;
use super::service::Idempotency;
use super::settings::{Settings, DEFAULT_MAX_REQUEST_BODY};
use crate::{Cache, CorrelationId};

/// A tower `Layer` wrapping a service in [`Idempotency`]. Cheap to clone.
#[derive(Clone)]
pub struct IdempotencyLayer {
    settings: Arc<Settings>,
}

impl IdempotencyLayer {
    /// A layer over `cache` with the defaults: POST and PATCH require a key; 1 MiB
    /// request bodies; `Content-Type` in the fingerprint; no waiting (409 at once); scope
    /// = method + path; one tenant; 2xx and 4xx stored; `Set-Cookie` never replayed.
    ///
    /// A request's entry is filed under `Key::new(scope, tenant, client_key)`
    /// ([`Key::without_tenant`](crate::Key::without_tenant) with one tenant), the scope
    /// being `"POST /orders"` by default: the method, one space, and the path as this
    /// service sees it (under a router nested at a prefix, the path after it: two nests
    /// with the same inner paths share keys unless [`scope`](Self::scope) names them
    /// apart). So `Cache::peek(&Key::without_tenant("POST /orders", "k1")?)` shows what
    /// the layer holds for a client's `Idempotency-Key: k1`.
    pub fn new(cache: Cache) -> Self {
        Self::over(Records::Memory(cache))
    }

    /// A layer over a [`Tiered`](crate::store::Tiered) store (the cache in front of a
    /// durable store), with [`new`](IdempotencyLayer::new)'s defaults: exactly-once
    /// across processes and restarts. Features `tower` and `store`, and a store's crate
    /// (`idemcache-sqlite`, `idemcache-postgres`, `idemcache-redis`).
    ///
    /// What changes against a cache alone: a duplicate executing in another process is
    /// looked at again every 10 ms (doubling to 250 ms) while [`wait`](Self::wait)ing, as
    /// a store cannot tell a waiter when a key settles; the store unreachable is 503
    /// `idempotency_store_unavailable` (never executed unguarded); the lease is the
    /// `Tiered`'s, renewed in the store while the execution runs (a renewal the store fails
    /// is tried again at the next beat); a `Tiered` whose lease or TTLs the store would
    /// refuse answers 500 before anything runs; and a completion the store fails to
    /// record is answered to its client and marked UNKNOWN if the store answers again,
    /// else its record stays PROCESSING until its lease lapses (keep a `UNIQUE` backstop
    /// in your own tables for that window). A store that never answers holds its request
    /// (and key) as long: give its client or pool a timeout.
    #[cfg(feature = "store")]
    pub fn tiered<S: crate::store::Store>(tiered: crate::store::Tiered<S>) -> Self {
        Self::over(Records::Durable(Arc::new(tiered)))
    }

    /// A layer in one-commit mode over `store`, with [`new`](IdempotencyLayer::new)'s
    /// defaults: per first execution, one transaction on the store's database holds the
    /// claim, the handler's business change and the recorded response, and commits once
    /// (the seeds' design). The handler finds the transaction in its request's extensions
    /// ([`HeldTransaction`](super::HeldTransaction)) and writes its change there. Features
    /// `tower` and `store`, and a SQL store's crate (`idemcache-postgres`,
    /// `idemcache-sqlx`'s `PgStore`).
    ///
    /// What changes against [`tiered`](Self::tiered):
    /// - **A crash or a rollback leaves nothing behind**: the claim was never committed,
    ///   so nothing lapses, is taken over or needs reconciling; a retry runs again.
    /// - **A response is answered only once committed**: a transaction that fails to
    ///   commit (or whose lease, [`OneCommit::with_lease`](crate::store::OneCommit::with_lease),
    ///   ran out first) answers 503 `idempotency_store_unavailable`, and nothing the
    ///   handler wrote happened.
    /// - **A duplicate waits on the record's row** in the database until the first
    ///   transaction ends, at most the layer's [`wait`](Self::wait) (without one, about
    ///   a millisecond), then replays what committed, runs if nothing did, or answers
    ///   409 `request_in_progress`. Each waiting duplicate holds a pooled connection
    ///   while it waits, and the wait for a connection is the pool's (its timeout), not
    ///   the layer's: many duplicates of one slow request can take the whole pool, and
    ///   requests for other keys wait for it too. Keep the wait short and the pool
    ///   larger than the duplicates you expect at once. A claim of the store's own (a
    ///   process running [`tiered`](Self::tiered) over the same table) of a key whose
    ///   transaction is open waits for that transaction, whatever its own settings.
    /// - **The lease decides whether a transaction may commit**, not how long it runs:
    ///   a hung handler holds its row and connection until it ends. Bound the handler
    ///   with a timeout inside this layer.
    /// - **A cache in front only if you give it one**
    ///   ([`OneCommit::with_cache`](crate::store::OneCommit::with_cache)): it replays
    ///   what committed from memory; without it every repeat is a transaction.
    /// - **Only effects inside the database belong in it**: the transaction, a
    ///   connection and the row lock are held for the whole execution, so a call to
    ///   another service inside it holds them as long and duplicates queue behind it;
    ///   and an outcome marked [`OutcomeUnknown`](super::OutcomeUnknown) rolls back
    ///   (nothing outside the transaction is recorded). Use [`tiered`](Self::tiered) there.
    ///
    /// `docs/commit-boundary.md` compares the two modes with their figures.
    #[cfg(feature = "store")]
    pub fn one_commit<S: crate::store::TransactionalStore>(
        store: crate::store::OneCommit<S>,
    ) -> Self {
        Self::over(Records::Durable(Arc::new(store)))
    }

    fn over(records: Records) -> Self {
        #[cfg(feature = "metrics")]
        let metrics = Arc::new(super::metrics::LayerMetrics::new(records.name()));
        IdempotencyLayer {
            settings: Arc::new(Settings {
                records,
                methods: vec![Method::POST, Method::PATCH],
                require_key: true,
                max_request_body: DEFAULT_MAX_REQUEST_BODY,
                fingerprint_headers: vec![CONTENT_TYPE],
                wait: None,
                scope: Arc::new(method_and_path),
                tenant: None,
                store: Arc::new(|status: StatusCode| !status.is_server_error()),
                replay_set_cookie: false,
                correlation_id: Arc::new(|parts: &Parts| super::trace_id(&parts.headers)),
                on_decision: None,
                grpc: None,
                key_from: None,
                fingerprint_body: None,
                times: Arc::default(),
                #[cfg(feature = "metrics")]
                metrics,
            }),
        }
    }

    fn settings(&mut self) -> &mut Settings {
        Arc::make_mut(&mut self.settings)
    }

    /// The methods the layer guards (others pass straight through). Default POST, PATCH.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.settings().methods = methods.into_iter().collect();
        self
    }

    /// Whether a guarded method without a key is refused with 400 (default `true`);
    /// `false` lets it through unguarded, before anything else is asked of it (no
    /// tenant is needed).
    pub fn require_key(mut self, required: bool) -> Self {
        self.settings().require_key = required;
        self
    }

    /// The largest request body buffered for the fingerprint; larger ones get 413.
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.settings().max_request_body = bytes;
        self
    }

    /// The request headers that are part of the fingerprint (default `Content-Type`).
    pub fn fingerprint_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.settings().fingerprint_headers = names.into_iter().collect();
        self
    }

    /// Wait up to `timeout` for a duplicate's first execution to finish, then replay it
    /// (or take the key over if its owner's lease lapses), instead of answering 409 at
    /// once. Waiting holds no thread ([`Cache::claim_wait_async`]).
    pub fn wait(mut self, timeout: Duration) -> Self {
        self.settings().wait = Some(timeout);
        self
    }

    /// How a request's scope is named (default: method and path). With axum, name it by
    /// the matched route (axum's `matched-path` feature, on by default), so `/orders/1`
    /// and `/orders/2` share nothing but their route, and the metrics' `scope` label names
    /// routes, never users' paths:
    /// `.scope(|p| format!("{} {}", p.method, p.extensions.get::<MatchedPath>().map_or("", |m| m.as_str())))`.
    pub fn scope(mut self, scope: impl Fn(&Parts) -> String + Send + Sync + 'static) -> Self {
        self.settings().scope = Arc::new(scope);
        self
    }

    /// Who the request is from (an authenticated user, an API key's account): keys are
    /// per tenant. `None` from `tenant` answers 401. Without it, all requests share one.
    pub fn tenant(
        mut self,
        tenant: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.settings().tenant = Some(Arc::new(tenant));
        self
    }

    /// Which responses are stored for replay (the rest release the key so a retry runs
    /// again). Default: everything but 5xx. In gRPC mode ([`grpc`](Self::grpc)) an answer
    /// is kept by its gRPC status ([`Grpc::store_when`]); this one decides only for an
    /// answer whose body failed mid-way.
    pub fn store_when(
        mut self,
        store: impl Fn(StatusCode) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.settings().store = Arc::new(store);
        self
    }

    /// Speak gRPC (a tonic server, or any gRPC service over tower): keep answers by their
    /// gRPC status, not their HTTP status (always 200), and answer refusals as gRPC
    /// statuses a client can act on (see [`Grpc`] for both, and which methods stream).
    /// The key is the `idempotency-key` metadata; the fingerprint covers the request
    /// message's bytes. Every call is guarded whatever its HTTP method (a gRPC server
    /// serves a call sent with `PUT` as one sent with `POST`): [`methods`](Self::methods)
    /// does not apply; [`Grpc::unguarded`] names what passes. What is kept is
    /// [`Grpc::store_when`]'s to say, not [`store_when`](Self::store_when)'s. The other
    /// settings apply as over HTTP, in any order, their refusals answered as gRPC
    /// statuses ([`Grpc`]'s table: `UNAUTHENTICATED` where [`tenant`](Self::tenant) says
    /// 401, `INVALID_ARGUMENT` for a missing key, `RESOURCE_EXHAUSTED` over
    /// [`max_request_body`](Self::max_request_body), `ABORTED` where [`wait`](Self::wait)
    /// says 409); [`require_key(false)`](Self::require_key) lets a call without a key
    /// through unguarded.
    ///
    /// ```
    /// use idemcache::layer::{Grpc, GrpcCode, IdempotencyLayer};
    ///
    /// let layer = IdempotencyLayer::new(idemcache::Cache::builder().build()?).grpc(
    ///     Grpc::new()
    ///         .unguarded(["/orders.v1.Orders/Watch", "/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"])
    ///         .store_when(|code| code.is_deterministic() && code != GrpcCode::NotFound),
    /// );
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn grpc(mut self, grpc: Grpc) -> Self {
        self.settings().grpc = Some(grpc);
        self
    }

    /// Where the client's key comes from, when it is not the `Idempotency-Key` header (or
    /// `idempotency-key` gRPC metadata): a field of the request, read from its head and
    /// its body (read whole first, up to [`max_request_body`](Self::max_request_body)).
    /// `Ok(None)`: the request has none (refused, or passed on unguarded without
    /// [`require_key`](Self::require_key)); `Err(why)`: a malformed one (refused as an
    /// invalid key, with `why` as the detail). The header is then not read: fall back to it
    /// in the closure ([`client_key`](super::client_key)) if both may carry it. A JSON
    /// field, with the application's own `serde_json`:
    ///
    /// ```ignore
    /// layer.key_from(|_, body| {
    ///     let request: serde_json::Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    ///     Ok(request["request_id"].as_str().map(|id| id.as_bytes().to_vec()))
    /// })
    /// ```
    ///
    /// A gRPC message's field (AEP-155's `request_id`), with the application's `prost`
    /// message: a unary request is one gRPC frame, a 5-byte prefix and the message:
    ///
    /// ```ignore
    /// layer.key_from(|_, body| {
    ///     let message = body.get(5..).ok_or("not a gRPC message")?;
    ///     let request = CreateOrder::decode(message).map_err(|e| e.to_string())?;
    ///     Ok(Some(request.request_id.into_bytes()).filter(|id| !id.is_empty()))
    /// })
    /// ```
    ///
    /// It runs before the key is claimed: a panic in it fails the request and holds
    /// nothing.
    pub fn key_from(
        mut self,
        key: impl Fn(&Parts, &[u8]) -> Result<Option<Vec<u8>>, String> + Send + Sync + 'static,
    ) -> Self {
        self.settings().key_from = Some(Arc::new(key));
        self
    }

    /// What of the body the fingerprint covers (default: all of it). A request sent
    /// again with the same key must match the first one's fingerprint, or it is refused as
    /// a reused key: when harmless differences (a client timestamp, a field's order, the
    /// key itself in the body) must not count, return only what must match, in a
    /// canonical form. Method, path, query and the
    /// [`fingerprint_headers`](Self::fingerprint_headers) are still covered. It runs
    /// before the key is claimed: a panic in it fails the request and holds nothing.
    ///
    /// ```
    /// # let layer = idemcache::layer::IdempotencyLayer::new(idemcache::Cache::builder().build()?);
    /// // The first line of the body alone (say the rest is a client's trace).
    /// let layer = layer.fingerprint_body(|_, body| {
    ///     body.split(|&b| b == b'\n').next().unwrap_or_default().to_vec()
    /// });
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fingerprint_body(
        mut self,
        select: impl Fn(&Parts, &[u8]) -> Vec<u8> + Send + Sync + 'static,
    ) -> Self {
        self.settings().fingerprint_body = Some(Arc::new(select));
        self
    }

    /// Whether `Set-Cookie` is stored and replayed (default `false`: a cookie replayed to
    /// whoever retries with the key would hand over a session).
    pub fn replay_set_cookie(mut self, replay: bool) -> Self {
        self.settings().replay_set_cookie = replay;
        self
    }

    /// Where a request's correlation id comes from: what joins its decision (the
    /// [`on_decision`](Self::on_decision) hook, the `tracing` events and span, and the
    /// key's entry in the cache or record in a durable store) to the request's own logs
    /// and trace. Over the cache alone with no hook and neither feature on, it is read only
    /// for a claim that may acquire the key, so a replay does not pay for it (except the
    /// first replay of a result just stored, which only a claim can share). Default: the
    /// trace id of a W3C `traceparent` header ([`trace_id`](super::trace_id)); none if it
    /// has none or a malformed one (a request is never refused for its correlation id). A
    /// request id header instead:
    ///
    /// ```
    /// # let layer = idemcache::layer::IdempotencyLayer::new(idemcache::Cache::builder().build()?);
    /// use idemcache::CorrelationId;
    ///
    /// let layer = layer.correlation_id(|request| {
    ///     let id = request.headers.get("x-request-id")?;
    ///     CorrelationId::new(id.as_bytes()).ok()
    /// });
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn correlation_id(
        mut self,
        correlation_id: impl Fn(&Parts) -> Option<CorrelationId> + Send + Sync + 'static,
    ) -> Self {
        self.settings().correlation_id = Arc::new(correlation_id);
        self
    }

    /// Calls `hook` once for every guarded request that reaches its claim, with its
    /// final [`Decision`](super::Decision), key, correlation id and times: for the
    /// application's own logging or metrics (see [`DecisionEvent`]). It runs on the
    /// request's task before its answer is sent: keep it short, and hand slow work to a
    /// channel. A panic in it is caught. Without a hook nothing is called and no clock
    /// is read for it.
    ///
    /// ```
    /// # let layer = idemcache::layer::IdempotencyLayer::new(idemcache::Cache::builder().build()?);
    /// use idemcache::layer::Decision;
    ///
    /// let layer = layer.on_decision(|event| {
    ///     if event.decision == Decision::Mismatch {
    ///         eprintln!("key reused: {:?} (request {:?})", event.key, event.correlation_id);
    ///     }
    /// });
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_decision(
        mut self,
        hook: impl Fn(&DecisionEvent<'_>) + Send + Sync + 'static,
    ) -> Self {
        self.settings().on_decision = Some(Arc::new(hook));
        self
    }

    /// Sets the gauges `idemcache_entries`, `idemcache_bytes` (the cache's) and
    /// `idemcache_unknown` (live UNKNOWN records: the store's, over a durable store) every
    /// `every`, for as long as it runs: spawn it (`tokio::spawn(layer.report_gauges(..))`)
    /// beside your server. Reading them costs the cache's locks and a store query, which
    /// is why no request pays for them. A store that fails a count leaves the gauge as it
    /// was until the next. Feature `metrics` (see the [metrics table](super#metrics)).
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn report_gauges(
        &self,
        every: std::time::Duration,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let records = self.settings.records.clone();
        let store = self.settings.metrics.store();
        async move {
            let mut ticks = tokio::time::interval(every.max(std::time::Duration::from_millis(1)));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut unknown = 0;
            loop {
                ticks.tick().await;
                let stats = records.cache().map(crate::Cache::stats).unwrap_or_default();
                if let Some(counted) =
                    records.count_unknown(super::metrics::UNKNOWN_GAUGE_LIMIT).await
                {
                    unknown = counted;
                }
                super::metrics::gauges(store, stats.entries, stats.bytes, unknown);
            }
        }
    }
}

/// The default scope: `"POST /orders"`, built without the formatting machinery (every
/// guarded request builds one).
fn method_and_path(parts: &Parts) -> String {
    let (method, path) = (parts.method.as_str(), parts.uri.path());
    let mut scope = String::with_capacity(method.len() + 1 + path.len());
    scope.push_str(method);
    scope.push(' ');
    scope.push_str(path);
    scope
}

impl<S> tower_layer::Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Idempotency<S> {
        Idempotency::new(inner, self.settings.clone())
    }
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.settings.fmt(f)
    }
}
