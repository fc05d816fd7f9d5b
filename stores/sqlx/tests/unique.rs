//! The sqlx classifier against real engines: only a duplicate key (primary or `UNIQUE`)
//! answers true; `NOT NULL`, `CHECK` and foreign-key failures do not. The engine's own
//! code (`idemcache::store::unique`, what a user of any other driver classifies by:
//! MySQL's error number, PostgreSQL's SQLSTATE) agrees on every probe. MariaDB/MySQL
//! when `IDEMCACHE_MYSQL_URL` is set, PostgreSQL when `IDEMCACHE_POSTGRES_URL` is;
//! skipped with a printed reason otherwise (CI sets both).

use idemcache::store::conformance::unique::{cleanup, probes, schema, service_url, table};
use idemcache_sqlx::is_unique_violation;

/// The probes through one sqlx connection type (a macro: sqlx's executor bounds are
/// per database).
macro_rules! sqlx_engine {
    ($connection:ty, $url:expr, $engine:expr, $by_code:expr) => {{
        use sqlx::Connection;
        let table = format!("{}_sqlx", table());
        let mut db = <$connection>::connect($url).await.unwrap();
        for sql in schema(&table, $engine) {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone())).execute(&mut db).await.unwrap();
        }
        for (sql, unique) in probes(&table) {
            let error =
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone())).execute(&mut db).await.unwrap_err();
            assert_eq!(is_unique_violation(&error), unique, "{sql}: {error}");
            let by_code: fn(&dyn sqlx::error::DatabaseError) -> bool = $by_code;
            assert_eq!(by_code(error.as_database_error().unwrap()), unique, "{sql}: {error}");
        }
        for sql in cleanup(&table) {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone())).execute(&mut db).await.unwrap();
        }
    }};
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn sqlx_against_mariadb() {
    let Some(url) = service_url("IDEMCACHE_MYSQL_URL", "mysql://root@127.0.0.1:3306/test") else {
        return;
    };
    // InnoDB: the engine that checks foreign keys.
    sqlx_engine!(sqlx::MySqlConnection, &url, " ENGINE=InnoDB", |e| {
        let number = e.downcast_ref::<sqlx::mysql::MySqlDatabaseError>().number();
        idemcache::store::unique::is_unique_mysql_code(number)
    });
}

#[tokio::test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn sqlx_against_postgres() {
    let Some(url) =
        service_url("IDEMCACHE_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
    else {
        return;
    };
    sqlx_engine!(sqlx::PgConnection, &url, "", |e| {
        e.code().is_some_and(|code| idemcache::store::unique::is_unique_sqlstate(&code))
    });
}
