//! idemcache's SQL half, without a driver: what the database does for idempotency, as
//! statement text per dialect and the decision taken from what the database answered.
//!
//! - [`inbox`]: a message consumer's record, received in the transaction that applies
//!   the message (its vocabulary, retention and purge loop, and the cache in front).
//! - [`outbox`]: a producer's messages written in the transaction of the change they
//!   announce, and the relay that publishes them (its vocabulary, statements per
//!   dialect, and a broker-agnostic loop).
//! - [`transition`]: a row's status moved only from allowed sources, so that a
//!   callback's duplicate is told apart from its first delivery.
//! - [`records`]: the durable store's records table, its statements per dialect
//!   ([`records::postgres`], [`records::mysql`]) and the decoding of the columns they
//!   return ([`records::decode`]) into the [`Store`](idemcache::store::Store) contract's
//!   answers. A driver binds the parameters each statement documents, runs it, reads the
//!   columns as plain values (`i16`, `i64`, `bool`, `Option<Vec<u8>>`) and hands them to
//!   `decode`.
//!
//! The driver crates run them on your own transaction: `idemcache-sqlite` (rusqlite),
//! `idemcache-postgres` (tokio-postgres) and `idemcache-sqlx` (sqlx, PostgreSQL and
//! MySQL/MariaDB). A table behaves the same whichever of them wrote it, because the
//! statements and the reading of their answers are these, once.
//!
//! Invariant: nothing here touches a database or the caller's clock, and no SQL is built
//! from input: names are validated and quoted, values are bound parameters. Every time a
//! record holds is the server's (read by the statements themselves, in microseconds
//! since the Unix epoch), and every row, whatever it holds, decodes to an answer or to
//! [`StoreError::Corrupt`](idemcache::store::StoreError::Corrupt) naming its key, never
//! a panic.
//!
//! Why a crate of its own: the core (`idemcache`) is the in-process cache, the HTTP layer
//! and the store trait; a program that never writes SQL never compiles this, and a
//! driver crate of your own builds on it as the bundled ones do:
//!
//! ```no_run
//! use idemcache::store::{StoreClaim, StoreError};
//! use idemcache::{Fingerprint, Key};
//! use idemcache_sql::records::decode::{self, ClaimRow, ClaimStep};
//! use idemcache_sql::records::postgres;
//!
//! /// Your driver's call: runs `sql` with `params`, returns the first row's columns.
//! fn query_claim(sql: &str, params: (&[u8], &[u8], i64, i64)) -> ClaimRow {
//!     unimplemented!("{sql}")
//! }
//!
//! fn claim(key: &Key, fp: Fingerprint, lease_us: i64) -> Result<StoreClaim, StoreError> {
//!     let row = query_claim(postgres::CLAIM, (key.as_bytes(), &fp.to_bytes(), lease_us, 0));
//!     match decode::claim(key.as_bytes(), fp, &row)? {
//!         ClaimStep::Answer(answer) => Ok(answer),
//!         // Run `postgres::TURN_UNKNOWN` (a lapse under `MarkUnknown`), or look again.
//!         ClaimStep::TurnUnknown { .. } | ClaimStep::Dead => unimplemented!(),
//!     }
//! }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]
// Where links to this crate's items go from documentation built without it (another
// crate's `cargo doc --no-deps`); `.ci/package` checks the version.
#![doc(html_root_url = "https://docs.rs/idemcache-sql/0.1.0")]

pub mod inbox;
pub mod one_commit;
pub mod outbox;
pub mod records;
pub mod transition;
