//! The MySQL/MariaDB outbox's table and statements (InnoDB), driver-free, run by
//! `idemcache_sqlx::outbox::mysql`.
//!
//! Invariant: as [`postgres`](super::postgres)'s: a row is leased by one claim at a time
//! and every mark is fenced by its claim's token. MySQL and MariaDB have no
//! `UPDATE ... RETURNING`, so a claim is a short transaction of three statements:
//! [`CLAIM_PICK`] locks due rows `FOR UPDATE SKIP LOCKED` (MySQL 8.0+, MariaDB 10.6+),
//! [`claim_lease`] leases them, [`claim_read`] reads them back, then the commit. The
//! driver runs it at READ COMMITTED, so that the pick takes no gap locks that would
//! make a concurrent `enqueue` wait.
//!
//! Ordering per aggregate key, the times and the dead rows are as
//! [`postgres`](super::postgres) describes; MySQL has no notification, so relays poll.

/// The outbox's tables: `idemcache_outbox` as PostgreSQL's, with `VARBINARY` text columns so that ids compare
/// byte for byte (the server's default collations ignore case and trailing spaces), and
/// `headers` a `MEDIUMBLOB`: the most headers a message may carry encode to 278,848
/// bytes, past a `BLOB`'s 65,535. `idemcache_outbox_keys` holds the [`KEY_BUCKETS`] rows
/// [`KEY_LOCK`] locks, made once, here.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idemcache_outbox (
    seq             BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    message_id      VARBINARY(255) NOT NULL,
    topic           VARBINARY(255) NOT NULL,
    payload         LONGBLOB NOT NULL,
    headers         MEDIUMBLOB NOT NULL,
    aggregate_key   VARBINARY(255) NULL,
    state           BIGINT NOT NULL,
    attempts        BIGINT NOT NULL,
    next_attempt_at BIGINT NOT NULL,
    lease_until     BIGINT NULL,
    token           BIGINT NOT NULL,
    last_error      VARBINARY(4000) NULL,
    created_at      BIGINT NOT NULL,
    delivered_at    BIGINT NULL,
    UNIQUE KEY idemcache_outbox_id (message_id),
    KEY idemcache_outbox_due (state, next_attempt_at),
    KEY idemcache_outbox_key (aggregate_key, seq),
    KEY idemcache_outbox_delivered (state, delivered_at)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS idemcache_outbox_keys (
    bucket INT NOT NULL PRIMARY KEY
) ENGINE=InnoDB;
INSERT IGNORE INTO idemcache_outbox_keys (bucket)
SELECT a.d + 4 * b.d + 16 * c.d + 64 * e.d + 256 * f.d
FROM (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3) AS a,
     (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3) AS b,
     (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3) AS c,
     (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3) AS e,
     (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3) AS f";

/// How many rows [`KEY_LOCK`] spreads the aggregate keys over (the `bucket`s 0 to
/// 1023 that [`SCHEMA`] creates).
pub const KEY_BUCKETS: u32 = 1024;

const COLUMNS: &str = "seq, message_id, topic, payload, headers, aggregate_key, state, \
                       attempts, next_attempt_at, lease_until, token, last_error, \
                       created_at, delivered_at";

/// Inserts a pending row, due at once. Parameters: message id, topic, payload, encoded
/// headers, aggregate key (or NULL). A row with the same id fails with error 1062.
pub const ENQUEUE: &str = "
INSERT INTO idemcache_outbox (message_id, topic, payload, headers, aggregate_key, state,
                              attempts, next_attempt_at, token, created_at)
VALUES (?, ?, ?, ?, ?, 0, 0, 0, 0,
        TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)))";

/// Locks an aggregate key until the transaction ends, before a keyed row is enqueued
/// (parameter: the key); returns the locked bucket, or no row when the buckets were never
/// made (the driver refuses to enqueue then: with no row to lock, nothing would wait).
/// MySQL has no transaction-scoped advisory lock, so the lock is one of the
/// [`KEY_BUCKETS`] rows of `idemcache_outbox_keys`, chosen by the key's CRC-32, locked
/// `FOR UPDATE`. A second transaction enqueueing the key waits until the first ends, so
/// `seq` order is commit order within a key (see
/// [`postgres::ENQUEUE`](super::postgres::ENQUEUE)); keys sharing a bucket wait for each
/// other too. The rows exist before any producer: a row a producer inserted itself and
/// rolled back would leave its waiters holding a gap lock that stops other keys' first
/// enqueues, and can fail a waiter as a deadlock.
pub const KEY_LOCK: &str = "
SELECT bucket FROM idemcache_outbox_keys WHERE bucket = CRC32(?) % 1024 FOR UPDATE";

