//! An outbox relay to RabbitMQ or NATS JetStream: publishes each committed outbox row,
//! and marks it delivered only after the broker confirmed it.
//!
//! ```sh
//! DATABASE_URL=sqlite:/tmp/orders.db cargo run -p idemcache-consumer --example relay
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p idemcache-consumer --example relay
//! NATS_URL=nats://127.0.0.1:4222 DATABASE_URL=sqlite:/tmp/orders.db cargo run -p idemcache-consumer --example relay
//! ```
//!
//! To RabbitMQ (the default), a row's message id is published as the AMQP `message_id`
//! property, its topic as the routing key (through the default exchange: the queue of
//! that name), its headers as the message's headers, persistent. The consumer example
//! (`--example consumer`) takes the `message_id` as its inbox's dedup key, so outbox →
//! broker → inbox applies each committed row once: a row published again after a relay
//! died before marking it is a `Duplicate` there. To JetStream (`NATS_URL` set), the
//! topic is the subject (a stream must hold it) and the message id the `Nats-Msg-Id`
//! header, so the stream's own duplicate window drops a row published again within it;
//! the consumer's inbox absorbs one published again later.
//!
//! Invariant: a row is marked delivered only after the broker confirmed its publish:
//! RabbitMQ's `basic.ack` in confirm mode, and routed (published `mandatory`, so a
//! message no queue took comes back and is an error, retried later); JetStream's ack,
//! a duplicate's included (the stream has the first copy). Everything else leaves the
//! row due again: a nack, an unroutable message, no stream for the subject, a lost
//! connection (each publish fails and its row is retried with backoff), or the relay's
//! death at any instant (its lease lapses).
//!
//! Environment:
//! - `DATABASE_URL` (required): `sqlite:PATH` or `postgres://user@host:port/db`; the
//!   outbox's schema is created at start if absent.
//! - `AMQP_URL`: the RabbitMQ broker (default `amqp://guest:guest@127.0.0.1:5672/%2f`).
//! - `NATS_URL`: publish to NATS JetStream at this server instead (`nats://host:port`).
//! - `BATCH`: rows leased per round (default 100); `LEASE_MS`: how long a relay holds
//!   them (default 30000); `POLL_MS`: the pause after a round that found fewer than a
//!   batch (default 200).
//!
//! Output, one line each on standard output: `relaying` once connected; then per round
//! that leased anything `batch: C claimed, D delivered, R retried, X dead`. Errors of a
//! round (a row the store cannot read, a database error) on standard error, `error: ...`;
//! the relay goes on. Exit status 1, `error: ...` on standard error, when the broker or
//! the database cannot be reached or configured at start.

use std::future::Future;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use idemcache_sql::outbox::{
    relay_loop, BatchReport, OutboxError, OutboxMessage, OutboxStorage, PublishError, Publisher,
    RelaySettings,
};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

/// Publishes outbox rows to RabbitMQ over a channel in confirm mode.
struct Amqp {
    channel: Channel,
}

impl Publisher for Amqp {
    fn publish(
        &self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<(), PublishError>> + Send {
        let channel = self.channel.clone();
        let id = message.id().to_owned();
        let topic = message.topic().to_owned();
        let payload = message.payload().clone();
        let mut headers = FieldTable::default();
        for (name, value) in message.headers() {
            headers.insert(name.as_str().into(), AMQPValue::LongString(value.as_str().into()));
        }
        async move {
            let properties = BasicProperties::default()
                .with_message_id(id.as_str().into())
                .with_delivery_mode(2)
                .with_headers(headers);
            // `mandatory`: a message no queue takes is returned, not confirmed as taken.
            let options = BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() };
            let confirm = channel
                .basic_publish("".into(), topic.as_str().into(), options, &payload, properties)
                .await
                .map_err(PublishError::new)?
                .await
                .map_err(PublishError::new)?;
            if !confirm.is_ack() {
                return Err(PublishError::new(format!("the broker refused {id} (nack)")));
            }
            if confirm.take_message().is_some() {
                return Err(PublishError::new(format!("no queue named {topic:?} took {id}")));
            }
            Ok(())
        }
    }
}

/// Publishes outbox rows to NATS JetStream, the message id as `Nats-Msg-Id`.
pub(crate) struct JetStream {
    /// The JetStream context of a connected client.
    pub(crate) context: async_nats::jetstream::Context,
}

