//! The inbox's suite (`idemcache_sql::inbox::testing`) on each engine of this crate:
//! PostgreSQL (feature `postgres`, a schema of its own) and MySQL/MariaDB (feature
//! `mysql`, a database of its own), each transaction a `sqlx::Transaction` from a pool
//! there. One fixture, written once as a macro over the engine's types and statements.
//! Each engine's own behaviour is in `inbox_postgres.rs` and `inbox_mysql.rs`. Skipped,
//! saying why, without `IDEMCACHE_POSTGRES_URL` or `IDEMCACHE_MYSQL_URL`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use idemcache::store::conformance::service_url;
use idemcache::Fingerprint;
use idemcache_sql::inbox::testing::{self, Boxed, Inbox};
use idemcache_sql::inbox::{InboxError, Receipt};
use sqlx::AssertSqlSafe;

/// A name of this run's own, for its schema or database.
fn unique(engine: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("idemcache_inbox_suite_{engine}_{}_{n}", std::process::id())
}

fn micros(at: SystemTime) -> i64 {
    at.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_micros() as i64
}

/// The fixture of one engine: its database type, its driver module, its name, and its
/// statements (the entry, the records count, the balance, the unreadable row, the
/// received time), each in the engine's placeholders.
macro_rules! sqlx_inbox {
    ($fixture:ident, $db:ty, $inbox:path, $engine:literal,
     credit: $credit:literal, records: $records:literal, balance: $balance:literal,
     unreadable: $unreadable:literal, received: $received:literal) => {
        struct $fixture(sqlx::Pool<$db>);

        impl Inbox for $fixture {
            type Tx = sqlx::Transaction<'static, $db>;

            fn engine(&self) -> &'static str {
                $engine
            }

            fn begin(&self) -> Boxed<'_, Self::Tx> {
                Box::pin(async move { self.0.begin().await.unwrap() })
            }

            fn receive<'a>(
                tx: &'a mut Self::Tx,
                consumer: &'a str,
                id: &'a str,
                fp: Fingerprint,
            ) -> Boxed<'a, Result<Receipt, InboxError>> {
                use $inbox as driver;
                Box::pin(driver::receive(tx, consumer, id, fp))
            }

            fn credit<'a>(tx: &'a mut Self::Tx, account: &'a str, amount: i64) -> Boxed<'a, ()> {
                Box::pin(async move {
                    let insert = sqlx::query($credit).bind(account).bind(amount);
                    insert.execute(&mut **tx).await.unwrap();
                })
            }

            fn commit(tx: Self::Tx) -> Boxed<'static, ()> {
                Box::pin(async move { tx.commit().await.unwrap() })
            }

            fn rollback(tx: Self::Tx) -> Boxed<'static, ()> {
                Box::pin(async move { tx.rollback().await.unwrap() })
            }

            fn records(&self, consumer: &str) -> Boxed<'_, i64> {
                let consumer = consumer.to_owned();
                Box::pin(async move {
                    let count = sqlx::query_scalar($records).bind(consumer);
                    count.fetch_one(&self.0).await.unwrap()
                })
            }

            fn balance(&self, account: &str) -> Boxed<'_, i64> {
                let account = account.to_owned();
                Box::pin(async move {
                    let sum = sqlx::query_scalar($balance).bind(account);
                    sum.fetch_one(&self.0).await.unwrap()
                })
            }

            fn store_unreadable<'a>(&'a self, consumer: &'a str, id: &'a str) -> Boxed<'a, ()> {
                Box::pin(async move {
                    let insert = sqlx::query($unreadable).bind(consumer).bind(id);
                    insert.execute(&self.0).await.unwrap();
                })
            }

            fn received<'a>(
                &'a self,
                consumer: &'a str,
                id: &'a str,
                at: SystemTime,
            ) -> Boxed<'a, ()> {
                Box::pin(async move {
                    let update = sqlx::query($received).bind(micros(at)).bind(consumer).bind(id);
                    update.execute(&self.0).await.unwrap();
                })
            }

            fn purge(
                &self,
                cutoff: SystemTime,
                limit: usize,
            ) -> Boxed<'_, Result<usize, InboxError>> {
                use $inbox as driver;
                Box::pin(driver::purge(&self.0, cutoff, limit))
            }
        }
    };
}

