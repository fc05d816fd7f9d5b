//! The PostgreSQL outbox's table and statements, driver-free: the tokio-postgres driver
//! (`idemcache_postgres::outbox`) and the sqlx one (`idemcache_sqlx::outbox::postgres`)
//! run these same strings, so both crates share one table and one behaviour.
//!
//! Invariant: a row is leased by one claim at a time, and every mark is fenced by the
//! token of the claim that leased it. [`CLAIM`] is one statement that picks due rows
//! `FOR UPDATE SKIP LOCKED` and leases them with a new token each, so two relays never
//! wait on each other and never lease one row together; a row whose lease lapsed is due
//! again and its next claim's token is higher.
//!
//! # Ordering per aggregate key
//!
//! A row with an aggregate key is due only while no earlier row (lower `seq`) of the same
//! key is undelivered (pending, leased or dead): the rows of one key are published one at
//! a time, in enqueue order. A dead row holds back the later rows of its key until it is
//! requeued and delivered (or deleted by hand): the order is kept, not skipped.
//!
//! `seq` is taken at the insert, so enqueue order would be insert order, not commit
//! order: two transactions enqueuing for one key at once could commit in the other order,
//! and a claim then lease the later row (the earlier not yet visible). So [`ENQUEUE`]
//! locks the key until its transaction ends before it draws `seq`: the producers of one
//! key are serialized from their enqueue to their commit.
//!
//! # Wake-up
//!
//! [`ENQUEUE`] also runs `pg_notify('idemcache_outbox', '')`. PostgreSQL delivers the
//! notification at the commit (and not at all on a rollback), once per transaction
//! however many rows it enqueued, to every session that ran `LISTEN idemcache_outbox`
//! ([`LISTEN`]). A relay that listens claims at once; polling remains the fallback (a
//! notification is lost while no relay listens).
//!
//! # Times
//!
//! Every time is microseconds since the Unix epoch. `created_at` is the server's clock;
//! the others are the relay's (`now` in each call), so that leases and backoff run on
//! one clock and a test can drive it by hand. Relays that share a table should share a
//! synchronized clock; a skew shortens or lengthens leases by as much.

macro_rules! schema {
    () => {
        r#"
CREATE TABLE IF NOT EXISTS idemcache_outbox (
    seq             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id      TEXT COLLATE "C" NOT NULL UNIQUE,
    topic           TEXT COLLATE "C" NOT NULL,
    payload         BYTEA NOT NULL,
    headers         BYTEA NOT NULL,
    aggregate_key   TEXT COLLATE "C",
    state           BIGINT NOT NULL,
    attempts        BIGINT NOT NULL,
    next_attempt_at BIGINT NOT NULL,
    lease_until     BIGINT,
    token           BIGINT NOT NULL,
    last_error      TEXT,
    created_at      BIGINT NOT NULL,
    delivered_at    BIGINT
);
CREATE INDEX IF NOT EXISTS idemcache_outbox_key ON idemcache_outbox (aggregate_key, seq)
    WHERE aggregate_key IS NOT NULL AND state <> 2;
CREATE INDEX IF NOT EXISTS idemcache_outbox_delivered ON idemcache_outbox (delivered_at)
    WHERE state = 2;
CREATE INDEX IF NOT EXISTS idemcache_outbox_dead ON idemcache_outbox (seq) WHERE state = 3;
CREATE INDEX IF NOT EXISTS idemcache_outbox_due ON idemcache_outbox (next_attempt_at)
    WHERE state IN (0, 1);
"#
    };
}

/// The outbox's table. `seq` is enqueue order; `message_id` is unique and compares byte
/// for byte (`COLLATE "C"`); `headers` is [`encode_headers`](super::encode_headers)'s
/// form; `state` a [`State::code`](super::State::code). Partial indexes serve the claim
/// (due rows, undelivered rows per key), the purge (delivered rows) and `list_dead`.
pub const SCHEMA: &str = schema!();

/// [`SCHEMA`] as one statement several processes may run at once: skipped when the last
/// index exists, else run under an advisory lock (the inbox's reasoning: see
/// `inbox::postgres::ENSURE_SCHEMA`).
pub const ENSURE_SCHEMA: &str = concat!(
    "DO $idemcache$ BEGIN IF to_regclass('idemcache_outbox_due') IS NULL THEN ",
    "PERFORM pg_advisory_xact_lock(7315993123);",
    schema!(),
    " END IF; END $idemcache$;"
);

