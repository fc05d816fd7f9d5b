//! The tower layer's added latency, against the bare handler, in one run:
//!
//! ```sh
//! cargo bench -p idemcache-benches --bench layer
//! ```
//!
//! Each iteration builds a request (method, path, `Idempotency-Key`, a 64-byte JSON body)
//! and drives the service to its response on a current-thread tokio runtime; the handler
//! answers 201 with a 128-byte body. `bare` is the handler alone; `replay` is the layer
//! answering a stored response; `first execution` is the layer claiming a fresh key,
//! running the handler in its task, storing the response and answering it. The `hook`
//! rows are the same with an `on_decision` hook that does nothing; with this package's
//! feature `metrics` (`--features metrics`, which turns on the layer's metrics) the
//! `recorder` rows run last, on a fresh layer, with a Prometheus recorder installed
//! globally (benches/results/decision-report-cost.md).

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idemcache::layer::IdempotencyLayer;
use idemcache::Cache;
use tower::{Layer, Service, ServiceExt};

const BODY: &[u8] = br#"{"item":"book","qty":2,"note":"deliver to the front desk please"}"#;

fn request(key: &str) -> Request<Full<Bytes>> {
    Request::post("/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(BODY)))
        .unwrap()
}

async fn handler<B>(_: Request<B>) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut response = Response::new(Full::new(Bytes::from(vec![b'x'; 128])));
    *response.status_mut() = StatusCode::CREATED;
    response.headers_mut().insert("content-type", "application/json".parse().unwrap());
    Ok(response)
}

/// Calls the service once and reads the whole response body, as a server would.
async fn call<S, B>(service: &mut S, request: Request<Full<Bytes>>) -> usize
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>, Error = Infallible>,
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    response.into_body().collect().await.unwrap().to_bytes().len()
}

fn layer(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let mut group = c.benchmark_group("layer");

    let mut bare = tower::service_fn(handler);
    group.bench_function("bare handler", |b| b.iter(|| rt.block_on(call(&mut bare, request("k")))));

    let cache = Cache::builder().build().unwrap();
    let mut layered = IdempotencyLayer::new(cache).layer(tower::service_fn(handler));
    rt.block_on(call(&mut layered, request("replayed")));
    group.bench_function("layer: replay", |b| {
        b.iter(|| rt.block_on(call(&mut layered, request("replayed"))))
    });

    let fresh = AtomicU64::new(0);
    group.bench_function("layer: first execution", |b| {
        b.iter(|| {
            let key = format!("k{}", fresh.fetch_add(1, Ordering::Relaxed));
            rt.block_on(call(&mut layered, request(&key)))
        })
    });

    let cache = Cache::builder().build().unwrap();
    let mut hooked = IdempotencyLayer::new(cache)
        .on_decision(|event| {
            std::hint::black_box(event);
        })
        .layer(tower::service_fn(handler));
    rows(&mut group, &rt, &mut hooked, "hook", &fresh);

    // Last: a global recorder cannot be taken back, and the layer registers its handles
    // with whichever recorder is installed when a scope is first seen.
    #[cfg(feature = "metrics")]
    {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        metrics::set_global_recorder(recorder).unwrap();
        let cache = Cache::builder().build().unwrap();
        let mut recorded = IdempotencyLayer::new(cache).layer(tower::service_fn(handler));
        rows(&mut group, &rt, &mut recorded, "recorder", &fresh);
    }
    group.finish();
}

/// The replay and first-execution rows of one more variant of the layer, named `variant`.
fn rows<S, B>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &tokio::runtime::Runtime,
    service: &mut S,
    variant: &str,
    fresh: &AtomicU64,
) where
    S: Service<Request<Full<Bytes>>, Response = Response<B>, Error = Infallible>,
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    rt.block_on(call(service, request("replayed")));
    group.bench_function(format!("layer: replay, {variant}"), |b| {
        b.iter(|| rt.block_on(call(service, request("replayed"))))
    });
    group.bench_function(format!("layer: first execution, {variant}"), |b| {
        b.iter(|| {
            let key = format!("k{}", fresh.fetch_add(1, Ordering::Relaxed));
            rt.block_on(call(service, request(&key)))
        })
    });
}

criterion_group!(benches, layer);
criterion_main!(benches);
