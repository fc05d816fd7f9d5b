//! The SQLite store's claim, and its first read (a live record is answered without the
//! write lock): boundaries pinned by SQLite's clock (`unixepoch` overridden on the store's
//! connection, so `expires_at == now` is exact, not raced); a live record answered while
//! another connection holds the write lock, and a claim that must write waiting it out,
//! failing typed and changing nothing; garbled rows `Corrupt`; another connection's
//! uncommitted change never answered (WAL, rollback journal, a shared cache with
//! `read_uncommitted`); many claimers of one key acquiring it once. (Written with an
//! adversarial review of the first read.)

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use idemcache::store::{block_on, Store, StoreClaim, StoreError};
use idemcache::{Fingerprint, Key, LapsePolicy};
use idemcache_sqlite::rusqlite::functions::FunctionFlags;
use idemcache_sqlite::rusqlite::{params, Connection, OpenFlags, ToSql};
use idemcache_sqlite::SqliteStore;

mod common;
use common::TempDb;

/// SQLite's clock on `conn` is `clock` (µs since the epoch; whole seconds, so the
/// store's `CAST(unixepoch('subsec') * 1000000 AS INTEGER)` reads it exactly).
fn pin(conn: &Connection, clock: &Arc<AtomicI64>) {
    let clock = clock.clone();
    conn.create_scalar_function("unixepoch", 1, FunctionFlags::SQLITE_UTF8, move |_| {
        Ok(clock.load(Ordering::SeqCst) as f64 / 1e6)
    })
    .unwrap();
}

const T0: i64 = 1_800_000_000_000_000;
const SEC: i64 = 1_000_000;

fn key(k: &str) -> Key {
    Key::without_tenant("claim-test", k).unwrap()
}

fn at(micros: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(micros as u64)
}

