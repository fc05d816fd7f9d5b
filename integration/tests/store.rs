//! The stores: each passes the conformance suite (`idemcache::store::conformance`), and
//! `Tiered` over it; then what is particular to each (a shared file, unreadable rows, a
//! server killed mid-request). SQLite always (in memory and on a file shared by two
//! stores, as two processes would); PostgreSQL and Redis when their URL is in the
//! environment (CI sets both).

use std::time::Duration;

use idemcache::store::conformance::{self, acquire, fp, key, LEASE, TTL};
use idemcache::store::{Store, StoreClaim, StoreError, Tiered, TieredClaim};
use idemcache::{Bytes, Cache, Key};
use idemcache_postgres::tokio_postgres;
use idemcache_redis::redis;
use idemcache_sqlite::SqliteStore;

/// A store on the SQLite file `url`.
async fn open(url: &str) -> SqliteStore {
    SqliteStore::connect(url).await.unwrap()
}

/// `IDEMCACHE_POSTGRES_URL`, or `None` after saying the test is skipped.
fn postgres_url() -> Option<String> {
    conformance::service_url("IDEMCACHE_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
}

/// `IDEMCACHE_REDIS_STORE_URL`, or `None` after saying the test is skipped. The tests
/// also use (and flush) the database numbered one below it.
fn redis_url() -> Option<String> {
    conformance::service_url("IDEMCACHE_REDIS_STORE_URL", "redis://127.0.0.1:6379/14")
}

async fn sqlite_memory() -> SqliteStore {
    let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
    store.ensure_schema().await.unwrap();
    store.ensure_schema().await.unwrap(); // idempotent
    store
}

#[tokio::test]
async fn sqlite_in_memory_conforms() {
    conformance::run(&sqlite_memory().await).await;
}

#[tokio::test]
async fn two_sqlite_stores_on_one_file_share_records_and_tokens() {
    let dir = std::env::temp_dir().join(format!("idemcache-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("records.db");
    let _ = std::fs::remove_file(&path);
    let url = format!("sqlite:{}", path.display());
    let (a, b) = (open(&url).await, open(&url).await);
    a.ensure_schema().await.unwrap();
    b.ensure_schema().await.unwrap();
    conformance::run(&a).await;
    let k = key("shared");
    let token = acquire(&a, &k).await;
    assert!(matches!(b.claim(&k, fp("r"), LEASE).await.unwrap(), StoreClaim::InProgress { .. }));
    a.complete(&k, token, Some(Bytes::from_static(b"once")), TTL).await.unwrap();
    match b.claim(&k, fp("r"), LEASE).await.unwrap() {
        StoreClaim::Completed(replay) => assert_eq!(replay.body.unwrap(), "once"),
        other => panic!("{other:?}"),
    }
    // A restarted store (a new connection) replays and issues larger tokens.
    drop((a, b));
    let restarted = open(&url).await;
    assert!(matches!(restarted.claim(&k, fp("r"), LEASE).await.unwrap(), StoreClaim::Completed(_)));
    assert!(acquire(&restarted, &key("after-restart")).await > token);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A query string (sqlx's `?mode=rwc`) is refused, not made part of the file's name;
/// the scheme is read in any case.
#[tokio::test]
async fn a_sqlite_url_takes_no_parameters_and_any_case_of_scheme() {
    let dir = std::env::temp_dir().join(format!("idemcache-sqlite-url-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}/records.db?mode=rwc", dir.display());
    let refused = SqliteStore::connect(&url).await;
    assert!(matches!(refused, Err(StoreError::InvalidInput(_))), "{refused:?}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no file was made");
    let store = SqliteStore::connect(&format!("SQLite:{}/records.db", dir.display())).await;
    store.unwrap().ensure_schema().await.unwrap();
    assert!(dir.join("records.db").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sync_code_runs_a_sqlite_store_with_block_on() {
    use idemcache::store::block_on;
    let store = block_on(SqliteStore::connect("sqlite::memory:")).unwrap();
    block_on(store.ensure_schema()).unwrap();
    let k = key("sync");
    let token = block_on(acquire(&store, &k));
    block_on(store.complete(&k, token, Some(Bytes::from_static(b"done")), TTL)).unwrap();
}

#[tokio::test]
async fn tiered_answers_completed_repeats_from_memory_and_reads_through_otherwise() {
    let store = sqlite_memory().await;
    let tiered = Tiered::new(Cache::builder().build().unwrap(), store);
    let k = key("tiered");
    let guard = match tiered.claim(&k, fp("r")).await.unwrap() {
        TieredClaim::Acquired(guard) => guard,
        other => panic!("{other:?}"),
    };
    // A local duplicate is answered by the cache while the store holds the claim.
    assert!(matches!(tiered.claim(&k, fp("r")).await.unwrap(), TieredClaim::InProgress { .. }));
    let record = guard.complete(&b"receipt"[..]).await.unwrap();
    // The durable fact is there.
    assert!(matches!(
        tiered.store().claim(&k, fp("r"), LEASE).await.unwrap(),
        StoreClaim::Completed(_)
    ));
    // The repeat is answered from memory: the cache counts a replay.
    let before = tiered.cache().stats().replayed;
    match tiered.claim(&k, fp("r")).await.unwrap() {
        // The store's own record, times and all, not the cache's idea of them.
        TieredClaim::Completed(replay) => assert_eq!(replay, record),
        other => panic!("{other:?}"),
    }
    assert_eq!(tiered.cache().stats().replayed, before + 1);
    assert!(matches!(tiered.claim(&k, fp("other")).await.unwrap(), TieredClaim::Mismatch));
}

#[tokio::test]
async fn tiered_instances_over_one_store_execute_once_and_a_new_one_reads_through() {
    let dir = std::env::temp_dir().join(format!("idemcache-tiered-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("records.db");
    let _ = std::fs::remove_file(&path);
    let url = format!("sqlite:{}", path.display());
    let open = || async { Tiered::new(Cache::builder().build().unwrap(), open(&url).await) };
    let (one, two) = (open().await, open().await);
    one.store().ensure_schema().await.unwrap();
    let k = key("across");
    let guard = match one.claim(&k, fp("r")).await.unwrap() {
        TieredClaim::Acquired(guard) => guard,
        other => panic!("{other:?}"),
    };
    assert!(matches!(two.claim(&k, fp("r")).await.unwrap(), TieredClaim::InProgress { .. }));
    guard.complete(&b"once"[..]).await.unwrap();
    for tiered in [&two, &open().await] {
        match tiered.claim(&k, fp("r")).await.unwrap() {
            TieredClaim::Completed(replay) => assert_eq!(replay.body.unwrap(), "once"),
            other => panic!("{other:?}"),
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn an_unreachable_store_is_a_typed_error_and_nothing_executes() {
    // A file in a directory that does not exist: the store cannot open it.
    let missing = std::env::temp_dir().join("idemcache-no-such-dir/x/records.db");
    let url = format!("sqlite:{}", missing.display());
    let opened = SqliteStore::connect(&url).await;
    assert!(
        matches!(&opened, Err(StoreError::Backend(e)) if e.to_string().contains("idemcache-no-such-dir")),
        "{opened:?}"
    );
    // A store without its schema fails every claim with a backend error, and the
    // cache in front lets the key go (the next claim asks the store again).
    let bare = SqliteStore::connect("sqlite::memory:").await.unwrap();
    let tiered = Tiered::new(Cache::builder().build().unwrap(), bare);
    let k = key("down");
    for _ in 0..2 {
        match tiered.claim(&k, fp("r")).await {
            Err(idemcache::store::TieredError::Store(StoreError::Backend(_))) => {}
            other => panic!("expected a backend error, got {other:?}"),
        }
    }
    assert_eq!(tiered.cache().stats().entries, 0);
}

/// PostgreSQL, when `IDEMCACHE_POSTGRES_URL` names a server (CI sets it).
mod postgres {
    use super::*;
    use idemcache_postgres::PostgresStore;

    /// A plain client of the server at `url`, for setting up and looking at what the
    /// store did.
    async fn client(url: &str) -> tokio_postgres::Client {
        let (client, connection) =
            tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
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
    async fn postgres_conforms() {
        let Some(store) = store().await else { return };
        conformance::run(&store).await;
        assert!(format!("{store:?}").starts_with("PostgresStore { server: Some("), "{store:?}");
    }

    /// `ensure_schema` against a database that has none of it: every object the store
    /// needs is created (the other tests run on a database that keeps its schema).
    #[tokio::test]
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
        let url = postgres_url()?;
        let admin = client(&url).await;
        let schema = format!("idemcache_{name}_{}", std::process::id());
        admin
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};"
            ))
            .await
            .unwrap();
        let separator = if url.contains('?') { '&' } else { '?' };
        let own = format!("{url}{separator}options=-c%20search_path%3D{schema}");
        Some((admin, PostgresStore::connect(&own).await.unwrap(), schema))
    }

    /// Rows the schema allows but the store cannot read (an UNKNOWN without its mark
    /// time, a fingerprint of the wrong length) are `Corrupt` naming their key, never a
    /// panic; named, the record can be forgotten and the listing works again.
    #[tokio::test]
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

    #[tokio::test]
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
                assert!(
                    said.contains("PostgreSQL at 127.0.0.1:1/test"),
                    "names the server: {said}"
                );
            }
            other => panic!("expected a backend error, got {other:?}"),
        }
        assert_eq!(tiered.cache().stats().entries, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_postgres_killed_mid_request_is_a_typed_error_and_nothing_runs_twice() {
        let Some(_schema) = store().await else { return };
        let url: tokio_postgres::Config =
            std::env::var("IDEMCACHE_POSTGRES_URL").unwrap().parse().unwrap();
        let host = match &url.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(host) => host.clone(),
            other => panic!("a TCP host, got {other:?}"),
        };
        let port = url.get_ports().first().copied().unwrap_or(5432);
        let upstream =
            tokio::net::lookup_host((host.as_str(), port)).await.unwrap().next().unwrap();
        let relay = super::relay::Relay::start(upstream).await;
        let user = url.get_user().unwrap_or("postgres");
        let db = url.get_dbname().unwrap_or("test");
        let through = format!("postgres://{user}@{}/{db}", relay.addr);
        let store = PostgresStore::connect(&through).await.unwrap();
        killed_mid_request(store, &relay, "pg").await;
    }

    #[tokio::test]
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
        assert!(is_unique_violation(
            &fails(format!("INSERT INTO {table} VALUES (2, 'a', 'x')")).await
        ));
        assert!(is_unique_violation(
            &fails(format!("INSERT INTO {table} VALUES (1, 'b', 'x')")).await
        ));
        assert!(!is_unique_violation(
            &fails(format!("INSERT INTO {table} VALUES (3, 'c', NULL)")).await
        ));
        client.batch_execute(&format!("DROP TABLE {table}")).await.unwrap();
    }
}

/// Redis, when `IDEMCACHE_REDIS_STORE_URL` names a server (CI sets it).
mod redis_store {
    use super::*;
    use idemcache_redis::RedisStore;

    /// These tests share one Redis database, and several count what `purge_expired`
    /// trims across the whole UNKNOWN index: one at a time, so that no test's count
    /// includes another's stale members.
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    async fn store() -> Option<RedisStore> {
        let url = redis_url()?;
        Some(RedisStore::connect(&url).await.unwrap())
    }

    #[tokio::test]
    async fn redis_conforms() {
        let _serial = SERIAL.lock().await;
        let Some(store) = store().await else { return };
        conformance::run_self_expiring(&store).await;
        assert!(format!("{store:?}").starts_with("RedisStore"), "{store:?}");
    }

    /// The UNKNOWN index names each mark by its token: a key forgotten and marked again
    /// is listed once, under its new mark, and trimming stale members never drops it.
    #[tokio::test]
    async fn a_key_marked_unknown_again_is_listed_once_and_survives_trimming() {
        let _serial = SERIAL.lock().await;
        let Some(store) = store().await else { return };
        let k = key("remarked");
        let first = acquire(&store, &k).await;
        store.mark_unknown(&k, first, TTL).await.unwrap();
        store.forget(&k).await.unwrap();
        let second = acquire(&store, &k).await;
        // A refused mark (a stale token) adds nothing listable.
        assert!(matches!(store.mark_unknown(&k, first, TTL).await, Err(StoreError::LeaseLost(_))));
        // Redis forgets its scripts (a restart, SCRIPT FLUSH): the pipelined mark loads again.
        let url = std::env::var("IDEMCACHE_REDIS_STORE_URL").unwrap();
        let mut admin =
            redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut admin).await.unwrap();
        store.mark_unknown(&k, second, TTL).await.unwrap();
        for _ in 0..2 {
            store.purge_expired(1000).await.unwrap();
            let listed = store.list_unknown(1000).await.unwrap();
            assert_eq!(listed.iter().filter(|u| u.key == k).count(), 1, "{listed:?}");
        }
        store.forget(&k).await.unwrap();
        assert!(!store.list_unknown(1000).await.unwrap().iter().any(|u| u.key == k));
    }

    /// The database apart, held by one test at a time.
    type Apart =
        (RedisStore, redis::aio::MultiplexedConnection, tokio::sync::MutexGuard<'static, ()>);

    /// A store on a Redis database of its own (the URL's number less one, flushed), and
    /// a plain connection to it: for tests whose records would fail or skew other
    /// tests' listings. One such test runs at a time (it holds the returned guard).
    async fn store_apart() -> Option<Apart> {
        static APART: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        let apart = apart_url()?;
        let held = APART.lock().await;
        let client = redis::Client::open(apart.as_str()).unwrap();
        let mut admin = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("FLUSHDB").query_async(&mut admin).await.unwrap();
        Some((RedisStore::connect(&apart).await.unwrap(), admin, held))
    }

    /// The URL of the database apart: the store tests' own, its number less one.
    fn apart_url() -> Option<String> {
        let url = redis_url()?;
        let info: redis::ConnectionInfo =
            redis::IntoConnectionInfo::into_connection_info(url.as_str()).unwrap();
        let redis::ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
            panic!("a TCP address, got {:?}", info.addr());
        };
        let db = if info.redis_settings().db() == 0 { 1 } else { info.redis_settings().db() - 1 };
        Some(format!("redis://{host}:{port}/{db}"))
    }

    /// The Redis key of `k`'s record (the module docs' layout).
    fn record_key(k: &Key) -> String {
        let hex: String = k.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
        format!("idemcache:{{{hex}}}")
    }

    /// The UNKNOWN index's bucket of `k` (the module docs' layout: FNV-1a of the stored
    /// key, modulo the bucket count).
    fn bucket_of(k: &Key) -> usize {
        let hash = k
            .as_bytes()
            .iter()
            .fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193));
        hash as usize % idemcache_redis::INDEX_BUCKETS
    }

    /// The Redis key of the UNKNOWN index's bucket `n`.
    fn bucket(n: usize) -> String {
        format!("idemcache:unknown:{{{n}}}")
    }

    /// How many members the UNKNOWN index holds, over its buckets.
    async fn index_size(admin: &mut redis::aio::MultiplexedConnection) -> usize {
        let mut size = 0;
        for index in (0..idemcache_redis::INDEX_BUCKETS).map(bucket) {
            let n: usize = redis::cmd("ZCARD").arg(index).query_async(admin).await.unwrap();
            size += n;
        }
        size
    }

    /// Records the store cannot read: an UNKNOWN hash that lost its mark time beside a
    /// valid one, a record key holding a string (WRONGTYPE), a garbled token. Each is
    /// `Corrupt` naming its key (never a panic in the client, never `Backend`), and
    /// purging keeps working past it.
    #[tokio::test]
    async fn records_the_store_cannot_read_are_corrupt_not_a_panic() {
        let _serial = SERIAL.lock().await;
        let Some((store, mut admin, _one_at_a_time)) = store_apart().await else { return };
        let (good, bad) = (key("good"), key("bad"));
        for k in [&good, &bad] {
            let token = acquire(&store, k).await;
            store.mark_unknown(k, token, TTL).await.unwrap();
        }
        let _: () = redis::cmd("HDEL")
            .arg(record_key(&bad))
            .arg("settled")
            .query_async(&mut admin)
            .await
            .unwrap();
        match store.list_unknown(10).await {
            Err(StoreError::Corrupt(why)) => assert!(why.contains("\"bad\""), "{why}"),
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert_eq!(store.purge_expired(100).await.unwrap(), 0, "both records are live");
        store.forget(&bad).await.unwrap();
        let listed = store.list_unknown(10).await.unwrap();
        assert_eq!(listed.iter().map(|u| &u.key).collect::<Vec<_>>(), [&good]);

        let wrong = key("a-string");
        let _: () = redis::cmd("SET")
            .arg(record_key(&wrong))
            .arg("x")
            .query_async(&mut admin)
            .await
            .unwrap();
        match store.claim(&wrong, fp("r"), LEASE).await {
            Err(StoreError::Corrupt(_)) => {}
            other => panic!("expected Corrupt, got {other:?}"),
        }
        let garbled = key("garbled-token");
        acquire(&store, &garbled).await;
        let _: () = redis::cmd("HSET")
            .arg(record_key(&garbled))
            .arg("token")
            .arg("not-a-number")
            .query_async(&mut admin)
            .await
            .unwrap();
        match store.claim(&garbled, fp("r"), LEASE).await {
            Err(StoreError::Corrupt(why)) => assert!(why.contains("garbled-token"), "{why}"),
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    async fn hset(admin: &mut redis::aio::MultiplexedConnection, k: &Key, field: &str, v: &str) {
        let _: () = redis::cmd("HSET")
            .arg(record_key(k))
            .arg(field)
            .arg(v)
            .query_async(admin)
            .await
            .unwrap();
    }

    async fn hdel(admin: &mut redis::aio::MultiplexedConnection, k: &Key, field: &str) {
        let _: () =
            redis::cmd("HDEL").arg(record_key(k)).arg(field).query_async(admin).await.unwrap();
    }

    fn corrupt_naming<T: std::fmt::Debug>(result: Result<T, StoreError>, name: &str) {
        match result {
            Err(StoreError::Corrupt(why)) => assert!(why.contains(name), "{why}"),
            other => panic!("{name}: expected Corrupt, got {other:?}"),
        }
    }

    /// A record whose state or expiry is garbled or missing is `Corrupt`, never taken
    /// for absent: claimed again, it would run the request a second time and overwrite
    /// the result (state 0 read as the script's own "acquired" every time).
    #[tokio::test]
    async fn a_garbled_record_is_never_taken_over() {
        let _serial = SERIAL.lock().await;
        let Some((store, mut admin, _one_at_a_time)) = store_apart().await else { return };
        let garblings: [(&str, Option<&str>); 7] = [
            ("state", Some("two")),
            ("state", Some("0")),
            ("state", Some("1.5")),
            ("state", None),
            ("expires", Some("soon")),
            ("expires", Some("1e19")),
            ("expires", None),
        ];
        for (i, (field, value)) in garblings.into_iter().enumerate() {
            let k = key(&format!("garbled-{i}"));
            let token = acquire(&store, &k).await;
            store.complete(&k, token, Some(Bytes::from_static(b"first")), TTL).await.unwrap();
            match value {
                Some(v) => hset(&mut admin, &k, field, v).await,
                None => hdel(&mut admin, &k, field).await,
            }
            corrupt_naming(store.claim(&k, fp("r"), LEASE).await, &format!("garbled-{i}"));
            let body: Vec<u8> = redis::cmd("HGET")
                .arg(record_key(&k))
                .arg("body")
                .query_async(&mut admin)
                .await
                .unwrap();
            assert_eq!(body, b"first", "{field} = {value:?}: the result was overwritten");
        }
    }

    /// A record whose expiry is garbled: every write on it is `Corrupt` naming the key
    /// (the scripts failed, as `Backend`, comparing a number with nil), and listing and
    /// purging are not stopped by it for every other key: the listing names it and how
    /// to clear it, purging goes on.
    #[tokio::test]
    async fn writes_on_a_garbled_record_are_corrupt_and_purging_goes_on() {
        let _serial = SERIAL.lock().await;
        let Some((store, mut admin, _one_at_a_time)) = store_apart().await else { return };
        let held = key("held-garbled");
        let token = acquire(&store, &held).await;
        hset(&mut admin, &held, "expires", "soon").await;
        corrupt_naming(store.extend_lease(&held, token, LEASE).await, "held-garbled");
        corrupt_naming(store.complete(&held, token, None, TTL).await, "held-garbled");
        corrupt_naming(store.release(&held, token).await, "held-garbled");
        corrupt_naming(store.mark_unknown(&held, token, TTL).await, "held-garbled");
        // Its refused mark left an index member, stale once the record is gone.
        let _: () = redis::cmd("DEL").arg(record_key(&held)).query_async(&mut admin).await.unwrap();

        let (good, bad) = (key("fine"), key("unknown-garbled"));
        for k in [&good, &bad] {
            let token = acquire(&store, k).await;
            store.mark_unknown(k, token, TTL).await.unwrap();
        }
        hset(&mut admin, &bad, "expires", "soon").await;
        corrupt_naming(store.resolve(&bad, None, TTL).await, "unknown-garbled");
        corrupt_naming(store.forget(&bad).await, "unknown-garbled");
        match store.list_unknown(10).await {
            Err(StoreError::Corrupt(why)) => {
                assert!(why.contains("unknown-garbled") && why.contains("delete the Redis key"))
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        // The listing trims the stale members it reads, bucket by bucket, and stops at
        // the garbled record: the stale member of `held` is trimmed by it or, when its
        // bucket comes later (buckets follow the run's keys), by this purge.
        assert!(store.purge_expired(100).await.unwrap() <= 1);
        assert_eq!(store.purge_expired(100).await.unwrap(), 0);
        // A record key holding a list: named, and purging goes on.
        let listy = key("a-list");
        let token = acquire(&store, &listy).await;
        store.mark_unknown(&listy, token, TTL).await.unwrap();
        let _: () =
            redis::cmd("DEL").arg(record_key(&listy)).query_async(&mut admin).await.unwrap();
        let _: () = redis::cmd("RPUSH")
            .arg(record_key(&listy))
            .arg("x")
            .query_async(&mut admin)
            .await
            .unwrap();
        corrupt_naming(store.forget(&listy).await, "a-list");
        assert_eq!(store.purge_expired(100).await.unwrap(), 0);
        // Cleared as the listing says, the rest is listed.
        for k in [&bad, &listy] {
            let _: () = redis::cmd("DEL").arg(record_key(k)).query_async(&mut admin).await.unwrap();
        }
        let listed = store.list_unknown(10).await.unwrap();
        assert_eq!(listed.iter().map(|u| &u.key).collect::<Vec<_>>(), [&good]);
    }

    /// The UNKNOWN index itself holding another type (another program's key): listing
    /// and purging are `Corrupt`, not `Backend` (the server answered; retrying will not
    /// help).
    #[tokio::test]
    async fn an_index_of_another_type_is_corrupt() {
        let _serial = SERIAL.lock().await;
        let Some((store, mut admin, _one_at_a_time)) = store_apart().await else { return };
        let _: () =
            redis::cmd("SET").arg(bucket(0)).arg("x").query_async(&mut admin).await.unwrap();
        assert!(matches!(store.list_unknown(10).await, Err(StoreError::Corrupt(_))));
        assert!(matches!(store.purge_expired(10).await, Err(StoreError::Corrupt(_))));
    }

    /// A listing returns up to its limit, past any window's size: 1,200 marks are all
    /// listed by `unknown(5000)`.
    #[tokio::test]
    async fn a_long_listing_is_not_cut_at_a_window() {
        let _serial = SERIAL.lock().await;
        let Some((store, _admin, _one_at_a_time)) = store_apart().await else { return };
        for i in 0..1200 {
            let k = key(&format!("many-{i:04}"));
            let token = acquire(&store, &k).await;
            store.mark_unknown(&k, token, TTL).await.unwrap();
        }
        assert_eq!(store.list_unknown(5000).await.unwrap().len(), 1200);
        assert_eq!(store.list_unknown(1100).await.unwrap().len(), 1100);
    }

    /// Two stores purging one index at once count what each removed: 200 stale members
    /// are 200 in all, never 400.
    #[tokio::test]
    async fn concurrent_purges_count_each_member_once() {
        let _serial = SERIAL.lock().await;
        let Some((store, _admin, _one_at_a_time)) = store_apart().await else { return };
        let other = RedisStore::connect(&apart_url().unwrap()).await.unwrap();
        for round in 0..5 {
            for i in 0..200 {
                let k = key(&format!("stale-{round}-{i}"));
                let token = acquire(&store, &k).await;
                store.mark_unknown(&k, token, TTL).await.unwrap();
                store.forget(&k).await.unwrap();
            }
            let (a, b) = tokio::join!(store.purge_expired(1000), other.purge_expired(1000));
            assert_eq!(a.unwrap() + b.unwrap(), 200, "round {round}");
        }
    }

    /// A purge call's work is bounded, whatever the index holds: behind 40 live marks,
    /// `purge_expired(1)` checks a few members and trims nothing, and later calls reach
    /// the stale member where the last one stopped.
    #[tokio::test]
    async fn a_purge_call_checks_a_bounded_part_of_the_index() {
        let _serial = SERIAL.lock().await;
        let Some((store, _admin, _one_at_a_time)) = store_apart().await else { return };
        for i in 0..40 {
            let k = key(&format!("live-{i:02}"));
            let token = acquire(&store, &k).await;
            store.mark_unknown(&k, token, TTL).await.unwrap();
        }
        // The stale member in the last bucket purging reads, behind every live one.
        let last = (0..)
            .map(|i| key(&format!("resolved-last-{i}")))
            .find(|k| bucket_of(k) == idemcache_redis::INDEX_BUCKETS - 1)
            .unwrap();
        let token = acquire(&store, &last).await;
        store.mark_unknown(&last, token, TTL).await.unwrap();
        store.forget(&last).await.unwrap(); // its member is stale now
        assert_eq!(store.purge_expired(1).await.unwrap(), 0, "the whole index was walked");
        let mut calls = 1;
        while store.purge_expired(1).await.unwrap() == 0 {
            calls += 1;
            assert!(calls <= 11, "never reached the stale member");
        }
        assert_eq!(store.list_unknown(100).await.unwrap().len(), 40);
    }

    /// `purge_expired` trims the UNKNOWN index: a limit of 0 trims nothing; stale
    /// members are trimmed wherever they stand, behind live ones too; and members of
    /// records that expired are all gone once it has run (the RedisStore docs: run it
    /// periodically).
    #[tokio::test]
    async fn purging_trims_the_unknown_index_and_a_limit_of_zero_does_nothing() {
        let _serial = SERIAL.lock().await;
        let Some((store, mut admin, _one_at_a_time)) = store_apart().await else { return };
        for i in 0..3 {
            let k = key(&format!("live-{i}"));
            let token = acquire(&store, &k).await;
            store.mark_unknown(&k, token, TTL).await.unwrap();
        }
        let short = Duration::from_millis(5);
        let mut marked = Vec::new();
        for i in 0..50 {
            let k = key(&format!("brief-{i}"));
            let token = acquire(&store, &k).await;
            store.mark_unknown(&k, token, short).await.unwrap();
            marked.push(k);
        }
        // Wait (bounded) until Redis has let every brief record go.
        for _ in 0..2000 {
            let left: usize = redis::cmd("EXISTS")
                .arg(marked.iter().map(record_key).collect::<Vec<_>>())
                .query_async(&mut admin)
                .await
                .unwrap();
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(index_size(&mut admin).await, 53);
        assert_eq!(store.purge_expired(0).await.unwrap(), 0);
        assert_eq!(index_size(&mut admin).await, 53, "a limit of 0 trimmed the index");
        // The three live marks stand first: a batch of two still finds two stale ones.
        assert_eq!(store.purge_expired(2).await.unwrap(), 2);
        let mut trimmed = 2;
        loop {
            let n = store.purge_expired(16).await.unwrap();
            trimmed += n;
            if n < 16 {
                break;
            }
        }
        assert_eq!(trimmed, 50);
        assert_eq!(index_size(&mut admin).await, 3);
        assert_eq!(store.list_unknown(10).await.unwrap().len(), 3);
    }

    /// `wait_for_replicas` on a server with no replica: `WAIT` counts none, so an
    /// acquiring claim is a typed error carrying `NotReplicated` and its caller does
    /// not execute; the claim is released (nothing ran under it), so the key is free
    /// at once. Zero replicas turns waiting off; a zero timeout (Redis's "forever") and
    /// one of the store's response timeout or more are refused.
    #[tokio::test]
    async fn waiting_for_replicas_that_are_not_there_is_a_typed_error() {
        let _serial = SERIAL.lock().await;
        let Some(store) = store().await else { return };
        let waiting = store.clone().wait_for_replicas(1, Duration::from_millis(20)).unwrap();
        let k = key("no-replica");
        match waiting.claim(&k, fp("r"), LEASE).await {
            Err(StoreError::Backend(e)) => {
                let e = e.downcast_ref::<idemcache_redis::NotReplicated>().expect("NotReplicated");
                assert_eq!((e.acknowledged, e.asked, e.write), (0, 1, "claim"));
            }
            other => panic!("expected NotReplicated, got {other:?}"),
        }
        assert!(matches!(
            store.claim(&k, fp("r"), LEASE).await.unwrap(),
            StoreClaim::Acquired { .. }
        ));
        // A completion that did not replicate stands on the server, and says so.
        let k = key("no-replica-completed");
        let token = acquire(&store, &k).await;
        match waiting.complete(&k, token, None, TTL).await {
            Err(StoreError::Backend(e)) => {
                assert_eq!(
                    e.downcast_ref::<idemcache_redis::NotReplicated>().unwrap().write,
                    "completion"
                );
            }
            other => panic!("expected NotReplicated, got {other:?}"),
        }
        assert!(matches!(store.claim(&k, fp("r"), LEASE).await.unwrap(), StoreClaim::Completed(_)));
        let off = waiting.clone().wait_for_replicas(0, Duration::ZERO).unwrap();
        acquire(&off, &key("no-replica-not-waiting")).await;
        for refused in [Duration::ZERO, Duration::from_secs(5), Duration::from_secs(3600)] {
            assert!(matches!(
                store.clone().wait_for_replicas(1, refused),
                Err(StoreError::InvalidInput(_))
            ));
        }
        assert!(store.clone().wait_for_replicas(1, Duration::from_millis(4999)).is_ok());
    }

    /// The index is scored by Redis's clock, as the record's own mark time is: every
    /// member's score lies within the server's time read just before and just after the
    /// mark, and at or before the mark the record holds.
    #[tokio::test]
    async fn the_index_is_scored_by_the_servers_clock() {
        let _serial = SERIAL.lock().await;
        let Some((store, mut admin, _one_at_a_time)) = store_apart().await else { return };
        let server_now = |admin: &mut redis::aio::MultiplexedConnection| {
            let mut admin = admin.clone();
            async move {
                let (s, us): (i64, i64) = redis::cmd("TIME").query_async(&mut admin).await.unwrap();
                s * 1_000_000 + us
            }
        };
        let k = key("scored");
        let token = acquire(&store, &k).await;
        let before = server_now(&mut admin).await;
        store.mark_unknown(&k, token, TTL).await.unwrap();
        let after = server_now(&mut admin).await;
        let members: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(bucket(bucket_of(&k)))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut admin)
            .await
            .unwrap();
        let [(_, score)] = members[..] else { panic!("{members:?}") };
        let score = score as i64;
        let settled: i64 = redis::cmd("HGET")
            .arg(record_key(&k))
            .arg("settled")
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!((before..=after).contains(&score), "{before} {score} {after}");
        assert!(score <= settled, "{score} {settled}");
    }

    #[tokio::test]
    async fn an_unreachable_redis_is_a_typed_error() {
        let _serial = SERIAL.lock().await;
        match RedisStore::connect("redis://127.0.0.1:1/0").await {
            Err(e @ StoreError::Backend(_)) => {
                let said = e.to_string();
                assert!(said.contains("Redis at 127.0.0.1:1"), "names the server: {said}");
            }
            other => panic!("expected a backend error, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_redis_killed_mid_request_is_a_typed_error_and_nothing_runs_twice() {
        let _serial = SERIAL.lock().await;
        let Some(_direct) = store().await else { return };
        let url = std::env::var("IDEMCACHE_REDIS_STORE_URL").unwrap();
        let info: redis::ConnectionInfo =
            redis::IntoConnectionInfo::into_connection_info(url.as_str()).unwrap();
        let redis::ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
            panic!("a TCP address, got {:?}", info.addr());
        };
        let upstream =
            tokio::net::lookup_host((host.as_str(), port)).await.unwrap().next().unwrap();
        let relay = super::relay::Relay::start(upstream).await;
        let through = format!("redis://{}/{}", relay.addr, info.redis_settings().db());
        let store = RedisStore::connect(&through).await.unwrap();
        killed_mid_request(store, &relay, "redis").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_tiered_instances_over_redis_execute_each_key_exactly_once() {
        let _serial = SERIAL.lock().await;
        let Some(first) = store().await else { return };
        let (second, restarted) = (store().await.unwrap(), store().await.unwrap());
        conformance::tiered_exactly_once(first, second, restarted, "redis-hammer").await;
    }
}

/// A guard owns what it needs, so the execution can run in a task of its own; its lease
/// is renewed in the store while it runs. Dropped unsettled, it lets the cache's claim go
/// whatever the cache's drop policy, and the store's record stays held.
#[tokio::test]
async fn a_tiered_guard_moves_into_a_task_renews_its_lease_and_drops_cleanly() {
    let cache = Cache::builder().drop_policy(idemcache::DropPolicy::MarkUnknown).build().unwrap();
    let tiered = Tiered::new(cache, sqlite_memory().await).with_lease(Duration::from_secs(5));
    let k = key("spawned");
    let TieredClaim::Acquired(mut guard) = tiered.claim(&k, fp("r")).await.unwrap() else {
        panic!("expected Acquired");
    };
    let first_end = guard.lease_ends_at();
    let renewed = tokio::spawn(async move {
        let ends = guard.extend_lease(LEASE).await.unwrap();
        (guard, ends)
    });
    let (guard, ends) = renewed.await.unwrap();
    assert!(ends > first_end + Duration::from_secs(20), "{ends:?} after {first_end:?}");
    match tiered.store().claim(&k, fp("r"), LEASE).await.unwrap() {
        StoreClaim::InProgress { lease_ends_at } => assert_eq!(lease_ends_at, ends),
        other => panic!("{other:?}"),
    }
    drop(guard);
    // Not UNKNOWN in memory (the drop released the cache's claim): the store still holds
    // the key, so a repeat is in progress, not re-run and not unknown.
    assert_eq!(tiered.cache().stats().entries, 0);
    assert!(matches!(tiered.claim(&k, fp("r")).await.unwrap(), TieredClaim::InProgress { .. }));
}

/// A TCP relay to a real server that a test can cut (every connection dropped, nobody
/// listening) and restore on the same port: the store killed mid-request, then back.
mod relay {
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};
    use tokio::task::JoinHandle;

    pub struct Relay {
        pub addr: SocketAddr,
        upstream: SocketAddr,
        tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    }

    impl Relay {
        pub async fn start(upstream: SocketAddr) -> Relay {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let relay =
                Relay { addr: listener.local_addr().unwrap(), upstream, tasks: Arc::default() };
            relay.serve(listener);
            relay
        }

        fn serve(&self, listener: tokio::net::TcpListener) {
            let (upstream, tasks) = (self.upstream, self.tasks.clone());
            let accept = tokio::spawn(async move {
                loop {
                    let Ok((mut client, _)) = listener.accept().await else { return };
                    let pipe = tokio::spawn(async move {
                        let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
                            return;
                        };
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    });
                    tasks.lock().unwrap().push(pipe);
                }
            });
            self.tasks.lock().unwrap().push(accept);
        }

        /// Drops every connection and stops listening.
        pub fn cut(&self) {
            for task in self.tasks.lock().unwrap().drain(..) {
                task.abort();
            }
        }

        /// Listens again on the same port.
        pub async fn restore(&self) {
            for _ in 0..100 {
                // The aborted listener's socket closes once its task is dropped.
                if let Ok(listener) = tokio::net::TcpListener::bind(self.addr).await {
                    self.serve(listener);
                    return;
                }
                tokio::task::yield_now().await;
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            panic!("could not listen on {} again", self.addr);
        }
    }
}

/// The store killed mid-request: a claim is taken, then the store goes away before the
/// completion. Every operation is then a typed backend error and nothing executes; when
/// the store is back, the key is still held (the lease has not lapsed): not executed again.
async fn killed_mid_request<S: Store>(store: S, relay: &relay::Relay, prefix: &str) {
    use idemcache::store::TieredError;
    let tiered = Tiered::new(Cache::builder().build().unwrap(), store);
    let k = key(&format!("{prefix}-killed"));
    let TieredClaim::Acquired(guard) = tiered.claim(&k, fp("r")).await.unwrap() else {
        panic!("expected Acquired");
    };
    relay.cut();
    let completed = guard.complete(&b"effect happened"[..]).await;
    assert!(matches!(completed, Err(TieredError::Store(StoreError::Backend(_)))), "{completed:?}");
    let said = completed.unwrap_err().to_string();
    assert!(said.contains(&relay.addr.to_string()), "names the server it lost: {said}");
    let again = tiered.claim(&k, fp("r")).await;
    assert!(matches!(again, Err(TieredError::Store(StoreError::Backend(_)))), "{again:?}");
    let other = tiered.claim(&key(&format!("{prefix}-during")), fp("r")).await;
    assert!(matches!(other, Err(TieredError::Store(StoreError::Backend(_)))), "{other:?}");
    relay.restore().await;
    let mut answer = tiered.claim(&k, fp("r")).await;
    for _ in 0..200 {
        // A pool or connection manager may hand out one dead connection first.
        if !matches!(answer, Err(TieredError::Store(StoreError::Backend(_)))) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        answer = tiered.claim(&k, fp("r")).await;
    }
    assert!(
        matches!(answer, Ok(TieredClaim::InProgress { .. })),
        "held until its lease lapses, never executed again: {answer:?}"
    );
}

/// A reply that does not parse on the wire (another service on the port, a broken
/// stream) is the server failing, `Backend` (503, retry), never `Corrupt` ("fix the
/// record"): with redis 1.x a parse error of the wire and one of a reply's fields share
/// one kind, so replies are read apart from the wire. A fake server that answers `+OK`
/// to every command and bytes that are not RESP to scripts; no Redis needed.
#[tokio::test]
async fn a_reply_that_is_not_resp_is_backend_not_corrupt() {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            std::thread::spawn(move || {
                let mut out = conn.try_clone().unwrap();
                let mut commands = BufReader::new(conn);
                loop {
                    let mut line = String::new();
                    if commands.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let n: usize = line.trim_start_matches('*').trim().parse().unwrap_or(0);
                    let mut args = Vec::new();
                    for _ in 0..n {
                        let mut len = String::new();
                        commands.read_line(&mut len).unwrap();
                        let len: usize = len.trim_start_matches('$').trim().parse().unwrap();
                        let mut arg = vec![0; len + 2];
                        commands.read_exact(&mut arg).unwrap();
                        arg.truncate(len);
                        args.push(String::from_utf8_lossy(&arg).to_uppercase());
                    }
                    let reply: &[u8] = match args.first().map(String::as_str) {
                        Some("EVALSHA" | "EVAL") => b"?this is not RESP\r\n",
                        _ => b"+OK\r\n",
                    };
                    if out.write_all(reply).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let url = format!("redis://127.0.0.1:{port}/0");
    let store = idemcache_redis::RedisStore::connect(&url).await.unwrap();
    let got = store.claim(&key("garbled-wire"), fp("r"), LEASE).await;
    assert!(matches!(got, Err(StoreError::Backend(_))), "{got:?}");
}

/// `IDEMCACHE_REDIS_CLUSTER_URLS` (the nodes of a Redis Cluster, `redis://host:port`
/// separated by commas; `.ci/run` starts one), or `None` after saying the test is
/// skipped.
fn redis_cluster_urls() -> Option<Vec<String>> {
    let urls = conformance::service_url(
        "IDEMCACHE_REDIS_CLUSTER_URLS",
        "redis://127.0.0.1:7000,redis://127.0.0.1:7001",
    )?;
    Some(urls.split(',').map(str::to_owned).collect())
}

/// Redis Cluster, when `IDEMCACHE_REDIS_CLUSTER_URLS` names its nodes (CI starts three
/// primaries with a replica each). The cluster has one database and nothing here
/// flushes it: every test keys its records apart (the suite's run prefix).
mod redis_cluster {
    use super::*;
    use idemcache_redis::{NotReplicated, RedisStore};

    async fn store() -> Option<RedisStore> {
        Some(RedisStore::connect_cluster(&redis_cluster_urls()?).await.unwrap())
    }

    #[tokio::test]
    async fn a_redis_cluster_conforms() {
        let Some(store) = store().await else { return };
        conformance::run_self_expiring(&store).await;
        assert!(format!("{store:?}").contains("Redis Cluster at 127.0.0.1:"), "{store:?}");
    }

    #[tokio::test]
    async fn tiered_over_a_redis_cluster_executes_each_key_once() {
        let Some(urls) = redis_cluster_urls() else { return };
        let open = || RedisStore::connect_cluster(&urls);
        let (a, b, c) = (open().await.unwrap(), open().await.unwrap(), open().await.unwrap());
        conformance::tiered_exactly_once(a, b, c, "cluster").await;
    }

    /// The slots of `keys` on the cluster (`CLUSTER KEYSLOT`, asked of any node).
    async fn slots(keys: impl Iterator<Item = String>) -> std::collections::BTreeSet<i64> {
        let urls = redis_cluster_urls().unwrap();
        let client = redis::Client::open(urls[0].as_str()).unwrap();
        let mut admin = client.get_multiplexed_async_connection().await.unwrap();
        let mut out = std::collections::BTreeSet::new();
        for k in keys {
            let slot: i64 =
                redis::cmd("CLUSTER").arg("KEYSLOT").arg(k).query_async(&mut admin).await.unwrap();
            out.insert(slot);
        }
        out
    }

    /// 200 keys marked UNKNOWN (their records on every primary, their index members in
    /// all sixteen buckets) are all listed, in mark order; forgetting half leaves stale
    /// members that purging trims bucket by bucket; the rest stay listed. No step
    /// touches two slots in one command (the cluster would refuse it: CROSSSLOT).
    #[tokio::test]
    async fn listing_and_purging_work_bucket_by_bucket_across_the_cluster() {
        let Some(store) = store().await else { return };
        let keys: Vec<Key> = (0..200).map(|i| key(&format!("spread-{i:03}"))).collect();
        let record = |k: &Key| {
            let hex: String = k.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
            format!("idemcache:{{{hex}}}")
        };
        assert!(slots(keys.iter().map(record)).await.len() > 150, "records spread over slots");
        for k in &keys {
            let token = acquire(&store, k).await;
            store.mark_unknown(k, token, TTL).await.unwrap();
        }
        let ours = |listed: &[idemcache::UnknownEntry<std::time::SystemTime>]| {
            listed
                .iter()
                .filter(|u| keys.contains(&u.key))
                .map(|u| u.key.clone())
                .collect::<Vec<_>>()
        };
        let listed = store.list_unknown(usize::MAX).await.unwrap();
        assert_eq!(ours(&listed).len(), 200);
        assert!(listed.windows(2).all(|w| w[0].marked_at <= w[1].marked_at), "in mark order");
        for k in keys.iter().step_by(2) {
            store.forget(k).await.unwrap();
        }
        // Purged until a sweep of every bucket trims nothing (other tests on the
        // cluster may purge some of these first).
        while store.purge_expired(64).await.unwrap() > 0
            || store.purge_expired(64).await.unwrap() > 0
        {}
        let client = redis::cluster::ClusterClient::new(redis_cluster_urls().unwrap()).unwrap();
        let mut admin = client.get_async_connection().await.unwrap();
        let mut members = Vec::new();
        for bucket in 0..idemcache_redis::INDEX_BUCKETS {
            let index = format!("idemcache:unknown:{{{bucket}}}");
            let some: Vec<String> = redis::cmd("ZRANGE")
                .arg(index)
                .arg(0)
                .arg(-1)
                .query_async(&mut admin)
                .await
                .unwrap();
            members.extend(some);
        }
        for (i, k) in keys.iter().enumerate() {
            let hex = &record(k)["idemcache:{".len()..record(k).len() - 1];
            let found = members.iter().filter(|m| m.starts_with(&format!("{hex}:"))).count();
            assert_eq!(found, i % 2, "{k:?}: forgotten ones trimmed, the others kept");
        }
        let left = ours(&store.list_unknown(usize::MAX).await.unwrap());
        assert_eq!(left, keys.iter().skip(1).step_by(2).cloned().collect::<Vec<_>>());
        for k in keys.iter().skip(1).step_by(2) {
            store.forget(k).await.unwrap();
        }
    }

    /// Every node forgets the scripts (`SCRIPT FLUSH` on each, as a restarted node or a
    /// replica that never saw `SCRIPT LOAD` would): each operation is sent the script
    /// whole and goes on, on every primary.
    #[tokio::test]
    async fn nodes_without_the_scripts_are_sent_them_whole() {
        let Some(store) = store().await else { return };
        let urls = redis_cluster_urls().unwrap();
        let client = redis::cluster::ClusterClient::new(urls).unwrap();
        let mut admin = client.get_async_connection().await.unwrap();
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut admin).await.unwrap();
        for i in 0..12 {
            let k = key(&format!("flushed-{i}"));
            let token = acquire(&store, &k).await;
            store.complete(&k, token, Some(Bytes::from_static(b"done")), TTL).await.unwrap();
            let token = acquire(&store, &key(&format!("flushed-mark-{i}"))).await;
            store.mark_unknown(&key(&format!("flushed-mark-{i}")), token, TTL).await.unwrap();
        }
        let listed = store.list_unknown(usize::MAX).await.unwrap();
        assert_eq!(
            listed.iter().filter(|u| u.key.client_key().starts_with("flushed-mark-")).count(),
            12
        );
        for i in 0..12 {
            store.forget(&key(&format!("flushed-mark-{i}"))).await.unwrap();
        }
    }

    /// `wait_for_replicas(1, ..)`: each primary has its replica, so claims and
    /// completions are acknowledged. Asking for two (there is one): the claim is a
    /// typed error carrying `NotReplicated`, its caller does not execute, and the claim
    /// is released (nothing ran under it): a second claim of the key acquires it.
    #[tokio::test]
    async fn waiting_for_replicas_answers_what_replicated() {
        let Some(store) = store().await else { return };
        let one = store.clone().wait_for_replicas(1, Duration::from_secs(2)).unwrap();
        let k = key("replicated");
        let token = acquire(&one, &k).await;
        one.complete(&k, token, Some(Bytes::from_static(b"kept")), TTL).await.unwrap();
        assert!(matches!(one.claim(&k, fp("r"), LEASE).await.unwrap(), StoreClaim::Completed(_)));
        let two = store.clone().wait_for_replicas(2, Duration::from_millis(50)).unwrap();
        let k = key("under-replicated");
        match two.claim(&k, fp("r"), LEASE).await {
            Err(StoreError::Backend(e)) => {
                let e = e.downcast_ref::<NotReplicated>().expect("NotReplicated");
                assert_eq!((e.acknowledged, e.asked, e.write), (1, 2, "claim"));
                assert_eq!(e.key, k);
            }
            other => panic!("expected NotReplicated, got {other:?}"),
        }
        assert!(matches!(
            store.claim(&k, fp("r"), LEASE).await.unwrap(),
            StoreClaim::Acquired { .. }
        ));
    }

    #[tokio::test]
    async fn no_nodes_or_a_bad_url_is_invalid_input() {
        let none: [&str; 0] = [];
        assert!(matches!(
            RedisStore::connect_cluster(&none).await,
            Err(StoreError::InvalidInput(_))
        ));
        assert!(matches!(
            RedisStore::connect_cluster(&["mysql://127.0.0.1:7000"]).await,
            Err(StoreError::InvalidInput(_))
        ));
    }
}
