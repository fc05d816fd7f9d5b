//! What the client's tests share: a payments service behind the idempotency layer (in
//! memory), and a TCP proxy in front of it that injects a fault into each connection
//! in turn ([`Proxy`], `proxy.rs`: the gRPC example's client tests use it too).

#![allow(dead_code)] // each test binary uses part of this

mod proxy;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use idemcache::layer::{Decision, IdempotencyLayer, OutcomeUnknown};
use idemcache::Cache;
use tokio::net::TcpListener;
use tokio::sync::Notify;

pub use proxy::{nowhere, Fault, Proxy};

/// The payments service: `POST /charges` runs once per key (its answer replayed after;
/// a request without a key runs every time it arrives)
/// and counts its runs; `POST /slow` waits for [`Payments::release`] first;
/// `POST /broken` answers 503 and keeps nothing; `POST /unknown` answers 504 and leaves
/// its key UNKNOWN.
#[derive(Clone, Default)]
pub struct Payments {
    runs: Arc<AtomicU64>,
    in_progress: Arc<AtomicU64>,
    gate: Arc<Notify>,
}

impl Payments {
    /// How many times a handler ran.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::SeqCst)
    }

    /// How many requests the layer answered "in progress" (409).
    pub fn answered_in_progress(&self) -> u64 {
        self.in_progress.load(Ordering::SeqCst)
    }

    /// Lets the waiting `/slow` handler answer.
    pub fn release(&self) {
        self.gate.notify_one();
    }

    /// Serves on a free port of 127.0.0.1; returns its address.
    pub async fn serve(&self) -> SocketAddr {
        let cache = Cache::builder().build().unwrap();
        let in_progress = self.in_progress.clone();
        // The key is optional, as a payment API's is: a request without one runs as sent.
        let layer = IdempotencyLayer::new(cache).require_key(false).on_decision(move |event| {
            if event.decision == Decision::InProgress {
                in_progress.fetch_add(1, Ordering::SeqCst);
            }
        });
        let (runs, slow_runs, broken_runs, gate) =
            (self.runs.clone(), self.runs.clone(), self.runs.clone(), self.gate.clone());
        let app = Router::new()
            .route(
                "/charges",
                post(move |body: String| async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    (StatusCode::CREATED, format!("charge {n}: {body}"))
                }),
            )
            .route(
                "/slow",
                post(move |body: String| async move {
                    slow_runs.fetch_add(1, Ordering::SeqCst);
                    gate.notified().await;
                    (StatusCode::CREATED, format!("slow: {body}"))
                }),
            )
            .route(
                "/unknown",
                post(move || async move {
                    // The handler cannot tell whether its effect happened: the key turns
                    // UNKNOWN, and every retry is told so (409 outcome_unknown).
                    let mut response = axum::response::Response::new(axum::body::Body::empty());
                    *response.status_mut() = StatusCode::GATEWAY_TIMEOUT;
                    response.extensions_mut().insert(OutcomeUnknown);
                    response
                }),
            )
            .route(
                "/broken",
                post(move || async move {
                    broken_runs.fetch_add(1, Ordering::SeqCst);
                    StatusCode::SERVICE_UNAVAILABLE
                }),
            )
            .route_layer(layer);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    }
}
