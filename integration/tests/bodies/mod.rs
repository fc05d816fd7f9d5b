//! Response bodies the layer's tests answer with: one that arrives late, one that
//! panics while it is read. Shared by the suites over the cache and over a store.

#![allow(dead_code)] // each suite uses what it needs

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;

/// A response body that arrives `after` its head, as a proxied or streamed body does.
pub struct Late {
    sleep: Pin<Box<tokio::time::Sleep>>,
    data: Option<Bytes>,
}

pub fn late(after: Duration, data: &'static str) -> Late {
    Late {
        sleep: Box::pin(tokio::time::sleep(after)),
        data: Some(Bytes::from_static(data.as_bytes())),
    }
}

impl http_body::Body for Late {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if std::future::Future::poll(self.sleep.as_mut(), cx).is_pending() {
            return Poll::Pending;
        }
        Poll::Ready(self.data.take().map(|d| Ok(Frame::data(d))))
    }
}

/// A response body that panics when it is read.
pub struct Panicking;

impl http_body::Body for Panicking {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        panic!("the response body panicked, as asked")
    }
}
