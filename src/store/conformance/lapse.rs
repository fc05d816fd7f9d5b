//! The conformance sub-suites of lapses and reconciling: [`run_mark_unknown`] for a
//! store built with [`LapsePolicy::MarkUnknown`](crate::LapsePolicy::MarkUnknown) (a
//! lapsed lease is never re-run), and [`reconcile_as_checked`] for any store (reconcile
//! resolves, forgets and leaves as its check says). [`run`](super::run) includes the
//! second.
//!
//! Time is the store's: leases are short ([`SHORT_LEASE`]) and the suite polls (bounded,
//! ~4 s) until the store says a lease lapsed, never sleeps a fixed time to get there.

use std::time::{Duration, SystemTime};

use bytes::Bytes;

use super::{acquire, fp, fresh, pause, Run, LEASE, TTL};
use crate::store::{reconcile, Store, StoreClaim, StoreError};
use crate::{FencingToken, Key, Verdict};

/// The lease the lapse checks claim with: long enough for a slow store's round trip,
/// short enough to wait out.
pub const SHORT_LEASE: Duration = Duration::from_millis(200);

/// Claims `k` for `r` with [`SHORT_LEASE`], which must be acquired.
async fn acquire_short<S: Store>(store: &S, k: &Key, r: &str) -> (FencingToken, SystemTime) {
    match store.claim(k, fp(r), SHORT_LEASE).await.unwrap() {
        StoreClaim::Acquired { token, lease_ends_at, .. } => (token, lease_ends_at),
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// Claims `k` for `r` until the store no longer answers "in progress"; returns what it
/// answered then. Panics if the store lets the key be acquired (a lapsed lease under
/// `MarkUnknown` must never be), or after ~4 s.
async fn until_lapsed<S: Store>(store: &S, k: &Key, r: &str) -> StoreClaim {
    for _ in 0..2000 {
        match store.claim(k, fp(r), LEASE).await.unwrap() {
            StoreClaim::InProgress { .. } => pause(Duration::from_millis(2)).await,
            StoreClaim::Acquired { token, .. } => {
                panic!("a lapsed lease under MarkUnknown was acquired (token {token})")
            }
            other => return other,
        }
    }
    panic!("the lease never lapsed");
}

/// Purges every expired record the store will purge, in batches.
async fn purge_all<S: Store>(store: &S) {
    while store.purge_expired(100).await.unwrap() == 100 {}
}

/// The sub-suite for a store built with `LapsePolicy::MarkUnknown { ttl: unknown_ttl }`
/// (e.g. `store.with_lapse_policy(LapsePolicy::MarkUnknown { ttl: unknown_ttl })`): a claim
/// after the lapse answers Unknown, marked at the lease's end (never Acquired), and so
/// does every claim after it; the record is listed with the TTL counted from the lease's
/// end; the lapsed token's every write is `LeaseLost`; purging does not make it
/// claimable; `resolve` then replays. A lapse nobody claimed is not purged either, is
/// UNKNOWN to `forget` and `resolve`, and (when `lists_unclaimed`: a store that can find
/// it, as idemcache's three do) is listed.
pub async fn run_mark_unknown<S: Store>(store: &S, unknown_ttl: Duration, lists_unclaimed: bool) {
    let run = Run(fresh());
    super::records::lapsed_is_unknown(store, &run, SHORT_LEASE).await;
    let k = run.key("lapsed-unknown");
    let (stale, lease_end) = acquire_short(store, &k, "r").await;
    let unknown = |claim: StoreClaim| match claim {
        StoreClaim::Unknown { marked_at } => {
            assert_eq!(marked_at, lease_end, "marked at the lease's end")
        }
        other => panic!("a lapsed lease must be UNKNOWN, got {other:?}"),
    };
    unknown(until_lapsed(store, &k, "r").await);
    unknown(store.claim(&k, fp("r"), LEASE).await.unwrap());
    assert_eq!(store.claim(&k, fp("other"), LEASE).await.unwrap(), StoreClaim::Mismatch);
    let listed = store.list_unknown(usize::MAX).await.unwrap();
    let entry = listed.iter().find(|u| u.key == k).expect("the lapsed lease is listed");
    assert_eq!((entry.fingerprint, entry.marked_at), (fp("r"), lease_end));
    assert_eq!(entry.expires_at, lease_end + unknown_ttl, "kept unknown_ttl from the lease's end");
    let body = || Some(Bytes::from_static(b"late"));
    for refused in [
        store.complete(&k, stale, body(), TTL).await.map(drop),
        store.extend_lease(&k, stale, LEASE).await.map(drop),
        store.release(&k, stale).await,
        store.mark_unknown(&k, stale, TTL).await,
    ] {
        assert!(matches!(refused, Err(StoreError::LeaseLost(_))), "the lapsed token: {refused:?}");
    }
    purge_all(store).await;
    unknown(store.claim(&k, fp("r"), LEASE).await.unwrap());
    store.resolve(&k, Some(Bytes::from_static(b"receipt")), TTL).await.unwrap();
    match store.claim(&k, fp("r"), LEASE).await.unwrap() {
        StoreClaim::Completed(replay) => assert_eq!(replay.body.unwrap(), "receipt"),
        other => panic!("resolved, a repeat replays: {other:?}"),
    }

    // Lapses nobody claims: `forgotten` and `resolved` first, `watch` last, so that once
    // `watch` lapsed (the only key polled) the others have too.
    let (unclaimed, forgotten, resolved, watch) =
        (run.key("unclaimed"), run.key("forgotten"), run.key("resolved"), run.key("watch"));
    let (_, unclaimed_end) = acquire_short(store, &unclaimed, "r").await;
    for k in [&forgotten, &resolved, &watch] {
        acquire_short(store, k, "r").await;
    }
    until_lapsed(store, &watch, "r").await;
    purge_all(store).await;
    if lists_unclaimed {
        let listed = store.list_unknown(usize::MAX).await.unwrap();
        let entry =
            listed.iter().find(|u| u.key == unclaimed).expect("an unclaimed lapse is listed");
        assert_eq!(
            (entry.marked_at, entry.expires_at),
            (unclaimed_end, unclaimed_end + unknown_ttl)
        );
    }
    match store.claim(&unclaimed, fp("r"), LEASE).await.unwrap() {
        StoreClaim::Unknown { marked_at } => assert_eq!(marked_at, unclaimed_end),
        other => panic!("purging must not free a lapsed lease: {other:?}"),
    }
    store.forget(&forgotten).await.unwrap();
    acquire(store, &forgotten).await;
    store.resolve(&resolved, None, TTL).await.unwrap();
    match store.claim(&resolved, fp("r"), LEASE).await.unwrap() {
        StoreClaim::Completed(replay) => assert_eq!(replay.body, None),
        other => panic!("{other:?}"),
    }
}

/// `store::reconcile` resolves, forgets and leaves each UNKNOWN record as its check
/// says; a record settled elsewhere between the listing and its verdict is left as it
/// is, counted as left. Records of other runs (a shared database) are checked
/// `Undecided` and so left alone.
pub async fn reconcile_as_checked<S: Store>(store: &S) {
    let run = Run(fresh());
    let names = ["paid", "unpaid", "pending", "raced"];
    let keys: Vec<Key> = names.iter().map(|n| run.key(&format!("reconcile-{n}"))).collect();
    for k in &keys {
        let token = acquire(store, k).await;
        store.mark_unknown(k, token, TTL).await.unwrap();
    }
    let mut checked = Vec::new();
    let done = reconcile(store, usize::MAX, TTL, |entry| {
        let mine = keys.iter().position(|k| *k == entry.key);
        checked.extend(mine);
        let raced = entry.key.clone();
        async move {
            match mine {
                Some(0) => Verdict::Happened(Some(Bytes::from_static(b"receipt"))),
                Some(1) => Verdict::DidNotHappen,
                Some(3) => {
                    // Settled elsewhere meanwhile: the verdict must not overwrite it.
                    store.resolve(&raced, Some(Bytes::from_static(b"theirs")), TTL).await.unwrap();
                    Verdict::DidNotHappen
                }
                _ => Verdict::Undecided,
            }
        }
    })
    .await
    .unwrap();
    checked.sort();
    assert_eq!(checked, vec![0, 1, 2, 3], "each of this run's records checked once");
    assert_eq!((done.resolved, done.forgotten), (1, 1), "{done:?}");
    assert!(done.left >= 2, "pending and raced are left: {done:?}");
    let replayed = |claim: StoreClaim| match claim {
        StoreClaim::Completed(replay) => replay.body.unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(replayed(store.claim(&keys[0], fp("r"), LEASE).await.unwrap()), "receipt");
    assert!(matches!(
        store.claim(&keys[1], fp("r"), LEASE).await.unwrap(),
        StoreClaim::Acquired { .. }
    ));
    assert!(matches!(
        store.claim(&keys[2], fp("r"), LEASE).await.unwrap(),
        StoreClaim::Unknown { .. }
    ));
    assert_eq!(replayed(store.claim(&keys[3], fp("r"), LEASE).await.unwrap()), "theirs");
    // A result TTL the store would refuse is refused before anything is listed.
    let refused =
        reconcile(store, usize::MAX, Duration::ZERO, |_| async { Verdict::DidNotHappen }).await;
    let error = refused.unwrap_err();
    assert!(matches!(error.error, StoreError::InvalidInput(_)), "{error}");
    assert_eq!(error.done.checked(), 0);
    assert!(matches!(
        store.claim(&keys[2], fp("r"), LEASE).await.unwrap(),
        StoreClaim::Unknown { .. }
    ));
    verdicts_settle_only_the_listed_record(store, &run).await;
}

/// A verdict is about the execution that was listed: if the key is forgotten, claimed
/// again (by another request, or by the same one) and marked UNKNOWN again while the
/// authority was asked, settling the listed record is refused (`NothingToSettle`) and the new
/// record stays UNKNOWN; the record listed now settles as usual. The listed execution is
/// told apart by its token alone: a listing of the new record's fingerprint and mark
/// time under the old token (what a mark within the same clock tick looks like) is
/// refused too.
async fn verdicts_settle_only_the_listed_record<S: Store>(store: &S, run: &Run) {
    async fn listed<S: Store>(store: &S, k: &Key) -> crate::UnknownEntry<SystemTime> {
        let listed = store.list_unknown(usize::MAX).await.unwrap();
        listed.into_iter().find(|e| e.key == *k).expect("the record is listed")
    }
    let k = run.key("reconcile-aba");
    let token = acquire(store, &k).await;
    store.mark_unknown(&k, token, TTL).await.unwrap();
    let stale = listed(store, &k).await;
    assert_eq!(stale.token, token, "a record is listed with its execution's token");
    for request in ["another request", "r"] {
        store.forget(&k).await.unwrap();
        let StoreClaim::Acquired { token, .. } = store.claim(&k, fp(request), LEASE).await.unwrap()
        else {
            panic!("a forgotten key is acquired");
        };
        store.mark_unknown(&k, token, TTL).await.unwrap();
        let now = listed(store, &k).await;
        let same_tick = crate::UnknownEntry::new(
            k.clone(),
            now.fingerprint,
            stale.token,
            now.marked_at,
            now.expires_at,
        );
        for earlier in [&stale, &same_tick] {
            let refused =
                store.resolve_listed(earlier, Some(Bytes::from_static(b"stale")), TTL).await;
            assert!(
                matches!(refused, Err(StoreError::NothingToSettle(_))),
                "{request}: {refused:?}"
            );
            let refused = store.forget_listed(earlier).await;
            assert!(
                matches!(refused, Err(StoreError::NothingToSettle(_))),
                "{request}: {refused:?}"
            );
        }
        assert!(matches!(
            store.claim(&k, fp(request), LEASE).await.unwrap(),
            StoreClaim::Unknown { .. }
        ));
    }
    let current = listed(store, &k).await;
    store.resolve_listed(&current, Some(Bytes::from_static(b"settled")), TTL).await.unwrap();
    assert!(matches!(store.claim(&k, fp("r"), LEASE).await.unwrap(), StoreClaim::Completed(_)));
}
