//! An HTTP layer ([`tower`](https://docs.rs/tower) `Layer`) that makes unsafe requests
//! idempotent by their `Idempotency-Key` header, on top of a [`Cache`] (one process) or of
//! a [`Tiered`](crate::store::Tiered) durable store (several processes, restarts).
//! Feature `tower`.
//!
//! It follows the IETF httpapi draft "The Idempotency-Key HTTP Header Field" and payment
//! APIs' practice:
//!
//! | the request | the answer |
//! |---|---|
//! | a configured method (default POST, PATCH) without a key | 400 `missing_idempotency_key` |
//! | a key that is not one sf-string (with well-formed parameters, if any) or bare token of visible ASCII | 400 `invalid_idempotency_key` |
//! | no tenant (or an empty one), when a tenant extractor is set | 401 `unauthenticated` |
//! | a scope (default: method and path) and tenant over 1024 bytes together | 414 `request_scope_too_long` |
//! | a body over the limit (`Content-Length` first, then as read) | 413 `request_body_too_large` |
//! | first of its key | the handler runs; 2xx and 4xx are stored, 5xx and errors release the key |
//! | a repeat of a stored response | status, headers and body replayed, plus `Idempotent-Replayed: true` and `Idempotency-Expires` |
//! | a repeat while the first executes | 409 `request_in_progress` with `Retry-After` (when the result should be ready: below), or, with [`IdempotencyLayer::wait`], the replay once it finishes |
//! | the same key with a different request | 422 `idempotency_key_reused` |
//! | a repeat of a request whose response was too large to keep | 409 `response_not_kept` (never a second execution) |
//! | a repeat of a request whose outcome is unknown | 409 `outcome_unknown` |
//! | the cache full of in-flight work | 503 `idempotency_cache_full` with `Retry-After` (never executed unguarded) |
//! | over a durable store ([`IdempotencyLayer::tiered`]): the store unreachable | 503 `idempotency_store_unavailable` with `Retry-After` (never executed unguarded) |
//! | over a durable store: the key's record unreadable ([`StoreError::Corrupt`](crate::store::StoreError::Corrupt)) | 500 `idempotency_record_corrupt` (never executed; retrying will not help) |
//!
//! Refusals are `application/problem+json` (RFC 9457) with a `code` member.
//!
//! The request fingerprint is method, path and query, selected headers (default
//! `Content-Type`) and the body; the body is buffered (up to
//! [`IdempotencyLayer::max_request_body`]) to be hashed and handed whole to the handler.
//! The key is scoped by method and route ([`IdempotencyLayer::scope`]) and by tenant
//! ([`IdempotencyLayer::tenant`]), so two users' equal keys never meet.
//!
//! **The handler runs in a spawned tokio task**, so a client that disconnects mid-request
//! neither wedges the key nor loses a completion: the handler finishes, its response is
//! stored, and the client's retry gets the replay. (Over a durable store the claim runs
//! in that task too: a store commits a claim before its answer arrives.)
//!
//! **An execution is the handler and its response body.** Until the response is read
//! whole and stored, the lease is renewed every third of its length (between frames
//! too, so a body whose frames are always ready is renewed), so neither a slow handler
//! nor a body that streams (or is proxied) for longer than the lease is taken over and
//! run twice. (An execution that never finishes therefore holds its key: bound it with
//! a timeout inside this layer. A handler that blocks its thread without awaiting
//! stops renewal with it: run blocking work with `spawn_blocking`.) A handler or a body
//! that panics is caught, and its claim settled as the cache's
//! [`DropPolicy`](crate::DropPolicy) settles a dropped guard (the default releases the
//! key; over a store, in the store too): the answer is a 500.
//!
//! **Responses are buffered whole** to be stored, trailers included, and answered as a
//! [`LayerBody`]. A response whose body fails mid-way marks the key UNKNOWN (its effect
//! may have happened): 409 `outcome_unknown` until the authority is checked; unless it
//! is one that is not stored (a 5xx), which releases the key as any 5xx does. A
//! response with trailers is answered with no exact length, so an HTTP/1.1 server sends
//! it chunked (trailers cannot follow a `Content-Length` body), and a replay announces
//! its trailers in a `Trailer` field. The fields never replayed (`Set-Cookie` unless
//! [`IdempotencyLayer::replay_set_cookie`], `WWW-Authenticate`, `Date`, framing and
//! hop-by-hop fields, those the response's `Connection` names included) are left out
//! of stored trailers as of stored headers.
//!
//! **Any request body** of `Bytes` frames is accepted (axum's `Body`, hyper's
//! `Incoming`, `Full`, ...): your service receives `Request<LayerBody<B>>`, the body read
//! whole when the layer guarded the request, else the client's own, unread. axum's
//! `Router` takes any such body, so `route_layer(layer)` needs nothing else.
//!
//! **`Retry-After` on a 409** is when the result should be ready: the mean of the
//! scope's recent executions in this process (each new one weighs a quarter), at least
//! one second (a scope with no finished execution yet gets one second), never past the
//! holder's lease end. Up to 1,024 scopes are tracked: name scopes by route, not by
//! raw path.
//!
//! This module uses the core's public API only, like any user of the crate.
//!
//! ```
//! use idemcache::layer::IdempotencyLayer;
//! use idemcache::Cache;
//!
//! let cache = Cache::builder().build()?;
//! let layer = IdempotencyLayer::new(cache)
//!     .tenant(|request| {
//!         let auth = request.headers.get("authorization")?.to_str().ok()?;
//!         auth.strip_prefix("Bearer ").map(str::to_owned)
//!     })
//!     .wait(std::time::Duration::from_secs(5));
//! // axum: Router::new().route("/orders", post(create)).route_layer(layer)
//! # let _ = layer;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod body;
mod header;
mod problem;
mod record;
mod records;
mod renewal;
mod service;
mod timing;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderName, CONTENT_TYPE};
use http::request::Parts;
use http::{Method, StatusCode};

