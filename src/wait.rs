//! [`WaitForClaim`], the async counterpart of [`Cache::claim_wait`], and the per-shard
//! list of wakers it files itself in.
//!
//! The invariant: a future whose last look found its key PROCESSING has its waker in
//! that shard's [`Wakers`], filed under the same shard write lock as the look; every
//! transition out of PROCESSING sets the shard's `left_processing` flag, and the cache's
//! epilogue takes the whole list under that lock and wakes it after unlocking. So a
//! wake-up cannot fall between a future's look and its filing (loom model 9 checks it).
//!
//! Wakers are the caller's code (an executor's vtable): they are cloned before locking
//! and woken or dropped after unlocking, never under a shard lock. The core depends on no
//! runtime; a lapse, which no transition announces, is noticed with a sleep the caller's
//! runtime supplies, and a timeout is the caller's runtime's too.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::{Cache, Claim, ClaimError, CorrelationId, Fingerprint, Key, Timestamp};

/// The shortest sleep before looking again at a lease that should have lapsed: the
/// cache's clock may be coarse (a few ms), and a zero sleep would spin until it moves.
const MIN_NAP: Duration = Duration::from_millis(1);

/// The futures waiting on one shard's PROCESSING entries. Ids are per shard, so a
/// future can find and replace its own waker.
#[derive(Debug, Default)]
pub(crate) struct Wakers {
    list: Vec<(u64, Waker)>,
    next_id: u64,
}

impl Wakers {
    /// Files `waker` under `*id` (giving the future an id on its first filing), and
    /// returns the waker it replaced, for the caller to drop unlocked.
    pub(crate) fn file(&mut self, id: &mut Option<u64>, waker: Waker) -> Option<Waker> {
        let id = *id.get_or_insert_with(|| {
            self.next_id += 1;
            self.next_id
        });
        match self.list.iter_mut().find(|(i, _)| *i == id) {
            Some((_, old)) => Some(std::mem::replace(old, waker)),
            None => {
                self.list.push((id, waker));
                None
            }
        }
    }

    /// Takes a future's waker out (it was dropped, or got its answer): `None` if a
    /// wake-up already took it.
    pub(crate) fn withdraw(&mut self, id: u64) -> Option<Waker> {
        let at = self.list.iter().position(|(i, _)| *i == id)?;
        Some(self.list.swap_remove(at).1)
    }

    /// Every filed waker, to be woken after unlocking.
    pub(crate) fn take_all(&mut self) -> Vec<(u64, Waker)> {
        std::mem::take(&mut self.list)
    }

    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }
}

/// The future of [`Cache::claim_wait_async`]: resolves to what a fresh claim returns
/// once the key is no longer PROCESSING.
///
/// Cancel-safe: dropping it (a timeout, a `select!`, a client gone) withdraws its waker
/// and changes nothing else; it never holds a claim, since a [`Claim::Acquired`] is
/// handed out in the same poll that makes it.
///
/// # Panics
///
/// If polled again after it resolved (as `async fn` futures do): that look would count a
/// second answer, or wait on the key the first answer handed its caller.
#[must_use = "futures do nothing unless awaited"]
pub struct WaitForClaim<F, S> {
    cache: Cache,
    key: Key,
    fingerprint: Fingerprint,
    /// Kept with the entry if a look acquires the key.
    correlation_id: Option<CorrelationId>,
    sleep: F,
    /// Sleeping until the lease seen last ends: its lapse lets a look take the key over,
    /// and no transition announces it.
    lapse: Option<(Timestamp, Pin<Box<S>>)>,
    /// This future's id in its shard's [`Wakers`], once filed.
    filed: Option<u64>,
    /// Resolved: polling again is a caller's bug, refused rather than claiming again.
    done: bool,
}

// Nothing is pinned structurally: the sleep is boxed, the rest is moved freely.
impl<F, S> Unpin for WaitForClaim<F, S> {}

impl<F, S> fmt::Debug for WaitForClaim<F, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitForClaim")
            .field("key", &self.key)
            .field("lease_ends_at", &self.lapse.as_ref().map(|(at, _)| at))
            .field("filed", &self.filed.is_some())
            .finish_non_exhaustive()
    }
}

impl<F, S> WaitForClaim<F, S> {
    pub(crate) fn new(cache: Cache, key: Key, fingerprint: Fingerprint, sleep: F) -> Self {
        WaitForClaim {
            cache,
            key,
            fingerprint,
            correlation_id: None,
            sleep,
            lapse: None,
            filed: None,
            done: false,
        }
    }

    /// Keeps `correlation_id` with the entry if this wait ends by acquiring the key, as
    /// [`Cache::claim_correlated`] does.
    pub fn correlated(mut self, correlation_id: Option<CorrelationId>) -> Self {
        self.correlation_id = correlation_id;
        self
    }
}

impl<F, S> Future for WaitForClaim<F, S>
where
    F: FnMut(Duration) -> S,
    S: Future,
{
    type Output = Result<Claim, ClaimError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // A second look after the answer would count a second answer, or file the
        // future on the key its own caller now owns.
        assert!(!this.done, "WaitForClaim polled after it resolved");
        loop {
            let claim = this.cache.claim_or_file(
                &this.key,
                this.fingerprint,
                this.correlation_id.as_ref(),
                &mut this.filed,
                cx.waker().clone(),
            );
            let lease_ends_at = match claim {
                Ok(Claim::InProgress { lease_ends_at, .. }) => lease_ends_at,
                other => {
                    this.lapse = None;
                    this.done = true;
                    return Poll::Ready(other);
                }
            };
            // A new owner or an extended lease: sleep until the lease now in force ends.
            if this.lapse.as_ref().map(|(at, _)| *at) != Some(lease_ends_at) {
                let nap = this.cache.time_until(lease_ends_at).max(MIN_NAP);
                this.lapse = Some((lease_ends_at, Box::pin((this.sleep)(nap))));
            }
            let (_, nap) = this.lapse.as_mut().expect("set just above");
            if nap.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // The lease should have lapsed: look again (the look takes the key over).
            this.lapse = None;
        }
    }
}

impl<F, S> Drop for WaitForClaim<F, S> {
    fn drop(&mut self) {
        if let Some(id) = self.filed.take() {
            self.cache.withdraw_waker(&self.key, id);
        }
    }
}
