//! [`Detached`]: an execution that runs in the task awaiting it, and finishes in a task
//! of its own if that task lets go of it.
//!
//! Invariant: a `Detached` future runs to completion whatever its awaiter does, unless
//! its runtime goes away: it is polled in place while awaited (no task spawned, no
//! wake-up sent to another worker: most executions end in the poll that started them),
//! and when dropped unfinished (the request's future dropped: a client gone) it is
//! spawned onto the current runtime to finish, its answer discarded. Dropped outside
//! any runtime (one shutting down), it is dropped, as a spawned task would be then: over
//! the cache its claim is settled by its guard's drop rule; over a durable store
//! (`Tiered`) the guard lets go of the hot tier's entry only, and the store's record
//! lapses at the end of its lease (what the store's lapse policy then says of it). A
//! panic while polled in place is caught and answered as [`Panicked`], never unwound
//! through the layer. The execution sees the request task's task-locals while it runs
//! there and none once it moves to a task of its own: a handler must not rely on them.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::renewal::Panicked;

/// A boxed execution, finished in a task of its own if dropped unfinished.
pub(crate) struct Detached<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    /// `None` once it has answered.
    future: Option<Pin<Box<F>>>,
}

impl<F> Detached<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    /// `future`, already on the heap (boxed by the caller: see the service module's docs
    /// on the size of futures).
    pub(crate) fn boxed(future: Pin<Box<F>>) -> Self {
        Detached { future: Some(future) }
    }
}

impl<F> Future for Detached<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = Result<F::Output, Panicked>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(future) = self.future.as_mut() else {
            // Polled after it answered: a caller's bug, answered as the layer's failure.
            return Poll::Ready(Err(Panicked));
        };
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| future.as_mut().poll(cx)));
        match polled {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(out)) => {
                self.future = None;
                Poll::Ready(Ok(out))
            }
            Err(_panic) => {
                // A panicked future is never polled again.
                self.future = None;
                Poll::Ready(Err(Panicked))
            }
        }
    }
}

impl<F> Drop for Detached<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        if let Some(future) = self.future.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                drop(runtime.spawn(future));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::*;

    #[test]
    fn an_execution_dropped_unfinished_finishes_in_a_task_of_its_own() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let finished = Arc::new(AtomicBool::new(false));
        let done = finished.clone();
        runtime.block_on(async move {
            let mut detached = Detached::boxed(Box::pin(async move {
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                done.store(true, Ordering::SeqCst);
            }));
            // Polled once (pending), then dropped: the awaiter is gone.
            assert!(poll_once(&mut detached).await.is_none());
            drop(detached);
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        });
        assert!(finished.load(Ordering::SeqCst), "the execution ran on after its awaiter let go");
    }

    #[test]
    fn a_panic_in_place_is_answered_not_unwound() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let answered =
            runtime.block_on(Detached::boxed(Box::pin(async { panic!("in the execution") })));
        assert!(matches!(answered, Err(Panicked)));
        let answered = runtime.block_on(Detached::boxed(Box::pin(async { 7 })));
        assert!(matches!(answered, Ok(7)));
    }

    async fn poll_once<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            Poll::Ready(match Pin::new(&mut *future).poll(cx) {
                Poll::Ready(out) => Some(out),
                Poll::Pending => None,
            })
        })
        .await
    }
}
