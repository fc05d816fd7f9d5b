//! The conformance sub-suite of inspection: [`Store::record`], [`Store::records`] and
//! [`Store::remove_record`] ([`inspection`], in [`run`](super::run)), and a lapse read
//! as UNKNOWN by them under `LapsePolicy::MarkUnknown` ([`lapsed_is_unknown`], in
//! [`run_mark_unknown`](super::run_mark_unknown)).
//!
//! Every record here has a client key of this call's own (the process's run and the
//! call's prefix in it), so a listing by client key finds this call's records only,
//! whatever else a shared database holds; listings by scope and tenant use a tenant of
//! this call's own. A row whose key bytes are not an idemcache key cannot be written
//! through the trait: each store's own tests check that `records` names it
//! [`Corrupt`](StoreError::Corrupt).

use std::time::Duration;

use bytes::Bytes;

use super::{acquire, fp, key, pause, Run, LEASE, TTL};
use crate::store::{Record, RecordFilter, RecordState, Store, StoreClaim, StoreError};
use crate::Key;

/// The scope of this sub-suite's second operation.
const OTHER_SCOPE: &str = "PUT /inspect";

/// This call's client key `name` (unique to the process and the call).
fn client_key(run: &Run, name: &str) -> String {
    let process = key("x");
    let process = process.tenant().unwrap_or("run");
    format!("{process}-{}{name}", run.0)
}

/// Every record `filter` selects, page by page of `page` records, each page after the
/// previous one's last key.
async fn all_pages<S: Store>(store: &S, filter: &RecordFilter, page: usize) -> Vec<Record> {
    let (mut out, mut after): (Vec<Record>, Option<Key>) = (Vec::new(), None);
    loop {
        let got = store.records(filter, after.as_ref(), page).await.unwrap();
        assert!(got.len() <= page, "a page is bounded: {} > {page}", got.len());
        let full = got.len() == page;
        after = got.last().map(|r| r.key.clone());
        out.extend(got);
        if !full {
            return out;
        }
    }
}

fn keys(records: &[Record]) -> Vec<Key> {
    records.iter().map(|r| r.key.clone()).collect()
}

/// Sorted as the stores list: by the stored key's bytes.
fn sorted(mut keys: Vec<Key>) -> Vec<Key> {
    keys.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    keys
}

