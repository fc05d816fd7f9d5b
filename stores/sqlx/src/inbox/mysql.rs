//! The consumer inbox on a sqlx MySQL or MariaDB transaction (InnoDB).
//!
//! Invariant: [`Receipt::New`] only when this transaction's plain `INSERT` wrote the
//! row; a duplicate key (error 1062 `ER_DUP_ENTRY`, a statement-level error that leaves
//! the transaction alive) is followed by one locking read of the stored fingerprint;
//! and the wait on another transaction's uncommitted record is bounded by
//! [`LOCK_WAIT_SECONDS`].
//!
//! # Isolation: the locking read
//!
//! REPEATABLE READ (InnoDB's default) and READ COMMITTED both work, because the read
//! after a duplicate key is a *locking* read (`LOCK IN SHARE MODE`): it reads the latest
//! committed row, not the transaction's snapshot. A plain `SELECT` under REPEATABLE
//! READ reads the snapshot taken at the transaction's first read, and misses a record
//! committed after it: the `INSERT` would say "duplicate" and the read "nothing".
//!
//! Share mode, not `FOR UPDATE`: the failed `INSERT` already holds a shared lock on the
//! duplicate row, so the read needs no new lock; `FOR UPDATE` would upgrade it to an
//! exclusive one, and two concurrent duplicates of one committed message, each holding
//! its shared lock and waiting for the other's, would deadlock (error 1213).
//!
//! # A second delivery waits at most `LOCK_WAIT_SECONDS`
//!
//! InnoDB makes an `INSERT` that meets another transaction's uncommitted row wait for
//! that transaction; it is the one statement of `receive` that can wait (the read after
//! it reads a row the insert already holds). On MariaDB the insert carries its own
//! bound, `SET STATEMENT innodb_lock_wait_timeout = 1 FOR`, in a comment only MariaDB
//! executes (`/*M! ... */`), so nothing of it outlives the statement and a `receive`
//! future dropped mid-way (a timeout around it, a cancelled task) leaves the session as
//! it was. (The dropped statement still runs to its end on the server, and sqlx hands
//! its error, a 1205 or a 1062, to the connection's next statement: a `rollback` then
//! fails, the transaction ended all the same.) MySQL has no `SET STATEMENT`: there the
//! session's `innodb_lock_wait_timeout` is set to [`LOCK_WAIT_SECONDS`] around the
//! statements and restored to the session's own value after them (kept in the session
//! variable `@idemcache_inbox_lock_wait`; on MariaDB the same two statements keep the
//! value as it is). On MySQL, then, a `receive` dropped mid-way leaves the session's
//! lock wait at [`LOCK_WAIT_SECONDS`]: roll that transaction back and close its
//! connection (`conn.close()`, or `detach()` from the pool) rather than reuse it. A
//! timeout (error 1205, which rolls back only the statement unless the server runs with
//! `innodb_rollback_on_timeout`) is answered [`Receipt::InFlight`]: roll back and
//! reject with requeue. Chosen over MySQL's named locks (`GET_LOCK(name, 0)`, which
//! would answer at once), because those belong to the session, not the transaction:
//! nothing would release one when your transaction commits. The price is two extra
//! round trips per receive (the `SET`s before and after, which MariaDB runs too, to no
//! effect: telling the servers apart before them would cost one more).
//!
//! A deadlock (error 1213), which InnoDB resolves by rolling back a whole transaction,
//! is answered `InFlight` too; the transaction is then already rolled back. So is
//! MariaDB's refusal to read, under `innodb_snapshot_isolation` (on by default from
//! 11.6), a record committed after the transaction's snapshot (error 1020): the
//! redelivery, in a transaction of its own, reads it and is a `Duplicate`.
//!
//! # Retention
//!
//! `received_at` is microseconds since the epoch on the server's clock, in UTC (no
//! session time zone enters it); [`purge`] deletes in bounded batches before a cutoff
//! from a [`Purger`](super::Purger).

use std::time::SystemTime;

use sqlx::mysql::MySqlDatabaseError;
use sqlx::{Executor, MySql, Transaction};

use idemcache::store::encoding::to_micros;
use idemcache::store::unique::MYSQL_DUP_ENTRY;
use idemcache::Fingerprint;
use idemcache_sql::inbox::check;
use idemcache_sql::inbox::receive::{Claimed, Receiving, Step, Vanished};
use idemcache_sql::transition::is_conflict_mysql_code;

use super::{database, read_answer, InboxError, Receipt};

/// The inbox's table, created by [`ensure_schema`] (idempotent). Keyed by consumer and
/// message id, in `VARBINARY` columns so that they compare byte for byte: the server's
/// default collations ignore case and trailing spaces, which would make `"M-1"` and
/// `"m-1 "` the message `"m-1"`. `fingerprint` is [`Fingerprint::to_bytes`];
/// `received_at` microseconds since the epoch (server clock, UTC), indexed for
/// [`purge`].
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idemcache_inbox (
    consumer    VARBINARY(200) NOT NULL,
    message_id  VARBINARY(255) NOT NULL,
    fingerprint VARBINARY(16) NOT NULL,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (consumer, message_id),
    KEY idemcache_inbox_received (received_at)
) ENGINE=InnoDB";

/// How long a `receive` waits for another transaction's uncommitted record of the same
/// message before answering [`Receipt::InFlight`]: 1 s, the least `innodb_lock_wait_timeout`
/// MySQL accepts.
pub const LOCK_WAIT_SECONDS: u32 = 1;

