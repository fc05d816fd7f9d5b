//! The relay as a process: its configuration, read from the environment, and [`run`],
//! which connects to the outbox's database and the broker and relays until stopped.
//!
//! Invariant: everything that can be wrong at start (a variable that does not parse, a
//! database or broker that cannot be reached within its timeout) is a [`StartError`]
//! before the first row is claimed; afterwards nothing ends the loop: a batch's
//! failures are reported and the next batch goes on.

// A build without every feature leaves some of the paths to the publishers and stores
// unused: each is compiled in exactly when its feature is.
#![cfg_attr(
    not(all(feature = "amqp", feature = "nats", feature = "sqlite", feature = "postgres")),
    allow(dead_code, unused_imports, unused_variables)
)]

use std::convert::Infallible;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idemcache_sql::outbox::{
    relay_loop, BatchReport, OutboxError, OutboxStorage, Publisher, RelaySettings,
};

use crate::history::{History, Recorded};

/// Where the outbox is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outbox {
    /// A SQLite file (`sqlite:PATH`).
    Sqlite(PathBuf),
    /// A PostgreSQL database (`postgres://user@host:port/db`).
    Postgres(String),
}

/// Where the rows go.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Broker {
    /// RabbitMQ (`amqp://user:password@host:port/vhost`): [`AmqpPublisher`](crate::AmqpPublisher).
    Amqp(String),
    /// NATS JetStream (`nats://host:port`): [`JetStreamPublisher`](crate::JetStreamPublisher).
    Nats(String),
}

/// What the program relays, where to, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The outbox's database.
    pub outbox: Outbox,
    /// The broker.
    pub broker: Broker,
    /// Batch, lease, poll and retries.
    pub settings: RelaySettings,
    /// Where to append the relay's history, if anywhere, for a test run's checker: one
    /// tab-separated line per event, `time pid event message_id token attempt`, the
    /// event `begin` (a publish begins under that lease's fencing token, as that
    /// attempt; `time`, in ns since the epoch, is when its count was sent) or its
    /// outcome, `confirmed` or `failed` (at the broker's answer). Each line is written
    /// whole, in one write, before the step it records goes on.
    pub history: Option<PathBuf>,
}

/// Why the relay did not start: a variable that does not parse (named), or what could
/// not be reached and why. The program prints it as `error: ...` and exits with status 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartError(String);

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartError {}

/// How long the start waits for the database (a connection, and the schema created).
const DATABASE_TIMEOUT: Duration = Duration::from_secs(5);

