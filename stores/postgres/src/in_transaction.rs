//! [`complete_in`]: a claim's completion written in the caller's own transaction, so
//! that it commits with the business change it records, or not at all.
//!
//! Invariant: the write is the store's own completion (the same statement,
//! `idemcache-sql`'s `COMPLETE`, judged by the server's clock), fenced by the claim's
//! token and refused once the key has moved on; it changes nothing but the claim's
//! record, and commits or rolls back with the caller's transaction. Under READ
//! COMMITTED (PostgreSQL's default) a concurrent takeover of the key and this write
//! serialize on the record's row: whichever commits first wins, and the other sees
//! the winner's row (a takeover finds it COMPLETED and replays; this write finds a new
//! token and is refused).

use std::time::SystemTime;

use tokio_postgres::types::ToSql;
use tokio_postgres::Transaction;

use idemcache::store::encoding::{check_duration, micros};
use idemcache::store::{OpenClaim, StoreError};
use idemcache::{Bytes, Replay};
use idemcache_sql::records::{decode, postgres::COMPLETE};

use crate::{backend, column};

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
pub async fn complete_in(
    tx: &Transaction<'_>,
    claim: &OpenClaim,
    body: Option<&[u8]>,
) -> Result<Replay<SystemTime>, StoreError> {
    let ttl = claim.result_ttl();
    check_duration("result TTL", ttl)?;
    claim.hand_over();
    let key = claim.key();
    let params: [&(dyn ToSql + Sync); 4] =
        [&key.as_bytes(), &decode::token(claim.token()), &body, &micros(ttl)];
    let rows = tx.query(COMPLETE, &params).await.map_err(backend)?;
    let row = rows.first().ok_or_else(|| StoreError::LeaseLost(key.clone()))?;
    let at: i64 = column(row, 0, key.as_bytes())?;
    let until: i64 = column(row, 1, key.as_bytes())?;
    Ok(decode::replay(body.map(Bytes::copy_from_slice), at, until))
}
