//! Conditional transitions against a real PostgreSQL (`IDEMCACHE_POSTGRES_URL`; skipped
//! with a printed reason when unset): the transitions' suite
//! (`idemcache_sql::transition::testing`, at `READ COMMITTED`, PostgreSQL's default),
//! then what is PostgreSQL's own: duplicate and mistyped ids, concurrent callbacks under
//! `REPEATABLE READ` conflict and their retries are duplicates, every column type
//! (enums too) answers as the database compares.
//!
//! Every test creates tables of its own (pid and counter in the name) and drops them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use idemcache::store::conformance::service_url;
use idemcache_postgres::tokio_postgres::{self, Client, IsolationLevel, NoTls, Transaction};
use idemcache_postgres::transition;
use idemcache_postgres::{PooledTransaction, PostgresStore};
use idemcache_sql::transition::testing::{self, Boxed, Payments};
use idemcache_sql::transition::{StatusColumn, Transition, TransitionError};

const EXAMPLE: &str = "postgres://postgres@127.0.0.1:5432/test";

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// A payments table and a ledger of this test's own, with p1 PENDING (500) and p2 PAID.
struct Tables {
    url: String,
    payments: String,
    ledger: String,
}

impl Tables {
    async fn new() -> Option<Tables> {
        static N: AtomicU64 = AtomicU64::new(0);
        let url = service_url("IDEMCACHE_POSTGRES_URL", EXAMPLE)?;
        let n = format!("{}_{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        let tables =
            // The ledger named for its payments, as the suite's fixture books in it.
            Tables { url, payments: format!("tr_payments_{n}"), ledger: format!("tr_payments_{n}_ledger") };
        let (payments, ledger) = (&tables.payments, &tables.ledger);
        connect(&tables.url)
            .await
            .batch_execute(&format!(
                "CREATE TABLE {payments} (id TEXT PRIMARY KEY, status VARCHAR(20), amount BIGINT NOT NULL);
                 CREATE TABLE {ledger} (payment TEXT NOT NULL, amount BIGINT NOT NULL);
                 INSERT INTO {payments} VALUES ('p1', 'PENDING', 500), ('p2', 'PAID', 700);"
            ))
            .await
            .unwrap();
        Some(tables)
    }

    fn column(&self) -> StatusColumn {
        StatusColumn::new(&self.payments, "id", "status").unwrap()
    }

    async fn client(&self) -> Client {
        connect(&self.url).await
    }

    async fn ledger(&self, id: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM {} WHERE payment = $1", self.ledger);
        self.client().await.query_one(&sql, &[&id]).await.unwrap().get(0)
    }

    /// The SUCCESS callback's handler: in one transaction at `isolation`, PENDING ->
    /// PAID and the ledger entry only if this call applied it.
    async fn on_success(
        &self,
        client: &mut Client,
        isolation: IsolationLevel,
        id: &str,
    ) -> Result<Transition, TransitionError> {
        let tx = begin(client, isolation).await;
        let outcome = transition(&tx, &self.column(), &id, &["PENDING"], "PAID").await;
        self.settle(tx, outcome, id).await
    }

    /// Books the ledger entry if `outcome` is Applied and commits; rolls back on an error.
    async fn settle(
        &self,
        tx: Transaction<'_>,
        outcome: Result<Transition, TransitionError>,
        id: &str,
    ) -> Result<Transition, TransitionError> {
        match outcome {
            Ok(outcome) => {
                if outcome == Transition::Applied {
                    let sql = format!(
                        "INSERT INTO {} SELECT id, amount FROM {} WHERE id = $1",
                        self.ledger, self.payments
                    );
                    tx.execute(&sql, &[&id]).await.unwrap();
                }
                tx.commit().await.unwrap();
                Ok(outcome)
            }
            Err(error) => {
                tx.rollback().await.unwrap();
                Err(error)
            }
        }
    }

    async fn drop_tables(self) {
        let sql = format!("DROP TABLE {}; DROP TABLE {}", self.payments, self.ledger);
        self.client().await.batch_execute(&sql).await.unwrap();
    }
}

/// A transaction at `isolation` on `client`.
async fn begin(client: &mut Client, isolation: IsolationLevel) -> Transaction<'_> {
    client.build_transaction().isolation_level(isolation).start().await.unwrap()
}

