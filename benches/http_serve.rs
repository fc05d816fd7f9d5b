//! One server of the HTTP load benchmark, started by `http_load` as a child process:
//!
//! ```sh
//! http_serve ROW [URL] [--threads N]
//! ```
//!
//! `ROW` is the middleware in front of the shared handler (`support/http_app.rs`):
//! `bare`; `layer-cache` (`idemcache::layer` over a `Cache`); `layer-tiered URL`
//! (the layer over `Tiered`, the store opened from `URL` with `idemcache_any`:
//! `sqlite:PATH`, `postgres://...`, `redis://...`, and `redis-cluster://...` once that
//! scheme lands there); `one-commit URL` (PostgreSQL: the claim, the handler's response
//! and the record in one transaction per request, with `idemcache-postgres`'s
//! `claim_in` and `complete_in`); `layer-tiered-orders URL` and `one-commit-orders
//! URL` (the same two over PostgreSQL with the business change a handler makes: an
//! order row, in its own transaction between the layer's claim and completion, or in
//! the one transaction); `layer-one-commit URL` and `layer-one-commit-orders URL` (the
//! layer's one-commit mode, `IdempotencyLayer::one_commit`, without and with the order); `axum-idempotent` (its README's setup: a `ruts` session over its
//! in-memory `MokaStore`, the `Idempotency-Key` header required); `setnx URL` (the
//! hand-written Redis middleware of payment blogs: `SET key processing NX EX`, then the
//! response `SET ... EX`; a refused `SET` reads the key and replays it, or answers 409).
//!
//! Invariant: each row differs from `bare` only in the middleware in front of the same
//! routes on the same runtime; a row whose store cannot be opened prints
//! `unavailable WHY` instead of `listening ADDR` and exits.

#[path = "support/http_app.rs"]
mod http_app;

use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idemcache::layer::IdempotencyLayer;
use idemcache::store::{Store, Tiered};
use idemcache::Cache;

fn main() {
    // Positional arguments: ROW and URL (`--threads N` is read by `http_app::threads`).
    let all: Vec<String> = std::env::args().skip(1).collect();
    let threads_value = all.iter().position(|a| a == "--threads").map(|i| i + 1);
    let mut args = all
        .into_iter()
        .enumerate()
        .filter(|(i, a)| Some(*i) != threads_value && !a.starts_with("--"))
        .map(|(_, a)| a);
    let row = args.next().unwrap_or_default();
    let url = args.next();
    http_app::serve(move || app(row, url));
}

/// A cache sized above every key one run makes (about two million at most), so a
/// pre-completed replay key is never evicted by the first executions that follow it.
fn cache() -> Cache {
    Cache::builder().max_entries(4_000_000).build().expect("a cache")
}

async fn app(row: String, url: Option<String>) -> Result<Router, String> {
    let url = || url.clone().ok_or_else(|| format!("row {row} needs a URL"));
    Ok(match row.as_str() {
        "bare" => http_app::guarded_routes().merge(http_app::open_routes()),
        "layer-cache" => http_app::guarded_routes()
            .route_layer(IdempotencyLayer::new(cache()))
            .merge(http_app::open_routes()),
        "layer-tiered" => {
            let url = url()?;
            let store = idemcache_any::open(&url).await.map_err(|e| format!("{e}: {e:?}"))?;
            store.ensure_schema().await.map_err(|e| format!("creating the schema: {e}"))?;
            let tiered = Tiered::new(cache(), store);
            http_app::guarded_routes()
                .route_layer(IdempotencyLayer::tiered(tiered))
                .merge(http_app::open_routes())
        }
        "one-commit" => one_commit_app(&url()?, false).await?,
        "one-commit-orders" => one_commit_app(&url()?, true).await?,
        "layer-tiered-orders" => {
            // Today's three commits: the claim, the handler's own transaction writing the
            // order, the completion.
            let store = orders_store(&url()?).await?;
            // One pool for the store and the handlers, sized as the one-commit rows'.
            store.pool().resize(ONE_COMMIT_CONNECTIONS);
            store.ensure_schema().await.map_err(|e| format!("creating the schema: {e}"))?;
            http_app::guarded_routes()
                .route_layer(axum::middleware::from_fn_with_state(store.clone(), insert_order))
                .route_layer(IdempotencyLayer::tiered(Tiered::new(cache(), store)))
                .merge(http_app::open_routes())
        }
        "layer-one-commit" => layer_one_commit_app(&url()?, false).await?,
        "layer-one-commit-orders" => layer_one_commit_app(&url()?, true).await?,
        "axum-idempotent" => axum_idempotent_app(),
        "setnx" => setnx_app(&url()?).await?,
        other => return Err(format!("no row named {other:?}")),
    })
}

