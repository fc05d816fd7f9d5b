//! Completion inside the handler's own transaction (`InTransaction`, `complete_in`):
//! the order and its record commit together, or neither does.
//!
//! - Over the layer: the handler's record is what repeats replay, and the layer writes
//!   none of its own; a handler that rolls back releases the key (nothing committed), so
//!   a retry runs again; a handler that holds its transaction open past several lease
//!   beats is not stalled by a renewal waiting on the record's row (PostgreSQL); a
//!   handler answering with axum's `Json` records the response it returns
//!   (`record_response`), and repeats replay it byte for byte (PostgreSQL).
//! - At the store: the two crash instants (before and after the commit) leave a record
//!   that is replayed, or one that lapses and is run again; a claim whose key was taken
//!   over is refused and changes nothing. Real process kills are `.ci/orders-crash`'s.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use bytes::Bytes;
use http_body_util::BodyExt;
use tower::ServiceExt;

use idemcache::layer::{IdempotencyLayer, InTransaction};
use idemcache::store::{
    conformance, OpenClaim, Store, StoreClaim, StoreError, Tiered, TieredClaim,
};
use idemcache::{Cache, Fingerprint, Key};
use idemcache_sqlite::rusqlite::{params, Connection, TransactionBehavior};
use idemcache_sqlite::{complete_in, SqliteStore};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idemcache-in-tx-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("shop.db")
}

/// The shop's own connection to the store's database, and its orders table.
fn shop_db(path: &std::path::Path) -> Connection {
    let db = Connection::open(path).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    db.execute_batch(
        "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, body BLOB NOT NULL)",
    )
    .unwrap();
    db
}

async fn store(path: &std::path::Path, lease: Duration) -> Tiered<SqliteStore> {
    let store = SqliteStore::open_path(path).await.unwrap();
    store.ensure_schema().await.unwrap();
    Tiered::new(Cache::builder().build().unwrap(), store).with_lease(lease)
}

#[derive(Clone)]
struct Shop {
    path: PathBuf,
    runs: Arc<AtomicUsize>,
    /// Requests whose transaction the handler rolls back after recording (answering 500).
    roll_back: Arc<AtomicUsize>,
}

/// Inserts the order and records the response in one transaction.
async fn create(
    State(shop): State<Shop>,
    held: Option<Extension<InTransaction>>,
    body: Bytes,
) -> Response {
    shop.runs.fetch_add(1, Ordering::SeqCst);
    let mut db = shop_db(&shop.path);
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    tx.execute("INSERT INTO orders (body) VALUES (?1)", params![body.to_vec()]).unwrap();
    let id = tx.last_insert_rowid();
    let mut headers = HeaderMap::new();
    headers.insert(header::LOCATION, HeaderValue::from_str(&format!("/orders/{id}")).unwrap());
    let answer = format!("{{\"id\":{id}}}");
    let Some(Extension(held)) = held else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "no claim handed over").into_response();
    };
    let record = held.record(StatusCode::CREATED, &headers, answer.as_bytes()).unwrap();
    assert!(
        held.record(StatusCode::SERVICE_UNAVAILABLE, &headers, b"").is_none(),
        "a 5xx is not kept"
    );
    if let Err(e) = complete_in(&tx, held.claim(), Some(&record)) {
        return (StatusCode::CONFLICT, e.to_string()).into_response();
    }
    if shop.roll_back.load(Ordering::SeqCst) > 0 {
        shop.roll_back.fetch_sub(1, Ordering::SeqCst);
        drop(tx);
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    tx.commit().unwrap();
    (StatusCode::CREATED, headers, answer).into_response()
}

fn app(tiered: Tiered<SqliteStore>, shop: Shop) -> Router {
    Router::new()
        .route("/orders", post(create))
        .route_layer(IdempotencyLayer::tiered(tiered))
        .with_state(shop)
}

