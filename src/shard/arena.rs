//! [`ResultArena`]: where a shard keeps the results of its completed entries, and
//! [`ResultRef`], the 8 bytes by which an entry names its result.
//!
//! Invariant: every buffer the arena holds is named by exactly `users` live
//! [`ResultRef`]s, and is dropped (handed back to the caller, to be freed outside the
//! shard lock) when the last of them is released. A packed result is an exact copy of
//! what the caller completed with, at `start..start + len` of one buffer. Results are
//! written only into the *open* buffer, a `BytesMut` of which no [`Bytes`] exists, so
//! nothing handed out can see a byte change. The first request for a `Bytes` of an open
//! buffer's result *seals* it: what it holds is frozen into a `Bytes` (no copy) and the
//! rest of its chunk becomes the next open buffer, under a new id. Sealing needs `&mut`:
//! [`ResultArena::shared`] on the read path answers `None` for the open buffer, and the
//! caller asks again under the write lock.
//!
//! Why an entry does not hold a `Bytes`: a `Bytes` handle is 32 bytes, a `ResultRef` 8.
//! The 24 bytes saved keep a key of up to 69 bytes (a scope, a tenant and a UUID
//! `Idempotency-Key`) inside the 128-byte entry, where a replay compares it in the cache
//! lines it has already loaded, instead of following a pointer to a heap copy: one cache
//! miss and one allocation less per lookup of such a key. Replaying costs one look in the
//! shard's buffer table (small, and kept hot by every replay: filled in completion
//! order, most chunks are one buffer).
//!
//! Why copy a result the caller already allocated: a 128-byte result in its own
//! allocation costs 144 bytes (the allocator's header and rounding) and, once replayed,
//! a second 32-byte allocation for the `Bytes`' shared reference count, which every
//! replay then touches: a cache miss of its own, on every replay, over a large key set.
//! Packed, a result costs its length, replays share one reference count per chunk
//! (hot in the processor's cache), and an eviction step frees whole chunks instead of
//! thousands of small buffers. Copying 128 bytes costs less than either miss.
//!
//! What it costs: a chunk lives as long as its longest-lived entry (or a replayed
//! `Bytes` a caller holds on to). The shard packs only results kept for the cache's
//! default `completed_ttl`, in completion order, so the results of one chunk expire (and
//! are evicted, oldest first) together. Sealing allocates nothing (the chunk is split,
//! not copied or shrunk): a completion then replay of each result in turn, the common
//! pattern of a retry, costs one buffer id per result and one atomic increment, and
//! fills chunks as densely as any other order. Results over [`PACK_MAX`] bytes, results
//! with another TTL, and empty ones are kept as given, zero-copy, each in a buffer of
//! its own. Each buffer, sealed or kept, takes one [`RESULT_SLOT`]-byte slot of the
//! table; an entry's charge against the byte bound counts one for it
//! ([`ENTRY_OVERHEAD`](crate::ENTRY_OVERHEAD)).

use std::num::NonZeroU32;

use bytes::{Bytes, BytesMut};

/// Results of at most this many bytes are packed; larger ones keep their own buffer.
pub(crate) const PACK_MAX: usize = 512;

/// Bytes per chunk: at least 32 results of [`PACK_MAX`] bytes, so the unused tail of a
/// full chunk is under 4% of it.
pub(crate) const CHUNK: usize = 16 * 1024;
const _: () = assert!(CHUNK / PACK_MAX >= 32);
// A packed result's start and length are u16s.
const _: () = assert!(CHUNK <= u16::MAX as usize + 1);

/// Which buffer holds an entry's result, and where in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResultRef {
    /// One more than the buffer's index (so `Option<ResultRef>` is 8 bytes).
    id: NonZeroU32,
    start: u16,
    /// The packed result's length; 0 for a result kept as given, which is its whole
    /// buffer (packed results are never empty).
    len: u16,
}

const _: () = assert!(std::mem::size_of::<Option<ResultRef>>() == 8);

/// Where buffer `id` sits in the table.
fn index(id: NonZeroU32) -> usize {
    id.get() as usize - 1
}

