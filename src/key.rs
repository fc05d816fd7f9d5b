//! [`Key`]: the name of one intent, `(scope, tenant, client_key)`.
//!
//! Invariant: a `Key` only exists in its validated, length-prefixed stored form, so two
//! different part-tuples can never share one stored form (`("a:b", "c")` and `("a", "b:c")`
//! differ in their length prefixes), and every accessor can slice the parts back out
//! without re-checking.
//!
//! Stored form, all lengths big-endian:
//!
//! ```text
//! scope_len:u16  scope  tenant_tag:u8 (0 = none, 1 = some)  [tenant_len:u16  tenant]
//! client_len:u8  client_key
//! ```

use std::fmt;

/// Most bytes that scope and tenant may take together.
pub const MAX_SCOPE_AND_TENANT_LEN: usize = 1024;

/// Most bytes in a client key (the `Idempotency-Key` header value).
pub const MAX_CLIENT_KEY_LEN: usize = 255;

const TENANT_NONE: u8 = 0;
const TENANT_SOME: u8 = 1;

/// The name of one business intent: `(scope, tenant, client_key)`.
///
/// - `scope` names the operation, e.g. `"POST /v1/orders"`; non-empty.
/// - `tenant` names whose key space it is, e.g. `"user:42"`; non-empty when present, and
///   absent only when you say so with [`Key::without_tenant`].
/// - `client_key` is what the client sent, e.g. the `Idempotency-Key` header: 1 to 255
///   bytes of visible ASCII (`!` to `~`), as HTTP idempotency keys are.
///
/// Scope and tenant together take at most [`MAX_SCOPE_AND_TENANT_LEN`] bytes.
///
/// ```
/// use idemcache::Key;
///
/// let key = Key::new("POST /v1/orders", "user:42", "8e03978e-40d5-43e8-bc93-6894a57f9324")?;
/// assert_eq!(key.tenant(), Some("user:42"));
/// let anonymous = Key::without_tenant("POST /v1/orders", "8e03978e")?;
/// assert_eq!(anonymous.tenant(), None);
/// # Ok::<(), idemcache::KeyError>(())
/// ```
#[derive(Clone)]
pub struct Key {
    stored: Stored,
}

/// Stored forms of up to this many bytes live inside the `Key` (72 bytes in all), with no
/// heap allocation: a replay hit then compares the key in the map slot it already
/// loaded instead of missing the cache on a second allocation, building a key allocates
/// nothing, and a short key costs less memory than a `Box<[u8]>` and its allocation
/// would. `("POST /v1/orders", "user:42", <UUID>)` is 64 bytes; with a 32-character hex
/// key, 60. 69 is what the 128-byte map entry has room for (see `src/shard/entry.rs`).
pub(crate) const INLINE_KEY_LEN: usize = 69;

/// Stored forms up to this long are encoded on the stack before being copied to the heap
/// (a scope, a tenant and a UUID-sized client key fit).
const STACK_KEY_LEN: usize = 128;

#[derive(Clone)]
enum Stored {
    Inline { len: u8, bytes: [u8; INLINE_KEY_LEN] },
    Heap(Box<[u8]>),
}

// The entry's layout (and the figure in INLINE_KEY_LEN's doc) depends on this.
const _: () = assert!(std::mem::size_of::<Key>() == 72);

impl PartialEq for Key {
    #[inline]
    fn eq(&self, other: &Key) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Key) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Key) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

