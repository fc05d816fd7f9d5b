//! One commit per first execution over sqlx's MySQL/MariaDB: `MySqlStore::claim_in`, the
//! business write and `MySqlStore::complete_in` in the caller's one transaction. Against
//! a real server (`IDEMCACHE_MYSQL_URL`; skipped with a printed reason when unset).
//!
//! What is checked here is MySQL's own (the claims every engine shares, a kill
//! included, are `idemcache_sql::one_commit::testing`'s, run from `one_commit_layer.rs`):
//! the three commit together on your transaction, and a retry replays; a duplicate
//! waits on the record's row and replays what the first committed; its wait is bounded
//! by the lease or by a lower session `innodb_lock_wait_timeout`, answering
//! `InProgress`, and the session's own bound is restored (on MariaDB, untouched even by
//! a claim dropped while it waits); a dead record is taken over under a higher token
//! and its holder fenced; a lapse under `MarkUnknown` turns UNKNOWN; a takeover or a turn
//! held by another transaction's gap lock waits at most the lease; a deadlock is an
//! error (1213), not retried.
//!
//! No test waits on a clock: a waiting duplicate is seen waiting in InnoDB's monitor
//! (`LOCK WAIT`) before the first transaction ends, and a lease is seen over by polling
//! the store's read of the record.

use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idemcache::store::conformance::service_url;
use idemcache::store::{OpenClaim, RecordState, Store, StoreClaim, StoreError};
use idemcache::{Fingerprint, Key, LapsePolicy};
use idemcache_sqlx::MySqlStore;
use sqlx::mysql::{MySqlConnectOptions, MySqlDatabaseError, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, MySql, MySqlPool, Row, Transaction};

const LEASE: Duration = Duration::from_secs(30);
const KEPT: Duration = Duration::from_secs(600);

/// A store over the test database, a table of this test's own for its orders, and keys
/// no other run has used.
struct Db {
    pool: MySqlPool,
    store: MySqlStore,
    orders: String,
}

impl Db {
    async fn new(name: &str) -> Option<Db> {
        static N: AtomicU32 = AtomicU32::new(0);
        let url = service_url("IDEMCACHE_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")?;
        let n = N.fetch_add(1, Ordering::Relaxed);
        let orders = format!("idemcache_sqlx_one_commit_{name}_{}_{n}", std::process::id());
        let db = Db::open(url, orders).await;
        db.store.ensure_schema().await.unwrap();
        let create =
            format!("CREATE TABLE {} (k VARCHAR(255) PRIMARY KEY) ENGINE=InnoDB", db.orders);
        sqlx::raw_sql(AssertSqlSafe(create)).execute(&db.pool).await.unwrap();
        Some(db)
    }

    async fn open(url: String, orders: String) -> Db {
        let pool = MySqlPoolOptions::new().max_connections(8).connect(&url).await.unwrap();
        let store = MySqlStore::from_pool(pool.clone());
        Db { pool, store, orders }
    }

    fn key(&self) -> Key {
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
        let n = N.fetch_add(1, Ordering::Relaxed);
        Key::new("POST /orders", "sqlx-one-commit", format!("{}-{nanos}-{n}", self.orders)).unwrap()
    }

    async fn orders_of(&self, key: &Key) -> i64 {
        let sql = format!("SELECT COUNT(*) FROM {} WHERE k = ?", self.orders);
        let query = sqlx::query(AssertSqlSafe(sql)).bind(key.client_key());
        query.fetch_one(&self.pool).await.unwrap().get(0)
    }

