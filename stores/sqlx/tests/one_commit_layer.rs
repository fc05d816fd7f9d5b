//! The one-commit mode's suite (`idemcache_sql::one_commit::testing`) on each engine of
//! this crate: PostgreSQL (`PgStore`, feature `postgres`) and MySQL/MariaDB
//! (`MySqlStore`, feature `mysql`), the layer's transaction a `sqlx::Transaction` from
//! the store's own pool. Each is skipped, saying why, without its URL
//! (`IDEMCACHE_POSTGRES_URL`, `IDEMCACHE_MYSQL_URL`).

use idemcache::store::conformance::service_url;
use idemcache::store::Store;
use idemcache_sql::one_commit::testing::{self, Boxed, Orders, Tx};
use sqlx::AssertSqlSafe;

/// The orders table every run shares (each run's keys are its own).
const ORDERS: &str = "idemcache_one_commit_orders";

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use idemcache_sqlx::PgStore;
    use sqlx::PgPool;

    struct Postgres(PgStore);

    impl Postgres {
        fn pool(&self) -> &PgPool {
            self.0.pool()
        }
    }

    impl Orders for Postgres {
        type Store = PgStore;

        fn engine(&self) -> &'static str {
            "PostgreSQL (sqlx)"
        }

        fn store(&self) -> PgStore {
            self.0.clone()
        }

        fn write<'a>(tx: &'a mut Tx<Self>, key: String, item: String) -> Boxed<'a, ()> {
            Box::pin(async move {
                let sql = format!("INSERT INTO {ORDERS} (key, item) VALUES ($1, $2)");
                let insert = sqlx::query(AssertSqlSafe(sql)).bind(key).bind(item);
                insert.execute(&mut **tx).await.unwrap();
            })
        }

        fn lease_ended<'a>(tx: &'a mut Tx<Self>, key: Vec<u8>) -> Boxed<'a, bool> {
            Box::pin(async move {
                let sql = "SELECT expires_at <= \
                           (extract(epoch FROM clock_timestamp()) * 1000000)::bigint \
                           FROM idemcache_records WHERE key = $1";
                sqlx::query_scalar(sql).bind(key).fetch_one(&mut **tx).await.unwrap()
            })
        }

        fn committed(&self, key: &str) -> Boxed<'_, (i64, i64)> {
            let key = key.to_owned();
            Box::pin(async move {
                let sql = format!("SELECT count(*) FROM {ORDERS} WHERE key = $1");
                let orders = sqlx::query_scalar(AssertSqlSafe(sql)).bind(&key);
                let orders = orders.fetch_one(self.pool()).await.unwrap();
                let sql = "SELECT count(*) FROM idemcache_records \
                           WHERE position($1::bytea in key) > 0";
                let records = sqlx::query_scalar(sql).bind(key.as_bytes());
                (orders, records.fetch_one(self.pool()).await.unwrap())
            })
        }

        fn correlation_id(&self, key: &str) -> Boxed<'_, Option<String>> {
            let key = key.to_owned();
            Box::pin(async move {
                let sql = "SELECT correlation_id FROM idemcache_records \
                           WHERE position($1::bytea in key) > 0";
                let kept = sqlx::query_scalar(sql).bind(key.as_bytes());
                kept.fetch_one(self.pool()).await.unwrap()
            })
        }

        fn claims_waiting(&self) -> Boxed<'_, Option<i64>> {
            Box::pin(async move {
                let sql = "SELECT count(*) FROM pg_stat_activity \
                           WHERE wait_event_type = 'Lock' \
                           AND (query LIKE '%idemcache_records%' OR query LIKE '%advisory%')";
                Some(sqlx::query_scalar(sql).fetch_one(self.pool()).await.unwrap())
            })
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs IDEMCACHE_POSTGRES_URL"]
    async fn one_commit_mode_holds_on_postgres() {
        let example = "postgres://postgres@127.0.0.1:5432/test";
        let Some(url) = service_url("IDEMCACHE_POSTGRES_URL", example) else { return };
        let store = PgStore::connect(&url).await.unwrap();
        store.ensure_schema().await.unwrap();
        // Serialized: concurrent `CREATE TABLE IF NOT EXISTS` can both try to create it.
        let ddl = format!(
            "BEGIN; SELECT pg_advisory_xact_lock(72431); \
             CREATE TABLE IF NOT EXISTS {ORDERS} (key TEXT NOT NULL, item TEXT); COMMIT"
        );
        sqlx::raw_sql(AssertSqlSafe(ddl)).execute(store.pool()).await.unwrap();
        testing::run(&Postgres(store)).await;
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    use idemcache_sqlx::MySqlStore;
    use sqlx::MySqlPool;

    struct MySql(MySqlStore);

    impl MySql {
        fn pool(&self) -> &MySqlPool {
            self.0.pool()
        }
    }

    impl Orders for MySql {
        type Store = MySqlStore;

        fn engine(&self) -> &'static str {
            "MySQL/MariaDB (sqlx)"
        }

        fn store(&self) -> MySqlStore {
            self.0.clone()
        }

        fn write<'a>(tx: &'a mut Tx<Self>, key: String, item: String) -> Boxed<'a, ()> {
            Box::pin(async move {
                let sql = format!("INSERT INTO {ORDERS} (`key`, item) VALUES (?, ?)");
                let insert = sqlx::query(AssertSqlSafe(sql)).bind(key).bind(item);
                insert.execute(&mut **tx).await.unwrap();
            })
        }

        fn lease_ended<'a>(tx: &'a mut Tx<Self>, key: Vec<u8>) -> Boxed<'a, bool> {
            Box::pin(async move {
                let sql = "SELECT expires_at <= \
                           TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) \
                           FROM idemcache_records WHERE `key` = ?";
                let ended: i64 =
                    sqlx::query_scalar(sql).bind(key).fetch_one(&mut **tx).await.unwrap();
                ended != 0
            })
        }

        fn committed(&self, key: &str) -> Boxed<'_, (i64, i64)> {
            let key = key.to_owned();
            Box::pin(async move {
                let sql = format!("SELECT count(*) FROM {ORDERS} WHERE `key` = ?");
                let orders = sqlx::query_scalar(AssertSqlSafe(sql)).bind(&key);
                let orders = orders.fetch_one(self.pool()).await.unwrap();
                let sql = "SELECT count(*) FROM idemcache_records WHERE INSTR(`key`, ?) > 0";
                let records = sqlx::query_scalar(sql).bind(key.as_bytes());
                (orders, records.fetch_one(self.pool()).await.unwrap())
            })
        }

        fn correlation_id(&self, key: &str) -> Boxed<'_, Option<String>> {
            let key = key.to_owned();
            Box::pin(async move {
                let sql = "SELECT correlation_id FROM idemcache_records WHERE INSTR(`key`, ?) > 0";
                let kept = sqlx::query_scalar(sql).bind(key.as_bytes());
                kept.fetch_one(self.pool()).await.unwrap()
            })
        }

        fn claims_waiting(&self) -> Boxed<'_, Option<i64>> {
            Box::pin(async move {
                // (MariaDB's `innodb_trx` does not list a claim waiting here.)
                let sql = "SELECT count(*) FROM information_schema.processlist \
                           WHERE id <> CONNECTION_ID() AND command = 'Execute' \
                           AND info LIKE '%INSERT INTO idemcache_records%'";
                Some(sqlx::query_scalar(sql).fetch_one(self.pool()).await.unwrap())
            })
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs IDEMCACHE_MYSQL_URL"]
    async fn one_commit_mode_holds_on_mysql() {
        let example = "mysql://root@127.0.0.1:3306/test";
        let Some(url) = service_url("IDEMCACHE_MYSQL_URL", example) else { return };
        let store = MySqlStore::connect(&url).await.unwrap();
        store.ensure_schema().await.unwrap();
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {ORDERS} \
             (`key` VARCHAR(255) NOT NULL, item TEXT) ENGINE = InnoDB"
        );
        sqlx::raw_sql(AssertSqlSafe(ddl)).execute(store.pool()).await.unwrap();
        testing::run(&MySql(store)).await;
    }
}
