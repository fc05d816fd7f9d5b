//! An orders service: `POST /orders` made idempotent by `Idempotency-Key`, with a SQLite
//! `UNIQUE(user, idempotency_key)` constraint as the backstop behind the cache.
//!
//! ```sh
//! cargo run --release -p idemcache-orders --example orders
//! curl -i -X POST localhost:3000/orders -H 'Authorization: Bearer alice' \
//!      -H 'Idempotency-Key: 8e03978e-40d5' -H 'Content-Type: application/json' \
//!      -d '{"item":"book","qty":2}'
//! ```
//!
//! Environment (all optional):
//! - `PORT`: listens on `127.0.0.1:$PORT` (default 3000); prints `listening on http://ADDR`
//!   once ready.
//! - `ORDERS_DB`: the orders table's database (default: SQLite in memory): a SQLite file
//!   (`PATH` or `sqlite:PATH`) or `postgres://user@host:port/db`. Two instances may share
//!   one: WAL mode and a busy timeout keep their SQLite writes from failing.
//! - `ORDER_DELAY_MS`: sleep this long inside the handler, to widen races (default 0).
//! - `IDEMPOTENCY_WAIT_MS`: how long a duplicate waits for the first request to finish
//!   and gets its replay (default 10000); `0` answers 409 with `Retry-After` at once.
//! - `IDEMPOTENCY_STORE`: the durable tier behind the cache (default: none, the cache
//!   alone): `sqlite:PATH`, `postgres://user@host:port/db`, `mysql://user@host:port/db`
//!   (MySQL or MariaDB), `redis://host:port/db` or `redis-cluster://host:port,host:port,...`
//!   (a Redis Cluster: any of its nodes).
//!   Instances over one store execute each key once between them, and a restarted one
//!   replays what they stored. When it names the database `ORDERS_DB` names (the same
//!   SQLite file, or the same PostgreSQL host, port, user and database), each order and
//!   its idempotency record commit in one transaction (the handler writes the record
//!   with `complete_in`), and the example prints `records commit with the orders` at
//!   start: after a crash at any instant, a retry either creates the order (nothing
//!   committed) or replays it (both committed), never creating it twice. Otherwise the
//!   record is written after the order commits, and the `UNIQUE` constraint is what
//!   stops a second order after a crash between the two; the example then prints `the
//!   backstop caught a second execution of KEY` on stderr when it does.
//! - `IDEMPOTENCY_LEASE_MS`: the lease a claim takes (default 10000, `Tiered`'s default);
//!   a lease held by an instance that died lapses after it, and a retry may then run the
//!   request.
//! - `ORDERS_OUTBOX`: a topic; when set, each new order also writes one message to the
//!   transactional outbox (`idemcache_outbox`, created at start in the orders database)
//!   in the order's own transaction, beside its idempotency record when they commit
//!   together: message id `order-{id}`, this topic, payload `{"account": <user>,
//!   "amount": <qty>, "order": <id>, "item": <item>}` (a payment the consumer example
//!   applies). The order, its record and its message commit together or not at all, so a
//!   relay (`idemcache-relay`) publishes exactly the orders that exist. An answer from
//!   the backstop (the key's row already there) enqueues nothing: its order's message
//!   committed with it.
//! - `ORDERS_PAYMENTS`: the base URL of a payments service (the `payments` example of
//!   this package); when set, each new order is charged there before it commits
//!   (`POST /payments`), with `idemcache-client` under the order's `DownstreamKey`
//!   (`"charge"`), so every execution of one order charges it once. A charge that failed
//!   or whose outcome is unknown answers 503 (the order's key released; the retry asks
//!   again by the same key). `ORDERS_PAYMENTS_CLIENT=reqwest-retry` calls through
//!   `reqwest-retry` without a key instead, the comparison of `.ci/two-services`;
//!   `ORDERS_PAYMENTS_TIMEOUT_MS` (each attempt, default 2000) and
//!   `ORDERS_PAYMENTS_DEADLINE_MS` (no retry after it, default 10000) bound the call.
//! - `ORDERS_HISTORY`: a file each execution appends to: `KEY\tTOKEN` (the client's key
//!   and its claim's fencing token) at its start, before its effect, and
//!   `KEY\tTOKEN\tcommitted` once the order it inserted committed (not when the backstop
//!   answered an existing one; missing if the process dies between the commit and the
//!   line, or the commit's answer is lost with its connection), each line with one
//!   `write` (several instances may share the file): the executions the fault run's
//!   history check reads (`.ci/model --history`). Over a
//!   durable store only: the cache's claims carry no token, and nothing is written.
//!
//! Two instances over one PostgreSQL holding both the orders and their records:
//!
//! ```sh
//! export IDEMPOTENCY_STORE=postgres://postgres@127.0.0.1:5432/test ORDERS_DB=$IDEMPOTENCY_STORE
//! PORT=3001 cargo run --release -p idemcache-orders --example orders &
//! PORT=3002 cargo run --release -p idemcache-orders --example orders &
//! ```
//!
//! Routes: `POST /orders` (`{"item": string, "qty": integer}`, `Authorization: Bearer
//! <user>` as the tenant, 401 without it) answers 201 with `{"id", "item", "qty"}` and
//! `Location: /orders/{id}`; `GET /orders/count` answers `{"count": n}`, outside the layer;
//! `GET /metrics` answers the layer's metrics as Prometheus text
//! (`idemcache_decisions_total{decision, scope, store}` and the rest the layer's docs
//! list). A request's correlation id is the trace id of its W3C `traceparent` header:
//! `idem list --store URL --key KEY` shows it beside the key's record.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{MatchedPath, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use idemcache::layer::{client_key, Claimed, IdempotencyLayer, InTransaction};
use idemcache::store::encoding::one_line;
use idemcache::store::{Store, Tiered, DEFAULT_LEASE};
use idemcache::Cache;
use idemcache_any::redacted;
use idemcache_postgres::{deadpool_postgres, tokio_postgres};
use idemcache_sql::outbox::OutboxMessage;
use idemcache_sqlite::rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde::Deserialize;
use serde_json::json;

