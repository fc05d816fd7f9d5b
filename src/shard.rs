//! [`Shard`]: the claim state machine over one slice of the key space.
//!
//! Ground rules: a shard is plain single-threaded data (`&mut self` everywhere); the
//! cache wraps each in a lock, so every transition of one key is one call here, one
//! critical section, and no interleaving can split a check from its update.
//!
//! Layout: entries live in a slab (`slots`, reused through `free`); the hash table maps
//! a key's hash to its slab index. Slab indices are stable while an entry lives, so a
//! [`ClaimGuard`](crate::ClaimGuard) addresses its entry by `(slot, token)` without
//! hashing or cloning the key, and a stale guard is recognised by its token: tokens are
//! never reused within a shard, so a reused slot never matches an old guard.
//!
//! Invariants (re-counted by [`Shard::validate`]): `entries` and `bytes` equal the count
//! and summed [`Entry::charge`] of occupied slots; every occupied slot is in the table
//! exactly once under its own hash; free slots are empty and listed once in `free`.

use bytes::Bytes;
use hashbrown::HashTable;

use crate::config::Config;
use crate::entry::{Entry, State};
use crate::stats::Counters;
use crate::{Claim, EntrySnapshot, Fingerprint, Key, LeaseLost, ResolveError, Timestamp};

#[derive(Debug)]
pub(crate) struct Shard {
    table: HashTable<u32>,
    slots: Vec<Option<Entry>>,
    free: Vec<u32>,
    /// Tokens issued here are `issued * token_stride + token_offset`: unique across the
    /// cache (each shard has its own offset) and increasing per key.
    issued: u64,
    token_stride: u64,
    token_offset: u64,
    entries: usize,
    bytes: usize,
    pub(crate) counters: Counters,
    /// Threads sleeping in `claim_wait` on this shard; notifying is skipped when zero.
    pub(crate) waiters: usize,
}

impl Shard {
    pub(crate) fn new(index: usize, shard_count: usize) -> Shard {
        Shard {
            table: HashTable::new(),
            slots: Vec::new(),
            free: Vec::new(),
            issued: 0,
            token_stride: shard_count as u64,
            token_offset: index as u64,
            entries: 0,
            bytes: 0,
            counters: Counters::default(),
            waiters: 0,
        }
    }