fn acquired(c: Result<StoreClaim, StoreError>) -> idemcache::FencingToken {
    match c {
        Ok(StoreClaim::Acquired { token, .. }) => token,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// A store on a WAL file whose clock is pinned; and a second connection to the file.
fn pinned_store(file: &TempDb, busy: Duration) -> (SqliteStore, Arc<AtomicI64>, Connection) {
    let clock = Arc::new(AtomicI64::new(T0));
    let conn = file.open("wal", busy);
    pin(&conn, &clock);
    let store = SqliteStore::from_connection(conn);
    block_on(store.ensure_schema()).unwrap();
    (store, clock, file.open("wal", busy))
}

/// A lease that ends exactly now has lapsed: TakeOver acquires it, and a claim must
/// take the write lock to do so (it never answers InProgress from the first read).
#[test]
fn a_lease_ending_exactly_now_is_not_live() {
    let file = TempDb::new("claim", "lease-now");
    let (store, clock, other) = pinned_store(&file, Duration::from_millis(200));
    let fp = Fingerprint::of(b"r");
    acquired(block_on(store.claim(&key("k"), fp, Duration::from_secs(10))));
    // One µs before the end: live, answered even while another connection writes.
    clock.store(T0 + 10 * SEC - 1, Ordering::SeqCst);
    other.execute_batch("BEGIN IMMEDIATE; CREATE TABLE held (x);").unwrap();
    match block_on(store.claim(&key("k"), fp, Duration::from_secs(10))) {
        Ok(StoreClaim::InProgress { lease_ends_at }) => {
            assert_eq!(lease_ends_at, at(T0 + 10 * SEC))
        }
        other => panic!("{other:?}"),
    }
    // Exactly the end: lapsed. The claim must write, so it waits for the lock and fails.
    clock.store(T0 + 10 * SEC, Ordering::SeqCst);
    match block_on(store.claim(&key("k"), fp, Duration::from_secs(10))) {
        Err(StoreError::Backend(_)) => {}
        other => panic!("a lapsed lease under a held lock: {other:?}"),
    }
    other.execute_batch("ROLLBACK").unwrap();
    match block_on(store.claim(&key("k"), fp, Duration::from_secs(10))) {
        Ok(StoreClaim::Acquired { lease_ends_at, .. }) => {
            assert_eq!(lease_ends_at, at(T0 + 20 * SEC))
        }
        other => panic!("a lease ending now is taken over: {other:?}"),
    }
}

/// A result whose TTL ends exactly now is not replayed: the key is acquired again.
#[test]
fn a_result_expiring_exactly_now_is_not_replayed() {
    let file = TempDb::new("claim", "result-now");
    let (store, clock, _other) = pinned_store(&file, Duration::from_millis(200));
    let fp = Fingerprint::of(b"r");
    let t = acquired(block_on(store.claim(&key("k"), fp, Duration::from_secs(10))));
    block_on(store.complete(&key("k"), t, Some(Bytes::from_static(b"x")), Duration::from_secs(5)))
        .unwrap();
    clock.store(T0 + 5 * SEC - 1, Ordering::SeqCst);
    assert!(matches!(
        block_on(store.claim(&key("k"), fp, Duration::from_secs(10))),
        Ok(StoreClaim::Completed(_))
    ));
    clock.store(T0 + 5 * SEC, Ordering::SeqCst);
    acquired(block_on(store.claim(&key("k"), fp, Duration::from_secs(10))));
}

/// MarkUnknown: a lease that ended exactly now is UNKNOWN (marked at its end), never
/// InProgress; one µs before, InProgress.
#[test]
fn under_mark_unknown_a_lease_ending_exactly_now_is_unknown() {
    let file = TempDb::new("claim", "mark-now");
    let (store, clock, other) = pinned_store(&file, Duration::from_millis(200));
    let store =
        store.with_lapse_policy(LapsePolicy::MarkUnknown { ttl: Duration::from_secs(60) }).unwrap();
    let fp = Fingerprint::of(b"r");
    acquired(block_on(store.claim(&key("k"), fp, Duration::from_secs(10))));
    clock.store(T0 + 10 * SEC - 1, Ordering::SeqCst);
    assert!(matches!(
        block_on(store.claim(&key("k"), fp, Duration::from_secs(10))),
        Ok(StoreClaim::InProgress { .. })
    ));
    clock.store(T0 + 10 * SEC, Ordering::SeqCst);
    other.execute_batch("BEGIN IMMEDIATE; CREATE TABLE held (x);").unwrap();
    match block_on(store.claim(&key("k"), fp, Duration::from_secs(10))) {
        Err(StoreError::Backend(_)) | Ok(StoreClaim::Unknown { .. }) => {}
        other => panic!("a lapsed lease under MarkUnknown, lock held: {other:?}"),
    }
    other.execute_batch("ROLLBACK").unwrap();
    match block_on(store.claim(&key("k"), fp, Duration::from_secs(10))) {
        Ok(StoreClaim::Unknown { marked_at }) => assert_eq!(marked_at, at(T0 + 10 * SEC)),
        other => panic!("{other:?}"),
    }
    // And it stays UNKNOWN through the first read (it is live now, as UNKNOWN).
    clock.store(T0 + 69 * SEC, Ordering::SeqCst);
    match block_on(store.claim(&key("k"), Fingerprint::of(b"other"), Duration::from_secs(10))) {
        Ok(StoreClaim::Mismatch) => {}
        other => panic!("{other:?}"),
    }
    match block_on(store.claim(&key("k"), fp, Duration::from_secs(10))) {
        Ok(StoreClaim::Unknown { marked_at }) => assert_eq!(marked_at, at(T0 + 10 * SEC)),
        other => panic!("{other:?}"),
    }
    clock.store(T0 + 70 * SEC, Ordering::SeqCst);
    acquired(block_on(store.claim(&key("k"), fp, Duration::from_secs(10))));
}

/// A row as a damaged file may hold it: its key's name, fingerprint, state, settled_at
/// and expires_at.
type Garbled<'a> = (&'a str, Vec<u8>, &'a dyn ToSql, &'a dyn ToSql, &'a dyn ToSql);

/// Rows the store cannot read, live or expired, are `Corrupt` naming the key: never a
/// panic, never an answer, never a takeover of a live one.
#[test]
fn garbled_rows_through_the_first_read_are_corrupt() {
    let file = TempDb::new("claim", "garbled");
    let clock = Arc::new(AtomicI64::new(T0));
    let conn = file.open("wal", Duration::from_millis(200));
    // The table without its constraints, as a damaged or hand-edited file may hold.
    conn.execute_batch(
        "CREATE TABLE idemcache_records (key BLOB PRIMARY KEY, fingerprint BLOB, state INTEGER,
         token INTEGER, body BLOB, started_at INTEGER, settled_at INTEGER, expires_at INTEGER)
         WITHOUT ROWID;",
    )
    .unwrap();
    pin(&conn, &clock);
    let store = SqliteStore::from_connection(conn);
    block_on(store.ensure_schema()).unwrap();
    let admin = file.open("wal", Duration::from_millis(200));
    let fp = Fingerprint::of(b"r");
    let good = fp.to_bytes().to_vec();
    let live = T0 + 10 * SEC;
    let rows: Vec<Garbled> = vec![
        ("state-7", good.clone(), &7i64, &None::<i64>, &live),
        ("state-text", good.clone(), &"done", &None::<i64>, &live),
        ("state-real", good.clone(), &2.5f64, &None::<i64>, &live),
        ("short-fp", vec![1, 2, 3], &2i64, &T0, &live),
        ("settled-text", good.clone(), &2i64, &"yesterday", &live),
        ("expires-text", good.clone(), &2i64, &T0, &"soon"),
        ("expires-huge", good.clone(), &2i64, &T0, &1e300f64),
        ("expires-null", good.clone(), &1i64, &None::<i64>, &None::<i64>),
        ("expired-state-text", good.clone(), &"x", &None::<i64>, &(T0 - 1)),
    ];
    for (name, fpv, state, settled, expires) in &rows {
        admin
            .execute(
                "INSERT INTO idemcache_records
                     (key, fingerprint, state, token, body, started_at, settled_at, expires_at)
                 VALUES (?1, ?2, ?3, 1, NULL, 0, ?4, ?5)",
                params![key(name).as_bytes(), fpv, state, settled, expires],
            )
            .unwrap();
    }
    for (name, ..) in &rows {
        match block_on(store.claim(&key(name), fp, Duration::from_secs(10))) {
            Err(StoreError::Corrupt(why)) => assert!(why.contains(name), "{name}: {why}"),
            other => panic!("{name}: expected Corrupt, got {other:?}"),
        }
    }
}

/// The record reads (`record`, `records`, `remove_record`) name a garbled row
/// `Corrupt` as a claim does, and a row whose key bytes are not an idemcache key
/// (another program's) by those bytes: `records` fails on the first one it scans, never
/// skipping it silently, and a listing whose filter leaves such rows out of its scan
/// (another scope's range) is not stopped by them.
#[test]
fn garbled_and_foreign_rows_are_corrupt_to_the_record_reads() {
    use idemcache::store::{RecordFilter, RecordState};
    let file = TempDb::new("claim", "garbled-reads");
    let clock = Arc::new(AtomicI64::new(T0));
    let conn = file.open("wal", Duration::from_millis(200));
    // The table without its constraints, as a damaged or hand-edited file may hold.
    conn.execute_batch(
        "CREATE TABLE idemcache_records (key BLOB PRIMARY KEY, fingerprint BLOB, state INTEGER,
         token INTEGER, body BLOB, started_at INTEGER, settled_at INTEGER, expires_at INTEGER)
         WITHOUT ROWID;",
    )
    .unwrap();
    pin(&conn, &clock);
    let store = SqliteStore::from_connection(conn);
    block_on(store.ensure_schema()).unwrap();
    let admin = file.open("wal", Duration::from_millis(200));
    let good = Fingerprint::of(b"r").to_bytes().to_vec();
    let live = T0 + 10 * SEC;
    let insert_with = |key: &[u8], fp: &[u8], state: i64, correlation_id: Option<&str>| {
        admin
            .execute(
                "INSERT INTO idemcache_records (key, fingerprint, state, token, body,
                     started_at, settled_at, expires_at, correlation_id)
                 VALUES (?1, ?2, ?3, 1, NULL, 0, ?4, ?5, ?6)",
                params![key, fp, state, T0, live, correlation_id],
            )
            .unwrap();
    };
    let insert = |key: &[u8], fp: &[u8], state: i64| insert_with(key, fp, state, None);
    insert(key("state-7").as_bytes(), &good, 7);
    insert(key("short-fp").as_bytes(), &[1, 2, 3], 2);
    insert(&[0xff, 0x00], &good, 2);
    insert_with(key("spaced-id").as_bytes(), &good, 2, Some("two words"));
    for name in ["state-7", "short-fp", "spaced-id"] {
        match block_on(store.record(&key(name))) {
            Err(StoreError::Corrupt(why)) => assert!(why.contains(name), "{name}: {why}"),
            other => panic!("{name}: expected Corrupt, got {other:?}"),
        }
        let removed = block_on(store.remove_record(&key(name), &RecordState::ALL));
        assert!(matches!(removed, Err(StoreError::Corrupt(_))), "{removed:?}");
    }
    let listed = block_on(store.records(&RecordFilter::new(), None, 10));
    assert!(matches!(listed, Err(StoreError::Corrupt(_))), "{listed:?}");
    // Past the garbled ones (key order), the foreign row is met and named by its bytes.
    let after = key("spaced-id");
    match block_on(store.records(&RecordFilter::new(), Some(&after), 10)) {
        Err(StoreError::Corrupt(why)) => assert!(why.contains("ff00"), "{why}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let elsewhere = RecordFilter::new().scope("another-scope");
    assert_eq!(block_on(store.records(&elsewhere, None, 10)).unwrap(), vec![]);
    assert_eq!(
        block_on(store.records(&RecordFilter::new().client_key("absent"), None, 10)).unwrap(),
        vec![]
    );
}

/// A row whose key SQLite holds as TEXT or as a number (written by hand: `INSERT ...
/// VALUES ('k', ...)`) sorts before every BLOB key, so a listing that started "after the
/// empty key" skipped it silently; it is named corrupt, as a foreign BLOB key is. A
/// listing of one scope's range is not stopped by it.
#[test]
fn a_row_whose_key_is_not_a_blob_is_corrupt_to_a_listing_never_skipped() {
    use idemcache::store::RecordFilter;
    let file = TempDb::new("claim", "text-key");
    let (store, _clock, admin) = pinned_store(&file, Duration::from_millis(200));
    let fine = key("fine");
    let token =
        acquired(block_on(store.claim(&fine, Fingerprint::of(b"r"), Duration::from_secs(10))));
    block_on(store.complete(&fine, token, None, Duration::from_secs(60))).unwrap();
    let good = Fingerprint::of(b"r").to_bytes().to_vec();
    for hand_written in [&"by-hand" as &dyn ToSql, &42_i64] {
        admin
            .execute(
                "INSERT INTO idemcache_records (key, fingerprint, state, token, body,
                     started_at, settled_at, expires_at)
                 VALUES (?1, ?2, 2, 1, NULL, 0, ?3, ?4)",
                params![hand_written, good, T0, T0 + 10 * SEC],
            )
            .unwrap();
        match block_on(store.records(&RecordFilter::new(), None, 10)) {
            Err(StoreError::Corrupt(why)) => assert!(why.contains("key"), "{why}"),
            other => panic!("expected Corrupt, got {other:?}"),
        }
        let theirs = RecordFilter::new().scope(fine.scope());
        assert_eq!(block_on(store.records(&theirs, None, 10)).unwrap().len(), 1);
        admin.execute("DELETE FROM idemcache_records WHERE typeof(key) <> 'blob'", []).unwrap();
    }
    assert_eq!(block_on(store.records(&RecordFilter::new(), None, 10)).unwrap().len(), 1);
}