/// axum-idempotent as its README sets it up: the layer inside a `ruts` session layer
/// (its in-memory `MokaStore`) inside the cookie manager, keyed by the
/// `Idempotency-Key` header (required). It caches only for a request that carries a
/// session and never creates one, so `POST /login` makes one (as an application's
/// login would) and the load generator sends its cookie with every request.
fn axum_idempotent_app() -> Router {
    use axum_idempotent::{IdempotentLayer, IdempotentOptions};
    use ruts::store::moka::MokaStore;
    use ruts::store::Ttl;
    use ruts::{CookieOptions, Session, SessionLayer};
    use tower_cookies::CookieManagerLayer;

    let store = Arc::new(MokaStore::builder().build());
    let options = IdempotentOptions::default()
        .use_idempotency_key_header(Some("Idempotency-Key"), true)
        .expire_after(24 * 3600);
    let login = post(|session: Session<MokaStore>| async move {
        let ttl = Ttl::new(24 * 3600).expect("a day is a TTL");
        match session.set("user", &String::from("bench"), ttl, None).await {
            Ok(()) => StatusCode::OK,
            Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    });
    let cookie = CookieOptions::build().name("session").max_age(24 * 3600).path("/");
    http_app::guarded_routes()
        .layer(IdempotentLayer::<MokaStore>::new(options))
        .merge(http_app::open_routes())
        .route("/login", login)
        .layer(SessionLayer::new(store).with_cookie_options(cookie))
        .layer(CookieManagerLayer::new())
}

/// One commit per first execution over PostgreSQL, as a middleware writes it with
/// `idemcache-postgres`'s plain functions: a transaction per request, the claim in it
/// (`PostgresStore::claim_in`), the handler, its response recorded in it
/// (`complete_in`), one commit. No cache in front: a replay is the claim statement's
/// read. A duplicate waits on the first one's row, then replays.
async fn one_commit_app(url: &str, orders: bool) -> Result<Router, String> {
    let store = orders_store(url).await?;
    // A connection per request in flight: each holds one for its transaction.
    store.pool().resize(ONE_COMMIT_CONNECTIONS);
    store.ensure_schema().await.map_err(|e| format!("creating the schema: {e}"))?;
    Ok(http_app::guarded_routes()
        .route_layer(axum::middleware::from_fn_with_state((store, orders), one_commit))
        .merge(http_app::open_routes()))
}

/// The one-commit rows' pool (and the Tiered orders row's, for parity): each request
/// holds a connection from its claim to its commit. Few enough that every PostgreSQL
/// row's server (the `Tiered` row's store keeps its default 16, five rows keep these)
/// fits in the default `max_connections` of 100 together: a server refused a connection
/// answers 503, which the table counts as unexpected.
const ONE_COMMIT_CONNECTIONS: usize = 14;

/// The orders rows' table: one row per first execution, written in a transaction.
const ORDERS_TABLE: &str = "idemcache_http_bench_orders";

/// A PostgreSQL store (its pool for the handlers' transactions too) and the orders table.
async fn orders_store(url: &str) -> Result<idemcache_postgres::PostgresStore, String> {
    let store = idemcache_postgres::PostgresStore::connect(url).await.map_err(|e| e.to_string())?;
    let client = store.pool().get().await.map_err(|e| e.to_string())?;
    let sql = format!("CREATE TABLE IF NOT EXISTS {ORDERS_TABLE} (key TEXT NOT NULL, items INT)");
    client.batch_execute(&sql).await.map_err(|e| e.to_string())?;
    Ok(store)
}

/// The layer's one-commit mode over PostgreSQL (`IdempotencyLayer::one_commit`): the
/// claim, the handler (with `orders`, first the order written in the transaction the
/// layer lends it) and the record in one transaction per first execution; a cache in
/// front replays what committed.
async fn layer_one_commit_app(url: &str, orders: bool) -> Result<Router, String> {
    let store = orders_store(url).await?;
    store.pool().resize(ONE_COMMIT_CONNECTIONS);
    store.ensure_schema().await.map_err(|e| format!("creating the schema: {e}"))?;
    let one_commit = idemcache::store::OneCommit::new(store).with_cache(cache());
    let layer = IdempotencyLayer::one_commit(one_commit);
    let routes = http_app::guarded_routes();
    let routes = match orders {
        true => routes.route_layer(axum::middleware::from_fn(insert_order_held)),
        false => routes,
    };
    Ok(routes.route_layer(layer).merge(http_app::open_routes()))
}

/// The order of the request's key written in the transaction the layer lends, then the
/// handler.
async fn insert_order_held(request: Request, next: Next) -> Response {
    use idemcache::layer::HeldTransaction;
    use idemcache_postgres::PooledTransaction;
    let key = request.headers().get("idempotency-key").and_then(|v| v.to_str().ok());
    let key = key.unwrap_or_default().to_owned();
    let Some(held) = request.extensions().get::<HeldTransaction<PooledTransaction>>().cloned()
    else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "no transaction lent").into_response();
    };
    let written = async {
        let tx = held.lock().await.map_err(|e| e.to_string())?;
        let sql = format!("INSERT INTO {ORDERS_TABLE} (key, items) VALUES ($1, 1)");
        let statement = tx.prepare_cached(&sql).await.map_err(|e| e.to_string())?;
        tx.execute(&statement, &[&key]).await.map_err(|e| e.to_string())
    };
    match written.await {
        Ok(_) => next.run(request).await,
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e).into_response(),
    }
}

