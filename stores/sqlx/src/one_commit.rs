//! [`TransactionalStore`] for [`PgStore`](crate::PgStore): the HTTP layer's one-commit
//! mode (`IdempotencyLayer::one_commit(OneCommit::new(store))`) over a sqlx pool, each
//! first execution one `sqlx::Transaction<'static, Postgres>` from the store's pool.
//!
//! Invariant: these are the store's plain one-commit functions (`claim_in`,
//! `complete_in`) and sqlx's own begin, commit and rollback; the only addition is the
//! claim's bound on its wait for another transaction's row, set before the claim and
//! ended after it, so it never bounds the handler's own statements.

#[cfg(feature = "postgres")]
mod postgres {
    use std::time::Duration;

    use idemcache::store::{OpenClaim, StoreClaim, StoreError, TransactionalStore};
    use idemcache::{CorrelationId, Fingerprint, Key};
    use idemcache_sql::records::postgres::{bound_claim_wait, RESET_CLAIM_WAIT};
    use sqlx::{AssertSqlSafe, Postgres, Transaction};

    use crate::PgStore;

    fn backend(e: sqlx::Error) -> StoreError {
        StoreError::Backend(Box::new(e))
    }

    /// One transaction per first execution, from the store's pool: the handler finds it
    /// in `HeldTransaction<sqlx::Transaction<'static, Postgres>>` and runs its
    /// statements on `&mut **tx`. A duplicate waits on the record's row at most the
    /// layer's wait (PostgreSQL's `lock_timeout`, in whole milliseconds).
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
            sqlx::raw_sql(AssertSqlSafe(bound_claim_wait(wait)))
                .execute(&mut **tx)
                .await
                .map_err(backend)?;
            let claimed = self.claim_in_correlated(tx, key, fp, lease, correlation_id).await?;
            if let StoreClaim::Acquired { .. } = claimed {
                sqlx::raw_sql(RESET_CLAIM_WAIT).execute(&mut **tx).await.map_err(backend)?;
            }
            Ok(claimed)
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
