//! The PostgreSQL inbox against a real server (`IDEMCACHE_POSTGRES_URL`; skipped with a
//! printed reason when unset): New / Duplicate / Mismatch, a rollback leaves nothing,
//! consumers are apart, a second delivery of an uncommitted message is InFlight at once
//! (the advisory lock) and its transaction stays usable, READ COMMITTED sees a record
//! committed mid-transaction, REPEATABLE READ and SERIALIZABLE answer InFlight for one
//! committed after their snapshot, concurrent deliveries apply a message once, purges
//! go in bounded batches. Each test works in a schema of its own, dropped at its end.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use idemcache::store::conformance::service_url;
use idemcache::Fingerprint;
use idemcache_postgres::inbox::{
    self, ensure_schema, purge, receive, InboxError, Purger, Receipt, Retention,
};
use idemcache_postgres::tokio_postgres::{self, Client, GenericClient, IsolationLevel, NoTls};

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

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn new_duplicate_mismatch_rollback_and_consumers_apart() {
    let Some(db) = Db::new("basic").await else { return };
    let mut c = db.client().await;
    ensure_schema(&c).await.unwrap(); // idempotent
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
    assert_eq!(rows(&c).await, 5);

    // A rollback leaves neither the record nor the change.
    {
        let tx = c.transaction().await.unwrap();
        assert_eq!(receive(&tx, LEDGER, "m-2", a).await.unwrap(), Receipt::New);
        // Twice in the claiming transaction: its own record.
        assert_eq!(receive(&tx, LEDGER, "m-2", a).await.unwrap(), Receipt::Duplicate);
        tx.execute("UPDATE accounts SET balance = balance + 5", &[]).await.unwrap();
        tx.rollback().await.unwrap();
    }
    assert_eq!((rows(&c).await, balance(&c).await), (5, 0));
    assert_eq!(once(&mut c, LEDGER, "m-2", a).await, Receipt::New);

    // Refused input, an unreadable row, a missing table: typed errors.
    let tx = c.transaction().await.unwrap();
    for (consumer, id) in [("", "m"), ("c", ""), ("c", "m\0")] {
        let e = receive(&tx, consumer, id, a).await.unwrap_err();
        assert!(matches!(e, InboxError::InvalidInput(_)), "{e:?}");
    }
    tx.execute("INSERT INTO idemcache_inbox VALUES ('idemcache-inbox-test-ledger', 'short', '\\x010203', 0)", &[])
        .await
        .unwrap();
    let e = receive(&tx, LEDGER, "short", a).await.unwrap_err();
    assert!(matches!(e, InboxError::Corrupt(_)) && e.to_string().contains("3 bytes"), "{e}");
    tx.rollback().await.unwrap();
    let mut bare = db.raw().await;
    bare.batch_execute("SET search_path TO pg_catalog").await.unwrap();
    let tx = bare.transaction().await.unwrap();
    let e = receive(&tx, LEDGER, "m", a).await.unwrap_err();
    assert!(matches!(e, InboxError::Database(_)), "{e:?}");
    assert!(e.to_string().contains("idemcache_inbox\" does not exist"), "{e}");
    drop(tx);
    db.drop().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_second_delivery_of_an_uncommitted_message_is_in_flight_at_once() {
    let Some(db) = Db::new("inflight").await else { return };
    let fp = Fingerprint::of(b"a");
    for (id, first_commits) in [("m-commit", true), ("m-rollback", false)] {
        let mut first = db.client().await;
        let mut second = db.client().await;
        let tx1 = first.transaction().await.unwrap();
        assert_eq!(receive(&tx1, LEDGER, id, fp).await.unwrap(), Receipt::New);

        let tx2 = second.transaction().await.unwrap();
        let started = Instant::now();
        // A timeout, so that a receive that waits fails the test instead of hanging it.
        let second_delivery = receive(&tx2, LEDGER, id, fp);
        let receipt = tokio::time::timeout(Duration::from_secs(10), second_delivery).await;
        assert_eq!(receipt.expect("the second delivery waited").unwrap(), Receipt::InFlight);
        let waited = started.elapsed();
        assert!(waited < Duration::from_secs(2), "waited {waited:?} for the first transaction");
        // Its transaction is still usable: another message is claimed in it.
        assert_eq!(receive(&tx2, LEDGER, &format!("{id}-other"), fp).await.unwrap(), Receipt::New);
        tx2.rollback().await.unwrap();

        if first_commits {
            tx1.commit().await.unwrap();
            assert_eq!(once(&mut second, LEDGER, id, fp).await, Receipt::Duplicate);
        } else {
            tx1.rollback().await.unwrap();
            assert_eq!(once(&mut second, LEDGER, id, fp).await, Receipt::New);
        }
    }
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
async fn concurrent_deliveries_of_one_message_apply_it_once() {
    let Some(db) = Db::new("concurrent").await else { return };
    let fp = Fingerprint::of(b"5");
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut c = db.client().await;
        tasks.push(tokio::spawn(async move {
            let mut receipts = Vec::new();
            for _ in 0..10 {
                let tx = c.transaction().await.unwrap();
                let receipt = receive(&tx, LEDGER, "m-concurrent", fp).await.unwrap();
                receipts.push(receipt);
                match receipt {
                    Receipt::New => {
                        tx.execute("UPDATE accounts SET balance = balance + 5", &[]).await.unwrap();
                        tx.commit().await.unwrap();
                    }
                    _ => tx.rollback().await.unwrap(),
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
    assert!(all.iter().all(|r| matches!(r, Receipt::New | Receipt::Duplicate | Receipt::InFlight)));
    let c = db.client().await;
    assert_eq!(balance(&c).await, 5);
    db.drop().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn purge_in_bounded_batches_and_never_within_a_horizon_of_a_start() {
    let Some(db) = Db::new("purge").await else { return };
    let mut c = db.client().await;
    let fp = Fingerprint::of(b"a");
    let hour = Duration::from_secs(3600);
    let crash = SystemTime::UNIX_EPOCH + 100_000 * hour;
    let us = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_micros() as i64;
    for i in 0..5 {
        let id = format!("old-{i}");
        assert_eq!(once(&mut c, LEDGER, &id, fp).await, Receipt::New);
        let at = us(crash) + i;
        c.execute("UPDATE idemcache_inbox SET received_at = $1 WHERE message_id = $2", &[&at, &id])
            .await
            .unwrap();
    }
    assert_eq!(once(&mut c, LEDGER, "recent", fp).await, Receipt::New);
    let recent = us(crash + 240 * hour);
    c.execute(
        "UPDATE idemcache_inbox SET received_at = $1 WHERE message_id = 'recent'",
        &[&recent],
    )
    .await
    .unwrap();

    // Ten days down, then a restart: the first purge may delete nothing.
    let restart = crash + 240 * hour;
    let purger = Purger::new(Retention::new(24 * hour, hour).unwrap(), restart);
    assert_eq!(purger.cutoff(restart + Duration::from_secs(1)), None);
    assert_eq!(once(&mut c, LEDGER, "old-0", fp).await, Receipt::Duplicate, "redelivered in time");
    let cutoff = purger.cutoff(restart + hour).unwrap();
    assert_eq!(purge(&c, cutoff, 0).await.unwrap(), 0);
    assert_eq!(purge(&c, cutoff, 2).await.unwrap(), 2);
    // Oldest first.
    assert_eq!(once(&mut c, LEDGER, "old-2", fp).await, Receipt::Duplicate);
    assert_eq!(purge(&c, cutoff, 2).await.unwrap(), 2);
    assert_eq!(purge(&c, cutoff, 2).await.unwrap(), 1);
    assert_eq!(purge(&c, cutoff, 2).await.unwrap(), 0);
    assert_eq!(rows(&c).await, 1);
    assert_eq!(once(&mut c, LEDGER, "recent", fp).await, Receipt::Duplicate);
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
