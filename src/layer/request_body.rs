//! A guarded request's body, read whole before its claim (its fingerprint covers it), and
//! the layer's answer when it cannot be.
//!
//! Invariant: a body is read at most `limit` bytes far: one whose `Content-Length` says it
//! is larger is refused before a byte is read, and one that turns out larger is refused
//! as soon as it passes the limit (413); a body that fails to read is refused (400).
//! Nothing is claimed for a refused body.

use bytes::{Buf, Bytes};
use http::header::CONTENT_LENGTH;
use http::request::Parts;
use http::Response;
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};

use super::body::LayerBody;
use super::problem::{refuse, Refusal};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The refusal of a request body that is too large or could not be read.
pub(crate) fn refuse_body<ResB, E>(
    limit: usize,
    refusal: Refusal,
) -> Result<Response<LayerBody<ResB>>, E> {
    let detail = match refusal {
        Refusal::BodyTooLarge => {
            format!("the request body exceeds {} bytes", limit)
        }
        _ => "the request body could not be read".to_owned(),
    };
    refuse(refusal, &detail, None)
}

/// The request body, whole: refused with 413 if `Content-Length` says it is over `limit`
/// (before reading), or if it turns out to be while reading.
pub(crate) async fn read_body<B>(parts: &Parts, body: B, limit: usize) -> Result<Bytes, Refusal>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let declared = parts.headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
    if declared.is_some_and(|len: u64| len > limit as u64) {
        return Err(Refusal::BodyTooLarge);
    }
    read_whole(body, limit).await
}

/// `body`'s data, whole, as one `Bytes`: a body of one frame (most requests' are, and
/// every buffered one is) is handed on as it came, without copying or a list of frames;
/// more frames are copied into one buffer. Trailers are not part of it (the fingerprint
/// is the body's data, as it always was).
async fn read_whole<B>(body: B, limit: usize) -> Result<Bytes, Refusal>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(Limited::new(body, limit));
    let (mut first, mut rest) = (None::<Bytes>, None::<bytes::BytesMut>);
    while let Some(frame) = body.as_mut().frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
                return Err(Refusal::BodyTooLarge)
            }
            Err(_) => return Err(Refusal::BodyUnreadable),
        };
        let Ok(mut data) = frame.into_data() else { continue };
        let data = data.copy_to_bytes(data.remaining());
        match (&first, &mut rest) {
            (None, _) => first = Some(data),
            (Some(head), None) => {
                let mut all = bytes::BytesMut::with_capacity(head.len() + data.len());
                all.extend_from_slice(head);
                all.extend_from_slice(&data);
                rest = Some(all);
            }
            (Some(_), Some(all)) => all.extend_from_slice(&data),
        }
    }
    Ok(match (first, rest) {
        (_, Some(all)) => all.freeze(),
        (first, None) => first.unwrap_or_default(),
    })
}
