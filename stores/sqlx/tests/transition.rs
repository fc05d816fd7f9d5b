//! Conditional transitions through sqlx against real engines: PostgreSQL when
//! `IDEMCACHE_POSTGRES_URL` is set, MariaDB/MySQL when `IDEMCACHE_MYSQL_URL` is
//! (skipped with a printed reason otherwise; the features `postgres` and `mysql` build
//! them). A payment provider's callbacks, each in its own transaction that books a
//! ledger entry only when the transition applied; the ledger in the database is the
//! witness: one entry per payment however many callbacks come, in turn or at once.
//!
//! Every test creates tables of its own (pid and counter in the name) and drops them.

#[cfg(not(all(feature = "postgres", feature = "mysql")))]
#[test]
fn transitions_need_the_postgres_and_mysql_features() {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "skipped the sqlx transition suites: build with --features postgres,mysql (or --all-features)"
    );
}

/// What both engines run: `$connection` the engine's sqlx connection, `$transition` its
/// `transition` function, `$var`/`$example` its URL's variable, `$engine` appended to
/// each `CREATE TABLE`, `$name` the engine's name in a breach. The suite itself is
/// `idemcache_sql::transition::testing`'s, which every driver runs; this fixture and
/// the tests beside it are sqlx's.
#[cfg(all(feature = "postgres", feature = "mysql"))]
macro_rules! suite {
    ($connection:ty, $transition:path, $var:expr, $example:expr, $engine:expr, $name:expr) => {
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::sync::Arc;

        use idemcache::store::conformance::service_url;
        use idemcache_sql::transition::testing::{self, Boxed, Payments};
        use idemcache_sql::transition::{StatusColumn, Transition, TransitionError};
        use sqlx::{AssertSqlSafe, Connection};

        use $transition as transition;

        type Db = $connection;

        /// Runs `sql` (test-owned names and literals only) on `conn`.
        async fn run(conn: &mut Db, sql: String) {
            sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut *conn).await.unwrap();
        }

        async fn one_i64(conn: &mut Db, sql: String) -> i64 {
            sqlx::query_scalar(AssertSqlSafe(sql)).fetch_one(&mut *conn).await.unwrap()
        }

        async fn one_text(conn: &mut Db, sql: String) -> Option<String> {
            sqlx::query_scalar(AssertSqlSafe(sql)).fetch_one(&mut *conn).await.unwrap()
        }

        /// One transition in a transaction of its own, committed after an answer and
        /// rolled back after an error.
        async fn alone<Id>(
            conn: &mut Db,
            column: &StatusColumn,
            id: &Id,
            from: &[&str],
            to: &str,
        ) -> Result<Transition, TransitionError>
        where
            Id: for<'q> sqlx::Encode<'q, <Db as Connection>::Database>
                + sqlx::Type<<Db as Connection>::Database>
                + std::fmt::Debug
                + Sync,
        {
            let mut tx = conn.begin().await.unwrap();
            let outcome = transition(&mut tx, column, id, from, to).await;
            match outcome {
                Ok(_) => tx.commit().await.unwrap(),
                Err(_) => tx.rollback().await.unwrap(),
            }
            outcome
        }

        /// Tables of this test's own: payments p1 PENDING (500), p2 PAID; a ledger.
        pub(crate) struct Tables {
            pub(crate) url: String,
            pub(crate) payments: String,
            pub(crate) ledger: String,
        }

        impl Tables {
            pub(crate) async fn new() -> Option<Tables> {
                static N: AtomicU64 = AtomicU64::new(0);
                let url = service_url($var, $example)?;
                let n = format!("{}_{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
                let t = Tables {
                    url,
                    payments: format!("tr_sqlx_payments_{n}"),
                    // Named for its payments, as the suite's fixture books in it.
                    ledger: format!("tr_sqlx_payments_{n}_ledger"),
                };
                let mut conn = t.conn().await;
                run(
                    &mut conn,
                    format!(
                        "CREATE TABLE {} (id VARCHAR(64) PRIMARY KEY, status VARCHAR(20), \
                     amount BIGINT NOT NULL){}",
                        t.payments, $engine
                    ),
                )
                .await;
                run(
                    &mut conn,
                    format!(
                        "CREATE TABLE {} (payment VARCHAR(64) NOT NULL, amount BIGINT NOT NULL){}",
                        t.ledger, $engine
                    ),
                )
                .await;
                run(
                    &mut conn,
                    format!(
                        "INSERT INTO {} VALUES ('p1', 'PENDING', 500), ('p2', 'PAID', 700)",
                        t.payments
                    ),
                )
                .await;
                Some(t)
            }

            pub(crate) fn column(&self) -> StatusColumn {
                StatusColumn::new(&self.payments, "id", "status").unwrap()
            }

            pub(crate) async fn conn(&self) -> Db {
                Db::connect(&self.url).await.unwrap()
            }

            pub(crate) async fn status(&self, id: &str) -> Option<String> {
                let sql = format!("SELECT status FROM {} WHERE id = '{id}'", self.payments);
                one_text(&mut self.conn().await, sql).await
            }

            pub(crate) async fn ledger(&self, id: &str) -> i64 {
                let sql = format!("SELECT count(*) FROM {} WHERE payment = '{id}'", self.ledger);
                one_i64(&mut self.conn().await, sql).await
            }

            /// Books the ledger entry of `id` in `conn`'s open transaction.
            pub(crate) async fn book(&self, conn: &mut Db, id: &str) {
                run(
                    conn,
                    format!(
                        "INSERT INTO {} SELECT id, amount FROM {} WHERE id = '{id}'",
                        self.ledger, self.payments
                    ),
                )
                .await;
            }

            /// The SUCCESS callback's handler: in one transaction, PENDING -> PAID and
            /// the ledger entry only if this call applied it.
            pub(crate) async fn on_success(
                &self,
                conn: &mut Db,
                id: &str,
            ) -> Result<Transition, TransitionError> {
                let mut tx = conn.begin().await.unwrap();
                let outcome =
                    transition(&mut tx, &self.column(), &id, &["PENDING"], "PAID").await?;
                if outcome == Transition::Applied {
                    self.book(&mut tx, id).await;
                }
                tx.commit().await.unwrap();
                Ok(outcome)
            }

            pub(crate) async fn drop_tables(self) {
                let mut conn = self.conn().await;
                run(&mut conn, format!("DROP TABLE {}", self.payments)).await;
                run(&mut conn, format!("DROP TABLE {}", self.ledger)).await;
            }
        }





        #[tokio::test]
        #[ignore = "needs its engine's URL: IDEMCACHE_POSTGRES_URL or IDEMCACHE_MYSQL_URL"]
        async fn null_statuses_and_duplicate_ids_are_corrupt_naming_table_and_id() {
            let Some(t) = Tables::new().await else { return };
            let mut conn = t.conn().await;
            let loose = format!("{}_loose", t.payments);
            run(&mut conn, format!("INSERT INTO {} VALUES ('p3', NULL, 1)", t.payments)).await;
            run(&mut conn, format!("CREATE TABLE {loose} (id BIGINT, status TEXT){}", $engine))
                .await;
            run(&mut conn, format!("INSERT INTO {loose} VALUES (7, 'PAID'), (7, 'PAID')")).await;
            let error =
                alone(&mut conn, &t.column(), &"p3", &["PENDING"], "PAID").await.unwrap_err();
            assert!(matches!(error, TransitionError::Corrupt { .. }), "{error:?}");
            let message = error.to_string();
            let row = format!("the row \"p3\" of {}.status", t.payments);
            assert!(message.contains(&row) && message.contains("NULL"), "{message}");
            let column = StatusColumn::new(&loose, "id", "status").unwrap();
            let error = alone(&mut conn, &column, &7_i64, &["PENDING"], "PAID").await.unwrap_err();
            let message = error.to_string();
            assert!(message.contains(&format!("the row 7 of {loose}.status")), "{message}");
            assert!(message.contains("2 rows have this id"), "{message}");
            run(&mut conn, format!("DROP TABLE {loose}")).await;
            t.drop_tables().await;
        }



        /// The transitions' suite on this engine: each transaction from a pool of the
        /// test's own (`'static`, as the suite holds it), statements with the test's
        /// own ids as literals.
        struct Suite {
            tables: Tables,
            pool: sqlx::Pool<<Db as Connection>::Database>,
        }

        impl Payments for Suite {
            type Tx = sqlx::Transaction<'static, <Db as Connection>::Database>;

            fn engine(&self) -> &'static str {
                $name
            }

            fn table(&self) -> &str {
                &self.tables.payments
            }

            fn begin(&self) -> Boxed<'_, Self::Tx> {
                Box::pin(async move { self.pool.begin().await.unwrap() })
            }

            fn transition<'a>(
                tx: &'a mut Self::Tx,
                column: &'a StatusColumn,
                id: &'a str,
                from: &'a [&'a str],
                to: &'a str,
            ) -> Boxed<'a, Result<Transition, TransitionError>> {
                Box::pin(async move { transition(tx, column, &id, from, to).await })
            }

            fn load<'a>(
                tx: &'a mut Self::Tx,
                table: &'a str,
                id: &'a str,
            ) -> Boxed<'a, Option<String>> {
                Box::pin(one_text(tx, format!("SELECT status FROM {table} WHERE id = '{id}'")))
            }

            fn book<'a>(tx: &'a mut Self::Tx, table: &'a str, id: &'a str) -> Boxed<'a, ()> {
                let sql = format!(
                    "INSERT INTO {table}_ledger SELECT id, amount FROM {table} WHERE id = '{id}'"
                );
                Box::pin(run(tx, sql))
            }

            fn commit(tx: Self::Tx) -> Boxed<'static, ()> {
                Box::pin(async move { tx.commit().await.unwrap() })
            }

            fn rollback(tx: Self::Tx) -> Boxed<'static, ()> {
                Box::pin(async move { tx.rollback().await.unwrap() })
            }

            fn insert<'a>(&'a self, id: &'a str, status: Option<&'a str>) -> Boxed<'a, ()> {
                let status = status.map_or("NULL".to_owned(), |s| format!("'{s}'"));
                let sql = format!("INSERT INTO {} VALUES ('{id}', {status}, 500)", self.table());
                Box::pin(async move { run(&mut self.tables.conn().await, sql).await })
            }

            fn status<'a>(&'a self, id: &'a str) -> Boxed<'a, Option<String>> {
                Box::pin(self.tables.status(id))
            }

            fn ledger<'a>(&'a self, id: &'a str) -> Boxed<'a, i64> {
                Box::pin(self.tables.ledger(id))
            }

            fn row_held<'a>(&'a self, id: &'a str) -> Boxed<'a, bool> {
                Box::pin(async move {
                    let mut other = self.tables.conn().await;
                    let mut tx = other.begin().await.unwrap();
                    let grab =
                        format!("SELECT status FROM {} WHERE id = '{id}' FOR UPDATE NOWAIT", self.table());
                    let held = sqlx::query(AssertSqlSafe(grab)).fetch_all(&mut *tx).await.is_err();
                    tx.rollback().await.unwrap();
                    held
                })
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "needs its engine's URL: IDEMCACHE_POSTGRES_URL or IDEMCACHE_MYSQL_URL"]
        async fn transitions_hold() {
            let Some(tables) = Tables::new().await else { return };
            let pool = sqlx::Pool::connect(&tables.url).await.unwrap();
            let suite = Arc::new(Suite { tables, pool });
            testing::run(suite.clone()).await;
            Arc::into_inner(suite).unwrap().tables.drop_tables().await;
        }

        /// On `column`'s table holding p1 PENDING and p2 REFUNDED (`column_type` names
        /// it in failures), each in its own transaction: p1 PENDING -> PAID applies, its
        /// duplicate is in the target, PAID -> PENDING and REFUNDED -> PAID are refused
        /// naming the status, an unknown id is not found.
        async fn assert_standard_answers(conn: &mut Db, column: &StatusColumn, column_type: &str) {
            let answers = [
                ("p1", "PENDING", "PAID", Transition::Applied),
                ("p1", "PENDING", "PAID", Transition::AlreadyInTarget),
                ("p1", "FAILED", "PENDING", Transition::Illegal { current: "PAID".into() }),
                ("p2", "PENDING", "PAID", Transition::Illegal { current: "REFUNDED".into() }),
                ("p404", "PENDING", "PAID", Transition::NotFound),
            ];
            for (id, from, to, expected) in answers {
                let mut tx = conn.begin().await.unwrap();
                let outcome = transition(&mut tx, column, &id, &[from], to).await;
                tx.commit().await.unwrap();
                assert_eq!(outcome.unwrap(), expected, "{column_type}: {id} {from} -> {to}");
            }
        }
    };
}

