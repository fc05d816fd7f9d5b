//! idemcache for sqlx: durable stores over your own pool ([`PgStore`], feature
//! `postgres`), the unique-violation classifier (is this database error "that
//! row already exists"? for your own business tables, whose `UNIQUE` constraint is the
//! backstop behind the cache: see [`idemcache::store::unique`]), and on your own sqlx
//! transaction the consumer [`inbox`] and conditional status `transition`s.
//!
//! This crate tracks sqlx's current release and re-exports it ([`sqlx`]) with no
//! default features: it needs only sqlx's error types. Enable the databases and runtime
//! you use on your own `sqlx` dependency (one version, so they unify). The features
//! `postgres` and `mysql` add the inbox and the transitions for those databases (they
//! enable sqlx's drivers of those names).
//!
//! Invariant: only a violation of a uniqueness constraint (or primary key) answers
//! `true`; `NOT NULL`, `CHECK` and foreign-key failures are real errors.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub use sqlx;

#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use store::MySqlStore;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use store::PgStore;

pub mod inbox;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod store;
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "mysql"))))]
pub mod transition;

/// Whether a sqlx error (any database) is a uniqueness violation, by sqlx's own
/// `ErrorKind::UniqueViolation`. For MySQL/MariaDB this is the right test: sqlx-mysql's
/// `code()` is the SQLSTATE `23000`, which other integrity errors share.
pub fn is_unique_violation(error: &sqlx::Error) -> bool {
    error.as_database_error().is_some_and(|e| e.kind() == sqlx::error::ErrorKind::UniqueViolation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_that_are_not_the_databases_are_not_violations() {
        assert!(!is_unique_violation(&sqlx::Error::RowNotFound));
        assert!(!is_unique_violation(&sqlx::Error::PoolTimedOut));
    }
}
