//! [`reconcile`]: the reconciler of UNKNOWN records for any [`Store`], as
//! [`Cache::reconcile`](crate::Cache::reconcile) is the cache's.
//!
//! Invariant: a record changes only as its check said, and only while it is still
//! UNKNOWN (the store's `resolve` and `forget` are conditional on it): a record settled
//! elsewhere between the listing and its verdict is left, never overwritten. A store
//! error stops the pass at once; what was done before it is in the error.

use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime};

use super::encoding::check_duration;
use super::{Store, StoreError};
use crate::{Reconciled, UnknownEntry, Verdict};

/// Why a reconciling pass stopped: the store's error, and what the pass had done
/// before it (those records stay settled).
#[derive(Debug)]
#[non_exhaustive]
pub struct ReconcileError {
    /// What was settled before the error.
    pub done: Reconciled,
    /// The store's error: listing, resolving or forgetting failed.
    pub error: StoreError,
}

impl fmt::Display for ReconcileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Reconciled { resolved, forgotten, left, .. } = self.done;
        write!(
            f,
            "reconciling stopped after {resolved} resolved, {forgotten} forgotten and {left} \
             left: {}",
            self.error
        )
    }
}

impl std::error::Error for ReconcileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Checks up to `limit` UNKNOWN records of `store`, oldest mark first (as
/// [`Store::list_unknown`] lists them), with `check`, and settles each as it says:
/// [`Store::resolve_listed`] (kept `result_ttl`) on [`Verdict::Happened`],
/// [`Store::forget_listed`] on [`Verdict::DidNotHappen`], nothing on
/// [`Verdict::Undecided`]: each conditional on the listed execution's fencing token, so
/// a verdict never settles a later execution of the same key.
///
/// A record no longer UNKNOWN when its verdict is written ([`StoreError::NothingToSettle`]:
/// settled by another reconciler, expired) counts as left. Any other store error stops
/// the pass: [`ReconcileError`] says what was done before it. A `result_ttl` of zero or
/// over [`MAX_DURATION`](crate::MAX_DURATION) is refused before anything is listed.
///
/// A store under [`LapsePolicy::MarkUnknown`](crate::LapsePolicy::MarkUnknown) lists
/// (and so reconciles) the leases that lapsed too, as its crate documents.
///
/// ```ignore
/// let done = idemcache::store::reconcile(&store, 100, Duration::from_secs(86_400), |entry| {
///     let charge = provider.find_charge(entry.key.client_key()); // your authority
///     async move {
///         match charge.await {
///             Ok(Some(charge)) => Verdict::Happened(Some(charge.receipt.into())),
///             Ok(None) => Verdict::DidNotHappen,
///             Err(_) => Verdict::Undecided, // ask again on the next pass
///         }
///     }
/// })
/// .await?;
/// ```
pub async fn reconcile<S, F, Fut>(
    store: &S,
    limit: usize,
    result_ttl: Duration,
    mut check: F,
) -> Result<Reconciled, ReconcileError>
where
    S: Store,
    F: FnMut(&UnknownEntry<SystemTime>) -> Fut,
    Fut: Future<Output = Verdict>,
{
    let mut done = Reconciled::default();
    let stop = |done: Reconciled, error: StoreError| ReconcileError { done, error };
    check_duration("result TTL", result_ttl).map_err(|e| stop(done, e))?;
    let listed = store.list_unknown(limit).await.map_err(|e| stop(done, e))?;
    for entry in &listed {
        let settled = match check(entry).await {
            Verdict::Happened(body) => {
                store.resolve_listed(entry, body, result_ttl).await.map(|_| &mut done.resolved)
            }
            Verdict::DidNotHappen => store.forget_listed(entry).await.map(|()| &mut done.forgotten),
            Verdict::Undecided => Ok(&mut done.left),
        };
        match settled {
            Ok(count) => *count += 1,
            Err(StoreError::NothingToSettle(_)) => done.left += 1,
            Err(error) => return Err(stop(done, error)),
        }
    }
    Ok(done)
}