/// Why a key was refused. Nothing is created when a key is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The scope was empty.
    EmptyScope,
    /// A tenant was given but was empty; use [`Key::without_tenant`] for "no tenant".
    EmptyTenant,
    /// Scope and tenant together are longer than [`MAX_SCOPE_AND_TENANT_LEN`].
    ScopeAndTenantTooLong {
        /// Their combined length in bytes.
        len: usize,
    },
    /// The client key was empty.
    EmptyClientKey,
    /// The client key is longer than [`MAX_CLIENT_KEY_LEN`].
    ClientKeyTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The client key holds a byte outside visible ASCII (`!` to `~`).
    ClientKeyNotVisibleAscii {
        /// Byte offset of the first offending byte.
        at: usize,
        /// The offending byte.
        byte: u8,
    },
    /// [`Key::from_bytes`] was given bytes that are not a stored key.
    Malformed,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::EmptyScope => f.write_str("key scope is empty"),
            KeyError::EmptyTenant => f.write_str(
                "key tenant is empty; use Key::without_tenant for a key with no tenant",
            ),
            KeyError::ScopeAndTenantTooLong { len } => write!(
                f,
                "key scope and tenant are {len} bytes together, more than the limit of {MAX_SCOPE_AND_TENANT_LEN}"
            ),
            KeyError::EmptyClientKey => f.write_str("client key is empty"),
            KeyError::ClientKeyTooLong { len } => write!(
                f,
                "client key is {len} bytes, more than the limit of {MAX_CLIENT_KEY_LEN}"
            ),
            KeyError::ClientKeyNotVisibleAscii { at, byte } => write!(
                f,
                "client key byte {at} is 0x{byte:02x}; only visible ASCII ('!' to '~') is allowed"
            ),
            KeyError::Malformed => f.write_str("bytes are not a stored idemcache key"),
        }
    }
}

impl std::error::Error for KeyError {}

impl Key {
    /// A key owned by `tenant`.
    ///
    /// `client_key` is a `&str` or the header's bytes as they arrived (`&[u8]`,
    /// `HeaderValue::as_bytes()`, or the `&HeaderValue` itself): a key is checked to be
    /// visible ASCII here, which is also what `HeaderValue::to_str` checks, so bytes need
    /// no check of their own first.
    ///
    /// ```
    /// use idemcache::Key;
    ///
    /// let header: &[u8] = b"8e03978e-40d5-43e8-bc93-6894a57f9324";
    /// let key = Key::new("POST /v1/orders", "user:42", header)?;
    /// assert_eq!(key, Key::new("POST /v1/orders", "user:42", "8e03978e-40d5-43e8-bc93-6894a57f9324")?);
    /// # Ok::<(), idemcache::KeyError>(())
    /// ```
    pub fn new(scope: &str, tenant: &str, client_key: impl AsRef<[u8]>) -> Result<Key, KeyError> {
        if tenant.is_empty() {
            return Err(KeyError::EmptyTenant);
        }
        Key::build(scope, Some(tenant), client_key.as_ref())
    }

    /// A key with no tenant: one key space shared by every caller of `scope`. The client
    /// key is a `&str` or bytes, as for [`Key::new`].
    pub fn without_tenant(scope: &str, client_key: impl AsRef<[u8]>) -> Result<Key, KeyError> {
        Key::build(scope, None, client_key.as_ref())
    }

    /// `client_key` is bytes: `check_parts` accepts only visible ASCII, so a key built
    /// is always UTF-8 (`client_key()` relies on it).
    fn build(scope: &str, tenant: Option<&str>, client_key: &[u8]) -> Result<Key, KeyError> {
        check_parts(scope.as_bytes(), tenant.map(str::as_bytes), client_key)?;
        let len = 2 + scope.len() + 1 + tenant.map_or(0, |t| 2 + t.len()) + 1 + client_key.len();
        let stored = if len <= INLINE_KEY_LEN {
            let mut bytes = [0u8; INLINE_KEY_LEN];
            encode(scope, tenant, client_key, &mut bytes[..len]);
            // len <= INLINE_KEY_LEN < 256.
            Stored::Inline { len: len as u8, bytes }
        } else if len <= STACK_KEY_LEN {
            // Encoded on the stack, then copied into an allocation of exactly `len`: no
            // zeroing of the heap buffer, no growth checks per part.
            let mut bytes = [0u8; STACK_KEY_LEN];
            encode(scope, tenant, client_key, &mut bytes[..len]);
            Stored::Heap(Box::from(&bytes[..len]))
        } else {
            let mut bytes = vec![0u8; len].into_boxed_slice();
            encode(scope, tenant, client_key, &mut bytes);
            Stored::Heap(bytes)
        };
        Ok(Key { stored })
    }

