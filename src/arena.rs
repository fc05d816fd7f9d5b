//! [`ResultArena`]: where a shard keeps the results of its completed entries, and
//! [`ResultRef`], the 8 bytes by which an entry names its result.
//!
//! Invariant: every buffer the arena holds is named by exactly `users` live
//! [`ResultRef`]s, and is dropped (handed back to the caller, to be freed outside the
//! shard lock) when the last of them is released. A packed result is an exact copy of
//! what the caller completed with, at `start..start + len` of one chunk; a chunk is only
//! ever written while it is *open*, and no [`Bytes`] of an open chunk exists, so nothing
//! handed out can see a byte change. The first request for a `Bytes` of an open chunk's
//! result *seals* the chunk (only with `&mut`: [`ResultArena::shared`] on the read path
//! answers `None` then, and the caller asks again under the write lock).
//!
//! Why an entry does not hold a `Bytes`: a `Bytes` handle is 32 bytes, a `ResultRef` 8.
//! The 24 bytes saved keep a key of up to 69 bytes (a scope, a tenant and a UUID
//! `Idempotency-Key`) inside the 128-byte entry, where a replay compares it in the cache
//! lines it has already loaded, instead of following a pointer to a heap copy: one cache
//! miss and one allocation less per lookup of such a key. Replaying costs one look in the
//! shard's buffer table (a few hundred entries per shard, kept hot by every replay).
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
//! are evicted, oldest first) together. A chunk sealed early (a result replayed just
//! after it completed) is shrunk to what it holds, and the next result opens a new one:
//! at worst, a completion then replay of each result in turn, one allocation per result,
//! as if nothing were packed. Results over [`PACK_MAX`] bytes, results with another TTL,
//! and empty ones are kept as given, zero-copy, each in a buffer of its own.

use std::num::NonZeroU32;

use bytes::Bytes;

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

impl ResultRef {
    fn index(self) -> usize {
        self.id.get() as usize - 1
    }

    fn is_whole(self) -> bool {
        self.len == 0
    }
}

#[derive(Debug)]
struct Buffer {
    /// Empty while this is the open chunk (its bytes are in `ResultArena::open`).
    bytes: Bytes,
    /// How many live entries name this buffer.
    users: u32,
}

/// The open chunk: not yet shared, so it may still be written.
#[derive(Debug)]
struct Open {
    id: NonZeroU32,
    bytes: Vec<u8>,
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
        let has_room = self.open.as_ref().is_some_and(|o| CHUNK - o.bytes.len() >= body.len());
        if !has_room {
            self.seal();
            let id = self.new_buffer(Bytes::new(), 0);
            self.open = Some(Open { id, bytes: Vec::with_capacity(CHUNK) });
        }
        let open = self.open.as_mut().expect("opened above");
        // Both fit in u16: start + len <= CHUNK.
        let start = open.bytes.len() as u16;
        open.bytes.extend_from_slice(body);
        let id = open.id;
        self.buffers[id.get() as usize - 1].users += 1;
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
                self.buffers[id.get() as usize - 1] = buffer;
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

    /// Shares the open chunk: from now on it is read-only, and the next packed result
    /// opens another. Trimmed to what it holds, so a chunk sealed early keeps no more
    /// memory than its results.
    fn seal(&mut self) {
        if let Some(Open { id, mut bytes }) = self.open.take() {
            bytes.shrink_to_fit();
            self.buffers[id.get() as usize - 1].bytes = Bytes::from(bytes);
        }
    }

    /// The result `r` names, as a `Bytes` sharing the arena's buffer; `None` if it is in
    /// the open chunk, which only [`ResultArena::sealed`] (with `&mut`) can share.
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

    /// The result `r` names, sealing its chunk first if it is the open one.
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
    /// it, for the caller to drop outside the lock. The open chunk is never returned: once
    /// nobody names it, it is emptied and filled again from the start.
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
    fn the_open_chunk_is_shared_only_once_sealed_and_never_written_after() {
        let mut arena = ResultArena::default();
        let a = arena.pack(&body(1, 10)).unwrap();
        assert_eq!(arena.shared(a), None, "the open chunk is not shared on the read path");
        let replayed = arena.sealed(a);
        assert_eq!(&replayed[..], &[1u8; 10][..]);
        // Sealed: the next result goes to a new chunk, and the replayed bytes stay as
        // they were.
        let b = arena.pack(&body(2, 10)).unwrap();
        assert!(!same_buffer(a, b));
        assert_eq!(arena.shared(a).unwrap(), replayed);
        assert_eq!(&replayed[..], &[1u8; 10][..]);
        // Trimmed to what it held.
        assert_eq!(arena.buffers[a.index()].bytes.len(), 10);
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
    fn an_open_chunk_nobody_names_is_refilled_from_the_start() {
        let mut arena = ResultArena::default();
        let a = arena.pack(&body(1, 100)).unwrap();
        assert_eq!(arena.release(a), None, "the open chunk is kept, not handed back");
        let b = arena.pack(&body(2, 100)).unwrap();
        assert!(same_buffer(a, b));
        assert_eq!(b.start, 0, "refilled from its start");
        assert_eq!(&arena.sealed(b)[..], &[2u8; 100][..]);
        arena.validate([b].into_iter());
    }
}
