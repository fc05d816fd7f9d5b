//! The tower layer over real HTTP: an axum server on 127.0.0.1 and a client that writes
//! HTTP/1.1 on a TCP socket (so a test can also hang up mid-request). Handlers that
//! must be caught in the act wait on a gate the test opens; nothing waits on time.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idemcache::layer::{IdempotencyLayer, LayerBody};
use idemcache::{Cache, Claim, Fingerprint, Key};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

mod bodies;
use bodies::late;

/// What every handler shares: how often it ran, and a gate it passes before answering.
#[derive(Clone)]
struct Handler {
    runs: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
}

impl Handler {
    fn open() -> Self {
        Handler { runs: Arc::default(), gate: Arc::new(Semaphore::new(Semaphore::MAX_PERMITS)) }
    }
    fn closed() -> Self {
        Handler { runs: Arc::default(), gate: Arc::new(Semaphore::new(0)) }
    }
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

/// Counts the run, passes the gate, and answers by the request: `x-answer: 500` for a
/// server error, `panic` to panic, `unknown` for a 504 whose effect may have happened
/// ([`OutcomeUnknown`](idemcache::layer::OutcomeUnknown)); otherwise 201 with the run
/// number and body length.
async fn handle(State(h): State<Handler>, headers: HeaderMap, body: Bytes) -> Response {
    let run = h.runs.fetch_add(1, Ordering::SeqCst) + 1;
    h.gate.acquire().await.unwrap().forget();
    match headers.get("x-answer").map(|v| v.to_str().unwrap()) {
        Some("500") => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        Some("panic") => panic!("the handler panicked, as asked"),
        Some("unknown") => {
            let mut timed_out = StatusCode::GATEWAY_TIMEOUT.into_response();
            timed_out.extensions_mut().insert(idemcache::layer::OutcomeUnknown);
            return timed_out;
        }
        _ => {}
    }
    Response::builder()
        .status(StatusCode::CREATED)
        .header("x-run", run.to_string())
        .header("set-cookie", "session=secret")
        .header("set-cookie", "theme=dark")
        .header("link", "</a>")
        .header("link", "</b>")
        .body(Body::from(format!("{{\"run\":{run},\"len\":{}}}", body.len())))
        .unwrap()
}

fn bearer(request: &axum::http::request::Parts) -> Option<String> {
    let auth = request.headers.get("authorization")?.to_str().ok()?;
    auth.strip_prefix("Bearer ").map(str::to_owned)
}

async fn serve(layer: IdempotencyLayer, handler: Handler) -> SocketAddr {
    serve_probed(layer, handler, Arc::default()).await
}

/// Serves with a probe outside the layer counting request futures the server dropped
/// before they finished (what it does when a client hangs up).
async fn serve_probed(
    layer: IdempotencyLayer,
    handler: Handler,
    dropped: Arc<AtomicUsize>,
) -> SocketAddr {
    let router = Router::new()
        .route("/orders", post(handle))
        .route_layer(layer)
        .with_state(handler)
        .layer(tower::layer::layer_fn(move |inner| Probe { inner, dropped: dropped.clone() }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

#[derive(Clone)]
struct Probe<S> {
    inner: S,
    dropped: Arc<AtomicUsize>,
}

impl<S: tower::Service<R>, R> tower::Service<R> for Probe<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = Probed<S::Future>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        Probed {
            future: Box::pin(self.inner.call(request)),
            done: false,
            dropped: self.dropped.clone(),
        }
    }
}

struct Probed<F> {
    future: std::pin::Pin<Box<F>>,
    done: bool,
    dropped: Arc<AtomicUsize>,
}

impl<F: std::future::Future> std::future::Future for Probed<F> {
    type Output = F::Output;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let out = self.future.as_mut().poll(cx);
        self.done = out.is_ready();
        out
    }
}

impl<F> Drop for Probed<F> {
    fn drop(&mut self) {
        if !self.done {
            self.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn layer(cache: &Cache) -> IdempotencyLayer {
    IdempotencyLayer::new(cache.clone()).tenant(bearer).max_request_body(1024)
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }
    fn code(&self) -> &str {
        let at = self.body.find("\"code\":\"").expect("a problem body") + 8;
        &self.body[at..at + self.body[at..].find('"').unwrap()]
    }
}

/// A request as a user's client sends it.
struct Req<'a> {
    key: Option<&'a str>,
    user: Option<&'a str>,
    body: &'a str,
    extra: Vec<(&'a str, &'a str)>,
}

fn req<'a>(key: &'a str, body: &'a str) -> Req<'a> {
    Req { key: Some(key), user: Some("alice"), body, extra: vec![] }
}

impl Req<'_> {
    fn bytes(&self) -> Vec<u8> {
        let mut head = String::from("POST /orders HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
        head.push_str("Content-Type: application/json\r\n");
        if let Some(k) = self.key {
            head.push_str(&format!("Idempotency-Key: {k}\r\n"));
        }
        if let Some(u) = self.user {
            head.push_str(&format!("Authorization: Bearer {u}\r\n"));
        }
        for (n, v) in &self.extra {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        if !self.extra.iter().any(|(n, _)| n.eq_ignore_ascii_case("transfer-encoding")) {
            head.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        head.push_str("\r\n");
        head.push_str(self.body);
        head.into_bytes()
    }

    async fn send(&self, addr: SocketAddr) -> Reply {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(&self.bytes()).await.unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.unwrap();
        parse(&raw)
    }
}

fn parse(raw: &[u8]) -> Reply {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole response");
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| l.split_once(": ").unwrap())
        .map(|(n, v)| (n.to_ascii_lowercase(), v.to_owned()))
        .collect();
    let chunked = headers.iter().any(|(n, v)| n == "transfer-encoding" && v == "chunked");
    let body = if chunked { unchunk(body) } else { body.to_owned() };
    Reply { status, headers, body }
}

fn unchunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").unwrap();
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        s = &rest[size + 2..];
    }
}

/// Waits (yielding, bounded) until `done` holds: for a state another task reaches.
async fn until(mut done: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the condition never held");
}

#[tokio::test]
async fn a_repeat_replays_status_headers_and_body_exactly() {
    let cache = Cache::builder().build().unwrap();
    let handler = Handler::open();
    let addr = serve(layer(&cache), handler.clone()).await;

    let first = req("k1", "{\"qty\":1}").send(addr).await;
    assert_eq!(first.status, 201);
    assert_eq!(
        first.all("set-cookie"),
        ["session=secret", "theme=dark"],
        "the first answer is untouched"
    );
    assert_eq!(first.header("idempotent-replayed"), None);

    // The draft's sf-string form names the same key as the bare form.
    let again = req("\"k1\"", "{\"qty\":1}").send(addr).await;
    assert_eq!(handler.runs(), 1);
    assert_eq!(again.status, 201);
    assert_eq!(again.body, first.body);
    assert_eq!(again.header("x-run"), Some("1"));
    assert_eq!(again.all("link"), ["</a>", "</b>"], "repeated fields stay repeated, in order");
    assert_eq!(again.all("set-cookie"), Vec::<&str>::new(), "cookies are not replayed");
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    let expires = httpdate::parse_http_date(again.header("idempotency-expires").unwrap()).unwrap();
    let ttl = expires.duration_since(std::time::SystemTime::now()).unwrap();
    assert!(
        ttl > Duration::from_secs(23 * 3600) && ttl <= Duration::from_secs(24 * 3600),
        "{ttl:?}"
    );
    assert!(again.header("date").is_some(), "the server dates the replay afresh");
}

#[tokio::test]
async fn set_cookie_is_replayed_when_allowed() {
    let cache = Cache::builder().build().unwrap();
    let addr = serve(layer(&cache).replay_set_cookie(true), Handler::open()).await;
    req("k", "{}").send(addr).await;
    let again = req("k", "{}").send(addr).await;
    assert_eq!(again.all("set-cookie"), ["session=secret", "theme=dark"]);
}

#[tokio::test]
async fn fifty_concurrent_duplicates_execute_once_and_share_one_body_when_waiting() {
    let cache = Cache::builder().build().unwrap();
    let handler = Handler::closed();
    let addr = serve(layer(&cache).wait(Duration::from_secs(60)), handler.clone()).await;
    let clients: Vec<_> = (0..50)
        .map(|_| tokio::spawn(async move { req("same", "{\"qty\":2}").send(addr).await }))
        .collect();
    // One executes (held at the gate), forty-nine wait on the cache.
    until(|| handler.runs() == 1 && cache.stats().waiting == 49).await;
    handler.gate.add_permits(1);
    let mut replies = Vec::new();
    for c in clients {
        replies.push(c.await.unwrap());
    }
    assert_eq!(handler.runs(), 1);
    assert!(replies.iter().all(|r| r.status == 201 && r.body == replies[0].body));
    assert_eq!(replies.iter().filter(|r| r.header("idempotent-replayed").is_some()).count(), 49);
}

#[tokio::test]
async fn without_waiting_duplicates_get_409_with_retry_after() {
    let cache = Cache::builder().lease(Duration::from_secs(30)).build().unwrap();
    let handler = Handler::closed();
    let addr = serve(layer(&cache), handler.clone()).await;
    let first = tokio::spawn(async move { req("k", "{}").send(addr).await });
    until(|| handler.runs() == 1).await;
    let clients: Vec<_> =
        (0..20).map(|_| tokio::spawn(async move { req("k", "{}").send(addr).await })).collect();
    for c in clients {
        let r = c.await.unwrap();
        assert_eq!((r.status, r.code()), (409, "request_in_progress"));
        let after: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=30).contains(&after), "{after}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
    }
    handler.gate.add_permits(1);
    assert_eq!(first.await.unwrap().status, 201);
    assert_eq!(handler.runs(), 1);
}

