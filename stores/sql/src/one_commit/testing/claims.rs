//! The one-commit mode below the layer, run by [`run`](super::run) on every engine: a
//! first execution as a handler of another framework writes it, through
//! [`TransactionalStore`]'s `claim_in`, the order and `complete_in` in one transaction.
//!
//! - Nobody sees the record before the commit; after it, a claim replays it and a retry
//!   in the mode writes nothing.
//! - A duplicate waiting on a first that rolls back acquires, as no earlier execution
//!   (no takeover).
//! - A key reused with another request is `Mismatch`, and writes nothing.
//! - A record the store's own claim holds (committed on its own) is `InProgress`, and
//!   a completion under a token that is not its holder's is `LeaseLost`.
//! - A duplicate whose wait ends before the first's transaction does is `InProgress`.
//! - A lease of zero is `InvalidInput` and writes nothing.
//!
//! And the kill test's halves ([`claim_and_wait_to_be_killed`],
//! [`after_a_kill_between_claim_and_commit`]): a process killed with SIGKILL between
//! its claim and its commit leaves nothing, and the retry acquires.
//!
//! Invariant: as the suite's, each scenario's keys are its own (under the call's
//! prefix), and a breach panics naming the scenario and the engine.

use std::time::Duration;

use idemcache::store::{conformance, OpenClaim, Store, StoreClaim, StoreError, TransactionalStore};
use idemcache::{FencingToken, Fingerprint, Key};

use super::{Orders, Tx};

/// A claim's lease in these scenarios: longer than any of them runs.
const LEASE: Duration = Duration::from_secs(30);
/// How long a completed record is kept.
const KEPT: Duration = Duration::from_secs(600);
/// A wait that only a hang outlasts: a guard, not a timing.
const GUARD: Duration = Duration::from_secs(60);

/// The record's key for the order of `client`: the client key is what the fixture's
/// `committed` looks for.
fn key(client: &str) -> Key {
    Key::new("POST /orders", "one-commit", client).expect("a valid key")
}

fn order() -> Fingerprint {
    Fingerprint::of(b"order")
}

/// The body a completed record of `answer` replays.
fn replayed(answer: &StoreClaim) -> Option<&[u8]> {
    match answer {
        StoreClaim::Completed(replay) => replay.body.as_deref(),
        _ => None,
    }
}

/// The first execution as a handler writes it, in `tx`: the claim (waiting at most
/// `wait`), the order and the completion with `body`; the claim's answer when it was
/// not acquired.
async fn execute<E: Orders>(
    store: &E::Store,
    tx: &mut Tx<E>,
    client: &str,
    body: &[u8],
    wait: Duration,
) -> Result<(), StoreClaim> {
    let claimed = store.claim_in(tx, &key(client), order(), LEASE, wait, None).await;
    match claimed.expect("the claim answers") {
        StoreClaim::Acquired { token, .. } => {
            E::write(tx, client.to_owned(), "book".to_owned()).await;
            let claim = OpenClaim::new(key(client), token, KEPT);
            store.complete_in(tx, &claim, Some(body)).await.expect("the completion");
            Ok(())
        }
        other => Err(other),
    }
}

/// A duplicate's claim of `client`'s key in a transaction of its own, on a task,
/// waiting at most `wait`; rolled back once answered.
fn duplicate<E: Orders>(
    engine: &E,
    client: &str,
    wait: Duration,
) -> tokio::task::JoinHandle<Result<StoreClaim, StoreError>> {
    let (store, key) = (engine.store(), key(client));
    tokio::spawn(async move {
        let mut tx = store.begin().await?;
        let answer = store.claim_in(&mut tx, &key, order(), LEASE, wait, None).await;
        store.rollback(tx).await?;
        answer
    })
}

/// Every scenario of this file, under the call's prefix `run`.
pub(super) async fn run<E: Orders>(engine: &E, run: &str) {
    nobody_sees_the_record_before_the_commit(engine, run).await;
    a_duplicate_of_a_rolled_back_first_acquires(engine, run).await;
    a_reused_key_is_a_mismatch_and_writes_nothing(engine, run).await;
    a_record_the_stores_own_claim_holds_is_in_progress_and_fenced(engine, run).await;
    a_wait_that_ends_first_is_in_progress(engine, run).await;
    a_zero_lease_is_invalid_input_and_writes_nothing(engine, run).await;
}

