//! The sqlx MySQL/MariaDB outbox against a real server (`IDEMCACHE_MYSQL_URL`; skipped
//! with a printed reason when unset): the suite both sqlx engines share
//! (`common::outbox_suite!`, the scenarios every driver runs plus a held row skipped),
//! and what is MySQL's own: a duplicate id leaves its transaction usable, and a topic
//! that is not UTF-8 (a `VARBINARY` holds any bytes) is `Corrupt`. Each test works in a
//! database of its own, dropped at its end; time is a clock moved by hand.

#[macro_use]
mod common;

use std::sync::atomic::{AtomicU32, Ordering};

use idemcache::store::conformance::service_url;
use idemcache_sqlx::outbox::mysql::{self, inspect};
use idemcache_sqlx::outbox::OutboxError;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, MySqlConnection, MySqlPool};

struct Db {
    url: String,
    name: String,
}

impl Db {
    async fn new(test: &str) -> Option<Db> {
        static N: AtomicU32 = AtomicU32::new(0);
        let url = service_url("IDEMCACHE_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")?;
        let n = N.fetch_add(1, Ordering::Relaxed);
        let name = format!("idemcache_outbox_{test}_{}_{n}", std::process::id());
        let db = Db { url, name };
        let mut admin = MySqlConnection::connect(&db.url).await.unwrap();
        let create = format!("CREATE DATABASE {}", db.name);
        admin.execute(sqlx::raw_sql(AssertSqlSafe(create))).await.unwrap();
        mysql::ensure_schema(&mut db.conn().await).await.unwrap();
        Some(db)
    }

    async fn conn(&self) -> MySqlConnection {
        let mut c = MySqlConnection::connect(&self.url).await.unwrap();
        c.execute(sqlx::raw_sql(AssertSqlSafe(format!("USE {}", self.name)))).await.unwrap();
        c
    }

    async fn pool(&self) -> MySqlPool {
        let options: MySqlConnectOptions = self.url.parse().unwrap();
        MySqlPoolOptions::new()
            .max_connections(4)
            .connect_with(options.database(&self.name))
            .await
            .unwrap()
    }

    async fn drop(self) {
        let mut admin = MySqlConnection::connect(&self.url).await.unwrap();
        let drop = format!("DROP DATABASE {}", self.name);
        admin.execute(sqlx::raw_sql(AssertSqlSafe(drop))).await.unwrap();
    }
}

outbox_suite!(
    engine: idemcache_sqlx::outbox::mysql,
    conn: MySqlConnection,
    needs: "needs IDEMCACHE_MYSQL_URL",
    spoil: "UPDATE idemcache_outbox SET headers = x'0009' WHERE message_id = 'bad-headers';
            UPDATE idemcache_outbox SET state = 9 WHERE message_id = 'bad-state';",
    count: "SELECT count(*) FROM idemcache_outbox WHERE state = ?"
);

/// A duplicate id is typed and the transaction goes on: what else it enqueued commits.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn after_a_duplicate_id_the_transaction_goes_on() {
    let Some(db) = Db::new("dup").await else { return };
    let mut c = db.conn().await;
    mysql::ensure_schema(&mut c).await.unwrap(); // idempotent
    put(&mut c, &[message("m-1")]).await;
    let mut tx = c.begin().await.unwrap();
    let e = enqueue(&mut tx, &message("m-1")).await.unwrap_err();
    assert!(matches!(&e, OutboxError::Duplicate(id) if id == "m-1"), "{e:?}");
    enqueue(&mut tx, &message("m-2")).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(ids(&claim_due(&mut c, 10, MIN, t0()).await.unwrap()), ["m-1", "m-2"]);
    db.drop().await;
}

/// A topic that is not UTF-8 is `Corrupt`, naming the column, never a panic.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_topic_that_is_not_utf8_is_corrupt() {
    let Some(db) = Db::new("topic").await else { return };
    let mut c = db.conn().await;
    put(&mut c, &[message("good")]).await;
    c.execute(sqlx::raw_sql("UPDATE idemcache_outbox SET topic = x'ff' WHERE message_id = 'good'"))
        .await
        .unwrap();
    let e = inspect(&mut c, "good").await.unwrap_err();
    assert!(e.to_string().contains("topic is not UTF-8"), "{e}");
    db.drop().await;
}