/// Bytes of the table's slot for one buffer: at most one per entry holding a result.
pub(crate) const RESULT_SLOT: usize = std::mem::size_of::<Buffer>();

impl ResultRef {
    fn index(self) -> usize {
        index(self.id)
    }

    fn is_whole(self) -> bool {
        self.len == 0
    }
}

#[derive(Debug)]
struct Buffer {
    /// Empty while this is the open buffer (its bytes are in `ResultArena::open`).
    bytes: Bytes,
    /// How many live entries name this buffer.
    users: u32,
}

/// The open buffer: the results written since the last seal, then the spare rest of
/// its chunk. Not shared, so it may still be written.
#[derive(Debug)]
struct Open {
    id: NonZeroU32,
    bytes: BytesMut,
}

/// A shard's result buffers, by id.
#[derive(Debug, Default)]
pub(crate) struct ResultArena {
    buffers: Vec<Buffer>,
    free: Vec<NonZeroU32>,
    open: Option<Open>,
}

impl ResultArena {
    /// Packs a copy of `body` into the open chunk (opening one when there is none or
    /// it is full), or answers `None` if it is not worth packing: the caller keeps
    /// `body` itself then ([`ResultArena::keep`]).
    pub(crate) fn pack(&mut self, body: &Bytes) -> Option<ResultRef> {
        if body.is_empty() || body.len() > PACK_MAX {
            // An empty body allocates nothing; a large one gains little from a copy.
            return None;
        }
        let room = self.open.as_ref().map_or(0, |o| o.bytes.capacity() - o.bytes.len());
        if room < body.len() {
            // The rest of this chunk is too short: freeze what it holds, and go on in a
            // new chunk under the id sealing left open. (Not zeroed: nothing shares the
            // spare capacity, and results are appended into it.)
            self.seal();
            let chunk = BytesMut::with_capacity(CHUNK);
            match self.open.as_mut() {
                Some(open) => open.bytes = chunk,
                None => {
                    let id = self.new_buffer(Bytes::new(), 0);
                    self.open = Some(Open { id, bytes: chunk });
                }
            }
        }
        let open = self.open.as_mut().expect("opened above");
        // Both fit in u16: start + len <= CHUNK.
        let start = open.bytes.len() as u16;
        open.bytes.extend_from_slice(body);
        let id = open.id;
        self.buffers[index(id)].users += 1;
        Some(ResultRef { id, start, len: body.len() as u16 })
    }

    /// Keeps `body` as given, in a buffer of its own.
    pub(crate) fn keep(&mut self, body: Bytes) -> ResultRef {
        ResultRef { id: self.new_buffer(body, 1), start: 0, len: 0 }
    }

    fn new_buffer(&mut self, bytes: Bytes, users: u32) -> NonZeroU32 {
        let buffer = Buffer { bytes, users };
        match self.free.pop() {
            Some(id) => {
                self.buffers[index(id)] = buffer;
                id
            }
            None => {
                self.buffers.push(buffer);
                // A buffer holds at least one live entry's result, and a shard's entries
                // are counted in u32 slab ids: there are never more buffers than that.
                u32::try_from(self.buffers.len())
                    .ok()
                    .and_then(NonZeroU32::new)
                    .expect("more result buffers in one shard than slab ids")
            }
        }
    }

    /// Freezes what the open buffer holds into its id's `Bytes`, read-only from now on;
    /// the rest of its chunk stays open under a new id. Nothing is copied: both halves
    /// share the chunk's allocation (and, from the first seal of a chunk, its one
    /// reference count).
    fn seal(&mut self) {
        let Some(open) = self.open.as_mut() else { return };
        if open.bytes.is_empty() {
            return;
        }
        let (id, held) = (open.id, open.bytes.split().freeze());
        self.buffers[index(id)].bytes = held;
        let next = self.new_buffer(Bytes::new(), 0);
        self.open.as_mut().expect("checked above").id = next;
    }