impl Config {
    /// The configuration the program's environment gives:
    /// - `DATABASE_URL` (required): `sqlite:PATH` or `postgres://user@host:port/db`;
    /// - `NATS_URL`: publish to NATS JetStream at this server; otherwise `AMQP_URL`, the
    ///   RabbitMQ broker (default `amqp://guest:guest@127.0.0.1:5672/%2f`);
    /// - `BATCH` (rows leased per round, default 100), `LEASE_MS` (how long a relay holds
    ///   them, default 30000), `POLL_MS` (the pause after a round that found fewer than a
    ///   batch, default 200);
    /// - `RELAY_HISTORY` (off by default): a file to append the relay's history to, for
    ///   a test run's checker ([`Config::history`]).
    pub fn from_env() -> Result<Config, StartError> {
        Config::from_vars(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) over any source of variables (a test's map).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Config, StartError> {
        let database =
            var("DATABASE_URL").ok_or_else(|| StartError("DATABASE_URL is not set".into()))?;
        let outbox = if let Some(path) = database.strip_prefix("sqlite:") {
            Outbox::Sqlite(PathBuf::from(path))
        } else if database.starts_with("postgres://") || database.starts_with("postgresql://") {
            Outbox::Postgres(database)
        } else {
            return Err(StartError(
                "DATABASE_URL is neither sqlite:PATH nor postgres://...".to_owned(),
            ));
        };
        let broker = match var("NATS_URL") {
            Some(url) => Broker::Nats(url),
            None => Broker::Amqp(
                var("AMQP_URL").unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".into()),
            ),
        };
        let number = |name: &str, default: u64| match var(name) {
            Some(text) => text
                .parse::<u64>()
                .map_err(|_| StartError(format!("{name}={text:?} is not a whole number"))),
            None => Ok(default),
        };
        let batch = usize::try_from(number("BATCH", 100)?)
            .map_err(|_| StartError("BATCH is too large".into()))?;
        let lease = Duration::from_millis(number("LEASE_MS", 30_000)?);
        let poll = Duration::from_millis(number("POLL_MS", 200)?);
        let settings = RelaySettings::default()
            .with_batch(batch)
            .and_then(|s| s.with_lease(lease))
            .and_then(|s| s.with_poll(poll))
            .map_err(|e| StartError(format!("the relay's settings: {e}")))?;
        let history = var("RELAY_HISTORY").map(PathBuf::from);
        Ok(Config { outbox, broker, settings, history })
    }
}

/// Connects to the broker and the outbox's database (creating the outbox's table if it
/// is absent), prints `relaying`, and relays until the process is stopped: per round
/// that leased anything, `batch: C claimed, D delivered, R retried, X dead` on standard
/// output, and each error of a round (a row the store cannot read, a database error) as
/// `error: ...` on standard error. Returns only a [`StartError`]: a database that does
/// not answer within 5 s, a broker that cannot be reached, a broker or store not built
/// into this binary (features `amqp`, `nats`, `sqlite`, `postgres`), a history file that
/// cannot be opened.
pub async fn run(config: Config) -> Result<Infallible, StartError> {
    let history = match &config.history {
        Some(path) => Some(
            History::open(path)
                .map_err(|e| StartError(format!("RELAY_HISTORY={}: {e}", path.display())))?,
        ),
        None => None,
    };
    let settings = Settings { relay: config.settings, history };
    match config.broker {
        #[cfg(feature = "amqp")]
        Broker::Amqp(url) => {
            let publisher = crate::AmqpPublisher::connect(&url)
                .await
                .map_err(|e| StartError(format!("the broker: {e}")))?;
            with_storage(&config.outbox, publisher, settings).await
        }
        #[cfg(feature = "nats")]
        Broker::Nats(url) => {
            let publisher = crate::JetStreamPublisher::connect(&url)
                .await
                .map_err(|e| StartError(format!("the broker: {e}")))?;
            with_storage(&config.outbox, publisher, settings).await
        }
        #[allow(unreachable_patterns)]
        other => Err(StartError(format!("{other:?}: this build has no publisher for it"))),
    }
}

/// How the loop runs, and where its history goes.
struct Settings {
    relay: RelaySettings,
    history: Option<Arc<History>>,
}

/// Relays the outbox at `outbox` through `publisher`.
async fn with_storage<P: Publisher + Sync>(
    outbox: &Outbox,
    publisher: P,
    settings: Settings,
) -> Result<Infallible, StartError> {
    match outbox {
        #[cfg(feature = "sqlite")]
        Outbox::Sqlite(path) => {
            use idemcache_sqlite::outbox::{ensure_schema, Storage};
            let open = |path: &std::path::Path| {
                let conn = idemcache_sqlite::rusqlite::Connection::open(path)?;
                conn.busy_timeout(DATABASE_TIMEOUT)?;
                Ok::<_, idemcache_sqlite::rusqlite::Error>(conn)
            };
            let conn =
                open(path).map_err(|e| StartError(format!("opening {}: {e}", path.display())))?;
            ensure_schema(&conn).map_err(|e| StartError(format!("the outbox's schema: {e}")))?;
            relay(Storage::new(conn), publisher, settings).await
        }
        #[cfg(feature = "postgres")]
        Outbox::Postgres(url) => {
            use idemcache_postgres::outbox::{ensure_schema, Storage};
            // The store's pool: 5 s to connect (a server that accepts and never answers
            // included) and 5 s to wait for a connection, errors naming the server.
            let store = idemcache_postgres::PostgresStore::connect(url)
                .await
                .map_err(|e| StartError(format!("DATABASE_URL: {e}")))?;
            let pool = store.pool().clone();
            let client = pool
                .get()
                .await
                .map_err(|e| StartError(format!("connecting to PostgreSQL: {e}")))?;
            ensure_schema(&**client)
                .await
                .map_err(|e| StartError(format!("the outbox's schema: {e}")))?;
            drop(client);
            relay(Storage::new(pool), publisher, settings).await
        }
        #[allow(unreachable_patterns)]
        other => Err(StartError(format!("{other:?}: this build has no store for it"))),
    }
}

async fn relay<S: OutboxStorage + Sync, P: Publisher + Sync>(
    storage: S,
    publisher: P,
    settings: Settings,
) -> Result<Infallible, StartError> {
    println!("relaying");
    let Settings { relay: settings, history } = settings;
    let report = |round: Result<BatchReport, OutboxError>| match round {
        Ok(r) => {
            if r.claimed > 0 {
                println!(
                    "batch: {} claimed, {} delivered, {} retried, {} dead",
                    r.claimed, r.delivered, r.retried, r.dead
                );
            }
            for e in r.errors {
                eprintln!("error: {e}");
            }
        }
        Err(e) => eprintln!("error: {e}"),
    };
    let sleep = tokio::time::sleep;
    Ok(match history {
        Some(history) => {
            let storage = Recorded { inner: storage, history: history.clone() };
            let publisher = Recorded { inner: publisher, history };
            relay_loop(storage, publisher, settings, SystemTime::now, sleep, report).await
        }
        None => relay_loop(storage, publisher, settings, SystemTime::now, sleep, report).await,
    })
}