    /// The first execution as a handler writes it: the claim, the order, the record, in
    /// `tx`; the claim's answer if it was not acquired.
    async fn execute(
        &self,
        tx: &mut Transaction<'_, MySql>,
        key: &Key,
        body: &[u8],
    ) -> Result<(), StoreClaim> {
        match self.store.claim_in(tx, key, Fingerprint::of(b"order"), LEASE).await.unwrap() {
            StoreClaim::Acquired { token, .. } => {
                let sql = format!("INSERT INTO {} VALUES (?)", self.orders);
                let insert = sqlx::query(AssertSqlSafe(sql)).bind(key.client_key());
                insert.execute(&mut **tx).await.unwrap();
                let claim = OpenClaim::new(key.clone(), token, KEPT);
                MySqlStore::complete_in(tx, &claim, Some(body)).await.unwrap();
                Ok(())
            }
            other => Err(other),
        }
    }

    /// A duplicate's claim of `key` in a transaction of its own, on a task; its
    /// connection's id, to watch it wait.
    async fn duplicate(&self, key: &Key) -> (u64, tokio::task::JoinHandle<StoreClaim>) {
        let mut conn = self.pool.acquire().await.unwrap();
        let id = connection_id(&mut conn).await;
        let (store, key) = (self.store.clone(), key.clone());
        let task = tokio::spawn(async move {
            let mut tx = sqlx::Acquire::begin(&mut *conn).await.unwrap();
            let answer = store.claim_in(&mut tx, &key, Fingerprint::of(b"order"), LEASE).await;
            tx.rollback().await.unwrap();
            answer.unwrap()
        });
        (id, task)
    }

    async fn drop_table(self) {
        let sql = format!("DROP TABLE {}", self.orders);
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(&self.pool).await.unwrap();
    }
}

async fn connection_id(conn: &mut sqlx::MySqlConnection) -> u64 {
    sqlx::query_scalar("SELECT CONNECTION_ID()").fetch_one(conn).await.unwrap()
}

async fn session_lock_wait(conn: &mut sqlx::MySqlConnection) -> u64 {
    let sql = "SELECT @@SESSION.innodb_lock_wait_timeout";
    sqlx::query_scalar(sql).fetch_one(conn).await.unwrap()
}

fn replayed(answer: &StoreClaim) -> Option<&[u8]> {
    match answer {
        StoreClaim::Completed(replay) => replay.body.as_deref(),
        _ => None,
    }
}

/// MySQL's error number under a store error, if a statement failed with one.
fn number(e: &StoreError) -> Option<u16> {
    let StoreError::Backend(e) = e else { return None };
    let e = e.downcast_ref::<sqlx::Error>()?.as_database_error()?;
    e.try_downcast_ref::<MySqlDatabaseError>().map(MySqlDatabaseError::number)
}

/// Waits until the connection `id`'s transaction waits on a row lock: the duplicate is
/// queued on another transaction's row. Polls InnoDB's monitor (`SHOW ENGINE INNODB
/// STATUS`, one `---TRANSACTION` block per transaction, `LOCK WAIT` in a waiting one's),
/// made afresh for each read: `information_schema.innodb_trx` is a cache the server
/// refreshes only once nobody has read it for 100 ms, which concurrent pollers (these
/// tests, other suites on the server) can keep from ever happening.
async fn until_waiting_on_lock(pool: &MySqlPool, id: u64) {
    let session = format!(" thread id {id},"); // "MySQL thread id" or "MariaDB thread id"
    let deadline = Instant::now() + Duration::from_secs(30); // against a hang
    while Instant::now() < deadline {
        let status = sqlx::raw_sql("SHOW ENGINE INNODB STATUS").fetch_one(pool).await.unwrap();
        let status: String = status.get("Status");
        let mut transactions = status.split("---TRANSACTION");
        if transactions.any(|t| t.contains(&session) && t.contains("LOCK WAIT")) {
            return;
        }
    }
    panic!("connection {id} never waited on a row lock");
}

