//! `PgStore` as the layer's one-commit store (`TransactionalStore`): the claim's bound on
//! its wait for another transaction's row ends with the claim, so the handler's
//! statements wait as the session says, whether the session set its own
//! `lock_timeout` or not. Skipped, saying why, without `IDEMCACHE_POSTGRES_URL`.

use std::time::Duration;

use idemcache::store::conformance::service_url;
use idemcache::store::{Store, StoreClaim, TransactionalStore};
use idemcache::{Fingerprint, Key};
use idemcache_sqlx::PgStore;
use sqlx::postgres::PgPoolOptions;

fn key(name: &str) -> Key {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    Key::without_tenant("POST /bound", format!("{name}-{}", nanos.as_nanos()).as_str()).unwrap()
}

async fn lock_timeout_after_claim(session: Option<&'static str>) -> Option<(String, String)> {
    let url = service_url("IDEMCACHE_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")?;
    let mut options = PgPoolOptions::new().max_connections(2);
    if let Some(sql) = session {
        options = options.after_connect(move |conn, _| {
            Box::pin(async move { sqlx::raw_sql(sql).execute(conn).await.map(drop) })
        });
    }
    let pool = options.connect(&url).await.unwrap();
    let store = PgStore::from_pool(pool.clone());
    store.ensure_schema().await.unwrap();
    let before: String = sqlx::query_scalar("SHOW lock_timeout").fetch_one(&pool).await.unwrap();
    let mut tx = TransactionalStore::begin(&store).await.unwrap();
    let (fp, lease) = (Fingerprint::of(b"x"), Duration::from_secs(30));
    let claimed = TransactionalStore::claim_in(
        &store,
        &mut tx,
        &key("bound"),
        fp,
        lease,
        Duration::from_millis(5),
        None,
    )
    .await
    .unwrap();
    assert!(matches!(claimed, StoreClaim::Acquired { .. }));
    let after: String = sqlx::query_scalar("SHOW lock_timeout").fetch_one(&mut *tx).await.unwrap();
    TransactionalStore::rollback(&store, tx).await.unwrap();
    Some((before, after))
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn the_claims_bound_ends_with_the_claim() {
    let Some((before, after)) = lock_timeout_after_claim(None).await else { return };
    assert_eq!(after, before);
}

/// A session-level lock_timeout (set by the pool's after_connect hook) is what the
/// handler's statements should wait by after the claim.
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_sessions_own_lock_timeout_survives_the_claim() {
    let session = Some("SET lock_timeout = '3s'");
    let Some((before, after)) = lock_timeout_after_claim(session).await else { return };
    assert_eq!(after, before, "the session's lock_timeout was lost for the handler");
}
