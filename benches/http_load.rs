//! The HTTP service under load: requests per second and latency percentiles of one
//! service behind each idempotency middleware, from one run, with a closed-loop load
//! generator of its own on hyper. Run from the repository root (BENCHMARKS.md has the
//! exact command and a run's table):
//!
//! ```sh
//! cargo build --release -p idemcache-benches --bin http_load --bin http_serve
//! cargo build --release --ignore-rust-version --manifest-path benches/peer-idempotent/Cargo.toml
//! IDEMCACHE_REDIS_URL=redis://127.0.0.1:6379/15 \
//! IDEMCACHE_POSTGRES_URL='postgres://postgres@127.0.0.1:5432/test' \
//!     target/release/http_load [--duration SECS] [--rounds N] [--connections N] \
//!     [--server-threads N] [--rows NAME,NAME]
//! ```
//!
//! Each server is a child process (`http_serve ROW`, or the `idempotent` crate's own
//! `http_peer_idempotent`), on 127.0.0.1, a tokio runtime of `--server-threads` workers
//! (default: the cores); the client is this process, one thread. Child processes
//! because the `idempotent` crate cannot be built in this workspace (its rust-version
//! is above the toolchain's), and so that every row, ours and the peers', is served the
//! same way and no row's heap or threads are another's.
//!
//! Per row: `--connections` keep-alive HTTP/1.1 connections (default 32), each sending
//! its next request when its last response is read whole (a closed loop). First
//! executions send a fresh `Idempotency-Key` every request; replays cycle through 32
//! keys per connection completed before the rounds start. Each round runs every row's
//! first executions then its replays, rows interleaved, `--duration` seconds each
//! (after a quarter second not measured); the table shows each figure's median round
//! (of `--rounds`, default 3), its percentiles those of that round. Then, per row, the
//! semantic checks: ten concurrent duplicates of a 100 ms request (how many times it
//! ran), the same key with a different body (replayed or refused), and a request
//! without a key (executed unguarded or refused).
//!
//! Rows whose URL is unset are skipped, saying so: `IDEMCACHE_POSTGRES_URL`,
//! `IDEMCACHE_REDIS_URL` (use db 15: it is flushed before and after the run),
//! `IDEMCACHE_REDIS_CLUSTER_URL` (`redis-cluster://h1:p1,...`, once `idemcache-any`
//! opens that scheme).

