//! The inbox's suite, run by every SQL driver on every engine it supports (SQLite,
//! tokio-postgres, sqlx PostgreSQL, sqlx MySQL/MariaDB) through a fixture of its own
//! ([`Inbox`]): a handful of statements in its dialect, and the driver's `receive`.
//!
//! - New, then Duplicate, then Mismatch, the first fingerprint kept; consumers and ids
//!   apart byte for byte.
//! - A rollback leaves neither the record nor the change; a second receive in the
//!   claiming transaction is a Duplicate (its own record), or a Mismatch.
//! - Refused input and an unreadable row are typed errors.
//! - A second delivery of an uncommitted message is InFlight (within the engine's
//!   bound), then a Duplicate once the first commits, or New once it rolls back.
//! - Concurrent deliveries of one message apply it once.
//! - Purges go in bounded batches, oldest first, never within a horizon of a start.
//!
//! Invariant: each scenario's consumer is its own (a fresh prefix per call), so the
//! counts a scenario asserts are of its rows alone; the purge scenario's counts are of
//! the whole table, whose other rows were received now, decades after its cutoff. A
//! breach panics naming the engine.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idemcache::Fingerprint;

use super::{InboxError, Purger, Receipt, Retention};

/// What a boxed future of the suite's is: `Send`, borrowing nothing it outlives.
pub type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An engine's inbox as the suite drives it: each driver's test writes one and calls
/// [`run`]. Every transaction is on a connection of its own, at the engine's default
/// isolation (SQLite: a deferred transaction, as a second delivery's is).
pub trait Inbox: Send + Sync + 'static {
    /// An open transaction on a connection of its own.
    type Tx: Send + 'static;

    /// The engine's name, in a breach's message.
    fn engine(&self) -> &'static str;

    /// A new transaction on a new connection to the fixture's database.
    fn begin(&self) -> Boxed<'_, Self::Tx>;

    /// The driver's `receive` in `tx`.
    fn receive<'a>(
        tx: &'a mut Self::Tx,
        consumer: &'a str,
        id: &'a str,
        fp: Fingerprint,
    ) -> Boxed<'a, Result<Receipt, InboxError>>;

    /// The business change: `amount` entered for `account` in `tx`.
    fn credit<'a>(tx: &'a mut Self::Tx, account: &'a str, amount: i64) -> Boxed<'a, ()>;

    /// Commits `tx`.
    fn commit(tx: Self::Tx) -> Boxed<'static, ()>;

    /// Rolls `tx` back.
    fn rollback(tx: Self::Tx) -> Boxed<'static, ()>;

    /// The committed records of `consumer`.
    fn records(&self, consumer: &str) -> Boxed<'_, i64>;

    /// The committed entries' sum for `account`.
    fn balance(&self, account: &str) -> Boxed<'_, i64>;

    /// Stores, committed, a record of (`consumer`, `id`) whose fingerprint is 3 bytes.
    fn store_unreadable<'a>(&'a self, consumer: &'a str, id: &'a str) -> Boxed<'a, ()>;

    /// Sets the `received_at` of every record of (`consumer`, `id`) to `at`.
    fn received<'a>(&'a self, consumer: &'a str, id: &'a str, at: SystemTime) -> Boxed<'a, ()>;

    /// The driver's `purge` of up to `limit` records received before `cutoff`.
    fn purge(&self, cutoff: SystemTime, limit: usize) -> Boxed<'_, Result<usize, InboxError>>;
}

/// Runs every scenario against `inbox`. Panics on the first breach.
pub async fn run<I: Inbox>(inbox: Arc<I>) {
    let run = fresh();
    kinds_of_receipt(&*inbox, &run).await;
    a_rollback_leaves_nothing(&*inbox, &run).await;
    refused_input_and_unreadable_rows(&*inbox, &run).await;
    a_second_delivery_of_an_uncommitted_message(&*inbox, &run).await;
    concurrent_deliveries_apply_once(inbox.clone(), &run).await;
    purges(&*inbox, &run).await;
}

/// A prefix no other call of the suite (in any process) uses: advisory locks and
/// shared tables outlive a fixture's schema.
fn fresh() -> String {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let at = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    format!("inbox-{}-{}-{call}", std::process::id(), at.as_nanos())
}