/// The order of the request's key written in a transaction of its own, then the handler.
async fn insert_order(
    State(store): State<idemcache_postgres::PostgresStore>,
    request: Request,
    next: Next,
) -> Response {
    let key = request.headers().get("idempotency-key").and_then(|v| v.to_str().ok());
    let key = key.unwrap_or_default().to_owned();
    let written = async {
        let mut client = store.pool().get().await.map_err(|e| e.to_string())?;
        let tx = client.transaction().await.map_err(|e| e.to_string())?;
        let sql = format!("INSERT INTO {ORDERS_TABLE} (key, items) VALUES ($1, 1)");
        tx.execute(&sql, &[&key]).await.map_err(|e| e.to_string())?;
        tx.commit().await.map_err(|e| e.to_string())
    };
    match written.await {
        Ok(()) => next.run(request).await,
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e).into_response(),
    }
}

async fn one_commit(
    State((store, orders)): State<(idemcache_postgres::PostgresStore, bool)>,
    request: Request,
    next: Next,
) -> Response {
    use idemcache::store::{OpenClaim, StoreClaim};
    use idemcache::{Fingerprint, Key};
    let failed = |e: &dyn std::fmt::Display| {
        (StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}")).into_response()
    };
    let Some(key) = request.headers().get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, "Idempotency-Key required").into_response();
    };
    let key = match Key::new("POST /orders", "bench", key) {
        Ok(key) => key,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let (parts, body) = request.into_parts();
    let Ok(body) = to_bytes(body, 1 << 20).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let fingerprint = Fingerprint::of(&body);
    let mut client = match store.pool().get().await {
        Ok(client) => client,
        Err(e) => return failed(&e),
    };
    let tx = match client.transaction().await {
        Ok(tx) => tx,
        Err(e) => return failed(&e),
    };
    let lease = std::time::Duration::from_secs(30);
    let token = match store.claim_in(&tx, &key, fingerprint, lease).await {
        Ok(StoreClaim::Acquired { token, .. }) => token,
        Ok(StoreClaim::Completed(replay)) => {
            let replayed = replay.body.as_deref().and_then(setnx_decode);
            return replayed.unwrap_or_else(|| StatusCode::INTERNAL_SERVER_ERROR.into_response());
        }
        Ok(StoreClaim::Mismatch) => return StatusCode::UNPROCESSABLE_ENTITY.into_response(),
        Ok(_) => return (StatusCode::CONFLICT, "request in progress").into_response(),
        Err(e) => return failed(&e),
    };
    if orders {
        let sql = format!("INSERT INTO {ORDERS_TABLE} (key, items) VALUES ($1, 1)");
        if let Err(e) = tx.execute(&sql, &[&key.client_key()]).await {
            return failed(&e);
        }
    }
    let response = next.run(Request::from_parts(parts, Body::from(body))).await;
    let (parts, body) = response.into_parts();
    let Ok(body) = to_bytes(body, 1 << 20).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response(); // rolled back on drop
    };
    if parts.status.is_server_error() {
        return Response::from_parts(parts, Body::from(body)); // rolled back on drop
    }
    let claim = OpenClaim::new(key, token, std::time::Duration::from_secs(SETNX_TTL_SECS));
    let record = setnx_encode(parts.status, &body);
    if let Err(e) = idemcache_postgres::complete_in(&tx, &claim, Some(&record)).await {
        return failed(&e);
    }
    if let Err(e) = tx.commit().await {
        return failed(&e);
    }
    Response::from_parts(parts, Body::from(body))
}

