//! The durable tier and the layer over it under faults: cancelled claims, clients gone
//! mid-claim, store blips during renewal, skewed store clocks, settings the store refuses,
//! panicking handlers. Most run over SQLite through `Faulty`, a wrapper that injects a
//! fault into a real store. Lapses are waited for by bounded polling on the store's clock;
//! nothing asserts a duration.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{Request, Response};
use bytes::Bytes;
use idemcache::layer::{Decision, IdempotencyLayer, LayerBody};
use idemcache::store::{
    Record, RecordFilter, RecordState, Store, StoreClaim, StoreError, Tiered, TieredClaim,
    TieredError,
};
use idemcache::{Cache, DropPolicy, FencingToken, Fingerprint, Key, Replay, UnknownEntry};
use idemcache_sqlite::{rusqlite, SqliteStore};
use tokio::sync::{Notify, Semaphore};
use tower::{Layer, ServiceExt};

mod bodies;

// ---------------------------------------------------------------- a faulty store wrapper

#[derive(Default)]
struct Faults {
    /// Claims that reached the store.
    claims: AtomicUsize,
    /// Pend forever before asking the inner store (the claim never reaches it).
    hang_before_claim: AtomicBool,
    /// How many completions are refused with `InvalidInput` (a body the store refuses).
    refused_completions: AtomicUsize,
    /// Notified when a hanging claim reached its hang point.
    hung: Notify,
    /// How many extend_lease calls fail with a Backend error (a blip).
    failing_extends: AtomicUsize,
    /// Every extend_lease's requested lease.
    extends: Mutex<Vec<Duration>>,
    /// Seconds added to every time the store reports (its clock vs ours).
    skew_secs: AtomicI64,
    /// A pool each extend_lease takes a connection (a permit) of first, as a store does
    /// whose pool the handlers share.
    pool: Mutex<Option<Arc<Semaphore>>>,
    /// How many releases fail with a Backend error (the store cut).
    failing_releases: AtomicUsize,
    /// How many mark_unknown calls fail with a Backend error (the store cut).
    failing_marks: AtomicUsize,
}

impl Faults {
    /// Whether the next call counted by `calls` fails (and one fewer will).
    fn fails(calls: &AtomicUsize) -> bool {
        calls.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
    }
}

struct Faulty<S> {
    inner: S,
    f: Arc<Faults>,
}

impl<S> std::fmt::Debug for Faulty<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Faulty")
    }
}

impl<S> Faulty<S> {
    fn t(&self, at: SystemTime) -> SystemTime {
        let s = self.f.skew_secs.load(Ordering::SeqCst);
        if s >= 0 {
            at + Duration::from_secs(s as u64)
        } else {
            at - Duration::from_secs((-s) as u64)
        }
    }
    fn r(&self, mut r: Replay<SystemTime>) -> Replay<SystemTime> {
        r.completed_at = self.t(r.completed_at);
        r.expires_at = self.t(r.expires_at);
        r
    }
}

impl<S: Store> Store for Faulty<S> {
    async fn claim_correlated(
        &self,
        key: &Key,
        fp: Fingerprint,
        lease: Duration,
        correlation_id: Option<&idemcache::CorrelationId>,
    ) -> Result<StoreClaim, StoreError> {
        if self.f.hang_before_claim.load(Ordering::SeqCst) {
            self.f.hung.notify_one();
            std::future::pending::<()>().await;
        }
        self.f.claims.fetch_add(1, Ordering::SeqCst);
        let c = self.inner.claim_correlated(key, fp, lease, correlation_id).await?;
        Ok(match c {
            StoreClaim::Acquired { token, lease_ends_at, took_over } => {
                StoreClaim::Acquired { token, lease_ends_at: self.t(lease_ends_at), took_over }
            }
            StoreClaim::Completed(r) => StoreClaim::Completed(self.r(r)),
            StoreClaim::InProgress { lease_ends_at } => {
                StoreClaim::InProgress { lease_ends_at: self.t(lease_ends_at) }
            }
            StoreClaim::Unknown { marked_at } => {
                StoreClaim::Unknown { marked_at: self.t(marked_at) }
            }
            StoreClaim::Mismatch => StoreClaim::Mismatch,
        })
    }
    async fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> Result<Replay<SystemTime>, StoreError> {
        let refused = self.f.refused_completions.load(Ordering::SeqCst);
        if refused > 0 {
            self.f.refused_completions.store(refused - 1, Ordering::SeqCst);
            return Err(StoreError::InvalidInput("a body too large for this store".into()));
        }
        self.inner.complete(key, token, body, ttl).await.map(|r| self.r(r))
    }
    async fn extend_lease(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Duration,
    ) -> Result<SystemTime, StoreError> {
        self.f.extends.lock().unwrap().push(lease);
        let pool = self.f.pool.lock().unwrap().clone();
        let _connection = match &pool {
            Some(pool) => Some(pool.acquire().await.unwrap()),
            None => None,
        };
        let failing = self.f.failing_extends.load(Ordering::SeqCst);
        if failing > 0 {
            self.f.failing_extends.store(failing - 1, Ordering::SeqCst);
            return Err(StoreError::Backend("a transient blip".into()));
        }
        self.inner.extend_lease(key, token, lease).await.map(|t| self.t(t))
    }
    async fn release(&self, key: &Key, token: FencingToken) -> Result<(), StoreError> {
        if Faults::fails(&self.f.failing_releases) {
            return Err(StoreError::Backend("the store was cut".into()));
        }
        self.inner.release(key, token).await
    }
    async fn mark_unknown(
        &self,
        key: &Key,
        token: FencingToken,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        if Faults::fails(&self.f.failing_marks) {
            return Err(StoreError::Backend("the store was cut".into()));
        }
        self.inner.mark_unknown(key, token, ttl).await
    }
    async fn resolve_fenced(
        &self,
        key: &Key,
        execution: Option<FencingToken>,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> Result<Replay<SystemTime>, StoreError> {
        self.inner.resolve_fenced(key, execution, body, ttl).await
    }
    async fn forget_fenced(
        &self,
        key: &Key,
        execution: Option<FencingToken>,
    ) -> Result<(), StoreError> {
        self.inner.forget_fenced(key, execution).await
    }
    async fn list_unknown(
        &self,
        limit: usize,
    ) -> Result<Vec<UnknownEntry<SystemTime>>, StoreError> {
        self.inner.list_unknown(limit).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }
    async fn ensure_schema(&self) -> Result<(), StoreError> {
        self.inner.ensure_schema().await
    }
    async fn record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner.record(key).await
    }
    async fn records(
        &self,
        filter: &RecordFilter,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.inner.records(filter, after, limit).await
    }
    async fn remove_record(
        &self,
        key: &Key,
        states: &[RecordState],
    ) -> Result<Option<Record>, StoreError> {
        self.inner.remove_record(key, states).await
    }
}

