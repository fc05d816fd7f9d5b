//! The same claim-or-return job with each peer keyed the way its own users key it: a
//! request arrives as a 16-byte id (a parsed UUID) and its 32-character hex header; a
//! dashmap, quick_cache or moka user keys by the `[u8; 16]` (ahash) or by the header's
//! `String`, and stores the request's fingerprint computed elsewhere; an idemcache user
//! builds its `Key` (scope, tenant, the header) and the request's `Fingerprint` on every
//! call, inside the timing. Shared by `benches/natural.rs`, `bench_report` and
//! `instructions` (callgrind counts).
#![allow(dead_code)]

use std::time::{Duration, Instant};

use ahash::RandomState;
use bytes::Bytes;
use idemcache::{Cache, Claim, Fingerprint, Key};

// The TTL, the result and the outcome are the peers' own (`support/peers.rs`, which every
// binary including this module includes too).
pub use crate::peers::{result, Outcome, TTL};

/// The request's body, hashed into idemcache's fingerprint on every call.
pub const REQUEST: &[u8] = br#"{"item":"book","qty":2,"currency":"EUR","amount":1999}"#;

/// One request: its id, and the same id as the client's header sent it. The header's
/// bytes are part of the request, as they are in a parsed request (and in cache: the
/// request was just read): a `String` of its own here would charge every peer that
/// reads the header one more cache miss per call, which the peers keyed by the id
/// would not pay and no server pays.
#[derive(Clone)]
pub struct Ask {
    pub id: [u8; 16],
    header: [u8; 32],
}

impl Ask {
    /// The `Idempotency-Key` header: the id in lowercase hex, as text (what a peer keyed
    /// by `String` needs: `HeaderValue::to_str`, a check of every byte).
    pub fn header(&self) -> &str {
        std::str::from_utf8(&self.header).expect("hex is ASCII")
    }

    /// The header's bytes as they arrived (`HeaderValue::as_bytes`, no check): what
    /// `Key::new` takes, checking them itself.
    pub fn header_bytes(&self) -> &[u8] {
        &self.header
    }
}

/// The request numbered `i` (ids are scattered, as UUIDs are).
pub fn ask(i: u64) -> Ask {
    let hi = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let id = ((u128::from(hi) << 64) | u128::from(i)).to_be_bytes();
    let mut header = [0u8; 32];
    for (pair, b) in header.chunks_exact_mut(2).zip(id) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        pair[0] = HEX[usize::from(b >> 4)];
        pair[1] = HEX[usize::from(b & 0xf)];
    }
    Ask { id, header }
}

/// What the map peers store: the marker, or the result, with the request's fingerprint.
#[derive(Clone)]
pub enum Slot {
    Processing(u128),
    Completed(u128, Bytes),
}

/// The fingerprint the map peers store: computed by their users once, elsewhere.
const STORED_FP: u128 = 0x5eed;

pub trait NaturalPeer: Send + Sync {
    fn name(&self) -> &'static str;
    fn claim_complete(&self, ask: &Ask, execute: &dyn Fn() -> Bytes) -> Outcome;
}

pub const NATURAL: [&str; 8] = [
    "idemcache (Key + Fingerprint per call)",
    CONTRACT,
    "dashmap [u8; 16]",
    "dashmap String",
    "quick_cache [u8; 16]",
    "quick_cache String",
    "moka [u8; 16]",
    "moka String",
];

/// The peer that does what idemcache does, by hand over dashmap: what the contract
/// costs a map user.
pub const CONTRACT: &str = "dashmap [u8; 16] + fingerprint, state, TTL";

