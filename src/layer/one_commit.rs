//! The layer's one-commit mode ([`IdempotencyLayer::one_commit`](super::IdempotencyLayer::one_commit)):
//! per first execution the layer opens a transaction on the store's database, claims the
//! key in it, lends it to the handler ([`HeldTransaction`]) for the business change,
//! records the response in it, and commits once.
//!
//! Invariant: the claim, the handler's writes and the completion commit together or
//! not at all. A response is answered as the handler made it only once its transaction
//! committed; a transaction that did not commit (a lost lease, a failed completion or
//! commit, a 5xx, an error, a panic, a body that failed) is rolled back, and the client
//! is told nothing happened (or gets the handler's own 5xx), so a retry runs again.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};

use super::backend::durable::{time_until, timed, BoxFuture, Durable, DurableHeld};
use super::backend::{Found, Held, Renewal, Settled};
use super::decision::Decision;
use crate::store::{read_through_ttl, CLOCK_SLACK};
use crate::store::{OneCommit, OpenClaim, StoreClaim, StoreError, TransactionalStore};
use crate::{Cache, CorrelationId, DropPolicy, Fingerprint, Key, Outcome, Replay};

/// A request extension the layer's one-commit mode
/// ([`IdempotencyLayer::one_commit`](super::IdempotencyLayer::one_commit)) sets on every
/// request it claimed: the transaction holding the claim, for the handler to write its
/// business change in. The layer records the response in it and commits it after the
/// handler returns: do not commit or roll it back yourself.
///
/// `T` is the store's transaction
/// ([`TransactionalStore::Transaction`]): `sqlx::Transaction<'static, Postgres>` for
/// `idemcache_sqlx::PgStore`, `idemcache_postgres::PooledTransaction` for
/// `PostgresStore`. With axum, take it as `Extension<HeldTransaction<T>>`:
///
/// ```ignore
/// async fn create(Extension(held): Extension<HeldTransaction<PgTransaction>>) -> StatusCode {
///     let Ok(mut tx) = held.lock().await else { return StatusCode::INTERNAL_SERVER_ERROR };
///     let insert = sqlx::query("INSERT INTO orders (item) VALUES ('book')");
///     match insert.execute(&mut **tx).await {
///         Ok(_) => StatusCode::CREATED, // recorded with the order, one commit
///         Err(_) => StatusCode::INTERNAL_SERVER_ERROR, // not kept: all of it rolls back
///     }
/// }
/// ```
///
/// The guard is dropped when your handler returns; the layer then takes the
/// transaction back (it waits for every guard to go, so keep none in a task that
/// outlives the handler). A statement of yours that fails aborts the transaction
/// (PostgreSQL): nothing can be recorded after it, so a 4xx you answer then reaches the
/// client as 503 (nothing was done). Answer a 5xx after a failed statement, or run a
/// statement that may fail inside a savepoint. A response the layer keeps (2xx and 4xx by default)
/// commits your writes with its record; one it does not keep (a 5xx), an error or a
/// panic rolls them back, as does a response marked
/// [`OutcomeUnknown`](super::OutcomeUnknown): this mode records nothing outside the
/// transaction, so keep calls to other services out of it (use
/// [`tiered`](super::IdempotencyLayer::tiered) for those).
pub struct HeldTransaction<T> {
    slot: Arc<Mutex<Option<T>>>,
}

impl<T> Clone for HeldTransaction<T> {
    fn clone(&self) -> Self {
        HeldTransaction { slot: self.slot.clone() }
    }
}

impl<T> std::fmt::Debug for HeldTransaction<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldTransaction").finish_non_exhaustive()
    }
}

impl<T> HeldTransaction<T> {
    fn new(tx: T) -> Self {
        HeldTransaction { slot: Arc::new(Mutex::new(Some(tx))) }
    }

