//! Reading the `Idempotency-Key` request header: the IETF draft's structured-field string
//! (`"8e03978e-40d5"`) and the bare token most clients send.
//!
//! Invariant: a value is accepted only if it decodes to one client key the core's [`Key`]
//! rules could accept character by character; everything else is a [`KeyHeaderError`]
//! naming the rule it broke, answered with 400 before anything is read or claimed.
//!
//! [`Key`]: crate::Key

use std::borrow::Cow;
use std::fmt;

use http::{HeaderMap, HeaderName};

/// The header's name, as the IETF httpapi draft spells it (matched case-insensitively).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Why an `Idempotency-Key` header was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyHeaderError {
    /// The method requires a key and the request has none.
    Missing,
    /// More than one `Idempotency-Key` field.
    Repeated,
    /// A quoted value without its closing quote, or a backslash escaping something other
    /// than `"` or `\`.
    MalformedString,
    /// A quoted value followed by something other than structured-field parameters
    /// (RFC 8941 §3.1.2: `;key` or `;key=value`, keys of lowercase letters, digits,
    /// `_-.*`).
    MalformedParameters,
    /// The key is empty.
    Empty,
    /// A byte outside visible ASCII (`!` to `~`): spaces and control characters included.
    NotVisibleAscii,
}

impl fmt::Display for KeyHeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyHeaderError::Missing => "this request requires an Idempotency-Key header",
            KeyHeaderError::Repeated => "send exactly one Idempotency-Key header",
            KeyHeaderError::MalformedString => {
                "a quoted Idempotency-Key must be a structured-field string: \
                 \"...\" with only \\\" and \\\\ escaped"
            }
            KeyHeaderError::MalformedParameters => {
                "a quoted Idempotency-Key may be followed only by structured-field parameters \
                 (;key or ;key=value, keys in lowercase)"
            }
            KeyHeaderError::Empty => "the Idempotency-Key is empty",
            KeyHeaderError::NotVisibleAscii => {
                "the Idempotency-Key may contain only visible ASCII characters (! to ~)"
            }
        })
    }
}

impl std::error::Error for KeyHeaderError {}

/// The client key the request carries: `Ok(None)` if it has no `Idempotency-Key`.
pub fn client_key(headers: &HeaderMap) -> Result<Option<String>, KeyHeaderError> {
    borrowed_key(headers).map(|key| key.map(Cow::into_owned))
}

/// The header's name, parsed once (a `&str` name is parsed again at every lookup).
const KEY_NAME: HeaderName = HeaderName::from_static(IDEMPOTENCY_KEY);

/// [`client_key`], borrowing the header's bytes when the key is a bare token (what most
/// clients send): the layer's path allocates nothing for it.
pub(crate) fn borrowed_key(headers: &HeaderMap) -> Result<Option<Cow<'_, str>>, KeyHeaderError> {
    let mut values = headers.get_all(KEY_NAME).iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(KeyHeaderError::Repeated);
    }
    parse(value.as_bytes()).map(Some)
}

/// One field value: an sf-string if it starts with a quote, else the bare key. Optional
/// whitespace around the value is not part of it.
fn parse(raw: &[u8]) -> Result<Cow<'_, str>, KeyHeaderError> {
    let raw = raw.trim_ascii();
    let key = match raw.strip_prefix(b"\"") {
        Some(quoted) => Cow::Owned(unquote(quoted)?),
        None => Cow::Borrowed(raw),
    };
    if key.is_empty() {
        return Err(KeyHeaderError::Empty);
    }
    if !key.iter().all(|b| (b'!'..=b'~').contains(b)) {
        return Err(KeyHeaderError::NotVisibleAscii);
    }
    // Visible ASCII only: always UTF-8.
    Ok(match key {
        Cow::Borrowed(bytes) => Cow::Borrowed(std::str::from_utf8(bytes).expect("ASCII is UTF-8")),
        Cow::Owned(bytes) => Cow::Owned(String::from_utf8(bytes).expect("ASCII is UTF-8")),
    })
}

