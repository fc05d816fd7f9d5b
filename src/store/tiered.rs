//! [`Tiered`]: the in-process [`Cache`] in front of a durable [`Store`].
//!
//! Invariants: the store is the authority and the cache only ever holds what the store
//! committed. A repeat of a key completed here is answered from memory without touching
//! the store; everything else reads through. A completion is written to the store first
//! and cached only after it committed, with a TTL no longer than the store's; a cache
//! problem never changes the durable fact; the store failing is a typed error and the
//! caller does not execute (fail closed).
//!
//! The cache also holds a claim while the store's is taken, so concurrent duplicates in
//! this process are answered "in progress" from memory instead of each asking the store.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::encoding::{check_duration, from_micros, to_micros};
use super::{Store, StoreClaim, StoreError};
use crate::{
    Cache, Claim, ClaimError, ClaimGuard, CorrelationId, FencingToken, Fingerprint, Key, Outcome,
    Replay, Timestamp,
};

/// The bytes in front of a body in the hot tier: the store's `completed_at` and
/// `expires_at` (µs since the epoch, big-endian), so a replay from memory answers the
/// store's own times without reading or converting a clock.
const TIMES: usize = 16;

/// How much shorter the hot tier keeps a result it completed than the store's TTL left:
/// the cache's clock reads the coarse monotonic clock, which lags by up to one tick (at
/// most 4 ms) at each of the two reads that time the store's answer, so without it a
/// replay could outlive the store's record by up to two ticks.
pub(crate) const CLOCK_SLACK: Duration = Duration::from_millis(10);

/// How long a committed record read from the store may be kept in a hot tier: its
/// whole TTL (`expires_at - completed_at`, the store's clock) and what is left of it
/// (the store's expiry read on this machine's clock, never more than the whole). With
/// clocks `d` apart, a record read through may outlive the store's by up to `d`,
/// bounded by its TTL.
pub(crate) fn read_through_ttl(record: &Replay<SystemTime>) -> (Duration, Duration) {
    let whole = record.expires_at.duration_since(record.completed_at).unwrap_or_default();
    let left = record.expires_at.duration_since(SystemTime::now()).unwrap_or_default();
    (whole, left.min(whole))
}

/// The lease [`Tiered::new`] takes: 10 s.
///
/// A process killed mid-execution leaves its keys PROCESSING in the store until their
/// lease ends, and a retry meanwhile is answered "in progress"; a shorter lease frees
/// them sooner and costs one store write per third of a lease that an execution runs
/// (the HTTP layer's renewal beat), none for an execution shorter than that. A renewal
/// has two thirds of the lease to land: 6.7 s here, against a worst renewal of 54 ms
/// measured on the four stores under saturating load (`benches/lease.rs`, BENCHMARKS.md).
/// A renewal also waits for a connection of the store's pool: with handlers holding
/// connections of the same pool, keep the lease at least 1.5 times the pool's wait
/// timeout (10 s covers the 5 s of a pool a store's `connect` builds). Choose a longer
/// lease when the store can stall for seconds (a Redis Cluster failover takes its
/// `cluster-node-timeout`, 15 s by default) or when an execution that claims through
/// [`Tiered`] directly runs longer than this without [`TieredGuard::extend_lease`]: a
/// lease that ends mid-execution lets a retry run the request again (under
/// [`LapsePolicy::TakeOver`](crate::LapsePolicy::TakeOver)).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// A [`Cache`] in front of a [`Store`]. Cheap to clone (the store is shared).
///
/// The cache is `Tiered`'s own: it keeps results in its own format there, so claim its
/// keys through `Tiered` only.
#[derive(Debug)]
pub struct Tiered<S> {
    cache: Cache,
    store: Arc<S>,
    lease: Duration,
    completed_ttl: Duration,
    unknown_ttl: Duration,
}

impl<S> Clone for Tiered<S> {
    fn clone(&self) -> Self {
        Tiered {
            cache: self.cache.clone(),
            store: self.store.clone(),
            lease: self.lease,
            completed_ttl: self.completed_ttl,
            unknown_ttl: self.unknown_ttl,
        }
    }
}