#[tokio::test]
async fn refusals_name_their_rule_and_never_run_the_handler() {
    let cache = Cache::builder().build().unwrap();
    let handler = Handler::open();
    let addr = serve(layer(&cache), handler.clone()).await;

    let missing = Req { key: None, ..req("", "{}") }.send(addr).await;
    assert_eq!((missing.status, missing.code()), (400, "missing_idempotency_key"));
    let spaced = req("\"a b\"", "{}").send(addr).await;
    assert_eq!((spaced.status, spaced.code()), (400, "invalid_idempotency_key"));
    assert!(spaced.body.contains("visible ASCII"), "{}", spaced.body);
    let long = "k".repeat(300);
    let too_long = req(&long, "{}").send(addr).await;
    assert_eq!((too_long.status, too_long.code()), (400, "invalid_idempotency_key"));
    let anonymous = Req { user: None, ..req("k", "{}") }.send(addr).await;
    assert_eq!((anonymous.status, anonymous.code()), (401, "unauthenticated"));
    // RFC 8941 wants a parameter's key after every `;`.
    for malformed in ["\"k1\";", "\"k1\";@@@", "\"k1\";;;", "\"k1\"; =x"] {
        let reply = req(malformed, "{}").send(addr).await;
        assert_eq!((reply.status, reply.code()), (400, "invalid_idempotency_key"), "{malformed}");
        assert!(reply.body.contains("parameters"), "{}", reply.body);
    }
    assert_eq!(handler.runs(), 0);
    assert_eq!(cache.stats().entries, 0, "nothing was claimed");
}

#[tokio::test]
async fn bodies_over_the_limit_get_413_by_length_or_as_read_and_the_handler_gets_whole_bodies() {
    let cache = Cache::builder().build().unwrap();
    let handler = Handler::open();
    let addr = serve(layer(&cache), handler.clone()).await;

    let big = "x".repeat(1025);
    let declared = req("a", &big).send(addr).await;
    assert_eq!((declared.status, declared.code()), (413, "request_body_too_large"));
    // Chunked: no Content-Length to check first, so the limit bites while reading.
    let chunked_body = format!("401\r\n{big}\r\n0\r\n\r\n", big = &big[..1025]);
    let chunked = Req { extra: vec![("Transfer-Encoding", "chunked")], ..req("b", &chunked_body) };
    let streamed = chunked.send(addr).await;
    assert_eq!((streamed.status, streamed.code()), (413, "request_body_too_large"));
    for refused in [&declared, &streamed] {
        assert!(refused.body.contains("exceeds 1024 bytes"), "{}", refused.body);
    }
    assert_eq!(handler.runs(), 0);

    let fits = "y".repeat(1024);
    let ok = req("c", &fits).send(addr).await;
    assert_eq!(ok.status, 201);
    assert!(ok.body.contains("\"len\":1024"), "{}", ok.body);
}

#[tokio::test]
async fn the_same_key_with_another_body_is_a_422() {
    let cache = Cache::builder().build().unwrap();
    let handler = Handler::open();
    let addr = serve(layer(&cache), handler.clone()).await;
    assert_eq!(req("k", "{\"qty\":1}").send(addr).await.status, 201);
    let other = req("k", "{\"qty\":9}").send(addr).await;
    assert_eq!((other.status, other.code()), (422, "idempotency_key_reused"));
    let other_type = Req { extra: vec![("Content-Type", "text/plain")], ..req("k", "{\"qty\":1}") };
    // Two Content-Type fields differ from one: still a mismatch, not a replay.
    assert_eq!(other_type.send(addr).await.status, 422);
    assert_eq!(handler.runs(), 1);
}

#[tokio::test]
async fn a_full_cache_answers_503_and_never_runs_unguarded() {
    let cache = Cache::builder().shards(1).max_entries(64).build().unwrap();
    let handler = Handler::open();
    let addr = serve(layer(&cache), handler.clone()).await;
    let held: Vec<_> = (0..64)
        .map(|i| {
            let k = Key::new("elsewhere", "x", format!("k{i}")).unwrap();
            match cache.claim(&k, Fingerprint::of(b"")).unwrap() {
                Claim::Acquired(guard) => guard,
                other => panic!("{other:?}"),
            }
        })
        .collect();
    let full = req("k", "{}").send(addr).await;
    assert_eq!((full.status, full.code()), (503, "idempotency_cache_full"));
    assert_eq!(full.header("retry-after"), Some("1"));
    assert_eq!(handler.runs(), 0);
    drop(held);
    assert_eq!(req("k", "{}").send(addr).await.status, 201);
}

