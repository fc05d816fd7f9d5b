//! The outbox's promises under producers at once, written once for every engine whose
//! transactions can be open side by side (feature `test-utils`, on tokio): commits of
//! one aggregate key that would cross are published in enqueue order; an open enqueue
//! of a key holds back no other key; many producers of one key commit in `seq` order;
//! and a row whose counters sit at the top of their range is reported, not a stalled
//! claim (this one on any engine, SQLite included).
//!
//! Each engine's test writes a [`Producers`] fixture (a connection per producer, a
//! question about lock waits, a read of a key's rows) and calls the scenarios.
//!
//! Invariant: a producer's transaction stays open from its enqueues until the scenario
//! says how it ends ([`End`]); a producer whose `end` sender is dropped rolls back.

use std::future::Future;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{ids, t0, GUARD};
use crate::one_commit::testing::Boxed;
use crate::outbox::{Mark, OutboxAdmin, OutboxError, OutboxMessage, OutboxStorage};

/// How a producer's transaction ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Commit it.
    Commit,
    /// Roll it back.
    RollBack,
}

/// What one producer does: in one transaction, enqueue `messages` in order (stopping at
/// the first error), send what the enqueues answered on `enqueued` (a scenario may have
/// dropped its receiver: the send's failure is no error), run a moment of
/// the database's own work (a 1 ms sleep of the server's: the window in which a later
/// producer of the key would commit first, were it not waiting), then end as `end`
/// says (roll back if its sender is gone).
#[derive(Debug)]
pub struct Script {
    /// The messages, enqueued in this order.
    pub messages: Vec<OutboxMessage>,
    /// Where the enqueues' answer goes.
    pub enqueued: oneshot::Sender<Result<(), OutboxError>>,
    /// How the transaction ends, told after the enqueues.
    pub end: oneshot::Receiver<End>,
}

/// A producer the fixture started: its session's id and its task.
#[derive(Debug)]
pub struct Producer {
    /// The engine's id of the producer's connection (what [`Producers::waiting`] asks
    /// about).
    pub session: i64,
    /// The producer's task, done when its transaction ended.
    pub done: JoinHandle<()>,
}

/// An engine's producers, as the scenarios need them.
pub trait Producers: Send + Sync + 'static {
    /// The relay's storage.
    type Storage: OutboxStorage + OutboxAdmin + Send + Sync;

    /// The storage, over an outbox of its own (empty at the scenario's start).
    fn storage(&self) -> Self::Storage;

    /// Connects a producer to the outbox, learns its session's id, and spawns it on
    /// tokio, running `script`.
    fn producer(&self, script: Script) -> Boxed<'_, Producer>;

    /// Whether the producer of `session` waits on a lock now.
    fn waiting(&self, session: i64) -> Boxed<'_, bool>;

    /// The `seq` of every committed row of aggregate key `key`, in `seq` order.
    fn key_seqs(&self, key: &'static str) -> Boxed<'_, Vec<i64>>;
}

/// A message `id` on topic `orders`, its payload its id.
fn message(id: &str) -> OutboxMessage {
    OutboxMessage::new(id, "orders", id.as_bytes().to_vec())
}

/// Starts a producer of `messages`, and returns it with its enqueues' answer and the
/// sender that ends it.
async fn start<P: Producers>(
    fixture: &P,
    messages: Vec<OutboxMessage>,
) -> (Producer, oneshot::Receiver<Result<(), OutboxError>>, oneshot::Sender<End>) {
    let (enqueued_tx, enqueued) = oneshot::channel();
    let (end, end_rx) = oneshot::channel();
    let script = Script { messages, enqueued: enqueued_tx, end: end_rx };
    (fixture.producer(script).await, enqueued, end)
}

/// Claims what is due and marks it delivered, twice, and returns the ids in the order
/// published.
async fn publish_all<S: OutboxStorage>(storage: &S) -> Vec<String> {
    let mut order = Vec::new();
    for _ in 0..2 {
        let batch = storage.claim_due(10, Duration::from_secs(60), t0()).await.unwrap();
        for c in &batch.claimed {
            order.push(c.message.id().to_owned());
            assert_eq!(storage.mark_delivered(&c.lease, t0()).await.unwrap(), Mark::Applied);
        }
    }
    order
}