    /// The result `r` names, as a `Bytes` sharing the arena's buffer; `None` if it is in
    /// the open buffer, which only [`ResultArena::sealed`] (with `&mut`) can share.
    #[inline]
    pub(crate) fn shared(&self, r: ResultRef) -> Option<Bytes> {
        if self.open.as_ref().is_some_and(|o| o.id == r.id) {
            return None;
        }
        let buffer = &self.buffers[r.index()].bytes;
        Some(if r.is_whole() {
            buffer.clone()
        } else {
            let start = usize::from(r.start);
            buffer.slice(start..start + usize::from(r.len))
        })
    }

    /// The result `r` names, sealing the open buffer first if `r` is in it.
    pub(crate) fn sealed(&mut self, r: ResultRef) -> Bytes {
        if self.open.as_ref().is_some_and(|o| o.id == r.id) {
            self.seal();
        }
        self.shared(r).expect("sealed above")
    }

    /// The length of the result `r` names.
    pub(crate) fn len(&self, r: ResultRef) -> usize {
        if r.is_whole() {
            self.buffers[r.index()].bytes.len()
        } else {
            usize::from(r.len)
        }
    }

    /// An entry naming `r` has gone. Returns its buffer if that was the last entry naming
    /// it, for the caller to drop outside the lock. The open buffer is never returned: once
    /// nobody names it, it is emptied and filled again from its start.
    pub(crate) fn release(&mut self, r: ResultRef) -> Option<Bytes> {
        let buffer = &mut self.buffers[r.index()];
        buffer.users -= 1;
        if buffer.users > 0 {
            return None;
        }
        if let Some(open) = self.open.as_mut().filter(|o| o.id == r.id) {
            open.bytes.clear();
            return None;
        }
        let bytes = std::mem::take(&mut buffer.bytes);
        self.free.push(r.id);
        Some(bytes)
    }

