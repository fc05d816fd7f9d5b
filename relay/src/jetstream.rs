//! [`JetStreamPublisher`]: outbox rows to NATS JetStream.
//!
//! Invariant: every message is checked against what NATS can carry before it is handed
//! to the client (which panics on a header it cannot write): a row that cannot be sent
//! fails alone, with a typed error naming why.

use async_nats::header::{HeaderName, HeaderValue, NATS_MESSAGE_ID};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::Context;
use idemcache_sql::outbox::{OutboxMessage, PublishError, Publisher};

/// Publishes outbox rows to NATS JetStream: the topic as the subject (a stream must hold
/// it), the row's id as the `Nats-Msg-Id` header (so the stream's duplicate window drops
/// a row published again within it), its headers as the message's headers; `Ok` once
/// JetStream acked it, a duplicate's ack included (the stream has the first copy).
///
/// NATS headers are lines of text: a header name must be printable ASCII without `:`,
/// and a value (the message id among them) must hold no CR or LF. A row that breaks this
/// fails with a [`PublishError`] saying so, and is retried and then dead like any
/// refused row; check messages before you enqueue them to keep such rows out.
#[derive(Debug, Clone)]
pub struct JetStreamPublisher {
    context: Context,
}

impl JetStreamPublisher {
    /// A publisher over a connected client's JetStream context
    /// (`async_nats::jetstream::new(client)`).
    pub fn new(context: Context) -> JetStreamPublisher {
        JetStreamPublisher { context }
    }

    /// Connects to the NATS server at `url` (`nats://host:port`).
    pub async fn connect(url: &str) -> Result<JetStreamPublisher, PublishError> {
        let client = async_nats::connect(url)
            .await
            .map_err(|e| PublishError::new(format!("connecting to NATS at {url}: {e}")))?;
        Ok(JetStreamPublisher::new(async_nats::jetstream::new(client)))
    }
}

impl JetStreamPublisher {
    /// Whether `message` can be sent to JetStream: its header names printable ASCII
    /// without `:`, no CR or LF in a header value or in its id. A producer that checks
    /// before it enqueues keeps out rows that could only die: such a row cannot be
    /// edited, so requeueing it fails again, and with an aggregate key it holds back
    /// the key's later messages until it is deleted.
    pub fn check(message: &OutboxMessage) -> Result<(), PublishError> {
        jetstream_message(message).map(drop)
    }
}

/// `message` as JetStream takes it, or why it cannot be sent.
fn jetstream_message(message: &OutboxMessage) -> Result<PublishMessage, PublishError> {
    let value = |what: &str, value: &str| {
        value.parse::<HeaderValue>().map_err(|_| {
            PublishError::new(format!("the {what} holds a CR or LF, which NATS cannot send"))
        })
    };
    let mut publish = PublishMessage::build()
        .payload(message.payload().clone())
        .header(NATS_MESSAGE_ID, value("message id", message.id())?);
    for (name, text) in message.headers() {
        let parsed = name.parse::<HeaderName>().map_err(|_| {
            PublishError::new(format!(
                "the header name {name:?} is not printable ASCII without ':', which NATS needs"
            ))
        })?;
        publish = publish.header(parsed, value(&format!("header {name:?}"), text)?);
    }
    Ok(publish)
}

impl Publisher for JetStreamPublisher {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), PublishError> {
        let publish = jetstream_message(message)?;
        let subject = message.topic().to_owned();
        let acked = self.context.send_publish(subject, publish).await.map_err(PublishError::new)?;
        acked.await.map_err(PublishError::new)?;
        Ok(())
    }

    /// Ready while the client is connected (it reconnects by itself): while it is not,
    /// the relay claims nothing, and an outage uses up no row's attempts.
    async fn ready(&self) -> Result<(), PublishError> {
        match self.context.client().connection_state() {
            async_nats::connection::State::Connected => Ok(()),
            state => Err(PublishError::new(format!("the NATS client is {state:?}"))),
        }
    }
}
