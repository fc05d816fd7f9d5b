//! tokio-postgres's errors and replies as the store's: a unique violation told apart
//! for the user's own tables, a serialization failure or deadlock told apart to run a
//! statement again, a driver failure as `StoreError::Backend`, and a column that cannot
//! be read as `StoreError::Corrupt`.
//!
//! Invariant: nothing here panics on any error or any row a database holds.

use idemcache::store::StoreError;
use idemcache_sql::records::decode;

/// Whether a tokio-postgres error is a unique violation (SQLSTATE 23505): for your own
/// business tables, whose `UNIQUE` constraint is the backstop behind the cache (see
/// [`idemcache::store::unique`]). Other constraint failures are real errors.
pub fn is_unique_violation(error: &tokio_postgres::Error) -> bool {
    error.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
}

/// How many times a statement runs again after a serialization failure or a deadlock.
pub(crate) const MAX_CONFLICTS: usize = 16;

/// Whether `e` is a serialization failure or a deadlock (SQLSTATE 40001, 40P01).
pub(crate) fn conflict(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|code| idemcache_sql::transition::is_conflict_sqlstate(code.code()))
}

pub(crate) fn backend(e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Backend(Box::new(e))
}

/// Column `i` of `row` as a `T`; a value of another type, or NULL where a value
/// belongs, is [`StoreError::Corrupt`] naming the record's key, never a panic.
pub(crate) fn column<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a tokio_postgres::Row,
    i: usize,
    key: &[u8],
) -> Result<T, StoreError> {
    row.try_get(i).map_err(|e| {
        let name = row.columns().get(i).map_or("?", |c| c.name());
        decode::unreadable(key, name, e)
    })
}
