//! `IdempotentRetryLayer` over hyper's client (hyper-util's legacy `Client`, HTTP/1),
//! against the payments service behind the idempotency layer, through the fault proxy:
//! a lost or cut answer is retried with the call's one key and the charge runs once (the
//! answer replayed); a server never reached is a `CallFailed` that was never sent; a
//! reused key's 422 is handed back after one attempt; a `GET` passes untouched.
//!
//! Needs no service: the payments service and the proxy run in the test.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{nowhere, Fault, Payments, Proxy};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idemcache_client::{
    BoxError, CallFailed, CallKey, IdempotentRetryLayer, IdempotentRetryService, RetryBody,
    RetryPolicy,
};
use tower_layer::Layer;
use tower_service::Service;

type Hyper = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// hyper's client under the layer, retrying quickly; a new connection per request (so
/// each takes the proxy's next fault).
fn client(attempts: u32) -> IdempotentRetryService<Hyper> {
    let hyper = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build_http();
    let policy = RetryPolicy::default()
        .with_first_delay(Duration::from_millis(5))
        .unwrap()
        .with_attempts(attempts)
        .unwrap();
    IdempotentRetryLayer::new(policy).layer(hyper)
}

async fn post(
    client: &mut IdempotentRetryService<Hyper>,
    url: String,
    body: &'static str,
    key: Option<&CallKey>,
) -> Result<http::Response<RetryBody<hyper::body::Incoming>>, BoxError> {
    let mut request = http::Request::post(url).body(Full::new(Bytes::from(body))).unwrap();
    if let Some(key) = key {
        request.extensions_mut().insert(key.clone());
    }
    std::future::poll_fn(|cx| client.poll_ready(cx)).await?;
    client.call(request).await
}

async fn text(response: http::Response<RetryBody<hyper::body::Incoming>>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_or_cut_answer_is_retried_with_one_key_and_the_charge_runs_once() {
    let payments = Payments::default();
    let proxy = Proxy::to(payments.serve().await).await;
    let mut client = client(5);
    for (n, fault) in [Fault::DropResponse, Fault::ResetMidResponse].into_iter().enumerate() {
        proxy.script([fault]);
        let before = (payments.runs(), proxy.connections());
        let url = format!("http://{}/charges", proxy.addr);
        let response = post(&mut client, url, ["c0", "c1"][n], None).await.unwrap();
        assert_eq!(response.status(), 201, "{fault:?}");
        assert_eq!(response.headers()["idempotent-replayed"], "true", "{fault:?}");
        assert_eq!(text(response).await, format!("charge {}: c{n}", before.0 + 1));
        assert_eq!(payments.runs(), before.0 + 1, "{fault:?}: the handler ran once");
        assert_eq!(proxy.connections(), before.1 + 2, "{fault:?}: one retry");
    }
}

#[tokio::test]
async fn a_server_never_reached_is_never_sent_after_every_attempt() {
    let error =
        post(&mut client(3), format!("http://{}/charges", nowhere()), "x", None).await.unwrap_err();
    let failed = CallFailed::find(&*error).expect("a CallFailed");
    assert_eq!((failed.attempts, failed.sent), (3, false), "{failed}");
}

#[tokio::test]
async fn a_reused_key_is_answered_422_after_one_attempt() {
    let payments = Payments::default();
    let proxy = Proxy::to(payments.serve().await).await;
    let mut client = client(5);
    let url = format!("http://{}/charges", proxy.addr);
    let key = CallKey::new("order-8-charge").unwrap();
    let first = post(&mut client, url.clone(), "8", Some(&key)).await.unwrap();
    assert_eq!(first.status(), 201);
    let connections = proxy.connections();
    let other = post(&mut client, url, "another order", Some(&key)).await.unwrap();
    assert_eq!(other.status(), 422);
    assert!(text(other).await.contains("idempotency_key_reused"));
    assert_eq!(proxy.connections(), connections + 1, "never retried");
    assert_eq!(payments.runs(), 1);
}

#[tokio::test]
async fn a_get_passes_untouched_and_carries_no_key() {
    let payments = Payments::default();
    let proxy = Proxy::to(payments.serve().await).await;
    proxy.script([Fault::DropResponse]);
    let mut client = client(5);
    let request = http::Request::get(format!("http://{}/charges", proxy.addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    std::future::poll_fn(|cx| client.poll_ready(cx)).await.unwrap();
    let error = client.call(request).await.unwrap_err();
    assert!(CallFailed::find(&*error).is_none(), "not the layer's: {error}");
    assert_eq!(proxy.connections(), 1);
}

#[tokio::test]
async fn an_unguarded_path_passes_untouched() {
    let payments = Payments::default();
    let proxy = Proxy::to(payments.serve().await).await;
    proxy.script([Fault::DropResponse]);
    let hyper = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build_http();
    let mut client = IdempotentRetryLayer::default().unguarded(["/charges"]).layer(hyper);
    let error =
        post(&mut client, format!("http://{}/charges", proxy.addr), "x", None).await.unwrap_err();
    assert!(CallFailed::find(&*error).is_none(), "not the layer's: {error}");
    assert_eq!(proxy.connections(), 1, "not retried");
}
