//! Bounded churn: a million fresh claim+complete operations through a cache bounded at
//! 100,000 entries, against moka and quick_cache doing the same job, plus the memory
//! each takes per completed entry.
//!
//! Every peer does claim-or-return the same way: claim = atomically insert a PROCESSING
//! marker (with the request's fingerprint) or get the stored value; complete = store a
//! 128-byte result. Keys are idemcache `Key`s for all (16-byte client key, 44 bytes
//! stored) so every map hashes and compares the same bytes.
//!
//! - moka: `entry(k).or_insert_with(processing)`, then `insert(k, completed)` when fresh;
//!   same capacity, 24 h time-to-live.
//! - quick_cache: `get_value_or_guard` (the guard is the PROCESSING marker), then
//!   `guard.insert(completed)`; same capacity, no TTL (it has none).
//!
//! Each peer runs in its own process (this binary re-runs itself) so peak RSS is that
//! peer's alone. Latency percentiles time each operation with `Instant` (~25 ns of the
//! figure is the clock); ns/op times the whole loop.
//!
//! Run: `cargo bench --bench churn` (about a minute; moka is most of it).

use std::hint::black_box;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use idemcache::{Cache, Claim, Fingerprint, Key};

const CAPACITY: usize = 100_000;
const OPS: u64 = 1_000_000;
const MEMORY_ENTRIES: u64 = 1_000_000;
const TTL: Duration = Duration::from_secs(24 * 3600);
const PEERS: [&str; 3] = ["idemcache", "quick_cache", "moka"];

/// What the peers store. Nothing reads it back in a churn run, but storing it is the job.
#[allow(dead_code)]
#[derive(Clone)]
enum Slot {
    Processing(Fingerprint),
    Completed(Fingerprint, Bytes),
}

fn key(i: u64) -> Key {
    Key::new("POST /v1/orders", "user:42", &format!("{i:016x}")).unwrap()
}

fn result(i: u64) -> Bytes {
    // A fresh allocation per result, as a real response body is.
    let mut body = vec![b'r'; 128];
    body[..8].copy_from_slice(&i.to_le_bytes());
    Bytes::from(body)
}

/// `op(i)` claims key `i` and completes it, returning whether it executed; `notes` says
/// what the peer can say about itself (idemcache: its longest eviction pause).
struct Peer {
    op: Box<dyn FnMut(u64) -> bool>,
    notes: Box<dyn Fn() -> String>,
}

fn peer(name: &str, capacity: usize) -> Peer {
    let no_notes = || Box::new(String::new) as Box<dyn Fn() -> String>;
    let fp = Fingerprint::of(b"request");
    match name {
        "idemcache" => {
            let cache = Cache::builder()
                .max_entries(capacity)
                .max_bytes(usize::MAX / 2)
                .completed_ttl(TTL)
                .build()
                .unwrap();
            let stats = cache.clone();
            Peer {
                op: Box::new(move |i| match cache.claim(&key(i), fp).unwrap() {
                    Claim::Acquired(guard) => guard.complete(result(i)).is_ok(),
                    _ => false,
                }),
                notes: Box::new(move || {
                    let s = stats.stats();
                    format!(
                        "{} evictions, longest eviction pause {:?}",
                        s.evictions, s.max_eviction_pause
                    )
                }),
            }
        }
        "quick_cache" => {
            let cache = quick_cache::sync::Cache::<Key, Slot>::new(capacity);
            let op = Box::new(move |i| {
                let k = key(i);
                match cache.get_value_or_guard(&k, None) {
                    quick_cache::sync::GuardResult::Guard(guard) => {
                        guard.insert(Slot::Completed(fp, result(i))).is_ok()
                    }
                    _ => false,
                }
            });
            Peer { op, notes: no_notes() }
        }
        "moka" => {
            let cache = moka::sync::Cache::<Key, Slot>::builder()
                .max_capacity(capacity as u64)
                .time_to_live(TTL)
                .build();
            let op = Box::new(move |i| {
                let k = key(i);
                let entry = cache.entry(k.clone()).or_insert_with(|| Slot::Processing(fp));
                if entry.is_fresh() {
                    cache.insert(k, Slot::Completed(fp, result(i)));
                    true
                } else {
                    false
                }
            });
            Peer { op, notes: no_notes() }
        }
        other => panic!("unknown peer {other}"),
    }
}

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
    // Churn: ns/op over the whole loop, then a second pass timing each op.
    let Peer { mut op, notes } = peer(name, CAPACITY);
    let start = Instant::now();
    for i in 0..OPS {
        assert!(black_box(op(i)), "{name}: fresh key {i} was not executed");
    }
    let ns_per_op = start.elapsed().as_nanos() as f64 / OPS as f64;
    let mut latencies = Vec::with_capacity(OPS as usize);
    for i in OPS..2 * OPS {
        let t = Instant::now();
        black_box(op(i));
        latencies.push(t.elapsed().as_nanos() as u64);
    }
    latencies.sort_unstable();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    let (p50, p99, p999) = (pct(0.5), pct(0.99), pct(0.999));
    let (_, churn_peak) = rss();
    let notes = notes();
    drop(op);
    drop(latencies);

    // Memory: fill a cache big enough to hold every entry, measure what it added.
    let (before, _) = rss();
    let Peer { mut op, .. } = peer(name, MEMORY_ENTRIES as usize);
    for i in 0..MEMORY_ENTRIES {
        op(10 * OPS + i);
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
    println!("churn: capacity {CAPACITY}, {OPS} fresh claim+complete per peer, 128-byte results");
    println!(
        "{:<12} {:>9} {:>8} {:>8} {:>9} {:>11} {:>14}",
        "peer", "ns/op", "p50 ns", "p99 ns", "p99.9 ns", "B/entry@1M", "churn peak MiB"
    );
    let exe = std::env::current_exe().unwrap();
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for name in PEERS {
        let out = Command::new(&exe).args(["--peer", name]).output().expect("run peer");
        let text = String::from_utf8_lossy(&out.stdout);
        let Some(line) = text.lines().find(|l| l.starts_with("RESULT ")) else {
            panic!("{name} failed: {}", String::from_utf8_lossy(&out.stderr));
        };
        let f: Vec<&str> = line.split_whitespace().skip(1).collect();
        notes.extend(text.lines().filter_map(|l| l.strip_prefix("NOTE ")).map(str::to_owned));
        println!(
            "{:<12} {:>9} {:>8} {:>8} {:>9} {:>11} {:>14}",
            f[0], f[1], f[2], f[3], f[4], f[5], f[6]
        );
        rows.push((
            f[0].to_owned(),
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
