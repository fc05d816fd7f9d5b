//! [`StatusColumn`]: the table, id column and status column a transition runs on, as
//! validated names, and their quoting in each [`Dialect`].
//!
//! Invariant: a `StatusColumn` holds only names that passed [`validate`]: an ASCII
//! letter or `_`, then ASCII letters, digits and `_`, at most [`MAX_IDENTIFIER_LEN`]
//! bytes (the table optionally `schema.table`). Such a name holds no quote character of
//! any dialect, so quoting it cannot be escaped; it is the only text interpolated into
//! the SQL this module builds.

use std::fmt;

use super::TransitionError;

/// The longest name accepted, in bytes: PostgreSQL's limit (it silently truncates a
/// longer name to 63 bytes, which would name another table); MySQL allows 64.
pub const MAX_IDENTIFIER_LEN: usize = 63;

/// The SQL dialect a statement is written in: how names are quoted, how parameters are
/// written, and how the status is read back (as text, under a lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dialect {
    /// SQLite: names in backticks, `?` parameters, no row locks (the transaction's
    /// write lock, taken by the `UPDATE`, covers the read). Not double quotes: SQLite
    /// reads a double-quoted name that matches no column as a string literal, so a
    /// misspelled id column would silently match no row.
    Sqlite,
    /// PostgreSQL: names in double quotes, `$1, $2, ...` parameters, `FOR UPDATE` reads.
    Postgres,
    /// MySQL and MariaDB: names in backticks (double quotes are strings unless
    /// `ANSI_QUOTES`), `?` parameters, `FOR UPDATE` reads (a plain read under
    /// `REPEATABLE READ` would see the transaction's snapshot, not the committed row).
    MySql,
}

impl Dialect {
    /// `name` (already validated) quoted for this dialect.
    fn quote(self, out: &mut String, name: &str) {
        let q = match self {
            Dialect::Postgres => '"',
            Dialect::Sqlite | Dialect::MySql => '`',
        };
        out.push(q);
        out.push_str(name);
        out.push(q);
    }

    /// The `n`th parameter (1-based) of a statement.
    pub(super) fn param(self, out: &mut String, n: usize) {
        match self {
            Dialect::Postgres => {
                out.push('$');
                out.push_str(&n.to_string());
            }
            Dialect::Sqlite | Dialect::MySql => out.push('?'),
        }
    }

    /// What follows the read of the status: a row lock where the engine has them.
    pub(super) fn lock_suffix(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres | Dialect::MySql => " FOR UPDATE",
        }
    }

    /// What follows the status read back to make it text: PostgreSQL's drivers read an
    /// enum type's value only as text, and `text` drops a `CHAR(n)`'s padding, which
    /// the column's own comparisons ignore. MySQL sends every string type, `ENUM`
    /// included, as text (`CHAR(n)` without its padding); SQLite's value keeps its
    /// storage class, so a status that is not text is told apart.
    pub(super) fn as_text_suffix(self) -> &'static str {
        match self {
            Dialect::Postgres => "::text",
            Dialect::Sqlite | Dialect::MySql => "",
        }
    }
}

/// A table's status column, keyed by its id column: the names a transition runs on,
/// validated once (see [`new`](Self::new)).
///
/// ```
/// use idemcache_sql::transition::{StatusColumn, TransitionError};
///
/// let payments = StatusColumn::new("payments", "id", "status")?;
/// assert!(StatusColumn::new("payments; DROP TABLE x", "id", "status").is_err());
/// # Ok::<(), TransitionError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusColumn {
    /// The table, possibly `schema.table`.
    table: String,
    id: String,
    status: String,
}

impl StatusColumn {
    /// The status column `status_column` of `table`, whose rows `id_column` names (a
    /// primary key or `UNIQUE`). `table` may be `schema.table`.
    ///
    /// Each name must be an ASCII letter or `_`, then ASCII letters, digits and `_`, at
    /// most [`MAX_IDENTIFIER_LEN`] bytes; anything else is
    /// [`TransitionError::InvalidIdentifier`], before any SQL exists. Names are quoted
    /// exactly as given, so they are matched case-sensitively where the engine does:
    /// PostgreSQL stores an unquoted `CREATE TABLE Payments` as `payments`, so pass
    /// `payments`.
    pub fn new(
        table: &str,
        id_column: &str,
        status_column: &str,
    ) -> Result<StatusColumn, TransitionError> {
        match table.split_once('.') {
            Some((schema, name)) => {
                validate("schema", schema)?;
                validate("table", name)?;
            }
            None => validate("table", table)?,
        }
        validate("id column", id_column)?;
        validate("status column", status_column)?;
        Ok(StatusColumn {
            table: table.to_owned(),
            id: id_column.to_owned(),
            status: status_column.to_owned(),
        })
    }

