//! `PostgresStore` against a real server (`IDEMCACHE_POSTGRES_URL`; skipped with a
//! printed reason when unset): the conformance suite under both lapse policies, the
//! schema, rows it cannot read, races, an unreachable server, and the classifier.
//!
//! Tests that write records a purge of another policy must not meet run on a schema of
//! their own, first on the store's search path.

use std::time::Duration;

use idemcache::store::conformance::{
    self, acquire, fp, key, postgres_url_in_schema, LEASE, SHORT_LEASE, TTL,
};
use idemcache::store::{Store, StoreError, Tiered};
use idemcache::{Cache, LapsePolicy};
use idemcache_postgres::{tokio_postgres, PostgresStore};

/// How long a lapse stays UNKNOWN in the `MarkUnknown` tests.
const UNKNOWN_TTL: Duration = Duration::from_secs(3600);

/// `IDEMCACHE_POSTGRES_URL`, or `None` after saying the test is skipped.
fn postgres_url() -> Option<String> {
    conformance::service_url("IDEMCACHE_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
}

/// A `MarkUnknown` store on a new schema, its schema created; the admin client and the
/// schema's name, to drop it after.
async fn marking_store(name: &str) -> Option<(tokio_postgres::Client, PostgresStore, String)> {
    let marking = LapsePolicy::MarkUnknown { ttl: UNKNOWN_TTL };
    let (admin, store, schema) = in_a_schema_of_its_own(&format!("lapse_{name}"), marking).await?;
    store.ensure_schema().await.unwrap();
    Some((admin, store, schema))
}

/// A plain client of the server at `url`, for setting up and looking at what the
/// store did.
async fn client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

async fn store() -> Option<PostgresStore> {
    let url = postgres_url()?;
    let store = PostgresStore::connect(&url).await.unwrap();
    store.ensure_schema().await.unwrap();
    Some(store)
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn postgres_conforms() {
    let Some(store) = store().await else { return };
    conformance::run(&store).await;
    assert!(format!("{store:?}").starts_with("PostgresStore { server: Some("), "{store:?}");
}

/// `ensure_schema` against a database that has none of it: every object the store
/// needs is created (the other tests run on a database that keeps its schema).
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn the_schema_is_created_in_an_empty_database() {
    let Some((admin, store, schema)) = store_in_a_schema_of_its_own("fresh").await else {
        return;
    };
    store.ensure_schema().await.unwrap();
    let created = admin
        .query_one(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname IN
               ('idemcache_records', 'idemcache_tokens', 'idemcache_records_expiry')",
            &[&schema],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(created, 3, "the table, the token sequence and the expiry index");
    conformance::run(&store).await;
    admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.unwrap();
}

/// A plain client, and a store on a schema of its own first on its search path,
/// empty as a new database is (and whatever a test writes there meets no other test).
async fn store_in_a_schema_of_its_own(
    name: &str,
) -> Option<(tokio_postgres::Client, PostgresStore, String)> {
    in_a_schema_of_its_own(name, LapsePolicy::TakeOver).await
}

/// [`store_in_a_schema_of_its_own`], its store under `lapse_policy`, its schema created.
async fn in_a_schema_of_its_own(
    name: &str,
    lapse_policy: LapsePolicy,
) -> Option<(tokio_postgres::Client, PostgresStore, String)> {
    let url = postgres_url()?;
    let admin = client(&url).await;
    let schema = format!("idemcache_{name}_{}", std::process::id());
    admin
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};"))
        .await
        .unwrap();
    let own = postgres_url_in_schema(&url, &schema);
    let store =
        PostgresStore::connect(&own).await.unwrap().with_lapse_policy(lapse_policy).unwrap();
    Some((admin, store, schema))
}

/// Rows the schema allows but the store cannot read (an UNKNOWN without its mark
/// time, a fingerprint of the wrong length) are `Corrupt` naming their key, never a
/// panic; named, the record can be forgotten and the listing works again.
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn rows_the_store_cannot_read_are_corrupt_not_a_panic() {
    let Some((admin, store, schema)) = store_in_a_schema_of_its_own("corrupt").await else {
        return;
    };
    store.ensure_schema().await.unwrap();
    let k = key("no-mark");
    let token = acquire(&store, &k).await;
    store.mark_unknown(&k, token, TTL).await.unwrap();
    let table = format!("{schema}.idemcache_records");
    let update = |set: &str| format!("UPDATE {table} SET {set}");
    admin.execute(&update("settled_at = NULL"), &[]).await.unwrap();
    match store.list_unknown(10).await {
        Err(StoreError::Corrupt(why)) => assert!(why.contains("no-mark"), "{why}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    admin.execute(&update("fingerprint = '\\x010203'::bytea"), &[]).await.unwrap();
    match store.claim(&k, fp("r"), LEASE).await {
        Err(StoreError::Corrupt(why)) => {
            assert!(why.contains("no-mark") && why.contains("16 bytes"), "{why}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    store.forget(&k).await.unwrap();
    assert!(store.list_unknown(10).await.unwrap().is_empty());
    admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.unwrap();
}

/// The record reads name a row they cannot read `Corrupt`, and a row whose key bytes
/// are not an idemcache key (another program's) by those bytes: `record` of a key with
/// such a row, and `records` on the first one it scans (never skipped silently); a
/// listing of a scope reads that scope's key range only, and is not stopped by them.
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn record_reads_name_unreadable_and_foreign_rows() {
    use idemcache::store::{RecordFilter, RecordState};
    let Some((admin, store, schema)) = store_in_a_schema_of_its_own("records").await else {
        return;
    };
    store.ensure_schema().await.unwrap();
    let k = key("short-fp");
    let token = acquire(&store, &k).await;
    store.complete(&k, token, None, TTL).await.unwrap();
    let table = format!("{schema}.idemcache_records");
    admin
        .execute(&format!("UPDATE {table} SET fingerprint = '\\x0102'::bytea"), &[])
        .await
        .unwrap();
    match store.record(&k).await {
        Err(StoreError::Corrupt(why)) => assert!(why.contains("short-fp"), "{why}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let listed = store.records(&RecordFilter::new(), None, 10).await;
    assert!(matches!(listed, Err(StoreError::Corrupt(_))), "{listed:?}");
    match store.remove_record(&k, &RecordState::ALL).await {
        Err(StoreError::Corrupt(why)) => assert!(why.ends_with("(it was deleted)"), "{why}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(store.record(&k).await.unwrap(), None, "the garbled record is gone");
    let foreign = format!(
        "INSERT INTO {table} VALUES ('\\xff00'::bytea, '\\x00000000000000000000000000000000'::bytea,
         2, 1, NULL, 0, 1, 9000000000000000)"
    );
    admin.batch_execute(&foreign).await.unwrap();
    match store.records(&RecordFilter::new(), Some(&k), 10).await {
        Err(StoreError::Corrupt(why)) => assert!(why.contains("ff00"), "{why}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let elsewhere = RecordFilter::new().scope("another scope");
    assert_eq!(store.records(&elsewhere, None, 10).await.unwrap(), vec![]);
    admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.unwrap();
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn concurrent_schema_creation_from_several_processes_is_safe() {
    let Some(store) = store().await else { return };
    let runs: Vec<_> = (0..4).map(|_| store.ensure_schema()).collect();
    for run in runs {
        run.await.unwrap();
    }
}

/// Two `Tiered` instances (separate caches, separate pools: two processes' worth)
/// over one PostgreSQL, hammered with concurrent duplicates: each key runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn two_tiered_instances_execute_each_key_exactly_once() {
    let Some(first) = store().await else { return };
    let url = std::env::var("IDEMCACHE_POSTGRES_URL").unwrap();
    let second = PostgresStore::connect(&url).await.unwrap();
    let restarted = PostgresStore::connect(&url).await.unwrap();
    conformance::tiered_exactly_once(first, second, restarted, "pg-hammer").await;
}

#[tokio::test]
async fn an_unreachable_postgres_is_a_typed_error_and_nothing_executes() {
    // A port nobody listens on.
    let store = PostgresStore::connect("postgres://postgres@127.0.0.1:1/test").await.unwrap();
    let tiered = Tiered::new(Cache::builder().build().unwrap(), store);
    match tiered.claim(&key("down"), fp("r")).await {
        Err(idemcache::store::TieredError::Store(e @ StoreError::Backend(_))) => {
            let said = e.to_string();
            assert!(said.contains("PostgreSQL at 127.0.0.1:1/test"), "names the server: {said}");
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    assert_eq!(tiered.cache().stats().entries, 0);
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn unique_violations_are_classified_against_the_real_engine() {
    use idemcache_postgres::is_unique_violation;
    let Some(url) = postgres_url() else { return };
    let client = client(&url).await;
    let table = format!("idemcache_unique_{}", std::process::id());
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table};
             CREATE TABLE {table} (id INT PRIMARY KEY, u TEXT UNIQUE, n TEXT NOT NULL);
             INSERT INTO {table} VALUES (1, 'a', 'x');"
        ))
        .await
        .unwrap();
    let fails = |sql: String| {
        let client = &client;
        async move { client.execute(&sql, &[]).await.unwrap_err() }
    };
    assert!(is_unique_violation(&fails(format!("INSERT INTO {table} VALUES (2, 'a', 'x')")).await));
    assert!(is_unique_violation(&fails(format!("INSERT INTO {table} VALUES (1, 'b', 'x')")).await));
    assert!(!is_unique_violation(
        &fails(format!("INSERT INTO {table} VALUES (3, 'c', NULL)")).await
    ));
    client.batch_execute(&format!("DROP TABLE {table}")).await.unwrap();
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn postgres_under_mark_unknown_never_re_runs_a_lapsed_lease() {
    let Some((admin, store, schema)) = marking_store("suite").await else { return };
    conformance::run_mark_unknown(&store, UNKNOWN_TTL, true).await;
    conformance::reconcile_as_checked(&store).await;
    admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.unwrap();
}

/// Many claims of one key racing its lapse: none acquires, all that see it lapsed
/// see it UNKNOWN at the lease's end.
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn concurrent_claims_of_a_lapse_all_answer_unknown() {
    let Some((admin, store, schema)) = marking_store("race").await else { return };
    let k = key("raced-lapse");
    let idemcache::store::StoreClaim::Acquired { lease_ends_at, .. } =
        store.claim(&k, fp("r"), SHORT_LEASE).await.unwrap()
    else {
        panic!("expected Acquired");
    };
    let mut unknown = 0;
    while unknown == 0 {
        let claims = (0..8).map(|_| {
            let (store, k) = (store.clone(), k.clone());
            tokio::spawn(async move { store.claim(&k, fp("r"), SHORT_LEASE).await.unwrap() })
        });
        for claim in claims {
            match claim.await.unwrap() {
                idemcache::store::StoreClaim::InProgress { .. } => {}
                idemcache::store::StoreClaim::Unknown { marked_at } => {
                    assert_eq!(marked_at, lease_ends_at);
                    unknown += 1;
                }
                other => panic!("a lapse was answered {other:?}"),
            }
        }
    }
    admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.unwrap();
}
