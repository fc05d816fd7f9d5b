//! A RabbitMQ consumer that applies payment messages exactly once, through the inbox.
//!
//! ```sh
//! DATABASE_URL=sqlite:/tmp/ledger.db cargo run -p idemcache-consumer --example consumer
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p idemcache-consumer --example consumer
//! ```
//!
//! Each message is a payment: its id is the AMQP `message_id` property, its body the JSON
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
//! | the process dies before the commit (`kill -9`, a crash, a lost database) | nothing was committed; the broker redelivers the unacknowledged message and it is applied once |
//! | it dies between the commit and the ack | the broker redelivers; the inbox answers `Duplicate`: acknowledged, not applied again |
//! | it dies after the ack | the message is gone from the queue; nothing to redo |
//! | the publisher sends a message twice (a retry after a lost confirm) | the second copy is a `Duplicate` |
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
//! - `QUEUE`: the queue consumed (default `payments`), declared durable if absent.
//! - `CONSUMER`: this consumer's name in the inbox (default `ledger`). Instances of one
//!   program share it, so that they apply each message once between them.
//! - `DATABASE_URL` (required): `sqlite:PATH` or `postgres://user@host:port/db`. The
//!   `accounts` table and the inbox's schema are created at start if absent.
//! - `PREFETCH`: how many unacknowledged deliveries the broker may hand this consumer
//!   at once (default 10, 1..=65535). Deliveries are handled one at a time, in order.
//! - `APPLY_DELAY_MS`: sleep this long inside the transaction, after the payment is
//!   applied and before the commit (default 0): a window to kill it before the commit.
//! - `ACK_DELAY_MS`: sleep this long after the commit (and the `applied` line), before the
//!   ack (default 0): a window to kill it between the commit and the ack.
//!
//! Output. Standard output, one line each, flushed at once: `consuming QUEUE as CONSUMER`
//! once the queue is declared and the consumer registered; then per delivery `applied ID`
//! (committed; acknowledged next), `duplicate ID` or `mismatch ID` (acknowledged).
//! Standard error: `applying ID` when a new message's transaction has claimed it (the
//! payment is uncommitted until `applied ID`), `rejected (no message id)` and
//! `rejected ID: REASON` (a body that is not a payment, or an amount that would overflow
//! the balance: rejected without requeue, so the broker drops or dead-letters it),
//! `mismatch ID: ...`, `in flight ID: ...` (another consumer's transaction holds the id:
//! rolled back and requeued after a short pause) and `error ID: ...` (a database error:
//! rolled back and requeued after a short pause, never acknowledged).
//!
//! Exit status: 1, with one line `error: ...` on standard error, when the broker or the
//! database cannot be reached or configured at start, the broker connection is lost, or
//! the database connection is lost (the unacknowledged deliveries go back to the queue).
//! Stopping it at any instant (Ctrl-C, `kill -9`) is one of the failures above: it needs
//! no graceful shutdown.

use std::convert::Infallible;
use std::io::Write;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use idemcache::Fingerprint;
use idemcache_postgres::tokio_postgres::{self, error::SqlState, NoTls};
use idemcache_sql::inbox::{InboxError, Receipt};
use idemcache_sqlite::rusqlite::{self, TransactionBehavior};
use lapin::message::Delivery;
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

/// The consumer's settings, read once from the environment.
struct Config {
    amqp_url: String,
    queue: String,
    consumer: String,
    database_url: String,
    prefetch: u16,
    apply_delay: Duration,
    ack_delay: Duration,
}

impl Config {
    fn from_env() -> Result<Config, String> {
        let text = |name: &str, default: &str| match std::env::var(name) {
            Ok(value) if !value.is_empty() => Ok(value),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(default.to_owned()),
            Err(std::env::VarError::NotUnicode(_)) => Err(format!("{name} is not UTF-8")),
        };
        let millis = |name: &str| -> Result<Duration, String> {
            let value = text(name, "0")?;
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
        Ok(Config {
            amqp_url: text("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")?,
            queue: text("QUEUE", "payments")?,
            consumer,
            database_url,
            prefetch,
            apply_delay: millis("APPLY_DELAY_MS")?,
            ack_delay: millis("ACK_DELAY_MS")?,
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

/// The delivery's message id, if it has a non-empty one.
fn message_id(delivery: &Delivery) -> Option<String> {
    let id = delivery.properties.message_id().as_ref()?.as_str();
    (!id.is_empty()).then(|| id.to_owned())
}

/// Handles one delivery to the end: applied and acknowledged, acknowledged, rejected or
/// requeued. An `Err` is the broker lost (or the database lost): the caller exits, and
/// the broker requeues whatever was not acknowledged.
async fn handle(config: &Config, ledger: &mut Ledger, delivery: Delivery) -> Result<(), String> {
    let Some(id) = message_id(&delivery) else {
        log("rejected (no message id)");
        return settle(&delivery, Settle::Reject).await;
    };
    let payment = match serde_json::from_slice::<Payment>(&delivery.data) {
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
    let fingerprint = Fingerprint::of(&delivery.data);
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

/// Consumes until something fails: it never returns but with the reason.
async fn run() -> Result<Infallible, String> {
    let config = Config::from_env()?;
    let mut ledger = Ledger::open(&config.database_url).await?;

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
        handle(&config, &mut ledger, delivery).await?;
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