/// Another connection completing every record (body `\x01`) in a transaction it leaves
/// open: a claim must never answer what it wrote.
const UNCOMMITTED_COMPLETION: &str =
    "BEGIN IMMEDIATE; UPDATE idemcache_records SET state = 2, body = x'01',
     settled_at = expires_at - 1, expires_at = expires_at + 100000000;";

/// Another connection mid-way through changing a row (its transaction not committed):
/// the first read answers the committed record, in WAL and rollback-journal mode alike.
#[test]
fn an_uncommitted_change_is_never_answered() {
    for journal in ["wal", "delete"] {
        let file = TempDb::new("claim", &format!("uncommitted-{journal}"));
        let store = SqliteStore::from_connection(file.open(journal, Duration::from_millis(200)));
        block_on(store.ensure_schema()).unwrap();
        let fp = Fingerprint::of(b"r");
        let t = acquired(block_on(store.claim(&key("k"), fp, Duration::from_secs(60))));
        let other = file.open(journal, Duration::from_millis(200));
        other.execute_batch(UNCOMMITTED_COMPLETION).unwrap();
        match block_on(store.claim(&key("k"), fp, Duration::from_secs(60))) {
            Ok(StoreClaim::InProgress { .. }) => {}
            other => panic!("{journal}: an uncommitted completion: {other:?}"),
        }
        other.execute_batch("ROLLBACK").unwrap();
        // Still the holder's: it completes.
        block_on(store.complete(&key("k"), t, None, Duration::from_secs(60))).unwrap();
    }
}

