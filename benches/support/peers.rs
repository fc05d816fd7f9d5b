//! The peers every benchmark compares, each doing the same claim-or-return job:
//! claim = atomically insert a PROCESSING marker (with the request's fingerprint) or get
//! what is stored; complete = store the 128-byte result. Shared by `benches/peers.rs`
//! (criterion) and `examples/bench_report.rs` (the one-run report), so both measure the
//! same code.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use ahash::RandomState;
use bytes::Bytes;
use idemcache::{Cache, Claim, Fingerprint, Key};

pub const TTL: Duration = Duration::from_secs(24 * 3600);

/// What a claim found.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The key was free: the caller executed and completed it.
    Executed,
    /// The key was completed before: its result, replayed.
    Replayed(Bytes),
    /// Someone else holds the key.
    Busy,
}

/// What the hand-rolled peers store.
#[derive(Clone)]
pub enum Slot {
    Processing(Fingerprint),
    Completed(Fingerprint, Bytes),
}

pub trait Peer: Send + Sync {
    fn name(&self) -> &'static str;
    /// Claims `key`; if it was free, runs `execute` (the intent: here it only builds the
    /// result) and completes the key with what it returns. A repeat gets the stored
    /// result and never executes.
    fn claim_complete(&self, key: &Key, fp: Fingerprint, execute: &dyn Fn() -> Bytes) -> Outcome;
    /// Anything the peer can report about itself after a run.
    fn notes(&self) -> String {
        String::new()
    }
}

pub const NAMES: [&str; 5] = ["idemcache", "dashmap", "mutex_hashmap", "quick_cache", "moka"];

/// Builds the named peer bounded at `capacity` entries (the unbounded maps ignore it).
pub fn build(name: &str, capacity: usize) -> Box<dyn Peer> {
    match name {
        "idemcache" => Box::new(Idemcache(
            Cache::builder()
                .max_entries(capacity)
                .max_bytes(usize::MAX / 2)
                .completed_ttl(TTL)
                .build()
                .unwrap(),
        )),
        "dashmap" => Box::new(DashMapPeer(dashmap::DashMap::with_hasher(RandomState::new()))),
        "mutex_hashmap" => {
            Box::new(MutexMapPeer(Mutex::new(HashMap::with_hasher(RandomState::new()))))
        }
        "quick_cache" => Box::new(QuickCachePeer(quick_cache::sync::Cache::new(capacity))),
        "moka" => Box::new(MokaPeer(
            moka::sync::Cache::builder().max_capacity(capacity as u64).time_to_live(TTL).build(),
        )),
        other => panic!("unknown peer {other}"),
    }
}

struct Idemcache(Cache);

impl Peer for Idemcache {
    fn name(&self) -> &'static str {
        "idemcache"
    }
    fn claim_complete(&self, key: &Key, fp: Fingerprint, execute: &dyn Fn() -> Bytes) -> Outcome {
        match self.0.claim(key, fp).expect("benchmarks never fill the cache with in-flight work") {
            Claim::Acquired(guard) => {
                guard.complete(execute()).unwrap();
                Outcome::Executed
            }
            Claim::Completed(replay) => Outcome::Replayed(replay.body.unwrap_or_default()),
            _ => Outcome::Busy,
        }
    }
    fn notes(&self) -> String {
        let s = self.0.stats();
        format!("{} evictions, longest eviction pause {:?}", s.evictions, s.max_eviction_pause)
    }
}

/// The floor: no TTL, no bound, the marker and the result in two map operations.
struct DashMapPeer(dashmap::DashMap<Key, Slot, RandomState>);

impl Peer for DashMapPeer {
    fn name(&self) -> &'static str {
        "dashmap"
    }
    fn claim_complete(&self, key: &Key, fp: Fingerprint, execute: &dyn Fn() -> Bytes) -> Outcome {
        use dashmap::mapref::entry::Entry;
        match self.0.entry(key.clone()) {
            Entry::Occupied(e) => match e.get() {
                Slot::Completed(_, body) => return Outcome::Replayed(body.clone()),
                Slot::Processing(_) => return Outcome::Busy,
            },
            Entry::Vacant(v) => {
                v.insert(Slot::Processing(fp));
            }
        }
        self.0.insert(key.clone(), Slot::Completed(fp, execute()));
        Outcome::Executed
    }
}

