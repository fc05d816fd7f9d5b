//! The transactional outbox's vocabulary, driver-free: what a message is
//! ([`OutboxMessage`]), what a relay holds ([`Claimed`], [`Lease`]), what can go wrong
//! ([`OutboxError`]), how failures are retried ([`Retry`]), how a row is read back
//! ([`decode`]), the statements per dialect ([`postgres`], [`mysql`]) and the relay's
//! broker-agnostic loop ([`relay`]).
//!
//! The outbox itself lives in each driver crate (`idemcache_sqlite::outbox`,
//! `idemcache_postgres::outbox`, `idemcache_sqlx::outbox::{postgres, mysql}`): its
//! `enqueue(&tx, &message)` runs inside the transaction that makes the business change.
//! The rule it keeps:
//!
//! **The business change, its idempotency record and the outbox row commit in one
//! transaction; a relay publishes the row only after that commit, and marks it delivered
//! only after the broker confirmed it.**
//!
//! ```text
//! request ─► begin ─► change ─► enqueue ─► commit          (all three, or none)
//! relay   ─► claim_due (lease, token) ─► publish ─┬─ confirmed ─► mark_delivered(token)
//!                                                 └─ error ─────► mark_failed(token)
//!                                                                 (retry later, or dead)
//! ```
//!
//! A crash before the commit leaves no row (nothing is published of a change that never
//! happened); a relay killed after claiming leaves its rows leased, and a lapsed lease
//! makes them due again: at worst a row is published twice, and the consumer's inbox,
//! keyed by the same message id, applies it once.
//!
//! Invariant of this module: nothing here touches a database or a clock; every time is
//! handed in by the caller, and every row, whatever it holds, decodes to a value or to
//! [`OutboxError::Corrupt`] naming its message id, never a panic.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::error::Error;
use std::fmt;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

mod admin;
pub mod decode;
pub mod mysql;
pub mod postgres;
mod purge_loop;
pub mod relay;
#[cfg(feature = "test-utils")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-utils")))]
pub mod testing;

pub use admin::OutboxAdmin;
pub use purge_loop::purge_loop;
pub use relay::{
    relay_batch, relay_loop, BatchReport, OutboxStorage, PublishError, Publisher, RelaySettings,
};

/// Most bytes in a topic (a routing key, a subject): 255.
pub const MAX_TOPIC_LEN: usize = 255;

/// Most bytes in an aggregate key: 255.
pub const MAX_AGGREGATE_KEY_LEN: usize = 255;

/// Most headers on one message: 64.
pub const MAX_HEADERS: usize = 64;

/// Most bytes in a header's name: 255.
pub const MAX_HEADER_NAME_LEN: usize = 255;

/// Most bytes in a header's value: 4096.
pub const MAX_HEADER_VALUE_LEN: usize = 4096;

/// Most bytes of a publish error kept in the row's `last_error` (longer ones are cut at
/// a character boundary): 1000.
pub const MAX_ERROR_LEN: usize = 1000;

/// One message to publish: its id (the consumers' inbox dedup key), topic, payload, a
/// few headers, and optionally an aggregate key that orders it after the earlier
/// messages of the same key.
///
/// ```
/// use idemcache_sql::outbox::OutboxMessage;
///
/// let message = OutboxMessage::new("order-42-created", "orders", &b"{\"id\":42}"[..])
///     .with_header("content-type", "application/json")
///     .with_aggregate_key("order-42");
/// assert!(message.check().is_ok());
/// assert_eq!(message.aggregate_key(), Some("order-42"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    id: String,
    topic: String,
    payload: Bytes,
    headers: BTreeMap<String, String>,
    aggregate_key: Option<String>,
}

impl OutboxMessage {
    /// A message without headers or aggregate key. Nothing is checked here;
    /// [`check`](OutboxMessage::check) (which `enqueue` runs) says what is refused.
    pub fn new(id: impl Into<String>, topic: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        OutboxMessage {
            id: id.into(),
            topic: topic.into(),
            payload: payload.into(),
            headers: BTreeMap::new(),
            aggregate_key: None,
        }
    }

