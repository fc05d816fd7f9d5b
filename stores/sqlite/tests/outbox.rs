//! The SQLite outbox against real SQLite (files in the temp dir, WAL): what an enqueue
//! promises on every engine (the shared scenario), a duplicate id leaves the
//! transaction usable, two relays never lease one row, a lapsed lease is
//! claimed again under a higher token and the old token's marks are refused, rows of
//! one aggregate key go one at a time in order, failures back off and die, dead rows
//! are listed and requeued, delivered rows are purged in batches, unreadable rows are
//! `Corrupt` (never a panic), and a relay killed mid-batch loses nothing. Time is a
//! manual clock handed to each call: nothing sleeps.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use idemcache::store::block_on;
use idemcache_sql::outbox::decode;
use idemcache_sql::outbox::testing::{self, ids, message, t0, FlakyBroker, HandClock};
use idemcache_sqlite::outbox::{
    self, begin_attempt, claim_due, enqueue, inspect, list_dead, mark_delivered, mark_failed,
    purge_delivered, relay_loop, requeue, Mark, OutboxError, OutboxMessage, RelaySettings, Retry,
    Storage,
};
use idemcache_sqlite::rusqlite::{Connection, TransactionBehavior};

mod common;
use common::TempDb;

/// `relay_batch`'s own rules, each test against a mutation the suites let through.
#[path = "outbox/relay_batch.rs"]
mod relay_batch;

const MIN: Duration = Duration::from_secs(60);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn memory() -> Connection {
    let db = Connection::open_in_memory().unwrap();
    outbox::ensure_schema(&db).unwrap();
    db
}

fn put(db: &mut Connection, messages: &[OutboxMessage]) {
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    for m in messages {
        enqueue(&tx, m).unwrap();
    }
    tx.commit().unwrap();
}

/// What an enqueue promises on every engine
/// (`idemcache_sql::outbox::testing::enqueue_commits_with_the_change_byte_for_byte`),
/// through this driver's `Storage`.
#[test]
fn enqueue_commits_with_the_change_byte_for_byte() {
    let file = TempDb::new("outbox", "enqueue");
    let storage = Storage::new(file.open("wal", secs(5)));
    outbox::ensure_schema(&storage.connection()).unwrap();
    let put = |messages: Vec<OutboxMessage>| {
        put(&mut file.open("wal", secs(5)), &messages);
        std::future::ready(())
    };
    let rolled_back = |m: OutboxMessage| {
        let mut db = file.open("wal", secs(5));
        let tx = db.transaction().unwrap();
        let enqueued = enqueue(&tx, &m);
        tx.rollback().unwrap();
        std::future::ready(enqueued)
    };
    block_on(testing::enqueue_commits_with_the_change_byte_for_byte(&storage, put, rolled_back));
}

/// SQLite's own: a duplicate id leaves the transaction usable, and what else it
/// enqueued commits.
#[test]
fn after_a_duplicate_id_the_transaction_goes_on() {
    let mut db = memory();
    put(&mut db, &[message("m-1")]);
    let tx = db.transaction().unwrap();
    let e = enqueue(&tx, &message("m-1")).unwrap_err();
    assert!(matches!(&e, OutboxError::Duplicate(id) if id == "m-1"), "{e:?}");
    enqueue(&tx, &message("m-2")).unwrap();
    tx.commit().unwrap();
    assert_eq!(ids(&claim_due(&db, 10, MIN, t0()).unwrap()), ["m-1", "m-2"]);
}

#[test]
fn a_lapsed_lease_is_claimed_again_under_a_higher_token_and_the_old_one_is_refused() {
    let mut db = memory();
    put(&mut db, &[message("m-1")]);
    let old = claim_due(&db, 10, MIN, t0()).unwrap().claimed.remove(0).lease;
    // The relay that holds it is gone; at the lease's end the row is due again.
    assert!(claim_due(&db, 10, MIN, t0() + MIN - secs(1)).unwrap().claimed.is_empty());
    let new = claim_due(&db, 10, MIN, t0() + MIN).unwrap().claimed.remove(0).lease;
    assert_eq!((new.token, new.attempts), (2, 0), "a claim counts no attempt");
    assert_eq!(mark_delivered(&db, &old, t0() + MIN).unwrap(), Mark::Stale);
    assert_eq!(begin_attempt(&db, &old).unwrap(), Mark::Stale);
    let retry = Retry::default();
    assert_eq!(mark_failed(&db, &old, "late", t0() + MIN, &retry).unwrap(), Mark::Stale);
    let row = inspect(&db, "m-1").unwrap().unwrap();
    assert_eq!((row.state, row.token, row.last_error), (outbox_state("leased"), 2, None));
    assert_eq!(mark_delivered(&db, &new, t0() + MIN).unwrap(), Mark::Applied);
    assert_eq!(mark_delivered(&db, &new, t0() + MIN).unwrap(), Mark::Stale);
}

