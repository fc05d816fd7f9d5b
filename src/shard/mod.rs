//! [`Shard`]: the claim state machine over one slice of the key space.
//!
//! Ground rules: a shard is plain single-threaded data (`&mut self` for every
//! transition; only [`Shard::replay`] reads through `&self`); the cache wraps each in a
//! lock and reads the clock after taking it, so every transition of one key is one call
//! here, one critical section, and time within a shard only moves forward in lock order.
//!
//! Layout: entries live in a slab (`slots`, reused through `free`; in segments, so that
//! growing copies none past the first 16,384: see [`slab`]); the hash table maps a key's hash
//! to its slab index. Slab indices are stable while an entry lives, so a
//! [`ClaimGuard`](crate::ClaimGuard) addresses its entry by `(slot, token)` without
//! hashing or cloning the key, and the timing wheel and the age list link entries by
//! slab index. A stale guard is recognised by its token: tokens are never reused within
//! a shard, so a reused slot never matches an old guard.
//!
//! Invariants (re-checked by [`Shard::validate`]): `entries` and `bytes` equal the count
//! and summed [`Entry::charge`] of occupied slots, `completed_bytes` the summed charge of
//! COMPLETED ones; every occupied slot is in the table exactly once and on the wheel
//! exactly once, at its deadline's tick; a slot is in the age list iff its entry is
//! COMPLETED and in the unknown list iff it is UNKNOWN; `entries <= max_entries` and
//! `bytes <= max_bytes` after every operation.
//!
//! Lapses: under [`LapsePolicy::MarkUnknown`](crate::LapsePolicy::MarkUnknown) a
//! PROCESSING entry past its lease is not dead but UNKNOWN from the lease's end. Every
//! path that finds an entry past its deadline (a claim, a lookup, the wheel, a listing)
//! first turns such an entry UNKNOWN in place ([`Shard::lapse`]), and only reclaims what
//! is dead after that; so no path can reclaim it, acquire its key or evict it before it
//! is UNKNOWN, and nobody ever sees it as absent.
//!
//! What runs under the shard lock: only this file's code and the cache's clock. No
//! caller-supplied value is dropped here (a drop can run the caller's code, e.g. a
//! `Bytes::from_owner` owner): a body the shard does not keep is left in the caller's
//! `Option`, and the bodies of entries that leave go to `graveyard`, which the cache
//! empties after unlocking.

pub(crate) mod arena;
mod correlations;
pub use correlations::CORRELATION_ID_OVERHEAD;
pub(crate) mod entry;
pub(crate) mod evict;
mod export;
pub(crate) use export::Exported;
mod slab;
pub(crate) mod wheel;

use std::time::{Duration, Instant};

use bytes::Bytes;
use hashbrown::HashTable;

use self::arena::{ResultArena, ResultRef};
use self::correlations::Correlations;
use self::entry::{Entry, State};
use self::evict::{AgeLinks, AgeList};
use self::slab::Slab;
use self::wheel::Wheel;
use crate::config::Config;
use crate::stats::Counters;
use crate::wait::Wakers;
use crate::{
    Claim, ClaimError, CorrelationId, EntrySnapshot, FencingToken, Fingerprint, InsertError, Key,
    LeaseLost, Outcome, RemovalCause, Replay, ResolveError, Timestamp, UnknownEntry,
};

/// Wheel work (node moves) an insert may spend reclaiming expired entries. An entry costs
/// at most one unit per wheel level it cascades through plus one to expire, and a
/// realistic TTL is three levels up, so each insert pays for more expiries than it
/// creates and the wheel keeps up while every ordinary call does bounded work. (Only a
/// full shard sweeps everything due at once; see `make_room`.)
const SWEEP_WORK_PER_INSERT: usize = 16;

/// Results of departed entries the cache frees after each locked operation, outside the
/// lock. An eviction step unlinks a tenth of the shard at once but leaves their results
/// in `graveyard`, to be freed a few at a time: freeing thousands of same-sized buffers
/// in one go overflows the allocator's per-thread cache and makes it coalesce chunks (a
/// quarter of churn's time, profiled), while freeing a few as the caller allocates the
/// next results reuses them hot. Four at once lets the processor overlap their cache
/// misses (the oldest results are long out of cache) and stays under glibc's per-thread
/// cache of seven chunks per size. The shard cannot fill and evict again before as many
/// inserts as it evicted, each freeing four, so the graveyard never holds more than one
/// eviction step's results.
pub(crate) const FREE_BATCH: usize = 4;

/// The latest deadline an entry may have: one [`MAX_TICK`](crate::MAX_TICK) short of
/// the end of time, so that the wheel tick it rounds up to is one a clock can still
/// reach (an entry due at a tick no clock reading reaches would never be reclaimed).
/// A claim whose lease would end later is refused ([`ClaimError::ClockOutOfRange`]);
/// results and marks made that late are kept until this deadline, shorter than asked.
pub(crate) const LAST_DEADLINE: Timestamp =
    Timestamp::from_nanos(u64::MAX - crate::MAX_TICK.as_nanos() as u64);

/// The UNKNOWN entry a listing saw, by its token (never reused within a shard):
/// settling "it" must not settle a later one, which a fingerprint and a mark time on a
/// coarse clock cannot tell apart.
#[derive(Clone, Copy)]
pub(crate) struct Listed {
    pub(crate) token: u64,
}

