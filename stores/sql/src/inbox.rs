//! The consumer inbox's vocabulary, driver-free: what a delivery is ([`Receipt`]), what
//! can go wrong ([`InboxError`]), which consumer names and message ids are accepted
//! ([`check`]), how long records must be kept ([`Retention`], [`Purger`]), and the
//! cache in front of the database ([`KnownMessages`]).
//!
//! The inbox itself lives in each driver crate (`idemcache_sqlite::inbox`,
//! `idemcache_postgres::inbox`, `idemcache_sqlx::inbox::{postgres, mysql}`): its
//! `receive(&tx, consumer, message_id, fingerprint)` runs inside the transaction that
//! applies the message. The rule it keeps:
//!
//! **The dedup fact and the business change commit in one transaction, and the message
//! is acknowledged only after that commit.**
//!
//! ```text
//! deliver ─► begin ─► receive ─┬─ New ──────► apply ─► commit ─► ack
//!                              ├─ Duplicate ► rollback ─► ack           (applied before)
//!                              ├─ Mismatch ─► rollback ─► ack + log     (never applied)
//!                              └─ InFlight ─► rollback ─► nack, requeue (another holds it)
//! ```
//!
//! A crash before the commit leaves nothing (the redelivery is `New` and applies it
//! once); a crash after the commit and before the ack leaves the row (the redelivery is
//! `Duplicate`). The record is keyed by consumer *and* message id, so several consumers
//! of one event each apply it once.
//!
//! # Fingerprint the message, not its bytes
//!
//! The fingerprint tells a redelivery of a message (`Duplicate`) from another message
//! under a reused id (`Mismatch`). Take it from the fields that define the effect, read
//! from the parsed message, not from the body as it arrived: a producer that serializes
//! a retry afresh (another key order, other whitespace, a field it adds on retries such
//! as a send time) sends other bytes for the same message, and a fingerprint of the
//! bytes ([`Fingerprint::of`](idemcache::Fingerprint::of)`(&body)`) makes that retry a
//! `Mismatch`: acknowledged and not applied, which is right for a copy of a message
//! already applied, but reported as an id reused for another message, so every such
//! retry sets off the alarm meant for a producer's bug. Feed each field
//! that changes the effect to [`Fingerprint::builder`](idemcache::Fingerprint::builder) as
//! one [`bytes`](idemcache::FingerprintBuilder::bytes) part (each part is framed by its
//! length, so `("ab", "c")` and `("a", "bc")` differ), numbers in a fixed form, and
//! leave out what a retry may change (times, trace ids):
//!
//! ```
//! use idemcache::Fingerprint;
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! struct Payment {
//!     account: String,
//!     amount: i64,
//! }
//!
//! impl Payment {
//!     /// What the payment does: its account and amount, whatever the wire form.
//!     fn fingerprint(&self) -> Fingerprint {
//!         Fingerprint::builder()
//!             .bytes(self.account.as_bytes())
//!             .bytes(&self.amount.to_be_bytes())
//!             .finish()
//!     }
//! }
//!
//! let first = br#"{"account":"a1","amount":5}"#;
//! let retry = br#"{ "amount": 5, "account": "a1", "sent_at": "2026-05-01T10:00:00Z" }"#;
//! let parse = |body: &[u8]| serde_json::from_slice::<Payment>(body);
//! // One message in two serializations: one fingerprint, so the retry is a `Duplicate`.
//! assert_eq!(parse(first)?.fingerprint(), parse(retry)?.fingerprint());
//! assert_ne!(Fingerprint::of(first), Fingerprint::of(retry)); // the bytes' would differ
//! // Another payment under the same id is still told apart: a `Mismatch`.
//! let other = br#"{"account":"a1","amount":50}"#;
//! assert_ne!(parse(first)?.fingerprint(), parse(other)?.fingerprint());
//! # Ok::<(), serde_json::Error>(())
//! ```
//!
//! The records keep the fingerprint for the retention window: a change of what it is
//! made of makes redeliveries of messages received before the change `Mismatch` until
//! their records are purged.
//!
//! Invariant of this module: nothing here ever answers [`Receipt::New`] on its own; only
//! a driver's claiming `INSERT` inside the user's transaction does. The pre-filter
//! ([`KnownMessages`]) answers only what it was told was committed.

use std::error::Error;
use std::fmt;

mod filter;
pub mod postgres;
mod purge_loop;
pub mod receive;
mod retention;
#[cfg(feature = "test-utils")]
pub mod testing;

pub use filter::KnownMessages;
pub use purge_loop::purge_loop;
pub use retention::{Purger, Retention, RetentionError};

/// Most bytes in a consumer name: the name of the handler that applies messages (e.g.
/// `"ledger"`), one key space of message ids per consumer.
pub const MAX_CONSUMER_LEN: usize = 200;

/// Most bytes in a message id: 255, as an AMQP `message-id` (a short string) and a
/// JetStream `Nats-Msg-Id` fit.
pub const MAX_MESSAGE_ID_LEN: usize = 255;

/// What the inbox says of one delivery, inside the transaction it was asked in.
///
/// Only `New` lets the caller apply the message; every other answer means "do not apply
/// it in this transaction".
#[must_use = "a receipt says whether to apply the message"]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Receipt {
    /// This transaction claimed the message: apply it in the same transaction, commit,
    /// then acknowledge. A rollback un-claims it (the redelivery is `New` again).
    New,
    /// A committed record holds this (consumer, message id) with the same fingerprint:
    /// it was applied before. Acknowledge; apply nothing. (Also the answer to a second
    /// `receive` of one message inside the transaction that claimed it.)
    Duplicate,
    /// A committed record holds this (consumer, message id) with another payload's
    /// fingerprint: the id was reused for a different message. Never apply it;
    /// acknowledge and log it (requeuing would only bring it back).
    Mismatch,
    /// Another transaction holds this message uncommitted right now (or, under
    /// snapshot isolation, committed it after this transaction's snapshot, which then
    /// cannot see the row). Apply nothing; roll back and reject with requeue, and let
    /// the redelivery decide: it will be `New` if the other transaction rolled back,
    /// `Duplicate` if it committed. The driver's docs say whether the transaction is
    /// still usable (it may have been aborted); rolling back is always right.
    InFlight,
}