/// Polls the store's read of `key` until `done` says the record is as awaited.
async fn until_record(store: &MySqlStore, key: &Key, done: impl Fn(Option<RecordState>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30); // against a hang
    while Instant::now() < deadline {
        if done(store.record(key).await.unwrap().map(|r| r.state)) {
            return;
        }
    }
    panic!("the record of {key:?} never got there");
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn the_claim_the_order_and_the_record_commit_together() {
    let Some(db) = Db::new("together").await else { return };
    let key = db.key();
    let mut tx = db.pool.begin().await.unwrap();
    db.execute(&mut tx, &key, b"201 order 1").await.unwrap();
    assert!(db.store.record(&key).await.unwrap().is_none(), "invisible until the commit");
    tx.commit().await.unwrap();
    let again = db.store.claim(&key, Fingerprint::of(b"order"), LEASE).await.unwrap();
    assert_eq!(replayed(&again), Some(&b"201 order 1"[..]));
    // A retry in one-commit mode replays too, and writes nothing.
    let mut tx = db.pool.begin().await.unwrap();
    let answer = db.execute(&mut tx, &key, b"never").await.unwrap_err();
    assert_eq!(replayed(&answer), Some(&b"201 order 1"[..]));
    tx.rollback().await.unwrap();
    assert_eq!(db.orders_of(&key).await, 1);
    db.drop_table().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_duplicate_waits_on_the_row_and_replays_what_committed() {
    let Some(db) = Db::new("waits").await else { return };
    let key = db.key();
    let mut tx = db.pool.begin().await.unwrap();
    db.execute(&mut tx, &key, b"201 first").await.unwrap();

    let (id, duplicate) = db.duplicate(&key).await;
    until_waiting_on_lock(&db.pool, id).await;
    assert!(!duplicate.is_finished(), "the duplicate answers only once the first ends");
    tx.commit().await.unwrap();
    assert_eq!(replayed(&duplicate.await.unwrap()), Some(&b"201 first"[..]));
    assert_eq!(db.orders_of(&key).await, 1);
    db.drop_table().await;
}

/// MariaDB's `innodb_snapshot_isolation` (on by default from 11.6): a transaction whose
/// snapshot is older than the first's commit may not read the committed record (error
/// 1020). The claim answers `InProgress`, and the retry, in a transaction of its own,
/// replays. Skipped where the server has no such setting.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_snapshot_older_than_the_records_commit_is_in_progress_then_replays() {
    let Some(db) = Db::new("snapshot").await else { return };
    let key = db.key();
    let mut conn = db.pool.acquire().await.unwrap();
    let on = sqlx::raw_sql("SET SESSION innodb_snapshot_isolation = ON").execute(&mut *conn).await;
    if let Err(e) = on {
        eprintln!("skipped: this server has no innodb_snapshot_isolation ({e})");
        return db.drop_table().await;
    }
    let mut dup = sqlx::Acquire::begin(&mut *conn).await.unwrap();
    let read = format!("SELECT COUNT(*) FROM {}", db.orders);
    let orders: i64 = sqlx::query_scalar(AssertSqlSafe(read)).fetch_one(&mut *dup).await.unwrap();
    assert_eq!(orders, 0); // the snapshot is taken here
    let mut first = db.pool.begin().await.unwrap();
    db.execute(&mut first, &key, b"201 first").await.unwrap();
    first.commit().await.unwrap();
    let answer = db.store.claim_in(&mut dup, &key, Fingerprint::of(b"order"), LEASE).await;
    assert!(matches!(answer, Ok(StoreClaim::InProgress { .. })), "{answer:?}");
    dup.rollback().await.unwrap();
    let mut retry = sqlx::Acquire::begin(&mut *conn).await.unwrap();
    let answer = db.store.claim_in(&mut retry, &key, Fingerprint::of(b"order"), LEASE).await;
    assert_eq!(replayed(&answer.unwrap()), Some(&b"201 first"[..]));
    retry.rollback().await.unwrap();
    sqlx::raw_sql("SET SESSION innodb_snapshot_isolation = OFF").execute(&mut *conn).await.unwrap();
    drop(conn);
    db.drop_table().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_wait_past_its_bound_is_in_progress_and_the_session_keeps_its_own() {
    let Some(db) = Db::new("timeout").await else { return };
    let key = db.key();
    let mut first = db.pool.begin().await.unwrap();
    db.execute(&mut first, &key, b"201 first").await.unwrap();

    // The first transaction stays open until both duplicates answered: each wait can only
    // end by its bound. One bounded by the session's own lower value, one by its lease.
    let mut conn = db.pool.acquire().await.unwrap();
    sqlx::raw_sql("SET SESSION innodb_lock_wait_timeout = 1").execute(&mut *conn).await.unwrap();
    let mut dup = sqlx::Acquire::begin(&mut *conn).await.unwrap();
    let answer = db.store.claim_in(&mut dup, &key, Fingerprint::of(b"order"), LEASE).await;
    assert!(matches!(answer, Ok(StoreClaim::InProgress { .. })), "{answer:?}");
    // Only the claim's statement was undone: the transaction goes on.
    sqlx::query("SELECT 1").execute(&mut *dup).await.unwrap();
    dup.rollback().await.unwrap();
    assert_eq!(session_lock_wait(&mut conn).await, 1, "the session's own value, kept");

    sqlx::raw_sql("SET SESSION innodb_lock_wait_timeout = 50").execute(&mut *conn).await.unwrap();
    let mut dup = sqlx::Acquire::begin(&mut *conn).await.unwrap();
    let short = Duration::from_millis(300);
    let answer = db.store.claim_in(&mut dup, &key, Fingerprint::of(b"order"), short).await;
    assert!(matches!(answer, Ok(StoreClaim::InProgress { .. })), "{answer:?}");
    dup.rollback().await.unwrap();
    assert_eq!(session_lock_wait(&mut conn).await, 50, "restored after the lease's bound");

    first.commit().await.unwrap();
    assert_eq!(db.orders_of(&key).await, 1);
    db.drop_table().await;
}

/// MariaDB's claim bounds its wait by the statement's own `SET STATEMENT`: a claim
/// dropped while it waits (a request timed out, a client gone) leaves the session's
/// `innodb_lock_wait_timeout` as it was for the next user of the pooled connection.
/// (MySQL's claim lowers the session's value and restores it after: its rustdoc says
/// to close such a connection; skipped there.)
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_claim_dropped_while_it_waits_leaves_the_session_as_it_was() {
    let Some(db) = Db::new("dropped").await else { return };
    let mut conn = db.pool.acquire().await.unwrap();
    let version: String =
        sqlx::query_scalar("SELECT VERSION()").fetch_one(&mut *conn).await.unwrap();
    if !version.contains("MariaDB") {
        eprintln!("skipped: {version} is MySQL, whose claim's bound is not cancel-safe");
        return db.drop_table().await;
    }
    let key = db.key();
    let mut first = db.pool.begin().await.unwrap();
    db.execute(&mut first, &key, b"201 first").await.unwrap();

    sqlx::raw_sql("SET SESSION innodb_lock_wait_timeout = 50").execute(&mut *conn).await.unwrap();
    let id = connection_id(&mut conn).await;
    let mut dup = sqlx::Acquire::begin(&mut *conn).await.unwrap();
    let claim = db.store.claim_in(&mut dup, &key, Fingerprint::of(b"order"), LEASE);
    tokio::select! {
        answer = claim => panic!("answered while the first held the row: {answer:?}"),
        () = until_waiting_on_lock(&db.pool, id) => {} // the claim dropped mid-wait
    }
    // The dropped statement ends once the first commits; the connection reads its
    // answer before the next statement.
    first.commit().await.unwrap();
    dup.rollback().await.unwrap();
    assert_eq!(session_lock_wait(&mut conn).await, 50, "the session's own value, untouched");
    db.drop_table().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_dead_record_is_taken_over_under_a_higher_token_and_its_holder_fenced() {
    let Some(db) = Db::new("dead").await else { return };
    let key = db.key();
    let lease = Duration::from_millis(1);
    let held = db.store.claim(&key, Fingerprint::of(b"order"), lease).await.unwrap();
    let StoreClaim::Acquired { token: old, .. } = held else { panic!("acquired: {held:?}") };
    until_record(&db.store, &key, |state| state.is_none()).await;

    let mut tx = db.pool.begin().await.unwrap();
    let answer = db.store.claim_in(&mut tx, &key, Fingerprint::of(b"order"), LEASE).await;
    let Ok(StoreClaim::Acquired { token, .. }) = answer else { panic!("taken over: {answer:?}") };
    assert!(token > old, "{token:?} above the dead record's {old:?}");
    // The old holder's completion in this transaction: fenced by the new token.
    let zombie = OpenClaim::new(key.clone(), old, KEPT);
    let refused = MySqlStore::complete_in(&mut tx, &zombie, Some(b"zombie")).await;
    assert!(matches!(refused, Err(StoreError::LeaseLost(_))), "{refused:?}");
    let claim = OpenClaim::new(key.clone(), token, KEPT);
    MySqlStore::complete_in(&mut tx, &claim, Some(b"201 taken over")).await.unwrap();
    tx.commit().await.unwrap();

    // And through the store, once committed.
    let refused = db.store.complete(&key, old, Some("zombie".into()), KEPT).await;
    assert!(matches!(refused, Err(StoreError::LeaseLost(_))), "{refused:?}");
    let again = db.store.claim(&key, Fingerprint::of(b"order"), LEASE).await.unwrap();
    assert_eq!(replayed(&again), Some(&b"201 taken over"[..]));
    db.drop_table().await;
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_lapse_under_mark_unknown_turns_unknown() {
    let Some(db) = Db::new("lapse").await else { return };
    let store = db.store.clone().with_lapse_policy(LapsePolicy::MarkUnknown { ttl: KEPT }).unwrap();
    let key = db.key();
    let lease = Duration::from_millis(1);
    let held = store.claim(&key, Fingerprint::of(b"order"), lease).await.unwrap();
    assert!(matches!(held, StoreClaim::Acquired { .. }), "{held:?}");
    until_record(&store, &key, |state| state == Some(RecordState::Unknown)).await;

    let mut tx = db.pool.begin().await.unwrap();
    let answer = store.claim_in(&mut tx, &key, Fingerprint::of(b"order"), LEASE).await;
    assert!(matches!(answer, Ok(StoreClaim::Unknown { .. })), "{answer:?}");
    tx.commit().await.unwrap();
    // The turn committed: the record is UNKNOWN as stored, for the takeover policy too.
    let record = db.store.record(&key).await.unwrap().map(|r| r.state);
    assert_eq!(record, Some(RecordState::Unknown));
    db.drop_table().await;
}

/// Every claim statement that can wait on a lock is bounded by the lease, not the
/// insert alone: a takeover's and a turn's new `expires_at` enter the expiry index,
/// where another transaction's gap lock (a locking range read at REPEATABLE READ) holds
/// them. The claim answers `InProgress` while that lock is still held. In a database of
/// its own, so that the gap lock holds no other test's claim.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_takeover_or_a_turn_held_by_a_gap_lock_waits_at_most_the_lease() {
    let Some(url) = service_url("IDEMCACHE_MYSQL_URL", "mysql://root@127.0.0.1:3306/test") else {
        return;
    };
    let database = format!("idemcache_claim_gap_{}", std::process::id());
    let admin = MySqlPool::connect(&url).await.unwrap();
    // Made afresh: a failed run of the same process id may have left one.
    let create = format!("DROP DATABASE IF EXISTS {database}; CREATE DATABASE {database}");
    sqlx::raw_sql(AssertSqlSafe(create)).execute(&admin).await.unwrap();
    let options = MySqlConnectOptions::from_str(&url).unwrap().database(&database);
    let pool = MySqlPoolOptions::new().max_connections(4).connect_with(options).await.unwrap();
    let takeover = MySqlStore::from_pool(pool.clone());
    takeover.ensure_schema().await.unwrap();
    let turning = takeover.clone().with_lapse_policy(LapsePolicy::MarkUnknown { ttl: KEPT });
    let turning = turning.unwrap();
    let now = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)";
    // The takeover's entry lands at now + 1 s, the turn's 600 s past the lapsed lease.
    for (store, seen, from) in [
        (&takeover, None, now.to_owned()),
        (&turning, Some(RecordState::Unknown), format!("{now} + 60000000")),
    ] {
        let key = Key::new("POST /orders", "gap", format!("{seen:?}")).unwrap();
        let fp = Fingerprint::of(b"order");
        let held = store.claim(&key, fp, Duration::from_millis(1)).await.unwrap();
        assert!(matches!(held, StoreClaim::Acquired { .. }), "{held:?}");
        until_record(store, &key, |state| state == seen).await;
        let mut other = pool.begin().await.unwrap();
        let gap = format!(
            "SELECT COUNT(*) FROM idemcache_records FORCE INDEX (idemcache_records_expiry) \
             WHERE expires_at >= {from} FOR UPDATE"
        );
        sqlx::raw_sql(AssertSqlSafe(gap)).execute(&mut *other).await.unwrap();
        let mut tx = pool.begin().await.unwrap();
        let claim = store.claim_in(&mut tx, &key, fp, Duration::from_secs(1));
        // A guard against a hang (unbounded, the wait would be the session's 50 s).
        let answer = tokio::time::timeout(Duration::from_secs(30), claim).await;
        assert!(matches!(answer, Ok(Ok(StoreClaim::InProgress { .. }))), "{seen:?}: {answer:?}");
        tx.rollback().await.unwrap();
        other.rollback().await.unwrap();
    }
    pool.close().await;
    let drop = format!("DROP DATABASE {database}");
    sqlx::raw_sql(AssertSqlSafe(drop)).execute(&admin).await.unwrap();
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_deadlock_is_an_error_not_a_retry() {
    let Some(db) = Db::new("deadlock").await else { return };
    let (one, two) = (db.key(), db.key());
    let mut a = db.pool.begin().await.unwrap();
    let a_id = connection_id(&mut a).await;
    let mut b = db.pool.begin().await.unwrap();
    let fp = Fingerprint::of(b"order");
    let took = db.store.claim_in(&mut a, &one, fp, LEASE).await.unwrap();
    assert!(matches!(took, StoreClaim::Acquired { .. }), "{took:?}");
    let took = db.store.claim_in(&mut b, &two, fp, LEASE).await.unwrap();
    assert!(matches!(took, StoreClaim::Acquired { .. }), "{took:?}");

    // A waits for B's row; B then asks for A's: a cycle, and InnoDB rolls one back.
    let store = db.store.clone();
    let (wants, key) = (two.clone(), one.clone());
    let waiting = tokio::spawn(async move {
        let answer = store.claim_in(&mut a, &wants, fp, LEASE).await;
        a.rollback().await.unwrap();
        answer
    });
    until_waiting_on_lock(&db.pool, a_id).await;
    let b_answer = db.store.claim_in(&mut b, &key, fp, LEASE).await;
    // The survivor's claim goes on once the victim's transaction is gone (InnoDB rolled
    // it back, locks and all): it acquires.
    let a_answer = waiting.await.unwrap();
    b.rollback().await.unwrap();
    let answers = [a_answer, b_answer];
    let victims: Vec<_> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    assert_eq!(victims.len(), 1, "{answers:?}");
    assert_eq!(number(victims[0]), Some(1213), "{answers:?}");
    assert!(answers.iter().any(|a| matches!(a, Ok(StoreClaim::Acquired { .. }))), "{answers:?}");
    db.drop_table().await;
}

/// A deadlock does not say whose the key is: here the claim of a key nobody holds waits
/// on a gap lock another transaction took for a different key.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_deadlock_over_the_gap_of_another_key_is_an_error() {
    let Some(db) = Db::new("gapdeadlock").await else { return };
    let (free, other) = (db.key(), db.key());
    let fp = Fingerprint::of(b"order");
    // A holds one of its own rows.
    let mut a = db.pool.begin().await.unwrap();
    let a_id = connection_id(&mut a).await;
    let sql = format!("INSERT INTO {} VALUES ('a-own')", db.orders);
    sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut *a).await.unwrap();
    // B is heavier (so InnoDB picks A as the victim) and locks the gap where `other`
    // would go, a key nobody has: a locking read of a row that does not exist.
    let mut b = db.pool.begin().await.unwrap();
    for n in 0..50 {
        let sql = format!("INSERT INTO {} VALUES ('b-{n}')", db.orders);
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut *b).await.unwrap();
    }
    let gap = sqlx::query("SELECT `key` FROM idemcache_records WHERE `key` = ? FOR UPDATE")
        .bind(other.as_bytes().to_vec());
    assert!(gap.fetch_optional(&mut *b).await.unwrap().is_none());
    // A claims `free`, a key nobody holds: its insert waits on B's gap lock.
    let store = db.store.clone();
    let key = free.clone();
    let waiting = tokio::spawn(async move {
        let answer = store.claim_in(&mut a, &key, fp, LEASE).await;
        let _ = a.rollback().await;
        answer
    });
    until_waiting_on_lock(&db.pool, a_id).await;
    // B then asks for A's own row: a cycle, A (lighter) rolled back.
    let sql = format!("SELECT k FROM {} WHERE k = 'a-own' FOR UPDATE", db.orders);
    let b_ran = sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut *b).await;
    let a_answer = waiting.await.unwrap();
    b.rollback().await.unwrap();
    assert!(b_ran.is_ok(), "B was the victim instead: {b_ran:?}");
    // Nobody ever held or claimed `free`.
    assert!(db.store.record(&free).await.unwrap().is_none());
    // So the claim says what happened, not that the key is someone else's.
    let a_answer = a_answer.unwrap_err();
    assert_eq!(number(&a_answer), Some(1213), "{a_answer:?}");
    db.drop_table().await;
}