/// One delivery in a transaction of its own, committed when New.
async fn once<I: Inbox>(inbox: &I, consumer: &str, id: &str, fp: Fingerprint) -> Receipt {
    let mut tx = inbox.begin().await;
    let receipt = I::receive(&mut tx, consumer, id, fp).await;
    let receipt = receipt.unwrap_or_else(|e| panic!("{}: {e}", inbox.engine()));
    match receipt {
        Receipt::New => I::commit(tx).await,
        _ => I::rollback(tx).await,
    }
    receipt
}

async fn kinds_of_receipt<I: Inbox>(inbox: &I, run: &str) {
    let on = inbox.engine();
    let ledger = format!("{run}-ledger");
    let (a, b) = (Fingerprint::of(b"a"), Fingerprint::of(b"b"));
    assert_eq!(once(inbox, &ledger, "m-1", a).await, Receipt::New, "{on}");
    assert_eq!(once(inbox, &ledger, "m-1", a).await, Receipt::Duplicate, "{on}");
    assert_eq!(once(inbox, &ledger, "m-1", b).await, Receipt::Mismatch, "{on}");
    let kept = once(inbox, &ledger, "m-1", a).await;
    assert_eq!(kept, Receipt::Duplicate, "{on}: the first fingerprint is kept, never overwritten");
    // Byte for byte: another case, another id, a trailing space, beyond ASCII.
    let upper = format!("{run}-Ledger");
    for (consumer, id) in [(&upper, "m-1"), (&ledger, "M-1"), (&ledger, "m-1 "), (&ledger, "ünï")]
    {
        let receipt = once(inbox, consumer, id, a).await;
        assert_eq!(receipt, Receipt::New, "{on}: {consumer:?} {id:?} is another message");
    }
    assert_eq!(inbox.records(&ledger).await, 4, "{on}");
    assert_eq!(inbox.records(&upper).await, 1, "{on}");
}

async fn a_rollback_leaves_nothing<I: Inbox>(inbox: &I, run: &str) {
    let on = inbox.engine();
    let ledger = format!("{run}-rollback");
    let a = Fingerprint::of(b"a");
    let mut tx = inbox.begin().await;
    assert_eq!(I::receive(&mut tx, &ledger, "m-2", a).await.unwrap(), Receipt::New, "{on}");
    let again = I::receive(&mut tx, &ledger, "m-2", a).await.unwrap();
    assert_eq!(again, Receipt::Duplicate, "{on}: twice in the claiming transaction");
    let other = I::receive(&mut tx, &ledger, "m-2", Fingerprint::of(b"b")).await.unwrap();
    assert_eq!(other, Receipt::Mismatch, "{on}: another message in the claiming transaction");
    I::credit(&mut tx, &ledger, 5).await;
    I::rollback(tx).await;
    assert_eq!(inbox.records(&ledger).await, 0, "{on}: the record rolled back");
    assert_eq!(inbox.balance(&ledger).await, 0, "{on}: the change rolled back");
    assert_eq!(once(inbox, &ledger, "m-2", a).await, Receipt::New, "{on}: redelivered");
}

async fn refused_input_and_unreadable_rows<I: Inbox>(inbox: &I, run: &str) {
    let on = inbox.engine();
    let ledger = format!("{run}-refused");
    let a = Fingerprint::of(b"a");
    let mut tx = inbox.begin().await;
    for (consumer, id) in [("", "m"), ("c", ""), ("c", "m\0")] {
        let e = I::receive(&mut tx, consumer, id, a).await.unwrap_err();
        assert!(matches!(e, InboxError::InvalidInput(_)), "{on}: {consumer:?} {id:?}: {e:?}");
    }
    I::rollback(tx).await;
    inbox.store_unreadable(&ledger, "short").await;
    // Received now, as every record but the purge scenario's old ones.
    inbox.received(&ledger, "short", SystemTime::now()).await;
    let mut tx = inbox.begin().await;
    let e = I::receive(&mut tx, &ledger, "short", a).await.unwrap_err();
    assert!(matches!(e, InboxError::Corrupt(_)), "{on}: {e:?}");
    assert!(e.to_string().contains("3 bytes"), "{on}: {e}");
    I::rollback(tx).await;
}

