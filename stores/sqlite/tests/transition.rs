//! Conditional transitions against SQLite files (WAL, as several processes share one):
//! the transitions' suite (`idemcache_sql::transition::testing`), then what is SQLite's
//! own: a misspelled column is an error (not a silent NotFound), statuses of other
//! types are corrupt, a non-unique id is corrupt and rolled back, integer ids and
//! schema-qualified tables, a deferred transaction's stale snapshot is a conflict to
//! retry, every declared type and collation answers as the database compares.

use std::sync::Arc;
use std::time::Duration;

use idemcache_sql::transition::testing::{self, Boxed, Payments};
use idemcache_sql::transition::{StatusColumn, Transition, TransitionError};
use idemcache_sqlite::rusqlite::{params, Connection, ToSql, TransactionBehavior};
use idemcache_sqlite::transition;

mod common;

/// A database file of this test's own (WAL), holding the payments and their ledger.
struct Db(common::TempDb);

impl Db {
    fn new() -> Db {
        let db = Db(common::TempDb::new("transition", "payments"));
        db.open()
            .execute_batch(
                "CREATE TABLE payments (id TEXT PRIMARY KEY, status TEXT, amount INTEGER NOT NULL);
                 CREATE TABLE ledger (payment TEXT NOT NULL, amount INTEGER NOT NULL);
                 CREATE TABLE x (keep INTEGER);
                 INSERT INTO payments VALUES ('p1', 'PENDING', 500), ('p2', 'PAID', 700);",
            )
            .unwrap();
        db
    }

    fn open(&self) -> Connection {
        self.0.open("wal", Duration::from_secs(30))
    }
}

fn payments() -> StatusColumn {
    StatusColumn::new("payments", "id", "status").unwrap()
}

fn status(conn: &Connection, id: &str) -> Option<String> {
    conn.query_row("SELECT status FROM payments WHERE id = ?", [id], |r| r.get(0)).unwrap()
}

fn ledger(conn: &Connection, id: &str) -> i64 {
    conn.query_row("SELECT count(*) FROM ledger WHERE payment = ?", [id], |r| r.get(0)).unwrap()
}

/// The SUCCESS callback's handler: PENDING -> PAID, and the ledger entry only if this
/// call applied it, in one `IMMEDIATE` transaction.
fn on_success(conn: &mut Connection, id: &str) -> Result<Transition, TransitionError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let outcome = transition(&tx, &payments(), id, &["PENDING"], "PAID")?;
    if outcome == Transition::Applied {
        tx.execute("INSERT INTO ledger SELECT id, amount FROM payments WHERE id = ?", [id])
            .unwrap();
    }
    tx.commit().unwrap();
    Ok(outcome)
}

/// One transition in an `IMMEDIATE` transaction of its own, committed after an answer
/// and rolled back after an error.
fn alone(
    conn: &mut Connection,
    column: &StatusColumn,
    id: impl ToSql,
    from: &[&str],
    to: &str,
) -> Result<Transition, TransitionError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let outcome = transition(&tx, column, id, from, to)?;
    tx.commit().unwrap();
    Ok(outcome)
}

