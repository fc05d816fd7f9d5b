//! The SQLite inbox against real SQLite (files in the temp dir, WAL, several
//! connections): New / Duplicate / Mismatch, a rollback leaves nothing, consumers are
//! apart, a second delivery of an uncommitted message answers InFlight within the busy
//! timeout, a deferred transaction's stale snapshot is InFlight (never New), purges go
//! in bounded batches and never within a horizon of a start, and the pre-filter answers
//! a known duplicate without a transaction.

use std::time::{Duration, Instant, SystemTime};

use idemcache::{Cache, Fingerprint};
use idemcache_sql::inbox::{InboxError, KnownMessages, Purger, Receipt, Retention};
use idemcache_sqlite::inbox::{self, ensure_schema, purge, receive};
use idemcache_sqlite::rusqlite::{params, Connection, TransactionBehavior};

mod common;
use common::TempDb;

/// A fresh database file of its own in WAL mode, with the inbox and an account, for
/// tests that need two connections.
fn ledger(name: &str) -> TempDb {
    let db = TempDb::new("inbox", name);
    let conn = db.open("wal", Duration::from_millis(100));
    ensure_schema(&conn).unwrap();
    conn.execute_batch(
        "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
         INSERT INTO accounts VALUES ('a1', 0);",
    )
    .unwrap();
    db
}

fn memory() -> Connection {
    let conn = Connection::open_in_memory().unwrap();
    ensure_schema(&conn).unwrap();
    conn
}

fn rows(conn: &Connection) -> i64 {
    conn.query_row("SELECT count(*) FROM idemcache_inbox", [], |r| r.get(0)).unwrap()
}

fn balance(conn: &Connection) -> i64 {
    conn.query_row("SELECT balance FROM accounts WHERE id = 'a1'", [], |r| r.get(0)).unwrap()
}

/// One delivery, applied in its own immediate transaction as a consumer would.
fn once(conn: &mut Connection, consumer: &str, id: &str, fp: Fingerprint) -> Receipt {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let receipt = receive(&tx, consumer, id, fp).unwrap();
    if receipt == Receipt::New {
        tx.commit().unwrap();
    }
    receipt
}

#[test]
fn new_then_duplicate_then_mismatch() {
    let mut conn = memory();
    ensure_schema(&conn).unwrap(); // idempotent
    let (a, b) = (Fingerprint::of(b"a"), Fingerprint::of(b"b"));
    assert_eq!(once(&mut conn, "ledger", "m-1", a), Receipt::New);
    assert_eq!(once(&mut conn, "ledger", "m-1", a), Receipt::Duplicate);
    assert_eq!(once(&mut conn, "ledger", "m-1", b), Receipt::Mismatch);
    assert_eq!(rows(&conn), 1);
    let stored: Vec<u8> =
        conn.query_row("SELECT fingerprint FROM idemcache_inbox", [], |r| r.get(0)).unwrap();
    assert_eq!(stored, a.to_bytes(), "the first fingerprint is kept, never overwritten");
}

#[test]
fn a_second_receive_in_the_claiming_transaction_is_a_duplicate() {
    let mut conn = memory();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let fp = Fingerprint::of(b"a");
    assert_eq!(receive(&tx, "ledger", "m-1", fp).unwrap(), Receipt::New);
    assert_eq!(receive(&tx, "ledger", "m-1", fp).unwrap(), Receipt::Duplicate);
    assert_eq!(receive(&tx, "ledger", "m-1", Fingerprint::of(b"b")).unwrap(), Receipt::Mismatch);
}

#[test]
fn a_rollback_leaves_neither_the_record_nor_the_change() {
    let db = ledger("rollback");
    let mut conn = db.open("wal", Duration::from_secs(1));
    let fp = Fingerprint::of(b"a");
    {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
        assert_eq!(receive(&tx, "ledger", "m-1", fp).unwrap(), Receipt::New);
        tx.execute("UPDATE accounts SET balance = balance + 5", []).unwrap();
        tx.rollback().unwrap();
    }
    {
        // Dropped without commit: rusqlite rolls back.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
        assert_eq!(receive(&tx, "ledger", "m-1", fp).unwrap(), Receipt::New);
    }
    assert_eq!((rows(&conn), balance(&conn)), (0, 0));
    assert_eq!(once(&mut conn, "ledger", "m-1", fp), Receipt::New, "the redelivery applies it");
}

#[test]
fn consumers_and_ids_are_apart_byte_for_byte() {
    let mut conn = memory();
    let fp = Fingerprint::of(b"a");
    for (consumer, id) in [
        ("ledger", "m-1"),
        ("audit", "m-1"),
        ("Ledger", "m-1"),
        ("ledger", "M-1"),
        ("ledger", "m-1 "),
        ("ledger", "ünï"),
    ] {
        assert_eq!(once(&mut conn, consumer, id, fp), Receipt::New, "{consumer:?} {id:?}");
    }
    assert_eq!(once(&mut conn, "audit", "m-1", fp), Receipt::Duplicate);
    assert_eq!(rows(&conn), 6);
}

