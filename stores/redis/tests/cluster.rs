//! What is particular to a Redis Cluster: the UNKNOWN index's buckets spread over the
//! primaries, listed and purged bucket by bucket with no command touching two slots
//! (the cluster would refuse it: CROSSSLOT); nodes that forget the scripts are sent
//! them whole; no nodes, or a URL that is not Redis's, is refused. Skipped without
//! `IDEMCACHE_REDIS_CLUSTER_URLS` (CI starts three primaries with a replica each).

use idemcache::store::conformance::{acquire, key, TTL};
use idemcache::store::{Store, StoreError};
use idemcache::{Bytes, Key};
use idemcache_redis::{redis, RedisStore};

mod common;
use common::{bucket, cluster_store, hex, record_key, redis_cluster_urls};

/// The slots of `keys` on the cluster (`CLUSTER KEYSLOT`, asked of any node).
async fn slots(keys: impl Iterator<Item = String>) -> std::collections::BTreeSet<i64> {
    let urls = redis_cluster_urls().unwrap();
    let client = redis::Client::open(urls[0].as_str()).unwrap();
    let mut admin = client.get_multiplexed_async_connection().await.unwrap();
    let mut out = std::collections::BTreeSet::new();
    for k in keys {
        let slot: i64 =
            redis::cmd("CLUSTER").arg("KEYSLOT").arg(k).query_async(&mut admin).await.unwrap();
        out.insert(slot);
    }
    out
}

/// 200 keys marked UNKNOWN (their records on every primary, their index members in
/// all sixteen buckets) are all listed, in mark order; forgetting half leaves stale
/// members that purging trims bucket by bucket; the rest stay listed. No step
/// touches two slots in one command (the cluster would refuse it: CROSSSLOT).
#[tokio::test]
#[ignore = "needs IDEMCACHE_REDIS_CLUSTER_URLS"]
async fn listing_and_purging_work_bucket_by_bucket_across_the_cluster() {
    let Some(store) = cluster_store().await else { return };
    let keys: Vec<Key> = (0..200).map(|i| key(&format!("spread-{i:03}"))).collect();
    assert!(slots(keys.iter().map(record_key)).await.len() > 150, "records spread over slots");
    for k in &keys {
        let token = acquire(&store, k).await;
        store.mark_unknown(k, token, TTL).await.unwrap();
    }
    let ours = |listed: &[idemcache::UnknownEntry<std::time::SystemTime>]| {
        listed.iter().filter(|u| keys.contains(&u.key)).map(|u| u.key.clone()).collect::<Vec<_>>()
    };
    let listed = store.list_unknown(usize::MAX).await.unwrap();
    assert_eq!(ours(&listed).len(), 200);
    assert!(listed.windows(2).all(|w| w[0].marked_at <= w[1].marked_at), "in mark order");
    for k in keys.iter().step_by(2) {
        store.forget(k).await.unwrap();
    }
    // Purged until a sweep of every bucket trims nothing (other tests on the
    // cluster may purge some of these first).
    while store.purge_expired(64).await.unwrap() > 0 || store.purge_expired(64).await.unwrap() > 0 {
    }
    let client = redis::cluster::ClusterClient::new(redis_cluster_urls().unwrap()).unwrap();
    let mut admin = client.get_async_connection().await.unwrap();
    let mut members = Vec::new();
    for n in 0..idemcache_redis::INDEX_BUCKETS {
        let some: Vec<String> = redis::cmd("ZRANGE")
            .arg(bucket(n))
            .arg(0)
            .arg(-1)
            .query_async(&mut admin)
            .await
            .unwrap();
        members.extend(some);
    }
    for (i, k) in keys.iter().enumerate() {
        let found = members.iter().filter(|m| m.starts_with(&format!("{}:", hex(k)))).count();
        assert_eq!(found, i % 2, "{k:?}: forgotten ones trimmed, the others kept");
    }
    let left = ours(&store.list_unknown(usize::MAX).await.unwrap());
    assert_eq!(left, keys.iter().skip(1).step_by(2).cloned().collect::<Vec<_>>());
    for k in keys.iter().skip(1).step_by(2) {
        store.forget(k).await.unwrap();
    }
}

/// Every node forgets the scripts (`SCRIPT FLUSH` on each, as a restarted node or a
/// replica that never saw `SCRIPT LOAD` would): each operation is sent the script
/// whole and goes on, on every primary.
#[tokio::test]
#[ignore = "needs IDEMCACHE_REDIS_CLUSTER_URLS"]
async fn nodes_without_the_scripts_are_sent_them_whole() {
    let Some(store) = cluster_store().await else { return };
    let urls = redis_cluster_urls().unwrap();
    let client = redis::cluster::ClusterClient::new(urls).unwrap();
    let mut admin = client.get_async_connection().await.unwrap();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut admin).await.unwrap();
    for i in 0..12 {
        let k = key(&format!("flushed-{i}"));
        let token = acquire(&store, &k).await;
        store.complete(&k, token, Some(Bytes::from_static(b"done")), TTL).await.unwrap();
        let token = acquire(&store, &key(&format!("flushed-mark-{i}"))).await;
        store.mark_unknown(&key(&format!("flushed-mark-{i}")), token, TTL).await.unwrap();
    }
    let listed = store.list_unknown(usize::MAX).await.unwrap();
    assert_eq!(
        listed.iter().filter(|u| u.key.client_key().starts_with("flushed-mark-")).count(),
        12
    );
    for i in 0..12 {
        store.forget(&key(&format!("flushed-mark-{i}"))).await.unwrap();
    }
}

#[tokio::test]
async fn no_nodes_or_a_bad_url_is_invalid_input() {
    let none: [&str; 0] = [];
    assert!(matches!(RedisStore::connect_cluster(&none).await, Err(StoreError::InvalidInput(_))));
    assert!(matches!(
        RedisStore::connect_cluster(&["mysql://127.0.0.1:7000"]).await,
        Err(StoreError::InvalidInput(_))
    ));
}