#[cfg(all(feature = "postgres", feature = "mysql"))]
mod postgres {
    suite!(
        sqlx::PgConnection,
        idemcache_sqlx::transition::postgres::transition,
        "IDEMCACHE_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
        "",
        "PostgreSQL (sqlx)"
    );

    /// Under `REPEATABLE READ`, a transaction whose snapshot predates a concurrent
    /// transition's commit gets a serialization failure: `Conflict`, and its retry is a
    /// duplicate.
    #[tokio::test]
    #[ignore = "needs IDEMCACHE_POSTGRES_URL"]
    async fn repeatable_read_after_a_concurrent_commit_is_a_conflict_to_retry() {
        let Some(t) = Tables::new().await else { return };
        let (mut late, mut first) = (t.conn().await, t.conn().await);
        let mut tx = late.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ").await.unwrap();
        let load = format!("SELECT status FROM {} WHERE id = 'p1'", t.payments);
        assert_eq!(one_text(&mut tx, load).await.as_deref(), Some("PENDING"));
        assert_eq!(t.on_success(&mut first, "p1").await.unwrap(), Transition::Applied);
        let error =
            transition(&mut tx, &t.column(), &"p1", &["PENDING"], "PAID").await.unwrap_err();
        assert!(error.is_conflict(), "{error:?}");
        assert!(error.to_string().contains("could not serialize access"), "{error}");
        tx.rollback().await.unwrap();
        assert_eq!(t.on_success(&mut late, "p1").await.unwrap(), Transition::AlreadyInTarget);
        assert_eq!(t.ledger("p1").await, 1);
        t.drop_tables().await;
    }