/// Why the inbox could not answer. The caller's transaction should be rolled back and
/// the message redelivered (nothing was claimed that a rollback would not undo).
#[derive(Debug)]
#[non_exhaustive]
pub enum InboxError {
    /// A consumer name or message id the inbox does not accept (see [`check`]); nothing
    /// was sent to the database.
    InvalidInput(String),
    /// A row the database holds cannot be read as an inbox record (e.g. a fingerprint
    /// that is not 16 bytes): named by its consumer and message id.
    Corrupt(String),
    /// The database failed; the driver's error is the [`source`](Error::source).
    Database(Box<dyn Error + Send + Sync>),
}

impl fmt::Display for InboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InboxError::InvalidInput(why) => write!(f, "inbox input refused: {why}"),
            InboxError::Corrupt(why) => write!(f, "an inbox record cannot be read: {why}"),
            InboxError::Database(e) => {
                // Drivers often keep the reason a few causes down ("db error" above
                // `relation "idemcache_inbox" does not exist`): say each cause once.
                write!(f, "the inbox's database failed: {e}")?;
                let mut line = e.to_string();
                let mut cause = e.source();
                while let Some(c) = cause {
                    let said = c.to_string();
                    if !line.contains(&said) {
                        write!(f, ": {said}")?;
                        line.push_str(&said);
                    }
                    cause = c.source();
                }
                Ok(())
            }
        }
    }
}

impl Error for InboxError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            InboxError::Database(e) => Some(&**e),
            InboxError::InvalidInput(_) | InboxError::Corrupt(_) => None,
        }
    }
}

