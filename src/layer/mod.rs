//! An HTTP layer ([`tower`](https://docs.rs/tower) `Layer`) that makes unsafe requests
//! idempotent by their `Idempotency-Key` header, on top of a [`Cache`](crate::Cache) (one process) or of
//! a `store::Tiered` durable store (feature `store`) (several processes, restarts).
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
//! | a repeat of a request whose outcome is unknown (its response carried [`OutcomeUnknown`], or its body failed mid-way) | 409 `outcome_unknown` |
//! | the cache full of in-flight work | 503 `idempotency_cache_full` with `Retry-After` (never executed unguarded) |
//! | over a durable store (`IdempotencyLayer::tiered`, feature `store`): the store unreachable | 503 `idempotency_store_unavailable` with `Retry-After` (never executed unguarded) |
//! | over a durable store: the key's record unreadable (`store::StoreError::Corrupt`) | 500 `idempotency_record_corrupt` (never executed; retrying will not help) |
//!
//! Refusals are `application/problem+json` (RFC 9457) with a `code` member.
//!
//! **gRPC** (a tonic server, or any gRPC service over tower): tell the layer with
//! [`IdempotencyLayer::grpc`]. A gRPC answer is HTTP 200 whatever its outcome, so the
//! layer then keeps answers by their `grpc-status` (the deterministic ones; a transient
//! `UNAVAILABLE` releases the key as a 5xx does), answers its refusals as gRPC statuses
//! (`ABORTED` while in progress, `FAILED_PRECONDITION` for a reused key, ...), and passes
//! the streaming methods (and those you name) through unguarded: [`Grpc`] has the table.
//!
//! The request fingerprint is method, path and query, selected headers (default
//! `Content-Type`) and the body (or what [`IdempotencyLayer::fingerprint_body`] selects of
//! it); the body is buffered (up to [`IdempotencyLayer::max_request_body`]) to be hashed
//! and handed whole to the handler. The key is the `Idempotency-Key` header, or what
//! [`IdempotencyLayer::key_from`] reads from the request.
//! The key is scoped by method and route ([`IdempotencyLayer::scope`]) and by tenant
//! ([`IdempotencyLayer::tenant`]), so two users' equal keys never meet.
//!
//! **The handler runs to completion even if the client goes**: it runs in the request's
//! own task while that awaits it, and if the request's future is dropped unfinished (a
//! client that disconnects mid-request), the execution moves to a tokio task of its own
//! and finishes there, so neither is the key wedged nor a completion lost: its response
//! is stored, and the client's retry gets the replay. (Over a durable store the claim
//! runs in it too: a store commits a claim before its answer arrives.) No task is
//! spawned for an execution whose client waits for it, the common case.
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
//! # Observing it
//!
//! Every guarded request that reaches its claim has one final [`Decision`]
//! (`acquired`, `replayed`, `in_progress`, ...), reported once: to your hook
//! ([`IdempotencyLayer::on_decision`]) with the key's parts, the correlation id
//! ([`IdempotencyLayer::correlation_id`]; by default the trace id of a W3C `traceparent`)
//! and the claim's and execution's times; as a `tracing` event (feature `tracing`,
//! target `idemcache::layer`, level DEBUG, with the same fields; the claim and the
//! handler run in a span `idempotency` carrying them, so the handler's own events
//! carry them too); and as metrics (feature `metrics`).
//!
//! # Metrics
//!
//! Feature `metrics`, through the [`metrics`](https://docs.rs/metrics) facade: install
//! the exporter you use (`metrics-exporter-prometheus`, ...) and they appear; with none
//! installed they cost a lookup. Labels never name a key or a tenant: a `scope` label is
//! kept for the first 256 scopes seen and the rest share `other` (name scopes by route,
//! not by raw path), and `store` is the store's name (`store::Store::name`), or
//! `cache` over the cache alone.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `idemcache_decisions_total` | counter | `decision` ([`Decision::as_str`]), `scope`, `store` |
//! | `idemcache_execution_seconds` | histogram | `scope`, `store`: handler start to response read whole |
//! | `idemcache_wait_seconds` | histogram | `scope`, `store`: claims that waited for a duplicate ([`IdempotencyLayer::wait`]) |
//! | `idemcache_store_seconds` | histogram | `operation` (`claim`, `complete`, `release`, `mark_unknown`, `extend_lease`), `store`: each call that reaches the store (a `claim` the hot tier answers, a replay it keeps or a duplicate in this process, sends nothing to the store and is not timed) |
//! | `idemcache_entries`, `idemcache_bytes` | gauge | `store`: the cache's [`Stats`](crate::Stats) |
//! | `idemcache_unknown` | gauge | `store`: live UNKNOWN records (in the store, over a durable one), counted up to 10,000 |
//!
//! The gauges are set by `IdempotencyLayer::report_gauges` (feature `metrics`), a loop the application spawns: reading them costs locks and (over a store) a query,
//! which no request should pay.
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

mod backend;
mod body;
mod claimed;
mod decision;
mod detached;
mod grpc;
mod header;
#[cfg(feature = "store")]
mod in_transaction;
#[allow(clippy::module_inception)] // tower-http's layout: `layer.rs` holds the Layer.
mod layer;
#[cfg(feature = "metrics")]
mod metrics;
#[cfg(feature = "store")]
mod one_commit;
mod outcome;
mod problem;
mod renewal;
mod replay;
mod report;
mod request_body;
mod service;
mod settings;
mod span;
mod stored_response;
mod timing;

pub use body::LayerBody;
pub use claimed::Claimed;
pub use decision::{Decision, DecisionEvent};
pub use grpc::{Grpc, GrpcCode};
pub use header::{
    client_key, KeyHeaderError, IDEMPOTENCY_EXPIRES, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED,
};
/// The `http` crate at the version the layer is built on: the closures
/// ([`IdempotencyLayer::tenant`], [`IdempotencyLayer::key_from`], ...) take its
/// `http::request::Parts`, so a program can name the type without a dependency of its own.
pub use http;
#[cfg(feature = "store")]
#[cfg_attr(docsrs, doc(cfg(feature = "store")))]
pub use in_transaction::InTransaction;
pub use layer::IdempotencyLayer;
#[cfg(feature = "store")]
#[cfg_attr(docsrs, doc(cfg(feature = "store")))]
pub use one_commit::{HeldTransaction, TransactionEnded};
pub use outcome::{stored_response, OutcomeUnknown};
pub use service::Idempotency;
pub use settings::DEFAULT_MAX_REQUEST_BODY;

/// The header a W3C Trace Context names a request's trace in.
pub const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");

/// The trace id of the request's W3C `traceparent` header
/// ([`CorrelationId::from_traceparent`](crate::CorrelationId::from_traceparent)), if it
/// has one well-formed: the layer's default correlation id
/// ([`IdempotencyLayer::correlation_id`]).
pub fn trace_id(headers: &http::HeaderMap) -> Option<crate::CorrelationId> {
    crate::CorrelationId::from_traceparent(headers.get(TRACEPARENT)?.as_bytes())
}
