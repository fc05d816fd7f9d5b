//! Claim-and-wait over a store (`idemcache::store::claim_wait`, `Tiered::claim_wait`)
//! on a SQLite file shared by two stores, as two processes share it: a waiter replays
//! what the holder completes, acquires what it releases, answers UNKNOWN for a lease
//! that lapses under `MarkUnknown`, and gives up "in progress" when its wait is spent.
//! Also the record methods (`Store::record`, `records`, `remove_record`) on SQLite,
//! which read records as a claim of the same handle would.

use std::time::{Duration, Instant};

use idemcache::store::conformance::{acquire, fp, key, LEASE, TTL};
use idemcache::store::{block_on, claim_wait, Store, StoreClaim, Tiered, TieredClaim};
use idemcache::store::{RecordFilter, RecordState};
use idemcache::{Bytes, Cache, LapsePolicy};
use idemcache_sqlite::SqliteStore;

/// Two stores on one new file, schema in place, the second under `lapse`.
async fn two_on_a_file(name: &str, lapse: LapsePolicy) -> (SqliteStore, SqliteStore) {
    let dir = std::env::temp_dir().join(format!("idemcache-wait-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("records.db");
    let a = SqliteStore::open_path(&path).await.unwrap();
    a.ensure_schema().await.unwrap();
    let b = SqliteStore::open_path(&path).await.unwrap().with_lapse_policy(lapse).unwrap();
    (a, b)
}

#[tokio::test]
async fn a_waiter_replays_what_the_holder_completes() {
    let (holder, waiter) = two_on_a_file("replay", LapsePolicy::TakeOver).await;
    let k = key("wait-replay");
    let token = acquire(&holder, &k).await;
    let finishing = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        holder
            .complete(&key("wait-replay"), token, Some(Bytes::from_static(b"once")), TTL)
            .await
            .unwrap();
    });
    let started = Instant::now();
    let got =
        claim_wait(&waiter, &k, fp("r"), LEASE, Duration::from_secs(20), tokio::time::sleep).await;
    match got.unwrap() {
        StoreClaim::Completed(replay) => assert_eq!(replay.body.unwrap(), "once"),
        other => panic!("{other:?}"),
    }
    // Noticed within a pause (at most 250 ms) of the completion, not at the wait's end.
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    finishing.await.unwrap();
    // Another request under the key is a mismatch at once, not a wait.
    let other =
        claim_wait(&waiter, &k, fp("other"), LEASE, Duration::from_secs(20), tokio::time::sleep);
    assert_eq!(other.await.unwrap(), StoreClaim::Mismatch);
}

#[tokio::test]
async fn a_waiter_acquires_a_released_key_and_gives_up_in_progress_when_its_wait_is_spent() {
    let (holder, waiter) = two_on_a_file("release", LapsePolicy::TakeOver).await;
    let k = key("wait-release");
    let token = acquire(&holder, &k).await;
    let started = Instant::now();
    let spent =
        claim_wait(&waiter, &k, fp("r"), LEASE, Duration::from_millis(300), tokio::time::sleep)
            .await;
    assert!(matches!(spent.unwrap(), StoreClaim::InProgress { .. }));
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(5), "{took:?}");
    holder.release(&k, token).await.unwrap();
    let got =
        claim_wait(&waiter, &k, fp("r"), LEASE, Duration::from_secs(20), tokio::time::sleep).await;
    assert!(matches!(got.unwrap(), StoreClaim::Acquired { .. }));
}

#[tokio::test]
async fn under_mark_unknown_a_waiter_answers_unknown_when_the_holder_lapses() {
    let (holder, waiter) = two_on_a_file("lapse", LapsePolicy::MarkUnknown { ttl: TTL }).await;
    let k = key("wait-lapse");
    // The holder claims with a short lease and never renews it (a process killed).
    match holder.claim(&k, fp("r"), Duration::from_millis(200)).await.unwrap() {
        StoreClaim::Acquired { .. } => {}
        other => panic!("{other:?}"),
    }
    let got =
        claim_wait(&waiter, &k, fp("r"), LEASE, Duration::from_secs(20), tokio::time::sleep).await;
    assert!(matches!(got.unwrap(), StoreClaim::Unknown { .. }), "a lapse was taken over");
}

#[test]
fn synchronous_code_waits_with_a_blocking_sleep_under_block_on() {
    let (holder, waiter) = block_on(two_on_a_file("sync", LapsePolicy::TakeOver));
    let k = key("wait-sync");
    let token = block_on(acquire(&holder, &k));
    let finishing = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        block_on(holder.complete(&key("wait-sync"), token, Some(Bytes::from_static(b"sync")), TTL))
            .unwrap();
    });
    let nap = |d: Duration| async move { std::thread::sleep(d) };
    let got =
        block_on(claim_wait(&waiter, &k, fp("r"), LEASE, Duration::from_secs(20), nap)).unwrap();
    assert!(
        matches!(got, StoreClaim::Completed(replay) if replay.body.as_deref() == Some(&b"sync"[..]))
    );
    finishing.join().unwrap();
}

