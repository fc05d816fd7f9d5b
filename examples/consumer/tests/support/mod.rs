//! What the consumer's tests share: the broker (RabbitMQ or NATS JetStream: a queue or
//! stream of their own, persistent messages published with confirms), the ledger's database (a SQLite file or a
//! PostgreSQL schema of their own), and the consumer as a real process whose output is
//! read line by line.
//!
//! Invariants: every wait has a deadline and fails with everything the consumers said
//! so far; nothing waits a fixed time for correctness (waits poll what a process printed
//! or what the database holds); everything a test creates (queue, file, schema) is
//! removed when its guard drops, even when the test fails.

#![allow(dead_code)] // each test file uses its part

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use idemcache::store::conformance::service_url;
use idemcache_postgres::tokio_postgres::{self, NoTls};
use idemcache_sqlite::rusqlite;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

/// How long any one wait may take before the test fails. Generous: CI runs the suites
/// of several packages on two cores at once.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// A name no other test, run or helper uses: `prefix-PID-N-NANOS`.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{}-{nanos}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The broker's URL, or `None` (the test is skipped, and says why on stderr).
pub fn amqp_url() -> Option<String> {
    service_url("IDEMCACHE_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
}

/// PostgreSQL's URL, or `None` (the PostgreSQL half is skipped, and says why).
pub fn postgres_url() -> Option<String> {
    service_url("IDEMCACHE_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
}

/// NATS's URL, or `None` (the JetStream half is skipped, and says why).
pub fn nats_url() -> Option<String> {
    service_url("IDEMCACHE_NATS_URL", "nats://127.0.0.1:4222")
}

/// A broker the tests publish to: RabbitMQ through a channel in confirm mode, or NATS
/// JetStream (each publish waits for the stream's ack).
pub enum Broker {
    Amqp { url: String, _connection: Connection, channel: Channel },
    JetStream { url: String, context: jetstream::Context },
}

impl Broker {
    /// RabbitMQ at `url`.
    pub async fn connect(url: &str) -> Broker {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| panic!("connecting to the broker at {url}: {e}"));
        let channel = connection.create_channel().await.expect("a channel");
        channel.confirm_select(ConfirmSelectOptions::default()).await.expect("confirm mode");
        Broker::Amqp { url: url.to_owned(), _connection: connection, channel }
    }

    /// NATS JetStream at `url`.
    pub async fn jetstream(url: &str) -> Broker {
        let client = async_nats::connect(url)
            .await
            .unwrap_or_else(|e| panic!("connecting to NATS at {url}: {e}"));
        Broker::JetStream { url: url.to_owned(), context: jetstream::new(client) }
    }

    /// Every broker whose URL is set: RabbitMQ, NATS JetStream.
    pub async fn every() -> Vec<Broker> {
        let mut brokers = Vec::new();
        if let Some(url) = amqp_url() {
            brokers.push(Broker::connect(&url).await);
        }
        if let Some(url) = nats_url() {
            brokers.push(Broker::jetstream(&url).await);
        }
        brokers
    }

    /// Its name, for a failure's message.
    pub fn name(&self) -> &'static str {
        match self {
            Broker::Amqp { .. } => "RabbitMQ",
            Broker::JetStream { .. } => "JetStream",
        }
    }

    /// A queue of this test's own, removed when the returned guard drops: a durable
    /// RabbitMQ queue (as the consumer declares it), or a JetStream stream holding one
    /// subject. The stream's duplicate window is the server's least, 100 ms, not the
    /// default 2 minutes: these tests are about the inbox, which must absorb the copies a
    /// window lets through (one published again after it), so the stream must not drop
    /// them first (see [`Broker::publish`]).
    pub async fn queue(&self) -> TestQueue {
        let name = unique("idemcache-consumer-test");
        match self {
            Broker::Amqp { url, channel, .. } => {
                let durable =
                    QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
                channel
                    .queue_declare(name.as_str().into(), durable, FieldTable::default())
                    .await
                    .expect("declaring the test's queue");
                TestQueue { name, broker: BrokerUrl::Amqp(url.clone()) }
            }
            Broker::JetStream { url, context } => {
                context
                    .create_stream(jetstream::stream::Config {
                        name: name.clone(),
                        subjects: vec![name.clone()],
                        duplicate_window: Duration::from_millis(100),
                        ..jetstream::stream::Config::default()
                    })
                    .await
                    .expect("creating the test's stream");
                TestQueue { name, broker: BrokerUrl::JetStream(url.clone()) }
            }
        }
    }

    /// Publishes a persistent message to `queue` and waits for the broker's confirm.
    /// Over JetStream, a copy the stream drops as a duplicate (its id published less
    /// than the 100 ms window ago) is published again until the window let it through:
    /// the copy must reach the consumer, as one published after the window would.
    pub async fn publish(&self, queue: &TestQueue, id: Option<&str>, body: &[u8]) {
        match self {
            Broker::Amqp { channel, .. } => {
                let mut properties = BasicProperties::default().with_delivery_mode(2);
                if let Some(id) = id {
                    properties = properties.with_message_id(id.into());
                }
                let confirm = channel
                    .basic_publish(
                        "".into(),
                        queue.name.as_str().into(),
                        BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() },
                        body,
                        properties,
                    )
                    .await
                    .expect("publishing")
                    .await
                    .expect("the publisher confirm");
                assert!(confirm.is_ack(), "the broker did not take message {id:?}: {confirm:?}");
                assert!(
                    confirm.take_message().is_none(),
                    "message {id:?} was not routed to {queue:?}"
                );
            }
            Broker::JetStream { context, .. } => {
                let deadline = Instant::now() + DEADLINE;
                loop {
                    let mut message =
                        jetstream::message::PublishMessage::build().payload(body.to_vec().into());
                    if let Some(id) = id {
                        message = message.message_id(id);
                    }
                    let ack = context
                        .send_publish(queue.name.clone(), message)
                        .await
                        .expect("publishing")
                        .await
                        .expect("the stream's ack");
                    if !ack.duplicate {
                        break;
                    }
                    assert!(Instant::now() < deadline, "the stream kept dropping {id:?}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    /// A payment `{"account": account, "amount": amount}` with id `id`.
    pub async fn pay(&self, queue: &TestQueue, id: &str, account: &str, amount: i64) {
        self.publish(queue, Some(id), payment(account, amount).as_bytes()).await;
    }

    /// Takes every message left in a RabbitMQ `queue` (none may be consumed meanwhile):
    /// each one's id (if any) and body.
    pub async fn drain(&self, queue: &TestQueue) -> Vec<(Option<String>, Vec<u8>)> {
        let Broker::Amqp { channel, .. } = self else {
            panic!("drain reads RabbitMQ queues only");
        };
        let mut left = Vec::new();
        while let Some(message) = channel
            .basic_get(queue.name.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            let id = message.delivery.properties.message_id().as_ref().map(|s| s.to_string());
            left.push((id, message.delivery.data));
        }
        left
    }

    /// The consumer's environment for `queue` over `ledger` as `consumer`, plus `extra`.
    /// Over JetStream, a delivery a killed consumer held comes back after 1 s.
    pub fn env(
        &self,
        queue: &TestQueue,
        ledger: &Ledger,
        consumer: &str,
        extra: &[(&'static str, &str)],
    ) -> Vec<(&'static str, String)> {
        let mut env = match self {
            Broker::Amqp { url, .. } => vec![("AMQP_URL", url.clone())],
            Broker::JetStream { url, .. } => vec![
                ("NATS_URL", url.clone()),
                ("STREAM", queue.name.clone()),
                ("ACK_WAIT_MS", "1000".to_owned()),
            ],
        };
        env.extend([
            ("QUEUE", queue.name.clone()),
            ("CONSUMER", consumer.to_owned()),
            ("DATABASE_URL", ledger.database_url()),
        ]);
        env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
        env
    }
}

/// A payment's body.
pub fn payment(account: &str, amount: i64) -> String {
    format!(r#"{{"account": "{account}", "amount": {amount}}}"#)
}

/// Where a test's queue lives, to remove it.
#[derive(Debug)]
enum BrokerUrl {
    Amqp(String),
    JetStream(String),
}

/// A queue (or stream) of one test, removed when dropped (from a thread of its own, so
/// that it also runs while a failing test unwinds inside its runtime).
#[derive(Debug)]
pub struct TestQueue {
    pub name: String,
    broker: BrokerUrl,
}

impl Drop for TestQueue {
    fn drop(&mut self) {
        let name = self.name.clone();
        let broker = match &self.broker {
            BrokerUrl::Amqp(url) => BrokerUrl::Amqp(url.clone()),
            BrokerUrl::JetStream(url) => BrokerUrl::JetStream(url.clone()),
        };
        let deleted = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                match broker {
                    BrokerUrl::Amqp(url) => {
                        let connection =
                            Connection::connect(&url, ConnectionProperties::default()).await?;
                        let channel = connection.create_channel().await?;
                        channel
                            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                            .await?;
                    }
                    BrokerUrl::JetStream(url) => {
                        let context = jetstream::new(async_nats::connect(&url).await?);
                        context.delete_stream(&name).await?;
                    }
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            })?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        })
        .join();
        if !matches!(deleted, Ok(Ok(()))) {
            eprintln!("could not delete the test queue {}: {deleted:?}", self.name);
        }
    }
}

/// Every pair of a broker whose URL is set and a ledger engine: what a test that should
/// hold over each runs once per pair.
pub async fn every_broker_and_ledger() -> Vec<(Arc<Broker>, Ledger)> {
    let mut pairs = Vec::new();
    for broker in Broker::every().await {
        let broker = Arc::new(broker);
        for ledger in Ledger::every().await {
            pairs.push((Arc::clone(&broker), ledger));
        }
    }
    pairs
}

/// Where the consumer keeps balances and its inbox: a SQLite file or a PostgreSQL
/// schema, of this test alone.
pub enum Ledger {
    Sqlite { path: PathBuf },
    Postgres { url: String, schema: String, admin: String },
}

impl Ledger {
    /// A fresh SQLite file in the temporary directory.
    pub fn sqlite() -> Ledger {
        Ledger::Sqlite { path: std::env::temp_dir().join(format!("{}.db", unique("ledger"))) }
    }

    /// A fresh schema in the database at `url`; the consumer reaches it through the
    /// URL's `options=-csearch_path=...`, so its `accounts` and inbox tables are this
    /// test's own.
    pub async fn postgres(url: &str) -> Ledger {
        let schema = unique("consumer_test").replace('-', "_");
        let client = pg_connect(url).await;
        client.batch_execute(&format!("CREATE SCHEMA {schema}")).await.expect("creating a schema");
        let separator = if url.contains('?') { '&' } else { '?' };
        Ledger::Postgres {
            url: format!("{url}{separator}options=-csearch_path%3D{schema}"),
            schema,
            admin: url.to_owned(),
        }
    }

    /// Both engines: SQLite always, PostgreSQL when its URL is set.
    pub async fn every() -> Vec<Ledger> {
        let mut ledgers = vec![Ledger::sqlite()];
        if let Some(url) = postgres_url() {
            ledgers.push(Ledger::postgres(&url).await);
        }
        ledgers
    }

    /// The consumer's `DATABASE_URL`.
    pub fn database_url(&self) -> String {
        match self {
            Ledger::Sqlite { path } => format!("sqlite:{}", path.display()),
            Ledger::Postgres { url, .. } => url.clone(),
        }
    }

    pub fn engine(&self) -> &'static str {
        match self {
            Ledger::Sqlite { .. } => "SQLite",
            Ledger::Postgres { .. } => "PostgreSQL",
        }
    }

    /// Every account's balance, as committed.
    pub async fn balances(&self) -> BTreeMap<String, i64> {
        let sql = "SELECT id, balance FROM accounts";
        match self {
            Ledger::Sqlite { path } => {
                let db = rusqlite::Connection::open(path).expect("opening the ledger");
                let mut statement = db.prepare(sql).expect("reading the accounts");
                let rows = statement
                    .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
                    .expect("reading the accounts");
                rows.map(|row| row.expect("an account row")).collect()
            }
            Ledger::Postgres { url, .. } => {
                let client = pg_connect(url).await;
                let rows = client.query(sql, &[]).await.expect("reading the accounts");
                rows.iter().map(|row| (row.get(0), row.get(1))).collect()
            }
        }
    }

    /// How many inbox records `consumer` has committed.
    pub async fn inbox_rows(&self, consumer: &str) -> i64 {
        match self {
            Ledger::Sqlite { path } => {
                let db = rusqlite::Connection::open(path).expect("opening the ledger");
                db.query_row(
                    "SELECT count(*) FROM idemcache_inbox WHERE consumer = ?1",
                    [consumer],
                    |row| row.get(0),
                )
                .expect("counting the inbox")
            }
            Ledger::Postgres { url, .. } => {
                let client = pg_connect(url).await;
                client
                    .query_one(
                        "SELECT count(*) FROM idemcache_inbox WHERE consumer = $1",
                        &[&consumer],
                    )
                    .await
                    .expect("counting the inbox")
                    .get(0)
            }
        }
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        match self {
            Ledger::Sqlite { path } => {
                for suffix in ["", "-wal", "-shm"] {
                    let mut file = path.clone().into_os_string();
                    file.push(suffix);
                    let _ = std::fs::remove_file(file);
                }
            }
            Ledger::Postgres { schema, admin, .. } => {
                let (name, admin) = (schema.clone(), admin.clone());
                let dropped = std::thread::spawn(move || {
                    let runtime =
                        tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                    runtime.block_on(async {
                        let (client, connection) = tokio_postgres::connect(&admin, NoTls).await?;
                        tokio::spawn(connection);
                        client.batch_execute(&format!("DROP SCHEMA {name} CASCADE")).await
                    })?;
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
                })
                .join();
                if !matches!(dropped, Ok(Ok(()))) {
                    eprintln!("could not drop the test schema {schema}: {dropped:?}");
                }
            }
        }
    }
}

async fn pg_connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to PostgreSQL: {e}"));
    tokio::spawn(connection);
    client
}

/// Which stream a line came on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Out,
    Err,
}

/// The consumer example, running as a process of its own.
pub struct Consumer {
    pub label: String,
    child: Child,
    lines: mpsc::Receiver<(Stream, String)>,
    /// Everything it printed so far, in order of arrival.
    pub seen: Vec<(Stream, String)>,
}

/// The consumer's binary, built by cargo before the tests (see the package's Cargo.toml).
const CONSUMER: &str = env!("CARGO_BIN_EXE_idemcache-consumer");

impl Consumer {
    /// Starts the consumer with `env` (on top of a clean set of its variables) and waits
    /// for `consuming QUEUE as CONSUMER`.
    pub async fn start(label: &str, env: &[(&str, String)]) -> Consumer {
        let mut command = Command::new(CONSUMER);
        for var in [
            "AMQP_URL",
            "NATS_URL",
            "STREAM",
            "ACK_WAIT_MS",
            "QUEUE",
            "CONSUMER",
            "DATABASE_URL",
            "PREFETCH",
            "APPLY_DELAY_MS",
            "ACK_DELAY_MS",
        ] {
            command.env_remove(var);
        }
        command.envs(env.iter().map(|(k, v)| (k, v))).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().unwrap_or_else(|e| panic!("starting {CONSUMER}: {e}"));
        let (send, lines) = mpsc::channel();
        let out = child.stdout.take().expect("piped stdout");
        let err = child.stderr.take().expect("piped stderr");
        for (stream, pipe) in [
            (Stream::Out, Box::new(out) as Box<dyn std::io::Read + Send>),
            (Stream::Err, Box::new(err)),
        ] {
            let send = send.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    if send.send((stream, line)).is_err() {
                        break;
                    }
                }
            });
        }
        let mut consumer = Consumer { label: label.to_owned(), child, lines, seen: Vec::new() };
        let var = |name: &str| env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone());
        let ready = format!(
            "consuming {} as {}",
            var("QUEUE").unwrap_or_else(|| "payments".into()),
            var("CONSUMER").unwrap_or_else(|| "ledger".into())
        );
        consumer.wait_for(Stream::Out, &ready).await;
        consumer
    }

    /// Takes what the process printed since the last look.
    fn pump(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
    }

    /// How many lines on `stream` are exactly `line`.
    pub fn count(&mut self, stream: Stream, line: &str) -> usize {
        self.pump();
        self.seen.iter().filter(|(s, l)| *s == stream && l == line).count()
    }

    /// The ids of every stdout line `WORD ID`.
    pub fn ids(&mut self, word: &str) -> Vec<String> {
        self.pump();
        let prefix = format!("{word} ");
        self.seen
            .iter()
            .filter(|(s, _)| *s == Stream::Out)
            .filter_map(|(_, l)| l.strip_prefix(&prefix).map(str::to_owned))
            .collect()
    }

    /// Waits until the process has printed `line` on `stream`.
    pub async fn wait_for(&mut self, stream: Stream, line: &str) {
        let what = format!("{stream:?} line {line:?}");
        wait_until(std::slice::from_mut(self), &what, |c| c[0].count(stream, line) > 0).await;
    }

    /// Kills the process with SIGKILL (`Child::kill` on Unix) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.pump();
    }

    /// Everything it printed, for a failure's message.
    pub fn transcript(&mut self) -> String {
        self.pump();
        let mut text = format!("--- {} ---\n", self.label);
        for (stream, line) in &self.seen {
            text.push_str(match stream {
                Stream::Out => "out: ",
                Stream::Err => "err: ",
            });
            text.push_str(line);
            text.push('\n');
        }
        text
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `consumers` until `done` holds, failing past [`DEADLINE`] or when one of them
/// exits, with everything they printed.
pub async fn wait_until(
    consumers: &mut [Consumer],
    what: &str,
    mut done: impl FnMut(&mut [Consumer]) -> bool,
) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if done(consumers) {
            return;
        }
        let exited = consumers.iter_mut().find_map(|c| match c.child.try_wait() {
            Ok(Some(status)) => Some(format!("{} exited ({status})", c.label)),
            _ => None,
        });
        if exited.is_some() || Instant::now() >= deadline {
            // A last look: the condition may have come true with the exit.
            if done(consumers) {
                return;
            }
            let why = exited.unwrap_or_else(|| format!("{DEADLINE:?} passed"));
            let transcripts: String = consumers.iter_mut().map(|c| c.transcript()).collect();
            panic!("waiting for {what}: {why}\n{transcripts}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
