//! [`Correlations`]: the correlation ids of a shard's entries, by slot.
//!
//! Invariant: a slot has a correlation id here only while its entry is occupied, and
//! only the one its claim (or the fact inserted in its place) was given: the shard sets
//! it as the entry is inserted and takes it as the entry is unlinked, the only two
//! places a slot changes hands. A state change in place (completion, UNKNOWN, a renewed
//! lease) keeps it, as a store keeps its record's.
//!
//! Why a side table and not a field of [`Entry`](super::entry::Entry): the entry is 128
//! bytes laid out for a replay's one cache-line pair, with keys of up to 69 bytes
//! inline. A 16-byte field would cost that much key room on every entry (or a third
//! cache line); here only the entries that have an id pay, a replay never reads it, and
//! a cache whose claims carry none pays one emptiness test per unlink.

use std::collections::HashMap;

use crate::CorrelationId;

/// Bytes charged against a cache's byte bound ([`Stats::bytes`](crate::Stats::bytes))
/// for an entry's correlation id, on top of the id's length: its slot in the shard's
/// table of ids (the slot index and the id's handle) and the table's control byte,
/// counted as the key's index is in [`ENTRY_OVERHEAD`](crate::ENTRY_OVERHEAD).
pub const CORRELATION_ID_OVERHEAD: usize = std::mem::size_of::<(u32, CorrelationId)>() + 1;

/// A shard's correlation ids, by the slot of the entry they belong to.
#[derive(Debug, Default)]
pub(crate) struct Correlations {
    by_slot: HashMap<u32, CorrelationId, ahash::RandomState>,
}

impl Correlations {
    /// Gives the entry just inserted in `slot` its id.
    pub(crate) fn set(&mut self, slot: u32, id: Option<&CorrelationId>) {
        if let Some(id) = id {
            let replaced = self.by_slot.insert(slot, id.clone());
            debug_assert!(replaced.is_none(), "an unlinked slot keeps no correlation id");
        }
    }

    /// The id of the entry in `slot`.
    pub(crate) fn get(&self, slot: u32) -> Option<&CorrelationId> {
        if self.by_slot.is_empty() {
            return None;
        }
        self.by_slot.get(&slot)
    }

    /// Takes the id of the entry leaving `slot`.
    #[inline]
    pub(crate) fn take(&mut self, slot: u32) -> Option<CorrelationId> {
        if self.by_slot.is_empty() {
            return None;
        }
        self.by_slot.remove(&slot)
    }

    /// What the id of the entry in `slot` costs against the byte bound.
    pub(crate) fn charge(&self, slot: u32) -> usize {
        self.get(slot).map_or(0, charge_for)
    }

    /// Panics unless every id here belongs to an occupied slot.
    pub(crate) fn validate(&self, occupied: impl Fn(u32) -> bool) {
        for &slot in self.by_slot.keys() {
            assert!(occupied(slot), "free slot {slot} keeps a correlation id");
        }
    }
}

/// What an entry's correlation id `id` costs against the byte bound.
pub(crate) fn charge_for(id: &CorrelationId) -> usize {
    id.as_str().len() + CORRELATION_ID_OVERHEAD
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_kept_until_its_slot_is_taken_and_charged_by_its_length() {
        let mut c = Correlations::default();
        let id = CorrelationId::new("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
        c.set(3, None);
        assert_eq!((c.get(3), c.charge(3)), (None, 0));
        c.set(3, Some(&id));
        assert_eq!(c.get(3), Some(&id));
        assert_eq!(c.get(4), None);
        assert_eq!(c.charge(3), 32 + CORRELATION_ID_OVERHEAD);
        assert_eq!(c.take(4), None);
        assert_eq!(c.take(3), Some(id));
        assert_eq!((c.get(3), c.charge(3)), (None, 0));
        c.validate(|_| false);
    }

    #[test]
    #[should_panic(expected = "free slot 7")]
    fn validate_finds_an_id_left_on_a_free_slot() {
        let mut c = Correlations::default();
        c.set(7, Some(&CorrelationId::new("x").unwrap()));
        c.validate(|slot| slot != 7);
    }
}
