//! The sqlx PostgreSQL inbox's own behaviour against a real server
//! (`IDEMCACHE_POSTGRES_URL`; skipped with a printed reason when unset); the suite every
//! engine runs is in `inbox.rs`. A second delivery of an uncommitted message is InFlight
//! at once and its transaction stays usable, READ COMMITTED sees a record committed
//! mid-transaction, REPEATABLE READ and SERIALIZABLE answer InFlight (transaction
//! aborted) for one committed after their snapshot. Each test works in a schema of its
//! own, dropped at its end.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use idemcache::store::conformance::service_url;
use idemcache::Fingerprint;
use idemcache_sqlx::inbox::postgres::{ensure_schema, lock_key, receive};
use idemcache_sqlx::inbox::Receipt;
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};

/// The consumer these tests receive as. Advisory locks are per database, not per
/// schema: a name of their own keeps other suites on the same server from holding
/// these tests' message locks (which would answer them InFlight).
const LEDGER: &str = "idemcache-inbox-test-ledger";

struct Db {
    url: String,
    schema: String,
}

impl Db {
    async fn new(test: &str) -> Option<Db> {
        static N: AtomicU32 = AtomicU32::new(0);
        let url = service_url("IDEMCACHE_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")?;
        let n = N.fetch_add(1, Ordering::Relaxed);
        let schema = format!("idemcache_inbox_sqlx_{test}_{}_{n}", std::process::id());
        let db = Db { url, schema };
        let mut admin = PgConnection::connect(&db.url).await.unwrap();
        let create = format!("CREATE SCHEMA {}", db.schema);
        admin.execute(sqlx::raw_sql(AssertSqlSafe(create))).await.unwrap();
        let mut c = db.conn().await;
        ensure_schema(&mut c).await.unwrap();
        c.execute(sqlx::raw_sql(
            "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL);
             INSERT INTO accounts VALUES ('a1', 0);",
        ))
        .await
        .unwrap();
        Some(db)
    }

    async fn conn(&self) -> PgConnection {
        let mut c = PgConnection::connect(&self.url).await.unwrap();
        let set = format!("SET search_path TO {}", self.schema);
        c.execute(sqlx::raw_sql(AssertSqlSafe(set))).await.unwrap();
        c
    }

    async fn drop(self) {
        let mut admin = PgConnection::connect(&self.url).await.unwrap();
        let drop = format!("DROP SCHEMA {} CASCADE", self.schema);
        admin.execute(sqlx::raw_sql(AssertSqlSafe(drop))).await.unwrap();
    }
}

async fn count(c: &mut PgConnection, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(c).await.unwrap()
}

async fn once(c: &mut PgConnection, consumer: &str, id: &str, fp: Fingerprint) -> Receipt {
    let mut tx = c.begin().await.unwrap();
    let receipt = receive(&mut tx, consumer, id, fp).await.unwrap();
    if receipt == Receipt::New {
        tx.commit().await.unwrap();
    }
    receipt
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_second_delivery_of_an_uncommitted_message_is_in_flight_at_once() {
    let Some(db) = Db::new("inflight").await else { return };
    let fp = Fingerprint::of(b"a");
    for (id, first_commits) in [("m-commit", true), ("m-rollback", false)] {
        let (mut first, mut second) = (db.conn().await, db.conn().await);
        let mut tx1 = first.begin().await.unwrap();
        assert_eq!(receive(&mut tx1, LEDGER, id, fp).await.unwrap(), Receipt::New);
        let mut tx2 = second.begin().await.unwrap();
        let started = Instant::now();
        let second_delivery = receive(&mut tx2, LEDGER, id, fp);
        let receipt = tokio::time::timeout(Duration::from_secs(10), second_delivery).await;
        assert_eq!(receipt.expect("the second delivery waited").unwrap(), Receipt::InFlight);
        let waited = started.elapsed();
        assert!(waited < Duration::from_secs(2), "waited {waited:?}");
        let other = format!("{id}-other");
        assert_eq!(receive(&mut tx2, LEDGER, &other, fp).await.unwrap(), Receipt::New);
        tx2.rollback().await.unwrap();
        if first_commits {
            tx1.commit().await.unwrap();
            assert_eq!(once(&mut second, LEDGER, id, fp).await, Receipt::Duplicate);
        } else {
            tx1.rollback().await.unwrap();
            assert_eq!(once(&mut second, LEDGER, id, fp).await, Receipt::New);
        }
    }
    // The same lock key as idemcache-postgres's, so the two crates may share the table.
    assert_eq!(lock_key(LEDGER, "m-1"), idemcache_postgres_key(LEDGER, "m-1"));
    db.drop().await;
}

/// idemcache-postgres's lock key, restated (this crate does not depend on that one).
fn idemcache_postgres_key(consumer: &str, id: &str) -> i32 {
    let mut input = Vec::new();
    input.extend_from_slice(&(consumer.len() as u64).to_be_bytes());
    input.extend_from_slice(consumer.as_bytes());
    input.extend_from_slice(&(id.len() as u64).to_be_bytes());
    input.extend_from_slice(id.as_bytes());
    Fingerprint::of(&input).as_u128() as i32
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn isolation_levels() {
    let Some(db) = Db::new("isolation").await else { return };
    let (mut first, mut second) = (db.conn().await, db.conn().await);
    let fp = Fingerprint::of(b"a");
    // READ COMMITTED: a record committed during the transaction is a duplicate.
    let mut tx2 = second.begin().await.unwrap();
    assert_eq!(count(&mut tx2, "SELECT balance FROM accounts").await, 0);
    assert_eq!(once(&mut first, LEDGER, "m-rc", fp).await, Receipt::New);
    assert_eq!(receive(&mut tx2, LEDGER, "m-rc", fp).await.unwrap(), Receipt::Duplicate);
    tx2.rollback().await.unwrap();
    // Snapshot isolation: committed after the snapshot → InFlight, transaction aborted.
    for (level, id) in [("REPEATABLE READ", "m-rr"), ("SERIALIZABLE", "m-ser")] {
        let begin = format!("BEGIN ISOLATION LEVEL {level}");
        let mut tx2 = second.begin_with(AssertSqlSafe(begin.clone())).await.unwrap();
        assert_eq!(count(&mut tx2, "SELECT balance FROM accounts").await, 0);
        assert_eq!(once(&mut first, LEDGER, id, fp).await, Receipt::New);
        assert_eq!(receive(&mut tx2, LEDGER, id, fp).await.unwrap(), Receipt::InFlight, "{level}");
        let e = sqlx::query("SELECT 1").execute(&mut *tx2).await.unwrap_err();
        let code = e.as_database_error().and_then(|d| d.code()).map(|c| c.into_owned());
        assert_eq!(code.as_deref(), Some("25P02"), "the transaction is aborted: {e}");
        tx2.rollback().await.unwrap();
        let mut tx2 = second.begin_with(AssertSqlSafe(begin)).await.unwrap();
        assert_eq!(receive(&mut tx2, LEDGER, id, fp).await.unwrap(), Receipt::Duplicate);
        tx2.commit().await.unwrap();
    }
    db.drop().await;
}
