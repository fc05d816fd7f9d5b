//! Adversarial checks of `MySqlStore` against a real MySQL or MariaDB
//! (`IDEMCACHE_MYSQL_URL`; skipped with a printed reason when unset).
//!
//! The server's clock is the store's clock; these tests pin it per session with
//! `SET timestamp` (which `UTC_TIMESTAMP(6)` follows), set on every acquire from the
//! pool, so time moves (forwards and backwards) only when the test says so: a manual
//! clock, no sleeps.

use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idemcache::store::conformance::{fp, key, service_url, LEASE, TTL};
use idemcache::store::{Store, StoreClaim, StoreError};
use idemcache::{Bytes, LapsePolicy};
use idemcache_sqlx::MySqlStore;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, MySqlPool};

const EXAMPLE: &str = "mysql://root@127.0.0.1:3306/test";

/// The manual clock, µs since the epoch (whole seconds plus a fraction).
#[derive(Clone)]
struct Clock(Arc<AtomicI64>);

impl Clock {
    fn set(&self, us: i64) {
        self.0.store(us, Ordering::SeqCst);
    }
    fn add(&self, d: Duration) {
        self.0.fetch_add(d.as_micros() as i64, Ordering::SeqCst);
    }
    fn get(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

struct Db {
    admin: MySqlPool,
    name: String,
    options: MySqlConnectOptions,
}

impl Db {
    async fn new(test: &str) -> Option<Db> {
        static N: AtomicU32 = AtomicU32::new(0);
        let url = service_url("IDEMCACHE_MYSQL_URL", EXAMPLE)?;
        let n = N.fetch_add(1, Ordering::Relaxed);
        let name = format!("idemcache_adv_{test}_{}_{n}", std::process::id());
        let admin = MySqlPoolOptions::new().max_connections(1).connect(&url).await.unwrap();
        let create = format!("DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name}");
        sqlx::raw_sql(AssertSqlSafe(create)).execute(&admin).await.unwrap();
        let options: MySqlConnectOptions = url.parse().unwrap();
        let options = options.database(&name);
        Some(Db { admin, name, options })
    }

    /// A store whose sessions read `clock` as the server's now.
    async fn clocked(&self, clock: &Clock) -> MySqlStore {
        let (first, every) = (clock.clone(), clock.clone());
        // A new connection is not "acquired" (sqlx runs `before_acquire` on idle ones
        // only): pin it when it connects too.
        let pool = MySqlPoolOptions::new()
            .max_connections(4)
            .after_connect(move |conn, _| {
                let set = pin(first.get());
                Box::pin(async move {
                    sqlx::raw_sql(AssertSqlSafe(set)).execute(&mut *conn).await?;
                    Ok(())
                })
            })
            .before_acquire(move |conn, _| {
                let set = pin(every.get());
                Box::pin(async move {
                    sqlx::raw_sql(AssertSqlSafe(set)).execute(&mut *conn).await?;
                    Ok(true)
                })
            })
            .connect_lazy_with(self.options.clone());
        let store = MySqlStore::from_pool(pool);
        store.ensure_schema().await.unwrap();
        store
    }

    /// A store on the server's real clock.
    async fn real(&self) -> MySqlStore {
        let store = MySqlStore::from_pool(
            MySqlPoolOptions::new().max_connections(4).connect_lazy_with(self.options.clone()),
        );
        store.ensure_schema().await.unwrap();
        store
    }

    async fn execute(&self, sql: String) {
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(&self.admin).await.unwrap();
    }

    async fn drop(self) {
        self.execute(format!("DROP DATABASE {}", self.name)).await;
    }
}

/// The statement that pins a session's now at `us`.
fn pin(us: i64) -> String {
    format!("SET timestamp = {}.{:06}", us / 1_000_000, us % 1_000_000)
}

/// A start time on a whole second (2030-01-01T00:00:00Z).
const T0: i64 = 1_893_456_000_000_000;
const S: Duration = Duration::from_secs(1);

fn acquired(claim: StoreClaim) -> idemcache::FencingToken {
    match claim {
        StoreClaim::Acquired { token, .. } => token,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// Sanity of the manual clock: the lease the store reports is the pinned now + lease.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn the_manual_clock_is_the_stores_clock() {
    let Some(db) = Db::new("clock").await else { return };
    let clock = Clock(Arc::new(AtomicI64::new(T0)));
    let store = db.clocked(&clock).await;
    match store.claim(&key("clock"), fp("r"), LEASE).await.unwrap() {
        StoreClaim::Acquired { lease_ends_at, .. } => {
            assert_eq!(lease_ends_at, idemcache::store::encoding::from_micros(T0) + LEASE)
        }
        other => panic!("{other:?}"),
    }
    db.drop().await;
}

/// A renewal at the very microsecond the claim was taken, to the same lease, changes no
/// column (the lease already ends there): it applied all the same (rows matched, not
/// changed, as the store's docs require of the connection).
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_renewal_that_changes_nothing_still_applies() {
    let Some(db) = Db::new("renew").await else { return };
    let clock = Clock(Arc::new(AtomicI64::new(T0)));
    let store = db.clocked(&clock).await;
    let k = key("renew-same");
    let token = acquired(store.claim(&k, fp("r"), LEASE).await.unwrap());
    let renewed = store.extend_lease(&k, token, LEASE).await;
    assert!(renewed.is_ok(), "{renewed:?}");
    db.drop().await;
}

/// Time going backwards after a takeover: the old holder's writes stay refused (fenced
/// by its token), and the new holder's apply.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_clock_stepped_back_after_a_takeover_does_not_revive_the_old_token() {
    let Some(db) = Db::new("back").await else { return };
    let clock = Clock(Arc::new(AtomicI64::new(T0)));
    let store = db.clocked(&clock).await;
    let k = key("back");
    let old = acquired(store.claim(&k, fp("r"), LEASE).await.unwrap());
    clock.add(LEASE + S);
    let new = acquired(store.claim(&k, fp("r"), LEASE).await.unwrap());
    assert!(new > old);
    clock.set(T0);
    for refused in [
        store.complete(&k, old, None, TTL).await.map(drop),
        store.extend_lease(&k, old, LEASE).await.map(drop),
        store.mark_unknown(&k, old, TTL).await,
        store.release(&k, old).await,
    ] {
        assert!(matches!(refused, Err(StoreError::LeaseLost(_))), "{refused:?}");
    }
    store.complete(&k, new, Some(Bytes::from_static(b"new")), TTL).await.unwrap();
    db.drop().await;
}

/// Under MarkUnknown, claim, listing and purge agree about a lapse at every instant
/// around its two boundaries (the lease's end, and the lease's end + ttl), turned by a
/// claim or not.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn claim_listing_and_purge_agree_on_a_lapse_at_its_boundaries() {
    let Some(db) = Db::new("bounds").await else { return };
    let clock = Clock(Arc::new(AtomicI64::new(T0)));
    let ttl = Duration::from_secs(600);
    let store =
        db.clocked(&clock).await.with_lapse_policy(LapsePolicy::MarkUnknown { ttl }).unwrap();
    for turned in [false, true] {
        clock.set(T0);
        let k = key(&format!("bounds-{turned}"));
        let token = acquired(store.claim(&k, fp("r"), LEASE).await.unwrap());
        let end = T0 + LEASE.as_micros() as i64;
        // One µs before the lease's end: live.
        clock.set(end - 1);
        assert!(matches!(
            store.claim(&k, fp("r"), LEASE).await.unwrap(),
            StoreClaim::InProgress { .. }
        ));
        assert!(store.list_unknown(usize::MAX).await.unwrap().is_empty());
        // At the lease's end: lapsed, UNKNOWN.
        clock.set(end);
        let listed = store.list_unknown(usize::MAX).await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].token, token);
        if turned {
            assert!(matches!(
                store.claim(&k, fp("r"), LEASE).await.unwrap(),
                StoreClaim::Unknown { .. }
            ));
            assert_eq!(store.list_unknown(usize::MAX).await.unwrap(), listed);
        }
        assert_eq!(store.purge_expired(usize::MAX).await.unwrap(), 0);
        let refused = store.complete(&k, token, None, TTL).await;
        assert!(matches!(refused, Err(StoreError::LeaseLost(_))), "{refused:?}");
        // One µs before the lapse's UNKNOWN ends: still UNKNOWN everywhere.
        clock.set(end + ttl.as_micros() as i64 - 1);
        assert_eq!(store.list_unknown(usize::MAX).await.unwrap(), listed);
        assert_eq!(store.purge_expired(0).await.unwrap(), 0);
        assert_eq!(store.purge_expired(usize::MAX).await.unwrap(), 0);
        assert!(matches!(
            store.claim(&k, fp("r"), LEASE).await.unwrap(),
            StoreClaim::Unknown { .. }
        ));
        // At its end: gone for the listing and the purge, and claimable.
        clock.set(end + ttl.as_micros() as i64);
        assert!(store.list_unknown(usize::MAX).await.unwrap().is_empty());
        assert_eq!(store.purge_expired(usize::MAX).await.unwrap(), 1);
        acquired(store.claim(&k, fp("r"), LEASE).await.unwrap());
    }
    db.drop().await;
}

