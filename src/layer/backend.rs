//! Where the layer's claims live: the in-process [`Cache`] alone, or a
//! [`Tiered`](crate::store::Tiered) store (feature `store`), behind one small interface.
//!
//! Invariant: both backends answer a claim with one [`Found`], and a [`Held`] claim ends
//! in exactly one of complete, release or mark unknown (or its backend's drop rule), so
//! the service's state machine is written once. The cache path stays free of boxing and
//! dynamic calls: it is the hot one.

use std::time::{Duration, SystemTime};

use bytes::Bytes;

use super::decision::Decision;
use crate::{Cache, Claim, ClaimError, ClaimGuard, CorrelationId, DropPolicy, Fingerprint, Key};

/// What a claim found, in the terms the layer answers in.
pub(crate) enum Found {
    /// Execute, holding this claim.
    Acquired(Held),
    /// Replay `body` (`None`: completed, but kept without its body).
    Completed { body: Option<Bytes>, expires_at: SystemTime },
    /// Executing elsewhere; it may be taken over after `retry_after`.
    InProgress { retry_after: Duration },
    /// An earlier execution's outcome is unknown.
    Unknown,
    /// The key was used for a different request.
    Mismatch,
    /// The cache is full of in-flight work.
    Full,
    /// The durable store could not be reached: nothing executes.
    #[cfg_attr(not(feature = "store"), allow(dead_code))]
    Unavailable(String),
    /// The store holds a record for the key that it cannot read: nothing executes.
    #[cfg_attr(not(feature = "store"), allow(dead_code))]
    Corrupt(String),
    /// Any other refusal.
    Refused(String),
}

/// A claim the handler runs under.
pub(crate) enum Held {
    Memory(ClaimGuard, Cache),
    #[cfg(feature = "store")]
    Durable(Box<dyn durable::DurableHeld>),
}

/// How [`Held::complete`] ended.
pub(crate) enum Settled {
    /// Recorded: repeats replay it.
    Recorded,
    /// The lease was lost (another owner took the key): nothing recorded.
    LeaseLost,
    /// The store failed to record it; its outcome is the store's (see the layer docs).
    #[cfg_attr(not(feature = "store"), allow(dead_code))]
    Failed,
    /// One commit: the transaction holding the claim and the handler's change did not
    /// commit (the decision says why), so nothing the handler did happened, and a retry
    /// runs again (or replays, if a commit whose answer was lost happened after all).
    #[cfg_attr(not(feature = "store"), allow(dead_code))]
    NotCommitted(Decision),
}

impl Settled {
    /// The decision to report for a release or a mark meant to be `meant`: `meant`, unless
    /// the store failed it ([`Decision::NotSettled`]: the key stays held until its lease
    /// lapses, whatever was meant).
    pub(crate) fn reported_as(self, meant: Decision) -> Decision {
        match self {
            Settled::Failed => Decision::NotSettled,
            _ => meant,
        }
    }
}

/// How [`Held::extend_lease`] ended.
pub(crate) enum Renewal {
    Renewed,
    /// The key moved on: stop renewing.
    Lost,
    /// The store failed this time: try again at the next beat.
    #[cfg_attr(not(feature = "store"), allow(dead_code))]
    Failed,
}

/// The layer's backend.
#[derive(Clone)]
pub(crate) enum Records {
    Memory(Cache),
    #[cfg(feature = "store")]
    Durable(std::sync::Arc<dyn durable::Durable>),
}

impl Records {
    /// Claims `key`, waiting up to `wait` for an executing duplicate to finish; and
    /// whether it waited. An acquired claim keeps the correlation id with its entry or
    /// record. `probed`: the cache's read lock was asked for a replay just before, and
    /// had none.
    pub(crate) async fn claim(
        &self,
        key: &Key,
        fp: Fingerprint,
        correlation_id: Option<&CorrelationId>,
        wait: Option<Duration>,
        probed: bool,
    ) -> (Found, bool) {
        match self {
            Records::Memory(cache) => {
                let mut waited = false;
                let claim = match wait {
                    // The read lock was just asked: go straight to the claim.
                    None if probed => cache.claim_locked(key, fp, correlation_id),
                    None => cache.claim_correlated(key, fp, correlation_id),
                    Some(timeout) => {
                        // The future sleeps only while the key is in progress: a sleep
                        // asked for is a wait.
                        let sleep = |nap| {
                            waited = true;
                            tokio::time::sleep(nap)
                        };
                        let waiting = cache
                            .claim_wait_async(key, fp, sleep)
                            .correlated(correlation_id.cloned());
                        // Boxed, as rare: its timer would otherwise enlarge every
                        // request's future.
                        match Box::pin(tokio::time::timeout(timeout, waiting)).await {
                            Ok(claim) => claim,
                            // Waited long enough: answer what the key is now.
                            Err(_elapsed) => cache.claim_correlated(key, fp, correlation_id),
                        }
                    }
                };
                (from_cache(cache, claim), waited)
            }
            #[cfg(feature = "store")]
            Records::Durable(durable) => durable.claim(key, fp, correlation_id, wait).await,
        }
    }

