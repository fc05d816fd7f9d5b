//! A RabbitMQ or NATS JetStream consumer that applies payment messages exactly once,
//! through the inbox.
//!
//! ```sh
//! DATABASE_URL=sqlite:/tmp/ledger.db cargo run -p idemcache-consumer --example consumer
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p idemcache-consumer --example consumer
//! NATS_URL=nats://127.0.0.1:4222 DATABASE_URL=sqlite:/tmp/ledger.db cargo run -p idemcache-consumer --example consumer
//! ```
//!
//! Each message is a payment: its id is the AMQP `message_id` property (JetStream: the
//! `Nats-Msg-Id` header, which the outbox relay sets to the row's id), its body the JSON
//! `{"account": "a1", "amount": 5}`, and its effect `balance = balance + amount` on the
//! account's row of `accounts(id TEXT PRIMARY KEY, balance BIGINT NOT NULL)` (the row is
//! created at the first payment). The effect is deliberately not idempotent: only the
//! inbox keeps a redelivered or republished payment from being counted twice.
//!
//! The rule it keeps, for every delivery:
//!
//! 1. open a transaction on the ledger's database;
//! 2. `receive(&tx, consumer, message_id, fingerprint)`: a claiming `INSERT` into the
//!    inbox, keyed by (consumer, message id);
//! 3. on `New`, apply the payment in the same transaction and commit;
//! 4. only then acknowledge the delivery.
//!
//! Invariant: a delivery is acknowledged only after the transaction holding its inbox
//! row committed, or when the inbox says a committed row holds its id (a duplicate, a
//! mismatch); one that can never apply is rejected, anything else requeued. The inbox
//! row and the balance commit together or not at all, and the broker forgets the
//! message only after both did. So, with the queue durable and messages persistent:
//!
//! | failure | what happens |
//! |---|---|
//! | the process dies before the commit (`kill -9`, a crash, a lost database) | nothing was committed; the broker redelivers the unacknowledged message (RabbitMQ when the connection drops, JetStream once `ACK_WAIT_MS` passed) and it is applied once |
//! | it dies between the commit and the ack | the broker redelivers; the inbox answers `Duplicate`: acknowledged, not applied again |
//! | it dies after the ack | the message is gone from the queue; nothing to redo |
//! | the publisher sends a message twice (a retry after a lost confirm) | the second copy is a `Duplicate` |
//! | a transaction outlives JetStream's `ACK_WAIT_MS` | the server redelivers the message to another instance (or this one) while the first transaction is open: answered as the next row says, then applied once |
//! | two consumers (processes) on one queue over one database get copies of one message | one applies it; the other gets `Duplicate` after its commit; while the first's transaction is open, PostgreSQL answers the other `InFlight` at once (rolled back, requeued) and SQLite makes it wait for the write lock (up to its 10 s busy timeout; past it, a database error: requeued) |
//! | the same id arrives with another body | `Mismatch`: never applied, acknowledged, logged |
//!
//! What it does not protect: consumers over *different* databases (each inbox knows only
//! its own commits, so each applies the message once); an effect outside the transaction
//! (an email, an HTTP call: it may run again after a crash before the commit); an inbox
//! row deleted while the broker can still redeliver its message (keep rows at least as
//! long as the broker's redelivery horizon); a consumer name shared by two programs that
//! mean different things by a message (the inbox is keyed by consumer *and* message id:
//! give each program its own `CONSUMER`).
//!
//! Environment:
//! - `AMQP_URL`: the broker (default `amqp://guest:guest@127.0.0.1:5672/%2f`); plain
//!   `amqp://` only, as this example is built without a TLS stack.
//! - `NATS_URL`: consume NATS JetStream at this server (`nats://host:port`) instead of
//!   RabbitMQ.
//! - `QUEUE`: the queue consumed (default `payments`), declared durable if absent; over
//!   JetStream, the subject consumed.
//! - `STREAM` (JetStream only): the stream that holds the subject (default `PAYMENTS`),
//!   created holding `QUEUE` if absent (file storage, the server's default duplicate
//!   window of 2 minutes).
//! - `CONSUMER`: this consumer's name in the inbox (default `ledger`). Instances of one
//!   program share it, so that they apply each message once between them. Over
//!   JetStream it also names the durable pull consumer (explicit acks) they share, so it
//!   may not hold `.`, `*`, `>`, `/`, `\` or white space there (refused at start). A
//!   durable consumer of that name that exists for another subject, or without explicit
//!   acks, is refused too (exit status 1), never consumed.
//! - `ACK_WAIT_MS` (JetStream only): how long the server waits for a delivery's ack
//!   before it redelivers it (default 30000), set when the durable consumer is created.
//!   A process that died holds its deliveries that long; keep it above the longest
//!   transaction, or a delivery still being applied is redelivered (and answered by the
//!   inbox, as the table says).
//! - `DATABASE_URL` (required): `sqlite:PATH` or `postgres://user@host:port/db`. The
//!   `accounts` table and the inbox's schema are created at start if absent.
//! - `PREFETCH`: how many unacknowledged deliveries the broker may hand this consumer
//!   at once (default 10, 1..=65535): RabbitMQ's prefetch, JetStream's pull batch.
//!   Deliveries are handled one at a time, in order.
//! - `APPLY_DELAY_MS`: sleep this long inside the transaction, after the payment is
//!   applied and before the commit (default 0): a window to kill it before the commit.
//! - `ACK_DELAY_MS`: sleep this long after the commit (and the `applied` line), before the
//!   ack (default 0): a window to kill it between the commit and the ack.
//!
//! Output. Standard output, one line each, flushed at once: `consuming QUEUE as CONSUMER`
//! once the queue (JetStream: the stream and the durable consumer) is declared and the
//! consumer registered; then per delivery `applied ID`
//! (committed; acknowledged next), `duplicate ID` or `mismatch ID` (acknowledged).
//! Standard error: `applying ID` when a new message's transaction has claimed it (the
//! payment is uncommitted until `applied ID`), `rejected (no message id)` and
//! `rejected ID: REASON` (a body that is not a payment, or an amount that would overflow
//! the balance: rejected without requeue, so the broker drops or dead-letters it),
//! `mismatch ID: ...`, `in flight ID: ...` (another consumer's transaction holds the id:
//! rolled back and requeued after a short pause) and `error ID: ...` (a database error:
//! rolled back and requeued after a short pause, never acknowledged).
//!
//! An acknowledgement is sent and, over JetStream, confirmed by the server (a double ack)
//! before the next delivery is handled: one whose confirmation fails is logged as
//! `error ID: ...` and comes back after `ACK_WAIT_MS` as a duplicate.
//!
//! Exit status: 1, with one line `error: ...` on standard error, when the broker or the
//! database cannot be reached or configured at start, the broker connection is lost
//! (JetStream: a pull request fails), or
//! the database connection is lost (the unacknowledged deliveries go back to the queue).
//! Stopping it at any instant (Ctrl-C, `kill -9`) is one of the failures above: it needs
//! no graceful shutdown.