/// A listing of limit 0 lists nothing; a purge of limit 0 deletes nothing.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn limits_of_zero_and_usize_max() {
    let Some(db) = Db::new("limits").await else { return };
    let clock = Clock(Arc::new(AtomicI64::new(T0)));
    let store = db.clocked(&clock).await;
    let k = key("limits");
    let token = acquired(store.claim(&k, fp("r"), LEASE).await.unwrap());
    store.mark_unknown(&k, token, S).await.unwrap();
    assert!(store.list_unknown(0).await.unwrap().is_empty());
    assert_eq!(store.list_unknown(usize::MAX).await.unwrap().len(), 1);
    clock.add(2 * S);
    assert_eq!(store.purge_expired(0).await.unwrap(), 0);
    assert_eq!(store.purge_expired(usize::MAX).await.unwrap(), 1);
    db.drop().await;
}

/// A body over the server's packet limit is a typed error, and the store (its pool)
/// goes on working afterwards: the same claim completes with a small body.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_body_over_the_packet_limit_is_a_typed_error_and_the_store_goes_on() {
    let Some(db) = Db::new("huge").await else { return };
    let store = db.real().await;
    let k = key("huge");
    let token = acquired(store.claim(&k, fp("r"), LEASE).await.unwrap());
    let huge = Bytes::from(vec![7u8; 17 * 1024 * 1024]);
    let refused = store.complete(&k, token, Some(huge), TTL).await;
    assert!(matches!(refused, Err(StoreError::Backend(_))), "{refused:?}");
    for _ in 0..8 {
        let other = key("huge-other");
        let _ = store.claim(&other, fp("r"), LEASE).await.unwrap();
    }
    store.complete(&k, token, Some(Bytes::from_static(b"small")), TTL).await.unwrap();
    db.drop().await;
}

