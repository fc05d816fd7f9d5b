//! The one-commit mode's suite (`idemcache_sql::one_commit::testing`) on each engine of
//! this crate: PostgreSQL (`PgStore`, feature `postgres`) and MySQL/MariaDB
//! (`MySqlStore`, feature `mysql`), the layer's transaction a `sqlx::Transaction` from
//! the store's own pool. One fixture, written once as a macro over the engine's types
//! and statements; and on each, the suite's kill test (a process killed with SIGKILL
//! between its claim and its commit). Each is skipped, saying why, without its URL
//! (`IDEMCACHE_POSTGRES_URL`, `IDEMCACHE_MYSQL_URL`).

use idemcache::store::conformance::service_url;
use idemcache::store::Store;
use idemcache_sql::one_commit::testing::{self, Boxed, Orders, Tx};
use sqlx::AssertSqlSafe;

/// The orders table every run shares (each run's keys are its own).
const ORDERS: &str = "idemcache_one_commit_orders";

/// The fixture of one engine: its store, its name, and its statements (the order's
/// insert, the lease's end by the server's clock, the counts, the correlation id, the
/// sessions waiting), each in the engine's placeholders.
macro_rules! sqlx_orders {
    ($fixture:ident, $store:ty, $engine:literal,
     insert: $insert:expr, lease_ended: $ended:literal, orders: $orders:expr,
     records: $records:literal, correlation: $correlation:literal, waiting: $waiting:literal) => {
        struct $fixture($store);

        impl Orders for $fixture {
            type Store = $store;

            fn engine(&self) -> &'static str {
                $engine
            }

            fn store(&self) -> $store {
                self.0.clone()
            }

            fn write<'a>(tx: &'a mut Tx<Self>, key: String, item: String) -> Boxed<'a, ()> {
                Box::pin(async move {
                    let insert = sqlx::query(AssertSqlSafe($insert)).bind(key).bind(item);
                    insert.execute(&mut **tx).await.unwrap();
                })
            }

            fn lease_ended<'a>(tx: &'a mut Tx<Self>, key: Vec<u8>) -> Boxed<'a, bool> {
                Box::pin(async move {
                    let ended: i64 =
                        sqlx::query_scalar($ended).bind(key).fetch_one(&mut **tx).await.unwrap();
                    ended != 0
                })
            }

            fn committed(&self, key: &str) -> Boxed<'_, (i64, i64)> {
                let key = key.to_owned();
                Box::pin(async move {
                    let orders = sqlx::query_scalar(AssertSqlSafe($orders)).bind(&key);
                    let orders = orders.fetch_one(self.0.pool()).await.unwrap();
                    let records = sqlx::query_scalar($records).bind(key.as_bytes());
                    (orders, records.fetch_one(self.0.pool()).await.unwrap())
                })
            }

            fn correlation_id(&self, key: &str) -> Boxed<'_, Option<String>> {
                let key = key.to_owned();
                Box::pin(async move {
                    let kept = sqlx::query_scalar($correlation).bind(key.as_bytes());
                    kept.fetch_one(self.0.pool()).await.unwrap()
                })
            }

            fn claims_waiting(&self) -> Boxed<'_, Option<i64>> {
                Box::pin(async move {
                    Some(sqlx::query_scalar($waiting).fetch_one(self.0.pool()).await.unwrap())
                })
            }
        }
    };
}

#[cfg(feature = "postgres")]
sqlx_orders!(
    Postgres, idemcache_sqlx::PgStore, "PostgreSQL (sqlx)",
    insert: format!("INSERT INTO {ORDERS} (key, item) VALUES ($1, $2)"),
    lease_ended: "SELECT CASE WHEN expires_at <= \
                  (extract(epoch FROM clock_timestamp()) * 1000000)::bigint THEN 1::int8 ELSE 0 END \
                  FROM idemcache_records WHERE key = $1",
    orders: format!("SELECT count(*) FROM {ORDERS} WHERE key = $1"),
    records: "SELECT count(*) FROM idemcache_records WHERE position($1::bytea in key) > 0",
    correlation: "SELECT correlation_id FROM idemcache_records WHERE position($1::bytea in key) > 0",
    waiting: "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
              AND (query LIKE '%idemcache_records%' OR query LIKE '%advisory%')"
);

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn one_commit_mode_holds_on_postgres() {
    let example = "postgres://postgres@127.0.0.1:5432/test";
    let Some(url) = service_url("IDEMCACHE_POSTGRES_URL", example) else { return };
    testing::run(&Postgres::open(&url).await).await;
}

