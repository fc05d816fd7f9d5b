//! Lapses under `LapsePolicy::MarkUnknown` across crates, and reconciling: each store
//! built with that policy passes `conformance::run_mark_unknown` (a lapsed lease is never
//! re-run: the claim after it answers Unknown, it is listed, its token is fenced,
//! purging keeps it, resolving replays it) and `conformance::reconcile_as_checked`;
//! `Tiered` over such a store never answers Acquired for a key the store holds UNKNOWN,
//! whatever its cache's own policy: a store opened from a URL, and under `Tiered`, over
//! SQLite. Each store's own runs of the sub-suite are in its crate's tests/.

use std::time::Duration;

use idemcache::store::conformance::{self, fp, key, SHORT_LEASE};
use idemcache::store::{Record, RecordFilter, RecordState, Store, StoreError, Tiered, TieredClaim};
use idemcache::{Bytes, Cache, LapsePolicy, Verdict};
use idemcache_sqlite::SqliteStore;

/// How long the stores under test keep a lapsed lease UNKNOWN.
const UNKNOWN_TTL: Duration = Duration::from_secs(3600);

async fn sqlite_marking() -> SqliteStore {
    let store = SqliteStore::connect("sqlite::memory:")
        .await
        .unwrap()
        .with_lapse_policy(LapsePolicy::MarkUnknown { ttl: UNKNOWN_TTL })
        .unwrap();
    store.ensure_schema().await.unwrap();
    store
}

/// A store chosen at run time takes the setting too (`idemcache_any::open_with`).
#[tokio::test]
async fn a_store_opened_from_a_url_marks_lapses_unknown_when_asked() {
    let marking = LapsePolicy::MarkUnknown { ttl: UNKNOWN_TTL };
    let store = idemcache_any::open_with("sqlite::memory:", marking).await.unwrap();
    store.ensure_schema().await.unwrap();
    conformance::run_mark_unknown(&store, UNKNOWN_TTL, true).await;
    let taking = idemcache_any::open("sqlite::memory:").await.unwrap();
    taking.ensure_schema().await.unwrap();
    conformance::run(&taking).await;
}

