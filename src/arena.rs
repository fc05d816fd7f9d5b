//! [`ResultArena`]: where a shard keeps small results, packed back to back.
//!
//! Invariant: a packed result is a [`Bytes`] slice of one shard-owned chunk, holding an
//! exact copy of what the caller completed with; the chunk is freed when the arena has
//! moved on to the next chunk and the last slice of it (the entry's or a replay's) is
//! dropped. The arena never writes into bytes a slice already covers.
//!
//! Why copy a result the caller already allocated: a 128-byte result in its own
//! allocation costs 144 bytes (the allocator's header and rounding) and, once replayed,
//! a second 32-byte allocation for the `Bytes`' shared reference count, which every
//! replay then touches: a cache miss of its own, on every replay, over a large key set.
//! Packed, a result costs its length, replays share one reference count per chunk
//! (hot in the processor's cache), and an eviction step frees whole chunks instead of
//! thousands of small buffers. Copying 128 bytes costs less than either miss.
//!
//! What it costs: a chunk lives as long as its longest-lived slice. The shard packs only
//! results kept for the cache's default `completed_ttl`, in completion order, so the
//! results of one chunk expire (and are evicted, oldest first) together; what can keep a
//! chunk alive longer is a removed entry's neighbours (until they expire) or a replayed
//! `Bytes` the caller holds on to. Results over [`PACK_MAX`] bytes are kept as given,
//! zero-copy.

use bytes::{Bytes, BytesMut};

/// Results of at most this many bytes are packed; larger ones keep their own buffer.
pub(crate) const PACK_MAX: usize = 512;

/// Bytes per chunk: at least 32 results of [`PACK_MAX`] bytes, so the unused tail of a
/// full chunk is under 4% of it.
pub(crate) const CHUNK: usize = 16 * 1024;
const _: () = assert!(CHUNK / PACK_MAX >= 32);

/// What is left of the chunk being filled; earlier chunks live on in the slices
/// handed out.
#[derive(Debug, Default)]
pub(crate) struct ResultArena {
    chunk: BytesMut,
}

impl ResultArena {
    /// A copy of `body` packed into the current chunk (starting a new chunk when this
    /// one is full), or `None` if it is not worth packing: the caller keeps `body`
    /// itself then.
    pub(crate) fn pack(&mut self, body: &Bytes) -> Option<Bytes> {
        if body.is_empty() || body.len() > PACK_MAX {
            // An empty body allocates nothing; a large one gains little from a copy.
            return None;
        }
        if self.chunk.len() < body.len() {
            // The old chunk is freed with the last of its slices. Zeroed, so that the
            // chunk is whole from the start and a result is cut off it before it is
            // copied in: cutting takes an atomic increment of the chunk's reference
            // count, which would otherwise wait for the copy's stores to reach the cache.
            self.chunk = BytesMut::zeroed(CHUNK);
        }
        let mut packed = self.chunk.split_to(body.len());
        packed.copy_from_slice(body);
        Some(packed.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_results_are_copied_into_one_chunk_back_to_back() {
        let mut arena = ResultArena::default();
        let a = arena.pack(&Bytes::from(vec![1u8; 100])).unwrap();
        let b = arena.pack(&Bytes::from(vec![2u8; 100])).unwrap();
        assert_eq!((&a[..], &b[..]), (&[1u8; 100][..], &[2u8; 100][..]));
        // Adjacent in one buffer: no allocation of their own.
        assert_eq!(a.as_ptr().wrapping_add(100), b.as_ptr());
    }

    #[test]
    fn large_and_empty_results_are_kept_as_given() {
        let mut arena = ResultArena::default();
        let large = Bytes::from(vec![7u8; PACK_MAX + 1]);
        assert_eq!(arena.pack(&large), None);
        assert_eq!(arena.pack(&Bytes::new()), None);
        assert_eq!(arena.chunk.len(), 0, "neither started a chunk");
    }

    #[test]
    fn a_full_chunk_is_left_to_its_slices_and_a_new_one_started() {
        let mut arena = ResultArena::default();
        let per_chunk = CHUNK / PACK_MAX;
        let first: Vec<Bytes> = (0..per_chunk)
            .map(|i| arena.pack(&Bytes::from(vec![i as u8; PACK_MAX])).unwrap())
            .collect();
        // Results of exactly PACK_MAX bytes are packed, and the last one fills the chunk
        // to its end rather than starting another.
        for (i, b) in first.iter().enumerate() {
            assert_eq!(b.as_ptr(), first[0].as_ptr().wrapping_add(i * PACK_MAX));
        }
        let next = arena.pack(&Bytes::from(vec![0xff; PACK_MAX])).unwrap();
        let chunk = first[0].as_ptr()..first[0].as_ptr().wrapping_add(CHUNK);
        assert!(!chunk.contains(&next.as_ptr()), "the full chunk was written past its end");
        // Every earlier slice still reads what was packed into it.
        for (i, b) in first.iter().enumerate() {
            assert!(b.iter().all(|&x| x == i as u8));
        }
    }
}
