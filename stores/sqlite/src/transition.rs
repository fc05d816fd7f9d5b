//! Conditional transitions of a status column in your own rusqlite transaction (see
//! [`idemcache_sql::transition`] for the contract).
//!
//! Invariant: the transition is an `UPDATE` and, only if it matched no row, one read in
//! the same transaction; both statements are the core's [`Plan`], with every value bound.
//! The read returns SQLite's own `status = to` and `status IN (from, ...)`, compared by
//! the column's collation as the `UPDATE`'s condition was (`NOCASE` ignores ASCII
//! case, `RTRIM` trailing spaces), and the answer is taken from those, not from the
//! bytes read back.

use std::fmt;

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, ToSql};

use idemcache_sql::transition::{
    is_conflict_sqlite_code, Dialect, Plan, ReadRow, StatusColumn, StoredStatus, Transition,
    TransitionError,
};

/// Moves the row of `column`'s table whose id is `id` from any status in `from` to
/// `to` inside `tx`, and says what it found (see [`Transition`]): do the effect of
/// [`Transition::Applied`] in `tx` too, and commit both together. `tx` is your
/// transaction's connection, as [`inbox::receive`](crate::inbox::receive) takes it (a
/// `&rusqlite::Transaction`, or the connection a `SqliteTransaction` lends); a
/// connection in no transaction is refused ([`TransitionError::InvalidInput`]): the
/// transition would commit on its own, before the effect it stands for.
///
/// `id` is any value rusqlite binds (an integer, a `&str`, ...); the status column holds
/// text. A NULL or non-text status is [`TransitionError::Corrupt`]; invalid input
/// ([`StatusColumn::plan`]) is refused before any SQL runs.
///
/// ```
/// use idemcache_sql::transition::{StatusColumn, Transition};
/// use idemcache_sqlite::rusqlite::{Connection, TransactionBehavior};
/// use idemcache_sqlite::transition;
///
/// let mut db = Connection::open_in_memory()?;
/// db.execute_batch(
///     "CREATE TABLE payments (id TEXT PRIMARY KEY, status TEXT NOT NULL);
///      CREATE TABLE ledger (payment TEXT NOT NULL);
///      INSERT INTO payments VALUES ('p1', 'PENDING');",
/// )?;
/// let payments = StatusColumn::new("payments", "id", "status")?;
///
/// // The payment provider's SUCCESS callback, delivered twice.
/// for _ in 0..2 {
///     let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
///     match transition(&tx, &payments, "p1", &["PENDING"], "PAID")? {
///         Transition::Applied => {
///             tx.execute("INSERT INTO ledger VALUES ('p1')", [])?;
///         }
///         Transition::AlreadyInTarget => {} // a duplicate: answer OK, do nothing
///         Transition::Illegal { current } => return Err(format!("409: payment is {current}").into()),
///         Transition::NotFound => return Err("404".into()),
///     }
///     tx.commit()?;
/// }
/// let entries: i64 = db.query_row("SELECT count(*) FROM ledger", [], |r| r.get(0))?;
/// assert_eq!(entries, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// `tx` is the connection of your transaction (a `rusqlite::Transaction`, or the one a
/// [`SqliteTransaction`](crate::SqliteTransaction) lends in the layer's one-commit
/// mode). Run it in a transaction begun `IMMEDIATE` (rusqlite's
/// `transaction_with_behavior(TransactionBehavior::Immediate)`): the write lock is then
/// held from the start, so the read sees what the `UPDATE` saw and the answer holds until
/// you commit. In a `DEFERRED` transaction that read before, another connection's commit
/// makes the `UPDATE` fail with `SQLITE_BUSY_SNAPSHOT`
/// ([`TransitionError::Conflict`]: roll back and run it again).
pub fn transition(
    tx: &Connection,
    column: &StatusColumn,
    id: impl ToSql,
    from: &[&str],
    to: &str,
) -> Result<Transition, TransitionError> {
    let plan = column.plan(Dialect::Sqlite, from, to)?;
    if tx.is_autocommit() {
        return Err(TransitionError::InvalidInput {
            column: format!("{}.{}", column.table(), column.status_column()),
            reason: "the transition runs in the transaction of its effect; this connection \
                     is in none"
                .into(),
        });
    }
    let shown = Shown(&id);
    let to = plan.to();
    // The plan's parameters, the same for both statements: target, sources, id.
    let mut params: Vec<&dyn ToSql> = Vec::with_capacity(2 + from.len());
    params.push(&to);
    params.extend(plan.from().iter().map(|f| f as &dyn ToSql));
    params.push(&id);
    let updated = tx
        .prepare_cached(&plan.update_sql())
        .and_then(|mut update| update.execute(params.as_slice()))
        .map_err(|e| failed(&plan, e))?;
    if let Some(done) = plan.after_update(updated as u64, &shown)? {
        return Ok(done);
    }
    let rows = read(tx, &plan, &params).map_err(|e| failed(&plan, e))?;
    plan.after_read(rows, &shown)
}

