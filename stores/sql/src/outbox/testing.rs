//! What every driver's outbox suite uses to try its relay (feature `test-utils`): a
//! broker that fails and hangs on cue ([`FlakyBroker`]), a clock moved by hand
//! ([`HandClock`]), and the scenarios written once for every driver: what an enqueue
//! promises ([`enqueue_commits_with_the_change_byte_for_byte`]), the largest headers
//! ([`the_largest_headers_check_accepts_are_read_back_as_enqueued`]), a row's whole life
//! through [`OutboxStorage`] and [`OutboxAdmin`] ([`a_rows_life`], on any executor), a
//! poison message's death ([`a_poison_message_dies_alone`], on any executor),
//! rows it cannot read ([`unreadable_rows_are_corrupt_and_hold_back_no_other`]),
//! relays claiming at once beside enqueues
//! ([`concurrent_relays_never_lease_one_row_nor_hold_up_an_enqueue`], on tokio) and a
//! relay killed mid-batch ([`a_relay_killed_mid_batch_loses_nothing`], on tokio); and,
//! in [`producers`], what producers at once and rows at the top of their counters must
//! not break.
//!
//! Invariant: the broker confirms a message (records it) only in a publish that answers
//! `Ok`; a publish it hangs never answers, as a broker that stopped responding, so that
//! the relay awaiting it can be killed mid-batch.

pub mod producers;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use super::{
    decode, relay_batch, relay_loop, Batch, Mark, OutboxAdmin, OutboxError, OutboxMessage,
    OutboxStorage, PublishError, Publisher, RelaySettings, Retry, State,
};

/// How long a scenario waits for an instant before it calls it a hang: a failure guard,
/// not a timing (nothing waits for it to pass).
pub const GUARD: Duration = Duration::from_secs(120);

/// The scenarios' first instant, on their clock moved by hand (2027-01-15).
pub fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

/// A message `id` on topic `orders`, its payload its id, with one header.
pub fn message(id: &str) -> OutboxMessage {
    OutboxMessage::new(id, "orders", id.as_bytes().to_vec()).with_header("kind", "created")
}

/// The ids of a batch's claimed messages, in claim order.
pub fn ids(batch: &Batch) -> Vec<&str> {
    batch.claimed.iter().map(|c| c.message.id()).collect()
}

/// What an enqueue promises on every engine, on an empty outbox: an enqueue rolled back
/// leaves nothing; ids are compared byte for byte (case, or a trailing space, makes
/// another message); a committed row is claimed once, read back as enqueued under its
/// first lease (token 1, no attempt begun), and not again within the lease; the lease's first
/// mark applies and a second is `Stale`; a duplicate id is `Duplicate` naming it and
/// changes nothing; an empty id is `InvalidInput`. `put` enqueues its messages in one
/// committed transaction; `rolled_back` enqueues one message in a transaction it then
/// rolls back, and returns what the enqueue answered.
pub async fn enqueue_commits_with_the_change_byte_for_byte<S, P, PF, R, RF>(
    storage: &S,
    put: P,
    rolled_back: R,
) where
    S: OutboxStorage + OutboxAdmin,
    P: Fn(Vec<OutboxMessage>) -> PF,
    PF: Future<Output = ()>,
    R: Fn(OutboxMessage) -> RF,
    RF: Future<Output = Result<(), OutboxError>>,
{
    let min = Duration::from_secs(60);
    rolled_back(message("lost")).await.unwrap();
    assert!(storage.claim_due(10, min, t0()).await.unwrap().claimed.is_empty());
    assert!(storage.inspect("lost").await.unwrap().is_none(), "rolled back with its change");

    put(vec![message("m-1"), message("M-1"), message("m-1 ")]).await;
    let first = storage.claim_due(10, min, t0()).await.unwrap();
    assert_eq!(ids(&first), ["m-1", "M-1", "m-1 "], "three messages, in enqueue order");
    let claimed = &first.claimed[0];
    assert_eq!(claimed.message, message("m-1"), "read back as enqueued, headers included");
    assert_eq!((claimed.lease.token, claimed.lease.attempts), (1, 0), "a claim counts none");
    let within = storage.claim_due(10, min, t0() + min - Duration::from_secs(1)).await.unwrap();
    assert!(within.claimed.is_empty(), "claimed once within its lease");
    assert_eq!(storage.mark_delivered(&claimed.lease, t0()).await.unwrap(), Mark::Applied);
    assert_eq!(storage.mark_delivered(&claimed.lease, t0()).await.unwrap(), Mark::Stale);

    let e = rolled_back(message("m-1")).await.unwrap_err();
    assert!(matches!(&e, OutboxError::Duplicate(id) if id == "m-1"), "{e:?}");
    let row = storage.inspect("m-1").await.unwrap().unwrap();
    assert_eq!((row.state, row.token), (State::Delivered, 1), "the duplicate changed nothing");
    let e = rolled_back(OutboxMessage::new("", "orders", Vec::new())).await.unwrap_err();
    assert!(matches!(e, OutboxError::InvalidInput(_)), "{e:?}");
}

