//! [`PooledTransaction`]: a transaction on a connection of the store's pool that owns
//! its connection; and [`TransactionalStore`] for [`PostgresStore`], the HTTP layer's
//! one-commit mode (`IdempotencyLayer::one_commit(OneCommit::new(store))`) over it.
//!
//! Invariant: a pooled connection goes back to the pool only once its transaction was
//! committed or rolled back; dropped in between (a future dropped by its caller, a
//! runtime shut down) or after a commit or rollback that failed, it is taken out of the
//! pool and closed, so the
//! server rolls back and no later user of the pool finds itself inside this
//! transaction. The claim's bound on its wait for another transaction's row is set
//! before the claim and ended after it, so it never bounds the handler's statements.

use std::ops::Deref;
use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Object};
use tokio_postgres::types::{ToSql, Type};

use idemcache::store::encoding::{check_duration, micros};
use idemcache::store::{OpenClaim, StoreClaim, StoreError, TransactionalStore};
use idemcache::{CorrelationId, Fingerprint, Key};
use idemcache_sql::records::decode;
use idemcache_sql::records::postgres::{
    bound_claim_wait, CLAIM_ABSENT, COMPLETE_OR_ABORT, RESET_CLAIM_WAIT,
};
use tokio_postgres::error::SqlState;

use crate::store::Statements;
use crate::{backend, PostgresStore};

/// A transaction that owns its pooled connection (a deadpool-postgres `Transaction`
/// borrows one, so it cannot be handed from the layer to a handler and back): what the
/// one-commit mode lends a handler, as
/// `HeldTransaction<PooledTransaction>`. It derefs to the connection's client: run your
/// statements on it (`tx.execute(..)`, `tx.prepare_cached(..)`), and do not `COMMIT`,
/// `ROLLBACK` or begin another transaction on it. [`PostgresStore::claim_in`] and
/// [`complete_in`](crate::complete_in) take it too.
///
/// Dropped before [`commit`](Self::commit) or [`rollback`](Self::rollback), its
/// connection is closed rather than returned to the pool (the server rolls back).
pub struct PooledTransaction {
    client: Option<Object>,
    /// Whether `BEGIN` was sent and answered (the one-commit claim sends it with itself).
    begun: bool,
}

impl std::fmt::Debug for PooledTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledTransaction").field("open", &self.client.is_some()).finish()
    }
}

impl PooledTransaction {
    /// Begins a transaction on a connection of `store`'s pool.
    pub async fn begin(store: &PostgresStore) -> Result<PooledTransaction, StoreError> {
        let client = store.pool().get().await.map_err(backend)?;
        client.batch_execute("BEGIN").await.map_err(backend)?;
        Ok(PooledTransaction { client: Some(client), begun: true })
    }

    /// Commits, and returns the connection to the pool.
    pub async fn commit(self) -> Result<(), StoreError> {
        self.end("COMMIT").await
    }

    /// Rolls back, and returns the connection to the pool.
    pub async fn rollback(self) -> Result<(), StoreError> {
        self.end("ROLLBACK").await
    }

    async fn end(mut self, statement: &str) -> Result<(), StoreError> {
        let client = self.client.as_ref().expect("open until ended");
        client.batch_execute(statement).await.map_err(backend)?;
        // Ended: the connection may go back to the pool.
        drop(self.client.take());
        Ok(())
    }

    fn client(&self) -> &ClientWrapper {
        self.client.as_ref().expect("open until ended")
    }
}

impl Deref for PooledTransaction {
    type Target = ClientWrapper;

    fn deref(&self) -> &ClientWrapper {
        self.client()
    }
}

impl Drop for PooledTransaction {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            // Still inside the transaction: never back to the pool.
            drop(Object::take(client));
        }
    }
}

/// Each statement prepared once per connection (deadpool's statement cache).
impl Statements for PooledTransaction {
    async fn rows(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        _: &'static [Type],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let statement = self.client().prepare_cached(sql).await.map_err(backend)?;
        self.client().query(&statement, params).await.map_err(backend)
    }
}

impl crate::Transaction for PooledTransaction {}

/// One [`PooledTransaction`] per first execution, from the store's pool. A duplicate
/// waits on the record's row at most the layer's wait (PostgreSQL's `lock_timeout`, in
/// whole milliseconds).
impl TransactionalStore for PostgresStore {
    type Transaction = PooledTransaction;

