//! The one-commit mode's suite, run by every SQL driver on every engine it supports
//! (SQLite, tokio-postgres, sqlx PostgreSQL, sqlx MySQL/MariaDB): an orders handler
//! behind `IdempotencyLayer::one_commit`, writing its order in the layer's transaction.
//!
//! - The order and its record commit together; repeats replay it (from another layer
//!   too), a different body under the key is 422, and the handler ran once.
//! - A response not kept (a 5xx) rolls the order back with the claim: nothing is left,
//!   and a retry runs again.
//! - A duplicate sent while the first's transaction is open waits for it (the layer's
//!   wait), then replays what it committed; without a wait it is 409 while the first is
//!   still open.
//! - A transaction that outlives its lease commits nothing and answers 503.
//! - The record keeps the request's correlation id.
//! - Below the layer, the claims as a handler of another framework runs them
//!   (`claim_in`, its write and `complete_in` in one transaction): see [`claims`]'s
//!   list; and the two halves of a kill test every driver runs
//!   ([`claim_and_wait_to_be_killed`], [`after_a_kill_between_claim_and_commit`]).
//!
//! Invariant: each scenario's keys are its own (a fresh prefix per call), so the suite
//! runs beside any other test on a shared database; a breach panics naming the scenario
//! and the engine.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idemcache::layer::{Claimed, HeldTransaction, Idempotency, IdempotencyLayer, LayerBody};
use idemcache::store::{OneCommit, Store, TransactionalStore};
use tower_layer::Layer;
use tower_service::Service;

pub mod claims;
pub use claims::{after_a_kill_between_claim_and_commit, claim_and_wait_to_be_killed};

/// The transaction of an engine's store.
pub type Tx<E> = <<E as Orders>::Store as TransactionalStore>::Transaction;

/// What a boxed future of the suite's is: `Send`, borrowing nothing it outlives.
pub type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An engine's orders table and its store, as the suite needs them: each driver's test
/// writes one (a handful of statements in its own dialect) and calls [`run`].
pub trait Orders: Send + Sync + 'static {
    /// The store under test.
    type Store: TransactionalStore + Store + Clone;

    /// The engine's name, in a breach's message.
    fn engine(&self) -> &'static str;

    /// The store, its schema and the orders table (`key`, `item`) made.
    fn store(&self) -> Self::Store;

    /// Inserts the order (`key`, `item`) in `tx`.
    fn write<'a>(tx: &'a mut Tx<Self>, key: String, item: String) -> Boxed<'a, ()>;

    /// Whether the record of `key` (its stored form, `Key::as_bytes`) has a lease that
    /// ended by the database's clock, as `tx` sees it (the uncommitted claim).
    fn lease_ended<'a>(tx: &'a mut Tx<Self>, key: Vec<u8>) -> Boxed<'a, bool>;

    /// The orders committed under the client key `key`, and the records whose stored
    /// key holds it.
    fn committed(&self, key: &str) -> Boxed<'_, (i64, i64)>;

    /// The correlation id the record whose stored key holds `key` keeps.
    fn correlation_id(&self, key: &str) -> Boxed<'_, Option<String>>;

    /// How many sessions wait for a lock on the records now, or `None` if the engine
    /// cannot tell (SQLite's wait for its write lock is inside the waiting connection).
    fn claims_waiting(&self) -> Boxed<'_, Option<i64>>;
}

/// Runs every scenario against `engine`'s store. Panics on the first breach.
pub async fn run<E: Orders>(engine: &E) {
    let run = unique_prefix();
    commit_together_and_replay(engine, &run).await;
    a_response_not_kept_leaves_nothing(engine, &run).await;
    a_duplicate_waits_then_replays(engine, &run).await;
    a_transaction_outliving_its_lease_commits_nothing(engine, &run).await;
    the_record_keeps_the_correlation_id(engine, &run).await;
    claims::run(engine, &run).await;
}

/// A prefix of keys no other call of the suite (in any process, on any engine) uses:
/// a test's keys of its own on a shared database.
pub fn unique_prefix() -> String {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    format!("one-commit-{}-{}-{call}", std::process::id(), at.as_nanos())
}

