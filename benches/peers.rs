//! idemcache against its in-process peers, same claim-or-return job, one criterion run:
//! idemcache, a bare `DashMap` with ahash (the floor: no TTL, no bound), a
//! `Mutex<HashMap>`, quick_cache (guard API) and moka (sync, entry API). The peers are in
//! `benches/support/peers.rs`.
//!
//! Scenarios: replay hit over 100k completed keys (uniform and Zipf s = 1); first claim +
//! complete of fresh keys; 2 threads, 90% replay / 10% new; bounded churn at capacity
//! 100k (every insert evicts, steady state).
//!
//! Run: `cargo bench -p idemcache-benches --bench peers` (several minutes: moka is slow on inserts). One
//! scenario: `cargo bench -p idemcache-benches --bench peers -- replay_uniform`.
#![allow(missing_docs)] // criterion_group! generates undocumented items.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

#[path = "support/peers.rs"]
mod peers;

use peers::{build, fingerprint, key, result, uniform, zipf, Outcome, NAMES};

const KEYS: u64 = 100_000;

/// Fills a peer with `KEYS` completed keys and hands back the keys.
fn filled(name: &str) -> (Box<dyn peers::Peer>, Vec<idemcache::Key>) {
    let peer = build(name, 2 * KEYS as usize);
    let keys: Vec<_> = (0..KEYS).map(key).collect();
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(peer.claim_complete(k, fingerprint(), &|| result(i as u64)), Outcome::Executed);
    }
    (peer, keys)
}

fn replay(c: &mut Criterion, group: &str, order: &[u64]) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));
    for name in NAMES {
        let (peer, keys) = filled(name);
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            let mut i = 0;
            b.iter(|| {
                let k = &keys[order[i] as usize];
                i = if i + 1 == order.len() { 0 } else { i + 1 };
                match peer.claim_complete(black_box(k), fingerprint(), &|| {
                    unreachable!("a replay never executes")
                }) {
                    Outcome::Replayed(body) => body,
                    _ => unreachable!("every key is completed"),
                }
            })
        });
    }
    g.finish();
}

fn replay_uniform(c: &mut Criterion) {
    replay(c, "replay_uniform_100k", &uniform(KEYS, 1 << 20, 1));
}

fn replay_zipf(c: &mut Criterion) {
    replay(c, "replay_zipf_100k", &zipf(KEYS, 1.0, 1 << 20, 2));
}

fn claim_complete(c: &mut Criterion) {
    let mut g = c.benchmark_group("claim_complete");
    g.throughput(Throughput::Elements(1));
    for name in NAMES {
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter_custom(|iters| {
                // A fresh peer per measurement, keys built outside the timing.
                let peer = build(name, iters as usize + 1);
                let keys: Vec<_> = (0..iters).map(key).collect();
                let start = Instant::now();
                for (i, k) in (0..).zip(&keys) {
                    black_box(peer.claim_complete(k, fingerprint(), &|| result(i)));
                }
                start.elapsed()
            })
        });
    }
    g.finish();
}

/// Two threads, each op 90% a replay of one of 100k completed keys, 10% a new key.
fn mix_two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("mix_90_10_two_threads");
    g.throughput(Throughput::Elements(1));
    for name in NAMES {
        let (peer, keys) = filled(name);
        let fresh = AtomicU64::new(KEYS);
        let plan = uniform(100, 1 << 16, 3);
        let order = uniform(KEYS, 1 << 16, 4);
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                std::thread::scope(|s| {
                    for t in 0..2u64 {
                        let (peer, keys, fresh, plan, order) =
                            (&peer, &keys, &fresh, &plan, &order);
                        s.spawn(move || {
                            for i in 0..iters / 2 {
                                let j = ((i * 2 + t) as usize) & (plan.len() - 1);
                                if plan[j] < 10 {
                                    let n = fresh.fetch_add(1, Ordering::Relaxed);
                                    black_box(
                                        peer.claim_complete(&key(n), fingerprint(), &|| result(n)),
                                    );
                                } else {
                                    black_box(peer.claim_complete(
                                        &keys[order[j] as usize],
                                        fingerprint(),
                                        &|| result(order[j]),
                                    ));
                                }
                            }
                        });
                    }
                });
                start.elapsed()
            })
        });
    }
    g.finish();
}

/// Steady-state churn: each peer bounded at 100k and already full; every fresh
/// claim+complete evicts.
fn churn(c: &mut Criterion) {
    let mut g = c.benchmark_group("churn_bounded_100k");
    g.throughput(Throughput::Elements(1));
    for name in ["idemcache", "quick_cache", "moka"] {
        let peer = build(name, KEYS as usize);
        for i in 0..KEYS {
            peer.claim_complete(&key(i), fingerprint(), &|| result(i));
        }
        let mut next = KEYS;
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter_custom(|iters| {
                let keys: Vec<_> = (next..next + iters).map(key).collect();
                let start = Instant::now();
                for (i, k) in (next..).zip(&keys) {
                    black_box(peer.claim_complete(k, fingerprint(), &|| result(i)));
                }
                next += iters;
                start.elapsed()
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(30);
    targets = replay_uniform, replay_zipf, claim_complete, mix_two_threads, churn
}
criterion_main!(benches);