/// A record whose times are far out (written by hand, or by another program) is
/// refused as Corrupt or answered, never a panic, under MarkUnknown (whose statements
/// add the ttl to `expires_at`).
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn far_out_times_are_not_a_panic() {
    let Some(db) = Db::new("far").await else { return };
    let store = db
        .real()
        .await
        .with_lapse_policy(LapsePolicy::MarkUnknown { ttl: idemcache::MAX_DURATION })
        .unwrap();
    let table = format!("{}.idemcache_records", db.name);
    let k = key("far");
    let token = acquired(store.claim(&k, fp("r"), LEASE).await.unwrap());
    for expires in [i64::MAX, i64::MIN, -1] {
        db.execute(format!("UPDATE {table} SET expires_at = {expires}, started_at = {expires}"))
            .await;
        let claim = store.claim(&k, fp("r"), LEASE).await;
        let listed = store.list_unknown(10).await;
        let purged = store.purge_expired(10).await;
        let done = store.complete(&k, token, None, TTL).await;
        println!("{expires}: {claim:?} {listed:?} {purged:?} {done:?}");
        if purged.as_ref().is_ok_and(|n| *n > 0) {
            let _ = store.claim(&k, fp("r"), LEASE).await.unwrap();
        }
    }
    db.drop().await;
}

