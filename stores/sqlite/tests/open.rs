//! Opening a SQLite store: the URLs `connect` reads (the scheme in any case, no
//! parameters: a query string is refused, never made part of the file's name), and a
//! store run from synchronous code with `block_on`.

use idemcache::store::conformance::{acquire, key, TTL};
use idemcache::store::{block_on, Store, StoreError};
use idemcache::Bytes;
use idemcache_sqlite::SqliteStore;

/// A query string (sqlx's `?mode=rwc`) is refused, not made part of the file's name;
/// the scheme is read in any case.
#[test]
fn a_sqlite_url_takes_no_parameters_and_any_case_of_scheme() {
    block_on(async {
        let dir = std::env::temp_dir().join(format!("idemcache-sqlite-url-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}/records.db?mode=rwc", dir.display());
        let refused = SqliteStore::connect(&url).await;
        assert!(matches!(refused, Err(StoreError::InvalidInput(_))), "{refused:?}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no file was made");
        let store = SqliteStore::connect(&format!("SQLite:{}/records.db", dir.display())).await;
        store.unwrap().ensure_schema().await.unwrap();
        assert!(dir.join("records.db").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    });
}

#[test]
fn sync_code_runs_a_sqlite_store_with_block_on() {
    let store = block_on(SqliteStore::connect("sqlite::memory:")).unwrap();
    block_on(store.ensure_schema()).unwrap();
    let k = key("sync");
    let token = block_on(acquire(&store, &k));
    block_on(store.complete(&k, token, Some(Bytes::from_static(b"done")), TTL)).unwrap();
}
