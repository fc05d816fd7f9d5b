//! The layer's `tracing` span: one `idempotency` span per guarded request, carrying its
//! key's parts and correlation id, whether it replays or executes (the handler's own
//! events run inside it), never one nested in another of the same request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use axum::routing::post;
use axum::Router;
use idemcache::layer::IdempotencyLayer;
use idemcache::Cache;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Spans named `idempotency`, by the client key they carry; and the client key of the
/// span each handler event was inside.
#[derive(Default)]
struct Seen {
    spans: HashMap<String, usize>,
    by_id: HashMap<u64, (String, Option<String>)>,
    current: Vec<u64>,
    handler_events_in: Vec<String>,
}

struct Spans {
    next: AtomicU64,
    seen: Arc<Mutex<Seen>>,
}

struct Fields(HashMap<&'static str, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name(), format!("{value:?}").trim_matches('"').to_owned());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name(), value.to_owned());
    }
}

impl Subscriber for Spans {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        if span.metadata().name() == "idempotency" {
            let mut fields = Fields(HashMap::new());
            span.record(&mut fields);
            let key = fields.0.get("client_key").cloned().unwrap_or_default();
            let mut seen = self.seen.lock().unwrap();
            *seen.spans.entry(key.clone()).or_default() += 1;
            seen.by_id.insert(id, (key, fields.0.get("correlation_id").cloned()));
        }
        Id::from_u64(id)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        if event.metadata().target().starts_with("tracing_span") {
            let mut seen = self.seen.lock().unwrap();
            let inside = seen.current.iter().rev().find_map(|id| seen.by_id.get(id)).cloned();
            if let Some((key, _)) = inside {
                seen.handler_events_in.push(key);
            }
        }
    }
    fn enter(&self, span: &Id) {
        self.seen.lock().unwrap().current.push(span.into_u64());
    }
    fn exit(&self, span: &Id) {
        let mut seen = self.seen.lock().unwrap();
        if let Some(at) = seen.current.iter().rposition(|id| *id == span.into_u64()) {
            seen.current.remove(at);
        }
    }
}

fn seen() -> Arc<Mutex<Seen>> {
    static SEEN: OnceLock<Arc<Mutex<Seen>>> = OnceLock::new();
    SEEN.get_or_init(|| {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let spans = Spans { next: AtomicU64::new(0), seen: seen.clone() };
        tracing::subscriber::set_global_default(spans).unwrap();
        seen
    })
    .clone()
}

// One thread: `enter` and `exit` are kept in one stack, as one thread sees them.
#[tokio::test(flavor = "current_thread")]
async fn one_span_per_request_and_the_handler_runs_inside_it() {
    let seen = seen();
    let layer = IdempotencyLayer::new(Cache::builder().build().unwrap());
    let handler = || async {
        tracing::info!("the handler runs");
        "done"
    };
    let router = Router::new().route("/orders", post(handler)).route_layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let client = reqwest_free_post(addr);
    for _ in 0..2 {
        assert!(client("span-k", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").await);
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.spans.get("span-k"), Some(&2), "one span per request: {:?}", seen.spans);
    assert_eq!(seen.handler_events_in, ["span-k"], "the handler ran once, inside its span");
    let ids: Vec<_> =
        seen.by_id.values().filter(|(k, _)| k == "span-k").map(|(_, c)| c.clone()).collect();
    assert!(
        ids.iter().all(|c| c.as_deref() == Some("4bf92f3577b34da6a3ce929d0e0e4736")),
        "{ids:?}"
    );
}

/// A POST with a key and a `traceparent`, over a plain TCP socket; whether it got a 2xx.
fn reqwest_free_post(
    addr: std::net::SocketAddr,
) -> impl Fn(&'static str, &'static str) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool>>>
{
    move |key, trace| {
        Box::pin(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            let request = format!(
                "POST /orders HTTP/1.1\r\nHost: t\r\nConnection: close\r\nIdempotency-Key: {key}\r\n\
                 traceparent: {trace}\r\nContent-Length: 2\r\n\r\n{{}}"
            );
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await.unwrap();
            answer.starts_with("HTTP/1.1 2")
        })
    }
}