/// An application whose sessions default to SERIALIZABLE hands its pool to the store:
/// 16 claims racing on one key (absent, then dead) and the holder's completion racing 8
/// claims still answer, exactly one Acquired, nothing failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn claims_and_completions_racing_over_a_serializable_pool() {
    let Some(db) = Db::new("ser").await else { return };
    let serial = || {
        let pool = MySqlPoolOptions::new()
            .max_connections(8)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::raw_sql("SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                        .execute(&mut *conn)
                        .await?;
                    Ok(())
                })
            })
            .connect_lazy_with(db.options.clone());
        MySqlStore::from_pool(pool)
    };
    let (one, two) = (serial(), serial());
    one.ensure_schema().await.unwrap();
    let table = format!("{}.idemcache_records", db.name);
    for round in 0..4 {
        let k = key(&format!("ser-{round}"));
        if round % 2 == 1 {
            acquired(one.claim(&k, fp("r"), LEASE).await.unwrap());
            let back = 60_000_000 + LEASE.as_micros();
            db.execute(format!("UPDATE {table} SET expires_at = expires_at - {back}")).await;
        }
        let claims: Vec<_> = (0..16)
            .map(|i| {
                let store = if i % 2 == 0 { one.clone() } else { two.clone() };
                let k = k.clone();
                tokio::spawn(async move { store.claim(&k, fp("r"), LEASE).await })
            })
            .collect();
        let (mut won, mut failed) = (Vec::new(), Vec::new());
        for claim in claims {
            match claim.await.unwrap() {
                Ok(StoreClaim::Acquired { token, .. }) => won.push(token),
                Ok(StoreClaim::InProgress { .. }) => {}
                Ok(other) => panic!("{other:?}"),
                Err(e) => failed.push(e.to_string()),
            }
        }
        assert!(failed.is_empty(), "round {round}: claims failed: {failed:#?}");
        assert_eq!(won.len(), 1, "round {round}: exactly one claim acquired");
        let done = {
            let (store, k, token) = (one.clone(), k.clone(), won[0]);
            tokio::spawn(async move { store.complete(&k, token, None, TTL).await })
        };
        let claims: Vec<_> = (0..8)
            .map(|_| {
                let (store, k) = (two.clone(), k.clone());
                tokio::spawn(async move { store.claim(&k, fp("r"), LEASE).await })
            })
            .collect();
        let done = done.await.unwrap();
        assert!(done.is_ok(), "round {round}: {done:?}");
        for claim in claims {
            let claim = claim.await.unwrap();
            assert!(claim.is_ok(), "round {round}: {claim:?}");
        }
    }
    db.drop().await;
}

/// An application whose sessions run with `autocommit = 0` (an `init_command` some
/// shops set) hands its pool to the store: a completion the store answered Ok must be
/// durable, seen by another process's store, not left open on a pooled connection.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_completion_over_an_autocommit_off_pool_is_durable() {
    let Some(db) = Db::new("autocommit").await else { return };
    let pool = MySqlPoolOptions::new()
        .max_connections(1)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::raw_sql("SET SESSION autocommit = 0").execute(&mut *conn).await?;
                Ok(())
            })
        })
        .connect_lazy_with(db.options.clone());
    let theirs = MySqlStore::from_pool(pool);
    let ours = impatient(&db).await;
    let k = key("autocommit");
    let token = acquired(ours.claim(&k, fp("r"), LEASE).await.unwrap());
    theirs.complete(&k, token, Some(Bytes::from_static(b"paid")), TTL).await.unwrap();
    match ours.claim(&k, fp("r"), LEASE).await {
        Ok(StoreClaim::Completed(replay)) => assert_eq!(replay.body.unwrap(), "paid"),
        other => panic!("the completion answered Ok is not committed: {other:?}"),
    }
    db.drop().await;
}

/// The same pool claiming: its claim must be answered, and must not leave the token
/// counter's row locked for every other store's claim; its reads (`record`, `records`)
/// must leave no transaction open on the session either, or its next claim fails
/// (`SET TRANSACTION` inside one, error 1568), as it did before they ran in
/// transactions of their own.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_claim_over_an_autocommit_off_pool_answers_and_blocks_no_one() {
    let Some(db) = Db::new("autocommit_claim").await else { return };
    let pool = MySqlPoolOptions::new()
        .max_connections(1)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::raw_sql("SET SESSION autocommit = 0").execute(&mut *conn).await?;
                Ok(())
            })
        })
        .connect_lazy_with(db.options.clone());
    let theirs = MySqlStore::from_pool(pool);
    let ours = impatient(&db).await;
    let claimed = theirs.claim(&key("autocommit-theirs"), fp("r"), LEASE).await;
    let other = ours.claim(&key("autocommit-ours"), fp("r"), LEASE).await;
    assert!(matches!(claimed, Ok(StoreClaim::Acquired { .. })), "{claimed:?}");
    assert!(matches!(other, Ok(StoreClaim::Acquired { .. })), "{other:?}");
    assert!(theirs.record(&key("autocommit-theirs")).await.unwrap().is_some());
    let next = theirs.claim(&key("autocommit-after-read"), fp("r"), LEASE).await;
    assert!(matches!(next, Ok(StoreClaim::Acquired { .. })), "after record: {next:?}");
    let listed = theirs.records(&idemcache::store::RecordFilter::default(), None, 10).await;
    assert!(!listed.unwrap().is_empty());
    let last = theirs.claim(&key("autocommit-after-list"), fp("r"), LEASE).await;
    assert!(matches!(last, Ok(StoreClaim::Acquired { .. })), "after records: {last:?}");
    drop(theirs);
    db.drop().await;
}

