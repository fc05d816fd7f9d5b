//! A plain sequential reference model of the cache, and a harness that runs one
//! operation against both and asserts they agree. Shared by the proptest suite and the
//! `ops` fuzz target, so both check the same contract.
//!
//! The model is written from the crate docs' state table, not from the implementation: a
//! BTreeMap of keys to `(fingerprint, state, since, deadline, owner)`. Dead entries stay
//! in the model until a key operation touches them or `RunPending` sweeps; the cache may
//! reclaim them earlier (a bounded sweep rides on every insert), so the counters that
//! depend on when reclaiming happens (`entries`, `bytes`, `expirations`, `takeovers`)
//! are compared right after `RunPending`, when both have reclaimed everything dead, and
//! every other answer and counter is compared after every step.

use std::collections::BTreeMap;
use std::time::Duration;

use idemcache::{
    Bytes, Cache, Claim, ClaimError, ClaimGuard, CorrelationId, DropPolicy, EntrySnapshot,
    EntryState, ExtendLeaseError, Fingerprint, InsertError, Key, LapsePolicy, LeaseLost,
    ManualClock, Outcome, ResolveError, SetResultTtlError, Stats, Timestamp, Verdict,
    CORRELATION_ID_OVERHEAD, ENTRY_OVERHEAD,
};

pub const KEYS: u8 = 16;
const SEC: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;
pub const LEASE_S: u64 = 10;
pub const COMPLETED_S: u64 = 30;
pub const UNKNOWN_S: u64 = 20;
pub const MAX_RESULT: usize = 8;