/// Rollback-journal mode: a writer holding EXCLUSIVE (a committing or spilled write
/// transaction) blocks readers, so even a live record's claim waits, then fails typed.
#[test]
fn rollback_journal_with_an_exclusive_writer_is_a_typed_error() {
    let file = TempDb::new("claim", "exclusive");
    let store = SqliteStore::from_connection(file.open("delete", Duration::from_millis(200)));
    block_on(store.ensure_schema()).unwrap();
    let fp = Fingerprint::of(b"r");
    acquired(block_on(store.claim(&key("k"), fp, Duration::from_secs(60))));
    let other = file.open("delete", Duration::from_millis(200));
    other.execute_batch("BEGIN EXCLUSIVE; CREATE TABLE held (x);").unwrap();
    match block_on(store.claim(&key("k"), fp, Duration::from_secs(60))) {
        Err(StoreError::Backend(_)) => {}
        other => panic!("{other:?}"),
    }
    other.execute_batch("ROLLBACK").unwrap();
    assert!(matches!(
        block_on(store.claim(&key("k"), fp, Duration::from_secs(60))),
        Ok(StoreClaim::InProgress { .. })
    ));
}

/// Shared cache with `read_uncommitted` (a connection configured by the application):
/// the first read would see another connection's uncommitted completion and replay it,
/// and the completion then roll back (the request never run); `from_connection` turns
/// `read_uncommitted` off.
#[test]
fn read_uncommitted_shared_cache_never_replays_an_uncommitted_completion() {
    let uri = format!("file:claim-shared-{}?mode=memory&cache=shared", std::process::id());
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_URI;
    let mine = Connection::open_with_flags(&uri, flags).unwrap();
    mine.execute_batch("PRAGMA read_uncommitted = 1").unwrap();
    let other = Connection::open_with_flags(&uri, flags).unwrap();
    let store = SqliteStore::from_connection(mine);
    block_on(store.ensure_schema()).unwrap();
    let fp = Fingerprint::of(b"r");
    acquired(block_on(store.claim(&key("k"), fp, Duration::from_secs(60))));
    other.execute_batch(UNCOMMITTED_COMPLETION).unwrap();
    let answer = block_on(store.claim(&key("k"), fp, Duration::from_secs(60)));
    other.execute_batch("ROLLBACK").unwrap();
    if let Ok(StoreClaim::Completed(r)) = answer {
        panic!("replayed an uncommitted completion (then rolled back): {r:?}")
    }
}