/// The most headers [`OutboxMessage::check`] takes, each as long as it takes, are stored
/// (in a deterministic form, more than a 64 KiB `BLOB` holds) and read back as
/// enqueued, on every engine. `put` enqueues in one committed transaction.
pub async fn the_largest_headers_check_accepts_are_read_back_as_enqueued<S, P, PF>(
    storage: &S,
    put: P,
) where
    S: OutboxAdmin,
    P: Fn(Vec<OutboxMessage>) -> PF,
    PF: Future<Output = ()>,
{
    use super::{MAX_HEADERS, MAX_HEADER_NAME_LEN, MAX_HEADER_VALUE_LEN};
    let mut big = OutboxMessage::new("big", "orders", b"big".to_vec());
    for i in 0..MAX_HEADERS {
        let name = format!("{i:02}{}", "n".repeat(MAX_HEADER_NAME_LEN - 2));
        big = big.with_header(name, "v".repeat(MAX_HEADER_VALUE_LEN));
    }
    big.check().unwrap();
    assert!(big.encoded_headers().len() > 65_535, "more than a BLOB holds");
    put(vec![big.clone()]).await;
    assert_eq!(storage.inspect("big").await.unwrap().unwrap().message, big);
}

/// A row's whole life, on an empty outbox: a publish begun counts an attempt, its lease
/// lapses and the row is claimed again under a higher token with that attempt, and the
/// old token's count and marks are `Stale`;
/// rows of one aggregate key go one at a time, in order; a failure backs off (doubled,
/// capped) and the last attempt's failure makes the row dead, listed with its error and
/// holding back its key; a requeued row starts over (once: a second requeue changes
/// nothing) and is delivered, and its key's next row follows; delivered rows are purged
/// before a cutoff only, oldest first, in batches (`limit` 0 deletes nothing), and
/// undelivered rows stay. `put` enqueues its messages in one committed transaction.
pub async fn a_rows_life<S, P, PF>(storage: &S, put: P)
where
    S: OutboxStorage + OutboxAdmin,
    P: Fn(Vec<OutboxMessage>) -> PF,
    PF: Future<Output = ()>,
{
    let (min, secs) = (Duration::from_secs(60), Duration::from_secs);
    let k = |id: &str| message(id).with_aggregate_key("K");
    put(vec![k("k1"), k("k2"), message("n1")]).await;

    let first = storage.claim_due(10, min, t0()).await.unwrap();
    assert_eq!(ids(&first), ["k1", "n1"], "k2 waits behind k1");
    let old = first.claimed[0].lease.clone();
    assert_eq!(storage.begin_attempt(&old).await.unwrap(), Mark::Applied);
    let early = storage.claim_due(10, min, t0() + min - secs(1)).await.unwrap();
    assert!(early.claimed.is_empty(), "nothing is due before the leases lapse");
    let again = storage.claim_due(10, min, t0() + min).await.unwrap();
    assert_eq!(ids(&again), ["k1", "n1"]);
    let new = again.claimed[0].lease.clone();
    assert_eq!((new.token, new.attempts), (2, 1), "the attempt begun, not the claims");
    assert_eq!(again.claimed[1].lease.attempts, 0, "n1 was never tried");
    assert_eq!(storage.begin_attempt(&old).await.unwrap(), Mark::Stale);
    assert_eq!(storage.begin_attempt(&new).await.unwrap(), Mark::Applied);
    let new = decode::begun(&new);
    assert_eq!(storage.mark_delivered(&old, t0() + min).await.unwrap(), Mark::Stale);
    let retry = Retry::new(secs(10), secs(15), 3).unwrap();
    assert_eq!(storage.mark_failed(&old, "late", t0(), &retry).await.unwrap(), Mark::Stale);

    let failed = storage.mark_failed(&new, "down", t0() + min, &retry).await.unwrap();
    assert_eq!(failed, Mark::Applied);
    let row = storage.inspect("k1").await.unwrap().unwrap();
    assert_eq!(row.next_attempt_at, t0() + min + secs(15), "10 s doubled, capped at 15");
    let third = storage.claim_due(10, min, t0() + min + secs(15)).await.unwrap();
    assert_eq!(ids(&third), ["k1"], "n1 is still leased");
    let lease = &third.claimed[0].lease;
    assert_eq!(lease.attempts, 2);
    assert_eq!(storage.begin_attempt(lease).await.unwrap(), Mark::Applied);
    let lease = &decode::begun(lease);
    assert_eq!(storage.inspect("k1").await.unwrap().unwrap().attempts, 3);
    let died = storage.mark_failed(lease, "still down", t0(), &retry).await.unwrap();
    assert_eq!(died, Mark::Applied);
    let dead = storage.list_dead(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].state, dead[0].last_error.as_deref()), (State::Dead, Some("still down")));
    let later = storage.claim_due(10, min, t0() + 1000 * min).await.unwrap();
    assert_eq!(ids(&later), ["n1"], "k2 waits behind dead k1");
    let n1 = storage.mark_delivered(&later.claimed[0].lease, t0() + secs(5)).await.unwrap();
    assert_eq!(n1, Mark::Applied);

    assert!(storage.requeue("k1").await.unwrap());
    assert!(!storage.requeue("k1").await.unwrap(), "a pending row is not requeued");
    let back = storage.claim_due(10, min, t0()).await.unwrap();
    assert_eq!(ids(&back), ["k1"]);
    assert_eq!(back.claimed[0].lease.attempts, 0, "attempts start over");
    let k1 = storage.mark_delivered(&back.claimed[0].lease, t0() + secs(10)).await.unwrap();
    assert_eq!(k1, Mark::Applied);
    let k2 = storage.claim_due(10, min, t0()).await.unwrap();
    assert_eq!(ids(&k2), ["k2"], "the key's next row follows");

    assert_eq!(storage.purge_delivered(t0() + secs(30), 0).await.unwrap(), 0);
    assert_eq!(storage.purge_delivered(t0() + secs(30), 1).await.unwrap(), 1);
    assert!(storage.inspect("n1").await.unwrap().is_none(), "oldest first");
    assert_eq!(storage.purge_delivered(t0() + secs(9), 5).await.unwrap(), 0, "k1 is younger");
    assert_eq!(storage.purge_delivered(t0() + secs(30), 5).await.unwrap(), 1);
    assert!(storage.inspect("k1").await.unwrap().is_none());
    assert!(storage.inspect("k2").await.unwrap().is_some(), "undelivered rows stay");
}

