//! An orders service: `POST /orders` made idempotent by `Idempotency-Key`, with a SQLite
//! `UNIQUE(user, idempotency_key)` constraint as the backstop behind the cache.
//!
//! ```sh
//! cargo run --release --example orders
//! curl -i -X POST localhost:3000/orders -H 'Authorization: Bearer alice' \
//!      -H 'Idempotency-Key: 8e03978e-40d5' -H 'Content-Type: application/json' \
//!      -d '{"item":"book","qty":2}'
//! ```
//!
//! Environment (all optional):
//! - `PORT`: listens on `127.0.0.1:$PORT` (default 3000); prints `listening on http://ADDR`
//!   once ready.
//! - `ORDERS_DB`: the SQLite file for the orders table (default: in memory). Two instances
//!   may share one file: WAL mode and a busy timeout keep their writes from failing.
//! - `ORDER_DELAY_MS`: sleep this long inside the handler, to widen races (default 0).
//! - `IDEMPOTENCY_WAIT_MS`: how long a duplicate waits for the first request to finish
//!   and gets its replay (default 10000); `0` answers 409 with `Retry-After` at once.
//! - `IDEMPOTENCY_STORE`: the durable tier behind the cache (default: none, the cache
//!   alone): `sqlite:PATH`, `postgres://user@host:port/db` or `redis://host:port/db`.
//!   Instances over one store execute each key once between them, and a restarted one
//!   replays what they stored.
//!
//! Two instances over one PostgreSQL, sharing one SQLite file for the orders:
//!
//! ```sh
//! export IDEMPOTENCY_STORE=postgres://postgres@127.0.0.1:5432/test ORDERS_DB=/tmp/orders.db
//! PORT=3001 cargo run --release --example orders &
//! PORT=3002 cargo run --release --example orders &
//! ```
//!
//! Routes: `POST /orders` (`{"item": string, "qty": integer}`, `Authorization: Bearer
//! <user>` as the tenant, 401 without it) answers 201 with `{"id", "item", "qty"}` and
//! `Location: /orders/{id}`; `GET /orders/count` answers `{"count": n}`, outside the layer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{MatchedPath, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idemcache::layer::{client_key, IdempotencyLayer};
use idemcache::store::encoding::one_line;
use idemcache::store::{Store, Tiered};
use idemcache::Cache;
use idemcache_any::redacted;
use idemcache_sqlite::is_unique_violation;
use idemcache_sqlite::rusqlite::{self, params, Connection};
use serde::Deserialize;
use serde_json::json;

#[derive(Clone)]
struct App {
    db: Arc<Mutex<Connection>>,
    delay: Duration,
}

#[derive(Deserialize)]
struct NewOrder {
    item: String,
    qty: i64,
}

/// The user named by `Authorization: Bearer <user>`.
fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let user = value.strip_prefix("Bearer ")?.trim();
    (!user.is_empty()).then(|| user.to_owned())
}

fn env_number(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(v) => v.parse().map_err(|_| format!("{name} must be a whole number, got {v:?}")),
        Err(_) => Ok(default),
    }
}

fn open_db() -> rusqlite::Result<Connection> {
    let db = match std::env::var("ORDERS_DB") {
        Ok(path) if !path.is_empty() => {
            let db = Connection::open(path)?;
            // Several processes on one file: readers never block the writer, and a
            // writer waits for the lock instead of failing with SQLITE_BUSY.
            db.pragma_update(None, "journal_mode", "WAL")?;
            db.busy_timeout(Duration::from_secs(10))?;
            db
        }
        _ => Connection::open_in_memory()?,
    };
    db.execute_batch(
        "CREATE TABLE IF NOT EXISTS orders (
             id INTEGER PRIMARY KEY AUTOINCREMENT,
             user TEXT NOT NULL,
             idempotency_key TEXT NOT NULL,
             item TEXT NOT NULL,
             qty INTEGER NOT NULL,
             UNIQUE (user, idempotency_key)
         )",
    )?;
    Ok(db)
}

