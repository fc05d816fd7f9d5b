//! The client half over gRPC: idemcache-client's `IdempotentRetryLayer` around a tonic
//! `Channel`, a client built over it as a generated one is (`OrdersClient::new`), against
//! the example's server, through the fault proxy the client's own tests use: each fault
//! it injects (the answer dropped after the call executed, cut mid-way, held past the
//! call's timeout) is retried with the call's one `idempotency-key` and ends `Executed`,
//! replayed, with the order executed once; a server never reached is `NotSent`; a
//! reused key is `Refused` (`FAILED_PRECONDITION`) after one attempt; the in-progress
//! `ABORTED` is waited out by its `grpc-retry-pushback-ms`; `UNAVAILABLE` is retried and
//! runs again; a kept `INVALID_ARGUMENT` is `Refused`; answers lost on every attempt are
//! `Unknown`.

mod common;

// The client's own fault proxy, shared rather than copied.
#[path = "../../../client/tests/common/proxy.rs"]
#[allow(dead_code)]
mod proxy;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use common::{order, refusal, unique, CreateOrder, OrdersClient, Server};
use idemcache_client::{
    CallFailed, CallKey, GrpcOutcome, IdempotentRetryLayer, IdempotentRetryService, RetryPolicy,
};
use proxy::{nowhere, Fault, Proxy};
use tonic::transport::Channel;
use tonic::{Code, Request};
use tower::Layer;

/// The client under test: the layer around a channel, counted.
type Client = OrdersClient<IdempotentRetryService<Counted<Channel>>>;

/// A service that logs the attempts that reach it (each one the layer makes): when each
/// was sent, and when its answer came with the `grpc-retry-pushback-ms` it asked for.
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    log: Log,
}

/// Each attempt's start, and its answer's time and pushback.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Attempt>>>);

/// When an attempt was sent, and when its answer came with what pushback.
type Attempt = (Instant, Option<(Instant, Option<Duration>)>);

impl Log {
    fn attempts(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

impl<S, B, ResB> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<ResB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let log = self.log.0.clone();
        let n = {
            let mut log = log.lock().unwrap();
            log.push((Instant::now(), None));
            log.len() - 1
        };
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            if let Ok(response) = &answer {
                let pushback = response.headers().get("grpc-retry-pushback-ms");
                let ms = pushback.and_then(|v| v.to_str().ok()?.parse().ok());
                log.lock().unwrap()[n].1 = Some((Instant::now(), ms.map(Duration::from_millis)));
            }
            answer
        })
    }
}

/// A client of `url` retrying quickly, each attempt given up after 300 ms; HTTP/2
/// keepalive every 100 ms, so that a connection whose answers stall is given up (and
/// the retry opens another) rather than waited on. Connects on its first call. Returns
/// the attempts' log beside it.
fn client(url: &str, attempts: u32) -> (Client, Log) {
    let channel = Channel::from_shared(url.to_owned())
        .unwrap()
        .timeout(Duration::from_millis(300))
        .http2_keep_alive_interval(Duration::from_millis(100))
        .keep_alive_timeout(Duration::from_millis(200))
        .connect_lazy();
    let policy = RetryPolicy::default()
        .with_first_delay(Duration::from_millis(5))
        .unwrap()
        .with_attempts(attempts)
        .unwrap();
    let log = Log::default();
    let counted = Counted { inner: channel, log: log.clone() };
    (OrdersClient::new(IdempotentRetryLayer::new(policy).layer(counted)), log)
}

/// `Create` by user `alice`, under the caller's key `key`.
async fn create(
    client: &mut Client,
    message: CreateOrder,
    key: &str,
) -> GrpcOutcome<common::Order> {
    let mut request = Request::new(message);
    request.metadata_mut().insert("authorization", "Bearer alice".parse().unwrap());
    request.extensions_mut().insert(CallKey::new(key).unwrap());
    GrpcOutcome::of(client.create_request(request).await)
}

fn addr(url: &str) -> SocketAddr {
    url.trim_start_matches("http://").parse().unwrap()
}

