//! The index of UNKNOWN records on one Redis server: each mark is named by its token
//! (a key marked again is listed once, under its new mark; a member whose token is not
//! a number, or too large for one, is stale, and a verdict under any token but the
//! record's settles nothing), a listing is not cut at a window, purging trims stale
//! members wherever they stand, in bounded calls, counting each once, and the index is
//! scored by the server's clock. Skipped without `IDEMCACHE_REDIS_STORE_URL`.

use std::time::Duration;

use idemcache::store::conformance::{acquire, fp, key, SHORT_LEASE, TTL};
use idemcache::store::{Store, StoreError};
use idemcache::{FencingToken, LapsePolicy, UnknownEntry};
use idemcache_redis::{redis, RedisStore};

mod common;
use common::{
    apart_url, bucket, bucket_of, hex, record_key, redis_url, store, store_apart, SERIAL,
};

/// The UNKNOWN index names each mark by its token: a key forgotten and marked again
/// is listed once, under its new mark, and trimming stale members never drops it.
#[tokio::test]
#[ignore = "needs IDEMCACHE_REDIS_STORE_URL"]
async fn a_key_marked_unknown_again_is_listed_once_and_survives_trimming() {
    let _serial = SERIAL.lock().await;
    let Some(store) = store().await else { return };
    let k = key("remarked");
    let first = acquire(&store, &k).await;
    store.mark_unknown(&k, first, TTL).await.unwrap();
    store.forget(&k).await.unwrap();
    let second = acquire(&store, &k).await;
    // A refused mark (a stale token) adds nothing listable.
    assert!(matches!(store.mark_unknown(&k, first, TTL).await, Err(StoreError::LeaseLost(_))));
    // Redis forgets its scripts (a restart, SCRIPT FLUSH): the pipelined mark loads again.
    let url = std::env::var("IDEMCACHE_REDIS_STORE_URL").unwrap();
    let mut admin =
        redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut admin).await.unwrap();
    store.mark_unknown(&k, second, TTL).await.unwrap();
    for _ in 0..2 {
        store.purge_expired(1000).await.unwrap();
        let listed = store.list_unknown(1000).await.unwrap();
        assert_eq!(listed.iter().filter(|u| u.key == k).count(), 1, "{listed:?}");
    }
    store.forget(&k).await.unwrap();
    assert!(!store.list_unknown(1000).await.unwrap().iter().any(|u| u.key == k));
}

/// How many members the UNKNOWN index holds, over its buckets.
async fn index_size(admin: &mut redis::aio::MultiplexedConnection) -> usize {
    let mut size = 0;
    for index in (0..idemcache_redis::INDEX_BUCKETS).map(bucket) {
        let n: usize = redis::cmd("ZCARD").arg(index).query_async(admin).await.unwrap();
        size += n;
    }
    size
}

/// A listing returns up to its limit, past any window's size: 1,200 marks are all
/// listed by `unknown(5000)`.
#[tokio::test]
#[ignore = "needs IDEMCACHE_REDIS_STORE_URL"]
async fn a_long_listing_is_not_cut_at_a_window() {
    let _serial = SERIAL.lock().await;
    let Some((store, _admin, _one_at_a_time)) = store_apart().await else { return };
    for i in 0..1200 {
        let k = key(&format!("many-{i:04}"));
        let token = acquire(&store, &k).await;
        store.mark_unknown(&k, token, TTL).await.unwrap();
    }
    assert_eq!(store.list_unknown(5000).await.unwrap().len(), 1200);
    assert_eq!(store.list_unknown(1100).await.unwrap().len(), 1100);
}

/// Two stores purging one index at once count what each removed: 200 stale members
/// are 200 in all, never 400.
#[tokio::test]
#[ignore = "needs IDEMCACHE_REDIS_STORE_URL"]
async fn concurrent_purges_count_each_member_once() {
    let _serial = SERIAL.lock().await;
    let Some((store, _admin, _one_at_a_time)) = store_apart().await else { return };
    let other = RedisStore::connect(&apart_url().unwrap()).await.unwrap();
    for round in 0..5 {
        for i in 0..200 {
            let k = key(&format!("stale-{round}-{i}"));
            let token = acquire(&store, &k).await;
            store.mark_unknown(&k, token, TTL).await.unwrap();
            store.forget(&k).await.unwrap();
        }
        let (a, b) = tokio::join!(store.purge_expired(1000), other.purge_expired(1000));
        assert_eq!(a.unwrap() + b.unwrap(), 200, "round {round}");
    }
}