use std::convert::Infallible;
use std::io::Write;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use futures_util::StreamExt;
use idemcache::Fingerprint;
use idemcache_postgres::tokio_postgres::{self, error::SqlState, NoTls};
use idemcache_sql::inbox::{InboxError, Receipt};
use idemcache_sqlite::rusqlite::{self, TransactionBehavior};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use serde::Deserialize;

/// How long a delivery that could not be settled (in flight elsewhere, a database error)
/// waits before it goes back to the queue: without it, a consumer alone on the queue
/// would take it straight back and spin while the other transaction is open.
const REQUEUE_PAUSE: Duration = Duration::from_millis(100);

/// How long a JetStream pull request waits for deliveries before the next is sent.
const JETSTREAM_PULL_EXPIRES: Duration = Duration::from_secs(5);

/// The consumer's settings, read once from the environment.
struct Config {
    amqp_url: String,
    /// Consume JetStream at this server instead of RabbitMQ.
    nats_url: Option<String>,
    queue: String,
    /// The JetStream stream holding `queue`.
    stream: String,
    consumer: String,
    database_url: String,
    prefetch: u16,
    apply_delay: Duration,
    ack_delay: Duration,
    /// JetStream's wait for an ack before it redelivers.
    ack_wait: Duration,
}

impl Config {
    fn from_env() -> Result<Config, String> {
        let text = |name: &str, default: &str| match std::env::var(name) {
            Ok(value) if !value.is_empty() => Ok(value),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(default.to_owned()),
            Err(std::env::VarError::NotUnicode(_)) => Err(format!("{name} is not UTF-8")),
        };
        let millis = |name: &str, default: &str| -> Result<Duration, String> {
            let value = text(name, default)?;
            value.parse().map(Duration::from_millis).map_err(|_| {
                format!("{name} must be a whole number of milliseconds, got {value:?}")
            })
        };
        let prefetch = text("PREFETCH", "10")?;
        let prefetch = match prefetch.parse::<u16>() {
            // 0 would be "no limit" to the broker, not a prefetch of none.
            Ok(n) if n > 0 => n,
            _ => {
                return Err(format!(
                    "PREFETCH must be a whole number in 1..=65535, got {prefetch:?}"
                ))
            }
        };
        let consumer = text("CONSUMER", "ledger")?;
        idemcache_sql::inbox::check(&consumer, "a message id")
            .map_err(|e| format!("CONSUMER {consumer:?} is refused: {e}"))?;
        let database_url = text("DATABASE_URL", "")?;
        if database_url.is_empty() {
            return Err("set DATABASE_URL: sqlite:PATH or postgres://user@host:port/db".into());
        }
        let nats_url = text("NATS_URL", "")?;
        // JetStream refuses these in a consumer's name, but says so only as a timeout.
        if !nats_url.is_empty() {
            if let Some(c) = consumer
                .chars()
                .find(|c| matches!(c, '.' | '*' | '>' | '/' | '\\') || c.is_whitespace())
            {
                return Err(format!(
                    "CONSUMER {consumer:?} is refused: it names the JetStream consumer, \
                     which may not hold {c:?}"
                ));
            }
        }
        let ack_wait = millis("ACK_WAIT_MS", "30000")?;
        if ack_wait.is_zero() {
            // Zero would be the server's default (30 s), not "redeliver at once".
            return Err("ACK_WAIT_MS must be at least 1".into());
        }
        Ok(Config {
            amqp_url: text("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")?,
            nats_url: (!nats_url.is_empty()).then_some(nats_url),
            queue: text("QUEUE", "payments")?,
            stream: text("STREAM", "PAYMENTS")?,
            consumer,
            database_url,
            prefetch,
            apply_delay: millis("APPLY_DELAY_MS", "0")?,
            ack_delay: millis("ACK_DELAY_MS", "0")?,
            ack_wait,
        })
    }
}

