//! rusqlite's classifier against a real SQLite: only a duplicate key (primary or
//! `UNIQUE`) answers true; `NOT NULL` and `CHECK` failures, and a statement on a table
//! that does not exist, do not.

use idemcache_sqlite::is_unique_violation;
use idemcache_sqlite::rusqlite::Connection;

#[test]
fn only_uniqueness_counts_in_a_real_sqlite() {
    let db = Connection::open_in_memory().unwrap();
    db.execute_batch(
        "CREATE TABLE t (id INTEGER PRIMARY KEY, u TEXT UNIQUE, n TEXT NOT NULL, c INTEGER CHECK (c > 0));
         INSERT INTO t VALUES (1, 'a', 'x', 1);",
    )
    .unwrap();
    let fails = |sql: &str| db.execute(sql, []).unwrap_err();
    assert!(is_unique_violation(&fails("INSERT INTO t VALUES (2, 'a', 'x', 1)")));
    assert!(is_unique_violation(&fails("INSERT INTO t VALUES (1, 'b', 'x', 1)")));
    assert!(!is_unique_violation(&fails("INSERT INTO t VALUES (3, 'c', NULL, 1)")));
    assert!(!is_unique_violation(&fails("INSERT INTO t VALUES (4, 'd', 'x', 0)")));
    assert!(!is_unique_violation(&fails("INSERT INTO nowhere VALUES (1)")));
}
