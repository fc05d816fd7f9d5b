//! [`TransitionError`]: why a transition gave no answer. Each variant says what the
//! caller should do; none leaves a half-applied transition behind once the caller's
//! transaction rolls back.

use std::error::Error;
use std::fmt;

/// Why a conditional transition gave no [`Transition`](super::Transition).
///
/// After any of these, roll the transaction back (the `UPDATE` may have run).
#[derive(Debug)]
#[non_exhaustive]
pub enum TransitionError {
    /// A name refused by [`StatusColumn::new`](super::StatusColumn::new); no SQL ran.
    InvalidIdentifier {
        /// Which name: "table", "schema", "id column" or "status column".
        what: &'static str,
        /// The name as given.
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The transition asked for cannot be run as asked (no source status, too many, or
    /// the target among the sources); no SQL ran.
    InvalidInput {
        /// The status column (`table.status`).
        column: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The row holds what cannot be a status (NULL, or not text), or the id names more
    /// than one row (the id column is not unique).
    Corrupt {
        /// The status column (`table.status`).
        column: String,
        /// The id asked for, as the driver shows it.
        id: String,
        /// What was found.
        reason: String,
    },
    /// A concurrent transaction conflicted with this one (a serialization failure under
    /// `REPEATABLE READ` or `SERIALIZABLE`, a deadlock, a lock wait timeout, SQLite
    /// busy, or the row moving between this call's two statements): roll back and run
    /// the whole transaction again; the retry sees the winner's status.
    Conflict {
        /// The status column (`table.status`).
        column: String,
        /// The database's error.
        source: Box<dyn Error + Send + Sync>,
    },
    /// Any other failure of the database or the driver (connection lost, no such table
    /// or column, an id of the wrong type, ...).
    Database {
        /// The status column (`table.status`).
        column: String,
        /// The database's error.
        source: Box<dyn Error + Send + Sync>,
    },
}

impl TransitionError {
    /// Whether running the whole transaction again may succeed
    /// ([`Conflict`](Self::Conflict)).
    pub fn is_conflict(&self) -> bool {
        matches!(self, TransitionError::Conflict { .. })
    }
}

impl fmt::Display for TransitionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransitionError::InvalidIdentifier { what, name, reason } => {
                write!(f, "{what} name {name:?} refused: {reason}")
            }
            TransitionError::InvalidInput { column, reason } => {
                write!(f, "transition of {column} refused: {reason}")
            }
            TransitionError::Corrupt { column, id, reason } => {
                write!(f, "the row {id} of {column} cannot be read as a status: {reason}")
            }
            TransitionError::Conflict { column, source } => write!(
                f,
                "transition of {column} met a concurrent transaction; roll back and retry: {}",
                causes(&**source)
            ),
            TransitionError::Database { column, source } => {
                write!(f, "transition of {column} failed in the database: {}", causes(&**source))
            }
        }
    }
}

/// `error` and its causes, `: `-separated, each said once: drivers often keep the reason
/// a few causes down ("db error" above "could not serialize access ..."), and `{e}` alone
/// must tell what failed.
fn causes(error: &(dyn Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let said = cause.to_string();
        if !line.contains(&said) {
            line.push_str(": ");
            line.push_str(&said);
        }
        next = cause.source();
    }
    line
}

impl Error for TransitionError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            TransitionError::Conflict { source, .. } | TransitionError::Database { source, .. } => {
                Some(&**source)
            }
            _ => None,
        }
    }
}
