//! The client half's quickstart: an orders service charging an order through a payments
//! API, with one key across every retry.
//!
//! ```sh
//! cargo run -p idemcache-client --example call_payments
//! ```
//!
//! It starts a payments service (behind idemcache's layer, in memory) whose first charge
//! of each order takes longer than the caller waits for an answer, charges order 42
//! through `IdempotentRetry` (the first attempt times out after the request was sent;
//! the retry carries the same key, is told the charge is in progress, waits, and gets
//! its answer), charges it again (the retry of a whole execution), and calls a port
//! nobody listens on. It prints each outcome and exits 0 when order 42 was charged once
//! (the retry and the second call replayed it) and the last call was `NotSent`; 1
//! otherwise.
//!
//! Invariant: the charge runs once per key, however many attempts carry it.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use idemcache::layer::IdempotencyLayer;
use idemcache::Cache;
use idemcache_client::reqwest;
use idemcache_client::reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use idemcache_client::{CallKey, CallOutcome, IdempotentRetry, RetryPolicy};

// ANCHOR: caller
/// Charges `order` once, whatever the network does to the attempts: one key for the
/// call, kept across its retries.
async fn charge(payments: &ClientWithMiddleware, url: &str, order: u64) -> CallOutcome {
    let key = CallKey::new(format!("order-{order}-charge")).expect("a valid key");
    let sent = payments.post(url).body(format!("order {order}")).with_extension(key).send();
    CallOutcome::of(sent.await).await
}
// ANCHOR_END: caller

/// What `outcome` says, as a line.
async fn said(outcome: CallOutcome) -> String {
    match outcome {
        CallOutcome::Executed { response, replayed } => {
            let body = response.text().await.unwrap_or_default();
            format!("executed (replayed: {replayed}): {body}")
        }
        CallOutcome::Refused { status, .. } => format!("refused: {status}"),
        CallOutcome::NotSent { .. } => "not sent: nothing ran".to_owned(),
        CallOutcome::Unknown { status, .. } => format!("unknown ({status:?}): reconcile it"),
    }
}

/// A payments service whose first charge of each order is slow (half a second, longer
/// than the caller's timeout). Returns its address and the count of charges made.
async fn payments() -> std::io::Result<(std::net::SocketAddr, Arc<AtomicU64>)> {
    let charges = Arc::new(AtomicU64::new(0));
    let seen = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let made = charges.clone();
    let charge = move |body: String| async move {
        let n = made.fetch_add(1, Ordering::SeqCst) + 1;
        if seen.lock().expect("not poisoned").insert(body.clone()) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        (StatusCode::CREATED, format!("charge {n} for {body}"))
    };
    let layer = IdempotencyLayer::new(Cache::builder().build().expect("a cache"));
    let app = Router::new().route("/charges", post(charge)).route_layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((addr, charges))
}

#[tokio::main]
async fn main() -> ExitCode {
    let Ok((addr, charges)) = payments().await else { return ExitCode::FAILURE };
    // Each attempt waits 200 ms for its answer; at most 4 attempts, within 5 s.
    let Ok(inner) = reqwest::Client::builder().timeout(Duration::from_millis(200)).build() else {
        return ExitCode::FAILURE;
    };
    let policy = RetryPolicy::default().with_deadline(Duration::from_secs(5));
    let Ok(policy) = policy.and_then(|p| p.with_attempts(4)) else {
        return ExitCode::FAILURE;
    };
    let client = ClientBuilder::new(inner).with(IdempotentRetry::new(policy)).build();
    let url = format!("http://{addr}/charges");
    let first = charge(&client, &url, 42).await;
    let ran_once = first.ran() == Some(true);
    println!("charge order 42: {}", said(first).await);
    let again = charge(&client, &url, 42).await;
    let replayed = matches!(again, CallOutcome::Executed { replayed: true, .. });
    println!("charge order 42 again: {}", said(again).await);
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr());
    let Ok(nowhere) = nowhere else { return ExitCode::FAILURE };
    let lost = charge(&client, &format!("http://{nowhere}/charges"), 43).await;
    let not_sent = matches!(lost, CallOutcome::NotSent { .. });
    println!("charge order 43 at {nowhere}: {}", said(lost).await);
    let charged = charges.load(Ordering::SeqCst);
    println!("charges made: {charged}");
    if ran_once && replayed && not_sent && charged == 1 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
