//! A newcomer's try at the gRPC layer: a unary `Create` guarded per tenant, a health
//! check and a server-streaming `Watch` passed through unguarded, then a tonic client
//! calling it: a replay, a reused key, and a missing key.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use http::uri::PathAndQuery;
use idemcache::layer::{Grpc, IdempotencyLayer};
use idemcache::Cache;
use tonic::server::{NamedService, ServerStreamingService, UnaryService};
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status};
use tonic_prost::ProstCodec;

#[derive(Clone, PartialEq, prost::Message)]
struct CreateOrder {
    #[prost(string, tag = "1")]
    item: String,
    #[prost(int32, tag = "2")]
    qty: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Order {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(string, tag = "2")]
    item: String,
    #[prost(int32, tag = "3")]
    qty: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    service: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckResponse {
    /// 1 = SERVING.
    #[prost(int32, tag = "1")]
    status: i32,
}

const CREATE: &str = "/orders.v1.Orders/Create";
const WATCH: &str = "/orders.v1.Orders/Watch";
const CHECK: &str = "/grpc.health.v1.Health/Check";

static EXECUTED: AtomicU64 = AtomicU64::new(0);

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

struct CreateCall;
impl UnaryService<CreateOrder> for CreateCall {
    type Response = Order;
    type Future = BoxFuture<Result<Response<Order>, Status>>;
    fn call(&mut self, request: Request<CreateOrder>) -> Self::Future {
        Box::pin(async move {
            let n = EXECUTED.fetch_add(1, Ordering::SeqCst) + 1;
            let o = request.into_inner();
            Ok(Response::new(Order { id: format!("ord_{n}"), item: o.item, qty: o.qty }))
        })
    }
}

type OrderStream = tokio_stream::Iter<std::vec::IntoIter<Result<Order, Status>>>;

struct WatchCall;
impl ServerStreamingService<CreateOrder> for WatchCall {
    type Response = Order;
    type ResponseStream = OrderStream;
    type Future = BoxFuture<Result<Response<OrderStream>, Status>>;
    fn call(&mut self, request: Request<CreateOrder>) -> Self::Future {
        Box::pin(async move {
            let o = request.into_inner();
            let items: Vec<Result<Order, Status>> = (1..=3)
                .map(|i| Ok(Order { id: format!("w{i}"), item: o.item.clone(), qty: i }))
                .collect();
            Ok(Response::new(tokio_stream::iter(items)))
        })
    }
}

struct CheckCall;
impl UnaryService<HealthCheckRequest> for CheckCall {
    type Response = HealthCheckResponse;
    type Future = BoxFuture<Result<Response<HealthCheckResponse>, Status>>;
    fn call(&mut self, _: Request<HealthCheckRequest>) -> Self::Future {
        Box::pin(async { Ok(Response::new(HealthCheckResponse { status: 1 })) })
    }
}

#[derive(Clone)]
struct OrdersServer;
impl NamedService for OrdersServer {
    const NAME: &'static str = "orders.v1.Orders";
}
impl tower::Service<http::Request<tonic::body::Body>> for OrdersServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let codec = ProstCodec::<Order, CreateOrder>::default();
        match request.uri().path() {
            CREATE => Box::pin(async move {
                Ok(tonic::server::Grpc::new(codec).unary(CreateCall, request).await)
            }),
            WATCH => Box::pin(async move {
                Ok(tonic::server::Grpc::new(codec).server_streaming(WatchCall, request).await)
            }),
            other => {
                let missing = Status::unimplemented(format!("no method {other}"));
                Box::pin(async move { Ok(missing.into_http()) })
            }
        }
    }
}

#[derive(Clone)]
struct HealthServer;
impl NamedService for HealthServer {
    const NAME: &'static str = "grpc.health.v1.Health";
}
impl tower::Service<http::Request<tonic::body::Body>> for HealthServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if request.uri().path() != CHECK {
            let missing = Status::unimplemented("no such method");
            return Box::pin(async move { Ok(missing.into_http()) });
        }
        let codec = ProstCodec::<HealthCheckResponse, HealthCheckRequest>::default();
        Box::pin(async move { Ok(tonic::server::Grpc::new(codec).unary(CheckCall, request).await) })
    }
}

fn bearer(headers: &http::HeaderMap) -> Option<String> {
    let v = headers.get("authorization")?.to_str().ok()?.strip_prefix("Bearer ")?;
    (!v.is_empty()).then(|| v.to_owned())
}

