//! Counters: what the cache has answered, and what it holds.
//!
//! Each shard keeps its own [`Counters`] under its own lock, so counting costs no shared
//! cache line; [`Stats`] is their sum, read shard by shard (not one atomic snapshot of
//! the whole cache, which would need every lock at once).

/// Running totals of one shard, summed into [`Stats`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counters {
    pub(crate) acquired: u64,
    pub(crate) replayed: u64,
    pub(crate) in_progress: u64,
    pub(crate) mismatches: u64,
    pub(crate) unknown: u64,
    pub(crate) takeovers: u64,
    pub(crate) lapsed_unknown: u64,
    pub(crate) releases: u64,
    pub(crate) completions: u64,
    pub(crate) oversized: u64,
    pub(crate) leases_lost: u64,
    pub(crate) expirations: u64,
    pub(crate) evictions: u64,
    pub(crate) capacity_refusals: u64,
    pub(crate) inserted: u64,
    pub(crate) max_eviction_pause: std::time::Duration,
}

/// A summary of a cache's activity since it was built, from [`Cache::stats`](crate::Cache::stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Claims that acquired a key (including takeovers).
    pub acquired: u64,
    /// Claims answered with a stored result.
    pub replayed: u64,
    /// Claims answered "in progress" (a [`Cache::claim_wait`](crate::Cache::claim_wait)
    /// counts only the answer it returns: one, if it timed out).
    pub in_progress: u64,
    /// Claims refused because the key was used with a different request.
    pub mismatches: u64,
    /// Claims answered "outcome unknown".
    pub unknown: u64,
    /// Leases that lapsed before their owner recorded an outcome, freeing the key for a
    /// new owner ([`LapsePolicy::TakeOver`](crate::LapsePolicy::TakeOver)). Counted when
    /// the lapsed entry is reclaimed: by the key's next claim or lookup, or by a sweep.
    pub takeovers: u64,
    /// Leases that lapsed before their owner recorded an outcome and turned UNKNOWN
    /// ([`LapsePolicy::MarkUnknown`](crate::LapsePolicy::MarkUnknown)). Counted when the
    /// entry is turned: by the key's next claim or lookup, a sweep or a listing.
    pub lapsed_unknown: u64,
    /// Keys released without an outcome (explicitly or by a dropped guard).
    pub releases: u64,
    /// Outcomes recorded as completed (by a guard or by `resolve`).
    pub completions: u64,
    /// Completions (and inserted facts) whose body was not kept: larger than
    /// `max_result_size`, or no room under `max_bytes` even after evicting.
    pub oversized: u64,
    /// Guard operations refused because the guard's lease was lost.
    pub leases_lost: u64,
    /// Entries reclaimed after their deadline (lease end or TTL), by a sweep or a lookup.
    pub expirations: u64,
    /// Completed entries evicted to make room.
    pub evictions: u64,
    /// Claims refused with [`ClaimError::CapacityExhausted`](crate::ClaimError::CapacityExhausted).
    pub capacity_refusals: u64,
    /// Facts put in with [`Cache::insert`](crate::Cache::insert).
    pub inserted: u64,
    /// Calls of the removal listener that panicked. The panic is caught: the cache did
    /// what it did regardless, and the listener still hears every other removal.
    pub listener_panics: u64,
    /// Threads waiting in [`Cache::claim_wait`](crate::Cache::claim_wait), and futures of
    /// [`Cache::claim_wait_async`](crate::Cache::claim_wait_async) filed to be woken,
    /// right now.
    pub waiting: u64,
    /// The longest single eviction step (removing a tenth of a shard's completed entries).
    pub max_eviction_pause: std::time::Duration,
    /// Entries currently held, including expired ones not yet reclaimed.
    pub entries: u64,
    /// Bytes currently charged: key, result body and
    /// [`ENTRY_OVERHEAD`](crate::ENTRY_OVERHEAD) per entry, and the correlation id's
    /// length and [`CORRELATION_ID_OVERHEAD`](crate::CORRELATION_ID_OVERHEAD) for an
    /// entry that keeps one.
    pub bytes: u64,
}

impl Stats {
    pub(crate) fn add(&mut self, c: &Counters, entries: usize, bytes: usize, waiting: usize) {
        self.acquired += c.acquired;
        self.replayed += c.replayed;
        self.in_progress += c.in_progress;
        self.mismatches += c.mismatches;
        self.unknown += c.unknown;
        self.takeovers += c.takeovers;
        self.lapsed_unknown += c.lapsed_unknown;
        self.releases += c.releases;
        self.completions += c.completions;
        self.oversized += c.oversized;
        self.leases_lost += c.leases_lost;
        self.expirations += c.expirations;
        self.evictions += c.evictions;
        self.capacity_refusals += c.capacity_refusals;
        self.inserted += c.inserted;
        self.waiting += waiting as u64;
        self.max_eviction_pause = self.max_eviction_pause.max(c.max_eviction_pause);
        self.entries += entries as u64;
        self.bytes += bytes as u64;
    }
}
