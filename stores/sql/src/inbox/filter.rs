//! [`KnownMessages`]: the core [`Cache`] in front of the inbox's database, answering a
//! redelivery of a committed message from memory, without opening a transaction.
//!
//! Invariant: it answers only [`Receipt::Duplicate`] or [`Receipt::Mismatch`], and only
//! for a (consumer, message id) it was told was committed; anything else is `None`,
//! "ask the database". It never answers [`Receipt::New`]: a message is new only when the
//! claiming `INSERT` in the transaction that applies it says so (a cache that decided
//! "new" alone would apply a message twice after a restart, or on a second process).
//!
//! Its facts are completed entries without a body, under keys of their own scope
//! (`"idemcache inbox: <consumer>"`, tenant the message id), remembered for the cache's
//! completed-result TTL and bounded by the cache's own limits: at capacity the oldest
//! are evicted, and a forgotten fact only sends its message to the database again.

use crate::inbox::{check, Receipt};
use idemcache::{Cache, EntryState, Fingerprint, InsertError, Key, Outcome};

/// The scope prefix of the pre-filter's keys: the consumer follows it. Key parts are
/// length-prefixed, so no consumer name can make two (consumer, id) pairs share a key.
const SCOPE: &str = "idemcache inbox: ";
/// The client-key part of every pre-filter key (the message id is the tenant part,
/// which, unlike a client key, may hold any UTF-8).
const CLIENT_KEY: &str = "message";

/// Committed messages remembered in a [`Cache`], to answer their redeliveries without a
/// transaction. Cheap to clone (clones share the cache).
///
/// Give it a cache of its own (its keys are scoped, but its entries share the cache's
/// capacity and TTL): [`CacheBuilder::completed_ttl`](idemcache::CacheBuilder::completed_ttl)
/// is how long a fact is remembered, `max_entries`/`max_bytes` how many.
///
/// ```
/// use idemcache_sql::inbox::{KnownMessages, Receipt};
/// use idemcache::{Cache, Fingerprint};
///
/// let known = KnownMessages::new(Cache::builder().build()?);
/// let body = Fingerprint::of(br#"{"account":"a1","amount":5}"#);
///
/// // Unknown: ask the database (begin, receive, apply, commit).
/// assert_eq!(known.check("ledger", "m-1", body), None);
/// // ... after the commit returned Ok:
/// assert!(known.committed("ledger", "m-1", body));
///
/// // A redelivery: acknowledged without a transaction.
/// assert_eq!(known.check("ledger", "m-1", body), Some(Receipt::Duplicate));
/// assert_eq!(known.check("ledger", "m-1", Fingerprint::of(b"other")), Some(Receipt::Mismatch));
/// // Another consumer of the same message still asks its database.
/// assert_eq!(known.check("audit", "m-1", body), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct KnownMessages {
    cache: Cache,
}

impl KnownMessages {
    /// A pre-filter over `cache`.
    pub fn new(cache: Cache) -> KnownMessages {
        KnownMessages { cache }
    }

    /// The cache it remembers in.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// What the cache knows of this delivery: `Some(Duplicate)` if it was told this
    /// (consumer, message id) committed with this fingerprint, `Some(Mismatch)` if with
    /// another; `None` otherwise (never seen, forgotten, evicted, or a consumer or id the
    /// inbox refuses): ask the database. Never `Some(New)`.
    pub fn check(
        &self,
        consumer: &str,
        message_id: &str,
        fingerprint: Fingerprint,
    ) -> Option<Receipt> {
        let key = key(consumer, message_id)?;
        let entry = self.cache.peek(&key)?;
        match entry.state {
            EntryState::Completed(_) if entry.fingerprint == fingerprint => {
                Some(Receipt::Duplicate)
            }
            EntryState::Completed(_) => Some(Receipt::Mismatch),
            // Only completed facts are inserted under these keys; anything else is not
            // a committed record, so the database decides.
            _ => None,
        }
    }

    /// Remembers that (consumer, message id) is committed with `fingerprint`. Call it
    /// only after the transaction that received it committed (a `New` whose commit
    /// returned `Ok`), or after the database answered `Duplicate` (committed before);
    /// never before the commit, or a rolled-back message would be acknowledged
    /// unapplied.
    ///
    /// Returns whether the cache now holds the fact: `false` when it could not keep it
    /// (its shard full of entries it may not evict, another fact already under the key,
    /// or a consumer or id the inbox refuses), which costs only a database round trip on
    /// the next redelivery.
    pub fn committed(&self, consumer: &str, message_id: &str, fingerprint: Fingerprint) -> bool {
        let Some(key) = key(consumer, message_id) else { return false };
        let now = self.cache.now();
        let known = Outcome::Completed {
            body: None,
            completed_at: now,
            expires_at: now.saturating_add(self.cache.completed_ttl()),
        };
        match self.cache.insert(&key, fingerprint, known) {
            Ok(()) => true,
            Err(InsertError::Occupied(entry)) => {
                matches!(entry.state, EntryState::Completed(_)) && entry.fingerprint == fingerprint
            }
            Err(_) => false,
        }
    }
}

