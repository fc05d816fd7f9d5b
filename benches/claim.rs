//! Single-thread cost of the two hot paths, beside a bare `DashMap` doing the least the
//! same job needs, in one run so the ratio survives a noisy machine:
//!
//! - `replay_hit`: claim a completed key and get its stored bytes back. The floor is a
//!   `DashMap<Vec<u8>, Bytes>` (ahash) `get` + `Bytes` clone of the same key.
//! - `claim_complete`: claim a fresh key and store a 128-byte result. The floor is a
//!   `DashMap` `insert` of the same key and bytes.
//!
//! Each result is built in its own allocation, for both.
//!
//! Keys are the common shape: a scope, a tenant and a 16-byte client key.
//!
//! Run: `cargo bench -p idemcache-benches --bench claim`

// criterion_group! generates undocumented public items.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use ahash::RandomState;
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dashmap::DashMap;
use idemcache::{Cache, Claim, Fingerprint, Key};

const RESULT: &[u8; 128] = &[b'r'; 128];

fn key(i: u64) -> Key {
    Key::new("POST /v1/orders", "user:42", format!("{i:016x}")).unwrap()
}

/// A 128-byte result in its own allocation, as a response body built per request is
/// (a `from_static` result would make every clone free and hide what storing costs).
fn result() -> Bytes {
    Bytes::from(RESULT.to_vec())
}

fn cache() -> Cache {
    Cache::builder().build().unwrap()
}

fn dashmap() -> DashMap<Vec<u8>, Bytes, RandomState> {
    DashMap::with_hasher(RandomState::new())
}

/// A key order that visits every key once, scattered so consecutive lookups miss caches
/// the way uniform traffic does.
fn scattered(n: u64) -> Vec<u64> {
    // Multiplying by an odd constant permutes 0..2^k; filter to 0..n.
    let size = n.next_power_of_two();
    (0..size)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) & (size - 1))
        .filter(|&i| i < n)
        .collect()
}

fn replay_hit(c: &mut Criterion) {
    let fp = Fingerprint::of(b"request");
    let mut group = c.benchmark_group("replay_hit");
    group.throughput(Throughput::Elements(1));
    for n in [1u64, 100_000] {
        let keys: Vec<Key> = (0..n).map(key).collect();
        let order = scattered(n);

        let cache = cache();
        for k in &keys {
            let Ok(Claim::Acquired(g)) = cache.claim(k, fp) else { unreachable!() };
            g.complete(result()).unwrap();
        }
        group.bench_function(BenchmarkId::new("idemcache", n), |b| {
            let mut i = 0;
            b.iter(|| {
                let k = &keys[order[i] as usize];
                i = if i + 1 == order.len() { 0 } else { i + 1 };
                match cache.claim(black_box(k), fp) {
                    Ok(Claim::Completed(replay)) => replay.body,
                    _ => unreachable!(),
                }
            })
        });

        let map = dashmap();
        for k in &keys {
            map.insert(k.as_bytes().to_vec(), result());
        }
        group.bench_function(BenchmarkId::new("dashmap_get", n), |b| {
            let mut i = 0;
            b.iter(|| {
                let k = &keys[order[i] as usize];
                i = if i + 1 == order.len() { 0 } else { i + 1 };
                map.get(black_box(k.as_bytes())).map(|v| v.clone())
            })
        });
    }
    group.finish();
}

/// Times `iters` fresh claims+completions, building the keys outside the timing.
fn time_fresh(iters: u64, mut run: impl FnMut(&[Key])) -> Duration {
    let keys: Vec<Key> = (0..iters).map(key).collect();
    let start = Instant::now();
    run(&keys);
    start.elapsed()
}

fn claim_complete(c: &mut Criterion) {
    let fp = Fingerprint::of(b"request");
    let mut group = c.benchmark_group("claim_complete");
    group.throughput(Throughput::Elements(1));
    group.bench_function("idemcache", |b| {
        b.iter_custom(|iters| {
            let cache = cache();
            time_fresh(iters, |keys| {
                for k in keys {
                    let Ok(Claim::Acquired(g)) = cache.claim(black_box(k), fp) else {
                        unreachable!()
                    };
                    g.complete(result()).unwrap();
                }
            })
        })
    });
    group.bench_function("dashmap_insert", |b| {
        b.iter_custom(|iters| {
            let map = dashmap();
            time_fresh(iters, |keys| {
                for k in keys {
                    map.insert(black_box(k.as_bytes().to_vec()), result());
                }
            })
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = replay_hit, claim_complete
}
criterion_main!(benches);