    /// The table, as given (`schema.table` or `table`).
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The id column.
    pub fn id_column(&self) -> &str {
        &self.id
    }

    /// The status column.
    pub fn status_column(&self) -> &str {
        &self.status
    }

    /// The table, quoted (each part of `schema.table`).
    pub(super) fn push_table(&self, out: &mut String, dialect: Dialect) {
        let mut parts = self.table.splitn(2, '.');
        if let Some(first) = parts.next() {
            dialect.quote(out, first);
        }
        if let Some(second) = parts.next() {
            out.push('.');
            dialect.quote(out, second);
        }
    }

    /// The id column, quoted.
    pub(super) fn push_id(&self, out: &mut String, dialect: Dialect) {
        dialect.quote(out, &self.id);
    }

    /// The status column, quoted.
    pub(super) fn push_status(&self, out: &mut String, dialect: Dialect) {
        dialect.quote(out, &self.status);
    }
}

impl fmt::Display for StatusColumn {
    /// `table.status` (`schema.table.status`), as error messages name it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.table, self.status)
    }
}

/// Refuses `name` (the `what` of a statement: "table", "id column", ...) unless it is an
/// ASCII letter or `_`, then ASCII letters, digits and `_`, 1 to 63 bytes.
fn validate(what: &'static str, name: &str) -> Result<(), TransitionError> {
    let refuse =
        |reason| Err(TransitionError::InvalidIdentifier { what, name: name.into(), reason });
    let Some(first) = name.bytes().next() else {
        return refuse("it is empty");
    };
    if name.len() > MAX_IDENTIFIER_LEN {
        return refuse("it is longer than 63 bytes");
    }
    if !(first.is_ascii_alphabetic() || first == b'_') {
        return refuse("it must start with an ASCII letter or '_'");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return refuse("it may hold only ASCII letters, digits and '_'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(table: &str, id: &str, status: &str) -> String {
        match StatusColumn::new(table, id, status) {
            Err(e @ TransitionError::InvalidIdentifier { .. }) => e.to_string(),
            other => {
                panic!("{table:?} {id:?} {status:?}: expected InvalidIdentifier, got {other:?}")
            }
        }
    }

    #[test]
    fn plain_and_schema_qualified_names_are_accepted() {
        for table in ["payments", "_p", "P2", "billing.payments", &"t".repeat(63)] {
            let column = StatusColumn::new(table, "id", "status").unwrap();
            assert_eq!(column.table(), table);
        }
        let column = StatusColumn::new("billing.payments", "payment_id", "state").unwrap();
        assert_eq!((column.id_column(), column.status_column()), ("payment_id", "state"));
        assert_eq!(column.to_string(), "billing.payments.state");
    }

    #[test]
    fn injection_attempts_and_odd_names_are_refused() {
        let names = [
            "payments; DROP TABLE x",
            "payments\"; DROP TABLE x; --",
            "pay`ments",
            "pay ments",
            "payments--",
            "1payments",
            "",
            "päyments",
            "a.b.c",
            ".payments",
            "payments.",
            "pay\0ments",
        ];
        for name in names {
            refused(name, "id", "status");
            refused("payments", name, "status");
            refused("payments", "id", name);
        }
        assert!(StatusColumn::new(&"t".repeat(64), "id", "status").is_err());
        assert!(StatusColumn::new(&format!("s.{}", "t".repeat(64)), "id", "status").is_err());
    }

    #[test]
    fn refusals_name_the_part_and_the_reason() {
        let message = refused("payments; DROP TABLE x", "id", "status");
        assert!(
            message.contains("table") && message.contains("payments; DROP TABLE x"),
            "{message}"
        );
        assert!(message.contains("only ASCII letters, digits and '_'"), "{message}");
        assert!(refused("payments", "", "status").contains("id column"));
        assert!(refused("payments", "id", "9s").contains("status column"));
        assert!(refused("payments", "id", "9s").contains("start with"));
        assert!(refused("x.payments", "id", &"s".repeat(64)).contains("longer than 63"));
        assert!(refused("1x.payments", "id", "status").contains("schema"));
    }
}
