//! `MySqlStore` against a real MySQL or MariaDB (`IDEMCACHE_MYSQL_URL`; skipped with a
//! printed reason when unset): the suite both sqlx engines share (`common::store_suite!`:
//! the conformance suite, the `MarkUnknown` sub-suite, concurrent claims of an absent or
//! dead key race to exactly one Acquired, unreadable rows are `Corrupt`, a completion in
//! the caller's transaction commits or rolls back with it), and what is MySQL's own:
//! tokens keep increasing for a new pool (a restart) and across the upgrade of the token
//! counter, a missing sequence is named, a column of another type is `Corrupt`, a
//! session's time zone does not move the store's clock, a refused connection is named.
//!
//! Every test works in a database of its own (pid and counter in the name) and drops
//! it: no other suite on the same server meets its records.

#[macro_use]
mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idemcache::store::conformance::service_url;
use idemcache_sqlx::MySqlStore;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, MySqlPool};

const EXAMPLE: &str = "mysql://root@127.0.0.1:3306/test";

/// A database of this test's own, and a store whose pool works in it (schema ensured).
struct Db {
    admin: MySqlPool,
    name: String,
    options: MySqlConnectOptions,
    store: MySqlStore,
}

impl Db {
    async fn new(test: &str) -> Option<Db> {
        static N: AtomicU32 = AtomicU32::new(0);
        let url = service_url("IDEMCACHE_MYSQL_URL", EXAMPLE)?;
        let n = N.fetch_add(1, Ordering::Relaxed);
        let name = format!("idemcache_sqlx_{test}_{}_{n}", std::process::id());
        let admin = MySqlPoolOptions::new().max_connections(1).connect(&url).await.unwrap();
        let create = format!("DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name}");
        sqlx::raw_sql(AssertSqlSafe(create)).execute(&admin).await.unwrap();
        let options: MySqlConnectOptions = url.parse().unwrap();
        let options = options.database(&name);
        let store = Db::store(&options);
        store.ensure_schema().await.unwrap();
        Some(Db { admin, name, options, store })
    }

    /// A store over a new pool on the database of `options`.
    fn store(options: &MySqlConnectOptions) -> MySqlStore {
        MySqlStore::from_pool(
            MySqlPoolOptions::new().max_connections(8).connect_lazy_with(options.clone()),
        )
    }

    /// A store over a new pool on this database (another process's, or a restart's).
    fn another(&self) -> MySqlStore {
        Db::store(&self.options)
    }

    /// The records table's qualified name.
    fn records(&self) -> String {
        format!("{}.idemcache_records", self.name)
    }

    async fn execute(&self, sql: String) {
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(&self.admin).await.unwrap();
    }

    async fn drop(self) {
        self.execute(format!("DROP DATABASE {}", self.name)).await;
    }
}

store_suite!(
    store: MySqlStore,
    needs: "needs IDEMCACHE_MYSQL_URL",
    said: "MySqlStore { server: \"MySQL at ",
    down: "mysql://root@127.0.0.1:1/test",
    named: "MySQL at 127.0.0.1:1/test",
    unparsable: "mysql://app:p@ss/word@db/x",
    tag: "sqlx-my",
    short_fingerprint: "fingerprint = x'010203'"
);

