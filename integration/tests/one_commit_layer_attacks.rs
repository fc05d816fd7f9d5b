//! The layer's one-commit mode over PostgreSQL, attacked: a commit that fails, an outcome
//! marked unknown, a body that fails mid-way, a panic, a client gone mid-handler, fresh
//! pools (the claim's statement not yet prepared), the handler's own lock waits, a
//! session's own `lock_timeout`, records made by `Tiered` over the same table (in flight,
//! and lapsed: taken over, the old holder fenced), and a handler's 4xx after one of its
//! statements failed. Skipped, saying why, without `IDEMCACHE_POSTGRES_URL`.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use bytes::Bytes;
use http_body::Frame;
use http_body_util::BodyExt;
use tower::ServiceExt;

use idemcache::layer::{HeldTransaction, IdempotencyLayer, OutcomeUnknown};
use idemcache::store::{conformance, OneCommit, Tiered};
use idemcache::Cache;
use idemcache_postgres::{PooledTransaction, PostgresStore};

const ORDERS: &str = "oc_attacks_orders";
const DEFERRED: &str = "oc_attacks_deferred";

fn url() -> Option<String> {
    conformance::service_url("IDEMCACHE_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
}

async fn store() -> Option<PostgresStore> {
    let store = PostgresStore::connect(&url()?).await.unwrap();
    idemcache::store::Store::ensure_schema(&store).await.unwrap();
    let client = store.pool().get().await.unwrap();
    let sql = format!(
        "BEGIN; SELECT pg_advisory_xact_lock(72432); \
         CREATE TABLE IF NOT EXISTS {ORDERS} (key TEXT NOT NULL, item TEXT); \
         CREATE TABLE IF NOT EXISTS {DEFERRED} (k TEXT, \
           CONSTRAINT oc_attacks_deferred_u UNIQUE (k) DEFERRABLE INITIALLY DEFERRED); \
         CREATE TABLE IF NOT EXISTS oc_attacks_locks (id INT PRIMARY KEY); \
         INSERT INTO oc_attacks_locks VALUES (1) ON CONFLICT DO NOTHING; COMMIT"
    );
    client.batch_execute(&sql).await.unwrap();
    Some(store)
}

fn fresh(name: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    format!("oc-attacks-{name}-{}-{}", std::process::id(), nanos.as_nanos())
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Plain,
    Unknown,
    BadBody,
    Panic,
    Deferred,
    /// Checks from another connection that the claim is not visible yet.
    Invisible,
    /// SELECT .. FOR UPDATE on a row the test holds.
    LockWait,
    /// A statement fails (unique violation); the handler answers its own 4xx.
    Duplicate,
}

#[derive(Clone)]
struct Shop {
    runs: Arc<AtomicUsize>,
    status: StatusCode,
    mode: Mode,
    gate: Arc<tokio::sync::RwLock<()>>,
    entered: Arc<tokio::sync::Notify>,
    other: Option<PostgresStore>,
    seen: Arc<AtomicUsize>,
}

impl Shop {
    fn new(status: StatusCode, mode: Mode) -> Shop {
        Shop {
            runs: Arc::default(),
            status,
            mode,
            gate: Arc::default(),
            entered: Arc::default(),
            other: None,
            seen: Arc::default(),
        }
    }
}

struct Failing(u8);

impl http_body::Body for Failing {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        this.0 += 1;
        match this.0 {
            1 => Poll::Ready(Some(Ok(Frame::data(Bytes::from("part"))))),
            _ => Poll::Ready(Some(Err(std::io::Error::other("broke")))),
        }
    }
}