#[path = "support/load.rs"]
mod load;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, COOKIE, HOST, SET_COOKIE};
use http::{HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use load::{cells, histogram, median, rounds_line, Measured, ServerProcess};

/// The request body: 64 bytes of JSON, as the layer bench sends.
const BODY: &[u8] = br#"{"item":"book","qty":2,"note":"deliver to the front desk please"}"#;
/// Another body, for the reused-key check.
const OTHER_BODY: &[u8] = br#"{"item":"lamp","qty":9,"note":"deliver to the back door instead"}"#;
/// Replay keys completed per connection before the rounds.
const REPLAY_KEYS: usize = 32;
/// The part of each phase not measured: connections warm, pools filled.
const WARM_UP: Duration = Duration::from_millis(250);

struct Args {
    duration: Duration,
    rounds: usize,
    connections: usize,
    server_threads: usize,
    /// The rows `--rows` names; empty: every row.
    rows: Vec<String>,
}

fn args() -> Args {
    Args {
        duration: Duration::from_secs_f64(load::flag("--duration", 2.0)),
        rounds: load::flag("--rounds", 3).max(1),
        connections: load::flag("--connections", 32).max(1),
        server_threads: load::flag("--server-threads", load::cores()),
        rows: load::flag("--rows", String::new())
            .split(',')
            .filter(|r| !r.is_empty())
            .map(str::to_owned)
            .collect(),
    }
}

/// One row of the table: a middleware (or none) over a store.
struct Row {
    /// Its short name (`--rows`).
    id: &'static str,
    /// Its name in the table.
    title: &'static str,
    /// Where its records live: peers on the same store are compared.
    store: &'static str,
    /// Ours, or a peer's.
    ours: bool,
    program: PathBuf,
    args: Vec<String>,
}

fn rows(run: &str) -> Vec<Result<Row, (String, String)>> {
    let dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
        .unwrap_or_default();
    let serve = dir.join("http_serve");
    let peer = dir.join("http_peer_idempotent");
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let redis = env("IDEMCACHE_REDIS_URL");
    let row = |id, title, store, ours, program: &PathBuf, args: &[&str]| Row {
        id,
        title,
        store,
        ours,
        program: program.clone(),
        args: args.iter().map(|a| a.to_string()).collect(),
    };
    let needs = |id: &str, url: &Option<String>, var: &str, make: &dyn Fn(&str) -> Row| match url {
        Some(url) => Ok(make(url)),
        None => Err((id.to_owned(), format!("{var} is not set"))),
    };
    let sqlite = std::env::temp_dir().join(format!("idemcache-http-load-{run}.db"));
    let sqlite = format!("sqlite:{}", sqlite.display());
    vec![
        Ok(row("bare", "bare axum handler", "-", true, &serve, &["bare"])),
        Ok(row("cache", "the layer over the cache", "memory", true, &serve, &["layer-cache"])),
        Ok(row(
            "sqlite",
            "the layer over SQLite (`Tiered`, a WAL file, synchronous FULL)",
            "SQLite",
            true,
            &serve,
            &["layer-tiered", &sqlite],
        )),
        needs("postgres", &env("IDEMCACHE_POSTGRES_URL"), "IDEMCACHE_POSTGRES_URL", &|url| {
            row(
                "postgres",
                "the layer over PostgreSQL (`Tiered`, fsync on)",
                "PostgreSQL",
                true,
                &serve,
                &["layer-tiered", url],
            )
        }),
        needs("one-commit", &env("IDEMCACHE_POSTGRES_URL"), "IDEMCACHE_POSTGRES_URL", &|url| {
            row(
                "one-commit",
                "one commit over PostgreSQL (`claim_in` + `complete_in` in one transaction, no cache)",
                "PostgreSQL",
                true,
                &serve,
                &["one-commit", url],
            )
        }),
        needs(
            "postgres-orders",
            &env("IDEMCACHE_POSTGRES_URL"),
            "IDEMCACHE_POSTGRES_URL",
            &|url| {
                row(
                "postgres-orders",
                "the layer over PostgreSQL (`Tiered`), the handler writing an order in its own transaction",
                "PostgreSQL",
                true,
                &serve,
                &["layer-tiered-orders", url],
            )
            },
        ),
        needs(
            "one-commit-orders",
            &env("IDEMCACHE_POSTGRES_URL"),
            "IDEMCACHE_POSTGRES_URL",
            &|url| {
                row(
                    "one-commit-orders",
                    "one commit over PostgreSQL, the order written in the same transaction",
                    "PostgreSQL",
                    true,
                    &serve,
                    &["one-commit-orders", url],
                )
            },
        ),
        needs(
            "layer-one-commit",
            &env("IDEMCACHE_POSTGRES_URL"),
            "IDEMCACHE_POSTGRES_URL",
            &|url| {
                row(
                    "layer-one-commit",
                    "the layer's one-commit mode over PostgreSQL (`IdempotencyLayer::one_commit`, a cache in front)",
                    "PostgreSQL",
                    true,
                    &serve,
                    &["layer-one-commit", url],
                )
            },
        ),
        needs(
            "layer-one-commit-orders",
            &env("IDEMCACHE_POSTGRES_URL"),
            "IDEMCACHE_POSTGRES_URL",
            &|url| {
                row(
                    "layer-one-commit-orders",
                    "the layer's one-commit mode over PostgreSQL, the order written in its transaction",
                    "PostgreSQL",
                    true,
                    &serve,
                    &["layer-one-commit-orders", url],
                )
            },
        ),
        needs("redis", &redis, "IDEMCACHE_REDIS_URL", &|url| {
            row(
                "redis",
                "the layer over Redis (`Tiered`)",
                "Redis",
                true,
                &serve,
                &["layer-tiered", url],
            )
        }),
        needs(
            "redis-cluster",
            &env("IDEMCACHE_REDIS_CLUSTER_URL"),
            "IDEMCACHE_REDIS_CLUSTER_URL",
            &|url| {
                row(
                    "redis-cluster",
                    "the layer over Redis Cluster (`Tiered`)",
                    "Redis Cluster",
                    true,
                    &serve,
                    &["layer-tiered", url],
                )
            },
        ),
        Ok(row(
            "axum-idempotent",
            "axum-idempotent 0.6 (its in-memory store)",
            "memory",
            false,
            &serve,
            &["axum-idempotent"],
        )),
        needs("setnx", &redis, "IDEMCACHE_REDIS_URL", &|url| {
            row(
                "setnx",
                "hand-written Redis `SET NX EX` middleware",
                "Redis",
                false,
                &serve,
                &["setnx", url],
            )
        }),
        match (&redis, peer.exists()) {
            (None, _) => Err(("idempotent".into(), "IDEMCACHE_REDIS_URL is not set".into())),
            (Some(_), false) => Err((
                "idempotent".into(),
                format!(
                    "{} is not built: cargo build --release --ignore-rust-version \
                     --manifest-path benches/peer-idempotent/Cargo.toml",
                    peer.display()
                ),
            )),
            (Some(url), true) => Ok(row(
                "idempotent",
                "`idempotent` 2.0 crate over Redis (its middleware, defaults)",
                "Redis",
                false,
                &peer,
                &[url],
            )),
        },
    ]
}

/// Starts `row`'s server with `threads` workers.
fn start(row: &Row, threads: usize) -> Result<ServerProcess, String> {
    let mut args = row.args.clone();
    args.extend(["--threads".to_owned(), threads.to_string()]);
    load::start(&row.program, &args)
}

/// One keep-alive connection, with the session cookie its server gave it (if any).
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    cookie: Option<HeaderValue>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn connect(addr: SocketAddr) -> Result<Conn, BoxError> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let mut conn = Conn { sender, cookie: None };
    // A server with sessions (axum-idempotent's) answers with its cookie; others 404.
    let response = send(&mut conn, "/login", None, BODY).await?;
    conn.cookie = response.cookie;
    Ok(conn)
}

