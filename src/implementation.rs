//! Design notes: how the cache is built, and why. No code lives here.
//!
//! # Layers
//!
//! | file | one job | keeps |
//! |---|---|---|
//! | `key.rs` | [`Key`](crate::Key) and its limits | a key exists only in its validated, length-prefixed form |
//! | `fingerprint.rs` | [`Fingerprint`](crate::Fingerprint) | the digest of given input never changes (pinned vectors) |
//! | `clock.rs` | [`Clock`](crate::Clock) and its two implementations | time never goes backwards |
//! | `shard/mod.rs` | **the state machine**, single-threaded (`&mut self`), and `Deferred`, the work it leaves for after unlocking | every transition; counters match contents; bounds hold |
//! | `shard/entry.rs` | one key's entry | live while `now < deadline`, whatever the state |
//! | `shard/wheel.rs` | hierarchical timing wheel over slab ids (Varghese and Lauck; tokio's driver) | each id fires once, at the first poll at or after its tick |
//! | `shard/evict.rs` | the capacity policy and the age list | only COMPLETED entries are evictable, oldest first |
//! | `shard/slab.rs` | the entries by slot index, in segments of 16,384 | an index never changes; past the first segment growing copies nothing |
//! | `shard/arena.rs` | each shard's results: small ones packed into chunks, the rest as given; the 8-byte reference an entry holds | a buffer lives exactly while an entry names it; a shared chunk is never written |
//! | `cache.rs` | locks, hashing, `claim_wait` | one shard lock per operation, never two |
//! | `wait.rs` | [`WaitForClaim`](crate::WaitForClaim), the async wait, and each shard's wakers | a waiting future's waker is filed under the lock it looked under |
//! | `guard.rs` | [`ClaimGuard`](crate::ClaimGuard) | a guard acts only under its own fencing token |
//! | `claim.rs`, `error.rs`, `stats.rs`, `config.rs` | public values, errors, counters, settings | a built config is valid |
//! | `sync.rs` | the loom shim | every lock and atomic is imported from here |
//! | `into_bytes.rs` | [`IntoBytes`](crate::IntoBytes), what `complete` accepts | owned buffers are never copied |
//! | `layer/` (feature `tower`) | the HTTP layer: `layer.rs` (the Layer), `service.rs` (the state machine per request), `backend.rs` (the cache or a tiered store behind one interface), `stored_response.rs`, `header.rs`, `problem.rs`, `renewal.rs`, `timing.rs`, `body.rs` | a guarded request reaches the handler only holding its claim; it uses only the public API |
//! | `store/` (feature `store`) | the `Store` trait, `dynamic.rs` (its object-safe form), `tiered.rs`, `encoding.rs` (what stores share), `unique.rs`, `conformance.rs` (feature `test-utils`) | the dedup fact lives in the store; the hot tier only answers for what the store committed |
//!
//! **Where does a claim become PROCESSING?** `Shard::acquire` in `src/shard/mod.rs`, called
//! from `Shard::claim` when the key is absent or its entry is dead. Every other
//! transition is a method of `Shard` named after it (`complete`, `release`,
//! `mark_unknown`, `extend_lease`, `resolve`, `forget`, `remove`, and `insert_known` for
//! a fact learned elsewhere).
//!
//! The layout has one choice that matters: the claim logic lives in `shard/`, a plain
//! data structure tested without threads, with its private structures (entry, arena,
//! wheel, eviction) beside it, and `cache.rs` is only the thin locking layer over it
//! (as quick_cache splits `shard.rs` from `sync.rs`). A concurrency bug can then only be a locking bug, and the locking
//! layer is small enough to model in loom whole.
//!
//! # The map
//!
//! A [`Cache`](crate::Cache) is a power-of-two array of shards, each an `RwLock<Shard>`
//! padded to its own cache line, with a condvar beside it for `claim_wait`. Every
//! transition takes the write lock; a replay hit, the one answer that changes nothing,
//! takes the read lock and counts itself in an atomic on the lock's cache line, so
//! replays of one shard do not queue behind each other (this took the two-thread 90/10
//! mix from 3.3 to 8.5 M ops/s here, `cargo bench --bench peers -- mix`). A claim that
//! finds anything else under the read lock drops it and claims under the write lock,
//! looking again: the read-locked look decides nothing it does not answer. A key's
//! 64-bit ahash picks the shard from bits 40 and up; the shard's hashbrown table files
//! it under bits 0–31, which the entry keeps (in what would be padding), so the table
//! grows and entries leave without hashing a key again (`shard::table_hash`).
//!
//! Inside a shard, entries live in a slab (segments of `Option<Entry>`, which a growing
//! cache appends to instead of copying, plus a free list) and a
//! `hashbrown::HashTable<u32>` maps hashes to slab indices. Slab indices are stable for
//! an entry's life, which gives:
//!
//! - guards that find their entry by `(slot, token)`: no key clone in the guard, no
//!   rehash or key comparison on `complete`;
//! - the timing wheel and the age list link entries by slab index, in one arena of
//!   24-byte nodes indexed by the same ids (a slot's wheel links and its age-list links
//!   share its node, so the bookkeeping outside the slab is one cache miss per entry,
//!   not two; merging them took churn's eviction steps from ~180 to ~90 µs here): no
//!   pointers, no generations, O(1) unlink.
//!
//! Why not dashmap, though the project card lists it: loom sees only its own types, and
//! dashmap's locks are its own atomics, so a loom run over dashmap would check nothing
//! inside the map; nor can its shards hold a wheel and an age queue beside the entries.
//! dashmap is the floor in the benchmarks instead.
//!
//! # Fencing
//!
//! Each shard issues tokens `base + n * shard_count + shard_index` for `n = 1, 2, ...`,
//! so tokens are unique in the cache and increase per key. `base` is the wall clock in
//! nanoseconds since the Unix epoch when the cache was built: a restarted process starts
//! above every token the last one issued (unless a shard issued more than one token per
//! `shard_count` nanoseconds, or the wall clock stepped back), so an authority keeping
//! "the highest fence seen" does not refuse a valid owner after a restart. Tokens of two
//! live caches are not comparable; fencing across processes needs a shared counter. An entry remembers the token of
//! the claim that created it; a guard's operation succeeds only if the entry at its slot
//! is still PROCESSING under its token with the lease unexpired, checked inside the
//! shard's critical section. A slot reused by another key carries another token, so a
//! stale guard can never touch it.
//!
//! # Expiry
//!
//! Every check reads the clock once per operation (under the shard lock) and compares it
//! with the entry's one `deadline`, so an expired entry is never returned, swept or not.
//! Memory comes back three ways, all through the shard's timing wheel (`shard/wheel.rs`):
//!
//! - every insert spends a bounded amount of wheel work (16 node moves) reclaiming
//!   expired entries: more than it adds, so the wheel keeps up, and no call does
//!   unbounded work;
//! - [`Cache::run_pending`](crate::Cache::run_pending) sweeps everything due, shard by
//!   shard in bounded locked steps;
//! - [`Cache::spawn_sweeper`](crate::Cache::spawn_sweeper) calls it from a thread.
//!
//! The wheel has 11 levels of 64 slots: 66 bits, so every `u64` tick has a level and the
//! top levels are the overflow, re-cascading far deadlines as they approach rather than
//! wrapping. Deadlines become ticks rounding up and "now" rounding down, so nothing is
//! reclaimed early. The price is that an entry whose deadline fell inside the current
//! tick is dead but not yet due: where that matters — a full shard about to evict or
//! refuse, and `run_pending`'s "every expired entry" — `Shard::reclaim_within_tick`
//! polls one tick further and files what is still live back at that tick.
//!
//! Deadlines are capped one [`MAX_TICK`](crate::MAX_TICK) short of the end of `u64`
//! time (`shard::LAST_DEADLINE`), so the tick every deadline rounds up to is one a clock
//! can reach: every entry is reclaimable. A claim whose lease could not run its length
//! under that cap (a clock ~584 years past its origin) is refused with
//! [`ClaimError::ClockOutOfRange`](crate::ClaimError::ClockOutOfRange) before anything
//! changes. An entry is rescheduled (moved, not copied) whenever its deadline
//! changes: lease extension, completion, marking unknown.
//!
//! Lapses under [`LapsePolicy::MarkUnknown`](crate::LapsePolicy::MarkUnknown) are turned
//! lazily, and the same way on every path: whatever finds a PROCESSING entry past its
//! deadline (a claim, a lookup, the wheel firing it, a full shard's sweep, a listing)
//! calls `Shard::lapse` first, which makes it UNKNOWN in place (marked at the lease's
//! end, reset on the wheel at that plus `unknown_ttl`, linked into the unknown list)
//! before anything could reclaim it; only an entry still dead after that is reclaimed.
//! No answer can tell a lapse turned now from one turned at its end, so no timer is
//! needed; [`Cache::list_unknown`](crate::Cache::list_unknown) sweeps each shard first (what is due,
//! in bounded steps) so that lapses nobody touched are listed. Loom models 10 and 11
//! race it against claims, stale completions, sweeps and listings.
//!
//! # Capacity
//!
//! `max_entries` and `max_bytes` are split evenly across shards (as in quick_cache), so
//! making room is a shard-local step under the one lock. Charged bytes are the key's
//! stored length, the result's length and [`ENTRY_OVERHEAD`](crate::ENTRY_OVERHEAD),
//! and for an entry that keeps a correlation id, its length and
//! [`CORRELATION_ID_OVERHEAD`](crate::CORRELATION_ID_OVERHEAD).
//! When an insert would exceed either bound the shard:
//!
//! 1. reclaims every expired entry, including those that died inside the current tick
//!    (each is reclaimed once, so this is paid for by the inserts that made them, and it
//!    only happens when the shard is full);
//! 2. checks that evicting every COMPLETED entry would make room (the shard keeps their
//!    summed charge); if not, the rest is live PROCESSING and UNKNOWN work: it refuses
//!    the claim with [`ClaimError::CapacityExhausted`](crate::ClaimError::CapacityExhausted)
//!    (or keeps a completion without its body) having evicted **nothing** — an eviction
//!    that cannot help would only lose results;
//! 3. evicts the oldest tenth of its live COMPLETED entries (at least one) in one step,
//!    by arrival order (completion, or insertion for [`Cache::insert`](crate::Cache::insert)ed
//!    facts), repeating only if a large insert still does not fit.
//!
//! Sweeping first makes the policy exact: eviction never takes a dead entry in place of
//! a live one's room, and a refusal means the shard really holds `max_entries` live
//! entries none of which may go. The reference model in `tests/common/model.rs` checks
//! exactly this.
//!
//! An eviction step unlinks its entries at once but leaves their results in the shard's
//! graveyard, freed four at a time after each locked operation, outside the lock (or
//! all by `run_pending`): freeing thousands of buffers in one go made glibc coalesce
//! chunks, a quarter of churn's time.
//!
//! The shard count is lowered (like the per-shard floors of 512 entries and 64 KiB) until
//! each shard's byte share holds four results of `max_result_size`, so keeping one large
//! result never evicts more than a quarter of a shard; `max_result_size` above
//! `max_bytes` is refused at `build()`.
//!
//! # What runs under a shard lock
//!
//! The shard's own code and the cache's [`Clock`](crate::Clock). Nothing else: dropping
//! a caller's `Bytes` can run the caller's code (`Bytes::from_owner`), which may call back
//! into the cache, so a body the shard copies or does not keep stays in the caller's
//! `Option` and is dropped after unlocking, the bodies of departed entries go to the
//! graveyard (above), and the removal listener is called after unlocking, each call
//! under `catch_unwind`: a listener's panic is counted in
//! [`Stats::listener_panics`](crate::Stats::listener_panics) and changes nothing the
//! cache did (before, it could drop a guard the caller had just acquired, whose release
//! called the listener again and aborted the process).
//!
//! # Facts from elsewhere, and the unknown list
//!
//! [`Cache::insert`](crate::Cache::insert) puts a COMPLETED or UNKNOWN entry with its
//! original times into an absent (or dead) key under the shard lock, so it is atomic
//! against claims (loom model 8): a live entry of any state refuses it. UNKNOWN entries
//! are kept in a second list threaded through the same link fields as the age list (an
//! entry is never both), so [`Cache::list_unknown`](crate::Cache::list_unknown)
//! walks only them, at most `limit` per shard.
//!
//! A completion never fails for lack of room (the work happened): its body is dropped
//! instead and the entry kept as completed-without-body. The longest eviction step is in
//! [`Stats::max_eviction_pause`](crate::Stats::max_eviction_pause).
//!
//! # Results
//!
//! A result of up to 512 bytes kept for the default `completed_ttl` is copied into the
//! shard's open 16 KiB chunk (`shard/arena.rs`); larger results, and results given their own
//! TTL, are kept as the caller's `Bytes`. Either way the entry holds an 8-byte
//! `ResultRef` (buffer id, start, length) into the shard's table of buffers, not a
//! 32-byte `Bytes`: the 24 bytes went to the key, so keys of up to 69 bytes (a scope, a
//! tenant and a UUID) are compared inside the 128-byte entry, with no allocation to
//! build them and no pointer to follow on a lookup (the replay of a 60-byte key,
//! `bench_report --natural-only`: 402 ns on the heap, 317 inline, 271 with the probe
//! below). A replay of a result in the open
//! chunk takes the write lock once, to seal the chunk (a chunk is only written before
//! anything of it is shared; sealing trims it to what it holds). A result in its own buffer costs the allocator's header and, from its first
//! replay, a separate reference count that every replay then misses on; packed results
//! share one reference count per chunk, which stays in the processor's cache. Replays
//! over 100k keys went from ~0.85x to ~0.55x the bare dashmap's time, 16 bytes per
//! entry went (48 once replayed), and churn's eviction steps free chunks instead of
//! thousands of small buffers; copying 128 bytes costs less than what it saves. The
//! price is that a chunk lives as long as its longest-lived entry: chunks fill in
//! completion order with results of one TTL, so they expire and are evicted whole, and
//! what can keep one longer is an entry removed early (until its neighbours expire) or
//! a replayed `Bytes` a caller keeps.
//!
//! A replay hit probes the table asking for the hit outright (COMPLETED, this
//! fingerprint, this key, in that order): the state and fingerprint sit in the entry's
//! second cache line and the key in its first, and asking for both at once lets the
//! processor fetch both lines together. Looking the key up first and the state after
//! made them two misses one after the other (perf showed both; 317 → 271 ns per replay
//! over 100k keys). Anything else reads as absent there and is answered by the write
//! path's ordinary lookup.
//!
//! # Waiting
//!
//! `claim_wait` blocks its thread. It re-runs the claim in a loop under the shard's write
//! lock and sleeps on the shard's condvar between tries, at most until its timeout or the current lease's
//! end. A condvar needs a mutex, and the shard lock is a reader-writer lock, so the
//! condvar sleeps on a small `sleep` mutex beside it: a waiter registers itself and
//! takes `sleep` while still holding the shard lock, then lets the shard go and sleeps;
//! every transition out of PROCESSING, still under the shard lock, takes `sleep` and
//! notifies, and only when a waiter is registered. So a notifier that sees the waiter
//! registered cannot notify until the waiter sleeps (the wake-up is never lost; the loom
//! model of it deadlocks if either side skips `sleep`), and nobody pays for a
//! notification nobody waits for.
//!
//! Only the answer a call returns is counted in [`Stats`](crate::Stats): its looks at
//! the key still in progress before it slept are not answers.
//!
//! `claim_wait_async` is the same loop as a future, with no thread blocked: each poll
//! claims under the shard's write lock and, if the key is still PROCESSING, files the
//! task's waker in the shard's list under that same lock; the epilogue of every
//! transition out of PROCESSING takes the list under the lock and wakes it after
//! unlocking (loom model 9). Wakers are cloned before locking and woken or dropped after
//! it: they are an executor's code. The core has no timer, and no transition announces a
//! lapse, so the caller passes its runtime's sleep and the future looks again when the
//! lease it saw should have ended; a timeout is the caller's runtime's too. Dropping the
//! future withdraws its waker; it never holds a claim (an `Acquired` is handed out by the
//! poll that made it).
