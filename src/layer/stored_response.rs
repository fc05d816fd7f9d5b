//! A stored response: status, the headers a replay may repeat, and the body, as the one
//! byte string the cache keeps.
//!
//! Invariant: [`decode`] returns exactly what [`encode`] was given after [`keep_header`]'s
//! filter — the status, every kept field in order with its raw bytes (two `Set-Cookie`
//! stay two), and the body — and refuses anything else with `None`, never panicking:
//! the cache may hold a value some other writer put under the same key.
//!
//! Layout: `b"IDR1"`, status (u16 BE), the header fields, the trailer fields, then the
//! body to the end. Fields are a count (u16 BE), then per field: name length (u16 BE),
//! name, value length (u32 BE), value.

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;

const MAGIC: &[u8; 4] = b"IDR1";

/// Fields never stored: hop-by-hop (RFC 9110 §7.6.1) and per-message framing, which the
/// server writes afresh for each response; `Date`, which would lie on a replay; and
/// `WWW-Authenticate`, a challenge to the client that got it (a Digest nonce, say),
/// which middlewares that replayed it handed to whoever retried.
const NEVER_STORED: [HeaderName; 11] = [
    header::CONNECTION,
    header::CONTENT_LENGTH,
    header::DATE,
    header::WWW_AUTHENTICATE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("keep-alive"),
];

/// Whether a response field is stored for replays. `Set-Cookie` is left out unless
/// allowed: a session cookie replayed to whoever retries would hand the session over.
/// Fields the response's own `Connection` names are hop-by-hop too.
pub(crate) fn keep_header(name: &HeaderName, headers: &HeaderMap, set_cookie: bool) -> bool {
    if NEVER_STORED.contains(name) || (*name == header::SET_COOKIE && !set_cookie) {
        return false;
    }
    !headers.get_all(header::CONNECTION).iter().any(|v| {
        v.to_str()
            .is_ok_and(|list| list.split(',').any(|t| t.trim().eq_ignore_ascii_case(name.as_str())))
    })
}

/// The stored form of a response: its status, the headers a replay may repeat, the
/// trailers the same rule keeps (a `Set-Cookie` sent as a trailer is a cookie all the
/// same) and its body.
pub(crate) fn encode(
    status: StatusCode,
    headers: &HeaderMap,
    set_cookie: bool,
    body: &[u8],
    trailers: Option<&HeaderMap>,
) -> Bytes {
    let kept: Vec<_> =
        headers.iter().filter(|(n, _)| keep_header(n, headers, set_cookie)).collect();
    // The response's `Connection` names its hop-by-hop fields, trailers included.
    let trailing: Vec<_> = trailers
        .into_iter()
        .flat_map(|map| map.iter().filter(|(n, _)| keep_header(n, headers, set_cookie)))
        .collect();
    let size = |fields: &[(&HeaderName, &HeaderValue)]| {
        2 + fields.iter().map(|(n, v)| 6 + n.as_str().len() + v.len()).sum::<usize>()
    };
    let mut out = BytesMut::with_capacity(6 + size(&kept) + size(&trailing) + body.len());
    out.put_slice(MAGIC);
    out.put_u16(status.as_u16());
    put_fields(&mut out, &kept);
    put_fields(&mut out, &trailing);
    out.put_slice(body);
    out.freeze()
}

fn put_fields(out: &mut BytesMut, fields: &[(&HeaderName, &HeaderValue)]) {
    // A response has far fewer than 65,536 fields (servers cap them near 100); names are
    // short tokens, and values are capped by servers far below 4 GiB.
    let fields = &fields[..fields.len().min(usize::from(u16::MAX))];
    out.put_u16(fields.len() as u16);
    for (name, value) in fields {
        out.put_u16(name.as_str().len() as u16);
        out.put_slice(name.as_str().as_bytes());
        out.put_u32(value.len() as u32);
        out.put_slice(value.as_bytes());
    }
}

/// A stored response taken apart again.
#[derive(Debug)]
pub(crate) struct Stored {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) trailers: Option<HeaderMap>,
    pub(crate) body: Bytes,
}

/// The response [`encode`] stored, or `None` if `stored` is not one.
pub(crate) fn decode(stored: &Bytes) -> Option<Stored> {
    let mut rest: &[u8] = stored.strip_prefix(MAGIC)?;
    let status =
        StatusCode::from_u16(u16::from_be_bytes(take(&mut rest, 2)?.try_into().ok()?)).ok()?;
    // Room for the fields a replay adds (`Idempotent-Replayed`, `Idempotency-Expires`,
    // `Trailer`), so adding them never grows the map.
    let headers = fields(stored, &mut rest, 3)?;
    let trailers = fields(stored, &mut rest, 0)?;
    let trailers = (!trailers.is_empty()).then_some(trailers);
    let body = stored.slice(stored.len() - rest.len()..);
    Some(Stored { status, headers, trailers, body })
}