    /// The status column's types a schema uses: each answers as PostgreSQL compares in
    /// it, the duplicate included (`CHAR(n)` ignores its padding; an enum type compares
    /// labels), and `current` is the value as text.
    #[tokio::test]
    #[ignore = "needs IDEMCACHE_POSTGRES_URL"]
    async fn every_status_column_type_answers_as_the_database_compares() {
        let Some(t) = Tables::new().await else { return };
        let mut conn = t.conn().await;
        let kind = format!("{}_kind", t.payments);
        let labels = "('PENDING', 'PAID', 'REFUNDED', 'FAILED')";
        run(&mut conn, format!("CREATE TYPE {kind} AS ENUM {labels}")).await;
        for (n, column_type) in ["CHAR(10)", "VARCHAR(20)", "TEXT", &kind].iter().enumerate() {
            let table = format!("{}_{n}", t.payments);
            let create =
                format!("CREATE TABLE {table} (id TEXT PRIMARY KEY, status {column_type})");
            run(&mut conn, create).await;
            let rows = format!("INSERT INTO {table} VALUES ('p1', 'PENDING'), ('p2', 'REFUNDED')");
            run(&mut conn, rows).await;
            let column = StatusColumn::new(&table, "id", "status").unwrap();
            assert_standard_answers(&mut conn, &column, column_type).await;
            run(&mut conn, format!("DROP TABLE {table}")).await;
        }
        run(&mut conn, format!("DROP TYPE {kind}")).await;
        t.drop_tables().await;
    }