    /// The message with a header set (a second value for one name replaces the first).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// The message ordered by `key`: a relay publishes it only after every earlier
    /// message of the same key was delivered.
    pub fn with_aggregate_key(mut self, key: impl Into<String>) -> Self {
        self.aggregate_key = Some(key.into());
        self
    }

    /// The message id: unique in the outbox, and the key the consumers' inbox dedups by.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Where the message goes (a routing key, a subject).
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The body, as enqueued.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// The headers, sorted by name.
    pub fn headers(&self) -> &BTreeMap<String, String> {
        &self.headers
    }

    /// The aggregate key, if the message is ordered.
    pub fn aggregate_key(&self) -> Option<&str> {
        self.aggregate_key.as_deref()
    }

    /// Checks the message as every outbox does before it writes it: the id by the
    /// inbox's rules ([`inbox::check_message_id`](crate::inbox::check_message_id), so that
    /// every id the outbox takes is one the consumers' inbox takes), the topic and the
    /// aggregate key non-empty, at most 255 bytes and free of NUL, and at most
    /// [`MAX_HEADERS`] headers, each name non-empty and at most [`MAX_HEADER_NAME_LEN`]
    /// bytes, each value at most [`MAX_HEADER_VALUE_LEN`], neither holding NUL.
    pub fn check(&self) -> Result<(), OutboxError> {
        crate::inbox::check_message_id(&self.id)
            .map_err(|e| OutboxError::InvalidInput(e.to_string()))?;
        text("topic", &self.topic, MAX_TOPIC_LEN, false)?;
        if let Some(key) = &self.aggregate_key {
            text("aggregate key", key, MAX_AGGREGATE_KEY_LEN, false)?;
        }
        if self.headers.len() > MAX_HEADERS {
            return Err(OutboxError::InvalidInput(format!(
                "{} headers, more than the limit of {MAX_HEADERS}",
                self.headers.len()
            )));
        }
        for (name, value) in &self.headers {
            text("header name", name, MAX_HEADER_NAME_LEN, false)?;
            text("header value", value, MAX_HEADER_VALUE_LEN, true)?;
        }
        Ok(())
    }

    /// The headers in their stored form: see [`encode_headers`].
    pub fn encoded_headers(&self) -> Vec<u8> {
        encode_headers(&self.headers)
    }

    pub(crate) fn from_parts(
        id: String,
        topic: String,
        payload: Bytes,
        headers: BTreeMap<String, String>,
        aggregate_key: Option<String>,
    ) -> Self {
        OutboxMessage { id, topic, payload, headers, aggregate_key }
    }
}

fn text(what: &str, value: &str, max: usize, may_be_empty: bool) -> Result<(), OutboxError> {
    if value.is_empty() && !may_be_empty {
        return Err(OutboxError::InvalidInput(format!("the {what} is empty")));
    }
    if value.len() > max {
        return Err(OutboxError::InvalidInput(format!(
            "the {what} is {} bytes, more than the limit of {max}",
            value.len()
        )));
    }
    if let Some(at) = value.bytes().position(|b| b == 0) {
        return Err(OutboxError::InvalidInput(format!(
            "the {what} holds a NUL character at byte {at}"
        )));
    }
    Ok(())
}