/// The fields at the head of `rest`, a tail of `stored`, in a map with `room` for more:
/// each value shares `stored`'s buffer (a reference, not a copy: a replay allocates
/// nothing per value).
fn fields(stored: &Bytes, rest: &mut &[u8], room: usize) -> Option<HeaderMap> {
    let count = u16::from_be_bytes(take(rest, 2)?.try_into().ok()?);
    let mut map = match (count, room) {
        (0, 0) => HeaderMap::new(),
        _ => HeaderMap::with_capacity(usize::from(count) + room),
    };
    for _ in 0..count {
        let len = u16::from_be_bytes(take(rest, 2)?.try_into().ok()?);
        let name = HeaderName::from_bytes(take(rest, usize::from(len))?).ok()?;
        let len = u32::from_be_bytes(take(rest, 4)?.try_into().ok()?);
        let value = take(rest, len as usize)?;
        let value = HeaderValue::from_maybe_shared(stored.slice_ref(value)).ok()?;
        map.append(name, value);
    }
    Some(map)
}

fn take<'a>(rest: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if rest.len() < n {
        return None;
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Some(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(fields: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (n, v) in fields {
            map.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    #[test]
    fn round_trip_keeps_order_repeats_and_raw_bytes() {
        let mut sent = headers(&[("x-a", "1"), ("link", "<a>"), ("link", "<b>")]);
        sent.append("x-raw", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        let trailers = headers(&[("grpc-status", "0"), ("grpc-message", "ok")]);
        let stored = encode(StatusCode::CREATED, &sent, false, b"{\"id\":1}", Some(&trailers));
        let back = decode(&stored).unwrap();
        assert_eq!(back.status, StatusCode::CREATED);
        assert_eq!(back.headers, sent);
        assert_eq!(back.trailers, Some(trailers));
        assert!(decode(&encode(StatusCode::OK, &sent, false, b"", None))
            .unwrap()
            .trailers
            .is_none());
        let links: Vec<_> = back.headers.get_all("link").iter().collect();
        assert_eq!(links, ["<a>", "<b>"]);
        assert_eq!(&back.body[..], b"{\"id\":1}");
    }

    #[test]
    fn framing_hop_by_hop_date_cookies_and_challenges_are_not_stored() {
        let sent = headers(&[
            ("content-length", "3"),
            ("transfer-encoding", "chunked"),
            ("date", "Mon, 30 Nov 2026 10:00:00 GMT"),
            ("connection", "x-hop"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("set-cookie", "a=1"),
            ("set-cookie", "b=2"),
            ("www-authenticate", "Digest realm=\"x\", nonce=\"n1\""),
            ("content-type", "application/json"),
        ]);
        let kept = decode(&encode(StatusCode::OK, &sent, false, b"abc", None)).unwrap().headers;
        assert_eq!(kept, headers(&[("content-type", "application/json")]));
        let with_cookies =
            decode(&encode(StatusCode::OK, &sent, true, b"abc", None)).unwrap().headers;
        assert_eq!(with_cookies.get_all("set-cookie").iter().count(), 2);
    }

    #[test]
    fn trailers_are_filtered_as_headers_are() {
        let trailers = headers(&[
            ("grpc-status", "0"),
            ("set-cookie", "session=secret"),
            ("content-length", "3"),
            ("connection", "x-hop"),
            ("x-hop", "1"),
        ]);
        let sent = headers(&[("connection", "x-hop")]);
        let stored = encode(StatusCode::OK, &sent, false, b"abc", Some(&trailers));
        assert_eq!(decode(&stored).unwrap().trailers, Some(headers(&[("grpc-status", "0")])));
        let allowed = encode(StatusCode::OK, &HeaderMap::new(), true, b"abc", Some(&trailers));
        let kept = decode(&allowed).unwrap().trailers.unwrap();
        assert_eq!(kept.get_all("set-cookie").iter().count(), 1);
        let only_cookie = headers(&[("set-cookie", "a=1")]);
        let stored = encode(StatusCode::OK, &HeaderMap::new(), false, b"", Some(&only_cookie));
        assert!(decode(&stored).unwrap().trailers.is_none(), "nothing left: no trailers");
    }

    #[test]
    fn anything_else_is_refused_without_panicking() {
        let good = encode(StatusCode::OK, &headers(&[("x-a", "1")]), false, b"body", None);
        for cut in 0..good.len() - 4 {
            // Cut inside the header section: refused. (Cutting the body is a shorter body.)
            assert!(decode(&good.slice(..cut)).is_none(), "cut at {cut}");
        }
        assert!(decode(&Bytes::from_static(b"plain result")).is_none());
        assert!(decode(&Bytes::from_static(b"IDR1\x00\x00\x00\x00\x00\x00")).is_none(), "status 0");
    }
}
