//! [`Plan`]: one transition's validated input, its two statements, and the decision
//! from what the database answered. A driver binds and executes; everything it decides
//! is decided here, once for every engine.
//!
//! Invariants:
//! - A `Plan` exists only for a `from` list of 1 to [`MAX_SOURCES`] statuses that does
//!   not hold `to` (ignoring ASCII case and trailing spaces), so an `UPDATE` that
//!   matched a row moved it out of a source status into `to`, and only that is
//!   [`Transition::Applied`].
//! - Statuses are compared by the database only, never in Rust: the read returns the
//!   database's own `status = to` and `status IN (from, ...)` beside the value, the
//!   same comparisons by the same column type and collation as the `UPDATE`'s (`CHAR(n)`
//!   ignoring its padding, a case-insensitive collation ignoring case), so the answer
//!   agrees with what the `UPDATE` matched. The value itself is only reported.

use std::error::Error;
use std::fmt;

use super::{Dialect, StatusColumn, Transition, TransitionError};

/// The most source statuses one transition may name: far above any state machine's,
/// far below every engine's limit on a statement's parameters.
pub const MAX_SOURCES: usize = 100;

/// A status as the driver read it back from the row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredStatus {
    /// A text value.
    Text(String),
    /// SQL `NULL`.
    Null,
    /// A value of another type: what the driver says it is (e.g. `"INTEGER"`).
    Other(String),
}

/// One row as [`select_sql`](Plan::select_sql) read it: the status, and what the
/// database answered comparing it with the target and the sources (a `NULL` comparison,
/// from a `NULL` status, is `false`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRow {
    /// The status as the database holds it (as text, in PostgreSQL).
    pub status: StoredStatus,
    /// The database's `status = to`.
    pub is_target: bool,
    /// The database's `status IN (from, ...)`: the `UPDATE`'s own condition.
    pub is_source: bool,
}

/// One transition of one [`StatusColumn`]: `from` → `to` in a [`Dialect`], validated.
/// Made by [`StatusColumn::plan`]; the driver runs [`update_sql`](Self::update_sql),
/// hands the affected rows to [`after_update`](Self::after_update), and if that gives no
/// answer, runs [`select_sql`](Self::select_sql) and hands the rows to
/// [`after_read`](Self::after_read). Both statements take the same parameters, bound in
/// the same order: the target, each of [`from`](Self::from) in order, then the id.
#[derive(Debug, Clone)]
pub struct Plan<'a> {
    column: &'a StatusColumn,
    dialect: Dialect,
    from: &'a [&'a str],
    to: &'a str,
}

impl StatusColumn {
    /// The transition of this column's row from any of `from` to `to`, written in
    /// `dialect`. Refused with [`TransitionError::InvalidInput`] (no SQL exists yet)
    /// when `from` is empty or longer than [`MAX_SOURCES`], or holds `to` ignoring ASCII
    /// case and trailing spaces: a duplicate would then match the `UPDATE` and count as
    /// applied again (MySQL's default collations compare so: `paid` and `PAID ` match
    /// `PAID`).
    ///
    /// Statuses are any strings, bound as parameters, and compared by the database
    /// only (by the column's type and collation), in the `UPDATE` and in the answer.
    pub fn plan<'a>(
        &'a self,
        dialect: Dialect,
        from: &'a [&'a str],
        to: &'a str,
    ) -> Result<Plan<'a>, TransitionError> {
        let refuse = |reason: String| {
            Err(TransitionError::InvalidInput { column: self.to_string(), reason })
        };
        if from.is_empty() {
            return refuse(format!(
                "no source status given: name the statuses a row may move to {to:?} from"
            ));
        }
        if from.len() > MAX_SOURCES {
            return refuse(format!(
                "{} source statuses given; at most {MAX_SOURCES} are accepted",
                from.len()
            ));
        }
        let loose = |s: &str| s.trim_end_matches(' ').to_ascii_lowercase();
        if let Some(same) = from.iter().find(|f| loose(f) == loose(to)) {
            return refuse(format!(
                "the target {to:?} is also a source ({same:?}): a duplicate would match the \
                 update and count as applied again; list only the statuses that move to it"
            ));
        }
        Ok(Plan { column: self, dialect, from, to })
    }
}

