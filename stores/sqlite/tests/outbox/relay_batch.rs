//! `relay_batch`'s own rules, through the SQLite driver (the rules are the relay's, the
//! same over every driver; each driver's statements are tried by the shared suite): a
//! relay whose lease lapsed skips a row another relay claimed, a row whose count failed
//! is not published, the failure of attempt N is charged as attempt N, and a row out of
//! attempts dies unpublished wherever it is in its batch. Each test was written against
//! a mutation of `relay_batch` or `decode` that the other suites let through.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, SystemTime};

use idemcache::store::block_on;
use idemcache_sql::outbox::testing::{ids, message, t0, FlakyBroker};
use idemcache_sql::outbox::{Batch, Lease, OutboxStorage, State};
use idemcache_sqlite::outbox::{
    self, claim_due, inspect, Mark, OutboxError, OutboxMessage, RelaySettings, Retry, Storage,
};

use super::{memory, put, secs, MIN};

fn settings(max_attempts: u32) -> RelaySettings {
    RelaySettings::default()
        .with_lease(MIN)
        .unwrap()
        .with_retry(Retry::new(secs(1), secs(1), max_attempts).unwrap())
}

struct Nobody;
impl Wake for Nobody {
    fn wake(self: Arc<Self>) {}
}

/// A broker whose publishes wait until the gate opens (a slow broker: a publish that
/// outlasts the lease), then confirm.
#[derive(Default)]
struct Gate {
    open: Arc<AtomicBool>,
    confirmed: Arc<Mutex<Vec<String>>>,
}