impl InboxError {
    /// A record of `(consumer, message_id)` that cannot be read, and why.
    pub fn corrupt(consumer: &str, message_id: &str, why: impl fmt::Display) -> InboxError {
        InboxError::Corrupt(format!(
            "the record of consumer {consumer:?}, message {message_id:?}: {why}"
        ))
    }
}

/// Checks a consumer name and a message id as every inbox does before it sends them to
/// a database: each non-empty, a consumer at most [`MAX_CONSUMER_LEN`] bytes, a message
/// id at most [`MAX_MESSAGE_ID_LEN`], and neither holding a NUL character (PostgreSQL's
/// text cannot store one; refusing it everywhere keeps an id that works on SQLite
/// working on PostgreSQL). Any other UTF-8 is accepted and compared byte for byte.
pub fn check(consumer: &str, message_id: &str) -> Result<(), InboxError> {
    check_part("consumer", consumer, MAX_CONSUMER_LEN)?;
    check_part("message id", message_id, MAX_MESSAGE_ID_LEN)
}

/// Checks a message id alone by [`check`]'s rules: non-empty, at most
/// [`MAX_MESSAGE_ID_LEN`] bytes, no NUL. The outbox checks its message ids with it, so
/// that every id a producer enqueues is one the consumers' inbox accepts.
pub fn check_message_id(message_id: &str) -> Result<(), InboxError> {
    check_part("message id", message_id, MAX_MESSAGE_ID_LEN)
}

fn check_part(what: &str, value: &str, max: usize) -> Result<(), InboxError> {
    if value.is_empty() {
        return Err(InboxError::InvalidInput(format!("the {what} is empty")));
    }
    if value.len() > max {
        return Err(InboxError::InvalidInput(format!(
            "the {what} is {} bytes, more than the limit of {max}",
            value.len()
        )));
    }
    if let Some(at) = value.bytes().position(|b| b == 0) {
        return Err(InboxError::InvalidInput(format!(
            "the {what} holds a NUL character at byte {at}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_and_message_id_bounds() {
        assert!(check("ledger", "m-1").is_ok());
        assert!(check(&"c".repeat(MAX_CONSUMER_LEN), &"m".repeat(MAX_MESSAGE_ID_LEN)).is_ok());
        // Any UTF-8 but NUL: spaces, case and non-ASCII are kept as they are.
        assert!(check("ledger", "Ünïcode id with spaces ").is_ok());
        for (consumer, id, says) in [
            ("", "m", "the consumer is empty"),
            ("c", "", "the message id is empty"),
            (&"c".repeat(MAX_CONSUMER_LEN + 1)[..], "m", "consumer is 201 bytes"),
            ("c", &"m".repeat(MAX_MESSAGE_ID_LEN + 1)[..], "message id is 256 bytes"),
            ("c\0", "m", "consumer holds a NUL character at byte 1"),
            ("c", "\0m", "message id holds a NUL character at byte 0"),
        ] {
            let e = check(consumer, id).unwrap_err();
            assert!(matches!(e, InboxError::InvalidInput(_)), "{e:?}");
            assert!(e.to_string().contains(says), "{e}");
        }
    }

    #[derive(Debug)]
    struct Outer(Inner);
    #[derive(Debug)]
    struct Inner;
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("db error")
        }
    }
    impl fmt::Display for Inner {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("relation \"idemcache_inbox\" does not exist")
        }
    }
    impl Error for Outer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }
    impl Error for Inner {}

    #[test]
    fn a_database_error_says_its_buried_reason_and_keeps_its_source() {
        let e = InboxError::Database(Box::new(Outer(Inner)));
        assert_eq!(
            e.to_string(),
            "the inbox's database failed: db error: relation \"idemcache_inbox\" does not exist"
        );
        assert!(e.source().is_some_and(|s| s.is::<Outer>()));
        let c = InboxError::corrupt("ledger", "m-1", "a fingerprint of 3 bytes");
        assert_eq!(
            c.to_string(),
            "an inbox record cannot be read: the record of consumer \"ledger\", message \"m-1\": \
             a fingerprint of 3 bytes"
        );
        assert!(c.source().is_none());
    }
}
