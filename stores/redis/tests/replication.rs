//! Waiting for replicas (`RedisStore::wait_for_replicas`): on one server, which has no
//! replica, an acquiring claim is a typed error carrying `NotReplicated` and is
//! released, a completion says it did not replicate, and settings Redis would misread
//! are refused; on a Redis Cluster, whose primaries have a replica each, claims and
//! completions are acknowledged, and asking for more replicas than there are is the
//! typed error. Skipped without `IDEMCACHE_REDIS_STORE_URL` and
//! `IDEMCACHE_REDIS_CLUSTER_URLS` respectively.

use std::time::Duration;

use idemcache::store::conformance::{acquire, fp, key, LEASE, TTL};
use idemcache::store::{Store, StoreClaim, StoreError};
use idemcache::Bytes;
use idemcache_redis::NotReplicated;

mod common;
use common::{cluster_store, store, SERIAL};

/// `wait_for_replicas` on a server with no replica: `WAIT` counts none, so an
/// acquiring claim is a typed error carrying `NotReplicated` and its caller does
/// not execute; the claim is released (nothing ran under it), so the key is free
/// at once. Zero replicas turns waiting off; a zero timeout (Redis's "forever") and
/// one of the store's response timeout or more are refused.
#[tokio::test]
#[ignore = "needs IDEMCACHE_REDIS_STORE_URL"]
async fn waiting_for_replicas_that_are_not_there_is_a_typed_error() {
    let _serial = SERIAL.lock().await;
    let Some(store) = store().await else { return };
    let waiting = store.clone().wait_for_replicas(1, Duration::from_millis(20)).unwrap();
    let k = key("no-replica");
    match waiting.claim(&k, fp("r"), LEASE).await {
        Err(StoreError::Backend(e)) => {
            let e = e.downcast_ref::<NotReplicated>().expect("NotReplicated");
            assert_eq!((e.acknowledged, e.asked, e.write), (0, 1, "claim"));
        }
        other => panic!("expected NotReplicated, got {other:?}"),
    }
    assert!(matches!(store.claim(&k, fp("r"), LEASE).await.unwrap(), StoreClaim::Acquired { .. }));
    // A completion that did not replicate stands on the server, and says so.
    let k = key("no-replica-completed");
    let token = acquire(&store, &k).await;
    match waiting.complete(&k, token, None, TTL).await {
        Err(StoreError::Backend(e)) => {
            assert_eq!(e.downcast_ref::<NotReplicated>().unwrap().write, "completion");
        }
        other => panic!("expected NotReplicated, got {other:?}"),
    }
    assert!(matches!(store.claim(&k, fp("r"), LEASE).await.unwrap(), StoreClaim::Completed(_)));
    let off = waiting.clone().wait_for_replicas(0, Duration::ZERO).unwrap();
    acquire(&off, &key("no-replica-not-waiting")).await;
    for refused in [Duration::ZERO, Duration::from_secs(5), Duration::from_secs(3600)] {
        assert!(matches!(
            store.clone().wait_for_replicas(1, refused),
            Err(StoreError::InvalidInput(_))
        ));
    }
    assert!(store.clone().wait_for_replicas(1, Duration::from_millis(4999)).is_ok());
}

/// `wait_for_replicas(1, ..)`: each primary has its replica, so claims and
/// completions are acknowledged. Asking for two (there is one): the claim is a
/// typed error carrying `NotReplicated`, its caller does not execute, and the claim
/// is released (nothing ran under it): a second claim of the key acquires it.
#[tokio::test]
#[ignore = "needs IDEMCACHE_REDIS_CLUSTER_URLS"]
async fn waiting_for_replicas_answers_what_replicated() {
    let Some(store) = cluster_store().await else { return };
    let one = store.clone().wait_for_replicas(1, Duration::from_secs(2)).unwrap();
    let k = key("replicated");
    let token = acquire(&one, &k).await;
    one.complete(&k, token, Some(Bytes::from_static(b"kept")), TTL).await.unwrap();
    assert!(matches!(one.claim(&k, fp("r"), LEASE).await.unwrap(), StoreClaim::Completed(_)));
    let two = store.clone().wait_for_replicas(2, Duration::from_millis(50)).unwrap();
    let k = key("under-replicated");
    match two.claim(&k, fp("r"), LEASE).await {
        Err(StoreError::Backend(e)) => {
            let e = e.downcast_ref::<NotReplicated>().expect("NotReplicated");
            assert_eq!((e.acknowledged, e.asked, e.write), (1, 2, "claim"));
            assert_eq!(e.key, k);
        }
        other => panic!("expected NotReplicated, got {other:?}"),
    }
    assert!(matches!(store.claim(&k, fp("r"), LEASE).await.unwrap(), StoreClaim::Acquired { .. }));
}