struct MutexMapPeer(Mutex<HashMap<Key, Slot, RandomState>>);

impl Peer for MutexMapPeer {
    fn name(&self) -> &'static str {
        "mutex_hashmap"
    }
    fn claim_complete(&self, key: &Key, fp: Fingerprint, execute: &dyn Fn() -> Bytes) -> Outcome {
        {
            let mut map = self.0.lock().unwrap();
            match map.get(key) {
                Some(Slot::Completed(_, body)) => return Outcome::Replayed(body.clone()),
                Some(Slot::Processing(_)) => return Outcome::Busy,
                None => {
                    map.insert(key.clone(), Slot::Processing(fp));
                }
            }
        }
        self.0.lock().unwrap().insert(key.clone(), Slot::Completed(fp, execute()));
        Outcome::Executed
    }
}

/// quick_cache's placeholder guard is the PROCESSING marker; no TTL.
struct QuickCachePeer(quick_cache::sync::Cache<Key, Slot>);

impl Peer for QuickCachePeer {
    fn name(&self) -> &'static str {
        "quick_cache"
    }
    fn claim_complete(&self, key: &Key, fp: Fingerprint, execute: &dyn Fn() -> Bytes) -> Outcome {
        match self.0.get_value_or_guard(key, Some(Duration::ZERO)) {
            quick_cache::sync::GuardResult::Guard(guard) => {
                let _ = guard.insert(Slot::Completed(fp, execute()));
                Outcome::Executed
            }
            quick_cache::sync::GuardResult::Value(Slot::Completed(_, body)) => {
                Outcome::Replayed(body)
            }
            _ => Outcome::Busy,
        }
    }
}

struct MokaPeer(moka::sync::Cache<Key, Slot>);

impl Peer for MokaPeer {
    fn name(&self) -> &'static str {
        "moka"
    }
    fn claim_complete(&self, key: &Key, fp: Fingerprint, execute: &dyn Fn() -> Bytes) -> Outcome {
        let entry = self.0.entry(key.clone()).or_insert_with(|| Slot::Processing(fp));
        if entry.is_fresh() {
            self.0.insert(key.clone(), Slot::Completed(fp, execute()));
            return Outcome::Executed;
        }
        match entry.into_value() {
            Slot::Completed(_, body) => Outcome::Replayed(body),
            Slot::Processing(_) => Outcome::Busy,
        }
    }
}

/// Keys of the common shape: scope, tenant, 16-byte client key (44 bytes stored).
pub fn key(i: u64) -> Key {
    Key::new("POST /v1/orders", "user:42", format!("{i:016x}")).unwrap()
}

/// A 128-byte result in its own allocation, as a real response body is.
pub fn result(i: u64) -> Bytes {
    let mut body = vec![b'r'; 128];
    body[..8].copy_from_slice(&i.to_le_bytes());
    Bytes::from(body)
}

pub fn fingerprint() -> Fingerprint {
    Fingerprint::of(b"request")
}

/// A fixed pseudo-random sequence (xorshift64*): the same on every run and every peer.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `len` key indices in `0..n`, uniform.
pub fn uniform(n: u64, len: usize, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    (0..len).map(|_| rng.below(n)).collect()
}

/// `len` key indices in `0..n`, Zipf-distributed with exponent `s` (rank 0 hottest),
/// by inverting the CDF; the ranks are then scattered over the key space so the hot
/// keys are not neighbours.
pub fn zipf(n: u64, s: f64, len: usize, seed: u64) -> Vec<u64> {
    let mut cdf = Vec::with_capacity(n as usize);
    let mut total = 0.0;
    for rank in 1..=n {
        total += 1.0 / (rank as f64).powf(s);
        cdf.push(total);
    }
    let mut rng = Rng::new(seed);
    (0..len)
        .map(|_| {
            let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * total;
            let rank = cdf.partition_point(|&c| c < u) as u64;
            // Multiplying by a prime that does not divide n permutes 0..n.
            (rank * 48_271) % n
        })
        .collect()
}
