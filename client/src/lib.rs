//! The client half of idempotency: a service that calls another keeps one
//! `Idempotency-Key` across every retry of a call, retries only what is safe to retry,
//! and learns what became of the call.
//!
//! [`IdempotentRetry`] is [`reqwest_middleware`] middleware. Each `POST` and `PATCH`
//! (the policy's methods) carries a key: the caller's [`CallKey`] (the usual one is
//! the [`DownstreamKey`](idemcache::DownstreamKey) of the execution making the call,
//! the same in every retry, process and reconciler) or one generated for the call. The
//! same key goes with every attempt, so the server turns a repeat into the first
//! attempt's answer. [`CallOutcome::of`] says what the caller must know:
//!
//! | outcome | ran? | what to do |
//! |---|---|---|
//! | `Executed { replayed }` | yes, once | use the answer |
//! | `Refused { status, problem }` | no | fix the request (422: the key was reused) |
//! | `NotSent` | no | give up, or call again later |
//! | `Unknown` | maybe | mark your claim UNKNOWN; reconcile by the same key |
//!
//! ```no_run
//! # #[cfg(feature = "reqwest")]
//! # async fn pay() -> Result<(), Box<dyn std::error::Error>> {
//! use idemcache_client::{CallKey, CallOutcome, IdempotentRetry};
//! use reqwest_middleware::ClientBuilder;
//!
//! let client = ClientBuilder::new(reqwest::Client::new()).with(IdempotentRetry::default()).build();
//! let sent = client
//!     .post("http://payments.internal/charges")
//!     .body("order 42: 10.00")
//!     .with_extension(CallKey::new("order-42-charge")?)
//!     .send()
//!     .await;
//! if CallOutcome::of(sent).await.ran().is_none() {
//!     // Sent, no final answer: settle it later by the same key.
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The retry schedule is [`RetryPolicy`]'s: capped exponential backoff with jitter,
//! at least the server's `Retry-After`, within a deadline. A body that cannot be sent
//! twice (a stream) is sent once. The guide, from "my service calls a payment API" to
//! settling an unknown call, is `docs/client.md` in the repository.
//!
//! The same comes as a tower layer, [`IdempotentRetryLayer`] (feature `tower`), for the
//! clients that are tower services of `http::Request`: hyper-util's `Client`, and
//! tonic's `Channel` under a generated gRPC client, whose calls are read by their
//! `grpc-status` (`UNAVAILABLE` retried, the in-progress `ABORTED` after its
//! `grpc-retry-pushback-ms`, `FAILED_PRECONDITION` never) and whose outcome is
//! [`GrpcOutcome`] (feature `tonic`). What is retried, how long it waits and what the
//! outcome is are decided once for every form.
//!
//! | feature | |
//! |---|---|
//! | `reqwest` (default) | [`IdempotentRetry`], [`CallOutcome`] |
//! | `tower` | [`IdempotentRetryLayer`], over any tower service of `http::Request` |
//! | `tonic` | `tower` with tonic's body, a failed call as a `tonic::Status`, [`GrpcOutcome`] |

#![doc(html_root_url = "https://docs.rs/idemcache-client/0.1.0")]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The guide's examples, compiled and checked as this crate's doctests.
#[cfg(all(doctest, feature = "reqwest"))]
#[doc = include_str!("../../docs/client.md")]
mod guide {}

mod attempt;
mod failed;
#[cfg(feature = "tonic")]
mod grpc;
mod key;
#[cfg(feature = "reqwest")]
mod middleware;
#[cfg(feature = "reqwest")]
mod outcome;
mod policy;
#[cfg(feature = "tower")]
mod tower;

pub use failed::CallFailed;
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
pub use grpc::GrpcOutcome;
pub use key::{CallKey, InvalidCallKey, MAX_KEY_LEN};
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use middleware::IdempotentRetry;
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use outcome::CallOutcome;
pub use policy::{PolicyError, RetryPolicy};
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub use tower::{
    BoxError, IdempotentRetryLayer, IdempotentRetryService, ResendableBody, ResponseFuture,
    RetryBody,
};

/// The middleware crate this one plugs into, and the client it wraps, re-exported: use
/// these (`idemcache_client::reqwest`, `idemcache_client::reqwest_middleware`), or
/// depend on the same releases (reqwest 0.13, reqwest-middleware 0.5), so that your
/// types are this crate's.
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use {reqwest, reqwest_middleware};