/// A purge call's work is bounded, whatever the index holds: behind 40 live marks,
/// `purge_expired(1)` checks a few members and trims nothing, and later calls reach
/// the stale member where the last one stopped.
#[tokio::test]
#[ignore = "needs IDEMCACHE_REDIS_STORE_URL"]
async fn a_purge_call_checks_a_bounded_part_of_the_index() {
    let _serial = SERIAL.lock().await;
    let Some((store, _admin, _one_at_a_time)) = store_apart().await else { return };
    for i in 0..40 {
        let k = key(&format!("live-{i:02}"));
        let token = acquire(&store, &k).await;
        store.mark_unknown(&k, token, TTL).await.unwrap();
    }
    // The stale member in the last bucket purging reads, behind every live one.
    let last = (0..)
        .map(|i| key(&format!("resolved-last-{i}")))
        .find(|k| bucket_of(k) == idemcache_redis::INDEX_BUCKETS - 1)
        .unwrap();
    let token = acquire(&store, &last).await;
    store.mark_unknown(&last, token, TTL).await.unwrap();
    store.forget(&last).await.unwrap(); // its member is stale now
    assert_eq!(store.purge_expired(1).await.unwrap(), 0, "the whole index was walked");
    let mut calls = 1;
    while store.purge_expired(1).await.unwrap() == 0 {
        calls += 1;
        assert!(calls <= 11, "never reached the stale member");
    }
    assert_eq!(store.list_unknown(100).await.unwrap().len(), 40);
}