    /// Parses a stored form produced by [`Key::as_bytes`], checking every rule a
    /// constructor checks.
    pub fn from_bytes(bytes: &[u8]) -> Result<Key, KeyError> {
        let parts = split(bytes).ok_or(KeyError::Malformed)?;
        let scope = std::str::from_utf8(parts.scope).map_err(|_| KeyError::Malformed)?;
        let tenant = match parts.tenant {
            None => None,
            Some(t) => Some(std::str::from_utf8(t).map_err(|_| KeyError::Malformed)?),
        };
        // `build` checks every rule a constructor checks (a client key of visible ASCII
        // is UTF-8), and re-encodes to `bytes`.
        Key::build(scope, tenant, parts.client_key)
    }

    /// The stored, length-prefixed form: what the cache hashes and compares, and what a
    /// durable store can keep and hand back to [`Key::from_bytes`].
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        match &self.stored {
            Stored::Inline { len, bytes } => &bytes[..*len as usize],
            Stored::Heap(bytes) => bytes,
        }
    }

    /// The scope, e.g. `"POST /v1/orders"`.
    pub fn scope(&self) -> &str {
        self.str_part(self.parts().scope)
    }

    /// The tenant, or `None` for a key made by [`Key::without_tenant`].
    pub fn tenant(&self) -> Option<&str> {
        self.parts().tenant.map(|t| self.str_part(t))
    }

    /// The client's key, e.g. the `Idempotency-Key` header value.
    pub fn client_key(&self) -> &str {
        self.str_part(self.parts().client_key)
    }

    fn parts(&self) -> Parts<'_> {
        split(self.as_bytes()).expect("a Key always holds a valid stored form")
    }

    fn str_part<'a>(&'a self, part: &'a [u8]) -> &'a str {
        std::str::from_utf8(part).expect("a Key's parts were built from str")
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Key")
            .field("scope", &self.scope())
            .field("tenant", &self.tenant())
            .field("client_key", &self.client_key())
            .finish()
    }
}

/// Writes the stored form into `out`, which is exactly its length. The casts cannot
/// truncate: `check_parts` bounded every length first. Offsets are computed up front
/// (each part's start is known from the lengths), so the parts are copied with no
/// cursor threaded from one to the next: a 60-byte key is built in about half the
/// instructions a cursor took (callgrind).
#[inline]
fn encode(scope: &str, tenant: Option<&str>, client_key: &[u8], out: &mut [u8]) {
    let scope = scope.as_bytes();
    out[..2].copy_from_slice(&(scope.len() as u16).to_be_bytes());
    let mut at = 2 + scope.len();
    out[2..at].copy_from_slice(scope);
    match tenant {
        None => {
            out[at] = TENANT_NONE;
            at += 1;
        }
        Some(t) => {
            let t = t.as_bytes();
            out[at] = TENANT_SOME;
            out[at + 1..at + 3].copy_from_slice(&(t.len() as u16).to_be_bytes());
            out[at + 3..at + 3 + t.len()].copy_from_slice(t);
            at += 3 + t.len();
        }
    }
    out[at] = client_key.len() as u8;
    out[at + 1..].copy_from_slice(client_key);
}

fn check_parts(scope: &[u8], tenant: Option<&[u8]>, client_key: &[u8]) -> Result<(), KeyError> {
    if scope.is_empty() {
        return Err(KeyError::EmptyScope);
    }
    if tenant.is_some_and(<[u8]>::is_empty) {
        return Err(KeyError::EmptyTenant);
    }
    let len = scope.len() + tenant.map_or(0, <[u8]>::len);
    if len > MAX_SCOPE_AND_TENANT_LEN {
        return Err(KeyError::ScopeAndTenantTooLong { len });
    }
    if client_key.is_empty() {
        return Err(KeyError::EmptyClientKey);
    }
    if client_key.len() > MAX_CLIENT_KEY_LEN {
        return Err(KeyError::ClientKeyTooLong { len: client_key.len() });
    }
    // Where the first bad byte is, is looked for only once one is known to be there.
    if !all_visible_ascii(client_key) {
        let at = client_key.iter().position(|b| !b.is_ascii_graphic()).unwrap_or(0);
        return Err(KeyError::ClientKeyNotVisibleAscii { at, byte: client_key[at] });
    }
    Ok(())
}