/// `now + d`, capped at [`LAST_DEADLINE`].
fn deadline_after(now: Timestamp, d: Duration) -> Timestamp {
    now.saturating_add(d).min(LAST_DEADLINE)
}

/// The hash a shard's table files a key under, from the key's 64-bit hash: its low 32
/// bits, twice. Entries keep those 32 bits, so the table grows and entries leave
/// without rehashing any key. Both halves are the same bits, so hashbrown's bucket (the
/// low bits) and its 7-bit tag (the top bits) come from the key's hash bits 0–31,
/// independent of the bits 40 and up that picked the shard.
#[inline]
pub(crate) fn table_hash(key_hash: u64) -> u64 {
    widen(key_hash as u32)
}

#[inline]
fn widen(low: u32) -> u64 {
    u64::from(low) << 32 | u64::from(low)
}

/// One shard's share of the cache's bounds, and the wheel's tick.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) max_entries: usize,
    pub(crate) max_bytes: usize,
    pub(crate) tick_nanos: u64,
}

/// The work a locked operation leaves for after the lock is released, drained by the
/// cache's epilogue ([`Cache::with_shard`](crate::Cache)): waking waiters, freeing
/// departed results, telling the removal listener. Kept apart so that nothing a caller
/// owns is dropped, and no caller code runs, under the shard lock.
#[derive(Debug, Default)]
pub(crate) struct Deferred {
    /// Threads sleeping in `claim_wait` on this shard; notifying is skipped when zero.
    pub(crate) waiters: usize,
    /// Futures of `claim_wait_async` waiting on this shard, woken with the threads.
    pub(crate) wakers: Wakers,
    /// Set when an entry left PROCESSING; the cache wakes waiters and clears it.
    pub(crate) left_processing: bool,
    /// Results of entries that left (evicted, expired, removed), not yet freed; the
    /// cache frees them after unlocking, [`FREE_BATCH`] per operation. Already gone from
    /// every count: nobody can reach them.
    pub(crate) graveyard: Vec<Bytes>,
    /// Removals for the listener, handed to it by the cache after unlocking; only kept
    /// when a listener is set.
    pub(crate) removed: Vec<(Key, RemovalCause)>,
}

impl Deferred {
    /// Whether a thread or a future waits on this shard.
    #[inline]
    pub(crate) fn has_waiters(&self) -> bool {
        self.waiters > 0 || self.wakers.len() > 0
    }

    /// Whether the epilogue has anything to do.
    #[inline]
    pub(crate) fn is_pending(&self) -> bool {
        self.left_processing || !self.removed.is_empty() || !self.graveyard.is_empty()
    }
}

#[derive(Debug)]
pub(crate) struct Shard {
    /// The cache's key hasher, for `validate` to check each entry's stored hash.
    hasher: ahash::RandomState,
    table: HashTable<u32>,
    slots: Slab<Entry>,
    free: Vec<u32>,
    /// Every entry, by the tick of its deadline; each slot's node also holds its links
    /// in `age`.
    wheel: Wheel<AgeLinks>,
    /// COMPLETED entries, oldest completion first (links in `wheel`'s nodes).
    age: AgeList,
    /// Summed charge of the entries in `age`: what evicting all of them would free.
    completed_bytes: usize,
    /// UNKNOWN entries, in the order they became UNKNOWN here, for a reconciler. Shares the link fields with
    /// `age`: an entry is never both COMPLETED and UNKNOWN.
    unknown: AgeList,
    /// Tokens issued here are `token_base + issued * token_stride + token_offset`:
    /// unique across the cache (each shard has its own offset), increasing per key, and
    /// (the base being the wall clock at build) larger after a restart.
    issued: u64,
    token_base: u64,
    token_stride: u64,
    token_offset: u64,
    entries: usize,
    bytes: usize,
    limits: Limits,
    pub(crate) counters: Counters,
    /// What this shard's operations left for the cache to do once the lock is released.
    pub(crate) deferred: Deferred,
    /// Where results kept for the default TTL are packed (see [`ResultArena`]).
    results: ResultArena,
    /// The correlation ids of the entries whose claims were given one.
    correlations: Correlations,
    record_removals: bool,
    /// How long an entry whose lease lapsed stays UNKNOWN, from the lease's end, under
    /// [`LapsePolicy::MarkUnknown`](crate::LapsePolicy::MarkUnknown); `None` under
    /// `TakeOver` (a lapsed entry is dead).
    lapse_to_unknown: Option<Duration>,
}

impl Shard {
    pub(crate) fn new(
        hasher: ahash::RandomState,
        index: usize,
        shard_count: usize,
        token_base: u64,
        limits: Limits,
        record_removals: bool,
        lapse_to_unknown: Option<Duration>,
    ) -> Shard {
        Shard {
            hasher,
            table: HashTable::new(),
            slots: Slab::default(),
            free: Vec::new(),
            wheel: Wheel::new(0),
            age: AgeList::default(),
            completed_bytes: 0,
            unknown: AgeList::default(),
            issued: 0,
            token_base,
            token_stride: shard_count as u64,
            token_offset: index as u64,
            entries: 0,
            bytes: 0,
            limits,
            counters: Counters::default(),
            results: ResultArena::default(),
            correlations: Correlations::default(),
            deferred: Deferred::default(),
            record_removals,
            lapse_to_unknown,
        }
    }