/// The stored form of a message's headers: for each header, in ascending order of name,
/// the name's length (2 bytes, big-endian), the name, the value's length (4 bytes,
/// big-endian), the value. No headers is no bytes. The same map always gives the same
/// bytes (the order is the map's), so a row can be compared and fingerprinted as stored;
/// [`decode_headers`] reads it back.
pub fn encode_headers(headers: &BTreeMap<String, String>) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        // Checked lengths (`OutboxMessage::check`) fit; saturate rather than wrap if not.
        out.extend_from_slice(&u16::try_from(name.len()).unwrap_or(u16::MAX).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&u32::try_from(value.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// Reads [`encode_headers`]'s form back, or says why it cannot: a length running past
/// the end, a name or value not UTF-8, names out of order or repeated.
pub fn decode_headers(mut bytes: &[u8]) -> Result<BTreeMap<String, String>, String> {
    let mut headers = BTreeMap::new();
    let mut last: Option<String> = None;
    while !bytes.is_empty() {
        let name = take(&mut bytes, 2, "name")?;
        let value = take(&mut bytes, 4, "value")?;
        if last.as_ref().is_some_and(|l| *l >= name) {
            return Err(format!("header {name:?} is out of order or repeated"));
        }
        last = Some(name.clone());
        headers.insert(name, value);
    }
    Ok(headers)
}

fn take(bytes: &mut &[u8], width: usize, what: &str) -> Result<String, String> {
    let Some((len, rest)) = bytes.split_at_checked(width) else {
        return Err(format!("a header {what}'s length is cut short"));
    };
    let len = len.iter().fold(0usize, |n, b| n << 8 | usize::from(*b));
    let Some((text, rest)) = rest.split_at_checked(len) else {
        return Err(format!("a header {what} of {len} bytes runs past the end"));
    };
    *bytes = rest;
    String::from_utf8(text.to_vec()).map_err(|_| format!("a header {what} is not UTF-8"))
}

/// Where a row is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Waiting to be published, due at its next attempt time.
    Pending,
    /// Held by a relay under a lease; due again when the lease lapses.
    Leased,
    /// Published and confirmed by the broker; kept until purged.
    Delivered,
    /// Failed its last allowed attempt; waits for an operator's `requeue`.
    Dead,
}

impl State {
    /// The value stored in the `state` column.
    pub fn code(self) -> i64 {
        match self {
            State::Pending => 0,
            State::Leased => 1,
            State::Delivered => 2,
            State::Dead => 3,
        }
    }

    /// The state a stored value names, if any.
    pub fn from_code(code: i64) -> Option<State> {
        match code {
            0 => Some(State::Pending),
            1 => Some(State::Leased),
            2 => Some(State::Delivered),
            3 => Some(State::Dead),
            _ => None,
        }
    }
}

/// What a relay holds of a claimed row: the message id, the fencing token its claim
/// received and how many publishes of the row were begun before. Every mark names it; a
/// mark with a token older than the row's changes nothing ([`Mark::Stale`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The row's message id.
    pub message_id: String,
    /// The fencing token of this claim: higher than every earlier claim's of the row.
    pub token: u64,
    /// How many publishes of the row were begun since it was enqueued or requeued, each
    /// counted as it begins ([`OutboxStorage::begin_attempt`]; the relay then holds
    /// [`decode::begun`], this one included). A claim counts none: a row that waited
    /// behind a relay that died without trying it keeps every attempt.
    pub attempts: u32,
}

/// A row a relay claimed: the message to publish and the lease to mark it under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The message, as enqueued.
    pub message: OutboxMessage,
    /// The claim's lease.
    pub lease: Lease,
}

/// What a claim returned: the rows it leased that read as messages, oldest first, and
/// one [`OutboxError::Corrupt`] for each leased row that did not (left leased: it is due
/// again when its lease lapses, and reported again, until an operator repairs or deletes
/// it).
#[derive(Debug, Default)]
pub struct Batch {
    /// The claimed messages, in enqueue order.
    pub claimed: Vec<Claimed>,
    /// The leased rows that cannot be read.
    pub unreadable: Vec<OutboxError>,
}