struct Answer {
    status: StatusCode,
    replayed: bool,
    body: Bytes,
    cookie: Option<HeaderValue>,
}

async fn send(
    conn: &mut Conn,
    path: &str,
    key: Option<&str>,
    body: &'static [u8],
) -> Result<Answer, BoxError> {
    let mut request = Request::post(path)
        .header(HOST, "127.0.0.1")
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from_static(body)))?;
    let headers = request.headers_mut();
    if let Some(key) = key {
        headers.insert("idempotency-key", HeaderValue::from_str(key)?);
    }
    if let Some(cookie) = &conn.cookie {
        headers.insert(COOKIE, cookie.clone());
    }
    conn.sender.ready().await?;
    let response = conn.sender.send_request(request).await?;
    let status = response.status();
    let headers = response.headers();
    // Ours and the `idempotent` crate say `idempotent-replayed`, axum-idempotent
    // `idempotency-replayed`.
    let replayed =
        headers.contains_key("idempotent-replayed") || headers.contains_key("idempotency-replayed");
    let cookie = headers
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("session="))
        .and_then(|v| HeaderValue::from_str(v.split(';').next()?).ok());
    let body = response.into_body().collect().await?.to_bytes();
    Ok(Answer { status, replayed, body, cookie })
}

#[derive(Clone, Copy, PartialEq)]
enum Phase {
    First,
    Replay,
}