/// Many claimers of one key on one file (each its own connection, as processes are):
/// exactly one acquires, however the first reads and the write locks interleave; and
/// the holder's renewals, racing the pollers, all succeed.
#[test]
fn many_claimers_one_acquire_and_renewals_are_not_starved() {
    let file = TempDb::new("claim", "hammer");
    let setup = SqliteStore::from_connection(file.open("wal", Duration::from_secs(10)));
    block_on(setup.ensure_schema()).unwrap();
    let fp = Fingerprint::of(b"r");
    let stores: Vec<_> = (0..6)
        .map(|_| SqliteStore::from_connection(file.open("wal", Duration::from_secs(10))))
        .collect();
    let start = Arc::new(std::sync::Barrier::new(stores.len()));
    let handles: Vec<_> = stores
        .into_iter()
        .map(|s| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                let mut tokens = vec![];
                for _ in 0..300 {
                    match block_on(s.claim(&key("k"), fp, Duration::from_secs(30))).unwrap() {
                        StoreClaim::Acquired { token, .. } => {
                            tokens.push(token);
                            // Renew under the pollers' reads.
                            for _ in 0..50 {
                                block_on(s.extend_lease(&key("k"), token, Duration::from_secs(30)))
                                    .unwrap();
                            }
                        }
                        StoreClaim::InProgress { .. } => {}
                        other => panic!("{other:?}"),
                    }
                }
                tokens
            })
        })
        .collect();
    let tokens: Vec<_> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    assert_eq!(tokens.len(), 1, "{tokens:?}");
}