#[cfg(feature = "postgres")]
impl Postgres {
    /// The fixture over the database at `url`: the store's schema and the orders table
    /// made.
    async fn open(url: &str) -> Postgres {
        let store = idemcache_sqlx::PgStore::connect(url).await.unwrap();
        store.ensure_schema().await.unwrap();
        // Serialized: concurrent `CREATE TABLE IF NOT EXISTS` can both try to create it.
        let ddl = format!(
            "BEGIN; SELECT pg_advisory_xact_lock(72431); \
             CREATE TABLE IF NOT EXISTS {ORDERS} (key TEXT NOT NULL, item TEXT); COMMIT"
        );
        sqlx::raw_sql(AssertSqlSafe(ddl)).execute(store.pool()).await.unwrap();
        Postgres(store)
    }
}

// MariaDB's `innodb_trx` does not list a claim waiting on a record's row: the
// processlist does.
#[cfg(feature = "mysql")]
sqlx_orders!(
    MySql, idemcache_sqlx::MySqlStore, "MySQL/MariaDB (sqlx)",
    insert: format!("INSERT INTO {ORDERS} (`key`, item) VALUES (?, ?)"),
    lease_ended: "SELECT CAST(expires_at <= \
                  TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) AS SIGNED) \
                  FROM idemcache_records WHERE `key` = ?",
    orders: format!("SELECT count(*) FROM {ORDERS} WHERE `key` = ?"),
    records: "SELECT count(*) FROM idemcache_records WHERE INSTR(`key`, ?) > 0",
    correlation: "SELECT correlation_id FROM idemcache_records WHERE INSTR(`key`, ?) > 0",
    waiting: "SELECT count(*) FROM information_schema.processlist \
              WHERE id <> CONNECTION_ID() AND command = 'Execute' \
              AND info LIKE '%INSERT INTO idemcache_records%'"
);

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn one_commit_mode_holds_on_mysql() {
    let example = "mysql://root@127.0.0.1:3306/test";
    let Some(url) = service_url("IDEMCACHE_MYSQL_URL", example) else { return };
    testing::run(&MySql::open(&url).await).await;
}

#[cfg(feature = "mysql")]
impl MySql {
    /// The fixture over the database at `url`: the store's schema and the orders table
    /// made.
    async fn open(url: &str) -> MySql {
        let store = idemcache_sqlx::MySqlStore::connect(url).await.unwrap();
        store.ensure_schema().await.unwrap();
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {ORDERS} \
             (`key` VARCHAR(255) NOT NULL, item TEXT) ENGINE = InnoDB"
        );
        sqlx::raw_sql(AssertSqlSafe(ddl)).execute(store.pool()).await.unwrap();
        MySql(store)
    }
}

/// The kill test's child: its key.
const CHILD_KEY: &str = "IDEMCACHE_ONE_COMMIT_CHILD_KEY";

/// The kill test on one engine: `$child`, the child (`testing::claim_and_wait_to_be_killed`,
/// a no-op run on its own), and `$parent`, which kills it at `claimed` and checks what
/// is left. Both open the fixture (`$fixture::open`, the orders table made) at `$var`'s
/// URL.
macro_rules! kill_test {
    ($child:ident, $parent:ident, $fixture:ident, $var:literal, $example:literal,
     $needs:literal) => {
        #[tokio::test]
        async fn $child() {
            let Ok(key) = std::env::var(CHILD_KEY) else { return };
            let Some(url) = service_url($var, $example) else { return };
            testing::claim_and_wait_to_be_killed(&$fixture::open(&url).await, &key).await
        }

        #[tokio::test]
        #[ignore = $needs]
        async fn $parent() {
            let Some(url) = service_url($var, $example) else { return };
            let engine = $fixture::open(&url).await;
            let key = format!("{}-killed", testing::unique_prefix());
            let env = [(CHILD_KEY, key.as_str()), ($var, url.as_str())];
            idemcache::store::conformance::kill_child_at(stringify!($child), &env, "claimed");
            testing::after_a_kill_between_claim_and_commit(&engine, &key).await;
        }
    };
}

#[cfg(feature = "postgres")]
kill_test!(
    postgres_child_claims_and_waits_to_be_killed,
    a_postgres_process_killed_between_claim_and_commit_leaves_nothing,
    Postgres,
    "IDEMCACHE_POSTGRES_URL",
    "postgres://postgres@127.0.0.1:5432/test",
    "needs IDEMCACHE_POSTGRES_URL"
);

#[cfg(feature = "mysql")]
kill_test!(
    mysql_child_claims_and_waits_to_be_killed,
    a_mysql_process_killed_between_claim_and_commit_leaves_nothing,
    MySql,
    "IDEMCACHE_MYSQL_URL",
    "mysql://root@127.0.0.1:3306/test",
    "needs IDEMCACHE_MYSQL_URL"
);
