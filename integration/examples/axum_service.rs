//! The README's HTTP quickstart: an axum service whose `POST /orders` is made idempotent
//! by the `Idempotency-Key` header (idemcache's feature `tower`).
//!
//! ```sh
//! cargo run --example axum_service
//! ```
//!
//! It listens on a free port of 127.0.0.1, sends itself one order twice with one key and
//! then the same key with another body, prints each answer and exits: 0 when the first
//! created the order, the second was its replay (`Idempotent-Replayed: true`, the
//! handler not run again) and the third was refused with 422; 1 otherwise.
//!
//! Invariant: the handler runs once per key and user; every repeat of the same request
//! gets the first answer back, and the key with another request is refused. The complete
//! service (a database, a durable store) is `orders.rs` beside it.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use idemcache::layer::IdempotencyLayer;
use idemcache::Cache;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How many orders the handler created.
static ORDERS: AtomicU64 = AtomicU64::new(0);

// ANCHOR: service
/// The user named by `Authorization: Bearer <user>`.
fn bearer_user(headers: &HeaderMap) -> Option<String> {
    let user = headers.get("authorization")?.to_str().ok()?.strip_prefix("Bearer ")?;
    (!user.is_empty()).then(|| user.to_owned())
}

/// Creates an order: runs once per key, however often the client retries.
async fn create_order(body: String) -> (StatusCode, String) {
    let id = ORDERS.fetch_add(1, Ordering::Relaxed) + 1;
    (StatusCode::CREATED, format!("{{\"order\":{id},\"request\":{body}}}"))
}

fn app(cache: Cache) -> Router {
    let idempotency = IdempotencyLayer::new(cache)
        .tenant(|req| bearer_user(&req.headers)) // keys are per user: None answers 401
        .wait(Duration::from_secs(10)); // duplicates wait and get the replay
    Router::new().route("/orders", post(create_order)).route_layer(idempotency)
}
// ANCHOR_END: service

/// Sends `POST /orders` with `key` and `body` over a connection of its own; returns the
/// whole response as text.
async fn post_order(addr: SocketAddr, key: &str, body: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!(
        "POST /orders HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer alice\r\n\
         Idempotency-Key: {key}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response)
}

/// The status line's code, whether the answer was a replay, and the body.
fn summary(response: &str) -> (u16, bool, &str) {
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((response, ""));
    let status = head.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    let replayed = head.lines().any(|line| line.eq_ignore_ascii_case("idempotent-replayed: true"));
    (status, replayed, body)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let service = app(Cache::builder().build()?);
    tokio::spawn(async move { axum::serve(listener, service).await });
    println!("listening on http://{addr}");

    let sends = [
        ("k1", r#"{"item":"book","qty":2}"#),
        ("k1", r#"{"item":"book","qty":2}"#),
        ("k1", r#"{"item":"pen","qty":9}"#),
    ];
    let mut answers = Vec::new();
    for (key, body) in sends {
        let response = post_order(addr, key, body).await?;
        let (status, replayed, answer) = summary(&response);
        let replay = if replayed { " (Idempotent-Replayed: true)" } else { "" };
        println!("POST /orders key {key} {body} -> {status}{replay} {answer}");
        answers.push((status, replayed, answer.to_owned()));
    }
    let created = ORDERS.load(Ordering::Relaxed);
    println!("orders created: {created}");
    let expected = answers.len() == 3
        && (answers[0].0, answers[0].1) == (201, false)
        && (answers[1].0, answers[1].1) == (201, true)
        && answers[1].2 == answers[0].2
        && answers[2].0 == 422
        && created == 1;
    if !expected {
        return Err("expected 201, its replay, then 422, and one order".into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