// ---------------------------------------------------------------- helpers

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("idemcache-faults-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("records.db")
}

async fn faulty(path: &std::path::Path) -> (Faulty<SqliteStore>, Arc<Faults>) {
    let inner = SqliteStore::open_path(path).await.unwrap();
    inner.ensure_schema().await.unwrap();
    let f = Arc::new(Faults::default());
    (Faulty { inner, f: f.clone() }, f)
}

fn fp(r: &str) -> Fingerprint {
    Fingerprint::of(r.as_bytes())
}

fn key(k: &str) -> Key {
    Key::without_tenant("POST /x", k).unwrap()
}

fn request(k: &str) -> Request<Body> {
    Request::post("/x").header("idempotency-key", k).body(Body::empty()).unwrap()
}

/// A service counting runs; it waits on `gate` (if closed) and panics if asked.
#[derive(Clone)]
struct H {
    runs: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
}

impl H {
    fn new(permits: usize) -> Self {
        H { runs: Arc::default(), gate: Arc::new(Semaphore::new(permits)) }
    }
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
    fn service(
        &self,
        layer: &IdempotencyLayer,
    ) -> impl tower::Service<
        Request<Body>,
        Response = Response<idemcache::layer::LayerBody<Body>>,
        Error = Infallible,
        Future = impl Send,
    > + Clone
           + Send {
        let h = self.clone();
        layer.layer(tower::service_fn(move |req: Request<LayerBody<Body>>| {
            let h = h.clone();
            async move {
                h.runs.fetch_add(1, Ordering::SeqCst);
                h.gate.acquire().await.unwrap().forget();
                if req.headers().contains_key("x-panic") {
                    panic!("asked to panic");
                }
                Ok::<_, Infallible>(
                    Response::builder().status(201).body(Body::from("made")).unwrap(),
                )
            }
        }))
    }
}

async fn until(mut done: impl FnMut() -> bool) {
    for _ in 0..5000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("never held");
}