/// What [`Tiered::claim`] found.
#[derive(Debug)]
pub enum TieredClaim<S: Store> {
    /// Absent in the store too: execute, then [`TieredGuard::complete`].
    Acquired(TieredGuard<S>),
    /// Completed before (from memory or from the store): replay.
    Completed(Replay<SystemTime>),
    /// Executing, here or in another process.
    InProgress {
        /// When the holder's lease lapses.
        lease_ends_at: SystemTime,
    },
    /// Outcome unknown: never re-run blindly.
    Unknown {
        /// When it was marked unknown.
        marked_at: SystemTime,
    },
    /// The key was used for a different request.
    Mismatch,
}

/// Why a tiered claim failed: do not execute.
#[derive(Debug)]
#[non_exhaustive]
pub enum TieredError {
    /// The hot tier refused the claim, before the store was asked: full of entries it
    /// may not evict, or its clock out of range ([`ClaimError`] says which).
    CacheRefused(ClaimError),
    /// The store failed or refused.
    Store(StoreError),
}

impl std::fmt::Display for TieredError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TieredError::CacheRefused(e) => write!(f, "the in-process cache refused: {e}"),
            TieredError::Store(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for TieredError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TieredError::CacheRefused(e) => Some(e),
            TieredError::Store(e) => Some(e),
        }
    }
}

impl From<StoreError> for TieredError {
    fn from(e: StoreError) -> Self {
        TieredError::Store(e)
    }
}

impl<S: Store> Tiered<S> {
    /// The cache in front of `store`, with a [`DEFAULT_LEASE`] (10 s) lease and 24 h
    /// TTLs for results and unknown outcomes (the store's TTLs; the cache keeps results
    /// no longer).
    pub fn new(cache: Cache, store: S) -> Self {
        let day = Duration::from_secs(24 * 3600);
        Tiered {
            cache,
            store: Arc::new(store),
            lease: DEFAULT_LEASE,
            completed_ttl: day,
            unknown_ttl: day,
        }
    }

    /// The lease a claim takes in the store ([`lease`](Tiered::lease) reads it): how
    /// long a crashed holder's keys stay blocked, and how long a claim holds without
    /// renewal. Through the HTTP layer it does not bound the handler (the layer renews
    /// every third of it while the handler runs); code that claims through `Tiered`
    /// itself renews with [`TieredGuard::extend_lease`] or sets a lease longer than its
    /// slowest execution. [`DEFAULT_LEASE`] says how to choose.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long the store keeps a completed result. The hot tier keeps one it completed
    /// for the store's TTL less the time the store took to answer and less 10 ms (two
    /// ticks of the coarse clock), so that it never replays what the store has dropped: a
    /// TTL of 10 ms or less is never kept in memory (every repeat asks the store).
    pub fn with_completed_ttl(mut self, ttl: Duration) -> Self {
        self.completed_ttl = ttl;
        self
    }

    /// How long the store keeps an UNKNOWN outcome a guard marked
    /// ([`TieredGuard::mark_unknown`]). A lapsed lease's is the store's
    /// [`LapsePolicy`](crate::LapsePolicy)'s.
    pub fn with_unknown_ttl(mut self, ttl: Duration) -> Self {
        self.unknown_ttl = ttl;
        self
    }

    /// The store behind the cache (for resolving, listing, purging).
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The cache in front.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The lease each claim takes in the store.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// How long the store keeps a completed result.
    pub fn completed_ttl(&self) -> Duration {
        self.completed_ttl
    }

    /// How long the store keeps an UNKNOWN outcome a guard marked.
    pub fn unknown_ttl(&self) -> Duration {
        self.unknown_ttl
    }

    /// [`store::reconcile`](super::reconcile) of the store's UNKNOWN records, resolving
    /// with this `Tiered`'s result TTL. The hot tier holds no UNKNOWN outcome of its
    /// own, so nothing there needs settling: a resolved key is read through next time.
    pub async fn reconcile<F, Fut>(
        &self,
        limit: usize,
        check: F,
    ) -> Result<crate::Reconciled, super::ReconcileError>
    where
        F: FnMut(&crate::UnknownEntry<SystemTime>) -> Fut,
        Fut: std::future::Future<Output = crate::Verdict>,
    {
        super::reconcile(&*self.store, limit, self.completed_ttl, check).await
    }