    /// A status that is not one of an enum type's labels is the database's refusal
    /// (`Database`), before anything changed.
    #[tokio::test]
    #[ignore = "needs IDEMCACHE_POSTGRES_URL"]
    async fn a_status_outside_an_enum_type_is_refused_by_the_database() {
        let Some(t) = Tables::new().await else { return };
        let mut conn = t.conn().await;
        let (kind, table) = (format!("{}_kind", t.payments), format!("{}_enum", t.payments));
        run(&mut conn, format!("CREATE TYPE {kind} AS ENUM ('PENDING', 'PAID')")).await;
        run(&mut conn, format!("CREATE TABLE {table} (id TEXT PRIMARY KEY, status {kind})")).await;
        run(&mut conn, format!("INSERT INTO {table} VALUES ('p1', 'PENDING')")).await;
        let column = StatusColumn::new(&table, "id", "status").unwrap();
        for (from, to) in [("PENDING", "SHIPPED"), ("SHIPPED", "PAID")] {
            let mut tx = conn.begin().await.unwrap();
            let error = transition(&mut tx, &column, &"p1", &[from], to).await.unwrap_err();
            assert!(matches!(error, TransitionError::Database { .. }), "{error:?}");
            assert!(error.to_string().contains("SHIPPED"), "{error}");
            tx.rollback().await.unwrap();
        }
        let status = format!("SELECT status::text FROM {table} WHERE id = 'p1'");
        assert_eq!(one_text(&mut conn, status).await.as_deref(), Some("PENDING"));
        run(&mut conn, format!("DROP TABLE {table}")).await;
        run(&mut conn, format!("DROP TYPE {kind}")).await;
        t.drop_tables().await;
    }
}

