//! The transactional outbox on your own sqlx transaction: the module `postgres` (feature
//! `postgres`) and the module `mysql` (feature `mysql`, MySQL 8.0+ and MariaDB 10.6+, for
//! `SKIP LOCKED`). Each `enqueue(&mut tx, &message)` writes a message in the transaction
//! that makes the business change, so both commit together and a rollback leaves
//! neither; each module's `Storage` is a relay's over a sqlx pool. See
//! [`idemcache_sql::outbox`] for the flow and the vocabulary, re-exported here.
//!
//! Invariant (both engines): a row is leased by one claim at a time, without waiting on
//! another relay's claim, under a token higher than every earlier claim's of the row,
//! and every mark is fenced by that token. PostgreSQL's table and statements are
//! `idemcache_postgres::outbox`'s, so both crates may share one table.

// The outbox's vocabulary and relay (`idemcache-sql`'s), re-exported so that one path
// imports the whole outbox of this driver.
pub use idemcache_sql::outbox::{
    purge_loop, relay_batch, relay_loop, Batch, BatchReport, Claimed, Lease, Mark, OutboxAdmin,
    OutboxError, OutboxMessage, OutboxRow, OutboxStorage, PublishError, Publisher, RelaySettings,
    Retry,
};

#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;

/// A sqlx error as the outbox's database error.
#[cfg(any(feature = "mysql", feature = "postgres"))]
fn database(e: sqlx::Error) -> OutboxError {
    OutboxError::Database(Box::new(e))
}

/// What a fenced `UPDATE` did: one row changed, or none (stale).
#[cfg(any(feature = "mysql", feature = "postgres"))]
fn mark(changed: u64) -> Mark {
    if changed == 1 {
        Mark::Applied
    } else {
        Mark::Stale
    }
}

/// A lease's token as stored.
#[cfg(any(feature = "mysql", feature = "postgres"))]
fn token(lease: &Lease) -> Result<i64, OutboxError> {
    i64::try_from(lease.token)
        .map_err(|_| OutboxError::InvalidInput(format!("a token of {} is no row's", lease.token)))
}

/// The state and due time a failure leaves a row in.
#[cfg(any(feature = "mysql", feature = "postgres"))]
fn failed_as(lease: &Lease, now: std::time::SystemTime, retry: &Retry) -> (i64, i64) {
    use idemcache::store::encoding::to_micros;
    use idemcache_sql::outbox::{Next, State};
    match retry.after(lease.attempts, now) {
        Next::At(at) => (State::Pending.code(), to_micros(at)),
        Next::Dead => (State::Dead.code(), to_micros(now)),
    }
}

/// Reads a row's fourteen columns (`RawRow`'s order) with sqlx, text as `$text`:
/// a column that cannot be read is `Corrupt`, naming the row's id.
#[cfg(any(feature = "mysql", feature = "postgres"))]
macro_rules! raw_row {
    ($row:expr, $text:ty, $bytes:expr) => {{
        use sqlx::Row as _;
        let row = $row;
        let id: String = row
            .try_get::<$text, _>(1)
            .map(|t| String::from_utf8_lossy(&$bytes(t)).into_owned())
            .unwrap_or_else(|_| "?".to_owned());
        let corrupt = |column: &str, e: sqlx::Error| {
            idemcache_sql::outbox::OutboxError::corrupt(&id, format_args!("column {column}: {e}"))
        };
        (|| {
            Ok(idemcache_sql::outbox::decode::RawRow {
                seq: row.try_get::<i64, _>(0).map_err(|e| corrupt("seq", e))?,
                message_id: $bytes(
                    row.try_get::<$text, _>(1).map_err(|e| corrupt("message_id", e))?,
                ),
                topic: $bytes(row.try_get::<$text, _>(2).map_err(|e| corrupt("topic", e))?),
                payload: row.try_get::<Vec<u8>, _>(3).map_err(|e| corrupt("payload", e))?,
                headers: row.try_get::<Vec<u8>, _>(4).map_err(|e| corrupt("headers", e))?,
                aggregate_key: row
                    .try_get::<Option<$text>, _>(5)
                    .map_err(|e| corrupt("aggregate_key", e))?
                    .map($bytes),
                state: row.try_get::<i64, _>(6).map_err(|e| corrupt("state", e))?,
                attempts: row.try_get::<i64, _>(7).map_err(|e| corrupt("attempts", e))?,
                next_attempt_at: row
                    .try_get::<i64, _>(8)
                    .map_err(|e| corrupt("next_attempt_at", e))?,
                lease_until: row
                    .try_get::<Option<i64>, _>(9)
                    .map_err(|e| corrupt("lease_until", e))?,
                token: row.try_get::<i64, _>(10).map_err(|e| corrupt("token", e))?,
                last_error: row
                    .try_get::<Option<$text>, _>(11)
                    .map_err(|e| corrupt("last_error", e))?
                    .map($bytes),
                created_at: row.try_get::<i64, _>(12).map_err(|e| corrupt("created_at", e))?,
                delivered_at: row
                    .try_get::<Option<i64>, _>(13)
                    .map_err(|e| corrupt("delivered_at", e))?,
            })
        })()
    }};
}
#[cfg(any(feature = "mysql", feature = "postgres"))]
use raw_row;