async fn a_second_delivery_of_an_uncommitted_message<I: Inbox>(inbox: &I, run: &str) {
    let on = inbox.engine();
    let ledger = format!("{run}-inflight");
    let fp = Fingerprint::of(b"a");
    for (id, first_commits) in [("m-commit", true), ("m-rollback", false)] {
        let mut first = inbox.begin().await;
        assert_eq!(I::receive(&mut first, &ledger, id, fp).await.unwrap(), Receipt::New, "{on}");
        let mut second = inbox.begin().await;
        // A guard, so that a receive that waits for the first fails instead of hanging.
        let guarded =
            tokio::time::timeout(Duration::from_secs(30), I::receive(&mut second, &ledger, id, fp));
        let receipt = guarded.await.unwrap_or_else(|_| panic!("{on}: waited for the first"));
        assert_eq!(receipt.unwrap(), Receipt::InFlight, "{on}: {id}");
        I::rollback(second).await;
        if first_commits {
            I::commit(first).await;
            assert_eq!(once(inbox, &ledger, id, fp).await, Receipt::Duplicate, "{on}: {id}");
        } else {
            I::rollback(first).await;
            assert_eq!(once(inbox, &ledger, id, fp).await, Receipt::New, "{on}: {id}");
        }
    }
}

async fn concurrent_deliveries_apply_once<I: Inbox>(inbox: Arc<I>, run: &str) {
    let on = inbox.engine();
    let ledger = Arc::<str>::from(format!("{run}-concurrent"));
    let fp = Fingerprint::of(b"5");
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (inbox, ledger) = (inbox.clone(), ledger.clone());
        tasks.push(tokio::spawn(async move {
            let mut receipts = Vec::new();
            for _ in 0..10 {
                let mut tx = inbox.begin().await;
                let receipt = I::receive(&mut tx, &ledger, "m-concurrent", fp).await;
                let receipt = receipt.unwrap_or_else(|e| panic!("{}: {e}", inbox.engine()));
                receipts.push(receipt);
                if receipt == Receipt::New {
                    I::credit(&mut tx, &ledger, 5).await;
                    I::commit(tx).await;
                } else {
                    I::rollback(tx).await;
                }
            }
            receipts
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("a delivering task"));
    }
    let applied = all.iter().filter(|r| **r == Receipt::New).count();
    assert_eq!(applied, 1, "{on}: {all:?}");
    let expected = |r: &Receipt| matches!(r, Receipt::New | Receipt::Duplicate | Receipt::InFlight);
    assert!(all.iter().all(expected), "{on}: {all:?}");
    assert_eq!(inbox.balance(&ledger).await, 5, "{on}");
}

async fn purges<I: Inbox>(inbox: &I, run: &str) {
    let on = inbox.engine();
    let ledger = format!("{run}-purge");
    let fp = Fingerprint::of(b"a");
    let hour = Duration::from_secs(3600);
    let crash = SystemTime::UNIX_EPOCH + 100_000 * hour;
    for i in 0..5 {
        let id = format!("old-{i}");
        assert_eq!(once(inbox, &ledger, &id, fp).await, Receipt::New, "{on}");
        inbox.received(&ledger, &id, crash + Duration::from_micros(i)).await;
    }
    assert_eq!(once(inbox, &ledger, "recent", fp).await, Receipt::New, "{on}");
    inbox.received(&ledger, "recent", crash + 240 * hour).await;
    // Every other record of the fixture's database was received now: decades after
    // the cutoff below, so the purge counts are these records'.

    // Ten days down, then a restart: the first purge may delete nothing.
    let restart = crash + 240 * hour;
    let purger = Purger::new(Retention::new(24 * hour, hour).expect("a retention"), restart);
    assert_eq!(purger.cutoff(restart + Duration::from_secs(1)), None, "{on}");
    let redelivered = once(inbox, &ledger, "old-0", fp).await;
    assert_eq!(redelivered, Receipt::Duplicate, "{on}: redelivered in time");
    let cutoff = purger.cutoff(restart + hour).expect("a cutoff an hour after the start");
    assert_eq!(inbox.purge(cutoff, 0).await.unwrap(), 0, "{on}: a limit of 0");
    assert_eq!(inbox.purge(cutoff, 2).await.unwrap(), 2, "{on}");
    // Oldest first.
    assert_eq!(once(inbox, &ledger, "old-2", fp).await, Receipt::Duplicate, "{on}");
    assert_eq!(inbox.purge(cutoff, 2).await.unwrap(), 2, "{on}");
    assert_eq!(inbox.purge(cutoff, 2).await.unwrap(), 1, "{on}");
    assert_eq!(inbox.purge(cutoff, 2).await.unwrap(), 0, "{on}");
    assert_eq!(inbox.records(&ledger).await, 1, "{on}: the recent record stays");
    assert_eq!(once(inbox, &ledger, "recent", fp).await, Receipt::Duplicate, "{on}");
}
