//! Attacks on the SQLite outbox's promises, from the guide and the rustdoc: the ones
//! every engine runs (`idemcache_sql::outbox::testing::producers`: rows whose counters
//! sit at the top of their range, which must be reported rather than stall a claim;
//! the largest headers), a skip saying why the side-by-side producers' scenarios do
//! not apply, and SQLite's own: a backoff that extreme settings must not shorten to
//! nothing, and a slow broker, which must not kill rows the relay never published.
//! Time is a clock moved by hand: nothing sleeps.

use std::sync::Mutex;
use std::time::Duration;

use idemcache::store::block_on;
use idemcache_sql::outbox::testing::producers;
use idemcache_sql::outbox::testing::{self, t0, HandClock};
use idemcache_sqlite::outbox::{
    self, claim_due, enqueue, mark_failed, Mark, OutboxError, OutboxMessage, PublishError,
    Publisher, RelaySettings, Retry, Storage,
};
use idemcache_sqlite::rusqlite::{Connection, TransactionBehavior};

mod common;
use common::TempDb;

const MIN: Duration = Duration::from_secs(60);

fn message(id: &str) -> OutboxMessage {
    OutboxMessage::new(id, "orders", id.as_bytes().to_vec())
}

fn put(db: &mut Connection, messages: &[OutboxMessage]) {
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    for m in messages {
        enqueue(&tx, m).unwrap();
    }
    tx.commit().unwrap();
}

fn memory() -> Connection {
    let db = Connection::open_in_memory().unwrap();
    outbox::ensure_schema(&db).unwrap();
    db
}

/// A backoff longer than the clock can add (a cap of `Duration::MAX`) must not turn into
/// no backoff at all, the failed row retried at once in a hot loop against a failing
/// broker: such a policy is refused, and the longest one taken keeps its wait.
#[test]
fn an_extreme_backoff_never_makes_a_failed_row_due_at_once() {
    let mut db = memory();
    put(&mut db, &[message("m")]);
    // A cap the clock cannot add is refused; the longest cap taken keeps its backoff.
    assert!(matches!(
        Retry::new(Duration::MAX, Duration::MAX, 3),
        Err(OutboxError::InvalidInput(_))
    ));
    let longest = idemcache::MAX_DURATION;
    let retry = Retry::new(longest, longest, 3).unwrap();
    let lease = claim_due(&db, 1, MIN, t0()).unwrap().claimed.remove(0).lease;
    assert_eq!(mark_failed(&db, &lease, "nack", t0(), &retry).unwrap(), Mark::Applied);
    let again = claim_due(&db, 1, MIN, t0() + Duration::from_secs(1)).unwrap();
    assert!(again.claimed.is_empty(), "retried a second after a failure with an endless backoff");
}

/// Counters at the top of their range, as every engine meets them
/// (`idemcache_sql::outbox::testing::producers::a_row_at_the_top_of_its_counters_does_not_stall_the_claim`).
#[test]
fn a_row_at_the_top_of_its_counters_does_not_stall_the_claim() {
    let file = TempDb::new("outbox_attacks", "top");
    let storage = Storage::new(file.open("wal", Duration::from_secs(5)));
    outbox::ensure_schema(&storage.connection()).unwrap();
    let put = |messages: Vec<OutboxMessage>| {
        put(&mut file.open("wal", Duration::from_secs(5)), &messages);
        std::future::ready(())
    };
    let raise = |column: &'static str, id: String| {
        let set = format!(
            "UPDATE idemcache_outbox SET {column} = 9223372036854775807 WHERE message_id = ?1"
        );
        file.open("wal", Duration::from_secs(5)).execute(&set, [id]).unwrap();
        std::future::ready(())
    };
    block_on(producers::a_row_at_the_top_of_its_counters_does_not_stall_the_claim(
        &storage, put, raise,
    ));
}

/// The largest headers, as every engine stores them
/// (`idemcache_sql::outbox::testing::the_largest_headers_check_accepts_are_read_back_as_enqueued`).
#[test]
fn the_largest_headers_check_accepts_are_read_back_as_enqueued() {
    let file = TempDb::new("outbox_attacks", "headers");
    let storage = Storage::new(file.open("wal", Duration::from_secs(5)));
    outbox::ensure_schema(&storage.connection()).unwrap();
    let put = |messages: Vec<OutboxMessage>| {
        put(&mut file.open("wal", Duration::from_secs(5)), &messages);
        std::future::ready(())
    };
    block_on(testing::the_largest_headers_check_accepts_are_read_back_as_enqueued(&storage, put));
}

/// The scenarios of producers open side by side (commits of one key that would cross,
/// an open enqueue beside other keys, many producers of one key at once) do not apply:
/// SQLite has one writer, so a second producer's transaction waits for the whole of
/// the first's, and no two commits can cross. Skipped, saying so.
#[test]
fn producers_side_by_side_cannot_meet_on_sqlite() {
    eprintln!(
        "skipped: idemcache_sql::outbox::testing::producers::run needs two \
         open write transactions, and SQLite has one writer"
    );
}

/// A broker that confirms every message but takes `latency` (on the hand clock) to.
struct Slow {
    clock: HandClock,
    latency: Duration,
    published: Mutex<Vec<String>>,
}

impl Publisher for Slow {
    fn publish(
        &self,
        message: &OutboxMessage,
    ) -> impl std::future::Future<Output = Result<(), PublishError>> + Send {
        self.clock.advance(self.latency);
        self.published.lock().unwrap().push(message.id().to_owned());
        std::future::ready(Ok(()))
    }
}

/// One relay alone, the defaults (batch 100, lease 30 s, 10 attempts), a broker that
/// confirms everything but slowly (4 s a confirm: a degraded broker, not a failing
/// one). The relay leaves the rows past its lease unpublished, but their claim counted
/// an attempt: a row deep in the backlog is claimed and left more often than the
/// attempts allow, and the relay then kills it as "out of attempts" without ever
/// publishing it. The guide calls a too-short lease wasteful, never lossy: every row
/// must be published, and none dead.
#[test]
fn a_slow_broker_kills_no_row_the_relay_never_published() {
    let mut db = memory();
    let all: Vec<OutboxMessage> = (0..100).map(|i| message(&format!("m{i:03}"))).collect();
    put(&mut db, &all);
    let clock = HandClock::at(t0());
    let broker = Slow {
        clock: clock.clone(),
        latency: Duration::from_secs(4),
        published: Mutex::new(Vec::new()),
    };
    let storage = Storage::new(db);
    let settings = RelaySettings::default();
    let mut now = || clock.now();
    let mut dead = 0;
    loop {
        let report =
            idemcache::store::block_on(outbox::relay_batch(&storage, &broker, &settings, &mut now))
                .unwrap();
        dead += report.dead;
        if report.claimed == 0 {
            break;
        }
    }
    let published = broker.published.lock().unwrap().len();
    assert_eq!((published, dead), (100, 0), "rows killed unpublished by a slow broker");
}
