//! [`Fingerprint`]: a 128-bit digest of the request a key was first used with.
//!
//! Invariant: the digest of given input never changes, across processes, platforms and
//! crate versions, because fingerprints outlive the process (a durable tier stores them
//! next to the key). The algorithm is fixed and pinned by known-answer tests below; a
//! change to it is a breaking change and must get a new constructor, not a new body.
//!
//! Algorithm:
//! - [`Fingerprint::of`]: XXH3-128 (seed 0) of the bytes, as specified by the xxHash
//!   project (`XXH3_128bits`).
//! - [`FingerprintBuilder`]: XXH3-128 (seed 0) of a framed stream: for each part, one tag
//!   byte (`M`ethod, `P`ath, `H`eader, `B`ody, `X` other) followed by each field as a
//!   64-bit little-endian length and the field's bytes. Header names are lower-cased
//!   ASCII before hashing, as HTTP header names are case-insensitive. The framing means no
//!   two different part sequences hash the same stream.
//! - A body's one field is the XXH3-128 (seed 0) digest of the body's bytes, as 16
//!   big-endian bytes, not the bytes themselves: a body arrives in chunks whose total
//!   length is known only at its end, and a length-prefixed field needs it first. So
//!   consecutive [`FingerprintBuilder::body`] calls hash the concatenation of their
//!   chunks, however it was split. (Chosen before any release stored a fingerprint;
//!   the pinned vectors below were computed independently with python-xxhash.)
//!
//! XXH3 is not a cryptographic hash: a fingerprint detects a client reusing a key for a
//! different request, it does not defend against an adversary crafting collisions within
//! their own tenant's key space (they could only confuse themselves).

use std::fmt;

use xxhash_rust::xxh3::{xxh3_128, Xxh3Default};

/// A 128-bit, stable digest of a request. Two requests with the same key but different
/// fingerprints are a [`Claim::Mismatch`](crate::Claim::Mismatch).
///
/// ```
/// use idemcache::Fingerprint;
///
/// let whole = Fingerprint::of(b"{\"amount\":100}");
/// let parts = Fingerprint::builder()
///     .method("POST")
///     .path("/v1/orders")
///     .header("Content-Type", b"application/json")
///     .body(b"{\"amount\":100}")
///     .finish();
/// assert_ne!(whole, parts);
/// assert_eq!(Fingerprint::from_u128(whole.as_u128()), whole);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint {
    // Two halves rather than a u128: a u128 is 16-byte aligned, which would pad every
    // map entry. (hi, lo) orders exactly as the u128 does.
    hi: u64,
    lo: u64,
}

impl Fingerprint {
    /// The fingerprint of a byte string: XXH3-128 with seed 0.
    pub fn of(bytes: &[u8]) -> Fingerprint {
        Fingerprint::from_u128(xxh3_128(bytes))
    }

    /// Starts a fingerprint built from request parts.
    pub fn builder() -> FingerprintBuilder {
        FingerprintBuilder { hasher: Xxh3Default::new(), body: None }
    }

    /// Rebuilds a fingerprint from [`Fingerprint::as_u128`], e.g. read from a store.
    pub const fn from_u128(value: u128) -> Fingerprint {
        Fingerprint { hi: (value >> 64) as u64, lo: value as u64 }
    }

    /// The digest as a number.
    pub const fn as_u128(self) -> u128 {
        (self.hi as u128) << 64 | self.lo as u128
    }

    /// The digest as 16 big-endian bytes, e.g. for a `BYTEA`/`BLOB` column.
    pub const fn to_bytes(self) -> [u8; 16] {
        self.as_u128().to_be_bytes()
    }

    /// Rebuilds a fingerprint from [`Fingerprint::to_bytes`]. (From a slice of unknown
    /// length, `Fingerprint::try_from(bytes)`.)
    pub const fn from_bytes(bytes: [u8; 16]) -> Fingerprint {
        Fingerprint::from_u128(u128::from_be_bytes(bytes))
    }
}

impl TryFrom<&[u8]> for Fingerprint {
    type Error = std::array::TryFromSliceError;