/// Counts the publish `lease` begins, as the relay does: the lease it charges then.
fn begin(db: &Connection, lease: &outbox::Lease) -> outbox::Lease {
    assert_eq!(begin_attempt(db, lease).unwrap(), Mark::Applied);
    decode::begun(lease)
}

fn outbox_state(name: &str) -> idemcache_sql::outbox::State {
    use idemcache_sql::outbox::State;
    match name {
        "pending" => State::Pending,
        "leased" => State::Leased,
        "delivered" => State::Delivered,
        _ => State::Dead,
    }
}

#[test]
fn rows_of_one_aggregate_key_go_one_at_a_time_in_order() {
    let mut db = memory();
    let k = |id: &str, key: &str| message(id).with_aggregate_key(key);
    put(&mut db, &[k("a1", "A"), k("a2", "A"), k("b1", "B"), message("n1"), k("a3", "A")]);
    let first = claim_due(&db, 10, MIN, t0()).unwrap();
    assert_eq!(ids(&first), ["a1", "b1", "n1"]);
    let a1 = first.claimed[0].lease.clone();
    // a1 failed: pending again, and a2 still waits behind it, however late it is.
    let retry = Retry::new(secs(1), secs(1), 5).unwrap();
    assert_eq!(mark_failed(&db, &a1, "broker down", t0(), &retry).unwrap(), Mark::Applied);
    assert!(claim_due(&db, 10, MIN, t0()).unwrap().claimed.is_empty());
    let again = claim_due(&db, 10, MIN, t0() + secs(1)).unwrap();
    assert_eq!(ids(&again), ["a1"]);
    assert_eq!(mark_delivered(&db, &again.claimed[0].lease, t0()).unwrap(), Mark::Applied);
    let next = claim_due(&db, 10, MIN, t0() + secs(1)).unwrap();
    assert_eq!(ids(&next), ["a2"], "a3 waits for a2");
    assert_eq!(mark_delivered(&db, &next.claimed[0].lease, t0()).unwrap(), Mark::Applied);
    assert_eq!(ids(&claim_due(&db, 10, MIN, t0() + secs(1)).unwrap()), ["a3"]);
}

#[test]
fn failures_back_off_then_die_and_a_requeued_row_starts_over() {
    let mut db = memory();
    put(&mut db, &[message("m-1")]);
    let retry = Retry::new(secs(10), secs(15), 3).unwrap();
    let mut now = t0();
    let mut waits = Vec::new();
    for attempt in 1..=3 {
        let batch = claim_due(&db, 1, MIN, now).unwrap();
        let lease = &batch.claimed[0].lease;
        assert_eq!((lease.message_id.as_str(), lease.attempts), ("m-1", attempt - 1));
        let lease = &begin(&db, lease);
        let why = format!("no confirm, attempt {attempt}");
        assert_eq!(mark_failed(&db, lease, &why, now, &retry).unwrap(), Mark::Applied);
        let row = inspect(&db, "m-1").unwrap().unwrap();
        if attempt < 3 {
            assert_eq!(row.state, outbox_state("pending"));
            waits.push(row.next_attempt_at.duration_since(now).unwrap());
            // Not due a moment before its backoff ends; due at its end.
            let early = row.next_attempt_at - Duration::from_micros(1);
            assert!(claim_due(&db, 1, MIN, early).unwrap().claimed.is_empty());
            now = row.next_attempt_at;
        } else {
            assert_eq!(row.state, outbox_state("dead"));
            assert_eq!(row.last_error.as_deref(), Some("no confirm, attempt 3"));
        }
    }
    assert_eq!(waits, [secs(10), secs(15)], "doubled, then capped");
    let dead = list_dead(&db, 10).unwrap();
    assert_eq!(dead.iter().map(|r| r.message.id()).collect::<Vec<_>>(), ["m-1"]);
    assert!(claim_due(&db, 10, MIN, now + 1000 * MIN).unwrap().claimed.is_empty());
    assert!(requeue(&db, "m-1").unwrap());
    assert!(!requeue(&db, "m-1").unwrap(), "no longer dead");
    assert!(!requeue(&db, "nobody").unwrap());
    let back = claim_due(&db, 10, MIN, now).unwrap();
    assert_eq!(back.claimed[0].lease.attempts, 0, "a requeued row has its attempts again");
    assert_eq!(back.claimed[0].lease.token, 4, "and its tokens still grow");
    assert!(list_dead(&db, 10).unwrap().is_empty());
}