#[cfg(all(feature = "postgres", feature = "mysql"))]
mod mysql {
    suite!(
        sqlx::MySqlConnection,
        idemcache_sqlx::transition::mysql::transition,
        "IDEMCACHE_MYSQL_URL",
        "mysql://root@127.0.0.1:3306/test",
        " ENGINE=InnoDB",
        "MySQL/MariaDB (sqlx)"
    );

    /// Why the read after the `UPDATE` must lock: under `REPEATABLE READ` a transaction
    /// that read the row before a concurrent transition committed keeps seeing PENDING
    /// in plain reads, while its `UPDATE` (a locking read) sees PAID and matches nothing.
    /// A plain read would report PENDING; the transition says `AlreadyInTarget`.
    #[tokio::test]
    #[ignore = "needs IDEMCACHE_MYSQL_URL"]
    async fn under_repeatable_read_the_read_locks_or_it_would_see_the_old_snapshot() {
        let Some(t) = Tables::new().await else { return };
        let (mut late, mut first) = (t.conn().await, t.conn().await);
        let load = format!("SELECT status FROM {} WHERE id = 'p1'", t.payments);
        // The server's default isolation: REPEATABLE READ unless configured otherwise
        // (then the plain read below would see PAID, and this test fail).
        let mut tx = late.begin().await.unwrap();
        assert_eq!(one_text(&mut tx, load.clone()).await.as_deref(), Some("PENDING"));
        assert_eq!(t.on_success(&mut first, "p1").await.unwrap(), Transition::Applied);
        // The plain read still says PENDING: the snapshot, not the committed row.
        assert_eq!(one_text(&mut tx, load.clone()).await.as_deref(), Some("PENDING"));
        let outcome = transition(&mut tx, &t.column(), &"p1", &["PENDING"], "PAID").await;
        assert_eq!(outcome.unwrap(), Transition::AlreadyInTarget);
        assert_eq!(one_text(&mut tx, load).await.as_deref(), Some("PENDING"));
        tx.commit().await.unwrap();
        assert_eq!(t.ledger("p1").await, 1);
        t.drop_tables().await;
    }