    /// Rebuilds a fingerprint from [`Fingerprint::to_bytes`] read back as a slice: an
    /// error unless it is exactly 16 bytes.
    fn try_from(bytes: &[u8]) -> Result<Fingerprint, Self::Error> {
        <[u8; 16]>::try_from(bytes).map(Fingerprint::from_bytes)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({:032x})", self.as_u128())
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.as_u128())
    }
}

/// Builds a [`Fingerprint`] from the parts of a request, in the order given.
///
/// Feed only what defines the intent: typically the method, the path, the few headers
/// that change meaning (content type, API version) and the body; never a timestamp or
/// trace header, or every retry would be a mismatch.
#[derive(Clone)]
#[must_use = "a builder does nothing until finish() is called"]
pub struct FingerprintBuilder {
    hasher: Xxh3Default,
    /// The body being fed, chunk by chunk, until another part or `finish` closes it.
    /// Boxed: the builder moves by value through every call.
    body: Option<Box<Xxh3Default>>,
}

impl fmt::Debug for FingerprintBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FingerprintBuilder").finish_non_exhaustive()
    }
}

impl FingerprintBuilder {
    /// Adds the request method, e.g. `"POST"`.
    pub fn method(self, method: &str) -> Self {
        self.part(b'M', &[method.as_bytes()])
    }

    /// Adds the request path (and query, if it matters), e.g. `"/v1/orders"`.
    pub fn path(self, path: &str) -> Self {
        self.part(b'P', &[path.as_bytes()])
    }

    /// Adds a header; the name is compared case-insensitively, the value byte for byte.
    pub fn header(self, name: &str, value: &[u8]) -> Self {
        // Most names arrive lower-cased already (the `http` crate keeps them so).
        let lower = match name.bytes().any(|b| b.is_ascii_uppercase()) {
            true => std::borrow::Cow::Owned(name.to_ascii_lowercase()),
            false => std::borrow::Cow::Borrowed(name),
        };
        self.part(b'H', &[lower.as_bytes(), value])
    }

    /// Adds the request body, or the next chunk of it: consecutive calls are one body,
    /// so a body fed frame by frame as it arrives hashes the same as the whole of it.
    /// (A body split by another part in between is two bodies.)
    pub fn body(mut self, chunk: &[u8]) -> Self {
        self.body.get_or_insert_with(|| Box::new(Xxh3Default::new())).update(chunk);
        self
    }

    /// Adds any other part that defines the intent (e.g. a serialized command).
    pub fn bytes(self, bytes: &[u8]) -> Self {
        self.part(b'X', &[bytes])
    }

    fn part(mut self, tag: u8, fields: &[&[u8]]) -> Self {
        if let Some(body) = self.body.take() {
            close_body(&mut self.hasher, &body);
        }
        write_part(&mut self.hasher, tag, fields);
        self
    }

    /// The fingerprint of everything added so far.
    pub fn finish(&self) -> Fingerprint {
        match &self.body {
            None => Fingerprint::from_u128(self.hasher.digest128()),
            Some(body) => {
                let mut hasher = self.hasher.clone();
                close_body(&mut hasher, body);
                Fingerprint::from_u128(hasher.digest128())
            }
        }
    }
}