/// One step of a test sequence. Small numbers index keys, fingerprints and live guards.
#[derive(Debug, Clone)]
pub enum Op {
    /// `claim_correlated`, with a correlation id unless `corr` is 0 (ids of several
    /// lengths, so the byte charge is checked).
    Claim {
        key: u8,
        fp: u8,
        corr: u8,
    },
    /// `claim_wait` with a zero timeout: must answer exactly as `claim` would.
    ClaimWaitNow {
        key: u8,
        fp: u8,
    },
    Complete {
        guard: u8,
        len: u8,
    },
    Release {
        guard: u8,
    },
    MarkUnknown {
        guard: u8,
    },
    DropGuard {
        guard: u8,
    },
    Extend {
        guard: u8,
        secs: u8,
    },
    Resolve {
        key: u8,
        len: u8,
    },
    Forget {
        key: u8,
    },
    Remove {
        key: u8,
    },
    Peek {
        key: u8,
    },
    /// Moves the clock; often by less than the wheel's 1 s tick, so that entries die
    /// between ticks.
    Advance {
        millis: u32,
    },
    /// `Cache::insert` of a fact: completed (with a body of `len`) or unknown, started
    /// `age_ms` ago, expiring `ttl_ms` from now (0: already expired).
    Insert {
        key: u8,
        fp: u8,
        unknown: bool,
        len: u8,
        age_ms: u32,
        ttl_ms: u32,
    },
    /// Override how long this guard's result is kept (0 is refused).
    SetResultTtl {
        guard: u8,
        secs: u8,
    },
    /// Sweep every expired entry; then all counters must agree.
    RunPending,
    /// `Cache::list_unknown` of at most `limit` entries.
    ListUnknown {
        limit: u8,
    },
    /// `Cache::reconcile` of at most `limit` entries; the check's verdict is the key's
    /// number modulo 3 (happened with a body of its length, did not happen, undecided),
    /// but `Undecided` for every key once `undecided` is set.
    Reconcile {
        limit: u8,
        undecided: bool,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum MState {
    Processing { owner: u64 },
    Completed(Option<Vec<u8>>),
    Unknown,
}

#[derive(Debug, Clone)]
struct MEntry {
    fp: u8,
    state: MState,
    since: u64,
    deadline: u64,
    /// Completion order, for eviction (oldest first).
    seq: u64,
    /// The correlation id its claim (or insert) was given.
    corr: Option<String>,
}

/// The reference model: plain data, no concurrency, no cleverness.
#[derive(Debug)]
struct Model {
    max_entries: usize,
    completions: u64,
    now: u64,
    entries: BTreeMap<u8, MEntry>,
    next_owner: u64,
    stats: Stats,
    /// `LapsePolicy::MarkUnknown`: a lapsed lease is UNKNOWN from its end.
    lapse_to_unknown: bool,
}

impl Model {
    /// Under `MarkUnknown`, every PROCESSING entry whose lease has lapsed is UNKNOWN,
    /// marked at the lease's end, for `UNKNOWN_S` from then (the contract; the cache
    /// turns them when it reaches them, which no answer can tell apart). Run after every
    /// clock move.
    fn lapse(&mut self) {
        if !self.lapse_to_unknown {
            return;
        }
        let now = self.now;
        for e in self.entries.values_mut() {
            if matches!(e.state, MState::Processing { .. }) && e.deadline <= now {
                e.state = MState::Unknown;
                e.since = e.deadline;
                e.deadline += UNKNOWN_S * SEC;
                self.stats.lapsed_unknown += 1;
            }
        }
    }

    /// The live UNKNOWN entries, oldest mark first (ties by key).
    fn list_unknown(&self) -> Vec<(u8, u64, u64)> {
        let now = self.now;
        let mut all: Vec<(u8, u64, u64)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.state == MState::Unknown && e.deadline > now)
            .map(|(k, e)| (*k, e.since, e.deadline))
            .collect();
        all.sort_by_key(|&(k, since, _)| (since, k));
        all
    }

    /// Reclaims `key`'s entry if it is dead, counting it as the cache does.
    fn reclaim_if_dead(&mut self, key: u8) {
        let now = self.now;
        if let Some(e) = self.entries.get(&key).filter(|e| e.deadline <= now) {
            if matches!(e.state, MState::Processing { .. }) {
                self.stats.takeovers += 1;
            }
            self.stats.expirations += 1;
            self.entries.remove(&key);
        }
    }

    /// A live entry, reclaiming a dead one (as the cache does on a key operation).
    fn live(&mut self, key: u8) -> Option<&mut MEntry> {
        self.reclaim_if_dead(key);
        self.entries.get_mut(&key)
    }

    fn run_pending(&mut self) {
        let keys: Vec<u8> = self.entries.keys().copied().collect();
        for key in keys {
            self.reclaim_if_dead(key);
        }
    }

    /// Capacity for one more entry: a full cache reclaims every dead entry, then evicts
    /// the oldest tenth (at least one) of its live completed entries by arrival, or
    /// refuses if there are none.
    fn make_room(&mut self) -> bool {
        let now = self.now;
        if self.entries.values().filter(|e| e.deadline > now).count() < self.max_entries {
            return true;
        }
        self.run_pending();
        let mut completed: Vec<(u64, u8)> = self
            .entries
            .iter()
            .filter(|(_, e)| matches!(e.state, MState::Completed(_)))
            .map(|(k, e)| (e.seq, *k))
            .collect();
        if completed.is_empty() {
            return false;
        }
        completed.sort();
        let batch = (completed.len() / 10).max(1);
        for (_, k) in &completed[..batch] {
            self.entries.remove(k);
        }
        self.stats.evictions += batch as u64;
        true
    }

    /// `Err(None)`: refused as occupied (the model keeps no snapshot to compare).
    fn insert(
        &mut self,
        key: u8,
        fp: u8,
        unknown: bool,
        len: u8,
        age: u64,
        ttl: u64,
    ) -> Result<(), Option<InsertError>> {
        let now = self.now;
        if ttl == 0 {
            return Err(Some(InsertError::Expired));
        }
        self.reclaim_if_dead(key);
        if self.entries.contains_key(&key) {
            return Err(None);
        }
        if !self.make_room() {
            return Err(Some(InsertError::CapacityExhausted));
        }
        let state = if unknown {
            MState::Unknown
        } else {
            let body = body(len);
            let kept = (body.len() <= MAX_RESULT).then_some(body);
            if kept.is_none() {
                self.stats.oversized += 1;
            }
            MState::Completed(kept)
        };
        self.completions += 1;
        let since = now.saturating_sub(age);
        let corr = correlation(len);
        let entry = MEntry { fp, state, since, deadline: now + ttl, seq: self.completions, corr };
        self.entries.insert(key, entry);
        self.stats.inserted += 1;
        Ok(())
    }

    fn claim(&mut self, key: u8, fp: u8, corr: Option<String>) -> Expected {
        let now = self.now;
        self.reclaim_if_dead(key);
        if let Some(e) = self.entries.get(&key) {
            {
                if e.fp != fp {
                    self.stats.mismatches += 1;
                    return Expected::Mismatch;
                }
                return match &e.state {
                    MState::Completed(body) => {
                        self.stats.replayed += 1;
                        Expected::Completed(body.clone(), e.since, e.deadline)
                    }
                    MState::Processing { .. } => {
                        self.stats.in_progress += 1;
                        Expected::InProgress(e.since, e.deadline)
                    }
                    MState::Unknown => {
                        self.stats.unknown += 1;
                        Expected::Unknown(e.since, e.deadline)
                    }
                };
            }
        }
        if !self.make_room() {
            self.stats.capacity_refusals += 1;
            return Expected::Refused;
        }
        self.next_owner += 1;
        let owner = self.next_owner;
        self.entries.insert(
            key,
            MEntry {
                fp,
                state: MState::Processing { owner },
                since: now,
                deadline: now + LEASE_S * SEC,
                seq: 0,
                corr,
            },
        );
        self.stats.acquired += 1;
        Expected::Acquired(owner)
    }

    /// Whether `owner` still owns `key`; counts a lost lease when not.
    fn owns(&mut self, key: u8, owner: u64) -> bool {
        let now = self.now;
        let ok = self
            .entries
            .get(&key)
            .is_some_and(|e| e.state == MState::Processing { owner } && e.deadline > now);
        if !ok {
            self.stats.leases_lost += 1;
        }
        ok
    }

    fn store(&mut self, key: u8, body: Vec<u8>, ttl_s: u64) {
        let now = self.now;
        let kept = (body.len() <= MAX_RESULT).then_some(body);
        if kept.is_none() {
            self.stats.oversized += 1;
        }
        self.stats.completions += 1;
        self.completions += 1;
        let seq = self.completions;
        let e = self.entries.get_mut(&key).unwrap();
        e.seq = seq;
        e.state = MState::Completed(kept);
        e.since = now;
        e.deadline = now + ttl_s * SEC;
    }

    fn mark_unknown(&mut self, key: u8) {
        let now = self.now;
        let e = self.entries.get_mut(&key).unwrap();
        e.state = MState::Unknown;
        e.since = now;
        e.deadline = now + UNKNOWN_S * SEC;
    }

    fn release(&mut self, key: u8) {
        self.entries.remove(&key);
        self.stats.releases += 1;
    }

    fn snapshot(&mut self, key: u8) -> Option<ModelSnapshot> {
        self.live(key).map(|e| (e.fp, e.state.clone(), e.since, e.deadline, e.corr.clone()))
    }
}

/// An entry as the model sees it: fingerprint, state, since, deadline, correlation id.
type ModelSnapshot = (u8, MState, u64, u64, Option<String>);

/// The correlation id an operation numbered `n` passes: none for 0, else one of a
/// length that varies with `n` (6 to 127 bytes).
fn correlation(n: u8) -> Option<String> {
    (n != 0).then(|| format!("req-{n}-{}", "x".repeat(usize::from(n) % 120)))
}

#[derive(Debug, PartialEq)]
enum Expected {
    Acquired(u64),
    Completed(Option<Vec<u8>>, u64, u64),
    InProgress(u64, u64),
    Unknown(u64, u64),
    Mismatch,
    Refused,
}

/// The cache under test, the model, and the guards handed out so far.
pub struct Harness {
    cache: Cache,
    clock: ManualClock,
    model: Model,
    keys: Vec<Key>,
    guards: Vec<Held>,
    policy: DropPolicy,
    /// Every result a replay handed out, with what it read then: it must read the same
    /// for as long as it is held, whatever the cache does after (chunks are sealed,
    /// split, refilled and freed under it).
    handed_out: Vec<(Bytes, Vec<u8>)>,
}

/// A guard the harness holds, with what the model knows of it.
struct Held {
    guard: ClaimGuard,
    key: u8,
    owner: u64,
    result_ttl_s: u64,
}

fn body(len: u8) -> Vec<u8> {
    (0..len).map(|i| b'a' + i % 26).collect()
}

fn fingerprint(fp: u8) -> Fingerprint {
    Fingerprint::from_u128(u128::from(fp))
}

impl Harness {
    /// A harness over a one-shard cache (so its bound is exact) holding at most
    /// `max_entries`.
    pub fn new(policy: DropPolicy, max_entries: usize) -> Harness {
        Harness::with_lapse(policy, false, max_entries)
    }

