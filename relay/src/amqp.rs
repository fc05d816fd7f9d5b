//! [`AmqpPublisher`]: outbox rows to RabbitMQ over a channel in confirm mode.
//!
//! Invariant: a publish answers `Ok` only for a message the broker acked and routed. A
//! publish that finds its channel closed (the connection was cut, or the broker closed
//! the channel over one message, as RabbitMQ does for a message past its
//! `max_message_size`) opens a new connection and channel first, so one failure never
//! fails every later row: each publish either reaches a live channel or fails alone.
//! Nothing waits on the broker unbounded: connecting and each confirm are bounded
//! ([`CONNECT_TIMEOUT`], [`CONFIRM_TIMEOUT`]), and a confirm that did not come drops
//! the channel, so the next publish opens a new one.

use std::fmt;
use std::time::Duration;

use idemcache_sql::outbox::{OutboxMessage, PublishError, Publisher};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use tokio::sync::Mutex;
use tokio::time::timeout;

/// How long opening a connection and its channel may take: a broker that accepts and
/// never answers (a black-holed host) is an error after it, not a relay stuck for good.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a publish may wait for the broker's confirm. Past it the row is retried
/// later (it may have arrived: the inbox absorbs a copy) and the channel is reopened.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// Publishes outbox rows to RabbitMQ: the row's id as the AMQP `message_id` (the
/// consumer's inbox dedups by it), its topic as the routing key through the default
/// exchange (the queue of that name), its headers as the message's headers, persistent,
/// `mandatory` (a message no queue takes is an error, retried later) and confirmed.
///
/// It reconnects by itself: a publish that finds the channel or the connection gone
/// opens new ones before it publishes.
pub struct AmqpPublisher {
    url: String,
    live: Mutex<Option<Live>>,
}

/// A connection and its channel in confirm mode.
struct Live {
    channel: Channel,
    /// Kept open as long as its channel is used.
    _connection: Connection,
}

impl fmt::Debug for AmqpPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL may hold a password: only whether a channel is open is shown.
        let open = self.live.try_lock().map(|live| live.is_some()).unwrap_or(true);
        f.debug_struct("AmqpPublisher").field("open", &open).finish()
    }
}

impl AmqpPublisher {
    /// Connects to the broker at `url` (`amqp://user:password@host:port/vhost`) and opens
    /// a channel in confirm mode; an unreachable broker is the error.
    pub async fn connect(url: &str) -> Result<AmqpPublisher, PublishError> {
        let live = open(url).await?;
        Ok(AmqpPublisher { url: url.to_owned(), live: Mutex::new(Some(live)) })
    }

    /// The live channel, opened anew when the one held is closed.
    async fn channel(&self) -> Result<Channel, PublishError> {
        let mut live = self.live.lock().await;
        if let Some(held) = live.as_ref() {
            if held.channel.status().connected() {
                return Ok(held.channel.clone());
            }
        }
        // Closed (or never opened): dropped before a new one is opened, so a broker that
        // is down costs one connection attempt per publish, no leak.
        *live = None;
        let opened = open(&self.url).await?;
        let channel = opened.channel.clone();
        *live = Some(opened);
        Ok(channel)
    }
}

async fn open(url: &str) -> Result<Live, PublishError> {
    match timeout(CONNECT_TIMEOUT, opened(url)).await {
        Ok(live) => live,
        Err(_) => Err(PublishError::new(format!(
            "the broker did not answer within {CONNECT_TIMEOUT:?} of connecting"
        ))),
    }
}

async fn opened(url: &str) -> Result<Live, PublishError> {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .map_err(|e| PublishError::new(format!("connecting to the broker: {e}")))?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| PublishError::new(format!("opening a channel: {e}")))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| PublishError::new(format!("turning on publisher confirms: {e}")))?;
    Ok(Live { channel, _connection: connection })
}

impl Publisher for AmqpPublisher {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), PublishError> {
        let mut headers = FieldTable::default();
        for (name, value) in message.headers() {
            headers.insert(name.as_str().into(), AMQPValue::LongString(value.as_str().into()));
        }
        let id = message.id();
        let topic = message.topic();
        let properties = BasicProperties::default()
            .with_message_id(id.into())
            .with_delivery_mode(2)
            .with_headers(headers);
        // `mandatory`: a message no queue takes is returned, not confirmed as taken.
        let options = BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() };
        let channel = self.channel().await?;
        let confirming = async {
            channel
                .basic_publish("".into(), topic.into(), options, message.payload(), properties)
                .await?
                .await
        };
        let confirm = match timeout(CONFIRM_TIMEOUT, confirming).await {
            Ok(confirm) => confirm.map_err(PublishError::new)?,
            Err(_) => {
                // A channel that lost a confirm is not trusted with the next publish.
                *self.live.lock().await = None;
                return Err(PublishError::new(format!(
                    "the broker did not confirm {id} within {CONFIRM_TIMEOUT:?}"
                )));
            }
        };
        if !confirm.is_ack() {
            return Err(PublishError::new(format!("the broker refused {id} (nack)")));
        }
        if confirm.take_message().is_some() {
            return Err(PublishError::new(format!("no queue named {topic:?} took {id}")));
        }
        Ok(())
    }

    /// Ready once a channel is open, opened anew here if it was closed: while the broker
    /// cannot be reached, the relay claims nothing, and an outage uses up no row's
    /// attempts.
    async fn ready(&self) -> Result<(), PublishError> {
        self.channel().await.map(drop)
    }
}