#[tokio::test]
async fn a_5xx_or_a_panic_releases_the_key_so_a_retry_runs_again() {
    let cache = Cache::builder().build().unwrap();
    let handler = Handler::open();
    let addr = serve(layer(&cache), handler.clone()).await;

    let failed = Req { extra: vec![("x-answer", "500")], ..req("k", "{}") };
    assert_eq!(failed.send(addr).await.status, 500);
    let panicked = Req { extra: vec![("x-answer", "panic")], ..req("k", "{}") };
    let answer = panicked.send(addr).await;
    assert_eq!((answer.status, answer.code()), (500, "internal_error"));
    // x-answer is not a fingerprinted header: the retry is the same request.
    let retried = req("k", "{}").send(addr).await;
    assert_eq!(retried.status, 201);
    assert_eq!(handler.runs(), 3, "each attempt ran: nothing was stored before the 201");
    let replay = req("k", "{}").send(addr).await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(handler.runs(), 3);
}

/// A handler that cannot tell whether its effect happened marks its key UNKNOWN: its
/// answer goes to the client, no retry runs the handler again, and a reconciler's
/// verdict, the record `layer::stored_response` makes, is what retries replay.
#[tokio::test]
async fn an_outcome_the_handler_cannot_know_is_unknown_until_reconciled() {
    use idemcache::layer::stored_response;
    use idemcache::Verdict;
    let cache = Cache::builder().build().unwrap();
    let handler = Handler::open();
    let addr = serve(layer(&cache), handler.clone()).await;

    let unknown = Req { extra: vec![("x-answer", "unknown")], ..req("charge", "{}") };
    assert_eq!(unknown.send(addr).await.status, 504, "the handler's own answer");
    let retried = req("charge", "{}").send(addr).await;
    assert_eq!((retried.status, retried.code()), (409, "outcome_unknown"));
    assert_eq!(handler.runs(), 1, "never run again before the authority is checked");

    let mut headers = HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    let charged = stored_response(StatusCode::CREATED, &headers, b"{\"charged\":true}");
    let done = cache.reconcile(10, |_| Verdict::Happened(Some(charged.clone())));
    assert_eq!(done.resolved, 1, "{done:?}");
    let replay = req("charge", "{}").send(addr).await;
    assert_eq!((replay.status, replay.body.as_str()), (201, "{\"charged\":true}"));
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.header("content-type"), Some("application/json"));
    assert_eq!(handler.runs(), 1);
}

#[tokio::test]
async fn equal_keys_of_two_tenants_never_meet() {
    let cache = Cache::builder().build().unwrap();
    let handler = Handler::open();
    let addr = serve(layer(&cache), handler.clone()).await;
    let alice = req("shared", "{}").send(addr).await;
    let bob = Req { user: Some("bob"), ..req("shared", "{}") }.send(addr).await;
    assert_eq!((alice.status, bob.status), (201, 201));
    assert_eq!(handler.runs(), 2);
    assert_ne!(alice.body, bob.body);
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_request_neither_wedges_the_key_nor_loses_the_completion() {
    let cache = Cache::builder().build().unwrap();
    let handler = Handler::closed();
    let dropped = Arc::new(AtomicUsize::new(0));
    let addr = serve_probed(layer(&cache), handler.clone(), dropped.clone()).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    // Keep-alive, as browsers and pools send: the server keeps reading the connection
    // while the handler runs, sees the hang-up, and drops the request's future.
    let keep_alive = String::from_utf8(req("k", "{\"qty\":3}").bytes()).unwrap();
    let keep_alive = keep_alive.replace("Connection: close\r\n", "");
    stream.write_all(keep_alive.as_bytes()).await.unwrap();
    until(|| handler.runs() == 1).await;
    drop(stream); // the client is gone while the handler executes
    until(|| dropped.load(Ordering::SeqCst) == 1).await; // and the server gave up on it
    handler.gate.add_permits(1);
    // The handler finishes in its own task and its response is stored.
    until(|| cache.stats().completions == 1).await;
    let retry = req("k", "{\"qty\":3}").send(addr).await;
    assert_eq!(retry.status, 201);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(handler.runs(), 1);
}

#[tokio::test]
async fn a_response_too_large_to_keep_is_passed_through_and_never_executed_again() {
    let cache = Cache::builder().max_result_size(64).build().unwrap();
    let handler = Handler::open();
    let addr = serve(layer(&cache), handler.clone()).await;
    // The stored form (status, headers, body) exceeds 64 bytes.
    let first = req("k", "{}").send(addr).await;
    assert_eq!(first.status, 201);
    assert!(first.body.starts_with("{\"run\":1"));
    let again = req("k", "{}").send(addr).await;
    assert_eq!((again.status, again.code()), (409, "response_not_kept"));
    assert_eq!(handler.runs(), 1);
    assert_eq!(cache.stats().oversized, 1);
}

#[tokio::test]
async fn unguarded_methods_and_keyless_requests_pass_through_when_allowed() {
    let cache = Cache::builder().build().unwrap();
    let handler = Handler::open();
    let addr = serve(layer(&cache).require_key(false), handler.clone()).await;
    for _ in 0..2 {
        let r = Req { key: None, ..req("", "{}") }.send(addr).await;
        assert_eq!(r.status, 201);
    }
    assert_eq!(handler.runs(), 2);
    assert_eq!(cache.stats().entries, 0);
}

/// The layer's own service errors (here a service that fails) release the key.
#[tokio::test]
async fn a_handler_error_releases_the_key() {
    use tower::{Layer, Service, ServiceExt};
    let cache = Cache::builder().build().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let inner = tower::service_fn(move |_: axum::http::Request<LayerBody<Body>>| {
        let run = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            if run == 0 {
                Err::<Response<Body>, &str>("database down")
            } else {
                Ok(Response::new(Body::from("ok")))
            }
        }
    });
    let mut service = IdempotencyLayer::new(cache.clone()).layer(inner);
    let request = || {
        axum::http::Request::post("/x")
            .header("idempotency-key", "k")
            .body(Body::from("b"))
            .unwrap()
    };
    let err = service.ready().await.unwrap().call(request()).await.unwrap_err();
    assert_eq!(err, "database down");
    let ok = service.ready().await.unwrap().call(request()).await.unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_empty_tenant_is_unauthenticated_and_a_long_path_is_not_blamed_on_the_key() {
    let cache = Cache::builder().build().unwrap();
    let handler = Handler::open();
    let addr = serve(layer(&cache), handler.clone()).await;
    let mut bytes = String::from_utf8(req("k", "{}").bytes()).unwrap();
    bytes = bytes.replace("Authorization: Bearer alice", "Authorization: Bearer ");
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let reply = parse(&raw);
    assert_eq!((reply.status, reply.code()), (401, "unauthenticated"));

    // The default scope is method + path: a very long path overflows it, not the key.
    let long = IdempotencyLayer::new(cache.clone());
    let service = {
        use tower::Layer;
        long.layer(tower::service_fn(|_: axum::http::Request<LayerBody<Body>>| async {
            Ok::<_, Infallible>(Response::new(Body::from("ran")))
        }))
    };
    let path = format!("/{}", "p".repeat(1100));
    let request =
        axum::http::Request::post(path).header("idempotency-key", "k").body(Body::empty()).unwrap();
    let response = tower::ServiceExt::oneshot(service, request).await.unwrap();
    assert_eq!(response.status(), 414);
    assert_eq!(handler.runs(), 0);
}

/// A body that sends its data, then trailers (as gRPC does with its status).
struct WithTrailers {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl http_body::Body for WithTrailers {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        let frame = match self.data.take() {
            Some(data) => Some(http_body::Frame::data(data)),
            None => self.trailers.take().map(http_body::Frame::trailers),
        };
        std::task::Poll::Ready(frame.map(Ok))
    }
}

#[tokio::test]
async fn trailers_reach_the_client_first_and_on_every_replay() {
    use http_body_util::BodyExt;
    use tower::{Layer, ServiceExt};
    let cache = Cache::builder().build().unwrap();
    let inner = tower::service_fn(|_: axum::http::Request<LayerBody<Body>>| async {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        trailers.insert("set-cookie", "session=secret".parse().unwrap());
        let body =
            WithTrailers { data: Some(Bytes::from_static(b"reply")), trailers: Some(trailers) };
        Ok::<_, Infallible>(Response::new(body))
    });
    let service = IdempotencyLayer::new(cache).layer(inner);
    for attempt in 0..2 {
        let request = axum::http::Request::post("/rpc")
            .header("idempotency-key", "k")
            .body(Body::from("q"))
            .unwrap();
        let response = service.clone().oneshot(request).await.unwrap();
        assert_eq!(response.headers().contains_key("idempotent-replayed"), attempt == 1);
        let collected = response.into_body().collect().await.unwrap();
        let trailers = collected.trailers().unwrap();
        assert_eq!(trailers["grpc-status"], "0", "attempt {attempt}");
        // The first client gets its cookie; nobody retrying with the key does.
        assert_eq!(trailers.contains_key("set-cookie"), attempt == 0, "attempt {attempt}");
        assert_eq!(collected.to_bytes(), "reply");
    }
}

/// The cache's clock follows tokio's, so paused tokio time moves both.
#[derive(Debug)]
struct TokioClock(tokio::time::Instant);

impl idemcache::Clock for TokioClock {
    fn now(&self) -> idemcache::Timestamp {
        idemcache::Timestamp::from_nanos(self.0.elapsed().as_nanos() as u64)
    }
}

/// A request to a slow handler, started and running: the layer over a cache on tokio's
/// clock with leases of `lease`, the handler (`POST /slow`) having counted its run and
/// now waiting for a permit of the gate.
struct Slow {
    cache: Cache,
    gate: Arc<Semaphore>,
    runs: Arc<AtomicUsize>,
    first: tokio::task::JoinHandle<Result<Response<idemcache::layer::LayerBody<Body>>, Infallible>>,
    /// The key and fingerprint a duplicate of the request has.
    duplicate: (Key, Fingerprint),
}

/// A handler that counts its run, works for `work` of tokio's time, then waits for a
/// permit of its gate (`permits` to start with) and answers 200 `slow`.
#[allow(clippy::type_complexity)]
fn gated_handler(
    work: Duration,
    permits: usize,
) -> (
    impl tower::Service<
            axum::http::Request<LayerBody<Body>>,
            Response = Response<Body>,
            Error = Infallible,
            Future = impl Send,
        > + Clone
        + Send
        + 'static,
    Arc<Semaphore>,
    Arc<AtomicUsize>,
) {
    let gate = Arc::new(Semaphore::new(permits));
    let runs = Arc::new(AtomicUsize::new(0));
    let (g, r) = (gate.clone(), runs.clone());
    let inner = tower::service_fn(move |_: axum::http::Request<LayerBody<Body>>| {
        let (gate, runs) = (g.clone(), r.clone());
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(work).await;
            gate.acquire().await.unwrap().forget();
            Ok::<_, Infallible>(Response::new(Body::from("slow")))
        }
    });
    (inner, gate, runs)
}

