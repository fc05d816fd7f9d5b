//! SQLite's errors as the store's.
//!
//! Invariant: a row the store cannot read (a column holding another type, which SQLite
//! allows, or NULL where a value belongs) is [`StoreError::Corrupt`] naming its key;
//! anything else SQLite answers is the database failing, [`StoreError::Backend`], and an
//! error opening a file names the file. Never a panic, whatever the database holds.

use idemcache::store::encoding::corrupt;
use idemcache::store::StoreError;

pub(crate) fn backend(e: rusqlite::Error) -> StoreError {
    StoreError::Backend(Box::new(e))
}

/// An error opening `path`, naming it (SQLite's own message does not).
pub(crate) fn opening(path: &str, e: rusqlite::Error) -> StoreError {
    StoreError::Backend(format!("opening the SQLite database {path:?}: {e}").into())
}

/// An error reading the record of `key`: a column holding another type (SQLite lets
/// any column hold any type) or NULL where a value belongs is [`StoreError::Corrupt`]
/// naming the key; anything else is the database failing.
pub(crate) fn read_error(key: &[u8], e: rusqlite::Error) -> StoreError {
    use rusqlite::Error::{FromSqlConversionFailure, IntegralValueOutOfRange, InvalidColumnType};
    match e {
        InvalidColumnType(_, name, ty) => corrupt(key, format_args!("column {name} holds {ty}")),
        FromSqlConversionFailure(i, ty, why) => {
            corrupt(key, format_args!("column {i} holds {ty} that does not convert: {why}"))
        }
        IntegralValueOutOfRange(i, v) => corrupt(key, format_args!("column {i} holds {v}")),
        e => backend(e),
    }
}

/// `SQLITE_BUSY` or `SQLITE_LOCKED` (any extended code): another connection holds the
/// lock this statement needs.
pub(crate) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy) | Some(rusqlite::ErrorCode::DatabaseLocked)
    )
}
