//! Claim-and-wait for keys a [`Store`] holds: [`claim_wait`] over any store and
//! [`Tiered::claim_wait`], and the loop both share (the HTTP layer's too).
//!
//! Invariant: a waiter only ever looks with the store's own atomic claim, so it acquires
//! exactly when a plain claim would (never on a look of its own), and it returns the
//! first answer that is not "in progress", or the last one once its wait is spent.
//!
//! A store cannot tell a waiter when a key settles (SQLite, PostgreSQL and Redis have no
//! notification the stores use), so the waiter looks again after a pause: 10 ms, doubling
//! to 250 ms, never past the end of its wait. The pauses are the caller's runtime's
//! (`sleep` is passed in), so the core needs none; a synchronous caller passes a sleep
//! that blocks its thread and runs the future with [`block_on`](super::block_on).

use std::future::Future;
use std::time::{Duration, Instant};

use super::{Store, StoreClaim, StoreError, Tiered, TieredClaim, TieredError};
use crate::{Fingerprint, Key};

/// The first pause between looks; it doubles up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause between looks: how late a waiter may notice that a key settled.
const LONGEST_PAUSE: Duration = Duration::from_millis(250);

/// Claims `key` in `store` (as [`Store::claim`] with `lease`), and while another caller
/// holds it, looks again until it settles or `wait` is spent.
///
/// Returns the first answer that is not [`StoreClaim::InProgress`] (the owner completed:
/// a replay; released, or its lease lapsed: `Acquired`; marked unknown, or lapsed under
/// a `MarkUnknown` lapse setting: `Unknown`), or `InProgress` once `wait` is spent. A
/// wait of zero is one plain claim. An error ends the wait at once: the store failing is
/// never waited out, the caller fails closed.
///
/// `sleep(d)` pauses for `d` on the caller's runtime: `tokio::time::sleep` in tokio; in
/// synchronous code a future that blocks its thread, run with
/// [`block_on`](super::block_on). The wait ends when `wait` has passed on the system's
/// monotonic clock, or when the pauses add up to `wait` (so a runtime whose time is
/// paused or driven by a test ends it too).
///
/// Cancel it only while it pauses: dropped during a look, the look's claim may still
/// have been made in the store (a store's operation is not undone by dropping its
/// future), and a key it acquired stays PROCESSING, with nobody to settle it, until its
/// lease lapses.
///
/// ```ignore
/// // (idemcache-sqlite's store; integration/tests/store_wait.rs runs this.)
/// use idemcache::store::{block_on, claim_wait, Store, StoreClaim};
/// use idemcache::{Fingerprint, Key};
/// use idemcache_sqlite::SqliteStore;
/// use std::time::Duration;
///
/// // Synchronous code: a sleep that blocks the thread, the future run with block_on.
/// let nap = |d: Duration| async move { std::thread::sleep(d) };
/// let store = block_on(SqliteStore::connect("sqlite::memory:"))?;
/// block_on(store.ensure_schema())?;
/// let key = Key::without_tenant("backup", "2026-12-01")?;
/// let lease = Duration::from_secs(10);
/// let first = block_on(claim_wait(&store, &key, Fingerprint::of(b"tar"), lease, Duration::ZERO, nap))?;
/// let StoreClaim::Acquired { token, .. } = first else { panic!("the key was free") };
/// block_on(store.complete(&key, token, Some("done".into()), Duration::from_secs(60)))?;
/// // A duplicate waits (here: not at all, the key settled) and replays.
/// let again = block_on(claim_wait(&store, &key, Fingerprint::of(b"tar"), lease, Duration::from_secs(5), nap))?;
/// assert!(matches!(again, StoreClaim::Completed(replay) if replay.body.as_deref() == Some(&b"done"[..])));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub async fn claim_wait<S, F, P>(
    store: &S,
    key: &Key,
    fingerprint: Fingerprint,
    lease: Duration,
    wait: Duration,
    sleep: F,
) -> Result<StoreClaim, StoreError>
where
    S: Store,
    F: FnMut(Duration) -> P,
    P: Future,
{
    let look = || store.claim(key, fingerprint, lease);
    let busy =
        |found: &Result<StoreClaim, StoreError>| matches!(found, Ok(StoreClaim::InProgress { .. }));
    look_while(look, busy, wait, sleep).await
}