/// `Tiered` over a store under `MarkUnknown`: an execution that ran past its lease (its
/// guard held, as a hung process holds it) is UNKNOWN to every later claim, never
/// re-run, whether the cache in front takes its own lapsed claim over or marks it
/// UNKNOWN too; `Tiered::reconcile` settles it in the store, and the next claim replays
/// (no UNKNOWN left behind in memory).
#[tokio::test]
async fn tiered_never_re_runs_a_lapse_the_store_holds_unknown() {
    let marking = LapsePolicy::MarkUnknown { ttl: UNKNOWN_TTL };
    for (name, cache_policy) in [("take-over", LapsePolicy::TakeOver), ("mark", marking)] {
        let cache = Cache::builder().lapse_policy(cache_policy).build().unwrap();
        let tiered = Tiered::new(cache, sqlite_marking().await).with_lease(SHORT_LEASE);
        let k = key(&format!("tiered-{name}"));
        let TieredClaim::Acquired(hung) = tiered.claim(&k, fp("r")).await.unwrap() else {
            panic!("expected Acquired");
        };
        let lapsed = loop {
            match tiered.claim(&k, fp("r")).await.unwrap() {
                TieredClaim::InProgress { .. } => {
                    conformance::pause(Duration::from_millis(5)).await
                }
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

/// A store whose `forget` fails (the server went away mid-pass), all else SQLite's.
#[derive(Debug)]
struct ForgetFails(SqliteStore);

impl Store for ForgetFails {
    fn claim_correlated(
        &self,
        key: &idemcache::Key,
        fingerprint: idemcache::Fingerprint,
        lease: Duration,
        correlation_id: Option<&idemcache::CorrelationId>,
    ) -> impl std::future::Future<Output = Result<idemcache::store::StoreClaim, StoreError>> + Send
    {
        self.0.claim_correlated(key, fingerprint, lease, correlation_id)
    }
    fn complete(
        &self,
        key: &idemcache::Key,
        token: idemcache::FencingToken,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl std::future::Future<
        Output = Result<idemcache::Replay<std::time::SystemTime>, StoreError>,
    > + Send {
        self.0.complete(key, token, body, ttl)
    }
    fn extend_lease(
        &self,
        key: &idemcache::Key,
        token: idemcache::FencingToken,
        lease: Duration,
    ) -> impl std::future::Future<Output = Result<std::time::SystemTime, StoreError>> + Send {
        self.0.extend_lease(key, token, lease)
    }
    fn release(
        &self,
        key: &idemcache::Key,
        token: idemcache::FencingToken,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send {
        self.0.release(key, token)
    }
    fn mark_unknown(
        &self,
        key: &idemcache::Key,
        token: idemcache::FencingToken,
        ttl: Duration,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send {
        self.0.mark_unknown(key, token, ttl)
    }
    fn resolve_fenced(
        &self,
        key: &idemcache::Key,
        execution: Option<idemcache::FencingToken>,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl std::future::Future<
        Output = Result<idemcache::Replay<std::time::SystemTime>, StoreError>,
    > + Send {
        self.0.resolve_fenced(key, execution, body, ttl)
    }
    fn forget_fenced(
        &self,
        _key: &idemcache::Key,
        _execution: Option<idemcache::FencingToken>,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Err(StoreError::Backend("the server went away".into())))
    }
    fn list_unknown(
        &self,
        limit: usize,
    ) -> impl std::future::Future<
        Output = Result<Vec<idemcache::UnknownEntry<std::time::SystemTime>>, StoreError>,
    > + Send {
        self.0.list_unknown(limit)
    }
    fn purge_expired(
        &self,
        limit: usize,
    ) -> impl std::future::Future<Output = Result<usize, StoreError>> + Send {
        self.0.purge_expired(limit)
    }
    async fn record(&self, key: &idemcache::Key) -> Result<Option<Record>, StoreError> {
        self.0.record(key).await
    }
    async fn records(
        &self,
        filter: &RecordFilter,
        after: Option<&idemcache::Key>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.0.records(filter, after, limit).await
    }
    async fn remove_record(
        &self,
        key: &idemcache::Key,
        states: &[RecordState],
    ) -> Result<Option<Record>, StoreError> {
        self.0.remove_record(key, states).await
    }
}

/// A store error stops a reconciling pass at once, and the error says what was done
/// before it: the record resolved first stays resolved, the one after is not checked.
#[tokio::test]
async fn a_store_error_stops_reconciling_and_says_what_was_done() {
    let store = ForgetFails(sqlite_marking().await);
    let keys: Vec<_> =
        ["first", "second", "third"].iter().map(|k| key(&format!("stop-{k}"))).collect();
    for k in &keys {
        let token = conformance::acquire(&store, k).await;
        store.mark_unknown(k, token, conformance::TTL).await.unwrap();
        // Marks a moment apart, so they are listed in this order.
        conformance::pause(Duration::from_millis(2)).await;
    }
    let mut checked = 0;
    let error = idemcache::store::reconcile(&store, usize::MAX, conformance::TTL, |_| {
        checked += 1;
        let verdict = if checked == 1 {
            Verdict::Happened(Some(Bytes::from_static(b"paid")))
        } else {
            Verdict::DidNotHappen
        };
        async move { verdict }
    })
    .await
    .unwrap_err();
    assert_eq!(checked, 2, "the pass stopped at the failing forget");
    assert_eq!((error.done.resolved, error.done.forgotten, error.done.left), (1, 0, 0));
    assert!(matches!(error.error, StoreError::Backend(_)), "{error:?}");
    let said = error.to_string();
    assert!(said.contains("1 resolved") && said.contains("the server went away"), "{said}");
    match store.claim(&keys[0], fp("r"), conformance::LEASE).await.unwrap() {
        idemcache::store::StoreClaim::Completed(replay) => assert_eq!(replay.body.unwrap(), "paid"),
        other => panic!("{other:?}"),
    }
    for k in &keys[1..] {
        let still = store.claim(k, fp("r"), conformance::LEASE).await.unwrap();
        assert!(matches!(still, idemcache::store::StoreClaim::Unknown { .. }), "{still:?}");
    }
}