/// How long the hand-written middleware keeps a key (processing marker and response).
const SETNX_TTL_SECS: u64 = 24 * 3600;

/// The hand-written middleware's stored response: `R`, the status (3 ASCII digits),
/// then the body (the handler's is always JSON).
fn setnx_encode(status: StatusCode, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + body.len());
    out.push(b'R');
    out.extend_from_slice(status.as_str().as_bytes());
    out.extend_from_slice(body);
    out
}

fn setnx_decode(stored: &[u8]) -> Option<Response> {
    let rest = stored.strip_prefix(b"R")?;
    let status = StatusCode::from_bytes(rest.get(..3)?).ok()?;
    let mut response = Response::new(Body::from(rest[3..].to_vec()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    Some(response)
}

/// The hand-written Redis middleware payment blogs describe, over one multiplexed
/// connection (redis-rs's `ConnectionManager`, reconnecting).
async fn setnx_app(url: &str) -> Result<Router, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let redis = redis::aio::ConnectionManager::new(client).await.map_err(|e| e.to_string())?;
    Ok(http_app::guarded_routes()
        .route_layer(axum::middleware::from_fn_with_state(redis, setnx))
        .merge(http_app::open_routes()))
}

async fn setnx(
    State(mut redis): State<redis::aio::ConnectionManager>,
    request: Request,
    next: Next,
) -> Response {
    let Some(key) = request.headers().get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, "Idempotency-Key required").into_response();
    };
    let key = format!("idem:{key}");
    let unavailable = |_| (StatusCode::SERVICE_UNAVAILABLE, "redis unavailable").into_response();
    let claimed: Option<String> = match redis::cmd("SET")
        .arg(&key)
        .arg("processing")
        .arg("NX")
        .arg("EX")
        .arg(SETNX_TTL_SECS)
        .query_async(&mut redis)
        .await
    {
        Ok(claimed) => claimed,
        Err(e) => return unavailable(e),
    };
    if claimed.is_none() {
        // Someone holds the key: replay what it stored, or 409 while it runs.
        let stored: Option<Vec<u8>> =
            match redis::cmd("GET").arg(&key).query_async(&mut redis).await {
                Ok(stored) => stored,
                Err(e) => return unavailable(e),
            };
        return match stored.as_deref().and_then(setnx_decode) {
            Some(replay) => replay,
            None => (StatusCode::CONFLICT, "request in progress").into_response(),
        };
    }
    let response = next.run(request).await;
    let (parts, body) = response.into_parts();
    let Ok(body) = to_bytes(body, 1 << 20).await else {
        drop(redis::cmd("DEL").arg(&key).query_async::<()>(&mut redis).await);
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let write = if parts.status.is_server_error() {
        redis::cmd("DEL").arg(&key).query_async::<()>(&mut redis).await
    } else {
        redis::cmd("SET")
            .arg(&key)
            .arg(setnx_encode(parts.status, &body))
            .arg("EX")
            .arg(SETNX_TTL_SECS)
            .query_async::<()>(&mut redis)
            .await
    };
    // The effect happened: answer it even if the write failed (blogs log and go on).
    drop(write);
    Response::from_parts(parts, Body::from(body))
}
