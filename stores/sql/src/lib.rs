//! idemcache's SQL half, without a driver: what the database does for idempotency, as
//! statement text per dialect and the decision taken from what the database answered.
//!
//! - [`inbox`]: a message consumer's record, received in the transaction that applies
//!   the message (its vocabulary, retention and purge loop, and the cache in front).
//! - [`transition`]: a row's status moved only from allowed sources, so that a
//!   callback's duplicate is told apart from its first delivery.
//!
//! The driver crates run them on your own transaction: `idemcache-sqlite` (rusqlite),
//! `idemcache-postgres` (tokio-postgres) and `idemcache-sqlx` (sqlx, PostgreSQL and
//! MySQL/MariaDB). A table behaves the same whichever of them wrote it, because the
//! statements and the reading of their answers are these, once.
//!
//! Invariant: nothing here touches a database or the caller's clock, and no SQL is built
//! from input: names are validated and quoted, values are bound parameters.
//!
//! Why a crate of its own: the core (`idemcache`) is the in-process cache, the HTTP layer
//! and the store trait; a program that never writes SQL never compiles this, and a
//! driver crate of your own builds on it as the bundled ones do.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod inbox;
pub mod transition;