    fn name(&self) -> &'static str {
        idemcache::store::Store::name(self)
    }

    /// A pooled connection whose `BEGIN` is sent with the claim (below).
    async fn begin(&self) -> Result<PooledTransaction, StoreError> {
        let client = self.pool().get().await.map_err(backend)?;
        Ok(PooledTransaction { client: Some(client), begun: false })
    }

    async fn claim_in(
        &self,
        tx: &mut PooledTransaction,
        key: &Key,
        fp: Fingerprint,
        lease: Duration,
        wait: Duration,
        correlation_id: Option<&CorrelationId>,
    ) -> Result<StoreClaim, StoreError> {
        let correlation_id = correlation_id.map(CorrelationId::as_str);
        if tx.begun {
            tx.batch_execute(&bound_claim_wait(wait)).await.map_err(backend)?;
            let claimed = self.claim_in_correlated(&*tx, key, fp, lease, correlation_id).await?;
            if let StoreClaim::Acquired { .. } = claimed {
                tx.batch_execute(RESET_CLAIM_WAIT).await.map_err(backend)?;
            }
            return Ok(claimed);
        }
        // One round trip: `BEGIN` and the bound, the claim, and the bound's end, sent in
        // this order on the one connection (tokio-postgres sends a query when it is
        // first polled, a statement cached by the pool needs no round trip to prepare,
        // and `join!` polls in order), then their answers read. The claim's statement
        // is prepared first (once per connection) so that nothing is sent before it.
        tx.client().prepare_cached(CLAIM_ABSENT).await.map_err(backend)?;
        let begin = format!("BEGIN; {}", bound_claim_wait(wait));
        let (began, claimed, reset) = tokio::join!(
            tx.batch_execute(&begin),
            self.claim_in_correlated(&*tx, key, fp, lease, correlation_id),
            tx.batch_execute(RESET_CLAIM_WAIT),
        );
        // `BEGIN` failed: the claim would have run alone and committed; it is refused
        // (the error returned), so only a claim made in a transaction is answered. (A
        // record it left lapses with its lease, as a crashed holder's does.)
        began.map_err(backend)?;
        tx.begun = true;
        let claimed = claimed?;
        if let StoreClaim::Acquired { .. } = claimed {
            // The handler's statements wait as the session says. (A claim that took a
            // dead record over ran its second statement after this reset: that one
            // waits on a competing takeover's row unbounded, at most its lease.)
            reset.map_err(backend)?;
        }
        Ok(claimed)
    }

    async fn complete_in(
        &self,
        tx: &mut PooledTransaction,
        claim: &OpenClaim,
        body: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        crate::complete_in(&*tx, claim, body).await.map(drop)
    }

    async fn commit(&self, tx: PooledTransaction) -> Result<(), StoreError> {
        tx.commit().await
    }

    /// One round trip: the completion, then `COMMIT`, sent together. The completion is
    /// `COMPLETE_OR_ABORT`, whose refusal (a lost lease) is an error that aborts the
    /// transaction, so the `COMMIT` behind it rolls back: the business change never
    /// commits without its record.
    async fn complete_and_commit(
        &self,
        mut tx: PooledTransaction,
        claim: &OpenClaim,
        body: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        let ttl = claim.result_ttl();
        check_duration("result TTL", ttl)?;
        claim.hand_over();
        let key = claim.key();
        let client = tx.client();
        let statement = client.prepare_cached(COMPLETE_OR_ABORT).await.map_err(backend)?;
        let params: [&(dyn ToSql + Sync); 4] =
            [&key.as_bytes(), &decode::token(claim.token()), &body, &micros(ttl)];
        let (completed, committed) =
            tokio::join!(client.query_one(&statement, &params), client.batch_execute("COMMIT"));
        // Whatever the completion answered, the transaction has ended (an aborted one's
        // `COMMIT` rolls back), unless the `COMMIT` itself failed: then the connection
        // is closed with it (dropped unended).
        committed.map_err(backend)?;
        tx.client.take();
        match completed {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some(&SqlState::DIVISION_BY_ZERO) => {
                Err(StoreError::LeaseLost(key.clone()))
            }
            Err(e) => Err(backend(e)),
        }
    }

    async fn rollback(&self, tx: PooledTransaction) -> Result<(), StoreError> {
        tx.rollback().await
    }
}