pub use body::LayerBody;
pub use header::{client_key, KeyHeaderError, IDEMPOTENCY_KEY};
pub use service::Idempotency;

use crate::Cache;
use records::Records;

/// Response header set on every replay.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// Response header set on every replay: when the stored response expires (an HTTP date).
pub const IDEMPOTENCY_EXPIRES: &str = "idempotency-expires";

/// The default limit on a request body the layer buffers: 1 MiB.
pub const DEFAULT_MAX_REQUEST_BODY: usize = 1 << 20;

type ScopeFn = dyn Fn(&Parts) -> String + Send + Sync;
type TenantFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;
type StoreFn = dyn Fn(StatusCode) -> bool + Send + Sync;

/// A tower `Layer` wrapping a service in [`Idempotency`]. Cheap to clone.
#[derive(Clone)]
pub struct IdempotencyLayer {
    settings: Arc<Settings>,
}

#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) records: Records,
    pub(crate) methods: Vec<Method>,
    pub(crate) require_key: bool,
    pub(crate) max_request_body: usize,
    pub(crate) fingerprint_headers: Vec<HeaderName>,
    pub(crate) wait: Option<Duration>,
    pub(crate) scope: Arc<ScopeFn>,
    pub(crate) tenant: Option<Arc<TenantFn>>,
    pub(crate) store: Arc<StoreFn>,
    pub(crate) replay_set_cookie: bool,
    /// Shared by every clone: the scopes' recent execution times, for `Retry-After`.
    pub(crate) times: Arc<timing::ExecutionTimes>,
}

impl IdempotencyLayer {
    /// A layer over `cache` with the defaults: POST and PATCH require a key; 1 MiB
    /// request bodies; `Content-Type` in the fingerprint; no waiting (409 at once); scope
    /// = method + path; one tenant; 2xx and 4xx stored; `Set-Cookie` never replayed.
    pub fn new(cache: Cache) -> Self {
        Self::over(Records::Memory(cache))
    }

    /// A layer over a [`Tiered`](crate::store::Tiered) store (the cache in front of a
    /// durable store), with [`new`](IdempotencyLayer::new)'s defaults: exactly-once
    /// across processes and restarts. Feature `store` (with a store's feature).
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

    fn over(records: Records) -> Self {
        IdempotencyLayer {
            settings: Arc::new(Settings {
                records,
                methods: vec![Method::POST, Method::PATCH],
                require_key: true,
                max_request_body: DEFAULT_MAX_REQUEST_BODY,
                fingerprint_headers: vec![CONTENT_TYPE],
                wait: None,
                scope: Arc::new(|parts: &Parts| format!("{} {}", parts.method, parts.uri.path())),
                tenant: None,
                store: Arc::new(|status: StatusCode| !status.is_server_error()),
                replay_set_cookie: false,
                times: Arc::default(),
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
    /// the matched route, so `/orders/1` and `/orders/2` share nothing but their route:
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
    /// again). Default: everything but 5xx.
    pub fn store_when(
        mut self,
        store: impl Fn(StatusCode) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.settings().store = Arc::new(store);
        self
    }

    /// Whether `Set-Cookie` is stored and replayed (default `false`: a cookie replayed to
    /// whoever retries with the key would hand over a session).
    pub fn replay_set_cookie(mut self, replay: bool) -> Self {
        self.settings().replay_set_cookie = replay;
        self
    }
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

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("methods", &self.methods)
            .field("require_key", &self.require_key)
            .field("max_request_body", &self.max_request_body)
            .field("fingerprint_headers", &self.fingerprint_headers)
            .field("wait", &self.wait)
            .field("tenant", &self.tenant.is_some())
            .field("replay_set_cookie", &self.replay_set_cookie)
            .finish_non_exhaustive()
    }
}