mod charge;

#[derive(Clone)]
struct App {
    orders: Orders,
    delay: Duration,
    /// The orders live in the idempotency store's database: record in the same
    /// transaction.
    together: bool,
    /// `ORDERS_OUTBOX`: the topic each new order's outbox message goes to, if any.
    outbox: Option<Arc<str>>,
    /// `ORDERS_PAYMENTS`: the payments service each new order is charged by, if any.
    payments: Option<Arc<charge::Payments>>,
    /// `ORDERS_HISTORY`: the file each execution's key and token are appended to.
    history: Option<Arc<std::fs::File>>,
}

/// Where the orders table lives.
#[derive(Clone)]
enum Orders {
    Sqlite(Arc<Mutex<Connection>>),
    Postgres(deadpool_postgres::Pool),
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

/// `ORDERS_DB`, or the empty string (SQLite in memory).
fn orders_db() -> String {
    std::env::var("ORDERS_DB").unwrap_or_default()
}

fn is_postgres(url: &str) -> bool {
    let lower = url.to_ascii_lowercase();
    lower.starts_with("postgres://") || lower.starts_with("postgresql://")
}

/// The SQLite path a `PATH`, `sqlite:PATH` or `sqlite://PATH` names.
fn sqlite_path(spec: &str) -> &str {
    match spec.split_once(':') {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("sqlite") => {
            rest.strip_prefix("//").unwrap_or(rest)
        }
        _ => spec,
    }
}

const SQLITE_ORDERS: &str = "CREATE TABLE IF NOT EXISTS orders (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    item TEXT NOT NULL,
    qty INTEGER NOT NULL,
    UNIQUE (user, idempotency_key)
)";