impl outbox::Publisher for Gate {
    fn publish(
        &self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<(), outbox::PublishError>> + Send {
        let (open, confirmed, id) =
            (self.open.clone(), self.confirmed.clone(), message.id().to_owned());
        std::future::poll_fn(move |_| {
            if open.load(Ordering::SeqCst) {
                confirmed.lock().unwrap().push(id.clone());
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        })
    }
}

/// Kills "a Stale begin publishes anyway" (relay.rs: "a relay whose lease lapsed now
/// skips a row another relay claimed"): relay A, slow on `s`, outlives its lease; relay
/// B claims `s` and `x`; A's count of `x` is Stale and A does not publish `x`.
#[test]
fn a_relay_whose_lease_lapsed_skips_a_row_another_relay_claimed() {
    let mut db = memory();
    put(&mut db, &[message("s"), message("x")]);
    let storage = Storage::new(db);
    let settings = settings(3).with_batch(2).unwrap();
    let gate = Gate::default();
    let mut clock_a = || t0();
    let mut a = pin!(outbox::relay_batch(&storage, &gate, &settings, &mut clock_a));
    let waker = Waker::from(Arc::new(Nobody));
    let mut cx = Context::from_waker(&waker);
    assert!(a.as_mut().poll(&mut cx).is_pending(), "A is publishing s");
    let b = claim_due(&storage.connection(), 10, MIN, t0() + MIN).unwrap();
    assert_eq!(ids(&b), ["s", "x"]);
    gate.open.store(true, Ordering::SeqCst);
    let Poll::Ready(ra) = a.as_mut().poll(&mut cx) else { panic!("A finished") };
    let ra = ra.unwrap();
    assert_eq!(*gate.confirmed.lock().unwrap(), ["s"], "A skipped x: {ra:?}");
    assert_eq!((ra.stale, ra.delivered), (2, 0), "{ra:?}");
    assert_eq!(inspect(&storage.connection(), "x").unwrap().unwrap().attempts, 0);
}

/// Kills "a failed begin publishes anyway" (relay.rs: "Uncounted, so unpublished").
#[test]
fn a_row_whose_count_failed_is_not_published() {
    let mut db = memory();
    put(&mut db, &[message("x")]);
    let storage = Storage::new(db);
    let broker = FlakyBroker::new(0, None);
    let r = block_on(outbox::relay_batch(
        &Faulty(&storage, Fault::BeginLocked),
        &broker,
        &settings(3),
        &mut t0,
    ))
    .unwrap();
    assert_eq!((r.claimed, r.errors.len(), r.delivered, broker.calls()), (1, 1, 0, 0), "{r:?}");
    let row = inspect(&storage.connection(), "x").unwrap().unwrap();
    assert_eq!((row.state, row.attempts), (State::Leased, 0));
}

/// Kills "a failure is charged with the claim's count, not the attempt begun" and
/// "out of attempts one early": through relay_batch, a row whose every publish fails
/// (max 3, backoff 1 s doubling to 4 s) is published three times, backs off 1 s then
/// 2 s, and dies at its third failure keeping the broker's error.
#[test]
fn the_failure_of_attempt_n_is_charged_as_attempt_n() {
    let mut db = memory();
    put(&mut db, &[message("x")]);
    let storage = Storage::new(db);
    let settings = RelaySettings::default()
        .with_lease(MIN)
        .unwrap()
        .with_retry(Retry::new(secs(1), secs(4), 3).unwrap());
    let nack = FlakyBroker::new(1, None);
    let mut now = t0();
    for (n, backoff) in [(1, secs(1)), (2, secs(2))] {
        let r = block_on(outbox::relay_batch(&storage, &nack, &settings, &mut || now)).unwrap();
        assert_eq!(r.retried, 1, "{r:?}");
        let row = inspect(&storage.connection(), "x").unwrap().unwrap();
        assert_eq!((row.state, row.attempts), (State::Pending, n));
        assert_eq!(row.next_attempt_at, now + backoff, "attempt {n}'s backoff");
        now += backoff;
    }
    let r = block_on(outbox::relay_batch(&storage, &nack, &settings, &mut || now)).unwrap();
    assert_eq!((r.dead, r.stale, nack.calls()), (1, 0, 3), "{r:?}");
    let row = inspect(&storage.connection(), "x").unwrap().unwrap();
    assert_eq!((row.state, row.attempts), (State::Dead, 3));
    assert_eq!(row.last_error.as_deref(), Some("publishing failed: publish 3 not confirmed"));
}

/// Kills "only a batch's first row is checked for attempts" and a miscounted report:
/// `p`, out of attempts, is made dead unpublished although `g`, before it in the batch,
/// was published; the report counts it dead, not stale.
#[test]
fn a_row_out_of_attempts_behind_a_published_one_dies_unpublished() {
    let mut db = memory();
    put(&mut db, &[message("g"), message("p")]);
    // Another relay holds `g` for ten minutes; `p`'s relays die publishing it, thrice.
    assert_eq!(ids(&claim_due(&db, 1, 10 * MIN, t0()).unwrap()), ["g"]);
    for round in 0..3u32 {
        let batch = claim_due(&db, 10, MIN, t0() + round * MIN).unwrap();
        assert_eq!(ids(&batch), ["p"]);
        assert_eq!(outbox::begin_attempt(&db, &batch.claimed[0].lease).unwrap(), Mark::Applied);
    }
    let storage = Storage::new(db);
    let broker = FlakyBroker::new(0, None);
    let mut clock = || t0() + 10 * MIN;
    let r = block_on(outbox::relay_batch(&storage, &broker, &settings(3), &mut clock)).unwrap();
    assert_eq!((r.claimed, r.delivered, r.dead, r.stale), (2, 1, 1, 0), "{r:?}");
    assert_eq!(broker.confirmed(), ["g"]);
    let p = inspect(&storage.connection(), "p").unwrap().unwrap();
    assert_eq!(
        (p.state, p.last_error.as_deref()),
        (State::Dead, Some("3 publishes begun, none marked"))
    );
}

/// Every claimed row's outcome in a report: each counts once.
fn outcomes(r: &outbox::BatchReport) -> usize {
    r.delivered + r.retried + r.dead + r.stale + r.errors.len()
}

/// How [`Faulty`] fails.
#[derive(Clone, Copy)]
enum Fault {
    /// Every count refused, changing nothing (the database locked).
    BeginLocked,
    /// A mark-and-count refused as one statement: nothing changed.
    Refused,
    /// Both applied, then the answer was lost (a connection dropped after the commit).
    AnswerLost,
    /// Another relay took the next row just before (its token moved on).
    NextTaken,
}

/// The storage, its counts failing as a database can, or its `mark_delivered_and_begin`
/// as a one-statement driver's can.
struct Faulty<'a>(&'a Storage, Fault);

impl OutboxStorage for Faulty<'_> {
    fn claim_due(
        &self,
        batch: usize,
        lease: Duration,
        now: SystemTime,
    ) -> impl Future<Output = Result<Batch, OutboxError>> + Send {
        self.0.claim_due(batch, lease, now)
    }
    async fn begin_attempt(&self, l: &Lease) -> Result<Mark, OutboxError> {
        match self.1 {
            Fault::BeginLocked => Err(OutboxError::Database("database is locked".into())),
            _ => self.0.begin_attempt(l).await,
        }
    }
    fn mark_delivered(
        &self,
        lease: &Lease,
        now: SystemTime,
    ) -> impl Future<Output = Result<Mark, OutboxError>> + Send {
        self.0.mark_delivered(lease, now)
    }
    fn mark_failed(
        &self,
        lease: &Lease,
        error: &str,
        now: SystemTime,
        retry: &Retry,
    ) -> impl Future<Output = Result<Mark, OutboxError>> + Send {
        self.0.mark_failed(lease, error, now, retry)
    }
    async fn mark_delivered_and_begin(
        &self,
        lease: &Lease,
        now: SystemTime,
        next: &Lease,
    ) -> (Result<Mark, OutboxError>, Result<Mark, OutboxError>) {
        match self.1 {
            Fault::BeginLocked => {
                let marked = self.0.mark_delivered(lease, now).await;
                return (marked, self.begin_attempt(next).await);
            }
            Fault::Refused => {}
            Fault::AnswerLost => {
                let _ = self.0.mark_delivered_and_begin(lease, now, next).await;
            }
            Fault::NextTaken => {
                let moved = "UPDATE idemcache_outbox SET token = token + 1 WHERE message_id = ?1";
                self.0.connection().execute(moved, [&next.message_id]).unwrap();
                return self.0.mark_delivered_and_begin(lease, now, next).await;
            }
        }
        let lost = || Err(OutboxError::Database("connection lost".into()));
        (lost(), lost())
    }
}

