//! [`complete_in`]: a claim's completion written in the caller's own transaction, so
//! that it commits with the business change it records, or not at all; and
//! [`PostgresStore::claim_in`], the claim itself made in that transaction, so that a
//! first execution is one commit.
//!
//! Invariant: the write is the store's own completion (the same statement,
//! `idemcache-sql`'s `COMPLETE`, judged by the server's clock), fenced by the claim's
//! token and refused once the key has moved on; it changes nothing but the claim's
//! record, and commits or rolls back with the caller's transaction. Under READ
//! COMMITTED (PostgreSQL's default) a concurrent takeover of the key and this write
//! serialize on the record's row: whichever commits first wins, and the other sees
//! the winner's row (a takeover finds it COMPLETED and replays; this write finds a new
//! token and is refused).

use std::time::{Duration, SystemTime};

use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};

use idemcache::store::encoding::{check_duration, lapse_ttl_micros, micros};
use idemcache::store::{OpenClaim, StoreClaim, StoreError};
use idemcache::{Bytes, Fingerprint, Key, Replay};
use idemcache_sql::records::decode;
use idemcache_sql::records::postgres::{CLAIM_ABSENT, COMPLETE};

use crate::store::{claim_on, Statements};
use crate::{backend, column, PostgresStore};

/// Your transaction, as every function of this crate that writes in it takes it
/// ([`PostgresStore::claim_in`], [`complete_in`], [`outbox::enqueue`](crate::outbox::enqueue),
/// [`inbox::receive`](crate::inbox::receive), [`transition`](crate::transition())): a
/// deadpool-postgres `Transaction` (from the store's pool, [`PostgresStore::pool`], or
/// yours), tokio-postgres's own, or a [`PooledTransaction`](crate::PooledTransaction)
/// (the one the layer's one-commit mode lends a handler, in
/// `HeldTransaction<PooledTransaction>`: pass `&*held.lock().await?`). Sealed: implemented
/// for those three only (its supertrait, the statements' runner, is this crate's own).
///
/// Over deadpool's, each statement is prepared once per pooled connection (its
/// statement cache), so PostgreSQL plans it once; over tokio-postgres's, which keeps no
/// cache, each runs typed in one round trip (`query_typed`), planned every time (about
/// half a millisecond per statement here): prefer deadpool's where first executions
/// are hot.
pub trait Transaction: Statements {
    /// The connection the transaction is open on, to run statements in it.
    #[doc(hidden)]
    fn connection(&self) -> &tokio_postgres::Client;
}

impl Transaction for tokio_postgres::Transaction<'_> {
    fn connection(&self) -> &tokio_postgres::Client {
        tokio_postgres::GenericClient::client(self)
    }
}

impl Transaction for deadpool_postgres::Transaction<'_> {
    fn connection(&self) -> &tokio_postgres::Client {
        tokio_postgres::GenericClient::client(&**self)
    }
}

/// tokio-postgres's transaction keeps no prepared statements: each statement runs
/// typed, parsed and executed in one round trip (`query_typed`).
impl Statements for tokio_postgres::Transaction<'_> {
    async fn rows(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        types: &'static [Type],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let typed: Vec<(&(dyn ToSql + Sync), Type)> =
            params.iter().copied().zip(types.iter().cloned()).collect();
        self.query_typed(sql, &typed).await.map_err(backend)
    }
}

/// deadpool's transaction: each statement prepared once per connection (its cache).
impl Statements for deadpool_postgres::Transaction<'_> {
    async fn rows(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        _: &'static [Type],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let statement = self.prepare_cached(sql).await.map_err(backend)?;
        self.query(&statement, params).await.map_err(backend)
    }
}

