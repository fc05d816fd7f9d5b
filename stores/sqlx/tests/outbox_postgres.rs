//! The sqlx PostgreSQL outbox against a real server (`IDEMCACHE_POSTGRES_URL`; skipped
//! with a printed reason when unset): a rolled-back enqueue leaves nothing, a committed
//! one is claimed once and notifies a `PgListener`, a duplicate id is a typed error, one
//! table is shared with the tokio-postgres driver, concurrent relays never lease one row
//! (`SKIP LOCKED`) and never make an enqueue wait, a lapsed lease is claimed again under a higher token and the old
//! token's marks are refused, rows of one key go in order, failures back off and die,
//! dead rows are listed and requeued, delivered rows are purged in batches, unreadable
//! rows are `Corrupt`, and a relay killed mid-batch loses nothing. Each test works in a
//! schema of its own, dropped at its end; time is a clock moved by hand.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idemcache::store::conformance::service_url;
use idemcache_sql::outbox::testing::{self, ids, message, t0};
use idemcache_sql::outbox::State;
use idemcache_sqlx::outbox::postgres::{
    self, claim_due, enqueue, inspect, mark_delivered, Storage,
};
use idemcache_sqlx::outbox::{Mark, OutboxError, OutboxMessage};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection, PgPool};

const MIN: Duration = Duration::from_secs(60);

struct Db {
    url: String,
    schema: String,
}

impl Db {
    async fn new(test: &str) -> Option<Db> {
        static N: AtomicU32 = AtomicU32::new(0);
        let url = service_url("IDEMCACHE_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")?;
        let n = N.fetch_add(1, Ordering::Relaxed);
        let schema = format!("idemcache_outbox_sqlx_{test}_{}_{n}", std::process::id());
        let db = Db { url, schema };
        let mut admin = PgConnection::connect(&db.url).await.unwrap();
        let create = format!("CREATE SCHEMA {}", db.schema);
        admin.execute(sqlx::raw_sql(AssertSqlSafe(create))).await.unwrap();
        postgres::ensure_schema(&mut db.conn().await).await.unwrap();
        Some(db)
    }

    async fn conn(&self) -> PgConnection {
        let mut c = PgConnection::connect(&self.url).await.unwrap();
        let set = format!("SET search_path TO {}", self.schema);
        c.execute(sqlx::raw_sql(AssertSqlSafe(set))).await.unwrap();
        c
    }

    async fn pool(&self) -> PgPool {
        let options: PgConnectOptions = self.url.parse().unwrap();
        let options = options.options([("search_path", self.schema.as_str())]);
        PgPoolOptions::new().max_connections(4).connect_with(options).await.unwrap()
    }

    async fn drop(self) {
        let mut admin = PgConnection::connect(&self.url).await.unwrap();
        let drop = format!("DROP SCHEMA {} CASCADE", self.schema);
        admin.execute(sqlx::raw_sql(AssertSqlSafe(drop))).await.unwrap();
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

async fn put(c: &mut PgConnection, messages: &[OutboxMessage]) {
    let mut tx = c.begin().await.unwrap();
    for m in messages {
        enqueue(&mut tx, m).await.unwrap();
    }
    tx.commit().await.unwrap();
}

async fn count<'c>(c: impl sqlx::Executor<'c, Database = sqlx::Postgres>, state: State) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idemcache_outbox WHERE state = $1")
        .bind(state.code())
        .fetch_one(c)
        .await
        .unwrap()
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn enqueue_commits_with_the_change_and_is_claimed_once() {
    let Some(db) = Db::new("basic").await else { return };
    let mut c = db.conn().await;
    postgres::ensure_schema(&mut c).await.unwrap(); // idempotent
    let mut listener = PgListener::connect(&db.url).await.unwrap();
    listener.listen(postgres::CHANNEL).await.unwrap();
    let mut tx = c.begin().await.unwrap();
    enqueue(&mut tx, &message("lost")).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(claim_due(&mut c, 10, MIN, t0()).await.unwrap().claimed.is_empty());
    assert!(inspect(&mut c, "lost").await.unwrap().is_none());

    // Byte for byte: ids differing in case or a trailing space are other messages.
    put(&mut c, &[message("m-1"), message("M-1"), message("m-1 ")]).await;
    // The commit notified the listener: one notification for the transaction.
    let heard = listener.recv().await.unwrap();
    assert_eq!(heard.channel(), postgres::CHANNEL);
    let first = claim_due(&mut c, 10, MIN, t0()).await.unwrap();
    assert_eq!(ids(&first), ["m-1", "M-1", "m-1 "]);
    assert_eq!(first.claimed[0].message, message("m-1"), "read back as enqueued");
    assert!(claim_due(&mut c, 10, MIN, t0() + secs(59)).await.unwrap().claimed.is_empty());
    let lease = &first.claimed[0].lease;
    assert_eq!(mark_delivered(&mut c, lease, t0()).await.unwrap(), Mark::Applied);
    assert_eq!(mark_delivered(&mut c, lease, t0()).await.unwrap(), Mark::Stale);

    // A duplicate id: typed (the transaction is aborted: PostgreSQL's rule).
    let mut tx = c.begin().await.unwrap();
    let e = enqueue(&mut tx, &message("m-1")).await.unwrap_err();
    assert!(matches!(&e, OutboxError::Duplicate(id) if id == "m-1"), "{e:?}");
    tx.rollback().await.unwrap();

    // One table for both drivers: enqueued by tokio-postgres, claimed here, and back.
    let (other, connection) = idemcache_postgres::tokio_postgres::connect(
        &db.url,
        idemcache_postgres::tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let mut other = other;
    other.batch_execute(&format!("SET search_path TO {}", db.schema)).await.unwrap();
    let tx = other.transaction().await.unwrap();
    idemcache_postgres::outbox::enqueue(&tx, &message("from-tokio-postgres")).await.unwrap();
    tx.commit().await.unwrap();
    put(&mut c, &[message("from-sqlx")]).await;
    let here = claim_due(&mut c, 1, MIN, t0()).await.unwrap();
    assert_eq!(ids(&here), ["from-tokio-postgres"]);
    let there = idemcache_postgres::outbox::claim_due(&other, 10, MIN, t0()).await.unwrap();
    assert_eq!(there.claimed.len(), 1);
    assert_eq!(there.claimed[0].message, message("from-sqlx"));
    db.drop().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
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
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn unreadable_rows_are_corrupt_and_do_not_block_the_others() {
    let Some(db) = Db::new("corrupt").await else { return };
    let pool = db.pool().await;
    let d = &db;
    let put = move |messages: Vec<OutboxMessage>| async move {
        put(&mut d.conn().await, &messages).await;
    };
    let spoil = || async {
        let spoiled =
            "UPDATE idemcache_outbox SET headers = '\\x0009' WHERE message_id = 'bad-headers';
                       UPDATE idemcache_outbox SET state = 9 WHERE message_id = 'bad-state';";
        d.conn().await.execute(sqlx::raw_sql(spoiled)).await.unwrap();
    };
    let storage = Storage::new(pool.clone());
    testing::unreadable_rows_are_corrupt_and_hold_back_no_other(&storage, put, spoil).await;
    pool.close().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
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
