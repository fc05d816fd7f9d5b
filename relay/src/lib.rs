//! The outbox relay: publishes each committed outbox row to a broker and marks it
//! delivered only once the broker confirmed it (the repository's `docs/outbox.md` is the
//! guide).
//!
//! Two ways to use it:
//! - **The program**, `idemcache-relay` (`cargo install idemcache-relay`): configured by
//!   its environment ([`Config::from_env`]), it relays one outbox (SQLite or
//!   PostgreSQL) to RabbitMQ or NATS JetStream until it is stopped.
//! - **The publishers**, for a relay of your own inside your service:
//!   [`AmqpPublisher`] (feature `amqp`) and [`JetStreamPublisher`] (feature `nats`) are
//!   [`Publisher`]s for `idemcache_sql::outbox::relay_loop` over your driver's
//!   `outbox::Storage`.
//!
//! Invariant: a row is marked delivered only after its broker confirmed the publish
//! (RabbitMQ's `basic.ack` in confirm mode for a routed message; JetStream's ack, a
//! duplicate's included). Any other outcome leaves the row due again: a nack, an
//! unroutable message, a message the broker cannot carry (a typed error naming why,
//! never a panic), a lost connection (the next publish reconnects), or the relay's death
//! at any instant (its lease lapses). At worst a row is published twice, and the
//! consumer's inbox, keyed by the same message id, applies it once.
//!
//! ```no_run
//! # #[cfg(all(feature = "amqp", feature = "sqlite"))]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::SystemTime;
//! use idemcache_relay::AmqpPublisher;
//! use idemcache_sqlite::outbox::{self, relay_loop, RelaySettings, Storage};
//! use idemcache_sqlite::rusqlite::Connection;
//!
//! let db = Connection::open("/var/lib/orders.db")?;
//! outbox::ensure_schema(&db)?;
//! let publisher = AmqpPublisher::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
//! let report = |batch| println!("{batch:?}");
//! let never = relay_loop(
//!     Storage::new(db),
//!     publisher,
//!     RelaySettings::default(),
//!     SystemTime::now,
//!     tokio::time::sleep,
//!     report,
//! )
//! .await;
//! match never {}
//! # }
//! ```
//!
//! [`Publisher`]: idemcache_sql::outbox::Publisher

// Where links to this crate's items go from documentation built without it (another
// crate's `cargo doc --no-deps`); `.ci/package` checks the version.
#![doc(html_root_url = "https://docs.rs/idemcache-relay/0.1.0")]

#[cfg(feature = "amqp")]
mod amqp;
mod history;
#[cfg(feature = "nats")]
mod jetstream;
mod process;

#[cfg(feature = "amqp")]
pub use amqp::{AmqpPublisher, CONFIRM_TIMEOUT, CONNECT_TIMEOUT};
#[cfg(feature = "nats")]
pub use jetstream::JetStreamPublisher;
pub use process::{run, Broker, Config, Outbox, StartError};