fn executed(outcome: GrpcOutcome<common::Order>) -> (bool, common::Order) {
    match outcome {
        GrpcOutcome::Executed { response, replayed } => (replayed, response.into_inner()),
        other => panic!("expected Executed, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_lost_answer_is_retried_with_one_key_and_the_order_runs_once() {
    let mut server = Server::start(&[]).await;
    let proxy = Proxy::h2(addr(&server.url)).await;
    let faults =
        [Fault::DropResponse, Fault::ResetMidResponse, Fault::Delay(Duration::from_secs(2))];
    let mut keys = Vec::new();
    for fault in faults {
        // A channel of its own: its first connection takes the fault.
        let (mut client, attempts) = client(&format!("http://{}", proxy.addr), 5);
        proxy.script([fault]);
        let key = unique("lost");
        let (replayed, order) = executed(create(&mut client, order("book", 2), &key).await);
        assert!(replayed, "{fault:?}: the retry got the first attempt's answer back");
        assert_eq!((order.item.as_str(), order.qty), ("book", 2));
        assert!(attempts.attempts() >= 2, "{fault:?}: retried");
        keys.push((fault, key));
    }
    server.settle().await;
    for (fault, key) in keys {
        assert_eq!(server.executions(&key), 1, "{fault:?}: executed once");
    }
}

#[tokio::test]
async fn a_server_never_reached_is_not_sent_after_every_attempt() {
    let (mut client, attempts) = client(&format!("http://{}", nowhere()), 3);
    let outcome = create(&mut client, order("book", 1), &unique("nowhere")).await;
    let GrpcOutcome::NotSent { status } = outcome else {
        panic!("expected NotSent, got {outcome:?}")
    };
    assert_eq!(status.code(), Code::Unavailable);
    let failed = CallFailed::find(&status).expect("the CallFailed");
    assert_eq!((failed.attempts, failed.sent), (3, false), "{failed}");
    assert_eq!(attempts.attempts(), 3);
}

#[tokio::test]
async fn a_reused_key_is_refused_after_one_attempt() {
    let mut server = Server::start(&[]).await;
    let (mut client, attempts) = client(&server.url, 5);
    let key = unique("reused");
    executed(create(&mut client, order("book", 1), &key).await);
    let outcome = create(&mut client, order("another book", 1), &key).await;
    let GrpcOutcome::Refused { status } = outcome else {
        panic!("expected Refused, got {outcome:?}")
    };
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(refusal(&status), Some("idempotency_key_reused"));
    assert_eq!(attempts.attempts(), 2, "one attempt each: never retried");
    server.settle().await;
    assert_eq!(server.executions(&key), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_progress_answer_is_waited_out_and_replays_the_first() {
    let mut server = Server::start(&[("ORDER_DELAY_MS", "1500")]).await;
    let key = unique("in-progress");
    let first = tokio::spawn({
        let (url, key) = (server.url.clone(), key.clone());
        async move {
            let mut plain = OrdersClient::connect(url).await.unwrap();
            plain.create(order("book", 3), Some(&key), Some("alice")).await
        }
    });
    while server.executions(&key) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // No timeout of its own past the first's: the layer answers ABORTED with a pushback
    // at once, and the duplicate waits it out before asking again.
    let channel = Channel::from_shared(server.url.clone()).unwrap().connect_lazy();
    let log = Log::default();
    let counted = Counted { inner: channel, log: log.clone() };
    let mut duplicate = OrdersClient::new(IdempotentRetryLayer::default().layer(counted));
    let mut request = Request::new(order("book", 3));
    request.metadata_mut().insert("authorization", "Bearer alice".parse().unwrap());
    request.metadata_mut().insert("idempotency-key", key.parse().unwrap());
    let (replayed, second) = executed(GrpcOutcome::of(duplicate.create_request(request).await));
    let first = first.await.unwrap().expect("the first call succeeds").into_inner();
    assert!(replayed, "the duplicate got the first's answer, replayed");
    assert_eq!(second, first);
    // Every attempt but the last was answered ABORTED with a pushback, and the next
    // waited at least that long.
    let log = log.0.lock().unwrap().clone();
    assert!((2..=4).contains(&log.len()), "ABORTED, waited out, then the replay: {log:?}");
    for pair in log.windows(2) {
        let ((_, answered), (next, _)) = (pair[0], pair[1]);
        let (at, pushback) = answered.expect("an answer");
        let pushback = pushback.expect("an ABORTED answer with a pushback");
        assert!(next - at >= pushback, "waited {:?}, asked {pushback:?}", next - at);
    }
    let (_, last) = log.last().unwrap();
    assert_eq!(last.unwrap().1, None, "the replay has no pushback");
    server.settle().await;
    assert_eq!(server.executions(&key), 1);
}

#[tokio::test]
async fn unavailable_is_retried_and_runs_again() {
    let mut server = Server::start(&[]).await;
    let (mut client, attempts) = client(&server.url, 5);
    let key = unique("flaky");
    let (replayed, order) = executed(create(&mut client, order("flaky", 1), &key).await);
    assert!(!replayed, "the first execution's UNAVAILABLE was not kept: the retry ran");
    assert_eq!(order.item, "flaky");
    assert_eq!(attempts.attempts(), 2);
    server.settle().await;
    assert_eq!(server.executions(&key), 2);
}

#[tokio::test]
async fn a_kept_invalid_argument_is_refused_after_one_attempt() {
    let server = Server::start(&[]).await;
    let (mut client, attempts) = client(&server.url, 5);
    let outcome = create(&mut client, order("book", 0), &unique("qty-0")).await;
    let GrpcOutcome::Refused { status } = outcome else {
        panic!("expected Refused, got {outcome:?}")
    };
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(attempts.attempts(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_lost_on_every_attempt_are_unknown() {
    let mut server = Server::start(&[]).await;
    let proxy = Proxy::h2(addr(&server.url)).await;
    proxy.script([Fault::DropResponse, Fault::ResetMidResponse]);
    let (mut client, attempts) = client(&format!("http://{}", proxy.addr), 2);
    let key = unique("unknown");
    let outcome = create(&mut client, order("book", 1), &key).await;
    let GrpcOutcome::Unknown { status } = outcome else {
        panic!("expected Unknown, got {outcome:?}")
    };
    let failed = CallFailed::find(&status).expect("the CallFailed");
    assert_eq!((failed.attempts, failed.sent), (2, true), "{failed}");
    assert_eq!(attempts.attempts(), 2);
    server.settle().await;
    assert_eq!(server.executions(&key), 1, "it ran: that is why it is unknown");
}