/// A row as an operator sees it (`inspect` and `list_dead` in the
/// drivers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    /// The message, as enqueued.
    pub message: OutboxMessage,
    /// Where it is in its life.
    pub state: State,
    /// How many publishes of it were begun since it was enqueued or requeued.
    pub attempts: u32,
    /// When it is due (pending), or when its lease lapses (leased).
    pub next_attempt_at: SystemTime,
    /// When the current lease lapses, while leased.
    pub lease_until: Option<SystemTime>,
    /// The last claim's fencing token (0 before the first claim).
    pub token: u64,
    /// The last failed publish's error, if any.
    pub last_error: Option<String>,
    /// When it was enqueued (the database's clock).
    pub created_at: SystemTime,
    /// When it was marked delivered (the relay's clock).
    pub delivered_at: Option<SystemTime>,
}

/// What a fenced mark did.
#[must_use = "a stale mark changed nothing"]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mark {
    /// The row was leased under this token, and is now marked.
    Applied,
    /// The row is not leased under this token (its lease lapsed and another claim took
    /// it, or it was marked already, or it is gone): nothing changed.
    Stale,
}

/// How failed publishes are retried: the `n`th failure makes the row due again after
/// `first * 2^(n-1)`, at most `cap`; the failure of attempt `max_attempts` makes it
/// [`State::Dead`] instead.
///
/// ```
/// use idemcache_sql::outbox::{Next, Retry};
/// use std::time::{Duration, SystemTime};
///
/// let retry = Retry::new(Duration::from_secs(1), Duration::from_secs(5), 4)?;
/// let now = SystemTime::UNIX_EPOCH;
/// assert_eq!(retry.after(1, now), Next::At(now + Duration::from_secs(1)));
/// assert_eq!(retry.after(3, now), Next::At(now + Duration::from_secs(4)));
/// assert_eq!(retry.after(4, now), Next::Dead);
/// # Ok::<(), idemcache_sql::outbox::OutboxError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    first: Duration,
    cap: Duration,
    max_attempts: u32,
}

/// What follows a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Pending again, due at this time.
    At(SystemTime),
    /// Out of attempts: dead.
    Dead,
}

impl Default for Retry {
    /// 1 s doubling up to 5 min, 10 attempts: 511 s of backoff between the first attempt
    /// and the last (the cap is never reached with 10).
    fn default() -> Self {
        Retry { first: Duration::from_secs(1), cap: Duration::from_secs(300), max_attempts: 10 }
    }
}

impl Retry {
    /// A policy; refuses a zero `first`, a `cap` below `first` or above
    /// [`MAX_DURATION`](idemcache::MAX_DURATION), or zero attempts. (A cap the clock
    /// cannot add to `now` would leave no backoff at all: the row retried at once.)
    pub fn new(first: Duration, cap: Duration, max_attempts: u32) -> Result<Retry, OutboxError> {
        if first.is_zero() || cap < first || cap > idemcache::MAX_DURATION || max_attempts == 0 {
            return Err(OutboxError::InvalidInput(format!(
                "a retry policy needs 0 < first <= cap <= MAX_DURATION and at least one \
                 attempt (first {first:?}, cap {cap:?}, {max_attempts} attempts)"
            )));
        }
        Ok(Retry { first, cap, max_attempts })
    }

    /// The most attempts a row gets before it is dead.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// What follows the failure of attempt `attempts` (1-based) at `now`.
    pub fn after(&self, attempts: u32, now: SystemTime) -> Next {
        if attempts >= self.max_attempts {
            return Next::Dead;
        }
        let doublings = attempts.saturating_sub(1).min(31);
        let delay = self.first.saturating_mul(1 << doublings).min(self.cap);
        Next::At(now.checked_add(delay).unwrap_or(now))
    }
}

