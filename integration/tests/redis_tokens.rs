//! Redis's UNKNOWN index names each mark by `<key hex>:<token>`, and a listing carries
//! that token into the verdict: members whose token is not a number, or too large for
//! one, are stale (trimmed by purging, never listed, never a stuck listing); a verdict
//! under any token but the record's settles nothing. Skipped without
//! `IDEMCACHE_REDIS_STORE_URL`.

use idemcache::store::conformance::{self, acquire, key, TTL};
use idemcache::store::{Store, StoreError};
use idemcache::{FencingToken, Key, UnknownEntry};
use idemcache_redis::{redis, RedisStore};

fn redis_url() -> Option<String> {
    conformance::service_url("IDEMCACHE_REDIS_STORE_URL", "redis://127.0.0.1:6379/14")
}

fn hex(k: &Key) -> String {
    k.as_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

/// The index bucket of `k` (FNV-1a of the stored key, modulo the bucket count).
fn bucket_of(k: &Key) -> String {
    let hash = k
        .as_bytes()
        .iter()
        .fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193));
    format!("idemcache:unknown:{{{}}}", hash as usize % idemcache_redis::INDEX_BUCKETS)
}

#[tokio::test]
async fn members_with_garbled_tokens_are_trimmed_and_only_the_records_token_settles() {
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
            .arg(bucket_of(&k))
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
            .arg(bucket_of(&k))
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
        assert!(matches!(refused, Err(StoreError::NotUnknown(_))), "{other}: {refused:?}");
    }
    store.forget_listed(ours[0]).await.unwrap();
}
