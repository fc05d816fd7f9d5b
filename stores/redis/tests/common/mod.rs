//! What the Redis suites share: the servers they run against (named in the environment,
//! or the test skipped with the reason printed), the database apart that tests which
//! would skew others' listings run on, the store's key layout as the crate docs give
//! it, and the lock that runs a suite's tests on the shared database one at a time.

// Each suite is a binary of its own and uses part of this.
#![allow(dead_code)]

use idemcache::store::conformance;
use idemcache::Key;
use idemcache_redis::{redis, RedisStore};

/// `IDEMCACHE_REDIS_STORE_URL`, or `None` after saying the test is skipped. The tests
/// also use (and flush) the database numbered one below it.
pub fn redis_url() -> Option<String> {
    conformance::service_url("IDEMCACHE_REDIS_STORE_URL", "redis://127.0.0.1:6379/14")
}

/// `IDEMCACHE_REDIS_CLUSTER_URLS` (the nodes of a Redis Cluster, `redis://host:port`
/// separated by commas; `.ci/run` starts one), or `None` after saying the test is
/// skipped. The cluster has one database and nothing here flushes it: every test keys
/// its records apart (the suite's run prefix).
pub fn redis_cluster_urls() -> Option<Vec<String>> {
    let urls = conformance::service_url(
        "IDEMCACHE_REDIS_CLUSTER_URLS",
        "redis://127.0.0.1:7000,redis://127.0.0.1:7001",
    )?;
    Some(urls.split(',').map(str::to_owned).collect())
}

/// A suite's tests share one Redis database, and several count what `purge_expired`
/// trims across the whole UNKNOWN index (or list what a handle under another lapse
/// policy would trim): one at a time, so that no test's count includes another's stale
/// members. (Suites are binaries of their own, which cargo runs one after another.)
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A store on the database `IDEMCACHE_REDIS_STORE_URL` names, or `None` (skipped).
pub async fn store() -> Option<RedisStore> {
    let url = redis_url()?;
    Some(RedisStore::connect(&url).await.unwrap())
}

/// A store on the cluster `IDEMCACHE_REDIS_CLUSTER_URLS` names, or `None` (skipped).
pub async fn cluster_store() -> Option<RedisStore> {
    Some(RedisStore::connect_cluster(&redis_cluster_urls()?).await.unwrap())
}

/// The database apart, held by one test at a time.
pub type Apart =
    (RedisStore, redis::aio::MultiplexedConnection, tokio::sync::MutexGuard<'static, ()>);

/// A store on a Redis database of its own (the URL's number less one, flushed), and
/// a plain connection to it: for tests whose records would fail or skew other
/// tests' listings. One such test runs at a time (it holds the returned guard).
pub async fn store_apart() -> Option<Apart> {
    static APART: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let apart = apart_url()?;
    let held = APART.lock().await;
    let client = redis::Client::open(apart.as_str()).unwrap();
    let mut admin = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("FLUSHDB").query_async(&mut admin).await.unwrap();
    Some((RedisStore::connect(&apart).await.unwrap(), admin, held))
}

/// The URL of the database apart: the store tests' own, its number less one.
pub fn apart_url() -> Option<String> {
    let url = redis_url()?;
    let info: redis::ConnectionInfo =
        redis::IntoConnectionInfo::into_connection_info(url.as_str()).unwrap();
    let redis::ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
        panic!("a TCP address, got {:?}", info.addr());
    };
    let db = if info.redis_settings().db() == 0 { 1 } else { info.redis_settings().db() - 1 };
    Some(format!("redis://{host}:{port}/{db}"))
}

/// The stored key `k` in hex, as the store's Redis keys and index members write it.
pub fn hex(k: &Key) -> String {
    k.as_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

/// The Redis key of `k`'s record (the crate docs' layout).
pub fn record_key(k: &Key) -> String {
    format!("idemcache:{{{}}}", hex(k))
}

/// The UNKNOWN index's bucket of `k` (the crate docs' layout: FNV-1a of the stored
/// key, modulo the bucket count).
pub fn bucket_of(k: &Key) -> usize {
    let hash = k
        .as_bytes()
        .iter()
        .fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193));
    hash as usize % idemcache_redis::INDEX_BUCKETS
}

/// The Redis key of the UNKNOWN index's bucket `n`.
pub fn bucket(n: usize) -> String {
    format!("idemcache:unknown:{{{n}}}")
}