/// Sets the next transaction's isolation to READ COMMITTED (run before the claim's
/// `BEGIN`).
pub const CLAIM_ISOLATION: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// Locks up to the second parameter's count of due rows (the first: now), oldest first,
/// skipping rows another claim holds; returns their `seq`.
pub const CLAIM_PICK: &str = "
SELECT c.seq FROM idemcache_outbox AS c
WHERE c.state IN (0, 1) AND c.next_attempt_at <= ?
  AND (c.aggregate_key IS NULL OR NOT EXISTS (
      SELECT 1 FROM idemcache_outbox AS e
      WHERE e.aggregate_key = c.aggregate_key AND e.seq < c.seq AND e.state <> 2))
ORDER BY c.seq LIMIT ?
FOR UPDATE SKIP LOCKED";

/// Leases `n` picked rows: parameters the lease end (twice), then the `n` seqs. No
/// attempt is counted ([`BEGIN_ATTEMPT`] counts one as a publish begins). A token that
/// is negative or at `i64::MAX` becomes -1, as in PostgreSQL's
/// [`CLAIM`](super::postgres::CLAIM): an overflow would fail every claim.
pub fn claim_lease(n: usize) -> String {
    format!(
        "UPDATE idemcache_outbox SET state = 1, \
         token = CASE WHEN token BETWEEN 0 AND 9223372036854775806 THEN token + 1 ELSE -1 END, \
         lease_until = ?, next_attempt_at = ? WHERE seq IN ({})",
        placeholders(n)
    )
}

/// Reads `n` leased rows back: parameters the `n` seqs.
pub fn claim_read(n: usize) -> String {
    format!("SELECT {COLUMNS} FROM idemcache_outbox WHERE seq IN ({})", placeholders(n))
}

fn placeholders(n: usize) -> String {
    vec!["?"; n.max(1)].join(", ")
}

/// Counts an attempt of the row (message id, token) as its publish begins, if it is
/// still leased under that token: parameters message id, token. As PostgreSQL's
/// [`BEGIN_ATTEMPT`](super::postgres::BEGIN_ATTEMPT).
pub const BEGIN_ATTEMPT: &str = "
UPDATE idemcache_outbox
SET attempts = CASE WHEN attempts BETWEEN 0 AND 9223372036854775806 THEN attempts + 1 ELSE -1 END
WHERE message_id = ? AND token = ? AND state = 1";

/// Marks the row (message id, token) delivered at the first parameter's time:
/// parameters delivered-at, message id, token.
pub const DELIVERED: &str = "
UPDATE idemcache_outbox SET state = 2, delivered_at = ?, lease_until = NULL
WHERE message_id = ? AND token = ? AND state = 1";

/// Marks the row failed: parameters state (pending or dead), due at, error, message id,
/// token.
pub const FAILED: &str = "
UPDATE idemcache_outbox SET state = ?, next_attempt_at = ?, lease_until = NULL, last_error = ?
WHERE message_id = ? AND token = ? AND state = 1";

/// Up to the parameter's count of dead rows, oldest first.
pub const LIST_DEAD: &str = concat!(
    "SELECT seq, message_id, topic, payload, headers, aggregate_key, state, attempts, ",
    "next_attempt_at, lease_until, token, last_error, created_at, delivered_at ",
    "FROM idemcache_outbox WHERE state = 3 ORDER BY seq LIMIT ?"
);

/// The row of the message id, in any state.
pub const INSPECT: &str = concat!(
    "SELECT seq, message_id, topic, payload, headers, aggregate_key, state, attempts, ",
    "next_attempt_at, lease_until, token, last_error, created_at, delivered_at ",
    "FROM idemcache_outbox WHERE message_id = ?"
);

/// Makes the message id's dead row pending again, due at once, attempts reset.
pub const REQUEUE: &str = "
UPDATE idemcache_outbox SET state = 0, attempts = 0, next_attempt_at = 0, lease_until = NULL
WHERE message_id = ? AND state = 3";

/// Deletes up to the second parameter's count of rows delivered before the first,
/// oldest first.
pub const PURGE: &str =
    "DELETE FROM idemcache_outbox WHERE state = 2 AND delivered_at < ? ORDER BY delivered_at LIMIT ?";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reads_return_every_column_in_order() {
        assert!(LIST_DEAD.contains(COLUMNS) && INSPECT.contains(COLUMNS));
        assert!(claim_read(2).ends_with("seq IN (?, ?)"));
        assert!(claim_lease(1).ends_with("seq IN (?)"));
    }
}