/// Why an outbox operation could not be done.
#[derive(Debug)]
#[non_exhaustive]
pub enum OutboxError {
    /// A message or setting the outbox does not accept; nothing was sent to the database.
    InvalidInput(String),
    /// `enqueue` met a row with the same message id: the message was enqueued before
    /// (on PostgreSQL the caller's transaction is then aborted; roll it back).
    Duplicate(String),
    /// A row the database holds cannot be read as an outbox row: named by its message id.
    Corrupt(String),
    /// The database failed; the driver's error is the [`source`](Error::source).
    Database(Box<dyn Error + Send + Sync>),
    /// The broker cannot take messages now ([`Publisher::ready`]
    /// said why): the relay claimed nothing, so no row used an attempt.
    BrokerUnavailable(relay::PublishError),
}

impl fmt::Display for OutboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutboxError::InvalidInput(why) => write!(f, "outbox input refused: {why}"),
            OutboxError::Duplicate(id) => {
                write!(f, "the outbox already holds a message with id {id:?}")
            }
            OutboxError::Corrupt(why) => write!(f, "an outbox row cannot be read: {why}"),
            OutboxError::BrokerUnavailable(e) => write!(f, "the broker is unavailable: {e}"),
            OutboxError::Database(e) => {
                // The reason is often a few causes down: say each cause once.
                write!(f, "the outbox's database failed: {e}")?;
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

impl Error for OutboxError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            OutboxError::Database(e) => Some(&**e),
            OutboxError::BrokerUnavailable(e) => Some(e),
            _ => None,
        }
    }
}

impl OutboxError {
    /// The row of `message_id` cannot be read, and why.
    pub fn corrupt(message_id: &str, why: impl fmt::Display) -> OutboxError {
        OutboxError::Corrupt(format!("the row of message {message_id:?}: {why}"))
    }
}

/// `error` as stored: each NUL (which PostgreSQL's `TEXT` refuses, failing the mark)
/// written as U+FFFD, then cut to at most [`MAX_ERROR_LEN`] bytes at a character
/// boundary.
pub fn clip_error(error: &str) -> Cow<'_, str> {
    let mut error = if error.contains('\0') {
        Cow::Owned(error.replace('\0', "\u{FFFD}"))
    } else {
        error.into()
    };
    if error.len() > MAX_ERROR_LEN {
        let mut end = MAX_ERROR_LEN;
        while !error.is_char_boundary(end) {
            end -= 1;
        }
        match &mut error {
            Cow::Borrowed(text) => *text = &text[..end],
            Cow::Owned(text) => text.truncate(end),
        }
    }
    error
}

