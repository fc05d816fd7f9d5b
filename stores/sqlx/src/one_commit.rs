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

#[cfg(feature = "postgres")]
mod postgres {
    use std::time::{Duration, SystemTime};

    use idemcache::store::{OpenClaim, StoreClaim, StoreError, TransactionalStore};
    use idemcache::{CorrelationId, Fingerprint, Key};
    use idemcache_sql::records::postgres::{bound_claim_wait, claim_turn, RESET_CLAIM_WAIT};
    use sqlx::{AssertSqlSafe, Postgres, Transaction};

    use crate::PgStore;

    fn backend(e: sqlx::Error) -> StoreError {
        StoreError::Backend(Box::new(e))
    }

    /// One transaction per first execution, from the store's pool: the handler finds it
    /// in `HeldTransaction<sqlx::Transaction<'static, Postgres>>` and runs its
    /// statements on `&mut **tx`. A duplicate waits for the transaction holding its key
    /// at most the layer's wait (PostgreSQL's `lock_timeout` on the key's turn).
    impl TransactionalStore for PgStore {
        type Transaction = Transaction<'static, Postgres>;

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
            // The key's turn, waited for at most `wait`; the bound ends with it.
            let turn = format!(
                "{}; {}; {RESET_CLAIM_WAIT}",
                bound_claim_wait(wait),
                claim_turn(key.as_bytes())
            );
            match sqlx::raw_sql(AssertSqlSafe(turn)).execute(&mut **tx).await {
                // Another transaction holds the key's turn (`lock_not_available`): the
                // caller rolls the aborted transaction back.
                Err(e) if crate::in_transaction::lock_wait_ran_out(&e) => {
                    return Ok(StoreClaim::InProgress { lease_ends_at: SystemTime::now() });
                }
                taken => taken.map_err(backend)?,
            };
            self.claim_in_correlated(tx, key, fp, lease, correlation_id).await
        }

        async fn complete_in(
            &self,
            tx: &mut Self::Transaction,
            claim: &OpenClaim,
            body: Option<&[u8]>,
        ) -> Result<(), StoreError> {
            PgStore::complete_in(tx, claim, body).await.map(drop)
        }

        async fn commit(&self, tx: Self::Transaction) -> Result<(), StoreError> {
            tx.commit().await.map_err(backend)
        }

        async fn rollback(&self, tx: Self::Transaction) -> Result<(), StoreError> {
            tx.rollback().await.map_err(backend)
        }
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use std::time::Duration;

    use idemcache::store::{OpenClaim, StoreClaim, StoreError, TransactionalStore};
    use idemcache::{CorrelationId, Fingerprint, Key};
    use sqlx::{MySql, Transaction};

    use crate::MySqlStore;

    fn backend(e: sqlx::Error) -> StoreError {
        StoreError::Backend(Box::new(e))
    }

    /// One transaction per first execution, from the store's pool: the handler finds it
    /// in `HeldTransaction<sqlx::Transaction<'static, MySql>>` and runs its statements
    /// on `&mut **tx`. A duplicate waits on the record's row at most the layer's wait,
    /// in whole seconds and at least 1 (InnoDB's `innodb_lock_wait_timeout` takes no
    /// less), then answers 409; `MySqlStore::claim_in` says what else is MySQL's own (a
    /// deadlock among duplicates is an error, answered 503).
    impl TransactionalStore for MySqlStore {
        type Transaction = Transaction<'static, MySql>;

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
            MySqlStore::complete_in(tx, claim, body).await.map(drop)
        }

        async fn commit(&self, tx: Self::Transaction) -> Result<(), StoreError> {
            tx.commit().await.map_err(backend)
        }

        async fn rollback(&self, tx: Self::Transaction) -> Result<(), StoreError> {
            tx.rollback().await.map_err(backend)
        }
    }
}