async fn slow(lease: Duration) -> Slow {
    use tower::{Layer, ServiceExt};
    let cache = Cache::builder()
        .clock(TokioClock(tokio::time::Instant::now()))
        .lease(lease)
        .build()
        .unwrap();
    let (inner, gate, runs) = gated_handler(Duration::ZERO, 0);
    let service = IdempotencyLayer::new(cache.clone()).layer(inner);
    let request =
        axum::http::Request::post("/slow").header("idempotency-key", "k").body(Body::empty());
    let first = tokio::spawn(service.oneshot(request.unwrap()));
    until(|| runs.load(Ordering::SeqCst) == 1).await;
    let duplicate = (
        Key::without_tenant("POST /slow", "k").unwrap(),
        Fingerprint::builder().method("POST").path("/slow").body(b"").finish(),
    );
    Slow { cache, gate, runs, first, duplicate }
}

/// A handler slower than its lease keeps the key: the layer renews the lease while the
/// handler runs, so no duplicate takes it over and runs it a second time.
#[tokio::test(start_paused = true)]
async fn a_handler_slower_than_its_lease_is_never_taken_over() {
    let lease = Duration::from_secs(10);
    let Slow { cache, gate, runs, first, duplicate: (k, same) } = slow(lease).await;
    tokio::time::sleep(lease * 5).await; // five leases, in paused (virtual) time
    match cache.claim(&k, same) {
        Ok(Claim::InProgress { .. }) => {}
        other => panic!("expected the first run still in progress, got {other:?}"),
    }
    gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap().status(), 200);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A lease the cache says is lost (the key removed while the handler runs) is not asked
/// for again at every later beat: one failed renewal, then none.
#[tokio::test(start_paused = true)]
async fn a_lost_lease_is_not_renewed_again() {
    let lease = Duration::from_secs(10);
    let Slow { cache, gate, first, duplicate: (k, _), .. } = slow(lease).await;
    assert!(cache.remove(&k).is_some());
    tokio::time::sleep(lease * 5).await; // fifteen beats, in paused (virtual) time
    assert_eq!(cache.stats().leases_lost, 1, "renewed again after the lease was lost");
    gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap().status(), 200);
}

/// The layer over a durable store (`IdempotencyLayer::tiered`): two instances with
/// separate caches and connections, as two processes would run, over one SQLite file.
mod over_a_store {
    use super::*;
    use idemcache::store::{Store, Tiered};
    use idemcache_sqlite::SqliteStore;

