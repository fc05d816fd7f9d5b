//! One calling convention for your transaction: `complete_in`, `inbox::receive` and
//! `transition::transition` each take it as `&tx`, whether it is tokio-postgres's own
//! `Transaction` or a deadpool-postgres `Transaction` (which dereferences to it). The
//! calls below are the check that they compile so; they run against a real PostgreSQL
//! (`IDEMCACHE_POSTGRES_URL`; skipped with a printed reason when unset) and commit in
//! the one transaction they share.
//!
//! The inbox's and the payments' tables live in a schema of this test's own, dropped at
//! its end; the store's records table is the store's own (`ensure_schema`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idemcache::store::conformance::service_url;
use idemcache::store::{OpenClaim, Store, StoreClaim};
use idemcache::{Fingerprint, Key};
use idemcache_postgres::deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use idemcache_postgres::inbox::{self, Receipt};
use idemcache_postgres::tokio_postgres::{self, Client, NoTls};
use idemcache_postgres::transition;
use idemcache_postgres::{complete_in, PostgresStore};
use idemcache_sql::transition::{StatusColumn, Transition};

/// The consumer these tests receive as: advisory locks are per database, so a name of
/// its own keeps other suites from holding these messages' locks.
const CONSUMER: &str = "idemcache-user-transaction-test";

/// A schema of this test's own holding the inbox and a payments table (p1 PENDING), and
/// a store over `url` with its schema ensured.
struct Db {
    url: String,
    schema: String,
    store: PostgresStore,
}

impl Db {
    async fn new(name: &str) -> Option<Db> {
        static N: AtomicU32 = AtomicU32::new(0);
        let url = service_url("IDEMCACHE_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")?;
        let n = N.fetch_add(1, Ordering::Relaxed);
        let schema = format!("idemcache_user_tx_{name}_{}_{n}", std::process::id());
        let store = PostgresStore::connect(&url).await.unwrap();
        store.ensure_schema().await.unwrap();
        let db = Db { url, schema, store };
        let client = db.client().await;
        client
            .batch_execute(&format!("CREATE SCHEMA {0}; SET search_path TO {0}", db.schema))
            .await
            .unwrap();
        inbox::ensure_schema(&client).await.unwrap();
        client
            .batch_execute(
                "CREATE TABLE payments (id TEXT PRIMARY KEY, status TEXT NOT NULL);
                 INSERT INTO payments VALUES ('p1', 'PENDING');",
            )
            .await
            .unwrap();
        Some(db)
    }

    async fn client(&self) -> Client {
        let (client, connection) = tokio_postgres::connect(&self.url, NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    }

    /// A deadpool pool over the same server, as an application keeps one.
    fn pool(&self) -> Pool {
        let config: tokio_postgres::Config = self.url.parse().unwrap();
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig { recycling_method: RecyclingMethod::Fast },
        );
        Pool::builder(manager).max_size(1).build().unwrap()
    }

    /// This schema first, then the store's records where `ensure_schema` put them.
    fn search_path(&self) -> String {
        format!("SET LOCAL search_path TO {}, public", self.schema)
    }

    /// A claim of a fresh key, as the HTTP layer hands it to a handler.
    async fn claim(&self) -> OpenClaim {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
        let key = Key::new("POST /payments", "user-tx", format!("k-{nanos}")).unwrap();
        let claimed = self.store.claim(&key, Fingerprint::of(b"pay"), Duration::from_secs(30));
        let StoreClaim::Acquired { token, .. } = claimed.await.unwrap() else {
            panic!("a fresh key is acquired");
        };
        OpenClaim::new(key, token, Duration::from_secs(60))
    }

    /// After the commit: the record replays, the message is a duplicate, the row is PAID.
    async fn assert_committed(&self, claim: &OpenClaim, message: &str) {
        let replayed =
            self.store.claim(claim.key(), Fingerprint::of(b"pay"), Duration::from_secs(30));
        assert!(matches!(replayed.await.unwrap(), StoreClaim::Completed(_)));
        let mut client = self.client().await;
        let tx = client.transaction().await.unwrap();
        tx.batch_execute(&self.search_path()).await.unwrap();
        let again = inbox::receive(&tx, CONSUMER, message, Fingerprint::of(b"pay")).await;
        assert_eq!(again.unwrap(), Receipt::Duplicate);
        let status: String =
            tx.query_one("SELECT status FROM payments WHERE id = 'p1'", &[]).await.unwrap().get(0);
        assert_eq!(status, "PAID");
        tx.rollback().await.unwrap();
    }

    async fn drop_schema(self) {
        let sql = format!("DROP SCHEMA {} CASCADE", self.schema);
        self.client().await.batch_execute(&sql).await.unwrap();
    }
}

fn payments() -> StatusColumn {
    StatusColumn::new("payments", "id", "status").unwrap()
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_deadpool_transaction_is_passed_as_ref_tx_to_every_function() {
    let Some(db) = Db::new("deadpool").await else { return };
    let claim = db.claim().await;
    let pool = db.pool();
    let mut object = pool.get().await.unwrap();
    let tx = object.transaction().await.unwrap();
    tx.batch_execute(&db.search_path()).await.unwrap();
    let receipt = inbox::receive(&tx, CONSUMER, &db.schema, Fingerprint::of(b"pay")).await;
    assert_eq!(receipt.unwrap(), Receipt::New);
    let moved = transition(&tx, &payments(), &"p1", &["PENDING"], "PAID").await;
    assert_eq!(moved.unwrap(), Transition::Applied);
    complete_in(&tx, &claim, Some(b"paid")).await.unwrap();
    tx.commit().await.unwrap();
    db.assert_committed(&claim, &db.schema).await;
    db.drop_schema().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_tokio_postgres_transaction_is_passed_as_ref_tx_to_every_function() {
    let Some(db) = Db::new("tokio").await else { return };
    let claim = db.claim().await;
    let mut client = db.client().await;
    let tx = client.transaction().await.unwrap();
    tx.batch_execute(&db.search_path()).await.unwrap();
    let receipt = inbox::receive(&tx, CONSUMER, &db.schema, Fingerprint::of(b"pay")).await;
    assert_eq!(receipt.unwrap(), Receipt::New);
    let moved = transition(&tx, &payments(), &"p1", &["PENDING"], "PAID").await;
    assert_eq!(moved.unwrap(), Transition::Applied);
    complete_in(&tx, &claim, Some(b"paid")).await.unwrap();
    tx.commit().await.unwrap();
    db.assert_committed(&claim, &db.schema).await;
    db.drop_schema().await;
}