    /// Claims `key`: from memory if it completed here, else through the store.
    ///
    /// The store's part runs in a boxed future of its own, so the memory answer does not
    /// build (and move) the store's future, which can be kilobytes.
    pub async fn claim(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
    ) -> Result<TieredClaim<S>, TieredError> {
        self.claim_correlated(key, fingerprint, None).await
    }

    /// [`claim`](Tiered::claim), keeping `correlation_id` with the store's record if the
    /// claim acquires the key ([`Store::claim_correlated`]), and with the hot tier's
    /// entry while it executes ([`Cache::claim_correlated`]). A result the hot tier
    /// learns from the store keeps none there: the store's record has it.
    pub async fn claim_correlated(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        correlation_id: Option<&CorrelationId>,
    ) -> Result<TieredClaim<S>, TieredError> {
        match self.answer_in_memory(key, fingerprint, correlation_id)? {
            Ok(answer) => Ok(answer),
            Err(local) => {
                Box::pin(self.read_through(key, fingerprint, correlation_id, local)).await
            }
        }
    }

    /// The cache's answer; or, to ask the store, its claim held meanwhile (`None` when
    /// the cache holds something it cannot answer with).
    #[allow(clippy::type_complexity)]
    pub(crate) fn answer_in_memory(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        correlation_id: Option<&CorrelationId>,
    ) -> Result<Result<TieredClaim<S>, Option<ClaimGuard>>, TieredError> {
        let claim = self.cache.claim_correlated(key, fingerprint, correlation_id);
        Ok(Ok(match claim.map_err(TieredError::CacheRefused)? {
            Claim::Acquired(local) => return Ok(Err(Some(local))),
            // The hot path: the store's times were kept in front of the body.
            Claim::Completed(replay) => match replay.body.and_then(unpack) {
                Some(record) => TieredClaim::Completed(record),
                None => return Ok(Err(None)),
            },
            Claim::InProgress { lease_ends_at, .. } => {
                TieredClaim::InProgress { lease_ends_at: self.cache.system_time(lease_ends_at) }
            }
            // Tiered never marks the hot tier UNKNOWN (the store keeps outcomes); a cache
            // built with `LapsePolicy::MarkUnknown` turns a lapsed local claim so. The
            // store's record, under the store's policy, decides: forget the local mark
            // (it would outlive the store's resolve) and ask.
            Claim::Unknown { .. } => {
                let _ = self.cache.forget(key);
                return Ok(Err(None));
            }
            Claim::Mismatch => TieredClaim::Mismatch,
        }))
    }

    /// Asks the store, holding the cache's claim `local` (if any) so local duplicates
    /// wait on memory, and settles `local` by the store's answer.
    pub(crate) async fn read_through(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        correlation_id: Option<&CorrelationId>,
        local: Option<ClaimGuard>,
    ) -> Result<TieredClaim<S>, TieredError> {
        // Dropped with this future, whenever: a claim cancelled mid-way (a timeout, a
        // client gone) leaves nothing in the hot tier that the store did not record.
        let mut local = Local(local);
        // Refused before anything is taken, not after the caller has executed.
        check_duration("lease", self.lease)?;
        check_duration("result TTL", self.completed_ttl)?;
        check_duration("unknown TTL", self.unknown_ttl)?;
        let claiming = self.store.claim_correlated(key, fingerprint, self.lease, correlation_id);
        let durable = claiming.await?;
        Ok(match durable {
            StoreClaim::Acquired { token, lease_ends_at, took_over } => {
                let mut local = local.0.take();
                if let Some(local) = &mut local {
                    // Local duplicates' `Retry-After` is the store's lease, not the cache's.
                    let _ = local.extend_lease(self.lease);
                }
                TieredClaim::Acquired(TieredGuard {
                    tiered: self.clone(),
                    key: key.clone(),
                    token,
                    lease_ends_at,
                    took_over,
                    local,
                })
            }
            StoreClaim::Completed(record) => {
                drop(local);
                self.remember(key, fingerprint, &record);
                TieredClaim::Completed(record)
            }
            StoreClaim::InProgress { lease_ends_at } => TieredClaim::InProgress { lease_ends_at },
            StoreClaim::Unknown { marked_at } => TieredClaim::Unknown { marked_at },
            StoreClaim::Mismatch => TieredClaim::Mismatch,
        })
    }

