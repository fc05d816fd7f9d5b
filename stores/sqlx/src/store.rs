//! The durable stores over your own sqlx pool: [`PgStore`] (feature `postgres`) and
//! [`MySqlStore`] (feature `mysql`, MySQL and MariaDB), each running `idemcache-sql`'s
//! statements for its database ([`idemcache_sql::records`]) and decoding their rows
//! with [`idemcache_sql::records::decode`]. `PgStore` runs the very statements
//! `idemcache-postgres` runs, so the two crates share one table and one behaviour.
//!
//! Invariant: this module decides nothing the statements and the decoding do not; the
//! judge of every time is the server's clock; a column a driver cannot read as its type
//! is [`StoreError::Corrupt`](idemcache::store::StoreError::Corrupt) naming the record's
//! key, never a panic.

#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;

#[cfg(feature = "mysql")]
pub use mysql::MySqlStore;
#[cfg(feature = "postgres")]
pub use postgres::PgStore;

use idemcache::store::StoreError;
use idemcache_sql::records::decode;
use sqlx::{Column, ColumnIndex, Decode, Row, Type};

/// Column `i` of `row` as a `T`; a value of another type, or NULL where a value
/// belongs, is [`StoreError::Corrupt`] naming the record stored under `key`.
fn column<'r, R, T>(row: &'r R, i: usize, key: &[u8]) -> Result<T, StoreError>
where
    R: Row,
    usize: ColumnIndex<R>,
    T: Decode<'r, R::Database> + Type<R::Database>,
{
    row.try_get(i).map_err(|e| {
        let name = row.columns().get(i).map_or("?", |c| c.name());
        decode::unreadable(key, name, e)
    })
}

/// `e` as [`StoreError::Backend`], naming `server` (`"PostgreSQL at db:5432/app"`).
fn failed(server: &str, e: sqlx::Error) -> StoreError {
    idemcache::store::encoding::at_server(server.to_owned(), e)
}
