//! The maintenance loops (`idemcache::purge`) over SQLite: the records' loop deletes
//! what expired on the store's clock, round after round, in paced batches; the inbox's
//! waits while its purger gives no cutoff, then deletes what is older than the window;
//! a purge that fails is reported as a failed round and the loop goes on.
//!
//! Time is the test's: the store's clock is pinned (`unixepoch` overridden on its
//! connection), and the loops' timer is one the test ticks, so a loop runs exactly up
//! to its next sleep and no further.

use std::cell::{Cell, RefCell};
use std::convert::Infallible;
use std::future::Future;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use idemcache::purge::{self, Round, Schedule, DEFAULT_PAUSE};
use idemcache::store::{block_on, Store, StoreClaim, StoreError};
use idemcache::{Fingerprint, Key};
use idemcache_sql::inbox::{InboxError, Purger, Retention};
use idemcache_sqlite::inbox;
use idemcache_sqlite::rusqlite::functions::FunctionFlags;
use idemcache_sqlite::rusqlite::{self, params, Connection};
use idemcache_sqlite::SqliteStore;

mod common;
use common::TempDb;

const T0: i64 = 1_800_000_000_000_000;
const SEC: i64 = 1_000_000;
const MINUTE: Duration = Duration::from_secs(60);

/// The loops' timer, ticked by the test: every sleep a loop asks for is noted, and ends
/// only once the test lets it.
#[derive(Default)]
struct Timer {
    asked: RefCell<Vec<Duration>>,
    let_go: Cell<usize>,
}

/// One sleep: the `n`th asked for.
struct Nap {
    timer: Rc<Timer>,
    n: usize,
}

impl Future for Nap {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        // No waker to keep: the test polls the loop again itself after a tick.
        if self.timer.let_go.get() >= self.n {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Timer {
    /// The `sleep` a loop is given.
    fn sleep(self: &Rc<Self>) -> impl FnMut(Duration) -> Nap {
        let timer = self.clone();
        move |d| {
            timer.asked.borrow_mut().push(d);
            Nap { timer: timer.clone(), n: timer.asked.borrow().len() }
        }
    }

    /// Ends the sleep the loop is in.
    fn tick(&self) {
        self.let_go.set(self.asked.borrow().len());
    }

    /// Runs `purging` until it sleeps again; returns how long it asked to sleep.
    fn run_until_asleep(
        &self,
        mut purging: Pin<&mut impl Future<Output = Infallible>>,
    ) -> Duration {
        block_on(std::future::poll_fn(|cx| {
            if let Poll::Ready(never) = purging.as_mut().poll(cx) {
                match never {}
            }
            match self.asked.borrow().len() > self.let_go.get() {
                true => Poll::Ready(()),
                false => Poll::Pending,
            }
        }));
        *self.asked.borrow().last().unwrap()
    }
}

/// Rounds as a loop reports them.
type Rounds<E> = Rc<RefCell<Vec<Round<E>>>>;

fn reporter<E>(rounds: &Rounds<E>) -> impl FnMut(Round<E>) {
    let rounds = rounds.clone();
    move |round| rounds.borrow_mut().push(round)
}

/// SQLite's clock on `conn` is `clock` (µs since the epoch), or fails while `failing`.
fn pin(conn: &Connection, clock: &Arc<AtomicI64>, failing: &Arc<AtomicBool>) {
    let (clock, failing) = (clock.clone(), failing.clone());
    conn.create_scalar_function("unixepoch", 1, FunctionFlags::SQLITE_UTF8, move |_| {
        if failing.load(Ordering::SeqCst) {
            return Err(rusqlite::Error::UserFunctionError("the clock is unreadable".into()));
        }
        Ok(clock.load(Ordering::SeqCst) as f64 / 1e6)
    })
    .unwrap();
}

/// Claims and completes `k` at the store's now, kept for `ttl_secs`.
fn completed(store: &SqliteStore, k: &str, ttl_secs: u64) {
    let key = Key::without_tenant("purge-test", k).unwrap();
    let claim = block_on(store.claim(&key, Fingerprint::of(b"r"), MINUTE)).unwrap();
    let StoreClaim::Acquired { token, .. } = claim else { panic!("{claim:?}") };
    let ttl = Duration::from_secs(ttl_secs);
    block_on(store.complete(&key, token, Some(Bytes::from_static(b"done")), ttl)).unwrap();
}

fn count(conn: &Connection, table: &str) -> i64 {
    conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0)).unwrap()
}