/// Sends `k` to `svc` until the answer is not 409 request_in_progress (the store's lease
/// lapsed), bounded.
async fn until_not_in_progress<S>(svc: &S, k: &str) -> Response<idemcache::layer::LayerBody<Body>>
where
    S: tower::Service<
            Request<Body>,
            Response = Response<idemcache::layer::LayerBody<Body>>,
            Error = Infallible,
        > + Clone,
{
    for _ in 0..1000 {
        let r = svc.clone().oneshot(request(k)).await.unwrap();
        if r.status() != 409 {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("always 409");
}

/// A store of one's own (this wrapper, outside the crate) proves the contract with the
/// exported suite, as the crate's stores do.
#[tokio::test]
async fn a_store_of_ones_own_passes_the_conformance_suite() {
    let (store, faults) = faulty(&scratch("conforms")).await;
    idemcache::store::conformance::run(&store).await;
    assert!(faults.claims.load(Ordering::SeqCst) > 0, "the suite went through the wrapper");
}

// ---------------------------------------------------------------- cancellation

/// A `Tiered::claim` future dropped while the store is asked (a timeout, a client gone)
/// leaves nothing in the hot tier, even with `DropPolicy::MarkUnknown`: the store never
/// saw the key, so the next claim acquires.
#[tokio::test]
async fn a_cancelled_claim_leaves_nothing_in_the_hot_tier() {
    let path = scratch("f1");
    let (store, f) = faulty(&path).await;
    let cache = Cache::builder().drop_policy(DropPolicy::MarkUnknown).build().unwrap();
    let tiered = Tiered::new(cache, store);
    let k = key("f1");
    f.hang_before_claim.store(true, Ordering::SeqCst);
    tokio::select! {
        _ = tiered.claim(&k, fp("r")) => unreachable!(),
        _ = f.hung.notified() => {} // the claim future is dropped here
    }
    f.hang_before_claim.store(false, Ordering::SeqCst);
    // The store never saw the key: a fresh Tiered over it acquires.
    let other = Tiered::new(
        Cache::builder().build().unwrap(),
        SqliteStore::open_path(&path).await.unwrap(),
    );
    let fresh = other.claim(&key("f1-other"), fp("r")).await.unwrap();
    assert!(matches!(fresh, TieredClaim::Acquired(_)));
    let again = tiered.claim(&k, fp("r")).await.unwrap();
    assert!(
        matches!(again, TieredClaim::Acquired(_)),
        "the store has nothing for this key, but the hot tier answers {again:?}"
    );
}

/// Instance A (its store's faults set by `fault`) runs a gated request under a 900 ms
/// lease; once A has tried to renew, instance B asks for the same request for ~3 s (each
/// ask answered at once, then 20 ms: three leases, long enough for a lapse to show).
/// Returns whether B ran it, and the leases A asked to renew with.
async fn does_another_instance_run_it_while_a_renews(
    name: &str,
    fault: impl FnOnce(&Faults),
) -> (bool, Vec<Duration>, Duration) {
    let path = scratch(name);
    let lease = Duration::from_millis(900);
    let (store_a, fa) = faulty(&path).await;
    fault(&fa);
    let (store_b, _) = faulty(&path).await;
    let a = IdempotencyLayer::tiered(
        Tiered::new(Cache::builder().build().unwrap(), store_a).with_lease(lease),
    );
    let b = IdempotencyLayer::tiered(
        Tiered::new(Cache::builder().build().unwrap(), store_b).with_lease(lease),
    );
    let h = H::new(0);
    let (sa, sb) = (h.service(&a), h.service(&b));
    let first = tokio::spawn(sa.oneshot(request(name)));
    until(|| h.runs() == 1).await;
    until(|| !fa.extends.lock().unwrap().is_empty()).await;
    let mut b_runs = false;
    for _ in 0..120 {
        let r = tokio::spawn(sb.clone().oneshot(request(name)));
        let _ = tokio::time::timeout(Duration::from_millis(50), r).await;
        if h.runs() == 2 {
            b_runs = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.gate.add_permits(10);
    let _ = first.await;
    let extends = fa.extends.lock().unwrap().clone();
    (b_runs, extends, lease)
}

/// A renewal the store fails once (a blip) is tried again at the next beat: the lease
/// never lapses while the handler runs, and another instance never runs it a second time.
/// A handler holding the only connection of the pool the store shares, past a renewal
/// beat: the renewal waits for that connection while the handler goes on, finishes and
/// gives it back, and the request is answered. (The renewal used to be awaited instead of
/// the handler: both waited on each other for ever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_waiting_for_the_handlers_pooled_connection_does_not_stop_the_handler() {
    let path = scratch("pooled");
    let (store, f) = faulty(&path).await;
    let pool = Arc::new(Semaphore::new(1));
    *f.pool.lock().unwrap() = Some(pool.clone());
    // A beat every 100 ms; the handler holds the connection for 250 ms.
    let tiered = Tiered::new(Cache::builder().build().unwrap(), store)
        .with_lease(Duration::from_millis(300));
    let svc = IdempotencyLayer::tiered(tiered).layer(tower::service_fn(
        move |_: Request<LayerBody<Body>>| {
            let pool = pool.clone();
            async move {
                let connection = pool.acquire_owned().await.unwrap();
                tokio::time::sleep(Duration::from_millis(250)).await; // its work
                drop(connection);
                Ok::<_, Infallible>(Response::builder().status(201).body(Body::empty()).unwrap())
            }
        },
    ));
    let request = Request::post("/x").header("idempotency-key", "pooled").body(Body::empty());
    // A guard against the deadlock, not a timing: the answer comes as the handler ends.
    let answered = tokio::time::timeout(Duration::from_secs(30), svc.oneshot(request.unwrap()))
        .await
        .expect("the handler and its renewal waited on each other");
    assert_eq!(answered.unwrap().status(), 201);
    assert!(!f.extends.lock().unwrap().is_empty(), "the lease was renewed meanwhile");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_renewal_is_retried_and_the_request_never_runs_twice() {
    let (b_runs, extends, _) = does_another_instance_run_it_while_a_renews("f3", |f| {
        f.failing_extends.store(1, Ordering::SeqCst);
    })
    .await;
    let extends = extends.len();
    assert!(
        !b_runs,
        "a second execution after one failed renewal; A renewed {extends} times in all"
    );
}

/// Renewals ask for the `Tiered`'s lease, never a remainder computed against this
/// machine's clock: a store whose clock is an hour behind still gets its lease renewed,
/// and the request never runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_ignores_a_store_clock_behind_ours() {
    // The DB server's clock is 1 h behind ours.
    let (b_runs, extends, lease) = does_another_instance_run_it_while_a_renews("f4", |f| {
        f.skew_secs.store(-3600, Ordering::SeqCst);
    })
    .await;
    assert!(!b_runs, "run twice; the leases A asked to renew with: {extends:?}");
    assert!(extends.iter().all(|&l| l == lease), "{extends:?}");
}

/// A TTL the store would refuse (zero, over `MAX_DURATION`) is refused before anything
/// is claimed: the handler never runs, rather than running and then failing to record.
#[tokio::test]
async fn a_ttl_the_store_refuses_is_refused_before_executing() {
    let path = scratch("f5");
    for ttl in [Duration::ZERO, idemcache::MAX_DURATION + Duration::from_secs(1)] {
        let (store, _) = faulty(&path).await;
        let tiered = Tiered::new(Cache::builder().build().unwrap(), store).with_completed_ttl(ttl);
        let claimed = tiered.claim(&key("f5"), fp("r")).await;
        assert!(
            matches!(claimed, Err(TieredError::Store(StoreError::InvalidInput(_)))),
            "{claimed:?}"
        );
        let h = H::new(Semaphore::MAX_PERMITS);
        let svc = h.service(&IdempotencyLayer::tiered(tiered));
        assert_eq!(svc.clone().oneshot(request("f5")).await.unwrap().status(), 500);
        assert_eq!(h.runs(), 0);
    }
}

/// A completion the store refuses (a body too large for it) after the effect happened
/// marks the record UNKNOWN: never re-run blindly, and listed for a reconciler.
#[tokio::test]
async fn a_completion_the_store_refuses_is_marked_unknown() {
    let path = scratch("f5b");
    let (store, f) = faulty(&path).await;
    let tiered = Tiered::new(Cache::builder().build().unwrap(), store);
    let k = key("f5b");
    let TieredClaim::Acquired(g) = tiered.claim(&k, fp("r")).await.unwrap() else { panic!() };
    f.refused_completions.store(1, Ordering::SeqCst);
    let done = g.complete(&b"effect"[..]).await;
    assert!(matches!(done, Err(TieredError::Store(StoreError::InvalidInput(_)))), "{done:?}");
    let answer = tiered.claim(&k, fp("r")).await.unwrap();
    assert!(matches!(answer, TieredClaim::Unknown { .. }), "{answer:?}");
    assert!(tiered.store().list_unknown(10).await.unwrap().iter().any(|u| u.key == k));
}

/// A handler that panics over a store: the panic is caught and the key settled as the
/// cache's drop policy says (the default releases it), in the store too, so the retry runs.
#[tokio::test]
async fn a_panicking_handler_over_a_store_releases_the_key() {
    let path = scratch("f6");
    let (store, _) = faulty(&path).await;
    let layer = IdempotencyLayer::tiered(Tiered::new(Cache::builder().build().unwrap(), store));
    let h = H::new(Semaphore::MAX_PERMITS);
    let svc = h.service(&layer);
    let mut panicking = request("f6");
    panicking.headers_mut().insert("x-panic", "1".parse().unwrap());
    assert_eq!(svc.clone().oneshot(panicking).await.unwrap().status(), 500);
    let retry = svc.clone().oneshot(request("f6")).await.unwrap();
    let ra = retry.headers().get("retry-after").cloned();
    assert_eq!(retry.status(), 201, "retry after a panic: {} retry-after {ra:?}", retry.status());
}

/// `Retry-After` for a duplicate is never past the store's lease, whichever instance answers
/// it (the one executing answers from memory, the other from the store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_never_past_the_stores_lease_in_any_instance() {
    let path = scratch("f7");
    let (store_a, _) = faulty(&path).await;
    let (store_b, _) = faulty(&path).await;
    let lease = Duration::from_secs(3);
    let a = IdempotencyLayer::tiered(
        Tiered::new(Cache::builder().build().unwrap(), store_a).with_lease(lease),
    );
    let b = IdempotencyLayer::tiered(
        Tiered::new(Cache::builder().build().unwrap(), store_b).with_lease(lease),
    );
    let h = H::new(0);
    let (sa, sb) = (h.service(&a), h.service(&b));
    let first = tokio::spawn(sa.clone().oneshot(request("f7")));
    until(|| h.runs() == 1).await;
    let here = sa.clone().oneshot(request("f7")).await.unwrap();
    let there = sb.clone().oneshot(request("f7")).await.unwrap();
    let ra = |r: &Response<_>| r.headers()["retry-after"].to_str().unwrap().parse::<u64>().unwrap();
    let (here_s, there_s) = (ra(&here), ra(&there));
    h.gate.add_permits(10);
    let _ = first.await;
    assert!(
        here_s <= 3,
        "local duplicate Retry-After {here_s}, another instance's {there_s}, store lease 3 s"
    );
    assert!(there_s <= 3, "{there_s}");
}

// ---------------------------------------------------------------- boundaries

#[tokio::test]
async fn results_at_the_hot_tiers_size_boundaries_replay_exactly() {
    let path = scratch("h1");
    let (store, _) = faulty(&path).await;
    let max = 1024;
    let tiered = Tiered::new(Cache::builder().max_result_size(max).build().unwrap(), store);
    for (name, len) in
        [("empty", 0), ("fits", max - 16), ("over", max - 15), ("max", max), ("big", max * 4)]
    {
        let k = key(name);
        let TieredClaim::Acquired(g) = tiered.claim(&k, fp("r")).await.unwrap() else { panic!() };
        let body = Bytes::from(vec![7u8; len]);
        let stored = g.complete(body.clone()).await.unwrap();
        for i in 0..3 {
            match tiered.claim(&k, fp("r")).await.unwrap() {
                TieredClaim::Completed(r) => {
                    assert_eq!(r.body.as_ref(), Some(&body), "{name} {i}");
                    assert_eq!(r.completed_at, stored.completed_at, "{name} {i}");
                    assert_eq!(r.expires_at, stored.expires_at, "{name} {i}");
                }
                other => panic!("{name}: {other:?}"),
            }
        }
        // A fresh instance reads the same from the store.
        let other = Tiered::new(
            Cache::builder().max_result_size(max).build().unwrap(),
            SqliteStore::open_path(&path).await.unwrap(),
        );
        match other.claim(&k, fp("r")).await.unwrap() {
            TieredClaim::Completed(r) => {
                assert_eq!(r.body.as_ref(), Some(&body), "{name} fresh");
                assert_eq!(r.expires_at, stored.expires_at);
            }
            o => panic!("{o:?}"),
        }
        assert!(matches!(tiered.claim(&k, fp("other")).await.unwrap(), TieredClaim::Mismatch));
    }
    // A tiny cache result size (< 16) never caches but still answers.
    let tiny = Tiered::new(
        Cache::builder().max_result_size(1).build().unwrap(),
        SqliteStore::open_path(&path).await.unwrap(),
    );
    let k = key("tiny");
    let TieredClaim::Acquired(g) = tiny.claim(&k, fp("r")).await.unwrap() else { panic!() };
    g.complete(Bytes::new()).await.unwrap();
    assert!(matches!(tiny.claim(&k, fp("r")).await.unwrap(), TieredClaim::Completed(_)));
}

#[tokio::test]
async fn a_stale_owner_is_fenced_across_instances() {
    let path = scratch("h2");
    let (sa, _) = faulty(&path).await;
    let (sb, _) = faulty(&path).await;
    let a =
        Tiered::new(Cache::builder().build().unwrap(), sa).with_lease(Duration::from_millis(100));
    let b = Tiered::new(Cache::builder().build().unwrap(), sb).with_lease(Duration::from_secs(30));
    let k = key("fence");
    let TieredClaim::Acquired(mut ga) = a.claim(&k, fp("r")).await.unwrap() else { panic!() };
    let gb = loop {
        match b.claim(&k, fp("r")).await.unwrap() {
            TieredClaim::Acquired(g) => break g,
            _ => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    };
    assert!(gb.token() > ga.token());
    assert!(matches!(
        ga.extend_lease(Duration::from_secs(30)).await,
        Err(TieredError::Store(StoreError::LeaseLost(_)))
    ));
    gb.complete(&b"B"[..]).await.unwrap();
    assert!(matches!(
        ga.complete(&b"A"[..]).await,
        Err(TieredError::Store(StoreError::LeaseLost(_)))
    ));
    for t in [&a, &b] {
        match t.claim(&k, fp("r")).await.unwrap() {
            TieredClaim::Completed(r) => assert_eq!(r.body.unwrap(), "B"),
            o => panic!("{o:?}"),
        }
    }
}

#[tokio::test]
async fn bad_durations_are_typed_errors_and_nothing_runs() {
    let path = scratch("h3");
    for lease in [Duration::ZERO, Duration::MAX, idemcache::MAX_DURATION + Duration::from_nanos(1)]
    {
        let (store, _) = faulty(&path).await;
        let t = Tiered::new(Cache::builder().build().unwrap(), store).with_lease(lease);
        let r = t.claim(&key("bad"), fp("r")).await;
        assert!(matches!(r, Err(TieredError::Store(StoreError::InvalidInput(_)))), "{r:?}");
        let h = H::new(Semaphore::MAX_PERMITS);
        let svc = h.service(&IdempotencyLayer::tiered(t));
        let resp = svc.oneshot(request("bad")).await.unwrap();
        assert!(resp.status().is_server_error());
        assert_eq!(h.runs(), 0);
    }
    let (store, _) = faulty(&path).await;
    let t = Tiered::new(Cache::builder().build().unwrap(), store);
    let TieredClaim::Acquired(mut g) = t.claim(&key("ext"), fp("r")).await.unwrap() else {
        panic!()
    };
    for d in [Duration::ZERO, Duration::MAX] {
        assert!(matches!(
            g.extend_lease(d).await,
            Err(TieredError::Store(StoreError::InvalidInput(_)))
        ));
    }
    g.complete(&b"x"[..]).await.unwrap();
}

#[tokio::test]
async fn an_unreachable_postgres_is_503_and_nothing_runs() {
    let store = idemcache_postgres::PostgresStore::connect("postgres://postgres@127.0.0.1:1/test")
        .await
        .unwrap();
    let h = H::new(Semaphore::MAX_PERMITS);
    let svc =
        h.service(&IdempotencyLayer::tiered(Tiered::new(Cache::builder().build().unwrap(), store)));
    let r = svc.oneshot(request("pg")).await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(h.runs(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_duplicates_across_instances_replay() {
    let path = scratch("h4");
    let (sa, _) = faulty(&path).await;
    let (sb, _) = faulty(&path).await;
    let a = IdempotencyLayer::tiered(Tiered::new(Cache::builder().build().unwrap(), sa))
        .wait(Duration::from_secs(20));
    let b = IdempotencyLayer::tiered(Tiered::new(Cache::builder().build().unwrap(), sb))
        .wait(Duration::from_secs(20));
    let h = H::new(0);
    let (va, vb) = (h.service(&a), h.service(&b));
    let first = tokio::spawn(va.clone().oneshot(request("w")));
    until(|| h.runs() == 1).await;
    let dups: Vec<_> = (0..6)
        .map(|i| {
            let s = if i % 2 == 0 { va.clone() } else { vb.clone() };
            tokio::spawn(s.oneshot(request("w")))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    h.gate.add_permits(100);
    assert_eq!(first.await.unwrap().unwrap().status(), 201);
    for d in dups {
        let r = d.await.unwrap().unwrap();
        assert_eq!(r.status(), 201);
        assert_eq!(r.headers()["idempotent-replayed"], "true");
        assert!(r.headers().contains_key("idempotency-expires"));
    }
    assert_eq!(h.runs(), 1);
}

/// A client gone while the store's claim is in flight (the job is on SQLite's worker and
/// commits): the claim and the handler run in a task of their own, so the key is neither
/// wedged nor lost: the handler runs once and the retry gets its replay.
#[tokio::test]
async fn a_client_gone_during_the_store_claim_neither_wedges_nor_reruns() {
    let path = scratch("f2b");
    let store = SqliteStore::open_path(&path).await.unwrap();
    store.ensure_schema().await.unwrap();
    let layer = IdempotencyLayer::tiered(Tiered::new(Cache::builder().build().unwrap(), store));
    let h = H::new(Semaphore::MAX_PERMITS);
    let svc = h.service(&layer);
    {
        let mut call = std::pin::pin!(svc.clone().oneshot(request("f2b")));
        // Poll until it waits on the store, then drop it: the client hung up.
        assert!(futures_poll_once(call.as_mut()).await.is_none());
    }
    let retry = until_not_in_progress(&svc, "f2b").await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(h.runs(), 1);
}

/// The same with a cache built with `DropPolicy::MarkUnknown`: nothing is marked unknown
/// for a request that runs to completion after its client left.
#[tokio::test]
async fn a_client_gone_during_the_claim_with_mark_unknown_leaves_no_unknown() {
    let path = scratch("f1b");
    let store = SqliteStore::open_path(&path).await.unwrap();
    store.ensure_schema().await.unwrap();
    let cache = Cache::builder().drop_policy(DropPolicy::MarkUnknown).build().unwrap();
    let layer = IdempotencyLayer::tiered(Tiered::new(cache, store));
    let h = H::new(Semaphore::MAX_PERMITS);
    let svc = h.service(&layer);
    {
        let mut call = std::pin::pin!(svc.clone().oneshot(request("f1b")));
        assert!(futures_poll_once(call.as_mut()).await.is_none());
    }
    let retry = until_not_in_progress(&svc, "f1b").await;
    assert_eq!(retry.status(), 201);
    assert_eq!(h.runs(), 1);
}

async fn futures_poll_once<F: std::future::Future + Unpin>(f: F) -> Option<F::Output> {
    let mut f = f;
    std::future::poll_fn(|cx| match std::pin::Pin::new(&mut f).poll(cx) {
        std::task::Poll::Ready(v) => std::task::Poll::Ready(Some(v)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await
}

/// A store clock an hour ahead of ours: a completion is kept in the hot tier for the
/// store's TTL as the store counted it, so never longer than the store keeps it.
#[tokio::test]
async fn the_hot_tier_never_outlives_the_store_when_its_clock_is_ahead() {
    let path = scratch("f8");
    let (store, f) = faulty(&path).await;
    f.skew_secs.store(3600, Ordering::SeqCst);
    let tiered = Tiered::new(Cache::builder().build().unwrap(), store)
        .with_completed_ttl(Duration::from_millis(200));
    let k = key("f8");
    let TieredClaim::Acquired(g) = tiered.claim(&k, fp("r")).await.unwrap() else { panic!() };
    g.complete(&b"x"[..]).await.unwrap();
    // Wait until the store itself has dropped the record (its clock).
    let plain = SqliteStore::open_path(&path).await.unwrap();
    let mut gone = false;
    for _ in 0..500 {
        if let StoreClaim::Acquired { token, .. } =
            plain.claim(&k, fp("r"), Duration::from_secs(30)).await.unwrap()
        {
            plain.release(&k, token).await.unwrap();
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(gone);
    let here = tiered.claim(&k, fp("r")).await.unwrap();
    assert!(
        !matches!(here, TieredClaim::Completed(_)),
        "the store forgot it; the hot tier still replays {here:?}"
    );
}

mod remote {
    use super::*;

    async fn prefix_over<S: Store, F: Fn() -> S>(make: F, tag: &str) {
        let max = 1024;
        let run = format!(
            "{tag}-{}",
            SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos()
        );
        let tiered = Tiered::new(Cache::builder().max_result_size(max).build().unwrap(), make());
        for (name, len) in [("empty", 0), ("fits", max - 16), ("over", max - 15), ("big", max * 4)]
        {
            let k = Key::new("POST /x", &run, name).unwrap();
            let TieredClaim::Acquired(g) = tiered.claim(&k, fp("r")).await.unwrap() else {
                panic!()
            };
            let body = Bytes::from(vec![9u8; len]);
            let stored = g.complete(body.clone()).await.unwrap();
            for fresh in [false, true] {
                let t2;
                let t = if fresh {
                    t2 =
                        Tiered::new(Cache::builder().max_result_size(max).build().unwrap(), make());
                    &t2
                } else {
                    &tiered
                };
                match t.claim(&k, fp("r")).await.unwrap() {
                    TieredClaim::Completed(r) => {
                        assert_eq!(r.body.as_ref(), Some(&body), "{tag} {name} fresh={fresh}");
                        assert_eq!(
                            (r.completed_at, r.expires_at),
                            (stored.completed_at, stored.expires_at),
                            "{tag} {name} fresh={fresh}"
                        );
                    }
                    o => panic!("{tag} {name}: {o:?}"),
                }
            }
        }
    }

    #[tokio::test]
    #[ignore = "needs IDEMCACHE_POSTGRES_URL or IDEMCACHE_REDIS_STORE_URL"]
    async fn boundaries_replay_exactly_over_postgres_and_redis() {
        use idemcache::store::conformance::service_url;
        let pg = service_url("IDEMCACHE_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test");
        let redis = service_url("IDEMCACHE_REDIS_STORE_URL", "redis://127.0.0.1:6379/14");
        let (Some(pg), Some(redis)) = (pg, redis) else { return };
        let pg = idemcache_postgres::PostgresStore::connect(&pg).await.unwrap();
        pg.ensure_schema().await.unwrap();
        prefix_over(|| pg.clone(), "pg").await;
        let rd = idemcache_redis::RedisStore::connect(&redis).await.unwrap();
        prefix_over(|| rd.clone(), "redis").await;
    }
}

/// A response body failing mid-way over a store: UNKNOWN in the store, seen by another
/// instance, listed for a reconciler, and resolvable.
#[tokio::test]
async fn a_body_failing_midway_marks_unknown_in_the_store() {
    let path = scratch("h5");
    let (sa, _) = faulty(&path).await;
    let (sb, _) = faulty(&path).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let r2 = runs.clone();
    let svc = IdempotencyLayer::tiered(Tiered::new(Cache::builder().build().unwrap(), sa)).layer(
        tower::service_fn(move |_: Request<LayerBody<Body>>| {
            r2.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, Infallible>(Response::new(Broken(0))) }
        }),
    );
    let first = svc.clone().oneshot(request("mid")).await.unwrap();
    assert_eq!(first.status(), 500);
    let tb = Tiered::new(Cache::builder().build().unwrap(), sb);
    let fpr = Fingerprint::builder().method("POST").path("/x").body(b"").finish();
    let seen = tb.claim(&key("mid"), fpr).await.unwrap();
    assert!(matches!(seen, TieredClaim::Unknown { .. }), "{seen:?}");
    let again = svc.clone().oneshot(request("mid")).await.unwrap();
    assert_eq!(again.status(), 409);
    assert_eq!(tb.store().list_unknown(10).await.unwrap().len(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

struct Broken(u8);
impl http_body::Body for Broken {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        self.0 += 1;
        std::task::Poll::Ready(Some(if self.0 == 1 {
            Ok(http_body::Frame::data(Bytes::from_static(b"part")))
        } else {
            Err(std::io::Error::other("cut"))
        }))
    }
}

// ---------------------------------------------------------------- what the hot tier answers

/// Which repeats the hot tier answers without asking the store: a result it keeps whole
/// (its body and the store's 16 bytes of times within `max_result_size`, an empty body
/// included) after a completion here or a read-through from a fresh instance; a result
/// one byte too large is read through every time.
#[tokio::test]
async fn the_hot_tier_answers_what_fits_and_reads_through_what_does_not() {
    let path = scratch("hot");
    let max = 1024;
    for (name, len, kept) in
        [("empty", 0, true), ("fits", max - 16, true), ("over", max - 15, false)]
    {
        let (store, f) = faulty(&path).await;
        let tiered = Tiered::new(Cache::builder().max_result_size(max).build().unwrap(), store);
        let k = key(name);
        let TieredClaim::Acquired(g) = tiered.claim(&k, fp("r")).await.unwrap() else { panic!() };
        let stored = g.complete(Bytes::from(vec![7u8; len])).await.unwrap();
        let asked = f.claims.load(Ordering::SeqCst);
        for _ in 0..3 {
            match tiered.claim(&k, fp("r")).await.unwrap() {
                TieredClaim::Completed(replay) => assert_eq!(replay, stored, "{name}"),
                other => panic!("{name}: {other:?}"),
            }
        }
        let reads = f.claims.load(Ordering::SeqCst) - asked;
        assert_eq!(reads, if kept { 0 } else { 3 }, "{name}: store reads for 3 repeats");

        // A fresh instance (a restart) reads it through once, then keeps what fits.
        let (store, f) = faulty(&path).await;
        let fresh = Tiered::new(Cache::builder().max_result_size(max).build().unwrap(), store);
        for _ in 0..3 {
            match fresh.claim(&k, fp("r")).await.unwrap() {
                TieredClaim::Completed(replay) => assert_eq!(replay, stored, "{name} fresh"),
                other => panic!("{name}: {other:?}"),
            }
        }
        let reads = f.claims.load(Ordering::SeqCst);
        assert_eq!(reads, if kept { 1 } else { 3 }, "{name}: a fresh instance's store reads");
        // A mismatch against a kept result is answered from memory too.
        assert!(matches!(fresh.claim(&k, fp("other")).await.unwrap(), TieredClaim::Mismatch));
        assert_eq!(f.claims.load(Ordering::SeqCst), reads + usize::from(!kept));
    }
}

/// A panicking handler over a store whose cache says `DropPolicy::MarkUnknown`: the key
/// is marked UNKNOWN in the store (its effect may have happened), not released.
#[tokio::test]
async fn a_panicking_handler_under_mark_unknown_marks_the_store_record_unknown() {
    let path = scratch("panic-unknown");
    let (store, _) = faulty(&path).await;
    let cache = Cache::builder().drop_policy(DropPolicy::MarkUnknown).build().unwrap();
    let layer = IdempotencyLayer::tiered(Tiered::new(cache, store));
    let h = H::new(Semaphore::MAX_PERMITS);
    let svc = h.service(&layer);
    let mut panicking = request("pu");
    panicking.headers_mut().insert("x-panic", "1".parse().unwrap());
    assert_eq!(svc.clone().oneshot(panicking).await.unwrap().status(), 500);
    let retry = svc.clone().oneshot(request("pu")).await.unwrap();
    assert_eq!(retry.status(), 409);
    let reader = SqliteStore::open_path(&path).await.unwrap();
    assert_eq!(reader.list_unknown(10).await.unwrap().len(), 1);
    assert_eq!(h.runs(), 1);
}

#[test]
fn tiered_errors_say_which_tier_refused_and_keep_their_cause() {
    use std::error::Error;
    let k = key("named");
    let lost = || StoreError::LeaseLost(k.clone());
    let store = TieredError::Store(lost());
    assert_eq!(store.to_string(), lost().to_string());
    assert!(store.to_string().contains("named"), "the key is named: {store}");
    assert!(store.source().is_some_and(|e| e.to_string() == lost().to_string()));
    let cache = TieredError::CacheRefused(idemcache::ClaimError::CapacityExhausted);
    assert!(cache.to_string().starts_with("the in-process cache refused: "), "{cache}");
    assert!(cache.source().is_some());
    assert!(matches!(
        TieredError::from(StoreError::NothingToSettle(k.clone())),
        TieredError::Store(_)
    ));
}

// ---------------------------------------------------------------- the response body

/// Two instances over one SQLite file, leases of 300 ms; the handler answers 201 at
/// once with a body that arrives 1.2 s later. A duplicate sent to the other instance
/// 50 ms in, waiting, replays the one execution: the lease is renewed in the store
/// until the response is stored, not only while the handler's future runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_streaming_past_its_lease_is_not_run_again_by_another_instance() {
    let path = scratch("late");
    let lease = Duration::from_millis(300);
    let runs = Arc::new(AtomicUsize::new(0));
    let instance = |store| {
        let counted = runs.clone();
        IdempotencyLayer::tiered(
            Tiered::new(Cache::builder().build().unwrap(), store).with_lease(lease),
        )
        .wait(Duration::from_secs(10))
        .layer(tower::service_fn(move |_: Request<LayerBody<Body>>| {
            counted.fetch_add(1, Ordering::SeqCst);
            let body = bodies::late(lease * 4, "made");
            async move { Ok::<_, Infallible>(Response::builder().status(201).body(body).unwrap()) }
        }))
    };
    let (a, b) = (instance(faulty(&path).await.0), instance(faulty(&path).await.0));
    let first = tokio::spawn(a.clone().oneshot(request("late")));
    until(|| runs.load(Ordering::SeqCst) == 1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = b.clone().oneshot(request("late")).await.unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the other instance took the key over");
    assert_eq!((first.status().as_u16(), second.status().as_u16()), (201, 201));
    assert_eq!(second.headers()["idempotent-replayed"], "true");
    // A third instance (a restart) replays what the store kept.
    let third = instance(faulty(&path).await.0);
    let again = third.oneshot(request("late")).await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A response body that panics over a store: caught, and the key settled by the drop
/// policy in the store too (released), so the retry runs at once instead of meeting a
/// PROCESSING record for the whole lease; the 500 says what happened.
#[tokio::test]
async fn a_body_that_panics_over_a_store_releases_the_key_there() {
    let path = scratch("body-panic");
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let layer = IdempotencyLayer::tiered(Tiered::new(
        Cache::builder().build().unwrap(),
        faulty(&path).await.0,
    ));
    let svc = layer.layer(tower::service_fn(move |_: Request<LayerBody<Body>>| {
        let run = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            let body = match run {
                0 => http_body_util::Either::Left(bodies::Panicking),
                _ => http_body_util::Either::Right(Body::from("made")),
            };
            Ok::<_, Infallible>(Response::builder().status(201).body(body).unwrap())
        }
    }));
    let panicked = svc.clone().oneshot(request("bp")).await.unwrap();
    assert_eq!(panicked.status(), 500);
    let detail = http_body_util::BodyExt::collect(panicked.into_body()).await.unwrap().to_bytes();
    let detail = String::from_utf8(detail.to_vec()).unwrap();
    assert!(detail.contains("panicked"), "{detail}");
    let retry = svc.clone().oneshot(request("bp")).await.unwrap();
    assert_eq!(retry.status(), 201, "the store's record was left PROCESSING");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

// ---------------------------------------------------------------- records the store holds

/// Runs `sql` on the SQLite file at `path`, as an operator (or another program) would.
fn sqlite_exec(path: &std::path::Path, sql: &str) {
    let db = rusqlite::Connection::open(path).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    assert!(db.execute(sql, []).unwrap() > 0, "{sql} changed nothing");
}

/// A record an operator pinned "for ever" (an expiry past the year 9999, which no HTTP
/// date can name) replays its response, with the last HTTP date there is.
#[tokio::test]
async fn a_record_pinned_past_the_year_9999_still_replays() {
    let path = scratch("forever");
    let h = H::new(Semaphore::MAX_PERMITS);
    let first = h.service(&IdempotencyLayer::tiered(Tiered::new(
        Cache::builder().build().unwrap(),
        faulty(&path).await.0,
    )));
    assert_eq!(first.oneshot(request("pinned")).await.unwrap().status(), 201);
    sqlite_exec(&path, "UPDATE idemcache_records SET expires_at = 300000000000000000");
    // A fresh instance (nothing in memory) reads the pinned record through, then from memory.
    let fresh = h.service(&IdempotencyLayer::tiered(Tiered::new(
        Cache::builder().build().unwrap(),
        faulty(&path).await.0,
    )));
    for _ in 0..2 {
        let replay = fresh.clone().oneshot(request("pinned")).await.unwrap();
        assert_eq!(replay.status(), 201);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(replay.headers()["idempotency-expires"], "Fri, 31 Dec 9999 23:59:59 GMT");
    }
    assert_eq!(h.runs(), 1);
}

/// A record the store cannot read (a column holding text, a NULL where a time belongs)
/// is `StoreError::Corrupt` naming its key, answered 500 `idempotency_record_corrupt`,
/// never 503 "unavailable" (retrying will not help) and never executed.
#[tokio::test]
async fn an_unreadable_record_is_corrupt_not_unavailable_and_nothing_runs() {
    let path = scratch("corrupt");
    let (store, _) = faulty(&path).await;
    let tiered = Tiered::new(Cache::builder().build().unwrap(), store);
    let k = key("garbled");
    let TieredClaim::Acquired(g) = tiered.claim(&k, fp("r")).await.unwrap() else { panic!() };
    g.mark_unknown().await.unwrap();
    // The row's settled_at holds text: a claim cannot read the record.
    sqlite_exec(&path, "UPDATE idemcache_records SET settled_at = 'yesterday'");
    let fresh = Tiered::new(Cache::builder().build().unwrap(), faulty(&path).await.0);
    match fresh.claim(&k, fp("r")).await {
        Err(TieredError::Store(StoreError::Corrupt(why))) => {
            assert!(why.contains("garbled") && why.contains("settled_at"), "{why}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let h = H::new(Semaphore::MAX_PERMITS);
    let svc = h.service(&IdempotencyLayer::tiered(fresh));
    let answer = svc.oneshot(request("garbled")).await.unwrap();
    assert_eq!(answer.status(), 500);
    let body = http_body_util::BodyExt::collect(answer.into_body()).await.unwrap().to_bytes();
    let body = String::from_utf8(body.to_vec()).unwrap();
    assert!(body.contains("\"code\":\"idempotency_record_corrupt\""), "{body}");
    assert_eq!(h.runs(), 0);

    // NULL where an UNKNOWN record's mark time belongs: the listing names the key.
    sqlite_exec(&path, "UPDATE idemcache_records SET settled_at = NULL");
    let reader = SqliteStore::open_path(&path).await.unwrap();
    match reader.list_unknown(10).await {
        Err(StoreError::Corrupt(why)) => assert!(why.contains("garbled"), "{why}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // Named, it can be forgotten, and the listing works again.
    reader.forget(&k).await.unwrap();
    assert!(reader.list_unknown(10).await.unwrap().is_empty());
}

// ---------------------------------------------------------------- decisions a store failed

/// The decisions a layer reported, in order.
type Seen = Arc<Mutex<Vec<Decision>>>;

/// A layer over `tiered` whose decisions are collected, and a handler answering `status`
/// (with `OutcomeUnknown` if `unknown`).
fn reporting<S: Store>(
    tiered: Tiered<S>,
    status: u16,
    unknown: bool,
) -> (
    impl tower::Service<
            Request<Body>,
            Response = Response<LayerBody<Body>>,
            Error = Infallible,
            Future = impl Send,
        > + Clone,
    Seen,
) {
    let seen = Seen::default();
    let s = seen.clone();
    let layer =
        IdempotencyLayer::tiered(tiered).on_decision(move |e| s.lock().unwrap().push(e.decision));
    let svc = layer.layer(tower::service_fn(move |_: Request<LayerBody<Body>>| async move {
        let mut response = Response::builder().status(status).body(Body::from("x")).unwrap();
        if unknown {
            response.extensions_mut().insert(idemcache::layer::OutcomeUnknown);
        }
        Ok::<_, Infallible>(response)
    }));
    (svc, seen)
}

/// A completion the store refuses is `not_settled`, and the layer marks the record
/// UNKNOWN: the retry is refused (409), never run.
#[tokio::test]
async fn a_refused_completion_is_not_settled_and_its_record_unknown() {
    let (store, f) = faulty(&scratch("refused-completion")).await;
    let tiered = Tiered::new(Cache::builder().build().unwrap(), store);
    let (svc, seen) = reporting(tiered.clone(), 201, false);
    f.refused_completions.store(1, Ordering::SeqCst);
    assert_eq!(svc.clone().oneshot(request("rc")).await.unwrap().status(), 201);
    let record = tiered.store().record(&key("rc")).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Unknown);
    assert_eq!(svc.clone().oneshot(request("rc")).await.unwrap().status(), 409);
    assert_eq!(*seen.lock().unwrap(), [Decision::NotSettled, Decision::Unknown]);
}

/// A 5xx whose release the store fails is `not_settled`, not `released`: the key is
/// still held, and the retry is refused while the lease runs.
#[tokio::test]
async fn a_failed_release_is_not_settled() {
    let (store, f) = faulty(&scratch("failed-release")).await;
    let tiered = Tiered::new(Cache::builder().build().unwrap(), store);
    let (svc, seen) = reporting(tiered.clone(), 503, false);
    f.failing_releases.store(1, Ordering::SeqCst);
    assert_eq!(svc.clone().oneshot(request("fr")).await.unwrap().status(), 503);
    assert_eq!(svc.clone().oneshot(request("fr")).await.unwrap().status(), 409);
    assert_eq!(*seen.lock().unwrap(), [Decision::NotSettled, Decision::InProgress]);
}

/// An `OutcomeUnknown` answer whose mark the store fails is `not_settled`, not
/// `marked_unknown`: the record is still PROCESSING (taken over once its lease lapses).
#[tokio::test]
async fn a_failed_mark_is_not_settled() {
    let (store, f) = faulty(&scratch("failed-mark")).await;
    let tiered = Tiered::new(Cache::builder().build().unwrap(), store);
    let (svc, seen) = reporting(tiered.clone(), 201, true);
    f.failing_marks.store(1, Ordering::SeqCst);
    assert_eq!(svc.clone().oneshot(request("fm")).await.unwrap().status(), 201);
    let record = tiered.store().record(&key("fm")).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Processing);
    assert_eq!(*seen.lock().unwrap(), [Decision::NotSettled]);
}

/// A panic under `DropPolicy::MarkUnknown` over a store is `marked_unknown`, its record
/// UNKNOWN, and the retry is refused as `unknown`.
#[tokio::test]
async fn a_panic_under_mark_unknown_is_marked_unknown_in_the_store() {
    let (store, _) = faulty(&scratch("panic-mark")).await;
    let cache = Cache::builder().drop_policy(DropPolicy::MarkUnknown).build().unwrap();
    let tiered = Tiered::new(cache, store);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let layer = IdempotencyLayer::tiered(tiered.clone())
        .on_decision(move |e| s.lock().unwrap().push(e.decision));
    let svc = H::new(Semaphore::MAX_PERMITS).service(&layer);
    let mut panicking = request("pm");
    panicking.headers_mut().insert("x-panic", "1".parse().unwrap());
    assert_eq!(svc.clone().oneshot(panicking).await.unwrap().status(), 500);
    let record = tiered.store().record(&key("pm")).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Unknown);
    assert_eq!(svc.clone().oneshot(request("pm")).await.unwrap().status(), 409);
    assert_eq!(*seen.lock().unwrap(), [Decision::MarkedUnknown, Decision::Unknown]);
}