/// PostgreSQL's default isolation.
const READ_COMMITTED: IsolationLevel = IsolationLevel::ReadCommitted;

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn null_statuses_duplicate_ids_and_mistyped_ids_are_typed_errors() {
    let Some(t) = Tables::new().await else { return };
    let mut client = t.client().await;
    let loose = format!("{}_loose", t.payments);
    client
        .batch_execute(&format!(
            "INSERT INTO {} VALUES ('p3', NULL, 1);
             CREATE TABLE {loose} (id BIGINT, status TEXT);
             INSERT INTO {loose} VALUES (7, 'PAID'), (7, 'PAID');",
            t.payments
        ))
        .await
        .unwrap();
    // Each in a transaction of its own, rolled back (as after any error).
    let tx = client.transaction().await.unwrap();
    let error = transition(&tx, &t.column(), &"p3", &["PENDING"], "PAID").await.unwrap_err();
    tx.rollback().await.unwrap();
    assert!(matches!(error, TransitionError::Corrupt { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains(&format!("the row \"p3\" of {}.status", t.payments)), "{message}");
    assert!(message.contains("NULL"), "{message}");

    let column = StatusColumn::new(&loose, "id", "status").unwrap();
    let tx = client.transaction().await.unwrap();
    let error = transition(&tx, &column, &7_i64, &["PENDING"], "PAID").await.unwrap_err();
    tx.rollback().await.unwrap();
    assert!(error.to_string().contains("2 rows have this id"), "{error}");
    // An i32 for a BIGINT column: refused by the driver's type check, nothing ran.
    let tx = client.transaction().await.unwrap();
    let error = transition(&tx, &column, &7_i32, &["PENDING"], "PAID").await.unwrap_err();
    tx.rollback().await.unwrap();
    assert!(matches!(error, TransitionError::Database { .. }), "{error:?}");
    assert!(error.to_string().contains(&format!("transition of {loose}.status")), "{error}");
    client.batch_execute(&format!("DROP TABLE {loose}")).await.unwrap();
    t.drop_tables().await;
}

/// What one concurrent handler got: its first attempt's answer (`None` for a
/// conflict), and its retry's after a conflict.
type Attempts = (Option<Transition>, Option<Transition>);

/// `CALLBACKS` handlers, each on its own connection: all begin a transaction at
/// `isolation` and load the payment, then, past a barrier so that every snapshot
/// predates the winner's commit, transition it; a handler that gets a conflict rolls
/// back and runs again.
async fn concurrent_callbacks(t: &Arc<Tables>, isolation: IsolationLevel) -> Vec<Attempts> {
    const CALLBACKS: usize = 8;
    let loaded = Arc::new(tokio::sync::Barrier::new(CALLBACKS));
    let mut handlers = Vec::new();
    for _ in 0..CALLBACKS {
        let (t, loaded) = (t.clone(), loaded.clone());
        handlers.push(tokio::spawn(async move {
            let mut client = t.client().await;
            let tx = begin(&mut client, isolation).await;
            let load = format!("SELECT status FROM {} WHERE id = 'p1'", t.payments);
            let seen: String = tx.query_one(&load, &[]).await.unwrap().get(0);
            assert_eq!(seen, "PENDING");
            loaded.wait().await;
            let first = transition(&tx, &t.column(), &"p1", &["PENDING"], "PAID").await;
            match t.settle(tx, first, "p1").await {
                Ok(outcome) => (Some(outcome), None),
                Err(error) => {
                    assert!(error.is_conflict(), "{error:?}");
                    (None, Some(t.on_success(&mut client, isolation, "p1").await.unwrap()))
                }
            }
        }));
    }
    let mut outcomes = Vec::new();
    for handler in handlers {
        outcomes.push(handler.await.unwrap());
    }
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn concurrent_callbacks_under_repeatable_read_conflict_and_their_retries_are_duplicates() {
    let Some(t) = Tables::new().await else { return };
    let t = Arc::new(t);
    let outcomes = concurrent_callbacks(&t, IsolationLevel::RepeatableRead).await;
    // Every loser's snapshot predates the winner's commit: a serialization failure, then
    // a retry that sees PAID.
    let applied = outcomes.iter().filter(|o| **o == (Some(Transition::Applied), None)).count();
    let retried =
        outcomes.iter().filter(|o| **o == (None, Some(Transition::AlreadyInTarget))).count();
    assert_eq!((applied, retried), (1, 7), "{outcomes:?}");
    assert_eq!(t.ledger("p1").await, 1);
    Arc::into_inner(t).unwrap().drop_tables().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn repeatable_read_after_a_concurrent_commit_is_a_conflict_to_retry() {
    let Some(t) = Tables::new().await else { return };
    let (mut late, mut first) = (t.client().await, t.client().await);
    let tx = begin(&mut late, IsolationLevel::RepeatableRead).await;
    // The handler loads the payment first: the snapshot is taken here.
    let load = format!("SELECT status FROM {} WHERE id = 'p1'", t.payments);
    assert_eq!(tx.query_one(&load, &[]).await.unwrap().get::<_, String>(0), "PENDING");
    assert_eq!(t.on_success(&mut first, READ_COMMITTED, "p1").await.unwrap(), Transition::Applied);
    let error = transition(&tx, &t.column(), &"p1", &["PENDING"], "PAID").await.unwrap_err();
    assert!(error.is_conflict(), "{error:?}");
    assert!(error.to_string().contains("could not serialize access"), "{error}");
    tx.rollback().await.unwrap();
    let retry = t.on_success(&mut late, IsolationLevel::RepeatableRead, "p1").await;
    assert_eq!(retry.unwrap(), Transition::AlreadyInTarget);
    assert_eq!(t.ledger("p1").await, 1);
    t.drop_tables().await;
}

/// The status column's types a schema uses: each answers as PostgreSQL compares in it,
/// the duplicate included. `CHAR(n)` pads what it holds and compares ignoring the
/// padding; an enum type compares labels. The answer is the database's comparison (the
/// one the `UPDATE` made), not the Rust bytes of the value read back, and `current`
/// is the value as text (`CHAR(n)` without its padding).
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn every_status_column_type_answers_as_the_database_compares() {
    let Some(t) = Tables::new().await else { return };
    let mut client = t.client().await;
    let kind = format!("{}_kind", t.payments);
    client
        .batch_execute(&format!(
            "CREATE TYPE {kind} AS ENUM ('PENDING', 'PAID', 'REFUNDED', 'FAILED')"
        ))
        .await
        .unwrap();
    for (n, column_type) in ["CHAR(10)", "VARCHAR(20)", "TEXT", kind.as_str()].iter().enumerate() {
        let table = format!("{}_{n}", t.payments);
        client
            .batch_execute(&format!(
                "CREATE TABLE {table} (id TEXT PRIMARY KEY, status {column_type} NOT NULL);
                 INSERT INTO {table} VALUES ('p1', 'PENDING'), ('p2', 'REFUNDED');"
            ))
            .await
            .unwrap();
        let column = StatusColumn::new(&table, "id", "status").unwrap();
        let answers = [
            ("p1", &["PENDING"][..], "PAID", Transition::Applied),
            ("p1", &["PENDING"][..], "PAID", Transition::AlreadyInTarget),
            ("p1", &["FAILED"][..], "PENDING", Transition::Illegal { current: "PAID".into() }),
            ("p2", &["PENDING"][..], "PAID", Transition::Illegal { current: "REFUNDED".into() }),
            ("p404", &["PENDING"][..], "PAID", Transition::NotFound),
        ];
        for (id, from, to, expected) in answers {
            let tx = client.transaction().await.unwrap();
            let outcome = transition(&tx, &column, &id, from, to).await;
            tx.commit().await.unwrap();
            assert_eq!(outcome.unwrap(), expected, "{column_type}: {id} {from:?} -> {to}");
        }
        client.batch_execute(&format!("DROP TABLE {table}")).await.unwrap();
    }
    client.batch_execute(&format!("DROP TYPE {kind}")).await.unwrap();
    t.drop_tables().await;
}

/// A status that is not one of an enum type's labels is the database's refusal
/// (`Database`), before anything changed.
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_status_outside_an_enum_type_is_refused_by_the_database() {
    let Some(t) = Tables::new().await else { return };
    let mut client = t.client().await;
    let (kind, table) = (format!("{}_kind", t.payments), format!("{}_enum", t.payments));
    client
        .batch_execute(&format!(
            "CREATE TYPE {kind} AS ENUM ('PENDING', 'PAID');
             CREATE TABLE {table} (id TEXT PRIMARY KEY, status {kind} NOT NULL);
             INSERT INTO {table} VALUES ('p1', 'PENDING');"
        ))
        .await
        .unwrap();
    let column = StatusColumn::new(&table, "id", "status").unwrap();
    for (from, to) in [("PENDING", "SHIPPED"), ("SHIPPED", "PAID")] {
        let tx = client.transaction().await.unwrap();
        let error = transition(&tx, &column, &"p1", &[from], to).await.unwrap_err();
        assert!(matches!(error, TransitionError::Database { .. }), "{error:?}");
        assert!(error.to_string().contains("SHIPPED"), "{error}");
        tx.rollback().await.unwrap();
    }
    let status: String = client
        .query_one(&format!("SELECT status::text FROM {table} WHERE id = 'p1'"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "PENDING");
    client.batch_execute(&format!("DROP TABLE {table}; DROP TYPE {kind}")).await.unwrap();
    t.drop_tables().await;
}

/// The transitions' suite through tokio-postgres: each transaction a
/// `PooledTransaction`, the ledger `{payments}_ledger`.
struct Suite {
    store: PostgresStore,
    payments: String,
}

impl Payments for Suite {
    type Tx = PooledTransaction;

    fn engine(&self) -> &'static str {
        "PostgreSQL (tokio-postgres)"
    }

    fn table(&self) -> &str {
        &self.payments
    }

    fn begin(&self) -> Boxed<'_, PooledTransaction> {
        Box::pin(async move { PooledTransaction::begin(&self.store).await.unwrap() })
    }

    fn transition<'a>(
        tx: &'a mut PooledTransaction,
        column: &'a StatusColumn,
        id: &'a str,
        from: &'a [&'a str],
        to: &'a str,
    ) -> Boxed<'a, Result<Transition, TransitionError>> {
        Box::pin(async move { transition(&*tx, column, &id, from, to).await })
    }

    fn load<'a>(
        tx: &'a mut PooledTransaction,
        table: &'a str,
        id: &'a str,
    ) -> Boxed<'a, Option<String>> {
        Box::pin(async move {
            let sql = format!("SELECT status FROM {table} WHERE id = $1");
            tx.query_one(&sql, &[&id]).await.unwrap().get(0)
        })
    }

    fn book<'a>(tx: &'a mut PooledTransaction, table: &'a str, id: &'a str) -> Boxed<'a, ()> {
        Box::pin(async move {
            let sql =
                format!("INSERT INTO {table}_ledger SELECT id, amount FROM {table} WHERE id = $1");
            tx.execute(&sql, &[&id]).await.unwrap();
        })
    }

    fn commit(tx: PooledTransaction) -> Boxed<'static, ()> {
        Box::pin(async move { tx.commit().await.unwrap() })
    }

    fn rollback(tx: PooledTransaction) -> Boxed<'static, ()> {
        Box::pin(async move { tx.rollback().await.unwrap() })
    }

    fn insert<'a>(&'a self, id: &'a str, status: Option<&'a str>) -> Boxed<'a, ()> {
        Box::pin(async move {
            let c = self.store.pool().get().await.unwrap();
            let sql = format!("INSERT INTO {} VALUES ($1, $2, 500)", self.payments);
            c.execute(&sql, &[&id, &status]).await.unwrap();
        })
    }

    fn status<'a>(&'a self, id: &'a str) -> Boxed<'a, Option<String>> {
        Box::pin(async move {
            let c = self.store.pool().get().await.unwrap();
            let sql = format!("SELECT status FROM {} WHERE id = $1", self.payments);
            c.query_one(&sql, &[&id]).await.unwrap().get(0)
        })
    }

    fn ledger<'a>(&'a self, id: &'a str) -> Boxed<'a, i64> {
        Box::pin(async move {
            let c = self.store.pool().get().await.unwrap();
            let sql = format!("SELECT count(*) FROM {}_ledger WHERE payment = $1", self.payments);
            c.query_one(&sql, &[&id]).await.unwrap().get(0)
        })
    }

    fn row_held<'a>(&'a self, id: &'a str) -> Boxed<'a, bool> {
        Box::pin(async move {
            let mut c = connect(&self.store_url()).await;
            let tx = c.transaction().await.unwrap();
            let sql = format!("SELECT 1 FROM {} WHERE id = $1 FOR UPDATE NOWAIT", self.payments);
            let held = tx.query(&sql, &[&id]).await.is_err();
            tx.rollback().await.unwrap();
            held
        })
    }
}

impl Suite {
    fn store_url(&self) -> String {
        service_url("IDEMCACHE_POSTGRES_URL", EXAMPLE).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn transitions_hold_on_postgres() {
    let Some(t) = Tables::new().await else { return };
    let store = PostgresStore::connect(&t.url).await.unwrap();
    testing::run(Arc::new(Suite { store, payments: t.payments.clone() })).await;
    t.drop_tables().await;
}