const POSTGRES_ORDERS: &str = "CREATE TABLE IF NOT EXISTS orders (
    id BIGSERIAL PRIMARY KEY,
    \"user\" TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    item TEXT NOT NULL,
    qty BIGINT NOT NULL,
    UNIQUE (\"user\", idempotency_key)
)";

async fn open_orders(spec: &str) -> Result<Orders, Box<dyn std::error::Error>> {
    if is_postgres(spec) {
        let config: tokio_postgres::Config = spec.parse()?;
        let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
        let pool = deadpool_postgres::Pool::builder(manager).max_size(16).build()?;
        let mut client = pool.get().await?;
        // Instances starting together: CREATE TABLE IF NOT EXISTS can still collide.
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock(7041)", &[]).await?;
        tx.batch_execute(POSTGRES_ORDERS).await?;
        tx.commit().await?;
        drop(client);
        return Ok(Orders::Postgres(pool));
    }
    let db = match sqlite_path(spec) {
        "" | ":memory:" => Connection::open_in_memory()?,
        path => {
            let db = Connection::open(path)?;
            // Several processes on one file: readers never block the writer, and a
            // writer waits for the lock instead of failing with SQLITE_BUSY.
            db.pragma_update(None, "journal_mode", "WAL")?;
            db.busy_timeout(Duration::from_secs(10))?;
            db
        }
    };
    db.execute_batch(SQLITE_ORDERS)?;
    Ok(Orders::Sqlite(Arc::new(Mutex::new(db))))
}

/// Creates the outbox's table in the orders database if absent (`ORDERS_OUTBOX`).
async fn outbox_schema(orders: &Orders) -> Result<(), Box<dyn std::error::Error>> {
    match orders {
        Orders::Sqlite(db) => {
            let db = db.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            idemcache_sqlite::outbox::ensure_schema(&db)?;
        }
        // Its DDL takes an advisory lock: instances starting together do not collide.
        Orders::Postgres(pool) => {
            idemcache_postgres::outbox::ensure_schema(&**pool.get().await?).await?
        }
    }
    Ok(())
}

/// Whether the idempotency store `store` names the database `orders` names: the same
/// SQLite file, or the same PostgreSQL host (as spelled: `localhost` is not
/// `127.0.0.1`), port, database, user and options (a `search_path` option names other
/// tables). When unsure it answers no, and the records are written after the commit.
fn same_database(store: &str, orders: &str) -> bool {
    if is_postgres(store) && is_postgres(orders) {
        let (Ok(a), Ok(b)) =
            (store.parse::<tokio_postgres::Config>(), orders.parse::<tokio_postgres::Config>())
        else {
            return false;
        };
        return a.get_hosts() == b.get_hosts()
            && a.get_ports() == b.get_ports()
            && a.get_dbname() == b.get_dbname()
            && a.get_user() == b.get_user()
            && a.get_options() == b.get_options();
    }
    let scheme = store.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
    if scheme.as_deref() != Some("sqlite") || is_postgres(orders) {
        return false;
    }
    let (store, orders) = (sqlite_path(store), sqlite_path(orders));
    let real = |p: &str| std::fs::canonicalize(Path::new(p)).ok();
    !matches!(store, "" | ":memory:") && real(store).is_some() && real(store) == real(orders)
}

/// An order's answer: what the handler returns, and (in one transaction with the
/// order) records.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
    /// This execution inserted the order (not the backstop's answer of an existing one).
    inserted: bool,
}

impl Answer {
    fn created(id: i64, item: &str, qty: i64) -> Answer {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Ok(location) = HeaderValue::from_str(&format!("/orders/{id}")) {
            headers.insert(header::LOCATION, location);
        }
        let body = json!({ "id": id, "item": item, "qty": qty }).to_string().into_bytes();
        Answer { status: StatusCode::CREATED, headers, body, inserted: false }
    }

    fn key_reused() -> Answer {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let body = json!({ "error": "this Idempotency-Key created a different order" });
        Answer {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            headers,
            body: body.to_string().into_bytes(),
            inserted: false,
        }
    }