async fn send(app: &Router, key: &str, body: &'static str) -> (StatusCode, HeaderMap, Bytes) {
    let request = Request::post("/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    (parts.status, parts.headers, body.collect().await.unwrap().to_bytes())
}

fn orders(path: &std::path::Path) -> i64 {
    shop_db(path).query_row("SELECT COUNT(*) FROM orders", [], |r| r.get(0)).unwrap()
}

/// The stored records: `(state, body)` of each (2 is COMPLETED).
fn records(path: &std::path::Path) -> Vec<(i64, Option<Vec<u8>>)> {
    let db = shop_db(path);
    let mut rows = db.prepare("SELECT state, body FROM idemcache_records").unwrap();
    rows.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_and_its_record_commit_together_and_repeats_replay_the_handlers_record() {
    let path = scratch("together");
    let shop = Shop { path: path.clone(), runs: Default::default(), roll_back: Default::default() };
    let app = app(store(&path, Duration::from_secs(30)).await, shop.clone());
    let (status, headers, body) = send(&app, "k-1", "{\"item\":\"book\"}").await;
    assert_eq!((status, &body[..]), (StatusCode::CREATED, &b"{\"id\":1}"[..]));
    assert!(headers.get("idempotent-replayed").is_none());
    // One record, COMPLETED, written by the handler: the layer did not write its own.
    let stored = records(&path);
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].0, 2, "the record is COMPLETED");
    // A fresh instance (its cache empty) replays what the handler's transaction stored.
    let other = app_over_fresh_cache(&path, shop.clone()).await;
    for app in [&app, &other] {
        let (status, headers, body) = send(app, "k-1", "{\"item\":\"book\"}").await;
        assert_eq!((status, &body[..]), (StatusCode::CREATED, &b"{\"id\":1}"[..]));
        assert_eq!(headers.get("idempotent-replayed").unwrap(), "true");
        assert_eq!(headers.get(header::LOCATION).unwrap(), "/orders/1");
    }
    assert_eq!((shop.runs.load(Ordering::SeqCst), orders(&path)), (1, 1));
}

