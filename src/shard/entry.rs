//! [`Entry`]: what the map holds for one key.
//!
//! Invariant: an entry is live while `now < deadline`, whatever its state; a dead entry
//! is never shown to anyone (it reads as absent) and is reclaimed on the next touch.
//! The one exception is a PROCESSING entry past its lease under
//! [`LapsePolicy::MarkUnknown`](crate::LapsePolicy::MarkUnknown): the shard turns it
//! UNKNOWN (see `Shard::lapse`) before anything reads it.
//! `deadline` means the lease's end while PROCESSING, the result's expiry while
//! COMPLETED and the mark's expiry while UNKNOWN; `since` is when the state began.
//!
//! The fields are flat (no enum carrying the body) so a slot stays small and a replay hit
//! reads the key, fingerprint, state and deadline from the two cache lines it loads
//! together. The result itself is in the shard's [`ResultArena`](crate::shard::arena), named
//! by an 8-byte [`ResultRef`]: a 32-byte `Bytes` here would leave room for 24 bytes less
//! of key inline.

use bytes::Bytes;

use crate::shard::arena::ResultRef;
use crate::{
    CorrelationId, EntrySnapshot, EntryState, FencingToken, Fingerprint, Key, Replay, Timestamp,
};

/// The three states of the contract (the state table in the crate docs); "absent" is the lack of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Processing,
    Completed,
    Unknown,
}

/// Laid out for a replay hit: the entry is exactly 128 bytes aligned to 128, so its two
/// cache lines are one adjacent-line pair that the hardware prefetcher fetches together:
/// one miss per hit, not two, with keys of up to 69 bytes inline (see [`Key`]).
#[derive(Debug)]
#[repr(C, align(128))]
pub(crate) struct Entry {
    pub(crate) key: Key,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) deadline: Timestamp,
    pub(crate) since: Timestamp,
    /// The token of the claim that created this entry; only its guard may change it.
    pub(crate) token: u64,
    /// Where the stored result is; `Some` only while COMPLETED with its body kept.
    pub(crate) body: Option<ResultRef>,
    /// The low half of the key's hash, from which the table's hash is rebuilt (see
    /// [`crate::shard::table_hash`]) when the table grows or the entry leaves: neither
    /// then rehashes the key. Fits in what was padding.
    pub(crate) hash: u32,
    pub(crate) state: State,
}

/// Bytes charged to every entry on top of its key's stored length and its result body:
/// the slab slot (which holds keys of up to 69 bytes inline, so short keys are charged
/// twice: the formula is an upper bound), the table's index and control byte, the
/// wheel's node (which also holds the age list's links), and one slot of the shard's
/// table of result buffers (a result kept as given has one to itself; packed results
/// share one per stretch of a chunk, at worst one each).
pub const ENTRY_OVERHEAD: usize = std::mem::size_of::<Option<Entry>>()
    + std::mem::size_of::<u32>()
    + 1
    + std::mem::size_of::<crate::shard::wheel::Node<crate::shard::evict::AgeLinks>>()
    + crate::shard::arena::RESULT_SLOT;

// What the charge is made of, pinned: the slab slot 128, the table's index 4 and control
// byte 1, the wheel node 24, the result buffer's slot 40. A change to any part shows here.
const _: () = assert!(ENTRY_OVERHEAD == 128 + 4 + 1 + 24 + 40);

// The layout argument above depends on this, and the memory figures on both.
const _: () = assert!(std::mem::size_of::<Option<Entry>>() == 128);
const _: () =
    assert!(std::mem::size_of::<crate::shard::wheel::Node<crate::shard::evict::AgeLinks>>() == 24);

impl Entry {
    #[inline]
    pub(crate) fn is_live(&self, now: Timestamp) -> bool {
        now < self.deadline
    }

    /// What an entry with this key and a body of `body_len` bytes costs against the byte
    /// bound.
    pub(crate) fn charge_for(key: &Key, body_len: usize) -> usize {
        key.as_bytes().len() + body_len + ENTRY_OVERHEAD
    }

    /// The answer to a replay of this entry, whose result (looked up in the arena) is
    /// `body`.
    #[inline]
    pub(crate) fn replay(&self, body: Option<Bytes>) -> Replay {
        Replay { body, completed_at: self.since, expires_at: self.deadline }
    }

    /// What this entry looks like from outside, its result being `body` and its
    /// claim's correlation id `correlation_id`.
    pub(crate) fn snapshot(
        &self,
        body: Option<Bytes>,
        correlation_id: Option<CorrelationId>,
    ) -> EntrySnapshot {
        let state = match self.state {
            State::Processing => EntryState::Processing {
                started_at: self.since,
                lease_ends_at: self.deadline,
                token: FencingToken(self.token),
            },
            State::Completed => EntryState::Completed(self.replay(body)),
            State::Unknown => {
                EntryState::Unknown { marked_at: self.since, expires_at: self.deadline }
            }
        };
        EntrySnapshot { fingerprint: self.fingerprint, state, correlation_id }
    }
}