/// A message's body.
#[derive(Debug, Deserialize)]
struct Payment {
    account: String,
    amount: i64,
}

/// What the ledger made of a payment; each is settled with the broker differently.
#[derive(Debug)]
enum Outcome {
    /// New: applied and committed with its inbox row.
    Applied,
    /// Committed before (by this consumer or another instance): nothing done.
    Duplicate,
    /// The id was committed with another body: nothing done.
    Mismatch,
    /// Another transaction holds the id, uncommitted: rolled back, try again later.
    InFlight,
}

/// Why a payment was neither applied nor found settled.
#[derive(Debug)]
enum Failure {
    /// It can never apply (the balance would overflow, the inbox refuses the id):
    /// rejected without requeue.
    Refused(String),
    /// The database failed; the transaction rolled back. Requeued: another try may work.
    Database(String),
}

impl From<rusqlite::Error> for Failure {
    fn from(e: rusqlite::Error) -> Self {
        Failure::Database(e.to_string())
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Database(one_line(&e))
    }
}

impl From<InboxError> for Failure {
    fn from(e: InboxError) -> Self {
        match e {
            // The consumer name was checked at start, so it is the message id (one
            // holding a NUL character): no redelivery will make it acceptable.
            InboxError::InvalidInput(_) => Failure::Refused(e.to_string()),
            // A record that cannot be read: whether the message was applied is unknown,
            // so it is neither applied nor dropped, but requeued until someone fixes it.
            _ => Failure::Database(one_line(&e)),
        }
    }
}

