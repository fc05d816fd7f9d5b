//! What the gRPC example's tests share: the example's binary started as a server, its
//! `executed KEY` lines counted as they come, and a tonic client of its service.
//!
//! Invariant: a count of executions is taken only after [`Server::settle`], which makes
//! one more call and waits for its own `executed` line: the server writes its lines in
//! order, so every execution before it has been read by then. No test waits on a clock.

#![allow(dead_code)] // each test file uses its own part of this module

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::uri::PathAndQuery;
use tokio::sync::mpsc;
use tonic::client::GrpcService;
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};
use tonic_prost::ProstCodec;

// The example's messages, from the example itself: the tests speak what it serves.
#[path = "../../grpc.rs"]
#[allow(dead_code, unreachable_pub)]
mod example;

pub use example::{CreateOrder, Order, CREATE};

/// The error type tonic's client takes from a service.
type StdError = Box<dyn std::error::Error + Send + Sync>;

/// How long the server gets to start or to answer a line: a deadline against a hang,
/// never a wait for timing.
const PATIENCE: Duration = Duration::from_secs(30);

/// A running instance of the example, killed on drop.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    lines: mpsc::UnboundedReceiver<String>,
    /// Executions per key, of the lines read so far.
    executed: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nothing listens on now: bound to port 0 and released. (The example takes a
/// port, not a listener; another process could take it in between, which a test run
/// would show as a failure to listen, never as a wrong answer.)
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("its address").port()
}

/// A name no other test (or earlier run against the same database) has used.
pub fn unique(what: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{what}-{}-{nanos}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

impl Server {
    /// Starts the example with these environment variables, and waits for `listening on`.
    pub async fn start(env: &[(&str, &str)]) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_idemcache-grpc-example"));
        command.env("PORT", free_port().to_string()).env_remove("IDEMPOTENCY_STORE");
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the example");
        let stdout = child.stdout.take().expect("its stdout");
        let (send, mut lines) = mpsc::unbounded_channel();
        let executed = Arc::new(Mutex::new(HashMap::new()));
        let counts = executed.clone();
        // A thread of its own: reading a pipe blocks.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(key) = line.strip_prefix("executed ") {
                    *counts.lock().unwrap().entry(key.to_owned()).or_insert(0) += 1;
                }
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let url = loop {
            let line = tokio::time::timeout(PATIENCE, lines.recv())
                .await
                .expect("the example prints `listening on` in time")
                .expect("the example exited before listening");
            if let Some(url) = line.strip_prefix("listening on ") {
                break url.to_owned();
            }
        };
        Server { child, url, lines, executed }
    }

    /// A client of this server.
    pub async fn client(&self) -> OrdersClient {
        OrdersClient::connect(self.url.clone()).await.expect("connect to the example")
    }

    /// Waits until every execution so far has been read, by making one more (a fresh
    /// key) and reading up to its line.
    pub async fn settle(&mut self) {
        let key = unique("settle");
        let answer = self.client().await.create(order("pen", 1), Some(&key), Some("settler")).await;
        answer.expect("the settling call succeeds");
        let wanted = format!("executed {key}");
        loop {
            let line = tokio::time::timeout(PATIENCE, self.lines.recv())
                .await
                .expect("the settling call's line comes in time")
                .expect("the example exited");
            if line == wanted {
                return;
            }
        }
    }

    /// How many times `key` was executed (after [`Server::settle`]).
    pub fn executions(&self, key: &str) -> usize {
        self.executed.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

/// A `CreateOrder`.
pub fn order(item: &str, qty: i32) -> CreateOrder {
    CreateOrder { item: item.to_owned(), qty }
}

/// An `orders.v1.Orders` client over a tonic channel (or any gRPC service: one wrapped
/// in idemcache-client's layer), as a generated one would be: the path, the codec and
/// the messages by hand.
#[derive(Debug, Clone)]
pub struct OrdersClient<T = Channel> {
    inner: tonic::client::Grpc<T>,
}

impl OrdersClient {
    /// A client of the server at `url`.
    pub async fn connect(url: String) -> Result<OrdersClient, Box<dyn std::error::Error>> {
        let channel = Channel::from_shared(url)?.connect().await?;
        Ok(OrdersClient::new(channel))
    }
}

impl<T> OrdersClient<T>
where
    T: GrpcService<tonic::body::Body>,
    T::Error: Into<StdError>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<StdError> + Send,
{
    /// A client over `service`, as a generated client's `new`.
    pub fn new(service: T) -> OrdersClient<T> {
        OrdersClient { inner: tonic::client::Grpc::new(service) }
    }

    /// `rpc Create`, with the `idempotency-key` and `authorization: Bearer USER`
    /// metadata when given.
    pub async fn create(
        &mut self,
        message: CreateOrder,
        key: Option<&str>,
        user: Option<&str>,
    ) -> Result<Response<Order>, Status> {
        let mut request = Request::new(message);
        if let Some(key) = key {
            request.metadata_mut().insert("idempotency-key", key.parse().unwrap());
        }
        if let Some(user) = user {
            let bearer = format!("Bearer {user}").parse().unwrap();
            request.metadata_mut().insert("authorization", bearer);
        }
        self.create_request(request).await
    }

    /// `rpc Create` with the request as given (its metadata, its timeout).
    pub async fn create_request(
        &mut self,
        request: Request<CreateOrder>,
    ) -> Result<Response<Order>, Status> {
        self.inner.ready().await.map_err(|e| Status::unavailable(e.into().to_string()))?;
        let codec = ProstCodec::<CreateOrder, Order>::default();
        self.inner.unary(request, PathAndQuery::from_static(CREATE), codec).await
    }
}

/// Whether the answer's metadata says it is a replay.
pub fn replayed(metadata: &MetadataMap) -> bool {
    metadata.get("idempotent-replayed").is_some_and(|v| v == "true")
}

/// The `idempotency-refusal` metadata, if any.
pub fn refusal(status: &Status) -> Option<&str> {
    status.metadata().get("idempotency-refusal").and_then(|v| v.to_str().ok())
}

/// Asserts `answer` failed with `code`, and returns its status.
pub fn failed<T: std::fmt::Debug>(answer: Result<T, Status>, code: Code) -> Status {
    match answer {
        Err(status) if status.code() == code => status,
        other => panic!("expected {code:?}, got {other:?}"),
    }
}