/// Whether every byte is visible ASCII (`!` to `~`), eight bytes per step: in a word, a
/// byte below 0x21 or above 0x7e sets its high bit in `below` or `above` (the classic
/// "has a byte less than / more than n" word tests, exact for n <= 128 and n <= 127).
fn all_visible_ascii(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = ONES * 0x80;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let x = u64::from_ne_bytes(word.try_into().expect("8 bytes"));
        let below = x.wrapping_sub(ONES * 0x21) & !x & HIGH;
        // + (127 - 0x7e) per byte, which is ONES.
        let above = (x.wrapping_add(ONES) | x) & HIGH;
        if below | above != 0 {
            return false;
        }
    }
    words.remainder().iter().all(u8::is_ascii_graphic)
}

struct Parts<'a> {
    scope: &'a [u8],
    tenant: Option<&'a [u8]>,
    client_key: &'a [u8],
}

/// Splits a stored form into its parts; `None` unless the framing is exact (no bytes
/// missing, none left over).
fn split(bytes: &[u8]) -> Option<Parts<'_>> {
    fn take<'a>(rest: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if rest.len() < n {
            return None;
        }
        let (head, tail) = rest.split_at(n);
        *rest = tail;
        Some(head)
    }
    fn take_u16(rest: &mut &[u8]) -> Option<usize> {
        let b = take(rest, 2)?;
        Some(u16::from_be_bytes([b[0], b[1]]) as usize)
    }
    let mut rest = bytes;
    let scope_len = take_u16(&mut rest)?;
    let scope = take(&mut rest, scope_len)?;
    let tenant = match take(&mut rest, 1)?[0] {
        TENANT_NONE => None,
        TENANT_SOME => {
            let len = take_u16(&mut rest)?;
            Some(take(&mut rest, len)?)
        }
        _ => return None,
    };
    let client_len = take(&mut rest, 1)?[0] as usize;
    let client_key = take(&mut rest, client_len)?;
    rest.is_empty().then_some(Parts { scope, tenant, client_key })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The word test agrees with the byte test: every byte value in every position of a
    /// word and of the tail, and random words rich in the boundary values.
    #[test]
    fn the_word_test_agrees_with_the_byte_test() {
        let slow = |b: &[u8]| b.iter().all(u8::is_ascii_graphic);
        for len in [1, 7, 8, 9, 16, 17] {
            for at in 0..len {
                for byte in 0..=255u8 {
                    let mut key = vec![b'a'; len];
                    key[at] = byte;
                    assert_eq!(all_visible_ascii(&key), slow(&key), "{byte:#x} at {at} of {len}");
                }
            }
        }
        let edges = [0x00, 0x20, 0x21, 0x22, 0x7d, 0x7e, 0x7f, 0x80, 0xa1, 0xfe, 0xff, b'a'];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let word: Vec<u8> =
                (0..16).map(|i| edges[(x >> (i * 4)) as usize % edges.len()]).collect();
            assert_eq!(all_visible_ascii(&word), slow(&word), "{word:x?}");
        }
    }

    /// A client key given as bytes is the same key as the same text, and bytes that are
    /// not visible ASCII (so perhaps not UTF-8) are refused with where they are.
    #[test]
    fn client_keys_as_bytes_are_checked_like_text() {
        let text = Key::new("s", "t", "abc-123").unwrap();
        assert_eq!(Key::new("s", "t", b"abc-123").unwrap(), text);
        assert_eq!(Key::new("s", "t", b"abc-123".as_slice()).unwrap(), text);
        assert_eq!(Key::new("s", "t", String::from("abc-123")).unwrap(), text);
        assert_eq!(Key::without_tenant("s", b"k").unwrap(), Key::without_tenant("s", "k").unwrap());
        for (bytes, at, byte) in
            [(&b"ab\xffc"[..], 2, 0xff), (&b"\xc3\xa9"[..], 0, 0xc3), (&b"a b"[..], 1, b' ')]
        {
            assert_eq!(
                Key::new("s", "t", bytes),
                Err(KeyError::ClientKeyNotVisibleAscii { at, byte }),
                "{bytes:?}"
            );
        }
        assert_eq!(text.client_key(), "abc-123");
    }

    #[test]
    fn parts_cannot_run_into_each_other() {
        let a = Key::new("a:b", "c", "k").unwrap();
        let b = Key::new("a", "b:c", "k").unwrap();
        assert_ne!(a.as_bytes(), b.as_bytes());
        let c = Key::without_tenant("a", "k").unwrap();
        let d = Key::new("a", "x", "k").unwrap();
        assert_ne!(c, d);
    }

    #[test]
    fn short_keys_are_inline_long_keys_on_the_heap_and_both_compare_by_bytes() {
        // A scope, a tenant and a UUID, as the layer builds them, stay inline.
        let uuid = "8e03978e-40d5-43e8-bc93-6894a57f9324";
        let short = Key::new("POST /v1/orders", "user:42", uuid).unwrap();
        assert_eq!(short.as_bytes().len(), 64);
        assert!(matches!(short.stored, Stored::Inline { .. }));
        let long = Key::new("POST /v1/orders", "user:42", "k".repeat(100)).unwrap();
        assert!(matches!(long.stored, Stored::Heap(_)));
        for len in [INLINE_KEY_LEN - 1, INLINE_KEY_LEN, INLINE_KEY_LEN + 1] {
            let client = "c".repeat(len - 5);
            let key = Key::without_tenant("s", &client).unwrap();
            assert_eq!(key.as_bytes().len(), len);
            assert_eq!(Key::from_bytes(key.as_bytes()).unwrap(), key);
            assert_eq!(key.client_key(), client);
        }
    }

    #[test]
    fn stored_form_round_trips() {
        for key in [
            Key::new("POST /v1/orders", "user:42", "abc-123").unwrap(),
            Key::without_tenant("é scope", "~!").unwrap(),
        ] {
            assert_eq!(Key::from_bytes(key.as_bytes()).unwrap(), key);
        }
    }

    #[test]
    fn malformed_stored_forms_are_refused() {
        let key = Key::new("s", "t", "k").unwrap();
        let bytes = key.as_bytes();
        for cut in 0..bytes.len() {
            assert!(Key::from_bytes(&bytes[..cut]).is_err(), "prefix {cut} accepted");
        }
        let mut longer = bytes.to_vec();
        longer.push(b'x');
        assert_eq!(Key::from_bytes(&longer), Err(KeyError::Malformed));
    }
}