/// The inside of an sf-string (RFC 8941 §3.3.3), after its opening quote. The Item may
/// carry parameters after the closing quote (`"k1";a=1`): they must be well formed,
/// and are not part of the key.
fn unquote(rest: &[u8]) -> Result<Vec<u8>, KeyHeaderError> {
    let mut out = Vec::with_capacity(rest.len());
    let mut bytes = rest.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'"' => {
                let after = bytes.as_slice();
                return match after.first() {
                    None => Ok(out),
                    Some(b';') if parameters(after) => Ok(out),
                    Some(b';') => Err(KeyHeaderError::MalformedParameters),
                    Some(_) => Err(KeyHeaderError::MalformedString),
                };
            }
            b'\\' => match bytes.next() {
                Some(&c @ (b'"' | b'\\')) => out.push(c),
                _ => return Err(KeyHeaderError::MalformedString),
            },
            _ => out.push(b),
        }
    }
    Err(KeyHeaderError::MalformedString)
}

/// Whether `rest` is exactly a list of sf parameters (RFC 8941 §3.1.2):
/// `*( ";" *SP key [ "=" bare-item ] )`.
fn parameters(mut rest: &[u8]) -> bool {
    while let Some(after) = rest.strip_prefix(b";") {
        rest = &after[after.iter().take_while(|&&b| b == b' ').count()..];
        match rest.first() {
            Some(b) if b.is_ascii_lowercase() || *b == b'*' => {}
            _ => return false,
        }
        let key = rest
            .iter()
            .take_while(|&&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-.*".contains(&b))
            .count();
        rest = &rest[key..];
        if let Some(value) = rest.strip_prefix(b"=") {
            match bare_item(value) {
                Some(after) => rest = after,
                None => return false,
            }
        }
    }
    rest.is_empty()
}

/// What follows one sf bare item at the start of `s` (RFC 8941 §3.3: an integer, a
/// decimal, a string, a token, a byte sequence or a boolean), or `None` if none is.
fn bare_item(s: &[u8]) -> Option<&[u8]> {
    let (&first, tail) = s.split_first()?;
    match first {
        b'"' => {
            let mut i = 0;
            loop {
                match *tail.get(i)? {
                    b'"' => return Some(&tail[i + 1..]),
                    b'\\' if matches!(tail.get(i + 1), Some(b'"' | b'\\')) => i += 2,
                    0x20..=0x7e if tail[i] != b'\\' => i += 1,
                    _ => return None,
                }
            }
        }
        b'?' => matches!(tail.first(), Some(b'0' | b'1')).then(|| &tail[1..]),
        b':' => {
            let end = tail.iter().position(|&b| b == b':')?;
            let base64 = |b: &u8| b.is_ascii_alphanumeric() || b"+/=".contains(b);
            tail[..end].iter().all(base64).then(|| &tail[end + 1..])
        }
        b'-' => number(tail),
        b'0'..=b'9' => number(s),
        b'*' | b'A'..=b'Z' | b'a'..=b'z' => {
            let token = |b: &&u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(*b);
            Some(&tail[tail.iter().take_while(token).count()..])
        }
        _ => None,
    }
}

/// What follows an sf-integer (1 to 15 digits) or sf-decimal (1 to 12 digits, a dot,
/// 1 to 3 digits) at the start of `s`, its sign already taken.
fn number(s: &[u8]) -> Option<&[u8]> {
    let digits = |s: &[u8]| s.iter().take_while(|b| b.is_ascii_digit()).count();
    let whole = digits(s);
    match s.get(whole) {
        _ if whole == 0 => None,
        Some(b'.') => {
            let fraction = digits(&s[whole + 1..]);
            (whole <= 12 && (1..=3).contains(&fraction)).then(|| &s[whole + 1 + fraction..])
        }
        _ => (whole <= 15).then(|| &s[whole..]),
    }
}

/// Response header set on every replay.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// Response header set on every replay: when the stored response expires (an HTTP date).
pub const IDEMPOTENCY_EXPIRES: &str = "idempotency-expires";

#[cfg(test)]
mod tests {
    use super::*;

    fn one(value: &[u8]) -> Result<Option<String>, KeyHeaderError> {
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, http::HeaderValue::from_bytes(value).unwrap());
        client_key(&headers)
    }

    #[test]
    fn bare_and_quoted_forms_give_the_same_key() {
        assert_eq!(one(b"8e03978e-40d5").unwrap().unwrap(), "8e03978e-40d5");
        assert_eq!(one(b"\"8e03978e-40d5\"").unwrap().unwrap(), "8e03978e-40d5");
        assert_eq!(one(b"  abc ").unwrap().unwrap(), "abc");
        assert_eq!(one(br#""a\"b\\c""#).unwrap().unwrap(), r#"a"b\c"#);
        assert_eq!(one(b"\"k1\";x=1;y").unwrap().unwrap(), "k1", "parameters are not the key");
    }

    #[test]
    fn well_formed_parameters_are_accepted() {
        for value in [
            &b"\"k1\";a"[..],
            b"\"k1\";a=1;b=-2.5;c=\"s \\\" t\";d=tok/x:y;e=:aGk=:;f=?0;*g_h-i.j=?1",
            b"\"k1\"; a=1; b",
            b"\"k1\";a=123456789012345;b=123456789012.123",
            b"\"k1\";a=\"\"",
            b"\"k1\";a=\"x\\\"y\";b",
        ] {
            let shown = String::from_utf8_lossy(value);
            assert_eq!(one(value).unwrap().as_deref(), Some("k1"), "{shown}");
        }
    }

    #[test]
    fn malformed_parameters_are_refused() {
        for value in [
            &b"\"k1\";"[..],
            b"\"k1\";@@@",
            b"\"k1\";;;",
            b"\"k1\"; =x",
            b"\"k1\";A=1",
            b"\"k1\";a=",
            b"\"k1\";a=1 b",
            b"\"k1\";a=1;",
            b"\"k1\";a=@1",
            b"\"k1\";a=1234567890123456",
            b"\"k1\";a=1.2345",
            b"\"k1\";a=1234567890123.1",
            b"\"k1\";a=1.",
            b"\"k1\";a=-",
            b"\"k1\";a=\"open",
            b"\"k1\";a=\"bad\\n\"",
            b"\"k1\";a=:no-end",
            b"\"k1\";a=:b@d:",
            b"\"k1\";a=?2",
            b"\"k1\";a=?",
            b"\"k1\";a=1=2",
        ] {
            let shown = String::from_utf8_lossy(value);
            assert_eq!(one(value), Err(KeyHeaderError::MalformedParameters), "{shown}");
        }
    }

    #[test]
    fn each_rule_is_named() {
        assert_eq!(client_key(&HeaderMap::new()), Ok(None));
        assert_eq!(one(b"\"abc"), Err(KeyHeaderError::MalformedString));
        assert_eq!(one(b"\"a\"b\""), Err(KeyHeaderError::MalformedString));
        assert_eq!(one(br#""a\nb""#), Err(KeyHeaderError::MalformedString));
        assert_eq!(one(b"\"\""), Err(KeyHeaderError::Empty));
        assert_eq!(one(b"\"a b\""), Err(KeyHeaderError::NotVisibleAscii));
        assert_eq!(one(b"a\tb"), Err(KeyHeaderError::NotVisibleAscii));
        assert_eq!(one("clé".as_bytes()), Err(KeyHeaderError::NotVisibleAscii));
        let mut headers = HeaderMap::new();
        headers.append(IDEMPOTENCY_KEY, "a".parse().unwrap());
        headers.append(IDEMPOTENCY_KEY, "b".parse().unwrap());
        assert_eq!(client_key(&headers), Err(KeyHeaderError::Repeated));
    }
}