/// Each state read by `record` and `records`, each filter field, paging, an expired
/// record absent, and `remove_record` only in the states it is given.
pub(super) async fn inspection<S: Store>(store: &S, run: &Run) {
    let tenant = format!("{}-{}", key("x").tenant().unwrap_or("run"), run.0.trim_end_matches('/'));
    let other_tenant = format!("{tenant}-other");
    let shared = client_key(run, "shared");
    let processing = Key::new("POST /orders", &tenant, &shared).unwrap();
    let completed = Key::new("POST /orders", &tenant, client_key(run, "completed")).unwrap();
    let unknown = Key::new("POST /orders", &tenant, client_key(run, "unknown")).unwrap();
    let elsewhere = Key::new(OTHER_SCOPE, &other_tenant, &shared).unwrap();
    let no_tenant = Key::without_tenant(OTHER_SCOPE, &shared).unwrap();
    let expired = Key::new("POST /orders", &tenant, client_key(run, "expired")).unwrap();

    let held = acquire(store, &processing).await;
    let completed_token = acquire(store, &completed).await;
    let done =
        store.complete(&completed, completed_token, Some(Bytes::from_static(b"receipt")), TTL);
    let done = done.await.unwrap();
    let marked = acquire(store, &unknown).await;
    store.mark_unknown(&unknown, marked, TTL).await.unwrap();
    for k in [&elsewhere, &no_tenant] {
        let token = acquire(store, k).await;
        store.complete(k, token, None, TTL).await.unwrap();
    }
    let token = acquire(store, &expired).await;
    store.complete(&expired, token, None, Duration::from_millis(10)).await.unwrap();

    // `record`: each state as a claim finds it, changing nothing.
    let p = store.record(&processing).await.unwrap().expect("the PROCESSING record");
    assert_eq!((p.state, p.token, p.fingerprint), (RecordState::Processing, held, fp("r")));
    assert_eq!((p.settled_at, p.body.as_deref(), p.lapsed), (None, None, false));
    let lease = p.expires_at.duration_since(p.started_at).unwrap_or_default();
    assert!(lease <= LEASE && lease > LEASE - Duration::from_secs(5), "a lease of {lease:?}");
    let c = store.record(&completed).await.unwrap().expect("the COMPLETED record");
    assert_eq!(
        (c.state, c.token, c.body.as_deref()),
        (RecordState::Completed, completed_token, Some(&b"receipt"[..]))
    );
    assert_eq!((c.settled_at, c.expires_at), (Some(done.completed_at), done.expires_at));
    let u = store.record(&unknown).await.unwrap().expect("the UNKNOWN record");
    assert_eq!((u.state, u.token, u.lapsed), (RecordState::Unknown, marked, false));
    assert!(u.settled_at.is_some_and(|at| at >= u.started_at), "{u:?}");
    assert_eq!(
        store
            .record(&Key::new("POST /orders", &tenant, client_key(run, "none")).unwrap())
            .await
            .unwrap(),
        None
    );
    assert!(
        matches!(
            store.claim(&processing, fp("r"), LEASE).await.unwrap(),
            StoreClaim::InProgress { .. }
        ),
        "a look changes nothing"
    );
    // An expired record is absent to both reads (the store's clock decides when).
    for _ in 0..2000 {
        if store.record(&expired).await.unwrap().is_none() {
            break;
        }
        pause(Duration::from_millis(2)).await;
    }
    assert_eq!(store.record(&expired).await.unwrap(), None, "the expired record is absent");

    // `records`: by client key, whatever the scope and tenant, in key order.
    let by_key = RecordFilter::new().client_key(shared.clone());
    let found = store.records(&by_key, None, 100).await.unwrap();
    assert_eq!(
        keys(&found),
        sorted(vec![processing.clone(), elsewhere.clone(), no_tenant.clone()])
    );
    assert_eq!(found.iter().find(|r| r.key == processing), Some(&p));
    // Each field narrows it, alone and together.
    let ours = RecordFilter::new().scope("POST /orders").tenant(tenant.clone());
    let cases = [
        (by_key.clone().scope("POST /orders"), vec![processing.clone()]),
        (by_key.clone().tenant(other_tenant.clone()), vec![elsewhere.clone()]),
        (by_key.clone().without_tenant(), vec![no_tenant.clone()]),
        (by_key.clone().scope(OTHER_SCOPE), vec![elsewhere.clone(), no_tenant.clone()]),
        (by_key.clone().state(RecordState::Completed), vec![elsewhere.clone(), no_tenant.clone()]),
        (ours.clone(), vec![processing.clone(), completed.clone(), unknown.clone()]),
        (ours.clone().state(RecordState::Processing), vec![processing.clone()]),
        (ours.clone().state(RecordState::Completed), vec![completed.clone()]),
        (ours.clone().state(RecordState::Unknown), vec![unknown.clone()]),
        (
            ours.clone().state(RecordState::Unknown).state(RecordState::Processing),
            vec![processing.clone(), unknown.clone()],
        ),
        (
            RecordFilter::new().tenant(tenant.clone()),
            vec![processing.clone(), completed.clone(), unknown.clone()],
        ),
        (RecordFilter::new().client_key(client_key(run, "expired")), vec![]),
    ];
    for (filter, expected) in cases {
        let found = store.records(&filter, None, 100).await.unwrap();
        assert_eq!(keys(&found), sorted(expected), "{filter:?}");
        assert!(found.iter().all(|r| filter.matches(r)), "{filter:?}");
    }
    // Paging: one record a page, each after the last, ends with an empty page.
    let paged = all_pages(store, &ours, 1).await;
    assert_eq!(keys(&paged), sorted(vec![processing.clone(), completed.clone(), unknown.clone()]));
    let last = paged.last().map(|r| r.key.clone()).unwrap();
    assert_eq!(store.records(&ours, Some(&last), 10).await.unwrap(), vec![]);
    assert_eq!(store.records(&ours, None, 0).await.unwrap(), vec![], "a limit of 0 lists none");
    // Every live record of the database, a page at a time, holds ours exactly once.
    let everything = all_pages(store, &RecordFilter::new(), 500).await;
    for k in [&processing, &completed, &unknown, &elsewhere, &no_tenant] {
        assert_eq!(everything.iter().filter(|r| &r.key == k).count(), 1, "{k:?}");
    }
    assert!(everything.iter().all(|r| r.key != expired));
    assert!(everything.windows(2).all(|w| w[0].key.as_bytes() < w[1].key.as_bytes()));

    // `remove_record`: only in the states it is given, and it says what it removed.
    assert_eq!(store.remove_record(&completed, &[RecordState::Unknown]).await.unwrap(), None);
    assert_eq!(
        store.record(&completed).await.unwrap().map(|r| r.state),
        Some(RecordState::Completed)
    );
    let removed = store.remove_record(&completed, &[RecordState::Completed]).await.unwrap();
    assert_eq!(removed, Some(c));
    assert_eq!(store.record(&completed).await.unwrap(), None);
    assert_eq!(store.remove_record(&completed, &RecordState::ALL).await.unwrap(), None);
    assert_eq!(store.remove_record(&unknown, &[]).await.unwrap(), None, "no state: nothing");
    let removed = store.remove_record(&unknown, &[RecordState::Completed, RecordState::Unknown]);
    assert_eq!(removed.await.unwrap().map(|r| r.state), Some(RecordState::Unknown));
    let removed = store.remove_record(&processing, &[RecordState::Processing]).await.unwrap();
    assert_eq!(removed.map(|r| r.token), Some(held));
    // Its owner, still running, is fenced; a claim executes the key again.
    let late = store.complete(&processing, held, None, TTL).await;
    assert!(matches!(late, Err(StoreError::LeaseLost(_))), "{late:?}");
    assert!(acquire(store, &processing).await > held);
    assert_eq!(store.remove_record(&expired, &RecordState::ALL).await.unwrap(), None);
}

