//! Completing a claim in your own sqlx transaction, so that the record commits with
//! the business change it records, or not at all: `PgStore::complete_in` and
//! `MySqlStore::complete_in` (as `idemcache_postgres::complete_in` for tokio-postgres);
//! and `claim_in` of each, the claim made in that transaction too, so that a first
//! execution is one commit.
//!
//! Invariant: the write is the store's own completion (`idemcache-sql`'s `COMPLETE` of
//! each dialect), fenced by the claim's token and judged by the server's clock when it
//! runs; it changes nothing but the claim's record, and commits or rolls back with the
//! caller's transaction. A concurrent takeover of the key and this write serialize on
//! the record's row: whichever commits first wins, and the other finds the winner's row
//! (a takeover finds it COMPLETED and replays; this write finds a new token and is
//! refused). A claim made in the caller's transaction decides on the record's row as it
//! stands there (locked, or inserted uncommitted) and never commits, rolls back or
//! retries that transaction.

#[cfg(any(feature = "postgres", feature = "mysql"))]
use idemcache::store::StoreClaim;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use idemcache::{Fingerprint, Key};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use std::time::Duration;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use std::time::SystemTime;

#[cfg(any(feature = "postgres", feature = "mysql"))]
use idemcache::store::encoding::{check_duration, micros};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use idemcache::store::{OpenClaim, StoreError};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use idemcache::{Bytes, Replay};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use idemcache_sql::records::decode;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use sqlx::Transaction;

#[cfg(feature = "postgres")]
impl crate::PgStore {
    /// Claims `key` for a request whose fingerprint is `fp` inside `tx`, your own
    /// transaction on the database this store keeps its records in: with
    /// [`complete_in`](Self::complete_in) and your business writes in the same `tx`, a
    /// first execution is one commit. As `idemcache_postgres`'s `PostgresStore::claim_in`
    /// (its docs say what changes): answers as the store's claim does; on `Acquired`,
    /// make the claim (`OpenClaim::new(key, token, result_ttl)`), write, complete, commit;
    /// on any other answer roll back and answer it. A rollback or a crash before the
    /// commit leaves no record; a concurrent duplicate waits on the record's row, then
    /// replays (`SET LOCAL lock_timeout` bounds the wait: `InProgress`, and that
    /// transaction is aborted); `lease` bounds the transaction.
    pub async fn claim_in(
        &self,
        tx: &mut Transaction<'_, sqlx::Postgres>,
        key: &Key,
        fp: Fingerprint,
        lease: Duration,
    ) -> Result<StoreClaim, StoreError> {
        self.claim_in_correlated(tx, key, fp, lease, None).await
    }

    /// [`claim_in`](Self::claim_in) as the layer's one-commit mode makes it: first the
    /// claim's turn on its key (`claim_turn`, an advisory lock every one-commit claim of
    /// the key takes), waited for at most `wait` (`lock_timeout`, the bound ending with
    /// the turn), then the claim, an acquired record keeping `correlation_id`. A turn
    /// another transaction holds past `wait` is `InProgress`; `tx` is then aborted.
    pub(crate) async fn claim_in_bounded(
        &self,
        tx: &mut Transaction<'_, sqlx::Postgres>,
        key: &Key,
        fp: Fingerprint,
        lease: Duration,
        wait: Duration,
        correlation_id: Option<&str>,
    ) -> Result<StoreClaim, StoreError> {
        use idemcache_sql::records::postgres::{bound_claim_wait, claim_turn, RESET_CLAIM_WAIT};
        let turn = format!(
            "{}; {}; {RESET_CLAIM_WAIT}",
            bound_claim_wait(wait),
            claim_turn(key.as_bytes())
        );
        match sqlx::raw_sql(sqlx::AssertSqlSafe(turn)).execute(&mut **tx).await {
            Err(e) if lock_wait_ran_out(&e) => {
                return Ok(StoreClaim::InProgress { lease_ends_at: SystemTime::now() });
            }
            taken => taken.map_err(|e| StoreError::Backend(Box::new(e)))?,
        };
        self.claim_in_correlated(tx, key, fp, lease, correlation_id).await
    }

    /// [`claim_in`](Self::claim_in), an acquired record keeping `correlation_id`.
    pub(crate) async fn claim_in_correlated(
        &self,
        tx: &mut Transaction<'_, sqlx::Postgres>,
        key: &Key,
        fp: Fingerprint,
        lease: Duration,
        correlation_id: Option<&str>,
    ) -> Result<StoreClaim, StoreError> {
        use idemcache::store::encoding::lapse_ttl_micros;
        let lapse_ttl = lapse_ttl_micros(self.lapse_policy());
        let mut connection: &mut sqlx::PgConnection = tx;
        let claimed = crate::store::postgres::claim_on(
            &mut connection,
            idemcache_sql::records::postgres::CLAIM_ABSENT,
            key.as_bytes(),
            fp,
            lease,
            lapse_ttl,
            correlation_id,
        )
        .await;
        match claimed {
            Err(StoreError::Backend(e)) if lock_wait_ran_out(&*e) => {
                Ok(StoreClaim::InProgress { lease_ends_at: SystemTime::now() })
            }
            answer => answer,
        }
    }