    /// The transaction, locked for your statements until the guard is dropped.
    /// [`TransactionEnded`] once the layer has settled the request (a handler's task
    /// still running after it returned).
    pub async fn lock(&self) -> Result<MappedMutexGuard<'_, T>, TransactionEnded> {
        MutexGuard::try_map(self.slot.lock().await, Option::as_mut).map_err(|_| TransactionEnded)
    }

    /// Takes the transaction back from the handler, once its locks are dropped.
    async fn take(&self) -> Option<T> {
        self.slot.lock().await.take()
    }
}

/// [`HeldTransaction::lock`] after the layer settled the request: the transaction was
/// committed or rolled back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransactionEnded;

impl std::fmt::Display for TransactionEnded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request's one-commit transaction has already ended")
    }
}

impl std::error::Error for TransactionEnded {}

/// A claim held in an open transaction.
struct TxHeld<S: TransactionalStore> {
    store: Arc<S>,
    tx: HeldTransaction<S::Transaction>,
    claim: OpenClaim,
    lease: Duration,
    /// The cache in front, told of the record once it committed, and the fingerprint.
    hot: Option<(Cache, Fingerprint)>,
    took_over: bool,
}

/// The hot tier's replay of `key`, if it keeps one with its body (one kept without is
/// read from the store, which has the body).
fn replay_in_memory(cache: &Cache, key: &Key, fp: Fingerprint) -> Option<Found> {
    let replay = cache.replay_hit(key, fp)?;
    let expires_at = cache.system_time(replay.expires_at);
    Some(Found::Completed { body: Some(replay.body?), expires_at })
}

/// Keeps a record the store committed in the hot tier, for `left` at most, if it fits
/// (a refusal, such as a full cache, only means the next repeat asks the store).
fn keep(cache: &Cache, key: &Key, fp: Fingerprint, body: Bytes, left: Duration) {
    if body.len() > cache.max_result_size() || left.is_zero() {
        return;
    }
    let now = cache.now();
    let expires_at = now.saturating_add(left);
    let known = Outcome::Completed { body: Some(body), completed_at: now, expires_at };
    let _ = cache.insert(key, fp, known);
}

/// Keeps a committed record the store answered with, for no longer than the store
/// keeps it ([`read_through_ttl`]).
fn remember(cache: &Cache, key: &Key, fp: Fingerprint, record: &Replay<SystemTime>) {
    let Some(body) = record.body.clone() else { return };
    keep(cache, key, fp, body, read_through_ttl(record).1);
}

impl<S: TransactionalStore> Durable for OneCommit<S> {
    fn claim<'a>(
        &'a self,
        key: &'a Key,
        fp: Fingerprint,
        correlation_id: Option<&'a CorrelationId>,
        wait: Option<Duration>,
    ) -> BoxFuture<'a, (Found, bool)> {
        Box::pin(async move {
            if let Some(replayed) = self.cache().and_then(|cache| replay_in_memory(cache, key, fp))
            {
                return (replayed, false);
            }
            let store = self.shared_store();
            let name = store.name();
            let mut tx = match timed(name, "begin", store.begin()).await {
                Ok(tx) => tx,
                Err(e) => return (Found::from_store_error(e), false),
            };
            // The wait happens on the row another transaction holds: one look, bounded.
            let wait = wait.unwrap_or(Duration::ZERO);
            let claiming = store.claim_in(&mut tx, key, fp, self.lease(), wait, correlation_id);
            let found = match timed(name, "claim", claiming).await {
                Ok(StoreClaim::Acquired { token, took_over, .. }) => {
                    let claim = OpenClaim::new(key.clone(), token, self.completed_ttl());
                    let tx = HeldTransaction::new(tx);
                    let lease = self.lease();
                    let hot = self.cache().map(|cache| (cache.clone(), fp));
                    let held = TxHeld { store: store.clone(), tx, claim, lease, hot, took_over };
                    return (Found::Acquired(Held::Durable(Box::new(held))), false);
                }
                Ok(StoreClaim::Completed(replay)) => {
                    if let Some(cache) = self.cache() {
                        remember(cache, key, fp, &replay);
                    }
                    Found::Completed { body: replay.body, expires_at: replay.expires_at }
                }
                Ok(StoreClaim::InProgress { lease_ends_at }) => {
                    Found::InProgress { retry_after: lease_left(lease_ends_at, self.lease()) }
                }
                Ok(StoreClaim::Unknown { .. }) => Found::Unknown,
                Ok(StoreClaim::Mismatch) => Found::Mismatch,
                Err(e) => Found::from_store_error(e),
            };
            // Answered without taking the key: the transaction wrote nothing to keep.
            let _ = store.rollback(tx).await;
            (found, false)
        })
    }

    #[cfg(feature = "metrics")]
    fn name(&self) -> &'static str {
        self.store().name()
    }

    #[cfg(feature = "metrics")]
    fn cache(&self) -> Option<&crate::Cache> {
        OneCommit::cache(self)
    }

    #[cfg(feature = "metrics")]
    fn count_unknown(&self, _limit: usize) -> BoxFuture<'_, Option<usize>> {
        // No record is ever UNKNOWN in this mode: a transaction commits or does not.
        Box::pin(async { Some(0) })
    }
}