async fn nobody_sees_the_record_before_the_commit<E: Orders>(engine: &E, run: &str) {
    let (on, store) = (engine.engine(), engine.store());
    let client = format!("{run}-claims-together");
    let mut tx = store.begin().await.unwrap();
    execute::<E>(&store, &mut tx, &client, b"201 order 1", Duration::ZERO).await.unwrap();
    let seen = store.record(&key(&client)).await.unwrap();
    assert!(seen.is_none(), "{on}: a record seen before its commit: {seen:?}");
    store.commit(tx).await.unwrap();
    let again = store.claim(&key(&client), order(), LEASE).await.unwrap();
    assert_eq!(replayed(&again), Some(&b"201 order 1"[..]), "{on}: {again:?}");
    let mut tx = store.begin().await.unwrap();
    let retry = execute::<E>(&store, &mut tx, &client, b"never", Duration::ZERO).await;
    let retry = retry.expect_err("a retry of a committed execution");
    assert_eq!(replayed(&retry), Some(&b"201 order 1"[..]), "{on}: {retry:?}");
    store.rollback(tx).await.unwrap();
    assert_eq!(engine.committed(&client).await, (1, 1), "{on}: one order, one record");
}

async fn a_duplicate_of_a_rolled_back_first_acquires<E: Orders>(engine: &E, run: &str) {
    let (on, store) = (engine.engine(), engine.store());
    let client = format!("{run}-claims-rolled-back");
    let mut tx = store.begin().await.unwrap();
    execute::<E>(&store, &mut tx, &client, b"lost", Duration::ZERO).await.unwrap();
    let waiting = duplicate(engine, &client, GUARD);
    // Seen waiting where the engine can show it (SQLite's wait is inside its connection).
    while engine.claims_waiting().await == Some(0) {
        assert!(!waiting.is_finished(), "{on}: the duplicate answered while the first is open");
        tokio::task::yield_now().await;
    }
    store.rollback(tx).await.unwrap();
    match waiting.await.unwrap().unwrap() {
        StoreClaim::Acquired { took_over, .. } => {
            assert!(!took_over, "{on}: a rolled-back first left no earlier execution")
        }
        other => panic!("{on}: the duplicate of a rolled-back first: {other:?}"),
    }
    assert_eq!(engine.committed(&client).await, (0, 0), "{on}: nothing committed");
}

async fn a_reused_key_is_a_mismatch_and_writes_nothing<E: Orders>(engine: &E, run: &str) {
    let (on, store) = (engine.engine(), engine.store());
    let client = format!("{run}-claims-reused");
    let mut tx = store.begin().await.unwrap();
    execute::<E>(&store, &mut tx, &client, b"201", Duration::ZERO).await.unwrap();
    store.commit(tx).await.unwrap();
    let mut tx = store.begin().await.unwrap();
    let other = Fingerprint::of(b"another order");
    let answer = store.claim_in(&mut tx, &key(&client), other, LEASE, Duration::ZERO, None).await;
    assert_eq!(answer.unwrap(), StoreClaim::Mismatch, "{on}");
    store.rollback(tx).await.unwrap();
    assert_eq!(engine.committed(&client).await, (1, 1), "{on}: nothing more written");
}