    /// Completes `claim` with `body` inside `tx`, a transaction on the database the
    /// store keeps its records in, so that the record commits with your business writes
    /// in `tx`, or neither does; the store's own completion statement, judged by the
    /// server's clock at the moment it runs. Returns the record as it will be replayed
    /// once `tx` commits.
    ///
    /// Refused with [`StoreError::LeaseLost`] if the claim no longer owns its key: roll
    /// `tx` back then. Hands the claim over first ([`OpenClaim::hand_over`]), so the HTTP
    /// layer neither renews its lease nor completes it itself. Under READ COMMITTED a
    /// concurrent takeover and this write serialize on the record's row: whichever
    /// commits first wins.
    pub async fn complete_in(
        tx: &mut Transaction<'_, sqlx::Postgres>,
        claim: &OpenClaim,
        body: Option<&[u8]>,
    ) -> Result<Replay<SystemTime>, StoreError> {
        let ttl = claim.result_ttl();
        check_duration("result TTL", ttl)?;
        claim.hand_over();
        let key = claim.key();
        let row = sqlx::query(idemcache_sql::records::postgres::COMPLETE)
            .bind(key.as_bytes())
            .bind(decode::token(claim.token()))
            .bind(body)
            .bind(micros(ttl))
            .fetch_optional(&mut **tx)
            .await
            .map_err(|e| StoreError::Backend(Box::new(e)))?;
        let row = row.ok_or_else(|| StoreError::LeaseLost(key.clone()))?;
        let (at, until) = crate::store::postgres::settled(&row, key)?;
        Ok(decode::replay(body.map(Bytes::copy_from_slice), at, until))
    }
}

/// Whether `e` is PostgreSQL's `lock_not_available` (a `lock_timeout` that ran out).
#[cfg(feature = "postgres")]
pub(crate) fn lock_wait_ran_out(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<sqlx::Error>()
        .and_then(|e| e.as_database_error())
        .and_then(|e| e.code())
        .is_some_and(|code| code == "55P03")
}

#[cfg(feature = "mysql")]
impl crate::MySqlStore {
    /// Claims `key` for a request whose fingerprint is `fp` inside `tx`, your own
    /// transaction on the database this store keeps its records in: with
    /// [`complete_in`](Self::complete_in) and your business writes in the same `tx`, a
    /// first execution is one commit. As `PgStore::claim_in`:
    /// answers as the store's claim does; on `Acquired`, make the claim
    /// (`OpenClaim::new(key, token, result_ttl)`), write, complete, commit; on any other
    /// answer roll back and answer it. A rollback or a crash before the commit leaves no
    /// record; `lease` bounds the transaction (a completion after it is refused).
    ///
    /// What is MySQL's own:
    /// - **A duplicate waits on the record's row, for at most the lease** in whole
    ///   seconds (at least 1), or the session's `innodb_lock_wait_timeout` if that is
    ///   less (set it lower before the claim to wait less). On MariaDB the bound is each
    ///   waiting statement's own (`SET STATEMENT ... FOR`), so a claim future dropped
    ///   mid-way leaves the session as it was; the number is in the statement's text,
    ///   so each lease length (in whole seconds) is a prepared statement of its own on
    ///   the connection: keep them few. MySQL has neither that nor `SET LOCAL`:
    ///   there the session's value is lowered for the claim's statements and restored
    ///   after them, and a claim future dropped mid-way leaves the lowered bound on the
    ///   connection (close it rather than reuse it). A wait that runs out answers
    ///   `InProgress` (`lease_ends_at` now, by this process's clock) with only the
    ///   claim's statement undone (all of `tx`, if the server runs with
    ///   `innodb_rollback_on_timeout`): roll back. So does a claim that MariaDB's
    ///   `innodb_snapshot_isolation` (on by default from 11.6) refuses to read a record
    ///   committed after `tx`'s snapshot (error 1020, when `tx` read before the claim):
    ///   roll back; the retry, in a new transaction, replays.
    /// - **Any answer holds the record's row** locked until `tx` ends (the claim reads
    ///   it exclusively locked, so that it can take a dead record over): end `tx` at
    ///   once when not `Acquired`. Locking reads see the latest committed row, so any
    ///   isolation level works (but for the snapshot isolation above).
    /// - **The token is minted in `tx`**, from an `AUTO_INCREMENT` sequence whose
    ///   value is handed out under a latch held for the statement only: the claim
    ///   needs no second connection, and its mint makes no claim wait for `tx`. A dead
    ///   record is taken over under a token above its own, so its old holder stays
    ///   fenced.
    /// - **A deadlock is an error, never retried here**: InnoDB has rolled back all of
    ///   `tx` (error 1213, in [`StoreError::Backend`] as the `sqlx::Error`); run the
    ///   request again in a new transaction, which waits, replays or runs as any claim
    ///   does. Your rows can make one (this claim waiting for a record's row that a
    ///   transaction holds while it waits for one of yours), and so can the claim
    ///   alone: two or more duplicates waiting on a first that rolls back always make
    ///   one, the row going with the first, their waits turning into gap locks, and
    ///   each insert then waiting for another's; one of them acquires. It is an error,
    ///   not `InProgress`, because a deadlock does not say whose the key is: a gap lock
    ///   another transaction took for a different key can be in the cycle while this
    ///   key is free.
    pub async fn claim_in(
        &self,
        tx: &mut Transaction<'_, sqlx::MySql>,
        key: &Key,
        fp: Fingerprint,
        lease: Duration,
    ) -> Result<StoreClaim, StoreError> {
        self.claim_in_bounded(tx, key, fp, lease, lease, None).await
    }

