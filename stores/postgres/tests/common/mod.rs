//! What the PostgreSQL suites share: a connection, a store beside an orders table of one
//! test's own ([`OrdersDb`], for the one-commit suites), and a schema of one test's own
//! ([`SchemaDb`], for the outbox suites), each named for its suite, the test and this
//! process, so that runs and tests never see each other's rows.

// Each suite is a binary of its own and uses part of this.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use idemcache::store::conformance::service_url;
use idemcache::store::Store;
use idemcache::Key;
use idemcache_postgres::deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use idemcache_postgres::tokio_postgres::{self, Client, NoTls};
use idemcache_postgres::PostgresStore;

/// The test server's URL, or `None` (the test is skipped, saying why).
pub fn url() -> Option<String> {
    service_url("IDEMCACHE_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
}

/// A connection of its own, its driver task spawned.
pub async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// A name no other test of this process, nor any other process, uses.
fn unique(prefix: &str, name: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{name}_{}_{n}", std::process::id())
}

/// A store over the test database (its schema ensured), a table of this test's own for
/// its orders, and keys no other run has used.
pub struct OrdersDb {
    pub url: String,
    pub store: PostgresStore,
    pub orders: String,
    /// The keys' tenant: the suite's name.
    pub suite: &'static str,
}

impl OrdersDb {
    /// `suite`'s database for its test `name`; `None` when no server is set.
    pub async fn new(suite: &'static str, name: &str) -> Option<OrdersDb> {
        let url = url()?;
        let store = PostgresStore::connect(&url).await.unwrap();
        store.ensure_schema().await.unwrap();
        let orders = unique(&format!("idemcache_{suite}"), name);
        let sql = format!("CREATE TABLE {orders} (key TEXT PRIMARY KEY, item TEXT NOT NULL)");
        connect(&url).await.batch_execute(&sql).await.unwrap();
        Some(OrdersDb { url, store, orders, suite })
    }

    /// A key no other run has used.
    pub fn key(&self) -> Key {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
        Key::new("POST /orders", self.suite, format!("{}-{nanos}", self.orders)).unwrap()
    }

    /// How many orders `key` has.
    pub async fn orders_of(&self, key: &Key) -> i64 {
        let sql = format!("SELECT count(*) FROM {} WHERE key = $1", self.orders);
        let client = connect(&self.url).await;
        client.query_one(&sql, &[&key.client_key()]).await.unwrap().get(0)
    }

    /// The rows of `key` in the records table, whatever their state.
    pub async fn records_of(&self, key: &Key) -> i64 {
        let client = connect(&self.url).await;
        let sql = "SELECT count(*) FROM idemcache_records WHERE key = $1";
        client.query_one(sql, &[&key.as_bytes()]).await.unwrap().get(0)
    }

    /// The stored state of `key`'s record (1 PROCESSING, 2 COMPLETED, 3 UNKNOWN).
    pub async fn state_of(&self, key: &Key) -> Option<i16> {
        let client = connect(&self.url).await;
        let sql = "SELECT state FROM idemcache_records WHERE key = $1";
        client.query_opt(sql, &[&key.as_bytes()]).await.unwrap().map(|row| row.get(0))
    }

    /// Drops the orders table.
    pub async fn drop_table(self) {
        let sql = format!("DROP TABLE {}", self.orders);
        connect(&self.url).await.batch_execute(&sql).await.unwrap();
    }
}

/// A schema of one test's own, with the outbox's tables in it; dropped by [`drop`].
///
/// [`drop`]: SchemaDb::drop
#[derive(Clone)]
pub struct SchemaDb {
    pub url: String,
    pub schema: String,
}

impl SchemaDb {
    /// The outbox suite's schema for its test `name`; `None` when no server is set.
    pub async fn new(name: &str) -> Option<SchemaDb> {
        let url = url()?;
        let db = SchemaDb { url, schema: unique("idemcache_outbox", name) };
        db.raw().await.batch_execute(&format!("CREATE SCHEMA {}", db.schema)).await.unwrap();
        idemcache_postgres::outbox::ensure_schema(&db.client().await).await.unwrap();
        Some(db)
    }

    /// A connection whose names resolve as the server's default.
    pub async fn raw(&self) -> Client {
        connect(&self.url).await
    }

    /// A connection working in the schema.
    pub async fn client(&self) -> Client {
        let client = self.raw().await;
        client.batch_execute(&format!("SET search_path TO {}", self.schema)).await.unwrap();
        client
    }

    /// A pool of 4 connections working in the schema.
    pub fn pool(&self) -> Pool {
        let mut config: tokio_postgres::Config = self.url.parse().unwrap();
        config.options(format!("-c search_path={}", self.schema));
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig { recycling_method: RecyclingMethod::Fast },
        );
        Pool::builder(manager).max_size(4).build().unwrap()
    }

    /// Enqueues `messages` in one committed transaction, on a connection of its own.
    pub async fn put(&self, messages: Vec<idemcache_postgres::outbox::OutboxMessage>) {
        let mut client = self.client().await;
        let tx = client.transaction().await.unwrap();
        for m in &messages {
            idemcache_postgres::outbox::enqueue(&tx, m).await.unwrap();
        }
        tx.commit().await.unwrap();
    }

    /// Drops the schema and everything in it.
    pub async fn drop(self) {
        let admin = self.raw().await;
        admin.batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema)).await.unwrap();
    }
}
