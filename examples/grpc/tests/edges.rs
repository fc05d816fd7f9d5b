//! The layer's gRPC mode at its edges, through a real tonic client and server: answers
//! a handler shapes unusually (a status in both the headers and the trailers, an HTTP
//! status other than 200, a failure's status in the trailers), a call with another HTTP
//! method, kept failures replayed with their metadata, and the refusals as a tonic
//! client decodes them.

mod common;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use common::{order, refusal, replayed, Order, OrdersClient, CREATE};
use http::{HeaderMap, HeaderValue};
use idemcache::layer::{Grpc, GrpcCode, IdempotencyLayer};
use idemcache::Cache;
use prost::Message;
use tonic::server::NamedService;
use tonic::transport::Server;
use tonic::Code;

/// A gRPC answer's body: its data frames, then its trailers (if any).
struct Frames {
    data: Vec<Bytes>,
    trailers: Option<HeaderMap>,
}

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        if !self.data.is_empty() {
            let data = self.data.remove(0);
            return Poll::Ready(Some(Ok(http_body::Frame::data(data))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(http_body::Frame::trailers(t))))
    }
}

/// The `status` of an answer that is a panic instead.
const PANIC: u16 = 0;

/// One answer of the scripted handler.
#[derive(Clone, Debug)]
struct Answer {
    status: u16,
    headers: Vec<(&'static str, Vec<u8>)>,
    data: Vec<Bytes>,
    trailers: Option<Vec<(&'static str, Vec<u8>)>>,
}

impl Answer {
    /// A well-formed `OK`: an `Order` message, then `grpc-status: 0` in the trailers.
    fn ok(id: &str) -> Answer {
        let message = Order { id: id.to_owned(), item: "book".into(), qty: 1 }.encode_to_vec();
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(&message);
        Answer {
            status: 200,
            headers: vec![("content-type", b"application/grpc".to_vec())],
            data: vec![Bytes::from(framed)],
            trailers: Some(vec![("grpc-status", b"0".to_vec())]),
        }
    }

    /// A trailers-only answer: the status (and these fields) in the headers, no body.
    fn trailers_only(status: &str, more: &[(&'static str, &[u8])]) -> Answer {
        let mut headers = vec![
            ("content-type", b"application/grpc".to_vec()),
            ("grpc-status", status.as_bytes().to_vec()),
        ];
        headers.extend(more.iter().map(|(n, v)| (*n, v.to_vec())));
        Answer { status: 200, headers, data: Vec::new(), trailers: None }
    }
}

fn header_map(fields: &[(&'static str, Vec<u8>)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in fields {
        map.append(*name, HeaderValue::from_bytes(value).unwrap());
    }
    map
}

/// A handler at `CREATE` answering its script in turn (the last answer once the script
/// runs out), counting its runs; `hold`, if set, is awaited by the first run before it
/// answers.
#[derive(Clone)]
struct Scripted {
    answers: Arc<Mutex<Vec<Answer>>>,
    runs: Arc<AtomicUsize>,
    hold: Option<Arc<tokio::sync::Semaphore>>,
}

impl Scripted {
    fn new(answers: Vec<Answer>) -> Scripted {
        Scripted { answers: Arc::new(Mutex::new(answers)), runs: Arc::default(), hold: None }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

impl NamedService for Scripted {
    const NAME: &'static str = "orders.v1.Orders";
}

impl tower::Service<http::Request<tonic::body::Body>> for Scripted {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
        let run = self.runs.fetch_add(1, Ordering::SeqCst);
        let answer = {
            let mut answers = self.answers.lock().unwrap();
            if answers.len() > 1 {
                answers.remove(0)
            } else {
                answers[0].clone()
            }
        };
        let hold = self.hold.clone().filter(|_| run == 0);
        Box::pin(async move {
            if let Some(hold) = hold {
                let _ = hold.acquire().await.expect("the test releases the handler");
            }
            assert!(answer.status != PANIC, "the handler panics, as scripted");
            let body =
                Frames { data: answer.data, trailers: answer.trailers.map(|t| header_map(&t)) };
            let mut response = http::Response::new(tonic::body::Body::new(body));
            *response.status_mut() = http::StatusCode::from_u16(answer.status).unwrap();
            *response.headers_mut() = header_map(&answer.headers);
            Ok(response)
        })
    }
}

/// A tonic server with `layer` in front of `handler`, and a client of it.
async fn serve(layer: IdempotencyLayer, handler: Scripted) -> OrdersClient {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(Server::builder().layer(layer).add_service(handler).serve_with_incoming(incoming));
    OrdersClient::connect(url).await.expect("connect to the test server")
}

fn grpc_layer() -> IdempotencyLayer {
    IdempotencyLayer::new(Cache::builder().build().unwrap()).grpc(Grpc::new())
}

/// The gRPC spec, and tonic's client, read a status in the headers as a trailers-only
/// answer's and look no further: here the client gets `UNAVAILABLE`. The layer reads
/// the trailers first, finds `OK`, keeps the answer, and replays `UNAVAILABLE` to every
/// retry: the one thing `Grpc` exists to prevent.
#[tokio::test(flavor = "multi_thread")]
async fn a_status_in_the_headers_decides_as_the_client_reads_it() {
    let mut conflicting = Answer::trailers_only("14", &[("grpc-message", b"busy")]);
    conflicting.trailers = Some(vec![("grpc-status", b"0".to_vec())]);
    let handler = Scripted::new(vec![conflicting, Answer::ok("o-1")]);
    let mut client = serve(grpc_layer(), handler.clone()).await;
    let first = client.create(order("book", 1), Some("k1"), None).await;
    assert_eq!(first.unwrap_err().code(), Code::Unavailable, "what the client reads");
    let retry = client.create(order("book", 1), Some("k1"), None).await;
    assert_eq!(handler.runs(), 2, "UNAVAILABLE releases the key: the retry runs again");
    assert_eq!(retry.expect("the retry succeeds").into_inner().id, "o-1");
}

/// docs/grpc.md: an answer with "no `grpc-status` at all" releases the key. An HTTP 429
/// from something between the layer and the handler (a rate limiter) has none, and a
/// tonic client reads it as `UNAVAILABLE` (the gRPC HTTP-to-status mapping); the layer
/// keeps it (by `IdempotencyLayer::store_when`, which keeps 4xx) and replays
/// `UNAVAILABLE` to every retry.
#[tokio::test(flavor = "multi_thread")]
async fn an_http_429_without_a_grpc_status_releases_the_key() {
    let limited = Answer { status: 429, headers: Vec::new(), data: Vec::new(), trailers: None };
    let handler = Scripted::new(vec![limited, Answer::ok("o-1")]);
    let mut client = serve(grpc_layer(), handler.clone()).await;
    let first = client.create(order("book", 1), Some("k1"), None).await;
    assert_eq!(first.unwrap_err().code(), Code::Unavailable, "what the client reads");
    let retry = client.create(order("book", 1), Some("k1"), None).await;
    assert_eq!(handler.runs(), 2, "no grpc-status: released, the retry runs again");
    assert_eq!(retry.expect("the retry succeeds").into_inner().id, "o-1");
}

/// The same with HTTP 503: a 5xx is released (the control for the 429 above).
#[tokio::test(flavor = "multi_thread")]
async fn an_http_503_without_a_grpc_status_releases_the_key() {
    let down = Answer { status: 503, headers: Vec::new(), data: Vec::new(), trailers: None };
    let handler = Scripted::new(vec![down, Answer::ok("o-1")]);
    let mut client = serve(grpc_layer(), handler.clone()).await;
    let first = client.create(order("book", 1), Some("k1"), None).await;
    assert_eq!(first.unwrap_err().code(), Code::Unavailable);
    let retry = client.create(order("book", 1), Some("k1"), None).await;
    assert_eq!(handler.runs(), 2);
    assert_eq!(retry.expect("the retry succeeds").into_inner().id, "o-1");
}

/// docs/grpc.md: "A replay carries the `idempotent-replayed: true` metadata: ... in the
/// `Status`'s metadata for a kept failure", also when the failure's status came in the
/// trailers (the handler sent its headers first) and the marker in the headers.
#[tokio::test(flavor = "multi_thread")]
async fn a_kept_failure_in_the_trailers_is_marked_as_a_replay() {
    let not_found = Answer {
        status: 200,
        headers: vec![("content-type", b"application/grpc".to_vec())],
        data: Vec::new(),
        trailers: Some(vec![
            ("grpc-status", b"5".to_vec()),
            ("grpc-message", b"no such shelf".to_vec()),
        ]),
    };
    let handler = Scripted::new(vec![not_found]);
    let mut client = serve(grpc_layer(), handler.clone()).await;
    let first = client.create(order("book", 1), Some("k1"), None).await.unwrap_err();
    assert_eq!(first.code(), Code::NotFound);
    let second = client.create(order("book", 1), Some("k1"), None).await.unwrap_err();
    assert_eq!(handler.runs(), 1, "NOT_FOUND is kept");
    assert_eq!((second.code(), second.message()), (Code::NotFound, "no such shelf"));
    assert!(replayed(second.metadata()), "the replay says so: {second:?}");
}

/// A kept `INVALID_ARGUMENT` is replayed with all its metadata as the client read it the
/// first time: `grpc-message` (percent-encoded), `grpc-status-details-bin`, a custom
/// field twice, and a binary one.
#[tokio::test(flavor = "multi_thread")]
async fn a_kept_failure_is_replayed_with_all_its_metadata() {
    let failure = Answer::trailers_only(
        "3",
        &[
            ("grpc-message", b"qty %C3%A9 must be %25 positive"),
            ("grpc-status-details-bin", b"AAEC/w"),
            ("x-tag", b"one"),
            ("x-tag", b"two"),
            ("x-detail-bin", b"3q2+7w"),
        ],
    );
    let handler = Scripted::new(vec![failure]);
    let mut client = serve(grpc_layer(), handler.clone()).await;
    let first = client.create(order("book", 1), Some("k1"), None).await.unwrap_err();
    let second = client.create(order("book", 1), Some("k1"), None).await.unwrap_err();
    assert_eq!(handler.runs(), 1);
    assert!(replayed(second.metadata()) && !replayed(first.metadata()));
    for status in [&first, &second] {
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "qty \u{e9} must be % positive");
        assert_eq!(status.details(), &[0u8, 1, 2, 255][..]);
        let tags: Vec<_> = status.metadata().get_all("x-tag").iter().collect();
        assert_eq!(tags, ["one", "two"]);
        let detail = status.metadata().get_bin("x-detail-bin").unwrap().to_bytes().unwrap();
        assert_eq!(detail, Bytes::from_static(&[0xde, 0xad, 0xbe, 0xef]));
    }
}

/// A message over the layer's request limit (1 MiB by default) is refused
/// `RESOURCE_EXHAUSTED` `request_body_too_large`, as a tonic client reads it, unexecuted.
#[tokio::test(flavor = "multi_thread")]
async fn an_oversized_message_is_resource_exhausted() {
    let handler = Scripted::new(vec![Answer::ok("o-1")]);
    let mut client = serve(grpc_layer(), handler.clone()).await;
    let big = "x".repeat(2 << 20);
    let refused = client.create(order(&big, 1), Some("k1"), None).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(refusal(&refused), Some("request_body_too_large"));
    assert_eq!(handler.runs(), 0);
}

/// The refusals a tonic client meets most, decoded as the table says: a malformed key,
/// and no key on a path that only prefixes an unguarded one (guarded: listed paths
/// match whole).
#[tokio::test(flavor = "multi_thread")]
async fn refusals_decode_as_the_table_says() {
    let handler = Scripted::new(vec![Answer::ok("o-1")]);
    let layer = IdempotencyLayer::new(Cache::builder().build().unwrap())
        .grpc(Grpc::new().unguarded(["/orders.v1.Orders/CreateMany"]));
    let mut client = serve(layer, handler.clone()).await;
    let malformed = client.create(order("book", 1), Some("\"open"), None).await.unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument, "{malformed:?}");
    assert_eq!(refusal(&malformed), Some("invalid_idempotency_key"));
    let missing = client.create(order("book", 1), None, None).await.unwrap_err();
    assert_eq!(refusal(&missing), Some("missing_idempotency_key"));
    assert_eq!(handler.runs(), 0);
}

/// A call whose client gives up (its deadline passes) while the handler runs: the
/// execution finishes anyway and is kept, and the retry, waiting, gets its replay.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_abandoned_by_its_client_finishes_and_is_replayed() {
    let hold = Arc::new(tokio::sync::Semaphore::new(0));
    let mut handler = Scripted::new(vec![Answer::ok("o-1"), Answer::ok("o-2")]);
    handler.hold = Some(hold.clone());
    let layer = grpc_layer().wait(Duration::from_secs(30));
    let client = serve(layer, handler.clone()).await;
    let mut impatient = client.clone();
    let mut request = tonic::Request::new(order("book", 1));
    request.set_timeout(Duration::from_millis(50));
    request.metadata_mut().insert("idempotency-key", "k1".parse().unwrap());
    let given_up = impatient.create_request(request).await.unwrap_err();
    assert!(matches!(given_up.code(), Code::DeadlineExceeded | Code::Cancelled), "{given_up:?}");
    hold.add_permits(1);
    let mut retrying = client.clone();
    let retry = retrying.create(order("book", 1), Some("k1"), None).await.expect("the replay");
    assert!(replayed(retry.metadata()));
    assert_eq!(retry.into_inner().id, "o-1");
    assert_eq!(handler.runs(), 1);
}

/// Without `.grpc(..)`, nothing changes: a refusal is HTTP problem+json, not a status.
#[tokio::test(flavor = "multi_thread")]
async fn over_http_a_refusal_is_still_problem_json() {
    use tower::{Layer, Service, ServiceExt};
    let handler = Scripted::new(vec![Answer::ok("o-1")]);
    let routes = tonic::service::Routes::new(handler);
    let mut service = IdempotencyLayer::new(Cache::builder().build().unwrap()).layer(routes);
    let request = http::Request::post(CREATE)
        .header("content-type", "application/grpc")
        .body(tonic::body::Body::empty())
        .unwrap();
    let ready = ServiceExt::<http::Request<tonic::body::Body>>::ready(&mut service);
    let answer = ready.await.unwrap().call(request).await.unwrap();
    assert_eq!(answer.status(), 400);
    assert_eq!(answer.headers()["content-type"], "application/problem+json");
    assert!(answer.headers().get("grpc-status").is_none());
}

/// A handler that panics is answered `INTERNAL` `internal_error`, a valid gRPC answer,
/// and its key released (the default drop policy): the retry runs again.
#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_handler_is_internal_and_releases_the_key() {
    let panics = Answer { status: PANIC, headers: Vec::new(), data: Vec::new(), trailers: None };
    let handler = Scripted::new(vec![panics, Answer::ok("o-1")]);
    let mut client = serve(grpc_layer(), handler.clone()).await;
    let first = client.create(order("book", 1), Some("k1"), None).await.unwrap_err();
    assert_eq!(first.code(), Code::Internal, "{first:?}");
    assert_eq!(refusal(&first), Some("internal_error"));
    let retry = client.create(order("book", 1), Some("k1"), None).await;
    assert_eq!(retry.expect("the retry runs").into_inner().id, "o-1");
    assert_eq!(handler.runs(), 2);
}

/// A duplicate while the first call runs is `ABORTED` `request_in_progress` with a
/// `grpc-retry-pushback-ms`, as a tonic client reads it.
#[tokio::test(flavor = "multi_thread")]
async fn a_duplicate_in_progress_is_aborted_with_a_pushback() {
    let hold = Arc::new(tokio::sync::Semaphore::new(0));
    let mut handler = Scripted::new(vec![Answer::ok("o-1")]);
    handler.hold = Some(hold.clone());
    let client = serve(grpc_layer(), handler.clone()).await;
    let mut first = client.clone();
    let first = tokio::spawn(async move { first.create(order("book", 1), Some("k1"), None).await });
    let mut second = client.clone();
    let aborted = loop {
        // Until the first call holds the key (it runs, held, once `runs` is 1).
        if handler.runs() == 1 {
            break second.create(order("book", 1), Some("k1"), None).await.unwrap_err();
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(aborted.code(), Code::Aborted, "{aborted:?}");
    assert_eq!(refusal(&aborted), Some("request_in_progress"));
    let pushback = aborted.metadata().get("grpc-retry-pushback-ms").expect("a pushback");
    assert!(pushback.to_str().unwrap().parse::<u64>().unwrap() >= 1000);
    hold.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap().into_inner().id, "o-1");
}

/// A `key_from` that panics "fails the request and holds nothing": the call fails, and
/// the next call on the same connection, with the same key, runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_key_from_fails_the_call_only() {
    let handler = Scripted::new(vec![Answer::ok("o-1")]);
    let layer = grpc_layer().key_from(|parts, body| {
        assert!(!body.ends_with(b"boom"), "key_from panics, as scripted");
        idemcache::layer::client_key(&parts.headers)
            .map(|k| k.map(|k| k.into_bytes()))
            .map_err(|e| e.to_string())
    });
    let mut client = serve(layer, handler.clone()).await;
    let failed = client.create(order("boom", 0), Some("k1"), None).await.unwrap_err();
    assert_ne!(failed.code(), Code::Ok);
    let next = client.create(order("book", 1), Some("k1"), None).await;
    assert_eq!(next.expect("the next call runs").into_inner().id, "o-1");
    assert_eq!(handler.runs(), 1);
}

/// `key_from`'s reason for a malformed key, with characters `grpc-message` must
/// percent-encode, reaches the client as it was written.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_from_reason_reaches_the_client_intact() {
    let handler = Scripted::new(vec![Answer::ok("o-1")]);
    let layer = grpc_layer().key_from(|_, _| Err("bad key: 100% \u{e9}\nline".into()));
    let mut client = serve(layer, handler.clone()).await;
    let refused = client.create(order("book", 1), Some("k1"), None).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(refusal(&refused), Some("invalid_idempotency_key"));
    assert_eq!(refused.message(), "bad key: 100% \u{e9}\nline");
    assert_eq!(handler.runs(), 0);
}

/// A call as tonic's transport would send it, but with `method` as its HTTP method:
/// `Create`'s path, the `idempotency-key` metadata, an `Order`-shaped message framed.
async fn raw_call(
    url: &str,
    method: http::Method,
    key: Option<&str>,
) -> http::Response<tonic::body::Body> {
    use tower::{Service, ServiceExt};
    let mut channel =
        tonic::transport::Channel::from_shared(url.to_owned()).unwrap().connect().await.unwrap();
    let message = order("book", 1).encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("{url}{CREATE}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let request = request.body(tonic::body::Body::new(http_body_full(framed))).unwrap();
    channel.ready().await.unwrap().call(request).await.unwrap()
}

fn http_body_full(data: Vec<u8>) -> Frames {
    Frames { data: vec![Bytes::from(data)], trailers: None }
}

/// `rpc Create` through tonic's own unary plumbing (as a generated server runs it),
/// counting its executions.
#[derive(Clone, Default)]
struct Tonic {
    runs: Arc<AtomicUsize>,
}

impl NamedService for Tonic {
    const NAME: &'static str = "orders.v1.Orders";
}

impl tonic::server::UnaryService<common::CreateOrder> for Tonic {
    type Response = Order;
    type Future =
        Pin<Box<dyn Future<Output = Result<tonic::Response<Order>, tonic::Status>> + Send>>;

    fn call(&mut self, request: tonic::Request<common::CreateOrder>) -> Self::Future {
        let n = self.runs.fetch_add(1, Ordering::SeqCst);
        let order = request.into_inner();
        Box::pin(async move {
            Ok(tonic::Response::new(Order {
                id: format!("o-{n}"),
                item: order.item,
                qty: order.qty,
            }))
        })
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Tonic {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let call = self.clone();
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<Order, common::CreateOrder>::default();
            Ok(tonic::server::Grpc::new(codec).unary(call, request).await)
        })
    }
}

/// docs/grpc.md: "Every method not listed is guarded as a unary one." A gRPC method is
/// its path, and tonic's router and its unary plumbing serve a call whatever its HTTP
/// method; the layer guards only POST and PATCH (`IdempotencyLayer::methods`, whose
/// HTTP default `.grpc(..)` keeps), so the same call sent with `PUT` passes through
/// unguarded: no key asked, and a repeat with the same key executes again.
#[tokio::test(flavor = "multi_thread")]
async fn a_guarded_method_is_guarded_whatever_the_http_method() {
    let handler = Tonic::default();
    let runs = || handler.runs.load(Ordering::SeqCst);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let server = Server::builder().layer(grpc_layer()).add_service(handler.clone());
    tokio::spawn(server.serve_with_incoming(incoming));
    // POST, as every gRPC client sends: guarded.
    let posted = raw_call(&url, http::Method::POST, None).await;
    assert_eq!(posted.headers()["idempotency-refusal"], "missing_idempotency_key");
    assert_eq!(runs(), 0);
    // PUT: tonic serves it (the layer aside, it would answer OK).
    let no_key = raw_call(&url, http::Method::PUT, None).await;
    assert_eq!(runs(), 0, "no key: refused, not run (got {:?})", no_key.headers());
    raw_call(&url, http::Method::PUT, Some("k1")).await;
    raw_call(&url, http::Method::PUT, Some("k1")).await;
    assert_eq!(runs(), 1, "the same key: executed once");
}

/// A kept answer too large for the cache is answered once, and its retry refused
/// `FAILED_PRECONDITION` `response_not_kept`, never run again.
#[tokio::test(flavor = "multi_thread")]
async fn an_answer_too_large_to_keep_is_never_run_twice() {
    let handler = Scripted::new(vec![Answer::ok(&"x".repeat(4096)), Answer::ok("o-2")]);
    let cache = Cache::builder().max_result_size(1024).build().unwrap();
    let mut client = serve(IdempotencyLayer::new(cache).grpc(Grpc::new()), handler.clone()).await;
    let first = client.create(order("book", 1), Some("k1"), None).await.expect("answered");
    assert_eq!(first.into_inner().id.len(), 4096);
    let retry = client.create(order("book", 1), Some("k1"), None).await.unwrap_err();
    assert_eq!(retry.code(), Code::FailedPrecondition, "{retry:?}");
    assert_eq!(refusal(&retry), Some("response_not_kept"));
    assert_eq!(handler.runs(), 1);
}

/// A handler that checks the call's credentials itself: `authorization: Bearer fresh`
/// is `OK`, anything else `UNAUTHENTICATED` (an expired token), counting its runs.
#[derive(Clone, Default)]
struct Authenticating {
    runs: Arc<AtomicUsize>,
}

impl NamedService for Authenticating {
    const NAME: &'static str = "orders.v1.Orders";
}

impl tower::Service<http::Request<tonic::body::Body>> for Authenticating {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let fresh = request.headers().get("authorization").is_some_and(|v| v == "Bearer fresh");
        let answer = if fresh {
            Answer::ok("o-1")
        } else {
            Answer::trailers_only("16", &[("grpc-message", b"token expired")])
        };
        let mut scripted = Scripted::new(vec![answer]);
        Box::pin(async move { tower::Service::call(&mut scripted, request).await })
    }
}

