//! What the client's tests share: a payments service behind the idempotency layer (in
//! memory), and a TCP proxy in front of it that injects a fault into each connection
//! in turn ([`Proxy`]).
//!
//! Invariant: the proxy forwards every request byte it is given to the service, so a
//! fault never keeps a request from executing: it only loses, cuts or delays the answer
//! on its way back, which is what a client cannot tell from the request never arriving.

#![allow(dead_code)] // each test binary uses part of this

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use idemcache::layer::{Decision, IdempotencyLayer, OutcomeUnknown};
use idemcache::Cache;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

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

/// What the proxy does to one connection's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forwards it whole.
    Pass,
    /// Forwards the request, waits for the answer's first bytes (the service has
    /// executed), then closes the client's connection without them.
    DropResponse,
    /// Forwards the answer's first bytes, then resets the connection (RST).
    ResetMidResponse,
    /// Holds the answer this long, then forwards it (past a client's timeout).
    Delay(Duration),
}

/// A TCP proxy to one upstream: each new connection takes the next scripted fault
/// ([`Fault::Pass`] once the script is spent).
#[derive(Clone)]
pub struct Proxy {
    pub addr: SocketAddr,
    faults: Arc<Mutex<VecDeque<Fault>>>,
    connections: Arc<AtomicU64>,
}

impl Proxy {
    /// A proxy to `upstream` on a free port of 127.0.0.1.
    pub async fn to(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Proxy {
            addr: listener.local_addr().unwrap(),
            faults: Arc::default(),
            connections: Arc::default(),
        };
        let serving = proxy.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { return };
                serving.connections.fetch_add(1, Ordering::SeqCst);
                let fault = serving.faults.lock().unwrap().pop_front().unwrap_or(Fault::Pass);
                tokio::spawn(relay(client, upstream, fault));
            }
        });
        proxy
    }

    /// Scripts the next connections' faults, in order.
    pub fn script(&self, faults: impl IntoIterator<Item = Fault>) {
        self.faults.lock().unwrap().extend(faults);
    }

    /// How many connections it accepted.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }
}

/// One connection through the proxy, under `fault`.
async fn relay(client: TcpStream, upstream: SocketAddr, fault: Fault) {
    let Ok(server) = TcpStream::connect(upstream).await else { return };
    if fault == Fault::ResetMidResponse {
        // Closed with linger 0: the kernel sends RST, not FIN (a drop that does not
        // block: the socket is non-blocking).
        let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
    }
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let upward = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_client, &mut to_server).await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    match fault {
        Fault::Pass => {
            let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
        }
        Fault::DropResponse => {
            let _ = from_server.read(&mut buf).await;
        }
        Fault::ResetMidResponse => {
            if let Ok(n) = from_server.read(&mut buf).await {
                let _ = to_client.write_all(&buf[..n / 2]).await;
            }
        }
        Fault::Delay(by) => {
            tokio::time::sleep(by).await;
            let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
        }
    }
    upward.abort();
    // Dropping both halves of the client's stream closes it (or resets it).
    drop(to_client);
}

/// An address nothing listens on: a connection to it is refused.
pub fn nowhere() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}
