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
//! Invariant: an id is in the list iff its entry is COMPLETED; links live here, in an
//! arena indexed by the same slab ids the shard uses, so `remove` is O(1).

const NIL: u32 = u32::MAX;

/// How many completed entries one eviction step removes: 10%, at least one.
pub(crate) fn batch(completed: usize) -> usize {
    (completed / 10).max(1)
}

#[derive(Debug, Clone, Copy)]
struct Links {
    prev: u32,
    next: u32,
    linked: bool,
}

/// Bytes of age-list bookkeeping per slab id.
pub(crate) const LINKS_SIZE: usize = std::mem::size_of::<Links>();

const UNLINKED: Links = Links { prev: NIL, next: NIL, linked: false };

/// A doubly linked list of slab ids, oldest first.
#[derive(Debug, Default)]
pub(crate) struct AgeList {
    links: Vec<Links>,
    head: Option<u32>,
    tail: Option<u32>,
    len: usize,
}

impl AgeList {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends `id` as the newest.
    pub(crate) fn push_back(&mut self, id: u32) {
        let i = id as usize;
        if i >= self.links.len() {
            self.links.resize(i + 1, UNLINKED);
        }
        debug_assert!(!self.links[i].linked, "id {id} is already in the age list");
        let prev = self.tail.unwrap_or(NIL);
        self.links[i] = Links { prev, next: NIL, linked: true };
        match self.tail {
            Some(t) => self.links[t as usize].next = id,
            None => self.head = Some(id),
        }
        self.tail = Some(id);
        self.len += 1;
    }

    /// Takes `id` out; returns whether it was in.
    pub(crate) fn remove(&mut self, id: u32) -> bool {
        let Some(l) = self.links.get(id as usize).copied().filter(|l| l.linked) else {
            return false;
        };
        match l.prev {
            NIL => self.head = (l.next != NIL).then_some(l.next),
            p => self.links[p as usize].next = l.next,
        }
        match l.next {
            NIL => self.tail = (l.prev != NIL).then_some(l.prev),
            n => self.links[n as usize].prev = l.prev,
        }
        self.links[id as usize] = UNLINKED;
        self.len -= 1;
        true
    }

    /// The oldest id, if any.
    pub(crate) fn front(&self) -> Option<u32> {
        self.head
    }

    /// Whether `id` is in the list.
    pub(crate) fn contains(&self, id: u32) -> bool {
        self.links.get(id as usize).is_some_and(|l| l.linked)
    }

    /// Ids from oldest to newest (for validation).
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors(self.head, |&id| {
            let next = self.links[id as usize].next;
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

    #[test]
    fn keeps_order_through_removals_anywhere() {
        let mut list = AgeList::default();
        for id in [5, 1, 9, 3] {
            list.push_back(id);
        }
        assert!(list.remove(9));
        assert!(!list.remove(9));
        assert!(list.remove(5));
        assert_eq!(list.iter().collect::<Vec<_>>(), vec![1, 3]);
        list.push_back(5);
        assert_eq!(list.front(), Some(1));
        assert!(list.remove(1) && list.remove(5) && list.remove(3));
        assert_eq!((list.len(), list.front()), (0, None));
        assert!(!list.contains(3));
    }
}
