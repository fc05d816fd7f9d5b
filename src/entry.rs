//! [`Entry`]: what the map holds for one key.
//!
//! Invariant: an entry is live while `now < deadline`, whatever its state; a dead entry
//! is never shown to anyone (it reads as absent) and is reclaimed on the next touch.
//! `deadline` means the lease's end while PROCESSING, the result's expiry while
//! COMPLETED and the mark's expiry while UNKNOWN; `since` is when the state began.
//!
//! The fields are flat (no enum carrying the body) so a slot stays small and a replay hit
//! reads the fingerprint, state and deadline from the one cache line it already touched.

use bytes::Bytes;

use crate::{EntrySnapshot, EntryState, FencingToken, Fingerprint, Key, Replay, Timestamp};

/// The three states of the contract (DESIGN.md); "absent" is the lack of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Processing,
    Completed,
    Unknown,
}

/// Laid out for a replay hit: the key and fingerprint fill the first cache line, the
/// deadline, state, times and body the second, and the entry is exactly 128 bytes aligned
/// to 128, so both lines are one adjacent-line pair that the hardware prefetcher fetches
/// together: one miss per hit, not two.
#[derive(Debug)]
#[repr(C, align(128))]
pub(crate) struct Entry {
    pub(crate) key: Key,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) deadline: Timestamp,
    pub(crate) since: Timestamp,
    /// The token of the claim that created this entry; only its guard may change it.
    pub(crate) token: u64,
    /// The stored result; `Some` only while COMPLETED with its body kept.
    pub(crate) body: Option<Bytes>,
    /// The low half of the key's hash, from which the table's hash is rebuilt (see
    /// [`crate::shard::table_hash`]) when the table grows or the entry leaves: neither
    /// then rehashes the key. Fits in what was padding.
    pub(crate) hash: u32,
    pub(crate) state: State,
}

/// Bytes charged to every entry on top of its key's stored length and its result body:
/// the slab slot (which holds keys of up to 46 bytes inline, so short keys are charged
/// twice: the formula is an upper bound), the table's index and control byte, and the
/// wheel's node (which also holds the age list's links).
pub const ENTRY_OVERHEAD: usize = std::mem::size_of::<Option<Entry>>()
    + std::mem::size_of::<u32>()
    + 1
    + std::mem::size_of::<crate::wheel::Node<crate::evict::AgeLinks>>();

// The layout argument above depends on this, and the memory figures on both.
const _: () = assert!(std::mem::size_of::<Option<Entry>>() == 128);
const _: () = assert!(std::mem::size_of::<crate::wheel::Node<crate::evict::AgeLinks>>() == 24);

impl Entry {
    #[inline]
    pub(crate) fn is_live(&self, now: Timestamp) -> bool {
        now < self.deadline
    }

    /// What this entry costs against the byte bound.
    pub(crate) fn charge(&self) -> usize {
        Entry::charge_for(&self.key, self.body.as_ref())
    }

    /// What an entry with this key and body costs against the byte bound.
    pub(crate) fn charge_for(key: &Key, body: Option<&Bytes>) -> usize {
        key.as_bytes().len() + body.map_or(0, Bytes::len) + ENTRY_OVERHEAD
    }

    #[inline]
    pub(crate) fn replay(&self) -> Replay {
        Replay { body: self.body.clone(), completed_at: self.since, expires_at: self.deadline }
    }

    pub(crate) fn snapshot(&self) -> EntrySnapshot {
        let state = match self.state {
            State::Processing => EntryState::Processing {
                started_at: self.since,
                lease_ends_at: self.deadline,
                token: FencingToken(self.token),
            },
            State::Completed => EntryState::Completed(self.replay()),
            State::Unknown => {
                EntryState::Unknown { marked_at: self.since, expires_at: self.deadline }
            }
        };
        EntrySnapshot { fingerprint: self.fingerprint, state }
    }
}
