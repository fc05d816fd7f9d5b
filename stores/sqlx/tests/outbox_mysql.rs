//! The sqlx MySQL/MariaDB outbox against a real server (`IDEMCACHE_MYSQL_URL`; skipped
//! with a printed reason when unset): a rolled-back enqueue leaves nothing, a committed
//! one is claimed once, a duplicate id is a typed error that leaves the transaction
//! usable, concurrent relays never lease one row (`SKIP LOCKED`) and never make an
//! enqueue wait, a lapsed lease is claimed again under a higher token and the old
//! token's marks are refused, rows of one key go in order, failures back off and die,
//! dead rows are listed and requeued, delivered rows are purged in batches, unreadable
//! rows are `Corrupt`, and a relay killed mid-batch loses nothing. Each test works in a
//! database of its own, dropped at its end; time is a clock moved by hand.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idemcache::store::conformance::service_url;
use idemcache_sql::outbox::testing::{self, ids, message, t0};
use idemcache_sql::outbox::State;
use idemcache_sqlx::outbox::mysql::{self, claim_due, enqueue, inspect, mark_delivered, Storage};
use idemcache_sqlx::outbox::{Mark, OutboxError, OutboxMessage};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Executor, MySqlConnection, MySqlPool};

const MIN: Duration = Duration::from_secs(60);

struct Db {
    url: String,
    name: String,
}

impl Db {
    async fn new(test: &str) -> Option<Db> {
        static N: AtomicU32 = AtomicU32::new(0);
        let url = service_url("IDEMCACHE_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")?;
        let n = N.fetch_add(1, Ordering::Relaxed);
        let name = format!("idemcache_outbox_{test}_{}_{n}", std::process::id());
        let db = Db { url, name };
        let mut admin = MySqlConnection::connect(&db.url).await.unwrap();
        let create = format!("CREATE DATABASE {}", db.name);
        admin.execute(sqlx::raw_sql(AssertSqlSafe(create))).await.unwrap();
        mysql::ensure_schema(&mut db.conn().await).await.unwrap();
        Some(db)
    }

    async fn conn(&self) -> MySqlConnection {
        let mut c = MySqlConnection::connect(&self.url).await.unwrap();
        c.execute(sqlx::raw_sql(AssertSqlSafe(format!("USE {}", self.name)))).await.unwrap();
        c
    }

    async fn pool(&self) -> MySqlPool {
        let options: MySqlConnectOptions = self.url.parse().unwrap();
        MySqlPoolOptions::new()
            .max_connections(4)
            .connect_with(options.database(&self.name))
            .await
            .unwrap()
    }