impl<'a> Plan<'a> {
    /// The target status.
    pub fn to(&self) -> &'a str {
        self.to
    }

    /// The source statuses, in the order [`update_sql`](Self::update_sql) binds them.
    pub fn from(&self) -> &'a [&'a str] {
        self.from
    }

    /// `UPDATE t SET status = P1 WHERE status IN (P2, ...) AND id = Pn`: bind the
    /// target, each of [`from`](Self::from) in order, then the id.
    pub fn update_sql(&self) -> String {
        let (c, d) = (self.column, self.dialect);
        let mut sql = String::with_capacity(64 + 4 * self.from.len());
        sql.push_str("UPDATE ");
        c.push_table(&mut sql, d);
        sql.push_str(" SET ");
        c.push_status(&mut sql, d);
        sql.push_str(" = ");
        d.param(&mut sql, 1);
        sql.push_str(" WHERE ");
        self.push_is_source(&mut sql);
        sql.push_str(" AND ");
        self.push_is_id(&mut sql);
        sql
    }

    /// `SELECT status, status = P1, status IN (P2, ...) FROM t WHERE id = Pn LIMIT 2`,
    /// `FOR UPDATE` where the engine locks rows: the parameters of
    /// [`update_sql`](Self::update_sql), bound the same way. The two comparisons are the
    /// database's, by the column's type and collation, as the `UPDATE`'s was; PostgreSQL
    /// reads the status as `text` (a `CHAR(n)` without its padding, an enum's label).
    /// Two rows at most, to tell a non-unique id from a unique one.
    pub fn select_sql(&self) -> String {
        let (c, d) = (self.column, self.dialect);
        let mut sql = String::with_capacity(96 + 4 * self.from.len());
        sql.push_str("SELECT ");
        c.push_status(&mut sql, d);
        sql.push_str(d.as_text_suffix());
        sql.push_str(", ");
        c.push_status(&mut sql, d);
        sql.push_str(" = ");
        d.param(&mut sql, 1);
        sql.push_str(", ");
        self.push_is_source(&mut sql);
        sql.push_str(" FROM ");
        c.push_table(&mut sql, d);
        sql.push_str(" WHERE ");
        self.push_is_id(&mut sql);
        sql.push_str(" LIMIT 2");
        sql.push_str(d.lock_suffix());
        sql
    }

    /// `status IN (P2, ..., Pn-1)`: the sources, after the target's parameter.
    fn push_is_source(&self, sql: &mut String) {
        let (c, d) = (self.column, self.dialect);
        c.push_status(sql, d);
        sql.push_str(" IN (");
        for n in 0..self.from.len() {
            if n > 0 {
                sql.push_str(", ");
            }
            d.param(sql, n + 2);
        }
        sql.push(')');
    }

    /// `id = Pn`: the id, the last parameter.
    fn push_is_id(&self, sql: &mut String) {
        let (c, d) = (self.column, self.dialect);
        c.push_id(sql, d);
        sql.push_str(" = ");
        d.param(sql, self.from.len() + 2);
    }

    /// The answer from the `UPDATE`'s affected rows: `Some(Applied)` for one, `None` for none
    /// (read the status next), [`TransitionError::Corrupt`] for several (the id column
    /// is not unique; roll back). `id` names the row in that error.
    ///
    /// Either count of MySQL's will do: matched rows (sqlx connects with
    /// `CLIENT_FOUND_ROWS`) or changed rows (mysql_async's default), since `to` is never
    /// a source and a matched row is always changed.
    pub fn after_update(
        &self,
        rows: u64,
        id: &dyn fmt::Debug,
    ) -> Result<Option<Transition>, TransitionError> {
        match rows {
            0 => Ok(None),
            1 => Ok(Some(Transition::Applied)),
            n => Err(self.corrupt(
                id,
                format!("{n} rows were updated: the id column must be unique (a primary key)"),
            )),
        }
    }

    /// The answer from the rows [`select_sql`](Self::select_sql) read after an `UPDATE`
    /// that moved none: no row is [`Transition::NotFound`]; a status the database found
    /// equal to the target is [`Transition::AlreadyInTarget`]; any other text is
    /// [`Transition::Illegal`], except one the database found among the sources, which
    /// means the row moved between the two statements and is
    /// [`TransitionError::Conflict`]. NULL, a non-text value or two rows are
    /// [`TransitionError::Corrupt`]. The value is only reported (`Illegal`'s `current`),
    /// never compared here.
    pub fn after_read(
        &self,
        rows: Vec<ReadRow>,
        id: &dyn fmt::Debug,
    ) -> Result<Transition, TransitionError> {
        let mut rows = rows.into_iter();
        let row = match (rows.next(), rows.next()) {
            (None, _) => return Ok(Transition::NotFound),
            (Some(row), None) => row,
            (Some(_), Some(_)) => {
                return Err(self.corrupt(
                    id,
                    "2 rows have this id: the id column must be unique (a primary key)".into(),
                ))
            }
        };
        match row.status {
            StoredStatus::Text(_) if row.is_target => Ok(Transition::AlreadyInTarget),
            StoredStatus::Text(current) if row.is_source => Err(TransitionError::Conflict {
                column: self.column.to_string(),
                source: Box::new(RowMoved { id: format!("{id:?}"), status: current }),
            }),
            StoredStatus::Text(current) => Ok(Transition::Illegal { current }),
            StoredStatus::Null => Err(self.corrupt(id, "the status is NULL".into())),
            StoredStatus::Other(kind) => {
                Err(self.corrupt(id, format!("the status is {kind}, not text")))
            }
        }
    }

    /// A driver's error running this plan's statements, as a [`TransitionError`]:
    /// [`Conflict`](TransitionError::Conflict) when `conflict` (the driver classified it
    /// with `is_conflict_*`), [`Database`](TransitionError::Database) otherwise.
    pub fn failed(
        &self,
        source: impl Into<Box<dyn Error + Send + Sync>>,
        conflict: bool,
    ) -> TransitionError {
        let (column, source) = (self.column.to_string(), source.into());
        if conflict {
            TransitionError::Conflict { column, source }
        } else {
            TransitionError::Database { column, source }
        }
    }

    fn corrupt(&self, id: &dyn fmt::Debug, reason: String) -> TransitionError {
        TransitionError::Corrupt { column: self.column.to_string(), id: format!("{id:?}"), reason }
    }
}