/// The scenarios of producers side by side, one after the other on one outbox (empty at
/// the start; each leaves what the next does not count): crossing commits, an open
/// enqueue beside other keys, many producers of one key.
pub async fn run<P: Producers + Clone>(fixture: &P) {
    crossing_commits_of_one_key_are_published_in_enqueue_order(fixture).await;
    an_open_enqueue_of_a_key_holds_back_no_other_key(fixture).await;
    many_concurrent_enqueues_of_one_key_commit_in_seq_order(fixture).await;
}

/// "A message with an aggregate key is not due while an earlier message (in enqueue
/// order) of the same key is undelivered." Two producers of one key: the first
/// enqueues and stays open, the second enqueues after it. Were the second to commit
/// first, a relay would publish it ahead of the first's row, which it cannot see yet;
/// so the second's enqueue must wait until the first's transaction ends (seen as a
/// lock wait, asked of the server: a guard on a hang, not a timing), and the two are
/// published in enqueue order.
pub async fn crossing_commits_of_one_key_are_published_in_enqueue_order<P: Producers>(fixture: &P) {
    let storage = fixture.storage();
    let keyed = |id: &str| message(id).with_aggregate_key("order-42");
    let (first, enqueued, end_first) = start(fixture, vec![keyed("created")]).await;
    enqueued.await.unwrap().unwrap();
    let (second, _, end_second) = start(fixture, vec![keyed("paid")]).await;
    end_second.send(End::Commit).unwrap();
    let deadline = tokio::time::Instant::now() + GUARD;
    while !fixture.waiting(second.session).await {
        assert!(!second.done.is_finished(), "the second enqueue of the key did not wait");
        assert!(tokio::time::Instant::now() < deadline, "the second enqueue never waited");
        // A poll's pace, not a timing: slower than InnoDB's 100 ms, as INNODB_TRX is a
        // cache refreshed only when it has not been read for that long.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let early = storage.claim_due(10, Duration::from_secs(60), t0()).await.unwrap();
    assert!(ids(&early).is_empty(), "published {:?} before any commit", ids(&early));
    end_first.send(End::Commit).unwrap();
    first.done.await.unwrap();
    second.done.await.unwrap();
    assert_eq!(publish_all(&storage).await, ["created", "paid"]);
}

/// Messages without a key, and of other keys, never wait on a key's lock: while a
/// producer of key `a` is open, another enqueues for key `b` and without a key and
/// commits (a wait would end at the scenario's guard).
pub async fn an_open_enqueue_of_a_key_holds_back_no_other_key<P: Producers>(fixture: &P) {
    let storage = fixture.storage();
    let (first, enqueued, end_first) =
        start(fixture, vec![message("a-1").with_aggregate_key("a")]).await;
    enqueued.await.unwrap().unwrap();
    let others = vec![message("b-1").with_aggregate_key("b"), message("none-1")];
    let (second, enqueued, end_second) = start(fixture, others).await;
    let answered = tokio::time::timeout(GUARD, enqueued).await;
    answered.expect("an enqueue of another key waited").unwrap().unwrap();
    end_second.send(End::Commit).unwrap();
    second.done.await.unwrap();
    let mut due = publish_all(&storage).await;
    due.sort();
    assert_eq!(due, ["b-1", "none-1"], "committed while key a's producer is open");
    end_first.send(End::Commit).unwrap();
    first.done.await.unwrap();
    assert_eq!(publish_all(&storage).await, ["a-1"]);
}

/// Many producers of one key at once (six lanes of thirty transactions, each on a
/// connection of its own), some enqueueing the key twice or beside an unkeyed
/// message, some rolling back; an observer reads the key's committed rows all along.
/// `seq` order must be commit order within the key: every snapshot of the key's rows is
/// a prefix (in `seq` order) of the final rows, never a later row visible while an
/// earlier one of the key is still uncommitted.
pub async fn many_concurrent_enqueues_of_one_key_commit_in_seq_order<P: Producers + Clone>(
    fixture: &P,
) {
    // The key enqueued once before: on MySQL a new key's first enqueue rolled back is a
    // case of its own (InnoDB's gap lock), tested there.
    let (first, enqueued, end) =
        start(fixture, vec![message("first").with_aggregate_key("hot")]).await;
    end.send(End::Commit).unwrap();
    enqueued.await.unwrap().unwrap();
    first.done.await.unwrap();
    let mut lanes = Vec::new();
    for lane in 0..6 {
        let fixture = fixture.clone();
        lanes.push(tokio::spawn(async move {
            for i in 0..30 {
                let hot =
                    |n: u32| message(&format!("hot-{lane}-{i}-{n}")).with_aggregate_key("hot");
                let mut messages = vec![hot(0)];
                if i % 3 == 0 {
                    messages.push(message(&format!("free-{lane}-{i}")));
                    messages.push(hot(1));
                }
                let (producer, enqueued, end) = start(&fixture, messages).await;
                let how = if i % 7 == 3 { End::RollBack } else { End::Commit };
                end.send(how).unwrap();
                enqueued.await.unwrap().unwrap();
                producer.done.await.unwrap();
            }
        }));
    }
    let mut snapshots = Vec::new();
    while lanes.iter().any(|l| !l.is_finished()) {
        snapshots.push(fixture.key_seqs("hot").await);
    }
    for lane in lanes {
        lane.await.unwrap();
    }
    let last = fixture.key_seqs("hot").await;
    assert_eq!(last.len(), 1 + 6 * (30 - 4) + 6 * 8, "every committed row of the key, once");
    assert!(snapshots.len() > 10, "the observer saw the producers at work");
    for seen in &snapshots {
        assert_eq!(seen[..], last[..seen.len()], "a later row of the key committed first");
    }
}

/// A row whose token or attempts sit at `i64::MAX` (by hand, or after an absurd number
/// of claims): the claim's `+ 1` must not fail every claim, stalling the whole relay.
/// The row is reported unreadable, the row beside it is claimed, and once its lease
/// lapsed it is still reported, never published; `inspect` finds it `Corrupt`. On an empty outbox; `put` enqueues
/// in one committed transaction; `raise` sets `column` of the row `id` to `i64::MAX`.
pub async fn a_row_at_the_top_of_its_counters_does_not_stall_the_claim<S, P, PF, R, RF>(
    storage: &S,
    put: P,
    raise: R,
) where
    S: OutboxStorage + OutboxAdmin,
    P: Fn(Vec<OutboxMessage>) -> PF,
    PF: Future<Output = ()>,
    R: Fn(&'static str, String) -> RF,
    RF: Future<Output = ()>,
{
    let min = Duration::from_secs(60);
    for column in ["token", "attempts"] {
        let (top, fine) = (format!("top-{column}"), format!("fine-{column}"));
        put(vec![message(&top), message(&fine)]).await;
        raise(column, top.clone()).await;
        let batch = storage.claim_due(10, min, t0()).await.unwrap();
        assert_eq!(ids(&batch), [fine.as_str()], "{column}");
        let named = |e: &OutboxError| e.to_string().contains(&top);
        assert!(batch.unreadable.iter().any(named), "{column}: {:?}", batch.unreadable);
        let lease = &batch.claimed[0].lease;
        assert_eq!(storage.mark_delivered(lease, t0()).await.unwrap(), Mark::Applied);
        // Still unreadable, still reported, once its lease lapsed: never published.
        let again = storage.claim_due(10, min, t0() + min).await.unwrap();
        assert!(again.claimed.is_empty(), "{column}: {:?}", ids(&again));
        assert!(again.unreadable.iter().any(named), "{column}: {:?}", again.unreadable);
        let read = storage.inspect(&top).await;
        assert!(matches!(read, Err(OutboxError::Corrupt(_))), "{column}: {read:?}");
    }
}
