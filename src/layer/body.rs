//! [`LayerBody`]: the body of every response the layer returns, and of every request it
//! hands your service.
//!
//! Invariant: a body passes through frame by frame when the layer did not guard its
//! request, and otherwise is exactly the buffered data followed by the trailers the
//! handler sent (gRPC's status travels in trailers), so a first answer and its replays
//! carry the same frames, and a guarded request's handler reads exactly the bytes that
//! were fingerprinted.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

/// A body from [`Idempotency`](super::Idempotency): the one it hands your service with
/// each request, and the one of each response it returns. It is the body it was given
/// (the client's, your handler's) when the request was not guarded, else a buffered one
/// (a request's read whole for its fingerprint; a response's with its trailers, if any).
#[derive(Debug)]
pub struct LayerBody<B> {
    kind: Kind<B>,
}

#[derive(Debug)]
enum Kind<B> {
    Passed(Pin<Box<B>>),
    Buffered { data: Option<Bytes>, trailers: Option<HeaderMap> },
}

impl<B> LayerBody<B> {
    pub(crate) fn passed(body: B) -> Self {
        LayerBody { kind: Kind::Passed(Box::pin(body)) }
    }

    pub(crate) fn buffered(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        let data = (!data.is_empty()).then_some(data);
        LayerBody { kind: Kind::Buffered { data, trailers } }
    }
}

impl<B> Body for LayerBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match &mut self.get_mut().kind {
            Kind::Passed(body) => body.as_mut().poll_frame(cx),
            Kind::Buffered { data, trailers } => Poll::Ready(match data.take() {
                Some(data) => Some(Ok(Frame::data(data))),
                None => trailers.take().map(|t| Ok(Frame::trailers(t))),
            }),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Passed(body) => body.is_end_stream(),
            Kind::Buffered { data, trailers } => data.is_none() && trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Passed(body) => body.size_hint(),
            // Trailers follow: not an exact length, so an HTTP/1.1 server sends the
            // body chunked (trailers cannot follow a `Content-Length` body).
            Kind::Buffered { data, trailers } => {
                let len = data.as_ref().map_or(0, |d| d.len() as u64);
                match trailers {
                    None => SizeHint::with_exact(len),
                    Some(_) => {
                        let mut hint = SizeHint::new();
                        hint.set_lower(len);
                        hint
                    }
                }
            }
        }
    }
}
