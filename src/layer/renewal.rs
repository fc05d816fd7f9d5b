//! [`Renewing`]: a claim whose lease is kept alive while its execution runs.
//!
//! Invariant: while a future of the execution (the handler, then each frame of its
//! response body) is being awaited, the lease is renewed at least every `beat` (a third
//! of the lease) — when the future is pending at the beat, and also when it is ready at
//! once past the beat (a body whose frames are always ready never lets a timer fire) —
//! and the future is polled while its renewal waits (a renewal waiting for a pooled
//! connection the handler holds must not stop the handler that would give it back) —
//! until the backend says the key is lost, or the handler hands the claim over to its
//! own transaction (see [`OpenClaim`](crate::store::OpenClaim)), after which it is never
//! asked again. A panic
//! in the future is caught and returned, never unwound through the layer.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::Body;
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::backend::{Held, Renewal};

/// A held claim, renewed while [`Renewing::run`] awaits its execution's futures.
pub(crate) struct Renewing {
    held: Held,
    /// The claim as handed to the handler (over a durable store): once the handler
    /// hands it over to its own transaction, renewing stops (the transaction may hold
    /// the record's row lock, and a renewal awaited here would wait on it for ever).
    #[cfg(feature = "store")]
    open: Option<crate::store::OpenClaim>,
    lease: Duration,
    beat: Duration,
    next: Instant,
    renewing: bool,
}

/// A panic caught while the execution ran.
pub(crate) struct Panicked;

/// How a response body ended.
pub(crate) enum Read {
    /// Its data, whole, and its trailers.
    Whole(Bytes, Option<HeaderMap>),
    /// It failed part-way.
    Failed,
}

impl Read {
    /// Whether the body failed part-way.
    pub(crate) fn failed(&self) -> bool {
        matches!(self, Read::Failed)
    }
}

impl Renewing {
    /// Renews `held`'s lease by the length it was taken with, every third of it, the
    /// first beat counted from `now` (the execution's start, read once by the caller).
    pub(crate) fn new(held: Held, now: Instant) -> Self {
        let lease = held.lease();
        let beat = (lease / 3).max(Duration::from_millis(1));
        Renewing {
            #[cfg(feature = "store")]
            open: held.open_claim(),
            held,
            lease,
            beat,
            next: now + beat,
            renewing: true,
        }
    }

    /// The claim for the handler's own transaction, over a durable store.
    #[cfg(feature = "store")]
    pub(crate) fn open_claim(&self) -> Option<&crate::store::OpenClaim> {
        self.open.as_ref()
    }

    /// Puts what the handler is lent into its request's extensions (the one-commit
    /// transaction).
    #[cfg(feature = "store")]
    pub(crate) fn lend(&self, extensions: &mut http::Extensions) {
        self.held.lend(extensions);
    }

    /// Whether the handler handed the claim over to its own transaction.
    pub(crate) fn handed_over(&self) -> bool {
        #[cfg(feature = "store")]
        return self.open.as_ref().is_some_and(crate::store::OpenClaim::handed_over);
        #[cfg(not(feature = "store"))]
        false
    }

    /// The claim, to be settled.
    pub(crate) fn into_held(self) -> Held {
        self.held
    }

    /// Awaits `future`, renewing the lease meanwhile; a panic is `Err(Panicked)`.
    ///
    /// Pinned by the caller: taken by value, the future (the handler's: as large as its
    /// state) would be kept twice in this one's, as the argument and as the pinned local.
    pub(crate) async fn run<F: Future>(
        &mut self,
        mut future: Pin<&mut F>,
    ) -> Result<F::Output, Panicked> {
        // Most futures here are ready at once (a buffered body's frames): the first poll
        // builds no timer; only a future still pending after it is raced against the beat.
        let mut timed = false;
        loop {
            let outcome = match timed {
                false => poll_once(caught(future.as_mut())).await,
                true => tokio::time::timeout_at(self.next, caught(future.as_mut())).await.ok(),
            };
            timed = true;
            let outcome = match outcome {
                None if Instant::now() >= self.next => self.renew_while(future.as_mut()).await,
                Some(_) if Instant::now() >= self.next => {
                    self.renew().await;
                    outcome
                }
                outcome => outcome,
            };
            if let Some(outcome) = outcome {
                return outcome;
            }
        }
    }

