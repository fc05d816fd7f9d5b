//! The unique-violation classifiers against real engines: only a duplicate key (primary
//! or `UNIQUE`) answers true; `NOT NULL`, `CHECK` and foreign-key failures do not.
//! MariaDB/MySQL through sqlx and mysql_async when `IDEMCACHE_MYSQL_URL` is set, and
//! PostgreSQL through sqlx when `IDEMCACHE_POSTGRES_URL` is; skipped with a printed reason
//! otherwise (CI sets both).

use idemcache::store::unique::{is_unique_violation_mysql_async, is_unique_violation_sqlx};
use mysql_async::prelude::Queryable;

fn url(var: &str, example: &str) -> Option<String> {
    let url = std::env::var(var).ok();
    if url.is_none() {
        eprintln!("skipped: set {var} (e.g. {example}) to run this test");
    }
    url
}

/// A table of this process's own, so concurrent runs never meet.
fn table() -> String {
    format!("idemcache_unique_{}", std::process::id())
}

/// The statements each engine's table is probed with: (SQL, is it a unique violation).
fn probes(table: &str) -> Vec<(String, bool)> {
    vec![
        (format!("INSERT INTO {table} (id, u, n, c, p) VALUES (2, 'a', 'x', 1, 1)"), true),
        (format!("INSERT INTO {table} (id, u, n, c, p) VALUES (1, 'b', 'x', 1, 1)"), true),
        (format!("INSERT INTO {table} (id, u, n, c, p) VALUES (3, 'c', NULL, 1, 1)"), false),
        (format!("INSERT INTO {table} (id, u, n, c, p) VALUES (4, 'd', 'x', 0, 1)"), false),
        (format!("INSERT INTO {table} (id, u, n, c, p) VALUES (5, 'e', 'x', 1, 99)"), false),
        (format!("INSERT INTO {table}_nowhere VALUES (1)"), false),
    ]
}

fn schema(table: &str, engine: &str) -> Vec<String> {
    vec![
        format!("DROP TABLE IF EXISTS {table}"),
        format!("DROP TABLE IF EXISTS {table}_parent"),
        format!("CREATE TABLE {table}_parent (id INT PRIMARY KEY){engine}"),
        format!("INSERT INTO {table}_parent VALUES (1)"),
        format!(
            "CREATE TABLE {table} (id INT PRIMARY KEY, u VARCHAR(10) UNIQUE, n VARCHAR(10) NOT NULL, \
             c INT CHECK (c > 0), p INT REFERENCES {table}_parent (id)){engine}"
        ),
        format!("INSERT INTO {table} (id, u, n, c, p) VALUES (1, 'a', 'x', 1, 1)"),
    ]
}

fn cleanup(table: &str) -> Vec<String> {
    vec![format!("DROP TABLE {table}"), format!("DROP TABLE {table}_parent")]
}

/// The probes through one sqlx connection type (a macro: sqlx's executor bounds are
/// per database).
macro_rules! sqlx_engine {
    ($connection:ty, $url:expr, $engine:expr) => {{
        use sqlx::Connection;
        let table = format!("{}_sqlx", table());
        let mut db = <$connection>::connect($url).await.unwrap();
        for sql in schema(&table, $engine) {
            sqlx::raw_sql(&sql).execute(&mut db).await.unwrap();
        }
        for (sql, unique) in probes(&table) {
            let error = sqlx::raw_sql(&sql).execute(&mut db).await.unwrap_err();
            assert_eq!(is_unique_violation_sqlx(&error), unique, "{sql}: {error}");
        }
        for sql in cleanup(&table) {
            sqlx::raw_sql(&sql).execute(&mut db).await.unwrap();
        }
    }};
}

#[tokio::test]
async fn sqlx_against_mariadb() {
    let Some(url) = url("IDEMCACHE_MYSQL_URL", "mysql://root@127.0.0.1:3306/test") else { return };
    // InnoDB: the engine that checks foreign keys.
    sqlx_engine!(sqlx::MySqlConnection, &url, " ENGINE=InnoDB");
}

#[tokio::test]
async fn sqlx_against_postgres() {
    let Some(url) = url("IDEMCACHE_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test") else {
        return;
    };
    sqlx_engine!(sqlx::PgConnection, &url, "");
}

#[tokio::test]
async fn mysql_async_against_mariadb() {
    let Some(url) = url("IDEMCACHE_MYSQL_URL", "mysql://root@127.0.0.1:3306/test") else { return };
    let table = format!("{}_mysql_async", table());
    let pool = mysql_async::Pool::new(url.as_str());
    let mut db = pool.get_conn().await.unwrap();
    for sql in schema(&table, " ENGINE=InnoDB") {
        db.query_drop(sql).await.unwrap();
    }
    for (sql, unique) in probes(&table) {
        let error = db.query_drop(&sql).await.unwrap_err();
        assert_eq!(is_unique_violation_mysql_async(&error), unique, "{sql}: {error}");
    }
    for sql in cleanup(&table) {
        db.query_drop(sql).await.unwrap();
    }
    drop(db);
    pool.disconnect().await.unwrap();
}