async fn measure(
    bare: bool,
    conns: Vec<Conn>,
    phase: Phase,
    tag: String,
    duration: Duration,
) -> (Vec<Conn>, Measured) {
    let start = Instant::now();
    let from = start + WARM_UP;
    let end = from + duration;
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(c, mut conn)| {
            let tag = tag.clone();
            tokio::spawn(async move {
                let mut histogram = histogram();
                let (mut requests, mut unexpected, mut first_unexpected) = (0u64, 0u64, None);
                let mut key = String::with_capacity(64);
                for seq in 0u64.. {
                    let sent = Instant::now();
                    if sent >= end {
                        break;
                    }
                    key.clear();
                    use std::fmt::Write;
                    match phase {
                        Phase::First => write!(key, "f-{tag}-{c}-{seq}"),
                        Phase::Replay => write!(key, "r-{tag}-{c}-{}", seq % REPLAY_KEYS as u64),
                    }
                    .expect("a key");
                    let answer = send(&mut conn, "/orders", Some(&key), BODY).await;
                    let took = sent.elapsed();
                    if sent < from {
                        continue;
                    }
                    requests += 1;
                    histogram.saturating_record(took.as_nanos() as u64);
                    let expected = match &answer {
                        // The bare handler replays nothing: every answer is a 201.
                        Ok(a) => {
                            a.status == StatusCode::CREATED
                                && (bare || a.replayed == (phase == Phase::Replay))
                        }
                        Err(_) => false,
                    };
                    if !expected {
                        unexpected += 1;
                        first_unexpected.get_or_insert_with(|| match &answer {
                            Ok(a) => format!(
                                "{} replayed={} {}",
                                a.status,
                                a.replayed,
                                String::from_utf8_lossy(&a.body[..a.body.len().min(120)])
                            ),
                            Err(e) => e.to_string(),
                        });
                        if answer.is_err() {
                            break;
                        }
                    }
                }
                (conn, requests, histogram, unexpected, first_unexpected)
            })
        })
        .collect();
    let mut conns = Vec::new();
    let mut total = Measured::empty();
    let mut total_requests = 0;
    for task in tasks {
        let (conn, requests, histogram, unexpected, first) = task.await.expect("a connection");
        conns.push(conn);
        total_requests += requests;
        total.add(&histogram, unexpected, first);
    }
    total.per_second = total_requests as f64 / duration.as_secs_f64();
    (conns, total)
}

/// Completes each connection's replay keys.
async fn prepare(conns: &mut [Conn], run: &str) -> Result<(), String> {
    for (c, conn) in conns.iter_mut().enumerate() {
        for i in 0..REPLAY_KEYS {
            let key = format!("r-{run}-{c}-{i}");
            let answer =
                send(conn, "/orders", Some(&key), BODY).await.map_err(|e| e.to_string())?;
            if answer.status != StatusCode::CREATED {
                return Err(format!("completing {key}: {}", answer.status));
            }
        }
    }
    Ok(())
}

async fn executions(conn: &mut Conn) -> Result<u64, BoxError> {
    let mut request = Request::get("/executions").header(HOST, "127.0.0.1").body(Full::default())?;
    if let Some(cookie) = &conn.cookie {
        request.headers_mut().insert(COOKIE, cookie.clone());
    }
    conn.sender.ready().await?;
    let response = conn.sender.send_request(request).await?;
    let body = response.into_body().collect().await?.to_bytes();
    Ok(std::str::from_utf8(&body)?.trim().parse()?)
}

/// What the semantic checks found for one row.
struct Semantics {
    duplicates: String,
    reused: String,
    no_key: String,
}

