//! [`Wheel`]: a hierarchical timing wheel over caller-chosen `u32` ids.
//!
//! A plain data structure: no locks, no clock. Time is a `u64` tick count the caller
//! supplies; the caller converts deadlines to ticks rounding up, and "now" to ticks
//! rounding down, so nothing fires early.
//!
//! Each id's node also carries a caller-chosen payload `P` that the wheel never reads:
//! the shard keeps its age-list links there, so the bookkeeping of one entry outside
//! its slab slot is one 24-byte node, one cache miss, not two arenas' worth.
//!
//! Prior art: the hierarchical timing wheel of Varghese and Lauck ("Hashed and
//! Hierarchical Timing Wheels", SOSP 1987, scheme 7), in the shape tokio's time driver
//! gives it (levels of 64 slots, each level's occupancy one `u64` bitfield, an item's
//! level read from the highest digit where its deadline differs from now). What is this
//! crate's own: ids into the shard's slab instead of allocated timer entries, a payload
//! riding in each node, the overflow level, and the per-call work bound below.
//!
//! Shape: [`NUM_LEVELS`] levels of 64 slots. Level `L` slot `d` holds items whose deadline
//! agrees with `elapsed` on every 6-bit digit above `L` and has digit `d` at `L`; an item's
//! level is the highest digit where its deadline differs from `elapsed` (three lines in
//! [`level_for`]). Eleven levels of six bits cover all 64 bits of a tick, so the top level
//! is the overflow level: a deadline centuries away sits there and re-cascades down as
//! time approaches it, instead of wrapping around and firing early.
//!
//! Ground rules:
//! - every item is in exactly one slot's doubly linked list, whose head's back link names
//!   the slot, so cancel and reschedule are O(1) and leave no stale copy behind;
//! - no occupied slot at level `L` lies behind `elapsed`'s digit at `L` (the wheel never
//!   wraps), and an item with `deadline <= elapsed` sits in level 0 at `elapsed`'s slot;
//! - [`Wheel::poll`] hands back every item whose deadline is at or before `to`, each once,
//!   doing at most `work` node moves per call, so a caller can bound a sweep.

/// Bits of a tick each level resolves. Being 6 makes a slot's occupancy one `u64`.
const BITS_PER_LEVEL: u32 = 6;
const SLOTS: usize = 1 << BITS_PER_LEVEL;
const SLOT_MASK: u64 = SLOTS as u64 - 1;
/// 11 levels × 6 bits = 66 bits ≥ 64: every `u64` deadline has a level.
pub(crate) const NUM_LEVELS: usize = 11;

/// The end of a list, and the `prev` of a node that is not scheduled.
const NIL: u32 = u32::MAX;
/// A list's first node has no predecessor; its `prev` names its slot instead, as
/// `SLOT_BASE + level * SLOTS + digit`, so that unlinking it can find the slot's head
/// without a field of its own (which would take a node from 24 to 32 bytes).
const SLOT_BASE: u32 = NIL - (NUM_LEVELS * SLOTS) as u32;
/// Ids must stay below the slot markers.
pub(crate) const MAX_ID: u32 = SLOT_BASE - 1;

/// One id's place on the wheel, and its payload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Node<P> {
    deadline: u64,
    /// The previous id in the slot's list, the slot's marker (at the head of the list;
    /// see [`SLOT_BASE`]), or `NIL` when not scheduled.
    prev: u32,
    next: u32,
    payload: P,
}

impl<P: Default> Node<P> {
    fn empty() -> Node<P> {
        Node { deadline: 0, prev: NIL, next: NIL, payload: P::default() }
    }

    fn is_scheduled(&self) -> bool {
        self.prev != NIL
    }
}

#[derive(Debug, Clone)]
struct Level {
    /// Bit `d` is set iff slot `d` is non-empty.
    occupied: u64,
    heads: [u32; SLOTS],
}

/// The level an item belongs on: the highest 6-bit digit where its deadline differs from
/// `elapsed`. `| SLOT_MASK` makes equal values land on level 0.
fn level_for(elapsed: u64, deadline: u64) -> usize {
    let masked = (elapsed ^ deadline) | SLOT_MASK;
    let significant = 63 - masked.leading_zeros();
    (significant / BITS_PER_LEVEL) as usize
}

