//! The layer's request fingerprint, as a handler sees it in `Claimed`, against
//! `FingerprintBuilder` fed the documented parts: method, path and query, the configured
//! headers in order with every value, then the body (or what `fingerprint_body` selects).
//! The layer computes it in one pass over a stack buffer, not with the builder: these
//! hold the two to one digest where that buffer spills (long paths, headers, bodies).

use std::sync::{Arc, Mutex};

use axum::http::{HeaderName, Method, Request, Response};
use bytes::Bytes;
use http_body_util::Full;
use idemcache::layer::{Claimed, IdempotencyLayer};
use idemcache::{Cache, Fingerprint};
use tower::{Layer, ServiceExt};

/// The fingerprint the layer gave the request, as its handler reads it in `Claimed`.
async fn layer_fingerprint(layer: IdempotencyLayer, request: Request<Full<Bytes>>) -> Fingerprint {
    let seen: Arc<Mutex<Option<Fingerprint>>> = Arc::default();
    let kept = seen.clone();
    let inner = tower::service_fn(move |req: Request<_>| {
        let kept = kept.clone();
        async move {
            let claimed = req.extensions().get::<Claimed>().cloned().expect("claimed");
            *kept.lock().unwrap() = Some(claimed.fingerprint());
            Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    });
    let service = layer.layer(inner);
    let response = service.oneshot(request).await.unwrap();
    assert!(response.status().is_success(), "{:?}", response.status());
    let fp = seen.lock().unwrap().take().expect("handler ran");
    fp
}

/// A header as a case names it: its name as sent, and its value.
type Header = (&'static str, Vec<u8>);

/// A guarded `POST` of `path` with `headers` (names as sent) and `body`.
fn request(path: &str, headers: &[Header], body: Vec<u8>) -> Request<Full<Bytes>> {
    let mut builder =
        Request::builder().method(Method::POST).uri(path).header("idempotency-key", "k-1");
    for (name, value) in headers {
        builder = builder.header(*name, value.as_slice());
    }
    builder.body(Full::new(Bytes::from(body))).unwrap()
}

/// The builder fed what the layer documents: method, path and query, each of `names`
/// with every value sent, in order, then the body.
fn built(path: &str, names: &[&str], headers: &[Header], body: &[u8]) -> Fingerprint {
    let mut b = Fingerprint::builder().method("POST").path(path);
    for name in names {
        for (n, v) in headers {
            if n.eq_ignore_ascii_case(name) {
                b = b.header(name, v);
            }
        }
    }
    b.body(body).finish()
}

#[tokio::test]
async fn the_layers_fingerprint_is_the_builders_for_long_and_repeated_parts() {
    let long_path = format!("/v1/{}?q={}&r=%2F", "seg/".repeat(200), "x".repeat(500));
    let cases: Vec<(String, Vec<Header>, Vec<u8>)> = vec![
        ("/a".into(), vec![], vec![]),
        ("/a?b=c&d".into(), vec![("content-type", b"application/json".to_vec())], b"{}".to_vec()),
        // Repeated headers, each value, in order; mixed case names on the wire.
        (
            "/orders?x=1".into(),
            vec![
                ("X-Tenant-Tag", b"one".to_vec()),
                ("Content-Type", b"text/plain".to_vec()),
                ("x-tenant-tag", vec![b'v'; 300]),
            ],
            vec![7u8; 5000],
        ),
        // A stream spilling at a header name's write, and a huge body.
        (
            format!("/{}", "p".repeat(200)),
            vec![("content-type", vec![b'c'; 10]), ("x-tenant-tag", vec![b't'; 4000])],
            vec![0xAB; 1 << 20],
        ),
        (
            long_path,
            vec![("x-tenant-tag", vec![]), ("content-type", vec![b'z'; 250])],
            vec![1; 1025],
        ),
    ];
    let names = ["content-type", "x-tenant-tag"];
    for (path, headers, body) in cases {
        let cache = Cache::builder().build().unwrap();
        let layer = IdempotencyLayer::new(cache)
            .max_request_body(4 << 20)
            .fingerprint_headers(names.iter().map(|n| HeaderName::from_static(n)));
        let got = layer_fingerprint(layer, request(&path, &headers, body.clone())).await;
        assert_eq!(
            got,
            built(&path, &names, &headers, &body),
            "path {} headers {}",
            path.len(),
            headers.len()
        );
    }
}

#[tokio::test]
async fn fingerprint_body_selecting_nothing_is_the_builders_empty_body() {
    for body in [vec![], b"anything".to_vec()] {
        let cache = Cache::builder().build().unwrap();
        let layer = IdempotencyLayer::new(cache).fingerprint_body(|_, _| Vec::new());
        let got =
            layer_fingerprint(layer, request("/x", &[("content-type", b"a/b".to_vec())], body))
                .await;
        let expect = Fingerprint::builder()
            .method("POST")
            .path("/x")
            .header("content-type", b"a/b")
            .body(b"")
            .finish();
        assert_eq!(got, expect);
    }
}