/// The table keeps `UNAUTHENTICATED` because "the same call would fail the same way";
/// but the fingerprint does not cover the credentials, so the usual refresh-and-retry
/// (an auth interceptor re-sends the same call, same metadata, with a fresh token) would
/// be answered the kept `UNAUTHENTICATED` again. docs/grpc.md says to leave it out of
/// the kept set then: with that `store_when`, the retry with a valid token runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_retry_with_fresh_credentials_runs_when_unauthenticated_is_not_kept() {
    let handler = Authenticating::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let grpc = Grpc::new().store_when(|code| {
        code.is_deterministic()
            && !matches!(code, GrpcCode::Unauthenticated | GrpcCode::PermissionDenied)
    });
    let layer = IdempotencyLayer::new(Cache::builder().build().unwrap()).grpc(grpc);
    let server = Server::builder().layer(layer).add_service(handler.clone());
    tokio::spawn(server.serve_with_incoming(incoming));
    let mut client = OrdersClient::connect(url).await.unwrap();
    let expired = client.create(order("book", 1), Some("k1"), Some("expired")).await;
    assert_eq!(expired.unwrap_err().code(), Code::Unauthenticated);
    let refreshed = client.create(order("book", 1), Some("k1"), Some("fresh")).await;
    let refreshed = refreshed.expect("the retry with a valid token runs");
    assert_eq!(refreshed.into_inner().id, "o-1");
    assert_eq!(handler.runs.load(Ordering::SeqCst), 2);
}