/// The `prev` of the node at the head of `level`'s slot `d`.
fn slot_marker(level: usize, d: u32) -> u32 {
    SLOT_BASE + (level * SLOTS) as u32 + d
}

fn digit(tick: u64, level: usize) -> u32 {
    let shift = level as u32 * BITS_PER_LEVEL;
    // Level 10's shift is 60: the digit is the top 4 bits.
    ((tick >> shift) & SLOT_MASK) as u32
}

/// The first tick of `level`'s slot `d`, in the rotation `elapsed` is in.
fn slot_start(elapsed: u64, level: usize, d: u32) -> u64 {
    let shift = level as u32 * BITS_PER_LEVEL;
    let above = shift + BITS_PER_LEVEL;
    let base = if above >= 64 { 0 } else { elapsed >> above << above };
    base | (u64::from(d) << shift)
}

/// A hierarchical timing wheel; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct Wheel<P = ()> {
    elapsed: u64,
    levels: Box<[Level; NUM_LEVELS]>,
    nodes: Vec<Node<P>>,
    len: usize,
    /// Set when a poll found nothing more due by `elapsed` (it ended without running out
    /// of work), cleared when a poll hands an item back or runs out: while set, no
    /// occupied slot begins at or before `elapsed` but level 0's current one, where an
    /// item scheduled already due is linked. So a poll to a tick not past `elapsed` (the
    /// clock has not moved a tick since: nearly every insert's sweep) looks at that one
    /// slot instead of every level (callgrind: 117 of a fresh claim + complete's 2,414
    /// instructions went to finding that nothing was due).
    drained: bool,
}

impl<P: Copy + Default> Wheel<P> {
    /// A wheel whose current tick is `now`.
    pub(crate) fn new(now: u64) -> Wheel<P> {
        let level = Level { occupied: 0, heads: [NIL; SLOTS] };
        Wheel {
            elapsed: now,
            levels: Box::new(std::array::from_fn(|_| level.clone())),
            nodes: Vec::new(),
            len: 0,
            drained: true,
        }
    }

    /// Items scheduled.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The payload of `id`'s node, created (as `P::default()`) if `id` never had one.
    /// Scheduling and cancelling leave it as it is.
    pub(crate) fn payload_mut(&mut self, id: u32) -> &mut P {
        self.node_mut(id);
        &mut self.nodes[id as usize].payload
    }

    /// The payload of `id`'s node, if it has one.
    pub(crate) fn payload(&self, id: u32) -> Option<&P> {
        self.nodes.get(id as usize).map(|n| &n.payload)
    }

    fn node_mut(&mut self, id: u32) -> &mut Node<P> {
        let i = id as usize;
        if i >= self.nodes.len() {
            self.nodes.resize(i + 1, Node::empty());
        }
        &mut self.nodes[i]
    }

    /// Schedules `id` to fire at `deadline`, replacing any earlier schedule of it: O(1).
    pub(crate) fn schedule(&mut self, id: u32, deadline: u64) {
        debug_assert!(id <= MAX_ID, "id {id} collides with the slot markers");
        let i = id as usize;
        self.node_mut(id);
        self.cancel(id);
        self.nodes[i].deadline = deadline;
        self.link(id);
        self.len += 1;
    }

    /// Unschedules `id`; returns whether it was scheduled. O(1).
    pub(crate) fn cancel(&mut self, id: u32) -> bool {
        let Some(node) = self.nodes.get(id as usize).copied() else { return false };
        if !node.is_scheduled() {
            return false;
        }
        self.unlink(id, node);
        self.len -= 1;
        true
    }

    /// The next item due at or before tick `to`, removed from the wheel; `None` when no
    /// item is due or `work` ran out (check `*work == 0` to tell them apart). Each node
    /// looked at costs one unit of `work`; an item cascades at most `NUM_LEVELS` times,
    /// so handing out `n` items costs `O(n)` work however far time jumped.
    pub(crate) fn poll(&mut self, to: u64, work: &mut usize) -> Option<u32> {
        if self.drained
            && to <= self.elapsed
            && self.levels[0].occupied & (1 << digit(self.elapsed, 0)) == 0
        {
            return None;
        }
        loop {
            let Some((level, d, start)) = self.next_slot() else {
                self.elapsed = self.elapsed.max(to);
                self.drained = true;
                return None;
            };
            if start > to {
                // Nothing is due by `to`; jumping there keeps every invariant because no
                // occupied slot begins at or before it.
                self.elapsed = self.elapsed.max(to);
                // Drained only if nothing begins by `elapsed` either: a `to` behind
                // `elapsed` can meet a slot stopped part way at `elapsed`, which is
                // still due there.
                self.drained = start > self.elapsed;
                return None;
            }
            self.drained = false;
            if *work == 0 {
                return None;
            }
            *work -= 1;
            self.elapsed = start;
            let id = self.levels[level].heads[d as usize];
            let node = self.nodes[id as usize];
            self.unlink(id, node);
            if node.deadline <= self.elapsed {
                self.len -= 1;
                return Some(id);
            }
            // Cascade: relative to the new `elapsed` it belongs on a lower level.
            self.link(id);
        }
    }

