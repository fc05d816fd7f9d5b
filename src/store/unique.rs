//! Is this database error "that row already exists"? For the user's own business tables,
//! whose `UNIQUE` constraint is the backstop behind the cache: a violation there means
//! the intent was already executed (by another process, or before the cache knew), so
//! answer with the existing row, never with a 500 and never by executing again.
//!
//! Invariant: only a violation of a uniqueness constraint (or primary key) answers
//! `true`; other constraint failures (`NOT NULL`, `CHECK`, foreign keys) are real errors.
//!
//! The engine's own codes, for drivers this crate has no feature for:
//!
//! | engine | code |
//! |---|---|
//! | PostgreSQL | SQLSTATE `23505` ([`SQLSTATE_UNIQUE_VIOLATION`]) |
//! | MySQL, MariaDB | error 1062 `ER_DUP_ENTRY` ([`MYSQL_DUP_ENTRY`]); sqlx-mysql's `code()` is the SQLSTATE `23000`, shared with other constraints: classify with sqlx's `ErrorKind::UniqueViolation` |
//! | SQLite | extended codes 2067 `SQLITE_CONSTRAINT_UNIQUE` and 1555 `SQLITE_CONSTRAINT_PRIMARYKEY` |

/// PostgreSQL's SQLSTATE for a unique violation.
pub const SQLSTATE_UNIQUE_VIOLATION: &str = "23505";
/// MySQL's and MariaDB's error number for a duplicate key.
pub const MYSQL_DUP_ENTRY: u16 = 1062;
/// SQLite's extended result code for a `UNIQUE` constraint.
pub const SQLITE_CONSTRAINT_UNIQUE: i32 = 2067;
/// SQLite's extended result code for a `PRIMARY KEY` constraint.
pub const SQLITE_CONSTRAINT_PRIMARYKEY: i32 = 1555;

/// Whether a PostgreSQL SQLSTATE is a unique violation.
pub fn is_unique_sqlstate(sqlstate: &str) -> bool {
    sqlstate == SQLSTATE_UNIQUE_VIOLATION
}

/// Whether a MySQL/MariaDB server error number is a duplicate key.
pub fn is_unique_mysql_code(code: u16) -> bool {
    code == MYSQL_DUP_ENTRY
}

/// Whether a SQLite extended result code is a uniqueness (or primary key) violation.
pub fn is_unique_sqlite_code(extended_code: i32) -> bool {
    extended_code == SQLITE_CONSTRAINT_UNIQUE || extended_code == SQLITE_CONSTRAINT_PRIMARYKEY
}

/// Whether a rusqlite error is a uniqueness (or primary key) violation.
#[cfg(feature = "sqlite")]
pub fn is_unique_violation_rusqlite(error: &rusqlite::Error) -> bool {
    matches!(error, rusqlite::Error::SqliteFailure(e, _) if is_unique_sqlite_code(e.extended_code))
}

/// Whether a tokio-postgres error is a unique violation (SQLSTATE 23505).
#[cfg(feature = "postgres")]
pub fn is_unique_violation_postgres(error: &tokio_postgres::Error) -> bool {
    error.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
}

/// Whether a sqlx error (any database) is a uniqueness violation, by sqlx's own
/// `ErrorKind::UniqueViolation`. For MySQL/MariaDB this is the right test: sqlx-mysql's
/// `code()` is the SQLSTATE `23000`, which other integrity errors share.
#[cfg(feature = "sqlx")]
pub fn is_unique_violation_sqlx(error: &sqlx::Error) -> bool {
    error.as_database_error().is_some_and(|e| e.kind() == sqlx::error::ErrorKind::UniqueViolation)
}

/// Whether a mysql_async error is a duplicate key (server error 1062).
#[cfg(feature = "mysql_async")]
pub fn is_unique_violation_mysql_async(error: &mysql_async::Error) -> bool {
    matches!(error, mysql_async::Error::Server(e) if is_unique_mysql_code(e.code))
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    #[test]
    fn only_uniqueness_counts_in_a_real_sqlite() {
        let db = rusqlite::Connection::open_in_memory().unwrap();
        db.execute_batch(
            "CREATE TABLE t (id INTEGER PRIMARY KEY, u TEXT UNIQUE, n TEXT NOT NULL, c INTEGER CHECK (c > 0));
             INSERT INTO t VALUES (1, 'a', 'x', 1);",
        )
        .unwrap();
        let fails = |sql: &str| db.execute(sql, []).unwrap_err();
        assert!(is_unique_violation_rusqlite(&fails("INSERT INTO t VALUES (2, 'a', 'x', 1)")));
        assert!(is_unique_violation_rusqlite(&fails("INSERT INTO t VALUES (1, 'b', 'x', 1)")));
        assert!(!is_unique_violation_rusqlite(&fails("INSERT INTO t VALUES (3, 'c', NULL, 1)")));
        assert!(!is_unique_violation_rusqlite(&fails("INSERT INTO t VALUES (4, 'd', 'x', 0)")));
        assert!(!is_unique_violation_rusqlite(&fails("INSERT INTO nowhere VALUES (1)")));
    }

    #[test]
    fn the_engines_codes() {
        assert!(is_unique_sqlstate("23505") && !is_unique_sqlstate("23502"));
        assert!(is_unique_mysql_code(1062) && !is_unique_mysql_code(1048));
        assert!(
            is_unique_sqlite_code(2067)
                && is_unique_sqlite_code(1555)
                && !is_unique_sqlite_code(1299)
        );
    }
}
