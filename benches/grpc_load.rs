//! The gRPC service under load: calls per second and latency percentiles of one tonic
//! service, bare and behind the idempotency layer, from one run, with a closed-loop load
//! generator of its own on tonic's client. Run from the repository root (BENCHMARKS.md
//! has the exact command and a run's table):
//!
//! ```sh
//! cargo build --release -p idemcache-benches --bin grpc_load
//! target/release/grpc_load [--duration SECS] [--rounds N] [--concurrency N] \
//!     [--server-threads N]
//! ```
//!
//! Each server is a child process (this binary, `grpc_load serve ROW`) on 127.0.0.1, a
//! tokio runtime of `--server-threads` workers (default: the cores), serving
//! `orders.v1.Orders/Create` with the example's messages (`examples/grpc/grpc.rs`) and a
//! trivial handler: it counts itself and answers the order. Rows: `bare` (tonic's
//! `Server` and the service alone), `layer-cache` (the same with
//! `IdempotencyLayer::new(cache).grpc(Grpc::new())` and the tenant from the
//! `authorization` metadata, as the example sets it up). The client is this process, one
//! thread, one tonic `Channel` (one HTTP/2 connection, as a tonic client shares it) with
//! `--concurrency` calls in flight (default 32), each sending its next call when its
//! last answer is read (a closed loop).
//!
//! First executions send a fresh `idempotency-key` every call; replays cycle through 32
//! keys per caller completed before the rounds. Each round runs every row's first
//! executions then its replays, rows interleaved, `--duration` seconds each (after a
//! quarter second not measured); the table shows each figure's median round (of
//! `--rounds`, default 3), its percentiles those of that round.

#[path = "support/load.rs"]
mod load;

// The example's messages: the benchmark sends what the example serves.
#[path = "../examples/grpc/grpc.rs"]
#[allow(dead_code, unreachable_pub)]
mod example;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use example::{bearer, CreateOrder, Order, CREATE};
use http::uri::PathAndQuery;
use idemcache::layer::{Grpc, IdempotencyLayer};
use idemcache::Cache;
use load::{cells, histogram, rounds_line, Measured, ServerProcess};
use tonic::server::{NamedService, UnaryService};
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

/// Replay keys completed per caller before the rounds.
const REPLAY_KEYS: usize = 32;
/// The part of each phase not measured: the connection warm, the pools filled.
const WARM_UP: Duration = Duration::from_millis(250);
/// The rows, in the table's order: the argument of `serve`, and the table's name.
const ROWS: [(&str, &str); 2] = [
    ("bare", "bare tonic service"),
    ("layer-cache", "the layer over the cache (`grpc(Grpc::new())`)"),
];

struct Args {
    duration: Duration,
    rounds: usize,
    concurrency: usize,
    server_threads: usize,
}

fn args() -> Args {
    Args {
        duration: Duration::from_secs_f64(load::flag("--duration", 2.0)),
        rounds: load::flag("--rounds", 3).max(1),
        concurrency: load::flag("--concurrency", 32).max(1),
        server_threads: load::flag("--server-threads", load::cores()),
    }
}

fn main() {
    let all: Vec<String> = std::env::args().skip(1).collect();
    if all.first().map(String::as_str) == Some("serve") {
        let threads = args().server_threads;
        serve(all.get(1).cloned().unwrap_or_default(), threads);
    } else {
        load(args());
    }
}

// ---- the server -------------------------------------------------------------------

/// Executions of the handler, from the start of the process.
static EXECUTIONS: AtomicU64 = AtomicU64::new(0);

/// `rpc Create`, trivially: counts itself and answers the order.
struct CreateCall;

impl UnaryService<CreateOrder> for CreateCall {
    type Response = Order;
    type Future = std::future::Ready<Result<Response<Order>, Status>>;

    fn call(&mut self, request: Request<CreateOrder>) -> Self::Future {
        let n = EXECUTIONS.fetch_add(1, Ordering::Relaxed) + 1;
        let order = request.into_inner();
        std::future::ready(Ok(Response::new(Order {
            id: n.to_string(),
            item: order.item,
            qty: order.qty,
        })))
    }
}

/// The `orders.v1.Orders` server, routing as tonic's generated servers do.
#[derive(Clone)]
struct Orders;