    /// [`Harness::new`], with lapsed leases turned UNKNOWN (for the model's `UNKNOWN_S`)
    /// when `mark_lapses`, taken over otherwise.
    pub fn with_lapse(policy: DropPolicy, mark_lapses: bool, max_entries: usize) -> Harness {
        let lapse = match mark_lapses {
            true => LapsePolicy::MarkUnknown { ttl: Duration::from_secs(UNKNOWN_S) },
            false => LapsePolicy::TakeOver,
        };
        let clock = ManualClock::new();
        let cache = Cache::builder()
            .clock(clock.clone())
            .shards(1)
            .max_entries(max_entries)
            .lease(Duration::from_secs(LEASE_S))
            .completed_ttl(Duration::from_secs(COMPLETED_S))
            .unknown_ttl(Duration::from_secs(UNKNOWN_S))
            .max_result_size(MAX_RESULT)
            .drop_policy(policy)
            .lapse_policy(lapse)
            .build()
            .unwrap();
        let keys =
            (0..KEYS).map(|i| Key::new("scope", "tenant", format!("key-{i}")).unwrap()).collect();
        let model = Model {
            max_entries,
            completions: 0,
            now: 0,
            entries: BTreeMap::new(),
            next_owner: 0,
            stats: Stats::default(),
            lapse_to_unknown: mark_lapses,
        };
        Harness { cache, clock, model, keys, guards: Vec::new(), policy, handed_out: Vec::new() }
    }

