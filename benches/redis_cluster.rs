//! Claims/s and replays/s of `RedisStore` on one Redis against a Redis Cluster, side by
//! side in one run (interleaved rounds, medians), for docs/scaling.md's per-node figures.
//!
//! ```text
//! IDEMCACHE_REDIS_URL=redis://127.0.0.1:6379/15 \
//! IDEMCACHE_REDIS_CLUSTER_URLS=redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002 \
//!     cargo bench -p idemcache-benches --bench redis_cluster
//! ```
//!
//! Closed loop, 32 tasks on one connection (the store's own multiplexing), 2 s per
//! phase, 3 rounds: "claims" are first claims of fresh keys (one `EVALSHA` each, a
//! write), "replays" are claims of keys completed before the phase (one `EVALSHA`, a
//! read). Everything runs on this machine: the cluster's six nodes share its cores with
//! the bench, so the cluster's total is a floor, and "per primary" divides it by three.
//! The keys are flushed from database 15 before and after on one Redis; on the cluster
//! they expire (a 60 s TTL).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idemcache::store::{Store, StoreClaim};
use idemcache::{Fingerprint, Key};
use idemcache_redis::RedisStore;

const TASKS: usize = 32;
const PHASE: Duration = Duration::from_secs(2);
const ROUNDS: usize = 3;
const TTL: Duration = Duration::from_secs(60);

fn key(run: &str, i: u64) -> Key {
    Key::new("POST /bench", run, format!("k{i}")).unwrap()
}

/// Operations per second of `op` over `TASKS` tasks for `PHASE`.
async fn rate<F, Fut>(op: F) -> f64
where
    F: Fn(u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (op, next) = (op.clone(), next.clone());
            tokio::spawn(async move {
                while start.elapsed() < PHASE {
                    op(next.fetch_add(1, Ordering::Relaxed)).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    next.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// (claims/s, replays/s) of `store`, keys under `run`.
async fn measure(store: RedisStore, run: String) -> (f64, f64) {
    let fp = Fingerprint::of(b"bench");
    let claims = {
        let (store, run) = (store.clone(), run.clone());
        rate(move |i| {
            let (store, k) = (store.clone(), key(&run, i));
            async move {
                let claim = store.claim(&k, fp, Duration::from_secs(60)).await.unwrap();
                assert!(matches!(claim, StoreClaim::Acquired { .. }));
            }
        })
        .await
    };
    // 1,000 completed keys, replayed round robin.
    let done = format!("{run}-done");
    for i in 0..1000 {
        let k = key(&done, i);
        if let StoreClaim::Acquired { token, .. } = store.claim(&k, fp, TTL).await.unwrap() {
            store
                .complete(&k, token, Some(idemcache::Bytes::from_static(b"{}")), TTL)
                .await
                .unwrap();
        }
    }
    let replays = rate(move |i| {
        let (store, k) = (store.clone(), key(&done, i % 1000));
        async move {
            let claim = store.claim(&k, fp, Duration::from_secs(60)).await.unwrap();
            assert!(matches!(claim, StoreClaim::Completed(_)));
        }
    })
    .await;
    (claims, replays)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let single = std::env::var("IDEMCACHE_REDIS_URL").unwrap_or("redis://127.0.0.1:6379/15".into());
    let Ok(cluster) = std::env::var("IDEMCACHE_REDIS_CLUSTER_URLS") else {
        eprintln!("skipped: set IDEMCACHE_REDIS_CLUSTER_URLS (the nodes of a Redis Cluster)");
        return;
    };
    let nodes: Vec<&str> = cluster.split(',').collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let flush = || async {
            let client = idemcache_redis::redis::Client::open(single.as_str()).unwrap();
            let mut c = client.get_multiplexed_async_connection().await.unwrap();
            let _: () = idemcache_redis::redis::cmd("FLUSHDB").query_async(&mut c).await.unwrap();
        };
        flush().await;
        let one = RedisStore::connect(&single).await.unwrap();
        let many = RedisStore::connect_cluster(&nodes).await.unwrap();
        let stamp =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let (mut a, mut b) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
        for round in 0..ROUNDS {
            let (c, r) = measure(one.clone(), format!("one-{stamp}-{round}")).await;
            a.0.push(c);
            a.1.push(r);
            let (c, r) = measure(many.clone(), format!("cluster-{stamp}-{round}")).await;
            b.0.push(c);
            b.1.push(r);
        }
        flush().await;
        let (c1, r1, c3, r3) = (median(a.0), median(a.1), median(b.0), median(b.1));
        println!("| | claims/s | replays/s |");
        println!("|---|---|---|");
        println!("| one Redis | {c1:.0} | {r1:.0} |");
        println!(
            "| Redis Cluster, 3 primaries + 3 replicas | {c3:.0} ({:.2}x) | {r3:.0} ({:.2}x) |",
            c3 / c1,
            r3 / r1
        );
        println!("| per primary | {:.0} | {:.0} |", c3 / 3.0, r3 / 3.0);
    });
}
