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

/// A storage whose `begin_attempt` fails and changes nothing (the database refused it).
struct BeginFails<'a>(&'a Storage);

impl OutboxStorage for BeginFails<'_> {
    fn claim_due(
        &self,
        batch: usize,
        lease: Duration,
        now: SystemTime,
    ) -> impl Future<Output = Result<Batch, OutboxError>> + Send {
        self.0.claim_due(batch, lease, now)
    }
    fn begin_attempt(&self, _: &Lease) -> impl Future<Output = Result<Mark, OutboxError>> + Send {
        std::future::ready(Err(OutboxError::Database("database is locked".into())))
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
    fn mark_delivered_and_begin(
        &self,
        _: &Lease,
        _: SystemTime,
        _: &Lease,
    ) -> impl Future<Output = Result<(Mark, Mark), OutboxError>> + Send {
        std::future::ready(Err(OutboxError::Database("database is locked".into())))
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
    let r = block_on(outbox::relay_batch(&BeginFails(&storage), &broker, &settings(3), &mut t0))
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