    /// Runs `op` on the cache and the model and asserts they agree, then re-validates the
    /// cache's internal counters.
    pub fn apply(&mut self, op: &Op) {
        match *op {
            Op::Claim { key, fp, .. } | Op::ClaimWaitNow { key, fp } => {
                let key = key % KEYS;
                // `claim_wait` keeps no correlation id.
                let corr = match *op {
                    Op::Claim { corr, .. } => correlation(corr),
                    _ => None,
                };
                let expected = self.model.claim(key, fp, corr.clone());
                let k = &self.keys[key as usize];
                let claim = if matches!(op, Op::Claim { .. }) {
                    let id = corr.map(|c| CorrelationId::new(c).unwrap());
                    self.cache.claim_correlated(k, fingerprint(fp), id.as_ref())
                } else {
                    self.cache.claim_wait(k, fingerprint(fp), Duration::ZERO)
                };
                let actual = match claim {
                    Err(ClaimError::CapacityExhausted) => Expected::Refused,
                    Err(e) => panic!("{op:?}: unexpected {e:?}"),
                    Ok(claim) => match claim {
                        Claim::Acquired(guard) => {
                            let Expected::Acquired(owner) = expected else {
                                panic!("{op:?}: cache acquired, model expected {expected:?}")
                            };
                            self.guards.push(Held { guard, key, owner, result_ttl_s: COMPLETED_S });
                            return self.check(false);
                        }
                        Claim::Completed(r) => {
                            if let Some(b) = &r.body {
                                self.handed_out.push((b.clone(), b.to_vec()));
                            }
                            Expected::Completed(
                                r.body.map(|b| b.to_vec()),
                                r.completed_at.as_nanos(),
                                r.expires_at.as_nanos(),
                            )
                        }
                        Claim::InProgress { started_at, lease_ends_at } => {
                            Expected::InProgress(started_at.as_nanos(), lease_ends_at.as_nanos())
                        }
                        Claim::Unknown { marked_at, expires_at } => {
                            Expected::Unknown(marked_at.as_nanos(), expires_at.as_nanos())
                        }
                        Claim::Mismatch => Expected::Mismatch,
                    },
                };
                assert_eq!(actual, expected, "{op:?}");
            }
            Op::Complete { guard, len } => {
                if let Some(Held { guard: g, key, owner, result_ttl_s }) = self.take_guard(guard) {
                    let ok = self.model.owns(key, owner);
                    let result = g.complete(body(len));
                    assert_eq!(result, if ok { Ok(()) } else { Err(LeaseLost) }, "{op:?}");
                    if ok {
                        self.model.store(key, body(len), result_ttl_s);
                    }
                }
            }
            Op::SetResultTtl { guard, secs } => {
                if !self.guards.is_empty() {
                    let n = self.guards.len();
                    let held = &mut self.guards[guard as usize % n];
                    let result = held.guard.set_result_ttl(Duration::from_secs(secs.into()));
                    if secs == 0 {
                        assert_eq!(result, Err(SetResultTtlError::InvalidDuration(Duration::ZERO)));
                    } else {
                        assert_eq!(result, Ok(()));
                        held.result_ttl_s = secs.into();
                    }
                }
            }
            Op::RunPending => {
                self.cache.run_pending();
                self.model.run_pending();
                return self.check(true);
            }
            Op::Release { guard } => {
                if let Some(Held { guard: g, key, owner, .. }) = self.take_guard(guard) {
                    let ok = self.model.owns(key, owner);
                    assert_eq!(g.release(), if ok { Ok(()) } else { Err(LeaseLost) }, "{op:?}");
                    if ok {
                        self.model.release(key);
                    }
                }
            }
            Op::MarkUnknown { guard } => {
                if let Some(Held { guard: g, key, owner, .. }) = self.take_guard(guard) {
                    let ok = self.model.owns(key, owner);
                    assert_eq!(
                        g.mark_unknown(),
                        if ok { Ok(()) } else { Err(LeaseLost) },
                        "{op:?}"
                    );
                    if ok {
                        self.model.mark_unknown(key);
                    }
                }
            }
            Op::DropGuard { guard } => {
                if let Some(Held { guard: g, key, owner, .. }) = self.take_guard(guard) {
                    let ok = self.model.owns(key, owner);
                    drop(g);
                    if ok {
                        match self.policy {
                            DropPolicy::Release => self.model.release(key),
                            DropPolicy::MarkUnknown => self.model.mark_unknown(key),
                        }
                    }
                }
            }
            Op::Extend { guard, secs } => {
                if self.guards.is_empty() {
                    return self.check(false);
                }
                let i = guard as usize % self.guards.len();
                let (key, owner) = (self.guards[i].key, self.guards[i].owner);
                let result = self.guards[i].guard.extend_lease(Duration::from_secs(secs.into()));
                if secs == 0 {
                    assert_eq!(result, Err(ExtendLeaseError::InvalidDuration(Duration::ZERO)));
                } else if self.model.owns(key, owner) {
                    let end = self.model.now + u64::from(secs) * SEC;
                    self.model.entries.get_mut(&key).unwrap().deadline = end;
                    assert_eq!(result.map(|t| t.as_nanos()), Ok(end), "{op:?}");
                } else {
                    assert_eq!(result, Err(ExtendLeaseError::LeaseLost), "{op:?}");
                }
            }
            Op::Resolve { key, len } => {
                let key = key % KEYS;
                let expected = self.model_resolvable(key);
                let result = self.cache.resolve(&self.keys[key as usize], body(len));
                assert_eq!(result, expected, "{op:?}");
                if expected.is_ok() {
                    self.model.store(key, body(len), COMPLETED_S);
                }
            }
            Op::Forget { key } => {
                let key = key % KEYS;
                let expected = self.model_resolvable(key);
                assert_eq!(self.cache.forget(&self.keys[key as usize]), expected, "{op:?}");
                if expected.is_ok() {
                    self.model.entries.remove(&key);
                }
            }
            Op::Remove { key } => {
                let key = key % KEYS;
                let expected = self.model.snapshot(key);
                let actual = self.cache.remove(&self.keys[key as usize]);
                self.assert_snapshot(actual, &expected, op);
                self.model.entries.remove(&key);
            }
            Op::Peek { key } => {
                let key = key % KEYS;
                let expected = self.model.snapshot(key);
                let actual = self.cache.peek(&self.keys[key as usize]);
                self.assert_snapshot(actual, &expected, op);
            }
            Op::Advance { millis } => {
                self.clock.advance(Duration::from_millis(millis.into()));
                self.model.now += u64::from(millis) * MS;
                self.model.lapse();
            }
            Op::ListUnknown { limit } => {
                let actual = self.cache.list_unknown(limit.into());
                for entry in &actual {
                    let key = self.keys.iter().position(|k| *k == entry.key).unwrap() as u8;
                    let listed = entry.correlation_id.as_ref().map(|c| c.as_str().to_owned());
                    assert_eq!(listed, self.model.entries[&key].corr, "{op:?}: {key}'s id");
                }
                let actual = self.listed(&actual);
                assert_listing(&actual, &self.model.list_unknown(), limit.into(), op);
            }
            Op::Reconcile { limit, undecided } => {
                let verdict = |key: u8| match key % 3 {
                    _ if undecided => Verdict::Undecided,
                    0 => Verdict::Happened(Some(Bytes::from(body(key)))),
                    1 => Verdict::DidNotHappen,
                    _ => Verdict::Undecided,
                };
                let mut listed = Vec::new();
                let keys = self.keys.clone();
                let done = self.cache.reconcile(limit.into(), |entry| {
                    let key = keys.iter().position(|k| *k == entry.key).unwrap() as u8;
                    listed.push((key, entry.marked_at.as_nanos(), entry.expires_at.as_nanos()));
                    verdict(key)
                });
                assert_listing(&listed, &self.model.list_unknown(), limit.into(), op);
                let (mut resolved, mut forgotten, mut left) = (0, 0, 0);
                for (key, _, _) in listed {
                    match verdict(key) {
                        Verdict::Happened(_) => {
                            self.model.store(key, body(key), COMPLETED_S);
                            resolved += 1;
                        }
                        Verdict::DidNotHappen => {
                            self.model.entries.remove(&key);
                            forgotten += 1;
                        }
                        Verdict::Undecided => left += 1,
                    }
                }
                assert_eq!(
                    (done.resolved, done.forgotten, done.left),
                    (resolved, forgotten, left),
                    "{op:?}"
                );
            }
            Op::Insert { key, fp, unknown, len, age_ms, ttl_ms } => {
                let key = key % KEYS;
                let (age, ttl) = (u64::from(age_ms) * MS, u64::from(ttl_ms) * MS);
                let expected = self.model.insert(key, fp, unknown, len, age, ttl);
                let now = self.model.now;
                let (since, expires_at) = (
                    Timestamp::from_nanos(now.saturating_sub(age)),
                    Timestamp::from_nanos(now + ttl),
                );
                let known = if unknown {
                    Outcome::Unknown { marked_at: since, expires_at }
                } else {
                    Outcome::Completed {
                        body: Some(Bytes::from(body(len))),
                        completed_at: since,
                        expires_at,
                    }
                };
                let id = correlation(len).map(|c| CorrelationId::new(c).unwrap());
                let k = &self.keys[key as usize];
                let actual = self.cache.insert_correlated(k, fingerprint(fp), known, id.as_ref());
                // The model does not rebuild the occupant's snapshot; `Peek` checks entries.
                let actual = actual.map_err(|e| match e {
                    InsertError::Occupied(_) => None,
                    other => Some(other),
                });
                assert_eq!(actual, expected, "{op:?}");
            }
        }
        self.check(false);
    }