impl Publisher for JetStream {
    fn publish(
        &self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<(), PublishError>> + Send {
        let context = self.context.clone();
        let subject = message.topic().to_owned();
        let mut publish = async_nats::jetstream::message::PublishMessage::build()
            .payload(message.payload().clone())
            .message_id(message.id());
        for (name, value) in message.headers() {
            publish = publish.header(name.as_str(), value.as_str());
        }
        async move {
            let acked = context.send_publish(subject, publish).await.map_err(PublishError::new)?;
            // A duplicate within the stream's window is acked too: the stream holds it.
            acked.await.map_err(PublishError::new)?;
            Ok(())
        }
    }
}

/// Runs the relay until it is stopped (see the module docs).
pub fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return fail(format!("starting the runtime: {e}")),
    };
    match runtime.block_on(run()) {
        Ok(never) => match never {},
        Err(why) => fail(why),
    }
}

fn fail(why: String) -> ExitCode {
    eprintln!("error: {why}");
    ExitCode::FAILURE
}

fn env_number(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(text) => text.parse().map_err(|_| format!("{name}={text:?} is not a whole number")),
        Err(_) => Ok(default),
    }
}

async fn run() -> Result<std::convert::Infallible, String> {
    let database = std::env::var("DATABASE_URL").map_err(|_| "DATABASE_URL is not set")?;
    let amqp = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let batch = usize::try_from(env_number("BATCH", 100)?).map_err(|e| e.to_string())?;
    let lease = Duration::from_millis(env_number("LEASE_MS", 30_000)?);
    let poll = Duration::from_millis(env_number("POLL_MS", 200)?);
    let settings = RelaySettings::default()
        .with_batch(batch)
        .and_then(|s| s.with_lease(lease))
        .and_then(|s| s.with_poll(poll))
        .map_err(|e| e.to_string())?;
    match std::env::var("NATS_URL") {
        Ok(nats) => {
            let client = async_nats::connect(&nats)
                .await
                .map_err(|e| format!("connecting to NATS at {nats}: {e}"))?;
            let publisher = JetStream { context: async_nats::jetstream::new(client) };
            with_storage(&database, publisher, settings).await
        }
        Err(_) => {
            let connection = Connection::connect(&amqp, ConnectionProperties::default())
                .await
                .map_err(|e| format!("connecting to the broker: {e}"))?;
            let channel =
                connection.create_channel().await.map_err(|e| format!("opening a channel: {e}"))?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(|e| format!("turning on publisher confirms: {e}"))?;
            // The connection lives as long as the relay: `relay_loop` never returns.
            let relayed = with_storage(&database, Amqp { channel }, settings).await;
            drop(connection);
            relayed
        }
    }
}

/// Relays the outbox at `database` through `publisher`.
async fn with_storage<P: Publisher>(
    database: &str,
    publisher: P,
    settings: RelaySettings,
) -> Result<std::convert::Infallible, String> {
    if let Some(path) = database.strip_prefix("sqlite:") {
        let conn = idemcache_sqlite::rusqlite::Connection::open(path)
            .map_err(|e| format!("opening {path}: {e}"))?;
        idemcache_sqlite::outbox::ensure_schema(&conn).map_err(|e| e.to_string())?;
        relay(idemcache_sqlite::outbox::Storage::new(conn), publisher, settings).await
    } else if database.starts_with("postgres://") || database.starts_with("postgresql://") {
        use idemcache_postgres::deadpool_postgres::{Manager, Pool};
        use idemcache_postgres::tokio_postgres::{Config, NoTls};
        let config: Config = database.parse().map_err(|e| format!("DATABASE_URL: {e}"))?;
        let pool = Pool::builder(Manager::new(config, NoTls))
            .max_size(2)
            .build()
            .map_err(|e| format!("a connection pool: {e}"))?;
        let client = pool.get().await.map_err(|e| format!("connecting to PostgreSQL: {e}"))?;
        idemcache_postgres::outbox::ensure_schema(&**client).await.map_err(|e| e.to_string())?;
        drop(client);
        relay(idemcache_postgres::outbox::Storage::new(pool), publisher, settings).await
    } else {
        Err(format!("DATABASE_URL={database:?} is neither sqlite:PATH nor postgres://..."))
    }
}

async fn relay<S: OutboxStorage, P: Publisher>(
    storage: S,
    publisher: P,
    settings: RelaySettings,
) -> Result<std::convert::Infallible, String> {
    println!("relaying");
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
    Ok(relay_loop(storage, publisher, settings, SystemTime::now, tokio::time::sleep, report).await)
}
