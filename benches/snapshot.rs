//! Snapshots: the cost of saving and loading a million completed entries (128-byte
//! results, 44-byte keys), and what a save does to claims served at the same time.
//!
//! - save: one shard at a time under its lock, the file written and fsynced with no
//!   lock held (`SnapshotFile::save`); load: the file read and checked whole, then each
//!   entry inserted (`SnapshotFile::load`). Best of three runs each; the file lives in
//!   the system's temporary directory.
//! - under load: a second thread replays random keys of the same cache while the first
//!   saves; its replay latency percentiles during the save against the same thread with
//!   no save running (each timed with `Instant`, ~25 ns of the figure).
//!
//! Run: `cargo bench -p idemcache-benches --bench snapshot` (about half a minute).

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[path = "support/peers.rs"]
mod peers;

use idemcache::snapshot::{Load, SnapshotFile};
use idemcache::{Cache, Claim};
use peers::{fingerprint, key, result, Rng};

const ENTRIES: u64 = 1_000_000;
const RUNS: usize = 3;

fn filled() -> Cache {
    let cache = Cache::builder().max_entries(2 * ENTRIES as usize).build().unwrap();
    for i in 0..ENTRIES {
        if let Ok(Claim::Acquired(guard)) = cache.claim(&key(i), fingerprint()) {
            guard.complete(result(i)).unwrap();
        }
    }
    cache
}

/// Replay latencies (ns) of random keys until `stop`, at least `min` of them.
fn replays(cache: &Cache, stop: &AtomicBool, min: usize) -> Vec<u64> {
    let mut rng = Rng::new(7);
    let keys: Vec<_> = (0..10_000).map(|_| key(rng.next() % ENTRIES)).collect();
    let mut out = Vec::with_capacity(1 << 20);
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) || out.len() < min {
        let t = Instant::now();
        black_box(cache.claim(&keys[i % keys.len()], fingerprint()).ok());
        out.push(t.elapsed().as_nanos() as u64);
        i += 1;
    }
    out.sort_unstable();
    out
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn main() {
    let path = std::env::temp_dir().join(format!("idemcache-bench-{}.snap", std::process::id()));
    let cache = filled();
    let mut file = SnapshotFile::new(&path);
    let mut save = Duration::MAX;
    let mut bytes = 0;
    for _ in 0..RUNS {
        let start = Instant::now();
        bytes = file.save(&cache).unwrap().bytes;
        save = save.min(start.elapsed());
    }
    let mut load = Duration::MAX;
    for _ in 0..RUNS {
        let fresh = Cache::builder().max_entries(2 * ENTRIES as usize).build().unwrap();
        let start = Instant::now();
        let loaded = SnapshotFile::new(&path).load(&fresh, Load::Strict).unwrap();
        load = load.min(start.elapsed());
        assert_eq!(loaded.inserted as u64, ENTRIES);
    }
    let per_million = |d: Duration| d.as_secs_f64() * 1e3 * 1e6 / ENTRIES as f64;
    println!("snapshot: {ENTRIES} completed entries, 128-byte results, best of {RUNS}");
    println!(
        "save  {:>7.0} ms per million entries ({:.0} MB file)",
        per_million(save),
        bytes as f64 / 1e6
    );
    println!("load  {:>7.0} ms per million entries", per_million(load));

    // Replays with no save, then during one.
    let stop = AtomicBool::new(false);
    let quiet = std::thread::scope(|s| {
        let t = s.spawn(|| replays(&cache, &stop, 200_000));
        std::thread::sleep(save);
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap()
    });
    stop.store(false, Ordering::Relaxed);
    let during = std::thread::scope(|s| {
        let t = s.spawn(|| replays(&cache, &stop, 1));
        file.save(&cache).unwrap();
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap()
    });
    println!("replays on a second thread   p50 ns  p99 ns  p99.9 ns  max ns     replays");
    for (name, l) in [("no save running", &quiet), ("during a save", &during)] {
        println!(
            "  {name:<26} {:>6}  {:>6}  {:>8}  {:>9}  {:>8}",
            pct(l, 0.5),
            pct(l, 0.99),
            pct(l, 0.999),
            l[l.len() - 1],
            l.len()
        );
    }
    let _ = std::fs::remove_file(&path);
}