/// The notification channel of [`ENQUEUE`].
pub const CHANNEL: &str = "idemcache_outbox";

/// Subscribes a session to [`CHANNEL`].
pub const LISTEN: &str = "LISTEN idemcache_outbox";

/// The columns every read returns, in [`RawRow`](super::decode::RawRow)'s order.
macro_rules! columns {
    ($t:literal) => {
        concat!(
            $t,
            ".seq, ",
            $t,
            ".message_id, ",
            $t,
            ".topic, ",
            $t,
            ".payload, ",
            $t,
            ".headers, ",
            $t,
            ".aggregate_key, ",
            $t,
            ".state, ",
            $t,
            ".attempts, ",
            $t,
            ".next_attempt_at, ",
            $t,
            ".lease_until, ",
            $t,
            ".token, ",
            $t,
            ".last_error, ",
            $t,
            ".created_at, ",
            $t,
            ".delivered_at"
        )
    };
}

/// Inserts a pending row, due at once, and notifies [`CHANNEL`] (at the commit).
/// Parameters: `$1` message id, `$2` topic, `$3` payload, `$4` encoded headers, `$5`
/// aggregate key (or NULL). A row with the same id fails with SQLSTATE 23505.
///
/// A keyed row first takes the key's transaction-scoped advisory lock
/// ([`KEY_LOCK_CLASS`], the key's `hashtext`), and only then draws its `seq`: a second
/// transaction enqueueing the same key waits until the first commits or rolls back, so
/// `seq` order is commit order within a key and a relay never sees a later message of a
/// key committed while an earlier one is still invisible to it. (The aggregate holds
/// every row before the insert runs: the lock comes first.) Keys whose hashes collide
/// only wait for each other.
pub const ENQUEUE: &str = "
WITH key_lock AS (
    SELECT pg_advisory_xact_lock(1768189794, hashtext($5::text)) WHERE $5::text IS NOT NULL),
