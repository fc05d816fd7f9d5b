//! The durable tiers, in one run: a replay from `Tiered`'s memory against the bare
//! cache's and each store's own, claim + complete per store, and each store's round
//! trips per claim + complete (counted on the server).
//!
//! ```sh
//! IDEMCACHE_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! IDEMCACHE_REDIS_STORE_URL=redis://127.0.0.1:6379/14 \
//!     cargo bench -p idemcache-benches --bench store
//! ```
//!
//! Without a URL, that store is left out (and says so). SQLite runs on a file in the
//! temporary directory (WAL), as a service would use it, and again behind `AnyStore` (a
//! store chosen at run time: boxed futures), side by side.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use idemcache::store::{AnyStore, Store, StoreClaim, Tiered, TieredClaim};
use idemcache::{Bytes, Cache, Claim, Fingerprint, Key};
use idemcache_postgres::PostgresStore;
use idemcache_redis::RedisStore;
use idemcache_sqlite::SqliteStore;
use tokio::runtime::Runtime;

const LEASE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(3600);

fn key(run: &str, k: u64) -> Key {
    Key::new("POST /orders", run, format!("k{k}")).unwrap()
}

fn body() -> Bytes {
    Bytes::from(vec![b'x'; 128])
}

async fn claim_complete<S: Store>(store: &S, k: &Key) {
    match store.claim(k, Fingerprint::of(b"r"), LEASE).await.unwrap() {
        StoreClaim::Acquired { token, .. } => {
            store.complete(k, token, Some(body()), TTL).await.unwrap();
        }
        other => panic!("{other:?}"),
    }
}

/// Replay and claim + complete for one store, and its replay through `Tiered`.
fn bench_store<S: Store>(c: &mut Criterion, rt: &Runtime, name: &str, store: S) {
    let run = format!("bench-{}-{name}", std::process::id());
    let mut group = c.benchmark_group(format!("store/{name}"));
    let fresh = AtomicU64::new(1);
    rt.block_on(claim_complete(&store, &key(&run, 0)));
    group.bench_function("replay from the store", |b| {
        b.iter(|| rt.block_on(store.claim(&key(&run, 0), Fingerprint::of(b"r"), LEASE)).unwrap())
    });
    group.bench_function("claim + complete", |b| {
        b.iter(|| {
            rt.block_on(claim_complete(&store, &key(&run, fresh.fetch_add(1, Ordering::Relaxed))))
        })
    });
    let tiered = Tiered::new(Cache::builder().build().unwrap(), store);
    let hot = key(&run, u64::MAX);
    rt.block_on(async {
        if let TieredClaim::Acquired(guard) =
            tiered.claim(&hot, Fingerprint::of(b"r")).await.unwrap()
        {
            guard.complete(body()).await.unwrap();
        }
    });
    group.bench_function("Tiered replay (from memory)", |b| {
        b.iter(|| match rt.block_on(tiered.claim(&hot, Fingerprint::of(b"r"))).unwrap() {
            TieredClaim::Completed(replay) => replay,
            other => panic!("{other:?}"),
        })
    });
    group.finish();
}

fn stores(c: &mut Criterion) {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();

    let cache = Cache::builder().build().unwrap();
    let k = Key::new("POST /orders", "bench", "hot").unwrap();
    if let Claim::Acquired(guard) = cache.claim(&k, Fingerprint::of(b"r")).unwrap() {
        guard.complete(body()).unwrap();
    }
    c.bench_function("store/cache/replay (bare cache, for reference)", |b| {
        b.iter(|| rt.block_on(async { cache.claim(&k, Fingerprint::of(b"r")).unwrap() }))
    });

    let path = std::env::temp_dir().join(format!("idemcache-bench-{}.db", std::process::id()));
    let sqlite = rt.block_on(SqliteStore::open_path(&path)).unwrap();
    rt.block_on(sqlite.ensure_schema()).unwrap();
    bench_store(c, &rt, "sqlite", sqlite.clone());
    // The same store chosen at run time: what `DynStore`'s boxed futures cost.
    bench_store(c, &rt, "sqlite as AnyStore", AnyStore::new(sqlite));
    let _ = std::fs::remove_file(&path);

    match std::env::var("IDEMCACHE_POSTGRES_URL") {
        Ok(url) => {
            let store = rt.block_on(PostgresStore::connect(&url)).unwrap();
            store.pool().resize(4);
            rt.block_on(store.ensure_schema()).unwrap();
            round_trips_postgres(&rt, &url, &store);
            bench_store(c, &rt, "postgres", store);
        }
        Err(_) => eprintln!("store/postgres: skipped (set IDEMCACHE_POSTGRES_URL)"),
    }
    match std::env::var("IDEMCACHE_REDIS_STORE_URL") {
        Ok(url) => {
            let store = rt.block_on(RedisStore::connect(&url)).unwrap();
            round_trips_redis(&rt, &url, &store);
            bench_store(c, &rt, "redis", store);
        }
        Err(_) => eprintln!("store/redis: skipped (set IDEMCACHE_REDIS_STORE_URL)"),
    }
}

/// Write statements per claim + complete, counted by transaction ids: each statement the
/// store sends runs in its own transaction (autocommit) and writes, so it takes one id.
fn round_trips_postgres(rt: &Runtime, url: &str, store: &PostgresStore) {
    const N: u64 = 200;
    let run = format!("trips-{}", std::process::id());
    rt.block_on(claim_complete(store, &key(&run, 0))); // statements prepared
    let next_id = || {
        rt.block_on(async {
            let (client, connection) =
                tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            let row = client.query_one("SELECT txid_current()", &[]).await.unwrap();
            row.get::<_, i64>(0)
        })
    };
    let before = next_id();
    for i in 1..=N {
        rt.block_on(claim_complete(store, &key(&run, i)));
    }
    let after = next_id();
    let per_op = (after - before - 1) as f64 / N as f64;
    eprintln!("store/postgres: {per_op:.2} statements (round trips) per claim + complete");
}

/// Scripts the client sent per claim + complete (`INFO commandstats`: the commands a
/// script runs inside are counted too, but under their own names).
fn round_trips_redis(rt: &Runtime, url: &str, store: &RedisStore) {
    const N: u64 = 200;
    let run = format!("trips-{}", std::process::id());
    rt.block_on(claim_complete(store, &key(&run, 0))); // scripts loaded
    let client = redis::Client::open(url).unwrap();
    let scripts_run = || -> u64 {
        let mut con = client.get_connection().unwrap();
        let info: String = redis::cmd("INFO").arg("commandstats").query(&mut con).unwrap();
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
            .sum()
    };
    let before = scripts_run();
    for i in 1..=N {
        rt.block_on(claim_complete(store, &key(&run, i)));
    }
    let per_op = (scripts_run() - before) as f64 / N as f64;
    eprintln!("store/redis: {per_op:.2} scripts (round trips) per claim + complete");
}

criterion_group!(benches, stores);
criterion_main!(benches);
