//! [`DownstreamKey`]: the idempotency key a claim hands to an outside system it calls.
//!
//! Invariant: a downstream key is a function of the claim's key, its request's
//! fingerprint and the call's purpose alone, fixed across processes and releases
//! (xxh3-128, whose output its specification fixes, over those three framed by length).
//! So every execution of one intent (the first, a retry after a release, a takeover
//! after a lapsed lease, the reconciler asking about an UNKNOWN entry) names the same
//! call with the same key, and the provider's own idempotency turns a second call into
//! the first one's answer; another request under a reused key (another fingerprint), or
//! another call of the same execution (another purpose), gets another key.

use std::fmt;

use xxhash_rust::xxh3::xxh3_128;

use crate::{Fingerprint, Key, UnknownEntry};

/// Most bytes in a downstream key's purpose.
pub const MAX_PURPOSE_LEN: usize = 32;

/// The idempotency key of one call an execution makes to an outside system: pass it as
/// the provider's `Idempotency-Key` header (or its equivalent), and the provider answers
/// a repeated call with the first one's result instead of acting twice.
///
/// `purpose` names the call within the execution (`"charge"`, `"email"`), so that each
/// call has its own key. The key reads `{purpose}-{32 hex digits}`: at most 65 bytes of
/// `[A-Za-z0-9_-]`, within every provider's limit (Stripe's is 255).
///
/// ```
/// use idemcache::{DownstreamKey, Fingerprint, Key};
///
/// let key = Key::new("POST /orders", "alice", "k-1")?;
/// let request = Fingerprint::of(b"{\"amount\":100}");
/// let charge = DownstreamKey::derive(&key, request, "charge")?;
/// // The same in a retry, another process, or the reconciler:
/// assert_eq!(charge, DownstreamKey::derive(&key, request, "charge")?);
/// assert_ne!(charge, DownstreamKey::derive(&key, request, "email")?);
/// assert!(charge.as_str().starts_with("charge-"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A reconciler asks the provider about the same call by the same key: see
/// [`UnknownEntry::downstream_key`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DownstreamKey(String);

/// Why a purpose was refused by [`DownstreamKey::derive`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PurposeError {
    /// It was empty.
    Empty,
    /// It is longer than [`MAX_PURPOSE_LEN`].
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// It holds a byte other than an ASCII letter, digit, `_` or `-`.
    Invalid {
        /// Byte offset of the first offending byte.
        at: usize,
    },
}

impl fmt::Display for PurposeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PurposeError::Empty => f.write_str("a downstream key's purpose is empty"),
            PurposeError::TooLong { len } => write!(
                f,
                "a downstream key's purpose is {len} bytes, more than the limit of {MAX_PURPOSE_LEN}"
            ),
            PurposeError::Invalid { at } => write!(
                f,
                "byte {at} of a downstream key's purpose is not an ASCII letter, digit, '_' or '-'"
            ),
        }
    }
}

impl std::error::Error for PurposeError {}

impl DownstreamKey {
    /// The key of the call named `purpose` made by the execution of `key` for the request
    /// with `fingerprint` (see the type's docs). `purpose` is 1 to [`MAX_PURPOSE_LEN`]
    /// bytes of ASCII letters, digits, `_` and `-`.
    pub fn derive(
        key: &Key,
        fingerprint: Fingerprint,
        purpose: &str,
    ) -> Result<DownstreamKey, PurposeError> {
        check(purpose)?;
        let stored = key.as_bytes();
        let mut framed = Vec::with_capacity(8 + stored.len() + 16 + 8 + purpose.len());
        framed.extend_from_slice(&(stored.len() as u64).to_be_bytes());
        framed.extend_from_slice(stored);
        framed.extend_from_slice(&fingerprint.to_bytes());
        framed.extend_from_slice(&(purpose.len() as u64).to_be_bytes());
        framed.extend_from_slice(purpose.as_bytes());
        Ok(DownstreamKey(format!("{purpose}-{:032x}", xxh3_128(&framed))))
    }

    /// The key, for the provider's header.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DownstreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for DownstreamKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl<At> UnknownEntry<At> {
    /// The [`DownstreamKey`] the execution whose outcome is unknown used for the call
    /// named `purpose`: what a reconciler asks the provider about ("did the charge with
    /// this idempotency key happen?") before it resolves or forgets the entry.
    pub fn downstream_key(&self, purpose: &str) -> Result<DownstreamKey, PurposeError> {
        DownstreamKey::derive(&self.key, self.fingerprint, purpose)
    }
}

fn check(purpose: &str) -> Result<(), PurposeError> {
    if purpose.is_empty() {
        return Err(PurposeError::Empty);
    }
    if purpose.len() > MAX_PURPOSE_LEN {
        return Err(PurposeError::TooLong { len: purpose.len() });
    }
    match purpose.bytes().position(|b| !(b.is_ascii_alphanumeric() || b == b'_' || b == b'-')) {
        Some(at) => Err(PurposeError::Invalid { at }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(client: &str) -> Key {
        Key::new("POST /orders", "alice", client).unwrap()
    }

    #[test]
    fn the_key_is_pinned_across_releases() {
        // A change here changes every key a deployed service hands its providers: a
        // retry after an upgrade would be a new call to them.
        let derived = DownstreamKey::derive(&key("k-1"), Fingerprint::from_u128(7), "charge");
        let pinned = derived.unwrap();
        assert_eq!(pinned.as_str().len(), "charge-".len() + 32);
        assert_eq!(pinned.as_str(), PINNED);
    }

    const PINNED: &str = "charge-e37aacfeb3b9cf74dcf18c9d9997dad7";

    #[test]
    fn each_part_changes_the_key() {
        let base = DownstreamKey::derive(&key("k-1"), Fingerprint::from_u128(7), "charge");
        let base = base.unwrap();
        for other in [
            DownstreamKey::derive(&key("k-2"), Fingerprint::from_u128(7), "charge"),
            DownstreamKey::derive(&key("k-1"), Fingerprint::from_u128(8), "charge"),
            DownstreamKey::derive(&key("k-1"), Fingerprint::from_u128(7), "email"),
            DownstreamKey::derive(
                &Key::without_tenant("POST /orders", "k-1").unwrap(),
                Fingerprint::from_u128(7),
                "charge",
            ),
        ] {
            assert_ne!(other.unwrap(), base);
        }
    }

    #[test]
    fn a_purpose_is_checked_and_named_in_its_error() {
        let derive = |p: &str| DownstreamKey::derive(&key("k"), Fingerprint::from_u128(1), p);
        assert_eq!(derive(""), Err(PurposeError::Empty));
        assert_eq!(derive(&"a".repeat(33)), Err(PurposeError::TooLong { len: 33 }));
        assert!(derive(&"a".repeat(32)).is_ok());
        assert_eq!(derive("charge card"), Err(PurposeError::Invalid { at: 6 }));
        assert_eq!(derive("é"), Err(PurposeError::Invalid { at: 0 }));
        assert!(derive("refund_2-b").is_ok());
        assert!(derive("x y").unwrap_err().to_string().contains("byte 1"));
    }

    #[test]
    fn an_unknown_entry_names_the_key_its_execution_used() {
        let (k, fp) = (key("k-1"), Fingerprint::from_u128(7));
        let entry = UnknownEntry::new(
            k.clone(),
            fp,
            crate::FencingToken::new(3),
            crate::Timestamp::from_nanos(1),
            crate::Timestamp::from_nanos(2),
        );
        assert_eq!(entry.downstream_key("charge"), DownstreamKey::derive(&k, fp, "charge"));
    }
}
