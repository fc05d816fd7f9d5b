//! An embeddable idempotency cache: it stops the same business intent from being executed
//! twice inside one process, and hands the first execution's result to every repeat.
//!
//! Before executing a request that carries an idempotency key, [`Cache::claim`] it:
//!
//! ```
//! use idemcache::{Cache, Claim, Fingerprint, Key};
//!
//! let cache = Cache::builder().build()?;
//! let key = Key::new("POST /v1/orders", "user:42", "8e03978e-40d5")?;
//! let request = Fingerprint::builder().method("POST").path("/v1/orders").body(b"{\"qty\":2}").finish();
//!
//! let response = match cache.claim(&key, request)? {
//!     Claim::Acquired(guard) => {
//!         let response = b"{\"order\":\"ord_1\"}".to_vec(); // execute the intent here
//!         guard.complete(response.clone())?;
//!         response
//!     }
//!     // Completed before; `None` means the response was too large to keep: say so,
//!     // never answer an empty success.
//!     Claim::Completed(replay) => match replay.body {
//!         Some(body) => body.to_vec(),
//!         None => return Err("409: done before, response not kept".into()),
//!     },
//!     Claim::InProgress { .. } => return Err("409: a duplicate is executing".into()),
//!     Claim::Unknown { .. } => return Err("409: outcome unknown, being checked".into()),
//!     Claim::Mismatch => return Err("422: key reused for a different request".into()),
//! };
//! # let _ = response;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The contract
//!
//! | state | reached by | a claim with the same fingerprint gets | leaves by |
//! |---|---|---|---|
//! | absent | start, release, forget, expiry | [`Claim::Acquired`] | claim |
//! | PROCESSING | claim | [`Claim::InProgress`] | complete, release, mark_unknown, guard drop, lease lapse (taken over, or UNKNOWN under [`LapsePolicy::MarkUnknown`]) |
//! | COMPLETED | complete, resolve | [`Claim::Completed`] with the stored bytes | TTL (default 24 h), eviction when full, remove |
//! | UNKNOWN | mark_unknown, guard drop under [`DropPolicy::MarkUnknown`], lease lapse under [`LapsePolicy::MarkUnknown`] | [`Claim::Unknown`] | resolve, forget ([`Cache::reconcile`]), TTL, remove |
//!
//! A different fingerprint gets [`Claim::Mismatch`] in every live state. An entry past its
//! deadline (lease end or TTL) reads as absent everywhere, whether or not its memory has
//! been reclaimed yet; except, under [`LapsePolicy::MarkUnknown`], a lease past its end,
//! which reads as UNKNOWN (marked at the lease's end) until its unknown TTL passes too. A guard whose lease lapsed gets [`LeaseLost`] from every operation
//! and never touches the key's new owner (fencing); see [`FencingToken`] to carry the
//! fence into your database.
//!
//! # Limits
//!
//! - Keys: scope and tenant 1 byte or more, at most [`MAX_SCOPE_AND_TENANT_LEN`] bytes
//!   together; client keys 1 to [`MAX_CLIENT_KEY_LEN`] bytes of visible ASCII.
//! - Results larger than `max_result_size` (default 64 KiB) are recorded as
//!   completed-without-body.
//! - Size: at most `max_entries` (default 1,000,000) and `max_bytes` (default 512 MiB),
//!   split evenly across shards. A full shard evicts the oldest tenth of its completed
//!   entries; PROCESSING and UNKNOWN are never evicted, and when nothing else is left a
//!   claim fails closed with [`ClaimError::CapacityExhausted`].
//! - Expiry: dead entries read as absent at once and are reclaimed by the timing wheel:
//!   a little on every insert, all at once with [`Cache::run_pending`], or in the
//!   background with [`Cache::spawn_sweeper`].
//! - Time: [`SystemClock`] reads the coarse monotonic clock (a few milliseconds of
//!   resolution); TTLs and leases are between 1 ns and [`MAX_DURATION`].
//! - One process. A cache is the hot tier in front of a durable store whose `UNIQUE`
//!   constraint stays the backstop; it survives a restart only as a [`snapshot`].
//! - Memory per entry is charged as `key bytes + result bytes +` [`ENTRY_OVERHEAD`] in
//!   [`Stats::bytes`] (an upper bound: keys of up to 69 bytes are stored inline and so
//!   counted twice), plus the id's length and [`CORRELATION_ID_OVERHEAD`] for an entry
//!   whose claim kept a correlation id; the process also pays the map's spare capacity (hashbrown keeps its
//!   load between ~44% and 87.5%; the slab never shrinks below its high-water mark).
//!   Measured: 292 bytes of resident memory per completed entry with a 128-byte result,
//!   at a million entries (`BENCHMARKS.md`, the one place this figure is measured).
//!
//! # Where things are
//!
//! See [`implementation`] for the design notes: how shards, slots and fencing tokens fit
//! together, and where each transition lives. Async code waits with
//! [`Cache::claim_wait_async`]; [`snapshot`] carries a cache's facts across a restart;
//! [`purge`] keeps a store's table trimmed, one future to spawn. The database's own half
//! of idempotency (the consumer inbox, conditional status transitions, the stores'
//! statements) is driver-free SQL in `idemcache-sql`, run by the driver crates.
//! Built on the public API, behind features, and in crates of their own:
//!
//! | feature / crate | what it adds | dependencies |
//! |---|---|---|
//! | (none) | [`Cache`], the in-process tier | ahash, bytes, hashbrown, parking_lot, xxhash-rust |
//! | `tower` | `layer`: an HTTP layer speaking `Idempotency-Key` | http, http-body(-util), httpdate, tokio (rt, time), tower-layer, tower-service |
//! | `tracing` | one `tracing` event per decision of the layer | tracing |
//! | `store` | `store`: the durable `Store` trait, its object-safe form, `Tiered` (the cache in front of a store), the engines' unique-violation codes | none |
//! | `test-utils` | `store::conformance`: the suite every store passes, for yours | none |
//! | `idemcache-sqlite` | `SqliteStore` (rusqlite, bundled), rusqlite's classifier, `complete_in`, the inbox and transitions on your own connection | rusqlite |
//! | `idemcache-postgres` | `PostgresStore` (tokio-postgres, deadpool), its classifier, `complete_in`, the inbox and transitions on your own transaction | tokio-postgres, deadpool-postgres |
//! | `idemcache-redis` | `RedisStore` (Lua scripts, Cluster-ready keys) | redis |
//! | `idemcache-sql` | the inbox, conditional transitions and the records table in SQL, driver-free: statements per dialect and the decoding of their rows | none |
//! | `idemcache-sqlx` | `PgStore`, `MySqlStore`, sqlx's unique-violation classifier, inbox, outbox and transitions | sqlx |
//! | `idemcache-any` | `open(url)`: any of the stores from `sqlite:`, `postgres://` or `redis://` | the three store crates |
//!
//! Each store crate tracks its driver's current release and re-exports it, so that an
//! application and its store link one driver; this crate's own version does not move
//! when a driver's does.