    /// The record as the hot tier keeps it, if it can: a record it would keep without
    /// its body stays in the store only (a repeat reads it through, body and all).
    fn packed(&self, record: &Replay<SystemTime>) -> Option<Bytes> {
        let body = record.body.as_ref()?;
        if body.len() + TIMES > self.cache.max_result_size() {
            return None;
        }
        let mut packed = BytesMut::with_capacity(TIMES + body.len());
        packed.put_i64(to_micros(record.completed_at));
        packed.put_i64(to_micros(record.expires_at));
        packed.put_slice(body);
        Some(packed.freeze())
    }

    /// Puts a committed record read from the store into the hot tier with its own
    /// times, so it expires here no later than there ([`read_through_ttl`]). A refusal
    /// (the key got busy, the cache is full) only means the next repeat reads through.
    /// (Completions are exact: see [`Tiered::keep`].)
    fn remember(&self, key: &Key, fingerprint: Fingerprint, record: &Replay<SystemTime>) {
        let Some(packed) = self.packed(record) else { return };
        let (whole, left) = read_through_ttl(record);
        let now = self.cache.now();
        let known = Outcome::Completed {
            body: Some(packed),
            completed_at: now.saturating_sub(whole.saturating_sub(left)),
            expires_at: now.saturating_add(left),
        };
        let _ = self.cache.insert(key, fingerprint, known);
    }

    /// Completes the cache's claim with a record the store committed (asked at `asked`
    /// on the cache's clock), for no longer than the store keeps it: the store's TTL as
    /// its own clock counted it, less the time the answer took here, less
    /// [`CLOCK_SLACK`]. Or lets the claim go if the record does not fit, or no time is
    /// left.
    fn keep(&self, local: Option<ClaimGuard>, record: &Replay<SystemTime>, asked: Timestamp) {
        let Some(mut local) = local else { return };
        let ttl = record.expires_at.duration_since(record.completed_at).unwrap_or_default();
        let took = self.cache.now().saturating_duration_since(asked);
        let left = ttl.saturating_sub(took).saturating_sub(CLOCK_SLACK);
        match self.packed(record) {
            Some(packed) if local.set_result_ttl(left).is_ok() => {
                let _ = local.complete(packed);
            }
            _ => {
                let _ = local.release();
            }
        }
    }
}

/// The cache's claim while the store is asked: released when dropped, whatever the
/// cache's drop policy.
struct Local(Option<ClaimGuard>);

impl Drop for Local {
    fn drop(&mut self) {
        let_go(self.0.take());
    }
}

/// A record the hot tier kept ([`Tiered::packed`]'s format); `None` if it is not one.
/// Reading the times advances the `Bytes` in place: no copy, no reference count touched.
fn unpack(mut packed: Bytes) -> Option<Replay<SystemTime>> {
    if packed.len() < TIMES {
        return None;
    }
    let completed_at = from_micros(packed.get_i64());
    let expires_at = from_micros(packed.get_i64());
    Some(Replay::new(Some(packed), completed_at, expires_at))
}

/// A claim held in the store (and in the cache, for local duplicates). Settle it with
/// [`complete`](TieredGuard::complete), [`release`](TieredGuard::release) or
/// [`mark_unknown`](TieredGuard::mark_unknown); renew its lease with
/// [`extend_lease`](TieredGuard::extend_lease) while a long execution runs. It owns what
/// it needs (no borrow of the [`Tiered`]), so it can move into a spawned task.
///
/// Dropped unsettled (an early return, a panic), it lets go of the cache's claim only:
/// the store's record stays PROCESSING until its lease lapses, so nobody re-executes
/// before then (a drop cannot wait for the store); then the store's lapse policy
/// decides (taken over, or UNKNOWN under `LapsePolicy::MarkUnknown`).
#[derive(Debug)]
pub struct TieredGuard<S> {
    tiered: Tiered<S>,
    key: Key,
    token: FencingToken,
    lease_ends_at: SystemTime,
    took_over: bool,
    local: Option<ClaimGuard>,
}