/// What a waiting duplicate's claim answered, as the test of two waiters sees it.
#[derive(Debug, PartialEq)]
enum Waiter {
    Acquired,
    /// The deadlock's victim: InnoDB undid all of its transaction.
    Deadlocked,
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn duplicates_of_a_rolled_back_first_acquire_in_turn_or_deadlock() {
    let Some(db) = Db::new("waiters").await else { return };
    let key = db.key();
    let mut first = db.pool.begin().await.unwrap();
    db.execute(&mut first, &key, b"rolled back").await.unwrap();

    // Two duplicates queue on the first's row; one that acquires holds the key (its
    // transaction open) until told to let go.
    let (told, mut answers) = tokio::sync::mpsc::unbounded_channel();
    let mut duplicates: Vec<(u64, _, Option<tokio::sync::oneshot::Sender<()>>)> = Vec::new();
    for n in 0..2 {
        let mut conn = db.pool.acquire().await.unwrap();
        let id = connection_id(&mut conn).await;
        let (store, key, told) = (db.store.clone(), key.clone(), told.clone());
        let (let_go, go) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut tx = sqlx::Acquire::begin(&mut *conn).await.unwrap();
            match store.claim_in(&mut tx, &key, Fingerprint::of(b"order"), LEASE).await {
                Ok(StoreClaim::Acquired { .. }) => {
                    told.send((n, Waiter::Acquired)).unwrap();
                    let _ = go.await;
                }
                Err(e) if number(&e) == Some(1213) => told.send((n, Waiter::Deadlocked)).unwrap(),
                other => panic!("a duplicate of a rolled-back first answered {other:?}"),
            }
            tx.rollback().await.unwrap();
        });
        until_waiting_on_lock(&db.pool, id).await;
        duplicates.push((id, task, Some(let_go)));
    }
    first.rollback().await.unwrap();

    // The row went with the first, and both inserts race for it: one acquires; the other
    // then waits on it, or is the victim of a deadlock between the two (an error: all of
    // its transaction undone). Never two holders at once.
    let mut holder: Option<usize> = None;
    let mut outcomes = Vec::new();
    while outcomes.len() < 2 {
        let (n, answer) = match holder {
            // Someone holds the key: the other either answers (a deadlock) or waits.
            Some(h) => {
                let waiting = until_waiting_on_lock(&db.pool, duplicates[1 - h].0);
                tokio::select! {
                    told = answers.recv() => told.unwrap(),
                    () = waiting => {
                        // Queued behind the holder: let the holder go, and it acquires.
                        duplicates[h].2.take().unwrap().send(()).unwrap();
                        answers.recv().await.unwrap()
                    }
                }
            }
            None => answers.recv().await.unwrap(),
        };
        if answer == Waiter::Acquired {
            assert!(holder.is_none() || duplicates[holder.unwrap()].2.is_none(), "two holders");
            holder = Some(n);
        }
        outcomes.push(answer);
    }
    for (_, task, let_go) in duplicates {
        drop(let_go);
        task.await.unwrap();
    }
    assert!(outcomes.contains(&Waiter::Acquired), "{outcomes:?}");
    assert!(db.store.record(&key).await.unwrap().is_none(), "all rolled back: {outcomes:?}");
    db.drop_table().await;
}

