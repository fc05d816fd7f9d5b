//! A TCP proxy that injects a fault into each connection in turn ([`Proxy`]), in front
//! of an HTTP/1 service (the client's tests) or an HTTP/2 one (the gRPC example's
//! client tests include this file).
//!
//! Invariant: the proxy forwards every request byte it is given to the service, so a
//! fault never keeps a request from executing: it only loses, cuts or delays the answer
//! on its way back, which is what a client cannot tell from the request never arriving.
//! The answer begins at the service's first byte over HTTP/1, and at its first frame of
//! a stream over HTTP/2: the connection's own frames before it (SETTINGS, PING,
//! WINDOW_UPDATE, on stream 0) pass, or the client could not send its request at all.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does to one connection's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forwards it whole.
    Pass,
    /// Forwards the request, waits for the answer's first bytes (the service has
    /// executed), then closes the client's connection without them.
    DropResponse,
    /// Forwards the answer's first bytes, then resets the connection (RST).
    ResetMidResponse,
    /// Holds the answer this long, then forwards it (past a client's timeout).
    Delay(Duration),
}

/// A TCP proxy to one upstream: each new connection takes the next scripted fault
/// ([`Fault::Pass`] once the script is spent).
#[derive(Clone)]
pub struct Proxy {
    pub addr: SocketAddr,
    faults: Arc<Mutex<VecDeque<Fault>>>,
    connections: Arc<AtomicU64>,
}

impl Proxy {
    /// A proxy to the HTTP/1 service at `upstream`, on a free port of 127.0.0.1.
    pub async fn to(upstream: SocketAddr) -> Proxy {
        Proxy::start(upstream, false).await
    }

    /// A proxy to the HTTP/2 (gRPC) service at `upstream`, on a free port of 127.0.0.1.
    pub async fn h2(upstream: SocketAddr) -> Proxy {
        Proxy::start(upstream, true).await
    }

    async fn start(upstream: SocketAddr, h2: bool) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Proxy {
            addr: listener.local_addr().unwrap(),
            faults: Arc::default(),
            connections: Arc::default(),
        };
        let serving = proxy.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { return };
                serving.connections.fetch_add(1, Ordering::SeqCst);
                let fault = serving.faults.lock().unwrap().pop_front().unwrap_or(Fault::Pass);
                tokio::spawn(relay(client, upstream, fault, h2));
            }
        });
        proxy
    }

    /// Scripts the next connections' faults, in order.
    pub fn script(&self, faults: impl IntoIterator<Item = Fault>) {
        self.faults.lock().unwrap().extend(faults);
    }

    /// How many connections it accepted.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Of the service's bytes `read` so far: how many lead the answer and pass (HTTP/2's
/// whole frames on stream 0), and whether the answer starts right after them.
fn before_answer(read: &[u8], h2: bool) -> (usize, bool) {
    if !h2 {
        return (0, !read.is_empty());
    }
    let mut at = 0;
    while let Some(header) = read.get(at..at + 9) {
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & !(1 << 31);
        if stream != 0 {
            return (at, true);
        }
        let len =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        if read.len() < at + 9 + len {
            break;
        }
        at += 9 + len;
    }
    (at, false)
}

/// One connection through the proxy, under `fault`.
async fn relay(client: TcpStream, upstream: SocketAddr, fault: Fault, h2: bool) {
    let Ok(server) = TcpStream::connect(upstream).await else { return };
    if fault == Fault::ResetMidResponse {
        // Closed with linger 0: the kernel sends RST, not FIN (a drop that does not
        // block: the socket is non-blocking).
        let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
    }
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let upward = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_client, &mut to_server).await;
    });
    // Up to the answer's first bytes: what leads it passes.
    let mut read = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let (pass, answer) = before_answer(&read, h2);
        if to_client.write_all(&read[..pass]).await.is_err() {
            break;
        }
        read.drain(..pass);
        if answer {
            match fault {
                Fault::Pass => {
                    let _ = to_client.write_all(&read).await;
                    let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                }
                Fault::DropResponse => {}
                Fault::ResetMidResponse => {
                    let _ = to_client.write_all(&read[..read.len() / 2]).await;
                }
                Fault::Delay(by) => {
                    tokio::time::sleep(by).await;
                    let _ = to_client.write_all(&read).await;
                    let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                }
            }
            break;
        }
        match from_server.read(&mut buf).await {
            Ok(n) if n > 0 => read.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    upward.abort();
    // Dropping both halves of the client's stream closes it (or resets it).
    drop(to_client);
}

/// An address nothing listens on: a connection to it is refused.
pub fn nowhere() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}
