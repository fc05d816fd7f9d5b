//! Conditional transitions of a status column in your own tokio-postgres transaction
//! (see [`idemcache_sql::transition`] for the contract).
//!
//! Invariant: the transition is an `UPDATE` and, only if it matched no row, one
//! `SELECT ... FOR UPDATE` in the same transaction; both statements are the core's
//! [`Plan`], with every value bound. The read returns PostgreSQL's own `status = to`
//! and `status IN (from, ...)`, compared by the column's type as the `UPDATE`'s
//! condition was, and the answer is taken from those, not from the value read back.

use std::error::Error;

use bytes::BytesMut;
use tokio_postgres::types::{to_sql_checked, IsNull, Kind, ToSql, Type};
use tokio_postgres::Row;

use crate::Transaction;

use idemcache_sql::transition::{
    is_conflict_sqlstate, Dialect, Plan, ReadRow, StatusColumn, StoredStatus, Transition,
    TransitionError,
};

/// Moves the row of `column`'s table whose id is `id` from any status in `from` to
/// `to` inside `tx`, and says what it found (see [`Transition`]): do the effect of
/// [`Transition::Applied`] in `tx` too, and commit both together. `tx` is taken as
/// [`complete_in`](crate::complete_in) and [`inbox::receive`](crate::inbox::receive)
/// take it: pass `&tx`, a tokio-postgres transaction or a deadpool-postgres one (which
/// dereferences to it).
///
/// A NULL status is [`TransitionError::Corrupt`]; invalid input
/// ([`StatusColumn::plan`]) is refused before any SQL runs.
///
/// ```no_run
/// use idemcache_sql::transition::{StatusColumn, Transition};
/// use idemcache_postgres::tokio_postgres::Client;
/// use idemcache_postgres::transition;
///
/// type Error = Box<dyn std::error::Error + Send + Sync>;
///
/// /// The payment provider's SUCCESS callback: answer OK to every duplicate, book once.
/// async fn on_success(db: &mut Client, payment: i64) -> Result<u16, Error> {
///     let payments = StatusColumn::new("payments", "id", "status")?;
///     let tx = db.transaction().await?;
///     let answer = match transition(&tx, &payments, &payment, &["PENDING"], "PAID").await? {
///         Transition::Applied => {
///             tx.execute("INSERT INTO ledger (payment) VALUES ($1)", &[&payment]).await?;
///             200
///         }
///         Transition::AlreadyInTarget => 200, // a duplicate: no second effect
///         Transition::Illegal { .. } => 409,
///         Transition::NotFound => 404,
///     };
///     tx.commit().await?;
///     Ok(answer)
/// }
/// ```
///
/// Types: the server types each parameter from the column it meets, and tokio-postgres
/// checks the Rust value against that type. The status column may be `TEXT`,
/// `VARCHAR`, `CHAR(n)` (compared ignoring its padding, and reported without it) or an
/// enum type (`CREATE TYPE ... AS ENUM`; a status that is none of its labels is the
/// server's refusal, [`TransitionError::Database`], before anything changed); statuses
/// are strings either way, and `current` is the status as `text`. The id is any value
/// whose type matches its column: `i64` for `BIGINT`, `i32` for `INTEGER`, `&str` for
/// `TEXT`, ...; a mismatch is [`TransitionError::Database`] before anything ran.
///
/// Isolation: under `READ COMMITTED` (PostgreSQL's default) a concurrent transition of
/// the same row makes the `UPDATE` wait for it, then re-check the row: the loser sees
/// the winner's status ([`Transition::AlreadyInTarget`]). Under `REPEATABLE READ` or
/// `SERIALIZABLE`, a row changed since the transaction's snapshot is a serialization
/// failure, [`TransitionError::Conflict`]: roll back and run the transaction again.
pub async fn transition(
    tx: &impl Transaction,
    column: &StatusColumn,
    id: &(dyn ToSql + Sync),
    from: &[&str],
    to: &str,
) -> Result<Transition, TransitionError> {
    let plan = column.plan(Dialect::Postgres, from, to)?;
    // The plan's parameters, the same for both statements: target, sources, id.
    let statuses: Vec<Status<'_>> =
        std::iter::once(plan.to()).chain(plan.from().iter().copied()).map(Status).collect();
    let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(2 + from.len());
    params.extend(statuses.iter().map(|s| s as &(dyn ToSql + Sync)));
    params.push(id);
    let updated = tx
        .connection()
        .execute(plan.update_sql().as_str(), &params)
        .await
        .map_err(|e| failed(&plan, e))?;
    if let Some(done) = plan.after_update(updated, &id)? {
        return Ok(done);
    }
    let rows = tx
        .connection()
        .query(plan.select_sql().as_str(), &params)
        .await
        .map_err(|e| failed(&plan, e))?;
    let found =
        rows.iter().map(read_row).collect::<Result<_, _>>().map_err(|e| failed(&plan, e))?;
    plan.after_read(found, &id)
}

/// One row of the plan's read: the status as text, and the server's comparisons of it
/// (NULL, for a NULL status, is neither).
fn read_row(row: &Row) -> Result<ReadRow, tokio_postgres::Error> {
    let status = match row.try_get::<_, Option<String>>(0) {
        Ok(Some(text)) => StoredStatus::Text(text),
        Ok(None) => StoredStatus::Null,
        Err(_) => StoredStatus::Other(
            row.columns().first().map_or("unknown", |c| c.type_().name()).to_owned(),
        ),
    };
    Ok(ReadRow {
        status,
        is_target: row.try_get::<_, Option<bool>>(1)?.unwrap_or(false),
        is_source: row.try_get::<_, Option<bool>>(2)?.unwrap_or(false),
    })
}

/// A status, bound as the type the server gave its parameter from the status column:
/// any text type `&str` binds (`TEXT`, `VARCHAR`, `CHAR(n)`, ...), or an enum type,
/// whose binary form is its label's UTF-8 (which the server checks is a label).
#[derive(Debug)]
struct Status<'a>(&'a str);

impl ToSql for Status<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        if matches!(ty.kind(), Kind::Enum(_)) {
            out.extend_from_slice(self.0.as_bytes());
            Ok(IsNull::No)
        } else {
            self.0.to_sql(ty, out)
        }
    }

    fn accepts(ty: &Type) -> bool {
        <&str as ToSql>::accepts(ty) || matches!(ty.kind(), Kind::Enum(_))
    }

    to_sql_checked!();
}

/// A tokio-postgres error as the transition's: a serialization failure or a deadlock is
/// a conflict.
fn failed(plan: &Plan<'_>, error: tokio_postgres::Error) -> TransitionError {
    let conflict = error.code().is_some_and(|code| is_conflict_sqlstate(code.code()));
    plan.failed(error, conflict)
}
