//! idemcache's records table in SQL, without a driver: the statements of each dialect
//! ([`records::postgres`], [`records::mysql`]) and the decoding of the columns they
//! return ([`records::decode`]) into the [`Store`](idemcache::store::Store) contract's
//! answers. A driver crate binds the parameters each statement documents, runs it,
//! reads the columns as plain values (`i16`, `i64`, `bool`, `Option<Vec<u8>>`) and hands
//! them to `decode`; so `idemcache-postgres` (tokio-postgres) and `idemcache-sqlx`
//! (sqlx) keep one table that behaves the same whichever of them wrote it, and a driver
//! of your own can too.
//!
//! Invariant: nothing here touches a database or the caller's clock. Every time is the
//! server's (read by the statements themselves, in microseconds since the Unix epoch),
//! and every row, whatever it holds, decodes to an answer or to
//! [`StoreError::Corrupt`](idemcache::store::StoreError::Corrupt) naming its key, never
//! a panic.
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

pub mod records;