/// A store on the server's clock that waits 2 s for a row lock (not InnoDB's 50 s
/// default) before it says so.
async fn impatient(db: &Db) -> MySqlStore {
    let pool = MySqlPoolOptions::new()
        .max_connections(2)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::raw_sql("SET SESSION innodb_lock_wait_timeout = 2")
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            })
        })
        .connect_lazy_with(db.options.clone());
    let store = MySqlStore::from_pool(pool);
    store.ensure_schema().await.unwrap();
    store
}

/// A lapse under MarkUnknown met at once by 16 claims from two pools and 4 purges: no
/// claim acquires it (every one answers Unknown), the purges keep it, and the listing
/// shows it once, under its holder's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_lapse_met_by_racing_claims_and_purges_is_never_re_run() {
    lapse_race("lapse_race", 8).await;
}

/// The same without the purges: the claims alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_lapse_met_by_racing_claims_is_never_re_run() {
    lapse_race("lapse_race_alone", 0).await;
}

async fn lapse_race(name: &str, purgers: usize) {
    let Some(db) = Db::new(name).await else { return };
    let clock = Clock(Arc::new(AtomicI64::new(T0)));
    let policy = LapsePolicy::MarkUnknown { ttl: Duration::from_secs(600) };
    let one = db.clocked(&clock).await.with_lapse_policy(policy).unwrap();
    let two = db.clocked(&clock).await.with_lapse_policy(policy).unwrap();
    for round in 0..100 {
        clock.set(T0);
        let k = key(&format!("lapse-race-{round}"));
        let token = acquired(one.claim(&k, fp("r"), LEASE).await.unwrap());
        clock.set(T0 + LEASE.as_micros() as i64 + round);
        let claims: Vec<_> = (0..16)
            .map(|i| {
                let store = if i % 2 == 0 { one.clone() } else { two.clone() };
                let k = k.clone();
                tokio::spawn(async move { store.claim(&k, fp("r"), LEASE).await })
            })
            .collect();
        let purges: Vec<_> = (0..purgers)
            .map(|i| {
                let store = if i % 2 == 0 { one.clone() } else { two.clone() };
                tokio::spawn(async move { store.purge_expired(usize::MAX).await })
            })
            .collect();
        for claim in claims {
            let claim = claim.await.unwrap();
            assert!(matches!(claim, Ok(StoreClaim::Unknown { .. })), "round {round}: {claim:?}");
        }
        for purge in purges {
            // A purge may lose a deadlock to a claim: its loop retries next round.
            let _ = purge.await.unwrap();
        }
        let listed: Vec<_> = one
            .list_unknown(usize::MAX)
            .await
            .unwrap()
            .into_iter()
            .filter(|u| u.key == k)
            .collect();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].token, token);
    }
    db.drop().await;
}

/// An operator resolving a listed lapse while purges run: the resolve applies (or, had
/// someone else settled it, is NothingToSettle), never a deadlock surfaced as Backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn resolving_a_listed_lapse_while_purges_run() {
    let Some(db) = Db::new("resolve_race").await else { return };
    let clock = Clock(Arc::new(AtomicI64::new(T0)));
    let policy = LapsePolicy::MarkUnknown { ttl: Duration::from_secs(600) };
    let one = db.clocked(&clock).await.with_lapse_policy(policy).unwrap();
    let two = db.clocked(&clock).await.with_lapse_policy(policy).unwrap();
    for round in 0..100 {
        clock.set(T0);
        let k = key(&format!("resolve-race-{round}"));
        acquired(one.claim(&k, fp("r"), LEASE).await.unwrap());
        clock.set(T0 + LEASE.as_micros() as i64 + round);
        let listed = one.list_unknown(usize::MAX).await.unwrap();
        let entry = listed.into_iter().find(|u| u.key == k).unwrap();
        let purges: Vec<_> = (0..8)
            .map(|_| {
                let store = two.clone();
                tokio::spawn(async move { store.purge_expired(usize::MAX).await })
            })
            .collect();
        let resolved = one.resolve_listed(&entry, Some(Bytes::from_static(b"done")), TTL).await;
        assert!(resolved.is_ok(), "round {round}: {resolved:?}");
        for purge in purges {
            let _ = purge.await.unwrap();
        }
    }
    db.drop().await;
}