impl NamedService for Orders {
    const NAME: &'static str = "orders.v1.Orders";
}

impl tower::Service<http::Request<tonic::body::Body>> for Orders {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if request.uri().path() != CREATE {
            let missing = Status::unimplemented(format!("no method {}", request.uri().path()));
            return Box::pin(async move { Ok(missing.into_http()) });
        }
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<Order, CreateOrder>::default());
            Ok(grpc.unary(CreateCall, request).await)
        })
    }
}

/// Serves `row` on 127.0.0.1 (a free port), printing `listening ADDR` once it accepts;
/// returns when stdin (the load generator) closes.
fn serve(row: String, threads: usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let addr = listener.local_addr().expect("an address");
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let server = match row.as_str() {
            "bare" => Box::pin(Server::builder().add_service(Orders).serve_with_incoming(incoming))
                as Pin<Box<dyn Future<Output = _> + Send>>,
            "layer-cache" => {
                // Sized above every key one run makes, as http_serve's cache is.
                let cache = Cache::builder().max_entries(4_000_000).build().expect("a cache");
                let layer = IdempotencyLayer::new(cache)
                    .grpc(Grpc::new())
                    .tenant(|request| bearer(&request.headers));
                Box::pin(
                    Server::builder()
                        .layer(layer)
                        .add_service(Orders)
                        .serve_with_incoming(incoming),
                )
            }
            other => {
                println!("unavailable no row {other:?}");
                return;
            }
        };
        println!("listening {addr}");
        let parent_gone = tokio::task::spawn_blocking(|| {
            let mut sink = String::new();
            while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
        });
        tokio::select! {
            _ = server => {}
            _ = parent_gone => {}
        }
    });
    runtime.shutdown_timeout(Duration::from_millis(100));
}

// ---- the load generator -----------------------------------------------------------

/// Starts `row`'s server: this binary, `serve ROW`.
fn start(row: &str, threads: usize) -> Result<ServerProcess, String> {
    let program = std::env::current_exe().map_err(|e| e.to_string())?;
    let args = ["serve", row, "--server-threads", &threads.to_string()].map(str::to_owned);
    load::start(&program, &args)
}

type Client = tonic::client::Grpc<Channel>;

/// One call of `Create` with `key`; whether the answer is a replay.
async fn create(client: &mut Client, key: &str) -> Result<bool, Status> {
    let mut request = Request::new(CreateOrder { item: "book".into(), qty: 2 });
    let metadata = request.metadata_mut();
    metadata.insert("idempotency-key", key.parse().map_err(|_| Status::internal("a key"))?);
    metadata.insert("authorization", "Bearer bench".parse().expect("ascii"));
    client.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    let codec = ProstCodec::<CreateOrder, Order>::default();
    let answer = client.unary(request, PathAndQuery::from_static(CREATE), codec).await?;
    Ok(answer.metadata().get("idempotent-replayed").is_some_and(|v| v == "true"))
}

#[derive(Clone, Copy, PartialEq)]
enum Phase {
    First,
    Replay,
}

async fn measure(client: &Client, bare: bool, phase: Phase, tag: &str, args: &Args) -> Measured {
    let from = Instant::now() + WARM_UP;
    let end = from + args.duration;
    let tasks: Vec<_> = (0..args.concurrency)
        .map(|c| {
            let mut client = client.clone();
            let tag = tag.to_owned();
            tokio::spawn(async move {
                let mut histogram = histogram();
                let (mut calls, mut unexpected, mut first_unexpected) = (0u64, 0u64, None);
                for seq in 0u64.. {
                    let sent = Instant::now();
                    if sent >= end {
                        break;
                    }
                    let key = match phase {
                        Phase::First => format!("f-{tag}-{c}-{seq}"),
                        Phase::Replay => format!("r-{tag}-{c}-{}", seq % REPLAY_KEYS as u64),
                    };
                    let answer = create(&mut client, &key).await;
                    let took = sent.elapsed();
                    if sent < from {
                        continue;
                    }
                    calls += 1;
                    histogram.saturating_record(took.as_nanos() as u64);
                    // The bare service replays nothing: every answer is an order.
                    let expected = match &answer {
                        Ok(replayed) => bare || *replayed == (phase == Phase::Replay),
                        Err(_) => false,
                    };
                    if !expected {
                        unexpected += 1;
                        first_unexpected.get_or_insert_with(|| format!("{answer:?}"));
                    }
                }
                (calls, histogram, unexpected, first_unexpected)
            })
        })
        .collect();
    let mut total = Measured::empty();
    let mut calls = 0;
    for task in tasks {
        let (n, histogram, unexpected, first) = task.await.expect("a caller");
        calls += n;
        total.add(&histogram, unexpected, first);
    }
    total.per_second = calls as f64 / args.duration.as_secs_f64();
    total
}