/// The count of the next row failing (a trigger refuses it) leaves the row before it
/// delivered and reported so: `a` and `c` delivered, `b`'s count the one error.
#[test]
fn a_failed_count_of_the_next_row_is_that_rows_error_alone() {
    let mut db = memory();
    put(&mut db, &[message("a"), message("b"), message("c")]);
    db.execute_batch(
        "CREATE TRIGGER refuse_b BEFORE UPDATE OF attempts ON idemcache_outbox
         WHEN NEW.message_id = 'b' AND NEW.attempts > OLD.attempts
         BEGIN SELECT RAISE(ABORT, 'database is locked'); END;",
    )
    .unwrap();
    let storage = Storage::new(db);
    let broker = FlakyBroker::new(0, None);
    let r = block_on(outbox::relay_batch(&storage, &broker, &settings(3), &mut t0)).unwrap();
    assert_eq!(inspect(&storage.connection(), "a").unwrap().unwrap().state, State::Delivered);
    assert_eq!(broker.confirmed(), ["a", "c"]);
    assert_eq!((r.delivered, r.errors.len(), outcomes(&r)), (2, 1, r.claimed), "{r:?}");
}

/// A mark-and-count refused as one statement costs a round trip, not a row: the relay
/// marks alone and counts the next row alone, and every row has one outcome.
#[test]
fn a_refused_mark_and_count_is_run_again_as_two_statements() {
    let mut db = memory();
    put(&mut db, &[message("a"), message("b")]);
    let storage = Storage::new(db);
    let broker = FlakyBroker::new(0, None);
    let combined = Faulty(&storage, Fault::Refused);
    let r = block_on(outbox::relay_batch(&combined, &broker, &settings(3), &mut t0)).unwrap();
    assert_eq!(broker.confirmed(), ["a", "b"], "{r:?}");
    assert_eq!((r.delivered, outcomes(&r)), (2, r.claimed), "{r:?}");
    let b = inspect(&storage.connection(), "b").unwrap().unwrap();
    assert_eq!((b.state, b.attempts), (State::Delivered, 1));
}

