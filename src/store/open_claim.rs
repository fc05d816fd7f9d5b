//! [`OpenClaim`]: a claim held by this execution, handed to code that records the
//! outcome inside its own database transaction.
//!
//! Invariant: once [`OpenClaim::hand_over`] was called, the claim's holder (the HTTP
//! layer) neither renews the lease nor writes a completion of its own: the outcome is
//! the transaction's. If that transaction commits, the record is COMPLETED with the
//! business change; if it rolls back, the record is still PROCESSING under the claim's
//! token, and the holder's fenced release (or the lease lapsing) lets a retry run again.
//! Either way the dedup fact and the business change share one commit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::{FencingToken, Key};

/// A claim held by this execution: its key, its fencing token and the TTL a completion
/// is kept for. Store crates' `complete_in(&tx, &claim, body)` write the completion with
/// it inside the caller's transaction (`idemcache_sqlite::complete_in`,
/// `idemcache_postgres::complete_in`), fenced by the token: a claim whose key was taken
/// over is refused with [`LeaseLost`](crate::store::StoreError::LeaseLost), and the
/// caller rolls its business change back.
///
/// The HTTP layer hands one to the handler of every request it claimed over a durable
/// store, in the request's extensions (see `idemcache::layer::InTransaction`). Cheap to
/// clone: clones share the hand-over flag.
#[derive(Clone, Debug)]
pub struct OpenClaim {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    key: Key,
    token: FencingToken,
    result_ttl: Duration,
    handed_over: AtomicBool,
}

impl OpenClaim {
    /// The claim of `key` under `token`, whose completion is kept for `result_ttl`.
    pub fn new(key: Key, token: FencingToken, result_ttl: Duration) -> OpenClaim {
        let handed_over = AtomicBool::new(false);
        OpenClaim { inner: Arc::new(Inner { key, token, result_ttl, handed_over }) }
    }

    /// The key claimed.
    pub fn key(&self) -> &Key {
        &self.inner.key
    }

    /// The claim's fencing token: every write for it names this token.
    pub fn token(&self) -> FencingToken {
        self.inner.token
    }

    /// How long a completion written for this claim is kept.
    pub fn result_ttl(&self) -> Duration {
        self.inner.result_ttl
    }

    /// Says the outcome is being written in the caller's own transaction: the holder
    /// stops renewing the lease (a renewal would wait on the row the transaction has
    /// locked) and will not complete the claim itself. Store crates' `complete_in` call
    /// it before their write; call it yourself only if you write the record another way.
    pub fn hand_over(&self) {
        self.inner.handed_over.store(true, Ordering::Release);
    }

    /// Whether [`hand_over`](Self::hand_over) was called on this claim or a clone.
    pub fn handed_over(&self) -> bool {
        self.inner.handed_over.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_hand_over() {
        let key = Key::new("POST /orders", "u", "k").unwrap();
        let claim = OpenClaim::new(key.clone(), FencingToken::new(7), Duration::from_secs(9));
        let clone = claim.clone();
        assert!(!claim.handed_over());
        clone.hand_over();
        assert!(claim.handed_over());
        assert_eq!((claim.key(), claim.token().get()), (&key, 7));
        assert_eq!(claim.result_ttl(), Duration::from_secs(9));
    }
}