/// MySQL's bound, around the statements. The condition is true on MySQL and false on
/// MariaDB by the same executable comment [`CLAIM`]'s bound is in, so exactly one of the
/// two bounds applies on any server (a version string can be set to anything): on
/// MariaDB, whose insert bounds itself, the session's value is left as it is.
const BOUND_WAIT: &str = "SET @idemcache_inbox_lock_wait = @@SESSION.innodb_lock_wait_timeout, \
                          SESSION innodb_lock_wait_timeout = IF(TRUE /*M! AND FALSE */, 1, \
                          @@SESSION.innodb_lock_wait_timeout)";
const RESTORE_WAIT: &str = "SET SESSION innodb_lock_wait_timeout = @idemcache_inbox_lock_wait";

/// The comment is MariaDB's executable comment: MariaDB bounds the insert's wait itself;
/// MySQL reads a comment.
const CLAIM: &str = "/*M! SET STATEMENT innodb_lock_wait_timeout = 1 FOR */
INSERT INTO idemcache_inbox (consumer, message_id, fingerprint, received_at)
VALUES (?, ?, ?, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))";

const READ: &str = "SELECT fingerprint FROM idemcache_inbox \
                    WHERE consumer = ? AND message_id = ? LOCK IN SHARE MODE";

const PURGE: &str =
    "DELETE FROM idemcache_inbox WHERE received_at < ? ORDER BY received_at LIMIT ?";

/// Creates the inbox's table (and its index) if it does not exist: one statement, safe
/// to run on every start and from several processes. Takes a pool, a connection or a
/// transaction (`&mut *tx`; DDL commits it implicitly).
pub async fn ensure_schema<'e, E>(executor: E) -> Result<(), InboxError>
where
    E: Executor<'e, Database = MySql>,
{
    executor.execute(sqlx::raw_sql(SCHEMA)).await.map(drop).map_err(database)
}

/// Claims (consumer, message id) inside `tx`, the transaction that applies the message:
/// [`Receipt::New`] if this transaction inserted the record (apply, commit, then
/// acknowledge); [`Receipt::Duplicate`] / [`Receipt::Mismatch`] if a committed record (or
/// this transaction's own) has this or another fingerprint; [`Receipt::InFlight`] if
/// another transaction held the message for [`LOCK_WAIT_SECONDS`] (`tx` stays usable),
/// on a deadlock (`tx` was rolled back), or when MariaDB's snapshot isolation refuses
/// to read a record committed after `tx`'s snapshot: roll back, requeue. Three round
/// trips, four on a conflict.
pub async fn receive(
    tx: &mut Transaction<'_, MySql>,
    consumer: &str,
    message_id: &str,
    fingerprint: Fingerprint,
) -> Result<Receipt, InboxError> {
    check(consumer, message_id)?;
    (&mut **tx).execute(sqlx::raw_sql(BOUND_WAIT)).await.map_err(database)?;
    let answer = claim(tx, consumer, message_id, fingerprint).await;
    // Restored whatever the claim said: SET is not transactional, so it works even in a
    // transaction a deadlock rolled back.
    let restored = (&mut **tx).execute(sqlx::raw_sql(RESTORE_WAIT)).await.map_err(database);
    let answer = answer?;
    restored?;
    Ok(answer)
}

async fn claim(
    tx: &mut Transaction<'_, MySql>,
    consumer: &str,
    message_id: &str,
    fingerprint: Fingerprint,
) -> Result<Receipt, InboxError> {
    let fp = fingerprint.to_bytes();
    // The failed INSERT holds a shared lock on the row: nothing can delete it.
    let mut receiving = Receiving::new(consumer, message_id, fingerprint, Vanished::Corrupt);
    loop {
        match receiving.next() {
            Step::Answer(receipt) => return Ok(receipt),
            Step::Claim => {
                let inserted = sqlx::query(CLAIM)
                    .bind(consumer.as_bytes())
                    .bind(message_id.as_bytes())
                    .bind(&fp[..])
                    .execute(&mut **tx)
                    .await;
                match inserted {
                    Ok(_) => receiving.claimed(Claimed::Inserted),
                    Err(e) => match number(&e) {
                        Some(MYSQL_DUP_ENTRY) => receiving.claimed(Claimed::Exists),
                        Some(code) if is_conflict_mysql_code(code) => receiving.conflicted(),
                        _ => return Err(database(e)),
                    },
                }
            }
            Step::Read => {
                let stored = sqlx::query_scalar::<_, Vec<u8>>(READ)
                    .bind(consumer.as_bytes())
                    .bind(message_id.as_bytes())
                    .fetch_optional(&mut **tx)
                    .await;
                read_answer(&mut receiving, stored, conflicted)?;
            }
        }
    }
}

purge_operation!(
    MySql,
    u64,
    "Deletes up to `limit` records received before `cutoff` (oldest first) and returns how many: call it until it returns less than `limit`. `limit` 0 deletes nothing. Take `cutoff` from [`Purger::cutoff`](super::Purger::cutoff)."
);

/// Whether `e` is a conflict of InnoDB's (a lock wait timeout, a deadlock, a snapshot
/// MariaDB refuses to read past).
fn conflicted(e: &sqlx::Error) -> bool {
    number(e).is_some_and(is_conflict_mysql_code)
}

/// The server's error number of a sqlx error, if it is one.
fn number(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()?.try_downcast_ref::<MySqlDatabaseError>().map(|m| m.number())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_bounds_set_are_the_documented_one() {
        let seconds = super::LOCK_WAIT_SECONDS;
        let mysql = format!("IF(TRUE /*M! AND FALSE */, {seconds}, ");
        assert!(super::BOUND_WAIT.contains(&mysql), "{}", super::BOUND_WAIT);
        let mariadb = format!("/*M! SET STATEMENT innodb_lock_wait_timeout = {seconds} FOR */");
        assert!(super::CLAIM.starts_with(&mariadb), "{}", super::CLAIM);
    }
}