    /// The answer when this key's row already exists: the same order (an earlier
    /// execution of this request, which the idempotency record did not stop) or another.
    fn existing(key: &str, found: (i64, String, i64), order: &NewOrder) -> Answer {
        let (id, item, qty) = found;
        if (&item, qty) != (&order.item, order.qty) {
            return Answer::key_reused();
        }
        eprintln!("the backstop caught a second execution of {key}");
        Answer::created(id, &item, qty)
    }

    fn into_response(self) -> Response {
        (self.status, self.headers, self.body).into_response()
    }
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

async fn create_order(
    State(app): State<App>,
    held: Option<Extension<InTransaction>>,
    claimed: Option<Extension<Claimed>>,
    headers: HeaderMap,
    Json(order): Json<NewOrder>,
) -> Response {
    // The layer has checked both already; a request without them never gets here.
    let (Some(user), Ok(Some(key))) = (bearer(&headers), client_key(&headers)) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    // Before any effect, so that an execution killed at any later instant is logged.
    let token = held.as_ref().map(|Extension(held)| held.claim().token().get());
    let key_logged = key.clone();
    if let (Some(file), Some(token)) = (&app.history, token) {
        if let Err(e) = log_execution(file, &key, token, "") {
            eprintln!("could not log the execution: {e}");
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
    }
    if !app.delay.is_zero() {
        tokio::time::sleep(app.delay).await;
    }
    // Charged before the order commits, under a key every execution of it shares.
    if let Some(payments) = &app.payments {
        let claimed = claimed.as_ref().map(|Extension(claimed)| claimed);
        if let Err(status) = payments.charge(claimed, &user, &key, order.qty).await {
            return status.into_response();
        }
    }
    // Record in the order's transaction when both live in one database.
    let held = held.filter(|_| app.together).map(|Extension(held)| held);
    let created = match &app.orders {
        Orders::Sqlite(db) => {
            let db = db.clone();
            let outbox = app.outbox.clone();
            let task =
                move || sqlite_order(&db, &user, &key, &order, held.as_ref(), outbox.as_deref());
            tokio::task::spawn_blocking(task).await.map_err(Failure::from).and_then(|r| r)
        }
        Orders::Postgres(pool) => {
            let outbox = app.outbox.as_deref();
            postgres_order(pool, &user, &key, &order, held.as_ref(), outbox).await
        }
    };
    match created {
        Ok(answer) => {
            // After the commit: one killed before this line, or whose commit's answer was
            // lost with its connection (an error here), committed unlogged.
            if let (Some(file), Some(token), true) = (&app.history, token, answer.inserted) {
                if let Err(e) = log_execution(file, &key_logged, token, "\tcommitted") {
                    eprintln!("could not log the execution's commit: {e}");
                }
            }
            answer.into_response()
        }
        // A 5xx releases the key (nothing committed): the client's retry runs again.
        Err(e) => {
            eprintln!("order failed: {}", one_line(&*e));
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// Appends `KEY\tTOKEN` and `tail` to the execution log (`ORDERS_HISTORY`). One
/// `write_all` of the whole line on a file opened for appending and not buffered: the
/// line reaches the kernel whole before the handler goes on, so a `kill -9` after it
/// cannot lose it, and the instances sharing the file cannot interleave their lines.
fn log_execution(
    mut file: &std::fs::File,
    key: &str,
    token: u64,
    tail: &str,
) -> std::io::Result<()> {
    use std::io::Write;
    file.write_all(format!("{key}\t{token}{tail}\n").as_bytes())
}

/// The outbox message announcing the new order `id`: a payment of `qty` to the user's
/// account, keyed by the order so that a republished copy is a duplicate downstream.
fn order_message(topic: &str, id: i64, user: &str, order: &NewOrder) -> OutboxMessage {
    let payload = json!({ "account": user, "amount": order.qty, "order": id, "item": order.item });
    OutboxMessage::new(format!("order-{id}"), topic, payload.to_string().into_bytes())
}

/// The order in SQLite: inserted, or (the backstop) the key's existing row answered;
/// with its record in the same transaction when `held`, and a new order's outbox
/// message too when `outbox` names a topic.
fn sqlite_order(
    db: &Mutex<Connection>,
    user: &str,
    key: &str,
    order: &NewOrder,
    held: Option<&InTransaction>,
    outbox: Option<&str>,
) -> Result<Answer, Failure> {
    let mut db = db.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let inserted = tx
        .query_row(
            "INSERT INTO orders (user, idempotency_key, item, qty) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (user, idempotency_key) DO NOTHING RETURNING id",
            params![user, key, order.item, order.qty],
            |row| row.get::<_, i64>(0),
        )
        .optional()?;
    let answer = match inserted {
        Some(id) => {
            if let Some(topic) = outbox {
                idemcache_sqlite::outbox::enqueue(&tx, &order_message(topic, id, user, order))?;
            }
            Answer { inserted: true, ..Answer::created(id, &order.item, order.qty) }
        }
        None => {
            let found = tx.query_row(
                "SELECT id, item, qty FROM orders WHERE user = ?1 AND idempotency_key = ?2",
                params![user, key],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )?;
            Answer::existing(key, found, order)
        }
    };
    // Every answer here is one the layer keeps (201, 422); one it would not keep (a
    // 5xx) has no record, and its key is released.
    let record =
        held.and_then(|h| Some((h, h.record(answer.status, &answer.headers, &answer.body)?)));
    if let Some((held, record)) = record {
        idemcache_sqlite::complete_in(&tx, held.claim(), Some(&record))?;
    }
    tx.commit()?;
    Ok(answer)
}

/// The order in PostgreSQL, as [`sqlite_order`] does it.
async fn postgres_order(
    pool: &deadpool_postgres::Pool,
    user: &str,
    key: &str,
    order: &NewOrder,
    held: Option<&InTransaction>,
    outbox: Option<&str>,
) -> Result<Answer, Failure> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let inserted = tx
        .query_opt(
            "INSERT INTO orders (\"user\", idempotency_key, item, qty) VALUES ($1, $2, $3, $4)
             ON CONFLICT (\"user\", idempotency_key) DO NOTHING RETURNING id",
            &[&user, &key, &order.item, &order.qty],
        )
        .await?;
    let answer = match inserted {
        Some(row) => {
            let id = row.try_get(0)?;
            if let Some(topic) = outbox {
                let message = order_message(topic, id, user, order);
                idemcache_postgres::outbox::enqueue(&tx, &message).await?;
            }
            Answer { inserted: true, ..Answer::created(id, &order.item, order.qty) }
        }
        None => {
            let row = tx
                .query_one(
                    "SELECT id, item, qty FROM orders WHERE \"user\" = $1 AND idempotency_key = $2",
                    &[&user, &key],
                )
                .await?;
            Answer::existing(key, (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?), order)
        }
    };
    let record =
        held.and_then(|h| Some((h, h.record(answer.status, &answer.headers, &answer.body)?)));
    if let Some((held, record)) = record {
        idemcache_postgres::complete_in(&tx, held.claim(), Some(&record)).await?;
    }
    tx.commit().await?;
    Ok(answer)
}

async fn count_orders(State(app): State<App>) -> Response {
    let count: Result<i64, Failure> = match &app.orders {
        Orders::Sqlite(db) => {
            let db = db.clone();
            tokio::task::spawn_blocking(move || {
                let db = db.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                db.query_row("SELECT COUNT(*) FROM orders", [], |row| row.get::<_, i64>(0))
            })
            .await
            .map_err(Failure::from)
            .and_then(|r| r.map_err(Failure::from))
        }
        Orders::Postgres(pool) => {
            async {
                let client = pool.get().await?;
                Ok(client.query_one("SELECT COUNT(*) FROM orders", &[]).await?.try_get(0)?)
            }
            .await
        }
    };
    match count {
        Ok(count) => Json(json!({ "count": count })).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

// ANCHOR: metrics-route
/// `GET /metrics`: the recorder's metrics as Prometheus text.
async fn metrics(prometheus: PrometheusHandle) -> Response {
    let text = "text/plain; version=0.0.4";
    ([(header::CONTENT_TYPE, HeaderValue::from_static(text))], prometheus.render()).into_response()
}

/// The recorder's upkeep (its histograms' buckets drained), which its own HTTP listener
/// would run; `/metrics` is served by this example's router instead.
async fn keep_metrics(prometheus: PrometheusHandle) {
    let mut ticks = tokio::time::interval(Duration::from_secs(5));
    loop {
        ticks.tick().await;
        prometheus.run_upkeep();
    }
}
// ANCHOR_END: metrics-route

/// The layer over the cache alone, or over the tier `IDEMPOTENCY_STORE` names: one
/// path whichever store it is (`idemcache_any::open` picks it from the URL).
async fn idempotency_layer(
    lease: Duration,
) -> Result<IdempotencyLayer, Box<dyn std::error::Error>> {
    let cache = Cache::builder().lease(lease).build()?;
    let url = std::env::var("IDEMPOTENCY_STORE").unwrap_or_default();
    if url.is_empty() {
        return Ok(IdempotencyLayer::new(cache));
    }
    let opening = || format!("could not open the idempotency store {}", redacted(&url));
    let store = doing(idemcache_any::open(&url).await, opening)?;
    doing(store.ensure_schema().await, opening)?;
    Ok(IdempotencyLayer::tiered(Tiered::new(cache, store).with_lease(lease)))
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
    let lease = Duration::from_millis(env_number(
        "IDEMPOTENCY_LEASE_MS",
        DEFAULT_LEASE.as_millis() as u64,
    )?);
    if lease.is_zero() {
        return Err("IDEMPOTENCY_LEASE_MS must be at least 1".into());
    }
    // The store first: opening it creates a SQLite file the orders may share.
    let layer = idempotency_layer(lease).await?;
    let spec = orders_db();
    let orders = doing(open_orders(&spec).await, || {
        let shown = if spec.is_empty() { ":memory:".to_owned() } else { redacted(&spec) };
        format!("could not open the orders database {shown}")
    })?;
    let store = std::env::var("IDEMPOTENCY_STORE").unwrap_or_default();
    let together = same_database(&store, &spec);
    if together {
        println!("records commit with the orders");
    }
    let outbox = match std::env::var("ORDERS_OUTBOX") {
        Ok(topic) if !topic.is_empty() => {
            doing(outbox_schema(&orders).await, || {
                "could not create the outbox in the orders database".to_owned()
            })?;
            Some(Arc::from(topic))
        }
        _ => None,
    };
    let payments = charge::Payments::from_env(env_number)?.map(Arc::new);
    let history = match std::env::var("ORDERS_HISTORY") {
        Ok(path) if !path.is_empty() => {
            let file = std::fs::OpenOptions::new().create(true).append(true).open(&path);
            Some(Arc::new(doing(file, || format!("could not open ORDERS_HISTORY {path}"))?))
        }
        _ => None,
    };
    let app = App { orders, delay, together, outbox, payments, history };
    // ANCHOR: prometheus
    let prometheus = doing(PrometheusBuilder::new().install_recorder(), || {
        "could not install the metrics recorder".to_owned()
    })?;
    tokio::spawn(keep_metrics(prometheus.clone()));
    tokio::spawn(layer.report_gauges(Duration::from_secs(5)));
    // ANCHOR_END: prometheus

    let mut idempotency = layer.tenant(|request| bearer(&request.headers)).scope(|request| {
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
        .with_state(app)
        // ANCHOR: route
        .route("/metrics", get(move || metrics(prometheus.clone())));
    // ANCHOR_END: route

    let listening = tokio::net::TcpListener::bind(("127.0.0.1", port)).await;
    let listener = doing(listening, || format!("could not listen on 127.0.0.1:{port}"))?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router).await?;
    Ok(())
}