#[tokio::test]
async fn tiered_claim_wait_replays_a_duplicate_running_in_another_process() {
    let (elsewhere, here) = two_on_a_file("tiered", LapsePolicy::TakeOver).await;
    let tiered = Tiered::new(Cache::builder().build().unwrap(), here);
    let k = key("wait-tiered");
    let token = acquire(&elsewhere, &k).await;
    let finishing = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        elsewhere
            .complete(&key("wait-tiered"), token, Some(Bytes::from_static(b"there")), TTL)
            .await
            .unwrap();
    });
    let got =
        tiered.claim_wait(&k, fp("r"), Duration::from_secs(20), tokio::time::sleep).await.unwrap();
    match got {
        TieredClaim::Completed(replay) => assert_eq!(replay.body.unwrap(), "there"),
        other => panic!("{other:?}"),
    }
    finishing.await.unwrap();
    // A wait of zero is one claim: the repeat is answered (from memory now).
    let again = tiered.claim_wait(&k, fp("r"), Duration::ZERO, tokio::time::sleep).await.unwrap();
    assert!(matches!(again, TieredClaim::Completed(_)));
}

#[tokio::test]
async fn sqlite_records_read_as_a_claim_would_and_removal_acts_on_the_named_states() {
    let (take_over, marking) =
        two_on_a_file("records", LapsePolicy::MarkUnknown { ttl: TTL }).await;
    let (done, running, lapsed, marked) =
        (key("rec-done"), key("rec-running"), key("rec-lapsed"), key("rec-marked"));
    let t = acquire(&marking, &done).await;
    marking.complete(&done, t, Some(Bytes::from_static(b"body")), TTL).await.unwrap();
    acquire(&marking, &running).await;
    let t = acquire(&marking, &marked).await;
    marking.mark_unknown(&marked, t, TTL).await.unwrap();
    let StoreClaim::Acquired { .. } =
        marking.claim(&lapsed, fp("r"), Duration::from_millis(50)).await.unwrap()
    else {
        panic!("not acquired")
    };
    // Wait (bounded) for the short lease to lapse on SQLite's clock.
    let deadline = Instant::now() + Duration::from_secs(10);
    while marking.record(&lapsed).await.unwrap().unwrap().state == RecordState::Processing {
        assert!(Instant::now() < deadline, "the lease never lapsed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let r = marking.record(&done).await.unwrap().unwrap();
    assert_eq!(
        (r.state, r.body.as_deref(), r.fingerprint),
        (RecordState::Completed, Some(&b"body"[..]), fp("r"))
    );
    assert!(r.settled_at.is_some() && r.expires_at > r.started_at);
    let l = marking.record(&lapsed).await.unwrap().unwrap();
    assert_eq!(
        (l.state, l.lapsed),
        (RecordState::Unknown, true),
        "a lapse under MarkUnknown is UNKNOWN"
    );
    // Marked at the lease's end, kept the unknown TTL from then.
    assert_eq!(l.settled_at, Some(l.started_at + Duration::from_millis(50)));
    assert_eq!(l.expires_at, l.started_at + Duration::from_millis(50) + TTL);
    // The same row read by a TakeOver handle is absent: its next claim takes it over.
    assert!(take_over.record(&lapsed).await.unwrap().is_none());
    assert!(marking.record(&key("rec-never")).await.unwrap().is_none());

    let all: Vec<_> = marking.records(&RecordFilter::new(), None, 100).await.unwrap();
    let mine: Vec<_> = all
        .iter()
        .filter(|r| r.key.client_key().starts_with("rec-"))
        .map(|r| (r.key.client_key().to_owned(), r.state))
        .collect();
    assert_eq!(mine.len(), 4, "{mine:?}");
    let unknown =
        marking.records(&RecordFilter::new().state(RecordState::Unknown), None, 100).await.unwrap();
    assert!(unknown.iter().all(|r| r.state == RecordState::Unknown) && unknown.len() >= 2);
    // Paging: one at a time, after the last key seen, visits every record once.
    let (mut after, mut paged) = (None, 0);
    while let Some(next) =
        marking.records(&RecordFilter::new(), after.as_ref(), 1).await.unwrap().pop()
    {
        paged += 1;
        after = Some(next.key);
    }
    assert_eq!(paged, all.len());

    // Removal acts only on the states named.
    assert!(marking.remove_record(&done, &[RecordState::Unknown]).await.unwrap().is_none());
    assert!(
        marking.record(&done).await.unwrap().is_some(),
        "a COMPLETED record was removed as UNKNOWN"
    );
    let was = marking.remove_record(&lapsed, &[RecordState::Unknown]).await.unwrap().unwrap();
    assert!(was.lapsed);
    let was = marking.remove_record(&running, &[RecordState::Processing]).await.unwrap().unwrap();
    assert_eq!(was.state, RecordState::Processing);
    for k in [&lapsed, &running] {
        assert!(marking.record(k).await.unwrap().is_none());
        assert!(matches!(
            marking.claim(k, fp("r"), LEASE).await.unwrap(),
            StoreClaim::Acquired { .. }
        ));
    }
}