async fn semantics(addr: SocketAddr, run: &str) -> Result<Semantics, BoxError> {
    let mut probe = connect(addr).await?;
    // Ten concurrent duplicates of a 100 ms request, one session (the same client).
    let mut dups = Vec::new();
    for _ in 0..10 {
        let mut conn = connect(addr).await?;
        conn.cookie = probe.cookie.clone();
        dups.push(conn);
    }
    let before = executions(&mut probe).await?;
    let key = format!("dup-{run}");
    let tasks: Vec<_> = dups
        .into_iter()
        .map(|mut conn| {
            let key = key.clone();
            tokio::spawn(async move { send(&mut conn, "/slow-orders", Some(&key), BODY).await })
        })
        .collect();
    let mut statuses = std::collections::BTreeMap::<String, usize>::new();
    for task in tasks {
        let label = match task.await? {
            Ok(a) if a.replayed => format!("{} replayed", a.status.as_u16()),
            Ok(a) => a.status.as_u16().to_string(),
            Err(e) => format!("error {e}"),
        };
        *statuses.entry(label).or_default() += 1;
    }
    let ran = executions(&mut probe).await? - before;
    let answers: Vec<String> = statuses.iter().map(|(s, n)| format!("{n}× {s}")).collect();
    let duplicates = format!("executed {ran} of 10 times ({})", answers.join(", "));

    // The same key, a different body.
    let key = format!("reuse-{run}");
    let first = send(&mut probe, "/orders", Some(&key), BODY).await?;
    let before = executions(&mut probe).await?;
    let second = send(&mut probe, "/orders", Some(&key), OTHER_BODY).await?;
    let ran = executions(&mut probe).await? - before;
    let reused = if ran > 0 {
        format!("executed again ({})", second.status.as_u16())
    } else if second.status.is_success() && (second.replayed || second.body == first.body) {
        format!("replayed the first response ({})", second.status.as_u16())
    } else {
        format!("refused ({})", second.status.as_u16())
    };

    // No key at all.
    let before = executions(&mut probe).await?;
    let answer = send(&mut probe, "/orders", None, BODY).await?;
    let ran = executions(&mut probe).await? - before;
    let no_key = match ran {
        0 => format!("refused ({})", answer.status.as_u16()),
        _ => format!("executed unguarded ({})", answer.status.as_u16()),
    };
    Ok(Semantics { duplicates, reused, no_key })
}

fn flush_redis(url: &str) {
    let flushed = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .and_then(|mut c| redis::cmd("FLUSHDB").query::<()>(&mut c));
    if let Err(e) = flushed {
        eprintln!("flushing {url}: {e}");
    }
}

struct Running {
    row: Row,
    server: ServerProcess,
    conns: Option<Vec<Conn>>,
    first: Vec<Measured>,
    replay: Vec<Measured>,
    semantics: Option<Result<Semantics, String>>,
}

fn main() {
    let args = args();
    let run = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs()
    );
    let redis = std::env::var("IDEMCACHE_REDIS_URL").ok().filter(|v| !v.is_empty());
    if let Some(url) = &redis {
        flush_redis(url);
    }
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let mut skipped = Vec::new();
    let mut running = Vec::new();
    for row in rows(&run) {
        let row = match row {
            Ok(row) => row,
            Err((id, why)) => {
                skipped.push((id, why));
                continue;
            }
        };
        if !args.rows.is_empty() && !args.rows.iter().any(|o| o == row.id) {
            continue;
        }
        let server = match start(&row, args.server_threads) {
            Ok(server) => server,
            Err(why) => {
                skipped.push((row.id.to_owned(), why));
                continue;
            }
        };
        let conns = runtime.block_on(async {
            let mut conns = Vec::new();
            for _ in 0..args.connections {
                conns.push(connect(server.addr).await.map_err(|e| e.to_string())?);
            }
            prepare(&mut conns, &keys_of(&run, row.id)).await?;
            Ok::<_, String>(conns)
        });
        match conns {
            Ok(conns) => running.push(Running {
                row,
                server,
                conns: Some(conns),
                first: Vec::new(),
                replay: Vec::new(),
                semantics: None,
            }),
            Err(why) => skipped.push((row.id.to_owned(), why)),
        }
    }
    for (id, why) in &skipped {
        eprintln!("skipped {id}: {why}");
    }
    for round in 0..args.rounds {
        for r in running.iter_mut() {
            for phase in [Phase::First, Phase::Replay] {
                let conns = r.conns.take().expect("connections between phases");
                // Each row's keys its own: rows over one database share its records.
                let keys = keys_of(&run, r.row.id);
                let tag = match phase {
                    Phase::First => format!("{keys}-{round}"),
                    Phase::Replay => keys,
                };
                let (conns, measured) =
                    runtime.block_on(measure(r.row.id == "bare", conns, phase, tag, args.duration));
                eprintln!(
                    "round {round} {:>16} {:>6}: req {}",
                    r.row.id,
                    if phase == Phase::First { "first" } else { "replay" },
                    measured.progress(),
                );
                r.conns = Some(conns);
                match phase {
                    Phase::First => r.first.push(measured),
                    Phase::Replay => r.replay.push(measured),
                }
            }
        }
    }
    for r in running.iter_mut() {
        r.conns = None;
        r.semantics = Some(
            runtime
                .block_on(semantics(r.server.addr, &keys_of(&run, r.row.id)))
                .map_err(|e| e.to_string()),
        );
    }
    report(&args, &running, &skipped);
    drop(running);
    if let Some(url) = &redis {
        flush_redis(url);
    }
    let sqlite = std::env::temp_dir().join(format!("idemcache-http-load-{run}.db"));
    for suffix in ["", "-wal", "-shm"] {
        drop(std::fs::remove_file(format!("{}{suffix}", sqlite.display())));
    }
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

