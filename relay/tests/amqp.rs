//! The RabbitMQ publisher against a real broker (`IDEMCACHE_AMQP_URL`), reached through
//! a TCP proxy the test cuts: once its connection is gone, the relay publishes again by
//! itself, with no restart. (Before, every later publish failed with "invalid channel
//! state" until each row was dead, the relay alive, so no supervisor restarted it.)

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use idemcache_relay::AmqpPublisher;
use idemcache_sql::outbox::testing::HandClock;
use idemcache_sql::outbox::{relay_batch, OutboxMessage, RelaySettings};
use idemcache_sqlite::outbox::{self, Storage};
use idemcache_sqlite::rusqlite::{Connection, TransactionBehavior};
use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::ConnectionProperties;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

fn amqp_url() -> Option<String> {
    idemcache::store::conformance::service_url(
        "IDEMCACHE_AMQP_URL",
        "amqp://guest:guest@127.0.0.1:5672/%2f",
    )
}

/// A TCP proxy to `upstream` whose open connections can all be cut at once (new ones
/// are still accepted): a network cut the broker recovers from at once.
struct Proxy {
    port: u16,
    open: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accepting: JoinHandle<()>,
}

impl Proxy {
    async fn to(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let tracked = open.clone();
        let accepting = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                tracked.lock().unwrap().push(tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                }));
            }
        });
        Proxy { port, open, accepting }
    }

    /// Closes every connection through the proxy.
    fn cut(&self) {
        for connection in self.open.lock().unwrap().drain(..) {
            connection.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accepting.abort();
    }
}

/// `url` with its host and port replaced by 127.0.0.1:`port`.
fn through(url: &str, port: u16) -> (String, String) {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (credentials, rest) = rest.rsplit_once('@').map_or(("", rest), |(c, r)| (c, r));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let at = if credentials.is_empty() { String::new() } else { format!("{credentials}@") };
    (format!("{scheme}://{at}127.0.0.1:{port}/{path}"), authority.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_AMQP_URL"]
async fn after_its_connection_is_cut_the_relay_publishes_again_by_itself() {
    let Some(amqp) = amqp_url() else { return };
    let (_, upstream) = through(&amqp, 0);
    let proxy = Proxy::to(upstream).await;
    let (proxied, _) = through(&amqp, proxy.port);
    let name = format!("idemcache-relay-cut-{}", std::process::id());
    let direct = lapin::Connection::connect(&amqp, ConnectionProperties::default()).await.unwrap();
    let channel = direct.create_channel().await.unwrap();
    let _ = channel.queue_delete(name.as_str().into(), QueueDeleteOptions::default()).await;
    channel
        .queue_declare(name.as_str().into(), QueueDeclareOptions::default(), FieldTable::default())
        .await
        .unwrap();

    let conn = Connection::open_in_memory().unwrap();
    outbox::ensure_schema(&conn).unwrap();
    let storage = Storage::new(conn);
    let enqueue = |id: &str| {
        let mut db = storage.connection();
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
        outbox::enqueue(&tx, &OutboxMessage::new(id, name.clone(), "{}")).unwrap();
        tx.commit().unwrap();
    };
    let publisher = AmqpPublisher::connect(&proxied).await.unwrap();
    let settings = RelaySettings::default();
    let clock = HandClock::at(SystemTime::now());
    let mut now = || clock.now();

    enqueue("before");
    let report = relay_batch(&storage, &publisher, &settings, &mut now).await.unwrap();
    assert_eq!(report.delivered, 1, "{report:?}");

    proxy.cut();
    enqueue("after");
    // The first publish after the cut may still find the old channel open and fail
    // (retried after its backoff, which the hand clock skips); the next reconnects.
    let mut delivered = 0;
    for _ in 0..3 {
        let report = relay_batch(&storage, &publisher, &settings, &mut now).await.unwrap();
        delivered += report.delivered;
        if delivered == 1 {
            break;
        }
        clock.advance(Duration::from_secs(60));
    }
    assert_eq!(delivered, 1, "the row enqueued after the cut was never delivered");

    let mut ids = Vec::new();
    while let Some(got) =
        channel.basic_get(name.as_str().into(), BasicGetOptions { no_ack: true }).await.unwrap()
    {
        ids.push(got.delivery.properties.message_id().as_ref().unwrap().to_string());
    }
    assert_eq!(ids, ["before", "after"]);
    channel.queue_delete(name.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
}
