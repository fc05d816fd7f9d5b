//! Conditional transitions of a status column on your own tokio-postgres client or
//! transaction (see [`idemcache::transition`] for the contract).
//!
//! ```no_run
//! use idemcache::transition::{StatusColumn, Transition};
//! use idemcache_postgres::tokio_postgres::Client;
//! use idemcache_postgres::transition::transition;
//!
//! type Error = Box<dyn std::error::Error + Send + Sync>;
//!
//! /// The payment provider's SUCCESS callback: answer OK to every duplicate, book once.
//! async fn on_success(db: &mut Client, payment: i64) -> Result<u16, Error> {
//!     let payments = StatusColumn::new("payments", "id", "status")?;
//!     let tx = db.transaction().await?;
//!     let answer = match transition(&tx, &payments, &payment, &["PENDING"], "PAID").await? {
//!         Transition::Applied => {
//!             tx.execute("INSERT INTO ledger (payment) VALUES ($1)", &[&payment]).await?;
//!             200
//!         }
//!         Transition::AlreadyInTarget => 200, // a duplicate: no second effect
//!         Transition::Illegal { .. } => 409,
//!         Transition::NotFound => 404,
//!     };
//!     tx.commit().await?;
//!     Ok(answer)
//! }
//! ```
//!
//! Invariant: the transition is an `UPDATE` and, only if it matched no row, one
//! `SELECT ... FOR UPDATE` on the same client; both statements are the core's [`Plan`],
//! with every value bound.
//!
//! Types: tokio-postgres checks each parameter's Rust type against the type the server
//! infers for it. The status column must be `TEXT` or `VARCHAR` (statuses are bound as
//! `&str`; a `CHAR(n)` column pads what it reads back, and an enum type does not accept
//! `&str`). The id is any value whose type matches its column: `i64` for `BIGINT`, `i32`
//! for `INTEGER`, `&str` for `TEXT`, ...; a mismatch is [`TransitionError::Database`]
//! before anything ran.
//!
//! Isolation: under `READ COMMITTED` (PostgreSQL's default) a concurrent transition of
//! the same row makes the `UPDATE` wait for it, then re-check the row: the loser sees
//! the winner's status ([`Transition::AlreadyInTarget`]). Under `REPEATABLE READ` or
//! `SERIALIZABLE`, a row changed since the transaction's snapshot is a serialization
//! failure, [`TransitionError::Conflict`]: roll back and run the transaction again.

use tokio_postgres::types::ToSql;
use tokio_postgres::GenericClient;

use idemcache::transition::{
    is_conflict_sqlstate, Dialect, Plan, StatusColumn, StoredStatus, Transition, TransitionError,
};

/// Moves the row of `column`'s table whose id is `id` from any status in `from` to
/// `to`, and says what it found (see [`Transition`]). `client` is a `Client` or a
/// `Transaction` (see [`GenericClient`]; from a deadpool pool, `&**pooled`): run it in
/// the transaction that does the effect of [`Transition::Applied`].
///
/// A NULL status is [`TransitionError::Corrupt`]; invalid input
/// ([`StatusColumn::plan`]) is refused before any SQL runs.
pub async fn transition<C>(
    client: &C,
    column: &StatusColumn,
    id: &(dyn ToSql + Sync),
    from: &[&str],
    to: &str,
) -> Result<Transition, TransitionError>
where
    C: GenericClient + Sync,
{
    let plan = column.plan(Dialect::Postgres, from, to)?;
    let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(2 + from.len());
    let target = plan.to();
    params.push(&target);
    params.push(id);
    params.extend(plan.from().iter().map(|f| f as &(dyn ToSql + Sync)));
    let updated =
        client.execute(plan.update_sql().as_str(), &params).await.map_err(|e| failed(&plan, e))?;
    if let Some(done) = plan.after_update(updated, &id)? {
        return Ok(done);
    }
    let rows =
        client.query(plan.select_sql().as_str(), &[id]).await.map_err(|e| failed(&plan, e))?;
    let statuses = rows
        .iter()
        .map(|row| match row.try_get::<_, Option<String>>(0) {
            Ok(Some(text)) => StoredStatus::Text(text),
            Ok(None) => StoredStatus::Null,
            Err(_) => StoredStatus::Other(
                row.columns().first().map_or("unknown", |c| c.type_().name()).to_owned(),
            ),
        })
        .collect();
    plan.after_read(statuses, &id)
}

/// A tokio-postgres error as the transition's: a serialization failure or a deadlock is
/// a conflict.
fn failed(plan: &Plan<'_>, error: tokio_postgres::Error) -> TransitionError {
    let conflict = error.code().is_some_and(|code| is_conflict_sqlstate(code.code()));
    plan.failed(error, conflict)
}
