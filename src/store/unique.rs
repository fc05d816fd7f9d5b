//! Is this database error "that row already exists"? For the user's own business tables,
//! whose `UNIQUE` constraint is the backstop behind the cache: a violation there means
//! the intent was already executed (by another process, or before the cache knew), so
//! answer with the existing row, never with a 500 and never by executing again.
//!
//! Invariant: only a violation of a uniqueness constraint (or primary key) answers
//! `true`; other constraint failures (`NOT NULL`, `CHECK`, foreign keys) are real errors.
//!
//! Each store crate has its driver's classifier (`idemcache_sqlite::is_unique_violation`,
//! `idemcache_postgres::…`, `idemcache_sqlx::…`); these are the engines' own codes, for
//! any other driver. With mysql_async, for one:
//!
//! ```text
//! let duplicate = matches!(&error, mysql_async::Error::Server(e) if is_unique_mysql_code(e.code));
//! ```
//!
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

#[cfg(test)]
mod tests {
    use super::*;

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
