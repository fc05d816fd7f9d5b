//! Adversarial checks of `PgStore` against a real PostgreSQL (`IDEMCACHE_POSTGRES_URL`;
//! skipped with a printed reason when unset).
//!
//! `PgStore::from_pool` takes the caller's own pool, whose connections may run under
//! any session setting the application needs; these tests use settings a real
//! application sets (a stricter default isolation) and check that the store's contract
//! still holds over them.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idemcache::store::conformance::{acquire, fp, key, service_url, LEASE, TTL};
use idemcache::store::{OpenClaim, Store, StoreClaim, StoreError};
use idemcache::{Bytes, LapsePolicy};
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
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn concurrent_claims_over_a_read_committed_pool() {
    let Some(db) = Db::new("rc").await else { return };
    race(&db, "read committed").await;
    db.drop().await;
}

/// An application whose pool defaults to REPEATABLE READ (so that its own transactions
/// read one snapshot) hands that pool to the store: claims racing on one key must still
/// answer InProgress, not fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn concurrent_claims_over_a_repeatable_read_pool() {
    let Some(db) = Db::new("rr").await else { return };
    race(&db, "repeatable read").await;
    db.drop().await;
}

/// The same over a SERIALIZABLE pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn concurrent_claims_over_a_serializable_pool() {
    let Some(db) = Db::new("ser").await else { return };
    race(&db, "serializable").await;
    db.drop().await;
}

/// A settling write racing a claim over a REPEATABLE READ pool: the holder's completion
/// and 8 claims of its key at once; the completion applies or is LeaseLost, the claims
/// answer, nothing fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
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
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
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

/// 2030-01-01T00:00:00Z, µs.
const T0: i64 = 1_893_456_000_000_000;

impl Db {
    /// The server's clock of this schema's sessions made manual: `clock_timestamp()`
    /// shadowed by a function of this schema reading `clock.us`, found first on a
    /// `search_path` of this schema, then `pg_catalog`.
    async fn manual_clock(&self) {
        let s = &self.schema;
        self.execute(format!(
            "CREATE TABLE {s}.clock (us bigint NOT NULL); INSERT INTO {s}.clock VALUES ({T0});
             CREATE FUNCTION {s}.clock_timestamp() RETURNS timestamptz LANGUAGE sql STABLE
             AS $f$ SELECT 'epoch'::timestamptz + us * interval '1 microsecond' FROM {s}.clock $f$"
        ))
        .await;
    }

    async fn set_clock(&self, us: i64) {
        self.execute(format!("UPDATE {}.clock SET us = {us}", self.schema)).await;
    }

    /// A sqlx store on the manual clock.
    async fn clocked(&self) -> PgStore {
        let path = format!("{}, pg_catalog", self.schema);
        let options = self.options.clone().options([("search_path", path.as_str())]);
        let pool = PgPoolOptions::new().max_connections(4).connect_lazy_with(options);
        let store = PgStore::from_pool(pool);
        store.ensure_schema().await.unwrap();
        store
    }

    /// The tokio-postgres store on the manual clock.
    async fn clocked_tokio(&self) -> PostgresStore {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        let url =
            format!("{}{sep}options=-c%20search_path%3D{}%2Cpg_catalog", self.url, self.schema);
        let store = PostgresStore::connect(&url).await.unwrap();
        store.ensure_schema().await.unwrap();
        store
    }
}

