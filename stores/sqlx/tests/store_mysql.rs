//! `MySqlStore` against a real MySQL or MariaDB (`IDEMCACHE_MYSQL_URL`; skipped with a
//! printed reason when unset): the conformance suite, the `MarkUnknown` sub-suite,
//! concurrent claims of one key (absent, or dead) race to exactly one Acquired, tokens
//! keep increasing for a new pool (a restart), a session's time zone does not move the
//! store's clock, rows the store cannot read are `Corrupt` naming their key (never a
//! panic), a missing token counter is a typed error, a completion in the caller's
//! transaction commits or rolls back with it and is fenced by its token.
//!
//! Every test works in a database of its own (pid and counter in the name) and drops
//! it: no other suite on the same server meets its records.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idemcache::store::conformance::{self, acquire, fp, key, service_url, LEASE, TTL};
use idemcache::store::{OpenClaim, Store, StoreClaim, StoreError};
use idemcache::LapsePolicy;
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

    /// A store over a new pool on this database (another process's, or a restart's).
    fn store(options: &MySqlConnectOptions) -> MySqlStore {
        MySqlStore::from_pool(
            MySqlPoolOptions::new().max_connections(8).connect_lazy_with(options.clone()),
        )
    }

    async fn execute(&self, sql: String) {
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(&self.admin).await.unwrap();
    }

    async fn drop(self) {
        self.execute(format!("DROP DATABASE {}", self.name)).await;
    }
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn mysql_conforms() {
    let Some(db) = Db::new("conforms").await else { return };
    conformance::run(&db.store).await;
    conformance::run(&db.store).await;
    // The schema again, on a database that has it: nothing changes.
    db.store.ensure_schema().await.unwrap();
    let said = format!("{:?}", db.store);
    assert!(said.starts_with("MySqlStore { server: \"MySQL at "), "{said}");
    db.drop().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn mysql_under_mark_unknown_never_re_runs_a_lapsed_lease() {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn two_tiered_instances_execute_each_key_exactly_once() {
    let Some(db) = Db::new("tiered").await else { return };
    let (second, restarted) = (Db::store(&db.options), Db::store(&db.options));
    conformance::tiered_exactly_once(db.store.clone(), second, restarted, "sqlx-my").await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn concurrent_claims_of_one_key_race_to_exactly_one_acquired() {
    let Some(db) = Db::new("race").await else { return };
    for round in 0..4 {
        let k = key(&format!("race-{round}"));
        let claims: Vec<_> = (0..16)
            .map(|i| {
                // Two pools: two processes' worth of connections.
                let store = if i % 2 == 0 { db.store.clone() } else { Db::store(&db.options) };
                let k = k.clone();
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

/// A dead record (its lease ended a minute ago, as the server's clock has it) claimed
/// by 16 at once from two pools: one takes it over under a new token, the rest find it
/// in progress, and the dead lease's token is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn concurrent_claims_of_a_dead_record_race_to_exactly_one_takeover() {
    let Some(db) = Db::new("takeover").await else { return };
    let k = key("takeover");
    let stale = acquire(&db.store, &k).await;
    let table = format!("{}.idemcache_records", db.name);
    // The lease's end a minute in the past: the lease and a minute before the claim.
    let back = 60_000_000 + LEASE.as_micros();
    db.execute(format!("UPDATE {table} SET expires_at = expires_at - {back}")).await;
    let claims: Vec<_> = (0..16)
        .map(|i| {
            let store = if i % 2 == 0 { db.store.clone() } else { Db::store(&db.options) };
            let k = k.clone();
            tokio::spawn(async move { store.claim(&k, fp("r"), LEASE).await.unwrap() })
        })
        .collect();
    let mut fresh = Vec::new();
    for claim in claims {
        match claim.await.unwrap() {
            StoreClaim::Acquired { token, .. } => fresh.push(token),
            StoreClaim::InProgress { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(fresh.len(), 1, "exactly one claim took the dead record over: {fresh:?}");
    assert!(fresh[0] > stale);
    let late = db.store.complete(&k, stale, None, TTL).await;
    assert!(matches!(late, Err(StoreError::LeaseLost(_))), "{late:?}");
    db.store.complete(&k, fresh[0], None, TTL).await.unwrap();
    db.drop().await;
}

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

/// Rows the schema allows but the store cannot read (an UNKNOWN without its mark time,
/// a fingerprint of the wrong length, a column of another type) are `Corrupt` naming
/// their key; named, the record can be forgotten.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn rows_the_store_cannot_read_are_corrupt_not_a_panic() {
    let Some(db) = Db::new("corrupt").await else { return };
    let store = &db.store;
    let k = key("sqlx-no-mark");
    let token = acquire(store, &k).await;
    store.mark_unknown(&k, token, TTL).await.unwrap();
    let table = format!("{}.idemcache_records", db.name);
    db.execute(format!("UPDATE {table} SET settled_at = NULL")).await;
    match store.list_unknown(10).await {
        Err(StoreError::Corrupt(why)) => assert!(why.contains("sqlx-no-mark"), "{why}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    db.execute(format!("UPDATE {table} SET fingerprint = x'010203'")).await;
    match store.claim(&k, fp("r"), LEASE).await {
        Err(StoreError::Corrupt(why)) => {
            assert!(why.contains("sqlx-no-mark") && why.contains("16 bytes"), "{why}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    store.forget(&k).await.unwrap();
    assert!(store.list_unknown(10).await.unwrap().is_empty());

    let k = key("sqlx-odd-type");
    let token = acquire(store, &k).await;
    store.complete(&k, token, None, TTL).await.unwrap();
    db.execute(format!("ALTER TABLE {table} MODIFY token VARCHAR(20) NOT NULL")).await;
    // A new pool: the old one's prepared statements know the old column types.
    let store = Db::store(&db.options);
    match store.claim(&k, fp("r"), LEASE).await {
        Err(StoreError::Corrupt(why)) => {
            assert!(why.contains("sqlx-odd-type") && why.contains("column token"), "{why}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    db.drop().await;
}

/// `complete_in`: rolled back, the record stays PROCESSING; committed, it replays; a
/// stale token is refused and its transaction can roll back.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_completion_in_the_callers_transaction_commits_with_it() {
    let Some(db) = Db::new("in_tx").await else { return };
    let store = &db.store;
    let k = key("sqlx-in-tx");
    let token = acquire(store, &k).await;
    let claim = OpenClaim::new(k.clone(), token, TTL);

    let mut tx = store.pool().begin().await.unwrap();
    MySqlStore::complete_in(&mut tx, &claim, Some(b"paid")).await.unwrap();
    assert!(claim.handed_over());
    tx.rollback().await.unwrap();
    assert!(matches!(
        store.claim(&k, fp("r"), LEASE).await.unwrap(),
        StoreClaim::InProgress { .. }
    ));

    let mut tx = store.pool().begin().await.unwrap();
    let record = MySqlStore::complete_in(&mut tx, &claim, Some(b"paid")).await.unwrap();
    tx.commit().await.unwrap();
    match store.claim(&k, fp("r"), LEASE).await.unwrap() {
        StoreClaim::Completed(replay) => assert_eq!(replay, record),
        other => panic!("{other:?}"),
    }

    let stale = OpenClaim::new(k.clone(), token, TTL);
    let mut tx = store.pool().begin().await.unwrap();
    let refused = MySqlStore::complete_in(&mut tx, &stale, Some(b"again")).await;
    assert!(matches!(refused, Err(StoreError::LeaseLost(_))), "{refused:?}");
    tx.rollback().await.unwrap();
    db.drop().await;
}

#[tokio::test]
async fn an_unreachable_server_is_a_typed_error_naming_it() {
    let store = MySqlStore::connect("mysql://root@127.0.0.1:1/test").await.unwrap();
    match store.claim(&key("down"), fp("r"), LEASE).await {
        Err(e @ StoreError::Backend(_)) => {
            assert!(e.to_string().contains("MySQL at 127.0.0.1:1/test"), "{e}")
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    let refused = MySqlStore::connect("mysql://app:p@ss/word@db/x").await;
    assert!(matches!(refused, Err(StoreError::InvalidInput(_))), "{refused:?}");
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
