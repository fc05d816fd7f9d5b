//! `PgStore` against a real PostgreSQL (`IDEMCACHE_POSTGRES_URL`; skipped with a printed
//! reason when unset): the conformance suite, the `MarkUnknown` sub-suite, concurrent
//! claims of one key race to exactly one Acquired, rows the store cannot read are
//! `Corrupt` naming their key (never a panic), a completion in the caller's transaction
//! commits or rolls back with it and is fenced by its token, and one table written by
//! this store and by `idemcache-postgres`'s (tokio-postgres) behaves as one store.
//!
//! Every test works in a schema of its own (pid and counter in the name), selected by
//! its pool's `search_path`, and drops it: no other suite on the same database (the
//! tokio-postgres store's, purging under another policy) meets its records.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idemcache::store::conformance::{
    self, acquire, fp, key, postgres_url_in_schema, service_url, LEASE, TTL,
};
use idemcache::store::{OpenClaim, Store, StoreClaim, StoreError};
use idemcache::LapsePolicy;
use idemcache_postgres::PostgresStore;
use idemcache_sqlx::PgStore;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, PgPool};

const EXAMPLE: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A schema of this test's own, and a store whose pool works in it (schema ensured).
struct Db {
    admin: PgPool,
    url: String,
    schema: String,
    store: PgStore,
}