/// The pre-filter's key of (consumer, message id), or `None` for parts the inbox
/// refuses (the database will say why).
fn key(consumer: &str, message_id: &str) -> Option<Key> {
    check(consumer, message_id).ok()?;
    let mut scope = String::with_capacity(SCOPE.len() + consumer.len());
    scope.push_str(SCOPE);
    scope.push_str(consumer);
    // Within every bound `Key` checks: non-empty parts, scope and tenant at most
    // 17 + 200 + 255 bytes together, a visible-ASCII client key.
    Key::new(&scope, message_id, CLIENT_KEY).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbox::{MAX_CONSUMER_LEN, MAX_MESSAGE_ID_LEN};
    use idemcache::ManualClock;
    use std::collections::HashMap;
    use std::time::Duration;

    fn known(clock: &ManualClock, entries: usize) -> KnownMessages {
        let cache = Cache::builder()
            .clock(clock.clone())
            .completed_ttl(Duration::from_secs(60))
            .max_entries(entries)
            .shards(1)
            .build()
            .unwrap();
        KnownMessages::new(cache)
    }

    #[test]
    fn answers_only_what_it_was_told_committed_and_never_new() {
        let clock = ManualClock::new();
        let known = known(&clock, 10_000);
        let (a, b) = (Fingerprint::of(b"a"), Fingerprint::of(b"b"));
        // A model of what was committed; the pre-filter must agree with it whenever it
        // answers, and answer only for committed pairs.
        let mut model: HashMap<(String, String), Fingerprint> = HashMap::new();
        let consumers = ["ledger", "audit", "Ledger"];
        let ids = ["m-1", "m-2", "M-1", "m-1 ", "ünï"];
        for round in 0..200u32 {
            let consumer = consumers[round as usize % consumers.len()];
            let id = ids[(round as usize * 7 / 3) % ids.len()];
            let fp = if round % 5 == 0 { b } else { a };
            let answer = known.check(consumer, id, fp);
            assert_ne!(answer, Some(Receipt::New));
            let told = model.get(&(consumer.to_owned(), id.to_owned()));
            let expected =
                told.map(|t| if *t == fp { Receipt::Duplicate } else { Receipt::Mismatch });
            assert_eq!(answer, expected, "round {round}: {consumer:?} {id:?}");
            if round % 3 == 0 && told.is_none() {
                assert!(known.committed(consumer, id, fp));
                model.insert((consumer.to_owned(), id.to_owned()), fp);
            }
        }
        assert!(!model.is_empty());
    }

    #[test]
    fn a_second_committed_fact_keeps_the_first() {
        let clock = ManualClock::new();
        let known = known(&clock, 100);
        let (a, b) = (Fingerprint::of(b"a"), Fingerprint::of(b"b"));
        assert!(known.committed("ledger", "m", a));
        assert!(known.committed("ledger", "m", a), "the same fact again is held");
        assert!(!known.committed("ledger", "m", b), "another fingerprint never replaces it");
        assert_eq!(known.check("ledger", "m", a), Some(Receipt::Duplicate));
        assert_eq!(known.check("ledger", "m", b), Some(Receipt::Mismatch));
    }

    #[test]
    fn facts_are_forgotten_after_the_caches_ttl_and_at_capacity() {
        let clock = ManualClock::new();
        let known = known(&clock, 100);
        let fp = Fingerprint::of(b"a");
        assert!(known.committed("ledger", "m", fp));
        clock.advance(Duration::from_secs(59));
        assert_eq!(known.check("ledger", "m", fp), Some(Receipt::Duplicate));
        clock.advance(Duration::from_secs(1));
        assert_eq!(known.check("ledger", "m", fp), None, "expired: ask the database");
        // Bounded by the cache: far more facts than entries never fail, the oldest go.
        for i in 0..1000 {
            assert!(known.committed("ledger", &format!("m-{i}"), fp));
        }
        assert!(known.cache().stats().entries <= 100);
        assert_eq!(known.check("ledger", "m-0", fp), None);
        assert_eq!(known.check("ledger", "m-999", fp), Some(Receipt::Duplicate));
    }

    #[test]
    fn refused_parts_ask_the_database_and_the_largest_fit() {
        let clock = ManualClock::new();
        let known = known(&clock, 100);
        let fp = Fingerprint::of(b"a");
        assert!(!known.committed("", "m", fp));
        assert_eq!(known.check("", "m", fp), None);
        assert!(!known.committed("ledger", "m\0", fp));
        let (c, m) = ("c".repeat(MAX_CONSUMER_LEN), "\u{7f}".repeat(MAX_MESSAGE_ID_LEN));
        assert!(known.committed(&c, &m, fp));
        assert_eq!(known.check(&c, &m, fp), Some(Receipt::Duplicate));
    }
}
