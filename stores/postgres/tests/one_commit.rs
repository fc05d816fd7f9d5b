//! One commit per first execution: `PostgresStore::claim_in`, the business write and
//! `complete_in` in the caller's one transaction. Against a real PostgreSQL
//! (`IDEMCACHE_POSTGRES_URL`; skipped with a printed reason when unset).
//!
//! What is checked here is this API's own (the claims every engine shares, a kill
//! included, are `idemcache_sql::one_commit::testing`'s, run from `one_commit_layer.rs`):
//! the claim, the order and the record commit together on your `tokio_postgres`
//! transaction; a concurrent duplicate waits on the record's row and replays what the
//! first committed, or acquires once it rolled back; your session's `lock_timeout` bounds that wait with `InProgress`;
//! a transaction of the store's pool runs the same.
//!
//! No test waits on a clock: a waiting duplicate is seen waiting in `pg_stat_activity`
//! (its backend waits on a lock) before the first transaction ends.

use std::time::Duration;

use idemcache::store::{OpenClaim, Store, StoreClaim};
use idemcache::{Fingerprint, Key};
use idemcache_postgres::complete_in;
use idemcache_postgres::tokio_postgres;

mod common;
use common::{connect, OrdersDb as Db};

const LEASE: Duration = Duration::from_secs(30);
const KEPT: Duration = Duration::from_secs(600);

/// The first execution as a handler writes it: the claim, the order, the record, in
/// `tx`; the claim's answer if it was not acquired.
async fn execute(
    db: &Db,
    tx: &tokio_postgres::Transaction<'_>,
    key: &Key,
    body: &[u8],
) -> Result<(), StoreClaim> {
    match db.store.claim_in(tx, key, Fingerprint::of(b"order"), LEASE).await.unwrap() {
        StoreClaim::Acquired { token, .. } => {
            let claim = OpenClaim::new(key.clone(), token, KEPT);
            let sql = format!("INSERT INTO {} VALUES ($1, 'book')", db.orders);
            tx.execute(&sql, &[&key.client_key()]).await.unwrap();
            complete_in(tx, &claim, Some(body)).await.unwrap();
            Ok(())
        }
        other => Err(other),
    }
}

fn replayed(answer: &StoreClaim) -> Option<&[u8]> {
    match answer {
        StoreClaim::Completed(replay) => replay.body.as_deref(),
        _ => None,
    }
}

/// Waits until the backend `pid` waits on a lock: the duplicate is queued on the first
/// transaction's row. Polls `pg_stat_activity`, one query after another.
async fn until_waiting_on_lock(url: &str, pid: i32) {
    let watcher = connect(url).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30); // against a hang
    while std::time::Instant::now() < deadline {
        let waiting: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
                &[&pid],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            return;
        }
    }
    panic!("the duplicate never waited on the first transaction's row");
}