    async fn tiered(path: &std::path::Path) -> Tiered<SqliteStore> {
        Tiered::new(Cache::builder().build().unwrap(), SqliteStore::open_path(path).await.unwrap())
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("idemcache-layer-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("records.db")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn duplicates_across_two_instances_execute_once_and_all_get_the_one_response() {
        let path = scratch("two");
        let (one, two) = (tiered(&path).await, tiered(&path).await);
        one.store().ensure_schema().await.unwrap();
        let handler = Handler::closed();
        let wait = Duration::from_secs(30);
        let a =
            serve(IdempotencyLayer::tiered(one).tenant(bearer).wait(wait), handler.clone()).await;
        let b =
            serve(IdempotencyLayer::tiered(two).tenant(bearer).wait(wait), handler.clone()).await;
        let mut replies = Vec::new();
        for i in 0..20 {
            let addr = if i % 2 == 0 { a } else { b };
            replies.push(tokio::spawn(async move { req("shared", "{}").send(addr).await }));
        }
        until(|| handler.runs() == 1).await;
        handler.gate.add_permits(100);
        let replies: Vec<Reply> =
            futures_join(replies).await.into_iter().map(Result::unwrap).collect();
        assert_eq!(handler.runs(), 1, "one execution across both instances");
        assert!(replies.iter().all(|r| r.status == 201), "{replies:?}");
        assert!(replies.iter().all(|r| r.body == replies[0].body));
        let replayed = replies.iter().filter(|r| r.header("idempotent-replayed").is_some()).count();
        assert_eq!(replayed, 19, "every duplicate is a replay");
        // A third instance (a restart: a fresh cache) replays from the store.
        let c =
            serve(IdempotencyLayer::tiered(tiered(&path).await).tenant(bearer), handler.clone())
                .await;
        let again = req("shared", "{}").send(c).await;
        assert_eq!((again.status, again.body.as_str()), (201, replies[0].body.as_str()));
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        assert!(again.header("idempotency-expires").is_some());
        // The same key for another request is refused by the store, not executed.
        assert_eq!(req("shared", "{\"other\":1}").send(c).await.status, 422);
        assert_eq!(handler.runs(), 1);
    }

    #[tokio::test]
    async fn an_unavailable_store_answers_503_and_never_runs_the_handler() {
        // A store without its schema fails every claim with a backend error.
        let broken = Tiered::new(
            Cache::builder().build().unwrap(),
            SqliteStore::connect("sqlite::memory:").await.unwrap(),
        );
        let handler = Handler::open();
        let addr = serve(IdempotencyLayer::tiered(broken).tenant(bearer), handler.clone()).await;
        let reply = req("k", "{}").send(addr).await;
        assert_eq!(reply.status, 503);
        assert_eq!(reply.code(), "idempotency_store_unavailable");
        assert!(reply.header("retry-after").is_some());
        assert_eq!(handler.runs(), 0);
    }

    #[tokio::test]
    async fn a_5xx_over_a_store_releases_the_key_there_too() {
        let path = scratch("release");
        let one = tiered(&path).await;
        one.store().ensure_schema().await.unwrap();
        let handler = Handler::open();
        let addr = serve(IdempotencyLayer::tiered(one).tenant(bearer), handler.clone()).await;
        let mut failing = req("k5", "{}");
        failing.extra.push(("x-answer", "500"));
        assert_eq!(failing.send(addr).await.status, 500);
        // Another instance runs the retry: the store let the key go.
        let other =
            serve(IdempotencyLayer::tiered(tiered(&path).await).tenant(bearer), handler.clone())
                .await;
        assert_eq!(req("k5", "{}").send(other).await.status, 201);
        assert_eq!(handler.runs(), 2);
    }

    async fn futures_join<T>(
        handles: Vec<tokio::task::JoinHandle<T>>,
    ) -> Vec<Result<T, tokio::task::JoinError>> {
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await);
        }
        out
    }
}

/// The layer as a plain tower service, with no server around it: what only a service
/// can be asked.
mod as_a_service {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use tower::{Layer, Service, ServiceExt};

    /// A service that is never ready, and says why.
    #[derive(Clone, Debug)]
    struct Busy;

    impl Service<axum::http::Request<LayerBody<Body>>> for Busy {
        type Response = Response;
        type Error = &'static str;
        type Future = std::future::Ready<Result<Response, &'static str>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), &'static str>> {
            Poll::Ready(Err("busy"))
        }

        fn call(&mut self, _: axum::http::Request<LayerBody<Body>>) -> Self::Future {
            unreachable!("never ready, never called")
        }
    }

    /// A request body whose stream breaks after its first chunk.
    pub(super) struct Broken(pub(super) bool);

    impl http_body::Body for Broken {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
            if std::mem::replace(&mut self.0, true) {
                Poll::Ready(Some(Err(std::io::Error::other("connection reset"))))
            } else {
                Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(b"{\"qty\":")))))
            }
        }
    }

    fn request(body: Body) -> axum::http::Request<Body> {
        axum::http::Request::post("/orders")
            .header("idempotency-key", "k")
            .header("authorization", "Bearer alice")
            .body(body)
            .unwrap()
    }

    #[tokio::test]
    async fn the_inner_service_readiness_and_errors_are_passed_on() {
        let cache = Cache::builder().build().unwrap();
        let mut service = layer(&cache).layer(Busy);
        assert_eq!(service.ready().await.err(), Some("busy"));
        let shown = format!("{service:?}");
        assert!(shown.starts_with("Idempotency { inner: Busy, settings: "), "{shown}");
    }

    #[tokio::test]
    async fn a_body_that_breaks_while_read_is_a_400_and_the_handler_never_runs() {
        let cache = Cache::builder().build().unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let handler = tower::service_fn(move |_: axum::http::Request<LayerBody<Body>>| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(StatusCode::CREATED.into_response()) }
        });
        let response =
            layer(&cache).layer(handler).oneshot(request(Body::new(Broken(false)))).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        use http_body_util::BodyExt;
        let body = response.into_body().collect().await.ok().unwrap().to_bytes();
        let body = String::from_utf8(body.to_vec()).unwrap();
        assert!(body.contains("\"code\":\"request_body_unreadable\""), "{body}");
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        assert_eq!(cache.stats().entries, 0, "nothing claimed for a request never read");
    }
}