/// The row's status was a source after an `UPDATE` that matched no row: another
/// transaction moved it between the two statements.
#[derive(Debug)]
struct RowMoved {
    id: String,
    status: String,
}

impl fmt::Display for RowMoved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the row {} has the source status {:?}, yet the update matched no row: another \
             transaction moved it, and committed, between the update and the read",
            self.id, self.status
        )
    }
}

impl Error for RowMoved {}

#[cfg(test)]
mod tests {
    use super::*;

    fn payments() -> StatusColumn {
        StatusColumn::new("payments", "id", "status").unwrap()
    }

    /// A row holding `s` that the database found neither the target nor a source.
    fn text(s: &str) -> ReadRow {
        ReadRow { status: StoredStatus::Text(s.into()), is_target: false, is_source: false }
    }

    /// A row holding `s` that the database found equal to the target.
    fn target(s: &str) -> ReadRow {
        ReadRow { is_target: true, ..text(s) }
    }

    /// A row holding `s` that the database found among the sources.
    fn source(s: &str) -> ReadRow {
        ReadRow { is_source: true, ..text(s) }
    }

    fn stored(status: StoredStatus) -> ReadRow {
        ReadRow { status, is_target: false, is_source: false }
    }

    #[test]
    fn the_statements_in_each_dialect() {
        let column = StatusColumn::new("billing.payments", "id", "status").unwrap();
        let from = ["PENDING", "AUTHORIZED"];
        let sqlite = column.plan(Dialect::Sqlite, &from, "PAID").unwrap();
        assert_eq!(
            sqlite.update_sql(),
            "UPDATE `billing`.`payments` SET `status` = ? WHERE `status` IN (?, ?) AND `id` = ?"
        );
        assert_eq!(
            sqlite.select_sql(),
            "SELECT `status`, `status` = ?, `status` IN (?, ?) FROM `billing`.`payments` \
             WHERE `id` = ? LIMIT 2"
        );
        let pg = column.plan(Dialect::Postgres, &from, "PAID").unwrap();
        assert_eq!(
            pg.update_sql(),
            "UPDATE \"billing\".\"payments\" SET \"status\" = $1 \
             WHERE \"status\" IN ($2, $3) AND \"id\" = $4"
        );
        assert_eq!(
            pg.select_sql(),
            "SELECT \"status\"::text, \"status\" = $1, \"status\" IN ($2, $3) \
             FROM \"billing\".\"payments\" WHERE \"id\" = $4 LIMIT 2 FOR UPDATE"
        );
        let mysql = payments().plan(Dialect::MySql, &["PENDING"], "PAID").unwrap().update_sql();
        assert_eq!(mysql, "UPDATE `payments` SET `status` = ? WHERE `status` IN (?) AND `id` = ?");
        let mysql = payments().plan(Dialect::MySql, &["PENDING"], "PAID").unwrap().select_sql();
        assert_eq!(
            mysql,
            "SELECT `status`, `status` = ?, `status` IN (?) FROM `payments` WHERE `id` = ? \
             LIMIT 2 FOR UPDATE"
        );
    }