/// A poison message (its publish kills the relay, every time) dies alone and
/// unpublished once each of its attempts was begun, and the rows claimed behind it,
/// never tried, keep theirs, on an empty outbox: `poison`, `good-1` and `good-2`, three
/// attempts each, batches of two. Three relays claim `poison` and `good-1`, begin
/// `poison`'s publish and die; a fourth finds `poison` out of attempts (`good-1` not),
/// makes it dead and dies before publishing `good-1` (the instant a count of claims
/// would have made `good-1` dead unpublished in the next claim); the next relay
/// ([`relay_batch`]) publishes `good-1` and `good-2` (counting `good-2`'s attempt with
/// `good-1`'s mark, [`OutboxStorage::mark_delivered_and_begin`]) and makes nothing dead;
/// the old leases' mark and count then change nothing. `put` enqueues in one committed
/// transaction.
pub async fn a_poison_message_dies_alone<S, P, PF>(storage: &S, put: P)
where
    S: OutboxStorage + OutboxAdmin,
    P: Fn(Vec<OutboxMessage>) -> PF,
    PF: Future<Output = ()>,
{
    let (lease, secs) = (Duration::from_secs(60), Duration::from_secs);
    let retry = Retry::new(secs(1), secs(4), 3).expect("a valid retry");
    put(vec![message("poison"), message("good-1"), message("good-2")]).await;
    let mut now = t0();
    for _ in 0..3 {
        let batch = storage.claim_due(2, lease, now).await.unwrap();
        assert_eq!(ids(&batch), ["poison", "good-1"]);
        assert_eq!(storage.begin_attempt(&batch.claimed[0].lease).await.unwrap(), Mark::Applied);
        now += lease; // the relay died publishing `poison`: its leases lapse
    }
    let batch = storage.claim_due(2, lease, now).await.unwrap();
    let (poison, good_lease) = (&batch.claimed[0].lease, &batch.claimed[1].lease);
    assert_eq!((poison.attempts, good_lease.attempts), (3, 0), "good-1 was never tried");
    assert!(!decode::out_of_attempts(good_lease, &retry));
    assert!(decode::out_of_attempts(poison, &retry));
    assert_eq!(storage.mark_failed(poison, "died", now, &retry).await.unwrap(), Mark::Applied);
    now += lease; // and this relay died before publishing `good-1`

    let broker = FlakyBroker::new(0, None);
    let settings = RelaySettings::default()
        .with_batch(2)
        .and_then(|s| s.with_lease(lease))
        .expect("valid settings")
        .with_retry(retry);
    let report = relay_batch(storage, &broker, &settings, &mut || now).await.unwrap();
    assert_eq!((report.claimed, report.delivered, report.dead), (2, 2, 0), "{report:?}");
    assert_eq!(broker.confirmed(), ["good-1", "good-2"]);
    let dead = storage.inspect("poison").await.unwrap().unwrap();
    assert_eq!((dead.state, dead.attempts), (State::Dead, 3));
    assert!(broker.confirmed().iter().all(|id| id != "poison"), "never published");
    let good = storage.inspect("good-1").await.unwrap().unwrap();
    assert_eq!((good.state, good.attempts), (State::Delivered, 1), "its one publish");
    let next = storage.inspect("good-2").await.unwrap().unwrap();
    assert_eq!((next.state, next.attempts), (State::Delivered, 1), "counted with good-1's mark");
    let (old_poison, old_good) = (poison.clone(), good_lease.clone());
    let (marked, counted) = storage.mark_delivered_and_begin(&old_poison, now, &old_good).await;
    let stale = (marked.unwrap(), counted.unwrap());
    assert_eq!(stale, (Mark::Stale, Mark::Stale), "an old lease's mark and count change nothing");
}