#[test]
fn a_misspelled_column_is_an_error_not_a_silent_not_found() {
    let db = Db::new();
    let mut conn = db.open();
    // Why the names are in backticks: SQLite reads a double-quoted name that matches no
    // column as a string literal, so this matches no row instead of failing.
    let silent = conn.execute(r#"UPDATE payments SET status = 'X' WHERE "idd" = 'p1'"#, []);
    assert_eq!(silent.unwrap(), 0);
    let column = StatusColumn::new("payments", "idd", "status").unwrap();
    let error = alone(&mut conn, &column, "p1", &["PENDING"], "PAID").unwrap_err();
    assert!(matches!(error, TransitionError::Database { .. }), "{error:?}");
    assert!(error.to_string().contains("no such column: idd"), "{error}");
}

#[test]
fn a_status_that_is_not_text_is_corrupt_naming_table_and_id() {
    let db = Db::new();
    let mut conn = db.open();
    // A TEXT column turns numbers into text; a column without a type keeps them.
    conn.execute_batch(
        "INSERT INTO payments VALUES ('p3', NULL, 1), ('p5', x'00ff', 1);
         CREATE TABLE untyped (id TEXT PRIMARY KEY, status);
         INSERT INTO untyped VALUES ('p4', 42), ('p6', 4.5);",
    )
    .unwrap();
    let untyped = StatusColumn::new("untyped", "id", "status").unwrap();
    for (column, id, what) in [
        (payments(), "p3", "NULL"),
        (payments(), "p5", "BLOB"),
        (untyped.clone(), "p4", "INTEGER"),
        (untyped, "p6", "REAL"),
    ] {
        let error = alone(&mut conn, &column, id, &["PENDING"], "PAID").unwrap_err();
        assert!(matches!(error, TransitionError::Corrupt { .. }), "{error:?}");
        let message = error.to_string();
        let row = format!("the row \"{id}\" of {}.status", column.table());
        assert!(message.contains(&row), "{message}");
        assert!(message.contains(what), "{message}");
    }
}

#[test]
fn a_non_unique_id_is_corrupt_and_the_rollback_undoes_it() {
    let db = Db::new();
    let mut conn = db.open();
    conn.execute_batch(
        "CREATE TABLE loose (id INTEGER, status TEXT);
         INSERT INTO loose VALUES (7, 'PENDING'), (7, 'PENDING'), (8, 'PAID'), (8, 'PAID');",
    )
    .unwrap();
    let loose = StatusColumn::new("loose", "id", "status").unwrap();
    {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
        let error = transition(&tx, &loose, 7, &["PENDING"], "PAID").unwrap_err();
        assert!(error.to_string().contains("the row 7 of loose.status"), "{error}");
        assert!(error.to_string().contains("2 rows were updated"), "{error}");
    }
    let pending: i64 = conn
        .query_row("SELECT count(*) FROM loose WHERE status = 'PENDING'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(pending, 2);
    let error = alone(&mut conn, &loose, 8_i64, &["PENDING"], "PAID").unwrap_err();
    assert!(error.to_string().contains("2 rows have this id"), "{error}");
}

#[test]
fn integer_ids_and_schema_qualified_tables() {
    let db = Db::new();
    let mut conn = db.open();
    conn.execute_batch(
        "CREATE TABLE orders (order_id INTEGER PRIMARY KEY, state TEXT NOT NULL);
         INSERT INTO orders VALUES (41, 'NEW');",
    )
    .unwrap();
    let orders = StatusColumn::new("main.orders", "order_id", "state").unwrap();
    let shipped = alone(&mut conn, &orders, 41, &["NEW"], "SHIPPED").unwrap();
    assert_eq!(shipped, Transition::Applied);
    let again = alone(&mut conn, &orders, 41_i64, &["NEW"], "SHIPPED").unwrap();
    assert_eq!(again, Transition::AlreadyInTarget);
    let missing = alone(&mut conn, &orders, 42, &["NEW"], "SHIPPED").unwrap();
    assert_eq!(missing, Transition::NotFound);
}

#[test]
fn a_deferred_transaction_with_a_stale_snapshot_gets_a_conflict_to_retry() {
    let db = Db::new();
    let (mut late, mut first) = (db.open(), db.open());
    let tx = late.transaction_with_behavior(TransactionBehavior::Deferred).unwrap();
    // The handler loads the payment first: the read starts the WAL snapshot.
    assert_eq!(status(&tx, "p1").as_deref(), Some("PENDING"));
    assert_eq!(on_success(&mut first, "p1").unwrap(), Transition::Applied);
    // Its UPDATE cannot write over a snapshot another commit has passed: SQLITE_BUSY_SNAPSHOT.
    let error = transition(&tx, &payments(), "p1", &["PENDING"], "PAID").unwrap_err();
    assert!(error.is_conflict(), "{error:?}");
    tx.rollback().unwrap();
    // The retry sees the winner's status.
    assert_eq!(on_success(&mut late, "p1").unwrap(), Transition::AlreadyInTarget);
    assert_eq!(ledger(&late, "p1"), 1);
}

/// On `table` holding p1 PENDING and p2 REFUNDED (`column_type` names it in failures),
/// each in its own `IMMEDIATE` transaction: p1 PENDING -> PAID applies, its duplicate is
/// in the target, PAID -> PENDING and REFUNDED -> PAID are refused naming the status, an
/// unknown id is not found.
fn assert_standard_answers(conn: &mut Connection, table: &str, column_type: &str) {
    let column = StatusColumn::new(table, "id", "status").unwrap();
    let answers = [
        ("p1", "PENDING", "PAID", Transition::Applied),
        ("p1", "PENDING", "PAID", Transition::AlreadyInTarget),
        ("p1", "FAILED", "PENDING", Transition::Illegal { current: "PAID".into() }),
        ("p2", "PENDING", "PAID", Transition::Illegal { current: "REFUNDED".into() }),
        ("p404", "PENDING", "PAID", Transition::NotFound),
    ];
    for (id, from, to, expected) in answers {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
        let outcome = transition(&tx, &column, id, &[from], to);
        tx.commit().unwrap();
        assert_eq!(outcome.unwrap(), expected, "{column_type}: {id} {from} -> {to}");
    }
}

/// The declared types a schema uses, and SQLite's stand-in for an enum (a `CHECK` on
/// the labels): SQLite stores and compares them all as text.
#[test]
fn every_status_column_type_answers_as_the_database_compares() {
    let db = Db::new();
    let mut conn = db.open();
    let labels = "CHECK (status IN ('PENDING', 'PAID', 'REFUNDED', 'FAILED'))";
    let enumeration = format!("TEXT {labels}");
    for (n, column_type) in ["CHAR(10)", "VARCHAR(20)", "TEXT", &enumeration].iter().enumerate() {
        let table = format!("typed_{n}");
        conn.execute_batch(&format!(
            "CREATE TABLE {table} (id TEXT PRIMARY KEY, status {column_type} NOT NULL);
             INSERT INTO {table} VALUES ('p1', 'PENDING'), ('p2', 'REFUNDED');"
        ))
        .unwrap();
        assert_standard_answers(&mut conn, &table, column_type);
    }
}

/// The column's collation decides, in the answer as in the `UPDATE`: under `NOCASE` a
/// row holding `paid` is already PAID (the redelivered callback is a duplicate) and one
/// holding `pending` moves; under `RTRIM` one holding `PAID  ` is PAID; under the
/// default `BINARY` they are other statuses. Each answer agrees with SQLite's own
/// `status = 'PAID'` for the row.
#[test]
fn the_collation_that_matched_the_update_decides_the_answer() {
    let db = Db::new();
    let mut conn = db.open();
    let illegal = |current: &str| Transition::Illegal { current: current.into() };
    let cases = [
        ("BINARY", [illegal("paid"), illegal("PAID  "), illegal("pending")]),
        ("NOCASE", [Transition::AlreadyInTarget, illegal("PAID  "), Transition::Applied]),
        ("RTRIM", [illegal("paid"), Transition::AlreadyInTarget, illegal("pending")]),
    ];
    for (collation, answers) in cases {
        let table = format!("collated_{collation}");
        conn.execute_batch(&format!(
            "CREATE TABLE {table} (id TEXT PRIMARY KEY, status TEXT COLLATE {collation});
             INSERT INTO {table} VALUES ('p3', 'paid'), ('p4', 'PAID  '), ('p5', 'pending');"
        ))
        .unwrap();
        let column = StatusColumn::new(&table, "id", "status").unwrap();
        for (id, expected) in ["p3", "p4", "p5"].into_iter().zip(answers) {
            let sql = format!("SELECT status = 'PAID' FROM {table} WHERE id = ?");
            let same: bool = conn.query_row(&sql, [id], |r| r.get(0)).unwrap();
            assert_eq!(same, expected == Transition::AlreadyInTarget, "{collation} {id}");
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
            let outcome = transition(&tx, &column, id, &["PENDING"], "PAID");
            tx.commit().unwrap();
            assert_eq!(outcome.unwrap(), expected, "{collation} {id}");
        }
    }
}

/// The transitions' suite on SQLite: each transaction a deferred one on a connection of
/// its own (the callback's), whose busy timeout (30 s) the suite's waits stay within.
struct Suite(Db);

impl Payments for Suite {
    type Tx = Connection;

    fn engine(&self) -> &'static str {
        "SQLite"
    }

    fn table(&self) -> &str {
        "payments"
    }

    fn begin(&self) -> Boxed<'_, Connection> {
        let conn = self.0.open();
        conn.execute_batch("BEGIN").unwrap();
        Box::pin(async move { conn })
    }

    fn transition<'a>(
        tx: &'a mut Connection,
        column: &'a StatusColumn,
        id: &'a str,
        from: &'a [&'a str],
        to: &'a str,
    ) -> Boxed<'a, Result<Transition, TransitionError>> {
        Box::pin(async move { transition(tx, column, id, from, to) })
    }

    fn load<'a>(tx: &'a mut Connection, _: &'a str, id: &'a str) -> Boxed<'a, Option<String>> {
        let loaded = status(tx, id);
        Box::pin(async move { loaded })
    }

    fn book<'a>(tx: &'a mut Connection, _: &'a str, id: &'a str) -> Boxed<'a, ()> {
        let sql = "INSERT INTO ledger SELECT id, amount FROM payments WHERE id = ?";
        tx.execute(sql, [id]).unwrap();
        Box::pin(async {})
    }

    fn commit(tx: Connection) -> Boxed<'static, ()> {
        tx.execute_batch("COMMIT").unwrap();
        Box::pin(async {})
    }

    fn rollback(tx: Connection) -> Boxed<'static, ()> {
        tx.execute_batch("ROLLBACK").unwrap();
        Box::pin(async {})
    }

    fn insert<'a>(&'a self, id: &'a str, status: Option<&'a str>) -> Boxed<'a, ()> {
        let sql = "INSERT INTO payments VALUES (?1, ?2, 500)";
        self.0.open().execute(sql, params![id, status]).unwrap();
        Box::pin(async {})
    }

    fn status<'a>(&'a self, id: &'a str) -> Boxed<'a, Option<String>> {
        let status = status(&self.0.open(), id);
        Box::pin(async move { status })
    }

    fn ledger<'a>(&'a self, id: &'a str) -> Boxed<'a, i64> {
        let entries = ledger(&self.0.open(), id);
        Box::pin(async move { entries })
    }

    fn row_held<'a>(&'a self, _: &'a str) -> Boxed<'a, bool> {
        // SQLite locks the database, not the row: the write lock, refused at once.
        let mut other = self.0.open();
        other.busy_timeout(Duration::ZERO).unwrap();
        let held = match other.transaction_with_behavior(TransactionBehavior::Immediate) {
            Ok(tx) => tx.rollback().map(|()| false).unwrap(),
            Err(_) => true,
        };
        Box::pin(async move { held })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transitions_hold_on_sqlite() {
    testing::run(Arc::new(Suite(Db::new()))).await;
}

/// A transition on a connection in no transaction would commit on its own, before the
/// effect it stands for: refused, and the row is as it was.
#[test]
fn a_transition_outside_a_transaction_is_refused_and_changes_nothing() {
    let db = Db::new();
    let conn = db.open();
    let refused = transition(&conn, &payments(), "p1", &["PENDING"], "PAID").unwrap_err();
    assert!(matches!(refused, TransitionError::InvalidInput { .. }), "{refused:?}");
    assert_eq!(status(&conn, "p1").as_deref(), Some("PENDING"));
}
