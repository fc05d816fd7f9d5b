//! Instructions per request through the tower layer, counted by callgrind: what the
//! layer's decision reporting (the hook, the correlation id, the `metrics` feature) costs a
//! replay and a first execution, repeatably on a shared machine.
//!
//! ```sh
//! cargo build --release -p idemcache-benches --bin layer_instructions [--features metrics]
//! target/release/layer_instructions          # runs itself under valgrind per row; prints a table
//! ```
//!
//! Each row runs in a child process under
//! `valgrind --tool=callgrind --toggle-collect=*measured*`: the requests are built
//! beforehand (method, path, `Idempotency-Key`, a 64-byte JSON body, as in
//! `benches/layer.rs`), and only the `measured` loop is counted: driving the service to
//! its response on a current-thread tokio runtime and reading the response body whole.
//! The count is divided by the loop's requests. Rows:
//!
//! - `bare`: the handler alone (what the layer adds is a row minus this one);
//! - `layer`: the layer over a cache, with its defaults (no hook);
//! - `no-correlation`: the same with a correlation id function that reads nothing
//!   (`correlation_id(|_| None)`), against the default's `traceparent` lookup (feature
//!   `decision`);
//! - `hook`: the same with an `on_decision` hook that does nothing (feature `decision`,
//!   which a build of a commit before the hook existed leaves out);
//! - `recorder`: the same as `layer` with a Prometheus recorder installed globally before
//!   the first request (feature `metrics`, which also turns on `idemcache/metrics`).
//!
//! `benches/results/decision-report-cost.md` has the numbers and the script that made them
//! (`benches/decision-report-cost.sh`).

use std::convert::Infallible;
use std::hint::black_box;
use std::process::Command;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idemcache::layer::IdempotencyLayer;
use idemcache::Cache;
use tower::{Layer, Service, ServiceExt};

/// The first argument of the child process that runs one row under valgrind (any other
/// arguments name the rows to print).
const CHILD: &str = "--row";

/// Requests in the counted loop.
const OPS: usize = 5_000;

const BODY: &[u8] = br#"{"item":"book","qty":2,"note":"deliver to the front desk please"}"#;

fn request(key: &str) -> Request<Full<Bytes>> {
    Request::post("/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(BODY)))
        .expect("a valid request")
}

async fn handler<B>(_: Request<B>) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut response = Response::new(Full::new(Bytes::from(vec![b'x'; 128])));
    *response.status_mut() = StatusCode::CREATED;
    response
        .headers_mut()
        .insert("content-type", http::HeaderValue::from_static("application/json"));
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

/// The counted loop: every request through `service` on `rt`.
#[inline(never)]
fn measured<S, B>(
    rt: &tokio::runtime::Runtime,
    service: &mut S,
    requests: Vec<Request<Full<Bytes>>>,
) where
    S: Service<Request<Full<Bytes>>, Response = Response<B>, Error = Infallible>,
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    for request in requests {
        black_box(rt.block_on(call(service, request)));
    }
}

/// The layer of `variant` over a fresh cache.
fn layer(variant: &str) -> IdempotencyLayer {
    let layer = IdempotencyLayer::new(Cache::builder().build().expect("a cache"));
    match variant {
        "layer" => layer,
        // The default correlation id reads `traceparent`; this reads nothing.
        #[cfg(feature = "decision")]
        "no-correlation" => layer.correlation_id(|_| None),
        #[cfg(feature = "decision")]
        "hook" => layer.on_decision(|event| {
            black_box(event);
        }),
        #[cfg(feature = "metrics")]
        "recorder" => {
            let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
            metrics::set_global_recorder(recorder).expect("no recorder installed yet");
            layer
        }
        other => panic!("no variant {other} in this build"),
    }
}

/// One row, in the child process valgrind runs.
fn workload(scenario: &str, variant: &str) {
    let rt =
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
    if variant == "bare" {
        let requests = (0..OPS).map(|_| request("k")).collect();
        return measured(&rt, &mut tower::service_fn(handler), requests);
    }
    let mut service = layer(variant).layer(tower::service_fn(handler));
    // One request first in both scenarios, so a scope's metrics handles are registered
    // (and the runtime warm) before counting starts, as in a server that has been up.
    rt.block_on(call(&mut service, request("replayed")));
    let requests = match scenario {
        "replay" => (0..OPS).map(|_| request("replayed")).collect(),
        _ => (0..OPS).map(|i| request(&format!("k{i}"))).collect(),
    };
    measured(&rt, &mut service, requests);
}

/// The child's instruction count from callgrind's summary line (`Collected : N`).
fn count(scenario: &str, variant: &str) -> Result<u64, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = Command::new("valgrind")
        .args(["--tool=callgrind", "--toggle-collect=*measured*", "--callgrind-out-file=/dev/null"])
        .arg(me)
        .args([CHILD, scenario, variant])
        .output()
        .map_err(|e| format!("valgrind: {e} (is it installed?)"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("the row failed: {stderr}"));
    }
    stderr
        .lines()
        .find_map(|l| l.split("Collected :").nth(1).map(|n| n.trim().parse::<u64>()))
        .ok_or_else(|| format!("no count in valgrind's output: {stderr}"))?
        .map_err(|e| e.to_string())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [child, scenario, variant] = args.as_slice() {
        if child == CHILD {
            return workload(scenario, variant);
        }
    }
    // Rows named on the command line (`layer hook`), else every row this build has.
    let mut variants: Vec<&str> = args.iter().map(String::as_str).collect();
    if variants.is_empty() {
        variants = vec!["bare", "layer"];
        if cfg!(feature = "decision") {
            variants.extend(["no-correlation", "hook"]);
        }
        if cfg!(feature = "metrics") {
            variants.push("recorder");
        }
    }
    println!("| row | replay, instructions/request | first execution, instructions/request |");
    println!("|---|---|---|");
    for variant in variants {
        let per_op = |scenario| match count(scenario, variant) {
            Ok(n) => format!("{:.0}", n as f64 / OPS as f64),
            Err(e) => {
                eprintln!("{variant}, {scenario}: {e}");
                "—".to_owned()
            }
        };
        println!("| {variant} | {} | {} |", per_op("replay"), per_op("first"));
    }
}
