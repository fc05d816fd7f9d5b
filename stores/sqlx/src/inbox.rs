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
