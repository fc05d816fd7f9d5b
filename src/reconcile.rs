//! Reconciling UNKNOWN entries: [`Verdict`], [`Reconciled`] and [`Cache::reconcile`].
//!
//! Invariant: reconciling changes an entry only as its check said, and only while the
//! entry is still UNKNOWN: an entry that stopped being UNKNOWN between the listing and
//! the settling write (resolved elsewhere, expired, removed) is left as it is and
//! counted as left, never overwritten.

use bytes::Bytes;

use crate::{Cache, ResolveError, UnknownEntry};

/// What the authority (a payment provider, your business table, a command's output)
/// says about an UNKNOWN entry, as a reconciler's check answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The effect happened: resolve the entry with this result (`None`: completed
    /// without a body), so repeats replay it. For a key the HTTP layer claimed, the
    /// bytes must be `layer::stored_response`'s (feature `tower`): any other bytes make
    /// its retries answer 500
    /// `idempotency_record_corrupt` until the key is forgotten or expires.
    Happened(Option<Bytes>),
    /// The effect did not happen: forget the entry, so a retry executes again.
    DidNotHappen,
    /// Not known yet (the authority is unreachable, the operation still settling):
    /// leave the entry UNKNOWN, to be checked again later.
    Undecided,
}

/// What a reconciling pass did, by count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reconciled {
    /// Entries resolved as completed ([`Verdict::Happened`]).
    pub resolved: usize,
    /// Entries forgotten ([`Verdict::DidNotHappen`]).
    pub forgotten: usize,
    /// Entries left UNKNOWN: [`Verdict::Undecided`], or no longer UNKNOWN when the
    /// verdict was to be written (settled by someone else meanwhile, or expired).
    pub left: usize,
}

impl Reconciled {
    /// How many entries the pass looked at.
    pub fn checked(&self) -> usize {
        self.resolved + self.forgotten + self.left
    }
}

impl Cache {
    /// Checks up to `limit` UNKNOWN entries, oldest mark first (as
    /// [`Cache::list_unknown`] lists them), with `check`, and settles each as it says:
    /// [`resolve`](Cache::resolve) on [`Verdict::Happened`], [`forget`](Cache::forget)
    /// on [`Verdict::DidNotHappen`], nothing on [`Verdict::Undecided`].
    ///
    /// `check` runs with no lock held, so it may take its time and call into the cache.
    /// An entry settled by someone else between the listing and its verdict is left as
    /// it is (counted in [`Reconciled::left`]). Run it periodically, or after a crash;
    /// under [`LapsePolicy::MarkUnknown`](crate::LapsePolicy::MarkUnknown) it also
    /// settles the leases that lapsed.
    ///
    /// ```
    /// use idemcache::{Cache, Claim, Fingerprint, Key, Verdict};
    ///
    /// let cache = Cache::builder().build()?;
    /// let key = Key::new("POST /charges", "user:1", "k1")?;
    /// let Claim::Acquired(guard) = cache.claim(&key, Fingerprint::of(b"req"))? else { unreachable!() };
    /// guard.mark_unknown()?; // the provider timed out: did the charge go through?
    /// let done = cache.reconcile(100, |entry| {
    ///     // Ask the provider about `entry.key`; here it says the charge exists.
    ///     Verdict::Happened(Some("charge ch_1".into()))
    /// });
    /// assert_eq!(done.resolved, 1);
    /// assert!(matches!(cache.claim(&key, Fingerprint::of(b"req"))?, Claim::Completed(_)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reconcile(
        &self,
        limit: usize,
        mut check: impl FnMut(&UnknownEntry) -> Verdict,
    ) -> Reconciled {
        let mut done = Reconciled::default();
        for entry in self.list_unknown(limit) {
            let settled = match check(&entry) {
                Verdict::Happened(body) => {
                    self.resolve_listed(&entry, body).map(|()| &mut done.resolved)
                }
                Verdict::DidNotHappen => self.forget_listed(&entry).map(|()| &mut done.forgotten),
                Verdict::Undecided => Ok(&mut done.left),
            };
            match settled {
                Ok(count) => *count += 1,
                // Not UNKNOWN any more (settled elsewhere, expired, removed): left.
                Err(ResolveError::NotFound | ResolveError::NothingToSettle) => done.left += 1,
            }
        }
        done
    }
}