/// The orders handler: writes the order named by the request's key and body in the
/// layer's transaction, then answers `status`, held by `gate` until the test lets go.
struct Shop<E: Orders> {
    runs: Arc<AtomicUsize>,
    status: StatusCode,
    gate: Arc<tokio::sync::RwLock<()>>,
    entered: Arc<tokio::sync::Notify>,
    /// Writes nothing: waits in the transaction until its lease ended, then writes.
    outlive: bool,
    engine: std::marker::PhantomData<fn() -> E>,
}

impl<E: Orders> Clone for Shop<E> {
    fn clone(&self) -> Self {
        Shop {
            runs: self.runs.clone(),
            status: self.status,
            gate: self.gate.clone(),
            entered: self.entered.clone(),
            outlive: self.outlive,
            engine: std::marker::PhantomData,
        }
    }
}

impl<E: Orders> Shop<E> {
    fn new(status: StatusCode) -> Self {
        Shop {
            runs: Arc::default(),
            status,
            gate: Arc::default(),
            entered: Arc::default(),
            outlive: false,
            engine: std::marker::PhantomData,
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

type Guarded = Request<LayerBody<Full<Bytes>>>;

impl<E: Orders> Service<Guarded> for Shop<E> {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Boxed<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Guarded) -> Self::Future {
        let shop = self.clone();
        Box::pin(async move {
            shop.runs.fetch_add(1, Ordering::SeqCst);
            let held = request.extensions().get::<HeldTransaction<Tx<E>>>().cloned();
            let held = held.expect("the layer lends its transaction");
            let claimed = request.extensions().get::<Claimed>().cloned().expect("a claim");
            let key = claimed.key().client_key().to_owned();
            let item = request.into_body().collect().await.expect("a body").to_bytes();
            let item = String::from_utf8_lossy(&item).into_owned();
            {
                let mut tx = held.lock().await.expect("the transaction is open");
                if shop.outlive {
                    let stored = claimed.key().as_bytes().to_vec();
                    while !E::lease_ended(&mut tx, stored.clone()).await {
                        tokio::task::yield_now().await;
                    }
                }
                E::write(&mut tx, key, item.clone()).await;
            }
            shop.entered.notify_one();
            drop(shop.gate.read().await);
            let body = Full::from(format!("order of {item}"));
            Ok(Response::builder().status(shop.status).body(body).expect("a response"))
        })
    }
}

/// The layer in one-commit mode over `one_commit`, around `shop`.
fn app<E: Orders>(
    one_commit: OneCommit<E::Store>,
    shop: &Shop<E>,
    wait: Option<Duration>,
) -> Idempotency<Shop<E>> {
    let mut layer = IdempotencyLayer::one_commit(one_commit);
    if let Some(wait) = wait {
        layer = layer.wait(wait);
    }
    layer.layer(shop.clone())
}

/// What an answer says: its status, whether it is a replay, its body.
type Answer = (StatusCode, bool, Bytes);

async fn send<E: Orders>(
    app: &Idempotency<Shop<E>>,
    key: &str,
    item: &'static str,
    trace: Option<&str>,
) -> Answer {
    let mut request = Request::post("/orders").header("idempotency-key", key);
    if let Some(trace) = trace {
        request = request.header("traceparent", trace);
    }
    let request = request.body(Full::from(item)).expect("a request");
    let mut app = app.clone();
    std::future::poll_fn(|cx| app.poll_ready(cx)).await.expect("ready");
    let response = app.call(request).await.expect("answered");
    let replayed = response.headers().contains_key("idempotent-replayed");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    (parts.status, replayed, body)
}

async fn commit_together_and_replay<E: Orders>(engine: &E, run: &str) {
    let on = engine.engine();
    let shop = Shop::<E>::new(StatusCode::CREATED);
    let app = app(OneCommit::new(engine.store()), &shop, None);
    let key = format!("{run}-commit");
    let first = send(&app, &key, "tea", None).await;
    assert_eq!(first, (StatusCode::CREATED, false, "order of tea".into()), "{on}");
    assert_eq!(engine.committed(&key).await, (1, 1), "{on}: the order and its record");
    let again = send(&app, &key, "tea", None).await;
    assert_eq!(again, (StatusCode::CREATED, true, "order of tea".into()), "{on}: a replay");
    // Another process's layer finds the same committed record.
    let other = self::app(OneCommit::new(engine.store()), &shop, None);
    assert!(send(&other, &key, "tea", None).await.1, "{on}: replayed by another layer");
    let reused = send(&other, &key, "cake", None).await.0;
    assert_eq!(reused, StatusCode::UNPROCESSABLE_ENTITY, "{on}: the key reused");
    assert_eq!(shop.runs(), 1, "{on}: the handler ran once");
    assert_eq!(engine.committed(&key).await, (1, 1), "{on}");
}

async fn a_response_not_kept_leaves_nothing<E: Orders>(engine: &E, run: &str) {
    let on = engine.engine();
    let shop = Shop::<E>::new(StatusCode::SERVICE_UNAVAILABLE);
    let app = app(OneCommit::new(engine.store()), &shop, None);
    let key = format!("{run}-rollback");
    assert_eq!(send(&app, &key, "tea", None).await.0, StatusCode::SERVICE_UNAVAILABLE, "{on}");
    assert_eq!(engine.committed(&key).await, (0, 0), "{on}: rolled back with the claim");
    assert_eq!(send(&app, &key, "tea", None).await.0, StatusCode::SERVICE_UNAVAILABLE, "{on}");
    assert_eq!(shop.runs(), 2, "{on}: a retry runs again");
    assert_eq!(engine.committed(&key).await, (0, 0), "{on}");
}

async fn a_duplicate_waits_then_replays<E: Orders>(engine: &E, run: &str) {
    let on = engine.engine();
    for wait in [Some(Duration::from_secs(20)), None] {
        let shop = Shop::<E>::new(StatusCode::CREATED);
        let app = app(OneCommit::new(engine.store()), &shop, wait);
        let key = format!("{run}-duplicate-{}", wait.is_some());
        let held = shop.gate.clone().write_owned().await;
        let first = tokio::spawn({
            let (app, key) = (app.clone(), key.clone());
            async move { send(&app, &key, "tea", None).await }
        });
        shop.entered.notified().await;
        let duplicate = tokio::spawn({
            let (app, key) = (app.clone(), key.clone());
            async move { send(&app, &key, "tea", None).await }
        });
        if wait.is_none() {
            // No wait: 409 with the first still open (after the least wait the engine
            // can bound a lock wait by).
            let (status, replayed, _) = duplicate.await.expect("the duplicate");
            assert_eq!((status, replayed), (StatusCode::CONFLICT, false), "{on}: no wait");
            drop(held);
            assert_eq!(first.await.expect("the first").0, StatusCode::CREATED, "{on}");
        } else {
            // The duplicate's claim waits on the first's transaction, where the engine
            // can show it.
            while engine.claims_waiting().await == Some(0) {
                assert!(!duplicate.is_finished(), "{on}: the duplicate answered while held");
                tokio::task::yield_now().await;
            }
            drop(held);
            assert_eq!(first.await.expect("the first").0, StatusCode::CREATED, "{on}");
            let answer = duplicate.await.expect("the duplicate");
            let replay = (StatusCode::CREATED, true, "order of tea".into());
            assert_eq!(answer, replay, "{on}: the duplicate replays the first's commit");
        }
        assert_eq!(shop.runs(), 1, "{on}: the handler ran once");
        assert_eq!(engine.committed(&key).await, (1, 1), "{on}");
    }
}

async fn a_transaction_outliving_its_lease_commits_nothing<E: Orders>(engine: &E, run: &str) {
    let on = engine.engine();
    let mut shop = Shop::<E>::new(StatusCode::CREATED);
    shop.outlive = true;
    let one_commit = OneCommit::new(engine.store()).with_lease(Duration::from_millis(50));
    let app = app(one_commit, &shop, None);
    let key = format!("{run}-lease");
    let (status, replayed, body) = send(&app, &key, "tea", None).await;
    assert_eq!((status, replayed), (StatusCode::SERVICE_UNAVAILABLE, false), "{on}");
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("idempotency_store_unavailable"), "{on}: {body}");
    assert_eq!(engine.committed(&key).await, (0, 0), "{on}: neither the order nor the claim");
}

async fn the_record_keeps_the_correlation_id<E: Orders>(engine: &E, run: &str) {
    let on = engine.engine();
    let shop = Shop::<E>::new(StatusCode::CREATED);
    let app = app(OneCommit::new(engine.store()), &shop, None);
    let key = format!("{run}-traced");
    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    assert_eq!(send(&app, &key, "tea", Some(trace)).await.0, StatusCode::CREATED, "{on}");
    let kept = engine.correlation_id(&key).await;
    assert_eq!(kept.as_deref(), Some("4bf92f3577b34da6a3ce929d0e0e4736"), "{on}");
}