async fn create(
    State(shop): State<Shop>,
    Extension(held): Extension<HeldTransaction<PooledTransaction>>,
    request: Request<Body>,
) -> Response {
    shop.runs.fetch_add(1, Ordering::SeqCst);
    let key = request.headers()["idempotency-key"].to_str().unwrap().to_owned();
    {
        let tx = held.lock().await.unwrap();
        let sql = format!("INSERT INTO {ORDERS} (key, item) VALUES ($1, 'x')");
        tx.execute(&sql, &[&key]).await.unwrap();
        match shop.mode {
            Mode::Deferred => {
                let sql = format!("INSERT INTO {DEFERRED} (k) VALUES ($1), ($1)");
                tx.execute(&sql, &[&key]).await.unwrap();
            }
            Mode::Duplicate => {
                let failed = tx.execute("INSERT INTO oc_attacks_locks (id) VALUES (1)", &[]).await;
                assert!(failed.is_err());
            }
            Mode::LockWait => {
                shop.entered.notify_one();
                tx.query_one("SELECT id FROM oc_attacks_locks WHERE id = 1 FOR UPDATE", &[])
                    .await
                    .unwrap();
            }
            _ => {}
        }
    }
    if shop.mode == Mode::Invisible {
        let other = shop.other.as_ref().unwrap().pool().get().await.unwrap();
        let sql = "SELECT count(*) FROM idemcache_records WHERE position($1::bytea in key) > 0";
        let n: i64 = other.query_one(sql, &[&key.as_bytes()]).await.unwrap().get(0);
        shop.seen.fetch_add(n as usize, Ordering::SeqCst);
    }
    if shop.mode != Mode::LockWait {
        shop.entered.notify_one();
    }
    drop(shop.gate.read().await);
    if shop.mode == Mode::Panic {
        panic!("handler panics after its insert");
    }
    let mut response = (shop.status, "done").into_response();
    if shop.mode == Mode::Unknown {
        response.extensions_mut().insert(OutcomeUnknown);
    }
    if shop.mode == Mode::BadBody {
        response = Response::builder().status(shop.status).body(Body::new(Failing(0))).unwrap();
    }
    response
}

fn app_with(layer: IdempotencyLayer, shop: Shop) -> Router {
    Router::new().route("/orders", post(create)).route_layer(layer).with_state(shop)
}

fn app(store: &PostgresStore, shop: Shop, wait: Option<Duration>) -> Router {
    let mut layer = IdempotencyLayer::one_commit(OneCommit::new(store.clone()));
    if let Some(wait) = wait {
        layer = layer.wait(wait);
    }
    app_with(layer, shop)
}

async fn send(app: &Router, key: &str) -> (StatusCode, bool, String) {
    let request = Request::post("/orders").header("idempotency-key", key).body(Body::from("x"));
    let response = app.clone().oneshot(request.unwrap()).await.unwrap();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let (parts, body) = response.into_parts();
    let body = match body.collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
        Err(e) => format!("<body error {e}>"),
    };
    (parts.status, replayed, body)
}

async fn committed(store: &PostgresStore, key: &str) -> (i64, i64) {
    let client = store.pool().get().await.unwrap();
    let sql = format!("SELECT count(*) FROM {ORDERS} WHERE key = $1");
    let orders: i64 = client.query_one(&sql, &[&key]).await.unwrap().get(0);
    let sql = "SELECT count(*) FROM idemcache_records WHERE position($1::bytea in key) > 0";
    let records: i64 = client.query_one(sql, &[&key.as_bytes()]).await.unwrap().get(0);
    (orders, records)
}

/// A COMMIT that fails (a deferred unique violation) answers 503, never 201.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn commit_failure_answers_503() {
    let Some(store) = store().await else { return };
    let shop = Shop::new(StatusCode::CREATED, Mode::Deferred);
    let app = app(&store, shop.clone(), None);
    let key = fresh("deferred");
    let (status, _, body) = send(&app, &key).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(committed(&store, &key).await, (0, 0));
}

/// OutcomeUnknown rolls back; the client must not be told 201.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn outcome_unknown_rolls_back_and_is_not_answered_as_done() {
    let Some(store) = store().await else { return };
    let shop = Shop::new(StatusCode::CREATED, Mode::Unknown);
    let app = app(&store, shop.clone(), None);
    let key = fresh("unknown");
    let (status, _, body) = send(&app, &key).await;
    let after = committed(&store, &key).await;
    eprintln!("OutcomeUnknown: answered {status} {body:?}; committed {after:?}");
    assert_eq!(after, (0, 0), "rolled back");
    let again = send(&app, &key).await;
    assert_eq!(shop.runs.load(Ordering::SeqCst), 2, "a retry runs again: {again:?}");
    assert_ne!(status, StatusCode::CREATED, "answered 201 although nothing committed");
}

/// A body failing mid-way rolls back; a retry runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn body_failing_midway_rolls_back() {
    let Some(store) = store().await else { return };
    let shop = Shop::new(StatusCode::CREATED, Mode::BadBody);
    let app = app(&store, shop.clone(), None);
    let key = fresh("badbody");
    let (status, _, body) = send(&app, &key).await;
    assert_eq!(committed(&store, &key).await, (0, 0));
    assert!(status.is_server_error(), "{body}");
    send(&app, &key).await;
    assert_eq!(shop.runs.load(Ordering::SeqCst), 2);
}