/// The prefix of a row's keys in this run.
fn keys_of(run: &str, row: &str) -> String {
    format!("{run}-{row}")
}

fn report(args: &Args, running: &[Running], skipped: &[(String, String)]) {
    let bare = running.iter().find(|r| r.row.id == "bare");
    println!(
        "\n{} keep-alive connections, closed loop, {} s per phase after {} ms not measured, \
         medians of {} interleaved rounds; server: a child process, {} tokio workers; client: \
         one thread. p50/p99/p99.9 of the median round.\n",
        args.connections,
        args.duration.as_secs_f64(),
        WARM_UP.as_millis(),
        args.rounds,
        args.server_threads
    );
    println!(
        "| | first executions req/s | p50 / p99 / p99.9 | replays req/s | p50 / p99 / p99.9 |"
    );
    println!("|---|---|---|---|---|");
    for r in running {
        let cell = |phase: Phase| {
            cells(r.rounds(phase), bare.filter(|_| r.row.id != "bare").map(|b| b.rounds(phase)))
        };
        let (first, first_lat) = cell(Phase::First);
        let (replay, replay_lat) = cell(Phase::Replay);
        println!("| {} | {first} | {first_lat} | {replay} | {replay_lat} |", r.row.title);
    }
    for (id, why) in skipped {
        println!("| {id}: skipped ({why}) | | | | |");
    }
    println!(
        "\nOurs against each peer on the same store (req/s ratio, first executions / replays):\n"
    );
    for ours in running.iter().filter(|r| r.row.ours && r.row.store != "-") {
        for peer in running.iter().filter(|p| !p.row.ours && p.row.store == ours.row.store) {
            let ratio =
                |a: &[Measured], b: &[Measured]| median(a).per_second / median(b).per_second;
            println!(
                "- {} / {}: {:.2}x / {:.2}x",
                ours.row.title,
                peer.row.title,
                ratio(&ours.first, &peer.first),
                ratio(&ours.replay, &peer.replay)
            );
        }
    }
    println!("\nSemantic checks, same run:\n");
    println!("| | 10 concurrent duplicates | same key, different body | no key |");
    println!("|---|---|---|---|");
    for r in running {
        match &r.semantics {
            Some(Ok(s)) => {
                println!("| {} | {} | {} | {} |", r.row.title, s.duplicates, s.reused, s.no_key)
            }
            Some(Err(e)) => println!("| {} | failed: {e} | | |", r.row.title),
            None => {}
        }
    }
    println!("\nEach round's req/s (first / replay):\n");
    for r in running {
        println!("- {}: {}", r.row.id, rounds_line(&r.first, &r.replay));
    }
}