impl<S: TransactionalStore> TxHeld<S> {
    /// Rolls the transaction back (if the handler left it to the layer).
    async fn roll_back(self) {
        if let Some(tx) = self.tx.take().await {
            let _ = timed(self.store.name(), "rollback", self.store.rollback(tx)).await;
        }
    }
}

impl<S: TransactionalStore> DurableHeld for TxHeld<S> {
    fn lease(&self) -> Duration {
        self.lease
    }

    fn took_over(&self) -> bool {
        self.took_over
    }

    fn drop_policy(&self) -> DropPolicy {
        // A panic rolls the transaction back: nothing happened.
        DropPolicy::Release
    }

    fn extend_lease(&mut self, _lease: Duration) -> BoxFuture<'_, Renewal> {
        // Nobody else sees the claim before it commits: there is nothing to renew, and
        // the lease bounds the transaction (the completion checks it).
        Box::pin(async { Renewal::Renewed })
    }

    fn complete(self: Box<Self>, body: Bytes) -> BoxFuture<'static, Settled> {
        Box::pin(async move {
            let name = self.store.name();
            let Some(tx) = self.tx.take().await else {
                return Settled::NotCommitted(Decision::StoreError);
            };
            // The record's TTL runs from the completion at the store, after this instant.
            let asked = std::time::Instant::now();
            let settling = self.store.complete_and_commit(tx, &self.claim, Some(&body));
            match timed(name, "complete", settling).await {
                Ok(()) => {
                    if let Some((cache, fp)) = &self.hot {
                        let ttl = self.claim.result_ttl().saturating_sub(asked.elapsed());
                        keep(cache, self.claim.key(), *fp, body, ttl.saturating_sub(CLOCK_SLACK));
                    }
                    Settled::Recorded
                }
                Err(StoreError::LeaseLost(_)) => Settled::NotCommitted(Decision::LeaseLost),
                Err(_) => Settled::NotCommitted(Decision::StoreError),
            }
        })
    }

    fn release(self: Box<Self>) -> BoxFuture<'static, Settled> {
        Box::pin(async move {
            self.roll_back().await;
            Settled::Recorded
        })
    }

    fn mark_unknown(self: Box<Self>) -> BoxFuture<'static, Settled> {
        // Never asked (the layer releases a claim that `rolls_back` instead): what the
        // handler wrote is undone, so a retry runs again.
        Box::pin(async move {
            self.roll_back().await;
            Settled::Recorded
        })
    }

    fn open_claim(&self) -> Option<OpenClaim> {
        // The layer completes in the transaction it lent: `InTransaction` is not set.
        None
    }

    fn lend(&self, extensions: &mut http::Extensions) {
        extensions.insert(self.tx.clone());
    }

    fn rolls_back(&self) -> bool {
        true
    }
}

