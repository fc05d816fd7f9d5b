//! idemcache against its peers keyed the way their own users key them: the
//! peers by a 16-byte id (`[u8; 16]`, ahash) or by the header's `String`; idemcache
//! building its `Key` and the request's `Fingerprint` on every call, inside the timing.
//! The peers are in `benches/support/natural.rs`; `benches/peers.rs` keeps the
//! equal-key comparison (every peer storing idemcache's `Key`).
//!
//! Run: `cargo bench -p idemcache-benches --bench natural`.
#![allow(missing_docs)] // criterion_group! generates undocumented items.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

#[path = "support/natural.rs"]
mod natural;
#[path = "support/peers.rs"]
mod peers;

use natural::{ask, build, result, Ask, NaturalPeer, Outcome, NATURAL};

const KEYS: u64 = 100_000;

fn filled(name: &str) -> (Box<dyn NaturalPeer>, Vec<Ask>) {
    let peer = build(name, 4 * KEYS as usize);
    let asks: Vec<_> = (0..KEYS).map(ask).collect();
    for (i, a) in asks.iter().enumerate() {
        assert_eq!(peer.claim_complete(a, &|| result(i as u64)), Outcome::Executed);
    }
    (peer, asks)
}

fn replay_uniform(c: &mut Criterion) {
    let order = peers::uniform(KEYS, 1 << 20, 1);
    let mut g = c.benchmark_group("natural_replay_uniform_100k");
    g.throughput(Throughput::Elements(1));
    for name in NATURAL {
        let (peer, asks) = filled(name);
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            let mut i = 0;
            b.iter(|| {
                let a = &asks[order[i] as usize];
                i = if i + 1 == order.len() { 0 } else { i + 1 };
                match peer.claim_complete(black_box(a), &|| unreachable!("a replay never executes"))
                {
                    Outcome::Replayed(body) => body,
                    _ => unreachable!("every key is completed"),
                }
            })
        });
    }
    g.finish();
}

fn claim_complete(c: &mut Criterion) {
    let mut g = c.benchmark_group("natural_claim_complete");
    g.throughput(Throughput::Elements(1));
    for name in NATURAL {
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter_custom(|iters| {
                let peer = build(name, iters as usize + 1);
                let asks: Vec<_> = (0..iters).map(ask).collect();
                let start = Instant::now();
                for (i, a) in (0..).zip(&asks) {
                    black_box(peer.claim_complete(a, &|| result(i)));
                }
                start.elapsed()
            })
        });
    }
    g.finish();
}

/// Two threads, each op 90% a replay of one of 100k completed keys, 10% a new key.
fn mix_two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("natural_mix_90_10_two_threads");
    g.throughput(Throughput::Elements(1));
    let plan = peers::uniform(100, 1 << 16, 3);
    let order = peers::uniform(KEYS, 1 << 16, 4);
    for name in NATURAL {
        let (peer, asks) = filled(name);
        let fresh = AtomicU64::new(KEYS);
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter_custom(|iters| {
                // New requests are made before the clock starts, as they arrive parsed.
                let news: Vec<Vec<Ask>> = (0..2)
                    .map(|_| {
                        let n = fresh.fetch_add(iters / 10 + 1, Ordering::Relaxed);
                        (n..n + iters / 10 + 1).map(ask).collect()
                    })
                    .collect();
                let start = Instant::now();
                std::thread::scope(|s| {
                    for (t, news) in news.iter().enumerate() {
                        let (peer, asks, plan, order) = (&peer, &asks, &plan, &order);
                        s.spawn(move || {
                            let mut news = news.iter();
                            for i in 0..iters / 2 {
                                let j = ((i * 2 + t as u64) as usize) & (plan.len() - 1);
                                let a = match plan[j] {
                                    p if p < 10 => news.next().unwrap_or(&asks[0]),
                                    _ => &asks[order[j] as usize],
                                };
                                black_box(peer.claim_complete(a, &|| result(i)));
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

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(30);
    targets = replay_uniform, claim_complete, mix_two_threads
}
criterion_main!(benches);