/// A mark-and-count whose answer was lost after its commit: the mark run again is
/// stale, and the next row's count run again spends an attempt without a publish (the
/// limit docs/outbox.md names); the row is still published.
#[test]
fn a_lost_answer_of_a_mark_and_count_spends_one_attempt_and_loses_no_row() {
    let mut db = memory();
    put(&mut db, &[message("a"), message("b")]);
    let storage = Storage::new(db);
    let broker = FlakyBroker::new(0, None);
    let combined = Faulty(&storage, Fault::AnswerLost);
    let r = block_on(outbox::relay_batch(&combined, &broker, &settings(3), &mut t0)).unwrap();
    assert_eq!(broker.confirmed(), ["a", "b"], "{r:?}");
    assert_eq!((r.delivered, r.stale, outcomes(&r)), (1, 1, r.claimed), "{r:?}");
    let b = inspect(&storage.connection(), "b").unwrap().unwrap();
    assert_eq!((b.state, b.attempts), (State::Delivered, 2));
}

/// The mark applied while the next row's count is stale (another relay took it):
/// delivered 1, stale 1, the next row unpublished and uncounted.
#[test]
fn a_mark_applied_and_a_stale_count_are_told_apart() {
    let mut db = memory();
    put(&mut db, &[message("a"), message("b")]);
    let storage = Storage::new(db);
    let broker = FlakyBroker::new(0, None);
    let combined = Faulty(&storage, Fault::NextTaken);
    let r = block_on(outbox::relay_batch(&combined, &broker, &settings(3), &mut t0)).unwrap();
    assert_eq!(broker.confirmed(), ["a"], "{r:?}");
    assert_eq!((r.delivered, r.stale, r.errors.len()), (1, 1, 0), "{r:?}");
    assert_eq!(inspect(&storage.connection(), "b").unwrap().unwrap().attempts, 0);
}

/// A row behind one out of attempts counts its own publish: `g`, `p` (out of
/// attempts: dead unpublished), `r` (delivered with one attempt); `p`'s count untouched.
#[test]
fn a_row_behind_a_dead_one_is_counted_itself() {
    let mut db = memory();
    put(&mut db, &[message("g"), message("p")]);
    assert_eq!(ids(&claim_due(&db, 1, 10 * MIN, t0()).unwrap()), ["g"]);
    for round in 0..3u32 {
        let batch = claim_due(&db, 10, MIN, t0() + round * MIN).unwrap();
        assert_eq!(ids(&batch), ["p"]);
        assert_eq!(outbox::begin_attempt(&db, &batch.claimed[0].lease).unwrap(), Mark::Applied);
    }
    put(&mut db, &[message("r")]);
    let storage = Storage::new(db);
    let broker = FlakyBroker::new(0, None);
    let mut clock = || t0() + 10 * MIN;
    let r = block_on(outbox::relay_batch(&storage, &broker, &settings(3), &mut clock)).unwrap();
    assert_eq!((r.claimed, r.delivered, r.dead), (3, 2, 1), "{r:?}");
    assert_eq!(broker.confirmed(), ["g", "r"]);
    let p = inspect(&storage.connection(), "p").unwrap().unwrap();
    let rr = inspect(&storage.connection(), "r").unwrap().unwrap();
    assert_eq!((p.state, p.attempts), (State::Dead, 3));
    assert_eq!((rr.state, rr.attempts), (State::Delivered, 1));
}

/// A row after a failed publish counts its own (no count carried over): `a`, `b` (its
/// publish fails), `c` delivered with one attempt.
#[test]
fn a_row_after_a_failed_publish_is_counted_itself() {
    let mut db = memory();
    put(&mut db, &[message("a"), message("b"), message("c")]);
    let storage = Storage::new(db);
    let broker = FlakyBroker::new(2, None);
    let r = block_on(outbox::relay_batch(&storage, &broker, &settings(3), &mut t0)).unwrap();
    assert_eq!((r.delivered, r.retried), (2, 1), "{r:?}");
    let c = inspect(&storage.connection(), "c").unwrap().unwrap();
    assert_eq!((c.state, c.attempts), (State::Delivered, 1));
}
