//! The core's async wait on a real tokio runtime. `claim_wait` on a current-thread
//! runtime blocks the only thread, so the owner could never finish; the async wait
//! yields it.

use idemcache::{Cache, Claim, Fingerprint, Key};

#[tokio::test(flavor = "current_thread")]
async fn on_a_current_thread_runtime_the_owner_finishes_and_the_waiter_replays() {
    let cache = Cache::builder().build().unwrap();
    let k = Key::new("POST /orders", "user:1", "k").unwrap();
    let Claim::Acquired(owner) = cache.claim(&k, Fingerprint::of(b"a")).unwrap() else {
        panic!("a free key is acquired at once");
    };
    let owner_task = tokio::spawn(async move {
        tokio::task::yield_now().await;
        owner.complete(b"done").unwrap();
    });
    let waited = cache.claim_wait_async(&k, Fingerprint::of(b"a"), tokio::time::sleep).await;
    match waited {
        Ok(Claim::Completed(replay)) => assert_eq!(replay.body.unwrap(), "done"),
        other => panic!("expected the replay, got {other:?}"),
    }
    owner_task.await.unwrap();
}
