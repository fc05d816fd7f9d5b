//! The conditional transitions' suite, run by every SQL driver on every engine it
//! supports (SQLite, tokio-postgres, sqlx PostgreSQL, sqlx MySQL/MariaDB) through a
//! fixture of its own ([`Payments`]): a payment provider's callbacks, each in a
//! transaction of its own that books a ledger entry only when the transition applied.
//! The ledger in the database is the witness.
//!
//! - A duplicate SUCCESS callback is answered `AlreadyInTarget`, with no second entry.
//! - PAID → PENDING is `Illegal` and changes nothing; an unknown id is `NotFound`.
//! - A transition rolled back leaves the row for the redelivery, which applies it.
//! - Hostile identifiers are refused before any SQL runs; a hostile status is bound, a
//!   string that matches nothing.
//! - A NULL status is `Corrupt`, naming the table and the id.
//! - Every answer but `NotFound` holds the row until the transaction ends.
//! - Concurrent callbacks (each loads the payment first, then all transition at once)
//!   apply it once: the rest are `AlreadyInTarget`, after a `Conflict` retried where the
//!   engine answers one (a snapshot older than the winner's commit).
//!
//! Invariant: each call works on payments of its own (a fresh prefix in their ids), in
//! the fixture's tables `payments (id, status, amount)` and `ledger (payment, amount)`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{StatusColumn, Transition, TransitionError};

/// What a boxed future of the suite's is: `Send`, borrowing nothing it outlives.
pub type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An engine's payments and ledger as the suite drives them: each driver's test writes
/// one (a handful of statements in its dialect, and the driver's `transition`) and
/// calls [`run`]. Every transaction is on a connection of its own, at the engine's
/// default isolation, beginning as a callback's would (SQLite: deferred).
pub trait Payments: Send + Sync + 'static {
    /// An open transaction on a connection of its own.
    type Tx: Send + 'static;

    /// The engine's name, in a breach's message.
    fn engine(&self) -> &'static str;

    /// The payments table's name, as a [`StatusColumn`] takes it.
    fn table(&self) -> &str;

    /// A new transaction on a new connection.
    fn begin(&self) -> Boxed<'_, Self::Tx>;

    /// The driver's `transition` of the payment `id` (a text id) in `tx`.
    fn transition<'a>(
        tx: &'a mut Self::Tx,
        column: &'a StatusColumn,
        id: &'a str,
        from: &'a [&'a str],
        to: &'a str,
    ) -> Boxed<'a, Result<Transition, TransitionError>>;

    /// Reads the payment's status in `tx` (a plain read, which takes the snapshot
    /// where the isolation has one).
    fn load<'a>(tx: &'a mut Self::Tx, table: &'a str, id: &'a str) -> Boxed<'a, Option<String>>;

    /// Books the ledger entry of payment `id` in `tx`.
    fn book<'a>(tx: &'a mut Self::Tx, table: &'a str, id: &'a str) -> Boxed<'a, ()>;

    /// Commits `tx`.
    fn commit(tx: Self::Tx) -> Boxed<'static, ()>;

    /// Rolls `tx` back.
    fn rollback(tx: Self::Tx) -> Boxed<'static, ()>;

    /// Inserts, committed, the payment `id` with `status` (NULL for `None`) and 500.
    fn insert<'a>(&'a self, id: &'a str, status: Option<&'a str>) -> Boxed<'a, ()>;

    /// The committed status of payment `id`.
    fn status<'a>(&'a self, id: &'a str) -> Boxed<'a, Option<String>>;

    /// The committed ledger entries of payment `id`.
    fn ledger<'a>(&'a self, id: &'a str) -> Boxed<'a, i64>;

    /// Whether another connection is kept from the row of payment `id` now (refused
    /// at once: `NOWAIT`, or SQLite's write lock with no busy timeout).
    fn row_held<'a>(&'a self, id: &'a str) -> Boxed<'a, bool>;
}

/// Runs every scenario against `payments`. Panics on the first breach.
pub async fn run<P: Payments>(payments: Arc<P>) {
    let run = fresh();
    let p = &*payments;
    a_duplicate_callback_has_no_second_effect(p, &run).await;
    illegal_and_not_found(p, &run).await;
    a_rollback_leaves_the_row_for_the_redelivery(p, &run).await;
    hostile_input(p, &run).await;
    a_null_status_is_corrupt(p, &run).await;
    an_answer_holds_the_row(p, &run).await;
    concurrent_callbacks_apply_once(payments.clone(), &run).await;
}

