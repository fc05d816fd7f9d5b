//! [`Slab`]: the shard's entries by slot index, in fixed-size segments.
//!
//! Invariant: indices never change, and once the first segment is full no slot moves
//! again. Growing past it appends a segment and copies nothing: a flat `Vec` of 128-byte
//! entries copied every entry on each doubling, and that copy (with the page faults of
//! the new allocation it wrote into) was a fifth of a claim's time while a cache grew
//! (BENCHMARKS.md, "Against quick_cache: the third round"). The price is one more load
//! per access, of the segment's header, from a table small enough to stay in cache.
//!
//! The first segment grows as a `Vec` does (copying at most its 16,384 slots), so a small
//! cache does not pay for a whole segment; every later one is allocated at its full size
//! at once (its pages are still only touched as slots are used).

/// Slots per segment, as a power of two: 16,384 slots of 128 bytes, 2 MiB a segment.
/// Smaller segments measured worse for memory (about 0.7 B more per entry at 1M entries
/// with 1,024 or 4,096 slots, against 0.2 B with these; BENCHMARKS.md, the third round:
/// measured, not explained).
const SEGMENT_BITS: u32 = 14;
const SEGMENT: usize = 1 << SEGMENT_BITS;

/// Values by index, each slot occupied (`Some`) or vacant; indices are handed out by
/// [`Slab::push`] in order and never move.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    /// Every segment but the last is full, so the length follows from them.
    segments: Vec<Vec<Option<T>>>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { segments: Vec::new() }
    }
}

impl<T> Slab<T> {
    /// Slots handed out, occupied or not.
    pub(crate) fn len(&self) -> usize {
        self.segments.last().map_or(0, |last| (self.segments.len() - 1) * SEGMENT + last.len())
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
        let index = self.len();
        match self.segments.last_mut() {
            Some(last) if last.len() < SEGMENT => last.push(Some(value)),
            _ => self.push_segment(value),
        }
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

    fn boundary_indices(len: usize) -> Vec<usize> {
        let mut v = vec![0, 1];
        for s in 1..=4 {
            for d in [-2isize, -1, 0, 1, 2] {
                let i = (s * SEGMENT) as isize + d;
                if i >= 0 {
                    v.push(i as usize);
                }
            }
        }
        v.push(len.saturating_sub(1));
        v.push(len);
        v.push(len + 1);
        v.sort_unstable();
        v.dedup();
        v
    }

    #[test]
    fn every_boundary_slot_reads_writes_and_enumerates_at_its_own_index() {
        let n = 4 * SEGMENT + 1; // the fifth segment holds exactly one slot
        let mut slab = Slab::default();
        let mut model: Vec<Option<usize>> = Vec::new();
        for i in 0..n {
            assert_eq!(slab.push(i), i);
            model.push(Some(i));
        }
        assert_eq!(slab.segments.len(), 5);
        for i in boundary_indices(n) {
            assert_eq!(slab.get(i), model.get(i).and_then(|v| v.as_ref()), "get {i}");
            if i < n {
                assert_eq!(slab.take(i), Some(i), "take {i}");
                assert_eq!(slab.get(i), None);
                model[i] = None;
                assert_eq!(slab.replace(i, i + 1_000_000), None, "replace vacant {i}");
                model[i] = Some(i + 1_000_000);
                assert_eq!(slab.replace(i, i + 2_000_000), Some(i + 1_000_000), "occupied {i}");
                model[i] = Some(i + 2_000_000);
                *slab.get_mut(i).unwrap() += 1;
                *model[i].as_mut().unwrap() += 1;
            } else {
                assert_eq!(slab.take(i), None);
                assert_eq!(slab.get_mut(i), None);
                let r =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| slab.replace(i, 0)));
                assert!(r.is_err(), "replace of never-handed-out slot {i} must panic");
            }
        }
        assert_eq!(slab.len(), n);
        let got: Vec<Option<usize>> = slab.iter().map(|o| o.copied()).collect();
        assert_eq!(got.len(), model.len());
        for (i, (a, b)) in got.iter().zip(&model).enumerate() {
            assert_eq!(a, b, "iter position {i}");
        }
        // pushing after takes still appends at len, in the last segment
        assert_eq!(slab.push(7), n);
        assert_eq!(slab.get(n), Some(&7));
    }

    #[test]
    fn a_full_last_segment_then_push_opens_the_next() {
        let mut slab = Slab::default();
        for i in 0..2 * SEGMENT {
            slab.push(i);
        }
        assert_eq!(slab.segments.len(), 2);
        assert_eq!(slab.segments[0].len(), SEGMENT);
        assert_eq!(slab.segments[1].len(), SEGMENT);
        assert_eq!(slab.segments[1].capacity(), SEGMENT);
        assert_eq!(slab.push(99), 2 * SEGMENT);
        assert_eq!(slab.segments.len(), 3);
        assert_eq!(slab.segments[2].capacity(), SEGMENT);
        assert!(slab.segments[0].capacity() <= SEGMENT, "first segment over-allocated");
    }

    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Push(u32),
        Take(usize),
        Replace(usize, u32),
        GetMut(usize, u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        // indices near boundaries or anywhere in 0..3*SEGMENT+4
        let idx = prop_oneof![
            (0usize..4, -3isize..4).prop_map(|(s, d)| ((s * SEGMENT) as isize + d).max(0) as usize),
            0usize..3 * SEGMENT + 4,
        ];
        prop_oneof![
            any::<u32>().prop_map(Op::Push),
            idx.clone().prop_map(Op::Take),
            (idx.clone(), any::<u32>()).prop_map(|(i, v)| Op::Replace(i, v)),
            (idx, any::<u32>()).prop_map(|(i, v)| Op::GetMut(i, v)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
        #[test]
        fn the_slab_behaves_as_a_vec_of_options(
            start in prop_oneof![Just(SEGMENT - 1), Just(SEGMENT), Just(2 * SEGMENT + 1), 0usize..3 * SEGMENT],
            ops in proptest::collection::vec(op(), 0..300),
        ) {
            let mut slab = Slab::default();
            let mut model: Vec<Option<u32>> = Vec::new();
            for i in 0..start {
                prop_assert_eq!(slab.push(i as u32), i);
                model.push(Some(i as u32));
            }
            for op in ops {
                match op {
                    Op::Push(v) => {
                        prop_assert_eq!(slab.push(v), model.len());
                        model.push(Some(v));
                    }
                    Op::Take(i) => {
                        let m = model.get_mut(i).and_then(Option::take);
                        prop_assert_eq!(slab.take(i), m);
                    }
                    Op::Replace(i, v) => {
                        if i < model.len() {
                            let m = model[i].replace(v);
                            prop_assert_eq!(slab.replace(i, v), m);
                        }
                    }
                    Op::GetMut(i, v) => {
                        let m = model.get_mut(i).and_then(Option::as_mut);
                        let s = slab.get_mut(i);
                        prop_assert_eq!(s.is_some(), m.is_some());
                        if let (Some(s), Some(m)) = (s, m) { *s = v; *m = v; }
                    }
                }
                prop_assert_eq!(slab.len(), model.len());
            }
            let got: Vec<Option<u32>> = slab.iter().map(|o| o.copied()).collect();
            prop_assert_eq!(&got, &model);
            for (i, m) in model.iter().enumerate() {
                prop_assert_eq!(slab.get(i), m.as_ref());
            }
        }
    }
}