    /// sqlx connects with `CLIENT_FOUND_ROWS`: an `UPDATE` that writes the value a row
    /// already holds still counts it. (A `to` among `from` is refused, so the count is
    /// never asked to tell a duplicate from a move.)
    #[tokio::test]
    #[ignore = "needs IDEMCACHE_MYSQL_URL"]
    async fn sqlx_counts_matched_rows_not_changed_ones() {
        let Some(t) = Tables::new().await else { return };
        let mut conn = t.conn().await;
        let same = format!("UPDATE {} SET status = 'PAID' WHERE id = 'p2'", t.payments);
        let result = sqlx::query(AssertSqlSafe(same)).execute(&mut conn).await.unwrap();
        assert_eq!(result.rows_affected(), 1);
        t.drop_tables().await;
    }

    /// MySQL's default collations compare case-insensitively and ignore trailing
    /// spaces: a row holding PAID matches `status IN ('paid')` and `('PAID  ')`. Hence
    /// `to` may not equal a `from` so compared.
    #[tokio::test]
    #[ignore = "needs IDEMCACHE_MYSQL_URL"]
    async fn the_default_collation_ignores_case_so_such_sources_are_refused() {
        let Some(t) = Tables::new().await else { return };
        let mut conn = t.conn().await;
        let sql = format!("SELECT count(*) FROM {} WHERE status IN ('paid')", t.payments);
        assert_eq!(one_i64(&mut conn, sql).await, 1);
        let sql = format!("SELECT count(*) FROM {} WHERE status IN ('PAID  ')", t.payments);
        assert_eq!(one_i64(&mut conn, sql).await, 1, "PAD SPACE: trailing spaces ignored");
        for source in ["paid", "PAID  "] {
            let refused = alone(&mut conn, &t.column(), &"p2", &[source], "PAID").await;
            assert!(matches!(refused, Err(TransitionError::InvalidInput { .. })), "{refused:?}");
        }
        t.drop_tables().await;
    }