    /// Slab slots handed out, occupied or free: what the slab has grown to.
    #[cfg(test)]
    pub(crate) fn slab_len(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn entries(&self) -> usize {
        self.entries
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    #[inline]
    fn find(&self, hash: u64, key: &Key) -> Option<u32> {
        self.find_where(hash, |e| e.key == *key)
    }

    /// The slot of the entry filed under `hash` that `wanted` accepts.
    #[inline]
    fn find_where(&self, hash: u64, wanted: impl Fn(&Entry) -> bool) -> Option<u32> {
        let slots = &self.slots;
        self.table.find(hash, |&i| slots.get(i as usize).is_some_and(&wanted)).copied()
    }

    /// The table hash the cache located this key with (the shard holds a copy of its
    /// hasher).
    fn hash_of(&self, key: &Key) -> u64 {
        table_hash(self.hasher.hash_one(key.as_bytes()))
    }

    /// What the entry in `slot` costs against the byte bound: its key, its result and
    /// its correlation id.
    fn charge(&self, slot: u32) -> usize {
        let e = self.entry(slot);
        Entry::charge_for(&e.key, e.body.map_or(0, |r| self.results.len(r)))
            + self.correlations.charge(slot)
    }

    /// The entry in `slot` as seen from outside (sealing the arena's open buffer if its
    /// result is there).
    fn snapshot(&mut self, slot: u32) -> EntrySnapshot {
        let body = self.entry(slot).body.map(|r| self.results.sealed(r));
        let correlation_id = self.correlations.get(slot).cloned();
        self.entry(slot).snapshot(body, correlation_id)
    }

    #[inline]
    fn entry(&self, slot: u32) -> &Entry {
        self.slots.get(slot as usize).expect("the table only indexes occupied slots")
    }

    fn entry_mut(&mut self, slot: u32) -> &mut Entry {
        self.slots.get_mut(slot as usize).expect("the table only indexes occupied slots")
    }

    /// The wheel tick of a deadline, rounded up so nothing is reclaimed early.
    fn tick_of(&self, deadline: Timestamp) -> u64 {
        deadline.as_nanos().div_ceil(self.limits.tick_nanos)
    }

    /// Puts a slot on the wheel at its entry's (new) deadline, replacing any old place.
    fn schedule(&mut self, slot: u32) {
        let tick = self.tick_of(self.entry(slot).deadline);
        self.wheel.schedule(slot, tick);
    }

    /// Finds a live entry; a dead one found on the way is reclaimed.
    fn find_live(&mut self, hash: u64, key: &Key, now: Timestamp) -> Option<u32> {
        let slot = self.find(hash, key)?;
        if self.entry(slot).is_live(now) || self.lapse(slot, now) {
            Some(slot)
        } else {
            self.expire(slot);
            None
        }
    }

    /// Under [`LapsePolicy::MarkUnknown`](crate::LapsePolicy::MarkUnknown), turns the
    /// entry in `slot`, past its deadline, UNKNOWN if it was PROCESSING (its lease
    /// lapsed): marked at the lease's end, kept `unknown_ttl` from then. Returns whether
    /// the entry is live afterwards (an UNKNOWN whose own TTL has not passed too); the
    /// caller reclaims it otherwise. Every path that finds an entry past its deadline
    /// asks this first, so a lapsed lease is never reclaimed as dead under that policy.
    #[cold]
    #[inline(never)]
    fn lapse(&mut self, slot: u32, now: Timestamp) -> bool {
        let Some(ttl) = self.lapse_to_unknown else { return false };
        let e = self.entry_mut(slot);
        debug_assert!(!e.is_live(now), "only an entry past its deadline lapses");
        if e.state != State::Processing {
            return false;
        }
        e.state = State::Unknown;
        e.since = e.deadline;
        e.deadline = deadline_after(e.since, ttl);
        let live = e.is_live(now);
        self.schedule(slot);
        self.unknown.push_back(slot, &mut self.wheel);
        self.deferred.left_processing = true;
        self.counters.lapsed_unknown += 1;
        live
    }

    fn next_token(&mut self) -> u64 {
        self.issued += 1;
        self.token_base + self.issued * self.token_stride + self.token_offset
    }

    /// The claim transition: absent (or dead) → PROCESSING, or the answer for a live entry.
    ///
    /// This is where a claim becomes PROCESSING (in [`Shard::acquire`]). `acquired`
    /// builds the guard from the new entry's `(slot, token, lease end)`; taking it as a
    /// closure lets the answer be built once, in its public form, with no intermediate
    /// enum to convert on the replay path.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn claim(
        &mut self,
        hash: u64,
        key: &Key,
        fingerprint: Fingerprint,
        correlation_id: Option<&CorrelationId>,
        now: Timestamp,
        cfg: &Config,
        acquired: impl FnOnce(u32, u64, Timestamp, bool) -> Claim,
    ) -> Result<Claim, ClaimError> {
        let existing = self.find(hash, key);
        if let Some(slot) = existing {
            if self.entry(slot).is_live(now) || self.lapse(slot, now) {
                return Ok(self.answer(slot, fingerprint));
            }
        }
        // A dead entry still PROCESSING is an earlier execution whose lease lapsed: this
        // claim takes it over.
        let took_over = existing.is_some_and(|slot| self.entry(slot).state == State::Processing);
        let (slot, token, lease_ends_at) =
            self.acquire(existing, hash, key, fingerprint, correlation_id, now, cfg)?;
        Ok(acquired(slot, token, lease_ends_at, took_over))
    }

    /// Absent or dead → PROCESSING under a new fencing token. Kept out of line so the
    /// replay path (`claim` → `answer`) stays small.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &mut self,
        existing: Option<u32>,
        hash: u64,
        key: &Key,
        fingerprint: Fingerprint,
        correlation_id: Option<&CorrelationId>,
        now: Timestamp,
        cfg: &Config,
    ) -> Result<(u32, u64, Timestamp), ClaimError> {
        let lease_ends_at = now.saturating_add(cfg.lease);
        if lease_ends_at > LAST_DEADLINE {
            // Checked before anything changes: an error leaves the shard as it was.
            return Err(ClaimError::ClockOutOfRange { now });
        }
        if let Some(dead) = existing {
            self.expire(dead);
        }
        let correlation_id = match self.make_room_for(key, correlation_id, now) {
            Ok(kept) => kept,
            Err(full) => {
                self.counters.capacity_refusals += 1;
                return Err(full);
            }
        };
        let (slot, token) = self.insert_new(
            hash,
            key,
            fingerprint,
            correlation_id,
            State::Processing,
            now,
            lease_ends_at,
        );
        self.counters.acquired += 1;
        // Reclaim a little of what has expired; the new entry is live, so it is not due.
        self.sweep(now, SWEEP_WORK_PER_INSERT);
        Ok((slot, token, lease_ends_at))
    }

