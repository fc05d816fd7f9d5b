//! The SQLite inbox against real SQLite (files in the temp dir, WAL, several
//! connections): the inbox's suite (`idemcache_sql::inbox::testing`), then what is
//! SQLite's own: a fingerprint that is no blob and a missing table are typed errors, an
//! immediate second transaction fails at `BEGIN` after the busy timeout, a deferred
//! transaction's stale snapshot is InFlight (never New), a receive outside a
//! transaction is refused, and the pre-filter answers a known duplicate without a
//! transaction.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use idemcache::{Cache, Fingerprint};
use idemcache_sql::inbox::testing::{self, Boxed, Inbox};
use idemcache_sql::inbox::{InboxError, KnownMessages, Receipt};
use idemcache_sqlite::inbox::{self, ensure_schema, receive};
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
fn a_fingerprint_that_is_no_blob_and_a_missing_table_are_typed_errors() {
    let mut conn = memory();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let fp = Fingerprint::of(b"a");
    // SQLite lets any column hold any type.
    tx.execute("INSERT INTO idemcache_inbox VALUES ('ledger', 'text', 'not a blob', 0)", [])
        .unwrap();
    let e = receive(&tx, "ledger", "text", fp).unwrap_err();
    assert!(matches!(e, InboxError::Corrupt(_)), "{e:?}");
    assert!(e.to_string().contains("message \"text\""), "{e}");
    drop(tx);
    // A missing table is a database error that says so.
    let mut bare = Connection::open_in_memory().unwrap();
    let tx = bare.transaction().unwrap();
    let e = receive(&tx, "ledger", "m", fp).unwrap_err();
    assert!(matches!(e, InboxError::Database(_)), "{e:?}");
    assert!(e.to_string().contains("no such table: idemcache_inbox"), "{e}");
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

/// SQLite's own: a second delivery whose transaction is immediate waits at `BEGIN` for
/// the write lock and fails there after the busy timeout (a deferred one answers
/// InFlight, as the suite checks).
#[test]
fn an_immediate_second_transaction_fails_at_begin_after_the_busy_timeout() {
    let db = ledger("immediate");
    let mut first = db.open("wal", Duration::from_secs(5));
    let mut second = db.open("wal", Duration::from_millis(200));
    let tx1 = first.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    assert_eq!(receive(&tx1, "ledger", "m-1", Fingerprint::of(b"a")).unwrap(), Receipt::New);
    let started = Instant::now();
    let e = second.transaction_with_behavior(TransactionBehavior::Immediate).unwrap_err();
    assert_eq!(e.sqlite_error_code(), Some(idemcache_sqlite::rusqlite::ErrorCode::DatabaseBusy));
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(3), "waited {waited:?}, bound 3 × 200 ms");
}

/// The inbox's suite (`idemcache_sql::inbox::testing`) on SQLite: each transaction a
/// deferred one on a connection of its own, whose busy timeout (200 ms) bounds a second
/// delivery's wait.
struct Sqlite(TempDb);

impl Sqlite {
    fn connection(&self) -> Connection {
        self.0.open("wal", Duration::from_millis(200))
    }
}

fn micros(at: SystemTime) -> i64 {
    at.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_micros() as i64
}

impl Inbox for Sqlite {
    type Tx = Connection;

    fn engine(&self) -> &'static str {
        "SQLite"
    }

    fn begin(&self) -> Boxed<'_, Connection> {
        let db = self.connection();
        db.execute_batch("BEGIN").unwrap();
        Box::pin(async move { db })
    }

    fn receive<'a>(
        tx: &'a mut Connection,
        consumer: &'a str,
        id: &'a str,
        fp: Fingerprint,
    ) -> Boxed<'a, Result<Receipt, InboxError>> {
        Box::pin(async move { inbox::receive(tx, consumer, id, fp) })
    }

    fn credit<'a>(tx: &'a mut Connection, account: &'a str, amount: i64) -> Boxed<'a, ()> {
        let sql = "INSERT INTO entries (account, amount) VALUES (?1, ?2)";
        tx.execute(sql, params![account, amount]).unwrap();
        Box::pin(async {})
    }

    fn commit(tx: Connection) -> Boxed<'static, ()> {
        tx.execute_batch("COMMIT").unwrap();
        Box::pin(async {})
    }

    fn rollback(tx: Connection) -> Boxed<'static, ()> {
        tx.execute_batch("ROLLBACK").unwrap();
        Box::pin(async {})
    }

    fn records(&self, consumer: &str) -> Boxed<'_, i64> {
        let sql = "SELECT count(*) FROM idemcache_inbox WHERE consumer = ?1";
        let n = self.connection().query_row(sql, [consumer], |r| r.get(0)).unwrap();
        Box::pin(async move { n })
    }

    fn balance(&self, account: &str) -> Boxed<'_, i64> {
        let sql = "SELECT coalesce(sum(amount), 0) FROM entries WHERE account = ?1";
        let n = self.connection().query_row(sql, [account], |r| r.get(0)).unwrap();
        Box::pin(async move { n })
    }

    fn store_unreadable<'a>(&'a self, consumer: &'a str, id: &'a str) -> Boxed<'a, ()> {
        let sql = "INSERT INTO idemcache_inbox VALUES (?1, ?2, X'010203', 0)";
        self.connection().execute(sql, [consumer, id]).unwrap();
        Box::pin(async {})
    }

    fn received<'a>(&'a self, consumer: &'a str, id: &'a str, at: SystemTime) -> Boxed<'a, ()> {
        let sql = "UPDATE idemcache_inbox SET received_at = ?1 \
                   WHERE consumer = ?2 AND message_id = ?3";
        self.connection().execute(sql, params![micros(at), consumer, id]).unwrap();
        Box::pin(async {})
    }

    fn purge(&self, cutoff: SystemTime, limit: usize) -> Boxed<'_, Result<usize, InboxError>> {
        let purged = inbox::purge(&self.connection(), cutoff, limit);
        Box::pin(async move { purged })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_holds_on_sqlite() {
    let db = TempDb::new("inbox-suite", "suite");
    let conn = db.open("wal", Duration::from_millis(200));
    inbox::ensure_schema(&conn).unwrap();
    let ddl = "CREATE TABLE entries (account TEXT NOT NULL, amount INTEGER NOT NULL)";
    conn.execute(ddl, []).unwrap();
    testing::run(Arc::new(Sqlite(db))).await;
}

#[test]
fn a_receive_outside_a_transaction_is_refused_and_records_nothing() {
    let conn = Connection::open_in_memory().unwrap();
    inbox::ensure_schema(&conn).unwrap();
    let e = inbox::receive(&conn, "ledger", "m-1", Fingerprint::of(b"a")).unwrap_err();
    assert!(matches!(e, InboxError::InvalidInput(_)), "{e:?}");
    let rows: i64 =
        conn.query_row("SELECT count(*) FROM idemcache_inbox", [], |r| r.get(0)).unwrap();
    assert_eq!(rows, 0);
}