impl<S: Store> TieredGuard<S> {
    /// The store's fencing token for this claim: carry it into your own writes.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// Whether the store's claim took the key over from an earlier execution whose
    /// lease lapsed ([`StoreClaim::Acquired`]'s `took_over`): that execution may have
    /// had its effects; check before acting again where a second effect would matter.
    pub fn took_over(&self) -> bool {
        self.took_over
    }

    /// When the store's lease lapses (the store's clock).
    pub fn lease_ends_at(&self) -> SystemTime {
        self.lease_ends_at
    }

    /// This claim for code that completes it inside its own transaction on the store's
    /// database (`complete_in` of the SQL store crates): its key, token, and the TTL
    /// this `Tiered` keeps completions for. See [`OpenClaim`](super::OpenClaim).
    pub fn open_claim(&self) -> super::OpenClaim {
        super::OpenClaim::new(self.key.clone(), self.token, self.tiered.completed_ttl)
    }

    /// Renews the lease in the store (and in the cache) to end `lease` from the store's
    /// now. Refused with [`StoreError::LeaseLost`] if the key has moved on.
    pub async fn extend_lease(&mut self, lease: Duration) -> Result<SystemTime, TieredError> {
        let ends = self.tiered.store.extend_lease(&self.key, self.token, lease).await?;
        self.lease_ends_at = ends;
        if let Some(local) = &mut self.local {
            // The cache's claim only answers local duplicates; losing it loses nothing.
            let _ = local.extend_lease(lease);
        }
        Ok(ends)
    }

    /// PROCESSING → COMPLETED: written to the store first, then cached. A store error
    /// leaves the outcome to the store (the write may have committed): the cache lets the
    /// key go, so the next claim asks the store; and unless the lease was lost, the record
    /// is marked UNKNOWN if the store answers that (a completion that did commit stays).
    pub async fn complete(
        mut self,
        result: impl crate::IntoBytes,
    ) -> Result<Replay<SystemTime>, TieredError> {
        let tiered = &self.tiered;
        let body = Some(result.into_bytes());
        let asked = tiered.cache.now();
        let outcome =
            tiered.store.complete(&self.key, self.token, body, tiered.completed_ttl).await;
        let local = self.local.take();
        match &outcome {
            Ok(record) => tiered.keep(local, record, asked),
            Err(StoreError::LeaseLost(_)) => let_go(local),
            Err(_) => {
                let_go(local);
                // Not recorded (a body the store refuses), or maybe not (the store failed
                // mid-way), and the effect has happened: mark it UNKNOWN, never to be
                // re-run blindly. Refused, harmlessly, if the completion did commit; with
                // the store still down, the record stays PROCESSING until its lease lapses.
                let (key, token, ttl) = (&self.key, self.token, tiered.unknown_ttl);
                let _ = tiered.store.mark_unknown(key, token, ttl).await;
            }
        }
        Ok(outcome?)
    }

    /// PROCESSING → absent in the store and here: a retry executes again.
    pub async fn release(mut self) -> Result<(), TieredError> {
        let_go(self.local.take());
        Ok(self.tiered.store.release(&self.key, self.token).await?)
    }

    /// PROCESSING → UNKNOWN in the store; repeats read it through.
    pub async fn mark_unknown(mut self) -> Result<(), TieredError> {
        let tiered = &self.tiered;
        let outcome = tiered.store.mark_unknown(&self.key, self.token, tiered.unknown_ttl).await;
        let_go(self.local.take());
        Ok(outcome?)
    }
}

impl<S> Drop for TieredGuard<S> {
    fn drop(&mut self) {
        let_go(self.local.take());
    }
}

/// Releases the cache's claim whatever the cache's drop policy: the store, not the hot
/// tier, records what happened, and the next claim asks it.
fn let_go(local: Option<ClaimGuard>) {
    if let Some(local) = local {
        let _ = local.release();
    }
}