#![cfg_attr(docsrs, feature(doc_cfg))]
// Where links to this crate's items go from documentation built without it (another
// crate's `cargo doc --no-deps`); `.ci/package` checks the version.
#![doc(html_root_url = "https://docs.rs/idemcache/0.1.0")]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]

/// The README's code blocks, compiled and run as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The guides' code blocks (`docs/`), compiled as the README's are: one item per guide.
/// The two whose blocks use a store's crate and axum, `durable-tiers.md` and
/// `commit-boundary.md`, are doctests of `idemcache-integration`, which depends on them.
#[cfg(doctest)]
mod guides {
    #[doc = include_str!("../docs/http.md")]
    pub struct Http;
    #[doc = include_str!("../docs/cli.md")]
    pub struct Cli;
    #[doc = include_str!("../docs/snapshots.md")]
    pub struct Snapshots;
    #[doc = include_str!("../docs/states.md")]
    pub struct States;
    #[doc = include_str!("../docs/testing.md")]
    pub struct Testing;
}

mod cache;
mod claim;
mod clock;
mod config;
mod correlation;
mod downstream;
mod error;
mod fingerprint;
mod guard;
pub mod implementation;
mod into_bytes;
mod key;
mod lapse;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod layer;
pub mod purge;
mod reconcile;
mod shard;
pub mod snapshot;
mod stats;
#[cfg(feature = "store")]
#[cfg_attr(docsrs, doc(cfg(feature = "store")))]
pub mod store;
mod sync;
mod wait;

/// The byte buffer results are stored and replayed as, re-exported so that naming it
/// needs no dependency of your own.
pub use bytes::Bytes;
#[cfg(not(idemcache_loom))]
pub use cache::Sweeper;
pub use cache::{Cache, SweeperError};
pub use claim::{
    Claim, EntrySnapshot, EntryState, FencingToken, Outcome, RemovalCause, Replay, UnknownEntry,
};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use config::{
    CacheBuilder, DropPolicy, MAX_DURATION, MAX_RESULT_SIZE_LIMIT, MAX_SHARDS, MAX_TICK, MIN_TICK,
};
pub use correlation::{CorrelationId, CorrelationIdError, MAX_CORRELATION_ID_LEN};
pub use downstream::{DownstreamKey, PurposeError, MAX_PURPOSE_LEN};
pub use error::{
    BuildError, ClaimError, ExtendLeaseError, InsertError, LeaseLost, ResolveError,
    SetResultTtlError,
};
pub use fingerprint::{Fingerprint, FingerprintBuilder};
pub use guard::ClaimGuard;
pub use into_bytes::IntoBytes;
pub use key::{Key, KeyError, MAX_CLIENT_KEY_LEN, MAX_SCOPE_AND_TENANT_LEN};
pub use lapse::LapsePolicy;
pub use reconcile::{Reconciled, Verdict};
pub use shard::entry::ENTRY_OVERHEAD;
pub use shard::CORRELATION_ID_OVERHEAD;
pub use stats::Stats;
pub use wait::WaitForClaim;
