//! A reconcile verdict names its execution by the record's token: a listed lapse taken
//! over by a `TakeOver` handle (a new execution, a new token) is never settled by the
//! verdict about the lapse; a row whose token is out of range or not an integer lists
//! as `Corrupt` naming its key, or round-trips exactly, never panics.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idemcache::store::{block_on, Store, StoreClaim, StoreError};
use idemcache::{Fingerprint, Key, LapsePolicy};
use idemcache_sqlite::rusqlite::functions::FunctionFlags;
use idemcache_sqlite::rusqlite::{params, Connection, ToSql};
use idemcache_sqlite::SqliteStore;

mod common;
use common::TempDb;

const T0: i64 = 1_800_000_000_000_000;
const SEC: i64 = 1_000_000;

fn pin(conn: &Connection, clock: &Arc<AtomicI64>) {
    let clock = clock.clone();
    conn.create_scalar_function("unixepoch", 1, FunctionFlags::SQLITE_UTF8, move |_| {
        Ok(clock.load(Ordering::SeqCst) as f64 / 1e6)
    })
    .unwrap();
}

fn key(k: &str) -> Key {
    Key::without_tenant("reconcile-token-test", k).unwrap()
}

/// Under `MarkUnknown` a lapse is listed before anyone turns it; a `TakeOver` handle
/// on the same file then takes the key over (a new execution) and marks it UNKNOWN
/// within the same second: the verdict about the lapse settles neither.
#[test]
fn a_listed_lapse_taken_over_is_never_settled_by_its_verdict() {
    let file = TempDb::new("reconcile-tokens", "taken-over");
    let clock = Arc::new(AtomicI64::new(T0));
    let open = || {
        let conn = file.open("wal", Duration::from_millis(500));
        pin(&conn, &clock);
        conn
    };
    let marking = SqliteStore::from_connection(open())
        .with_lapse_policy(LapsePolicy::MarkUnknown { ttl: Duration::from_secs(3600) })
        .unwrap();
    block_on(marking.ensure_schema()).unwrap();
    let taking = SqliteStore::from_connection(open());
    let k = key("lapse");
    let fp = Fingerprint::of(b"r");
    let lapsed = match block_on(marking.claim(&k, fp, Duration::from_secs(1))).unwrap() {
        StoreClaim::Acquired { token, .. } => token,
        other => panic!("{other:?}"),
    };
    clock.fetch_add(2 * SEC, Ordering::SeqCst);
    let listed = block_on(marking.list_unknown(10)).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].token, lapsed);
    let token = match block_on(taking.claim(&k, fp, Duration::from_secs(1))).unwrap() {
        StoreClaim::Acquired { token, .. } => token,
        other => panic!("a TakeOver handle takes over the lapse: {other:?}"),
    };
    block_on(taking.mark_unknown(&k, token, Duration::from_secs(3600))).unwrap();
    let refused = block_on(marking.resolve_listed(&listed[0], Some(Bytes::from("x")), SEC_TTL));
    assert!(matches!(refused, Err(StoreError::NothingToSettle(_))), "{refused:?}");
    let refused = block_on(marking.forget_listed(&listed[0]));
    assert!(matches!(refused, Err(StoreError::NothingToSettle(_))), "{refused:?}");
    let now = block_on(marking.list_unknown(10)).unwrap();
    assert_eq!(now.len(), 1);
    assert_eq!(now[0].token, token);
}

const SEC_TTL: Duration = Duration::from_secs(60);

/// UNKNOWN rows of a damaged file with every kind of token: a negative one and the
/// largest one round-trip (the verdict settles exactly that row); a real, a text and a
/// NULL list as `Corrupt` naming the key. Nothing panics.
#[test]
fn tokens_out_of_range_or_not_integers_are_corrupt_or_exact() {
    let cases: [(&str, &dyn ToSql, bool); 5] = [
        ("negative", &-5i64, true),
        ("largest", &i64::MAX, true),
        ("real", &1.5f64, false),
        ("text", &"abc", false),
        ("null", &None::<i64>, false),
    ];
    for (name, token, readable) in cases {
        let file = TempDb::new("reconcile-tokens", name);
        let conn = file.open("wal", Duration::from_millis(200));
        conn.execute_batch(
            "CREATE TABLE idemcache_records (key BLOB PRIMARY KEY, fingerprint BLOB,
             state INTEGER, token INTEGER, body BLOB, started_at INTEGER,
             settled_at INTEGER, expires_at INTEGER) WITHOUT ROWID;",
        )
        .unwrap();
        let clock = Arc::new(AtomicI64::new(T0));
        pin(&conn, &clock);
        let store = SqliteStore::from_connection(conn);
        block_on(store.ensure_schema()).unwrap();
        let admin = file.open("wal", Duration::from_millis(200));
        let fp = Fingerprint::of(b"r").to_bytes().to_vec();
        admin
            .execute(
                "INSERT INTO idemcache_records
                     (key, fingerprint, state, token, body, started_at, settled_at, expires_at)
                 VALUES (?1, ?2, 3, ?3, NULL, ?4, ?4, ?5)",
                params![key(name).as_bytes(), fp, token, T0 - SEC, T0 + 100 * SEC],
            )
            .unwrap();
        match block_on(store.list_unknown(10)) {
            Ok(listed) if readable => {
                assert_eq!(listed.len(), 1, "{name}");
                block_on(store.forget_listed(&listed[0])).unwrap();
                assert!(block_on(store.list_unknown(10)).unwrap().is_empty(), "{name}");
            }
            Err(StoreError::Corrupt(why)) if !readable => {
                assert!(why.contains(name), "{name}: {why}")
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}
