//! [`TransactionalStore`] for [`PgStore`](crate::PgStore) and
//! [`MySqlStore`](crate::MySqlStore): the HTTP layer's one-commit mode
//! (`IdempotencyLayer::one_commit(OneCommit::new(store))`) over a sqlx pool, each first
//! execution one `sqlx::Transaction<'static, _>` from the store's pool.
//!
//! Invariant: these are the store's plain one-commit functions (`claim_in`,
//! `complete_in`) and sqlx's own begin, commit and rollback, the claim's waits bounded
//! by the layer's wait. PostgreSQL's only addition is the claim's turn on its key
//! (`claim_turn`, an advisory lock every one-commit claim of the key takes first),
//! waited for at most that wait, so the bound never applies to waits on other keys'
//! writers or to the handler's own statements. (The claim's statements run as the
//! session says: a takeover of a dead record that meets the row lock of a claim outside
//! one-commit mode waits for it; `PostgresStore` bounds those.) MySQL's claim bounds
//! its own waiting statements (whole seconds, at least 1) and mints its token in the
//! transaction, so a first execution holds one connection of the pool, never two.

#![cfg(any(feature = "postgres", feature = "mysql"))]

use std::time::Duration;

use idemcache::store::{OpenClaim, StoreClaim, StoreError, TransactionalStore};
use idemcache::{CorrelationId, Fingerprint, Key};

/// `impl TransactionalStore` for `$store` over `sqlx::Transaction<'static, $db>`: the
/// store's own `claim_in_bounded` and `complete_in`, sqlx's begin, commit and rollback.
macro_rules! transactional {
    ($(#[$doc:meta])* $feature:literal, $store:ident, $db:ty) => {
        $(#[$doc])*
        #[cfg(feature = $feature)]
        impl TransactionalStore for crate::$store {
            type Transaction = sqlx::Transaction<'static, $db>;

            fn name(&self) -> &'static str {
                idemcache::store::Store::name(self)
            }

            async fn begin(&self) -> Result<Self::Transaction, StoreError> {
                self.pool().begin().await.map_err(backend)
            }

            async fn claim_in(
                &self,
                tx: &mut Self::Transaction,
                key: &Key,
                fp: Fingerprint,
                lease: Duration,
                wait: Duration,
                correlation_id: Option<&CorrelationId>,
            ) -> Result<StoreClaim, StoreError> {
                let correlation_id = correlation_id.map(CorrelationId::as_str);
                self.claim_in_bounded(tx, key, fp, lease, wait, correlation_id).await
            }

            async fn complete_in(
                &self,
                tx: &mut Self::Transaction,
                claim: &OpenClaim,
                body: Option<&[u8]>,
            ) -> Result<(), StoreError> {
                crate::$store::complete_in(tx, claim, body).await.map(drop)
            }

            async fn commit(&self, tx: Self::Transaction) -> Result<(), StoreError> {
                tx.commit().await.map_err(backend)
            }

            async fn rollback(&self, tx: Self::Transaction) -> Result<(), StoreError> {
                tx.rollback().await.map_err(backend)
            }
        }
    };
}

fn backend(e: sqlx::Error) -> StoreError {
    StoreError::Backend(Box::new(e))
}

transactional!(
    /// One transaction per first execution, from the store's pool: the handler finds it
    /// in `HeldTransaction<sqlx::Transaction<'static, Postgres>>` and runs its
    /// statements on `&mut **tx`. A duplicate waits for the transaction holding its key
    /// at most the layer's wait (PostgreSQL's `lock_timeout` on the key's turn).
    "postgres",
    PgStore,
    sqlx::Postgres
);

transactional!(
    /// One transaction per first execution, from the store's pool: the handler finds it
    /// in `HeldTransaction<sqlx::Transaction<'static, MySql>>` and runs its statements
    /// on `&mut **tx`. A duplicate waits on the record's row at most the layer's wait,
    /// in whole seconds and at least 1 (InnoDB's `innodb_lock_wait_timeout` takes no
    /// less), then answers 409; `MySqlStore::claim_in` says what else is MySQL's own (a
    /// deadlock among duplicates is an error, answered 503).
    "mysql",
    MySqlStore,
    sqlx::MySql
);
