//! The sqlx PostgreSQL inbox against a real server (`IDEMCACHE_POSTGRES_URL`; skipped
//! with a printed reason when unset): New / Duplicate / Mismatch, a rollback leaves
//! nothing, a second delivery of an uncommitted message is InFlight at once and its
//! transaction stays usable, READ COMMITTED sees a record committed mid-transaction,
//! REPEATABLE READ and SERIALIZABLE answer InFlight (transaction aborted) for one
//! committed after their snapshot, concurrent deliveries apply once, purges go in
//! bounded batches. Each test works in a schema of its own, dropped at its end.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use idemcache::store::conformance::service_url;
use idemcache::Fingerprint;
use idemcache_sqlx::inbox::postgres::{ensure_schema, lock_key, purge, receive};
use idemcache_sqlx::inbox::{InboxError, Purger, Receipt, Retention};
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
async fn new_duplicate_mismatch_rollback_and_consumers_apart() {
    let Some(db) = Db::new("basic").await else { return };
    let mut c = db.conn().await;
    ensure_schema(&mut c).await.unwrap(); // idempotent
    let (a, b) = (Fingerprint::of(b"a"), Fingerprint::of(b"b"));
    assert_eq!(once(&mut c, LEDGER, "m-1", a).await, Receipt::New);
    assert_eq!(once(&mut c, LEDGER, "m-1", a).await, Receipt::Duplicate);
    assert_eq!(once(&mut c, LEDGER, "m-1", b).await, Receipt::Mismatch);
    for (consumer, id) in [
        ("idemcache-inbox-test-audit", "m-1"),
        ("Idemcache-inbox-test-ledger", "m-1"),
        (LEDGER, "M-1"),
        (LEDGER, "m-1 "),
    ] {
        assert_eq!(once(&mut c, consumer, id, a).await, Receipt::New, "{consumer:?} {id:?}");
    }
    assert_eq!(count(&mut c, "SELECT count(*) FROM idemcache_inbox").await, 5);
    {
        let mut tx = c.begin().await.unwrap();
        assert_eq!(receive(&mut tx, LEDGER, "m-2", a).await.unwrap(), Receipt::New);
        assert_eq!(receive(&mut tx, LEDGER, "m-2", a).await.unwrap(), Receipt::Duplicate);
        sqlx::query("UPDATE accounts SET balance = balance + 5").execute(&mut *tx).await.unwrap();
        tx.rollback().await.unwrap();
    }
    assert_eq!(count(&mut c, "SELECT count(*) FROM idemcache_inbox").await, 5);
    assert_eq!(count(&mut c, "SELECT balance FROM accounts").await, 0);
    assert_eq!(once(&mut c, LEDGER, "m-2", a).await, Receipt::New);

    let mut tx = c.begin().await.unwrap();
    for (consumer, id) in [("", "m"), ("c", ""), ("c", "m\0")] {
        let e = receive(&mut tx, consumer, id, a).await.unwrap_err();
        assert!(matches!(e, InboxError::InvalidInput(_)), "{e:?}");
    }
    sqlx::query("INSERT INTO idemcache_inbox VALUES ('idemcache-inbox-test-ledger', 'short', '\\x010203', 0)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let e = receive(&mut tx, LEDGER, "short", a).await.unwrap_err();
    assert!(matches!(e, InboxError::Corrupt(_)) && e.to_string().contains("3 bytes"), "{e}");
    tx.rollback().await.unwrap();
    db.drop().await;
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

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn concurrent_deliveries_of_one_message_apply_it_once() {
    let Some(db) = Db::new("concurrent").await else { return };
    let fp = Fingerprint::of(b"5");
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let mut c = db.conn().await;
        tasks.push(tokio::spawn(async move {
            let mut receipts = Vec::new();
            for _ in 0..10 {
                let mut tx = c.begin().await.unwrap();
                let receipt = receive(&mut tx, LEDGER, "m-concurrent", fp).await.unwrap();
                receipts.push(receipt);
                if receipt == Receipt::New {
                    sqlx::query("UPDATE accounts SET balance = balance + 5")
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                } else {
                    tx.rollback().await.unwrap();
                }
            }
            receipts
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    assert_eq!(all.iter().filter(|r| **r == Receipt::New).count(), 1, "{all:?}");
    let mut c = db.conn().await;
    assert_eq!(count(&mut c, "SELECT balance FROM accounts").await, 5);
    db.drop().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn purge_in_bounded_batches_and_never_within_a_horizon_of_a_start() {
    let Some(db) = Db::new("purge").await else { return };
    let mut c = db.conn().await;
    let fp = Fingerprint::of(b"a");
    let hour = Duration::from_secs(3600);
    let crash = SystemTime::UNIX_EPOCH + 100_000 * hour;
    let us = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_micros() as i64;
    for i in 0..5 {
        let id = format!("old-{i}");
        assert_eq!(once(&mut c, LEDGER, &id, fp).await, Receipt::New);
        sqlx::query("UPDATE idemcache_inbox SET received_at = $1 WHERE message_id = $2")
            .bind(us(crash) + i)
            .bind(&id)
            .execute(&mut c)
            .await
            .unwrap();
    }
    assert_eq!(once(&mut c, LEDGER, "recent", fp).await, Receipt::New);
    let restart = crash + 240 * hour;
    let purger = Purger::new(Retention::new(24 * hour, hour).unwrap(), restart);
    assert_eq!(purger.cutoff(restart + Duration::from_secs(1)), None);
    assert_eq!(once(&mut c, LEDGER, "old-0", fp).await, Receipt::Duplicate);
    let cutoff = purger.cutoff(restart + hour).unwrap();
    assert_eq!(purge(&mut c, cutoff, 0).await.unwrap(), 0);
    assert_eq!(purge(&mut c, cutoff, 2).await.unwrap(), 2);
    assert_eq!(once(&mut c, LEDGER, "old-2", fp).await, Receipt::Duplicate, "oldest first");
    assert_eq!(purge(&mut c, cutoff, 2).await.unwrap(), 2);
    assert_eq!(purge(&mut c, cutoff, 2).await.unwrap(), 1);
    assert_eq!(purge(&mut c, cutoff, 2).await.unwrap(), 0);
    assert_eq!(count(&mut c, "SELECT count(*) FROM idemcache_inbox").await, 1);
    db.drop().await;
}