/// A prefix no other call of the suite (in any process) uses.
fn fresh() -> String {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let at = at.unwrap_or_default().as_nanos();
    format!("t{}-{at}-{}", std::process::id(), CALLS.fetch_add(1, Ordering::Relaxed))
}

fn column<P: Payments>(p: &P) -> StatusColumn {
    StatusColumn::new(p.table(), "id", "status").expect("the fixture's table")
}

/// The SUCCESS callback's handler: PENDING → PAID, and the ledger entry only if this
/// call applied it, in one transaction.
async fn on_success<P: Payments>(p: &P, id: &str) -> Result<Transition, TransitionError> {
    let column = column(p);
    let mut tx = p.begin().await;
    let outcome = P::transition(&mut tx, &column, id, &["PENDING"], "PAID").await;
    match outcome {
        Ok(Transition::Applied) => P::book(&mut tx, p.table(), id).await,
        Ok(_) => {}
        Err(e) => {
            P::rollback(tx).await;
            return Err(e);
        }
    }
    P::commit(tx).await;
    outcome
}

/// One transition in a transaction of its own, committed after an answer and rolled
/// back after an error.
async fn alone<P: Payments>(
    p: &P,
    column: &StatusColumn,
    id: &str,
    from: &[&str],
    to: &str,
) -> Result<Transition, TransitionError> {
    let mut tx = p.begin().await;
    let outcome = P::transition(&mut tx, column, id, from, to).await;
    match outcome {
        Ok(_) => P::commit(tx).await,
        Err(_) => P::rollback(tx).await,
    }
    outcome
}

async fn a_duplicate_callback_has_no_second_effect<P: Payments>(p: &P, run: &str) {
    let on = p.engine();
    let id = format!("{run}-dup");
    p.insert(&id, Some("PENDING")).await;
    assert_eq!(on_success(p, &id).await.unwrap(), Transition::Applied, "{on}");
    for _ in 0..3 {
        let again = on_success(p, &id).await.unwrap();
        assert_eq!(again, Transition::AlreadyInTarget, "{on}");
    }
    assert_eq!(p.status(&id).await.as_deref(), Some("PAID"), "{on}");
    assert_eq!(p.ledger(&id).await, 1, "{on}: one entry");
}

async fn illegal_and_not_found<P: Payments>(p: &P, run: &str) {
    let on = p.engine();
    let id = format!("{run}-paid");
    p.insert(&id, Some("PAID")).await;
    let column = column(p);
    let outcome = alone(p, &column, &id, &["FAILED"], "PENDING").await.unwrap();
    assert_eq!(outcome, Transition::Illegal { current: "PAID".into() }, "{on}");
    assert_eq!(p.status(&id).await.as_deref(), Some("PAID"), "{on}: unchanged");
    let missing = format!("{run}-404");
    let outcome = alone(p, &column, &missing, &["PENDING"], "PAID").await.unwrap();
    assert_eq!(outcome, Transition::NotFound, "{on}");
}

async fn a_rollback_leaves_the_row_for_the_redelivery<P: Payments>(p: &P, run: &str) {
    let on = p.engine();
    let id = format!("{run}-rollback");
    p.insert(&id, Some("PENDING")).await;
    let column = column(p);
    let mut tx = p.begin().await;
    let outcome = P::transition(&mut tx, &column, &id, &["PENDING"], "PAID").await;
    assert_eq!(outcome.unwrap(), Transition::Applied, "{on}");
    // The effect failed, or the process died.
    P::rollback(tx).await;
    assert_eq!(p.status(&id).await.as_deref(), Some("PENDING"), "{on}: rolled back");
    assert_eq!(on_success(p, &id).await.unwrap(), Transition::Applied, "{on}: redelivered");
    assert_eq!(p.ledger(&id).await, 1, "{on}");
}

