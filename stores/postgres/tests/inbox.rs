//! The PostgreSQL inbox against a real server (`IDEMCACHE_POSTGRES_URL`; skipped with a
//! printed reason when unset): the inbox's suite (`idemcache_sql::inbox::testing`), then
//! what is PostgreSQL's own: a second delivery is InFlight at once (the advisory lock)
//! and its transaction goes on, a missing table is named, READ COMMITTED sees a record
//! committed mid-transaction, REPEATABLE READ and SERIALIZABLE answer InFlight for one
//! committed after their snapshot, and the schema is made safely from several clients.
//! Each test works in a schema of its own, dropped at its end.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use idemcache::store::conformance::{self, service_url};
use idemcache::Fingerprint;
use idemcache_postgres::inbox::{self, ensure_schema, purge, receive, InboxError, Receipt};
use idemcache_postgres::tokio_postgres::{self, Client, GenericClient, IsolationLevel, NoTls};
use idemcache_postgres::{PooledTransaction, PostgresStore};
use idemcache_sql::inbox::testing::{self, Boxed};

/// The consumer these tests receive as. Advisory locks are per database, not per
/// schema: a name of their own keeps other suites on the same server from holding
/// these tests' message locks (which would answer them InFlight).
const LEDGER: &str = "idemcache-inbox-test-ledger";

struct Db {
    url: String,
    schema: String,
}

impl Db {
    /// A schema of its own holding the inbox and an `accounts` table, or `None` (skipped).
    async fn new(name: &str) -> Option<Db> {
        static N: AtomicU32 = AtomicU32::new(0);
        let url = service_url("IDEMCACHE_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")?;
        let n = N.fetch_add(1, Ordering::Relaxed);
        let schema = format!("idemcache_inbox_{name}_{}_{n}", std::process::id());
        let db = Db { url, schema };
        let admin = db.raw().await;
        admin.batch_execute(&format!("CREATE SCHEMA {}", db.schema)).await.unwrap();
        let c = db.client().await;
        ensure_schema(&c).await.unwrap();
        c.batch_execute(
            "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL);
             INSERT INTO accounts VALUES ('a1', 0);",
        )
        .await
        .unwrap();
        Some(db)
    }

    async fn raw(&self) -> Client {
        let (client, connection) = tokio_postgres::connect(&self.url, NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    }

    /// A connection whose tables are this test's.
    async fn client(&self) -> Client {
        let client = self.raw().await;
        client.batch_execute(&format!("SET search_path TO {}", self.schema)).await.unwrap();
        client
    }

    async fn drop(self) {
        let admin = self.raw().await;
        admin.batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema)).await.unwrap();
    }
}

async fn rows<C: GenericClient + Sync>(c: &C) -> i64 {
    c.query_one("SELECT count(*) FROM idemcache_inbox", &[]).await.unwrap().get(0)
}

async fn balance<C: GenericClient + Sync>(c: &C) -> i64 {
    c.query_one("SELECT balance FROM accounts WHERE id = 'a1'", &[]).await.unwrap().get(0)
}

/// One delivery in its own transaction, committed when New.
async fn once(c: &mut Client, consumer: &str, id: &str, fp: Fingerprint) -> Receipt {
    let tx = c.transaction().await.unwrap();
    let receipt = receive(&tx, consumer, id, fp).await.unwrap();
    if receipt == Receipt::New {
        tx.commit().await.unwrap();
    }
    receipt
}

/// The inbox's suite (`idemcache_sql::inbox::testing`) on this driver: each transaction
/// a `PooledTransaction` of a store whose connections work in a schema of their own.
struct Postgres {
    store: PostgresStore,
}

fn micros(at: SystemTime) -> i64 {
    at.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_micros() as i64
}

impl testing::Inbox for Postgres {
    type Tx = PooledTransaction;