/// Runs the plan's read: each row (at most two) with the id, its status and SQLite's
/// comparisons of it.
fn read(
    conn: &Connection,
    plan: &Plan<'_>,
    params: &[&dyn ToSql],
) -> rusqlite::Result<Vec<ReadRow>> {
    let mut statement = conn.prepare_cached(&plan.select_sql())?;
    let mut rows = statement.query(params)?;
    let mut found = Vec::with_capacity(1);
    while let Some(row) = rows.next()? {
        found.push(ReadRow {
            status: stored(row.get_ref(0)?),
            // NULL (a NULL status) compares as neither.
            is_target: row.get::<_, Option<bool>>(1)?.unwrap_or(false),
            is_source: row.get::<_, Option<bool>>(2)?.unwrap_or(false),
        });
    }
    Ok(found)
}

/// A status as SQLite holds it: text, or its storage class.
fn stored(value: ValueRef<'_>) -> StoredStatus {
    match value {
        ValueRef::Text(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => StoredStatus::Text(text.to_owned()),
            Err(_) => StoredStatus::Other("TEXT that is not UTF-8".into()),
        },
        ValueRef::Null => StoredStatus::Null,
        ValueRef::Integer(_) => StoredStatus::Other("INTEGER".into()),
        ValueRef::Real(_) => StoredStatus::Other("REAL".into()),
        ValueRef::Blob(_) => StoredStatus::Other("BLOB".into()),
    }
}

/// A rusqlite error as the transition's: `SQLITE_BUSY` in any form is a conflict.
fn failed(plan: &Plan<'_>, error: rusqlite::Error) -> TransitionError {
    let conflict = matches!(&error, rusqlite::Error::SqliteFailure(e, _)
        if is_conflict_sqlite_code(e.extended_code));
    plan.failed(error, conflict)
}

/// The id as error messages show it: `42`, `"p-1"`; formatted only when one is written.
struct Shown<'a, T: ToSql>(&'a T);

impl<T: ToSql> fmt::Debug for Shown<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Ok(output) = self.0.to_sql() else {
            return f.write_str("(an id rusqlite cannot convert)");
        };
        let value = if let ToSqlOutput::Borrowed(value) = &output {
            *value
        } else if let ToSqlOutput::Owned(value) = &output {
            ValueRef::from(value)
        } else {
            return f.write_str("(an id)");
        };
        match value {
            ValueRef::Null => f.write_str("NULL"),
            ValueRef::Integer(i) => write!(f, "{i}"),
            ValueRef::Real(r) => write!(f, "{r}"),
            ValueRef::Text(t) => write!(f, "{:?}", String::from_utf8_lossy(t)),
            ValueRef::Blob(b) => {
                f.write_str("x'")?;
                b.iter().try_for_each(|byte| write!(f, "{byte:02x}"))?;
                f.write_str("'")
            }
        }
    }
}
