//! One commit per first execution over sqlx's PostgreSQL: `PgStore::claim_in`, the
//! business write and `PgStore::complete_in` in the caller's one transaction. Against a
//! real PostgreSQL (`IDEMCACHE_POSTGRES_URL`; skipped with a printed reason when unset).
//!
//! What is checked here is this API's own (the claims every engine shares, a kill
//! included, are `idemcache_sql::one_commit::testing`'s, run from `one_commit_layer.rs`):
//! the three commit together on your `sqlx` transaction, and a retry replays; a
//! duplicate waits on the record's row (seen waiting in `pg_stat_activity`) and replays
//! what the first committed; a `lock_timeout` bounds that wait with `InProgress`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idemcache::store::conformance::service_url;
use idemcache::store::{OpenClaim, Store, StoreClaim};
use idemcache::{Fingerprint, Key};
use idemcache_sqlx::PgStore;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool, Row};

const LEASE: Duration = Duration::from_secs(30);
const KEPT: Duration = Duration::from_secs(600);

struct Db {
    pool: PgPool,
    store: PgStore,
    orders: String,
}

impl Db {
    async fn new(name: &str) -> Option<Db> {
        static N: AtomicU32 = AtomicU32::new(0);
        let url = service_url("IDEMCACHE_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")?;
        let pool = PgPoolOptions::new().max_connections(8).connect(&url).await.unwrap();
        let store = PgStore::from_pool(pool.clone());
        store.ensure_schema().await.unwrap();
        let n = N.fetch_add(1, Ordering::Relaxed);
        let orders = format!("idemcache_sqlx_one_commit_{name}_{}_{n}", std::process::id());
        let create = format!("CREATE TABLE {orders} (key TEXT PRIMARY KEY)");
        sqlx::raw_sql(AssertSqlSafe(create)).execute(&pool).await.unwrap();
        Some(Db { pool, store, orders })
    }

    fn key(&self) -> Key {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
        Key::new("POST /orders", "sqlx-one-commit", format!("{}-{nanos}", self.orders)).unwrap()
    }

    async fn orders(&self) -> i64 {
        let sql = format!("SELECT count(*) FROM {}", self.orders);
        sqlx::query(AssertSqlSafe(sql)).fetch_one(&self.pool).await.unwrap().get(0)
    }

    /// Claims `key` in a new transaction; on `Acquired`, writes the order and the record
    /// and returns the open transaction for the caller to end.
    async fn execute(
        &self,
        key: &Key,
        body: &[u8],
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreClaim> {
        let mut tx = self.pool.begin().await.unwrap();
        match self.store.claim_in(&mut tx, key, Fingerprint::of(b"order"), LEASE).await.unwrap() {
            StoreClaim::Acquired { token, .. } => {
                let sql = format!("INSERT INTO {} VALUES ($1)", self.orders);
                let insert = sqlx::query(AssertSqlSafe(sql)).bind(key.client_key());
                insert.execute(&mut *tx).await.unwrap();
                let claim = OpenClaim::new(key.clone(), token, KEPT);
                PgStore::complete_in(&mut tx, &claim, Some(body)).await.unwrap();
                Ok(tx)
            }
            other => Err(other),
        }
    }

    async fn drop(self) {
        let sql = format!("DROP TABLE {}", self.orders);
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(&self.pool).await.unwrap();
    }
}

fn replayed(answer: &StoreClaim) -> Option<&[u8]> {
    match answer {
        StoreClaim::Completed(replay) => replay.body.as_deref(),
        _ => None,
    }
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn the_claim_the_order_and_the_record_commit_together() {
    let Some(db) = Db::new("together").await else { return };
    let key = db.key();
    let tx = db.execute(&key, b"201 sqlx").await.unwrap();
    assert!(db.store.record(&key).await.unwrap().is_none(), "invisible until the commit");
    tx.commit().await.unwrap();
    let retry = db.execute(&key, b"never").await.unwrap_err();
    assert_eq!(replayed(&retry), Some(&b"201 sqlx"[..]));
    assert_eq!(db.orders().await, 1);
    db.drop().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_duplicate_waits_on_the_row_replays_and_a_lock_timeout_bounds_it() {
    let Some(db) = Db::new("waits").await else { return };
    let key = db.key();
    let first = db.execute(&key, b"201 first").await.unwrap();

    // Bounded: the first stays open, so only the timeout ends the wait.
    let mut bounded = db.pool.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '100ms'").execute(&mut *bounded).await.unwrap();
    let answer = db.store.claim_in(&mut bounded, &key, Fingerprint::of(b"order"), LEASE).await;
    assert!(matches!(answer, Ok(StoreClaim::InProgress { .. })), "{answer:?}");
    bounded.rollback().await.unwrap();

    // Unbounded: waits on the row until the first commits, then replays it.
    let mut waiting = db.pool.acquire().await.unwrap();
    let pid: i32 =
        sqlx::query("SELECT pg_backend_pid()").fetch_one(&mut *waiting).await.unwrap().get(0);
    let (store, dup_key) = (db.store.clone(), key.clone());
    let duplicate = tokio::spawn(async move {
        let mut tx = sqlx::Acquire::begin(&mut *waiting).await.unwrap();
        let answer = store.claim_in(&mut tx, &dup_key, Fingerprint::of(b"order"), LEASE).await;
        tx.rollback().await.unwrap();
        answer.unwrap()
    });
    let deadline = Instant::now() + Duration::from_secs(30); // against a hang
    loop {
        let waits: i64 = sqlx::query(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
        )
        .bind(pid)
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .get(0);
        if waits > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the duplicate never waited on the row");
    }
    assert!(!duplicate.is_finished());
    first.commit().await.unwrap();
    assert_eq!(replayed(&duplicate.await.unwrap()), Some(&b"201 first"[..]));
    assert_eq!(db.orders().await, 1);
    db.drop().await;
}