#[test]
fn the_records_loop_purges_what_expired_in_paced_batches_and_survives_a_failed_round() {
    let file = TempDb::new("purge", "records");
    let (clock, failing) = (Arc::new(AtomicI64::new(T0)), Arc::new(AtomicBool::new(false)));
    let conn = file.open("wal", Duration::from_secs(5));
    pin(&conn, &clock, &failing);
    let store = SqliteStore::from_connection(conn);
    block_on(store.ensure_schema()).unwrap();
    let other = file.open("wal", Duration::from_secs(5));
    for (k, ttl) in [("a", 10), ("b", 10), ("c", 10), ("kept", 3600)] {
        completed(&store, k, ttl);
    }
    let (timer, rounds) = (Rc::new(Timer::default()), Rounds::default());
    let schedule = Schedule::every(MINUTE).unwrap().with_batch(2).unwrap();
    let mut purging = pin!(purge::records_loop(store, schedule, timer.sleep(), reporter(&rounds)));

    // A round at once, then a minute's sleep: nothing had expired.
    assert_eq!(timer.run_until_asleep(purging.as_mut()), MINUTE);
    assert!(matches!(rounds.borrow()[..], [Round::Purged(0)]), "{rounds:?}");
    assert_eq!(count(&other, "idemcache_records"), 4);

    // Past three TTLs: a full batch of two, a pause, then a short batch of one.
    clock.store(T0 + 11 * SEC, Ordering::SeqCst);
    timer.tick();
    assert_eq!(timer.run_until_asleep(purging.as_mut()), DEFAULT_PAUSE);
    assert_eq!((rounds.borrow().len(), count(&other, "idemcache_records")), (1, 2));
    timer.tick();
    assert_eq!(timer.run_until_asleep(purging.as_mut()), MINUTE);
    assert!(matches!(rounds.borrow()[1], Round::Purged(3)), "{rounds:?}");
    assert_eq!(count(&other, "idemcache_records"), 1);

    // The store fails: the round is reported as failed, and the loop sleeps on.
    clock.store(T0 + 7200 * SEC, Ordering::SeqCst);
    failing.store(true, Ordering::SeqCst);
    timer.tick();
    assert_eq!(timer.run_until_asleep(purging.as_mut()), MINUTE);
    match &rounds.borrow()[2] {
        Round::Failed { deleted: 0, error: StoreError::Backend(e) } => {
            assert!(e.to_string().contains("the clock is unreadable"), "{e}")
        }
        other => panic!("a failed purge is a failed round: {other:?}"),
    }
    assert_eq!(count(&other, "idemcache_records"), 1);

    // The next round, the store back, deletes what the failed one could not.
    failing.store(false, Ordering::SeqCst);
    timer.tick();
    assert_eq!(timer.run_until_asleep(purging.as_mut()), MINUTE);
    assert!(matches!(rounds.borrow()[3], Round::Purged(1)), "{rounds:?}");
    assert_eq!((rounds.borrow().len(), count(&other, "idemcache_records")), (4, 0));
}

/// `received_at` `ago` before now (negative: after it), in µs.
fn received(conn: &Connection, id: &str, ago: i64) {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap();
    let at = now.as_micros() as i64 - ago;
    conn.execute(
        "INSERT INTO idemcache_inbox (consumer, message_id, fingerprint, received_at)
         VALUES ('ledger', ?1, ?2, ?3)",
        params![id, Fingerprint::of(id.as_bytes()).to_bytes().to_vec(), at],
    )
    .unwrap();
}

