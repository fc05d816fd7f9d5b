//! Conditional state transitions of a row's status column, for callbacks and webhooks
//! that arrive more than once: "move payment 42 from PENDING to PAID" must apply once,
//! answer OK to every duplicate without a second effect, and refuse
//! one asked of a row no longer in a source status (a PAID payment asked to move back).
//!
//! The transition is one `UPDATE t SET status = :to WHERE status IN (:from, ...) AND
//! id = :id`; if it moved no row, one locking read tells why: `SELECT status, status =
//! :to, status IN (:from, ...)`, so that the database, which decided what the `UPDATE`
//! matched, also decides whether the row is in the target, by the same comparison
//! (its column type's and collation's: a `CHAR(n)` ignores its padding, MySQL's default
//! collations ignore case):
//!
//! | the `UPDATE` | the read | answer |
//! |---|---|---|
//! | moved the row | (none) | [`Transition::Applied`]: do the effect now, in the same transaction |
//! | no row | `status = :to` | [`Transition::AlreadyInTarget`]: a duplicate, answer OK, do nothing |
//! | no row | another status | [`Transition::Illegal`] `{ current }`: refuse (e.g. a PAID row asked to move from PENDING) |
//! | no row | no row | [`Transition::NotFound`] |
//!
//! This module is the driver-free half: [`StatusColumn`] (validated, quoted names) and
//! [`Plan`] (one call's validated `from`/`to`, the SQL text in each [`Dialect`], and the
//! decision from what the database answered). The driver crates bind, execute and hand
//! the answers back: `idemcache_sqlite::transition`, `idemcache_postgres::transition`,
//! `idemcache_sqlx::transition::{postgres, mysql}`.
//!
//! Invariants:
//! - No SQL is built from user input: only names [`StatusColumn::new`] validated are
//!   interpolated (quoted), every status and id is a bound parameter.
//! - Statuses are compared by the database only, never in Rust, so the answer agrees
//!   with what the `UPDATE` matched whatever the column's type and collation.
//! - `to` is never among `from` (compared ignoring ASCII case and trailing spaces, as
//!   MySQL's default collations compare), so the `UPDATE` can only match a row not yet
//!   in `to`: a duplicate is never [`Transition::Applied`], whatever the engine counts
//!   as an affected row. (A collation that equates more, e.g. accents, is the schema's
//!   to keep apart: see `idemcache_sqlx::transition::mysql`.)
//! - Every answer but [`Transition::NotFound`] leaves the row locked until the caller's
//!   transaction ends (the `UPDATE`'s lock, or the read's `FOR UPDATE`; SQLite's write
//!   lock), so the answer still holds when the caller commits the effect.
//!
//! Run it inside the transaction that does the effect (the ledger entry, the e-mail
//! outbox row), and commit both together: a crash before the commit leaves the row
//! unmoved, and the redelivered callback applies it. Each driver's `transition` takes
//! that transaction the way the driver's `inbox::receive` (and `complete_in`) take it:
//! `&tx` (`&mut tx` for sqlx).

mod column;
mod error;
mod plan;
#[cfg(feature = "test-utils")]
pub mod testing;

pub use column::{Dialect, StatusColumn, MAX_IDENTIFIER_LEN};
pub use error::TransitionError;
pub use plan::{Plan, ReadRow, StoredStatus, MAX_SOURCES};

/// What a conditional transition found and did.
#[must_use = "only Applied may do the effect; AlreadyInTarget is a duplicate to answer OK"]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// This call moved the row from an allowed source status to the target: do the
    /// effect, in the same transaction.
    Applied,
    /// The row already had the target status: a duplicate (a retried callback). Answer
    /// as for the first; do not repeat the effect.
    AlreadyInTarget,
    /// The row's status is neither an allowed source nor the target (e.g. PAID when
    /// PENDING was asked for): the transition is refused, nothing changed.
    Illegal {
        /// The status the row has.
        current: String,
    },
    /// No row has this id.
    NotFound,
}

/// PostgreSQL's SQLSTATE for a serialization failure (`REPEATABLE READ` or
/// `SERIALIZABLE` meeting a concurrent update).
pub const SQLSTATE_SERIALIZATION_FAILURE: &str = "40001";
/// PostgreSQL's SQLSTATE for a detected deadlock.
pub const SQLSTATE_DEADLOCK_DETECTED: &str = "40P01";
/// MySQL's and MariaDB's error number for a deadlock (the transaction was rolled back).
pub const MYSQL_LOCK_DEADLOCK: u16 = 1213;
/// MySQL's and MariaDB's error number for a lock wait timeout.
pub const MYSQL_LOCK_WAIT_TIMEOUT: u16 = 1205;
/// MariaDB's `ER_CHECKREAD` ("record has changed since last read"): `REPEATABLE READ`
/// with `innodb_snapshot_isolation` on, meeting a concurrent update.
pub const MARIADB_CHECKREAD: u16 = 1020;
/// SQLite's primary result code `SQLITE_BUSY` (also the low byte of
/// `SQLITE_BUSY_SNAPSHOT`, a deferred transaction's read snapshot gone stale).
pub const SQLITE_BUSY: i32 = 5;

/// Whether a PostgreSQL SQLSTATE means "a concurrent transaction conflicted: roll back
/// and run the transaction again" ([`TransitionError::Conflict`]).
pub fn is_conflict_sqlstate(sqlstate: &str) -> bool {
    sqlstate == SQLSTATE_SERIALIZATION_FAILURE || sqlstate == SQLSTATE_DEADLOCK_DETECTED
}

/// Whether a MySQL/MariaDB error number means the same ([`TransitionError::Conflict`]).
pub fn is_conflict_mysql_code(code: u16) -> bool {
    matches!(code, MYSQL_LOCK_DEADLOCK | MYSQL_LOCK_WAIT_TIMEOUT | MARIADB_CHECKREAD)
}

/// Whether a SQLite extended result code means the same: any `SQLITE_BUSY` (its primary
/// code is the low byte).
pub fn is_conflict_sqlite_code(extended_code: i32) -> bool {
    extended_code & 0xff == SQLITE_BUSY
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engines_conflict_codes() {
        assert!(is_conflict_sqlstate("40001") && is_conflict_sqlstate("40P01"));
        assert!(!is_conflict_sqlstate("23505") && !is_conflict_sqlstate("40002"));
        assert!(is_conflict_mysql_code(1213) && is_conflict_mysql_code(1205));
        assert!(is_conflict_mysql_code(1020) && !is_conflict_mysql_code(1062));
        // SQLITE_BUSY, SQLITE_BUSY_RECOVERY, SQLITE_BUSY_SNAPSHOT; not SQLITE_LOCKED.
        assert!(is_conflict_sqlite_code(5) && is_conflict_sqlite_code(261));
        assert!(is_conflict_sqlite_code(517) && !is_conflict_sqlite_code(6));
        assert!(!is_conflict_sqlite_code(2067));
    }
}