/// The database that holds the balances and the inbox.
enum Ledger {
    /// One connection, used from blocking tasks (rusqlite is synchronous).
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
    Postgres(tokio_postgres::Client),
}

const SQLITE_ACCOUNTS: &str =
    "CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL)";

/// The payment, as one upsert. SQLite turns an integer overflow into a REAL, so the
/// statement returns the new balance's type: anything but `integer` is an overflow.
const SQLITE_APPLY: &str = "INSERT INTO accounts (id, balance) VALUES (?1, ?2)
     ON CONFLICT (id) DO UPDATE SET balance = balance + excluded.balance
     RETURNING typeof(balance)";

const POSTGRES_ACCOUNTS: &str =
    "CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL)";

/// The payment, as one upsert; PostgreSQL refuses an overflow (SQLSTATE 22003).
const POSTGRES_APPLY: &str = "INSERT INTO accounts (id, balance) VALUES ($1, $2)
     ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + EXCLUDED.balance";

/// Serializes `CREATE TABLE IF NOT EXISTS accounts` across consumers starting at once
/// (two concurrent creations of one table can fail in PostgreSQL's catalog).
const POSTGRES_SCHEMA_LOCK: i64 = 0x6964_656d_6163_6374; // "idemacct"

impl Ledger {
    async fn open(url: &str) -> Result<Ledger, String> {
        if let Some(path) = url.strip_prefix("sqlite:") {
            let path = path.to_owned();
            let opened = tokio::task::spawn_blocking(move || open_sqlite(&path))
                .await
                .map_err(|e| format!("opening SQLite: {e}"))??;
            Ok(Ledger::Sqlite(Arc::new(Mutex::new(opened))))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            open_postgres(url).await.map(Ledger::Postgres)
        } else {
            Err("DATABASE_URL must be sqlite:PATH or postgres://user@host:port/db".into())
        }
    }

    /// Receives the payment `id` in a transaction, applies it if it is new and commits.
    /// Prints `applying ID` once the transaction holds a new message.
    async fn apply(
        &mut self,
        config: &Config,
        id: &str,
        payment: Payment,
        fingerprint: Fingerprint,
    ) -> Result<Outcome, Failure> {
        match self {
            Ledger::Sqlite(db) => {
                let db = Arc::clone(db);
                let consumer = config.consumer.clone();
                let id = id.to_owned();
                let delay = config.apply_delay;
                tokio::task::spawn_blocking(move || {
                    // A panic of another holder of the lock cannot leave the connection
                    // inside a transaction (a Transaction rolls back when dropped).
                    let mut db = db.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    apply_sqlite(&mut db, &consumer, &id, &payment, fingerprint, delay)
                })
                .await
                .map_err(|e| Failure::Database(format!("the SQLite task failed: {e}")))?
            }
            Ledger::Postgres(client) => {
                apply_postgres(client, config, id, &payment, fingerprint).await
            }
        }
    }

    /// True when the database connection is gone for good (PostgreSQL's; SQLite's is a
    /// file, never lost).
    fn lost(&self) -> bool {
        match self {
            Ledger::Sqlite(_) => false,
            Ledger::Postgres(client) => client.is_closed(),
        }
    }
}