impl PostgresStore {
    /// Claims `key` for a request whose fingerprint is `fp` inside `tx`, your own
    /// transaction on the database this store keeps its records in: with
    /// [`complete_in`] and your business writes in the same `tx`, a first execution is
    /// one commit, the seeds' design (get or create the record, check the fingerprint,
    /// write the order, mark the record succeeded, commit).
    ///
    /// Answers as [`Store::claim`](idemcache::store::Store::claim) does, by the same
    /// statement. On [`StoreClaim::Acquired`], make the claim
    /// (`OpenClaim::new(key, token, result_ttl)`), write your change, [`complete_in`],
    /// commit. On any other answer, roll `tx` back and answer it (a replay of
    /// `Completed`, a refusal of the rest).
    ///
    /// What it changes about failures and duplicates:
    /// - **A rollback, or a crash before the commit, leaves nothing behind**: the
    ///   PROCESSING record was never committed, so nothing lapses, is taken over or needs
    ///   reconciling; a retry runs again.
    /// - **A concurrent duplicate waits on the record's row** (its claim statement blocks
    ///   on the uncommitted key until `tx` ends), then replays what `tx` committed (or
    ///   acquires, if `tx` rolled back). It holds a connection while it waits. Bound the
    ///   wait with `SET LOCAL lock_timeout = '2s'` in its transaction before the claim: a
    ///   wait that runs out answers [`StoreClaim::InProgress`] (`lease_ends_at` now, by
    ///   this process's clock), and that transaction is aborted: roll it back. (Any lock
    ///   the claim waited for counts: a migration holding the records table answers so
    ///   too, for as long as it holds it.)
    /// - **It locks only a row it takes**: answering a replay, `InProgress` or `Mismatch`
    ///   it holds no lock, so an open transaction that was answered so delays nobody.
    /// - **`lease` bounds the transaction**: [`complete_in`] after the lease's end is
    ///   refused ([`StoreError::LeaseLost`]), so a transaction that ran too long commits
    ///   nothing. Nobody else can take the key over meanwhile (the record is not
    ///   visible to them), so choose it long enough for the slowest transaction.
    /// - **Records other processes made** (this store's own claims, each its own
    ///   commit) meet this claim as they meet any: a live PROCESSING one is `InProgress`,
    ///   and fencing by token holds.
    ///
    /// Choose it when the effects live in this database; not when the transaction
    /// would hold a call to another service: the row lock and the connection are held
    /// for that call's duration, and duplicates queue on them (use the store's own
    /// claim and [`complete_in`] then). Call it first in `tx`: a lock wait that times
    /// out aborts `tx`. Under READ COMMITTED (the default); under REPEATABLE READ or
    /// SERIALIZABLE a duplicate's wait ends in a serialization error instead of a
    /// replay.
    pub async fn claim_in<T: Transaction>(
        &self,
        tx: &T,
        key: &Key,
        fp: Fingerprint,
        lease: Duration,
    ) -> Result<StoreClaim, StoreError> {
        self.claim_in_correlated(tx, key, fp, lease, None).await
    }

    /// [`claim_in`](Self::claim_in), an acquired record keeping `correlation_id`.
    pub(crate) async fn claim_in_correlated<T: Transaction>(
        &self,
        tx: &T,
        key: &Key,
        fp: Fingerprint,
        lease: Duration,
        correlation_id: Option<&str>,
    ) -> Result<StoreClaim, StoreError> {
        let lapse_ttl = lapse_ttl_micros(self.lapse);
        let (key, first) = (key.as_bytes(), CLAIM_ABSENT);
        match claim_on(tx, first, key, fp, lease, lapse_ttl, correlation_id).await {
            Err(StoreError::Backend(e)) if lock_wait_ran_out(&*e) => {
                Ok(StoreClaim::InProgress { lease_ends_at: SystemTime::now() })
            }
            answer => answer,
        }
    }
}

/// Whether `e` is PostgreSQL's `lock_not_available` (a `lock_timeout` that ran out).
pub(crate) fn lock_wait_ran_out(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<tokio_postgres::Error>()
        .and_then(tokio_postgres::Error::code)
        .is_some_and(|code| *code == SqlState::LOCK_NOT_AVAILABLE)
}

/// The types of [`COMPLETE`]'s parameters.
const COMPLETE_TYPES: &[Type] = &[Type::BYTEA, Type::INT8, Type::BYTEA, Type::INT8];

/// Completes `claim` with `body` inside `tx`, a transaction on the database the
/// [`PostgresStore`](crate::PostgresStore) keeps its records in, so that the record
/// commits with your business writes in `tx`, or neither does. Returns the record as it
/// will be replayed once `tx` commits. (A deadpool-postgres transaction derefs to
/// tokio-postgres's: pass `&tx`.)
///
/// Refused with [`StoreError::LeaseLost`] if the claim no longer owns its key (the
/// lease lapsed, or it was settled): roll `tx` back then, someone else owns the key.
/// Hands the claim over first ([`OpenClaim::hand_over`]): the HTTP layer then neither
/// renews the lease (a renewal would wait on the row this write locks until `tx` ends)
/// nor completes the claim itself. Under REPEATABLE READ or SERIALIZABLE, a concurrent
/// change of the record fails `tx` with a serialization error: roll back and retry.
pub async fn complete_in<T: Transaction>(
    tx: &T,
    claim: &OpenClaim,
    body: Option<&[u8]>,
) -> Result<Replay<SystemTime>, StoreError> {
    let ttl = claim.result_ttl();
    check_duration("result TTL", ttl)?;
    claim.hand_over();
    let key = claim.key();
    let params: [&(dyn ToSql + Sync); 4] =
        [&key.as_bytes(), &decode::token(claim.token()), &body, &micros(ttl)];
    let rows = tx.rows(COMPLETE, &params, COMPLETE_TYPES).await?;
    let row = rows.first().ok_or_else(|| StoreError::LeaseLost(key.clone()))?;
    let at: i64 = column(row, 0, key.as_bytes())?;
    let until: i64 = column(row, 1, key.as_bytes())?;
    Ok(decode::replay(body.map(Bytes::copy_from_slice), at, until))
}
