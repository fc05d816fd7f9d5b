//! Adversarial checks of `PgStore` against a real PostgreSQL (`IDEMCACHE_POSTGRES_URL`;
//! skipped with a printed reason when unset).
//!
//! `PgStore::from_pool` takes the caller's own pool, whose connections may run under
//! any session setting the application needs; these tests use settings a real
//! application sets (a stricter default isolation) and check that the store's contract
//! still holds over them.

use std::sync::atomic::{AtomicU32, Ordering};

use idemcache::store::conformance::{acquire, fp, key, service_url, LEASE, TTL};
use idemcache::store::{Store, StoreClaim, StoreError};
use idemcache_postgres::PostgresStore;
use idemcache_sqlx::PgStore;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, PgPool};

const EXAMPLE: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A schema of this test's own; stores over pools whose sessions work in it.
struct Db {
    admin: PgPool,
    url: String,
    schema: String,
    options: PgConnectOptions,
}

impl Db {
    async fn new(name: &str) -> Option<Db> {
        static N: AtomicU32 = AtomicU32::new(0);
        let url = service_url("IDEMCACHE_POSTGRES_URL", EXAMPLE)?;
        let n = N.fetch_add(1, Ordering::Relaxed);
        let schema = format!("idemcache_adv_{name}_{}_{n}", std::process::id());
        let admin = PgPoolOptions::new().max_connections(1).connect(&url).await.unwrap();
        let create = format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}");
        sqlx::raw_sql(AssertSqlSafe(create)).execute(&admin).await.unwrap();
        let options: PgConnectOptions = url.parse().unwrap();
        Some(Db { admin, url, schema, options })
    }

    /// A store whose sessions run with `default_transaction_isolation = isolation`.
    async fn store(&self, isolation: &str) -> PgStore {
        let options = self.options.clone().options([
            ("search_path", self.schema.as_str()),
            ("default_transaction_isolation", isolation),
        ]);
        let pool = PgPoolOptions::new().max_connections(8).connect_lazy_with(options);
        let store = PgStore::from_pool(pool);
        store.ensure_schema().await.unwrap();
        store
    }

    async fn execute(&self, sql: String) {
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(&self.admin).await.unwrap();
    }

    async fn drop(self) {
        self.execute(format!("DROP SCHEMA {} CASCADE", self.schema)).await;
    }
}

/// 16 concurrent claims of one key, absent and then dead, from two pools: exactly one
/// Acquired, the rest InProgress; any error fails.
async fn race(db: &Db, isolation: &str) {
    let (one, two) = (db.store(isolation).await, db.store(isolation).await);
    for round in 0..4 {
        let k = key(&format!("race-{}-{round}", isolation.replace(' ', "-")));
        if round % 2 == 1 {
            // A dead record to take over: acquired, then its lease a minute past.
            acquire(&one, &k).await;
            let back = 60_000_000 + LEASE.as_micros();
            let table = format!("{}.idemcache_records", db.schema);
            db.execute(format!("UPDATE {table} SET expires_at = expires_at - {back}")).await;
        }
        let claims: Vec<_> = (0..16)
            .map(|i| {
                let store = if i % 2 == 0 { one.clone() } else { two.clone() };
                let k = k.clone();
                tokio::spawn(async move { store.claim(&k, fp("r"), LEASE).await })
            })
            .collect();
        let (mut acquired, mut failed) = (0, Vec::new());
        for claim in claims {
            match claim.await.unwrap() {
                Ok(StoreClaim::Acquired { .. }) => acquired += 1,
                Ok(StoreClaim::InProgress { .. }) => {}
                Ok(other) => panic!("{other:?}"),
                Err(e) => failed.push(e.to_string()),
            }
        }
        assert!(failed.is_empty(), "{isolation}, round {round}: claims failed: {failed:#?}");
        assert_eq!(acquired, 1, "{isolation}, round {round}: exactly one claim acquired");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_over_a_read_committed_pool() {
    let Some(db) = Db::new("rc").await else { return };
    race(&db, "read committed").await;
    db.drop().await;
}

/// An application whose pool defaults to REPEATABLE READ (so that its own transactions
/// read one snapshot) hands that pool to the store: claims racing on one key must still
/// answer InProgress, not fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_over_a_repeatable_read_pool() {
    let Some(db) = Db::new("rr").await else { return };
    race(&db, "repeatable read").await;
    db.drop().await;
}

/// The same over a SERIALIZABLE pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_over_a_serializable_pool() {
    let Some(db) = Db::new("ser").await else { return };
    race(&db, "serializable").await;
    db.drop().await;
}

/// A settling write racing a claim over a REPEATABLE READ pool: the holder's completion
/// and 8 claims of its key at once; the completion applies or is LeaseLost, the claims
/// answer, nothing fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_racing_claims_over_a_repeatable_read_pool() {
    let Some(db) = Db::new("rr_complete").await else { return };
    let store = db.store("repeatable read").await;
    for round in 0..8 {
        let k = key(&format!("rr-complete-{round}"));
        let token = acquire(&store, &k).await;
        let done = {
            let (store, k) = (store.clone(), k.clone());
            tokio::spawn(async move { store.complete(&k, token, None, TTL).await })
        };
        let claims: Vec<_> = (0..8)
            .map(|_| {
                let (store, k) = (store.clone(), k.clone());
                tokio::spawn(async move { store.claim(&k, fp("r"), LEASE).await })
            })
            .collect();
        let done = done.await.unwrap();
        assert!(matches!(done, Ok(_) | Err(StoreError::LeaseLost(_))), "round {round}: {done:?}");
        for claim in claims {
            let claim = claim.await.unwrap();
            assert!(claim.is_ok(), "round {round}: {claim:?}");
        }
    }
    db.drop().await;
}

/// The tokio-postgres store (`idemcache-postgres`) runs the same statements: over a URL
/// whose sessions default to REPEATABLE READ, claims racing on one key fail the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tokio_postgres_store_over_a_repeatable_read_url() {
    let Some(db) = Db::new("tp_rr").await else { return };
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let url = format!(
        "{}{sep}options=-c%20search_path%3D{}%20-c%20default_transaction_isolation%3Drepeatable%5C%20read",
        db.url, db.schema
    );
    let store = PostgresStore::connect(&url).await.unwrap();
    store.ensure_schema().await.unwrap();
    for round in 0..4 {
        let k = key(&format!("tp-rr-{round}"));
        let claims: Vec<_> = (0..16)
            .map(|_| {
                let (store, k) = (store.clone(), k.clone());
                tokio::spawn(async move { store.claim(&k, fp("r"), LEASE).await })
            })
            .collect();
        let (mut acquired, mut failed) = (0, Vec::new());
        for claim in claims {
            match claim.await.unwrap() {
                Ok(StoreClaim::Acquired { .. }) => acquired += 1,
                Ok(StoreClaim::InProgress { .. }) => {}
                Ok(other) => panic!("{other:?}"),
                Err(e) => failed.push(e.to_string()),
            }
        }
        assert!(failed.is_empty(), "round {round}: claims failed: {failed:#?}");
        assert_eq!(acquired, 1, "round {round}: exactly one claim acquired");
    }
    db.drop().await;
}