fn open_sqlite(path: &str) -> Result<rusqlite::Connection, String> {
    if path.is_empty() {
        return Err("DATABASE_URL sqlite: names no file (sqlite:PATH)".into());
    }
    let failed = |e: rusqlite::Error| format!("cannot open the SQLite database {path:?}: {e}");
    let db = rusqlite::Connection::open(path).map_err(failed)?;
    // Several consumers may share the file: WAL lets readers run beside the writer, and
    // the busy timeout makes a writer wait for the lock instead of failing at once.
    db.pragma_update(None, "journal_mode", "WAL").map_err(failed)?;
    db.busy_timeout(Duration::from_secs(10)).map_err(failed)?;
    db.execute_batch(SQLITE_ACCOUNTS).map_err(failed)?;
    idemcache_sqlite::inbox::ensure_schema(&db)
        .map_err(|e| format!("cannot create the inbox in {path:?}: {}", one_line(&e)))?;
    Ok(db)
}

async fn open_postgres(url: &str) -> Result<tokio_postgres::Client, String> {
    let (mut client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|e| format!("cannot connect to PostgreSQL (DATABASE_URL): {}", one_line(&e)))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            let _ = writeln!(std::io::stderr(), "PostgreSQL connection lost: {}", one_line(&e));
        }
    });
    let failed = |e: tokio_postgres::Error| format!("cannot create the schema: {}", one_line(&e));
    let tx = client.transaction().await.map_err(failed)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&POSTGRES_SCHEMA_LOCK])
        .await
        .map_err(failed)?;
    tx.batch_execute(POSTGRES_ACCOUNTS).await.map_err(failed)?;
    tx.commit().await.map_err(failed)?;
    // Takes no lock when the inbox exists: a consumer starting while another applies a
    // payment does not wait for that commit.
    idemcache_postgres::inbox::ensure_schema(&client)
        .await
        .map_err(|e| format!("cannot create the inbox: {}", one_line(&e)))?;
    Ok(client)
}

fn apply_sqlite(
    db: &mut rusqlite::Connection,
    consumer: &str,
    id: &str,
    payment: &Payment,
    fingerprint: Fingerprint,
    delay: Duration,
) -> Result<Outcome, Failure> {
    // IMMEDIATE: the write lock first, so the inbox's claim and the payment cannot be
    // split by another connection.
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Every early return drops `tx`: rolled back, nothing kept.
    if let Some(settled) =
        settled(idemcache_sqlite::inbox::receive(&tx, consumer, id, fingerprint)?)
    {
        return Ok(settled);
    }
    announce_applying(id);
    let balance_type: String =
        tx.query_row(SQLITE_APPLY, rusqlite::params![payment.account, payment.amount], |row| {
            row.get(0)
        })?;
    if balance_type != "integer" {
        return Err(overflow(payment));
    }
    std::thread::sleep(delay);
    tx.commit()?;
    Ok(Outcome::Applied)
}

async fn apply_postgres(
    client: &mut tokio_postgres::Client,
    config: &Config,
    id: &str,
    payment: &Payment,
    fingerprint: Fingerprint,
) -> Result<Outcome, Failure> {
    // READ COMMITTED, PostgreSQL's default, as the inbox asks: its read after a conflict
    // sees the record the conflict found.
    let tx = client.transaction().await?;
    // Every early return drops `tx`: rolled back, nothing kept.
    let receipt =
        idemcache_postgres::inbox::receive(&tx, &config.consumer, id, fingerprint).await?;
    if let Some(settled) = settled(receipt) {
        return Ok(settled);
    }
    announce_applying(id);
    match tx.execute(POSTGRES_APPLY, &[&payment.account, &payment.amount]).await {
        Ok(_) => {}
        Err(e) if e.code() == Some(&SqlState::NUMERIC_VALUE_OUT_OF_RANGE) => {
            return Err(overflow(payment))
        }
        Err(e) => return Err(e.into()),
    }
    tokio::time::sleep(config.apply_delay).await;
    tx.commit().await?;
    Ok(Outcome::Applied)
}