/// Where the framed stream goes: the builder's streaming hasher, or [`WholeRequest`]'s
/// buffer. The framing itself is written once, in [`write_part`].
trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Xxh3Default {
    fn put(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

/// One part of the framed stream: its tag, then each field as its length (u64 LE) and
/// its bytes.
#[inline]
fn write_part(sink: &mut impl Sink, tag: u8, fields: &[&[u8]]) {
    sink.put(&[tag]);
    for field in fields {
        sink.put(&(field.len() as u64).to_le_bytes());
        sink.put(field);
    }
}

/// Writes an open body's part: its digest as the one field.
fn close_body(hasher: &mut Xxh3Default, body: &Xxh3Default) {
    write_part(hasher, b'B', &[&body.digest128().to_be_bytes()]);
}

/// The stream's bytes a [`WholeRequest`] keeps on the stack; a longer one moves to the
/// heap. A request's method, path, a header and a body's digest take about a hundred.
const INLINE_STREAM: usize = 256;

/// [`FingerprintBuilder`]'s digest of a request whose body is at hand whole (the layer's
/// case), at a fraction of its cost: the framed stream is written to a buffer, on the
/// stack while short, and hashed in one call, as is the body. The builder keeps a
/// streaming hasher (384 bytes, 64-byte aligned: an aligned allocation for the body's,
/// and a copy at every call that moves it), which only a body fed in chunks needs.
/// Fed the same parts in the same order, both give the same fingerprint (tested).
#[cfg_attr(not(feature = "tower"), allow(dead_code))]
pub(crate) struct WholeRequest {
    inline: [u8; INLINE_STREAM],
    len: usize,
    /// The whole stream once it outgrew `inline`.
    spilled: Vec<u8>,
}

impl Sink for WholeRequest {
    // Inlined: most writes are a tag byte or a length, stored directly at their size.
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        match self.inline.get_mut(self.len..self.len + bytes.len()) {
            Some(room) if self.spilled.is_empty() => {
                room.copy_from_slice(bytes);
                self.len += bytes.len();
            }
            _ => {
                if self.spilled.is_empty() {
                    self.spilled.extend_from_slice(&self.inline[..self.len]);
                }
                self.spilled.extend_from_slice(bytes);
            }
        }
    }
}

#[cfg_attr(not(feature = "tower"), allow(dead_code))]
impl WholeRequest {
    /// An empty stream.
    pub(crate) fn new() -> Self {
        WholeRequest { inline: [0; INLINE_STREAM], len: 0, spilled: Vec::new() }
    }

    /// As [`FingerprintBuilder::method`].
    pub(crate) fn method(&mut self, method: &str) {
        write_part(self, b'M', &[method.as_bytes()]);
    }

    /// As [`FingerprintBuilder::path`].
    pub(crate) fn path(&mut self, path: &str) {
        write_part(self, b'P', &[path.as_bytes()]);
    }

    /// As [`FingerprintBuilder::header`]: the name lower-cased as it is written.
    pub(crate) fn header(&mut self, name: &str, value: &[u8]) {
        self.put(b"H");
        self.put(&(name.len() as u64).to_le_bytes());
        self.put(name.as_bytes());
        let end = self.stream_len();
        let written = end - name.len()..end;
        match self.spilled.is_empty() {
            true => self.inline[written].make_ascii_lowercase(),
            false => self.spilled[written].make_ascii_lowercase(),
        }
        self.put(&(value.len() as u64).to_le_bytes());
        self.put(value);
    }

    /// As [`FingerprintBuilder::body`] with the whole body, then
    /// [`finish`](FingerprintBuilder::finish).
    pub(crate) fn finish_with_body(mut self, body: &[u8]) -> Fingerprint {
        write_part(&mut self, b'B', &[&xxh3_128(body).to_be_bytes()]);
        let stream = match self.spilled.is_empty() {
            true => &self.inline[..self.len],
            false => &self.spilled[..],
        };
        Fingerprint::of(stream)
    }

    fn stream_len(&self) -> usize {
        match self.spilled.is_empty() {
            true => self.len,
            false => self.spilled.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known answers pin the algorithm: if one of these changes, every stored fingerprint
    /// in every user's database silently becomes a mismatch.
    #[test]
    fn known_vectors_are_stable() {
        // XXH3_128bits("") from the xxHash reference implementation.
        assert_eq!(Fingerprint::of(b"").as_u128(), 0x99aa06d3014798d86001c324468d497f);
        assert_eq!(Fingerprint::of(b"hello world").to_string(), PINNED_HELLO);
        let built = Fingerprint::builder()
            .method("POST")
            .path("/v1/orders")
            .header("Content-Type", b"application/json")
            .body(b"{\"amount\":100}")
            .finish();
        assert_eq!(built.to_string(), PINNED_BUILT);
    }

    /// Cross-checked against the C reference (python-xxhash's `xxh3_128_hexdigest`).
    const PINNED_HELLO: &str = "df8d09e93f874900a99b8775cc15b6c7";
    /// The framed stream, computed independently with python-xxhash (see the module docs):
    /// `xxh3_128(b"M" + le64(4) + b"POST" + b"P" + le64(10) + b"/v1/orders" + b"H" +
    /// le64(12) + b"content-type" + le64(16) + b"application/json" + b"B" + le64(16) +
    /// xxh3_128(b"{\"amount\":100}").digest())`.
    const PINNED_BUILT: &str = "62369dc2eba175d67e175ea89629c24c";
    /// `xxh3_128(b"B" + le64(16) + xxh3_128(b"").digest())`: an empty body is a body.
    const PINNED_EMPTY_BODY: &str = "d2dee22c8b25a6bfd50242042ed440b9";

    #[test]
    fn a_body_fed_in_chunks_hashes_as_the_whole_body() {
        let body = b"{\"sku\":\"A1\",\"qty\":2,\"note\":\"chunked\"}";
        let whole = Fingerprint::builder().method("POST").body(body).finish();
        for split in 0..=body.len() {
            let (a, b) = body.split_at(split);
            let chunked = Fingerprint::builder().method("POST").body(a).body(b).finish();
            assert_eq!(chunked, whole, "split at {split}");
        }
        let bytewise =
            body.iter().fold(Fingerprint::builder().method("POST"), |f, b| f.body(&[*b]));
        assert_eq!(bytewise.finish(), whole);
        // A part after the body closes it: the same body then another header differs
        // from a body that swallowed the header's bytes.
        let closed = Fingerprint::builder().body(b"ab").header("x", b"y").finish();
        let open = Fingerprint::builder().body(b"ab").finish();
        assert_ne!(closed, open);
        assert_eq!(Fingerprint::builder().body(b"").finish().to_string(), PINNED_EMPTY_BODY);
        assert_ne!(Fingerprint::builder().finish(), Fingerprint::builder().body(b"").finish());
    }

    #[test]
    fn finish_leaves_the_builder_usable() {
        let partial = Fingerprint::builder().body(b"ab");
        let first = partial.finish();
        assert_eq!(partial.finish(), first);
        assert_eq!(partial.body(b"c").finish(), Fingerprint::builder().body(b"abc").finish());
    }

    #[test]
    fn framing_separates_parts() {
        let a = Fingerprint::builder().path("/ab").body(b"c").finish();
        let b = Fingerprint::builder().path("/a").body(b"bc").finish();
        assert_ne!(a, b);
        let c = Fingerprint::builder().body(b"x").finish();
        let d = Fingerprint::builder().bytes(b"x").finish();
        assert_ne!(c, d);
    }

    #[test]
    fn header_names_are_case_insensitive_values_are_not() {
        let a = Fingerprint::builder().header("Content-Type", b"a").finish();
        let b = Fingerprint::builder().header("content-type", b"a").finish();
        let c = Fingerprint::builder().header("content-type", b"A").finish();
        assert_eq!(a, b);
        assert_ne!(b, c);
    }

    /// The builder's parts for [`whole_requests_fingerprint_as_the_builder_does`].
    fn both(
        method: &str,
        path: &str,
        headers: &[(String, Vec<u8>)],
        body: &[u8],
    ) -> [Fingerprint; 2] {
        let mut builder = Fingerprint::builder().method(method).path(path);
        let mut whole = WholeRequest::new();
        whole.method(method);
        whole.path(path);
        for (name, value) in headers {
            builder = builder.header(name, value);
            whole.header(name, value);
        }
        [builder.body(body).finish(), whole.finish_with_body(body)]
    }

    #[test]
    fn a_whole_request_gives_the_pinned_fingerprint() {
        let headers = [("Content-Type".to_owned(), b"application/json".to_vec())];
        let [built, whole] = both("POST", "/v1/orders", &headers, b"{\"amount\":100}");
        assert_eq!(whole.to_string(), PINNED_BUILT);
        assert_eq!(built, whole);
    }

    proptest::proptest! {
        /// Streams on either side of the inline buffer's size, header names in any case.
        #[test]
        fn whole_requests_fingerprint_as_the_builder_does(
            method in "[A-Z]{0,8}",
            path in "/[a-zA-Z0-9/?=&%-]{0,300}",
            headers in proptest::collection::vec(
                ("[a-zA-Z-]{0,40}", proptest::collection::vec(proptest::prelude::any::<u8>(), 0..120)),
                0..4,
            ),
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
        ) {
            let [built, whole] = both(&method, &path, &headers, &body);
            proptest::prop_assert_eq!(built, whole);
        }
    }

    #[test]
    fn bytes_round_trip() {
        let f = Fingerprint::of(b"x");
        assert_eq!(Fingerprint::from_bytes(f.to_bytes()), f);
    }
}