    /// A listing as `(key number, marked_at, expires_at)`.
    fn listed(&self, entries: &[idemcache::UnknownEntry]) -> Vec<(u8, u64, u64)> {
        entries
            .iter()
            .map(|e| {
                let key = self.keys.iter().position(|k| *k == e.key).unwrap() as u8;
                (key, e.marked_at.as_nanos(), e.expires_at.as_nanos())
            })
            .collect()
    }

    fn take_guard(&mut self, i: u8) -> Option<Held> {
        if self.guards.is_empty() {
            None
        } else {
            let n = self.guards.len();
            Some(self.guards.swap_remove(i as usize % n))
        }
    }

    fn model_resolvable(&mut self, key: u8) -> Result<(), ResolveError> {
        match self.model.live(key) {
            None => Err(ResolveError::NotFound),
            Some(e) if e.state == MState::Unknown => Ok(()),
            Some(_) => Err(ResolveError::NothingToSettle),
        }
    }

    fn assert_snapshot(
        &self,
        actual: Option<EntrySnapshot>,
        expected: &Option<ModelSnapshot>,
        op: &Op,
    ) {
        let actual = actual.map(|s| {
            let corr = s.correlation_id.map(|c| c.as_str().to_owned());
            let fp = u8::try_from(s.fingerprint.as_u128()).unwrap();
            let (state, since, deadline) = match s.state {
                EntryState::Processing { started_at, lease_ends_at, .. } => {
                    // The model's owner ids are not tokens; compare state, not identity.
                    (None, started_at, lease_ends_at)
                }
                EntryState::Completed(r) => (
                    Some(MState::Completed(r.body.map(|b| b.to_vec()))),
                    r.completed_at,
                    r.expires_at,
                ),
                EntryState::Unknown { marked_at, expires_at } => {
                    (Some(MState::Unknown), marked_at, expires_at)
                }
                _ => unreachable!("no other states exist"),
            };
            (fp, state, since.as_nanos(), deadline.as_nanos(), corr)
        });
        let expected = expected.as_ref().map(|(fp, state, since, deadline, corr)| {
            let state = match state {
                MState::Processing { .. } => None,
                other => Some(other.clone()),
            };
            (*fp, state, *since, *deadline, corr.clone())
        });
        assert_eq!(actual, expected, "{op:?}");
    }