    /// The stored result, if `key` has a live COMPLETED entry for this request: the one
    /// claim answer that reads without writing (see `Cache::claim`). Counts nothing; the
    /// caller counts it. The clock is read only for a completed entry: a first claim
    /// reads none here. `None` too for a result in the arena's open buffer, which only
    /// the write path (`answer`) can share.
    #[inline]
    pub(crate) fn replay(
        &self,
        hash: u64,
        key: &Key,
        fingerprint: Fingerprint,
        now: impl FnOnce() -> Timestamp,
    ) -> Option<Replay> {
        // One probe that asks for a hit outright: an entry of this key in another state or
        // for another request is not one, and reads as absent here (the write path then
        // answers it). Testing the state and fingerprint (the entry's second cache line)
        // before the key (its first) lets the processor fetch both lines at once: looked
        // up key first and state after, the two lines were two misses one after the other
        // (perf, 100k keys).
        let found = self.find_where(hash, |e| {
            e.state == State::Completed && e.fingerprint == fingerprint && e.key == *key
        })?;
        let e = self.entry(found);
        if !e.is_live(now()) {
            return None;
        }
        let body = match e.body {
            Some(r) => Some(self.results.shared(r)?),
            None => None,
        };
        Some(e.replay(body))
    }

    /// The answer to a claim of a live entry.
    #[inline]
    fn answer(&mut self, slot: u32, fingerprint: Fingerprint) -> Claim {
        let e = self.entry(slot);
        if e.fingerprint != fingerprint {
            self.counters.mismatches += 1;
            return Claim::Mismatch;
        }
        match e.state {
            State::Completed => {
                let body = e.body.map(|r| self.results.sealed(r));
                let replay = self.entry(slot).replay(body);
                self.counters.replayed += 1;
                Claim::Completed(replay)
            }
            State::Processing => {
                let (started_at, lease_ends_at) = (e.since, e.deadline);
                self.counters.in_progress += 1;
                Claim::InProgress { started_at, lease_ends_at }
            }
            State::Unknown => {
                let (marked_at, expires_at) = (e.since, e.deadline);
                self.counters.unknown += 1;
                Claim::Unknown { marked_at, expires_at }
            }
        }
    }

    /// The entry a guard owns: PROCESSING, its token, lease not lapsed.
    fn owned(&mut self, slot: u32, token: u64, now: Timestamp) -> Result<u32, LeaseLost> {
        let owned = self
            .slots
            .get(slot as usize)
            .is_some_and(|e| e.state == State::Processing && e.token == token && e.is_live(now));
        if owned {
            Ok(slot)
        } else {
            self.counters.leases_lost += 1;
            Err(LeaseLost)
        }
    }

    /// PROCESSING → COMPLETED. A body over `max_result_size`, or one the byte bound has
    /// no room for even after evicting, is dropped and the completion kept: the work
    /// happened and a retry must not redo it.
    ///
    /// The shard takes `body` out of its `Option` only when it keeps the caller's
    /// `Bytes` as given; a body copied into the arena, or not kept, is left there for
    /// the caller to drop after unlocking (dropping it may run the caller's code).
    pub(crate) fn complete(
        &mut self,
        slot: u32,
        token: u64,
        body: &mut Option<Bytes>,
        ttl: Duration,
        now: Timestamp,
        cfg: &Config,
    ) -> Result<(), LeaseLost> {
        let slot = self.owned(slot, token, now)?;
        self.deferred.left_processing = true;
        let kept = self.keep_result(body, ttl, now, cfg);
        self.set_completed(slot, kept, now, deadline_after(now, ttl));
        self.counters.completions += 1;
        Ok(())
    }