pub fn build(name: &str, capacity: usize) -> Box<dyn NaturalPeer> {
    match name {
        CONTRACT => Box::new(ContractPeer {
            map: dashmap::DashMap::with_hasher(RandomState::new()),
            tokens: std::sync::atomic::AtomicU64::new(0),
        }),
        "idemcache (Key + Fingerprint per call)" => Box::new(Idemcache(
            Cache::builder()
                .max_entries(capacity)
                .max_bytes(usize::MAX / 2)
                .completed_ttl(TTL)
                .build()
                .unwrap(),
        )),
        "dashmap [u8; 16]" => Box::new(DashMapPeer::<[u8; 16]>(
            dashmap::DashMap::with_hasher(RandomState::new()),
            "dashmap [u8; 16]",
        )),
        "dashmap String" => Box::new(DashMapPeer::<String>(
            dashmap::DashMap::with_hasher(RandomState::new()),
            "dashmap String",
        )),
        "quick_cache [u8; 16]" => Box::new(QuickCachePeer::<[u8; 16]>(
            quick_cache::sync::Cache::new(capacity),
            "quick_cache [u8; 16]",
        )),
        "quick_cache String" => Box::new(QuickCachePeer::<String>(
            quick_cache::sync::Cache::new(capacity),
            "quick_cache String",
        )),
        "moka [u8; 16]" => Box::new(MokaPeer::<[u8; 16]>(
            moka::sync::Cache::builder().max_capacity(capacity as u64).time_to_live(TTL).build(),
            "moka [u8; 16]",
        )),
        "moka String" => Box::new(MokaPeer::<String>(
            moka::sync::Cache::builder().max_capacity(capacity as u64).time_to_live(TTL).build(),
            "moka String",
        )),
        other => panic!("unknown peer {other}"),
    }
}

/// How each map peer's user turns a request into its key.
pub trait NaturalKey: std::hash::Hash + Eq + Clone + Send + Sync + 'static {
    fn of(ask: &Ask) -> Self;
}

impl NaturalKey for [u8; 16] {
    fn of(ask: &Ask) -> Self {
        ask.id
    }
}

impl NaturalKey for String {
    fn of(ask: &Ask) -> Self {
        ask.header().to_owned()
    }
}

struct Idemcache(Cache);

impl NaturalPeer for Idemcache {
    fn name(&self) -> &'static str {
        "idemcache (Key + Fingerprint per call)"
    }
    fn claim_complete(&self, ask: &Ask, execute: &dyn Fn() -> Bytes) -> Outcome {
        let key = Key::new("POST /v1/orders", "user:42", ask.header_bytes()).unwrap();
        let fp = Fingerprint::of(REQUEST);
        match self.0.claim(&key, fp).expect("benchmarks never fill the cache with in-flight work") {
            Claim::Acquired(guard) => {
                guard.complete(execute()).unwrap();
                Outcome::Executed
            }
            Claim::Completed(replay) => Outcome::Replayed(replay.body.unwrap_or_default()),
            _ => Outcome::Busy,
        }
    }
}

struct DashMapPeer<K>(dashmap::DashMap<K, Slot, RandomState>, &'static str);

impl<K: NaturalKey> NaturalPeer for DashMapPeer<K> {
    fn name(&self) -> &'static str {
        self.1
    }
    fn claim_complete(&self, ask: &Ask, execute: &dyn Fn() -> Bytes) -> Outcome {
        use dashmap::mapref::entry::Entry;
        let key = K::of(ask);
        match self.0.entry(key.clone()) {
            Entry::Occupied(e) => match e.get() {
                Slot::Completed(_, body) => return Outcome::Replayed(body.clone()),
                Slot::Processing(_) => return Outcome::Busy,
            },
            Entry::Vacant(v) => {
                v.insert(Slot::Processing(STORED_FP));
            }
        }
        self.0.insert(key, Slot::Completed(STORED_FP, execute()));
        Outcome::Executed
    }
}