/// The execution is the handler and its body: a body arriving four leases after the
/// handler answered keeps the key (its lease renewed until the response is stored), so
/// a duplicate waits and replays instead of taking the key over and running it again,
/// and a request with no duplicate stores its response for the retry.
#[tokio::test(start_paused = true)]
async fn a_body_streaming_past_its_lease_is_never_taken_over_and_run_twice() {
    use http_body_util::BodyExt;
    use tower::{Layer, ServiceExt};
    let lease = Duration::from_millis(300);
    let cache = Cache::builder()
        .clock(TokioClock(tokio::time::Instant::now()))
        .lease(lease)
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let inner = tower::service_fn(move |_: axum::http::Request<LayerBody<Body>>| {
        counted.fetch_add(1, Ordering::SeqCst);
        let body = late(lease * 4, "made");
        async move { Ok::<_, Infallible>(Response::builder().status(201).body(body).unwrap()) }
    });
    let service = IdempotencyLayer::new(cache).wait(Duration::from_secs(10)).layer(inner);
    let request = |key: &str| {
        axum::http::Request::post("/slow").header("idempotency-key", key).body(Body::empty())
    };
    let first = tokio::spawn(service.clone().oneshot(request("k").unwrap()));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = service.clone().oneshot(request("k").unwrap()).await.unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the duplicate took the key over and ran it");
    assert_eq!((first.status(), second.status()), (StatusCode::CREATED, StatusCode::CREATED));
    assert_eq!(second.headers()["idempotent-replayed"], "true");
    assert_eq!(second.into_body().collect().await.unwrap().to_bytes(), "made");
    assert_eq!(first.into_body().collect().await.unwrap().to_bytes(), "made");

    // No duplicate in flight: the completion is stored, and the retry replays it.
    let alone = service.clone().oneshot(request("alone").unwrap()).await.unwrap();
    assert_eq!(alone.status(), StatusCode::CREATED);
    let retry = service.clone().oneshot(request("alone").unwrap()).await.unwrap();
    assert_eq!(
        retry.headers().get("idempotent-replayed").map(|v| v.to_str().unwrap()),
        Some("true")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A 409's `Retry-After` is when the result should be ready, from the scope's recent
/// execution times (here 1.5 s: 2 s, rounded up), not the holder's whole lease (60 s).
#[tokio::test(start_paused = true)]
async fn retry_after_is_the_scopes_recent_execution_time_not_the_lease() {
    use tower::{Layer, ServiceExt};
    let cache = Cache::builder().clock(TokioClock(tokio::time::Instant::now())).build().unwrap();
    let (inner, gate, runs) = gated_handler(Duration::from_millis(1500), 1);
    let service = IdempotencyLayer::new(cache).layer(inner);
    let request = |key: &str| {
        axum::http::Request::post("/work").header("idempotency-key", key).body(Body::empty())
    };
    let done = service.clone().oneshot(request("a").unwrap()).await.unwrap();
    assert_eq!(done.status(), StatusCode::OK);
    let running = tokio::spawn(service.clone().oneshot(request("b").unwrap()));
    until(|| runs.load(Ordering::SeqCst) == 2).await;
    let busy = service.clone().oneshot(request("b").unwrap()).await.unwrap();
    assert_eq!(busy.status(), StatusCode::CONFLICT);
    assert_eq!(busy.headers()["retry-after"], "2");
    gate.add_permits(1);
    assert_eq!(running.await.unwrap().unwrap().status(), StatusCode::OK);
}

/// A plain hyper service, no axum: the request body is hyper's `Incoming` (not
/// buildable from bytes), which the layer reads for the fingerprint and hands on whole
/// as a `LayerBody`; repeats replay.
#[tokio::test]
async fn a_plain_hyper_service_over_incoming_bodies_is_guarded() {
    use http_body_util::{BodyExt, Full};
    use tower::Layer;
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let inner =
        tower::service_fn(move |request: axum::http::Request<LayerBody<hyper::body::Incoming>>| {
            let run = counted.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                let body = request.into_body().collect().await.unwrap().to_bytes();
                let answer = format!("{{\"run\":{run},\"len\":{}}}", body.len());
                let response = Response::builder().status(201).body(Full::new(Bytes::from(answer)));
                Ok::<_, Infallible>(response.unwrap())
            }
        });
    let service = layer(&Cache::builder().build().unwrap()).layer(inner);
    let addr = serve_hyper(service).await;
    let first = req("k", "{\"qty\":2}").send(addr).await;
    assert_eq!((first.status, first.body.as_str()), (201, "{\"run\":1,\"len\":9}"));
    let again = req("k", "{\"qty\":2}").send(addr).await;
    assert_eq!((again.status, again.body.as_str()), (201, first.body.as_str()));
    // A buffered body without trailers has an exact length: sent with Content-Length.
    assert_eq!(first.header("content-length"), Some("17"), "{first:?}");
    assert_eq!(again.header("content-length"), Some("17"), "{again:?}");
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(req("k", "{\"qty\":3}").send(addr).await.status, 422);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Serves `service` with a plain hyper HTTP/1.1 server (no axum) on 127.0.0.1.
async fn serve_hyper<S, B>(service: S) -> SocketAddr
where
    S: tower::Service<
            axum::http::Request<hyper::body::Incoming>,
            Response = axum::http::Response<B>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let io = hyper_util::rt::TokioIo::new(stream);
            let hyper_service = hyper_util::service::TowerToHyperService::new(service.clone());
            let connection = hyper::server::conn::http1::Builder::new();
            tokio::spawn(connection.serve_connection(io, hyper_service));
        }
    });
    addr
}

/// Over HTTP/1.1 a trailer can only follow a chunked body the `Trailer` field
/// announced: the first answer and every replay are sent so (the body's length is not
/// announced as exact), with the trailers that are stored, and a field the response's
/// `Connection` names is hop-by-hop in a trailer too: never replayed.
#[tokio::test]
async fn trailers_reach_an_http1_client_first_and_on_replays_without_hop_by_hop_fields() {
    use tower::Layer;
    let inner =
        tower::service_fn(|_: axum::http::Request<LayerBody<hyper::body::Incoming>>| async {
            let mut trailers = HeaderMap::new();
            trailers.insert("x-checksum", "abc123".parse().unwrap());
            trailers.insert("x-hop", "secret".parse().unwrap());
            let body = WithTrailers {
                data: Some(Bytes::from_static(b"payload")),
                trailers: Some(trailers),
            };
            let response = Response::builder()
                .status(201)
                .header("trailer", "x-checksum, x-hop")
                .header("connection", "x-hop")
                .body(body);
            Ok::<_, Infallible>(response.unwrap())
        });
    let addr = serve_hyper(layer(&Cache::builder().build().unwrap()).layer(inner)).await;
    let sent = Req { extra: vec![("TE", "trailers")], ..req("k", "{}") };
    // The whole response as sent, chunks and trailer section included.
    let raw = || async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(&sent.bytes()).await.unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.unwrap();
        String::from_utf8(raw).unwrap()
    };
    let first = raw().await;
    assert!(first.contains("\r\ntransfer-encoding: chunked\r\n"), "{first}");
    assert!(!first.contains("content-length"), "{first}");
    // The first client gets every trailer its handler sent.
    assert!(first.contains("\r\n0\r\nx-checksum: abc123\r\nx-hop: secret\r\n"), "{first}");
    let replay = raw().await;
    assert!(replay.contains("\r\nidempotent-replayed: true\r\n"), "{replay}");
    assert!(replay.contains("\r\ntrailer: x-checksum\r\n"), "{replay}");
    assert!(replay.ends_with("\r\n0\r\nx-checksum: abc123\r\n\r\n"), "{replay}");
    assert!(!replay.contains("secret"), "a hop-by-hop trailer replayed: {replay}");
}

/// Without a key and with none required, a request is passed on unguarded before
/// anything else is asked of it: no tenant is needed (a public sign-up route).
#[tokio::test]
async fn a_keyless_request_passes_unguarded_without_a_tenant_when_no_key_is_required() {
    let cache = Cache::builder().build().unwrap();
    let handler = Handler::open();
    let addr = serve(layer(&cache).require_key(false), handler.clone()).await;
    let anonymous = Req { key: None, user: None, ..req("", "{}") }.send(addr).await;
    assert_eq!(anonymous.status, 201);
    assert_eq!(handler.runs(), 1);
    // A key still needs a tenant.
    let keyed = Req { user: None, ..req("k", "{}") }.send(addr).await;
    assert_eq!((keyed.status, keyed.code()), (401, "unauthenticated"));
    assert_eq!(cache.stats().entries, 0);
}

