//! [`TransactionalStore`]: a store whose claim and completion run inside a transaction
//! on its own database; and [`OneCommit`], such a store with the lease and the result
//! TTL it claims with, which the HTTP layer's one-commit mode takes
//! (`IdempotencyLayer::one_commit`).
//!
//! Invariant: a first execution is one transaction. The claim, the business change the
//! handler writes in the same transaction, and the completion commit together or not
//! at all, so nothing is left PROCESSING by a crash or a rollback, and nobody sees the
//! claim before the business change is committed with it. A duplicate meanwhile waits on
//! the record's row (at most the wait it was given), then replays what committed, or
//! acquires if nothing did.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::{OpenClaim, StoreClaim, StoreError};
use crate::{Cache, CorrelationId, Fingerprint, Key};

/// A store whose claim and completion can run in a transaction the caller's business
/// writes share: the one-commit design (the claim, the change, the completion, one
/// commit). Implemented by the SQL store crates (`idemcache-postgres`'s
/// `PostgresStore`, `idemcache-sqlx`'s `PgStore`); each documents its transaction type.
///
/// Each method is the store's plain one-commit function (`claim_in`, `complete_in`)
/// under one name, so that [`OneCommit`] and the HTTP layer drive any of them.
pub trait TransactionalStore: Send + Sync + 'static {
    /// An open transaction on the store's database, owned (it borrows nothing), so the
    /// layer can hand it to a handler and take it back. Dropped unfinished, it rolls
    /// back.
    type Transaction: Send + 'static;

    /// The store's name, for metrics (as [`Store::name`](super::Store::name)).
    fn name(&self) -> &'static str;

    /// Opens a transaction at the database's default isolation (READ COMMITTED on
    /// PostgreSQL, REPEATABLE READ on MySQL/MariaDB; SQLite's are serializable), whose first
    /// statement is [`claim_in`](Self::claim_in)'s: a store may send its `BEGIN` with
    /// the claim, so run nothing in it before.
    fn begin(&self) -> impl Future<Output = Result<Self::Transaction, StoreError>> + Send;

    /// Claims `key` for a request whose fingerprint is `fp` inside `tx`, answering as
    /// [`Store::claim_correlated`](super::Store::claim_correlated) does (an acquired
    /// record keeps `correlation_id`). A record another transaction holds uncommitted is
    /// waited for at most `wait` (then [`StoreClaim::InProgress`]); the bound applies to
    /// this claim only, not to the statements `tx` runs after it.
    fn claim_in(
        &self,
        tx: &mut Self::Transaction,
        key: &Key,
        fp: Fingerprint,
        lease: Duration,
        wait: Duration,
        correlation_id: Option<&CorrelationId>,
    ) -> impl Future<Output = Result<StoreClaim, StoreError>> + Send;

    /// Completes `claim` with `body` inside `tx`, fenced by its token: refused with
    /// [`StoreError::LeaseLost`] once the claim's lease has ended.
    fn complete_in(
        &self,
        tx: &mut Self::Transaction,
        claim: &OpenClaim,
        body: Option<&[u8]>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Commits `tx`. An error leaves it unknown whether the commit happened (the
    /// connection may have dropped after the server committed): a retry of the request
    /// replays if it did, and runs if it did not.
    fn commit(&self, tx: Self::Transaction) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Completes `claim` with `body` in `tx` and commits `tx`: [`complete_in`] then
    /// [`commit`], rolling back if the completion is refused. A store may send both at
    /// once, provided a refused completion never lets the commit keep the business
    /// change. An error means nothing committed, except from the commit itself (see
    /// [`commit`]).
    ///
    /// [`complete_in`]: TransactionalStore::complete_in
    /// [`commit`]: TransactionalStore::commit
    fn complete_and_commit(
        &self,
        mut tx: Self::Transaction,
        claim: &OpenClaim,
        body: Option<&[u8]>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async move {
            if let Err(e) = self.complete_in(&mut tx, claim, body).await {
                let _ = self.rollback(tx).await;
                return Err(e);
            }
            self.commit(tx).await
        }
    }

    /// Rolls `tx` back.
    fn rollback(
        &self,
        tx: Self::Transaction,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// A [`TransactionalStore`] with the lease and result TTL its claims take: what the HTTP
/// layer's one-commit mode runs on (`IdempotencyLayer::one_commit`, feature `tower`).
///
/// The lease decides whether each first execution's transaction may commit: a
/// completion after it ends is refused, and the transaction commits nothing. It does not
/// end a transaction that runs on (a hung handler keeps its row and connection): bound
/// the handler with a timeout. Nobody else can take the key over meanwhile (the claim is
/// not visible to them), so choose it longer than the slowest transaction. Defaults: a
/// 60 s lease, results kept 24 h (as [`Tiered`](super::Tiered)), no cache in front
/// ([`with_cache`](Self::with_cache)). The lease is longer than `Tiered`'s
/// [`DEFAULT_LEASE`](super::DEFAULT_LEASE) because here it frees no crashed holder's
/// key: a crash rolls the claim back with its transaction, and the key is free at once.
#[derive(Debug)]
pub struct OneCommit<S> {
    store: Arc<S>,
    lease: Duration,
    result_ttl: Duration,
    cache: Option<Cache>,
}

impl<S> Clone for OneCommit<S> {
    fn clone(&self) -> Self {
        OneCommit {
            store: self.store.clone(),
            lease: self.lease,
            result_ttl: self.result_ttl,
            cache: self.cache.clone(),
        }
    }
}

impl<S: TransactionalStore> OneCommit<S> {
    /// `store` with a 60 s lease and a 24 h result TTL.
    pub fn new(store: S) -> Self {
        OneCommit {
            store: Arc::new(store),
            lease: Duration::from_secs(60),
            result_ttl: Duration::from_secs(24 * 3600),
            cache: None,
        }
    }

    /// A cache in front that replays what committed: a repeat of a key this process
    /// committed (or read committed) is answered from memory, with no transaction. It
    /// holds completed records only, each for no longer than the store keeps it (its TTL
    /// counted from before the completion was sent, less 10 ms); claims stay the
    /// database's, so a duplicate of an execution still running waits on its row. A
    /// response larger than the cache's `max_result_size` is read from the store. In
    /// the cache's [`Stats`](crate::Stats), a record kept counts as `inserted` and a
    /// repeat answered as `replayed`.
    pub fn with_cache(mut self, cache: Cache) -> Self {
        self.cache = Some(cache);
        self
    }

    /// The cache in front, if any.
    pub fn cache(&self) -> Option<&Cache> {
        self.cache.as_ref()
    }

    /// The lease each claim takes: the longest a first execution's transaction may run.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long the store keeps a completed result.
    pub fn with_completed_ttl(mut self, ttl: Duration) -> Self {
        self.result_ttl = ttl;
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The store, shared with the claims the layer holds.
    #[cfg(feature = "tower")]
    pub(crate) fn shared_store(&self) -> &Arc<S> {
        &self.store
    }

    /// The lease each claim takes.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// How long the store keeps a completed result.
    pub fn completed_ttl(&self) -> Duration {
        self.result_ttl
    }
}