    /// Renews while `future` goes on being polled, so that a renewal that waits (for a
    /// connection of the pool the handler holds one of, say) never stops the execution
    /// that would let it go; the future's outcome if it finished meanwhile (returned once
    /// the renewal ended).
    async fn renew_while<F: Future>(
        &mut self,
        mut future: Pin<&mut F>,
    ) -> Option<Result<F::Output, Panicked>> {
        let mut finished = None;
        let mut renewal = std::pin::pin!(self.renew());
        std::future::poll_fn(|cx| {
            if finished.is_none() {
                if let Poll::Ready(outcome) = std::pin::pin!(caught(future.as_mut())).poll(cx) {
                    finished = Some(outcome);
                }
            }
            renewal.as_mut().poll(cx)
        })
        .await;
        finished
    }

    /// Reads `body` whole, frame by frame, renewing the lease meanwhile.
    pub(crate) async fn read<B: Body<Data = Bytes>>(&mut self, body: B) -> Result<Read, Panicked> {
        let mut body = std::pin::pin!(body);
        let (mut first, mut rest, mut trailers) = (None::<Bytes>, None::<BytesMut>, None);
        loop {
            // `.ok()` before anything awaits: the body's error need not be `Send`.
            let frame = std::pin::pin!(async { body.as_mut().frame().await.map(Result::ok) });
            let frame = self.run(frame).await?;
            let Some(frame) = frame else { break };
            let Some(frame) = frame else { return Ok(Read::Failed) };
            let frame = match frame.into_data() {
                Ok(data) => {
                    match (&first, &mut rest) {
                        (None, _) => first = Some(data),
                        (Some(head), None) => {
                            let mut all = BytesMut::with_capacity(head.len() + data.len());
                            all.extend_from_slice(head);
                            all.extend_from_slice(&data);
                            rest = Some(all);
                        }
                        (Some(_), Some(all)) => all.extend_from_slice(&data),
                    }
                    continue;
                }
                Err(frame) => frame,
            };
            // Trailers sent in several frames are merged; a name sent again replaces
            // the earlier values (as `http_body_util`'s `collect` does).
            if let Ok(more) = frame.into_trailers() {
                trailers.get_or_insert_with(HeaderMap::new).extend(more);
            }
        }
        let data = match (first, rest) {
            (_, Some(all)) => all.freeze(),
            (first, None) => first.unwrap_or_default(),
        };
        Ok(Read::Whole(data, trailers))
    }

    async fn renew(&mut self) {
        // Lost (taken over, removed): nothing to renew; its outcome will not be kept.
        // A store that failed this once is asked again at the next beat.
        if self.renewing && self.handed_over() {
            self.renewing = false;
        }
        if self.renewing {
            self.renewing = !matches!(self.held.extend_lease(self.lease).await, Renewal::Lost);
        }
        self.next = Instant::now() + self.beat;
    }
}

/// `future`'s output if one poll gives it, else `None` (the future is left to be polled
/// again).
async fn poll_once<F: Future + Unpin>(mut future: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        Poll::Ready(match Pin::new(&mut future).poll(cx) {
            Poll::Ready(out) => Some(out),
            Poll::Pending => None,
        })
    })
    .await
}

/// Polls `future`, answering a panic as `Err` instead of unwinding through the layer:
/// the claim is then settled (in the store too) before the 500 goes out.
fn caught<F: Future>(
    mut future: Pin<&mut F>,
) -> impl Future<Output = Result<F::Output, Panicked>> + '_ {
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(out)) => Poll::Ready(Ok(out)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(_panic) => Poll::Ready(Err(Panicked)),
        }
    })
}
