//! [`CorrelationId`]: what joins an idempotency decision to the request's logs and trace.
//!
//! Invariant: a `CorrelationId` only exists validated, as a client key is: 1 to
//! [`MAX_CORRELATION_ID_LEN`] bytes of visible ASCII (`!` to `~`), so it can be written
//! into a log line, a metric's exemplar or a record without escaping, and never grows
//! without bound whatever a client sends.

use std::fmt;

/// Most bytes in a [`CorrelationId`]: room for a W3C trace id (32), a UUID (36) or a
/// request id of a few parts, not for a payload.
pub const MAX_CORRELATION_ID_LEN: usize = 128;

/// An identifier that joins an idempotency decision to the request's logs and trace: a
/// W3C trace id ([`from_traceparent`](CorrelationId::from_traceparent)), a request id
/// header, or whatever your service logs requests by.
///
/// ```
/// use idemcache::CorrelationId;
///
/// let id = CorrelationId::from_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
/// assert_eq!(id.unwrap().as_str(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert!(CorrelationId::new("req-7f3a").is_ok());
/// assert!(CorrelationId::new("two words").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CorrelationId(Box<str>);

/// Why a [`CorrelationId`] was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CorrelationIdError {
    /// It was empty.
    Empty,
    /// It is longer than [`MAX_CORRELATION_ID_LEN`].
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// It holds a byte outside visible ASCII (`!` to `~`).
    NotVisibleAscii {
        /// Byte offset of the first offending byte.
        at: usize,
    },
}

impl fmt::Display for CorrelationIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CorrelationIdError::Empty => f.write_str("correlation id is empty"),
            CorrelationIdError::TooLong { len } => write!(
                f,
                "correlation id is {len} bytes, more than the limit of {MAX_CORRELATION_ID_LEN}"
            ),
            CorrelationIdError::NotVisibleAscii { at } => {
                write!(f, "correlation id byte {at} is not visible ASCII ('!' to '~')")
            }
        }
    }
}

impl std::error::Error for CorrelationIdError {}

impl CorrelationId {
    /// `id`, if it is 1 to [`MAX_CORRELATION_ID_LEN`] bytes of visible ASCII.
    pub fn new(id: impl AsRef<[u8]>) -> Result<CorrelationId, CorrelationIdError> {
        let bytes = id.as_ref();
        if bytes.is_empty() {
            return Err(CorrelationIdError::Empty);
        }
        if bytes.len() > MAX_CORRELATION_ID_LEN {
            return Err(CorrelationIdError::TooLong { len: bytes.len() });
        }
        if let Some(at) = bytes.iter().position(|b| !(b'!'..=b'~').contains(b)) {
            return Err(CorrelationIdError::NotVisibleAscii { at });
        }
        // Visible ASCII is UTF-8.
        let text = std::str::from_utf8(bytes)
            .map_err(|e| CorrelationIdError::NotVisibleAscii { at: e.valid_up_to() })?;
        Ok(CorrelationId(text.into()))
    }

    /// The trace id of a W3C Trace Context `traceparent` value
    /// (`version-traceid-parentid-flags`, e.g.
    /// `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`): the 32 lowercase hex
    /// digits that name the whole trace, so every span of it finds the record. `None`
    /// for a value the specification says to ignore: not of that shape, version `ff`, a
    /// trace id or parent id of all zeros, or uppercase hex. (A later version may add
    /// fields after the flags; they are allowed, as the specification asks.)
    pub fn from_traceparent(value: impl AsRef<[u8]>) -> Option<CorrelationId> {
        let value = value.as_ref();
        let field = |from: usize, len: usize| value.get(from..from + len);
        let lower_hex = |f: &[u8]| f.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let zero = |f: &[u8]| f.iter().all(|&b| b == b'0');
        let (version, trace, parent, flags) =
            (field(0, 2)?, field(3, 32)?, field(36, 16)?, field(53, 2)?);
        let dashes = [2, 35, 52].iter().all(|&at| value.get(at) == Some(&b'-'));
        let rest_ok = match value.get(55..) {
            Some([]) => true,
            // Version 00 has exactly four fields; a later one may have more, after a dash.
            Some([b'-', ..]) => version != b"00",
            _ => false,
        };
        let well_formed = dashes
            && rest_ok
            && [version, trace, parent, flags].iter().all(|f| lower_hex(f))
            && version != b"ff"
            && !zero(trace)
            && !zero(parent);
        well_formed.then(|| CorrelationId(String::from_utf8_lossy(trace).into()))
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for CorrelationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for CorrelationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for CorrelationId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn an_id_is_visible_ascii_of_bounded_length() {
        assert_eq!(CorrelationId::new(""), Err(CorrelationIdError::Empty));
        let long = "a".repeat(MAX_CORRELATION_ID_LEN + 1);
        assert_eq!(
            CorrelationId::new(&long),
            Err(CorrelationIdError::TooLong { len: MAX_CORRELATION_ID_LEN + 1 })
        );
        assert!(CorrelationId::new(&long[1..]).is_ok());
        assert_eq!(CorrelationId::new("a b"), Err(CorrelationIdError::NotVisibleAscii { at: 1 }));
        assert_eq!(CorrelationId::new("é"), Err(CorrelationIdError::NotVisibleAscii { at: 0 }));
        assert_eq!(
            CorrelationId::new(b"x\x7f"),
            Err(CorrelationIdError::NotVisibleAscii { at: 1 })
        );
        assert_eq!(CorrelationId::new("!~").unwrap().as_str(), "!~");
        for e in [CorrelationIdError::Empty, CorrelationIdError::TooLong { len: 200 }] {
            assert!(e.to_string().starts_with("correlation id is"));
        }
    }

    #[test]
    fn the_trace_id_of_a_traceparent() {
        let id = CorrelationId::from_traceparent(TRACEPARENT).unwrap();
        assert_eq!(id.as_str(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(format!("{id} {id:?}"), format!("{0} \"{0}\"", id.as_str()));
        // A later version may carry more fields after the flags.
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds";
        assert!(CorrelationId::from_traceparent(later).is_some());
    }

    #[test]
    fn a_traceparent_the_specification_ignores_gives_none() {
        let with = |from: usize, to: &str| {
            let mut v = TRACEPARENT.to_owned();
            v.replace_range(from..from + to.len(), to);
            v
        };
        let bad = [
            String::new(),
            TRACEPARENT[..54].to_owned(),
            format!("{TRACEPARENT}-extra"), // version 00 has four fields
            format!("{TRACEPARENT}x"),      // nor anything glued on
            with(0, "ff"),                  // version ff is invalid
            with(3, &"0".repeat(32)),       // all-zero trace id
            with(36, &"0".repeat(16)),      // all-zero parent id
            with(3, "4BF92F35"),            // uppercase
            with(2, "_"),                   // not a dash
            with(53, "0g"),                 // not hex
            "00-4bf92f3577b34da6a3ce929d0e0e4736".to_owned(),
        ];
        for value in bad {
            assert_eq!(CorrelationId::from_traceparent(&value), None, "{value:?}");
        }
    }
}
