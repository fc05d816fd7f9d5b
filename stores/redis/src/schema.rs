//! Where the store keeps its records in Redis: the key layout (Redis has no schema to
//! create; see the crate docs for why it is cut this way).
//!
//! Invariant: a record is one hash at `idemcache:{<hex of the stored key>}` (the braces a
//! hash tag: one record, one slot), and the UNKNOWN index is [`INDEX_BUCKETS`] sorted
//! sets `idemcache:unknown:{0}` to `{15}`, each its own slot; a key's index members
//! always go in the one bucket [`index_key`] names.

use idemcache::store::encoding::hex;
use idemcache::Key;

/// How many buckets the UNKNOWN index is sharded into (see the module docs). Part of
/// the key layout: a member put in a bucket by a version with another count would
/// still be listed (every bucket is read) only if its bucket is among these.
pub const INDEX_BUCKETS: usize = 16;

/// The Redis keys of the UNKNOWN index, in the order listing and purging read them: the
/// buckets `idemcache:unknown:{0}` to `{15}`.
pub(crate) fn index_keys() -> impl Iterator<Item = String> {
    (0..INDEX_BUCKETS).map(|n| format!("idemcache:unknown:{{{n}}}"))
}

/// The bucket of the UNKNOWN index `key`'s members go in: FNV-1a (32 bits) of the
/// stored key's bytes, modulo [`INDEX_BUCKETS`]. Spreads the index's writes (one per
/// acquiring claim under `MarkUnknown`) over buckets, and so over a cluster's nodes.
pub(crate) fn index_key(key: &Key) -> String {
    let hash = key
        .as_bytes()
        .iter()
        .fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193));
    format!("idemcache:unknown:{{{}}}", hash as usize % INDEX_BUCKETS)
}

/// The Redis key of `key`'s record: one hash, in the slot its hash tag names.
pub(crate) fn record_key(key: &Key) -> String {
    format!("idemcache:{{{}}}", hex(key.as_bytes()))
}