#[test]
fn a_row_whose_relays_keep_dying_runs_out_of_attempts_unpublished() {
    let mut db = memory();
    put(&mut db, &[message("poison")]);
    // Two claims whose relays died before marking anything: their leases lapse.
    for n in 0..2 {
        let batch = claim_due(&db, 10, MIN, t0() + n * MIN).unwrap();
        assert_eq!(ids(&batch), ["poison"]);
        begin(&db, &batch.claimed[0].lease);
    }
    let settings = RelaySettings::default()
        .with_lease(MIN)
        .unwrap()
        .with_retry(Retry::new(secs(1), secs(1), 2).unwrap());
    let broker = FlakyBroker::new(0, None);
    let storage = Storage::new(db);
    let mut clock = || t0() + 2 * MIN;
    let report =
        idemcache::store::block_on(outbox::relay_batch(&storage, &broker, &settings, &mut clock))
            .unwrap();
    assert_eq!((report.claimed, report.dead, broker.calls()), (1, 1, 0));
    let dead = list_dead(&storage.connection(), 10).unwrap();
    assert_eq!(dead[0].last_error.as_deref(), Some("2 publishes begun, none marked"));
}

/// A broker that confirms every message but one, whose publish never answers (the
/// relay publishing it is killed there, every time: a poison message).
struct HangsOn(&'static str, std::sync::Mutex<Vec<String>>);

impl outbox::Publisher for HangsOn {
    fn publish(
        &self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<(), outbox::PublishError>> + Send {
        let hang = message.id() == self.0;
        if !hang {
            self.1.lock().unwrap().push(message.id().to_owned());
        }
        std::future::poll_fn(move |_| if hang { Poll::Pending } else { Poll::Ready(Ok(())) })
    }
}

/// A relay killed while it publishes the poison row leaves the rows behind it in its
/// batch leased, never tried, and uncounted. When the poison row's attempts run out, it
/// alone is dead; the innocent rows behind it are published. (Before, every row of the
/// batch was marked dead, unpublished.)
#[test]
fn a_poison_row_runs_out_of_attempts_alone_and_the_rows_behind_it_are_published() {
    let mut db = memory();
    let names = ["a", "b", "poison", "c", "d", "e", "f", "g"];
    put(&mut db, &names.map(message));
    let settings = RelaySettings::default()
        .with_lease(MIN)
        .unwrap()
        .with_retry(Retry::new(secs(1), secs(1), 3).unwrap());
    let broker = HangsOn("poison", Default::default());
    let storage = Storage::new(db);
    let waker = Waker::from(Arc::new(Nobody));
    let mut finished = None;
    // Each round is a relay's life: it runs until the poison's publish, and is killed
    // there (its future dropped); the next starts once the lease has lapsed.
    for round in 0..5u32 {
        let mut clock = || t0() + round * 2 * MIN;
        let mut relay = pin!(outbox::relay_batch(&storage, &broker, &settings, &mut clock));
        if let Poll::Ready(report) = relay.as_mut().poll(&mut Context::from_waker(&waker)) {
            finished = Some((round, report.unwrap()));
            break;
        }
    }
    let (round, report) = finished.expect("the poison row never ran out of attempts");
    assert_eq!(round, 3, "three attempts, then the fourth claim marks it dead");
    assert_eq!((report.dead, report.delivered), (1, 5), "{report:?}");
    assert_eq!(*broker.1.lock().unwrap(), ["a", "b", "c", "d", "e", "f", "g"]);
    let dead = list_dead(&storage.connection(), 10).unwrap();
    let dead: Vec<&str> = dead.iter().map(|d| d.message.id()).collect();
    assert_eq!(dead, ["poison"]);
}

/// A broker that cannot be reached: not ready, and never asked to publish.
struct Down;

impl outbox::Publisher for Down {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), outbox::PublishError> {
        panic!("{} was claimed and published while the broker was down", message.id())
    }

    async fn ready(&self) -> Result<(), outbox::PublishError> {
        Err(outbox::PublishError::new("connecting to the broker: Connection refused"))
    }
}

/// While the broker cannot be reached the relay claims nothing: an outage as long as
/// a row's whole retry span uses up none of its attempts. (Before, each claim counted
/// an attempt and each publish failed, and every row was dead ~8.5 min into an outage
/// with the default retries.)
#[test]
fn an_unreachable_broker_claims_nothing_and_uses_no_attempt() {
    let file = TempDb::new("outbox", "broker-down");
    let mut db = file.open("wal", secs(5));
    outbox::ensure_schema(&db).unwrap();
    put(&mut db, &[message("a"), message("b")]);
    let storage = Storage::new(file.open("wal", secs(5)));
    let mut reports = Vec::new();
    let mut waits = 0;
    {
        let wait = |_| {
            waits += 1;
            // The third wait never ends: the loop is stopped there.
            let stop = waits >= 3;
            std::future::poll_fn(move |_| if stop { Poll::Pending } else { Poll::Ready(()) })
        };
        let report = |batch: Result<outbox::BatchReport, OutboxError>| reports.push(batch);
        let relay = relay_loop(storage, Down, RelaySettings::default(), t0, wait, report);
        let mut relay = pin!(relay);
        let waker = Waker::from(Arc::new(Nobody));
        for _ in 0..10 {
            assert!(relay.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
        }
    }
    assert_eq!(waits, 3);
    assert_eq!(reports.len(), 3);
    for batch in &reports {
        assert!(matches!(batch, Err(OutboxError::BrokerUnavailable(_))), "{batch:?}");
    }
    for id in ["a", "b"] {
        let row = inspect(&db, id).unwrap().unwrap();
        assert_eq!((row.state, row.attempts), (outbox_state("pending"), 0), "{id}");
    }
}

/// The life every driver's outbox lives (`idemcache_sql::outbox::testing::a_rows_life`),
/// through this driver's `Storage`.
#[test]
fn a_rows_life_as_every_driver_lives_it() {
    let file = TempDb::new("outbox", "life");
    let storage = Storage::new(file.open("wal", secs(5)));
    outbox::ensure_schema(&storage.connection()).unwrap();
    let put = |messages: Vec<OutboxMessage>| {
        put(&mut file.open("wal", secs(5)), &messages);
        std::future::ready(())
    };
    block_on(testing::a_rows_life(&storage, put));
}

/// A poison message dies alone, the rows behind it keep their attempts
/// (`idemcache_sql::outbox::testing::a_poison_message_dies_alone`).
#[test]
fn a_poison_message_dies_alone() {
    let file = TempDb::new("outbox", "poison");
    let storage = Storage::new(file.open("wal", secs(5)));
    outbox::ensure_schema(&storage.connection()).unwrap();
    let put = |messages: Vec<OutboxMessage>| {
        put(&mut file.open("wal", secs(5)), &messages);
        std::future::ready(())
    };
    block_on(testing::a_poison_message_dies_alone(&storage, put));
}

#[test]
fn a_dead_row_holds_back_its_key_until_requeued_and_delivered() {
    let mut db = memory();
    put(&mut db, &[message("k1").with_aggregate_key("K"), message("k2").with_aggregate_key("K")]);
    let once = Retry::new(secs(1), secs(1), 1).unwrap();
    let lease = claim_due(&db, 10, MIN, t0()).unwrap().claimed.remove(0).lease;
    let lease = begin(&db, &lease);
    assert_eq!(mark_failed(&db, &lease, "poison", t0(), &once).unwrap(), Mark::Applied);
    assert!(claim_due(&db, 10, MIN, t0() + 1000 * MIN).unwrap().claimed.is_empty());
    assert!(requeue(&db, "k1").unwrap());
    let lease = claim_due(&db, 10, MIN, t0()).unwrap().claimed.remove(0).lease;
    assert_eq!(mark_delivered(&db, &lease, t0()).unwrap(), Mark::Applied);
    assert_eq!(ids(&claim_due(&db, 10, MIN, t0()).unwrap()), ["k2"]);
}

#[test]
fn delivered_rows_are_purged_in_batches_and_nothing_else_is() {
    let mut db = memory();
    put(&mut db, &[message("d1"), message("d2"), message("d3"), message("pending")]);
    let batch = claim_due(&db, 3, MIN, t0()).unwrap();
    for (i, c) in batch.claimed.iter().enumerate() {
        let at = t0() + secs(10 * i as u64);
        assert_eq!(mark_delivered(&db, &c.lease, at).unwrap(), Mark::Applied);
    }
    let cutoff = t0() + secs(15); // d1 and d2 delivered before it
    assert_eq!(purge_delivered(&db, cutoff, 0).unwrap(), 0);
    assert_eq!(purge_delivered(&db, cutoff, 1).unwrap(), 1);
    assert!(inspect(&db, "d1").unwrap().is_none(), "oldest first");
    assert_eq!(purge_delivered(&db, cutoff, 5).unwrap(), 1);
    assert_eq!(purge_delivered(&db, t0() + 1000 * MIN, 5).unwrap(), 1);
    assert!(inspect(&db, "pending").unwrap().is_some(), "an undelivered row is never purged");
}

/// Unreadable rows as every driver meets them
/// (`idemcache_sql::outbox::testing::unreadable_rows_are_corrupt_and_hold_back_no_other`),
/// then SQLite's own: other columns of the wrong type, written by hand.
#[test]
fn unreadable_rows_are_corrupt_never_a_panic_and_do_not_block_the_others() {
    let file = TempDb::new("outbox", "corrupt");
    let storage = Storage::new(file.open("wal", secs(5)));
    outbox::ensure_schema(&storage.connection()).unwrap();
    let put = |messages: Vec<OutboxMessage>| {
        put(&mut file.open("wal", secs(5)), &messages);
        std::future::ready(())
    };
    let spoil = || {
        let spoiled =
            "UPDATE idemcache_outbox SET headers = x'0009' WHERE message_id = 'bad-headers';
                       UPDATE idemcache_outbox SET state = 9 WHERE message_id = 'bad-state';";
        file.open("wal", secs(5)).execute_batch(spoiled).unwrap();
        std::future::ready(())
    };
    block_on(testing::unreadable_rows_are_corrupt_and_hold_back_no_other(&storage, put, spoil));
    let db = file.open("wal", secs(5));
    db.execute_batch("UPDATE idemcache_outbox SET attempts = 'many' WHERE message_id = 'good'")
        .unwrap();
    assert!(matches!(inspect(&db, "good"), Err(OutboxError::Corrupt(_))));
    db.execute_batch("UPDATE idemcache_outbox SET state = 3, attempts = 1 WHERE message_id = 'good';
                      UPDATE idemcache_outbox SET state = 3, topic = x'ff' WHERE message_id = 'bad-state'")
        .unwrap();
    assert!(matches!(list_dead(&db, 10), Err(OutboxError::Corrupt(_))));
}

#[test]
fn two_relays_claiming_at_once_never_lease_one_row() {
    let file = TempDb::new("outbox", "two-relays");
    let mut db = file.open("wal", secs(10));
    outbox::ensure_schema(&db).unwrap();
    let all: Vec<OutboxMessage> = (0..400).map(|i| message(&format!("m-{i}"))).collect();
    put(&mut db, &all);
    let relays: Vec<_> = (0..2)
        .map(|_| {
            let conn = file.open("wal", secs(10));
            std::thread::spawn(move || {
                let mut got = Vec::new();
                loop {
                    let batch = claim_due(&conn, 7, 100 * MIN, t0()).unwrap();
                    if batch.claimed.is_empty() {
                        return got;
                    }
                    got.extend(batch.claimed.into_iter().map(|c| c.message.id().to_owned()));
                }
            })
        })
        .collect();
    let got: Vec<Vec<String>> = relays.into_iter().map(|r| r.join().unwrap()).collect();
    let mut seen = BTreeSet::new();
    for id in got.iter().flatten() {
        assert!(seen.insert(id.clone()), "{id} leased twice");
    }
    assert_eq!(seen.len(), 400);
    assert!(got.iter().all(|g| !g.is_empty()) || got.iter().any(|g| g.len() == 400));
}

struct Nobody;
impl Wake for Nobody {
    fn wake(self: Arc<Self>) {}
}

/// Pending once, then ready: a timer that has fired by the next poll.
struct Tick(bool);
impl Future for Tick {
    type Output = ();
    fn poll(mut self: std::pin::Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if std::mem::replace(&mut self.0, true) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

#[test]
fn a_relay_killed_mid_batch_loses_nothing_and_failures_are_retried() {
    let file = TempDb::new("outbox", "killed");
    let mut db = file.open("wal", secs(5));
    outbox::ensure_schema(&db).unwrap();
    let mut all = Vec::new();
    for i in 0..40 {
        let m = message(&format!("m-{i:02}"));
        all.push(if i % 3 == 0 { m.with_aggregate_key(format!("order-{}", i % 2)) } else { m });
    }
    put(&mut db, &all);
    let clock = HandClock::at(t0());
    let broker = FlakyBroker::new(0, None);
    let settings = RelaySettings::default()
        .with_batch(8)
        .unwrap()
        .with_lease(secs(30))
        .unwrap()
        .with_poll(secs(1))
        .unwrap()
        .with_retry(Retry::new(secs(1), secs(4), 50).unwrap());
    let waker = Waker::from(Arc::new(Nobody));
    let run = |publisher: FlakyBroker, polls: usize| {
        let (now, tick) = (clock.clone(), clock.clone());
        let relay = relay_loop(
            Storage::new(file.open("wal", secs(5))),
            publisher,
            settings,
            move || now.now(),
            // Each wait is a tick of the manual clock, over by the next poll.
            move |pause| {
                tick.advance(pause);
                Tick(false)
            },
            |report| {
                report.unwrap();
            },
        );
        let mut relay = pin!(relay);
        for _ in 0..polls {
            let _ = relay.as_mut().poll(&mut Context::from_waker(&waker));
        }
        // Dropped here: killed, whatever it was doing.
    };
    // The first relay hangs in its second batch's fourth publish, then is killed.
    let first = broker.sharing(3, Some(12));
    run(first.clone(), 50);
    assert_eq!(first.calls(), 12, "killed while publishing");
    let leased: i64 = db
        .query_row("SELECT count(*) FROM idemcache_outbox WHERE state = 1", [], |r| r.get(0))
        .unwrap();
    assert!(leased > 0, "the killed relay left rows leased");
    // A second relay: the leases lapse on its clock, and it delivers everything.
    run(broker.sharing(3, None), 400);
    let delivered: i64 = db
        .query_row("SELECT count(*) FROM idemcache_outbox WHERE state = 2", [], |r| r.get(0))
        .unwrap();
    assert_eq!(delivered, 40, "every row delivered");
    let confirmed = broker.confirmed();
    let unique: BTreeSet<&String> = confirmed.iter().collect();
    assert_eq!(unique.len(), 40, "every message confirmed by the broker");
    // Rows of one aggregate key were first confirmed in enqueue order.
    let mut first_seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut once = BTreeSet::new();
    for id in &confirmed {
        if !once.insert(id.clone()) {
            continue;
        }
        let m = all.iter().find(|m| m.id() == id).unwrap();
        if let Some(key) = m.aggregate_key() {
            first_seen.entry(key.to_owned()).or_default().push(id.clone());
        }
    }
    for (key, order) in first_seen {
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order, sorted, "key {key}");
    }
    let retried: i64 = db
        .query_row("SELECT count(*) FROM idemcache_outbox WHERE attempts > 1", [], |r| r.get(0))
        .unwrap();
    assert!(retried > 0, "some publishes failed and were retried");
}