#[test]
fn refused_input_and_unreadable_rows_are_typed_errors() {
    let mut conn = memory();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let fp = Fingerprint::of(b"a");
    for (consumer, id) in [("", "m"), ("c", ""), ("c", "m\0")] {
        let e = receive(&tx, consumer, id, fp).unwrap_err();
        assert!(matches!(e, InboxError::InvalidInput(_)), "{e:?}");
    }
    tx.execute(
        "INSERT INTO idemcache_inbox VALUES ('ledger', 'short', x'010203', 0),
                                            ('ledger', 'text', 'not a blob', 0)",
        [],
    )
    .unwrap();
    for id in ["short", "text"] {
        let e = receive(&tx, "ledger", id, fp).unwrap_err();
        assert!(matches!(e, InboxError::Corrupt(_)), "{e:?}");
        assert!(e.to_string().contains(&format!("message {id:?}")), "{e}");
    }
    drop(tx);
    // A missing table is a database error that says so.
    let mut bare = Connection::open_in_memory().unwrap();
    let tx = bare.transaction().unwrap();
    let e = receive(&tx, "ledger", "m", fp).unwrap_err();
    assert!(matches!(e, InboxError::Database(_)), "{e:?}");
    assert!(e.to_string().contains("no such table: idemcache_inbox"), "{e}");
}

#[test]
fn a_second_delivery_of_an_uncommitted_message_is_in_flight_within_the_busy_timeout() {
    for first_commits in [true, false] {
        let db = ledger("inflight");
        let mut first = db.open("wal", Duration::from_secs(5));
        let mut second = db.open("wal", Duration::from_millis(200));
        let fp = Fingerprint::of(b"a");
        let tx1 = first.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
        assert_eq!(receive(&tx1, "ledger", "m-1", fp).unwrap(), Receipt::New);

        // A deferred second transaction: its INSERT waits the busy timeout, then InFlight.
        let started = Instant::now();
        {
            let tx2 = second.transaction().unwrap();
            assert_eq!(receive(&tx2, "ledger", "m-1", fp).unwrap(), Receipt::InFlight);
            assert_eq!(receive(&tx2, "ledger", "m-2", fp).unwrap(), Receipt::InFlight);
            tx2.rollback().unwrap();
        }
        // An immediate one waits at BEGIN and fails there, after the same bound.
        let e = second.transaction_with_behavior(TransactionBehavior::Immediate).unwrap_err();
        assert_eq!(
            e.sqlite_error_code(),
            Some(idemcache_sqlite::rusqlite::ErrorCode::DatabaseBusy)
        );
        let waited = started.elapsed();
        assert!(waited < Duration::from_secs(3), "waited {waited:?}, bound 3 × 200 ms");

        if first_commits {
            tx1.commit().unwrap();
            assert_eq!(once(&mut second, "ledger", "m-1", fp), Receipt::Duplicate);
        } else {
            tx1.rollback().unwrap();
            assert_eq!(once(&mut second, "ledger", "m-1", fp), Receipt::New);
        }
    }
}

#[test]
fn a_deferred_transactions_stale_snapshot_is_in_flight_never_new() {
    let db = ledger("snapshot");
    let mut first = db.open("wal", Duration::from_secs(1));
    let mut second = db.open("wal", Duration::from_secs(1));
    let fp = Fingerprint::of(b"a");
    let tx2 = second.transaction().unwrap();
    // The read opens tx2's snapshot: before the first consumer's commit.
    assert_eq!(balance(&tx2), 0);
    assert_eq!(once(&mut first, "ledger", "m-1", fp), Receipt::New);
    // tx2 cannot see the record; it must not claim the message either (SQLITE_BUSY_SNAPSHOT).
    assert_eq!(receive(&tx2, "ledger", "m-1", fp).unwrap(), Receipt::InFlight);
    tx2.rollback().unwrap();
    assert_eq!(once(&mut second, "ledger", "m-1", fp), Receipt::Duplicate);
}

/// Sets every record's `received_at` to `at` (the test's own clock stands in for
/// SQLite's).
fn received_at(conn: &Connection, id: &str, at: SystemTime) {
    let us = at.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_micros() as i64;
    conn.execute(
        "UPDATE idemcache_inbox SET received_at = ?1 WHERE message_id = ?2",
        params![us, id],
    )
    .unwrap();
}