/// Rows the outbox cannot read are `Corrupt` naming them, never a panic, and hold back
/// no other row: `bad-headers` (its headers do not decode) is set aside by a claim, in
/// its `unreadable` naming the row; `bad-state` (state 9) is `Corrupt` to `inspect`,
/// naming the state; `good` is claimed. On an empty outbox; `put` enqueues in one
/// committed transaction; `spoil` writes, by hand in the driver's dialect, headers
/// `0x00 0x09` to `bad-headers` and state 9 to `bad-state`.
pub async fn unreadable_rows_are_corrupt_and_hold_back_no_other<S, P, PF, X, XF>(
    storage: &S,
    put: P,
    spoil: X,
) where
    S: OutboxStorage + OutboxAdmin,
    P: Fn(Vec<OutboxMessage>) -> PF,
    PF: Future<Output = ()>,
    X: FnOnce() -> XF,
    XF: Future<Output = ()>,
{
    put(vec![message("bad-headers"), message("bad-state"), message("good")]).await;
    spoil().await;
    let e = storage.inspect("bad-state").await.unwrap_err();
    assert!(matches!(e, OutboxError::Corrupt(_)), "{e:?}");
    assert!(e.to_string().contains("\"bad-state\"") && e.to_string().contains("state 9"), "{e}");
    let batch = storage.claim_due(10, Duration::from_secs(60), t0()).await.unwrap();
    assert_eq!(ids(&batch), ["good"], "the unreadable rows hold back no other");
    assert_eq!(batch.unreadable.len(), 1, "{:?}", batch.unreadable);
    let why = batch.unreadable[0].to_string();
    assert!(why.contains("bad-headers") && why.contains("headers"), "{why}");
}