    /// Panics unless each buffer's count of users is the number of `refs` (every live
    /// entry's) naming it, and the free list holds exactly the buffers nobody uses.
    pub(crate) fn validate(&self, refs: impl Iterator<Item = ResultRef>) {
        let mut counted = vec![0u32; self.buffers.len()];
        for r in refs {
            counted[r.index()] += 1;
        }
        for (i, (buffer, &counted)) in self.buffers.iter().zip(&counted).enumerate() {
            let id = NonZeroU32::new(i as u32 + 1).expect("i + 1 > 0");
            assert_eq!(buffer.users, counted, "result buffer {i} user count drifted");
            let is_open = self.open.as_ref().is_some_and(|o| o.id == id);
            assert_eq!(
                self.free.contains(&id),
                counted == 0 && !is_open,
                "result buffer {i} free-list membership"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same_buffer(a: ResultRef, b: ResultRef) -> bool {
        a.id == b.id
    }

    fn body(byte: u8, len: usize) -> Bytes {
        Bytes::from(vec![byte; len])
    }

    #[test]
    fn small_results_are_copied_into_one_chunk_back_to_back() {
        let mut arena = ResultArena::default();
        let a = arena.pack(&body(1, 100)).unwrap();
        let b = arena.pack(&body(2, 100)).unwrap();
        assert!(same_buffer(a, b));
        let (a, b) = (arena.sealed(a), arena.shared(b).unwrap());
        assert_eq!((&a[..], &b[..]), (&[1u8; 100][..], &[2u8; 100][..]));
        // Adjacent in one buffer: no allocation of their own.
        assert_eq!(a.as_ptr().wrapping_add(100), b.as_ptr());
    }

    #[test]
    fn the_open_buffer_is_shared_only_once_sealed_and_never_written_after() {
        let mut arena = ResultArena::default();
        let a = arena.pack(&body(1, 10)).unwrap();
        assert_eq!(arena.shared(a), None, "the open buffer is not shared on the read path");
        let replayed = arena.sealed(a);
        assert_eq!(&replayed[..], &[1u8; 10][..]);
        // Sealed: the next result goes under a new id, and the replayed bytes stay as
        // they were.
        let b = arena.pack(&body(2, 10)).unwrap();
        assert!(!same_buffer(a, b));
        assert_eq!(arena.shared(a).unwrap(), replayed);
        assert_eq!(&replayed[..], &[1u8; 10][..]);
        assert_eq!(arena.buffers[a.index()].bytes.len(), 10, "a holds only what it held");
        arena.validate([a, b].into_iter());
    }

    #[test]
    fn sealing_after_every_result_still_packs_them_back_to_back_in_one_chunk() {
        // The retry pattern: each result replayed as soon as it completes. Sealing splits
        // the chunk; it allocates no chunk of its own.
        let mut arena = ResultArena::default();
        let first = arena.pack(&body(0, 100)).unwrap();
        let first = arena.sealed(first);
        let mut refs = Vec::new();
        for i in 1..(CHUNK / 100) {
            let r = arena.pack(&body(i as u8, 100)).unwrap();
            let b = arena.sealed(r);
            assert_eq!(b.as_ptr(), first.as_ptr().wrapping_add(100 * i), "result {i}");
            assert!(b.iter().all(|&x| x == i as u8));
            refs.push(r);
        }
        assert_eq!(&first[..], &[0u8; 100][..]);
        // The chunk's last 84 bytes hold no 100-byte result: the next opens a new chunk.
        let next = arena.pack(&body(9, 100)).unwrap();
        let next = arena.sealed(next);
        let chunk = first.as_ptr()..first.as_ptr().wrapping_add(CHUNK);
        assert!(!chunk.contains(&next.as_ptr()));
    }

    #[test]
    fn large_and_empty_results_are_kept_as_given() {
        let mut arena = ResultArena::default();
        let large = body(7, PACK_MAX + 1);
        assert_eq!(arena.pack(&large), None);
        assert_eq!(arena.pack(&Bytes::new()), None);
        assert!(arena.open.is_none(), "neither opened a chunk");
        let kept = arena.keep(large.clone());
        assert_eq!(arena.len(kept), PACK_MAX + 1);
        let shared = arena.shared(kept).unwrap();
        assert_eq!(shared.as_ptr(), large.as_ptr(), "kept zero-copy");
        let empty = arena.keep(Bytes::new());
        assert_eq!((arena.len(empty), arena.shared(empty)), (0, Some(Bytes::new())));
    }

    #[test]
    fn a_full_chunk_is_sealed_and_a_new_one_opened() {
        let mut arena = ResultArena::default();
        let per_chunk = CHUNK / PACK_MAX;
        let first: Vec<ResultRef> =
            (0..per_chunk).map(|i| arena.pack(&body(i as u8, PACK_MAX)).unwrap()).collect();
        // Results of exactly PACK_MAX bytes are packed, and the last one fills the chunk
        // to its end rather than opening another.
        assert!(first.iter().all(|&r| same_buffer(r, first[0])));
        let next = arena.pack(&body(0xff, PACK_MAX)).unwrap();
        assert!(!same_buffer(next, first[0]));
        // The full chunk was sealed by the next result: readable without `&mut`.
        for (i, &r) in first.iter().enumerate() {
            let b = arena.shared(r).unwrap();
            assert_eq!(b.len(), PACK_MAX);
            assert!(b.iter().all(|&x| x == i as u8));
        }
    }

    #[test]
    fn a_buffer_is_handed_back_with_its_last_user_and_its_id_reused() {
        let mut arena = ResultArena::default();
        let a = arena.pack(&body(1, 10)).unwrap();
        let b = arena.pack(&body(2, 10)).unwrap();
        let replayed = arena.sealed(a);
        assert_eq!(arena.release(a), None, "b still names the chunk");
        let freed = arena.release(b).expect("the last user hands the buffer back");
        assert_eq!(freed.len(), 20);
        // A replay handed out earlier keeps its bytes.
        assert_eq!(&replayed[..], &[1u8; 10][..]);
        let kept = arena.keep(body(3, 1000));
        assert_eq!(kept.index(), a.index(), "the freed id is reused");
        arena.validate([kept].into_iter());
    }

    #[test]
    #[should_panic(expected = "user count drifted")]
    fn validate_notices_a_reference_it_was_not_told_of() {
        let mut arena = ResultArena::default();
        arena.keep(Bytes::from_static(b"kept"));
        arena.validate(std::iter::empty());
    }

    #[test]
    fn an_open_chunk_nobody_names_is_refilled_from_the_start() {
        let mut arena = ResultArena::default();
        let a = arena.pack(&body(1, 100)).unwrap();
        assert_eq!(arena.release(a), None, "the open buffer is kept, not handed back");
        let b = arena.pack(&body(2, 100)).unwrap();
        assert!(same_buffer(a, b));
        assert_eq!(b.start, 0, "refilled from its start");
        assert_eq!(&arena.sealed(b)[..], &[2u8; 100][..]);
        arena.validate([b].into_iter());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Pack(u16),
        Keep(u16),
        Sealed(u8),
        Shared(u8),
        Release(u8),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        let len = prop_oneof![1u16..=3, 200u16..=520, Just(512), Just(511), Just(0)];
        prop_oneof![
            5 => len.clone().prop_map(Op::Pack),
            1 => len.prop_map(Op::Keep),
            2 => any::<u8>().prop_map(Op::Sealed),
            2 => any::<u8>().prop_map(Op::Shared),
            4 => any::<u8>().prop_map(Op::Release),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 500, ..Default::default() })]

        /// Against a plain model: every live reference reads back what was stored, bytes
        /// handed out never change, counts and the free list agree, a buffer goes back
        /// exactly with its last user (never the open one), an unused buffer holds
        /// nothing, and nothing is left once every reference is released.
        #[test]
        fn the_arena_agrees_with_a_model(ops in proptest::collection::vec(op(), 1..400)) {
            let mut arena = ResultArena::default();
            let mut live: Vec<(ResultRef, Vec<u8>)> = Vec::new();
            let mut handed: Vec<(Bytes, Vec<u8>)> = Vec::new();
            for (seq, op) in ops.iter().enumerate() {
                let content =
                    |len: u16| (0..usize::from(len)).map(|i| ((seq * 97) ^ (i * 31)) as u8).collect();
                match *op {
                    Op::Pack(len) => {
                        let c: Vec<u8> = content(len);
                        let b = Bytes::from(c.clone());
                        let r = match arena.pack(&b) {
                            Some(r) => r,
                            None => {
                                proptest::prop_assert!(len == 0 || usize::from(len) > PACK_MAX);
                                arena.keep(b)
                            }
                        };
                        live.push((r, c));
                    }
                    Op::Keep(len) => {
                        let c: Vec<u8> = content(len);
                        live.push((arena.keep(Bytes::from(c.clone())), c));
                    }
                    Op::Sealed(i) if !live.is_empty() => {
                        let (r, c) = live[usize::from(i) % live.len()].clone();
                        let b = arena.sealed(r);
                        proptest::prop_assert_eq!(&b[..], &c[..]);
                        handed.push((b, c));
                    }
                    Op::Shared(i) if !live.is_empty() => {
                        let (r, c) = live[usize::from(i) % live.len()].clone();
                        if let Some(b) = arena.shared(r) {
                            proptest::prop_assert_eq!(&b[..], &c[..]);
                            handed.push((b, c));
                        }
                    }
                    Op::Release(i) if !live.is_empty() => {
                        let (r, _) = live.swap_remove(usize::from(i) % live.len());
                        let still_named = live.iter().any(|(o, _)| same_buffer(*o, r));
                        let is_open = arena.open.as_ref().is_some_and(|o| o.id == r.id);
                        let freed = arena.release(r);
                        proptest::prop_assert_eq!(freed.is_some(), !still_named && !is_open);
                    }
                    _ => {}
                }
                arena.validate(live.iter().map(|(r, _)| *r));
                for (r, c) in &live {
                    proptest::prop_assert_eq!(arena.len(*r), c.len());
                }
                for (b, c) in &handed {
                    proptest::prop_assert_eq!(&b[..], &c[..], "handed-out bytes changed");
                }
                for buffer in &arena.buffers {
                    proptest::prop_assert!(buffer.users > 0 || buffer.bytes.is_empty());
                }
                if let Some(o) = &arena.open {
                    let users = arena.buffers[index(o.id)].users;
                    proptest::prop_assert_eq!(users == 0, o.bytes.is_empty());
                }
            }
            for (r, _) in live.drain(..) {
                arena.release(r);
            }
            arena.validate(std::iter::empty());
            proptest::prop_assert!(arena.buffers.iter().all(|b| b.bytes.is_empty()));
        }
    }
}