    /// What of `body` a new COMPLETED entry keeps: a packed copy, the caller's `Bytes`
    /// itself (taken out of `body`), or nothing (too large, or no room even after
    /// evicting, which this may do).
    fn keep_result(
        &mut self,
        body: &mut Option<Bytes>,
        ttl: Duration,
        now: Timestamp,
        cfg: &Config,
    ) -> Option<ResultRef> {
        let len = body.as_ref().map_or(0, Bytes::len);
        // make_room cannot take the entry this is for: it is live (not due on the
        // wheel) and PROCESSING, UNKNOWN or not yet inserted (not in the age list).
        let fits = len <= cfg.max_result_size && self.make_room(now, 0, len).is_ok();
        if !fits {
            self.counters.oversized += 1;
            return None;
        }
        // Only results with the default TTL share chunks, so a chunk's results expire
        // together and none keeps the others' memory for longer.
        let packed = if ttl == cfg.completed_ttl {
            body.as_ref().and_then(|b| self.results.pack(b))
        } else {
            None
        };
        packed.or_else(|| body.take().map(|b| self.results.keep(b)))
    }

    /// Makes a live entry COMPLETED with `kept` as its result, until `deadline`.
    fn set_completed(
        &mut self,
        slot: u32,
        kept: Option<ResultRef>,
        since: Timestamp,
        deadline: Timestamp,
    ) {
        let before = self.charge(slot);
        let e = self.entry_mut(slot);
        let was_unknown = e.state == State::Unknown;
        e.state = State::Completed;
        e.since = since;
        e.deadline = deadline;
        e.body = kept;
        let after = self.charge(slot);
        self.bytes = self.bytes - before + after;
        self.completed_bytes += after;
        if was_unknown {
            self.unknown.remove(slot, &mut self.wheel);
        }
        self.schedule(slot);
        self.age.push_back(slot, &mut self.wheel);
    }

    /// PROCESSING → absent: the owner gives the key back without an outcome.
    pub(crate) fn release(
        &mut self,
        slot: u32,
        token: u64,
        now: Timestamp,
    ) -> Result<(), LeaseLost> {
        let slot = self.owned(slot, token, now)?;
        self.unlink(slot, RemovalCause::Removed);
        self.counters.releases += 1;
        Ok(())
    }

    /// PROCESSING → UNKNOWN: the outcome is ambiguous; nobody may re-execute blindly.
    pub(crate) fn mark_unknown(
        &mut self,
        slot: u32,
        token: u64,
        now: Timestamp,
        cfg: &Config,
    ) -> Result<(), LeaseLost> {
        let slot = self.owned(slot, token, now)?;
        self.deferred.left_processing = true;
        let e = self.entry_mut(slot);
        e.state = State::Unknown;
        e.since = now;
        e.deadline = deadline_after(now, cfg.unknown_ttl);
        self.schedule(slot);
        self.unknown.push_back(slot, &mut self.wheel);
        Ok(())
    }

    /// Renews the lease to end `lease` after `now`.
    pub(crate) fn extend_lease(
        &mut self,
        slot: u32,
        token: u64,
        now: Timestamp,
        lease: Duration,
    ) -> Result<Timestamp, LeaseLost> {
        let slot = self.owned(slot, token, now)?;
        let e = self.entry_mut(slot);
        e.deadline = deadline_after(now, lease);
        let deadline = e.deadline;
        self.schedule(slot);
        Ok(deadline)
    }

    /// UNKNOWN → COMPLETED, after the caller checked the authority.
    pub(crate) fn resolve(
        &mut self,
        hash: u64,
        key: &Key,
        listed: Option<Listed>,
        body: &mut Option<Bytes>,
        now: Timestamp,
        cfg: &Config,
    ) -> Result<(), ResolveError> {
        let slot = self.find_unknown(hash, key, listed, now)?;
        let kept = self.keep_result(body, cfg.completed_ttl, now, cfg);
        self.set_completed(slot, kept, now, deadline_after(now, cfg.completed_ttl));
        self.counters.completions += 1;
        Ok(())
    }

    /// UNKNOWN → absent, after the caller checked the authority: the intent may run again.
    pub(crate) fn forget(
        &mut self,
        hash: u64,
        key: &Key,
        listed: Option<Listed>,
        now: Timestamp,
    ) -> Result<(), ResolveError> {
        let slot = self.find_unknown(hash, key, listed, now)?;
        self.unlink(slot, RemovalCause::Removed);
        Ok(())
    }

    /// The key's live UNKNOWN entry; with `listed`, only if it is still the one a listing
    /// saw (the same token), so that a verdict about one execution never
    /// settles another: forgotten, claimed by another request and marked again while
    /// the verdict was being reached.
    fn find_unknown(
        &mut self,
        hash: u64,
        key: &Key,
        listed: Option<Listed>,
        now: Timestamp,
    ) -> Result<u32, ResolveError> {
        let slot = self.find_live(hash, key, now).ok_or(ResolveError::NotFound)?;
        let e = self.entry(slot);
        let same = listed.is_none_or(|l| l.token == e.token);
        if e.state == State::Unknown && same {
            Ok(slot)
        } else {
            Err(ResolveError::NothingToSettle)
        }
    }

