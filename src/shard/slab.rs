//! [`Slab`]: the shard's entries by slot index, in fixed-size segments.
//!
//! Invariant: indices never change, and once the first segment is full no slot moves
//! again. Growing past it appends a segment and copies nothing: a flat `Vec` of 128-byte
//! entries copied every entry on each doubling, and that copy (with the page faults of
//! the new allocation it wrote into) was a quarter of a claim's time while a cache grew
//! (BENCHMARKS.md, "the third round"). The price is one more load per access, of the
//! segment's header, from a table small enough to stay in cache.
//!
//! The first segment grows as a `Vec` does (copying at most its 16,384 slots), so a small
//! cache does not pay for a whole segment; every later one is allocated at its full size
//! at once (its pages are still only touched as slots are used).

/// Slots per segment, as a power of two: 16,384 slots of 128 bytes, 2 MiB a segment.
/// Smaller segments measured worse for memory (about 0.7 B more per entry at 1M entries
/// with 1,024 or 4,096 slots, against 0.2 B with these; BENCHMARKS.md, the third round).
const SEGMENT_BITS: u32 = 14;
const SEGMENT: usize = 1 << SEGMENT_BITS;

/// Values by index, each slot occupied (`Some`) or vacant; indices are handed out by
/// [`Slab::push`] in order and never move.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    segments: Vec<Vec<Option<T>>>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { segments: Vec::new(), len: 0 }
    }
}

impl<T> Slab<T> {
    /// Slots handed out, occupied or not.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn slot(&self, index: usize) -> Option<&Option<T>> {
        self.segments.get(index >> SEGMENT_BITS)?.get(index & (SEGMENT - 1))
    }

    #[inline]
    fn slot_mut(&mut self, index: usize) -> Option<&mut Option<T>> {
        self.segments.get_mut(index >> SEGMENT_BITS)?.get_mut(index & (SEGMENT - 1))
    }

    /// The value in slot `index`, if that slot exists and is occupied.
    #[inline]
    pub(crate) fn get(&self, index: usize) -> Option<&T> {
        self.slot(index)?.as_ref()
    }

    /// The value in slot `index`, mutably, if that slot exists and is occupied.
    #[inline]
    pub(crate) fn get_mut(&mut self, index: usize) -> Option<&mut T> {
        self.slot_mut(index)?.as_mut()
    }

    /// Puts `value` in a new slot at the end; returns its index. Inlined, so the caller's
    /// 128-byte entry is written into its slot rather than moved there through a call.
    #[inline]
    pub(crate) fn push(&mut self, value: T) -> usize {
        let index = self.len;
        match self.segments.last_mut() {
            Some(last) if last.len() < SEGMENT => last.push(Some(value)),
            _ => self.push_segment(value),
        }
        self.len += 1;
        index
    }

    /// Starts a segment with `value` in its first slot: out of line, once per segment.
    #[cold]
    #[inline(never)]
    fn push_segment(&mut self, value: T) {
        let mut segment =
            if self.segments.is_empty() { Vec::new() } else { Vec::with_capacity(SEGMENT) };
        segment.push(Some(value));
        self.segments.push(segment);
    }

    /// Puts `value` in the existing slot `index`, returning what it held.
    ///
    /// # Panics
    /// If slot `index` was never handed out by [`Slab::push`].
    pub(crate) fn replace(&mut self, index: usize, value: T) -> Option<T> {
        self.slot_mut(index).expect("a slot the slab handed out").replace(value)
    }

    /// Empties slot `index`, returning what it held (`None` if it was vacant or never
    /// handed out).
    pub(crate) fn take(&mut self, index: usize) -> Option<T> {
        self.slot_mut(index)?.take()
    }

    /// Every slot in index order, `None` where vacant.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Option<&T>> {
        self.segments.iter().flatten().map(Option::as_ref)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_are_handed_out_in_order_across_segments_and_read_back() {
        let mut slab = Slab::default();
        for i in 0..3 * SEGMENT + 5 {
            assert_eq!(slab.push(i), i);
        }
        assert_eq!(slab.len(), 3 * SEGMENT + 5);
        for i in [0, SEGMENT - 1, SEGMENT, 2 * SEGMENT + 1, 3 * SEGMENT + 4] {
            assert_eq!(slab.get(i), Some(&i));
        }
        assert_eq!(slab.get(3 * SEGMENT + 5), None, "past the end");
        assert_eq!(slab.iter().flatten().count(), 3 * SEGMENT + 5);
        assert!(slab.iter().flatten().copied().eq(0..3 * SEGMENT + 5));
    }

    #[test]
    fn once_the_first_segment_is_full_no_slot_moves() {
        let mut slab = Slab::default();
        for i in 0..SEGMENT {
            slab.push(i as u64);
        }
        let before: *const u64 = slab.get(0).unwrap();
        for i in 0..4 * SEGMENT {
            slab.push(i as u64);
        }
        assert_eq!(slab.get(0).unwrap() as *const u64, before);
        let second: *const u64 = slab.get(SEGMENT).unwrap();
        for i in 0..4 * SEGMENT {
            slab.push(i as u64);
        }
        assert_eq!(slab.get(SEGMENT).unwrap() as *const u64, second);
    }

    #[test]
    fn take_and_replace_change_one_slot_only() {
        let mut slab = Slab::default();
        for i in 0..SEGMENT + 2 {
            slab.push(i);
        }
        assert_eq!(slab.take(SEGMENT), Some(SEGMENT));
        assert_eq!(slab.take(SEGMENT), None, "already vacant");
        assert_eq!(slab.get(SEGMENT), None);
        assert_eq!(slab.get_mut(SEGMENT), None);
        assert_eq!(slab.take(10 * SEGMENT), None, "never handed out");
        assert_eq!(slab.replace(SEGMENT, 99), None);
        assert_eq!(slab.get(SEGMENT), Some(&99));
        *slab.get_mut(1).unwrap() = 42;
        assert_eq!(slab.replace(1, 43), Some(42));
        assert_eq!(slab.len(), SEGMENT + 2, "no slot added or lost");
        let values: Vec<_> = slab.iter().flatten().copied().collect();
        assert_eq!(values.len(), SEGMENT + 2);
        assert_eq!((values[0], values[1], values[SEGMENT]), (0, 43, 99));
    }

    #[test]
    #[should_panic(expected = "a slot the slab handed out")]
    fn replace_past_the_end_panics() {
        let mut slab: Slab<u8> = Slab::default();
        slab.replace(0, 1);
    }
}
