//! Records read for inspection, by tools and operators: [`Record`], its
//! [`RecordState`], the [`RecordFilter`] that [`Store::records`](super::Store::records)
//! selects with, and, for store authors, [`StoredRecord`] and [`judge`], which read a
//! stored row as every store must read it.
//!
//! Invariant: a record is read as a claim of the store's handle would find it at the
//! store's now, one judgement shared by every store ([`judge`]): an expired record, or a
//! lapsed lease a claim would take over (`LapsePolicy::TakeOver`), is absent; under
//! `LapsePolicy::MarkUnknown` a lease that lapsed less than the unknown TTL ago is
//! UNKNOWN, marked at the lease's end (as `list_unknown` lists it). A row that does not
//! read (a state out of range, a fingerprint of another length, key bytes that are not
//! a key) is [`StoreError::Corrupt`], never skipped and never a panic.

use std::time::SystemTime;

use bytes::Bytes;

use super::encoding::{corrupt, fingerprint, from_micros, key};
use super::StoreError;
use crate::{CorrelationId, FencingToken, Fingerprint, Key};

/// A record's state, as a claim would find it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RecordState {
    /// Executing: its lease is live.
    Processing,
    /// Completed: repeats replay its body.
    Completed,
    /// The outcome is unknown: marked so, or (under `LapsePolicy::MarkUnknown`) its
    /// lease lapsed while it executed.
    Unknown,
}

impl RecordState {
    /// Every state, in the order of the lifecycle.
    pub const ALL: [RecordState; 3] =
        [RecordState::Processing, RecordState::Completed, RecordState::Unknown];

    /// The state's name as the docs write it: `PROCESSING`, `COMPLETED`, `UNKNOWN`.
    pub fn name(self) -> &'static str {
        match self {
            RecordState::Processing => "PROCESSING",
            RecordState::Completed => "COMPLETED",
            RecordState::Unknown => "UNKNOWN",
        }
    }

    /// The `state` column's number for it (1, 2, 3), as every SQL store keeps it; also
    /// the bit `1 << code` of a [`RecordFilter::state_mask`].
    pub fn code(self) -> i16 {
        match self {
            RecordState::Processing => 1,
            RecordState::Completed => 2,
            RecordState::Unknown => 3,
        }
    }
}

/// One live record, as [`Store::record`](super::Store::record) and
/// [`Store::records`](super::Store::records) read it (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Record {
    /// The record's key.
    pub key: Key,
    /// The request it was claimed for.
    pub fingerprint: Fingerprint,
    /// What a claim would find.
    pub state: RecordState,
    /// The fencing token of the claim that made it.
    pub token: FencingToken,
    /// When that claim was made.
    pub started_at: SystemTime,
    /// When it completed or was marked unknown (for a lapsed lease: the lease's end);
    /// `None` while PROCESSING.
    pub settled_at: Option<SystemTime>,
    /// When the lease ends (PROCESSING) or the record expires (otherwise).
    pub expires_at: SystemTime,
    /// The completed result's body (`None`: none, or kept without one).
    pub body: Option<Bytes>,
    /// Under `MarkUnknown`: an UNKNOWN record that is a lease which lapsed while it
    /// executed (its owner crashed or hung), not yet turned so by a claim.
    pub lapsed: bool,
    /// The correlation id the claim that made it was given
    /// ([`Store::claim_correlated`](super::Store::claim_correlated)): what joins the record
    /// to that request's logs and trace. `None`: it was given none.
    pub correlation_id: Option<CorrelationId>,
}

/// Which records [`Store::records`](super::Store::records) lists: any combination of
/// states, a scope, a tenant (or none) and a client key. The default selects every live
/// record; each setting narrows it.
///
/// ```
/// use idemcache::store::{RecordFilter, RecordState};
///
/// // "The customer gave me this key": every record with it, whatever its scope and tenant.
/// let theirs = RecordFilter::new().client_key("8e03978e");
/// // The UNKNOWN and PROCESSING records of one tenant of one operation.
/// let stuck = RecordFilter::new()
///     .state(RecordState::Unknown)
///     .state(RecordState::Processing)
///     .scope("POST /v1/orders")
///     .tenant("user:42");
/// # let _ = (theirs, stuck);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordFilter {
    states: Vec<RecordState>,
    scope: Option<String>,
    tenant: Option<Option<String>>,
    client_key: Option<String>,
}

