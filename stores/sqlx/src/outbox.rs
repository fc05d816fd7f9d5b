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

/// An engine module's `Storage`: a relay's and an operator's outbox over a sqlx pool
/// (`$pool`), each operation the module's free function of the same name on the pool,
/// but the claim, which is the module's `claim_from_pool` (an engine's claim may need a
/// connection of its own for its transaction). Written once for both engines.
#[cfg(any(feature = "mysql", feature = "postgres"))]
macro_rules! pool_storage {
    ($pool:ty, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone)]
        pub struct Storage {
            pool: $pool,
        }

        impl Storage {
            /// The storage over `pool` (the schema is not created: [`ensure_schema`]).
            pub fn new(pool: $pool) -> Storage {
                Storage { pool }
            }

            /// The pool, for the operations neither trait runs.
            pub fn pool(&self) -> &$pool {
                &self.pool
            }
        }

        impl OutboxStorage for Storage {
            async fn claim_due(
                &self,
                batch: usize,
                lease: Duration,
                now: SystemTime,
            ) -> Result<Batch, OutboxError> {
                claim_from_pool(&self.pool, batch, lease, now).await
            }

            async fn begin_attempt(&self, lease: &Lease) -> Result<Mark, OutboxError> {
                begin_attempt(&self.pool, lease).await
            }

            async fn mark_delivered_and_begin(
                &self,
                lease: &Lease,
                now: SystemTime,
                next: &Lease,
            ) -> (Result<Mark, OutboxError>, Result<Mark, OutboxError>) {
                mark_delivered_and_begin(&self.pool, lease, now, next).await
            }

            async fn mark_delivered(
                &self,
                lease: &Lease,
                now: SystemTime,
            ) -> Result<Mark, OutboxError> {
                mark_delivered(&self.pool, lease, now).await
            }

            async fn mark_failed(
                &self,
                lease: &Lease,
                error: &str,
                now: SystemTime,
                retry: &Retry,
            ) -> Result<Mark, OutboxError> {
                mark_failed(&self.pool, lease, error, now, retry).await
            }
        }

        impl OutboxAdmin for Storage {
            async fn list_dead(&self, limit: usize) -> Result<Vec<OutboxRow>, OutboxError> {
                list_dead(&self.pool, limit).await
            }

            async fn inspect(&self, message_id: &str) -> Result<Option<OutboxRow>, OutboxError> {
                inspect(&self.pool, message_id).await
            }

            async fn requeue(&self, message_id: &str) -> Result<bool, OutboxError> {
                requeue(&self.pool, message_id).await
            }

            async fn purge_delivered(
                &self,
                cutoff: SystemTime,
                limit: usize,
            ) -> Result<usize, OutboxError> {
                purge_delivered(&self.pool, cutoff, limit).await
            }
        }
    };
}

/// An engine module's operator operations (`list_dead`, `inspect`, `requeue`,
/// `purge_delivered`) over any executor of `$db`, each one of the engine's statements
/// (`LIST_DEAD`, `INSPECT`, `REQUEUE`, `PURGE` in scope) bound through the module's
/// `id` (a message id as the engine's column takes it) and `limit` (a count as its
/// `LIMIT` takes it). Written once for both engines.
#[cfg(any(feature = "mysql", feature = "postgres"))]
macro_rules! admin_operations {
    ($db:ty) => {
        /// Up to `limit` dead rows, oldest first.
        pub async fn list_dead<'e, E>(
            executor: E,
            limit: usize,
        ) -> Result<Vec<OutboxRow>, OutboxError>
        where
            E: Executor<'e, Database = $db>,
        {
            let rows = sqlx::query(LIST_DEAD)
                .bind(self::limit(limit))
                .fetch_all(executor)
                .await
                .map_err(database)?;
            rows.iter().map(|r| decode::row(raw(r)?).map(|(_, row)| row)).collect()
        }

        /// The row of `message_id`, in any state, or `None`.
        pub async fn inspect<'e, E>(
            executor: E,
            message_id: &str,
        ) -> Result<Option<OutboxRow>, OutboxError>
        where
            E: Executor<'e, Database = $db>,
        {
            let query = sqlx::query(INSPECT).bind(id(message_id));
            let found = query.fetch_optional(executor).await.map_err(database)?;
            found.map(|r| decode::row(raw(&r)?).map(|(_, row)| row)).transpose()
        }

        /// Makes a dead row pending again, due at once, its attempts reset: `true` if it
        /// was dead.
        pub async fn requeue<'e, E>(executor: E, message_id: &str) -> Result<bool, OutboxError>
        where
            E: Executor<'e, Database = $db>,
        {
            let query = sqlx::query(REQUEUE).bind(id(message_id));
            let done = query.execute(executor).await.map_err(database)?;
            Ok(done.rows_affected() == 1)
        }

        /// Deletes up to `limit` rows delivered before `cutoff` (oldest first) and
        /// returns how many. `limit` 0 deletes nothing.
        pub async fn purge_delivered<'e, E>(
            executor: E,
            cutoff: SystemTime,
            limit: usize,
        ) -> Result<usize, OutboxError>
        where
            E: Executor<'e, Database = $db>,
        {
            if limit == 0 {
                return Ok(0);
            }
            let query = sqlx::query(PURGE).bind(to_micros(cutoff)).bind(self::limit(limit));
            let done = query.execute(executor).await.map_err(database)?;
            Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
        }
    };
}

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