/// A response that is not kept (a 5xx) releases its key whatever its body does: a body
/// failing mid-way does not make it UNKNOWN for a day, and the retry runs.
#[tokio::test]
async fn a_5xx_whose_body_fails_releases_the_key() {
    use tower::{Layer, ServiceExt};
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let inner = tower::service_fn(move |_: axum::http::Request<LayerBody<Body>>| {
        let run = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            let body = match run {
                0 => Body::new(as_a_service::Broken(false)),
                _ => Body::from("ok"),
            };
            Ok::<_, Infallible>(Response::builder().status(503).body(body).unwrap())
        }
    });
    let service = IdempotencyLayer::new(Cache::builder().build().unwrap()).layer(inner);
    let request = || {
        axum::http::Request::post("/x").header("idempotency-key", "k").body(Body::empty()).unwrap()
    };
    assert_eq!(service.clone().oneshot(request()).await.unwrap().status(), 500);
    assert_eq!(service.clone().oneshot(request()).await.unwrap().status(), 503, "not 409");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A response body whose frames are each ready at once but take a moment of work (a
/// body rendered on the fly): no timer ever fires while it is read, yet its lease is
/// renewed. Three leases in, the body itself asks the cache for its own key as a
/// duplicate would, and finds it in progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_whose_frames_are_always_ready_keeps_its_lease() {
    use tower::{Layer, ServiceExt};
    struct Rendered {
        frames: u32,
        cache: Cache,
        seen: Arc<std::sync::Mutex<Option<String>>>,
    }
    impl http_body::Body for Rendered {
        type Data = Bytes;
        type Error = Infallible;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
            if self.frames == 0 {
                return std::task::Poll::Ready(None);
            }
            self.frames -= 1;
            let spin = std::time::Instant::now() + Duration::from_millis(2);
            while std::time::Instant::now() < spin {} // the work of one frame
            if self.frames == 200 {
                // 600 frames of 2 ms in: three leases of 400 ms have passed.
                let key = Key::without_tenant("POST /csv", "k").unwrap();
                let fp = Fingerprint::builder().method("POST").path("/csv").body(b"").finish();
                let seen = match self.cache.claim(&key, fp) {
                    Ok(Claim::InProgress { .. }) => "in progress".to_owned(),
                    other => format!("{other:?}"),
                };
                *self.seen.lock().unwrap() = Some(seen);
            }
            std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(b"row\n")))))
        }
    }
    let cache = Cache::builder().lease(Duration::from_millis(400)).build().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(None));
    let (c, s) = (cache.clone(), seen.clone());
    let inner = tower::service_fn(move |_: axum::http::Request<LayerBody<Body>>| {
        let body = Rendered { frames: 800, cache: c.clone(), seen: s.clone() };
        async move { Ok::<_, Infallible>(Response::builder().status(201).body(body).unwrap()) }
    });
    let service = IdempotencyLayer::new(cache.clone()).layer(inner);
    let request =
        axum::http::Request::post("/csv").header("idempotency-key", "k").body(Body::empty());
    let answer = service.oneshot(request.unwrap()).await.unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    assert_eq!(seen.lock().unwrap().as_deref(), Some("in progress"), "taken over mid-body");
    assert!(cache.stats().leases_lost == 0);
}

/// One reported decision: what it was, the key's parts, the correlation id, and whether
/// it executed (has an execution time).
type Reported = (String, String, Option<String>, String, Option<String>, bool);

/// A layer over `cache` that reports every decision into the list it returns.
fn reporting(cache: &Cache) -> (IdempotencyLayer, Arc<std::sync::Mutex<Vec<Reported>>>) {
    let seen: Arc<std::sync::Mutex<Vec<Reported>>> = Arc::default();
    let into = seen.clone();
    let layer = layer(cache).on_decision(move |event| {
        let key = event.key;
        into.lock().unwrap().push((
            event.decision.to_string(),
            key.scope().to_owned(),
            key.tenant().map(str::to_owned),
            key.client_key().to_owned(),
            event.correlation_id.map(|id| id.as_str().to_owned()),
            event.execution_time.is_some(),
        ));
    });
    (layer, seen)
}

