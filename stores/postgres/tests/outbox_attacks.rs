//! Attacks on the PostgreSQL outbox's promises (`IDEMCACHE_POSTGRES_URL`; skipped with
//! a printed reason when unset): the scenarios every engine runs
//! (`idemcache_sql::outbox::testing::producers`: commits of one key that would cross,
//! an open enqueue beside other keys, many producers of one key at once, rows at the
//! top of their counters, the largest headers) through tokio-postgres, and PostgreSQL's own: a publish error
//! holding NUL, and producers that lock the aggregate first. Each test works in a
//! schema of its own, dropped at its end; time is a clock moved by hand.

use std::time::Duration;

use idemcache_postgres::deadpool_postgres::Pool;
use idemcache_postgres::outbox::{
    claim_due, enqueue, inspect, mark_delivered, mark_failed, Mark, OutboxMessage, Retry, Storage,
};
use idemcache_sql::one_commit::testing::Boxed;
use idemcache_sql::outbox::testing::producers::{self, End, Producer, Producers, Script};
use idemcache_sql::outbox::testing::{self, t0};
use idemcache_sql::outbox::State;

mod common;
use common::SchemaDb as Db;

const MIN: Duration = Duration::from_secs(60);

fn message(id: &str) -> OutboxMessage {
    OutboxMessage::new(id, "orders", id.as_bytes().to_vec())
}

/// Producers on connections of their own in the test's schema; the relay's storage and
/// the observer on a pool there.
#[derive(Clone)]
struct Producing {
    db: Db,
    pool: Pool,
}

impl Producing {
    fn new(db: &Db) -> Producing {
        Producing { db: db.clone(), pool: db.pool() }
    }
}

impl Producers for Producing {
    type Storage = Storage;

    fn storage(&self) -> Storage {
        Storage::new(self.pool.clone())
    }