    /// The `store` label of the layer's metrics: `cache` for the cache alone, else the
    /// store's [`name`](crate::store::Store::name).
    #[cfg(feature = "metrics")]
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Records::Memory(_) => "cache",
            #[cfg(feature = "store")]
            Records::Durable(durable) => durable.name(),
        }
    }

    /// The cache (in front of the store, over a durable one; none in one-commit mode).
    #[cfg(feature = "metrics")]
    pub(crate) fn cache(&self) -> Option<&Cache> {
        match self {
            Records::Memory(cache) => Some(cache),
            #[cfg(feature = "store")]
            Records::Durable(durable) => durable.cache(),
        }
    }

    /// Live UNKNOWN records, up to `limit`: the cache's, or the store's over a durable
    /// one; `None` if the store failed to count them.
    #[cfg(feature = "metrics")]
    pub(crate) async fn count_unknown(&self, limit: usize) -> Option<usize> {
        match self {
            Records::Memory(cache) => Some(cache.list_unknown(limit).len()),
            #[cfg(feature = "store")]
            Records::Durable(durable) => durable.count_unknown(limit).await,
        }
    }
}

fn from_cache(cache: &Cache, claim: Result<Claim, ClaimError>) -> Found {
    match claim {
        Ok(Claim::Acquired(guard)) => Found::Acquired(Held::Memory(guard, cache.clone())),
        Ok(Claim::Completed(replay)) => {
            Found::Completed { body: replay.body, expires_at: cache.system_time(replay.expires_at) }
        }
        Ok(Claim::InProgress { lease_ends_at, .. }) => {
            Found::InProgress { retry_after: cache.time_until(lease_ends_at) }
        }
        Ok(Claim::Unknown { .. }) => Found::Unknown,
        Ok(Claim::Mismatch) => Found::Mismatch,
        Err(ClaimError::CapacityExhausted) => Found::Full,
        Err(e) => Found::Refused(e.to_string()),
    }
}

impl Held {
    /// Whether the claim took the key over from an earlier execution whose lease lapsed.
    pub(crate) fn took_over(&self) -> bool {
        match self {
            Held::Memory(guard, _) => guard.took_over(),
            #[cfg(feature = "store")]
            Held::Durable(held) => held.took_over(),
        }
    }

    /// The lease each renewal asks for: the one the claim was taken with (a duration,
    /// never a remainder computed against another machine's clock).
    pub(crate) fn lease(&self) -> Duration {
        match self {
            Held::Memory(guard, cache) => cache.time_until(guard.lease_ends_at()),
            #[cfg(feature = "store")]
            Held::Durable(held) => held.lease(),
        }
    }

    /// Renews the lease to end `lease` from now.
    pub(crate) async fn extend_lease(&mut self, lease: Duration) -> Renewal {
        match self {
            Held::Memory(guard, _) => match guard.extend_lease(lease) {
                Ok(_) => Renewal::Renewed,
                Err(_) => Renewal::Lost,
            },
            #[cfg(feature = "store")]
            Held::Durable(held) => held.extend_lease(lease).await,
        }
    }

    /// Records `body` as the key's result.
    /// The claim for a handler that records its outcome in its own transaction: over a
    /// durable store only (the cache's claims live in this process alone).
    #[cfg(feature = "store")]
    pub(crate) fn open_claim(&self) -> Option<crate::store::OpenClaim> {
        match self {
            Held::Memory(..) => None,
            Held::Durable(held) => held.open_claim(),
        }
    }

