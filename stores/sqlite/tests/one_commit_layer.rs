//! The one-commit mode's suite (`idemcache_sql::one_commit::testing`) on SQLite: the
//! layer's transaction is a `SqliteTransaction`, a connection of its own to the store's
//! file; and its kill test, a process killed with SIGKILL between its claim and its
//! commit. Needs no service: a database file of the test's own.

mod common;

use idemcache_sql::one_commit::testing::{self, Boxed, Orders, Tx};
use idemcache_sqlite::rusqlite::{params, Connection, OptionalExtension};
use idemcache_sqlite::SqliteStore;

use common::TempDb;

struct Sqlite {
    url: String,
    store: SqliteStore,
}

impl Sqlite {
    /// The fixture over the database file of `url`, its schema and orders table made.
    async fn new(url: String) -> Sqlite {
        use idemcache::store::Store;
        let store = SqliteStore::connect(&url).await.unwrap();
        store.ensure_schema().await.unwrap();
        let engine = Sqlite { url, store };
        let ddl = "CREATE TABLE IF NOT EXISTS orders (key TEXT NOT NULL, item TEXT NOT NULL)";
        engine.connection().execute(ddl, []).unwrap();
        engine
    }

    fn connection(&self) -> Connection {
        Connection::open(self.url.trim_start_matches("sqlite:")).unwrap()
    }
}

impl Orders for Sqlite {
    type Store = SqliteStore;

    fn engine(&self) -> &'static str {
        "SQLite"
    }

    fn store(&self) -> SqliteStore {
        self.store.clone()
    }

    fn write<'a>(tx: &'a mut Tx<Self>, key: String, item: String) -> Boxed<'a, ()> {
        Box::pin(async move {
            let sql = "INSERT INTO orders (key, item) VALUES (?1, ?2)";
            tx.run(move |db| db.execute(sql, params![key, item])).await.unwrap().unwrap();
        })
    }

    fn lease_ended<'a>(tx: &'a mut Tx<Self>, key: Vec<u8>) -> Boxed<'a, bool> {
        Box::pin(async move {
            let sql = "SELECT expires_at <= CAST(unixepoch('subsec') * 1000000 AS INTEGER) \
                       FROM idemcache_records WHERE key = ?1";
            tx.run(move |db| db.query_row(sql, [key], |r| r.get(0))).await.unwrap().unwrap()
        })
    }

    fn committed(&self, key: &str) -> Boxed<'_, (i64, i64)> {
        let db = self.connection();
        let key = key.to_owned();
        Box::pin(async move {
            let count = |sql: &str| db.query_row(sql, [&key], |r| r.get(0)).unwrap();
            let orders = count("SELECT count(*) FROM orders WHERE key = ?1");
            let records = count("SELECT count(*) FROM idemcache_records WHERE instr(key, ?1) > 0");
            (orders, records)
        })
    }

    fn correlation_id(&self, key: &str) -> Boxed<'_, Option<String>> {
        let db = self.connection();
        let key = key.to_owned();
        Box::pin(async move {
            let sql = "SELECT correlation_id FROM idemcache_records WHERE instr(key, ?1) > 0";
            db.query_row(sql, [&key], |r| r.get(0)).optional().unwrap().flatten()
        })
    }

    fn claims_waiting(&self) -> Boxed<'_, Option<i64>> {
        Box::pin(async { None })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_commit_mode_holds_on_sqlite() {
    let db = TempDb::new("one-commit-layer", "suite");
    testing::run(&Sqlite::new(db.url()).await).await;
}

#[tokio::test]
async fn a_store_without_a_file_refuses_one_commit_mode_by_name() {
    use idemcache::store::{StoreError, TransactionalStore};
    let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
    match TransactionalStore::begin(&store).await {
        Err(StoreError::InvalidInput(why)) => assert!(why.contains(":memory:"), "{why}"),
        other => panic!("expected InvalidInput, got {:?}", other.map(drop)),
    }
}

/// A wait longer than SQLite's busy timeout can count (an `int` of milliseconds) is as
/// long as it can wait: the claim acquires, never a panic of the transaction's thread.
#[tokio::test]
async fn a_wait_past_sqlites_longest_busy_timeout_still_claims() {
    use idemcache::store::{Store, StoreClaim, TransactionalStore};
    use idemcache::{Fingerprint, Key};
    use std::time::Duration;
    let db = TempDb::new("one-commit-layer", "long-wait");
    let store = SqliteStore::connect(&db.url()).await.unwrap();
    store.ensure_schema().await.unwrap();
    let key = Key::without_tenant("POST /orders", "long-wait").unwrap();
    for wait in [Duration::from_secs(30 * 86_400), Duration::MAX] {
        let mut tx = TransactionalStore::begin(&store).await.unwrap();
        let lease = Duration::from_secs(30);
        let fp = Fingerprint::of(b"o");
        let claimed = TransactionalStore::claim_in(&store, &mut tx, &key, fp, lease, wait, None);
        let claimed = claimed.await;
        assert!(matches!(claimed, Ok(StoreClaim::Acquired { .. })), "{wait:?}: {claimed:?}");
        TransactionalStore::rollback(&store, tx).await.unwrap();
    }
}

/// The kill test's child: the database file's URL.
const CHILD_DB: &str = "IDEMCACHE_ONE_COMMIT_CHILD_DB";

/// The kill test's child (`testing::claim_and_wait_to_be_killed`); a no-op run on its
/// own.
#[tokio::test]
async fn child_claims_and_waits_to_be_killed() {
    let Ok(url) = std::env::var(CHILD_DB) else { return };
    testing::claim_and_wait_to_be_killed(&Sqlite::new(url).await, "killed").await
}

#[tokio::test]
async fn a_process_killed_between_claim_and_commit_leaves_nothing() {
    let db = TempDb::new("one-commit-layer", "killed");
    let engine = Sqlite::new(db.url()).await;
    let env = [(CHILD_DB, engine.url.as_str())];
    idemcache::store::conformance::kill_child_at(
        "child_claims_and_waits_to_be_killed",
        &env,
        "claimed",
    );
    testing::after_a_kill_between_claim_and_commit(&engine, "killed").await;
}
