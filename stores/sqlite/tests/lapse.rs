//! The lapse setting of a SQLite store (`SqliteStore::lapse_policy`): `TakeOver` by
//! default, a `MarkUnknown` TTL checked; and two handles on one file under each policy
//! (as two processes configured apart), where a lapse the `MarkUnknown` handle turned
//! UNKNOWN stays UNKNOWN to the other. Runs without an async runtime.

use std::time::Duration;

use idemcache::store::block_on;
use idemcache::store::conformance::{self, fp, key, SHORT_LEASE};
use idemcache::store::{Store, StoreError};
use idemcache::LapsePolicy;
use idemcache_sqlite::SqliteStore;

mod common;
use common::TempDb;

/// How long the `MarkUnknown` handle keeps a lapsed lease UNKNOWN.
const UNKNOWN_TTL: Duration = Duration::from_secs(3600);

#[test]
fn a_lapse_setting_is_checked_and_take_over_stays_the_default() {
    block_on(async {
        let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
        assert_eq!(store.lapse_policy(), LapsePolicy::TakeOver);
        let refused =
            store.clone().with_lapse_policy(LapsePolicy::MarkUnknown { ttl: Duration::ZERO });
        assert!(matches!(refused, Err(StoreError::InvalidInput(_))), "{refused:?}");
        // TakeOver ignores the TTL.
        store.with_lapse_policy(LapsePolicy::TakeOver).unwrap();
    });
}

/// Two handles on one file, one under each policy (as two processes configured apart):
/// a lapse the `MarkUnknown` handle turned UNKNOWN is UNKNOWN to the `TakeOver` handle
/// too, and its purge keeps it. (A lapse nobody turned yet is the `TakeOver` handle's to
/// take over: the documented reason to configure every handle alike.)
#[test]
fn a_lapse_turned_unknown_is_unknown_to_a_take_over_handle_too() {
    block_on(async {
        let file = TempDb::new("lapse", "mixed");
        let url = file.url();
        let taking = SqliteStore::connect(&url).await.unwrap();
        taking.ensure_schema().await.unwrap();
        let marking = SqliteStore::connect(&url)
            .await
            .unwrap()
            .with_lapse_policy(LapsePolicy::MarkUnknown { ttl: UNKNOWN_TTL })
            .unwrap();
        let k = key("mixed");
        let idemcache::store::StoreClaim::Acquired { lease_ends_at, .. } =
            marking.claim(&k, fp("r"), SHORT_LEASE).await.unwrap()
        else {
            panic!("expected Acquired");
        };
        let turned = loop {
            match marking.claim(&k, fp("r"), SHORT_LEASE).await.unwrap() {
                idemcache::store::StoreClaim::InProgress { .. } => {
                    conformance::pause(Duration::from_millis(5)).await
                }
                other => break other,
            }
        };
        assert_eq!(turned, idemcache::store::StoreClaim::Unknown { marked_at: lease_ends_at });
        while taking.purge_expired(100).await.unwrap() == 100 {}
        assert_eq!(
            taking.claim(&k, fp("r"), SHORT_LEASE).await.unwrap(),
            idemcache::store::StoreClaim::Unknown { marked_at: lease_ends_at }
        );
    });
}
