//! The conformance suite every [`Store`] passes (feature `test-utils`): run it on a
//! store of your own to prove it keeps the contract of the [module docs](super), as
//! idemcache's SQLite, PostgreSQL and Redis stores do in their tests.
//!
//! ```ignore
//! #[tokio::test]
//! async fn my_store_conforms() {
//!     let store = MyStore::connect("...").await.unwrap();
//!     store.ensure_schema().await.unwrap();
//!     idemcache::store::conformance::run(&store).await;
//! }
//! ```
//!
//! Stores judge time by their own clock, so the checks of lapses and expiry use short
//! leases and TTLs and wait (bounded, ~4 s) until the store says the time has passed;
//! times are only compared with other times the store gave (its clock may be apart from
//! the test machine's, but must run at real speed). Every call keys its records apart
//! (a tenant per process, a prefix per call), so calls on one shared database, and
//! records an earlier run left there, never meet; listings ask for every live UNKNOWN
//! record, so a database holding many is slower to check, never wrong. The suite needs no async runtime of its own (it waits on a
//! thread), so it runs under whichever runtime the store needs.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use super::{Store, StoreClaim, StoreError, Tiered, TieredClaim};
use crate::{Cache, FencingToken, Fingerprint, Key};

mod crash;
mod lapse;
mod records;
pub mod unique;

pub use crash::{kill_child_at, wait_to_be_killed_at};

pub use lapse::{reconcile_as_checked, run_mark_unknown, SHORT_LEASE};

/// The lease the suite claims with.
pub const LEASE: Duration = Duration::from_secs(30);
/// The TTL the suite completes with.
pub const TTL: Duration = Duration::from_secs(3600);

/// The key `k` of this test process: keys are per process (a tenant of their own), so
/// records a shared database kept from an earlier run never meet this one's. The suite's
/// own keys are also per call ([`run`] twice in one process meets no key twice).
pub fn key(k: &str) -> Key {
    static RUN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let run = RUN.get_or_init(|| {
        let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos();
        format!("run-{}-{nanos}", std::process::id())
    });
    Key::new("POST /orders", run, k).unwrap()
}

