//! [`PooledTransaction`]: a transaction on a connection of the store's pool that owns
//! its connection; and [`TransactionalStore`] for [`PostgresStore`], the HTTP layer's
//! one-commit mode (`IdempotencyLayer::one_commit(OneCommit::new(store))`) over it.
//!
//! Invariant: a pooled connection goes back to the pool only once its transaction was
//! committed or rolled back; dropped in between (a future dropped by its caller, a
//! runtime shut down) or after a commit or rollback that failed, it is taken out of the
//! pool and closed, so the
//! server rolls back and no later user of the pool finds itself inside this
//! transaction. The claim's bound on its wait (the layer's `wait`) applies to the wait for
//! its key's turn (an advisory lock every one-commit claim of the key takes first) and
//! to statements on the key's existing row, never to the insert of a fresh key (which
//! may wait on other keys' writers) nor to the handler's statements.

use std::ops::Deref;
use std::time::{Duration, SystemTime};

use deadpool_postgres::{ClientWrapper, Object};
use tokio_postgres::types::{ToSql, Type};

use idemcache::store::encoding::{check_duration, micros};
use idemcache::store::{OpenClaim, StoreClaim, StoreError, TransactionalStore};
use idemcache::{CorrelationId, Fingerprint, Key};
use idemcache_sql::records::decode;
use idemcache_sql::records::postgres::{
    bound_claim_wait, claim_turn, CLAIM_ABSENT, COMPLETE_OR_ABORT, RESET_CLAIM_WAIT,
};
use tokio_postgres::error::SqlState;

use crate::in_transaction::lock_wait_ran_out;
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

impl crate::Transaction for PooledTransaction {
    fn connection(&self) -> &tokio_postgres::Client {
        self.client()
    }
}

/// The claim's statements after its key's turn: the first (the insert of a fresh key, or
/// the look at the key's row) runs as the session says, since whatever it waits on is no
/// holder of this key (the turn was that). A later one works on the key's existing row
/// (the takeover of a dead record, the turn of a lapsed lease to UNKNOWN) and may wait
/// on a row lock that a claim outside one-commit mode holds (the store's own claim, a
/// caller's `claim_in`): each is sent between the bound and its end, in one round trip.
struct LaterBounded<'a> {
    tx: &'a PooledTransaction,
    bound: &'a str,
    first_sent: std::sync::atomic::AtomicBool,
}

impl Statements for LaterBounded<'_> {
    async fn rows(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        types: &'static [Type],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        if !self.first_sent.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return self.tx.rows(sql, params, types).await;
        }
        // Prepared first, so that nothing is sent between the bound and the statement.
        self.tx.client().prepare_cached(sql).await.map_err(backend)?;
        let (bound, rows, reset) = tokio::join!(
            self.tx.batch_execute(self.bound),
            self.tx.rows(sql, params, types),
            self.tx.batch_execute(RESET_CLAIM_WAIT),
        );
        bound.map_err(backend)?;
        // A bound that ran out aborts the transaction, and the reset with it: the
        // statement's error is the answer (`InProgress`, `claim_in_correlated` says).
        let rows = rows?;
        reset.map_err(backend)?;
        Ok(rows)
    }
}

impl crate::Transaction for LaterBounded<'_> {
    fn connection(&self) -> &tokio_postgres::Client {
        self.tx.client()
    }
}

/// One [`PooledTransaction`] per first execution, from the store's pool. A duplicate
/// waits for the transaction holding its key at most the layer's wait (PostgreSQL's
/// `lock_timeout` on the key's turn, `idemcache_sql::records::postgres::claim_turn`).
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
        let in_progress = || Ok(StoreClaim::InProgress { lease_ends_at: SystemTime::now() });
        let bound = bound_claim_wait(wait);
        // The key's turn, waited for at most `wait`; the bound ends with it.
        let turn = format!("{bound}; {}; {RESET_CLAIM_WAIT}", claim_turn(key.as_bytes()));
        let statements = LaterBounded { tx: &*tx, bound: &bound, first_sent: Default::default() };
        if tx.begun {
            match tx.batch_execute(&turn).await {
                Err(e) if lock_wait_ran_out(&e) => return in_progress(),
                taken => taken.map_err(backend)?,
            }
            return self.claim_in_correlated(&statements, key, fp, lease, correlation_id).await;
        }
        // One round trip: `BEGIN` and the key's turn, then the claim, sent in this order
        // on the one connection (tokio-postgres sends a query when it is first polled, a
        // statement cached by the pool needs no round trip to prepare, and `join!` polls
        // in order), then their answers read. The claim's statement is prepared first
        // (once per connection) so that nothing is sent before it.
        tx.client().prepare_cached(CLAIM_ABSENT).await.map_err(backend)?;
        let begin = format!("BEGIN; {turn}");
        let (began, claimed) = tokio::join!(
            tx.batch_execute(&begin),
            self.claim_in_correlated(&statements, key, fp, lease, correlation_id),
        );
        match began {
            // Another transaction holds the key's turn: the claim behind it failed in
            // the aborted transaction, which the caller rolls back.
            Err(e) if lock_wait_ran_out(&e) => {
                tx.begun = true;
                in_progress()
            }
            // `BEGIN` failed: the claim would have run alone and committed; it is
            // refused (the error returned), so only a claim made in a transaction is
            // answered. (A record it left lapses with its lease, as a crashed holder's
            // does.)
            Err(e) => Err(backend(e)),
            Ok(()) => {
                tx.begun = true;
                claimed
            }
        }
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
