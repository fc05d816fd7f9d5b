//! The README's callback quickstart: a payment provider's "payment succeeded" webhook,
//! delivered more than once, moves a payment from PENDING to PAID with one conditional
//! `UPDATE` and books it in the ledger once. SQLite in memory: no service needed.
//!
//! ```sh
//! cargo run --example callback
//! ```
//!
//! It delivers the callback of payment `p1` twice, then the callbacks of a FAILED
//! payment and of an unknown one, prints the HTTP status each would be answered, and
//! exits 0 when those are 200, 200, 409 and 404 and the ledger holds `p1` once; 1
//! otherwise.
//!
//! Invariant: the status change and its effect (the ledger entry) commit in one
//! transaction, and only the delivery whose `UPDATE` moved the row does the effect.

use std::error::Error;
use std::process::ExitCode;

use idemcache_sql::transition::{StatusColumn, Transition};
use idemcache_sqlite::rusqlite::{Connection, TransactionBehavior};
use idemcache_sqlite::transition;

// ANCHOR: callback
/// The provider's callback "payment `id` succeeded": the HTTP status to answer it.
fn on_payment_succeeded(db: &mut Connection, id: &str) -> Result<u16, Box<dyn Error>> {
    let payments = StatusColumn::new("payments", "id", "status")?;
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
    match transition(&tx, &payments, id, &["PENDING"], "PAID")? {
        Transition::Applied => {
            // The effect, in the transaction that moved the status: both or neither.
            tx.execute("INSERT INTO ledger (payment) VALUES (?1)", [id])?;
            tx.commit()?;
            Ok(200)
        }
        Transition::AlreadyInTarget => Ok(200), // a duplicate callback: no second effect
        Transition::Illegal { current } => {
            eprintln!("payment {id} is {current}: not moved to PAID");
            Ok(409)
        }
        Transition::NotFound => Ok(404),
    }
}
// ANCHOR_END: callback

fn run() -> Result<(), Box<dyn Error>> {
    let mut db = Connection::open_in_memory()?;
    db.execute_batch(
        "CREATE TABLE payments (id TEXT PRIMARY KEY, status TEXT NOT NULL);
         CREATE TABLE ledger (payment TEXT NOT NULL);
         INSERT INTO payments VALUES ('p1', 'PENDING'), ('p2', 'FAILED');",
    )?;
    let mut answers = Vec::new();
    for id in ["p1", "p1", "p2", "p3"] {
        let status = on_payment_succeeded(&mut db, id)?;
        println!("callback: payment {id} succeeded -> {status}");
        answers.push(status);
    }
    let booked: i64 =
        db.query_row("SELECT count(*) FROM ledger WHERE payment = 'p1'", [], |row| row.get(0))?;
    println!("ledger entries for p1: {booked}");
    if answers != [200, 200, 409, 404] || booked != 1 {
        return Err("expected 200, 200, 409, 404 and one ledger entry".into());
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