/// `purge_expired` trims the UNKNOWN index: a limit of 0 trims nothing; stale
/// members are trimmed wherever they stand, behind live ones too; and members of
/// records that expired are all gone once it has run (the RedisStore docs: run it
/// periodically).
#[tokio::test]
#[ignore = "needs IDEMCACHE_REDIS_STORE_URL"]
async fn purging_trims_the_unknown_index_and_a_limit_of_zero_does_nothing() {
    let _serial = SERIAL.lock().await;
    let Some((store, mut admin, _one_at_a_time)) = store_apart().await else { return };
    for i in 0..3 {
        let k = key(&format!("live-{i}"));
        let token = acquire(&store, &k).await;
        store.mark_unknown(&k, token, TTL).await.unwrap();
    }
    let short = Duration::from_millis(5);
    let mut marked = Vec::new();
    for i in 0..50 {
        let k = key(&format!("brief-{i}"));
        let token = acquire(&store, &k).await;
        store.mark_unknown(&k, token, short).await.unwrap();
        marked.push(k);
    }
    // Wait (bounded) until Redis has let every brief record go.
    for _ in 0..2000 {
        let left: usize = redis::cmd("EXISTS")
            .arg(marked.iter().map(record_key).collect::<Vec<_>>())
            .query_async(&mut admin)
            .await
            .unwrap();
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(index_size(&mut admin).await, 53);
    assert_eq!(store.purge_expired(0).await.unwrap(), 0);
    assert_eq!(index_size(&mut admin).await, 53, "a limit of 0 trimmed the index");
    // The three live marks stand first: a batch of two still finds two stale ones.
    assert_eq!(store.purge_expired(2).await.unwrap(), 2);
    let mut trimmed = 2;
    loop {
        let n = store.purge_expired(16).await.unwrap();
        trimmed += n;
        if n < 16 {
            break;
        }
    }
    assert_eq!(trimmed, 50);
    assert_eq!(index_size(&mut admin).await, 3);
    assert_eq!(store.list_unknown(10).await.unwrap().len(), 3);
}

/// The index is scored by Redis's clock, as the record's own mark time is: every
/// member's score lies within the server's time read just before and just after the
/// mark, and at or before the mark the record holds.
#[tokio::test]
#[ignore = "needs IDEMCACHE_REDIS_STORE_URL"]
async fn the_index_is_scored_by_the_servers_clock() {
    let _serial = SERIAL.lock().await;
    let Some((store, mut admin, _one_at_a_time)) = store_apart().await else { return };
    let server_now = |admin: &mut redis::aio::MultiplexedConnection| {
        let mut admin = admin.clone();
        async move {
            let (s, us): (i64, i64) = redis::cmd("TIME").query_async(&mut admin).await.unwrap();
            s * 1_000_000 + us
        }
    };
    let k = key("scored");
    let token = acquire(&store, &k).await;
    let before = server_now(&mut admin).await;
    store.mark_unknown(&k, token, TTL).await.unwrap();
    let after = server_now(&mut admin).await;
    let members: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(bucket(bucket_of(&k)))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut admin)
        .await
        .unwrap();
    let [(_, score)] = members[..] else { panic!("{members:?}") };
    let score = score as i64;
    let settled: i64 = redis::cmd("HGET")
        .arg(record_key(&k))
        .arg("settled")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!((before..=after).contains(&score), "{before} {score} {after}");
    assert!(score <= settled, "{score} {settled}");
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_REDIS_STORE_URL"]
async fn members_with_garbled_tokens_are_trimmed_and_only_the_records_token_settles() {
    let _serial = SERIAL.lock().await;
    let Some(url) = redis_url() else { return };
    let store = RedisStore::connect(&url).await.unwrap();
    let mut admin =
        redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
    let k = key(&format!("garbled-member-{}", std::process::id()));
    let token = acquire(&store, &k).await;
    store.mark_unknown(&k, token, TTL).await.unwrap();
    let garbage = [
        format!("{}:not-a-number", hex(&k)),
        format!("{}:{}", hex(&k), "9".repeat(25)),
        format!("{}:-{}", hex(&k), token.get()),
        format!("{}:", hex(&k)),
    ];
    for member in &garbage {
        let _: () = redis::cmd("ZADD")
            .arg(bucket(bucket_of(&k)))
            .arg(0)
            .arg(member)
            .query_async(&mut admin)
            .await
            .unwrap();
    }
    let listed = store.list_unknown(100_000).await.unwrap();
    let ours: Vec<_> = listed.iter().filter(|u| u.key == k).collect();
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert_eq!(ours[0].token, token);
    for member in &garbage {
        let left: Option<f64> = redis::cmd("ZSCORE")
            .arg(bucket(bucket_of(&k)))
            .arg(member)
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!(left.is_none(), "{member} is still in the index");
    }
    for other in [token.get() - 1, token.get() + 1, u64::MAX, 0] {
        let wrong = UnknownEntry::new(
            k.clone(),
            ours[0].fingerprint,
            FencingToken::new(other),
            ours[0].marked_at,
            ours[0].expires_at,
        );
        let refused = store.forget_listed(&wrong).await;
        assert!(matches!(refused, Err(StoreError::NothingToSettle(_))), "{other}: {refused:?}");
    }
    store.forget_listed(ours[0]).await.unwrap();
}

/// Many claims of one key racing its lapse: none acquires, and the lapse is listed
/// once (one index member, however many claims put it in).
#[tokio::test]
#[ignore = "needs IDEMCACHE_REDIS_STORE_URL"]
async fn concurrent_claims_of_a_lapse_all_answer_unknown_and_list_it_once() {
    let _serial = SERIAL.lock().await;
    let Some(store) = store().await else { return };
    let store = store.with_lapse_policy(LapsePolicy::MarkUnknown { ttl: TTL }).unwrap();
    let k = key("raced-lapse");
    let idemcache::store::StoreClaim::Acquired { lease_ends_at, .. } =
        store.claim(&k, fp("r"), SHORT_LEASE).await.unwrap()
    else {
        panic!("expected Acquired");
    };
    let mut unknown = 0;
    while unknown == 0 {
        let claims = (0..8).map(|_| {
            let (store, k) = (store.clone(), k.clone());
            tokio::spawn(async move { store.claim(&k, fp("r"), SHORT_LEASE).await.unwrap() })
        });
        for claim in claims {
            match claim.await.unwrap() {
                idemcache::store::StoreClaim::InProgress { .. } => {}
                idemcache::store::StoreClaim::Unknown { marked_at } => {
                    assert_eq!(marked_at, lease_ends_at);
                    unknown += 1;
                }
                other => panic!("a lapse was answered {other:?}"),
            }
        }
    }
    let listed = store.list_unknown(usize::MAX).await.unwrap();
    assert_eq!(listed.iter().filter(|u| u.key == k).count(), 1, "listed once");
    store.forget(&k).await.unwrap();
}