/// Under `MarkUnknown`: a lease that lapsed, not yet claimed, is UNKNOWN to `record`
/// and `records` (flagged `lapsed`, marked at the lease's end), and `remove_record`
/// removes it as UNKNOWN.
pub(super) async fn lapsed_is_unknown<S: Store>(store: &S, run: &Run, short: Duration) {
    let k = key(&format!("{}inspect-lapse", run.0));
    let (token, ends) = match store.claim(&k, fp("r"), short).await.unwrap() {
        StoreClaim::Acquired { token, lease_ends_at, .. } => (token, lease_ends_at),
        other => panic!("expected Acquired, got {other:?}"),
    };
    let mut seen = None;
    for _ in 0..2000 {
        match store.record(&k).await.unwrap() {
            Some(r) if r.state == RecordState::Processing => pause(Duration::from_millis(2)).await,
            other => {
                seen = other;
                break;
            }
        }
    }
    let seen = seen.expect("the lapsed lease reads as UNKNOWN");
    assert_eq!((seen.state, seen.lapsed, seen.token), (RecordState::Unknown, true, token));
    assert_eq!(seen.settled_at, Some(ends), "marked at the lease's end");
    let filter = RecordFilter::new().client_key(k.client_key()).state(RecordState::Unknown);
    assert_eq!(store.records(&filter, None, 10).await.unwrap(), vec![seen.clone()]);
    let processing = filter.clone().state(RecordState::Processing);
    let only_processing =
        RecordFilter::new().client_key(k.client_key()).state(RecordState::Processing);
    assert_eq!(store.records(&processing, None, 10).await.unwrap().len(), 1);
    assert_eq!(store.records(&only_processing, None, 10).await.unwrap(), vec![]);
    assert_eq!(store.remove_record(&k, &[RecordState::Processing]).await.unwrap(), None);
    assert_eq!(store.remove_record(&k, &[RecordState::Unknown]).await.unwrap(), Some(seen));
    assert_eq!(store.record(&k).await.unwrap(), None);
}

/// A claim's correlation id is kept with its record through completion and an UNKNOWN
/// mark; a claim without one leaves none; a takeover's replaces the lapsed claim's.
pub(super) async fn correlation<S: Store>(store: &S, run: &Run) {
    let id = |s: &str| crate::CorrelationId::new(format!("{s}-{}", run.0.trim_end_matches('/')));
    let (first, second) = (id("req-1").unwrap(), id("req-2").unwrap());
    let claimed = |k: Key, lease, with: Option<crate::CorrelationId>| async move {
        match store.claim_correlated(&k, fp("r"), lease, with.as_ref()).await.unwrap() {
            StoreClaim::Acquired { token, .. } => token,
            other => panic!("{other:?}"),
        }
    };
    let kept = |k: Key| async move { store.record(&k).await.unwrap().expect("a record") };

    let completed = run.key("correlated-completed");
    let token = claimed(completed.clone(), LEASE, Some(first.clone())).await;
    assert_eq!(kept(completed.clone()).await.correlation_id.as_ref(), Some(&first));
    store.complete(&completed, token, None, TTL).await.unwrap();
    let done = kept(completed.clone()).await;
    assert_eq!((done.state, done.correlation_id), (RecordState::Completed, Some(first.clone())));

    let unknown = run.key("correlated-unknown");
    let token = claimed(unknown.clone(), LEASE, Some(second.clone())).await;
    store.mark_unknown(&unknown, token, TTL).await.unwrap();
    assert_eq!(kept(unknown.clone()).await.correlation_id, Some(second.clone()));
    // This process's record only: another run's with the same client key has its tenant.
    let tenant = unknown.tenant().unwrap_or_default();
    let listed = RecordFilter::new().client_key(unknown.client_key()).tenant(tenant);
    let found = store.records(&listed, None, 10).await.unwrap();
    assert_eq!(
        found.iter().map(|r| r.correlation_id.clone()).collect::<Vec<_>>(),
        [Some(second.clone())]
    );

    let none = run.key("correlated-none");
    claimed(none.clone(), LEASE, None).await;
    assert_eq!(kept(none).await.correlation_id, None);

    // A lapsed claim's id is replaced by its takeover's.
    let lapsed = run.key("correlated-lapsed");
    claimed(lapsed.clone(), Duration::from_millis(20), Some(first.clone())).await;
    for _ in 0..2000 {
        let taken = store.claim_correlated(&lapsed, fp("r"), LEASE, Some(&second)).await.unwrap();
        if let StoreClaim::Acquired { .. } = taken {
            assert_eq!(kept(lapsed).await.correlation_id, Some(second));
            return;
        }
        pause(Duration::from_millis(2)).await;
    }
    panic!("the lapsed claim was never taken over");
}