/// A duplicate's claim of `key` in a transaction of its own, on a task; its backend's
/// pid, to watch it wait.
async fn duplicate(db: &Db, key: &Key) -> (i32, tokio::task::JoinHandle<StoreClaim>) {
    let mut client = connect(&db.url).await;
    let pid: i32 = client.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let (store, key) = (db.store.clone(), key.clone());
    let task = tokio::spawn(async move {
        let tx = client.transaction().await.unwrap();
        let answer = store.claim_in(&tx, &key, Fingerprint::of(b"order"), LEASE).await;
        tx.rollback().await.unwrap();
        answer.unwrap()
    });
    (pid, task)
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn the_claim_the_order_and_the_record_commit_together() {
    let Some(db) = Db::new("one_commit", "together").await else { return };
    let key = db.key();
    let mut client = connect(&db.url).await;
    let tx = client.transaction().await.unwrap();
    execute(&db, &tx, &key, b"201 order 1").await.unwrap();
    // Before the commit, nobody else sees a record: the store's own read finds none.
    assert!(db.store.record(&key).await.unwrap().is_none());
    tx.commit().await.unwrap();
    let again = db.store.claim(&key, Fingerprint::of(b"order"), LEASE).await.unwrap();
    assert_eq!(replayed(&again), Some(&b"201 order 1"[..]));
    assert_eq!(db.orders_of(&key).await, 1);
    // A retry in one-commit mode replays too, and writes nothing.
    let tx = client.transaction().await.unwrap();
    let answer = execute(&db, &tx, &key, b"never").await.unwrap_err();
    assert_eq!(replayed(&answer), Some(&b"201 order 1"[..]));
    tx.rollback().await.unwrap();
    assert_eq!(db.orders_of(&key).await, 1);
    db.drop_table().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_duplicate_waits_on_the_row_and_replays_what_committed() {
    let Some(db) = Db::new("one_commit", "waits").await else { return };
    let key = db.key();
    let mut first = connect(&db.url).await;
    let tx = first.transaction().await.unwrap();
    execute(&db, &tx, &key, b"201 first").await.unwrap();

    let (pid, duplicate) = duplicate(&db, &key).await;
    until_waiting_on_lock(&db.url, pid).await;
    assert!(!duplicate.is_finished(), "the duplicate answers only once the first ends");
    tx.commit().await.unwrap();
    let answer = duplicate.await.unwrap();
    assert_eq!(replayed(&answer), Some(&b"201 first"[..]));
    assert_eq!(db.orders_of(&key).await, 1);
    db.drop_table().await;
}

/// Through this API (which takes no turn lock first, unlike the layer's mode): a
/// duplicate waiting on the record's own row acquires once the first rolls back.
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_duplicate_of_a_rolled_back_first_acquires() {
    let Some(db) = Db::new("one_commit", "acquires").await else { return };
    let key = db.key();
    let mut first = connect(&db.url).await;
    let tx = first.transaction().await.unwrap();
    execute(&db, &tx, &key, b"rolled back").await.unwrap();

    let (pid, duplicate) = duplicate(&db, &key).await;
    until_waiting_on_lock(&db.url, pid).await;
    tx.rollback().await.unwrap();
    let answer = duplicate.await.unwrap();
    assert!(matches!(answer, StoreClaim::Acquired { took_over: false, .. }), "{answer:?}");
    db.drop_table().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_lock_timeout_bounds_the_wait_with_in_progress() {
    let Some(db) = Db::new("one_commit", "timeout").await else { return };
    let key = db.key();
    let mut first = connect(&db.url).await;
    let tx = first.transaction().await.unwrap();
    execute(&db, &tx, &key, b"201 first").await.unwrap();

    // The first transaction stays open until the duplicate answered: its wait can only
    // end by the timeout.
    let mut client = connect(&db.url).await;
    let dup = client.transaction().await.unwrap();
    dup.batch_execute("SET LOCAL lock_timeout = '100ms'").await.unwrap();
    let answer = db.store.claim_in(&dup, &key, Fingerprint::of(b"order"), LEASE).await.unwrap();
    assert!(matches!(answer, StoreClaim::InProgress { .. }), "{answer:?}");
    dup.rollback().await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.orders_of(&key).await, 1);
    db.drop_table().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_transaction_from_the_stores_pool_runs_the_same_one_commit() {
    let Some(db) = Db::new("one_commit", "pooled").await else { return };
    let key = db.key();
    let mut object = db.store.pool().get().await.unwrap();
    // Twice on one pooled connection: the second runs the statements it prepared.
    for (round, body) in [(0, &b"201 pooled"[..]), (1, &b"never"[..])] {
        let tx = object.transaction().await.unwrap();
        let answer = db.store.claim_in(&tx, &key, Fingerprint::of(b"order"), LEASE).await;
        match (round, answer.unwrap()) {
            (0, StoreClaim::Acquired { token, .. }) => {
                let sql = format!("INSERT INTO {} VALUES ($1, 'book')", db.orders);
                tx.execute(&sql, &[&key.client_key()]).await.unwrap();
                let claim = OpenClaim::new(key.clone(), token, KEPT);
                complete_in(&tx, &claim, Some(body)).await.unwrap();
                tx.commit().await.unwrap();
            }
            (1, answer) => {
                assert_eq!(replayed(&answer), Some(&b"201 pooled"[..]));
                tx.rollback().await.unwrap();
            }
            (_, answer) => panic!("round {round}: {answer:?}"),
        }
    }
    drop(object);
    assert_eq!(db.orders_of(&key).await, 1);
    db.drop_table().await;
}