    fn producer(&self, script: Script) -> Boxed<'_, Producer> {
        Box::pin(async move {
            let mut client = self.db.client().await;
            let pid: i32 = client.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
            let done = tokio::spawn(async move {
                let tx = client.transaction().await.unwrap();
                let mut enqueued = Ok(());
                for m in &script.messages {
                    enqueued = enqueue(&tx, m).await;
                    if enqueued.is_err() {
                        break;
                    }
                }
                let failed = enqueued.is_err();
                let _ = script.enqueued.send(enqueued);
                if !failed {
                    tx.batch_execute("SELECT pg_sleep(0.001)").await.unwrap();
                }
                match script.end.await {
                    Ok(End::Commit) if !failed => tx.commit().await.unwrap(),
                    _ => tx.rollback().await.unwrap(),
                }
            });
            Producer { session: pid.into(), done }
        })
    }

    fn waiting(&self, session: i64) -> Boxed<'_, bool> {
        Box::pin(async move {
            let pid = i32::try_from(session).unwrap();
            let sql = "SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted";
            let c = self.pool.get().await.unwrap();
            c.query_one(sql, &[&pid]).await.unwrap().get::<_, i64>(0) > 0
        })
    }

    fn key_seqs(&self, key: &'static str) -> Boxed<'_, Vec<i64>> {
        Box::pin(async move {
            let sql = "SELECT seq FROM idemcache_outbox WHERE aggregate_key = $1 ORDER BY seq";
            let c = self.pool.get().await.unwrap();
            c.query(sql, &[&key]).await.unwrap().iter().map(|r| r.get(0)).collect()
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn producers_side_by_side_keep_each_keys_order_and_hold_back_no_other() {
    let Some(db) = Db::new("side_by_side").await else { return };
    producers::run(&Producing::new(&db)).await;
    db.drop().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_row_at_the_top_of_its_counters_does_not_stall_the_claim() {
    let Some(db) = Db::new("top").await else { return };
    let d = &db;
    let put = move |messages: Vec<OutboxMessage>| d.put(messages);
    let raise = move |column: &'static str, id: String| async move {
        let set = format!(
            "UPDATE idemcache_outbox SET {column} = 9223372036854775807 WHERE message_id = $1"
        );
        d.client().await.execute(&set, &[&id]).await.unwrap();
    };
    let storage = Storage::new(db.pool());
    producers::a_row_at_the_top_of_its_counters_does_not_stall_the_claim(&storage, put, raise)
        .await;
    db.drop().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn the_largest_headers_check_accepts_are_read_back_as_enqueued() {
    let Some(db) = Db::new("headers").await else { return };
    let d = &db;
    let put = move |messages: Vec<OutboxMessage>| d.put(messages);
    let storage = Storage::new(db.pool());
    testing::the_largest_headers_check_accepts_are_read_back_as_enqueued(&storage, put).await;
    db.drop().await;
}

/// A broker's error is free text, and may hold a NUL (a binary protocol's reason, a
/// message quoted raw). PostgreSQL's `TEXT` refuses NUL: the failure must still be
/// marked (the row backs off), not fail the mark and leave the row to be re-published
/// at each lapse of its lease instead of its backoff.
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_publish_error_holding_nul_is_marked_and_backs_off() {
    let Some(db) = Db::new("nul_error").await else { return };
    let mut c = db.client().await;
    let tx = c.transaction().await.unwrap();
    enqueue(&tx, &message("m")).await.unwrap();
    tx.commit().await.unwrap();
    let lease = claim_due(&c, 1, MIN, t0()).await.unwrap().claimed.remove(0).lease;
    let retry = Retry::new(10 * MIN, 10 * MIN, 5).unwrap();
    let marked = mark_failed(&c, &lease, "broker said \0 no", t0(), &retry).await;
    assert_eq!(marked.unwrap(), Mark::Applied);
    let row = inspect(&c, "m").await.unwrap().unwrap();
    assert_eq!(row.state, State::Pending);
    assert!(row.last_error.unwrap().contains("broker said"), "the reason is kept");
    assert!(claim_due(&c, 1, MIN, t0() + 2 * MIN).await.unwrap().claimed.is_empty());
    db.drop().await;
}

/// The guide's remedy for crossing commits: producers of one key that lock the
/// aggregate's row before they enqueue are serialized, and the key's order holds.
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn producers_that_lock_the_aggregate_first_keep_the_keys_order() {
    let Some(db) = Db::new("locked").await else { return };
    let mut first = db.client().await;
    let relay = db.client().await;
    relay.batch_execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, state TEXT)").await.unwrap();
    relay.batch_execute("INSERT INTO orders VALUES (42, 'new')").await.unwrap();
    // Tagged so that the wait below finds this test's own blocked statement.
    let lock = format!("SELECT 1 FROM orders WHERE id = 42 FOR UPDATE /* {} */", db.schema);
    let tx1 = first.transaction().await.unwrap();
    tx1.execute(lock.as_str(), &[]).await.unwrap();
    enqueue(&tx1, &message("created").with_aggregate_key("order-42")).await.unwrap();
    let mut second = db.client().await;
    let lock2 = lock.clone();
    let producer = tokio::spawn(async move {
        let tx2 = second.transaction().await.unwrap();
        tx2.execute(lock2.as_str(), &[]).await.unwrap();
        enqueue(&tx2, &message("paid").with_aggregate_key("order-42")).await.unwrap();
        tx2.commit().await.unwrap();
    });
    // Wait (by asking the server, not by sleeping) until the second producer is blocked
    // on the lock, so that its enqueue comes after the first one's commit.
    let blocked = "SELECT count(*) FROM pg_stat_activity \
                   WHERE wait_event_type = 'Lock' AND query = $1";
    while relay.query_one(blocked, &[&lock]).await.unwrap().get::<_, i64>(0) == 0 {
        tokio::task::yield_now().await;
    }
    tx1.commit().await.unwrap();
    producer.await.unwrap();
    let mut order = Vec::new();
    for _ in 0..2 {
        for c in claim_due(&relay, 10, MIN, t0()).await.unwrap().claimed {
            order.push(c.message.id().to_owned());
            assert_eq!(mark_delivered(&relay, &c.lease, t0()).await.unwrap(), Mark::Applied);
        }
    }
    assert_eq!(order, ["created", "paid"]);
    db.drop().await;
}
