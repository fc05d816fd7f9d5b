//! The records table in MySQL and MariaDB (InnoDB): its schema and statements, with the
//! order of each statement's parameters as data ([`Statement::params`]), so that a
//! driver binds them from one [`Values`] and cannot bind them out of order.
//!
//! MySQL has no `RETURNING` on `UPDATE` and no single statement that inserts-or-takes
//! over and reads the holder as PostgreSQL's claim does, so a claim here is a short
//! transaction and every other write one statement with the server's now bound in:
//!
//! - **Now** is the server's clock in microseconds ([`NOW`]:
//!   `TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))`, arithmetic on UTC,
//!   whatever the session's time zone). Every write but the claim first reads it with
//!   [`NOW`] and binds it ([`Param::Now`]), so the write is judged by the server's clock
//!   read a moment before, and returns what it stored without a second read.
//! - **Tokens** come from [`MINT`]: an insert into `idemcache_token_seq`, whose
//!   `AUTO_INCREMENT` column hands each insert a value no other insert gets, then
//!   [`MINTED`] deletes the row again. The token is the insert's last-insert id (the OK
//!   packet's). InnoDB allocates the value under a latch held for the statement only,
//!   never returns it (not on a rollback either) and keeps the counter across
//!   restarts (MySQL 8.0, MariaDB 10.2.4 and later), so the mint locks nothing another
//!   claim waits for, wherever it runs: on a connection of its own, or in the caller's
//!   own transaction (the one-commit claim, which so needs no second connection). A
//!   token minted for a claim that took nothing is never used, which costs nothing.
//!   (An earlier release counted in the one row of `idemcache_tokens`, which each mint
//!   locked until its transaction ended; [`SCHEMA`] starts the sequence 2^32 above that
//!   counter, so processes of that release still running during an upgrade mint tokens
//!   no new one will.)
//! - **The claim** is one transaction on one connection, at READ COMMITTED (`SET
//!   TRANSACTION ISOLATION LEVEL READ COMMITTED` before it begins): [`LOOK`] reads the
//!   server's now and the key's record with `SELECT ... FOR UPDATE`, which locks the
//!   record's row until the transaction ends. The decision
//!   ([`decode::claim`](super::decode::claim)) is made on that locked row, so nothing can
//!   change it before the write: a dead record is taken over with [`TAKE_OVER`], a lapse
//!   turned with [`TURN_UNKNOWN`] (both also fenced by the token `LOOK` read); a live one
//!   is answered and the transaction rolled back. An absent key has no row to lock:
//!   [`TAKE_NEW`] inserts it, and the primary key decides between concurrent claims (a
//!   second `INSERT` of the key waits for the first transaction, then fails with a
//!   duplicate key, error 1062): the loser rolls back and runs the claim again, finding
//!   the winner's row. A deadlock (1213, which InnoDB resolves by rolling one transaction
//!   back) is run again the same way. So the claim is one atomic step: a read-then-write
//!   only under the row's lock, or an insert only the key's uniqueness lets through.
//!   (A server logging its binary log by statement, `binlog_format = STATEMENT`,
//!   refuses InnoDB writes at READ COMMITTED, error 1665: use `ROW` or `MIXED`, the
//!   defaults of MySQL and MariaDB.)
//! - **The claim in a caller's transaction** (one commit per first execution): the token
//!   minted as above, in that transaction, then [`TAKE_NEW_OR_LOCK`] inserts the record or locks the key's
//!   row, and [`LOOK`] reads it; the decision is made on that locked row as above. The
//!   transaction, its isolation and its end are the caller's; [`bound_claim_wait`]
//!   bounds the wait on another transaction's row.
//! - **Every other write** is one statement (in a READ COMMITTED transaction of its own,
//!   with the read of [`NOW`] before it; a deadlock rolls both back and they run again)
//!   naming the claim's token in its `WHERE`
//!   (and the record's state and expiry, against the bound now), and tells by its
//!   affected-row count whether it applied. The count must be of rows matched, not
//!   changed: connect with `CLIENT_FOUND_ROWS`, as sqlx always does (a renewal to the
//!   very microsecond the lease already ends at changes nothing, yet applied).
//!
//! Invariant: the one of [`records`](super) in every dialect: a claim is one atomic step
//! judged by the server's clock, tokens increase across processes and restarts, every
//! write after a claim is fenced by its token, and under `LapsePolicy::MarkUnknown` a
//! lapse younger than the unknown TTL is UNKNOWN to every statement.

