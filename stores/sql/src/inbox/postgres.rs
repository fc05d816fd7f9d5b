//! The PostgreSQL inbox's table and statements, driver-free: the tokio-postgres driver
//! (`idemcache_postgres::inbox`) and the sqlx one (`idemcache_sqlx::inbox::postgres`) run
//! these same strings, so both crates share one table and one behaviour, and a driver of
//! your own can too.
//!
//! Invariant: [`Receipt::New`](super::Receipt::New) only when the transaction's own
//! [`CLAIM`] inserted the row; a row already there is read back ([`READ`], never read
//! first and then inserted) to tell a duplicate from a mismatch; and no claim waits on
//! another claim's uncommitted record. (A [`PURGE`] run inside a transaction that stays
//! open holds the rows it deleted, and a redelivery of one of them waits for it: run it
//! on its own, as one short statement.)
//!
//! # A second delivery does not wait: the advisory lock
//!
//! Before its `INSERT`, [`CLAIM`] takes `pg_try_advisory_xact_lock(ADVISORY_LOCK_CLASS,
//! lock_key(consumer, id))` in the same statement. A transaction holding an uncommitted
//! record of the message holds that lock until it ends, so a second delivery meanwhile
//! is answered `InFlight` at once, and its transaction stays usable. Without it the
//! `INSERT` would wait on the uncommitted row for the first transaction's whole run.
//! (`SET LOCAL lock_timeout` was not chosen: its timeout is an error that aborts the
//! caller's transaction, and it answers only after waiting.) PostgreSQL releases the
//! lock at the end of the transaction, after its commit is visible, so the next
//! delivery's `INSERT` sees the committed record.
//!
//! The keys are the two-integer form, a key space apart from the one-bigint form the
//! store's schema lock uses: the first integer names the inbox, the second is a hash.
//! Two messages whose hashes collide only share the lock (a spurious `InFlight`, then a
//! redelivery). Only the claim should write the table; a row inserted otherwise,
//! uncommitted, would still be waited on. Advisory locks belong to the database, not to
//! a schema: inbox tables in several schemas of one database share them.
//!
//! The lock is held to the end of the transaction whatever the claim answered, so a
//! delivery that meets a transaction still judging the same message (one answered
//! `Duplicate` that has not ended yet) is `InFlight` too: end a duplicate's transaction
//! at once; the redelivery after it is `Duplicate`.
//!
//! # Isolation
//!
//! READ COMMITTED (PostgreSQL's default) is what the inbox needs: the read after a
//! conflict is a new statement with a new snapshot, so it sees the record the conflict
//! found. Under REPEATABLE READ or SERIALIZABLE a record another transaction committed
//! after this transaction's snapshot makes the claim fail with SQLSTATE 40001
//! ("could not serialize access due to concurrent update"): the drivers answer
//! `InFlight`, and **the transaction is aborted**: roll back and let the redelivery
//! decide.
//!
//! # Retention
//!
//! `received_at` is microseconds since the Unix epoch on the server's clock
//! (`clock_timestamp()` at the `INSERT`), indexed; [`PURGE`] deletes records received
//! before a cutoff (take it from a [`Purger`](super::Purger)) in bounded batches.

use idemcache::Fingerprint;