async fn hostile_input<P: Payments>(p: &P, run: &str) {
    let on = p.engine();
    let table = p.table();
    let hostile_table = format!("{table}; DROP TABLE x");
    for (table, id, status) in [
        (hostile_table.as_str(), "id", "status"),
        (table, "id; DROP TABLE x", "status"),
        (table, "id`; DROP TABLE x; --", "status"),
        (table, "id", "status = 'PAID'; DROP TABLE x; --"),
    ] {
        let refused = StatusColumn::new(table, id, status).unwrap_err();
        let invalid = matches!(refused, TransitionError::InvalidIdentifier { .. });
        assert!(invalid, "{on}: {refused:?}");
    }
    // Values are bound: a hostile status is a string that matches nothing.
    let id = format!("{run}-hostile");
    p.insert(&id, Some("PENDING")).await;
    let hostile = format!("PENDING'); DROP TABLE {table}; --");
    let outcome = alone(p, &column(p), &id, &[hostile.as_str()], "PAID").await.unwrap();
    assert_eq!(outcome, Transition::Illegal { current: "PENDING".into() }, "{on}");
    assert_eq!(p.status(&id).await.as_deref(), Some("PENDING"), "{on}: the table is there");
}

async fn a_null_status_is_corrupt<P: Payments>(p: &P, run: &str) {
    let on = p.engine();
    let id = format!("{run}-null");
    p.insert(&id, None).await;
    let error = alone(p, &column(p), &id, &["PENDING"], "PAID").await.unwrap_err();
    assert!(matches!(error, TransitionError::Corrupt { .. }), "{on}: {error:?}");
    let message = error.to_string();
    let row = format!("the row \"{id}\" of {}.status", p.table());
    assert!(message.contains(&row) && message.contains("NULL"), "{on}: {message}");
}

async fn an_answer_holds_the_row<P: Payments>(p: &P, run: &str) {
    let on = p.engine();
    let id = format!("{run}-held");
    p.insert(&id, Some("PAID")).await;
    let column = column(p);
    for to in ["PAID", "REFUNDED"] {
        let mut tx = p.begin().await;
        let outcome = P::transition(&mut tx, &column, &id, &["PENDING"], to).await.unwrap();
        let answered = matches!(outcome, Transition::AlreadyInTarget | Transition::Illegal { .. });
        assert!(answered, "{on}: {outcome:?}");
        assert!(p.row_held(&id).await, "{on}: the row was not held after {to}");
        P::commit(tx).await;
        assert!(!p.row_held(&id).await, "{on}: the row was held after the commit");
    }
}

async fn concurrent_callbacks_apply_once<P: Payments>(p: Arc<P>, run: &str) {
    const CALLBACKS: usize = 8;
    let on = p.engine();
    let id: Arc<str> = format!("{run}-concurrent").into();
    p.insert(&id, Some("PENDING")).await;
    let loaded = Arc::new(tokio::sync::Barrier::new(CALLBACKS));
    let mut handlers = Vec::new();
    for _ in 0..CALLBACKS {
        let (p, id, loaded) = (p.clone(), id.clone(), loaded.clone());
        handlers.push(tokio::spawn(async move {
            let column = column(&*p);
            // The first attempt loads the payment with every other callback before any
            // transitions it; a conflict is retried as a handler would, afresh.
            let mut first = true;
            loop {
                let mut tx = p.begin().await;
                let status = P::load(&mut tx, p.table(), &id).await;
                if std::mem::take(&mut first) {
                    assert_eq!(status.as_deref(), Some("PENDING"), "{}", p.engine());
                    loaded.wait().await;
                }
                match P::transition(&mut tx, &column, &id, &["PENDING"], "PAID").await {
                    Ok(outcome) => {
                        if outcome == Transition::Applied {
                            P::book(&mut tx, p.table(), &id).await;
                        }
                        P::commit(tx).await;
                        return outcome;
                    }
                    Err(TransitionError::Conflict { .. }) => P::rollback(tx).await,
                    Err(e) => panic!("{}: {e}", p.engine()),
                }
            }
        }));
    }
    let mut outcomes = Vec::new();
    for handler in handlers {
        outcomes.push(handler.await.expect("a callback"));
    }
    let applied = outcomes.iter().filter(|o| **o == Transition::Applied).count();
    assert_eq!(applied, 1, "{on}: {outcomes:?}");
    let rest =
        outcomes.iter().all(|o| matches!(o, Transition::Applied | Transition::AlreadyInTarget));
    assert!(rest, "{on}: {outcomes:?}");
    assert_eq!(p.ledger(&id).await, 1, "{on}: one entry");
}
