//! The conformance suite (`idemcache::store::conformance`) over SQLite: in memory, on a
//! file shared by two stores (as two processes share it: each sees the other's records
//! and tokens, and a store opened again replays and issues larger tokens), and under
//! `LapsePolicy::MarkUnknown` (a lapsed lease is never re-run). Needs nothing
//! installed; runs without an async runtime.

use std::time::Duration;

use idemcache::store::block_on;
use idemcache::store::conformance::{self, acquire, fp, key, LEASE, TTL};
use idemcache::store::{Store, StoreClaim};
use idemcache::{Bytes, LapsePolicy};
use idemcache_sqlite::SqliteStore;

mod common;
use common::TempDb;

/// How long the `MarkUnknown` store keeps a lapsed lease UNKNOWN.
const UNKNOWN_TTL: Duration = Duration::from_secs(3600);

/// A store on the SQLite file `url`.
async fn open(url: &str) -> SqliteStore {
    SqliteStore::connect(url).await.unwrap()
}

#[test]
fn sqlite_in_memory_conforms() {
    block_on(async {
        let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
        store.ensure_schema().await.unwrap();
        store.ensure_schema().await.unwrap(); // idempotent
        conformance::run(&store).await;
    });
}

#[test]
fn sqlite_under_mark_unknown_never_re_runs_a_lapsed_lease() {
    block_on(async {
        let store = SqliteStore::connect("sqlite::memory:")
            .await
            .unwrap()
            .with_lapse_policy(LapsePolicy::MarkUnknown { ttl: UNKNOWN_TTL })
            .unwrap();
        store.ensure_schema().await.unwrap();
        assert_eq!(store.lapse_policy(), LapsePolicy::MarkUnknown { ttl: UNKNOWN_TTL });
        conformance::run_mark_unknown(&store, UNKNOWN_TTL, true).await;
        conformance::reconcile_as_checked(&store).await;
    });
}

#[test]
fn two_sqlite_stores_on_one_file_share_records_and_tokens() {
    block_on(async {
        let file = TempDb::new("conformance", "shared");
        let url = file.url();
        let (a, b) = (open(&url).await, open(&url).await);
        a.ensure_schema().await.unwrap();
        b.ensure_schema().await.unwrap();
        conformance::run(&a).await;
        let k = key("shared");
        let token = acquire(&a, &k).await;
        assert!(matches!(
            b.claim(&k, fp("r"), LEASE).await.unwrap(),
            StoreClaim::InProgress { .. }
        ));
        a.complete(&k, token, Some(Bytes::from_static(b"once")), TTL).await.unwrap();
        match b.claim(&k, fp("r"), LEASE).await.unwrap() {
            StoreClaim::Completed(replay) => assert_eq!(replay.body.unwrap(), "once"),
            other => panic!("{other:?}"),
        }
        // A restarted store (a new connection) replays and issues larger tokens.
        drop((a, b));
        let restarted = open(&url).await;
        assert!(matches!(
            restarted.claim(&k, fp("r"), LEASE).await.unwrap(),
            StoreClaim::Completed(_)
        ));
        assert!(acquire(&restarted, &key("after-restart")).await > token);
    });
}
