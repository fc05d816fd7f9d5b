//! [`InTransaction`]: the claim the layer hands a handler whose business tables live in
//! the store's database, so that the response is recorded in the handler's own
//! transaction and commits with the business change, or not at all.
//!
//! Invariant: the record the handler writes is exactly what the layer would have stored
//! for that response (the same encoding, the same fields left out), so a replay cannot
//! tell which of the two wrote it; and once the handler handed the claim over, the layer
//! writes no completion of its own (see [`OpenClaim`]).

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

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
///     let (status, headers, body) = created(id);
///     if let Some(Extension(held)) = &held {
///         let record = held.record(status, &headers, &body).ok_or("a 5xx: roll back")?;
///         idemcache_postgres::complete_in(&tx, held.claim(), Some(&record)).await?;
///     }
///     tx.commit().await?;
///     (status, headers, body).into_response()
/// }
/// ```
///
/// After a crash at any instant, a retry either runs the handler (nothing committed) or
/// replays (the order and its record committed). A handler that does not use it behaves
/// as before. `complete_in` refuses a claim whose key was taken over (its lease lapsed
/// and another caller claimed it) with `StoreError::LeaseLost`: roll back then.
///
/// Return the response you recorded: repeats replay the record, not what the handler
/// returned. Use it only over a SQL store whose database holds your business tables
/// (`SqliteStore`, `PostgresStore`): over Redis there is no transaction to join, and a
/// `complete_in` into your own database finds no record there (`LeaseLost`). Over
/// SQLite, the renewal needs the write lock your transaction holds: keep the
/// transaction itself shorter than the lease (open it when you start writing). The layer renews the lease until the handler hands the claim over (the
/// first thing `complete_in` does) and not after: commit promptly.
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
}