    /// The occupied slot that begins first: `(level, digit, start)`. A slot that began
    /// before `elapsed` (a higher-level slot being cascaded bit by bit) counts as starting
    /// at `elapsed`.
    fn next_slot(&self) -> Option<(usize, u32, u64)> {
        let mut best: Option<(usize, u32, u64)> = None;
        for (level, l) in self.levels.iter().enumerate() {
            if l.occupied == 0 {
                continue;
            }
            let current = digit(self.elapsed, level);
            let ahead = l.occupied & (u64::MAX << current);
            debug_assert_eq!(ahead, l.occupied, "an occupied slot lies behind elapsed");
            let d = ahead.trailing_zeros();
            let start = slot_start(self.elapsed, level, d).max(self.elapsed);
            if best.is_none_or(|(_, _, s)| start < s) {
                best = Some((level, d, start));
            }
        }
        best
    }

    fn link(&mut self, id: u32) {
        let deadline = self.nodes[id as usize].deadline;
        // An item already due waits in level 0 at the current slot.
        let at = deadline.max(self.elapsed);
        let level = level_for(self.elapsed, at);
        let d = digit(at, level);
        let l = &mut self.levels[level];
        let head = l.heads[d as usize];
        l.heads[d as usize] = id;
        l.occupied |= 1 << d;
        if head != NIL {
            self.nodes[head as usize].prev = id;
        }
        let node = &mut self.nodes[id as usize];
        node.prev = slot_marker(level, d);
        node.next = head;
    }

    fn unlink(&mut self, id: u32, node: Node<P>) {
        if node.prev >= SLOT_BASE {
            // The head of its slot's list; its successor, if any, becomes the head.
            let slot = (node.prev - SLOT_BASE) as usize;
            let l = &mut self.levels[slot / SLOTS];
            l.heads[slot % SLOTS] = node.next;
            if node.next == NIL {
                l.occupied &= !(1 << (slot % SLOTS));
            }
        } else {
            self.nodes[node.prev as usize].next = node.next;
        }
        if node.next != NIL {
            self.nodes[node.next as usize].prev = node.prev;
        }
        let n = &mut self.nodes[id as usize];
        (n.prev, n.next) = (NIL, NIL);
    }

    /// Whether `id` is scheduled, and for when.
    pub(crate) fn deadline(&self, id: u32) -> Option<u64> {
        self.nodes.get(id as usize).filter(|n| n.is_scheduled()).map(|n| n.deadline)
    }