    /// Puts what the handler is lent into its request's extensions: in one-commit mode,
    /// the transaction holding the claim.
    #[cfg(feature = "store")]
    pub(crate) fn lend(&self, extensions: &mut http::Extensions) {
        if let Held::Durable(held) = self {
            held.lend(extensions);
        }
    }

    pub(crate) fn complete(self, body: Bytes) -> Settling<Settled> {
        match self {
            Held::Memory(guard, _) => Settling::Done(Some(match guard.complete(body) {
                Ok(()) => Settled::Recorded,
                Err(_) => Settled::LeaseLost,
            })),
            #[cfg(feature = "store")]
            Held::Durable(held) => Settling::Pending(held.complete(body)),
        }
    }

    /// Lets the key go: a retry executes again. Says how that ended:
    /// [`Settled::Recorded`] if the key was released, [`Settled::LeaseLost`] if the claim
    /// no longer held it (over a store: a handler's own transaction recorded it, or
    /// another owner took it), [`Settled::Failed`] if the store failed.
    pub(crate) fn release(self) -> Settling<Settled> {
        match self {
            Held::Memory(guard, _) => Settling::Done(Some(match guard.release() {
                Ok(()) => Settled::Recorded,
                Err(_) => Settled::LeaseLost,
            })),
            #[cfg(feature = "store")]
            Held::Durable(held) => Settling::Pending(held.release()),
        }
    }

    /// Whether settling this claim any way but completing it rolls back everything the
    /// execution wrote (one commit), so that no outcome is ever unknown.
    pub(crate) fn rolls_back(&self) -> bool {
        match self {
            Held::Memory(..) => false,
            #[cfg(feature = "store")]
            Held::Durable(held) => held.rolls_back(),
        }
    }

    /// Marks the outcome unknown: never re-run blindly.
    pub(crate) fn mark_unknown(self) -> Settling<Settled> {
        match self {
            // Lost (another owner took the key): nothing of this claim to mark.
            Held::Memory(guard, _) => Settling::Done(Some(match guard.mark_unknown() {
                Ok(()) => Settled::Recorded,
                Err(_) => Settled::LeaseLost,
            })),
            #[cfg(feature = "store")]
            Held::Durable(held) => Settling::Pending(held.mark_unknown()),
        }
    }

    /// The handler panicked: settle the key as the cache's [`DropPolicy`] says a dropped
    /// guard is settled (the default releases it), in the store too; returns which.
    pub(crate) fn abandon(self) -> impl std::future::Future<Output = Decision> {
        let policy = match &self {
            Held::Memory(_, cache) => cache.drop_policy(),
            #[cfg(feature = "store")]
            Held::Durable(held) => held.drop_policy(),
        };
        let (settling, decision) = match policy {
            DropPolicy::Release => (self.release(), Decision::Released),
            DropPolicy::MarkUnknown => (self.mark_unknown(), Decision::MarkedUnknown),
        };
        async move { settling.await.reported_as(decision) }
    }
}

/// A claim being settled: at once over the cache, or a store's boxed future. Small
/// whichever it is (no `async fn` state to copy at each move of the execution that
/// awaits it, nor room kept there for the larger of the two).
pub(crate) enum Settling<T> {
    /// Settled; taken by the first poll.
    Done(Option<T>),
    /// The store's answer, to come.
    #[cfg(feature = "store")]
    Pending(durable::BoxFuture<'static, T>),
}

impl<T: Unpin> std::future::Future for Settling<T> {
    type Output = T;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        #[cfg_attr(not(feature = "store"), allow(unused_variables))] cx: &mut std::task::Context<
            '_,
        >,
    ) -> std::task::Poll<T> {
        match self.get_mut() {
            // Polled again after its answer: a caller's bug; never answered twice, so it
            // stays pending rather than panicking.
            Settling::Done(done) => {
                done.take().map_or(std::task::Poll::Pending, std::task::Poll::Ready)
            }
            #[cfg(feature = "store")]
            Settling::Pending(pending) => pending.as_mut().poll(cx),
        }
    }
}

#[cfg(feature = "store")]
pub(crate) mod durable {
    //! [`Tiered`] (and, in `super::super::one_commit`, `OneCommit`) behind object-safe
    //! traits, so the layer (and its settings) need not be generic over the store.

    use std::future::Future;
    use std::pin::Pin;
    use std::time::{Duration, SystemTime};

    use bytes::Bytes;

