//! The capacity policy: which entries go when a shard is full.
//!
//! Only COMPLETED entries are ever evicted: evicting PROCESSING would let a duplicate run
//! while the first is still executing, and evicting UNKNOWN would re-run an intent whose
//! effect may already have happened. [`AgeList`] keeps the completed entries of one
//! shard in completion order (the shard reads its clock under its lock, so order of
//! appends is order of completion times); a full shard evicts the oldest
//! [`batch`] of them in one step, so the cost of an eviction is paid once per tenth of
//! the shard's completed entries: amortised O(1) per insert.
//!
//! Invariant: an id is in the list iff its entry is COMPLETED. The list keeps only its
//! ends; each id's links live in a [`LinkArena`] the caller owns (the shard keeps them
//! in the timing wheel's node for the same id, beside that entry's wheel links), so
//! `remove` is O(1).

/// The `next` of the newest id, and the `prev` of an id not in the list.
const NIL: u32 = u32::MAX;
/// The `prev` of the oldest id: an id is in the list iff its `prev` is not `NIL`, which
/// spares a flag (and keeps a wheel node, which holds these links, at 24 bytes).
const FRONT: u32 = NIL - 1;

/// How many completed entries one eviction step removes: 10%, at least one.
pub(crate) fn batch(completed: usize) -> usize {
    (completed / 10).max(1)
}

/// One id's place in an [`AgeList`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct AgeLinks {
    prev: u32,
    next: u32,
}

impl Default for AgeLinks {
    fn default() -> AgeLinks {
        AgeLinks { prev: NIL, next: NIL }
    }
}

impl AgeLinks {
    fn linked(&self) -> bool {
        self.prev != NIL
    }
}

/// Where an [`AgeList`]'s links live, by id.
pub(crate) trait LinkArena {
    /// The links of `id`, created unlinked if `id` never had any.
    fn links_mut(&mut self, id: u32) -> &mut AgeLinks;
    /// The links of `id`, if it has any.
    fn links(&self, id: u32) -> Option<&AgeLinks>;
}

impl LinkArena for crate::shard::wheel::Wheel<AgeLinks> {
    fn links_mut(&mut self, id: u32) -> &mut AgeLinks {
        self.payload_mut(id)
    }
    fn links(&self, id: u32) -> Option<&AgeLinks> {
        self.payload(id)
    }
}

/// A doubly linked list of slab ids, oldest first; its links live in a [`LinkArena`].
#[derive(Debug, Default)]
pub(crate) struct AgeList {
    head: Option<u32>,
    tail: Option<u32>,
    len: usize,
}

impl AgeList {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends `id` as the newest.
    pub(crate) fn push_back(&mut self, id: u32, arena: &mut impl LinkArena) {
        debug_assert!(!arena.links_mut(id).linked(), "id {id} is already in the age list");
        debug_assert!(id < FRONT, "id {id} collides with the list's markers");
        let prev = self.tail.unwrap_or(FRONT);
        *arena.links_mut(id) = AgeLinks { prev, next: NIL };
        match self.tail {
            Some(t) => arena.links_mut(t).next = id,
            None => self.head = Some(id),
        }
        self.tail = Some(id);
        self.len += 1;
    }

    /// Takes `id` out; returns whether it was in.
    pub(crate) fn remove(&mut self, id: u32, arena: &mut impl LinkArena) -> bool {
        let Some(l) = arena.links(id).copied().filter(AgeLinks::linked) else {
            return false;
        };
        match l.prev {
            FRONT => self.head = (l.next != NIL).then_some(l.next),
            p => arena.links_mut(p).next = l.next,
        }
        match l.next {
            NIL => self.tail = (l.prev != FRONT).then_some(l.prev),
            n => arena.links_mut(n).prev = l.prev,
        }
        *arena.links_mut(id) = AgeLinks::default();
        self.len -= 1;
        true
    }

    /// The oldest id, if any.
    pub(crate) fn front(&self) -> Option<u32> {
        self.head
    }

    /// Whether `id` is in the list.
    pub(crate) fn contains(&self, id: u32, arena: &impl LinkArena) -> bool {
        arena.links(id).is_some_and(AgeLinks::linked)
    }

    /// Ids from oldest to newest (for validation).
    pub(crate) fn iter<'a>(&self, arena: &'a impl LinkArena) -> impl Iterator<Item = u32> + 'a {
        std::iter::successors(self.head, |&id| {
            let next = arena.links(id).map_or(NIL, |l| l.next);
            (next != NIL).then_some(next)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_is_a_tenth_and_at_least_one() {
        assert_eq!(batch(0), 1);
        assert_eq!(batch(9), 1);
        assert_eq!(batch(10), 1);
        assert_eq!(batch(25), 2);
        assert_eq!(batch(100_000), 10_000);
    }

    /// A plain arena for testing the list alone.
    #[derive(Default)]
    struct Arena(Vec<AgeLinks>);

    impl LinkArena for Arena {
        fn links_mut(&mut self, id: u32) -> &mut AgeLinks {
            let i = id as usize;
            if i >= self.0.len() {
                self.0.resize(i + 1, AgeLinks::default());
            }
            &mut self.0[i]
        }
        fn links(&self, id: u32) -> Option<&AgeLinks> {
            self.0.get(id as usize)
        }
    }

    #[test]
    fn keeps_order_through_removals_anywhere() {
        let (mut list, mut arena) = (AgeList::default(), Arena::default());
        for id in [5, 1, 9, 3] {
            list.push_back(id, &mut arena);
        }
        assert!(list.remove(9, &mut arena));
        assert!(!list.remove(9, &mut arena));
        assert!(list.remove(5, &mut arena));
        assert_eq!(list.iter(&arena).collect::<Vec<_>>(), vec![1, 3]);
        list.push_back(5, &mut arena);
        assert_eq!(list.front(), Some(1));
        assert!(list.remove(1, &mut arena) && list.remove(5, &mut arena));
        assert!(list.remove(3, &mut arena));
        assert_eq!((list.len(), list.front()), (0, None));
        assert!(!list.contains(3, &arena));
    }
}