/// A panic rolls back; a retry runs again; no connection left in a transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn panic_rolls_back() {
    let Some(store) = store().await else { return };
    let shop = Shop::new(StatusCode::CREATED, Mode::Panic);
    let app = app(&store, shop.clone(), None);
    let key = fresh("panic");
    let (status, _, body) = send(&app, &key).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(committed(&store, &key).await, (0, 0));
    let (status, ..) = send(&app, &key).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(shop.runs.load(Ordering::SeqCst), 2);
    assert_pool_clean(&store).await;
}

/// No idle connection of the pool is inside a transaction with writes.
async fn assert_pool_clean(store: &PostgresStore) {
    let n = store.pool().status().available;
    let mut held = Vec::new();
    for _ in 0..n {
        held.push(store.pool().get().await.unwrap());
    }
    for client in &held {
        let row =
            client.query_one("SELECT pg_current_xact_id_if_assigned()::text", &[]).await.unwrap();
        let xid: Option<String> = row.get(0);
        assert_eq!(xid, None, "a pooled connection is inside a transaction");
    }
}

/// A client gone mid-handler: the execution is detached, so it finishes and commits;
/// no pooled connection is left inside a transaction, and the key replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn request_dropped_mid_handler() {
    let Some(store) = store().await else { return };
    let shop = Shop::new(StatusCode::CREATED, Mode::Plain);
    let app = app(&store, shop.clone(), None);
    let key = fresh("dropped");
    let held = shop.gate.clone().write_owned().await;
    let first = tokio::spawn({
        let (app, key) = (app.clone(), key.clone());
        async move { send(&app, &key).await }
    });
    shop.entered.notified().await;
    first.abort();
    assert!(first.await.is_err());
    drop(held);
    // The execution is detached: it finishes and commits with nobody to answer.
    while committed(&store, &key).await != (1, 1) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_pool_clean(&store).await;
    let (status, replayed, _) = send(&app, &key).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
}

/// On fresh pools (statement not yet prepared), the claim is never visible to
/// others before the commit, and a rolled-back one leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn fresh_pool_claim_runs_inside_the_transaction() {
    let Some(other) = store().await else { return };
    for i in 0..8 {
        let store = PostgresStore::connect(&url().unwrap()).await.unwrap();
        let mut shop = Shop::new(
            if i % 2 == 0 { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::CREATED },
            Mode::Invisible,
        );
        shop.other = Some(other.clone());
        let app = app(&store, shop.clone(), None);
        let key = fresh("freshpool");
        let (status, ..) = send(&app, &key).await;
        assert_eq!(shop.seen.load(Ordering::SeqCst), 0, "claim visible before commit");
        let want = if i % 2 == 0 { (0, 0) } else { (1, 1) };
        assert_eq!(committed(&other, &key).await, want, "{status}");
    }
}

/// The claim's short wait does not bound the handler's own lock waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn handler_lock_wait_not_bounded_by_claim_wait() {
    let Some(store) = store().await else { return };
    let shop = Shop::new(StatusCode::CREATED, Mode::LockWait);
    let app = app(&store, shop.clone(), Some(Duration::from_millis(20)));
    let key = fresh("lockwait");
    let mut locker = store.pool().get().await.unwrap();
    let ltx = locker.transaction().await.unwrap();
    ltx.query_one("SELECT id FROM oc_attacks_locks WHERE id = 1 FOR UPDATE", &[]).await.unwrap();
    let first = tokio::spawn({
        let (app, key) = (app.clone(), key.clone());
        async move { send(&app, &key).await }
    });
    shop.entered.notified().await;
    let watcher = store.pool().get().await.unwrap();
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                   AND query LIKE '%oc_attacks_locks%FOR UPDATE%' AND pid <> pg_backend_pid()";
    let start = std::time::Instant::now();
    // Wait until the handler is blocked, and well past the claim's 20 ms.
    loop {
        let n: i64 = watcher.query_one(waiting, &[]).await.unwrap().get(0);
        if (n > 0 && start.elapsed() > Duration::from_millis(300)) || first.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ltx.rollback().await.unwrap();
    let (status, _, body) = first.await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(committed(&store, &key).await, (1, 1));
}

