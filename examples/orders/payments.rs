//! A payments service: the second service of the two-service fault run
//! (`.ci/two-services`), which the orders example calls to charge each new order.
//!
//! `POST /payments` (`{"account": string, "amount": integer, "order_key": string}`)
//! inserts one payment and answers 201 with `{"id", "account", "amount"}`. It is behind
//! the idempotency layer over PostgreSQL, and each payment commits with its idempotency
//! record in one transaction (`complete_in`): a call repeated with the same
//! `Idempotency-Key` is answered with the first one's payment, however the first call's
//! answer was lost on the way back. A call without a key is executed as it comes, as a
//! payment API executes a keyless call: that is what a retry without a key (the
//! `reqwest-retry` comparison of the fault run) meets. `GET /payments/count` answers
//! `{"count": n}`.
//!
//! ```sh
//! PAYMENTS_DB=postgres://postgres@127.0.0.1:5432/test PORT=3100 \
//!     cargo run --release -p idemcache-orders --example payments
//! ```
//!
//! Environment: `PAYMENTS_DB` (required): the PostgreSQL database of the payments and of
//! their records; `PORT` (default 3100); `IDEMPOTENCY_LEASE_MS` (default 10000). Prints
//! `listening on http://ADDR` once ready.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use idemcache::layer::{IdempotencyLayer, InTransaction};
use idemcache::store::encoding::one_line;
use idemcache::store::Store;
use idemcache::store::{Tiered, DEFAULT_LEASE};
use idemcache::Cache;
use idemcache_postgres::{deadpool_postgres, tokio_postgres, PostgresStore};
use serde::Deserialize;
use serde_json::json;

type Failure = Box<dyn std::error::Error + Send + Sync>;

const PAYMENTS: &str = "CREATE TABLE IF NOT EXISTS payments (
    id BIGSERIAL PRIMARY KEY,
    account TEXT NOT NULL,
    amount BIGINT NOT NULL,
    order_key TEXT NOT NULL,
    -- The audit of .ci/two-services tells a kill between a payment and its order by it.
    paid_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
)";

#[derive(Deserialize)]
struct Payment {
    account: String,
    amount: i64,
    order_key: String,
}

/// The payment, and (when the call had a key) its record, in one transaction.
async fn pay(
    State(pool): State<deadpool_postgres::Pool>,
    held: Option<Extension<InTransaction>>,
    Json(payment): Json<Payment>,
) -> Response {
    let paid = async {
        let mut client = pool.get().await?;
        let tx = client.transaction().await?;
        let row = tx
            .query_one(
                "INSERT INTO payments (account, amount, order_key) VALUES ($1, $2, $3) RETURNING id",
                &[&payment.account, &payment.amount, &payment.order_key],
            )
            .await?;
        let id: i64 = row.try_get(0)?;
        let body = json!({ "id": id, "account": payment.account, "amount": payment.amount });
        let mut response = (StatusCode::CREATED, Json(body)).into_response();
        if let Some(Extension(held)) = &held {
            let (record, recorded) = held.record_response(response).await?;
            let record = record.ok_or("a 201 the layer would not keep")?;
            idemcache_postgres::complete_in(&tx, held.claim(), Some(&record)).await?;
            response = recorded.into_response();
        }
        tx.commit().await?;
        Ok::<_, Failure>(response)
    };
    match paid.await {
        Ok(response) => response,
        // Nothing committed: a 5xx releases the key, and a retry pays.
        Err(e) => {
            eprintln!("payment failed: {}", one_line(&*e));
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

async fn count(State(pool): State<deadpool_postgres::Pool>) -> Response {
    let counted = async {
        let row = pool.get().await?.query_one("SELECT count(*) FROM payments", &[]).await?;
        Ok::<i64, Failure>(row.try_get(0)?)
    };
    match counted.await {
        Ok(n) => Json(json!({ "count": n })).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, one_line(&*e)).into_response(),
    }
}

fn number(name: &str, default: u64) -> Result<u64, Failure> {
    match std::env::var(name) {
        Ok(v) => v.parse().map_err(|_| format!("{name} must be a whole number, not {v:?}").into()),
        Err(_) => Ok(default),
    }
}

async fn serve() -> Result<(), Failure> {
    let url = std::env::var("PAYMENTS_DB").map_err(|_| "set PAYMENTS_DB to a PostgreSQL URL")?;
    let port = u16::try_from(number("PORT", 3100)?).map_err(|_| "PORT must be a port number")?;
    let default_lease = u64::try_from(DEFAULT_LEASE.as_millis()).unwrap_or(u64::MAX);
    let lease = Duration::from_millis(number("IDEMPOTENCY_LEASE_MS", default_lease)?.max(1));

    let config: tokio_postgres::Config = url.parse()?;
    let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(manager).max_size(16).build()?;
    {
        let mut client = pool.get().await?;
        // Instances starting together: CREATE TABLE IF NOT EXISTS can still collide.
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock(7042)", &[]).await?;
        tx.batch_execute(PAYMENTS).await?;
        tx.commit().await?;
    }
    let store = PostgresStore::from_pool(pool.clone());
    store.ensure_schema().await?;
    let tier = Tiered::new(Cache::builder().lease(lease).build()?, store).with_lease(lease);
    // The key is optional, as a payment API's is: a call without one runs as sent.
    let idempotency = IdempotencyLayer::tiered(tier).require_key(false);
    let router = Router::new()
        .route("/payments", post(pay))
        .route_layer(idempotency)
        .route("/payments/count", get(count))
        .with_state(pool);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match serve().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&*e));
            std::process::ExitCode::FAILURE
        }
    }
}
