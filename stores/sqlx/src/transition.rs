//! Conditional transitions of a status column on your own sqlx connection or transaction
//! (see [`idemcache::transition`] for the contract): [`postgres::transition`] (feature
//! `postgres`) and [`mysql::transition`] (feature `mysql`, for MySQL and MariaDB).
//!
//! ```no_run
//! # #[cfg(feature = "mysql")]
//! # mod example {
//! use idemcache::transition::{StatusColumn, Transition};
//! use idemcache_sqlx::transition::mysql::transition;
//!
//! type Error = Box<dyn std::error::Error + Send + Sync>;
//!
//! /// The payment provider's SUCCESS callback, in the transaction that books it.
//! async fn on_success(pool: &sqlx::MySqlPool, payment: i64) -> Result<u16, Error> {
//!     let payments = StatusColumn::new("payments", "id", "status")?;
//!     let mut tx = pool.begin().await?;
//!     let answer = match transition(&mut tx, &payments, &payment, &["PENDING"], "PAID").await? {
//!         Transition::Applied => {
//!             sqlx::query("INSERT INTO ledger (payment) VALUES (?)")
//!                 .bind(payment)
//!                 .execute(&mut *tx)
//!                 .await?;
//!             200
//!         }
//!         Transition::AlreadyInTarget => 200, // a duplicate: no second effect
//!         Transition::Illegal { .. } => 409,
//!         Transition::NotFound => 404,
//!     };
//!     tx.commit().await?;
//!     Ok(answer)
//! }
//! # }
//! ```
//!
//! Invariant: the transition is an `UPDATE` and, only if it matched no row, one
//! `SELECT ... FOR UPDATE` on the same connection; both statements are the core's
//! [`Plan`](idemcache::transition::Plan), with every value bound. The read locks: under
//! MySQL's and MariaDB's default `REPEATABLE READ`, a plain `SELECT` reads the
//! transaction's snapshot, so after a concurrent transition committed it would still
//! say PENDING; a locking read, like the `UPDATE` itself, reads the committed row.
//!
//! Affected rows: sqlx connects to MySQL with `CLIENT_FOUND_ROWS`, so an `UPDATE`
//! counts the rows it matched, not only those it changed; and since `to` is never among
//! `from`, a matched row is always changed. Either way one row is
//! [`Transition::Applied`](idemcache::transition::Transition::Applied) only if this call
//! moved it.
//!
//! The connection is `&mut` a `PgConnection` or `MySqlConnection`: pass a transaction
//! as `&mut tx` (a `Transaction` dereferences to its connection) or a pooled connection
//! as `&mut pooled`. The id is any value sqlx binds for its column (`i64`, `&str`,
//! `String`, a `Uuid`, ...), passed by reference; it shows in error messages by `Debug`.

/// The body of one engine's `transition`: the same steps, with that engine's types.
macro_rules! transition_fn {
    ($db:ty, $connection:ty, $dialect:expr, $is_conflict:path) => {
        use std::fmt;

        use sqlx::{AssertSqlSafe, Column, Row, TypeInfo};

        use idemcache::transition::{
            Plan, StatusColumn, StoredStatus, Transition, TransitionError,
        };

        /// Moves the row of `column`'s table whose id is `id` from any status in `from`
        /// to `to`, and says what it found (see [`Transition`]). Run it in the
        /// transaction that does the effect of [`Transition::Applied`] (`&mut tx`).
        ///
        /// A NULL or non-text status is [`TransitionError::Corrupt`]; invalid input
        /// ([`StatusColumn::plan`]) is refused before any SQL runs.
        pub async fn transition<Id>(
            conn: &mut $connection,
            column: &StatusColumn,
            id: &Id,
            from: &[&str],
            to: &str,
        ) -> Result<Transition, TransitionError>
        where
            Id: for<'q> sqlx::Encode<'q, $db> + sqlx::Type<$db> + fmt::Debug + Sync,
        {
            let plan = column.plan($dialect, from, to)?;
            let mut update = sqlx::query(AssertSqlSafe(plan.update_sql())).bind(plan.to()).bind(id);
            for source in plan.from() {
                update = update.bind(*source);
            }
            let updated = update.execute(&mut *conn).await.map_err(|e| failed(&plan, e))?;
            if let Some(done) = plan.after_update(updated.rows_affected(), id)? {
                return Ok(done);
            }
            let rows = sqlx::query(AssertSqlSafe(plan.select_sql()))
                .bind(id)
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| failed(&plan, e))?;
            let statuses = rows
                .iter()
                .map(|row| match row.try_get::<Option<String>, _>(0) {
                    Ok(Some(text)) => StoredStatus::Text(text),
                    Ok(None) => StoredStatus::Null,
                    Err(_) => StoredStatus::Other(
                        row.columns()
                            .first()
                            .map_or("unknown", |c| c.type_info().name())
                            .to_owned(),
                    ),
                })
                .collect();
            plan.after_read(statuses, id)
        }

        /// A sqlx error as the transition's, a conflict as the engine's codes say.
        fn failed(plan: &Plan<'_>, error: sqlx::Error) -> TransitionError {
            let conflict = error.as_database_error().is_some_and($is_conflict);
            plan.failed(error, conflict)
        }
    };
}