    /// Absent or dead → COMPLETED or UNKNOWN, from a fact learned elsewhere (a durable
    /// store, a snapshot), keeping its original times. Refused, changing nothing, if the
    /// key has a live entry (a claim may be executing it right now: the fact must not
    /// fence it out) or the times make no sense. Like `complete`, the shard takes the
    /// body out of `known` only when it keeps the caller's `Bytes` as given.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn insert_known(
        &mut self,
        hash: u64,
        key: &Key,
        fingerprint: Fingerprint,
        known: &mut Outcome,
        correlation_id: Option<&CorrelationId>,
        now: Timestamp,
        cfg: &Config,
    ) -> Result<(), InsertError> {
        let (since, deadline) = match *known {
            Outcome::Completed { completed_at, expires_at, .. } => (completed_at, expires_at),
            Outcome::Unknown { marked_at, expires_at } => (marked_at, expires_at),
        };
        if deadline <= now {
            return Err(InsertError::Expired);
        }
        if since > now {
            return Err(InsertError::StartsInTheFuture);
        }
        if deadline.saturating_duration_since(now) > crate::MAX_DURATION {
            return Err(InsertError::TtlTooLong);
        }
        // As for results completed that late: kept until the last deadline, shorter
        // than asked, and only if that is still ahead.
        let deadline = deadline.min(LAST_DEADLINE);
        if deadline <= now {
            return Err(InsertError::Expired);
        }
        let existing = self.find(hash, key);
        if let Some(slot) = existing {
            if self.entry(slot).is_live(now) || self.lapse(slot, now) {
                return Err(InsertError::Occupied(self.snapshot(slot)));
            }
            self.expire(slot);
        }
        let correlation_id = self
            .make_room_for(key, correlation_id, now)
            .map_err(|_| InsertError::CapacityExhausted)?;
        // UNKNOWN until its body is settled below (`keep_result` may evict, and an
        // UNKNOWN entry is never evicted).
        let (slot, _) = self.insert_new(
            hash,
            key,
            fingerprint,
            correlation_id,
            State::Unknown,
            since,
            deadline,
        );
        match known {
            Outcome::Completed { body, .. } => {
                // Chunks hold results that expire together: pack only a fact that
                // expires with the results completed now.
                let ttl = if deadline == deadline_after(now, cfg.completed_ttl) {
                    cfg.completed_ttl
                } else {
                    deadline.saturating_duration_since(now)
                };
                let kept = self.keep_result(body, ttl, now, cfg);
                self.set_completed(slot, kept, since, deadline);
            }
            Outcome::Unknown { .. } => self.unknown.push_back(slot, &mut self.wheel),
        }
        self.counters.inserted += 1;
        self.sweep(now, SWEEP_WORK_PER_INSERT);
        Ok(())
    }

    /// The `limit` live UNKNOWN entries marked longest ago (ties in the order they
    /// became UNKNOWN here); dead ones not yet reclaimed are passed over. Walks every
    /// UNKNOWN entry of the shard (never the map). Under `MarkUnknown` the caller first
    /// sweeps, so lapsed leases are turned.
    pub(crate) fn list_unknown(&self, limit: usize, now: Timestamp) -> Vec<UnknownEntry> {
        // The list is in arrival order, which is not mark order (an inserted fact, a
        // lapse turned late, keep older marks): pick the oldest marks of all of them.
        let mut live: Vec<(u32, &Entry)> = self
            .unknown
            .iter(&self.wheel)
            .map(|slot| (slot, self.entry(slot)))
            .filter(|(_, e)| e.is_live(now))
            .collect();
        live.sort_by_key(|(_, e)| e.since);
        live.truncate(limit);
        live.into_iter()
            .map(|(slot, e)| UnknownEntry {
                key: e.key.clone(),
                fingerprint: e.fingerprint,
                token: FencingToken(e.token),
                marked_at: e.since,
                expires_at: e.deadline,
                correlation_id: self.correlations.get(slot).cloned(),
            })
            .collect()
    }

    /// A look at a live entry; changes nothing a caller can see (a dead entry may be
    /// reclaimed, which is invisible: it already read as absent).
    pub(crate) fn peek(&mut self, hash: u64, key: &Key, now: Timestamp) -> Option<EntrySnapshot> {
        let slot = self.find_live(hash, key, now)?;
        Some(self.snapshot(slot))
    }

    /// Any state → absent. Returns what was there; a PROCESSING owner is thereby fenced.
    pub(crate) fn remove(&mut self, hash: u64, key: &Key, now: Timestamp) -> Option<EntrySnapshot> {
        let slot = self.find_live(hash, key, now)?;
        let snapshot = self.snapshot(slot);
        self.unlink(slot, RemovalCause::Removed);
        Some(snapshot)
    }

    /// Reclaims expired entries, spending at most `work` wheel moves. Returns how many
    /// entries it reclaimed and whether it finished (nothing more is due).
    pub(crate) fn sweep(&mut self, now: Timestamp, work: usize) -> (usize, bool) {
        let to = now.as_nanos() / self.limits.tick_nanos;
        let mut work = work;
        let mut reclaimed = 0;
        while let Some(slot) = self.wheel.poll(to, &mut work) {
            // The wheel never fires early: tick(deadline) <= floor(now / tick) means
            // deadline <= now.
            debug_assert!(!self.entry(slot).is_live(now), "the wheel fired a live entry");
            // A lapsed lease turned UNKNOWN is filed again at its new deadline, a tick
            // past `to` (it is live): this loop does not meet it again.
            if !self.lapse(slot, now) {
                self.expire(slot);
                reclaimed += 1;
            }
        }
        (reclaimed, work > 0)
    }

    /// Reclaims a dead entry, found by lookup or fired by the wheel.
    fn expire(&mut self, slot: u32) {
        if self.entry(slot).state == State::Processing {
            self.counters.takeovers += 1;
        }
        self.unlink(slot, RemovalCause::Expired);
        self.counters.expirations += 1;
    }

    /// Makes room for `entries` more entries and `bytes` more bytes: first by reclaiming
    /// every dead entry, then by evicting the oldest completed ones, a tenth at a time.
    /// Refuses, having evicted nothing, if even evicting every completed entry would not
    /// make room: the rest is in flight or unknown, which is never evicted.
    ///
    /// Reclaiming everything dead first means eviction only ever takes live completed
    /// entries, oldest first, and a refusal means the shard really is full of live work;
    /// it costs at most one wheel pass over the shard's dead entries, each reclaimed
    /// once, and only when the shard is full.
    fn make_room(
        &mut self,
        now: Timestamp,
        entries: usize,
        bytes: usize,
    ) -> Result<(), ClaimError> {
        let fits = |s: &Shard| {
            s.entries + entries <= s.limits.max_entries && s.bytes + bytes <= s.limits.max_bytes
        };
        if fits(self) {
            return Ok(());
        }
        self.sweep(now, usize::MAX);
        if !fits(self) {
            self.reclaim_within_tick(now);
        }
        let after_evicting_all = self.entries - self.age.len() + entries <= self.limits.max_entries
            && self.bytes - self.completed_bytes + bytes <= self.limits.max_bytes;
        if !after_evicting_all {
            return Err(ClaimError::CapacityExhausted);
        }
        while !fits(self) {
            if self.age.len() == 0 {
                // Unreachable past the check above; a drifted count refuses, never spins.
                return Err(ClaimError::CapacityExhausted);
            }
            self.evict_step();
        }
        Ok(())
    }

    /// Makes room for a new entry of `key` with its correlation id; returns the id it
    /// keeps. If the byte bound has room for the entry but not its id, the entry is
    /// kept without it: an id only joins an entry to its logs, and is never why a claim
    /// is refused or a fact (an UNKNOWN mark above all) is left out. Refused, as
    /// `make_room`, only when the entry alone does not fit.
    fn make_room_for<'i>(
        &mut self,
        key: &Key,
        correlation_id: Option<&'i CorrelationId>,
        now: Timestamp,
    ) -> Result<Option<&'i CorrelationId>, ClaimError> {
        let entry = Entry::charge_for(key, 0);
        if let Some(id) = correlation_id {
            // A refusal here evicted nothing (see `make_room`): asking again for less is
            // as if it had been asked for less at first.
            if self.make_room(now, 1, entry + correlations::charge_for(id)).is_ok() {
                return Ok(Some(id));
            }
        }
        self.make_room(now, 1, entry).map(|()| None)
    }

    /// Reclaims the entries that died since the current wheel tick began. The wheel
    /// files an entry at the tick its deadline rounds up to and a sweep reaches the tick
    /// `now` rounds down to, so a sweep leaves those whose deadline fell inside the
    /// current tick: dead, but still counted against the bounds. This polls one tick
    /// further and files what is still live back at that tick, where the next sweep to
    /// reach it finds it. Only a full shard and `run_pending` pay for it: O(entries due
    /// within a tick). Returns how many it reclaimed.
    pub(crate) fn reclaim_within_tick(&mut self, now: Timestamp) -> usize {
        let next = now.as_nanos() / self.limits.tick_nanos + 1;
        let mut work = usize::MAX;
        let mut live = Vec::new();
        let mut reclaimed = 0;
        while let Some(slot) = self.wheel.poll(next, &mut work) {
            if self.entry(slot).is_live(now) || self.lapse(slot, now) {
                live.push(slot);
            } else {
                self.expire(slot);
                reclaimed += 1;
            }
        }
        for slot in live {
            self.schedule(slot);
        }
        reclaimed
    }

    /// Evicts the oldest tenth of the completed entries, in one step. Their results are
    /// freed after unlocking, a few per operation (see [`FREE_BATCH`]).
    fn evict_step(&mut self) {
        let started = Instant::now();
        for _ in 0..evict::batch(self.age.len()) {
            let Some(slot) = self.age.front() else { break };
            self.unlink(slot, RemovalCause::Evicted);
            self.counters.evictions += 1;
        }
        self.counters.max_eviction_pause = self.counters.max_eviction_pause.max(started.elapsed());
    }

    /// Files a new entry without a body under a fresh token; returns its slot and token.
    #[allow(clippy::too_many_arguments)]
    fn insert_new(
        &mut self,
        hash: u64,
        key: &Key,
        fingerprint: Fingerprint,
        correlation_id: Option<&CorrelationId>,
        state: State,
        since: Timestamp,
        deadline: Timestamp,
    ) -> (u32, u64) {
        let token = self.next_token();
        let entry = Entry {
            key: key.clone(),
            fingerprint,
            state,
            token,
            since,
            deadline,
            body: None,
            hash: hash as u32,
        };
        (self.insert(hash, entry, correlation_id), token)
    }

    fn insert(&mut self, hash: u64, entry: Entry, correlation_id: Option<&CorrelationId>) -> u32 {
        let slot = match self.free.pop() {
            Some(slot) => {
                let vacant = self.slots.replace(slot as usize, entry);
                debug_assert!(vacant.is_none(), "a free slot is vacant");
                slot
            }
            None => {
                // Ids up to wheel::MAX_ID (2^32 less a thousand) are free to use: that many
                // entries of at least ENTRY_OVERHEAD bytes each do not fit in memory.
                let slot = u32::try_from(self.slots.len())
                    .ok()
                    .filter(|&slot| slot <= self::wheel::MAX_ID)
                    .expect("more entries in one shard than the wheel has ids");
                self.slots.push(entry);
                slot
            }
        };
        self.correlations.set(slot, correlation_id);
        self.entries += 1;
        self.bytes += self.charge(slot);
        let slots = &self.slots;
        self.table.insert_unique(hash, slot, |&i| {
            let e = slots.get(i as usize).expect("the table only indexes occupied slots");
            widen(e.hash)
        });
        self.schedule(slot);
        slot
    }

    /// Takes an entry out of the table, the slab, the wheel and its state's list, and
    /// its result to the graveyard. Removing a PROCESSING entry (release, lapse,
    /// `remove`) flags waiters to be woken.
    fn unlink(&mut self, slot: u32, cause: RemovalCause) {
        let hash = widen(self.entry(slot).hash);
        match self.table.find_entry(hash, |&i| i == slot) {
            Ok(found) => {
                found.remove();
            }
            Err(_) => unreachable!("every occupied slot is in the table"),
        }
        let charge = self.charge(slot);
        let entry = self.slots.take(slot as usize).expect("checked occupied above");
        self.correlations.take(slot);
        self.wheel.cancel(slot);
        match entry.state {
            State::Completed => {
                self.age.remove(slot, &mut self.wheel);
                self.completed_bytes -= charge;
            }
            State::Unknown => {
                self.unknown.remove(slot, &mut self.wheel);
            }
            State::Processing => self.deferred.left_processing = true,
        }
        self.free.push(slot);
        self.entries -= 1;
        self.bytes -= charge;
        if let Some(r) = entry.body {
            self.deferred.graveyard.extend(self.results.release(r));
        }
        if self.record_removals {
            self.deferred.removed.push((entry.key, cause));
        }
    }

    /// Re-counts everything and panics on any disagreement with the running totals.
    pub(crate) fn validate(&self) {
        let mut entries = 0;
        let mut bytes = 0;
        let (mut completed, mut completed_bytes) = (0, 0);
        for (i, slot) in self.slots.iter().enumerate() {
            let id = i as u32;
            match slot {
                Some(e) => {
                    entries += 1;
                    bytes += self.charge(id);
                    assert_eq!(widen(e.hash), self.hash_of(&e.key), "slot {i} stored hash");
                    assert_eq!(
                        self.find(self.hash_of(&e.key), &e.key),
                        Some(id),
                        "key of slot {i} is indexed more than once"
                    );
                    assert!(
                        self.table.find(self.hash_of(&e.key), |&j| j == id).is_some(),
                        "slot {i} not in the table"
                    );
                    assert!(!self.free.contains(&id), "occupied slot {i} on the free list");
                    assert_eq!(
                        self.wheel.deadline(id),
                        Some(self.tick_of(e.deadline)),
                        "slot {i} misfiled on the wheel"
                    );
                    let listed = self.age.contains(id, &self.wheel);
                    assert_eq!(listed, e.state != State::Processing, "slot {i} list membership");
                    if e.state == State::Completed {
                        completed += 1;
                        completed_bytes += self.charge(id);
                    }
                }
                None => {
                    assert_eq!(self.wheel.deadline(id), None, "free slot {i} on the wheel");
                    assert!(!self.age.contains(id, &self.wheel), "free slot {i} in the age list");
                }
            }
        }
        assert_eq!(self.table.len(), entries, "table and slab disagree");
        assert_eq!(entries, self.entries, "entry count drifted");
        assert_eq!(bytes, self.bytes, "byte count drifted");
        assert_eq!(self.slots.len() - entries, self.free.len(), "free list drifted");
        assert_eq!(self.wheel.len(), entries, "wheel length drifted");
        self.wheel.validate();
        // Both lists share the link fields; each must hold exactly its state's entries.
        // (Their order is arrival order, which `Cache::insert` does not tie to `since`;
        // the reference model checks eviction order.)
        let in_age =
            self.age.iter(&self.wheel).filter(|&id| self.entry(id).state == State::Completed);
        assert_eq!((in_age.count(), self.age.len()), (completed, completed), "age list drifted");
        assert_eq!(completed_bytes, self.completed_bytes, "completed bytes drifted");
        let unknown = self.slots.iter().flatten().filter(|e| e.state == State::Unknown).count();
        let in_unknown =
            self.unknown.iter(&self.wheel).filter(|&id| self.entry(id).state == State::Unknown);
        assert_eq!(
            (in_unknown.count(), self.unknown.len()),
            (unknown, unknown),
            "unknown list drifted"
        );
        self.results.validate(self.slots.iter().flatten().filter_map(|e| e.body));
        self.correlations.validate(|slot| self.slots.get(slot as usize).is_some());
        assert!(self.entries <= self.limits.max_entries, "entry bound exceeded");
        assert!(self.bytes <= self.limits.max_bytes, "byte bound exceeded");
    }
}
