//! Conditional transitions of a status column in your own sqlx transaction (see
//! [`idemcache_sql::transition`] for the contract): [`postgres::transition`] (feature
//! `postgres`) and [`mysql::transition`] (feature `mysql`, for MySQL and MariaDB).
//!
//! ```no_run
//! # #[cfg(feature = "mysql")]
//! # mod example {
//! use idemcache_sql::transition::{StatusColumn, Transition};
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
//! `SELECT ... FOR UPDATE` in the same transaction; both statements are the core's
//! [`Plan`](idemcache_sql::transition::Plan), with every value bound. The read returns the
//! engine's own `status = to` and `status IN (from, ...)`, compared by the column's type
//! and collation as the `UPDATE`'s condition was, and the answer is taken from those,
//! not from the value read back. The read locks: under
//! MySQL's and MariaDB's default `REPEATABLE READ`, a plain `SELECT` reads the
//! transaction's snapshot, so after a concurrent transition committed it would still
//! say PENDING; a locking read, like the `UPDATE` itself, reads the committed row.
//!
//! Affected rows: sqlx connects to MySQL with `CLIENT_FOUND_ROWS`, so an `UPDATE`
//! counts the rows it matched, not only those it changed; and since `to` is never among
//! `from`, a matched row is always changed. Either way one row is
//! [`Transition::Applied`](idemcache_sql::transition::Transition::Applied) only if this call
//! moved it.
//!
//! The transaction is taken as the inbox's `receive` takes it: `&mut tx`, a
//! `sqlx::Transaction` of the engine. The id is any value sqlx binds for its column
//! (`i64`, `&str`, `String`, a `Uuid`, ...), passed by reference; it shows in error
//! messages by `Debug`.

/// The body of one engine's `transition`: the same steps, with that engine's types
/// (`$status` makes each status a value to bind).
macro_rules! transition_fn {
    ($db:ty, $dialect:expr, $status:path, $is_conflict:path) => {
        use std::fmt;

        use sqlx::{AssertSqlSafe, Column, Row, TypeInfo};

        use idemcache_sql::transition::{
            Plan, ReadRow, StatusColumn, StoredStatus, Transition, TransitionError,
        };

        /// Moves the row of `column`'s table whose id is `id` from any status in `from`
        /// to `to` inside `tx`, and says what it found (see [`Transition`]): do the
        /// effect of [`Transition::Applied`] in `tx` too, and commit both together.
        /// Pass `&mut tx`, as to the inbox's `receive`.
        ///
        /// A NULL or non-text status is [`TransitionError::Corrupt`]; invalid input
        /// ([`StatusColumn::plan`]) is refused before any SQL runs.
        pub async fn transition<Id>(
            tx: &mut sqlx::Transaction<'_, $db>,
            column: &StatusColumn,
            id: &Id,
            from: &[&str],
            to: &str,
        ) -> Result<Transition, TransitionError>
        where
            Id: for<'q> sqlx::Encode<'q, $db> + sqlx::Type<$db> + fmt::Debug + Sync,
        {
            let plan = column.plan($dialect, from, to)?;
            let updated = bound(&plan, plan.update_sql(), id)
                .execute(&mut **tx)
                .await
                .map_err(|e| failed(&plan, e))?;
            if let Some(done) = plan.after_update(updated.rows_affected(), id)? {
                return Ok(done);
            }
            let rows = bound(&plan, plan.select_sql(), id)
                .fetch_all(&mut **tx)
                .await
                .map_err(|e| failed(&plan, e))?;
            let found = rows
                .iter()
                .map(read_row)
                .collect::<Result<_, _>>()
                .map_err(|e| failed(&plan, e))?;
            plan.after_read(found, id)
        }

        /// `sql`, one of the plan's statements, with the parameters both take: the
        /// target, the sources, the id.
        fn bound<'q, Id>(
            plan: &Plan<'q>,
            sql: String,
            id: &'q Id,
        ) -> sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments>
        where
            Id: for<'e> sqlx::Encode<'e, $db> + sqlx::Type<$db> + Sync,
        {
            let mut query = sqlx::query(AssertSqlSafe(sql)).bind($status(plan.to()));
            for source in plan.from() {
                query = query.bind($status(source));
            }
            query.bind(id)
        }

        /// One row of the plan's read: the status, and the engine's comparisons of it
        /// (NULL, for a NULL status, is neither).
        fn read_row(row: &<$db as sqlx::Database>::Row) -> Result<ReadRow, sqlx::Error> {
            let status = match row.try_get::<Option<String>, _>(0) {
                Ok(Some(text)) => StoredStatus::Text(text),
                Ok(None) => StoredStatus::Null,
                Err(_) => StoredStatus::Other(
                    row.columns().first().map_or("unknown", |c| c.type_info().name()).to_owned(),
                ),
            };
            Ok(ReadRow {
                status,
                is_target: row.try_get::<Option<bool>, _>(1)?.unwrap_or(false),
                is_source: row.try_get::<Option<bool>, _>(2)?.unwrap_or(false),
            })
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
/// Types: statuses are bound untyped, so that the server types them from the status
/// column, as it does for tokio-postgres, and compares as the column does: `TEXT`,
/// `VARCHAR`, `CHAR(n)` (ignoring its padding, and reported without it) or an enum type
/// (`CREATE TYPE ... AS ENUM`; a status that is none of its labels is the server's
/// refusal, [`TransitionError::Database`](idemcache_sql::transition::TransitionError::Database),
/// before anything changed); `current` is the status as `text`. The id's Rust type
/// must be one sqlx encodes for the id column (`i64` for `BIGINT`, ...); a mismatch is
/// [`TransitionError::Database`](idemcache_sql::transition::TransitionError::Database).
///
/// Isolation: under `READ COMMITTED` (the default) a concurrent transition of the same
/// row makes the `UPDATE` wait for it and re-check the row: the loser gets
/// `AlreadyInTarget`. Under `REPEATABLE READ` or `SERIALIZABLE`, a row changed since
/// the snapshot is a serialization failure (SQLSTATE 40001):
/// [`TransitionError::Conflict`](idemcache_sql::transition::TransitionError::Conflict), roll
/// back and run the transaction again.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres {
    transition_fn!(
        sqlx::Postgres,
        idemcache_sql::transition::Dialect::Postgres,
        Status,
        is_conflict
    );

    /// A status, bound with no declared type (OID 0): the server types it from the
    /// status column it meets, as `TEXT`, `VARCHAR`, `CHAR(n)` or an enum type, whose
    /// binary forms are all the string's UTF-8. (Declared `TEXT`, as a `&str` is, it
    /// would compare a `CHAR(n)` as text and meet no operator for an enum type.)
    struct Status<'a>(&'a str);

    impl sqlx::Type<sqlx::Postgres> for Status<'_> {
        fn type_info() -> sqlx::postgres::PgTypeInfo {
            sqlx::postgres::PgTypeInfo::with_oid(sqlx::postgres::types::Oid(0))
        }
    }

    impl sqlx::Encode<'_, sqlx::Postgres> for Status<'_> {
        fn encode_by_ref(
            &self,
            buf: &mut sqlx::postgres::PgArgumentBuffer,
        ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
            <&str as sqlx::Encode<sqlx::Postgres>>::encode_by_ref(&self.0, buf)
        }
    }

    /// A serialization failure or a deadlock (by SQLSTATE).
    fn is_conflict(error: &dyn sqlx::error::DatabaseError) -> bool {
        error.code().is_some_and(|code| idemcache_sql::transition::is_conflict_sqlstate(&code))
    }
}