ins AS (
    INSERT INTO idemcache_outbox (message_id, topic, payload, headers, aggregate_key, state,
                                  attempts, next_attempt_at, token, created_at)
    SELECT $1::text, $2::text, $3::bytea, $4::bytea, $5::text, 0, 0, 0, 0,
           (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
    FROM (SELECT count(*) FROM key_lock) AS locked
    RETURNING 1)
SELECT pg_notify('idemcache_outbox', '') FROM ins";

/// The first key of the advisory locks [`ENQUEUE`] takes per aggregate key
/// (`0x69646f62`, "idob"): the two-key form keeps them apart from an application's
/// one-key (`bigint`) advisory locks.
pub const KEY_LOCK_CLASS: i32 = 0x6964_6f62;

/// Leases up to `$2` due rows, oldest first, skipping rows another claim holds: a row is
/// due when pending or leased with `next_attempt_at <= $1` (now) and no earlier row of
/// its aggregate key is undelivered. Each gets `token + 1` and a lease to `$3` (no
/// attempt: [`BEGIN_ATTEMPT`] counts one as its publish begins). Returns the leased rows'
/// columns (in no particular order). A token that is negative or at `i64::MAX` (written
/// by hand) becomes -1 rather than overflow, which would fail every claim: the row reads
/// as corrupt, and is reported at each claim.
pub const CLAIM: &str = concat!(
    "
UPDATE idemcache_outbox AS o
SET state = 1,
    token = CASE WHEN o.token BETWEEN 0 AND 9223372036854775806 THEN o.token + 1 ELSE -1 END,
    lease_until = $3::bigint, next_attempt_at = $3::bigint
FROM (
    SELECT c.seq FROM idemcache_outbox AS c
    WHERE c.state IN (0, 1) AND c.next_attempt_at <= $1::bigint
      AND (c.aggregate_key IS NULL OR NOT EXISTS (
          SELECT 1 FROM idemcache_outbox AS e
          WHERE e.aggregate_key = c.aggregate_key AND e.seq < c.seq AND e.state <> 2))
    ORDER BY c.seq LIMIT $2::bigint
    FOR UPDATE OF c SKIP LOCKED) AS due
WHERE o.seq = due.seq
RETURNING ",
    columns!("o")
);

/// Counts an attempt of `$1`'s row as its publish begins, if it is leased under token
/// `$2`; one row affected or none (stale: another claim took it, and publishes it). A
/// counter at `i64::MAX` or below zero becomes -1 (the row reads as corrupt).
pub const BEGIN_ATTEMPT: &str = "
UPDATE idemcache_outbox
SET attempts = CASE WHEN attempts BETWEEN 0 AND 9223372036854775806 THEN attempts + 1 ELSE -1 END
WHERE message_id = $1::text AND token = $2::bigint AND state = 1";

/// [`DELIVERED`] of `$1` (token `$2`, at `$3`) and [`BEGIN_ATTEMPT`] of `$4` (token
/// `$5`) in one statement: the rows each changed (0 or 1), in that order.
pub const DELIVERED_AND_BEGIN: &str = "
WITH delivered AS (
    UPDATE idemcache_outbox
    SET state = 2, delivered_at = $3::bigint, lease_until = NULL
    WHERE message_id = $1::text AND token = $2::bigint AND state = 1
    RETURNING 1),
begun AS (
    UPDATE idemcache_outbox
    SET attempts = CASE WHEN attempts BETWEEN 0 AND 9223372036854775806 THEN attempts + 1 ELSE -1 END
    WHERE message_id = $4::text AND token = $5::bigint AND state = 1
    RETURNING 1)
SELECT (SELECT count(*) FROM delivered), (SELECT count(*) FROM begun)";

/// Marks `$1`'s row delivered at `$3` if it is leased under token `$2`; one row affected
/// or none (stale).
pub const DELIVERED: &str = "
UPDATE idemcache_outbox
SET state = 2, delivered_at = $3::bigint, lease_until = NULL
WHERE message_id = $1::text AND token = $2::bigint AND state = 1";

/// Marks `$1`'s row failed if it is leased under token `$2`: state `$3` (pending or
/// dead), due at `$4`, `$5` the error. One row affected or none (stale).
pub const FAILED: &str = "
UPDATE idemcache_outbox
SET state = $3::bigint, next_attempt_at = $4::bigint, lease_until = NULL,
    last_error = $5::text
WHERE message_id = $1::text AND token = $2::bigint AND state = 1";

/// Up to `$1` dead rows, oldest first.
pub const LIST_DEAD: &str = concat!(
    "SELECT ",
    columns!("o"),
    " FROM idemcache_outbox AS o WHERE o.state = 3 ORDER BY o.seq LIMIT $1::bigint"
);

/// The row of message `$1`, in any state.
pub const INSPECT: &str =
    concat!("SELECT ", columns!("o"), " FROM idemcache_outbox AS o WHERE o.message_id = $1::text");

/// Makes `$1`'s dead row pending again, due at once, with its attempts reset (its last
/// error kept); one row affected, or none if it is not dead.
pub const REQUEUE: &str = "
UPDATE idemcache_outbox SET state = 0, attempts = 0, next_attempt_at = 0, lease_until = NULL
WHERE message_id = $1::text AND state = 3";

/// Deletes up to `$2` rows delivered before `$1`, oldest first, skipping rows another
/// purge is deleting.
pub const PURGE: &str = "
DELETE FROM idemcache_outbox WHERE seq IN (
    SELECT seq FROM idemcache_outbox
    WHERE state = 2 AND delivered_at < $1::bigint ORDER BY delivered_at LIMIT $2::bigint
    FOR UPDATE SKIP LOCKED)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_runs_inside_the_once_block_and_reads_return_every_column() {
        assert!(ENSURE_SCHEMA.contains(SCHEMA.trim()));
        for read in [CLAIM, LIST_DEAD, INSPECT] {
            assert!(read.contains("o.seq, o.message_id") && read.contains("o.delivered_at"));
        }
        assert!(ENQUEUE.contains(CHANNEL) && LISTEN.ends_with(CHANNEL));
        assert!(ENQUEUE.contains(&format!("pg_advisory_xact_lock({KEY_LOCK_CLASS}, ")));
    }
}