async fn app_over_fresh_cache(path: &std::path::Path, shop: Shop) -> Router {
    app(store(path, Duration::from_secs(30)).await, shop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_rolls_back_after_recording_releases_the_key_and_a_retry_runs() {
    let path = scratch("rollback");
    let shop = Shop { path: path.clone(), runs: Default::default(), roll_back: Arc::new(1.into()) };
    let app = app(store(&path, Duration::from_secs(30)).await, shop.clone());
    let (status, _, _) = send(&app, "k-2", "{}").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    // Nothing committed: no order, and no record (the layer released the claim at once,
    // rather than leaving it PROCESSING until its lease lapsed).
    assert_eq!((orders(&path), records(&path).len()), (0, 0));
    let (status, _, body) = send(&app, "k-2", "{}").await;
    assert_eq!((status, &body[..]), (StatusCode::CREATED, &b"{\"id\":1}"[..]));
    assert_eq!((shop.runs.load(Ordering::SeqCst), orders(&path)), (2, 1));
}

/// The decisions reported for a handler that records in its own transaction follow what
/// its transaction did: one rolled back (the key released, a retry runs again) is
/// `released`, as `Decision::Released` and `Acquired`'s docs say; only a committed record
/// is `acquired`. (It was reported `acquired` either way.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_rolls_back_is_reported_released_and_one_that_commits_acquired() {
    use idemcache::layer::Decision;
    let path = scratch("rollback-decision");
    let shop = Shop { path: path.clone(), runs: Default::default(), roll_back: Arc::new(1.into()) };
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let hook = seen.clone();
    let layer = IdempotencyLayer::tiered(store(&path, Duration::from_secs(30)).await)
        .on_decision(move |event| hook.lock().unwrap().push(event.decision));
    let app = Router::new().route("/orders", post(create)).route_layer(layer).with_state(shop);
    let (status, _, _) = send(&app, "k-3", "{}").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(*seen.lock().unwrap(), [Decision::Released], "rolled back: nothing recorded");
    let (status, _, _) = send(&app, "k-3", "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, headers, _) = send(&app, "k-3", "{}").await;
    assert_eq!(headers.get("idempotent-replayed").unwrap(), "true");
    assert_eq!(*seen.lock().unwrap(), [Decision::Released, Decision::Acquired, Decision::Replayed]);
}

fn key(name: &str) -> Key {
    Key::new("POST /orders", "user:1", name).unwrap()
}

/// Claims `k` until the store lets it go (a lease lapsing), within ten seconds.
async fn acquired(
    tiered: &Tiered<SqliteStore>,
    k: &Key,
) -> idemcache::store::TieredGuard<SqliteStore> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match tiered.claim(k, Fingerprint::of(b"order")).await.unwrap() {
            TieredClaim::Acquired(guard) => return guard,
            other => assert!(Instant::now() < deadline, "never acquired: {other:?}"),
        }
        conformance::pause(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_commit_replays_and_a_crash_before_it_runs_again() {
    let path = scratch("crash");
    let lease = Duration::from_millis(200);
    // After the commit: the process dies before the layer does anything more.
    let k = key("after-commit");
    let first = store(&path, lease).await;
    let guard = acquired(&first, &k).await;
    let mut db = shop_db(&path);
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    tx.execute("INSERT INTO orders (body) VALUES (x'01')", []).unwrap();
    complete_in(&tx, &guard.open_claim(), Some(b"the order")).unwrap();
    tx.commit().unwrap();
    std::mem::forget(guard); // no release, no completion: the process is gone
    drop(first);
    let restarted = store(&path, lease).await;
    match restarted.claim(&k, Fingerprint::of(b"order")).await.unwrap() {
        TieredClaim::Completed(replay) => {
            assert_eq!(replay.body.as_deref(), Some(&b"the order"[..]))
        }
        other => panic!("expected the replay, got {other:?}"),
    }
    // Before the commit: the transaction never commits; the record lapses and a retry
    // runs again, with nothing of the first attempt committed.
    let k = key("before-commit");
    let first = store(&path, lease).await;
    let guard = acquired(&first, &k).await;
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    tx.execute("INSERT INTO orders (body) VALUES (x'02')", []).unwrap();
    complete_in(&tx, &guard.open_claim(), Some(b"never committed")).unwrap();
    drop(tx);
    std::mem::forget(guard);
    drop(first);
    let restarted = store(&path, lease).await;
    let retry = acquired(&restarted, &k).await;
    retry.complete(&b"the retry's order"[..]).await.unwrap();
    assert_eq!(orders(&path), 1, "only the committed order exists");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_key_was_taken_over_is_refused_and_its_transaction_keeps_nothing() {
    let path = scratch("fenced");
    let k = key("taken-over");
    let (one, two) = (
        store(&path, Duration::from_millis(150)).await,
        store(&path, Duration::from_secs(30)).await,
    );
    let stale = acquired(&one, &k).await;
    let stale_claim = stale.open_claim();
    let owner = acquired(&two, &k).await; // once the stale lease lapsed
    assert!(owner.token() > stale.token());
    let mut db = shop_db(&path);
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    tx.execute("INSERT INTO orders (body) VALUES (x'03')", []).unwrap();
    let refused = complete_in(&tx, &stale_claim, Some(b"stale"));
    assert!(matches!(refused, Err(StoreError::LeaseLost(ref lost)) if *lost == k), "{refused:?}");
    assert!(stale_claim.handed_over());
    drop(tx);
    owner.complete(&b"the owner's"[..]).await.unwrap();
    let replay = two.store().claim(&k, Fingerprint::of(b"order"), Duration::from_secs(1)).await;
    assert!(
        matches!(replay, Ok(StoreClaim::Completed(r)) if r.body.as_deref() == Some(&b"the owner's"[..]))
    );
    assert_eq!(orders(&path), 0);
    drop(stale);
}

#[tokio::test]
async fn a_result_ttl_out_of_range_is_refused_before_anything_is_written() {
    let path = scratch("ttl");
    let tiered = store(&path, Duration::from_secs(30)).await;
    let guard = acquired(&tiered, &key("ttl")).await;
    let claim = OpenClaim::new(key("ttl"), guard.token(), Duration::ZERO);
    let mut db = shop_db(&path);
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    assert!(matches!(complete_in(&tx, &claim, None), Err(StoreError::InvalidInput(_))));
    assert!(!claim.handed_over(), "a refused call hands nothing over");
    drop(tx);
    guard.complete(&b"done"[..]).await.unwrap();
}

/// PostgreSQL: the handler holds its transaction, with the record's row locked, for
/// several lease beats before it commits. A renewal then would wait on that row while
/// the handler (polled by the same task) cannot commit; handing the claim over stops
/// renewal, so the request finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn postgres_a_transaction_held_past_lease_beats_after_recording_is_not_stalled() {
    let Some(url) = conformance::service_url(
        "IDEMCACHE_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    ) else {
        return;
    };
    let store = idemcache_postgres::PostgresStore::connect(&url).await.unwrap();
    store.ensure_schema().await.unwrap();
    let tiered = Tiered::new(Cache::builder().build().unwrap(), store)
        .with_lease(Duration::from_millis(300));
    let (client, connection) = idemcache_postgres::tokio_postgres::connect(
        &url,
        idemcache_postgres::tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let client = Arc::new(tokio::sync::Mutex::new(client));
    let handler = {
        let client = client.clone();
        move |held: Option<Extension<InTransaction>>| async move {
            let Some(Extension(held)) = held else {
                return StatusCode::INTERNAL_SERVER_ERROR.into_response();
            };
            let mut client = client.lock().await;
            let tx = client.transaction().await.unwrap();
            let record = held.record(StatusCode::CREATED, &HeaderMap::new(), b"held").unwrap();
            idemcache_postgres::complete_in(&tx, held.claim(), Some(&record)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(700)).await; // over two beats of 100 ms
            tx.commit().await.unwrap();
            (StatusCode::CREATED, "held").into_response()
        }
    };
    let app =
        Router::new().route("/orders", post(handler)).route_layer(IdempotencyLayer::tiered(tiered));
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let key = format!("pg-held-{}-{}", std::process::id(), nanos.as_nanos());
    let first = tokio::time::timeout(Duration::from_secs(20), send_owned(&app, &key)).await;
    let (status, _, body) = first.expect("the request stalled on its own renewal");
    assert_eq!((status, &body[..]), (StatusCode::CREATED, &b"held"[..]));
    let (status, headers, body) = send_owned(&app, &key).await;
    assert_eq!((status, &body[..]), (StatusCode::CREATED, &b"held"[..]));
    assert_eq!(headers.get("idempotent-replayed").unwrap(), "true");
}

/// The order a JSON handler answers with.
#[derive(serde::Serialize)]
struct Created {
    id: i64,
    item: String,
}

/// PostgreSQL: a handler answering with axum's `Json` records that very response
/// (`record_response`, no `HeaderMap` or serializing by hand) and returns it; a repeat,
/// from this instance or from one whose cache is empty, replays it byte for byte: the
/// status, every header the first answer had (`Content-Type` included) and the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn postgres_a_json_response_is_recorded_as_returned_and_replayed_byte_for_byte() {
    let Some(url) = conformance::service_url(
        "IDEMCACHE_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    ) else {
        return;
    };
    let store = idemcache_postgres::PostgresStore::connect(&url).await.unwrap();
    store.ensure_schema().await.unwrap();
    let (client, connection) = idemcache_postgres::tokio_postgres::connect(
        &url,
        idemcache_postgres::tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS idemcache_it_json_orders
                 (id BIGSERIAL PRIMARY KEY, item TEXT NOT NULL)",
        )
        .await
        .unwrap();
    let client = Arc::new(tokio::sync::Mutex::new(client));
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (client, runs) = (client.clone(), runs.clone());
        move |held: Option<Extension<InTransaction>>, item: String| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let Some(Extension(held)) = held else {
                return StatusCode::INTERNAL_SERVER_ERROR.into_response();
            };
            let mut client = client.lock().await;
            let tx = client.transaction().await.unwrap();
            let insert = "INSERT INTO idemcache_it_json_orders (item) VALUES ($1) RETURNING id";
            let id: i64 = tx.query_one(insert, &[&item]).await.unwrap().get(0);
            let location = [(header::LOCATION, format!("/orders/{id}"))];
            let response =
                (StatusCode::CREATED, location, axum::Json(Created { id, item })).into_response();
            let (record, response) = held.record_response(response).await.unwrap();
            let record = record.expect("a 201 is kept");
            idemcache_postgres::complete_in(&tx, held.claim(), Some(&record)).await.unwrap();
            tx.commit().await.unwrap();
            response.into_response()
        }
    };
    let app = |store: idemcache_postgres::PostgresStore| {
        let tiered = Tiered::new(Cache::builder().build().unwrap(), store);
        Router::new()
            .route("/orders", post(handler.clone()))
            .route_layer(IdempotencyLayer::tiered(tiered))
    };
    let (one, fresh) = (app(store.clone()), app(store));
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let key = format!("pg-json-{}-{}", std::process::id(), nanos.as_nanos());
    let (status, first, body) = send_text(&one, &key, "book").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(first.get(header::CONTENT_TYPE).unwrap(), "application/json");
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["item"], "book");
    assert!(first.get("idempotent-replayed").is_none());
    for app in [&one, &fresh] {
        let (replayed_status, mut replayed, replayed_body) = send_text(app, &key, "book").await;
        assert_eq!(replayed.remove("idempotent-replayed").unwrap(), "true");
        assert!(replayed.remove("idempotency-expires").is_some());
        assert_eq!((replayed_status, &replayed, &replayed_body), (status, &first, &body));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn send_text(app: &Router, key: &str, text: &'static str) -> (StatusCode, HeaderMap, Bytes) {
    let request = Request::post("/orders")
        .header("idempotency-key", key)
        .header("content-type", "text/plain")
        .body(Body::from(text))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    (parts.status, parts.headers, body.collect().await.unwrap().to_bytes())
}

async fn send_owned(app: &Router, key: &str) -> (StatusCode, HeaderMap, Bytes) {
    let request =
        Request::post("/orders").header("idempotency-key", key).body(Body::empty()).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    (parts.status, parts.headers, body.collect().await.unwrap().to_bytes())
}

/// PostgreSQL: a starting instance's `ensure_schema` does not wait for a handler's open
/// transaction holding a record it completed (`CREATE INDEX IF NOT EXISTS` would, and
/// every later claim would queue behind it): the schema is checked before any lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn postgres_ensure_schema_beside_an_open_completion_does_not_wait() {
    let Some(url) = conformance::service_url(
        "IDEMCACHE_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    ) else {
        return;
    };
    let store = idemcache_postgres::PostgresStore::connect(&url).await.unwrap();
    store.ensure_schema().await.unwrap();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let key = Key::new("POST /orders", "schema", format!("k-{}", nanos.as_nanos())).unwrap();
    let StoreClaim::Acquired { token, .. } =
        store.claim(&key, Fingerprint::of(b"o"), Duration::from_secs(30)).await.unwrap()
    else {
        panic!("a fresh key is acquired");
    };
    let (mut client, connection) = idemcache_postgres::tokio_postgres::connect(
        &url,
        idemcache_postgres::tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let tx = client.transaction().await.unwrap();
    let claim = OpenClaim::new(key, token, Duration::from_secs(60));
    idemcache_postgres::complete_in(&tx, &claim, Some(b"open")).await.unwrap();
    let starting = idemcache_postgres::PostgresStore::connect(&url).await.unwrap();
    let started = tokio::time::timeout(Duration::from_secs(5), starting.ensure_schema()).await;
    assert!(matches!(started, Ok(Ok(()))), "ensure_schema waited for an open transaction");
    tx.commit().await.unwrap();
}
