//! The consumer inbox on your own sqlx transaction: the module `postgres` (feature `postgres`)
//! and the module `mysql` (feature `mysql`, MySQL and MariaDB). Each `receive(&mut tx, consumer,
//! message_id, fingerprint)` claims a (consumer, message id) with one claiming `INSERT`
//! in the transaction that applies the message, so the record and the business change
//! commit together and a rollback leaves neither. See [`idemcache_sql::inbox`] for the flow
//! (apply on [`Receipt::New`], commit, then acknowledge) and the vocabulary, re-exported
//! here.
//!
//! Invariant (both engines): [`Receipt::New`] is answered only when this transaction's
//! `INSERT` wrote the row; a row already there is read back, never read first and then
//! inserted; and a second delivery of a message another transaction holds uncommitted is
//! answered [`Receipt::InFlight`] within a bound, never after that transaction's whole
//! run.

// The inbox's vocabulary and its purge loop (`idemcache-sql`'s), re-exported so that one
// path imports the whole inbox of this driver.
pub use idemcache_sql::inbox::{
    purge_loop, InboxError, KnownMessages, Purger, Receipt, Retention, RetentionError,
};

/// An engine module's `purge` over any executor of `$db`: its `PURGE` statement (in
/// scope) bound with the cutoff and `$limit`, the count of the `LIMIT`'s type; `$doc`
/// says what the engine's deletes skip. Written once for both engines.
#[cfg(any(feature = "mysql", feature = "postgres"))]
macro_rules! purge_operation {
    ($db:ty, $limit:ty, $doc:literal) => {
        #[doc = $doc]
        pub async fn purge<'e, E>(
            executor: E,
            cutoff: SystemTime,
            limit: usize,
        ) -> Result<usize, InboxError>
        where
            E: Executor<'e, Database = $db>,
        {
            if limit == 0 {
                return Ok(0);
            }
            let limit = <$limit>::try_from(limit).unwrap_or(<$limit>::MAX);
            let purge = sqlx::query(PURGE).bind(to_micros(cutoff)).bind(limit);
            let done = purge.execute(executor).await.map_err(database)?;
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

/// A sqlx error as the inbox's database error.
#[cfg(any(feature = "mysql", feature = "postgres"))]
fn database(e: sqlx::Error) -> InboxError {
    InboxError::Database(Box::new(e))
}

/// What a receive's read of the record answered, told to `receiving`: an error the
/// engine's `conflict` names means the message is in flight elsewhere; a column sqlx
/// cannot decode is the record's, unreadable.
#[cfg(any(feature = "mysql", feature = "postgres"))]
fn read_answer(
    receiving: &mut idemcache_sql::inbox::receive::Receiving<'_>,
    stored: Result<Option<Vec<u8>>, sqlx::Error>,
    conflict: fn(&sqlx::Error) -> bool,
) -> Result<(), InboxError> {
    match stored {
        Ok(bytes) => receiving.read(bytes.as_deref()),
        Err(e) if conflict(&e) => {
            receiving.conflicted();
            Ok(())
        }
        Err(sqlx::Error::ColumnDecode { source, .. }) => {
            Err(receiving.unreadable(format_args!("column fingerprint: {source}")))
        }
        Err(e) => Err(database(e)),
    }
}
