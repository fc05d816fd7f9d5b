//! `PgStore` against a real PostgreSQL (`IDEMCACHE_POSTGRES_URL`; skipped with a printed
//! reason when unset): the suite both sqlx engines share (`common::store_suite!`: the
//! conformance suite, the `MarkUnknown` sub-suite, concurrent claims of an absent or
//! dead key race to exactly one Acquired, unreadable rows are `Corrupt`, a completion in
//! the caller's transaction commits or rolls back with it), and what is PostgreSQL's
//! own: a state the decoding does not know or of another type is `Corrupt`, one table
//! written by this store and by `idemcache-postgres`'s (tokio-postgres) behaves as one
//! store, and an earlier release's table is brought up to date.
//!
//! Every test works in a schema of its own (pid and counter in the name), selected by
//! its pool's `search_path`, and drops it: no other suite on the same database (the
//! tokio-postgres store's, purging under another policy) meets its records.

#[macro_use]
mod common;

use std::sync::atomic::{AtomicU32, Ordering};

use idemcache::store::conformance::{postgres_url_in_schema, service_url};
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

    /// A store over a new pool in this schema (another process's, or a restart's).
    fn another(&self) -> PgStore {
        let options = self.store.pool().connect_options().as_ref().clone();
        PgStore::from_pool(PgPoolOptions::new().max_connections(8).connect_lazy_with(options))
    }

    /// The records table's qualified name.
    fn records(&self) -> String {
        format!("{}.idemcache_records", self.schema)
    }

    async fn execute(&self, sql: String) {
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(&self.admin).await.unwrap();
    }

    async fn drop(self) {
        self.execute(format!("DROP SCHEMA {} CASCADE", self.schema)).await;
    }
}

store_suite!(
    store: PgStore,
    needs: "needs IDEMCACHE_POSTGRES_URL",
    said: "PgStore { server: \"PostgreSQL at ",
    down: "postgres://postgres@127.0.0.1:1/test",
    named: "PostgreSQL at 127.0.0.1:1/test",
    unparsable: "postgres://app:p@ss/word@db/x",
    tag: "sqlx-pg",
    short_fingerprint: "fingerprint = '\\x010203'::bytea"
);

/// A state the decoding does not know, or a state column of another type, is
/// `Corrupt` naming the key and what it found, never a panic.
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn an_unknown_state_or_a_column_of_another_type_is_corrupt_not_a_panic() {
    let Some(db) = Db::new("odd_state").await else { return };
    let store = &db.store;
    let table = db.records();
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
    let store = db.another();
    match store.claim(&k, fp("r"), LEASE).await {
        Err(StoreError::Corrupt(why)) => {
            assert!(why.contains("sqlx-odd-state") && why.contains("column state"), "{why}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    db.drop().await;
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