    use super::{Found, Held, Renewal, Settled};
    use crate::store::{Store, StoreError, Tiered, TieredClaim, TieredError, TieredGuard};
    use crate::{ClaimError, CorrelationId, DropPolicy, Fingerprint, Key};

    pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

    pub(crate) trait Durable: Send + Sync {
        /// Claims `key`, waiting up to `wait` for a duplicate executing; and whether it
        /// waited.
        fn claim<'a>(
            &'a self,
            key: &'a Key,
            fp: Fingerprint,
            correlation_id: Option<&'a CorrelationId>,
            wait: Option<Duration>,
        ) -> BoxFuture<'a, (Found, bool)>;
        #[cfg(feature = "metrics")]
        fn name(&self) -> &'static str;
        #[cfg(feature = "metrics")]
        fn cache(&self) -> Option<&crate::Cache>;
        #[cfg(feature = "metrics")]
        fn count_unknown(&self, limit: usize) -> BoxFuture<'_, Option<usize>>;
    }

    /// `call`, timed into `idemcache_store_seconds` as `operation` (feature `metrics`).
    pub(crate) async fn timed<T>(
        _store: &'static str,
        _operation: &'static str,
        call: impl Future<Output = T>,
    ) -> T {
        #[cfg(feature = "metrics")]
        let started = std::time::Instant::now();
        let out = call.await;
        #[cfg(feature = "metrics")]
        crate::layer::metrics::store_call(_store, _operation, started.elapsed());
        out
    }

    pub(crate) trait DurableHeld: Send {
        fn lease(&self) -> Duration;
        fn took_over(&self) -> bool;
        fn drop_policy(&self) -> DropPolicy;
        fn extend_lease(&mut self, lease: Duration) -> BoxFuture<'_, Renewal>;
        fn complete(self: Box<Self>, body: Bytes) -> BoxFuture<'static, Settled>;
        fn release(self: Box<Self>) -> BoxFuture<'static, Settled>;
        fn mark_unknown(self: Box<Self>) -> BoxFuture<'static, Settled>;
        /// The claim for a handler's own transaction (`InTransaction`), if it may
        /// complete it there.
        fn open_claim(&self) -> Option<crate::store::OpenClaim>;
        /// Puts what the handler is lent into its request's extensions.
        fn lend(&self, _extensions: &mut http::Extensions) {}
        /// Whether a release rolls back what the execution wrote (one commit).
        fn rolls_back(&self) -> bool {
            false
        }
    }

    /// A [`TieredGuard`] with what the layer needs from its `Tiered`.
    struct Guard<S> {
        guard: TieredGuard<S>,
        lease: Duration,
        drop_policy: DropPolicy,
        /// The store's name, for the timing of its calls.
        store: &'static str,
    }

    impl<S: Store> Durable for Tiered<S> {
        fn claim<'a>(
            &'a self,
            key: &'a Key,
            fp: Fingerprint,
            correlation_id: Option<&'a CorrelationId>,
            wait: Option<Duration>,
        ) -> BoxFuture<'a, (Found, bool)> {
            Box::pin(claim_polling(move || look(self, key, fp, correlation_id), wait))
        }

        #[cfg(feature = "metrics")]
        fn name(&self) -> &'static str {
            self.store().name()
        }

        #[cfg(feature = "metrics")]
        fn cache(&self) -> Option<&crate::Cache> {
            Some(Tiered::cache(self))
        }

        #[cfg(feature = "metrics")]
        fn count_unknown(&self, limit: usize) -> BoxFuture<'_, Option<usize>> {
            Box::pin(async move { self.store().list_unknown(limit).await.ok().map(|l| l.len()) })
        }
    }

    /// One claim through `tiered`, in the layer's terms.
    async fn look<S: Store>(
        tiered: &Tiered<S>,
        key: &Key,
        fp: Fingerprint,
        correlation_id: Option<&CorrelationId>,
    ) -> Found {
        let store = tiered.store().name();
        // `Tiered::claim_correlated`, with only the store's claim timed: the answers the
        // hot tier gives (a local holder's duplicates, a replay, a mismatch) send nothing
        // to the store, and counting them as its claims made a duplicate waiting in this
        // process look like a poll of the store.
        let claimed = match tiered.answer_in_memory(key, fp, correlation_id) {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(local)) => {
                let asking = tiered.read_through(key, fp, correlation_id, local);
                timed(store, "claim", Box::pin(asking)).await
            }
            Err(e) => Err(e),
        };
        match claimed {
            Ok(TieredClaim::Acquired(guard)) => Found::Acquired(Held::Durable(Box::new(Guard {
                guard,
                lease: Tiered::lease(tiered),
                drop_policy: tiered.cache().drop_policy(),
                store,
            }))),
            Ok(TieredClaim::Completed(record)) => {
                Found::Completed { body: record.body, expires_at: record.expires_at }
            }
            Ok(TieredClaim::InProgress { lease_ends_at }) => {
                Found::InProgress { retry_after: time_until(lease_ends_at) }
            }
            Ok(TieredClaim::Unknown { .. }) => Found::Unknown,
            Ok(TieredClaim::Mismatch) => Found::Mismatch,
            Err(TieredError::CacheRefused(ClaimError::CapacityExhausted)) => Found::Full,
            Err(TieredError::Store(e)) => Found::from_store_error(e),
            Err(e) => Found::Refused(e.to_string()),
        }
    }

    /// How long from now until `at` (zero if it has passed).
    pub(crate) fn time_until(at: SystemTime) -> Duration {
        at.duration_since(SystemTime::now()).unwrap_or_default()
    }

    impl Found {
        /// A store's failure, in the layer's terms.
        pub(crate) fn from_store_error(e: StoreError) -> Found {
            match e {
                e @ StoreError::Backend(_) => Found::Unavailable(e.to_string()),
                e @ StoreError::Corrupt(_) => Found::Corrupt(e.to_string()),
                e => Found::Refused(e.to_string()),
            }
        }
    }

    /// How a guard's settling call ended, in the layer's terms.
    fn settled<T>(outcome: Result<T, TieredError>) -> Settled {
        match outcome {
            Ok(_) => Settled::Recorded,
            Err(TieredError::Store(StoreError::LeaseLost(_))) => Settled::LeaseLost,
            Err(_) => Settled::Failed,
        }
    }

    impl<S: Store> DurableHeld for Guard<S> {
        fn lease(&self) -> Duration {
            self.lease
        }

        fn took_over(&self) -> bool {
            self.guard.took_over()
        }

        fn drop_policy(&self) -> DropPolicy {
            self.drop_policy
        }

        fn extend_lease(&mut self, lease: Duration) -> BoxFuture<'_, Renewal> {
            Box::pin(async move {
                let renewing = self.guard.extend_lease(lease);
                match timed(self.store, "extend_lease", renewing).await {
                    Ok(_) => Renewal::Renewed,
                    Err(TieredError::Store(StoreError::LeaseLost(_))) => Renewal::Lost,
                    Err(_) => Renewal::Failed,
                }
            })
        }

        fn complete(self: Box<Self>, body: Bytes) -> BoxFuture<'static, Settled> {
            Box::pin(async move {
                settled(timed(self.store, "complete", self.guard.complete(body)).await)
            })
        }

        fn release(self: Box<Self>) -> BoxFuture<'static, Settled> {
            Box::pin(
                async move { settled(timed(self.store, "release", self.guard.release()).await) },
            )
        }

        fn mark_unknown(self: Box<Self>) -> BoxFuture<'static, Settled> {
            Box::pin(async move {
                settled(timed(self.store, "mark_unknown", self.guard.mark_unknown()).await)
            })
        }

        fn open_claim(&self) -> Option<crate::store::OpenClaim> {
            Some(self.guard.open_claim())
        }
    }

    /// Claims with `look`; with `wait`, looks again (pausing 10 ms, doubling to 250 ms)
    /// while a duplicate executes, until it settles or `wait` is spent: the store's
    /// claim-and-wait loop ([`crate::store::claim_wait`]) over the layer's answer.
    async fn claim_polling<L, LF>(look: L, wait: Option<Duration>) -> (Found, bool)
    where
        L: FnMut() -> LF,
        LF: std::future::Future<Output = Found>,
    {
        let Some(wait) = wait else {
            let mut look = look;
            return (look().await, false);
        };
        let busy = |found: &Found| matches!(found, Found::InProgress { .. });
        // look_while sleeps only after a look found the key in progress: a sleep is a wait.
        let mut waited = false;
        let sleep = |nap| {
            waited = true;
            tokio::time::sleep(nap)
        };
        let found = crate::store::look_while(look, busy, wait, sleep).await;
        (found, waited)
    }
}