    /// [`claim_in`](Self::claim_in), its waits bounded by `wait` rather than the lease
    /// (whole seconds, at least 1), an acquired record keeping `correlation_id`.
    pub(crate) async fn claim_in_bounded(
        &self,
        tx: &mut sqlx::MySqlConnection,
        key: &Key,
        fp: Fingerprint,
        lease: Duration,
        wait: Duration,
        correlation_id: Option<&str>,
    ) -> Result<StoreClaim, StoreError> {
        match self.claim_in_conn(tx, key, fp, lease, wait, correlation_id).await {
            Err(StoreError::Backend(e)) if mysql_not_readable_now(&*e) => {
                Ok(StoreClaim::InProgress { lease_ends_at: SystemTime::now() })
            }
            answer => answer,
        }
    }

    /// Completes `claim` with `body` inside `tx`, a transaction on the database the
    /// store keeps its records in, so that the record commits with your business writes
    /// in `tx`, or neither does; the store's own completion, fenced by the claim's
    /// token and judged by the server's clock when it runs. Returns the record as it
    /// will be replayed once `tx` commits.
    ///
    /// Refused with [`StoreError::LeaseLost`] if the claim no longer owns its key: roll
    /// `tx` back then. Hands the claim over first ([`OpenClaim::hand_over`]), so the HTTP
    /// layer neither renews its lease nor completes it itself. The write locks the
    /// record's row until `tx` ends (InnoDB's `UPDATE` reads the latest committed row
    /// whatever the isolation), so a concurrent claim of the key waits for `tx`.
    pub async fn complete_in(
        tx: &mut Transaction<'_, sqlx::MySql>,
        claim: &OpenClaim,
        body: Option<&[u8]>,
    ) -> Result<Replay<SystemTime>, StoreError> {
        use crate::store::mysql::{bind, now};
        use idemcache_sql::records::mysql::{Values, COMPLETE};

        let ttl = claim.result_ttl();
        check_duration("result TTL", ttl)?;
        claim.hand_over();
        let key = claim.key();
        let backend = |e: sqlx::Error| StoreError::Backend(Box::new(e));
        let now = now(tx).await.map_err(backend)?;
        let values = Values {
            key: key.as_bytes(),
            token: decode::token(claim.token()),
            now,
            duration: micros(ttl),
            body,
            ..Values::default()
        };
        let done = bind(&COMPLETE, &values).execute(&mut **tx).await.map_err(backend)?;
        if done.rows_affected() == 0 {
            return Err(StoreError::LeaseLost(key.clone()));
        }
        Ok(decode::replay(
            body.map(Bytes::copy_from_slice),
            now,
            now.saturating_add(values.duration),
        ))
    }
}

/// Whether `e` says the record's row could not be read now, though another transaction
/// has it or had it: MySQL's `ER_LOCK_WAIT_TIMEOUT` (an `innodb_lock_wait_timeout` that
/// ran out), or MariaDB's `ER_CHECKREAD` (under `innodb_snapshot_isolation`, a row
/// committed after the transaction's snapshot).
#[cfg(feature = "mysql")]
fn mysql_not_readable_now(e: &(dyn std::error::Error + 'static)) -> bool {
    use idemcache_sql::{records::mysql::LOCK_WAIT_TIMEOUT, transition::MARIADB_CHECKREAD};
    e.downcast_ref::<sqlx::Error>()
        .and_then(|e| e.as_database_error())
        .and_then(|e| e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .is_some_and(|e| matches!(e.number(), LOCK_WAIT_TIMEOUT | MARIADB_CHECKREAD))
}