    fn engine(&self) -> &'static str {
        "PostgreSQL (tokio-postgres)"
    }

    fn begin(&self) -> Boxed<'_, PooledTransaction> {
        Box::pin(async move { PooledTransaction::begin(&self.store).await.unwrap() })
    }

    fn receive<'a>(
        tx: &'a mut PooledTransaction,
        consumer: &'a str,
        id: &'a str,
        fp: Fingerprint,
    ) -> Boxed<'a, Result<Receipt, InboxError>> {
        Box::pin(receive(&*tx, consumer, id, fp))
    }

    fn credit<'a>(tx: &'a mut PooledTransaction, account: &'a str, amount: i64) -> Boxed<'a, ()> {
        Box::pin(async move {
            let sql = "INSERT INTO entries (account, amount) VALUES ($1, $2)";
            tx.execute(sql, &[&account, &amount]).await.unwrap();
        })
    }

    fn commit(tx: PooledTransaction) -> Boxed<'static, ()> {
        Box::pin(async move { tx.commit().await.unwrap() })
    }

    fn rollback(tx: PooledTransaction) -> Boxed<'static, ()> {
        Box::pin(async move { tx.rollback().await.unwrap() })
    }

    fn records(&self, consumer: &str) -> Boxed<'_, i64> {
        let consumer = consumer.to_owned();
        Box::pin(async move {
            let c = self.store.pool().get().await.unwrap();
            let sql = "SELECT count(*) FROM idemcache_inbox WHERE consumer = $1";
            c.query_one(sql, &[&consumer]).await.unwrap().get(0)
        })
    }

    fn balance(&self, account: &str) -> Boxed<'_, i64> {
        let account = account.to_owned();
        Box::pin(async move {
            let c = self.store.pool().get().await.unwrap();
            let sql = "SELECT coalesce(sum(amount), 0)::bigint FROM entries WHERE account = $1";
            c.query_one(sql, &[&account]).await.unwrap().get(0)
        })
    }

    fn store_unreadable<'a>(&'a self, consumer: &'a str, id: &'a str) -> Boxed<'a, ()> {
        Box::pin(async move {
            let c = self.store.pool().get().await.unwrap();
            let sql = "INSERT INTO idemcache_inbox VALUES ($1, $2, '\\x010203', 0)";
            c.execute(sql, &[&consumer, &id]).await.unwrap();
        })
    }

    fn received<'a>(&'a self, consumer: &'a str, id: &'a str, at: SystemTime) -> Boxed<'a, ()> {
        Box::pin(async move {
            let c = self.store.pool().get().await.unwrap();
            let sql = "UPDATE idemcache_inbox SET received_at = $1 \
                       WHERE consumer = $2 AND message_id = $3";
            c.execute(sql, &[&micros(at), &consumer, &id]).await.unwrap();
        })
    }

    fn purge(&self, cutoff: SystemTime, limit: usize) -> Boxed<'_, Result<usize, InboxError>> {
        Box::pin(async move {
            let c = self.store.pool().get().await.unwrap();
            purge(&**c, cutoff, limit).await
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn the_inbox_holds_on_postgres() {
    let Some(db) = Db::new("suite").await else { return };
    let scoped = conformance::postgres_url_in_schema(&db.url, &db.schema);
    let store = PostgresStore::connect(&scoped).await.unwrap();
    let c = db.client().await;
    c.batch_execute("CREATE TABLE entries (account TEXT NOT NULL, amount BIGINT NOT NULL)")
        .await
        .unwrap();
    testing::run(Arc::new(Postgres { store })).await;
    db.drop().await;
}

/// PostgreSQL's own: a second delivery is InFlight at once (the advisory lock, no wait
/// for the first transaction), and its transaction goes on.
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_second_delivery_is_in_flight_at_once_and_its_transaction_goes_on() {
    let Some(db) = Db::new("inflight").await else { return };
    let fp = Fingerprint::of(b"a");
    let (mut first, mut second) = (db.client().await, db.client().await);
    let tx1 = first.transaction().await.unwrap();
    assert_eq!(receive(&tx1, LEDGER, "m-1", fp).await.unwrap(), Receipt::New);
    let tx2 = second.transaction().await.unwrap();
    let started = Instant::now();
    // A timeout, so that a receive that waits fails the test instead of hanging it.
    let second_delivery = receive(&tx2, LEDGER, "m-1", fp);
    let receipt = tokio::time::timeout(Duration::from_secs(10), second_delivery).await;
    assert_eq!(receipt.expect("the second delivery waited").unwrap(), Receipt::InFlight);
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(2), "waited {waited:?} for the first transaction");
    assert_eq!(receive(&tx2, LEDGER, "m-1-other", fp).await.unwrap(), Receipt::New);
    tx2.rollback().await.unwrap();
    tx1.rollback().await.unwrap();
    db.drop().await;
}

/// A missing table is the database's error, naming it.
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_missing_table_is_a_database_error_naming_it() {
    let Some(db) = Db::new("missing").await else { return };
    let mut bare = db.raw().await;
    bare.batch_execute("SET search_path TO pg_catalog").await.unwrap();
    let tx = bare.transaction().await.unwrap();
    let e = receive(&tx, LEDGER, "m", Fingerprint::of(b"a")).await.unwrap_err();
    assert!(matches!(e, InboxError::Database(_)), "{e:?}");
    assert!(e.to_string().contains("idemcache_inbox\" does not exist"), "{e}");
    drop(tx);
    db.drop().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn read_committed_sees_a_record_committed_during_the_transaction() {
    let Some(db) = Db::new("rc").await else { return };
    let (mut first, mut second) = (db.client().await, db.client().await);
    let fp = Fingerprint::of(b"a");
    let tx2 = second
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await
        .unwrap();
    assert_eq!(balance(&tx2).await, 0);
    assert_eq!(once(&mut first, LEDGER, "m-rc", fp).await, Receipt::New);
    assert_eq!(receive(&tx2, LEDGER, "m-rc", fp).await.unwrap(), Receipt::Duplicate);
    tx2.rollback().await.unwrap();
    db.drop().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn snapshot_isolation_answers_in_flight_for_a_record_committed_after_the_snapshot() {
    let Some(db) = Db::new("rr").await else { return };
    let (mut first, mut second) = (db.client().await, db.client().await);
    let fp = Fingerprint::of(b"a");
    for (level, id) in
        [(IsolationLevel::RepeatableRead, "m-rr"), (IsolationLevel::Serializable, "m-ser")]
    {
        let tx2 = second.build_transaction().isolation_level(level).start().await.unwrap();
        // The snapshot is taken by the first statement: before the record's commit.
        tx2.query_one("SELECT count(*) FROM accounts", &[]).await.unwrap();
        assert_eq!(once(&mut first, LEDGER, id, fp).await, Receipt::New);
        assert_eq!(receive(&tx2, LEDGER, id, fp).await.unwrap(), Receipt::InFlight, "{level:?}");
        // As documented: the serialization failure aborted the transaction.
        let e = tx2.query_one("SELECT 1", &[]).await.unwrap_err();
        assert_eq!(e.code(), Some(&tokio_postgres::error::SqlState::IN_FAILED_SQL_TRANSACTION));
        tx2.rollback().await.unwrap();
        // The redelivery, in a new transaction at the same level, sees the record.
        let tx2 = second.build_transaction().isolation_level(level).start().await.unwrap();
        assert_eq!(receive(&tx2, LEDGER, id, fp).await.unwrap(), Receipt::Duplicate);
        // A record committed before the snapshot is an ordinary duplicate, and the
        // transaction goes on.
        assert_eq!(
            receive(&tx2, LEDGER, id, Fingerprint::of(b"b")).await.unwrap(),
            Receipt::Mismatch
        );
        assert_eq!(receive(&tx2, LEDGER, &format!("{id}-2"), fp).await.unwrap(), Receipt::New);
        tx2.commit().await.unwrap();
    }
    db.drop().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn schema_creation_is_safe_from_several_clients_at_once() {
    let Some(db) = Db::new("schema").await else { return };
    let c = db.client().await;
    c.batch_execute("DROP TABLE idemcache_inbox").await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let c = db.client().await;
        tasks.push(tokio::spawn(async move { ensure_schema(&c).await }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(rows(&c).await, 0);
    // The lock key is stable: what pg_locks shows for a message.
    assert_eq!(inbox::lock_key(LEDGER, "m-1"), inbox::lock_key(LEDGER, "m-1"));
    assert_ne!(inbox::lock_key(LEDGER, "m-1"), inbox::lock_key(LEDGER, "m-2"));
    db.drop().await;
}

/// `ensure_schema` on an inbox that exists takes no lock: it does not wait for a
/// transaction holding an uncommitted record (a consumer mid-message), so a consumer
/// starting beside a busy one starts at once.
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn ensure_schema_on_an_existing_inbox_does_not_wait_for_open_transactions() {
    let Some(db) = Db::new("schema_busy").await else { return };
    let mut busy = db.client().await;
    let tx = busy.transaction().await.unwrap();
    let fp = Fingerprint::of(b"{}");
    assert_eq!(receive(&tx, LEDGER, "schema-busy-1", fp).await.unwrap(), Receipt::New);
    let starting = db.client().await;
    let started = tokio::time::timeout(Duration::from_secs(5), ensure_schema(&starting)).await;
    assert!(matches!(started, Ok(Ok(()))), "ensure_schema waited for an open transaction");
    tx.rollback().await.unwrap();
    db.drop().await;
}