/// Checks a claim's batch size and lease as every driver does before claiming.
pub fn check_claim(batch: usize, lease: Duration) -> Result<(), OutboxError> {
    if batch == 0 || lease.is_zero() || lease > idemcache::MAX_DURATION {
        return Err(OutboxError::InvalidInput(format!(
            "a claim needs a batch of at least one row and a lease of more than zero and \
             at most MAX_DURATION (batch {batch}, lease {lease:?})"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_encode_deterministically_and_read_back() {
        let a = OutboxMessage::new("m", "t", &b""[..]).with_header("b", "2").with_header("a", "1");
        let b = OutboxMessage::new("m", "t", &b""[..]).with_header("a", "1").with_header("b", "2");
        assert_eq!(a.encoded_headers(), b.encoded_headers());
        assert_eq!(a.encoded_headers(), b"\0\x01a\0\0\0\x011\0\x01b\0\0\0\x012");
        assert_eq!(decode_headers(&a.encoded_headers()).unwrap(), *a.headers());
        assert!(encode_headers(&BTreeMap::new()).is_empty());
        assert_eq!(decode_headers(b"").unwrap(), BTreeMap::new());
    }

    #[test]
    fn unreadable_headers_say_why() {
        for (bytes, says) in [
            (&b"\0"[..], "cut short"),
            (b"\0\x05ab", "runs past the end"),
            (b"\0\x01a\0\0\0", "cut short"),
            (b"\0\x01\xff\0\0\0\0", "not UTF-8"),
            (b"\0\x01b\0\0\0\0\0\x01a\0\0\0\0", "out of order"),
            (b"\0\x01a\0\0\0\0\0\x01a\0\0\0\0", "repeated"),
        ] {
            let e = decode_headers(bytes).unwrap_err();
            assert!(e.contains(says), "{bytes:?}: {e}");
        }
    }

    #[test]
    fn messages_are_checked_like_the_inboxs_ids() {
        let ok = OutboxMessage::new("m-1", "orders", &b"x"[..]);
        assert!(ok.check().is_ok());
        let long = "x".repeat(256);
        for (message, says) in [
            (OutboxMessage::new("", "t", &b""[..]), "message id is empty"),
            (OutboxMessage::new("m\0", "t", &b""[..]), "NUL"),
            (OutboxMessage::new(long.clone(), "t", &b""[..]), "256 bytes"),
            (OutboxMessage::new("m", "", &b""[..]), "topic is empty"),
            (OutboxMessage::new("m", long.clone(), &b""[..]), "topic is 256 bytes"),
            (ok.clone().with_aggregate_key(""), "aggregate key is empty"),
            (ok.clone().with_header("", "v"), "header name is empty"),
            (ok.clone().with_header("h", "v\0"), "header value holds a NUL"),
        ] {
            let e = message.check().unwrap_err();
            assert!(matches!(e, OutboxError::InvalidInput(_)), "{e:?}");
            assert!(e.to_string().contains(says), "{e}");
        }
        let mut many = ok.clone();
        for i in 0..=MAX_HEADERS {
            many = many.with_header(format!("h{i}"), "");
        }
        assert!(many.check().unwrap_err().to_string().contains("65 headers"));
    }

    #[test]
    fn retries_double_up_to_the_cap_then_die() {
        let s = Duration::from_secs;
        let retry = Retry::new(s(2), s(10), 6).unwrap();
        let now = SystemTime::UNIX_EPOCH + s(100);
        let delays: Vec<Next> = (1..=6).map(|n| retry.after(n, now)).collect();
        let at = |d| Next::At(now + s(d));
        assert_eq!(delays, [at(2), at(4), at(8), at(10), at(10), Next::Dead]);
        // A huge attempt count neither overflows nor panics.
        let patient = Retry::new(s(1), s(60), u32::MAX).unwrap();
        assert_eq!(patient.after(u32::MAX - 1, now), at(60));
        assert!(Retry::new(Duration::ZERO, s(1), 1).is_err());
        assert!(Retry::new(s(2), s(1), 1).is_err());
        assert!(Retry::new(s(1), s(1), 0).is_err());
        // A cap past what a clock can add is refused; the longest one taken still waits.
        assert!(Retry::new(s(1), Duration::MAX, 3).is_err());
        let longest = Retry::new(idemcache::MAX_DURATION, idemcache::MAX_DURATION, 3).unwrap();
        assert_eq!(longest.after(1, now), Next::At(now + idemcache::MAX_DURATION));
    }

    #[test]
    fn states_round_trip_and_unknown_codes_are_none() {
        for state in [State::Pending, State::Leased, State::Delivered, State::Dead] {
            assert_eq!(State::from_code(state.code()), Some(state));
        }
        assert_eq!(State::from_code(9), None);
        assert_eq!(State::from_code(-1), None);
    }

    #[test]
    fn errors_are_clipped_at_a_character_boundary() {
        let long = "é".repeat(MAX_ERROR_LEN);
        let clipped = clip_error(&long);
        assert!(clipped.len() <= MAX_ERROR_LEN && clipped.len() >= MAX_ERROR_LEN - 1);
        assert_eq!(clip_error("short"), "short");
        assert_eq!(clip_error("a\0b"), "a\u{FFFD}b", "NUL, which PostgreSQL refuses, replaced");
        let nuls = "\0".repeat(MAX_ERROR_LEN);
        let nuls = clip_error(&nuls);
        assert!(nuls.len() <= MAX_ERROR_LEN && nuls.chars().all(|c| c == '\u{FFFD}'));
    }
}