/// One parameter of a statement, in the order the statement's `?`s take them. A value
/// may be asked for more than once (MySQL's placeholders are positional).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// The record's key (`VARBINARY`): [`Values::key`].
    Key,
    /// The request's fingerprint (`VARBINARY`): [`Values::fingerprint`].
    Fingerprint,
    /// The caller's token (`BIGINT`): [`Values::token`].
    Token,
    /// The token of the record as the claim read it, or the listed one (`BIGINT`, NULL
    /// for any): [`Values::held`].
    Held,
    /// The server's now read by [`NOW`] (`BIGINT`, µs): [`Values::now`].
    Now,
    /// The lease or TTL of the call (`BIGINT`, µs): [`Values::duration`].
    Duration,
    /// The unknown TTL of `LapsePolicy::MarkUnknown`, 0 under `TakeOver` (`BIGINT`, µs):
    /// [`Values::lapse_ttl`].
    LapseTtl,
    /// The body (`LONGBLOB`, NULL for none): [`Values::body`].
    Body,
    /// A row count (`BIGINT`): [`Values::limit`].
    Limit,
    /// The claim's correlation id (`VARCHAR`, NULL for none): [`Values::correlation_id`].
    CorrelationId,
    /// The key a listing starts after (`VARBINARY`): [`Values::from`].
    From,
    /// The key a listing ends before (`VARBINARY`, NULL for none): [`Values::below`].
    Below,
    /// The bytes a listed key ends with (`VARBINARY`, empty for any):
    /// [`Values::suffix`].
    Suffix,
    /// The states a listing or removal takes, as bits `1 << state` (`BIGINT`):
    /// [`Values::mask`].
    Mask,
}

/// The values a driver binds for [`Param`]s; a statement uses those its
/// [`params`](Statement::params) name, the rest may be left at their defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Values<'a> {
    /// [`Param::Key`].
    pub key: &'a [u8],
    /// [`Param::Fingerprint`].
    pub fingerprint: &'a [u8],
    /// [`Param::Token`] ([`decode::token`](super::decode::token) of the caller's).
    pub token: i64,
    /// [`Param::Held`].
    pub held: Option<i64>,
    /// [`Param::Now`].
    pub now: i64,
    /// [`Param::Duration`].
    pub duration: i64,
    /// [`Param::LapseTtl`].
    pub lapse_ttl: i64,
    /// [`Param::Body`].
    pub body: Option<&'a [u8]>,
    /// [`Param::Limit`].
    pub limit: i64,
    /// [`Param::CorrelationId`].
    pub correlation_id: Option<&'a str>,
    /// [`Param::From`].
    pub from: &'a [u8],
    /// [`Param::Below`].
    pub below: Option<&'a [u8]>,
    /// [`Param::Suffix`].
    pub suffix: &'a [u8],
    /// [`Param::Mask`].
    pub mask: i64,
}

/// A statement and the parameters its `?`s take, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Statement {
    /// The SQL text.
    pub sql: &'static str,
    /// What each `?` binds, in order.
    pub params: &'static [Param],
}

/// The schema, one statement each (MySQL's prepared statements take one at a time):
/// the earlier release's token counter and its one row, the token sequence started
/// above it ([`MINT`]), then the records table with its expiry index.
/// Each is idempotent, and safe to run from several processes at once. Columns as in
/// PostgreSQL's; `key` holds a key's stored form, at most 1,300 bytes or so (a
/// `VARBINARY(1536)` primary key: InnoDB's index limit is 3072 bytes); the fingerprint
/// is `VARBINARY`, so that a value of another length reads back as it is (and is
/// [`Corrupt`](idemcache::store::StoreError::Corrupt)), not padded.
pub const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS idemcache_tokens (
        id   TINYINT NOT NULL PRIMARY KEY,
        next BIGINT NOT NULL
    ) ENGINE = InnoDB",
    "INSERT INTO idemcache_tokens (id, next) VALUES (1, 0) ON DUPLICATE KEY UPDATE id = id",
    "CREATE TABLE IF NOT EXISTS idemcache_token_seq (
        id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY
    ) ENGINE = InnoDB",
    // The sequence starts above every token the earlier release's counter handed out,
    // with 2^32 to spare for that release's processes still running: an explicit id
    // lifts the `AUTO_INCREMENT` counter (never lowers it), and is deleted at once.
    "INSERT IGNORE INTO idemcache_token_seq (id)
        SELECT next + 4294967296 FROM idemcache_tokens WHERE id = 1",
    "DELETE FROM idemcache_token_seq
        WHERE id = (SELECT next + 4294967296 FROM idemcache_tokens WHERE id = 1)",
    "CREATE TABLE IF NOT EXISTS idemcache_records (
        `key`       VARBINARY(1536) NOT NULL PRIMARY KEY,
        fingerprint VARBINARY(255) NOT NULL,
        state       SMALLINT NOT NULL CHECK (state IN (1, 2, 3)),
        token       BIGINT NOT NULL,
        body        LONGBLOB,
        started_at  BIGINT NOT NULL,
        settled_at  BIGINT,
        expires_at  BIGINT NOT NULL,
        correlation_id VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin,
        INDEX idemcache_records_expiry (expires_at)
    ) ENGINE = InnoDB",
];

