//! Conditional transitions against SQLite files (WAL, as several processes share one):
//! a payment provider's callbacks, each run in its own `IMMEDIATE` transaction that
//! writes a ledger entry only when the transition applied. The ledger in the database
//! is the witness: one entry per payment however many callbacks arrive, at once or not.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use idemcache_sql::transition::{StatusColumn, Transition, TransitionError};
use idemcache_sqlite::rusqlite::{Connection, ToSql, TransactionBehavior};
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
fn a_duplicate_success_callback_is_ok_with_no_second_effect() {
    let db = Db::new();
    let mut conn = db.open();
    assert_eq!(on_success(&mut conn, "p1").unwrap(), Transition::Applied);
    assert_eq!((status(&conn, "p1").as_deref(), ledger(&conn, "p1")), (Some("PAID"), 1));
    for _ in 0..3 {
        assert_eq!(on_success(&mut conn, "p1").unwrap(), Transition::AlreadyInTarget);
    }
    assert_eq!((status(&conn, "p1").as_deref(), ledger(&conn, "p1")), (Some("PAID"), 1));
}

#[test]
fn paid_to_pending_is_refused_and_changes_nothing() {
    let db = Db::new();
    let mut conn = db.open();
    // A retry flow may move FAILED back to PENDING; a PAID payment never.
    let outcome = alone(&mut conn, &payments(), "p2", &["FAILED"], "PENDING").unwrap();
    assert_eq!(outcome, Transition::Illegal { current: "PAID".into() });
    assert_eq!(status(&conn, "p2").as_deref(), Some("PAID"));
}

#[test]
fn an_unknown_id_is_not_found() {
    let db = Db::new();
    let mut conn = db.open();
    let outcome = alone(&mut conn, &payments(), "p404", &["PENDING"], "PAID").unwrap();
    assert_eq!(outcome, Transition::NotFound);
}

#[test]
fn a_rolled_back_transition_leaves_the_row_for_the_redelivery() {
    let db = Db::new();
    let mut conn = db.open();
    {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
        let outcome = transition(&tx, &payments(), "p1", &["PENDING"], "PAID").unwrap();
        assert_eq!(outcome, Transition::Applied);
        // Dropped without commit: the effect failed, or the process died.
    }
    assert_eq!(status(&conn, "p1").as_deref(), Some("PENDING"));
    assert_eq!(on_success(&mut conn, "p1").unwrap(), Transition::Applied);
    assert_eq!(ledger(&conn, "p1"), 1);
}

#[test]
fn injection_attempts_are_refused_before_any_sql_runs() {
    let db = Db::new();
    let mut conn = db.open();
    for (table, id, status) in [
        ("payments; DROP TABLE x", "id", "status"),
        ("payments", "id; DROP TABLE x", "status"),
        ("payments", "id", "status = 'PAID'; DROP TABLE x; --"),
        ("payments`; DROP TABLE x; --", "id", "status"),
    ] {
        let refused = StatusColumn::new(table, id, status).unwrap_err();
        assert!(matches!(refused, TransitionError::InvalidIdentifier { .. }), "{refused:?}");
    }
    // Values are bound, so a hostile status is just a string that matches nothing.
    let hostile = "PENDING'); DROP TABLE x; --";
    let outcome = alone(&mut conn, &payments(), "p1", &[hostile], "PAID").unwrap();
    assert_eq!(outcome, Transition::Illegal { current: "PENDING".into() });
    let kept: i64 = conn.query_row("SELECT count(*) FROM x", [], |r| r.get(0)).unwrap();
    assert_eq!(kept, 0, "table x still exists");
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
fn an_answer_holds_the_database_until_the_transaction_ends() {
    let db = Db::new();
    let (mut conn, mut other) = (db.open(), db.open());
    // Refused at once instead of waiting: no timing involved.
    other.busy_timeout(Duration::ZERO).unwrap();
    for to in ["PAID", "REFUNDED"] {
        // Deferred: the write lock comes from the transition's UPDATE, even one that
        // matches no row.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred).unwrap();
        let outcome = transition(&tx, &payments(), "p2", &["PENDING"], to).unwrap();
        assert!(matches!(outcome, Transition::AlreadyInTarget | Transition::Illegal { .. }));
        let refused = other.transaction_with_behavior(TransactionBehavior::Immediate);
        assert!(refused.is_err(), "the database was not locked after {to}");
        drop(refused);
        tx.commit().unwrap();
        other.transaction_with_behavior(TransactionBehavior::Immediate).unwrap().commit().unwrap();
    }
}

#[test]
fn concurrent_callbacks_on_their_own_connections_apply_once() {
    const CALLBACKS: usize = 8;
    let db = Db::new();
    let start = Arc::new(Barrier::new(CALLBACKS));
    let outcomes: Vec<Transition> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..CALLBACKS)
            .map(|_| {
                let (db, start) = (&db, start.clone());
                s.spawn(move || {
                    let mut conn = db.open();
                    start.wait();
                    on_success(&mut conn, "p1").unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let applied = outcomes.iter().filter(|o| **o == Transition::Applied).count();
    assert_eq!(applied, 1, "{outcomes:?}");
    assert!(outcomes
        .iter()
        .all(|o| matches!(o, Transition::Applied | Transition::AlreadyInTarget)));
    assert_eq!(ledger(&db.open(), "p1"), 1);
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