/// Keys from any bytes (an adversarial review's models): what is accepted, what it
/// reads back as, and that a stored form names one key.
#[cfg(test)]
mod any_bytes {
    use proptest::prelude::*;

    use super::*;

    fn bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..300),
            proptest::collection::vec(
                prop_oneof![0x1fu8..0x23, 0x7cu8..0x83, 0xc0u8..0xc4, 0xfeu8..=0xff, Just(b'a')],
                0..300
            ),
            (250usize..260).prop_map(|n| vec![b'k'; n]),
            (0usize..300, any::<u8>(), 0usize..300).prop_map(|(n, b, at)| {
                let mut v = vec![b'x'; n];
                if n > 0 {
                    v[at % n] = b;
                }
                v
            }),
        ]
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![".{0,20}", "[a-z:/ ]{1,8}", (1020usize..1030).prop_map(|n| "s".repeat(n))]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 1000,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Any bytes: a key built is exactly the visible-ASCII, 1..=255 client key the
        /// `&str` form accepts; accessors never panic; from_bytes(as_bytes) round
        /// trips; as `&str`, `&[u8]`, `Vec<u8>` the same result.
        #[test]
        fn a_client_key_of_any_bytes_is_accepted_exactly_when_visible_ascii(scope in text(), tenant in prop::option::of(text()), ck in bytes()) {
            let r = match &tenant {
                Some(t) => Key::new(&scope, t, &ck),
                None => Key::without_tenant(&scope, &ck),
            };
            let r2 = match &tenant {
                Some(t) => Key::new(&scope, t, ck.clone()),
                None => Key::without_tenant(&scope, ck.as_slice()),
            };
            prop_assert_eq!(&r, &r2);
            let ok_ck = !ck.is_empty() && ck.len() <= MAX_CLIENT_KEY_LEN && ck.iter().all(|b| (b'!'..=b'~').contains(b));
            if let Ok(s) = std::str::from_utf8(&ck) {
                let r3 = match &tenant {
                    Some(t) => Key::new(&scope, t, s),
                    None => Key::without_tenant(&scope, s),
                };
                prop_assert_eq!(&r, &r3);
            }
            match r {
                Ok(k) => {
                    prop_assert!(ok_ck, "accepted {:?}", ck);
                    prop_assert_eq!(k.client_key().as_bytes(), &ck[..]);
                    prop_assert_eq!(k.scope(), scope.as_str());
                    prop_assert_eq!(k.tenant(), tenant.as_deref());
                    let _ = format!("{k:?}");
                    let back = Key::from_bytes(k.as_bytes()).unwrap();
                    prop_assert_eq!(back.as_bytes(), k.as_bytes());
                }
                Err(e) => {
                    let scope_ok = !scope.is_empty() && tenant.as_ref().is_none_or(|t| !t.is_empty())
                        && scope.len() + tenant.as_ref().map_or(0, |t| t.len()) <= MAX_SCOPE_AND_TENANT_LEN;
                    prop_assert!(!ok_ck || !scope_ok, "refused {:?}: {:?}", ck, e);
                    if scope_ok {
                        if let KeyError::ClientKeyNotVisibleAscii { at, byte } = e {
                            let first = ck.iter().position(|b| !b.is_ascii_graphic()).unwrap();
                            prop_assert_eq!((at, byte), (first, ck[first]));
                        }
                    }
                }
            }
        }

        /// Arbitrary bytes into from_bytes: never panics; an accepted stored form is
        /// exactly its input (one stored form per key), accessors never panic, and it
        /// equals the key built from its parts.
        #[test]
        fn any_bytes_read_as_a_stored_form_are_that_form_or_refused(raw in proptest::collection::vec(any::<u8>(), 0..400),
                                    sl in 0u16..12, tag in 0u8..3, tl in 0u16..12, cl in any::<u8>(), framed in any::<bool>()) {
            let input = if framed {
                // A plausible framing with arbitrary contents.
                let mut v = Vec::new();
                let mut it = raw.iter().copied().chain(std::iter::repeat(b'!'));
                v.extend(sl.to_be_bytes());
                v.extend(it.by_ref().take(sl as usize));
                v.push(tag);
                if tag == 1 {
                    v.extend(tl.to_be_bytes());
                    v.extend(it.by_ref().take(tl as usize));
                }
                v.push(cl);
                v.extend(it.take(cl as usize));
                v
            } else {
                raw
            };
            if let Ok(k) = Key::from_bytes(&input) {
                prop_assert_eq!(k.as_bytes(), &input[..]);
                let rebuilt = match k.tenant() {
                    Some(t) => Key::new(k.scope(), t, k.client_key()),
                    None => Key::without_tenant(k.scope(), k.client_key()),
                }.unwrap();
                prop_assert_eq!(rebuilt, k.clone());
                let _ = format!("{k:?}");
            }
        }
    }
}
