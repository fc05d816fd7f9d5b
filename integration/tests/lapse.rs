//! Lapses under `LapsePolicy::MarkUnknown` on every store, and reconciling: each store
//! built with that policy passes `conformance::run_mark_unknown` (a lapsed lease is never
//! re-run: the claim after it answers Unknown, it is listed, its token is fenced,
//! purging keeps it, resolving replays it) and `conformance::reconcile_as_checked`;
//! `Tiered` over such a store never answers Acquired for a key the store holds UNKNOWN,
//! whatever its cache's own policy. SQLite always; PostgreSQL (on a schema of its own, so
//! no other test's purge, under another policy, meets its records) and Redis when their
//! URLs are in the environment.

use std::time::Duration;

use idemcache::store::conformance::{self, fp, key, SHORT_LEASE};
use idemcache::store::{Store, StoreError, Tiered, TieredClaim};
use idemcache::{Bytes, Cache, LapsePolicy, Verdict};
use idemcache_sqlite::SqliteStore;

/// How long the stores under test keep a lapsed lease UNKNOWN.
const UNKNOWN_TTL: Duration = Duration::from_secs(3600);

async fn sqlite_marking() -> SqliteStore {
    let store = SqliteStore::connect("sqlite::memory:")
        .await
        .unwrap()
        .lapse_policy(LapsePolicy::MarkUnknown, UNKNOWN_TTL)
        .unwrap();
    store.ensure_schema().await.unwrap();
    store
}

#[tokio::test]
async fn sqlite_under_mark_unknown_never_re_runs_a_lapsed_lease() {
    let store = sqlite_marking().await;
    assert_eq!(store.lapse().policy(), LapsePolicy::MarkUnknown);
    conformance::run_mark_unknown(&store, UNKNOWN_TTL, true).await;
    conformance::reconcile_as_checked(&store).await;
}

#[tokio::test]
async fn a_lapse_setting_is_checked_and_take_over_stays_the_default() {
    let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
    assert_eq!(store.lapse().policy(), LapsePolicy::TakeOver);
    let refused = store.clone().lapse_policy(LapsePolicy::MarkUnknown, Duration::ZERO);
    assert!(matches!(refused, Err(StoreError::InvalidInput(_))), "{refused:?}");
    // TakeOver ignores the TTL.
    store.lapse_policy(LapsePolicy::TakeOver, Duration::ZERO).unwrap();
}

/// Two handles on one file, one under each policy (as two processes configured apart):
/// a lapse the `MarkUnknown` handle turned UNKNOWN is UNKNOWN to the `TakeOver` handle
/// too, and its purge keeps it. (A lapse nobody turned yet is the `TakeOver` handle's to
/// take over: the documented reason to configure every handle alike.)
#[tokio::test]
async fn a_lapse_turned_unknown_is_unknown_to_a_take_over_handle_too() {
    let dir = std::env::temp_dir().join(format!("idemcache-lapse-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("records.db");
    let _ = std::fs::remove_file(&path);
    let url = format!("sqlite:{}", path.display());
    let taking = SqliteStore::connect(&url).await.unwrap();
    taking.ensure_schema().await.unwrap();
    let marking = SqliteStore::connect(&url)
        .await
        .unwrap()
        .lapse_policy(LapsePolicy::MarkUnknown, UNKNOWN_TTL)
        .unwrap();
    let k = key("mixed");
    let idemcache::store::StoreClaim::Acquired { lease_ends_at, .. } =
        marking.claim(&k, fp("r"), SHORT_LEASE).await.unwrap()
    else {
        panic!("expected Acquired");
    };
    let turned = loop {
        match marking.claim(&k, fp("r"), SHORT_LEASE).await.unwrap() {
            idemcache::store::StoreClaim::InProgress { .. } => {
                conformance::pause(Duration::from_millis(5)).await
            }
            other => break other,
        }
    };
    assert_eq!(turned, idemcache::store::StoreClaim::Unknown { marked_at: lease_ends_at });
    while taking.purge_expired(100).await.unwrap() == 100 {}
    assert_eq!(
        taking.claim(&k, fp("r"), SHORT_LEASE).await.unwrap(),
        idemcache::store::StoreClaim::Unknown { marked_at: lease_ends_at }
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `Tiered` over a store under `MarkUnknown`: an execution that ran past its lease (its
/// guard held, as a hung process holds it) is UNKNOWN to every later claim, never
/// re-run, whether the cache in front takes its own lapsed claim over or marks it
/// UNKNOWN too; `Tiered::reconcile` settles it in the store, and the next claim replays
/// (no UNKNOWN left behind in memory).
#[tokio::test]
async fn tiered_never_re_runs_a_lapse_the_store_holds_unknown() {
    for cache_policy in [LapsePolicy::TakeOver, LapsePolicy::MarkUnknown] {
        let cache = Cache::builder().lapse_policy(cache_policy).build().unwrap();
        let tiered = Tiered::new(cache, sqlite_marking().await).lease(SHORT_LEASE);
        let k = key(&format!("tiered-{cache_policy:?}"));
        let TieredClaim::Acquired(hung) = tiered.claim(&k, fp("r")).await.unwrap() else {
            panic!("expected Acquired");
        };
        let lapsed = loop {
            match tiered.claim(&k, fp("r")).await.unwrap() {
                TieredClaim::InProgress { .. } => conformance::pause(Duration::from_millis(5)).await,
                TieredClaim::Acquired(_) => panic!("a lapsed lease was re-run ({cache_policy:?})"),
                other => break other,
            }
        };
        assert!(matches!(lapsed, TieredClaim::Unknown { .. }), "{lapsed:?}");
        assert!(matches!(tiered.claim(&k, fp("r")).await.unwrap(), TieredClaim::Unknown { .. }));
        let late = hung.complete(&b"late"[..]).await;
        assert!(
            matches!(late, Err(idemcache::store::TieredError::Store(StoreError::LeaseLost(_)))),
            "{late:?}"
        );
        let done = tiered
            .reconcile(usize::MAX, |entry| {
                let mine = entry.key == k;
                async move {
                    if mine {
                        Verdict::Happened(Some(Bytes::from_static(b"charged")))
                    } else {
                        Verdict::Undecided
                    }
                }
            })
            .await
            .unwrap();
        assert_eq!(done.resolved, 1, "{done:?}");
        match tiered.claim(&k, fp("r")).await.unwrap() {
            TieredClaim::Completed(replay) => assert_eq!(replay.body.unwrap(), "charged"),
            other => panic!("{other:?} ({cache_policy:?})"),
        }
    }
}
