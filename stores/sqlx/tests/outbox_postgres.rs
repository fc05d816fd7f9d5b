//! The sqlx PostgreSQL outbox against a real server (`IDEMCACHE_POSTGRES_URL`; skipped
//! with a printed reason when unset): the suite both sqlx engines share
//! (`common::outbox_suite!`, the scenarios every driver runs plus a held row skipped),
//! and what is PostgreSQL's own: a commit notifies a `PgListener`, a duplicate id
//! aborts its transaction, and one table is shared with the tokio-postgres driver. Each
//! test works in a schema of its own, dropped at its end; time is a clock moved by hand.

#[macro_use]
mod common;

use std::sync::atomic::{AtomicU32, Ordering};

use idemcache::store::conformance::service_url;
use idemcache_sqlx::outbox::postgres;
use idemcache_sqlx::outbox::OutboxError;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{AssertSqlSafe, PgConnection, PgPool};

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

outbox_suite!(
    engine: idemcache_sqlx::outbox::postgres,
    conn: PgConnection,
    db: sqlx::Postgres,
    needs: "needs IDEMCACHE_POSTGRES_URL",
    spoil: "UPDATE idemcache_outbox SET headers = '\\x0009' WHERE message_id = 'bad-headers';
            UPDATE idemcache_outbox SET state = 9 WHERE message_id = 'bad-state';",
    count: "SELECT count(*) FROM idemcache_outbox WHERE state = $1",
    session: "SELECT pg_backend_pid()::int8",
    waiting: "SELECT count(*) FROM pg_locks WHERE pid::int8 = $1 AND NOT granted",
    key_seqs: "SELECT seq FROM idemcache_outbox WHERE aggregate_key = $1 ORDER BY seq",
    sleep: "SELECT pg_sleep(0.001)",
    raise: "UPDATE idemcache_outbox SET {} = 9223372036854775807 WHERE message_id = $1"
);

/// A commit notifies a `PgListener` on the outbox's channel; a duplicate id aborts its
/// transaction (PostgreSQL's rule); one table serves both drivers: enqueued by
/// tokio-postgres, claimed here, and back.
#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_commit_notifies_and_one_table_serves_both_drivers() {
    let Some(db) = Db::new("basic").await else { return };
    let mut c = db.conn().await;
    postgres::ensure_schema(&mut c).await.unwrap(); // idempotent
    let mut listener = PgListener::connect(&db.url).await.unwrap();
    listener.listen(postgres::CHANNEL).await.unwrap();
    put(&mut c, &[message("m-1")]).await;
    let heard = listener.recv().await.unwrap();
    assert_eq!(heard.channel(), postgres::CHANNEL);
    assert_eq!(ids(&claim_due(&mut c, 10, MIN, t0()).await.unwrap()), ["m-1"]);

    let mut tx = c.begin().await.unwrap();
    let e = enqueue(&mut tx, &message("m-1")).await.unwrap_err();
    assert!(matches!(&e, OutboxError::Duplicate(id) if id == "m-1"), "{e:?}");
    let after = enqueue(&mut tx, &message("m-2")).await;
    assert!(matches!(after, Err(OutboxError::Database(_))), "{after:?}");
    tx.rollback().await.unwrap();

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