/// Completes each caller's replay keys.
async fn prepare(client: &Client, concurrency: usize, tag: &str) -> Result<(), Status> {
    let mut client = client.clone();
    for c in 0..concurrency {
        for i in 0..REPLAY_KEYS {
            create(&mut client, &format!("r-{tag}-{c}-{i}")).await?;
        }
    }
    Ok(())
}

struct Running {
    id: &'static str,
    title: &'static str,
    _server: ServerProcess,
    client: Client,
    first: Vec<Measured>,
    replay: Vec<Measured>,
}

fn load(args: Args) {
    let run = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs()
    );
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let mut running = Vec::new();
    for (id, title) in ROWS {
        let started = start(id, args.server_threads).and_then(|server| {
            let client = runtime.block_on(async {
                let channel = Channel::from_shared(format!("http://{}", server.addr))
                    .map_err(|e| e.to_string())?
                    .tcp_nodelay(true)
                    .connect()
                    .await
                    .map_err(|e| e.to_string())?;
                let client = Client::new(channel);
                prepare(&client, args.concurrency, &run).await.map_err(|e| e.to_string())?;
                Ok::<_, String>(client)
            })?;
            Ok((server, client))
        });
        match started {
            Ok((server, client)) => running.push(Running {
                id,
                title,
                _server: server,
                client,
                first: Vec::new(),
                replay: Vec::new(),
            }),
            Err(why) => {
                eprintln!("grpc_load: row {id} could not start: {why}");
                std::process::exit(1);
            }
        }
    }
    for round in 0..args.rounds {
        for r in running.iter_mut() {
            for phase in [Phase::First, Phase::Replay] {
                let tag = match phase {
                    Phase::First => format!("{run}-{round}"),
                    Phase::Replay => run.clone(),
                };
                let measured =
                    runtime.block_on(measure(&r.client, r.id == "bare", phase, &tag, &args));
                eprintln!(
                    "round {round} {:>12} {:>6}: calls {}",
                    r.id,
                    if phase == Phase::First { "first" } else { "replay" },
                    measured.progress(),
                );
                match phase {
                    Phase::First => r.first.push(measured),
                    Phase::Replay => r.replay.push(measured),
                }
            }
        }
    }
    report(&args, &running);
}

impl Running {
    /// This row's rounds of `phase`.
    fn rounds(&self, phase: Phase) -> &[Measured] {
        match phase {
            Phase::First => &self.first,
            Phase::Replay => &self.replay,
        }
    }
}

fn report(args: &Args, running: &[Running]) {
    let bare = running.iter().find(|r| r.id == "bare");
    println!(
        "\n{} calls in flight over one HTTP/2 connection, closed loop, {} s per phase after \
         {} ms not measured, medians of {} interleaved rounds; server: a child process, {} \
         tokio workers; client: one thread. p50/p99/p99.9 of the median round.\n",
        args.concurrency,
        args.duration.as_secs_f64(),
        WARM_UP.as_millis(),
        args.rounds,
        args.server_threads
    );
    println!(
        "| | first executions calls/s | p50 / p99 / p99.9 | replays calls/s | p50 / p99 / p99.9 |"
    );
    println!("|---|---|---|---|---|");
    for r in running {
        let cell = |phase: Phase| {
            cells(r.rounds(phase), bare.filter(|_| r.id != "bare").map(|b| b.rounds(phase)))
        };
        let (first, first_lat) = cell(Phase::First);
        let (replay, replay_lat) = cell(Phase::Replay);
        println!("| {} | {first} | {first_lat} | {replay} | {replay_lat} |", r.title);
    }
    println!("\nEach round's calls/s (first / replay):\n");
    for r in running {
        println!("- {}: {}", r.id, rounds_line(&r.first, &r.replay));
    }
}