impl RecordFilter {
    /// Every live record.
    pub fn new() -> RecordFilter {
        RecordFilter::default()
    }

    /// Records in `state` too: the first call selects only that state, each further one
    /// adds a state (none given: every state).
    pub fn state(mut self, state: RecordState) -> RecordFilter {
        if !self.states.contains(&state) {
            self.states.push(state);
        }
        self
    }

    /// Only records of `scope` (the operation, e.g. `"POST /v1/orders"`).
    pub fn scope(mut self, scope: impl Into<String>) -> RecordFilter {
        self.scope = Some(scope.into());
        self
    }

    /// Only records of `tenant`.
    pub fn tenant(mut self, tenant: impl Into<String>) -> RecordFilter {
        self.tenant = Some(Some(tenant.into()));
        self
    }

    /// Only records without a tenant (keys made by [`Key::without_tenant`]).
    pub fn without_tenant(mut self) -> RecordFilter {
        self.tenant = Some(None);
        self
    }

    /// Only records whose client key (the `Idempotency-Key` a client sent) is
    /// `client_key`.
    pub fn client_key(mut self, client_key: impl Into<String>) -> RecordFilter {
        self.client_key = Some(client_key.into());
        self
    }

    /// The states selected (empty: every state).
    pub fn states(&self) -> &[RecordState] {
        &self.states
    }

    /// Whether `record` is selected.
    pub fn matches(&self, record: &Record) -> bool {
        (self.states.is_empty() || self.states.contains(&record.state))
            && self.matches_key(&record.key)
    }

    /// Whether a record of `key` is selected, whatever its state.
    pub fn matches_key(&self, key: &Key) -> bool {
        self.scope.as_deref().is_none_or(|s| s == key.scope())
            && self.tenant.as_ref().is_none_or(|t| t.as_deref() == key.tenant())
            && self.client_key.as_deref().is_none_or(|c| c == key.client_key())
    }

    /// For store authors: the bits `1 << code` ([`RecordState::code`]) of the states
    /// selected, every state's when none is given; bit 0 and bit 4 are never set (a
    /// store's statement may judge a dead row 0; it must hand a row of an unknown state
    /// to [`judge`], which names it corrupt).
    pub fn state_mask(&self) -> i32 {
        let states: &[RecordState] =
            if self.states.is_empty() { &RecordState::ALL } else { &self.states };
        states.iter().fold(0, |mask, s| mask | 1 << s.code())
    }

    /// For store authors: the bytes every selected record's stored key
    /// ([`Key::as_bytes`]) starts with, when the filter names a scope (and a tenant):
    /// the selected records are one range of keys, so a store ordered by key reads that
    /// range only. `None` when no scope is given (a tenant alone is not a prefix).
    pub fn key_prefix(&self) -> Option<Vec<u8>> {
        let scope = self.scope.as_deref()?;
        // A key of these parts with a one-byte client key ends with its length (1) and
        // that byte: what is before them is the prefix of every key with these parts.
        let (key, tail) = match &self.tenant {
            Some(Some(tenant)) => (Key::new(scope, tenant, "x"), 2),
            // Without the tenant's tag: keys with any tenant, or none, share the scope's.
            None => (Key::without_tenant(scope, "x"), 3),
            Some(None) => (Key::without_tenant(scope, "x"), 2),
        };
        // A scope no key can have (empty, too long) selects nothing: a prefix no stored
        // key has (a scope length of 0) says so to the store.
        let Ok(key) = key else { return Some(vec![0, 0, 0xff]) };
        let bytes = key.as_bytes();
        Some(bytes[..bytes.len() - tail].to_vec())
    }

    /// For store authors: the bytes every selected record's stored key ends with, when
    /// the filter names a client key (its length byte and the key's bytes); a suffix
    /// that may also match keys not selected (a tenant ending in the same bytes), so a
    /// store filters with it first and with [`matches`](RecordFilter::matches) last.
    pub fn key_suffix(&self) -> Option<Vec<u8>> {
        let client_key = self.client_key.as_deref()?;
        let mut suffix = Vec::with_capacity(client_key.len() + 1);
        suffix.push(u8::try_from(client_key.len()).unwrap_or(u8::MAX));
        suffix.extend_from_slice(client_key.as_bytes());
        Some(suffix)
    }
}