/// A Tiered execution in flight: a one-commit duplicate gets 409, then replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn one_commit_meets_tiered_in_flight() {
    let Some(store) = store().await else { return };
    let gate = Arc::new(tokio::sync::RwLock::new(()));
    let entered = Arc::new(tokio::sync::Notify::new());
    let tiered =
        IdempotencyLayer::tiered(Tiered::new(Cache::builder().build().unwrap(), store.clone()));
    let tiered_app = Router::new()
        .route(
            "/orders",
            post({
                let (gate, entered) = (gate.clone(), entered.clone());
                move || async move {
                    entered.notify_one();
                    drop(gate.read().await);
                    (StatusCode::CREATED, "tiered")
                }
            }),
        )
        .route_layer(tiered);
    let shop = Shop::new(StatusCode::CREATED, Mode::Plain);
    let one = app(&store, shop.clone(), None);
    let key = fresh("tiered-a");
    let held = gate.clone().write_owned().await;
    let first = tokio::spawn({
        let (t, key) = (tiered_app.clone(), key.clone());
        async move { send(&t, &key).await }
    });
    entered.notified().await;
    let request = Request::post("/orders").header("idempotency-key", &key).body(Body::from("x"));
    let response = one.clone().oneshot(request.unwrap()).await.unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    drop(held);
    assert_eq!(first.await.unwrap().0, StatusCode::CREATED);
    let again = send(&one, &key).await;
    assert!(again.1 && again.2 == "tiered");
    assert_eq!(shop.runs.load(Ordering::SeqCst), 0);
}

/// A lapsed store claim (Tiered's kind) is taken over by a one-commit request;
/// the old holder's completion is fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn one_commit_takes_over_a_lapsed_store_claim_and_fences_it() {
    use idemcache::store::{Store, StoreClaim, StoreError};
    let Some(store) = store().await else { return };
    let shop = Shop::new(StatusCode::CREATED, Mode::Plain);
    let app = app(&store, shop.clone(), None);
    let client_key = fresh("fence");
    let key = idemcache::Key::without_tenant("POST /orders", client_key.as_str()).unwrap();
    let fp = idemcache::Fingerprint::builder().method("POST").path("/orders").body(b"x").finish();
    let claimed = Store::claim(&store, &key, fp, Duration::from_millis(200)).await.unwrap();
    let StoreClaim::Acquired { token, lease_ends_at, .. } = claimed else { panic!("{claimed:?}") };
    let (status, _, body) = send(&app, &client_key).await;
    assert_eq!(status, StatusCode::CONFLICT, "a live claim is in progress: {body}");
    while std::time::SystemTime::now() < lease_ends_at + Duration::from_millis(50) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, replayed, body) = send(&app, &client_key).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{body}");
    let late =
        Store::complete(&store, &key, token, Some(Bytes::from("late")), Duration::from_secs(60))
            .await;
    assert!(matches!(late, Err(StoreError::LeaseLost(_))), "{late:?}");
    let again = send(&app, &client_key).await;
    assert!(again.1 && again.2 == "done", "{again:?}");
}

/// A session-level lock_timeout survives the claim's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn postgres_session_lock_timeout_survives_the_claim() {
    use idemcache::store::{StoreClaim, TransactionalStore};
    let Some(_) = store().await else { return };
    let store = PostgresStore::connect(&url().unwrap()).await.unwrap();
    store.pool().resize(1);
    let client = store.pool().get().await.unwrap();
    client.batch_execute("SET lock_timeout = '3s'").await.unwrap();
    drop(client);
    let key = idemcache::Key::without_tenant("POST /orders", fresh("session").as_str()).unwrap();
    let fp = idemcache::Fingerprint::of(b"x");
    let mut tx = TransactionalStore::begin(&store).await.unwrap();
    let before: String = tx.query_one("SHOW lock_timeout", &[]).await.unwrap().get(0);
    let claimed = TransactionalStore::claim_in(
        &store,
        &mut tx,
        &key,
        fp,
        Duration::from_secs(30),
        Duration::from_millis(5),
        None,
    )
    .await
    .unwrap();
    assert!(matches!(claimed, StoreClaim::Acquired { .. }));
    let after: String = tx.query_one("SHOW lock_timeout", &[]).await.unwrap().get(0);
    TransactionalStore::rollback(&store, tx).await.unwrap();
    assert_eq!(after, before);
}

/// A handler whose statement failed answers its own 4xx (kept by default): the
/// transaction is aborted, so the completion fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn handler_4xx_after_failed_statement() {
    let Some(store) = store().await else { return };
    let shop = Shop::new(StatusCode::CONFLICT, Mode::Duplicate);
    let app = app(&store, shop.clone(), None);
    let key = fresh("dup4xx");
    // The failed statement aborted the transaction (PostgreSQL): the 409 cannot be
    // recorded, so the client is told nothing was done (as documented: answer a 5xx
    // after a failed statement, or use a savepoint), and nothing was committed.
    let (status, _, body) = send(&app, &key).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(committed(&store, &key).await, (0, 0));
    send(&app, &key).await;
    assert_eq!(shop.runs.load(Ordering::SeqCst), 2, "a retry runs again");
}