impl<S: Store> Tiered<S> {
    /// [`claim`](Tiered::claim), and while another caller holds the key (in this process
    /// or another), looks again until it settles or `wait` is spent, as the free
    /// [`claim_wait`] does over a store: the same answers, the same `sleep`, the same
    /// end of the wait, the same rule for cancelling (only while it pauses).
    ///
    /// A duplicate in this process is answered "in progress" from memory while it runs;
    /// once it settles, the next look reads through to the store.
    pub async fn claim_wait<F, P>(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        wait: Duration,
        sleep: F,
    ) -> Result<TieredClaim<S>, TieredError>
    where
        F: FnMut(Duration) -> P,
        P: Future,
    {
        let look = || self.claim(key, fingerprint);
        let busy = |found: &Result<TieredClaim<S>, TieredError>| {
            matches!(found, Ok(TieredClaim::InProgress { .. }))
        };
        look_while(look, busy, wait, sleep).await
    }
}

/// Looks with `look` while its answer is `busy`, pausing with `sleep` between looks
/// (10 ms, doubling to 250 ms), until `wait` has passed on the monotonic clock or in
/// pauses; returns the last answer.
pub(crate) async fn look_while<T, L, LF, F, P>(
    mut look: L,
    busy: impl Fn(&T) -> bool,
    wait: Duration,
    mut sleep: F,
) -> T
where
    L: FnMut() -> LF,
    LF: Future<Output = T>,
    F: FnMut(Duration) -> P,
    P: Future,
{
    let started = Instant::now();
    let mut paused = Duration::ZERO;
    let mut pause = FIRST_PAUSE;
    loop {
        let found = look().await;
        // Real time, or the pauses' time when a runtime drives its clock (the larger
        // of the two is never short of what really passed).
        let left = wait.saturating_sub(started.elapsed().max(paused));
        if !busy(&found) || left.is_zero() {
            return found;
        }
        let nap = pause.min(left);
        sleep(nap).await;
        paused = paused.saturating_add(nap);
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};

    /// A sleep that records what it was asked for and returns at once.
    fn recorder(
        naps: &RefCell<Vec<Duration>>,
    ) -> impl FnMut(Duration) -> std::future::Ready<()> + '_ {
        move |d| {
            naps.borrow_mut().push(d);
            std::future::ready(())
        }
    }

    #[test]
    fn pauses_double_to_a_quarter_second_and_end_with_the_wait() {
        let naps = RefCell::new(Vec::new());
        let looks = Cell::new(0);
        let look = || {
            looks.set(looks.get() + 1);
            std::future::ready(true)
        };
        let last = crate::store::block_on(look_while(
            look,
            |busy: &bool| *busy,
            Duration::from_millis(1000),
            recorder(&naps),
        ));
        assert!(last, "still busy when the wait was spent");
        let ms: Vec<u128> = naps.borrow().iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [10, 20, 40, 80, 160, 250, 250, 190], "the last pause is what was left");
        assert_eq!(ms.iter().sum::<u128>(), 1000);
        assert_eq!(looks.get(), ms.len() + 1, "a look after every pause, the last one too");
    }

    #[test]
    fn the_first_settled_answer_ends_the_wait_and_a_zero_wait_looks_once() {
        let naps = RefCell::new(Vec::new());
        let looks = Cell::new(0);
        let look = || {
            looks.set(looks.get() + 1);
            std::future::ready(looks.get())
        };
        let busy = |n: &usize| *n < 3;
        let got = crate::store::block_on(look_while(
            look,
            busy,
            Duration::from_secs(60),
            recorder(&naps),
        ));
        assert_eq!((got, naps.borrow().len()), (3, 2));

        let once = Cell::new(0);
        let look = || {
            once.set(once.get() + 1);
            std::future::ready(())
        };
        crate::store::block_on(look_while(look, |_| true, Duration::ZERO, recorder(&naps)));
        assert_eq!(once.get(), 1);
    }
}