#[cfg(feature = "postgres")]
sqlx_inbox!(
    Postgres, sqlx::Postgres, idemcache_sqlx::inbox::postgres, "PostgreSQL (sqlx)",
    credit: "INSERT INTO entries (account, amount) VALUES ($1, $2)",
    records: "SELECT count(*) FROM idemcache_inbox WHERE consumer = $1",
    balance: "SELECT coalesce(sum(amount), 0)::bigint FROM entries WHERE account = $1",
    unreadable: "INSERT INTO idemcache_inbox VALUES ($1, $2, '\\x010203', 0)",
    received: "UPDATE idemcache_inbox SET received_at = $1 WHERE consumer = $2 AND message_id = $3"
);

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn the_inbox_holds_on_postgres() {
    use idemcache::store::conformance::postgres_url_in_schema;
    let example = "postgres://postgres@127.0.0.1:5432/test";
    let Some(url) = service_url("IDEMCACHE_POSTGRES_URL", example) else { return };
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    let schema = unique("postgres");
    let create = format!("CREATE SCHEMA {schema}");
    sqlx::raw_sql(AssertSqlSafe(create)).execute(&admin).await.unwrap();
    let pool = sqlx::PgPool::connect(&postgres_url_in_schema(&url, &schema)).await.unwrap();
    idemcache_sqlx::inbox::postgres::ensure_schema(&pool).await.unwrap();
    let ddl = "CREATE TABLE entries (account TEXT NOT NULL, amount BIGINT NOT NULL)";
    sqlx::raw_sql(ddl).execute(&pool).await.unwrap();
    testing::run(Arc::new(Postgres(pool))).await;
    let drop = format!("DROP SCHEMA {schema} CASCADE");
    sqlx::raw_sql(AssertSqlSafe(drop)).execute(&admin).await.unwrap();
}

#[cfg(feature = "mysql")]
sqlx_inbox!(
    MySql, sqlx::MySql, idemcache_sqlx::inbox::mysql, "MySQL/MariaDB (sqlx)",
    credit: "INSERT INTO entries (account, amount) VALUES (?, ?)",
    records: "SELECT count(*) FROM idemcache_inbox WHERE consumer = ?",
    balance: "SELECT CAST(coalesce(sum(amount), 0) AS SIGNED) FROM entries WHERE account = ?",
    unreadable: "INSERT INTO idemcache_inbox VALUES (?, ?, X'010203', 0)",
    received: "UPDATE idemcache_inbox SET received_at = ? WHERE consumer = ? AND message_id = ?"
);

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn the_inbox_holds_on_mysql() {
    use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
    let example = "mysql://root@127.0.0.1:3306/test";
    let Some(url) = service_url("IDEMCACHE_MYSQL_URL", example) else { return };
    let admin = sqlx::MySqlPool::connect(&url).await.unwrap();
    let name = unique("mysql");
    let create = format!("CREATE DATABASE {name}");
    sqlx::raw_sql(AssertSqlSafe(create)).execute(&admin).await.unwrap();
    let options: MySqlConnectOptions = url.parse().unwrap();
    let pool = MySqlPoolOptions::new().connect_with(options.database(&name)).await.unwrap();
    idemcache_sqlx::inbox::mysql::ensure_schema(&pool).await.unwrap();
    let ddl = "CREATE TABLE entries (account VARBINARY(200) NOT NULL, amount BIGINT NOT NULL) \
               ENGINE = InnoDB";
    sqlx::raw_sql(ddl).execute(&pool).await.unwrap();
    testing::run(Arc::new(MySql(pool))).await;
    let drop = format!("DROP DATABASE {name}");
    sqlx::raw_sql(AssertSqlSafe(drop)).execute(&admin).await.unwrap();
}