#[test]
fn purge_deletes_only_older_records_in_bounded_batches() {
    let mut conn = memory();
    let fp = Fingerprint::of(b"a");
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    for i in 0..5 {
        assert_eq!(once(&mut conn, "ledger", &format!("old-{i}"), fp), Receipt::New);
        received_at(&conn, &format!("old-{i}"), t0 + Duration::from_secs(i));
    }
    assert_eq!(once(&mut conn, "ledger", "new", fp), Receipt::New);
    received_at(&conn, "new", t0 + Duration::from_secs(100));
    let cutoff = t0 + Duration::from_secs(100);
    assert_eq!(purge(&conn, cutoff, 0).unwrap(), 0);
    assert_eq!(purge(&conn, cutoff, 2).unwrap(), 2);
    // Oldest first: old-0 and old-1 are gone, old-2 still answers Duplicate.
    assert_eq!(once(&mut conn, "ledger", "old-2", fp), Receipt::Duplicate);
    assert_eq!(purge(&conn, cutoff, 2).unwrap(), 2);
    assert_eq!(purge(&conn, cutoff, 2).unwrap(), 1);
    assert_eq!(purge(&conn, cutoff, 2).unwrap(), 0);
    assert_eq!(rows(&conn), 1, "the record at the cutoff is kept");
    assert_eq!(once(&mut conn, "ledger", "new", fp), Receipt::Duplicate);
}

#[test]
fn after_a_long_downtime_nothing_is_purged_until_redeliveries_had_their_horizon() {
    let mut conn = memory();
    let fp = Fingerprint::of(b"a");
    let hour = Duration::from_secs(3600);
    let retention = Retention::new(24 * hour, hour).unwrap();
    // Committed, not acknowledged, then the consumer was down for ten days.
    let crash = SystemTime::UNIX_EPOCH + 100_000 * hour;
    assert_eq!(once(&mut conn, "ledger", "pending", fp), Receipt::New);
    received_at(&conn, "pending", crash);
    let restart = crash + 240 * hour;
    let purger = Purger::new(retention, restart);

    // The first purge after the restart: nothing may go.
    let now = restart + Duration::from_secs(1);
    assert_eq!(purger.cutoff(now), None);
    // The broker redelivers within the horizon: the record is still there.
    assert_eq!(once(&mut conn, "ledger", "pending", fp), Receipt::Duplicate);
    // A horizon after the restart, the window applies and the old record goes.
    let cutoff = purger.cutoff(restart + hour).unwrap();
    assert_eq!(purge(&conn, cutoff, 100).unwrap(), 1);
    assert_eq!(rows(&conn), 0);
}

/// A consumer as the pre-filter is meant to be used, counting the transactions it opens.
struct Consumer<'a> {
    conn: &'a mut Connection,
    known: KnownMessages,
    name: &'static str,
    transactions: u32,
}

impl Consumer<'_> {
    fn deliver(&mut self, id: &str, amount: i64) -> Receipt {
        let fp = Fingerprint::of(&amount.to_be_bytes());
        if let Some(receipt) = self.known.check(self.name, id, fp) {
            assert_ne!(receipt, Receipt::New, "the pre-filter never answers New");
            return receipt;
        }
        self.transactions += 1;
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
        let receipt = receive(&tx, self.name, id, fp).unwrap();
        if receipt == Receipt::New {
            tx.execute("UPDATE accounts SET balance = balance + ?1", [amount]).unwrap();
            tx.commit().unwrap();
        }
        if matches!(receipt, Receipt::New | Receipt::Duplicate) {
            self.known.committed(self.name, id, fp);
        }
        receipt
    }
}

#[test]
fn the_pre_filter_answers_a_known_duplicate_without_a_transaction_and_never_new() {
    let db = ledger("prefilter");
    let mut conn = db.open("wal", Duration::from_secs(1));
    let known = KnownMessages::new(Cache::builder().build().unwrap());
    let mut ledger =
        Consumer { conn: &mut conn, known: known.clone(), name: "ledger", transactions: 0 };
    assert_eq!(ledger.deliver("m-1", 5), Receipt::New);
    assert_eq!(ledger.transactions, 1);
    for _ in 0..10 {
        assert_eq!(ledger.deliver("m-1", 5), Receipt::Duplicate);
        assert_eq!(ledger.deliver("m-1", 7), Receipt::Mismatch);
    }
    assert_eq!(ledger.transactions, 1, "known duplicates open no transaction");
    assert_eq!(ledger.deliver("m-2", 1), Receipt::New);
    assert_eq!(ledger.transactions, 2);

    // After a restart (an empty cache) the database decides, and the cache learns.
    let restarted = KnownMessages::new(Cache::builder().build().unwrap());
    let mut ledger =
        Consumer { conn: &mut conn, known: restarted, name: "ledger", transactions: 0 };
    assert_eq!(ledger.deliver("m-1", 5), Receipt::Duplicate);
    assert_eq!(ledger.deliver("m-1", 5), Receipt::Duplicate);
    assert_eq!(ledger.transactions, 1);
    // Another consumer of the same message is not answered by the ledger's fact.
    let mut audit = Consumer { conn: &mut conn, known, name: "audit", transactions: 0 };
    assert_eq!(audit.deliver("m-1", 5), Receipt::New);
    assert_eq!(audit.transactions, 1);
    let second = db.open("wal", Duration::from_secs(1));
    assert_eq!(balance(&second), 5 + 1 + 5);
    // The module re-exports the vocabulary.
    let _: Option<inbox::Receipt> = None;
}