const LEASE: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(60);

#[test]
fn a_live_record_is_answered_while_another_connection_holds_the_write_lock() {
    let file = TempDb::new("claim", "locked");
    // A busy timeout long enough that a claim waiting for the lock is told apart from
    // one that did not wait; short enough that the write below fails soon.
    let store = SqliteStore::from_connection(file.open("wal", Duration::from_millis(300)));
    let (fp, other_fp) = (Fingerprint::of(b"request"), Fingerprint::of(b"another request"));
    block_on(async {
        store.ensure_schema().await.unwrap();
        let done = match store.claim(&key("done"), fp, LEASE).await.unwrap() {
            StoreClaim::Acquired { token, .. } => token,
            other => panic!("{other:?}"),
        };
        store.complete(&key("done"), done, Some(Bytes::from_static(b"result")), TTL).await.unwrap();
        let unknown = match store.claim(&key("unknown"), fp, LEASE).await.unwrap() {
            StoreClaim::Acquired { token, .. } => token,
            other => panic!("{other:?}"),
        };
        store.mark_unknown(&key("unknown"), unknown, TTL).await.unwrap();
        assert!(matches!(
            store.claim(&key("running"), fp, LEASE).await.unwrap(),
            StoreClaim::Acquired { .. }
        ));
    });

    let other = file.open("wal", Duration::from_millis(300));
    other.execute_batch("BEGIN IMMEDIATE; CREATE TABLE held (x);").unwrap();
    block_on(async {
        match store.claim(&key("done"), fp, LEASE).await.unwrap() {
            StoreClaim::Completed(replay) => {
                assert_eq!(replay.body.as_deref(), Some(&b"result"[..]))
            }
            other => panic!("a completed key under a held lock: {other:?}"),
        }
        assert!(matches!(
            store.claim(&key("running"), fp, LEASE).await.unwrap(),
            StoreClaim::InProgress { .. }
        ));
        assert!(matches!(
            store.claim(&key("unknown"), fp, LEASE).await.unwrap(),
            StoreClaim::Unknown { .. }
        ));
        assert!(matches!(
            store.claim(&key("done"), other_fp, LEASE).await.unwrap(),
            StoreClaim::Mismatch
        ));
        // A new key must write: it waits out the busy timeout and fails, typed.
        match store.claim(&key("new"), fp, LEASE).await {
            Err(StoreError::Backend(_)) => {}
            other => panic!("a new key under a held lock: {other:?}"),
        }
    });
    other.execute_batch("ROLLBACK").unwrap();
    block_on(async {
        // The failed claim left nothing: the key is new, and now acquired.
        assert!(matches!(
            store.claim(&key("new"), fp, LEASE).await.unwrap(),
            StoreClaim::Acquired { .. }
        ));
        assert!(matches!(
            store.claim(&key("done"), fp, LEASE).await.unwrap(),
            StoreClaim::Completed(_)
        ));
    });
}

/// The token counter's row deleted by hand: a claim that must acquire fails `Corrupt`
/// naming the table and the repair (it was `Backend`, "Query returned no rows"), and
/// changes nothing; once the row is back, above every token issued, claims acquire.
#[test]
fn a_lost_token_counter_row_is_corrupt_naming_its_table() {
    let file = TempDb::new("claim", "tokens");
    let store = SqliteStore::from_connection(file.open("wal", Duration::from_millis(200)));
    block_on(store.ensure_schema()).unwrap();
    let fp = Fingerprint::of(b"r");
    let first = acquired(block_on(store.claim(&key("before"), fp, Duration::from_secs(10))));
    let admin = file.open("wal", Duration::from_millis(200));
    admin.execute_batch("DELETE FROM idemcache_tokens").unwrap();
    let repair = match block_on(store.claim(&key("after"), fp, Duration::from_secs(10))) {
        Err(StoreError::Corrupt(why)) => {
            assert!(why.contains("idemcache_tokens"), "{why}");
            why.split('`').nth(1).expect("the repair, quoted").to_owned()
        }
        other => panic!("expected Corrupt, got {other:?}"),
    };
    let records: i64 =
        admin.query_row("SELECT count(*) FROM idemcache_records", [], |r| r.get(0)).unwrap();
    assert_eq!(records, 1, "the failed claim wrote nothing");
    admin.execute_batch(&repair).unwrap();
    let next = acquired(block_on(store.claim(&key("after"), fp, Duration::from_secs(10))));
    assert!(next.get() > first.get(), "a token was issued twice: {first:?} then {next:?}");
}