    /// Re-walks every slot and panics if a list, a count or a placement is wrong.
    pub(crate) fn validate(&self) {
        let mut seen = 0;
        for (level, l) in self.levels.iter().enumerate() {
            for d in 0..SLOTS {
                let mut id = l.heads[d];
                assert_eq!(id != NIL, l.occupied & (1 << d) != 0, "occupancy bit of {level}/{d}");
                let mut prev = slot_marker(level, d as u32);
                while id != NIL {
                    let n = self.nodes[id as usize];
                    assert_eq!(n.prev, prev, "broken back link at {id}");
                    let at = n.deadline.max(self.elapsed);
                    // On its own level, or still in the slot being cascaded: a bounded
                    // poll may stop part way through moving a higher slot's nodes down
                    // (`next_slot` then treats that slot as starting at `elapsed`).
                    let natural = level_for(self.elapsed, at);
                    let cascading = natural < level && d as u32 == digit(self.elapsed, level);
                    assert!(natural == level || cascading, "node {id} on the wrong level");
                    seen += 1;
                    prev = id;
                    id = n.next;
                }
            }
        }
        assert_eq!(seen, self.len, "wheel length drifted");
        if self.drained {
            for (level, l) in self.levels.iter().enumerate() {
                let mut occupied = l.occupied;
                if level == 0 {
                    occupied &= !(1 << digit(self.elapsed, 0));
                }
                while occupied != 0 {
                    let d = occupied.trailing_zeros();
                    occupied &= occupied - 1;
                    assert!(
                        slot_start(self.elapsed, level, d) > self.elapsed,
                        "drained, yet slot {level}/{d} begins by elapsed"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(w: &mut Wheel, to: u64) -> Vec<u32> {
        let mut out = Vec::new();
        let mut work = usize::MAX;
        while let Some(id) = w.poll(to, &mut work) {
            out.push(id);
        }
        w.validate();
        out.sort();
        out
    }

    #[test]
    fn level_for_every_level_boundary() {
        assert_eq!(level_for(0, 0), 0);
        assert_eq!(level_for(0, 63), 0);
        for level in 1..NUM_LEVELS {
            let first = 1u64 << (level as u32 * BITS_PER_LEVEL);
            assert_eq!(level_for(0, first), level, "first tick of level {level}");
            assert_eq!(level_for(0, first - 1), level - 1, "last tick below level {level}");
        }
        assert_eq!(level_for(0, u64::MAX), NUM_LEVELS - 1);
        // Only the differing digits matter, not the distance.
        assert_eq!(level_for(63, 64), 1);
        assert_eq!(level_for(64, 127), 0);
    }

    #[test]
    fn every_slot_of_level_zero_fires_at_its_tick() {
        for t in 0..64u64 {
            let mut w = Wheel::new(0);
            w.schedule(7, t);
            if t > 0 {
                assert_eq!(drain(&mut w, t - 1), Vec::<u32>::new(), "fired early at {t}");
            }
            assert_eq!(drain(&mut w, t), vec![7]);
        }
    }

    #[test]
    fn items_on_every_level_fire_never_early_never_lost() {
        for level in 0..NUM_LEVELS {
            for offset in [0u64, 1, 63] {
                let t = (1u64 << (level as u32 * BITS_PER_LEVEL)).saturating_add(offset);
                let mut w = Wheel::new(0);
                w.schedule(1, t);
                assert!(drain(&mut w, t - 1).is_empty(), "level {level} +{offset} fired early");
                assert_eq!(drain(&mut w, t), vec![1], "level {level} +{offset} lost");
                assert_eq!(w.len(), 0);
            }
        }
    }

    #[test]
    fn a_jump_of_hours_hands_back_everything_due_and_nothing_else() {
        let mut w = Wheel::new(0);
        // Millisecond ticks: deadlines spread over 12 hours.
        for i in 0..1000u32 {
            w.schedule(i, u64::from(i) * 43_200);
        }
        let six_hours = 6 * 3600 * 1000;
        let fired = drain(&mut w, six_hours);
        let expected: Vec<u32> =
            (0..1000).filter(|&i| u64::from(i) * 43_200 <= six_hours).collect();
        assert_eq!(fired, expected);
        assert_eq!(w.len(), 1000 - expected.len());
    }

    #[test]
    fn reschedule_moves_the_item_and_leaves_no_stale_copy() {
        let mut w = Wheel::new(0);
        w.schedule(3, 10);
        w.schedule(3, 5000);
        assert_eq!(w.len(), 1);
        assert!(drain(&mut w, 4999).is_empty(), "the old deadline must not fire");
        assert_eq!(drain(&mut w, 5000), vec![3]);
        w.schedule(4, 6000);
        w.schedule(4, 5001);
        assert_eq!(drain(&mut w, 5001), vec![4]);
        assert!(drain(&mut w, 10_000).is_empty(), "a stale later copy must not fire");
    }

    #[test]
    fn cancel_is_exact() {
        let mut w = Wheel::new(0);
        w.schedule(1, 100);
        w.schedule(2, 100);
        assert!(w.cancel(1));
        assert!(!w.cancel(1));
        assert!(!w.cancel(99));
        assert_eq!(drain(&mut w, 100), vec![2]);
    }

    /// Four items due at 64 and a poll to 64 that runs out of `work` inside their
    /// level-1 slot, which begins at the current tick: the wheel, and what it handed back.
    fn stopped_cascade(work: usize) -> (Wheel, Vec<u32>) {
        let mut w = Wheel::new(0);
        for id in 0..4 {
            w.schedule(id, 64);
        }
        let mut budget = work;
        let fired: Vec<u32> = std::iter::from_fn(|| w.poll(64, &mut budget)).collect();
        assert_eq!(budget, 0, "work ran out part way");
        assert_eq!(fired.len(), work, "one item a unit of work");
        w.validate();
        (w, fired)
    }

    /// A poll stopped inside a cascade at the current tick leaves the rest of it due:
    /// the next poll at the same tick (the one a shortcut could skip) hands it back.
    #[test]
    fn a_poll_stopped_at_the_current_tick_leaves_the_rest_due() {
        for work in [1, 2] {
            let (mut w, mut fired) = stopped_cascade(work);
            fired.extend(drain(&mut w, 64));
            fired.sort();
            assert_eq!(fired, [0, 1, 2, 3], "work {work}");
            // Drained: a poll at the same tick finds nothing, and a new item due now fires.
            assert_eq!(drain(&mut w, 64), Vec::<u32>::new());
            w.schedule(9, 10);
            assert_eq!(drain(&mut w, 64), [9]);
        }
    }

    /// Then a poll to a tick behind `elapsed`, with work or none, which finds nothing due
    /// by its `to` (and once marked the wheel drained for it: `validate` in `drain`
    /// refuses that), then a full poll at `elapsed`: every item due there comes back
    /// (with the mark, one of four did).
    #[test]
    fn a_poll_behind_elapsed_after_a_stopped_cascade_keeps_what_is_due() {
        for (behind, work) in [(10, usize::MAX), (63, 0)] {
            let (mut w, mut fired) = stopped_cascade(1);
            let mut budget = work;
            assert_eq!(w.poll(behind, &mut budget), None);
            w.validate();
            fired.extend(drain(&mut w, 64));
            fired.sort();
            assert_eq!(fired, [0, 1, 2, 3], "after a poll to {behind} with work {work}");
        }
    }

    /// `validate` refuses the state the shortcut must never be in: marked drained while
    /// a slot stopped part way at `elapsed` is still due.
    #[test]
    fn validate_refuses_a_drained_mark_over_a_slot_still_due() {
        let (mut w, _) = stopped_cascade(1);
        w.drained = true;
        let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.validate()));
        assert!(refused.is_err(), "validate accepted a drained mark over a due slot");
    }

    #[test]
    fn past_deadlines_fire_on_the_next_poll() {
        let mut w = Wheel::new(1000);
        w.schedule(1, 10);
        assert_eq!(w.deadline(1), Some(10));
        assert_eq!(drain(&mut w, 1000), vec![1]);
    }

    #[test]
    fn work_bounds_each_poll_and_nothing_is_lost_across_calls() {
        let mut w: Wheel = Wheel::new(0);
        for i in 0..100 {
            w.schedule(i, 5000 + u64::from(i));
        }
        let mut fired = Vec::new();
        let mut calls = 0;
        loop {
            let mut work = 3;
            let before = fired.len();
            while let Some(id) = w.poll(1_000_000, &mut work) {
                fired.push(id);
            }
            calls += 1;
            assert!(fired.len() - before <= 3);
            if work > 0 {
                break;
            }
        }
        fired.sort();
        assert_eq!(fired, (0..100).collect::<Vec<_>>());
        assert!(calls > 30, "work was not bounded: {calls} calls");
        w.validate();
    }

    mod model {
        use std::collections::BTreeMap;

        use proptest::prelude::*;

        use super::super::*;

        #[derive(Debug, Clone)]
        enum Op {
            Schedule(u32, u64),
            Cancel(u32),
            /// Advance by this many ticks, polling with this much work per call until done.
            Advance(u64, usize),
            /// One poll at the current tick with this much work: may stop part way.
            PollOnce(usize),
        }

        fn op() -> impl Strategy<Value = Op> {
            // Deadlines near and far (up to the top level), steps small and huge.
            let delta = prop_oneof![0u64..200, 0u64..100_000, any::<u64>()];
            prop_oneof![
                4 => (0u32..16, delta).prop_map(|(id, d)| Op::Schedule(id, d)),
                1 => (0u32..16).prop_map(Op::Cancel),
                3 => (prop_oneof![0u64..100, 0u64..1_000_000, any::<u64>()], 1usize..8)
                    .prop_map(|(step, work)| Op::Advance(step, work)),
                2 => (0usize..4).prop_map(Op::PollOnce),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

            /// Every scheduled item fires exactly once, at the first advance that reaches
            /// its deadline, unless cancelled; against a BTreeMap of id → deadline.
            #[test]
            fn wheel_agrees_with_a_btreemap(start in 0u64..1_000_000, ops in proptest::collection::vec(op(), 1..60)) {
                let mut wheel: Wheel = Wheel::new(start);
                let mut now = start;
                let mut reference: BTreeMap<u32, u64> = BTreeMap::new();
                for op in ops {
                    match op {
                        Op::Schedule(id, delta) => {
                            let deadline = now.saturating_add(delta);
                            wheel.schedule(id, deadline);
                            reference.insert(id, deadline);
                        }
                        Op::Cancel(id) => {
                            prop_assert_eq!(wheel.cancel(id), reference.remove(&id).is_some());
                        }
                        Op::PollOnce(work) => {
                            let mut budget = work;
                            while let Some(id) = wheel.poll(now, &mut budget) {
                                let due = reference.remove(&id);
                                prop_assert!(due.is_some_and(|d| d <= now), "{} fired early or twice at {}", id, now);
                            }
                        }
                        Op::Advance(step, work) => {
                            now = now.saturating_add(step);
                            let mut fired = Vec::new();
                            loop {
                                let mut budget = work;
                                while let Some(id) = wheel.poll(now, &mut budget) {
                                    fired.push(id);
                                }
                                if budget > 0 {
                                    break;
                                }
                            }
                            fired.sort();
                            let due: Vec<u32> = reference.iter().filter(|(_, &d)| d <= now).map(|(&id, _)| id).collect();
                            prop_assert_eq!(&fired, &due, "at tick {}", now);
                            reference.retain(|_, d| *d > now);
                        }
                    }
                    wheel.validate();
                    prop_assert_eq!(wheel.len(), reference.len());
                }
            }
        }
    }
}

/// A second model, written to break the `drained` shortcut: `to` may go below the
/// highest tick polled (which a shard's clock never does, but the wheel must not
/// depend on), ticks biased to level boundaries, polls of 0 to 4 work that stop part
/// way.
#[cfg(test)]
mod model_any_to {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        /// Schedule at an absolute-ish deadline chosen relative to `hi` or a boundary.
        Schedule(u32, Dl),
        Cancel(u32),
        /// Poll to this tick, with this much work per call; `full`: repeat until done.
        Poll(To, usize, bool),
    }

    #[derive(Debug, Clone)]
    enum Dl {
        Rel(i64),
        Boundary(u32, i64),
        Abs(u64),
    }

    #[derive(Debug, Clone)]
    enum To {
        /// Relative to the highest tick polled so far.
        Rel(i64),
        Boundary(u32, i64),
        Abs(u64),
    }

    fn boundary(hi: u64, level: u32, off: i64) -> u64 {
        // The next multiple of 64^level at or after hi, plus an offset.
        let shift = (level * BITS_PER_LEVEL).min(63);
        let unit = 1u64 << shift;
        let b = (hi | (unit - 1)).saturating_add(1);
        b.saturating_add_signed(off)
    }

    fn resolve_dl(hi: u64, d: &Dl) -> u64 {
        match *d {
            Dl::Rel(r) => hi.saturating_add_signed(r),
            Dl::Boundary(l, off) => boundary(hi, l, off),
            Dl::Abs(a) => a,
        }
    }

    fn resolve_to(hi: u64, t: &To) -> u64 {
        match *t {
            To::Rel(r) => hi.saturating_add_signed(r),
            To::Boundary(l, off) => boundary(hi, l, off),
            To::Abs(a) => a,
        }
    }

    fn op(monotone: bool) -> impl Strategy<Value = Op> {
        let dl = prop_oneof![
            4 => (-3i64..70).prop_map(Dl::Rel),
            3 => (0u32..11, -2i64..3).prop_map(|(l, o)| Dl::Boundary(l, o)),
            1 => (-100_000i64..100_000).prop_map(Dl::Rel),
            1 => any::<u64>().prop_map(Dl::Abs),
            1 => prop_oneof![Just(0u64), Just(u64::MAX), Just(u64::MAX - 1)].prop_map(Dl::Abs),
        ];
        let to = if monotone {
            prop_oneof![
                6 => (0i64..3).prop_map(To::Rel),
                2 => (0i64..130).prop_map(To::Rel),
                3 => (0u32..11, -1i64..2).prop_map(|(l, o)| To::Boundary(l, o)),
                1 => Just(To::Abs(u64::MAX)),
            ]
            .boxed()
        } else {
            prop_oneof![
                6 => (-3i64..3).prop_map(To::Rel),
                2 => (-130i64..130).prop_map(To::Rel),
                3 => (0u32..11, -2i64..2).prop_map(|(l, o)| To::Boundary(l, o)),
                1 => any::<u64>().prop_map(To::Abs),
                1 => prop_oneof![Just(0u64), Just(u64::MAX)].prop_map(To::Abs),
            ]
            .boxed()
        };
        prop_oneof![
            5 => (0u32..12, dl).prop_map(|(id, d)| Op::Schedule(id, d)),
            1 => (0u32..12).prop_map(Op::Cancel),
            6 => (to, 0usize..5, any::<bool>()).prop_map(|(t, w, f)| Op::Poll(t, w, f)),
        ]
    }

    /// The model: `hi` is the highest tick polled so far (the wheel's `elapsed` never
    /// exceeds it). An item scheduled when `hi` was `h` is due, at the latest, at
    /// `max(deadline, h)`. Checks: an item handed back is scheduled, and its deadline is
    /// at or before the poll's `to` (never early, never twice); a completed poll to `to`
    /// leaves nothing scheduled whose `max(deadline, hi at schedule)` is at or before
    /// `to`; `validate` after every op. In the monotone model (`to` never decreases, as a
    /// monotonic clock's ticks), completed polls must hand back exactly the items whose
    /// deadline is at or before `to`.
    fn run(start: u64, ops: Vec<Op>, monotone: bool) -> Result<(), TestCaseError> {
        let mut wheel: Wheel = Wheel::new(start);
        let mut hi = start;
        // id -> (deadline, due at the latest)
        let mut reference: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Schedule(id, d) => {
                    let deadline = resolve_dl(hi, &d);
                    wheel.schedule(id, deadline);
                    reference.insert(id, (deadline, deadline.max(hi)));
                }
                Op::Cancel(id) => {
                    prop_assert_eq!(wheel.cancel(id), reference.remove(&id).is_some());
                }
                Op::Poll(t, work, full) => {
                    let mut to = resolve_to(hi, &t);
                    if monotone {
                        to = to.max(hi);
                        prop_assert!(to >= hi);
                    }
                    let mut done = false;
                    let mut rounds = 0;
                    loop {
                        let mut budget = if full { work.max(1) } else { work };
                        while let Some(id) = wheel.poll(to, &mut budget) {
                            let due = reference.remove(&id);
                            prop_assert!(
                                due.is_some_and(|(d, _)| d <= to),
                                "op {}: {} fired early or twice at {} ({:?})",
                                i,
                                id,
                                to,
                                due
                            );
                        }
                        if budget > 0 {
                            done = true;
                        }
                        rounds += 1;
                        if !full || done || rounds > 100_000 {
                            break;
                        }
                    }
                    hi = hi.max(to);
                    if done {
                        let late: Vec<_> = reference
                            .iter()
                            .filter(|(_, &(d, l))| if monotone { d <= to } else { l <= to })
                            .collect();
                        prop_assert!(
                            late.is_empty(),
                            "op {}: a completed poll to {} left {:?}",
                            i,
                            to,
                            late
                        );
                    }
                }
            }
            wheel.validate();
            prop_assert_eq!(wheel.len(), reference.len());
        }
        Ok(())
    }

    fn start() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            0u64..1_000_000,
            (0u32..11, -1i64..2).prop_map(|(l, o)| boundary(0, l, o)),
            any::<u64>().prop_map(|x| x >> 4),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 2000,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn ticks_that_never_go_back(start in start(), ops in proptest::collection::vec(op(true), 1..80)) {
            run(start, ops, true)?;
        }

        #[test]
        fn ticks_that_may_go_back(start in start(), ops in proptest::collection::vec(op(false), 1..80)) {
            run(start, ops, false)?;
        }
    }
}