/// The inbox loop's batch: the driver's purge on `conn`.
fn batches(
    conn: &Connection,
) -> impl FnMut(SystemTime, usize) -> std::future::Ready<Result<usize, InboxError>> + '_ {
    move |cutoff, limit| std::future::ready(inbox::purge(conn, cutoff, limit))
}

#[test]
fn the_inbox_loop_waits_for_its_purger_then_purges_past_the_window_and_survives_a_failed_round() {
    let file = TempDb::new("purge", "inbox");
    let conn = file.open("wal", Duration::from_secs(5));
    inbox::ensure_schema(&conn).unwrap();
    let day = 24 * 3600 * SEC;
    for id in ["old-1", "old-2", "old-3"] {
        received(&conn, id, 10 * day);
    }
    received(&conn, "recent", -day); // well inside any window
    let other = file.open("wal", Duration::from_secs(5));
    let hour = Duration::from_secs(3600);
    let retention = Retention::new(hour, MINUTE).unwrap();
    let schedule =
        Schedule::every(MINUTE).unwrap().with_batch(2).unwrap().with_pause(Duration::ZERO);

    // Just started: a purger gives no cutoff for its redelivery horizon; nothing goes.
    let (timer, rounds) = (Rc::new(Timer::default()), Rounds::default());
    let starting = Purger::new(retention, SystemTime::now());
    let sleep = timer.sleep();
    let waiting = pin!(idemcache_sql::inbox::purge_loop(
        starting,
        batches(&conn),
        schedule,
        sleep,
        reporter(&rounds)
    ));
    assert_eq!(timer.run_until_asleep(waiting), MINUTE);
    assert!(matches!(rounds.borrow()[..], [Round::Waiting]), "{rounds:?}");
    assert_eq!(count(&other, "idemcache_inbox"), 4);

    // Running for a day: what is older than the window goes, in batches of two back to
    // back (no pause asked), and the recent record stays.
    let (timer, rounds) = (Rc::new(Timer::default()), Rounds::<InboxError>::default());
    let running = Purger::new(retention, SystemTime::now() - 24 * hour);
    let sleep = timer.sleep();
    let mut purging = pin!(idemcache_sql::inbox::purge_loop(
        running,
        batches(&conn),
        schedule,
        sleep,
        reporter(&rounds)
    ));
    assert_eq!(timer.run_until_asleep(purging.as_mut()), MINUTE);
    assert!(matches!(rounds.borrow()[..], [Round::Purged(3)]), "{rounds:?}");
    assert_eq!(timer.asked.borrow().len(), 1, "no pause between batches");
    assert_eq!(count(&other, "idemcache_inbox"), 1);

    // The table gone: a failed round, reported; the loop sleeps on, and purges again
    // once the table is back.
    other.execute_batch("ALTER TABLE idemcache_inbox RENAME TO idemcache_inbox_away").unwrap();
    timer.tick();
    assert_eq!(timer.run_until_asleep(purging.as_mut()), MINUTE);
    match &rounds.borrow()[1] {
        Round::Failed { deleted: 0, error: InboxError::Database(e) } => {
            assert!(e.to_string().contains("no such table"), "{e}")
        }
        other => panic!("a failed purge is a failed round: {other:?}"),
    }
    other.execute_batch("ALTER TABLE idemcache_inbox_away RENAME TO idemcache_inbox").unwrap();
    received(&other, "old-4", 10 * day);
    timer.tick();
    assert_eq!(timer.run_until_asleep(purging.as_mut()), MINUTE);
    assert!(matches!(rounds.borrow()[2], Round::Purged(1)), "{rounds:?}");
    assert_eq!(count(&other, "idemcache_inbox"), 1);
}