async fn a_record_the_stores_own_claim_holds_is_in_progress_and_fenced<E: Orders>(
    engine: &E,
    run: &str,
) {
    let (on, store) = (engine.engine(), engine.store());
    let client = format!("{run}-claims-held");
    // Another process's claim, committed on its own (the three-commit path).
    let held = store.claim(&key(&client), order(), LEASE).await.unwrap();
    let StoreClaim::Acquired { token, .. } = held else { panic!("{on}: acquired: {held:?}") };
    let (mut tx, held_key) = (store.begin().await.unwrap(), key(&client));
    let answer = store.claim_in(&mut tx, &held_key, order(), LEASE, Duration::ZERO, None);
    let answer = answer.await.unwrap();
    assert!(matches!(answer, StoreClaim::InProgress { .. }), "{on}: {answer:?}");
    let stale = OpenClaim::new(key(&client), FencingToken::new(token.get() + 1), KEPT);
    let refused = store.complete_in(&mut tx, &stale, Some(b"stale")).await;
    assert!(matches!(refused, Err(StoreError::LeaseLost(_))), "{on}: {refused:?}");
    store.rollback(tx).await.unwrap();
    store.complete(&key(&client), token, Some("201 held".into()), KEPT).await.unwrap();
    let mut tx = store.begin().await.unwrap();
    let retry = execute::<E>(&store, &mut tx, &client, b"never", Duration::ZERO).await;
    assert_eq!(replayed(&retry.unwrap_err()), Some(&b"201 held"[..]), "{on}");
    store.rollback(tx).await.unwrap();
    assert_eq!(engine.committed(&client).await, (0, 1), "{on}: the holder's record only");
}

async fn a_wait_that_ends_first_is_in_progress<E: Orders>(engine: &E, run: &str) {
    let (on, store) = (engine.engine(), engine.store());
    let client = format!("{run}-claims-bounded");
    let mut tx = store.begin().await.unwrap();
    execute::<E>(&store, &mut tx, &client, b"slow", Duration::ZERO).await.unwrap();
    // One second: the least bound every engine can put on a lock wait (MySQL counts
    // whole seconds).
    let answer = duplicate(engine, &client, Duration::from_secs(1)).await.unwrap().unwrap();
    assert!(matches!(answer, StoreClaim::InProgress { .. }), "{on}: {answer:?}");
    store.rollback(tx).await.unwrap();
    assert_eq!(engine.committed(&client).await, (0, 0), "{on}");
}

async fn a_zero_lease_is_invalid_input_and_writes_nothing<E: Orders>(engine: &E, run: &str) {
    let (on, store) = (engine.engine(), engine.store());
    let client = format!("{run}-claims-zero-lease");
    let (mut tx, zero_key) = (store.begin().await.unwrap(), key(&client));
    let refused = store.claim_in(&mut tx, &zero_key, order(), Duration::ZERO, Duration::ZERO, None);
    let refused = refused.await;
    assert!(matches!(refused, Err(StoreError::InvalidInput(_))), "{on}: {refused:?}");
    let _ = store.rollback(tx).await;
    assert_eq!(engine.committed(&client).await, (0, 0), "{on}");
}

/// The kill test's child half: claims `client`'s key in a transaction of the store's,
/// writes its order and completes it, says `claimed` (on stdout) and blocks until the
/// parent kills it, never committing.
pub async fn claim_and_wait_to_be_killed<E: Orders>(engine: &E, client: &str) -> ! {
    let store = engine.store();
    let mut tx = store.begin().await.unwrap();
    execute::<E>(&store, &mut tx, client, b"never committed", Duration::ZERO).await.unwrap();
    conformance::wait_to_be_killed_at("claimed")
}

/// The kill test's parent half, once the child died at `claimed`: the retry waits on
/// the dead transaction's row until the server rolled it back, then acquires (nothing
/// was left PROCESSING to lapse or take over), and one order and one record commit.
pub async fn after_a_kill_between_claim_and_commit<E: Orders>(engine: &E, client: &str) {
    let (on, store) = (engine.engine(), engine.store());
    let mut tx = store.begin().await.unwrap();
    let retry = execute::<E>(&store, &mut tx, client, b"201 the retry", GUARD).await;
    retry.unwrap_or_else(|answer| panic!("{on}: the retry after the kill: {answer:?}"));
    store.commit(tx).await.unwrap();
    assert_eq!(engine.committed(client).await, (1, 1), "{on}: the retry's order only");
    let again = store.claim(&key(client), order(), LEASE).await.unwrap();
    assert_eq!(replayed(&again), Some(&b"201 the retry"[..]), "{on}: {again:?}");
}