/// PostgreSQL (feature `postgres`).
///
/// Types: PostgreSQL types each parameter from its column: the status column must be
/// `TEXT` or `VARCHAR` (statuses are bound as text; a `CHAR(n)` column pads what it
/// reads back, an enum type refuses text parameters), and the id's Rust type must be
/// one sqlx encodes for the id column (`i64` for `BIGINT`, ...); a mismatch is
/// [`TransitionError::Database`](idemcache::transition::TransitionError::Database).
///
/// Isolation: under `READ COMMITTED` (the default) a concurrent transition of the same
/// row makes the `UPDATE` wait for it and re-check the row: the loser gets
/// `AlreadyInTarget`. Under `REPEATABLE READ` or `SERIALIZABLE`, a row changed since
/// the snapshot is a serialization failure (SQLSTATE 40001):
/// [`TransitionError::Conflict`](idemcache::transition::TransitionError::Conflict), roll
/// back and run the transaction again.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres {
    transition_fn!(
        sqlx::Postgres,
        sqlx::PgConnection,
        idemcache::transition::Dialect::Postgres,
        is_conflict
    );

    /// A serialization failure or a deadlock (by SQLSTATE).
    fn is_conflict(error: &dyn sqlx::error::DatabaseError) -> bool {
        error.code().is_some_and(|code| idemcache::transition::is_conflict_sqlstate(&code))
    }
}

/// MySQL and MariaDB (feature `mysql`).
///
/// Types: the status column is text (`VARCHAR`, `TEXT`, `ENUM` binds as text too); the
/// id any type sqlx binds. Statuses are compared by the column's collation in the
/// `UPDATE` (by default ignoring case, trailing spaces and accents: which is why a `to`
/// equal to a `from` ignoring ASCII case and trailing spaces is refused; statuses that
/// differ only by accents are yours to avoid) and byte for byte in the answer; for
/// exact matching, give the column a binary collation (`utf8mb4_bin`).
///
/// Isolation: under `REPEATABLE READ` (the default) or `READ COMMITTED`, a concurrent
/// transition of the same row makes the `UPDATE` wait for its lock and then read the
/// committed row (an `UPDATE` is a locking read): the loser gets `AlreadyInTarget`,
/// also when its transaction read the row before the winner committed. A deadlock
/// (1213), a lock wait timeout (1205), and MariaDB's `innodb_snapshot_isolation`
/// refusal (1020) are
/// [`TransitionError::Conflict`](idemcache::transition::TransitionError::Conflict): roll
/// back and run the transaction again.
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql {
    transition_fn!(
        sqlx::MySql,
        sqlx::MySqlConnection,
        idemcache::transition::Dialect::MySql,
        is_conflict
    );

    /// A deadlock, a lock wait timeout, or a snapshot refusal (by error number: sqlx's
    /// `code()` is the SQLSTATE, too coarse here).
    fn is_conflict(error: &dyn sqlx::error::DatabaseError) -> bool {
        error
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|e| idemcache::transition::is_conflict_mysql_code(e.number()))
    }
}
