//! idemcache for sqlx: durable stores over your own pool (`PgStore`, feature
//! `postgres`; `MySqlStore`, feature `mysql`, for MySQL and MariaDB), the
//! unique-violation classifier (is this database error "that row already exists"? for
//! your own business tables, whose `UNIQUE` constraint is the backstop behind the
//! cache: see [`idemcache::store::unique`]), and on your own sqlx transaction the
//! consumer [`inbox`], the transactional [`outbox`] and conditional status `transition`s.
//!
//! This crate tracks sqlx's current release and re-exports it ([`sqlx`]) with no
//! default features. Enable the databases and runtime you use on your own `sqlx`
//! dependency (one version, so they unify). The features `postgres` and `mysql` add
//! the stores, the inbox, the outbox and the transitions for those databases (they enable sqlx's
//! drivers of those names).
//!
//! # The stores
//!
//! `PgStore` and `MySqlStore` keep idemcache's records (the durable half of
//! [`Tiered`](idemcache::store::Tiered), or a [`Store`](idemcache::store::Store) on its
//! own) in the database your pool connects to: `from_pool(pool)` takes yours, so your
//! handlers and the records share its connections, and `complete_in(&mut tx, claim,
//! body)` completes a claim in your transaction, committing with your business writes
//! or not at all. `connect(url)` builds a pool for you. Their statements and the
//! decoding of their rows are `idemcache-sql`'s ([`idemcache_sql::records`]), which
//! `idemcache-postgres` (tokio-postgres) runs too: a records table either crate wrote
//! behaves the same under the other. Call `ensure_schema` once at startup; the
//! `with_lapse_policy(policy)` setting is the other stores'.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # mod example {
//! use idemcache::store::{OpenClaim, Store, Tiered};
//! use idemcache::Cache;
//! use idemcache_sqlx::PgStore;
//!
//! type Error = Box<dyn std::error::Error + Send + Sync>;
//!
//! async fn start(pool: sqlx::PgPool) -> Result<Tiered<PgStore>, Error> {
//!     let store = PgStore::from_pool(pool); // your pool, shared with your handlers
//!     store.ensure_schema().await?;
//!     Ok(Tiered::new(Cache::builder().build()?, store))
//! }
//!
//! /// In a handler that holds `claim`: the order and its record commit together.
//! async fn place(pool: &sqlx::PgPool, claim: &OpenClaim, record: &[u8]) -> Result<(), Error> {
//!     let mut tx = pool.begin().await?;
//!     sqlx::query("INSERT INTO orders (item) VALUES ($1)").bind("book").execute(&mut *tx).await?;
//!     PgStore::complete_in(&mut tx, claim, Some(record)).await?;
//!     tx.commit().await?;
//!     Ok(())
//! }
//! # }
//! ```
//!
//! Invariant: the stores decide nothing `idemcache-sql`'s statements and decoding do
//! not (every time is the server's; a row they cannot read is
//! [`StoreError::Corrupt`](idemcache::store::StoreError::Corrupt)); and only a violation
//! of a uniqueness constraint (or primary key) is [`is_unique_violation`]: `NOT NULL`,
//! `CHECK` and foreign-key failures are real errors.

#![cfg_attr(docsrs, feature(doc_cfg))]
// Where links to this crate's items go from documentation built without it (another
// crate's `cargo doc --no-deps`); `.ci/package` checks the version.
#![doc(html_root_url = "https://docs.rs/idemcache-sqlx/0.1.0")]

pub use sqlx;

#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use store::MySqlStore;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use store::PgStore;

mod in_transaction;
pub mod inbox;
mod one_commit;
pub mod outbox;
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
