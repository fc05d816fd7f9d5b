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