fn acquired(claim: StoreClaim) -> idemcache::FencingToken {
    match claim {
        StoreClaim::Acquired { token, .. } => token,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// Under MarkUnknown, both drivers' claims, listings and purges agree about a lapse at
/// each instant around its boundaries, turned by either driver's claim or not; and a
/// clock stepped back after a takeover revives no token.
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn both_drivers_agree_on_a_lapse_at_its_boundaries_on_a_manual_clock() {
    let Some(db) = Db::new("pg_clock").await else { return };
    db.manual_clock().await;
    let ttl = Duration::from_secs(600);
    let policy = LapsePolicy::MarkUnknown { ttl };
    let ours = db.clocked().await.with_lapse_policy(policy).unwrap();
    let theirs = db.clocked_tokio().await.with_lapse_policy(policy).unwrap();
    match ours.claim(&key("pg-clock-sane"), fp("r"), LEASE).await.unwrap() {
        StoreClaim::Acquired { lease_ends_at, .. } => {
            assert_eq!(lease_ends_at, idemcache::store::encoding::from_micros(T0) + LEASE)
        }
        other => panic!("{other:?}"),
    }
    let (lease, ttl_us) = (LEASE.as_micros() as i64, ttl.as_micros() as i64);
    for (round, turner) in [(0, None), (1, Some(true)), (2, Some(false))] {
        db.set_clock(T0).await;
        let k = key(&format!("pg-bounds-{round}"));
        let token = acquired(theirs.claim(&k, fp("r"), LEASE).await.unwrap());
        let end = T0 + lease;
        db.set_clock(end - 1).await;
        for claim in [ours.claim(&k, fp("r"), LEASE).await, theirs.claim(&k, fp("r"), LEASE).await]
        {
            assert!(matches!(claim, Ok(StoreClaim::InProgress { .. })), "{claim:?}");
        }
        assert!(!ours.list_unknown(usize::MAX).await.unwrap().iter().any(|u| u.key == k));
        db.set_clock(end).await;
        let listed: Vec<_> = ours
            .list_unknown(usize::MAX)
            .await
            .unwrap()
            .into_iter()
            .filter(|u| u.key == k)
            .collect();
        assert_eq!(listed.len(), 1, "round {round}");
        assert_eq!(listed[0].token, token);
        match turner {
            Some(true) => assert!(matches!(
                ours.claim(&k, fp("r"), LEASE).await.unwrap(),
                StoreClaim::Unknown { .. }
            )),
            Some(false) => assert!(matches!(
                theirs.claim(&k, fp("r"), LEASE).await.unwrap(),
                StoreClaim::Unknown { .. }
            )),
            None => {}
        }
        let theirs_listed: Vec<_> = theirs
            .list_unknown(usize::MAX)
            .await
            .unwrap()
            .into_iter()
            .filter(|u| u.key == k)
            .collect();
        assert_eq!(theirs_listed, listed, "round {round}: the drivers list it alike");
        assert_eq!(ours.purge_expired(usize::MAX).await.unwrap(), 0);
        let refused = ours.complete(&k, token, None, TTL).await;
        assert!(matches!(refused, Err(StoreError::LeaseLost(_))), "{refused:?}");
        db.set_clock(end + ttl_us - 1).await;
        assert_eq!(theirs.purge_expired(usize::MAX).await.unwrap(), 0);
        assert!(matches!(
            ours.claim(&k, fp("r"), LEASE).await.unwrap(),
            StoreClaim::Unknown { .. }
        ));
        db.set_clock(end + ttl_us).await;
        assert!(!ours.list_unknown(usize::MAX).await.unwrap().iter().any(|u| u.key == k));
        assert!(!theirs.list_unknown(usize::MAX).await.unwrap().iter().any(|u| u.key == k));
        let fresh = acquired(ours.claim(&k, fp("r"), LEASE).await.unwrap());
        // Back to the first lease's time: the old token stays refused, the new applies.
        db.set_clock(T0).await;
        let late = theirs.complete(&k, token, None, TTL).await;
        assert!(matches!(late, Err(StoreError::LeaseLost(_))), "{late:?}");
        theirs.complete(&k, fresh, Some(Bytes::from_static(b"ok")), TTL).await.unwrap();
    }
    db.drop().await;
}

/// `complete_in` in the caller's transaction, its commit after the lease lapsed under
/// MarkUnknown: a claim meanwhile waits for it and then replays the result; a listing
/// meanwhile may show the lapse, but resolving or forgetting it is refused once the
/// transaction committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_completion_in_a_transaction_committed_after_the_lapse() {
    let Some(db) = Db::new("pg_in_tx").await else { return };
    db.manual_clock().await;
    let ttl = Duration::from_secs(600);
    let ours = db.clocked().await.with_lapse_policy(LapsePolicy::MarkUnknown { ttl }).unwrap();
    let k = key("pg-in-tx");
    let token = acquired(ours.claim(&k, fp("r"), LEASE).await.unwrap());
    let claim = OpenClaim::new(k.clone(), token, TTL);
    let mut tx = ours.pool().begin().await.unwrap();
    PgStore::complete_in(&mut tx, &claim, Some(b"paid")).await.unwrap();
    db.set_clock(T0 + LEASE.as_micros() as i64 + 1).await;
    let listed: Vec<_> =
        ours.list_unknown(10).await.unwrap().into_iter().filter(|u| u.key == k).collect();
    let waiting = {
        let (store, k) = (ours.clone(), k.clone());
        tokio::spawn(async move { store.claim(&k, fp("r"), LEASE).await })
    };
    tokio::task::yield_now().await;
    tx.commit().await.unwrap();
    match waiting.await.unwrap().unwrap() {
        StoreClaim::Completed(replay) => assert_eq!(replay.body.unwrap(), "paid"),
        other => panic!("{other:?}"),
    }
    for entry in &listed {
        let refused = ours.forget_listed(entry).await;
        assert!(matches!(refused, Err(StoreError::NothingToSettle(_))), "{refused:?}");
    }
    db.drop().await;
}