/// A one-commit claim whose token was minted before the dead record it meets was
/// written (it waited on the record's row meanwhile) takes the record over under a
/// token minted again, above the record's: a key's tokens only grow on this path too.
#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn a_one_commit_takeover_mints_above_a_record_written_after_its_token() {
    let Some(db) = Db::new("remint").await else { return };
    let key = db.key();
    let held = db.store.claim(&key, Fingerprint::of(b"order"), LEASE).await.unwrap();
    assert!(matches!(held, StoreClaim::Acquired { .. }), "{held:?}");
    // The record's row held by another transaction; the one-commit claim queued on it.
    let mut blocker = db.pool.begin().await.unwrap();
    sqlx::query("SELECT token FROM idemcache_records WHERE `key` = ? FOR UPDATE")
        .bind(key.as_bytes())
        .fetch_one(&mut *blocker)
        .await
        .unwrap();
    let (id, claim) = db.duplicate(&key).await;
    until_waiting_on_lock(&db.pool, id).await;
    // A token minted after the queued claim's (another key's claim), and the record left
    // dead under it, as a later claim whose lease ran out leaves it.
    let later = db.store.claim(&db.key(), Fingerprint::of(b"order"), LEASE).await.unwrap();
    let StoreClaim::Acquired { token: later, .. } = later else { panic!("{later:?}") };
    sqlx::query(
        "UPDATE idemcache_records SET token = ?, expires_at = expires_at - 3600000000 \
         WHERE `key` = ?",
    )
    .bind(later.get() as i64)
    .bind(key.as_bytes())
    .execute(&mut *blocker)
    .await
    .unwrap();
    blocker.commit().await.unwrap();
    match claim.await.unwrap() {
        StoreClaim::Acquired { token, took_over, .. } => {
            assert!(took_over, "the dead record was PROCESSING");
            assert!(token > later, "{token:?} at or below the dead record's {later:?}");
        }
        other => panic!("taken over: {other:?}"),
    }
    db.drop_table().await;
}