    async fn drop(self) {
        let mut admin = MySqlConnection::connect(&self.url).await.unwrap();
        let drop = format!("DROP DATABASE {}", self.name);
        admin.execute(sqlx::raw_sql(AssertSqlSafe(drop))).await.unwrap();
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

async fn put(c: &mut MySqlConnection, messages: &[OutboxMessage]) {
    let mut tx = c.begin().await.unwrap();
    for m in messages {
        enqueue(&mut tx, m).await.unwrap();
    }
    tx.commit().await.unwrap();
}

async fn count<'c>(c: impl sqlx::Executor<'c, Database = sqlx::MySql>, state: State) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idemcache_outbox WHERE state = ?")
        .bind(state.code())
        .fetch_one(c)
        .await
        .unwrap()
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn enqueue_commits_with_the_change_and_is_claimed_once() {
    let Some(db) = Db::new("basic").await else { return };
    let mut c = db.conn().await;
    mysql::ensure_schema(&mut c).await.unwrap(); // idempotent
    let mut tx = c.begin().await.unwrap();
    enqueue(&mut tx, &message("lost")).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(claim_due(&mut c, 10, MIN, t0()).await.unwrap().claimed.is_empty());
    assert!(inspect(&mut c, "lost").await.unwrap().is_none());

    // Byte for byte: ids differing in case or a trailing space are other messages.
    put(&mut c, &[message("m-1"), message("M-1"), message("m-1 ")]).await;
    let first = claim_due(&mut c, 10, MIN, t0()).await.unwrap();
    assert_eq!(ids(&first), ["m-1", "M-1", "m-1 "]);
    assert_eq!(first.claimed[0].message, message("m-1"), "read back as enqueued");
    assert!(claim_due(&mut c, 10, MIN, t0() + secs(59)).await.unwrap().claimed.is_empty());
    let lease = &first.claimed[0].lease;
    assert_eq!(mark_delivered(&mut c, lease, t0()).await.unwrap(), Mark::Applied);
    assert_eq!(mark_delivered(&mut c, lease, t0()).await.unwrap(), Mark::Stale);

    // A duplicate id: typed, and the transaction goes on.
    let mut tx = c.begin().await.unwrap();
    let e = enqueue(&mut tx, &message("m-1")).await.unwrap_err();
    assert!(matches!(&e, OutboxError::Duplicate(id) if id == "m-1"), "{e:?}");
    enqueue(&mut tx, &message("m-2")).await.unwrap();
    tx.commit().await.unwrap();
    assert!(inspect(&mut c, "m-2").await.unwrap().is_some());
    db.drop().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn leases_lapse_to_a_higher_token_keys_keep_order_failures_die_and_purge() {
    let Some(db) = Db::new("life").await else { return };
    let pool = db.pool().await;
    let d = &db;
    let put = move |messages: Vec<OutboxMessage>| async move {
        put(&mut d.conn().await, &messages).await;
    };
    testing::a_rows_life(&Storage::new(pool.clone()), put).await;
    pool.close().await;
    db.drop().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn unreadable_rows_are_corrupt_and_do_not_block_the_others() {
    let Some(db) = Db::new("corrupt").await else { return };
    let pool = db.pool().await;
    let d = &db;
    let put = move |messages: Vec<OutboxMessage>| async move {
        put(&mut d.conn().await, &messages).await;
    };
    let spoil = || async {
        let spoiled =
            "UPDATE idemcache_outbox SET headers = x'0009' WHERE message_id = 'bad-headers';
                       UPDATE idemcache_outbox SET state = 9 WHERE message_id = 'bad-state';";
        d.conn().await.execute(sqlx::raw_sql(spoiled)).await.unwrap();
    };
    let storage = Storage::new(pool.clone());
    testing::unreadable_rows_are_corrupt_and_hold_back_no_other(&storage, put, spoil).await;
    let mut c = db.conn().await;
    c.execute(sqlx::raw_sql("UPDATE idemcache_outbox SET topic = x'ff' WHERE message_id = 'good'"))
        .await
        .unwrap();
    let e = inspect(&mut c, "good").await.unwrap_err();
    assert!(e.to_string().contains("topic is not UTF-8"), "{e}");
    pool.close().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn concurrent_relays_never_lease_one_row_nor_hold_up_an_enqueue() {
    let Some(db) = Db::new("skip").await else { return };
    let pool = db.pool().await;
    let d = &db;
    let put = move |messages: Vec<OutboxMessage>| async move {
        put(&mut d.conn().await, &messages).await;
    };
    testing::concurrent_relays_never_lease_one_row_nor_hold_up_an_enqueue(
        || Storage::new(pool.clone()),
        put,
    )
    .await;
    pool.close().await;
    db.drop().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_claim_skips_a_row_another_transaction_holds_instead_of_waiting() {
    let Some(db) = Db::new("held").await else { return };
    let mut c = db.conn().await;
    let k = |id: &str| message(id).with_aggregate_key("K");
    put(&mut c, &[k("held"), k("after-held"), message("free")]).await;
    let mut holder = db.conn().await;
    let mut tx = holder.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM idemcache_outbox WHERE message_id = 'held' FOR UPDATE")
        .execute(&mut *tx)
        .await
        .unwrap();
    // A bound on a hang, not a timing: the claim answers at once or the test fails.
    let claim = claim_due(&mut c, 10, MIN, t0());
    let batch = tokio::time::timeout(secs(10), claim).await.expect("the claim waited").unwrap();
    assert_eq!(ids(&batch), ["free"], "the held row skipped, its key's later row waits");
    tx.rollback().await.unwrap();
    assert_eq!(ids(&claim_due(&mut c, 10, MIN, t0()).await.unwrap()), ["held"]);
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_relay_killed_mid_batch_loses_nothing() {
    let Some(db) = Db::new("killed").await else { return };
    let mut c = db.conn().await;
    put(&mut c, &testing::killed_mid_batch_messages()).await;
    let pool = db.pool().await;
    let storage = || Storage::new(pool.clone());
    testing::a_relay_killed_mid_batch_loses_nothing(storage, |state| count(&pool, state)).await;
    pool.close().await;
    db.drop().await;
}