    pub(crate) fn entries(&self) -> usize {
        self.entries
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    #[inline]
    fn find(&self, hash: u64, key: &Key) -> Option<u32> {
        let slots = &self.slots;
        self.table
            .find(hash, |&i| {
                slots[i as usize].as_ref().is_some_and(|e| e.key == *key)
            })
            .copied()
    }

    fn entry(&self, slot: u32) -> &Entry {
        self.slots[slot as usize]
            .as_ref()
            .expect("the table only indexes occupied slots")
    }

    fn entry_mut(&mut self, slot: u32) -> &mut Entry {
        self.slots[slot as usize]
            .as_mut()
            .expect("the table only indexes occupied slots")
    }

    /// Finds a live entry; a dead one found on the way is reclaimed.
    fn find_live(&mut self, hash: u64, key: &Key, now: Timestamp) -> Option<u32> {
        let slot = self.find(hash, key)?;
        if self.entry(slot).is_live(now) {
            Some(slot)
        } else {
            self.unlink(slot);
            None
        }
    }

    fn next_token(&mut self) -> u64 {
        self.issued += 1;
        self.issued * self.token_stride + self.token_offset
    }

    /// The claim transition: absent (or dead) → PROCESSING, or the answer for a live entry.
    ///
    /// This is where a claim becomes PROCESSING (in [`Shard::acquire`]). `acquired`
    /// builds the guard from the new entry's `(slot, token, lease end)`; taking it as a
    /// closure lets the answer be built once, in its public form, with no intermediate
    /// enum to convert on the replay path.
    #[inline]
    pub(crate) fn claim(
        &mut self,
        hash: u64,
        key: &Key,
        fingerprint: Fingerprint,
        now: Timestamp,
        cfg: &Config,
        acquired: impl FnOnce(u32, u64, Timestamp) -> Claim,
    ) -> Claim {
        let existing = self.find(hash, key);
        if let Some(slot) = existing {
            if self.entry(slot).is_live(now) {
                return self.answer(slot, fingerprint);
            }
        }
        let (slot, token, lease_ends_at) = self.acquire(existing, hash, key, fingerprint, now, cfg);
        acquired(slot, token, lease_ends_at)
    }

    /// Absent or dead → PROCESSING under a new fencing token. Kept out of line so the
    /// replay path (`claim` → `answer`) stays small.
    #[inline(never)]
    fn acquire(
        &mut self,
        existing: Option<u32>,
        hash: u64,
        key: &Key,
        fingerprint: Fingerprint,
        now: Timestamp,
        cfg: &Config,
    ) -> (u32, u64, Timestamp) {
        if existing.is_some_and(|slot| self.entry(slot).state == State::Processing) {
            self.counters.takeovers += 1;
        }
        let token = self.next_token();
        let lease_ends_at = now.saturating_add(cfg.lease);
        let fresh = Entry {
            key: key.clone(),
            hash,
            fingerprint,
            state: State::Processing,
            token,
            since: now,
            deadline: lease_ends_at,
            body: None,
        };
        let slot = match existing {
            // A dead entry's slot is reused in place: same key, same table position.
            Some(slot) => {
                self.bytes -= self.entry(slot).charge();
                self.bytes += fresh.charge();
                *self.entry_mut(slot) = fresh;
                slot
            }
            None => self.insert(fresh),
        };
        self.counters.acquired += 1;
        (slot, token, lease_ends_at)
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
                let replay = e.replay();
                self.counters.replayed += 1;
                Claim::Completed(replay)
            }
            State::Processing => {
                let (started_at, lease_ends_at) = (e.since, e.deadline);
                self.counters.in_progress += 1;
                Claim::InProgress {
                    started_at,
                    lease_ends_at,
                }
            }
            State::Unknown => {
                let (marked_at, expires_at) = (e.since, e.deadline);
                self.counters.unknown += 1;
                Claim::Unknown {
                    marked_at,
                    expires_at,
                }
            }
        }
    }

    /// The entry a guard owns: PROCESSING, its token, lease not lapsed.
    fn owned(&mut self, slot: u32, token: u64, now: Timestamp) -> Result<u32, LeaseLost> {
        let owned = self
            .slots
            .get(slot as usize)
            .and_then(Option::as_ref)
            .is_some_and(|e| e.state == State::Processing && e.token == token && e.is_live(now));
        if owned {
            Ok(slot)
        } else {
            self.counters.leases_lost += 1;
            Err(LeaseLost)
        }
    }

    /// PROCESSING → COMPLETED. A body over `max_result_size` is dropped, the completion
    /// kept: the work happened and a retry must not redo it.
    pub(crate) fn complete(
        &mut self,
        slot: u32,
        token: u64,
        body: Bytes,
        now: Timestamp,
        cfg: &Config,
    ) -> Result<(), LeaseLost> {
        let slot = self.owned(slot, token, now)?;
        self.store_result(slot, body, now, cfg);
        Ok(())
    }

    fn store_result(&mut self, slot: u32, body: Bytes, now: Timestamp, cfg: &Config) {
        let body = if body.len() <= cfg.max_result_size {
            Some(body)
        } else {
            self.counters.oversized += 1;
            None
        };
        self.counters.completions += 1;
        let e = self.slots[slot as usize]
            .as_mut()
            .expect("caller checked the slot");
        let before = e.charge();
        e.state = State::Completed;
        e.since = now;
        e.deadline = now.saturating_add(cfg.completed_ttl);
        e.body = body;
        let after = e.charge();
        self.bytes = self.bytes - before + after;
    }

    /// PROCESSING → absent: the owner gives the key back without an outcome.
    pub(crate) fn release(
        &mut self,
        slot: u32,
        token: u64,
        now: Timestamp,
    ) -> Result<(), LeaseLost> {
        let slot = self.owned(slot, token, now)?;
        self.unlink(slot);
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
        let e = self.entry_mut(slot);
        e.state = State::Unknown;
        e.since = now;
        e.deadline = now.saturating_add(cfg.unknown_ttl);
        Ok(())
    }

    /// Renews the lease to end `lease` after `now`.
    pub(crate) fn extend_lease(
        &mut self,
        slot: u32,
        token: u64,
        now: Timestamp,
        lease: std::time::Duration,
    ) -> Result<Timestamp, LeaseLost> {
        let slot = self.owned(slot, token, now)?;
        let e = self.entry_mut(slot);
        e.deadline = now.saturating_add(lease);
        Ok(e.deadline)
    }

    /// UNKNOWN → COMPLETED, after the caller checked the authority.
    pub(crate) fn resolve(
        &mut self,
        hash: u64,
        key: &Key,
        body: Bytes,
        now: Timestamp,
        cfg: &Config,
    ) -> Result<(), ResolveError> {
        let slot = self.find_unknown(hash, key, now)?;
        self.store_result(slot, body, now, cfg);
        Ok(())
    }

    /// UNKNOWN → absent, after the caller checked the authority: the intent may run again.
    pub(crate) fn forget(
        &mut self,
        hash: u64,
        key: &Key,
        now: Timestamp,
    ) -> Result<(), ResolveError> {
        let slot = self.find_unknown(hash, key, now)?;
        self.unlink(slot);
        Ok(())
    }

    fn find_unknown(&mut self, hash: u64, key: &Key, now: Timestamp) -> Result<u32, ResolveError> {
        let slot = self
            .find_live(hash, key, now)
            .ok_or(ResolveError::NotFound)?;
        if self.entry(slot).state == State::Unknown {
            Ok(slot)
        } else {
            Err(ResolveError::NotUnknown)
        }
    }

    /// A look at a live entry; changes nothing a caller can see (a dead entry may be
    /// reclaimed, which is invisible: it already read as absent).
    pub(crate) fn peek(&mut self, hash: u64, key: &Key, now: Timestamp) -> Option<EntrySnapshot> {
        let slot = self.find_live(hash, key, now)?;
        Some(self.entry(slot).snapshot())
    }

    /// Any state → absent. Returns what was there; a PROCESSING owner is thereby fenced.
    pub(crate) fn remove(&mut self, hash: u64, key: &Key, now: Timestamp) -> Option<EntrySnapshot> {
        let slot = self.find_live(hash, key, now)?;
        Some(self.unlink(slot).snapshot())
    }

    fn insert(&mut self, entry: Entry) -> u32 {
        let hash = entry.hash;
        self.entries += 1;
        self.bytes += entry.charge();
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(entry);
                slot
            }
            None => {
                // 2^32 entries of at least ENTRY_OVERHEAD bytes each do not fit in memory.
                let slot =
                    u32::try_from(self.slots.len()).expect("more than 2^32 entries in one shard");
                self.slots.push(Some(entry));
                slot
            }
        };
        let slots = &self.slots;
        self.table.insert_unique(hash, slot, |&i| {
            slots[i as usize]
                .as_ref()
                .expect("the table only indexes occupied slots")
                .hash
        });
        slot
    }

    /// Takes an entry out of the table and the slab.
    fn unlink(&mut self, slot: u32) -> Entry {
        let hash = self.entry(slot).hash;
        match self.table.find_entry(hash, |&i| i == slot) {
            Ok(found) => {
                found.remove();
            }
            Err(_) => unreachable!("every occupied slot is in the table"),
        }
        let entry = self.slots[slot as usize]
            .take()
            .expect("checked occupied above");
        self.free.push(slot);
        self.entries -= 1;
        self.bytes -= entry.charge();
        entry
    }

    /// Re-counts everything and panics on any disagreement with the running totals.
    pub(crate) fn validate(&self) {
        let mut entries = 0;
        let mut bytes = 0;
        for (i, slot) in self.slots.iter().enumerate() {
            if let Some(e) = slot {
                entries += 1;
                bytes += e.charge();
                let found = self.table.find(e.hash, |&j| j as usize == i);
                assert!(found.is_some(), "slot {i} missing from the table");
                assert!(
                    !self.free.contains(&(i as u32)),
                    "occupied slot {i} on the free list"
                );
            }
        }
        assert_eq!(self.table.len(), entries, "table and slab disagree");
        assert_eq!(entries, self.entries, "entry count drifted");
        assert_eq!(bytes, self.bytes, "byte count drifted");
        assert_eq!(
            self.slots.len() - entries,
            self.free.len(),
            "free list drifted"
        );
    }
}