async fn create(
    channel: &Channel,
    key: Option<&str>,
    order: CreateOrder,
) -> Result<Response<Order>, Status> {
    let mut client = tonic::client::Grpc::new(channel.clone());
    client.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    let mut request = Request::new(order);
    request.metadata_mut().insert("authorization", "Bearer alice".parse().unwrap());
    if let Some(key) = key {
        request.metadata_mut().insert("idempotency-key", key.parse().unwrap());
    }
    let codec = ProstCodec::<CreateOrder, Order>::default();
    client.unary(request, PathAndQuery::from_static(CREATE), codec).await
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let cache = Cache::builder().build()?;
    let layer = IdempotencyLayer::new(cache)
        .grpc(Grpc::new().unguarded([WATCH, CHECK]))
        .tenant(|request| bearer(&request.headers));

    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let address = listener.local_addr()?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let server = Server::builder()
        .layer(layer)
        .add_service(OrdersServer)
        .add_service(HealthServer)
        .serve_with_incoming(incoming);
    tokio::spawn(server);

    let channel = Channel::from_shared(format!("http://{address}"))?.connect().await?;
    let book = CreateOrder { item: "book".into(), qty: 2 };

    // 1. The same key twice: executed once, the second replayed.
    let first = create(&channel, Some("k1"), book.clone()).await?;
    assert!(first.metadata().get("idempotent-replayed").is_none());
    let second = create(&channel, Some("k1"), book.clone()).await?;
    println!("replay metadata: {:?}", second.metadata().get("idempotent-replayed"));
    assert_eq!(second.metadata().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(first.get_ref(), second.get_ref());
    assert_eq!(EXECUTED.load(Ordering::SeqCst), 1);

    // 2. Another message under the same key: FAILED_PRECONDITION, idempotency_key_reused.
    let other = CreateOrder { item: "book".into(), qty: 3 };
    let refused = create(&channel, Some("k1"), other).await.expect_err("refused");
    println!("reused: {:?} {:?}", refused.code(), refused.metadata().get("idempotency-refusal"));
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert_eq!(refused.metadata().get("idempotency-refusal").unwrap(), "idempotency_key_reused");

    // 3. No key: INVALID_ARGUMENT, missing_idempotency_key.
    let refused = create(&channel, None, book.clone()).await.expect_err("refused");
    println!("no key: {:?} {:?}", refused.code(), refused.metadata().get("idempotency-refusal"));
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(refused.metadata().get("idempotency-refusal").unwrap(), "missing_idempotency_key");
    assert_eq!(EXECUTED.load(Ordering::SeqCst), 1);

    // 4. The health check and the stream pass with no key (and no tenant?).
    let mut client = tonic::client::Grpc::new(channel.clone());
    client.ready().await?;
    let codec = ProstCodec::<HealthCheckRequest, HealthCheckResponse>::default();
    let health = client
        .unary(Request::new(HealthCheckRequest::default()), PathAndQuery::from_static(CHECK), codec)
        .await?;
    assert_eq!(health.get_ref().status, 1);

    client.ready().await?;
    let codec = ProstCodec::<CreateOrder, Order>::default();
    let mut stream = client
        .server_streaming(Request::new(book.clone()), PathAndQuery::from_static(WATCH), codec)
        .await?
        .into_inner();
    let mut n = 0;
    while let Some(order) = stream.message().await? {
        n += 1;
        assert_eq!(order.qty, n);
    }
    assert_eq!(n, 3);
    println!("all as documented");
    probe().await
}

/// Undocumented for gRPC: do `require_key(false)` and the HTTP `store_when` apply?
async fn probe() -> Result<(), Box<dyn std::error::Error>> {
    let layer = IdempotencyLayer::new(Cache::builder().build()?)
        .grpc(Grpc::new())
        .require_key(false)
        .store_when(|_| false);
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let address = listener.local_addr()?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let server =
        Server::builder().layer(layer).add_service(OrdersServer).serve_with_incoming(incoming);
    tokio::spawn(server);
    let channel = Channel::from_shared(format!("http://{address}"))?.connect().await?;
    let book = CreateOrder { item: "book".into(), qty: 2 };
    let before = EXECUTED.load(Ordering::SeqCst);
    let no_key = create(&channel, None, book.clone()).await;
    println!(
        "require_key(false), no key: {:?}",
        no_key.as_ref().map(|r| r.get_ref()).map_err(|s| s.code())
    );
    let a = create(&channel, Some("p1"), book.clone()).await?;
    let b = create(&channel, Some("p1"), book.clone()).await?;
    println!(
        "HTTP store_when(|_| false) under grpc: second replayed = {:?}; executions = {}",
        b.metadata().get("idempotent-replayed"),
        EXECUTED.load(Ordering::SeqCst) - before
    );
    let _ = a;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run())
}
