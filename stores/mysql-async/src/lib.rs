//! mysql_async's unique-violation classifier for idemcache: is this error "that row
//! already exists"? For your own business tables, whose `UNIQUE` constraint is the
//! backstop behind the cache (see [`idemcache::store::unique`]).
//!
//! This crate tracks mysql_async's current release and re-exports it ([`mysql_async`]).
//!
//! Invariant: only a duplicate key (server error 1062, `ER_DUP_ENTRY`) answers `true`;
//! `NOT NULL`, `CHECK` and foreign-key failures are real errors.

#![cfg_attr(docsrs, feature(doc_cfg))]
// Where links to this crate's items go from documentation built without it (another
// crate's `cargo doc --no-deps`); `.ci/package` checks the version.
#![doc(html_root_url = "https://docs.rs/idemcache-mysql-async/0.1.0")]

use idemcache::store::unique::is_unique_mysql_code;
pub use mysql_async;

/// Whether a mysql_async error is a duplicate key (server error 1062).
pub fn is_unique_violation(error: &mysql_async::Error) -> bool {
    matches!(error, mysql_async::Error::Server(e) if is_unique_mysql_code(e.code))
}