impl Db {
    async fn new(name: &str) -> Option<Db> {
        static N: AtomicU32 = AtomicU32::new(0);
        let url = service_url("IDEMCACHE_POSTGRES_URL", EXAMPLE)?;
        let n = N.fetch_add(1, Ordering::Relaxed);
        let schema = format!("idemcache_sqlx_{name}_{}_{n}", std::process::id());
        let admin = PgPoolOptions::new().max_connections(1).connect(&url).await.unwrap();
        let create = format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}");
        sqlx::raw_sql(AssertSqlSafe(create)).execute(&admin).await.unwrap();
        let options: PgConnectOptions = url.parse().unwrap();
        let url = url.clone();
        let options = options.options([("search_path", schema.as_str())]);
        let pool = PgPoolOptions::new().max_connections(8).connect_with(options).await.unwrap();
        let store = PgStore::from_pool(pool);
        store.ensure_schema().await.unwrap();
        Some(Db { admin, url, schema, store })
    }

    async fn execute(&self, sql: String) {
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(&self.admin).await.unwrap();
    }

    async fn drop(self) {
        self.execute(format!("DROP SCHEMA {} CASCADE", self.schema)).await;
    }
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn postgres_conforms() {
    let Some(db) = Db::new("conforms").await else { return };
    conformance::run(&db.store).await;
    // Twice on one table: every call keys its records apart.
    conformance::run(&db.store).await;
    let said = format!("{:?}", db.store);
    assert!(said.starts_with("PgStore { server: \"PostgreSQL at "), "{said}");
    db.drop().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn postgres_under_mark_unknown_never_re_runs_a_lapsed_lease() {
    let Some(db) = Db::new("lapse").await else { return };
    let ttl = Duration::from_secs(3600);
    let store = db.store.clone().with_lapse_policy(LapsePolicy::MarkUnknown { ttl }).unwrap();
    assert_eq!(store.lapse_policy(), LapsePolicy::MarkUnknown { ttl });
    conformance::run_mark_unknown(&store, ttl, true).await;
    conformance::reconcile_as_checked(&store).await;
    let refused =
        db.store.clone().with_lapse_policy(LapsePolicy::MarkUnknown { ttl: Duration::ZERO });
    assert!(matches!(refused, Err(StoreError::InvalidInput(_))), "{refused:?}");
    db.drop().await;
}

/// Two `Tiered` instances (separate caches, separate pools) over one schema, hammered
/// with concurrent duplicates: each key runs once; a restarted one replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn two_tiered_instances_execute_each_key_exactly_once() {
    let Some(db) = Db::new("tiered").await else { return };
    let options = db.store.pool().connect_options().as_ref().clone();
    let other = || PgStore::from_pool(PgPoolOptions::new().connect_lazy_with(options.clone()));
    conformance::tiered_exactly_once(db.store.clone(), other(), other(), "sqlx-pg").await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn concurrent_claims_of_one_key_race_to_exactly_one_acquired() {
    let Some(db) = Db::new("race").await else { return };
    for round in 0..4 {
        let k = key(&format!("race-{round}"));
        let claims: Vec<_> = (0..16)
            .map(|_| {
                let (store, k) = (db.store.clone(), k.clone());
                tokio::spawn(async move { store.claim(&k, fp("r"), LEASE).await.unwrap() })
            })
            .collect();
        let mut acquired = 0;
        for claim in claims {
            match claim.await.unwrap() {
                StoreClaim::Acquired { .. } => acquired += 1,
                StoreClaim::InProgress { .. } => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(acquired, 1, "round {round}: exactly one claim acquired");
    }
    db.drop().await;
}

/// Rows the schema allows but the store cannot read (an UNKNOWN without its mark time,
/// a fingerprint of the wrong length, a state the decoding does not know) are
/// `Corrupt` naming their key; named, the record can be forgotten.
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn rows_the_store_cannot_read_are_corrupt_not_a_panic() {
    let Some(db) = Db::new("corrupt").await else { return };
    let store = &db.store;
    let k = key("sqlx-no-mark");
    let token = acquire(store, &k).await;
    store.mark_unknown(&k, token, TTL).await.unwrap();
    let table = format!("{}.idemcache_records", db.schema);
    db.execute(format!("UPDATE {table} SET settled_at = NULL")).await;
    match store.list_unknown(10).await {
        Err(StoreError::Corrupt(why)) => assert!(why.contains("sqlx-no-mark"), "{why}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    db.execute(format!("UPDATE {table} SET fingerprint = '\\x010203'::bytea")).await;
    match store.claim(&k, fp("r"), LEASE).await {
        Err(StoreError::Corrupt(why)) => {
            assert!(why.contains("sqlx-no-mark") && why.contains("16 bytes"), "{why}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    store.forget(&k).await.unwrap();
    assert!(store.list_unknown(10).await.unwrap().is_empty());

    // A state the contract does not know (the schema's CHECK dropped, as a hand-made
    // table might lack it), and a state column of another type.
    let k = key("sqlx-odd-state");
    let token = acquire(store, &k).await;
    store.complete(&k, token, None, TTL).await.unwrap();
    db.execute(format!("ALTER TABLE {table} DROP CONSTRAINT idemcache_records_state_check")).await;
    db.execute(format!("UPDATE {table} SET state = 7")).await;
    match store.claim(&k, fp("r"), LEASE).await {
        Err(StoreError::Corrupt(why)) => {
            assert!(why.contains("sqlx-odd-state") && why.contains("state is 7"), "{why}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    db.execute(format!("ALTER TABLE {table} ALTER COLUMN state TYPE integer")).await;
    // A new pool: the old one's prepared statements return the old column types.
    let options = store.pool().connect_options().as_ref().clone();
    let store = PgStore::from_pool(PgPoolOptions::new().connect_lazy_with(options));
    match store.claim(&k, fp("r"), LEASE).await {
        Err(StoreError::Corrupt(why)) => {
            assert!(why.contains("sqlx-odd-state") && why.contains("column state"), "{why}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    db.drop().await;
}

/// `complete_in`: rolled back, the record stays PROCESSING; committed, it replays; a
/// stale token is refused and its transaction can roll back.
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_completion_in_the_callers_transaction_commits_with_it() {
    let Some(db) = Db::new("in_tx").await else { return };
    let store = &db.store;
    let k = key("sqlx-in-tx");
    let token = acquire(store, &k).await;
    let claim = OpenClaim::new(k.clone(), token, TTL);

    let mut tx = store.pool().begin().await.unwrap();
    PgStore::complete_in(&mut tx, &claim, Some(b"paid")).await.unwrap();
    assert!(claim.handed_over());
    tx.rollback().await.unwrap();
    assert!(matches!(
        store.claim(&k, fp("r"), LEASE).await.unwrap(),
        StoreClaim::InProgress { .. }
    ));

    let mut tx = store.pool().begin().await.unwrap();
    let record = PgStore::complete_in(&mut tx, &claim, Some(b"paid")).await.unwrap();
    tx.commit().await.unwrap();
    match store.claim(&k, fp("r"), LEASE).await.unwrap() {
        StoreClaim::Completed(replay) => assert_eq!(replay, record),
        other => panic!("{other:?}"),
    }

    let stale = OpenClaim::new(k.clone(), token, TTL);
    let mut tx = store.pool().begin().await.unwrap();
    let refused = PgStore::complete_in(&mut tx, &stale, Some(b"again")).await;
    assert!(matches!(refused, Err(StoreError::LeaseLost(_))), "{refused:?}");
    tx.rollback().await.unwrap();
    db.drop().await;
}

#[tokio::test]
async fn an_unreachable_server_is_a_typed_error_naming_it() {
    let store = PgStore::connect("postgres://postgres@127.0.0.1:1/test").await.unwrap();
    match store.claim(&key("down"), fp("r"), LEASE).await {
        Err(e @ StoreError::Backend(_)) => {
            assert!(e.to_string().contains("PostgreSQL at 127.0.0.1:1/test"), "{e}")
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    let refused = PgStore::connect("postgres://app:p@ss/word@db/x").await;
    assert!(matches!(refused, Err(StoreError::InvalidInput(_))), "{refused:?}");
}

/// One schema, two drivers: what one store wrote, the other reads and settles alike
/// (the claim, the fencing, the UNKNOWN listing and its settling, the token order).
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn the_tokio_postgres_store_and_this_one_share_a_table() {
    let Some(db) = Db::new("shared").await else { return };
    let scoped = postgres_url_in_schema(&db.url, &db.schema);
    let theirs = PostgresStore::connect(&scoped).await.unwrap();
    theirs.ensure_schema().await.unwrap();
    let ours = &db.store;

    let k = key("shared-complete");
    let token = acquire(&theirs, &k).await;
    assert!(matches!(ours.claim(&k, fp("r"), LEASE).await.unwrap(), StoreClaim::InProgress { .. }));
    assert_eq!(ours.claim(&k, fp("other"), LEASE).await.unwrap(), StoreClaim::Mismatch);
    let stale = idemcache::FencingToken::new(token.get() + 1);
    let refused = ours.complete(&k, stale, None, TTL).await;
    assert!(matches!(refused, Err(StoreError::LeaseLost(_))), "{refused:?}");
    let record = ours.complete(&k, token, Some("done".into()), TTL).await.unwrap();
    match theirs.claim(&k, fp("r"), LEASE).await.unwrap() {
        StoreClaim::Completed(replay) => assert_eq!(replay, record),
        other => panic!("{other:?}"),
    }

    let k = key("shared-unknown");
    let token = acquire(ours, &k).await;
    theirs.mark_unknown(&k, token, TTL).await.unwrap();
    let listed = ours.list_unknown(usize::MAX).await.unwrap();
    let entry = listed.iter().find(|u| u.key == k).expect("listed by the other driver");
    assert_eq!((entry.token, entry.fingerprint), (token, fp("r")));
    theirs.resolve_listed(entry, Some("checked".into()), TTL).await.unwrap();
    match ours.claim(&k, fp("r"), LEASE).await.unwrap() {
        StoreClaim::Completed(replay) => assert_eq!(replay.body.unwrap(), "checked"),
        other => panic!("{other:?}"),
    }
    // One sequence: each driver's next token is above the other's last.
    let mine = acquire(ours, &key("shared-order-1")).await;
    let next = acquire(&theirs, &key("shared-order-2")).await;
    assert!(next > mine && mine > token, "{token} < {mine} < {next}");
    db.drop().await;
}

/// A records table an earlier release made (no `correlation_id` column) is brought up
/// to date by `ensure_schema`; a claim then keeps its correlation id.
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn an_earlier_releases_table_gains_the_correlation_id_column() {
    let Some(db) = Db::new("upgrade").await else { return };
    db.execute(format!(
        "DROP TABLE {0}.idemcache_records;
         CREATE TABLE {0}.idemcache_records (
            key BYTEA PRIMARY KEY, fingerprint BYTEA NOT NULL, state SMALLINT NOT NULL,
            token BIGINT NOT NULL, body BYTEA, started_at BIGINT NOT NULL, settled_at BIGINT,
            expires_at BIGINT NOT NULL);
         CREATE INDEX idemcache_records_expiry ON {0}.idemcache_records (expires_at);",
        db.schema
    ))
    .await;
    db.store.ensure_schema().await.unwrap();
    db.store.ensure_schema().await.unwrap();
    let id = idemcache::CorrelationId::new("req-upgraded").unwrap();
    let k = key("upgraded");
    let claimed = db.store.claim_correlated(&k, fp("a"), LEASE, Some(&id)).await.unwrap();
    assert!(matches!(claimed, StoreClaim::Acquired { .. }), "{claimed:?}");
    let stored: Option<String> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT correlation_id FROM {}.idemcache_records WHERE key = $1",
        db.schema
    )))
    .bind(k.as_bytes())
    .fetch_one(&db.admin)
    .await
    .unwrap();
    assert_eq!(stored.as_deref(), Some(id.as_str()));
    db.drop().await;
}