/// Whether the records table has every column this release writes: one row, one
/// column, 1 or 0. A table an earlier release made lacks `correlation_id`: run
/// [`UPGRADE`] then. (MySQL has no `ADD COLUMN IF NOT EXISTS`; MariaDB's is not
/// MySQL's.)
pub const IS_CURRENT: Statement = Statement {
    sql: "SELECT COUNT(*) FROM information_schema.columns
          WHERE table_schema = DATABASE() AND table_name = 'idemcache_records'
            AND column_name = 'correlation_id'",
    params: &[],
};

/// What [`SCHEMA`] added since an earlier release made the table, one statement each.
/// A process running it at once with another may find the column added: error 1060
/// (`ER_DUP_FIELDNAME`), which means the table is current.
pub const UPGRADE: &[&str] = &["ALTER TABLE idemcache_records
         ADD COLUMN correlation_id VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin"];

/// MySQL's error for a column that is there already: an [`UPGRADE`] another process
/// made first.
pub const DUPLICATE_COLUMN: u16 = 1060;

/// The server's now in microseconds since the Unix epoch, from UTC (the session's time
/// zone does not enter it): a macro, so that statements `concat!` it.
macro_rules! now {
    () => {
        "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
    };
}

/// "The record is UNKNOWN, or a lapse `MarkUnknown` reads as UNKNOWN", against the
/// bound now: takes `Now, Now, LapseTtl, Now`.
macro_rules! unknown_or_lapsed {
    () => {
        "((state = 3 AND expires_at > ?) OR (state = 1 AND expires_at <= ? AND expires_at + ? > ?))"
    };
}

/// The server's now (one `BIGINT` column, µs).
pub const NOW: Statement = Statement { sql: concat!("SELECT ", now!()), params: &[] };

/// A new token: the statement's last-insert id, a value of `idemcache_token_seq`'s
/// `AUTO_INCREMENT` column no other insert is given. Run anywhere (autocommit, or the
/// caller's transaction: it locks only the row it inserts), then [`MINTED`].
pub const MINT: Statement =
    Statement { sql: "INSERT INTO idemcache_token_seq () VALUES ()", params: &[] };

/// The row [`MINT`] inserted, deleted (the sequence keeps its counter, not its rows).
/// One row matched; none is harmless (a row left behind costs a few bytes).
pub const MINTED: Statement =
    Statement { sql: "DELETE FROM idemcache_token_seq WHERE id = ?", params: &[Param::Token] };

/// Run before the claim's transaction begins: it sets the isolation of the next one
/// only (not the session's), so that the claim takes no gap locks.
pub const READ_COMMITTED: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// The claim's look, in its transaction: the server's now and the key's record, its row
/// locked (`FOR UPDATE`) until the transaction ends. One row: `now, state, token,
/// fingerprint, body, settled_at, expires_at, live, lapsed`, the record's columns NULL
/// when the key is absent; with a record, the columns after `now` are a
/// [`ClaimRow`](super::decode::ClaimRow).
pub const LOOK: Statement = Statement {
    sql: concat!(
        "SELECT n.us AS now, r.state, r.token, r.fingerprint, r.body, r.settled_at, r.expires_at,
                r.expires_at > n.us AS live,
                (r.state = 1 AND r.expires_at <= n.us AND r.expires_at + ? > n.us) AS lapsed
         FROM (SELECT ",
        now!(),
        " AS us) n
         LEFT JOIN idemcache_records r ON r.`key` = ?
         FOR UPDATE"
    ),
    params: &[Param::LapseTtl, Param::Key],
};

/// The claim of an absent key, in its transaction: the record, PROCESSING under the
/// minted token until now + the lease, with the claim's correlation id. A duplicate key
/// (error 1062): a concurrent claim inserted it first; roll back and claim again.
pub const TAKE_NEW: Statement = Statement {
    sql: "INSERT INTO idemcache_records
              (`key`, fingerprint, state, token, body, started_at, settled_at, expires_at,
               correlation_id)
          VALUES (?, ?, 1, ?, NULL, ?, NULL, ? + ?, ?)",
    params: &[
        Param::Key,
        Param::Fingerprint,
        Param::Token,
        Param::Now,
        Param::Now,
        Param::Duration,
        Param::CorrelationId,
    ],
};

/// The one-commit claim's first statement, in the caller's transaction: the key's
/// record inserted as [`TAKE_NEW`] inserts it (the server's now read in the statement),
/// or, when the key has one, its row left as it is and locked. The no-op update is
/// what takes an exclusive lock on a duplicate: a plain `INSERT` that meets one takes a
/// shared lock, and two claims each holding one and wanting the exclusive lock to take a
/// dead record over would deadlock. Waits for another transaction's uncommitted row of
/// the key. Either way the row is this transaction's until it ends: [`LOOK`] reads it,
/// and it holds the bound token only if this statement inserted it (tokens are never
/// reused). The affected-row count cannot tell (under `CLIENT_FOUND_ROWS` both are 1).
pub const TAKE_NEW_OR_LOCK: Statement = Statement {
    sql: concat!(
        "INSERT INTO idemcache_records
              (`key`, fingerprint, state, token, body, started_at, settled_at, expires_at,
               correlation_id)
          VALUES (?, ?, 1, ?, NULL, ",
        now!(),
        ", NULL, ",
        now!(),
        " + ?, ?)
          ON DUPLICATE KEY UPDATE `key` = `key`"
    ),
    params: &[Param::Key, Param::Fingerprint, Param::Token, Param::Duration, Param::CorrelationId],
};

/// MySQL's one-commit claim bound on its wait for another transaction's row: the
/// session's `innodb_lock_wait_timeout` kept in the session variable
/// `@idemcache_claim_wait`, then lowered to `seconds` if that is less (MySQL has no
/// `SET LOCAL`, nor MariaDB's `SET STATEMENT`: on MariaDB the claim uses
/// [`waiting_at_most`]). Sent as text (a number, never a caller's
/// string); [`RESTORE_CLAIM_WAIT`] puts the kept value back.
pub fn bound_claim_wait(seconds: u64) -> String {
    format!(
        "SET @idemcache_claim_wait = @@SESSION.innodb_lock_wait_timeout, \
         SESSION innodb_lock_wait_timeout = LEAST(@@SESSION.innodb_lock_wait_timeout, {seconds})"
    )
}

/// `statement` under MariaDB's `SET STATEMENT`: its waits for other transactions' locks
/// bounded by `seconds` or the session's own `innodb_lock_wait_timeout`, whichever is
/// less, for this statement alone. The one-commit claim sends each of its statements
/// that can wait this way on MariaDB: [`TAKE_NEW_OR_LOCK`] (another transaction's row
/// of the key), and [`TAKE_OVER`] and [`TURN_UNKNOWN`] (their new `expires_at` enters
/// the expiry index, where another transaction's gap lock can hold it). Nothing of the
/// bound outlives its statement, so a claim dropped while it waits leaves the session
/// as it was, which [`bound_claim_wait`] and [`RESTORE_CLAIM_WAIT`] (MySQL, which has no
/// `SET STATEMENT`) cannot promise. The parameters are `statement`'s. Sent as text with
/// the number in it (MariaDB takes no placeholder there): one prepared statement per
/// distinct lease length.
pub fn waiting_at_most(seconds: u64, statement: &Statement) -> String {
    format!(
        "SET STATEMENT innodb_lock_wait_timeout = \
         LEAST(@@SESSION.innodb_lock_wait_timeout, {seconds}) FOR {}",
        statement.sql
    )
}

/// The session's `innodb_lock_wait_timeout` as [`bound_claim_wait`] found it. `SET` is
/// not transactional: it restores even in a transaction a deadlock rolled back.
pub const RESTORE_CLAIM_WAIT: &str = "SET SESSION innodb_lock_wait_timeout = @idemcache_claim_wait";

/// The claim of a dead record [`LOOK`] locked (expired, or a lapse under `TakeOver`),
/// in its transaction, fenced by the token it read ([`Param::Held`]). One row matched.
pub const TAKE_OVER: Statement = Statement {
    sql: "UPDATE idemcache_records
          SET fingerprint = ?, state = 1, token = ?, body = NULL, started_at = ?,
              settled_at = NULL, expires_at = ? + ?, correlation_id = ?
          WHERE `key` = ? AND token = ?",
    params: &[
        Param::Fingerprint,
        Param::Token,
        Param::Now,
        Param::Now,
        Param::Duration,
        Param::CorrelationId,
        Param::Key,
        Param::Held,
    ],
};

/// `LapsePolicy::MarkUnknown`: the lapse [`LOOK`] locked turns UNKNOWN, marked at the
/// lease's end and kept the unknown TTL from there, fenced by its token. (MySQL assigns
/// left to right: `settled_at` takes `expires_at` before it moves.) One row matched;
/// the claim answers from the row `LOOK` read
/// ([`decode::turned_unknown`](super::decode::turned_unknown) with its fingerprint and
/// `expires_at`).
pub const TURN_UNKNOWN: Statement = Statement {
    sql: "UPDATE idemcache_records
          SET state = 3, settled_at = expires_at, expires_at = expires_at + ?
          WHERE `key` = ? AND token = ? AND state = 1 AND expires_at <= ? AND expires_at + ? > ?",
    params: &[Param::LapseTtl, Param::Key, Param::Held, Param::Now, Param::LapseTtl, Param::Now],
};

/// PROCESSING → COMPLETED under the caller's token while the lease is live, the body
/// kept for the TTL ([`Param::Duration`]). One row matched: stored with `settled_at` =
/// now, `expires_at` = now + TTL; none: the lease was lost.
pub const COMPLETE: Statement = Statement {
    sql: "UPDATE idemcache_records SET state = 2, body = ?, settled_at = ?, expires_at = ? + ?
          WHERE `key` = ? AND token = ? AND state = 1 AND expires_at > ?",
    params: &[
        Param::Body,
        Param::Now,
        Param::Now,
        Param::Duration,
        Param::Key,
        Param::Token,
        Param::Now,
    ],
};

/// The live lease under the caller's token renewed to end now + the lease. One row
/// matched, or the lease was lost.
pub const EXTEND: Statement = Statement {
    sql: "UPDATE idemcache_records SET expires_at = ? + ?
          WHERE `key` = ? AND token = ? AND state = 1 AND expires_at > ?",
    params: &[Param::Now, Param::Duration, Param::Key, Param::Token, Param::Now],
};

/// PROCESSING → absent under the caller's token while the lease is live. One row, or
/// the lease was lost.
pub const RELEASE: Statement = Statement {
    sql: "DELETE FROM idemcache_records
          WHERE `key` = ? AND token = ? AND state = 1 AND expires_at > ?",
    params: &[Param::Key, Param::Token, Param::Now],
};

/// PROCESSING → UNKNOWN under the caller's token while the lease is live, marked now
/// and kept the TTL. One row, or the lease was lost.
pub const MARK_UNKNOWN: Statement = Statement {
    sql: "UPDATE idemcache_records SET state = 3, settled_at = ?, expires_at = ? + ?
          WHERE `key` = ? AND token = ? AND state = 1 AND expires_at > ?",
    params: &[Param::Now, Param::Now, Param::Duration, Param::Key, Param::Token, Param::Now],
};

/// UNKNOWN (or a lapse read so) → COMPLETED, of the listed execution only if
/// [`Param::Held`] is given, the body kept the TTL. One row, or the key has no such
/// UNKNOWN record.
pub const RESOLVE: Statement = Statement {
    sql: concat!(
        "UPDATE idemcache_records SET state = 2, body = ?, settled_at = ?, expires_at = ? + ?
         WHERE `key` = ? AND ",
        unknown_or_lapsed!(),
        " AND (? IS NULL OR token = ?)"
    ),
    params: &[
        Param::Body,
        Param::Now,
        Param::Now,
        Param::Duration,
        Param::Key,
        Param::Now,
        Param::Now,
        Param::LapseTtl,
        Param::Now,
        Param::Held,
        Param::Held,
    ],
};

/// UNKNOWN (or a lapse read so) → absent, of the listed execution only if
/// [`Param::Held`] is given. One row, or the key has no such UNKNOWN record.
pub const FORGET: Statement = Statement {
    sql: concat!(
        "DELETE FROM idemcache_records WHERE `key` = ? AND ",
        unknown_or_lapsed!(),
        " AND (? IS NULL OR token = ?)"
    ),
    params: &[
        Param::Key,
        Param::Now,
        Param::Now,
        Param::LapseTtl,
        Param::Now,
        Param::Held,
        Param::Held,
    ],
};

/// Up to [`Param::Limit`] live UNKNOWN records (a lapse read as the UNKNOWN it will
/// be), oldest mark first: `key, fingerprint, marked_at, expires_at, token` (for
/// [`decode::unknown_entry`](super::decode::unknown_entry)).
pub const UNKNOWN: Statement = Statement {
    sql: concat!(
        "SELECT `key`, fingerprint,
                CASE WHEN state = 1 THEN expires_at ELSE settled_at END AS marked_at,
                CASE WHEN state = 1 THEN expires_at + ? ELSE expires_at END AS expires_at,
                token
         FROM idemcache_records WHERE ",
        unknown_or_lapsed!(),
        " ORDER BY marked_at, `key` LIMIT ?"
    ),
    params: &[Param::LapseTtl, Param::Now, Param::Now, Param::LapseTtl, Param::Now, Param::Limit],
};

/// One bounded batch of `purge_expired`: at most [`Param::Limit`] expired records, the
/// oldest first through the expiry index; a lapsed lease is kept while it lapsed less
/// than the unknown TTL ago (`MarkUnknown` reads it UNKNOWN), or less than the time it
/// was held (`expires_at - started_at`, at least one lease), so that a claim after the
/// lapse still finds the execution it takes over and answers `took_over`. In `DECIMAL`: a
/// row whose columns are far apart (one no store writes) must not overflow the `BIGINT`
/// arithmetic and fail the purge.
/// The affected-row count is the batch. (InnoDB's `DELETE` has no `SKIP LOCKED`: a
/// purge waits for a row a claim holds locked, for that claim's short transaction.)
pub const PURGE: Statement = Statement {
    sql: "DELETE FROM idemcache_records
          WHERE expires_at <= ? AND NOT (state = 1 AND expires_at <= ?
                AND CAST(expires_at AS DECIMAL(21))
                    + GREATEST(?, CAST(expires_at AS DECIMAL(21)) - started_at) > ?)
          ORDER BY expires_at LIMIT ?",
    params: &[Param::Now, Param::Now, Param::LapseTtl, Param::Now, Param::Limit],
};

/// The columns the record reads return, in order: `key, fingerprint, state, token,
/// body, started_at, settled_at, expires_at` (an `idemcache::store::record::StoredRecord`).
macro_rules! record_columns {
    () => {
        "`key`, fingerprint, state, token, body, started_at, settled_at, expires_at,
         correlation_id"
    };
}

/// The record of a key, whatever its state, after the server's now: `now` then the
/// record columns (see [`RECORDS`]); no row, no record. The driver judges it
/// (`idemcache::store::record::judge`).
pub const RECORD: Statement = Statement {
    sql: concat!(
        "SELECT ",
        now!(),
        " AS now, ",
        record_columns!(),
        " FROM idemcache_records WHERE `key` = ?"
    ),
    params: &[Param::Key],
};

/// [`RECORD`] in a removal's transaction (READ COMMITTED, as a claim's): the row locked
/// (`FOR UPDATE`) until the transaction ends, so that the driver judges it and deletes
/// it with [`DELETE_RECORD`] with nothing changing it between.
pub const LOOK_RECORD: Statement = Statement {
    sql: concat!(
        "SELECT ",
        now!(),
        " AS now, ",
        record_columns!(),
        " FROM idemcache_records WHERE `key` = ? FOR UPDATE"
    ),
    params: &[Param::Key],
};

/// Deletes the record [`LOOK_RECORD`] locked, in its transaction.
pub const DELETE_RECORD: Statement =
    Statement { sql: "DELETE FROM idemcache_records WHERE `key` = ?", params: &[Param::Key] };

/// Up to [`Param::Limit`] records in key order, past [`Param::From`] and before
/// [`Param::Below`] (NULL: no end), ending with [`Param::Suffix`] (empty: any), whose
/// state as judged at [`Param::Now`] under the unknown TTL is a bit of [`Param::Mask`]
/// (`1 << state`: 0 dead, 1 PROCESSING, 2 COMPLETED, 3 UNKNOWN or a lapse
/// `MarkUnknown` reads so, 4 a state no store writes, which a listing asks for so that
/// `judge` names it corrupt). The record columns; the driver judges each at the bound
/// now. Through the primary key's range: a filter naming a scope reads its range only,
/// any other the rest of the table from [`Param::From`] (a scan, for tools).
pub const RECORDS: Statement = Statement {
    sql: concat!(
        "SELECT ",
        record_columns!(),
        " FROM idemcache_records
         WHERE `key` > ? AND (? IS NULL OR `key` < ?)
           AND (LENGTH(?) = 0 OR RIGHT(`key`, LENGTH(?)) = ?)
           AND (? & (1 << (CASE WHEN state NOT IN (1, 2, 3) THEN 4
                                WHEN expires_at > ? THEN state
                                WHEN state = 1 AND expires_at + ? > ? THEN 3 ELSE 0 END))) <> 0
         ORDER BY `key` LIMIT ?"
    ),
    params: &[
        Param::From,
        Param::Below,
        Param::Below,
        Param::Suffix,
        Param::Suffix,
        Param::Suffix,
        Param::Mask,
        Param::Now,
        Param::LapseTtl,
        Param::Now,
        Param::Limit,
    ],
};

/// MySQL's error number for a duplicate key: a concurrent claim inserted the key first.
pub const DUPLICATE_KEY: u16 = 1062;
/// MySQL's error number for a deadlock: InnoDB rolled the transaction back.
pub const DEADLOCK: u16 = 1213;
/// MySQL's error number for a lock wait that ran past `innodb_lock_wait_timeout`: the
/// statement was rolled back (the whole transaction only if the server runs with
/// `innodb_rollback_on_timeout`).
pub const LOCK_WAIT_TIMEOUT: u16 = 1205;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_binds_one_value_per_placeholder() {
        let all = [
            NOW,
            MINT,
            MINTED,
            LOOK,
            TAKE_NEW,
            TAKE_NEW_OR_LOCK,
            TAKE_OVER,
            TURN_UNKNOWN,
            COMPLETE,
            EXTEND,
            RELEASE,
            MARK_UNKNOWN,
            RESOLVE,
            FORGET,
            UNKNOWN,
            PURGE,
            IS_CURRENT,
            RECORD,
            LOOK_RECORD,
            DELETE_RECORD,
            RECORDS,
        ];
        for statement in all {
            let placeholders = statement.sql.matches('?').count();
            assert_eq!(placeholders, statement.params.len(), "{}", statement.sql);
        }
        assert!(SCHEMA.iter().chain(UPGRADE).all(|ddl| !ddl.contains('?')));
        assert!(!bound_claim_wait(1).contains('?') && !RESTORE_CLAIM_WAIT.contains('?'));
        for statement in [TAKE_NEW_OR_LOCK, TAKE_OVER, TURN_UNKNOWN] {
            let bounded = waiting_at_most(1, &statement);
            assert_eq!(bounded.matches('?').count(), statement.params.len());
        }
    }

    #[test]
    fn the_claim_wait_is_lowered_never_raised_and_kept() {
        let set = bound_claim_wait(7);
        assert!(set.ends_with("LEAST(@@SESSION.innodb_lock_wait_timeout, 7)"), "{set}");
        assert!(set.starts_with("SET @idemcache_claim_wait = @@SESSION.innodb_lock_wait_timeout"));
        assert!(RESTORE_CLAIM_WAIT.ends_with("= @idemcache_claim_wait"));
        let bounded = waiting_at_most(7, &TAKE_NEW_OR_LOCK);
        let prefix = "SET STATEMENT innodb_lock_wait_timeout = \
                      LEAST(@@SESSION.innodb_lock_wait_timeout, 7) FOR INSERT";
        assert!(bounded.starts_with(prefix), "{bounded}");
        assert!(bounded.ends_with(TAKE_NEW_OR_LOCK.sql));
    }
}