    /// MariaDB's `innodb_snapshot_isolation` makes `REPEATABLE READ` refuse to update a
    /// row changed since the snapshot (error 1020): a `Conflict`, whose retry is a
    /// duplicate. Skipped on servers without the variable (MySQL, MariaDB < 10.6.18).
    #[tokio::test]
    #[ignore = "needs IDEMCACHE_MYSQL_URL"]
    async fn mariadb_snapshot_isolation_refusal_is_a_conflict_to_retry() {
        let Some(t) = Tables::new().await else { return };
        let (mut late, mut first) = (t.conn().await, t.conn().await);
        let on = sqlx::raw_sql("SET SESSION innodb_snapshot_isolation = ON").execute(&mut late);
        if let Err(error) = on.await {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "skipped the snapshot isolation test: {error}");
            t.drop_tables().await;
            return;
        }
        let load = format!("SELECT status FROM {} WHERE id = 'p1'", t.payments);
        let mut tx = late.begin().await.unwrap();
        assert_eq!(one_text(&mut tx, load).await.as_deref(), Some("PENDING"));
        assert_eq!(t.on_success(&mut first, "p1").await.unwrap(), Transition::Applied);
        let error =
            transition(&mut tx, &t.column(), &"p1", &["PENDING"], "PAID").await.unwrap_err();
        assert!(error.is_conflict(), "{error:?}");
        tx.rollback().await.unwrap();
        assert_eq!(t.on_success(&mut late, "p1").await.unwrap(), Transition::AlreadyInTarget);
        assert_eq!(t.ledger("p1").await, 1);
        t.drop_tables().await;
    }

    /// The status column's types a schema uses: each answers as MariaDB compares in it,
    /// the duplicate included (`CHAR(n)` drops trailing spaces, `ENUM` compares labels).
    #[tokio::test]
    #[ignore = "needs IDEMCACHE_MYSQL_URL"]
    async fn every_status_column_type_answers_as_the_database_compares() {
        let Some(t) = Tables::new().await else { return };
        let mut conn = t.conn().await;
        let enumeration = "ENUM('PENDING', 'PAID', 'REFUNDED', 'FAILED')";
        for (n, column_type) in ["CHAR(10)", "VARCHAR(20)", "TEXT", enumeration].iter().enumerate()
        {
            let table = format!("{}_{n}", t.payments);
            let create = format!(
                "CREATE TABLE {table} (id VARCHAR(64) PRIMARY KEY, status {column_type}) \
                 ENGINE=InnoDB"
            );
            run(&mut conn, create).await;
            let rows = format!("INSERT INTO {table} VALUES ('p1', 'PENDING'), ('p2', 'REFUNDED')");
            run(&mut conn, rows).await;
            let column = StatusColumn::new(&table, "id", "status").unwrap();
            assert_standard_answers(&mut conn, &column, column_type).await;
            run(&mut conn, format!("DROP TABLE {table}")).await;
        }
        t.drop_tables().await;
    }

    /// The column's collation decides, in the answer as in the `UPDATE`: under the
    /// server's default (`utf8mb4_general_ci`: case-insensitive, PAD SPACE) a row holding
    /// `paid` or `PAID  ` is already PAID, so the redelivered callback is a duplicate, and
    /// one holding `pending` moves; `utf8mb4_bin` tells case apart but still ignores
    /// trailing spaces; `utf8mb4_nopad_bin` (MariaDB) tells both apart. Each answer
    /// agrees with the database's own `status = 'PAID'` for the row.
    #[tokio::test]
    #[ignore = "needs IDEMCACHE_MYSQL_URL"]
    async fn the_collation_that_matched_the_update_decides_the_answer() {
        let Some(t) = Tables::new().await else { return };
        let mut conn = t.conn().await;
        let illegal = |current: &str| Transition::Illegal { current: current.into() };
        let cases = [
            (
                "utf8mb4_general_ci",
                [Transition::AlreadyInTarget, Transition::AlreadyInTarget, Transition::Applied],
            ),
            ("utf8mb4_bin", [illegal("paid"), Transition::AlreadyInTarget, illegal("pending")]),
            ("utf8mb4_nopad_bin", [illegal("paid"), illegal("PAID  "), illegal("pending")]),
        ];
        for (collation, answers) in cases {
            let table = format!("{}_{collation}", t.payments);
            let create = format!(
                "CREATE TABLE {table} (id VARCHAR(64) PRIMARY KEY, \
                 status VARCHAR(20) CHARACTER SET utf8mb4 COLLATE {collation}) ENGINE=InnoDB"
            );
            run(&mut conn, create).await;
            let rows = format!(
                "INSERT INTO {table} VALUES ('p3', 'paid'), ('p4', 'PAID  '), ('p5', 'pending')"
            );
            run(&mut conn, rows).await;
            let column = StatusColumn::new(&table, "id", "status").unwrap();
            for ((id, held), expected) in
                [("p3", "paid"), ("p4", "PAID  "), ("p5", "pending")].into_iter().zip(answers)
            {
                let same = format!("SELECT status = 'PAID' FROM {table} WHERE id = '{id}'");
                let same = one_i64(&mut conn, same).await == 1;
                assert_eq!(same, expected == Transition::AlreadyInTarget, "{collation} {held:?}");
                let mut tx = conn.begin().await.unwrap();
                let outcome = transition(&mut tx, &column, &id, &["PENDING"], "PAID").await;
                tx.commit().await.unwrap();
                assert_eq!(outcome.unwrap(), expected, "{collation} {held:?}");
            }
            run(&mut conn, format!("DROP TABLE {table}")).await;
        }
        t.drop_tables().await;
    }
}