/// Every guarded request that reaches its claim is reported once, with its final
/// decision, its key's parts and the trace id of its `traceparent`; requests refused
/// before their claim are not.
#[tokio::test]
async fn every_claimed_request_reports_one_decision_with_its_key_and_trace_id() {
    let cache = Cache::builder().shards(1).max_entries(64).build().unwrap();
    let (layer, seen) = reporting(&cache);
    let handler = Handler::closed();
    let addr = serve(layer.wait(Duration::from_secs(30)), handler.clone()).await;
    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traced = |key| Req { extra: vec![("traceparent", trace)], ..req(key, "{}") };

    // acquired, then replayed after waiting for it, then replayed.
    let first = tokio::spawn(async move { traced("k1").send(addr).await });
    until(|| handler.runs() == 1).await;
    let waiting = tokio::spawn(async move { req("k1", "{}").send(addr).await });
    until(|| cache.stats().waiting == 1).await;
    handler.gate.add_permits(Semaphore::MAX_PERMITS / 2);
    assert_eq!(first.await.unwrap().status, 201);
    assert_eq!(waiting.await.unwrap().header("idempotent-replayed"), Some("true"));
    assert_eq!(req("k1", "{}").send(addr).await.header("idempotent-replayed"), Some("true"));
    // mismatch; released (a 5xx); unknown, marked and then refused.
    assert_eq!(req("k1", "{\"other\":1}").send(addr).await.status, 422);
    assert_eq!(
        Req { extra: vec![("x-answer", "500")], ..req("k2", "{}") }.send(addr).await.status,
        500
    );
    assert_eq!(
        Req { extra: vec![("x-answer", "unknown")], ..req("k3", "{}") }.send(addr).await.status,
        504
    );
    assert_eq!(req("k3", "{}").send(addr).await.status, 409);
    // capacity refused: every slot held elsewhere.
    let held: Vec<_> = (0..64)
        .filter_map(|i| {
            let k = Key::new("elsewhere", "x", format!("h{i}")).unwrap();
            match cache.claim(&k, Fingerprint::of(b"")) {
                Ok(Claim::Acquired(guard)) => Some(guard),
                _ => None,
            }
        })
        .collect();
    assert_eq!(req("k4", "{}").send(addr).await.status, 503);
    drop(held);
    // Refused before the claim: no key, a malformed one, no credentials. Not reported.
    assert_eq!(Req { key: None, ..req("", "{}") }.send(addr).await.status, 400);
    assert_eq!(req("bad key", "{}").send(addr).await.status, 400);
    assert_eq!(Req { user: None, ..req("k5", "{}") }.send(addr).await.status, 401);

    let seen = seen.lock().unwrap().clone();
    // The first two are reported by two tasks at once (the waiter wakes as the owner
    // records): in either order.
    let mut decisions: Vec<(&str, &str, bool)> =
        seen.iter().map(|(d, _, _, k, _, ran)| (d.as_str(), k.as_str(), *ran)).collect();
    decisions.sort();
    let mut expected = vec![
        ("acquired", "k1", true),
        ("replayed_after_wait", "k1", false),
        ("replayed", "k1", false),
        ("mismatch", "k1", false),
        ("released", "k2", true),
        ("marked_unknown", "k3", true),
        ("unknown", "k3", false),
        ("capacity_refused", "k4", false),
    ];
    expected.sort();
    assert_eq!(decisions, expected, "{seen:?}");
    let acquired = seen.iter().find(|(d, ..)| d == "acquired").unwrap();
    assert_eq!(
        acquired,
        &(
            "acquired".to_owned(),
            "POST /orders".to_owned(),
            Some("alice".to_owned()),
            "k1".to_owned(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736".to_owned()),
            true,
        )
    );
    assert!(seen.iter().filter(|(d, ..)| d != "acquired").all(|r| r.4.is_none()));
}

/// A correlation id comes from wherever the application says; one that is not a valid
/// id (too long, not visible ASCII) is none, and the request is served all the same.
#[tokio::test]
async fn the_correlation_id_comes_from_a_configured_header_and_a_bad_one_is_none() {
    let cache = Cache::builder().build().unwrap();
    let (layer, seen) = reporting(&cache);
    let layer = layer.correlation_id(|request| {
        idemcache::CorrelationId::new(request.headers.get("x-request-id")?.as_bytes()).ok()
    });
    let addr = serve(layer, Handler::open()).await;
    let with = |key, id| Req { extra: vec![("x-request-id", id)], ..req(key, "{}") };
    assert_eq!(with("a", "req-7").send(addr).await.status, 201);
    let long = "x".repeat(idemcache::MAX_CORRELATION_ID_LEN + 1);
    assert_eq!(with("b", &long).send(addr).await.status, 201);
    let ids: Vec<_> = seen.lock().unwrap().iter().map(|r| r.4.clone()).collect();
    assert_eq!(ids, [Some("req-7".to_owned()), None]);
}

/// A hook that panics is the hook's problem: the request is answered as if it returned.
#[tokio::test]
async fn a_panicking_hook_changes_no_answer() {
    let cache = Cache::builder().build().unwrap();
    let layer = layer(&cache).on_decision(|_| panic!("the hook panicked, as asked"));
    let handler = Handler::open();
    let addr = serve(layer, handler.clone()).await;
    assert_eq!(req("k", "{}").send(addr).await.status, 201);
    assert_eq!(req("k", "{}").send(addr).await.header("idempotent-replayed"), Some("true"));
    assert_eq!(handler.runs(), 1);
}

/// Over a durable store, the request's correlation id (its `traceparent`'s trace id) is
/// kept with the key's record, where an operator finds it.
#[tokio::test]
async fn over_a_store_the_record_keeps_the_requests_trace_id() {
    use idemcache::store::{Store, Tiered};
    let store = idemcache_sqlite::SqliteStore::from_connection(
        idemcache_sqlite::rusqlite::Connection::open_in_memory().unwrap(),
    );
    store.ensure_schema().await.unwrap();
    let tiered = Tiered::new(Cache::builder().build().unwrap(), store.clone());
    let addr = serve(IdempotencyLayer::tiered(tiered).tenant(bearer), Handler::open()).await;
    let trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let traced = Req { extra: vec![("traceparent", trace)], ..req("k1", "{}") };
    assert_eq!(traced.send(addr).await.status, 201);
    let key = Key::new("POST /orders", "alice", "k1").unwrap();
    let record = store.record(&key).await.unwrap().expect("the key's record");
    let id = record.correlation_id.expect("its correlation id");
    assert_eq!(id.as_str(), "0af7651916cd43dd8448eb211c80319c");
}

/// A duplicate that waits ([`IdempotencyLayer::wait`]) for the first execution reached
/// its claim: the docs promise it is reported once. Over the cache, its client hanging up
/// mid-wait drops the claim's future: it is reported `in_progress`, the answer it had at
/// that instant (over a store, the claim runs detached and reports what it finds).
#[tokio::test]
async fn a_waiting_duplicate_whose_client_hangs_up_is_still_reported_once() {
    let cache = Cache::builder().build().unwrap();
    let (layer, seen) = reporting(&cache);
    let handler = Handler::closed();
    let dropped = Arc::new(AtomicUsize::new(0));
    let layer = layer.wait(Duration::from_secs(30));
    let addr = serve_probed(layer, handler.clone(), dropped.clone()).await;
    let first = tokio::spawn(async move { req("k", "{}").send(addr).await });
    until(|| handler.runs() == 1).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let keep_alive = String::from_utf8(req("k", "{}").bytes()).unwrap();
    let keep_alive = keep_alive.replace("Connection: close\r\n", "");
    stream.write_all(keep_alive.as_bytes()).await.unwrap();
    until(|| cache.stats().waiting == 1).await;
    drop(stream); // the duplicate's client is gone while it waits
    until(|| dropped.load(Ordering::SeqCst) == 1).await;
    handler.gate.add_permits(1);
    assert_eq!(first.await.unwrap().status, 201);
    until(|| seen.lock().unwrap().len() >= 2).await;
    let mut decisions: Vec<String> = seen.lock().unwrap().iter().map(|r| r.0.clone()).collect();
    decisions.sort();
    assert_eq!(decisions, ["acquired", "in_progress"]);
}

/// `store_when` is the application's code, as a handler is: one that panics gets the
/// handler's treatment (a 500, the key settled by the drop policy so a retry runs), and
/// the request is reported once. (Its panic unwound past the reporting: the request
/// got a 500 and no decision.)
#[tokio::test]
async fn a_panicking_store_when_is_settled_and_reported_as_a_panicking_handler() {
    let cache = Cache::builder().build().unwrap();
    let (layer, seen) = reporting(&cache);
    let layer = layer.store_when(|status| {
        assert!(status != StatusCode::CREATED, "store_when panicked, as asked");
        true
    });
    let handler = Handler::open();
    let addr = serve(layer, handler.clone()).await;
    assert_eq!(req("k", "{}").send(addr).await.status, 500);
    let decisions: Vec<String> = seen.lock().unwrap().iter().map(|r| r.0.clone()).collect();
    assert_eq!(decisions, ["released"], "one decision for the request");
    // Released: the retry runs again (and panics again).
    assert_eq!(req("k", "{}").send(addr).await.status, 500);
    assert_eq!(handler.runs(), 2);
}

/// A handler is told when its execution took the key over from an earlier one whose
/// lease lapsed (`Claimed::took_over`), and not when the key was absent: the earlier
/// execution may have had its effects.
#[tokio::test]
async fn a_handler_is_told_its_execution_took_a_lapsed_key_over() {
    use idemcache::layer::Claimed;
    use idemcache::ManualClock;
    use tower::{Layer, ServiceExt};
    let clock = ManualClock::new();
    let lease = Duration::from_secs(10);
    let cache = Cache::builder().clock(clock.clone()).lease(lease).build().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::<Claimed>::new()));
    let told = seen.clone();
    let inner = tower::service_fn(move |request: axum::http::Request<LayerBody<Body>>| {
        told.lock().unwrap().push(request.extensions().get::<Claimed>().unwrap().clone());
        async { Ok::<_, Infallible>(StatusCode::CREATED.into_response()) }
    });
    let service = IdempotencyLayer::new(cache.clone()).layer(inner);
    let request = |key: &str| {
        axum::http::Request::post("/orders").header("idempotency-key", key).body(Body::empty())
    };
    let fresh = service.clone().oneshot(request("k1").unwrap()).await.unwrap();
    assert_eq!(fresh.status(), StatusCode::CREATED);
    let first = seen.lock().unwrap()[0].clone();
    assert!(!first.took_over(), "an absent key is no takeover");
    // Another process's execution of k2 (the same request) that stopped renewing.
    let k2 = match first.key().tenant() {
        Some(tenant) => Key::new(first.key().scope(), tenant, "k2").unwrap(),
        None => Key::without_tenant(first.key().scope(), "k2").unwrap(),
    };
    let Claim::Acquired(stalled) = cache.claim(&k2, first.fingerprint()).unwrap() else {
        panic!("the stalled execution acquires")
    };
    clock.advance(lease);
    let taken = service.clone().oneshot(request("k2").unwrap()).await.unwrap();
    assert_eq!(taken.status(), StatusCode::CREATED);
    assert!(seen.lock().unwrap()[1].took_over(), "the handler is told of the takeover");
    assert!(stalled.complete(Bytes::from_static(b"late")).is_err(), "the stalled one is fenced");
}