/// `ensure_schema` puts a lost counter row back above every token a record holds (it
/// put it back at 0, and the next claims were handed tokens live records held).
#[test]
fn ensure_schema_puts_a_lost_token_counter_back_above_every_token() {
    let file = TempDb::new("claim", "tokens-schema");
    let store = SqliteStore::from_connection(file.open("wal", Duration::from_millis(200)));
    block_on(store.ensure_schema()).unwrap();
    let fp = Fingerprint::of(b"r");
    let mut issued = Vec::new();
    for k in ["a", "b", "c"] {
        issued.push(acquired(block_on(store.claim(&key(k), fp, Duration::from_secs(10)))));
    }
    let admin = file.open("wal", Duration::from_millis(200));
    admin.execute_batch("DELETE FROM idemcache_tokens").unwrap();
    block_on(store.ensure_schema()).unwrap();
    let next = acquired(block_on(store.claim(&key("d"), fp, Duration::from_secs(10))));
    assert!(issued.iter().all(|t| next.get() > t.get()), "{next:?} after {issued:?}");
}

/// A table an earlier release made (no `correlation_id` column) keeps its rows and gains
/// the column at `ensure_schema`; an acquiring claim keeps its correlation id, a
/// takeover replaces it, a claim without one leaves none.
#[test]
fn an_earlier_releases_table_gains_the_correlation_id_column() {
    let file = TempDb::new("claim", "upgrade");
    let old = file.open("wal", Duration::from_millis(200));
    old.execute_batch(
        "CREATE TABLE idemcache_records (key BLOB PRIMARY KEY, fingerprint BLOB NOT NULL,
         state INTEGER NOT NULL, token INTEGER NOT NULL, body BLOB, started_at INTEGER NOT NULL,
         settled_at INTEGER, expires_at INTEGER NOT NULL) WITHOUT ROWID;
         INSERT INTO idemcache_records VALUES (x'00', x'00', 2, 1, NULL, 0, 0, 0);",
    )
    .unwrap();
    let (store, clock, admin) = pinned_store(&file, Duration::from_millis(200));
    block_on(store.ensure_schema()).unwrap();
    let stored = |k: &Key| -> Option<String> {
        admin
            .query_row(
                "SELECT correlation_id FROM idemcache_records WHERE key = ?1",
                [k.as_bytes()],
                |r| r.get(0),
            )
            .unwrap()
    };
    let old_rows: i64 = admin
        .query_row("SELECT count(*) FROM idemcache_records WHERE key = x'00'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(old_rows, 1, "the upgrade kept the table's rows");
    let first = idemcache::CorrelationId::new("req-1").unwrap();
    let k = key("correlated");
    let fp = Fingerprint::of(b"c");
    acquired(block_on(store.claim_correlated(&k, fp, Duration::from_secs(10), Some(&first))));
    assert_eq!(stored(&k).as_deref(), Some("req-1"));
    // The lease lapses: the takeover's id replaces it; a claim without one leaves none.
    clock.fetch_add(11 * SEC, Ordering::SeqCst);
    let second = idemcache::CorrelationId::new("req-2").unwrap();
    acquired(block_on(store.claim_correlated(&k, fp, Duration::from_secs(10), Some(&second))));
    assert_eq!(stored(&k).as_deref(), Some("req-2"));
    clock.fetch_add(11 * SEC, Ordering::SeqCst);
    acquired(block_on(store.claim(&k, fp, Duration::from_secs(10))));
    assert_eq!(stored(&k), None);
}