/// `None` for a new message (apply it); otherwise what the inbox says was settled.
fn settled(receipt: Receipt) -> Option<Outcome> {
    match receipt {
        Receipt::New => None,
        Receipt::Duplicate => Some(Outcome::Duplicate),
        Receipt::Mismatch => Some(Outcome::Mismatch),
        Receipt::InFlight => Some(Outcome::InFlight),
    }
}

fn overflow(payment: &Payment) -> Failure {
    Failure::Refused(format!(
        "adding {} to account {:?} would overflow its balance",
        payment.amount, payment.account
    ))
}

fn announce_applying(id: &str) {
    let _ = writeln!(std::io::stderr(), "applying {id}");
}

/// One line on standard output, flushed now: a test or a pipe reads it as it happens.
/// Write errors are ignored: a reader that went away must not stop the ledger.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// One line on standard error (unbuffered).
fn log(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// An error and its causes on one line.
fn one_line(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

/// A delivery from either broker, settled with the one it came from.
enum Delivery {
    Amqp(lapin::message::Delivery),
    JetStream(jetstream::Message),
}

impl Delivery {
    /// The message id, if it has a non-empty one: AMQP's `message_id` property,
    /// JetStream's `Nats-Msg-Id` header.
    fn message_id(&self) -> Option<String> {
        let id = match self {
            Delivery::Amqp(delivery) => delivery.properties.message_id().as_ref()?.as_str(),
            Delivery::JetStream(message) => jetstream_id(message)?,
        };
        (!id.is_empty()).then(|| id.to_owned())
    }

    /// The message's body.
    fn body(&self) -> &[u8] {
        match self {
            Delivery::Amqp(delivery) => &delivery.data,
            Delivery::JetStream(message) => &message.payload,
        }
    }
}

/// Handles one delivery to the end: applied and acknowledged, acknowledged, rejected or
/// requeued. An `Err` is the broker lost (or the database lost): the caller exits, and
/// the broker requeues whatever was not acknowledged.
async fn handle(config: &Config, ledger: &mut Ledger, delivery: Delivery) -> Result<(), String> {
    let Some(id) = delivery.message_id() else {
        log("rejected (no message id)");
        return settle(&delivery, Settle::Reject).await;
    };
    let payment = match serde_json::from_slice::<Payment>(delivery.body()) {
        Ok(payment) if !payment.account.is_empty() => payment,
        Ok(_) => {
            log(&format!("rejected {id}: the account is empty"));
            return settle(&delivery, Settle::Reject).await;
        }
        Err(e) => {
            log(&format!(
                "rejected {id}: the body is not {{\"account\": string, \"amount\": integer}}: {e}"
            ));
            return settle(&delivery, Settle::Reject).await;
        }
    };
    let fingerprint = Fingerprint::of(delivery.body());
    match ledger.apply(config, &id, payment, fingerprint).await {
        Ok(Outcome::Applied) => {
            say(&format!("applied {id}"));
            tokio::time::sleep(config.ack_delay).await;
            settle(&delivery, Settle::Ack).await
        }
        Ok(Outcome::Duplicate) => {
            say(&format!("duplicate {id}"));
            settle(&delivery, Settle::Ack).await
        }
        Ok(Outcome::Mismatch) => {
            say(&format!("mismatch {id}"));
            log(&format!("mismatch {id}: this id was applied with another body; not applied"));
            settle(&delivery, Settle::Ack).await
        }
        Ok(Outcome::InFlight) => {
            log(&format!("in flight {id}: another consumer's transaction holds it; requeued"));
            tokio::time::sleep(REQUEUE_PAUSE).await;
            settle(&delivery, Settle::Requeue).await
        }
        Err(Failure::Refused(why)) => {
            log(&format!("rejected {id}: {why}"));
            settle(&delivery, Settle::Reject).await
        }
        Err(Failure::Database(why)) => {
            log(&format!("error {id}: {why}; rolled back, requeued"));
            if ledger.lost() {
                // Not acknowledged: the broker requeues it when this process goes.
                return Err("lost the PostgreSQL connection".into());
            }
            tokio::time::sleep(REQUEUE_PAUSE).await;
            settle(&delivery, Settle::Requeue).await
        }
    }
}

/// How a delivery is answered to the broker.
#[derive(Clone, Copy, Debug)]
enum Settle {
    /// Done with: the broker forgets it.
    Ack,
    /// Never applicable: dropped (or dead-lettered), not redelivered.
    Reject,
    /// Not settled: back to the queue, for this consumer or another.
    Requeue,
}

async fn settle(delivery: &Delivery, how: Settle) -> Result<(), String> {
    let delivery = match delivery {
        Delivery::Amqp(delivery) => delivery,
        Delivery::JetStream(message) => {
            settle_jetstream(message, how).await;
            return Ok(());
        }
    };
    let sent = match how {
        Settle::Ack => delivery.ack(BasicAckOptions::default()).await,
        Settle::Reject => delivery.reject(BasicRejectOptions { requeue: false }).await,
        Settle::Requeue => delivery.nack(BasicNackOptions { multiple: false, requeue: true }).await,
    };
    match sent {
        Ok(true) => Ok(()),
        // The channel closed under us: the broker requeues the delivery itself.
        Ok(false) => Err(format!("the channel closed before the {how:?} was sent")),
        Err(e) => Err(format!("lost the broker sending {how:?}: {}", one_line(&e))),
    }
}

/// A JetStream message's `Nats-Msg-Id` header.
fn jetstream_id(message: &jetstream::Message) -> Option<&str> {
    Some(message.headers.as_ref()?.get(async_nats::header::NATS_MESSAGE_ID)?.as_str())
}

/// Answers a JetStream delivery. An ack waits for the server's confirmation, so the
/// next delivery is handled only once this one is settled; a failed one is logged, not
/// fatal: the client reconnects by itself, and the server redelivers what it did not
/// take after the ack wait (a duplicate to the inbox).
async fn settle_jetstream(message: &jetstream::Message, how: Settle) {
    use jetstream::AckKind;
    let sent = match how {
        Settle::Ack => message.double_ack().await,
        // Term: never redelivered (JetStream's reject).
        Settle::Reject => message.ack_with(AckKind::Term).await,
        Settle::Requeue => message.ack_with(AckKind::Nak(None)).await,
    };
    if let Err(e) = sent {
        let id = jetstream_id(message).unwrap_or("(no message id)");
        log(&format!("error {id}: the {how:?} was not confirmed: {}", one_line(&*e)));
    }
}

/// Consumes until something fails: it never returns but with the reason.
async fn run() -> Result<Infallible, String> {
    let config = Config::from_env()?;
    let mut ledger = Ledger::open(&config.database_url).await?;
    match config.nats_url.clone() {
        Some(url) => consume_jetstream(&config, &mut ledger, &url).await,
        None => consume_amqp(&config, &mut ledger).await,
    }
}

/// Consumes JetStream through a durable pull consumer: a batch of at most `PREFETCH`
/// deliveries at a time, each handled to the end before the next.
async fn consume_jetstream(
    config: &Config,
    ledger: &mut Ledger,
    url: &str,
) -> Result<Infallible, String> {
    let client = async_nats::connect(url)
        .await
        .map_err(|e| format!("cannot connect to NATS (NATS_URL): {}", one_line(&e)))?;
    let context = jetstream::new(client);
    let stream = context
        .get_or_create_stream(jetstream::stream::Config {
            name: config.stream.clone(),
            subjects: vec![config.queue.clone()],
            ..jetstream::stream::Config::default()
        })
        .await
        .map_err(|e| format!("cannot declare the stream {:?}: {}", config.stream, one_line(&e)))?;
    let consumer: jetstream::consumer::PullConsumer = stream
        .get_or_create_consumer(
            &config.consumer,
            jetstream::consumer::pull::Config {
                durable_name: Some(config.consumer.clone()),
                filter_subject: config.queue.clone(),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: config.ack_wait,
                ..jetstream::consumer::pull::Config::default()
            },
        )
        .await
        .map_err(|e| {
            format!(
                "cannot create the consumer {:?} of {:?} in the stream {:?}: {}",
                config.consumer,
                config.queue,
                config.stream,
                one_line(&e)
            )
        })?;
    // A durable consumer of that name that already existed is taken as it is: one made
    // for another subject would consume other messages than QUEUE's while this says
    // otherwise, and one without explicit acks would lose a delivery at a crash.
    let existing = &consumer.cached_info().config;
    if existing.filter_subject != config.queue
        || existing.ack_policy != jetstream::consumer::AckPolicy::Explicit
    {
        return Err(format!(
            "the consumer {:?} of the stream {:?} exists for {:?} ({:?} acks), not {:?} \
             (explicit acks): delete it, or name another CONSUMER",
            config.consumer,
            config.stream,
            existing.filter_subject,
            existing.ack_policy,
            config.queue
        ));
    }
    say(&format!("consuming {} as {}", config.queue, config.consumer));
    loop {
        // A pull request for up to PREFETCH deliveries, answered as they arrive; it ends
        // when that many came or it expired, and the next one is sent.
        let mut batch = consumer
            .batch()
            .max_messages(usize::from(config.prefetch))
            .expires(JETSTREAM_PULL_EXPIRES)
            .messages()
            .await
            .map_err(|e| format!("lost the broker: {}", one_line(&e)))?;
        while let Some(message) = batch.next().await {
            let message = message.map_err(|e| format!("lost the broker: {}", one_line(&*e)))?;
            handle(config, ledger, Delivery::JetStream(message)).await?;
        }
    }
}

/// Consumes a RabbitMQ queue with manual acknowledgements.
async fn consume_amqp(config: &Config, ledger: &mut Ledger) -> Result<Infallible, String> {
    let broker = Connection::connect(&config.amqp_url, ConnectionProperties::default())
        .await
        .map_err(|e| format!("cannot connect to the broker (AMQP_URL): {}", one_line(&e)))?;
    let channel = broker
        .create_channel()
        .await
        .map_err(|e| format!("cannot open a channel: {}", one_line(&e)))?;
    channel
        .basic_qos(config.prefetch, BasicQosOptions::default())
        .await
        .map_err(|e| format!("cannot set the prefetch: {}", one_line(&e)))?;
    let durable = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
    channel
        .queue_declare(config.queue.as_str().into(), durable, FieldTable::default())
        .await
        .map_err(|e| format!("cannot declare the queue {:?}: {}", config.queue, one_line(&e)))?;
    // Manual acknowledgements (no_ack false): a delivery stays the broker's until `settle`.
    let mut deliveries = channel
        .basic_consume(
            config.queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| format!("cannot consume {:?}: {}", config.queue, one_line(&e)))?;
    say(&format!("consuming {} as {}", config.queue, config.consumer));

    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery.map_err(|e| format!("lost the broker: {}", one_line(&e)))?;
        handle(config, ledger, Delivery::Amqp(delivery)).await?;
    }
    Err("the broker cancelled the consumer".into())
}

/// Runs the consumer until it fails; see the module docs.
pub fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            log(&format!("error: cannot start the async runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let Err(e) = runtime.block_on(run());
    log(&format!("error: {e}"));
    ExitCode::FAILURE
}