    #[test]
    fn postgres_numbers_every_source_parameter() {
        let from: Vec<String> = (0..MAX_SOURCES).map(|n| format!("S{n}")).collect();
        let from: Vec<&str> = from.iter().map(String::as_str).collect();
        let column = payments();
        let plan = column.plan(Dialect::Postgres, &from, "PAID").unwrap();
        let update = plan.update_sql();
        assert!(update.ends_with(r#"$100, $101) AND "id" = $102"#), "{update}");
        assert_eq!(update.matches('$').count(), 2 + MAX_SOURCES);
        // The read binds the same parameters, each once.
        let select = plan.select_sql();
        assert!(select.contains(r#"$100, $101) FROM "payments" WHERE "id" = $102 "#), "{select}");
        assert_eq!(select.matches('$').count(), 2 + MAX_SOURCES);
    }

    #[test]
    fn statuses_are_never_part_of_the_sql() {
        let from = ["x'); DROP TABLE payments; --"];
        let column = payments();
        let plan = column.plan(Dialect::Sqlite, &from, "'; DROP TABLE y").unwrap();
        assert!(!plan.update_sql().contains("DROP") && !plan.select_sql().contains("DROP"));
        assert_eq!((plan.from(), plan.to()), (&from[..], "'; DROP TABLE y"));
    }

    #[test]
    fn a_transition_needs_a_source_and_a_target_apart_from_them() {
        let column = payments();
        let refused = |from: &[&str], to: &str| match column.plan(Dialect::Postgres, from, to) {
            Err(e @ TransitionError::InvalidInput { .. }) => e.to_string(),
            other => panic!("{from:?} -> {to:?}: expected InvalidInput, got {other:?}"),
        };
        assert!(refused(&[], "PAID").contains("no source status"));
        let message = refused(&["PENDING", "PAID"], "PAID");
        assert!(message.starts_with("transition of payments.status refused"), "{message}");
        assert!(message.contains("also a source"), "{message}");
        // MySQL's default collations would match "paid" against a row holding "PAID".
        assert!(refused(&["paid"], "PAID").contains("\"paid\""));
        // And its PAD SPACE collations ignore trailing spaces.
        assert!(refused(&["PENDING", "PAID  "], "paid").contains("\"PAID  \""));
        assert!(refused(&["PAID"], "PAID ").contains("also a source"));
        let many = vec!["S"; MAX_SOURCES + 1];
        assert!(refused(&many, "PAID").contains("at most 100"));
        // Any strings otherwise, the empty one included.
        assert!(column.plan(Dialect::Postgres, &["", "PENDING"], "PAÏD").is_ok());
        assert!(column.plan(Dialect::Postgres, &vec!["S"; MAX_SOURCES], "PAID").is_ok());
    }

    #[test]
    fn one_updated_row_is_applied_none_reads_several_are_corrupt() {
        let column = payments();
        let plan = column.plan(Dialect::Sqlite, &["PENDING"], "PAID").unwrap();
        assert_eq!(plan.after_update(1, &7).unwrap(), Some(Transition::Applied));
        assert_eq!(plan.after_update(0, &7).unwrap(), None);
        let error = plan.after_update(3, &7).unwrap_err();
        assert!(matches!(&error, TransitionError::Corrupt { id, .. } if id == "7"), "{error:?}");
        assert!(error.to_string().contains("3 rows were updated"), "{error}");
    }

    #[test]
    fn the_read_tells_duplicate_illegal_and_missing_apart() {
        let column = payments();
        let plan = column.plan(Dialect::Postgres, &["PENDING", "FAILED"], "PAID").unwrap();
        assert_eq!(plan.after_read(vec![target("PAID")], &1).unwrap(), Transition::AlreadyInTarget);
        assert_eq!(
            plan.after_read(vec![text("REFUNDED")], &1).unwrap(),
            Transition::Illegal { current: "REFUNDED".into() }
        );
        assert_eq!(plan.after_read(vec![], &1).unwrap(), Transition::NotFound);
    }

    #[test]
    fn the_database_compares_the_read_only_reports_the_value() {
        let column = payments();
        let plan = column.plan(Dialect::Postgres, &["PENDING", "FAILED"], "PAID").unwrap();
        // A padded CHAR(n), or a case-insensitive collation: the target by the
        // database's comparison, whatever the bytes.
        for held in ["PAID      ", "paid"] {
            let answer = plan.after_read(vec![target(held)], &1).unwrap();
            assert_eq!(answer, Transition::AlreadyInTarget, "{held:?}");
        }
        // A binary collation: "paid" is another status, and is reported as held.
        assert_eq!(
            plan.after_read(vec![text("paid")], &1).unwrap(),
            Transition::Illegal { current: "paid".into() }
        );
        // Nor do the bytes make a source: only the database's `IN` does.
        assert_eq!(
            plan.after_read(vec![text("FAILED")], &1).unwrap(),
            Transition::Illegal { current: "FAILED".into() }
        );
        assert!(plan.after_read(vec![source("failed ")], &1).unwrap_err().is_conflict());
    }

    #[test]
    fn a_source_status_read_after_no_update_is_a_conflict_to_retry() {
        let column = payments();
        let plan = column.plan(Dialect::Postgres, &["PENDING", "FAILED"], "PAID").unwrap();
        let error = plan.after_read(vec![source("FAILED")], &"p-1").unwrap_err();
        assert!(error.is_conflict(), "{error:?}");
        let message = error.to_string();
        assert!(message.contains("roll back and retry"), "{message}");
        assert!(message.contains("\"p-1\"") && message.contains("\"FAILED\""), "{message}");
    }

    #[test]
    fn unreadable_statuses_and_duplicate_ids_are_corrupt_naming_table_and_id() {
        let column = payments();
        let plan = column.plan(Dialect::MySql, &["PENDING"], "PAID").unwrap();
        let cases = [
            (vec![stored(StoredStatus::Null)], "the status is NULL"),
            (
                vec![stored(StoredStatus::Other("INTEGER".into()))],
                "the status is INTEGER, not text",
            ),
            (vec![target("PAID"), source("PENDING")], "2 rows have this id"),
        ];
        for (rows, reason) in cases {
            let error = plan.after_read(rows, &42_i64).unwrap_err();
            assert!(matches!(error, TransitionError::Corrupt { .. }), "{error:?}");
            let message = error.to_string();
            assert!(message.contains("the row 42 of payments.status"), "{message}");
            assert!(message.contains(reason), "{message}");
        }
    }

    #[test]
    fn driver_errors_are_conflicts_or_database_errors_with_their_causes() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("db error")
            }
        }
        impl Error for Outer {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&self.0)
            }
        }
        let column = payments();
        let plan = column.plan(Dialect::Postgres, &["PENDING"], "PAID").unwrap();
        let buried = || Outer(std::io::Error::other("could not serialize access"));
        let conflict = plan.failed(buried(), true);
        assert!(conflict.is_conflict());
        assert_eq!(
            conflict.to_string(),
            "transition of payments.status met a concurrent transaction; roll back and retry: \
             db error: could not serialize access"
        );
        assert_eq!(conflict.source().unwrap().to_string(), "db error");
        let other = plan.failed(buried(), false);
        assert!(!other.is_conflict());
        assert!(other
            .to_string()
            .starts_with("transition of payments.status failed in the database: db error: could"));
    }
}
