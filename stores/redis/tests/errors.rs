//! What the Redis store answers when Redis holds what it cannot read, or cannot be
//! reached: records that do not read (fields missing or garbled, a key of another
//! type), an UNKNOWN index of another type, a reply that is not RESP, a server nobody
//! listens on. Each is a typed error (`Corrupt` naming its key, or `Backend` naming
//! the server), never a panic, never a record taken over; listing and purging go on
//! past what does not read. Skipped without `IDEMCACHE_REDIS_STORE_URL`, but for the
//! fake server's test, which needs no Redis.

use idemcache::store::conformance::{acquire, fp, key, LEASE, TTL};
use idemcache::store::{Store, StoreError};
use idemcache::{Bytes, Key};
use idemcache_redis::{redis, RedisStore};

mod common;
use common::{bucket, record_key, store_apart, SERIAL};

/// Records the store cannot read: an UNKNOWN hash that lost its mark time beside a
/// valid one, a record key holding a string (WRONGTYPE), a garbled token. Each is
/// `Corrupt` naming its key (never a panic in the client, never `Backend`), and
/// purging keeps working past it.
#[tokio::test]
#[ignore = "needs IDEMCACHE_REDIS_STORE_URL"]
async fn records_the_store_cannot_read_are_corrupt_not_a_panic() {
    let _serial = SERIAL.lock().await;
    let Some((store, mut admin, _one_at_a_time)) = store_apart().await else { return };
    let (good, bad) = (key("good"), key("bad"));
    for k in [&good, &bad] {
        let token = acquire(&store, k).await;
        store.mark_unknown(k, token, TTL).await.unwrap();
    }
    let _: () = redis::cmd("HDEL")
        .arg(record_key(&bad))
        .arg("settled")
        .query_async(&mut admin)
        .await
        .unwrap();
    match store.list_unknown(10).await {
        Err(StoreError::Corrupt(why)) => assert!(why.contains("\"bad\""), "{why}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(store.purge_expired(100).await.unwrap(), 0, "both records are live");
    store.forget(&bad).await.unwrap();
    let listed = store.list_unknown(10).await.unwrap();
    assert_eq!(listed.iter().map(|u| &u.key).collect::<Vec<_>>(), [&good]);

    let wrong = key("a-string");
    let _: () =
        redis::cmd("SET").arg(record_key(&wrong)).arg("x").query_async(&mut admin).await.unwrap();
    match store.claim(&wrong, fp("r"), LEASE).await {
        Err(StoreError::Corrupt(_)) => {}
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let garbled = key("garbled-token");
    acquire(&store, &garbled).await;
    let _: () = redis::cmd("HSET")
        .arg(record_key(&garbled))
        .arg("token")
        .arg("not-a-number")
        .query_async(&mut admin)
        .await
        .unwrap();
    match store.claim(&garbled, fp("r"), LEASE).await {
        Err(StoreError::Corrupt(why)) => assert!(why.contains("garbled-token"), "{why}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

async fn hset(admin: &mut redis::aio::MultiplexedConnection, k: &Key, field: &str, v: &str) {
    let _: () =
        redis::cmd("HSET").arg(record_key(k)).arg(field).arg(v).query_async(admin).await.unwrap();
}

async fn hdel(admin: &mut redis::aio::MultiplexedConnection, k: &Key, field: &str) {
    let _: () = redis::cmd("HDEL").arg(record_key(k)).arg(field).query_async(admin).await.unwrap();
}

fn corrupt_naming<T: std::fmt::Debug>(result: Result<T, StoreError>, name: &str) {
    match result {
        Err(StoreError::Corrupt(why)) => assert!(why.contains(name), "{why}"),
        other => panic!("{name}: expected Corrupt, got {other:?}"),
    }
}

/// A record whose state or expiry is garbled or missing is `Corrupt`, never taken
/// for absent: claimed again, it would run the request a second time and overwrite
/// the result (state 0 read as the script's own "acquired" every time).
#[tokio::test]
#[ignore = "needs IDEMCACHE_REDIS_STORE_URL"]
async fn a_garbled_record_is_never_taken_over() {
    let _serial = SERIAL.lock().await;
    let Some((store, mut admin, _one_at_a_time)) = store_apart().await else { return };
    let garblings: [(&str, Option<&str>); 7] = [
        ("state", Some("two")),
        ("state", Some("0")),
        ("state", Some("1.5")),
        ("state", None),
        ("expires", Some("soon")),
        ("expires", Some("1e19")),
        ("expires", None),
    ];
    for (i, (field, value)) in garblings.into_iter().enumerate() {
        let k = key(&format!("garbled-{i}"));
        let token = acquire(&store, &k).await;
        store.complete(&k, token, Some(Bytes::from_static(b"first")), TTL).await.unwrap();
        match value {
            Some(v) => hset(&mut admin, &k, field, v).await,
            None => hdel(&mut admin, &k, field).await,
        }
        corrupt_naming(store.claim(&k, fp("r"), LEASE).await, &format!("garbled-{i}"));
        let body: Vec<u8> = redis::cmd("HGET")
            .arg(record_key(&k))
            .arg("body")
            .query_async(&mut admin)
            .await
            .unwrap();
        assert_eq!(body, b"first", "{field} = {value:?}: the result was overwritten");
    }
}

/// A record whose expiry is garbled: every write on it is `Corrupt` naming the key
/// (the scripts failed, as `Backend`, comparing a number with nil), and listing and
/// purging are not stopped by it for every other key: the listing names it and how
/// to clear it, purging goes on.
#[tokio::test]
#[ignore = "needs IDEMCACHE_REDIS_STORE_URL"]
async fn writes_on_a_garbled_record_are_corrupt_and_purging_goes_on() {
    let _serial = SERIAL.lock().await;
    let Some((store, mut admin, _one_at_a_time)) = store_apart().await else { return };
    let held = key("held-garbled");
    let token = acquire(&store, &held).await;
    hset(&mut admin, &held, "expires", "soon").await;
    corrupt_naming(store.extend_lease(&held, token, LEASE).await, "held-garbled");
    corrupt_naming(store.complete(&held, token, None, TTL).await, "held-garbled");
    corrupt_naming(store.release(&held, token).await, "held-garbled");
    corrupt_naming(store.mark_unknown(&held, token, TTL).await, "held-garbled");
    // Its refused mark left an index member, stale once the record is gone.
    let _: () = redis::cmd("DEL").arg(record_key(&held)).query_async(&mut admin).await.unwrap();

    let (good, bad) = (key("fine"), key("unknown-garbled"));
    for k in [&good, &bad] {
        let token = acquire(&store, k).await;
        store.mark_unknown(k, token, TTL).await.unwrap();
    }
    hset(&mut admin, &bad, "expires", "soon").await;
    corrupt_naming(store.resolve(&bad, None, TTL).await, "unknown-garbled");
    corrupt_naming(store.forget(&bad).await, "unknown-garbled");
    match store.list_unknown(10).await {
        Err(StoreError::Corrupt(why)) => {
            assert!(why.contains("unknown-garbled") && why.contains("delete the Redis key"))
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // The listing trims the stale members it reads, bucket by bucket, and stops at
    // the garbled record: the stale member of `held` is trimmed by it or, when its
    // bucket comes later (buckets follow the run's keys), by this purge.
    assert!(store.purge_expired(100).await.unwrap() <= 1);
    assert_eq!(store.purge_expired(100).await.unwrap(), 0);
    // A record key holding a list: named, and purging goes on.
    let listy = key("a-list");
    let token = acquire(&store, &listy).await;
    store.mark_unknown(&listy, token, TTL).await.unwrap();
    let _: () = redis::cmd("DEL").arg(record_key(&listy)).query_async(&mut admin).await.unwrap();
    let _: () =
        redis::cmd("RPUSH").arg(record_key(&listy)).arg("x").query_async(&mut admin).await.unwrap();
    corrupt_naming(store.forget(&listy).await, "a-list");
    assert_eq!(store.purge_expired(100).await.unwrap(), 0);
    // Cleared as the listing says, the rest is listed.
    for k in [&bad, &listy] {
        let _: () = redis::cmd("DEL").arg(record_key(k)).query_async(&mut admin).await.unwrap();
    }
    let listed = store.list_unknown(10).await.unwrap();
    assert_eq!(listed.iter().map(|u| &u.key).collect::<Vec<_>>(), [&good]);
}

/// The UNKNOWN index itself holding another type (another program's key): listing
/// and purging are `Corrupt`, not `Backend` (the server answered; retrying will not
/// help).
#[tokio::test]
#[ignore = "needs IDEMCACHE_REDIS_STORE_URL"]
async fn an_index_of_another_type_is_corrupt() {
    let _serial = SERIAL.lock().await;
    let Some((store, mut admin, _one_at_a_time)) = store_apart().await else { return };
    let _: () = redis::cmd("SET").arg(bucket(0)).arg("x").query_async(&mut admin).await.unwrap();
    assert!(matches!(store.list_unknown(10).await, Err(StoreError::Corrupt(_))));
    assert!(matches!(store.purge_expired(10).await, Err(StoreError::Corrupt(_))));
}

#[tokio::test]
async fn an_unreachable_redis_is_a_typed_error() {
    let _serial = SERIAL.lock().await;
    match RedisStore::connect("redis://127.0.0.1:1/0").await {
        Err(e @ StoreError::Backend(_)) => {
            let said = e.to_string();
            assert!(said.contains("Redis at 127.0.0.1:1"), "names the server: {said}");
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
}

/// A reply that does not parse on the wire (another service on the port, a broken
/// stream) is the server failing, `Backend` (503, retry), never `Corrupt` ("fix the
/// record"): with redis 1.x a parse error of the wire and one of a reply's fields share
/// one kind, so replies are read apart from the wire. A fake server that answers `+OK`
/// to every command and bytes that are not RESP to scripts; no Redis needed.
#[tokio::test]
async fn a_reply_that_is_not_resp_is_backend_not_corrupt() {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            std::thread::spawn(move || {
                let mut out = conn.try_clone().unwrap();
                let mut commands = BufReader::new(conn);
                loop {
                    let mut line = String::new();
                    if commands.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let n: usize = line.trim_start_matches('*').trim().parse().unwrap_or(0);
                    let mut args = Vec::new();
                    for _ in 0..n {
                        let mut len = String::new();
                        commands.read_line(&mut len).unwrap();
                        let len: usize = len.trim_start_matches('$').trim().parse().unwrap();
                        let mut arg = vec![0; len + 2];
                        commands.read_exact(&mut arg).unwrap();
                        arg.truncate(len);
                        args.push(String::from_utf8_lossy(&arg).to_uppercase());
                    }
                    let reply: &[u8] = match args.first().map(String::as_str) {
                        Some("EVALSHA" | "EVAL") => b"?this is not RESP\r\n",
                        _ => b"+OK\r\n",
                    };
                    if out.write_all(reply).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let url = format!("redis://127.0.0.1:{port}/0");
    let store = RedisStore::connect(&url).await.unwrap();
    let got = store.claim(&key("garbled-wire"), fp("r"), LEASE).await;
    assert!(matches!(got, Err(StoreError::Backend(_))), "{got:?}");
}

/// The record reads name what they cannot read: a record key holding a string is
/// `Corrupt` to `record`; a key of the records' pattern whose name is not a record's
/// (not hex, or hex that is not an idemcache key) fails `records` naming it, never
/// skipped silently; a listing of a scope matches that scope's keys only, and is not
/// stopped by them.
#[tokio::test]
#[ignore = "needs IDEMCACHE_REDIS_STORE_URL"]
async fn record_reads_name_what_they_cannot_read() {
    use idemcache::store::{RecordFilter, RecordState};
    let _serial = SERIAL.lock().await;
    let Some((store, mut admin, _one_at_a_time)) = store_apart().await else { return };
    let fine = key("fine");
    let token = acquire(&store, &fine).await;
    store.complete(&fine, token, None, TTL).await.unwrap();
    let wrong = key("a-string");
    let _: () =
        redis::cmd("SET").arg(record_key(&wrong)).arg("x").query_async(&mut admin).await.unwrap();
    assert!(matches!(store.record(&wrong).await, Err(StoreError::Corrupt(_))));
    let removed = store.remove_record(&wrong, &RecordState::ALL).await;
    assert!(matches!(removed, Err(StoreError::Corrupt(_))), "{removed:?}");
    let _: () = redis::cmd("DEL").arg(record_key(&wrong)).query_async(&mut admin).await.unwrap();
    let every = RecordFilter::new();
    assert_eq!(store.records(&every, None, 10).await.unwrap().len(), 1);
    for foreign in [&b"idemcache:{ff00}"[..], b"idemcache:{not-hex}", b"idemcache:{\xffzz}"] {
        let _: () = redis::cmd("HSET")
            .arg(foreign)
            .arg("state")
            .arg(2)
            .query_async(&mut admin)
            .await
            .unwrap();
        match store.records(&every, None, 10).await {
            Err(StoreError::Corrupt(why)) => {
                let named = ["ff00", "not-hex", "zz"].iter().any(|name| why.contains(name));
                assert!(named, "{why}")
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        let theirs = RecordFilter::new().scope(fine.scope());
        assert_eq!(store.records(&theirs, None, 10).await.unwrap().len(), 1);
        let _: () = redis::cmd("DEL").arg(foreign).query_async(&mut admin).await.unwrap();
    }
}