/// How long a key's holder may still run, for a duplicate's `Retry-After`: its lease's end
/// when the store read one (a record committed PROCESSING), else `lease`, this layer's,
/// which bounds every first execution's transaction: a holder seen only as a lock (its
/// turn held, its record not committed yet) has no end to read, and answering as if its
/// lease ended now made every such 409 say `Retry-After: 1`, however long it had to run.
fn lease_left(lease_ends_at: SystemTime, lease: Duration) -> Duration {
    match time_until(lease_ends_at) {
        left if left.is_zero() => lease,
        left => left,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    use std::sync::Mutex as StdMutex;
    use std::task::{Context, Poll};
    use std::time::SystemTime;

    use http::{Request, Response};
    use http_body_util::{BodyExt, Full};
    use tower_layer::Layer;
    use tower_service::Service;

    use super::*;
    use crate::layer::{IdempotencyLayer, OutcomeUnknown};
    use crate::FencingToken;

    /// A database with one records table and one orders table, where a transaction's
    /// writes are seen by others only once it commits, and a key claimed by an open
    /// transaction is "locked" (a claim of it answers in progress at once).
    #[derive(Default)]
    struct Db {
        records: StdMutex<HashMap<Vec<u8>, (Fingerprint, Bytes)>>,
        orders: StdMutex<Vec<String>>,
        locked: StdMutex<HashSet<Vec<u8>>>,
        tokens: AtomicU64,
        fail_commit: AtomicBool,
        lease_lost: AtomicBool,
        rollbacks: AtomicUsize,
        begins: AtomicUsize,
    }

    #[derive(Clone, Default)]
    struct Fake(Arc<Db>);

    /// An open transaction: its claim (locked), the record and orders it would commit.
    struct FakeTx {
        db: Arc<Db>,
        claimed: Option<(Vec<u8>, Fingerprint)>,
        record: Option<Bytes>,
        orders: Vec<String>,
    }

    impl Drop for FakeTx {
        fn drop(&mut self) {
            // Ended either way: the row lock goes with it.
            if let Some((key, _)) = self.claimed.take() {
                self.db.locked.lock().unwrap().remove(&key);
            }
        }
    }

    impl TransactionalStore for Fake {
        type Transaction = FakeTx;

        fn name(&self) -> &'static str {
            "fake"
        }

        async fn begin(&self) -> Result<FakeTx, StoreError> {
            self.0.begins.fetch_add(1, Ordering::Relaxed);
            let db = self.0.clone();
            Ok(FakeTx { db, claimed: None, record: None, orders: Vec::new() })
        }

        async fn claim_in(
            &self,
            tx: &mut FakeTx,
            key: &Key,
            fp: Fingerprint,
            lease: Duration,
            _wait: Duration,
            _correlation_id: Option<&CorrelationId>,
        ) -> Result<StoreClaim, StoreError> {
            let now = SystemTime::now();
            if let Some((stored, body)) = self.0.records.lock().unwrap().get(key.as_bytes()) {
                if *stored != fp {
                    return Ok(StoreClaim::Mismatch);
                }
                let body = Some(body.clone());
                let replay = Replay { body, completed_at: now, expires_at: now + lease };
                return Ok(StoreClaim::Completed(replay));
            }
            if !self.0.locked.lock().unwrap().insert(key.as_bytes().to_vec()) {
                return Ok(StoreClaim::InProgress { lease_ends_at: now });
            }
            tx.claimed = Some((key.as_bytes().to_vec(), fp));
            let token = FencingToken::new(self.0.tokens.fetch_add(1, Ordering::Relaxed) + 1);
            Ok(StoreClaim::Acquired { token, lease_ends_at: now + lease, took_over: false })
        }

        async fn complete_in(
            &self,
            tx: &mut FakeTx,
            claim: &OpenClaim,
            body: Option<&[u8]>,
        ) -> Result<(), StoreError> {
            if self.0.lease_lost.load(Ordering::Relaxed) {
                return Err(StoreError::LeaseLost(claim.key().clone()));
            }
            tx.record = body.map(Bytes::copy_from_slice);
            Ok(())
        }

        async fn commit(&self, mut tx: FakeTx) -> Result<(), StoreError> {
            if self.0.fail_commit.load(Ordering::Relaxed) {
                return Err(StoreError::Backend("the connection dropped".into()));
            }
            if let (Some((key, fp)), Some(record)) = (tx.claimed.clone(), tx.record.take()) {
                self.0.records.lock().unwrap().insert(key, (fp, record));
            }
            self.0.orders.lock().unwrap().append(&mut tx.orders);
            Ok(())
        }

        async fn rollback(&self, _tx: FakeTx) -> Result<(), StoreError> {
            self.0.rollbacks.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    type Answer = Result<Response<Full<Bytes>>, &'static str>;

    /// What the handler does after writing its order in the transaction.
    #[derive(Clone, Copy)]
    enum Then {
        Answer(u16),
        Unknown,
        Fail,
        /// Keeps the transaction's handle past the request, then answers 201.
        Keep,
    }

    /// A handler that writes an order named by its body in the lent transaction.
    #[derive(Clone)]
    struct Orders {
        then: Then,
        runs: Arc<AtomicUsize>,
        kept: Arc<StdMutex<Option<HeldTransaction<FakeTx>>>>,
        /// Entered: the handler waits for the gate once it wrote its order.
        gate: Option<Arc<tokio::sync::Semaphore>>,
    }

    impl Orders {
        fn new(then: Then) -> Orders {
            let runs = Arc::default();
            Orders { then, runs, kept: Arc::default(), gate: None }
        }
    }

    impl<B: http_body::Body<Data = Bytes> + Send + 'static> Service<Request<B>> for Orders {
        type Response = Response<Full<Bytes>>;
        type Error = &'static str;
        type Future = BoxFuture<'static, Answer>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: Request<B>) -> Self::Future {
            let held = request.extensions().get::<HeldTransaction<FakeTx>>().cloned();
            let in_transaction = request.extensions().get::<super::super::InTransaction>();
            assert!(in_transaction.is_none(), "one commit lends the transaction, not a claim");
            let this = self.clone();
            Box::pin(async move {
                this.runs.fetch_add(1, Ordering::Relaxed);
                let held = held.expect("the layer lends its transaction");
                let body = request.into_body().collect().await.ok().unwrap().to_bytes();
                let order = String::from_utf8(body.to_vec()).unwrap();
                held.lock().await.unwrap().orders.push(order);
                if let Some(gate) = &this.gate {
                    drop(gate.acquire().await.unwrap());
                }
                let status = match this.then {
                    Then::Answer(status) => status,
                    Then::Fail => return Err("the handler failed"),
                    Then::Unknown | Then::Keep => 201,
                };
                let mut response = Response::builder().status(status);
                if let Then::Unknown = this.then {
                    response = response.extension(OutcomeUnknown);
                }
                if let Then::Keep = this.then {
                    *this.kept.lock().unwrap() = Some(held);
                }
                Ok(response.body(Full::new(Bytes::from("{\"id\":7}"))).unwrap())
            })
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
    }

    fn post(key: &str, order: &str) -> Request<Full<Bytes>> {
        let request = Request::post("/orders").header("idempotency-key", key);
        request.body(Full::new(Bytes::from(order.to_owned()))).unwrap()
    }

    /// The status, the `code` of a refusal (empty otherwise) and whether it replayed.
    async fn sent<S>(service: &mut S, key: &str, order: &str) -> (u16, String, bool)
    where
        S: Service<Request<Full<Bytes>>, Response = Response<super::super::LayerBody<Full<Bytes>>>>,
        S::Error: std::fmt::Debug,
    {
        let response = service.call(post(key, order)).await.unwrap();
        let replayed = response.headers().contains_key(crate::layer::IDEMPOTENT_REPLAYED);
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let code = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("code").and_then(|c| c.as_str()).map(str::to_owned));
        (status, code.unwrap_or_default(), replayed)
    }

    fn layer(fake: &Fake) -> IdempotencyLayer {
        IdempotencyLayer::one_commit(OneCommit::new(fake.clone()))
    }

    #[test]
    fn a_holder_seen_only_as_a_lock_may_run_the_whole_lease() {
        let lease = Duration::from_secs(60);
        let now = SystemTime::now();
        assert_eq!(super::lease_left(now, lease), lease, "no end to read: the layer's lease");
        let read = super::lease_left(now + Duration::from_secs(10), lease);
        assert!(read <= Duration::from_secs(10) && read > Duration::from_secs(9), "{read:?}");
    }

    #[test]
    fn the_order_and_its_record_commit_together_and_repeats_replay() {
        let fake = Fake::default();
        let handler = Orders::new(Then::Answer(201));
        let mut service = layer(&fake).layer(handler.clone());
        runtime().block_on(async {
            assert_eq!(sent(&mut service, "k1", "a").await, (201, String::new(), false));
            assert_eq!(sent(&mut service, "k1", "a").await, (201, String::new(), true));
            assert_eq!(sent(&mut service, "k1", "b").await.0, 422);
        });
        assert_eq!(*fake.0.orders.lock().unwrap(), ["a"]);
        assert_eq!(handler.runs.load(Ordering::Relaxed), 1);
        assert!(fake.0.locked.lock().unwrap().is_empty(), "every transaction ended");
    }

    #[test]
    fn what_is_not_kept_rolls_back_and_runs_again() {
        // The handler's 503 as it is; an outcome marked unknown is never answered as
        // the handler's 201 (nothing committed); an error as it is.
        for (then, expected) in [(Then::Answer(503), 503), (Then::Unknown, 500), (Then::Fail, 0)] {
            let fake = Fake::default();
            let handler = Orders::new(then);
            let mut service = layer(&fake).layer(handler.clone());
            runtime().block_on(async {
                for _ in 0..2 {
                    match service.call(post("k1", "a")).await {
                        Ok(response) => assert_eq!(response.status(), expected),
                        Err(e) => assert_eq!((e, expected), ("the handler failed", 0)),
                    }
                }
            });
            assert!(fake.0.orders.lock().unwrap().is_empty(), "nothing committed");
            assert!(fake.0.records.lock().unwrap().is_empty());
            assert_eq!(handler.runs.load(Ordering::Relaxed), 2, "a retry runs again");
            assert_eq!(fake.0.rollbacks.load(Ordering::Relaxed), 2);
        }
    }

    #[test]
    fn a_commit_or_completion_that_fails_is_never_answered_as_done() {
        fn fail_commit(db: &Db) -> &AtomicBool {
            &db.fail_commit
        }
        fn lose_lease(db: &Db) -> &AtomicBool {
            &db.lease_lost
        }
        for flag in [fail_commit, lose_lease] {
            let fake = Fake::default();
            flag(&fake.0).store(true, Ordering::Relaxed);
            let handler = Orders::new(Then::Answer(201));
            let mut service = layer(&fake).layer(handler.clone());
            let rt = runtime();
            let failed = rt.block_on(sent(&mut service, "k1", "a"));
            assert_eq!(failed, (503, "idempotency_store_unavailable".to_owned(), false));
            assert!(fake.0.orders.lock().unwrap().is_empty());
            // The database back: the retry runs and commits.
            flag(&fake.0).store(false, Ordering::Relaxed);
            assert_eq!(rt.block_on(sent(&mut service, "k1", "a")).0, 201);
            assert_eq!(*fake.0.orders.lock().unwrap(), ["a"]);
        }
    }

    #[test]
    fn a_duplicate_meets_the_open_transaction_then_replays_its_commit() {
        let fake = Fake::default();
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let mut handler = Orders::new(Then::Answer(201));
        handler.gate = Some(gate.clone());
        let service = layer(&fake).layer(handler.clone());
        runtime().block_on(async {
            let mut first = service.clone();
            let first = tokio::spawn(async move { sent(&mut first, "k1", "a").await });
            while fake.0.locked.lock().unwrap().is_empty() {
                tokio::task::yield_now().await;
            }
            let during = sent(&mut service.clone(), "k1", "a").await;
            assert_eq!((during.0, during.1.as_str()), (409, "request_in_progress"));
            gate.add_permits(1);
            assert_eq!(first.await.unwrap().0, 201);
            assert_eq!(sent(&mut service.clone(), "k1", "a").await, (201, String::new(), true));
        });
        assert_eq!(handler.runs.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_handle_kept_past_the_request_finds_the_transaction_ended() {
        let fake = Fake::default();
        let handler = Orders::new(Then::Keep);
        let mut service = layer(&fake).layer(handler.clone());
        let rt = runtime();
        assert_eq!(rt.block_on(sent(&mut service, "k1", "a")).0, 201);
        let kept = handler.kept.lock().unwrap().take().unwrap();
        assert_eq!(rt.block_on(kept.lock()).err(), Some(TransactionEnded));
        assert_eq!(*fake.0.orders.lock().unwrap(), ["a"]);
    }

    fn cached(fake: &Fake, cache: &Cache) -> IdempotencyLayer {
        IdempotencyLayer::one_commit(OneCommit::new(fake.clone()).with_cache(cache.clone()))
    }

    #[test]
    fn the_cache_in_front_replays_only_what_committed() {
        let fake = Fake::default();
        let cache = Cache::builder().build().unwrap();
        let failing = Orders::new(Then::Answer(503));
        let rt = runtime();
        // Rolled back: nothing is kept in memory, the retry runs again.
        let mut service = cached(&fake, &cache).layer(failing.clone());
        assert_eq!(rt.block_on(sent(&mut service, "k1", "a")).0, 503);
        assert_eq!(rt.block_on(sent(&mut service, "k1", "a")).0, 503);
        assert_eq!(failing.runs.load(Ordering::Relaxed), 2);
        // A commit that fails: nothing kept either.
        fake.0.fail_commit.store(true, Ordering::Relaxed);
        let handler = Orders::new(Then::Answer(201));
        let mut service = cached(&fake, &cache).layer(handler.clone());
        assert_eq!(rt.block_on(sent(&mut service, "k1", "a")).0, 503);
        fake.0.fail_commit.store(false, Ordering::Relaxed);
        // Committed: repeats are answered from memory, with no transaction.
        assert_eq!(rt.block_on(sent(&mut service, "k1", "a")), (201, String::new(), false));
        let begins = fake.0.begins.load(Ordering::Relaxed);
        assert_eq!(rt.block_on(sent(&mut service, "k1", "a")), (201, String::new(), true));
        assert_eq!(fake.0.begins.load(Ordering::Relaxed), begins, "replayed from memory");
        // Another body under the key is the store's to judge: refused, not replayed.
        assert_eq!(rt.block_on(sent(&mut service, "k1", "b")).0, 422);
        assert_eq!(handler.runs.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_record_another_process_committed_is_read_once_then_kept() {
        let fake = Fake::default();
        let rt = runtime();
        let handler = Orders::new(Then::Answer(201));
        let mut first = layer(&fake).layer(handler.clone());
        assert_eq!(rt.block_on(sent(&mut first, "k1", "a")).0, 201);
        let other = Cache::builder().build().unwrap();
        let mut second = cached(&fake, &other).layer(handler.clone());
        let begins = fake.0.begins.load(Ordering::Relaxed);
        assert!(rt.block_on(sent(&mut second, "k1", "a")).2, "replayed from the store");
        assert_eq!(fake.0.begins.load(Ordering::Relaxed), begins + 1);
        assert!(rt.block_on(sent(&mut second, "k1", "a")).2, "replayed from memory");
        assert_eq!(fake.0.begins.load(Ordering::Relaxed), begins + 1);
        assert_eq!(handler.runs.load(Ordering::Relaxed), 1);
    }
}
