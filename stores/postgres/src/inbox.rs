//! The consumer inbox in PostgreSQL, on your own tokio-postgres transaction:
//! [`receive`] claims a (consumer, message id) with one
//! `INSERT ... ON CONFLICT DO NOTHING` in the transaction that applies the message, so
//! the record and the business change commit together and a rollback leaves neither.
//! See [`idemcache_sql::inbox`] for the flow (apply on [`Receipt::New`], commit, then
//! acknowledge).
//!
//! Invariant: the one of [`idemcache_sql::inbox::postgres`], whose statements this module
//! runs (the sqlx driver runs the same ones, so both may share one table):
//! [`Receipt::New`] only when this transaction's `INSERT` wrote the row, and no
//! `receive` waits on another `receive`'s uncommitted record (an advisory try-lock in
//! the claiming statement answers [`Receipt::InFlight`] at once). Its docs explain the
//! lock, the isolation levels (under REPEATABLE READ or SERIALIZABLE a concurrent commit
//! is `InFlight` and aborts the transaction) and retention.
//!
//! # Purging
//!
//! [`purge`] deletes a batch of records older than a cutoff; [`purge_loop`]
//! runs it for as long as the program runs, asking a [`Purger`] for the cutoff each
//! round (so it keeps the dedup window, and purges nothing in the first redelivery
//! horizon after a start). Over a deadpool pool, each batch takes a connection:
//!
//! ```no_run
//! use std::time::{Duration, SystemTime};
//!
//! use idemcache::purge::{self, Round, Schedule};
//! use idemcache_postgres::deadpool_postgres::Pool;
//! use idemcache_postgres::inbox::{self, InboxError, Purger, Retention};
//!
//! # async fn run(pool: Pool) -> Result<(), Box<dyn std::error::Error>> {
//! let hour = Duration::from_secs(3600);
//! let purger = Purger::new(Retention::new(24 * hour, hour)?, SystemTime::now());
//! let batch = move |cutoff, limit| {
//!     let pool = pool.clone();
//!     async move {
//!         let client = pool.get().await.map_err(|e| InboxError::Database(e.into()))?;
//!         inbox::purge(&**client, cutoff, limit).await
//!     }
//! };
//! let every_minute = Schedule::every(Duration::from_secs(60))?;
//! tokio::spawn(idemcache_postgres::inbox::purge_loop(purger, batch, every_minute, tokio::time::sleep, |round| {
//!     if let Round::Failed { error, .. } = round {
//!         eprintln!("purging the inbox failed: {error}"); // the loop goes on
//!     }
//! }));
//! # Ok(())
//! # }
//! ```

use std::time::SystemTime;

use tokio_postgres::error::SqlState;
use tokio_postgres::GenericClient;

use crate::Transaction;

use idemcache::store::encoding::to_micros;
use idemcache::Fingerprint;
use idemcache_sql::inbox::check;

// The inbox's vocabulary and its purge loop (`idemcache-sql`'s), re-exported so that one
// path imports the whole inbox of this driver.
pub use idemcache_sql::inbox::{
    purge_loop, InboxError, KnownMessages, Purger, Receipt, Retention, RetentionError,
};

use idemcache_sql::inbox::postgres::{self, CLAIM, ENSURE_SCHEMA, PURGE, READ};
pub use idemcache_sql::inbox::postgres::{lock_key, ADVISORY_LOCK_CLASS, SCHEMA};
use idemcache_sql::inbox::receive::{Receiving, Step, Vanished};

/// Creates the inbox's table and index if they do not exist, holding an advisory lock
/// so that several processes may run it at once; when they exist it takes no lock at all
/// (a starting consumer never waits for the others' open transactions). One multi-statement query, so it is
/// one transaction of its own on a client (`&client`, or `&**object` for a deadpool
/// object), or part of yours on a [`Transaction`].
pub async fn ensure_schema<C: GenericClient + Sync>(client: &C) -> Result<(), InboxError> {
    client.batch_execute(ENSURE_SCHEMA).await.map_err(database)
}

/// Claims (consumer, message id) inside `tx`, the transaction that applies the message:
/// [`Receipt::New`] if this transaction inserted the record (apply, commit, then
/// acknowledge), [`Receipt::Duplicate`] or [`Receipt::Mismatch`] if a committed record
/// (or this transaction's own) is there with this or another fingerprint,
/// [`Receipt::InFlight`] if another transaction holds the message (see the module docs:
/// at once, with `tx` still usable) or, under snapshot isolation, committed it after
/// `tx`'s snapshot (`tx` is then aborted). Consumer and id are checked by
/// [`idemcache_sql::inbox::check`]. One round trip, two on a conflict.
pub async fn receive(
    tx: &impl Transaction,
    consumer: &str,
    message_id: &str,
    fingerprint: Fingerprint,
) -> Result<Receipt, InboxError> {
    check(consumer, message_id)?;
    let lock = lock_key(consumer, message_id);
    let fp = fingerprint.to_bytes();
    // A record that a concurrent purge deletes between the claim and the read is
    // claimed again (this transaction still holds the lock).
    let mut receiving = Receiving::new(consumer, message_id, fingerprint, Vanished::ClaimAgain);
    let serialization =
        |e: &tokio_postgres::Error| e.code() == Some(&SqlState::T_R_SERIALIZATION_FAILURE);
    loop {
        match receiving.next() {
            Step::Answer(receipt) => return Ok(receipt),
            Step::Claim => {
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
                    [&ADVISORY_LOCK_CLASS, &lock, &consumer, &message_id, &&fp[..]];
                match tx.connection().query_one(CLAIM, &params).await {
                    Ok(row) => {
                        let got: Option<bool> = row.try_get(0).map_err(database)?;
                        let inserted: i64 = row.try_get(1).map_err(database)?;
                        receiving.claimed(postgres::claimed(got, inserted));
                    }
                    Err(e) if serialization(&e) => receiving.conflicted(),
                    Err(e) => return Err(database(e)),
                }
            }
            Step::Read => match tx.connection().query_opt(READ, &[&consumer, &message_id]).await {
                Ok(None) => receiving.read(None)?,
                Ok(Some(row)) => {
                    let bytes: &[u8] = row.try_get(0).map_err(|e| {
                        receiving.unreadable(format_args!("column fingerprint: {e}"))
                    })?;
                    receiving.read(Some(bytes))?;
                }
                Err(e) if serialization(&e) => receiving.conflicted(),
                Err(e) => return Err(database(e)),
            },
        }
    }
}

/// Deletes up to `limit` records received before `cutoff` (oldest first), skipping rows
/// another purge is deleting, and returns how many it deleted: call it until it returns
/// less than `limit`. `limit` 0 deletes nothing. Take `cutoff` from
/// [`Purger::cutoff`]; purge nothing when it is `None`. (Deleted rows leave dead tuples
/// until autovacuum; small batches let it keep up.)
pub async fn purge<C: GenericClient + Sync>(
    client: &C,
    cutoff: SystemTime,
    limit: usize,
) -> Result<usize, InboxError> {
    if limit == 0 {
        return Ok(0);
    }
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let deleted = client.execute(PURGE, &[&to_micros(cutoff), &limit]).await.map_err(database)?;
    Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
}

fn database(e: tokio_postgres::Error) -> InboxError {
    InboxError::Database(Box::new(e))
}