    /// Counters agree with the model (all of them when `swept`, else those that do not
    /// depend on when dead entries are reclaimed); internal invariants hold.
    fn check(&self, swept: bool) {
        self.cache.debug_validate();
        for (held, read) in &self.handed_out {
            assert_eq!(&held[..], &read[..], "a result handed out changed under its holder");
        }
        let mut actual = self.cache.stats();
        let mut expected = self.model.stats;
        expected.entries = self.model.entries.len() as u64;
        expected.bytes = self
            .model
            .entries
            .iter()
            .map(|(k, e)| {
                let body = match &e.state {
                    MState::Completed(Some(b)) => b.len(),
                    _ => 0,
                };
                let corr = e.corr.as_ref().map_or(0, |c| c.len() + CORRELATION_ID_OVERHEAD);
                (self.keys[*k as usize].as_bytes().len() + body + ENTRY_OVERHEAD + corr) as u64
            })
            .sum();
        // Real time, not model time: not comparable.
        actual.max_eviction_pause = Duration::ZERO;
        if !swept {
            for s in [&mut actual, &mut expected] {
                (s.entries, s.bytes, s.expirations, s.takeovers) = (0, 0, 0, 0);
                s.lapsed_unknown = 0;
            }
        }
        assert_eq!(actual, expected, "swept: {swept}");
    }
}

/// A listing of at most `limit` of the model's live UNKNOWN entries `all` (oldest mark
/// first): the `limit` oldest marks, in mark order; of entries tied at the last mark
/// listed, any may be the ones listed.
fn assert_listing(actual: &[(u8, u64, u64)], all: &[(u8, u64, u64)], limit: usize, op: &Op) {
    assert_eq!(actual.len(), all.len().min(limit), "{op:?}: {actual:?} of {all:?}");
    assert!(actual.windows(2).all(|w| w[0].1 <= w[1].1), "{op:?}: {actual:?} out of order");
    for e in actual {
        assert!(all.contains(e), "{op:?}: {e:?} listed, not in {all:?}");
    }
    if let Some(last) = actual.last() {
        for e in all.iter().filter(|e| e.1 < last.1) {
            assert!(actual.contains(e), "{op:?}: {e:?}, marked earlier, not listed");
        }
    }
}