/// MySQL and MariaDB (feature `mysql`).
///
/// Types: the status column is text (`CHAR(n)`, `VARCHAR`, `TEXT`, `ENUM` binds as text
/// too); the id any type sqlx binds. Statuses are compared by the column's collation,
/// in the `UPDATE` and in the answer alike (by default ignoring case, trailing spaces
/// and accents: a row holding `paid` is already `PAID`, so a redelivered callback is
/// `AlreadyInTarget`; which is also why a `to` equal to a `from` ignoring ASCII case and
/// trailing spaces is refused; statuses that differ only by accents are yours to
/// avoid); `current` is the value as held. For exact matching, give the column a binary
/// collation (`utf8mb4_bin`).
///
/// Isolation: under `REPEATABLE READ` (the default) or `READ COMMITTED`, a concurrent
/// transition of the same row makes the `UPDATE` wait for its lock and then read the
/// committed row (an `UPDATE` is a locking read): the loser gets `AlreadyInTarget`,
/// also when its transaction read the row before the winner committed. A deadlock
/// (1213), a lock wait timeout (1205), and MariaDB's `innodb_snapshot_isolation`
/// refusal (1020) are
/// [`TransitionError::Conflict`](idemcache_sql::transition::TransitionError::Conflict): roll
/// back and run the transaction again.
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql {
    transition_fn!(sqlx::MySql, idemcache_sql::transition::Dialect::MySql, status, is_conflict);

    /// A status, bound as a string: MySQL converts it to the column's type (`ENUM`
    /// included) and compares by the column's collation.
    fn status(status: &str) -> &str {
        status
    }

    /// A deadlock, a lock wait timeout, or a snapshot refusal (by error number: sqlx's
    /// `code()` is the SQLSTATE, too coarse here).
    fn is_conflict(error: &dyn sqlx::error::DatabaseError) -> bool {
        error
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|e| idemcache_sql::transition::is_conflict_mysql_code(e.number()))
    }
}