macro_rules! schema {
    () => {
        r#"
CREATE TABLE IF NOT EXISTS idemcache_inbox (
    consumer    TEXT COLLATE "C" NOT NULL,
    message_id  TEXT COLLATE "C" NOT NULL,
    fingerprint BYTEA NOT NULL,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS idemcache_inbox_received ON idemcache_inbox (received_at);
"#
    };
}

/// The inbox's table: keyed by consumer and message id, so several consumers of one
/// message each record it; `COLLATE "C"` compares byte for byte (`"M-1"`, `"m-1"` and
/// `"m-1 "` are three messages). `fingerprint` is [`Fingerprint::to_bytes`];
/// `received_at` is microseconds since the epoch on the server's clock, indexed for
/// [`PURGE`].
pub const SCHEMA: &str = schema!();

/// [`SCHEMA`] as one statement that several processes may run at once: skipped (no lock
/// taken) when the table's last index exists, else run under a one-bigint advisory
/// lock. The check comes first because `CREATE INDEX IF NOT EXISTS` takes the table's
/// lock before it finds the index, waiting for every open transaction on the inbox while
/// later ones queue behind it; the lock because concurrent `CREATE ... IF NOT EXISTS`
/// can still collide on the catalog's unique indexes.
pub const ENSURE_SCHEMA: &str = concat!(
    "DO $idemcache$ BEGIN IF to_regclass('idemcache_inbox_received') IS NULL THEN ",
    "PERFORM pg_advisory_xact_lock(7315993122);",
    schema!(),
    " END IF; END $idemcache$;"
);

/// The first key of the inbox's advisory locks: names the inbox in `pg_locks`.
pub const ADVISORY_LOCK_CLASS: i32 = 0x1de0_1b0c;

/// The lock, then the claim, in one statement (one round trip on the happy path): the
/// `INSERT` reads its one row from `held`, so it runs only after the lock was taken and
/// inserts nothing if it was not. Parameters: `$1` [`ADVISORY_LOCK_CLASS`], `$2`
/// [`lock_key`], `$3` consumer, `$4` message id, `$5` fingerprint bytes. Returns one row:
/// (got the lock, rows inserted).
pub const CLAIM: &str = "
WITH held AS (SELECT pg_try_advisory_xact_lock($1::int4, $2::int4) AS got),
claimed AS (
    INSERT INTO idemcache_inbox (consumer, message_id, fingerprint, received_at)
    SELECT $3::text, $4::text, $5::bytea,
           (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
    FROM held WHERE got
    ON CONFLICT (consumer, message_id) DO NOTHING
    RETURNING 1)
SELECT (SELECT got FROM held), (SELECT count(*) FROM claimed)";

/// The stored fingerprint of (`$1` consumer, `$2` message id), after a claim conflicted.
pub const READ: &str =
    "SELECT fingerprint FROM idemcache_inbox WHERE consumer = $1::text AND message_id = $2::text";

/// Deletes up to `$2` records received before `$1` (µs), oldest first; `SKIP LOCKED` so
/// that two purgers never wait on each other.
pub const PURGE: &str = "
DELETE FROM idemcache_inbox WHERE (consumer, message_id) IN (
    SELECT consumer, message_id FROM idemcache_inbox
    WHERE received_at < $1::bigint ORDER BY received_at LIMIT $2::bigint
    FOR UPDATE SKIP LOCKED)";

/// What [`CLAIM`] did, from its row: whether it got the message's advisory lock
/// (`NULL` or false: another transaction holds the message) and how many records it
/// inserted (one: new; none: the record was there).
pub fn claimed(got_lock: Option<bool>, inserted: i64) -> super::receive::Claimed {
    use super::receive::Claimed;
    match (got_lock, inserted) {
        (Some(true), 1) => Claimed::Inserted,
        (Some(true), _) => Claimed::Exists,
        _ => Claimed::Held,
    }
}

/// The second key of (consumer, message id)'s advisory lock: 32 bits of the XXH3-128
/// digest of the pair, length-prefixed so that no two pairs share an input.
pub fn lock_key(consumer: &str, message_id: &str) -> i32 {
    let mut input = Vec::with_capacity(16 + consumer.len() + message_id.len());
    input.extend_from_slice(&(consumer.len() as u64).to_be_bytes());
    input.extend_from_slice(consumer.as_bytes());
    input.extend_from_slice(&(message_id.len() as u64).to_be_bytes());
    input.extend_from_slice(message_id.as_bytes());
    Fingerprint::of(&input).as_u128() as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_are_length_prefixed() {
        // "ab" + "c" and "a" + "bc" concatenate alike; the prefixes keep them apart.
        assert_ne!(lock_key("ab", "c"), lock_key("a", "bc"));
        assert_eq!(lock_key("ledger", "m-1"), lock_key("ledger", "m-1"));
    }

    #[test]
    fn the_schema_runs_inside_the_once_block() {
        assert!(ENSURE_SCHEMA.contains(SCHEMA.trim()));
        assert!(ENSURE_SCHEMA.starts_with("DO $idemcache$"));
    }
}
