//! The one-commit mode's suite (`idemcache_sql::one_commit::testing`) on PostgreSQL
//! through tokio-postgres: the layer's transaction is a `PooledTransaction`; and its
//! kill test, a process killed with SIGKILL between its claim and its commit. Skipped,
//! saying why, without `IDEMCACHE_POSTGRES_URL`.

mod common;

use idemcache::store::{conformance, Store};
use idemcache_postgres::PostgresStore;
use idemcache_sql::one_commit::testing::{self, Boxed, Orders, Tx};

/// The orders table every run shares (each run's keys are its own).
const ORDERS: &str = "idemcache_one_commit_orders";

struct Postgres {
    url: String,
    store: PostgresStore,
}

impl Orders for Postgres {
    type Store = PostgresStore;

    fn engine(&self) -> &'static str {
        "PostgreSQL (tokio-postgres)"
    }

    fn store(&self) -> PostgresStore {
        self.store.clone()
    }

    fn write<'a>(tx: &'a mut Tx<Self>, key: String, item: String) -> Boxed<'a, ()> {
        Box::pin(async move {
            let sql = format!("INSERT INTO {ORDERS} (key, item) VALUES ($1, $2)");
            tx.execute(&sql, &[&key, &item]).await.unwrap();
        })
    }

    fn lease_ended<'a>(tx: &'a mut Tx<Self>, key: Vec<u8>) -> Boxed<'a, bool> {
        Box::pin(async move {
            let sql = "SELECT expires_at <= \
                       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint \
                       FROM idemcache_records WHERE key = $1";
            tx.query_one(sql, &[&key]).await.unwrap().get(0)
        })
    }

    fn committed(&self, key: &str) -> Boxed<'_, (i64, i64)> {
        let key = key.to_owned();
        Box::pin(async move {
            let client = common::connect(&self.url).await;
            let sql = format!("SELECT count(*) FROM {ORDERS} WHERE key = $1");
            let orders = client.query_one(&sql, &[&key]).await.unwrap().get(0);
            let sql = "SELECT count(*) FROM idemcache_records WHERE position($1::bytea in key) > 0";
            let records = client.query_one(sql, &[&key.as_bytes()]).await.unwrap().get(0);
            (orders, records)
        })
    }

    fn correlation_id(&self, key: &str) -> Boxed<'_, Option<String>> {
        let key = key.to_owned();
        Box::pin(async move {
            let client = common::connect(&self.url).await;
            let sql = "SELECT correlation_id FROM idemcache_records \
                       WHERE position($1::bytea in key) > 0";
            client.query_one(sql, &[&key.as_bytes()]).await.unwrap().get(0)
        })
    }

    fn claims_waiting(&self) -> Boxed<'_, Option<i64>> {
        Box::pin(async move {
            let client = common::connect(&self.url).await;
            let sql = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                       AND (query LIKE '%idemcache_records%' OR query LIKE '%advisory%')";
            Some(client.query_one(sql, &[]).await.unwrap().get(0))
        })
    }
}

/// The orders table, made once (serialized: concurrent `CREATE TABLE IF NOT EXISTS` can
/// both try to create it).
async fn orders_table(url: &str) {
    let sql = format!(
        "BEGIN; SELECT pg_advisory_xact_lock(72431); \
         CREATE TABLE IF NOT EXISTS {ORDERS} (key TEXT NOT NULL, item TEXT); COMMIT"
    );
    common::connect(url).await.batch_execute(&sql).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn one_commit_mode_holds_on_postgres() {
    let Some(url) = common::url() else { return };
    let store = PostgresStore::connect(&url).await.unwrap();
    store.ensure_schema().await.unwrap();
    orders_table(&url).await;
    testing::run(&Postgres { url, store }).await;
}

/// The kill test's child: its key.
const CHILD_KEY: &str = "IDEMCACHE_ONE_COMMIT_CHILD_KEY";

/// The kill test's child (`testing::claim_and_wait_to_be_killed`); a no-op run on its
/// own.
#[tokio::test]
async fn child_claims_and_waits_to_be_killed() {
    let Ok(key) = std::env::var(CHILD_KEY) else { return };
    let Some(url) = common::url() else { return };
    let store = PostgresStore::connect(&url).await.unwrap();
    testing::claim_and_wait_to_be_killed(&Postgres { url, store }, &key).await
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_process_killed_between_claim_and_commit_leaves_nothing() {
    let Some(url) = common::url() else { return };
    let store = PostgresStore::connect(&url).await.unwrap();
    store.ensure_schema().await.unwrap();
    orders_table(&url).await;
    let key = format!("{}-killed", testing::unique_prefix());
    let env = [(CHILD_KEY, key.as_str()), ("IDEMCACHE_POSTGRES_URL", url.as_str())];
    conformance::kill_child_at("child_claims_and_waits_to_be_killed", &env, "claimed");
    testing::after_a_kill_between_claim_and_commit(&Postgres { url, store }, &key).await;
}
