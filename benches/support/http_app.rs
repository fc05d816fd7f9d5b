//! The service every row of the HTTP load benchmark serves, whatever middleware is in
//! front of it: `POST /orders` (a trivial JSON handler), `POST /slow-orders` (the same
//! after 100 ms, for the concurrent-duplicates check), and `GET /executions` (how many
//! times a handler ran, for the semantic checks). Shared by `http_serve` (our rows and
//! two peers) and `peer-idempotent/` (the `idempotent` crate's row).
//!
//! Invariant: every row runs this handler on the same routes, on a runtime built the
//! same way ([`serve`]), so the rows differ only in the middleware in front; and every
//! execution of a handler is counted once in [`EXECUTIONS`] before it answers.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;

/// Executions of the order handlers, from the start of the process.
pub static EXECUTIONS: AtomicU64 = AtomicU64::new(0);

#[derive(Serialize)]
struct Order {
    id: u64,
    status: &'static str,
    items: u32,
}

/// The trivial JSON handler: reads the body, counts itself, answers 201.
async fn create(body: Bytes) -> (StatusCode, Json<Order>) {
    let id = EXECUTIONS.fetch_add(1, Ordering::Relaxed) + 1;
    (StatusCode::CREATED, Json(Order { id, status: "created", items: body.len() as u32 }))
}

/// The same after 100 ms: long enough for ten concurrent duplicates to overlap it.
async fn create_slowly(body: Bytes) -> (StatusCode, Json<Order>) {
    tokio::time::sleep(Duration::from_millis(100)).await;
    create(body).await
}

/// The routes the middleware guards.
pub fn guarded_routes() -> Router {
    Router::new().route("/orders", post(create)).route("/slow-orders", post(create_slowly))
}

/// The routes no middleware guards.
pub fn open_routes() -> Router {
    Router::new()
        .route("/executions", get(|| async { EXECUTIONS.load(Ordering::Relaxed).to_string() }))
}

/// The worker threads of every server's runtime: `--threads N` on the command line, else
/// the number of cores (what `#[tokio::main]` gives a service).
pub fn threads() -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
}

/// Builds the server's runtime, then serves the router `app` builds on 127.0.0.1 (a free
/// port), printing `listening ADDR` on stdout once it accepts. Returns when the
/// connection to `http_load` (stdin) closes, so a killed load generator leaves no server.
pub fn serve<F, Fut>(app: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<Router, String>>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads())
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async move {
        let app = match app().await {
            Ok(app) => app,
            Err(why) => {
                println!("unavailable {why}");
                return;
            }
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        println!("listening {}", listener.local_addr().expect("an address"));
        use axum::serve::ListenerExt;
        // Responses are one write each: no reason to let Nagle hold any of them.
        let listener = listener.tap_io(|tcp| drop(tcp.set_nodelay(true)));
        let server = axum::serve(listener, app);
        // stdin closes when the load generator exits, however it exits.
        let parent_gone = tokio::task::spawn_blocking(|| {
            let mut sink = String::new();
            while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
        });
        tokio::select! {
            _ = server => {}
            _ = parent_gone => {}
        }
    });
    runtime.shutdown_timeout(Duration::from_millis(100));
}
