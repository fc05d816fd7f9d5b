//! The mysql_async classifier against a real MariaDB (or MySQL): only a duplicate key
//! (primary or `UNIQUE`) answers true; `NOT NULL`, `CHECK` and foreign-key failures do
//! not. Runs when `IDEMCACHE_MYSQL_URL` is set; skipped with a printed reason otherwise
//! (CI sets it).

use idemcache::store::conformance::unique::{cleanup, probes, schema, service_url, table};
use idemcache_mysql_async::is_unique_violation;
use mysql_async::prelude::Queryable;

#[tokio::test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
async fn mysql_async_against_mariadb() {
    let Some(url) = service_url("IDEMCACHE_MYSQL_URL", "mysql://root@127.0.0.1:3306/test") else {
        return;
    };
    let table = format!("{}_mysql_async", table());
    let pool = mysql_async::Pool::new(url.as_str());
    let mut db = pool.get_conn().await.unwrap();
    for sql in schema(&table, " ENGINE=InnoDB") {
        db.query_drop(sql).await.unwrap();
    }
    for (sql, unique) in probes(&table) {
        let error = db.query_drop(&sql).await.unwrap_err();
        assert_eq!(is_unique_violation(&error), unique, "{sql}: {error}");
    }
    for sql in cleanup(&table) {
        db.query_drop(sql).await.unwrap();
    }
    drop(db);
    pool.disconnect().await.unwrap();
}