/// Four relays claiming at once, five rows a claim, while 20 more rows are enqueued one
/// transaction at a time: no row is leased by two claims, no enqueue waits on a claim's
/// locks (it finishes while the relays run), and the 320 rows are all leased once the
/// relays and a last claim are done. On an empty outbox; `storage` makes one relay's
/// storage (each on connections of its own), `put` enqueues in one committed transaction.
pub async fn concurrent_relays_never_lease_one_row_nor_hold_up_an_enqueue<S, P, PF>(
    storage: impl Fn() -> S,
    put: P,
) where
    S: OutboxStorage + Send + Sync + 'static,
    P: Fn(Vec<OutboxMessage>) -> PF,
    PF: Future<Output = ()>,
{
    let long = Duration::from_secs(6000);
    put((0..300).map(|i| message(&format!("m-{i}"))).collect()).await;
    let relays: Vec<_> = (0..4)
        .map(|_| {
            let storage = storage();
            tokio::spawn(async move {
                let mut got = Vec::new();
                loop {
                    let batch = storage.claim_due(5, long, t0()).await.unwrap();
                    if batch.claimed.is_empty() {
                        return got;
                    }
                    got.extend(batch.claimed.into_iter().map(|c| c.message.id().to_owned()));
                }
            })
        })
        .collect();
    let enqueues = async {
        for i in 0..20 {
            put(vec![message(&format!("late-{i}"))]).await;
        }
    };
    tokio::time::timeout(GUARD, enqueues).await.expect("an enqueue waited on a claim");
    let mut seen = BTreeSet::new();
    for relay in relays {
        for id in relay.await.expect("a relay") {
            assert!(seen.insert(id.clone()), "{id} leased twice");
        }
    }
    for claimed in storage().claim_due(1000, long, t0()).await.unwrap().claimed {
        let id = claimed.message.id().to_owned();
        assert!(seen.insert(id.clone()), "{id} leased twice");
    }
    assert_eq!(seen.len(), 320, "every row leased");
}

/// What [`a_relay_killed_mid_batch_loses_nothing`] relays: 40 messages `m-00`..`m-39`,
/// every third under one of two aggregate keys. Enqueue them, in this order, into an
/// empty outbox before it runs.
pub fn killed_mid_batch_messages() -> Vec<OutboxMessage> {
    (0..40)
        .map(|i| {
            let m = message(&format!("m-{i:02}"));
            if i % 3 == 0 {
                m.with_aggregate_key(format!("order-{}", i % 2))
            } else {
                m
            }
        })
        .collect()
}

