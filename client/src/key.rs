//! [`CallKey`]: the `Idempotency-Key` of one logical call, kept across its retries.
//!
//! Invariant: a key is chosen once per call, before its first attempt, and every
//! attempt of the call sends that key: the caller's (a [`CallKey`] in the request's
//! extensions, or an `Idempotency-Key` header it set), or one generated for the call.

use std::fmt;

use http::HeaderValue;
use idemcache::DownstreamKey;

/// The idempotency key of one logical call. Put it in the request's extensions
/// (`reqwest_middleware::RequestBuilder::with_extension`) to name the call; without
/// one, the middleware generates a key for the call (a random UUID) and keeps it for
/// every retry.
///
/// The usual key is the [`DownstreamKey`] of the execution that makes the call: it is
/// the same in a retry of that execution, in another process after a crash, and in the
/// reconciler that asks about the call later.
///
/// ```
/// use idemcache::{DownstreamKey, Fingerprint, Key};
/// use idemcache_client::CallKey;
///
/// let order = Key::new("POST /orders", "alice", "k-1")?;
/// let charge = DownstreamKey::derive(&order, Fingerprint::of(b"order 1"), "charge")?;
/// let key = CallKey::from(&charge);
/// assert_eq!(key.as_str(), charge.as_str());
/// assert!(CallKey::new("has a\nnewline").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CallKey(HeaderValue);

/// A key a header cannot carry (not visible ASCII, or empty), or longer than 255 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidCallKey(String);

impl fmt::Display for InvalidCallKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not an idempotency key: {}", self.0)
    }
}

impl std::error::Error for InvalidCallKey {}

/// The longest key: what the common providers take (Stripe's limit).
pub const MAX_KEY_LEN: usize = 255;

impl CallKey {
    /// `key` (a `&str` or a `String`), checked: 1 to [`MAX_KEY_LEN`] bytes of visible
    /// ASCII.
    pub fn new(key: impl AsRef<str>) -> Result<CallKey, InvalidCallKey> {
        let key = key.as_ref();
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(InvalidCallKey(format!("{} bytes, not 1 to {MAX_KEY_LEN}", key.len())));
        }
        if !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(InvalidCallKey(format!("{key:?} holds bytes other than visible ASCII")));
        }
        HeaderValue::from_str(key).map(CallKey).map_err(|e| InvalidCallKey(e.to_string()))
    }

    /// A key of its own for one call: a random (version 4) UUID.
    pub fn generate() -> CallKey {
        let uuid = uuid::Uuid::new_v4().hyphenated().to_string();
        CallKey(HeaderValue::from_str(&uuid).expect("a UUID is visible ASCII"))
    }

    /// The key as sent.
    pub fn as_str(&self) -> &str {
        self.0.to_str().expect("checked visible ASCII")
    }

    /// The header value.
    pub fn header_value(&self) -> &HeaderValue {
        &self.0
    }
}

impl From<&DownstreamKey> for CallKey {
    fn from(key: &DownstreamKey) -> CallKey {
        CallKey::new(key.as_str()).expect("a downstream key is at most 65 bytes of [A-Za-z0-9_-]")
    }
}

impl fmt::Debug for CallKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CallKey").field(&self.as_str()).finish()
    }
}

impl fmt::Display for CallKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked_and_generated_ones_differ() {
        assert!(CallKey::new("").is_err());
        assert!(CallKey::new("k".repeat(256)).is_err());
        assert!(CallKey::new("caf\u{e9}").is_err());
        assert!(CallKey::new("a b").is_err(), "a space is not visible ASCII");
        assert_eq!(CallKey::new("order-42").unwrap().as_str(), "order-42");
        let refused = CallKey::new("").unwrap_err().to_string();
        assert_eq!(refused, "not an idempotency key: 0 bytes, not 1 to 255");
        let key = CallKey::new("order-42").unwrap();
        assert_eq!(
            (format!("{key}"), format!("{key:?}")),
            ("order-42".into(), "CallKey(\"order-42\")".into())
        );
        let (a, b) = (CallKey::generate(), CallKey::generate());
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 36);
    }
}