/// The sequence is durable: a new pool (a restarted process) is handed larger tokens,
/// a database an earlier release counted in (`idemcache_tokens`) is handed tokens 2^32
/// above that counter once the schema is ensured, and with the sequence gone a claim is
/// a typed error naming it.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn tokens_increase_across_pools_and_upgrades_and_a_missing_sequence_is_named() {
    let Some(db) = Db::new("tokens").await else { return };
    let first = acquire(&db.store, &key("tokens-1")).await;
    let restarted = Db::store(&db.options);
    let second = acquire(&restarted, &key("tokens-2")).await;
    assert!(second > first, "{second} after {first}");
    // An earlier release's processes went on counting far beyond this sequence.
    let earlier = u64::MAX >> 8;
    db.execute(format!("UPDATE {}.idemcache_tokens SET next = {earlier}", db.name)).await;
    restarted.ensure_schema().await.unwrap();
    let upgraded = acquire(&restarted, &key("tokens-3")).await;
    assert!(upgraded.get() > earlier + (1 << 32), "{upgraded:?} after the counter's {earlier}");
    db.execute(format!("DROP TABLE {}.idemcache_token_seq", db.name)).await;
    match restarted.claim(&key("tokens-4"), fp("r"), LEASE).await {
        Err(StoreError::Backend(why)) => {
            assert!(why.to_string().contains("idemcache_token_seq"), "{why}")
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    db.drop().await;
}

/// A column of another type than the schema's is `Corrupt` naming the key and the
/// column, never a panic.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_column_of_another_type_is_corrupt_not_a_panic() {
    let Some(db) = Db::new("odd_type").await else { return };
    let store = &db.store;
    let table = db.records();
    let k = key("sqlx-odd-type");
    let token = acquire(store, &k).await;
    store.complete(&k, token, None, TTL).await.unwrap();
    db.execute(format!("ALTER TABLE {table} MODIFY token VARCHAR(20) NOT NULL")).await;
    // A new pool: the old one's prepared statements know the old column types.
    let store = db.another();
    match store.claim(&k, fp("r"), LEASE).await {
        Err(StoreError::Corrupt(why)) => {
            assert!(why.contains("sqlx-odd-type") && why.contains("column token"), "{why}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    db.drop().await;
}

/// Times are the server's UTC microseconds whatever a session's time zone: a handle
/// whose sessions run at +05:00 reads the lease a UTC handle's claim set, to the
/// microsecond, and its own claims' leases end when the UTC handle's do (within the
/// moment between them), not five hours apart.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_sessions_time_zone_does_not_move_the_stores_clock() {
    let Some(db) = Db::new("zone").await else { return };
    let zoned = Db::store(&db.options.clone().timezone(Some("+05:00".to_owned())));
    let k = key("zone-held");
    let StoreClaim::Acquired { lease_ends_at, .. } =
        db.store.claim(&k, fp("r"), LEASE).await.unwrap()
    else {
        panic!("expected Acquired")
    };
    match zoned.claim(&k, fp("r"), LEASE).await.unwrap() {
        StoreClaim::InProgress { lease_ends_at: seen } => assert_eq!(seen, lease_ends_at),
        other => panic!("{other:?}"),
    }
    let StoreClaim::Acquired { lease_ends_at: zoned_end, .. } =
        zoned.claim(&key("zone-other"), fp("r"), LEASE).await.unwrap()
    else {
        panic!("expected Acquired")
    };
    let apart = zoned_end.duration_since(lease_ends_at).unwrap_or_default();
    assert!(apart < Duration::from_secs(60), "the zoned lease ends {apart:?} later");
    assert!(zoned_end >= lease_ends_at, "claimed after, so it ends after");
    db.drop().await;
}

/// A records table an earlier release made (no `correlation_id` column) is brought up
/// to date by `ensure_schema`, keeping its rows; a claim then keeps its correlation id,
/// and a takeover replaces it.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn an_earlier_releases_table_gains_the_correlation_id_column() {
    let Some(db) = Db::new("upgrade").await else { return };
    db.execute(format!(
        "DROP TABLE {0}.idemcache_records;
         CREATE TABLE {0}.idemcache_records (
            `key` VARBINARY(1536) NOT NULL PRIMARY KEY, fingerprint VARBINARY(255) NOT NULL,
            state SMALLINT NOT NULL, token BIGINT NOT NULL, body LONGBLOB,
            started_at BIGINT NOT NULL, settled_at BIGINT, expires_at BIGINT NOT NULL,
            INDEX idemcache_records_expiry (expires_at)) ENGINE = InnoDB",
        db.name
    ))
    .await;
    db.store.ensure_schema().await.unwrap();
    db.store.ensure_schema().await.unwrap();
    let id = idemcache::CorrelationId::new("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
    let k = key("upgraded");
    let claimed = db.store.claim_correlated(&k, fp("a"), LEASE, Some(&id)).await.unwrap();
    assert!(matches!(claimed, StoreClaim::Acquired { .. }), "{claimed:?}");
    let stored: Option<String> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT correlation_id FROM {}.idemcache_records WHERE `key` = ?",
        db.name
    )))
    .bind(k.as_bytes())
    .fetch_one(&db.admin)
    .await
    .unwrap();
    assert_eq!(stored.as_deref(), Some(id.as_str()));
    db.drop().await;
}

/// A server that refuses connections is answered at once, with the cause and the
/// server's address: sqlx's pool alone retries a refused connection until its acquire
/// timeout (5 s) and then says only "pool timed out while waiting for an open
/// connection". Needs no server: the port is one nothing listens on.
#[tokio::test]
async fn a_refused_connection_is_named_as_refused_not_a_pool_timeout() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let store = MySqlStore::connect(&format!("mysql://root@127.0.0.1:{port}/test")).await.unwrap();
    let error = store.claim(&key("refused"), fp("r"), LEASE).await.unwrap_err();
    let said = error.to_string();
    assert!(matches!(error, StoreError::Backend(_)), "{error:?}");
    assert!(said.contains("refused") && said.contains(&port.to_string()), "{said}");
}

/// A key's tokens only grow: eight claims at once with a 1 ms lease, forty times, and
/// the record ends under the largest token any claim acquired. (A claim that minted
/// before a later claim took the key, and found that one dead in turn, took it over
/// under its older, lower token: 20 rounds in 40 before a takeover minted again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_takeover_never_carries_a_token_below_the_record_it_replaces() {
    let Some(db) = Db::new("monotonic").await else { return };
    let mut lowered = Vec::new();
    for round in 0..40 {
        let k = key(&format!("monotonic-{round}"));
        let claims: Vec<_> = (0..8)
            .map(|i| {
                let (store, k) = (db.store.clone(), k.clone());
                let asked = fp(&format!("r{i}"));
                tokio::spawn(async move { store.claim(&k, asked, Duration::from_millis(1)).await })
            })
            .collect();
        let mut acquired = Vec::new();
        for claim in claims {
            if let StoreClaim::Acquired { token, .. } = claim.await.unwrap().unwrap() {
                acquired.push(token.get());
            }
        }
        let sql = "SELECT token FROM idemcache_records WHERE `key` = ?";
        let last: i64 =
            sqlx::query_scalar(sql).bind(k.as_bytes()).fetch_one(db.store.pool()).await.unwrap();
        if Some(last as u64) < acquired.iter().copied().max() {
            lowered.push((round, acquired, last));
        }
    }
    assert!(lowered.is_empty(), "{} rounds lowered a token: {:?}", lowered.len(), lowered.first());
    db.drop().await;
}