/// A prefix no other call in this process gets: each call of the suite keys its records
/// under one, so two calls on one database (one after the other, or at once) never meet.
fn fresh() -> String {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!("call{}/", CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// One call of the suite: its keys are [`key`]'s under a [`fresh`] prefix.
struct Run(String);

impl Run {
    fn key(&self, k: &str) -> Key {
        key(&format!("{}{k}", self.0))
    }
}

/// The service URL in the environment variable `var`, or `None` after saying the test
/// is skipped and what to set (`example`). Said on the process's stderr directly, not
/// through `eprintln!`, which the test harness captures and shows only for a failing
/// test: a skipped test passes, and its reason must still be seen.
pub fn service_url(var: &str, example: &str) -> Option<String> {
    use std::io::Write;
    let url = std::env::var(var).ok().filter(|url| !url.is_empty());
    if url.is_none() {
        let test = std::thread::current().name().unwrap_or("a test").to_owned();
        let _ = writeln!(std::io::stderr(), "skipped {test}: set {var} (e.g. {example}) to run it");
    }
    url
}

/// A PostgreSQL connection URL whose sessions resolve unqualified names in `schema`
/// first (`options=-c search_path=SCHEMA`): what a suite or benchmark that works in a
/// schema of its own connects with, so the store's tables are created and read there.
pub fn postgres_url_in_schema(url: &str, schema: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}options=-c%20search_path%3D{schema}")
}

/// The fingerprint of the request named `r`.
pub fn fp(r: &str) -> Fingerprint {
    Fingerprint::of(r.as_bytes())
}

/// Claims `k` for the request `"r"`, which must be acquired; returns the token.
pub async fn acquire<S: Store>(store: &S, k: &Key) -> FencingToken {
    acquire_until(store, k).await.0
}

/// [`acquire`], with the lease's end as the store said it.
async fn acquire_until<S: Store>(store: &S, k: &Key) -> (FencingToken, SystemTime) {
    match store.claim(k, fp("r"), LEASE).await.unwrap() {
        StoreClaim::Acquired { token, lease_ends_at, .. } => (token, lease_ends_at),
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// Claims `k` for the request `r` until the store's clock has passed what holds it (a
/// lease or TTL a few ms long); returns the token. Panics after ~4 s.
pub async fn until_acquired<S: Store>(store: &S, k: &Key, r: &str) -> FencingToken {
    until_taken(store, k, r).await.0
}

/// [`until_acquired`], with whether the claim took the key over from a lapsed execution.
async fn until_taken<S: Store>(store: &S, k: &Key, r: &str) -> (FencingToken, bool) {
    for _ in 0..2000 {
        match store.claim(k, fp(r), LEASE).await.unwrap() {
            StoreClaim::Acquired { token, took_over, .. } => return (token, took_over),
            _ => pause(Duration::from_millis(2)).await,
        }
    }
    panic!("the store never let the key go");
}

/// The state table: absent → PROCESSING → COMPLETED / absent / UNKNOWN → COMPLETED /
/// absent, with the answers a repeat and a different request get in each.
async fn state_table<S: Store>(store: &S, run: &Run) {
    let k = run.key("states");
    let (token, lease_ends_at) = acquire_until(store, &k).await;
    assert!(matches!(
        store.claim(&k, fp("r"), LEASE).await.unwrap(),
        StoreClaim::InProgress { .. }
    ));
    assert_eq!(store.claim(&k, fp("other"), LEASE).await.unwrap(), StoreClaim::Mismatch);
    let record =
        store.complete(&k, token, Some(Bytes::from_static(b"receipt")), TTL).await.unwrap();
    assert_eq!(record.body.as_deref(), Some(&b"receipt"[..]));
    assert!(record.expires_at > record.completed_at + TTL - Duration::from_secs(1));
    // Both on the store's clock: the lease ran from the claim, a moment before.
    let lease_left = lease_ends_at.duration_since(record.completed_at).unwrap_or_default();
    assert!(
        lease_left > LEASE - Duration::from_secs(5) && lease_left <= LEASE,
        "the lease ended {lease_left:?} after the completion, of a {LEASE:?} lease"
    );
    match store.claim(&k, fp("r"), LEASE).await.unwrap() {
        StoreClaim::Completed(replay) => assert_eq!(replay, record),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.claim(&k, fp("other"), LEASE).await.unwrap(), StoreClaim::Mismatch);

    let k = run.key("released");
    let token = acquire(store, &k).await;
    store.release(&k, token).await.unwrap();
    let again = acquire(store, &k).await;
    assert!(again > token, "tokens increase: {again} after {token}");

    let k = run.key("unknown");
    let token = acquire(store, &k).await;
    store.mark_unknown(&k, token, TTL).await.unwrap();
    assert!(matches!(store.claim(&k, fp("r"), LEASE).await.unwrap(), StoreClaim::Unknown { .. }));
    // Every live UNKNOWN record: a shared database may hold older ones, listed first.
    let listed = store.list_unknown(usize::MAX).await.unwrap();
    let entry = listed.iter().find(|u| u.key == k).expect("the UNKNOWN record is listed");
    assert_eq!(entry.fingerprint, fp("r"));
    // The mark expires its TTL after it was made, on the store's clock.
    let lived = entry.expires_at.duration_since(entry.marked_at).unwrap_or_default();
    assert!(lived.abs_diff(TTL) < Duration::from_secs(1), "marked {entry:?} for {lived:?}");
    store.resolve(&k, None, TTL).await.unwrap();
    match store.claim(&k, fp("r"), LEASE).await.unwrap() {
        StoreClaim::Completed(replay) => assert_eq!(replay.body, None, "completed without a body"),
        other => panic!("{other:?}"),
    }

    let k = run.key("forgotten");
    let token = acquire(store, &k).await;
    store.mark_unknown(&k, token, TTL).await.unwrap();
    store.forget(&k).await.unwrap();
    acquire(store, &k).await;
}

/// Every write names its token; a stale or wrong one changes nothing.
async fn fencing<S: Store>(store: &S, run: &Run) {
    let k = run.key("fenced");
    let (token, first_end) = acquire_until(store, &k).await;
    let body = || Some(Bytes::from_static(b"x"));
    assert!(matches!(
        store.complete(&k, next(token), body(), TTL).await,
        Err(StoreError::LeaseLost(_))
    ));
    assert!(matches!(
        store.release(&k, FencingToken::new(token.get().wrapping_sub(1))).await,
        Err(StoreError::LeaseLost(_))
    ));
    assert!(matches!(
        store.mark_unknown(&k, FencingToken::new(0), TTL).await,
        Err(StoreError::LeaseLost(_))
    ));
    assert!(matches!(
        store.extend_lease(&k, next(token), LEASE).await,
        Err(StoreError::LeaseLost(_))
    ));
    let longer = store.extend_lease(&k, token, 4 * LEASE).await.unwrap();
    // From the store's now, after the claim: at least 3 leases past the first end.
    assert!(longer > first_end + 2 * LEASE, "the lease now ends later: {longer:?}");
    match store.claim(&k, fp("r"), LEASE).await.unwrap() {
        StoreClaim::InProgress { lease_ends_at } => assert_eq!(lease_ends_at, longer),
        other => panic!("{other:?}"),
    }
    store.complete(&k, token, body(), TTL).await.unwrap();
    // Settled: the same token cannot settle it again.
    assert!(matches!(store.release(&k, token).await, Err(StoreError::LeaseLost(_))));
    assert!(matches!(store.complete(&k, token, body(), TTL).await, Err(StoreError::LeaseLost(_))));
    assert!(matches!(store.resolve(&k, body(), TTL).await, Err(StoreError::NothingToSettle(_))));
    assert!(matches!(store.forget(&k).await, Err(StoreError::NothingToSettle(_))));
    assert!(matches!(store.extend_lease(&k, token, LEASE).await, Err(StoreError::LeaseLost(_))));
}

/// A lapsed lease outlives `purge_expired` for as long as it was held, so the claim after
/// the purge still finds the execution it takes over and says so (`took_over`): what a
/// handler whose effect is outside the store asks before acting again. (A purge deleting
/// every lapsed lease at once, as the SQL stores' did, made that claim a new execution.)
///
/// Renewed, a lease is held longer than one lease, and kept that much longer: the layer
/// renews a slow handler's lease, and a slow handler that crashes is the takeover
/// `took_over` is for. (Redis kept a renewed key one lease past its last renewal.)
async fn purge_keeps_a_lapse<S: Store>(store: &S, run: &Run) {
    let k = run.key("lapsed-purged");
    let stale = match store.claim(&k, fp("r"), Duration::from_millis(500)).await.unwrap() {
        StoreClaim::Acquired { token, .. } => token,
        other => panic!("an absent key is acquired: {other:?}"),
    };
    purged_after_lapse(store, &k, stale, Duration::ZERO).await;

    // Held 1.4 s under 200 ms leases, then purged 500 ms after the lapse: more than a
    // lease, less than the time held.
    let k = run.key("renewed-purged");
    let lease = Duration::from_millis(200);
    let stale = match store.claim(&k, fp("r"), lease).await.unwrap() {
        StoreClaim::Acquired { token, .. } => token,
        other => panic!("an absent key is acquired: {other:?}"),
    };
    for _ in 0..12 {
        pause(Duration::from_millis(100)).await;
        store.extend_lease(&k, stale, lease).await.unwrap();
    }
    purged_after_lapse(store, &k, stale, Duration::from_millis(500)).await;
}

/// Waits until `k`'s lease under `stale` lapsed, then `after`, purges, and claims: the
/// claim must take the lapse over and say so.
async fn purged_after_lapse<S: Store>(store: &S, k: &Key, stale: FencingToken, after: Duration) {
    let mut lapsed = false;
    for _ in 0..2000 {
        // A lapsed lease reads as no record: dead, to be taken over.
        if store.record(k).await.unwrap().is_none() {
            lapsed = true;
            break;
        }
        pause(Duration::from_millis(2)).await;
    }
    assert!(lapsed, "the lease never lapsed");
    if !after.is_zero() {
        pause(after).await;
    }
    while store.purge_expired(100).await.unwrap() == 100 {}
    match store.claim(k, fp("r"), LEASE).await.unwrap() {
        StoreClaim::Acquired { token, took_over, .. } => {
            assert!(token > stale, "taken over under a larger token");
            assert!(took_over, "the purge kept the lapsed lease, and the claim says so");
        }
        other => panic!("a lapsed lease is taken over: {other:?}"),
    }
}

/// A lapsed lease is taken over with a larger token; the stale owner is refused.
async fn takeover<S: Store>(store: &S, run: &Run) {
    let k = run.key("lapsed");
    let stale = match store.claim(&k, fp("r"), Duration::from_millis(20)).await.unwrap() {
        StoreClaim::Acquired { token, took_over: false, .. } => token,
        other => panic!("an absent key is acquired, not taken over: {other:?}"),
    };
    let (fresh, took_over) = until_taken(store, &k, "r").await;
    assert!(fresh > stale);
    assert!(took_over, "a lapsed execution's key is taken over, and the answer says so");
    let renewed = store.extend_lease(&k, stale, LEASE).await;
    assert!(matches!(renewed, Err(StoreError::LeaseLost(_))), "{renewed:?}");
    let late = store.complete(&k, stale, Some(Bytes::from_static(b"stale")), TTL).await;
    assert!(matches!(late, Err(StoreError::LeaseLost(_))), "{late:?}");
    store.complete(&k, fresh, Some(Bytes::from_static(b"fresh")), TTL).await.unwrap();
    match store.claim(&k, fp("r"), LEASE).await.unwrap() {
        StoreClaim::Completed(replay) => assert_eq!(replay.body.unwrap(), "fresh"),
        other => panic!("{other:?}"),
    }
}

/// Expired records read as absent and are purged in bounded batches (a store that
/// expires records by itself, as Redis does, has fewer or none left to purge).
async fn expiry<S: Store>(store: &S, run: &Run, purges_itself: bool) {
    for i in 0..5 {
        let k = run.key(&format!("short{i}"));
        let token = acquire(store, &k).await;
        store
            .complete(&k, token, Some(Bytes::from_static(b"x")), Duration::from_millis(10))
            .await
            .unwrap();
    }
    // The last one expires: a claim of a different request then acquires (absent), no
    // takeover: the earlier execution completed.
    let (_, took_over) = until_taken(store, &run.key("short4"), "another request").await;
    assert!(!took_over, "an expired result's key is acquired, not taken over");
    let mut purged = 0;
    loop {
        let n = store.purge_expired(2).await.unwrap();
        assert!(n <= 2, "a batch is bounded");
        purged += n;
        if n < 2 {
            break;
        }
    }
    assert!(
        purges_itself || purged >= 4,
        "the four other expired records were purged, got {purged}"
    );
    for i in 0..4 {
        let k = run.key(&format!("short{i}"));
        assert!(matches!(
            store.claim(&k, fp("r"), LEASE).await.unwrap(),
            StoreClaim::Acquired { .. }
        ));
    }
    assert!(matches!(
        store.claim(&run.key("short4"), fp("r"), LEASE).await.unwrap(),
        StoreClaim::Mismatch
    ));
}

/// Bad input is refused with a typed error and changes nothing.
async fn bad_input<S: Store>(store: &S, run: &Run) {
    let k = run.key("bad");
    let zero = store.claim(&k, fp("r"), Duration::ZERO).await;
    assert!(matches!(zero, Err(StoreError::InvalidInput(_))), "{zero:?}");
    let token = acquire(store, &k).await;
    let forever = store.complete(&k, token, None, Duration::MAX).await;
    assert!(matches!(forever, Err(StoreError::InvalidInput(_))), "{forever:?}");
    let zero = store.extend_lease(&k, token, Duration::ZERO).await;
    assert!(matches!(zero, Err(StoreError::InvalidInput(_))), "{zero:?}");
    let over = store.extend_lease(&k, token, crate::MAX_DURATION + Duration::from_nanos(1)).await;
    assert!(matches!(over, Err(StoreError::InvalidInput(_))), "{over:?}");
    // The longest lease the cache allows is allowed here too.
    store.extend_lease(&k, token, crate::MAX_DURATION).await.unwrap();
    assert!(matches!(
        store.claim(&k, fp("r"), LEASE).await.unwrap(),
        StoreClaim::InProgress { .. }
    ));
    store.complete(&k, token, None, TTL).await.unwrap();
}

/// The whole suite on `store`, which must have its schema: the state table, fencing,
/// lease takeover, expiry and purging, bad input, inspection (`record`, `records`,
/// `remove_record`), reconciling. Panics on the first
/// breach. (A store built with `LapsePolicy::MarkUnknown` runs [`run_mark_unknown`]
/// instead of this: its lapses are never taken over.)
pub async fn run<S: Store>(store: &S) {
    suite(store, false).await;
}

/// [`run`], for a store that expires records by itself (as Redis does), so that purging
/// may find fewer expired records, or none, left to delete.
pub async fn run_self_expiring<S: Store>(store: &S) {
    suite(store, true).await;
}

async fn suite<S: Store>(store: &S, purges_itself: bool) {
    let run = Run(fresh());
    state_table(store, &run).await;
    fencing(store, &run).await;
    takeover(store, &run).await;
    purge_keeps_a_lapse(store, &run).await;
    expiry(store, &run, purges_itself).await;
    bad_input(store, &run).await;
    records::inspection(store, &run).await;
    records::correlation(store, &run).await;
    reconcile_as_checked(store).await;
}

/// Two `Tiered` instances (separate caches, separate connections: two processes' worth)
/// over one store, hammered with 64 concurrent claims of 8 keys: each key runs once and
/// every other claim replays its result.
///
/// Then a restarted instance (a new cache over `restarted`, a new connection) replays
/// every key's result from the store. `prefix` names the keys in messages; each call
/// keys its records apart from every other call's.
pub async fn tiered_exactly_once<S: Store>(first: S, second: S, restarted: S, prefix: &str) {
    let prefix = format!("{}{prefix}", fresh());
    let instances = [
        std::sync::Arc::new(Tiered::new(Cache::builder().build().unwrap(), first)),
        std::sync::Arc::new(Tiered::new(Cache::builder().build().unwrap(), second)),
    ];
    let executed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..64 {
        let tiered = instances[i % 2].clone();
        let executed = executed.clone();
        let k = key(&format!("{prefix}{}", i % 8));
        tasks.push(async move {
            loop {
                match tiered.claim(&k, fp("r")).await.unwrap() {
                    TieredClaim::Acquired(guard) => {
                        executed.lock().unwrap().push(k.client_key().to_owned());
                        guard.complete(format!("done {}", k.client_key())).await.unwrap();
                    }
                    TieredClaim::InProgress { .. } => {
                        yield_now().await;
                        continue;
                    }
                    TieredClaim::Completed(replay) => {
                        assert_eq!(replay.body.unwrap(), format!("done {}", k.client_key()));
                    }
                    other => panic!("{other:?}"),
                }
                return;
            }
        });
    }
    join_all(tasks).await;
    let mut executed = executed.lock().unwrap().clone();
    executed.sort();
    let expected: Vec<_> = (0..8).map(|i| format!("{prefix}{i}")).collect();
    assert_eq!(executed, expected, "each key executed exactly once");
    // A lease lapsed in one instance is taken over by the other; the stale owner is fenced.
    let (one, two) = (instances[0].store(), instances[1].store());
    let k = key(&format!("{prefix}-lapsed"));
    let StoreClaim::Acquired { token: stale, .. } =
        one.claim(&k, fp("r"), Duration::from_millis(20)).await.unwrap()
    else {
        panic!("expected Acquired");
    };
    let fresh = until_acquired(two, &k, "r").await;
    assert!(fresh > stale);
    let late = one.complete(&k, stale, Some(Bytes::from_static(b"stale")), TTL).await;
    assert!(matches!(late, Err(StoreError::LeaseLost(_))), "{late:?}");
    drop(instances);
    let restarted = Tiered::new(Cache::builder().build().unwrap(), restarted);
    for i in 0..8 {
        let k = key(&format!("{prefix}{i}"));
        match restarted.claim(&k, fp("r")).await.unwrap() {
            TieredClaim::Completed(replay) => {
                assert_eq!(replay.body.unwrap(), format!("done {}", k.client_key()));
            }
            other => panic!("a restarted instance must replay, got {other:?}"),
        }
    }
}

/// The token after `token`: one no claim was given.
fn next(token: FencingToken) -> FencingToken {
    FencingToken::new(token.get() + 1)
}

/// A future ready once `d` has passed, on any runtime or none: a thread sleeps and
/// wakes it.
pub fn pause(d: Duration) -> impl Future<Output = ()> + Send {
    struct Pause {
        done: Arc<Mutex<(bool, Option<Waker>)>>,
        started: bool,
        d: Duration,
    }
    impl Future for Pause {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
            if done.0 {
                return Poll::Ready(());
            }
            done.1 = Some(cx.waker().clone());
            drop(done);
            if !self.started {
                self.started = true;
                let (shared, d) = (self.done.clone(), self.d);
                std::thread::spawn(move || {
                    std::thread::sleep(d);
                    let mut done = shared.lock().unwrap_or_else(|p| p.into_inner());
                    done.0 = true;
                    if let Some(waker) = done.1.take() {
                        waker.wake();
                    }
                });
            }
            Poll::Pending
        }
    }
    Pause { done: Arc::default(), started: false, d }
}

/// Pending once, waking itself: lets the other futures of a [`join_all`] run.
fn yield_now() -> impl Future<Output = ()> + Send {
    let mut yielded = false;
    std::future::poll_fn(move |cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
}

/// Runs `futures` concurrently in the calling task until all are done: every unfinished
/// one is polled whenever the task is woken, so their store calls interleave at every
/// await (a spurious poll is allowed by `Future`'s contract).
async fn join_all<F: Future<Output = ()> + Send>(futures: Vec<F>) {
    let mut futures: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    std::future::poll_fn(move |cx| {
        let mut pending = false;
        for slot in &mut futures {
            if let Some(future) = slot {
                if future.as_mut().poll(cx).is_ready() {
                    *slot = None;
                } else {
                    pending = true;
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
}
