//! Bounded churn: a million fresh claim+complete operations through a cache bounded at
//! 100,000 entries, against moka and quick_cache doing the same job, plus the memory
//! each takes per completed entry.
//!
//! Every peer does claim-or-return the same way, with the implementations the other
//! benches use (`benches/support/peers.rs`): moka with the same capacity and a 24 h
//! time-to-live, quick_cache with the same capacity and no TTL (it has none). Keys are
//! idemcache `Key`s for all (16-byte client key, 44 bytes stored).
//!
//! Each peer runs in its own process (this binary re-runs itself) so peak RSS is that
//! peer's alone. Latency percentiles time each operation with `Instant` (~25 ns of the
//! figure is the clock); ns/op times the whole loop.
//!
//! Each peer runs three times, the rounds interleaved, and its best run is reported.
//!
//! Run: `cargo bench -p idemcache-benches --bench churn` (about three minutes; moka is most of it).

use std::hint::black_box;
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "support/peers.rs"]
mod peers;

use idemcache::Key;
use peers::{build, fingerprint, key, result, Outcome};

const CAPACITY: usize = 100_000;
const OPS: u64 = 1_000_000;
const MEMORY_ENTRIES: u64 = 1_000_000;
const PEERS: [&str; 3] = ["idemcache", "quick_cache", "moka"];
const ROUNDS: usize = 3;
/// Keys built ahead of each timed stretch.
const KEY_CHUNK: u64 = 10_000;

/// Resident and peak resident bytes of this process, from /proc (Linux).
fn rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Runs one peer in this process and prints one result line.
fn run_child(name: &str) {
    // Churn: ns/op over the whole loop, then a second pass timing each op. Keys are
    // built ahead, a chunk at a time, so the clock times the cache and not `format!`;
    // each result is still built when its claim executes, as a real intent's would be.
    let peer = build(name, CAPACITY);
    let op =
        |k: &Key, i: u64| peer.claim_complete(k, fingerprint(), &|| result(i)) == Outcome::Executed;
    let chunks = |from: u64| {
        (from..from + OPS)
            .step_by(KEY_CHUNK as usize)
            .map(|at| (at..at + KEY_CHUNK).map(|i| (key(i), i)).collect::<Vec<_>>())
    };
    let mut elapsed = Duration::ZERO;
    for keys in chunks(0) {
        let start = Instant::now();
        for (k, i) in &keys {
            assert!(black_box(op(k, *i)), "{name}: fresh key {i} was not executed");
        }
        elapsed += start.elapsed();
    }
    let ns_per_op = elapsed.as_nanos() as f64 / OPS as f64;
    let mut latencies = Vec::with_capacity(OPS as usize);
    for keys in chunks(OPS) {
        for (k, i) in &keys {
            let t = Instant::now();
            black_box(op(k, *i));
            latencies.push(t.elapsed().as_nanos() as u64);
        }
    }
    latencies.sort_unstable();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    let (p50, p99, p999) = (pct(0.5), pct(0.99), pct(0.999));
    let (_, churn_peak) = rss();
    let notes = peer.notes();
    drop(peer);
    drop(latencies);

    // Memory: fill a cache big enough to hold every entry, measure what it added.
    let (before, _) = rss();
    let peer = build(name, MEMORY_ENTRIES as usize);
    for i in 10 * OPS..10 * OPS + MEMORY_ENTRIES {
        peer.claim_complete(&key(i), fingerprint(), &|| result(i));
    }
    let (after, _) = rss();
    let per_entry = after.saturating_sub(before) as f64 / MEMORY_ENTRIES as f64;
    println!(
        "RESULT {name} {ns_per_op:.0} {p50} {p99} {p999} {per_entry:.0} {}",
        churn_peak / (1024 * 1024)
    );
    if !notes.is_empty() {
        println!("NOTE {name}: {notes}");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--peer") {
        return run_child(&args[i + 1]);
    }
    println!(
        "churn: capacity {CAPACITY}, {OPS} fresh claim+complete per peer, 128-byte results, \
         best of {ROUNDS} interleaved runs"
    );
    println!(
        "{:<12} {:>9} {:>8} {:>8} {:>9} {:>11} {:>14}",
        "peer", "ns/op", "p50 ns", "p99 ns", "p99.9 ns", "B/entry@1M", "churn peak MiB"
    );
    let exe = std::env::current_exe().unwrap();
    // Each peer's best of ROUNDS runs, the rounds interleaved so a noisy stretch of this
    // shared machine lands on every peer alike instead of on whichever ran then.
    let mut best: Vec<Option<Vec<String>>> = vec![None; PEERS.len()];
    let mut notes = Vec::new();
    for _ in 0..ROUNDS {
        for (i, name) in PEERS.iter().enumerate() {
            let out = Command::new(&exe).args(["--peer", name]).output().expect("run peer");
            let text = String::from_utf8_lossy(&out.stdout);
            let Some(line) = text.lines().find(|l| l.starts_with("RESULT ")) else {
                panic!("{name} failed: {}", String::from_utf8_lossy(&out.stderr));
            };
            let fields: Vec<String> = line.split_whitespace().skip(1).map(str::to_owned).collect();
            let ns = |f: &[String]| f[1].parse::<f64>().unwrap();
            if best[i].as_ref().is_none_or(|b| ns(&fields) < ns(b)) {
                best[i] = Some(fields);
            }
            notes.extend(text.lines().filter_map(|l| l.strip_prefix("NOTE ")).map(str::to_owned));
        }
    }
    let mut rows = Vec::new();
    for f in best.into_iter().flatten() {
        println!(
            "{:<12} {:>9} {:>8} {:>8} {:>9} {:>11} {:>14}",
            f[0], f[1], f[2], f[3], f[4], f[5], f[6]
        );
        rows.push((
            f[0].clone(),
            f[1].parse::<f64>().unwrap(),
            f[5].parse::<f64>().unwrap(),
            f[6].parse::<f64>().unwrap(),
        ));
    }
    for note in notes {
        println!("{note}");
    }
    let ours = rows[0].clone();
    for (name, ns, bytes, peak) in &rows[1..] {
        println!(
            "idemcache vs {name}: {:.2}x faster per op, {:.2}x the memory per entry, {:.2}x the churn peak",
            ns / ours.1,
            ours.2 / bytes,
            ours.3 / peak
        );
    }
}