struct QuickCachePeer<K>(quick_cache::sync::Cache<K, Slot>, &'static str);

impl<K: NaturalKey> NaturalPeer for QuickCachePeer<K> {
    fn name(&self) -> &'static str {
        self.1
    }
    fn claim_complete(&self, ask: &Ask, execute: &dyn Fn() -> Bytes) -> Outcome {
        match self.0.get_value_or_guard(&K::of(ask), Some(Duration::ZERO)) {
            quick_cache::sync::GuardResult::Guard(guard) => {
                let _ = guard.insert(Slot::Completed(STORED_FP, execute()));
                Outcome::Executed
            }
            quick_cache::sync::GuardResult::Value(Slot::Completed(_, body)) => {
                Outcome::Replayed(body)
            }
            _ => Outcome::Busy,
        }
    }
}

struct MokaPeer<K>(moka::sync::Cache<K, Slot>, &'static str);

impl<K: NaturalKey> NaturalPeer for MokaPeer<K> {
    fn name(&self) -> &'static str {
        self.1
    }
    fn claim_complete(&self, ask: &Ask, execute: &dyn Fn() -> Bytes) -> Outcome {
        let key = K::of(ask);
        let entry = self.0.entry(key.clone()).or_insert_with(|| Slot::Processing(STORED_FP));
        if entry.is_fresh() {
            self.0.insert(key, Slot::Completed(STORED_FP, execute()));
            return Outcome::Executed;
        }
        match entry.into_value() {
            Slot::Completed(_, body) => Outcome::Replayed(body),
            Slot::Processing(_) => Outcome::Busy,
        }
    }
}

/// What [`ContractPeer`] stores: idemcache's contract by hand (the request's
/// fingerprint, a state, a deadline: the lease's end while processing, the result's
/// expiry once completed, and the claim's token so a completion is fenced).
enum Record {
    Processing { fp: Fingerprint, token: u64, lease_ends: Instant },
    Completed { fp: Fingerprint, body: Bytes, expires: Instant },
}

/// dashmap keyed by the `[u8; 16]` doing what idemcache does on every call: the
/// request's fingerprint computed per call (as idemcache's user computes it), a replay
/// only for the same request and a live result, a lapsed lease taken over under a new
/// token, a completion only by the claim's own token. `Instant::now()` is the clock a
/// map user reaches for; no size bound, no eviction, no UNKNOWN, no waiting.
struct ContractPeer {
    map: dashmap::DashMap<[u8; 16], Record, RandomState>,
    tokens: std::sync::atomic::AtomicU64,
}

/// How long a claim's lease lasts in [`ContractPeer`] (idemcache's default).
const LEASE: Duration = Duration::from_secs(30);

impl NaturalPeer for ContractPeer {
    fn name(&self) -> &'static str {
        CONTRACT
    }
    fn claim_complete(&self, ask: &Ask, execute: &dyn Fn() -> Bytes) -> Outcome {
        use dashmap::mapref::entry::Entry;
        let fp = Fingerprint::of(REQUEST);
        let now = Instant::now();
        // A token only for a claim that acquires: a replay takes none.
        let token = || self.tokens.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let claimed = |token| Record::Processing { fp, token, lease_ends: now + LEASE };
        let token = match self.map.entry(ask.id) {
            Entry::Occupied(mut e) => match e.get() {
                Record::Completed { fp: stored, body, expires } if *expires > now => {
                    return if *stored == fp {
                        Outcome::Replayed(body.clone())
                    } else {
                        Outcome::Busy
                    };
                }
                Record::Processing { lease_ends, .. } if *lease_ends > now => return Outcome::Busy,
                // Expired, or its lease lapsed: taken over.
                _ => {
                    let token = token();
                    e.insert(claimed(token));
                    token
                }
            },
            Entry::Vacant(v) => {
                let token = token();
                v.insert(claimed(token));
                token
            }
        };
        let body = execute();
        if let Some(mut record) = self.map.get_mut(&ask.id) {
            if matches!(*record, Record::Processing { token: t, .. } if t == token) {
                *record = Record::Completed { fp, body, expires: Instant::now() + TTL };
            }
        }
        Outcome::Executed
    }
}
