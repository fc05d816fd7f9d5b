//! Completing a claim in your own sqlx transaction, so that the record commits with
//! the business change it records, or not at all: `PgStore::complete_in` and
//! `MySqlStore::complete_in` (as `idemcache_postgres::complete_in` for tokio-postgres).
//!
//! Invariant: the write is the store's own completion (`idemcache-sql`'s `COMPLETE` of
//! each dialect), fenced by the claim's token and judged by the server's clock when it
//! runs; it changes nothing but the claim's record, and commits or rolls back with the
//! caller's transaction. A concurrent takeover of the key and this write serialize on
//! the record's row: whichever commits first wins, and the other finds the winner's row
//! (a takeover finds it COMPLETED and replays; this write finds a new token and is
//! refused).

#[cfg(feature = "postgres")]
use idemcache::store::StoreClaim;
#[cfg(feature = "postgres")]
use idemcache::{Fingerprint, Key};
#[cfg(feature = "postgres")]
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
            None,
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
fn lock_wait_ran_out(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<sqlx::Error>()
        .and_then(|e| e.as_database_error())
        .and_then(|e| e.code())
        .is_some_and(|code| code == "55P03")
}

#[cfg(feature = "mysql")]
impl crate::MySqlStore {
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