async fn create_order(
    State(app): State<App>,
    headers: HeaderMap,
    Json(order): Json<NewOrder>,
) -> Response {
    // The layer has checked both already; a request without them never gets here.
    let (Some(user), Ok(Some(key))) = (bearer(&headers), client_key(&headers)) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    if !app.delay.is_zero() {
        tokio::time::sleep(app.delay).await;
    }
    let db = app.db.clone();
    let created = tokio::task::spawn_blocking(move || -> rusqlite::Result<Created> {
        let db = db.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let inserted = db.execute(
            "INSERT INTO orders (user, idempotency_key, item, qty) VALUES (?1, ?2, ?3, ?4)",
            params![user, key, order.item, order.qty],
        );
        match inserted {
            Ok(_) => Ok(Created::New(db.last_insert_rowid(), order.item, order.qty)),
            // The backstop: this key already created an order (in another process, or
            // one whose cache forgot it). Never a second row: the same order is answered
            // as created, a different one under the same key is refused.
            Err(e) if is_unique_violation(&e) => {
                let (id, item, qty): (i64, String, i64) = db.query_row(
                    "SELECT id, item, qty FROM orders WHERE user = ?1 AND idempotency_key = ?2",
                    params![user, key],
                    |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
                )?;
                Ok(if (&item, qty) == (&order.item, order.qty) {
                    Created::New(id, item, qty)
                } else {
                    Created::KeyReused
                })
            }
            Err(e) => Err(e),
        }
    })
    .await;
    match created {
        Ok(Ok(Created::New(id, item, qty))) => (
            StatusCode::CREATED,
            [(header::LOCATION, format!("/orders/{id}"))],
            Json(json!({ "id": id, "item": item, "qty": qty })),
        )
            .into_response(),
        Ok(Ok(Created::KeyReused)) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({ "error": "this Idempotency-Key created a different order" })),
        )
            .into_response(),
        // A 5xx releases the key: the client's retry runs again.
        _ => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// What the insert found.
enum Created {
    /// The order's row: inserted now, or by an earlier execution of this same request.
    New(i64, String, i64),
    /// The key's row is a different order.
    KeyReused,
}

async fn count_orders(State(app): State<App>) -> Response {
    let db = app.db.clone();
    let count = tokio::task::spawn_blocking(move || {
        let db = db.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        db.query_row("SELECT COUNT(*) FROM orders", [], |row| row.get::<_, i64>(0))
    })
    .await;
    match count {
        Ok(Ok(count)) => Json(json!({ "count": count })).into_response(),
        _ => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// The layer over the cache alone, or over the tier `IDEMPOTENCY_STORE` names: one
/// path whichever store it is (`idemcache_any::open` picks it from the URL).
async fn idempotency_layer() -> Result<IdempotencyLayer, Box<dyn std::error::Error>> {
    let cache = Cache::builder().build()?;
    let url = std::env::var("IDEMPOTENCY_STORE").unwrap_or_default();
    if url.is_empty() {
        return Ok(IdempotencyLayer::new(cache));
    }
    let opening = || format!("could not open the idempotency store {}", redacted(&url));
    let store = doing(idemcache_any::open(&url).await, opening)?;
    doing(store.ensure_schema().await, opening)?;
    Ok(IdempotencyLayer::tiered(Tiered::new(cache, store)))
}

/// A failure at startup: what was being done (and where), and why.
#[derive(Debug)]
struct Startup {
    doing: String,
    cause: Box<dyn std::error::Error>,
}

impl std::fmt::Display for Startup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.doing)
    }
}

impl std::error::Error for Startup {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.cause)
    }
}

/// `doing` as the context of whatever `result` failed with.
fn doing<T, E: Into<Box<dyn std::error::Error>>>(
    result: Result<T, E>,
    doing: impl FnOnce() -> String,
) -> Result<T, Box<dyn std::error::Error>> {
    result.map_err(|cause| Box::new(Startup { doing: doing(), cause: cause.into() }).into())
}

fn main() -> std::process::ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build();
    match runtime.map_err(Into::into).and_then(|runtime| runtime.block_on(serve())) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&*e));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    let port =
        u16::try_from(env_number("PORT", 3000)?).map_err(|_| "PORT must be a port number")?;
    let delay = Duration::from_millis(env_number("ORDER_DELAY_MS", 0)?);
    let wait = Duration::from_millis(env_number("IDEMPOTENCY_WAIT_MS", 10_000)?);
    let orders = doing(open_db(), || {
        let db = std::env::var("ORDERS_DB").unwrap_or_default();
        format!(
            "could not open the orders database {:?}",
            if db.is_empty() { ":memory:" } else { &db }
        )
    })?;
    let app = App { db: Arc::new(Mutex::new(orders)), delay };

    let mut idempotency =
        idempotency_layer().await?.tenant(|request| bearer(&request.headers)).scope(|request| {
            let route = request.extensions.get::<MatchedPath>().map_or("", |m| m.as_str());
            format!("{} {route}", request.method)
        });
    if !wait.is_zero() {
        idempotency = idempotency.wait(wait);
    }
    let router = Router::new()
        .route("/orders", post(create_order))
        .route_layer(idempotency)
        .route("/orders/count", get(count_orders))
        .with_state(app);

    let listening = tokio::net::TcpListener::bind(("127.0.0.1", port)).await;
    let listener = doing(listening, || format!("could not listen on 127.0.0.1:{port}"))?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router).await?;
    Ok(())
}
