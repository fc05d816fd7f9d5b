//! What every driver's outbox suite uses to try its relay (feature `test-utils`): a
//! broker that fails and hangs on cue ([`FlakyBroker`]) and a clock moved by hand
//! ([`HandClock`]).
//!
//! Invariant: the broker confirms a message (records it) only in a publish that answers
//! `Ok`; a publish it hangs never answers, as a broker that stopped responding, so that
//! the relay awaiting it can be killed mid-batch.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use super::{OutboxMessage, PublishError, Publisher};

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