/// The first byte string after every string that starts with `prefix`: the end
/// (exclusive) of `prefix`'s range of keys, or `None` if it has none (all `0xff`).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// For store authors: a record's columns as stored, before they are judged. Times in
/// microseconds since the Unix epoch on the store's clock, `state` 1 PROCESSING, 2
/// COMPLETED, 3 UNKNOWN (as every SQL store keeps them; Redis's hash fields read the
/// same), `expires_at` the lease's end while PROCESSING.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredRecord {
    /// The stored key ([`Key::as_bytes`]).
    pub key: Vec<u8>,
    /// The stored fingerprint (`None`: missing, which is corrupt).
    pub fingerprint: Option<Vec<u8>>,
    /// The state column.
    pub state: i64,
    /// The token column.
    pub token: i64,
    /// The body.
    pub body: Option<Vec<u8>>,
    /// When it was claimed (`None`: missing, which is corrupt).
    pub started_at: Option<i64>,
    /// When it was completed or marked.
    pub settled_at: Option<i64>,
    /// The lease's end while PROCESSING, the TTL's after.
    pub expires_at: i64,
    /// The claim's correlation id (`None`: none).
    pub correlation_id: Option<String>,
}

/// Judges `stored` at the store's `now` (µs) under the lapse TTL `lapse_ttl` (µs, 0
/// under `TakeOver`: [`lapse_ttl_micros`](super::encoding::lapse_ttl_micros)): the
/// record a claim would find, or `None` if a claim would find the key absent (see the
/// module docs). A store's statements that select or delete by state judge as this
/// does: PROCESSING while `expires_at > now`; else UNKNOWN while
/// `expires_at + lapse_ttl > now` (never under `TakeOver`); COMPLETED and UNKNOWN while
/// `expires_at > now`.
pub fn judge(stored: StoredRecord, now: i64, lapse_ttl: i64) -> Result<Option<Record>, StoreError> {
    const PROCESSING: i64 = 1;
    const COMPLETED: i64 = 2;
    const UNKNOWN: i64 = 3;
    let (state, settled_at, expires_at, lapsed) = match stored.state {
        PROCESSING if stored.expires_at > now => {
            (RecordState::Processing, None, stored.expires_at, false)
        }
        PROCESSING if stored.expires_at.saturating_add(lapse_ttl) > now => (
            RecordState::Unknown,
            Some(stored.expires_at),
            stored.expires_at.saturating_add(lapse_ttl),
            true,
        ),
        PROCESSING => return Ok(None),
        COMPLETED | UNKNOWN if stored.expires_at <= now => return Ok(None),
        COMPLETED => (RecordState::Completed, stored.settled_at, stored.expires_at, false),
        UNKNOWN => {
            let marked = stored.settled_at.ok_or_else(|| {
                corrupt(&stored.key, "it is UNKNOWN without a mark time (settled_at)")
            })?;
            (RecordState::Unknown, Some(marked), stored.expires_at, false)
        }
        other => return Err(corrupt(&stored.key, format_args!("its state is {other}"))),
    };
    let token = u64::try_from(stored.token)
        .map_err(|_| corrupt(&stored.key, format_args!("its token is {}", stored.token)))?;
    let fp = stored
        .fingerprint
        .as_deref()
        .ok_or_else(|| corrupt(&stored.key, "it has no fingerprint"))?;
    let started_at =
        stored.started_at.ok_or_else(|| corrupt(&stored.key, "it has no claim time"))?;
    let correlation_id = match stored.correlation_id.as_deref() {
        None => None,
        Some(id) => Some(
            CorrelationId::new(id)
                .map_err(|e| corrupt(&stored.key, format_args!("its correlation id: {e}")))?,
        ),
    };
    Ok(Some(Record {
        key: key(&stored.key)?,
        fingerprint: fingerprint(fp).map_err(|e| corrupt(&stored.key, e))?,
        state,
        token: FencingToken::new(token),
        started_at: from_micros(started_at),
        settled_at: settled_at.map(from_micros),
        expires_at: from_micros(expires_at),
        body: stored.body.map(Bytes::from),
        lapsed,
        correlation_id,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(key: &Key, state: i64, expires_at: i64) -> StoredRecord {
        StoredRecord {
            key: key.as_bytes().to_vec(),
            fingerprint: Some(Fingerprint::of(b"r").to_bytes().to_vec()),
            state,
            token: 7,
            body: None,
            started_at: Some(1),
            settled_at: (state != 1).then_some(5),
            expires_at,
            correlation_id: None,
        }
    }

    #[test]
    fn a_stored_row_is_judged_as_a_claim_would_find_it() {
        let k = Key::new("POST /x", "t", "k-1").unwrap();
        let judged = |s, exp, lapse| judge(stored(&k, s, exp), 100, lapse).unwrap();
        assert_eq!(judged(1, 101, 0).unwrap().state, RecordState::Processing);
        assert!(judged(1, 100, 0).is_none(), "a lapse under TakeOver is absent");
        let lapsed = judged(1, 100, 50).unwrap();
        assert_eq!((lapsed.state, lapsed.lapsed), (RecordState::Unknown, true));
        assert_eq!(lapsed.settled_at, Some(from_micros(100)));
        assert_eq!(lapsed.expires_at, from_micros(150));
        assert!(judged(1, 50, 50).is_none(), "the lapse's mark expired too");
        assert_eq!(judged(2, 101, 0).unwrap().state, RecordState::Completed);
        assert_eq!(judged(3, 101, 0).unwrap().state, RecordState::Unknown);
        assert!(judged(2, 100, 0).is_none() && judged(3, 99, 50).is_none());
        for bad in [stored(&k, 9, 101), StoredRecord { token: -1, ..stored(&k, 2, 101) }] {
            let Err(StoreError::Corrupt(why)) = judge(bad, 100, 0) else { panic!() };
            assert!(why.contains("k-1"), "{why}");
        }
        let with_id =
            |id: &str| StoredRecord { correlation_id: Some(id.into()), ..stored(&k, 2, 101) };
        let kept = judge(with_id("req-7"), 100, 0).unwrap().unwrap();
        assert_eq!(kept.correlation_id.unwrap().as_str(), "req-7");
        let Err(StoreError::Corrupt(why)) = judge(with_id("two words"), 100, 0) else { panic!() };
        assert!(why.contains("k-1") && why.contains("correlation id"), "{why}");
        let foreign = StoredRecord { key: vec![0xff, 0x01], ..stored(&k, 2, 101) };
        let Err(StoreError::Corrupt(why)) = judge(foreign, 100, 0) else { panic!() };
        assert!(why.contains("ff01"), "{why}");
    }

    #[test]
    fn a_filter_selects_by_any_combination_and_names_its_key_range() {
        let k = Key::new("POST /x", "t", "k-1").unwrap();
        let other = Key::without_tenant("POST /y", "k-1").unwrap();
        let record = |key: &Key| judge(stored(key, 2, 101), 100, 0).unwrap().unwrap();
        let everything = RecordFilter::new();
        assert!(everything.matches(&record(&k)) && everything.matches(&record(&other)));
        assert_eq!(everything.state_mask(), 0b1110);
        let by_key = RecordFilter::new().client_key("k-1");
        assert!(by_key.matches(&record(&k)) && by_key.matches(&record(&other)));
        assert!(!RecordFilter::new().client_key("k-2").matches(&record(&k)));
        assert!(!RecordFilter::new().state(RecordState::Unknown).matches(&record(&k)));
        assert!(RecordFilter::new().tenant("t").matches(&record(&k)));
        assert!(!RecordFilter::new().tenant("t").matches(&record(&other)));
        assert!(RecordFilter::new().without_tenant().matches(&record(&other)));
        assert!(RecordFilter::new().scope("POST /y").matches(&record(&other)));
        for filter in [
            RecordFilter::new().scope("POST /x"),
            RecordFilter::new().scope("POST /x").tenant("t"),
            RecordFilter::new().scope("POST /y").without_tenant(),
        ] {
            let prefix = filter.key_prefix().unwrap();
            let end = prefix_end(&prefix).unwrap();
            for key in [&k, &other] {
                let inside = key.as_bytes().starts_with(&prefix);
                assert_eq!(inside, filter.matches_key(key), "{filter:?} {key:?}");
                assert_eq!(inside, key.as_bytes() > &prefix[..] && key.as_bytes() < &end[..]);
            }
        }
        assert!(k.as_bytes().ends_with(&by_key.key_suffix().unwrap()));
        assert_eq!(prefix_end(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xff]), None);
    }
}