/// A relay killed mid-batch loses nothing: a relay whose broker fails every third
/// publish is killed (its task aborted) at the instant it hangs on publish 12, with rows
/// leased; a second relay, once those leases lapse on a clock moved by hand, delivers all
/// 40 rows of [`killed_mid_batch_messages`], every message is confirmed, none is dead,
/// and the rows of each aggregate key were first confirmed in the order they were
/// enqueued. `storage` makes a relay's storage over the outbox, `count` counts its rows
/// in a state. Runs on the caller's tokio runtime; each wait is bounded by [`GUARD`].
pub async fn a_relay_killed_mid_batch_loses_nothing<S, N, NF>(storage: impl Fn() -> S, count: N)
where
    S: OutboxStorage + Send + Sync + 'static,
    N: Fn(State) -> NF,
    NF: Future<Output = i64>,
{
    let clock = HandClock::at(t0());
    let broker = FlakyBroker::new(0, None);
    let secs = Duration::from_secs;
    let settings = RelaySettings::default()
        .with_batch(8)
        .and_then(|s| s.with_lease(secs(30)))
        .expect("valid settings")
        .with_retry(Retry::new(secs(1), secs(4), 50).expect("a valid retry"));
    let relay = |publisher: FlakyBroker| {
        let (now, tick) = (clock.clone(), clock.clone());
        tokio::spawn(relay_loop(
            storage(),
            publisher,
            settings,
            move || now.now(),
            move |pause| {
                tick.advance(pause);
                tokio::task::yield_now()
            },
            |report| {
                report.expect("a batch's report");
            },
        ))
    };
    let first = broker.sharing(3, Some(12));
    let task = relay(first.clone());
    // Killed at the instant it hangs on publish 12, mid-batch, with rows leased.
    let reached = tokio::time::timeout(GUARD, async {
        while first.calls() < 12 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    task.abort();
    let _ = task.await;
    assert!(reached.is_ok(), "the relay never reached publish 12");
    assert!(count(State::Leased).await > 0, "the killed relay left rows leased");
    let task = relay(broker.sharing(3, None));
    // The loop ends as soon as every row is delivered; the guard only stops a hang.
    let delivered = tokio::time::timeout(GUARD, async {
        while count(State::Delivered).await < 40 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    task.abort();
    let _ = task.await;
    assert!(delivered.is_ok(), "every row delivered");
    assert_eq!(count(State::Dead).await, 0, "no row dead");
    let confirmed = broker.confirmed();
    let unique: BTreeSet<&String> = confirmed.iter().collect();
    assert_eq!(unique.len(), 40, "every message confirmed by the broker");
    let all = killed_mid_batch_messages();
    let mut by_key: BTreeMap<&str, Vec<&String>> = BTreeMap::new();
    let mut once = BTreeSet::new();
    for id in confirmed.iter().filter(|id| once.insert(*id)) {
        let message = all.iter().find(|m| m.id() == id.as_str()).expect("a message enqueued");
        if let Some(key) = message.aggregate_key() {
            by_key.entry(key).or_default().push(id);
        }
    }
    for (key, order) in by_key {
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order, sorted, "key {key}: first confirmed out of order");
    }
}

/// A broker that fails every `fail_every`th publish (counted from 1), never answers
/// publish number `hang_at`, and records every message id it confirmed, in order.
#[derive(Debug, Clone)]
pub struct FlakyBroker {
    calls: Arc<AtomicUsize>,
    fail_every: usize,
    hang_at: Option<usize>,
    confirmed: Arc<Mutex<Vec<String>>>,
}

impl FlakyBroker {
    /// Fails every `fail_every`th publish (0: none), hangs at publish `hang_at`.
    pub fn new(fail_every: usize, hang_at: Option<usize>) -> FlakyBroker {
        FlakyBroker {
            calls: Arc::new(AtomicUsize::new(0)),
            fail_every,
            hang_at,
            confirmed: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Another broker (its own count and cue) recording into this one's list.
    pub fn sharing(&self, fail_every: usize, hang_at: Option<usize>) -> FlakyBroker {
        FlakyBroker { confirmed: self.confirmed.clone(), ..FlakyBroker::new(fail_every, hang_at) }
    }

    /// How many publishes were asked of it.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The ids confirmed so far, in order (with repeats, if any was published twice).
    pub fn confirmed(&self) -> Vec<String> {
        lock(&self.confirmed).clone()
    }
}

impl Publisher for FlakyBroker {
    fn publish(
        &self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<(), PublishError>> + Send {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let hang = self.hang_at == Some(n);
        let fail = self.fail_every != 0 && n.is_multiple_of(self.fail_every);
        let confirmed = self.confirmed.clone();
        let id = message.id().to_owned();
        async move {
            if hang {
                std::future::pending::<()>().await;
            }
            if fail {
                return Err(PublishError::new(format!("publish {n} not confirmed")));
            }
            lock(&confirmed).push(id);
            Ok(())
        }
    }
}

/// A wall clock moved only by hand; clones share it.
#[derive(Debug, Clone)]
pub struct HandClock(Arc<Mutex<SystemTime>>);

impl HandClock {
    /// A clock at `start`.
    pub fn at(start: SystemTime) -> HandClock {
        HandClock(Arc::new(Mutex::new(start)))
    }

    /// The time now.
    pub fn now(&self) -> SystemTime {
        *lock(&self.0)
    }

    /// Moves it forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = lock(&self.0);
        *now = now.checked_add(by).unwrap_or(*now);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
