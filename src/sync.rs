//! The one door to synchronisation primitives.
//!
//! Every lock, condvar and atomic the crate uses is imported from here, never from
//! `std`, `parking_lot` or `loom` directly. Normally these are `parking_lot`'s
//! reader-writer lock, mutex and condvar and `std`'s atomics; compiled with
//! `RUSTFLAGS="--cfg idemcache_loom"` they are loom's, so the loom models in
//! `tests/loom.rs` explore the shipping code, not a copy.
//!
//! The crate-specific cfg (rather than the global `loom`) keeps loom out of dependencies
//! that also react to `cfg(loom)`.
//!
//! The API is the intersection of the two worlds: `lock()`, `read()` and `write()` never
//! report poisoning, and `Condvar::wait_timeout` takes the guard by value and hands it
//! back.

#[cfg(not(idemcache_loom))]
mod imp {
    use std::time::Duration;

    pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
    pub(crate) use std::sync::Arc;

    /// A mutex that does not poison: a panic under the lock cannot leave a shard's
    /// invariants half-updated, because every shard method restores them before it can
    /// panic (they only panic on internal bugs, caught by `validate` in tests).
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(parking_lot::Mutex<T>);

    pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(parking_lot::Mutex::new(value))
        }

        #[inline]
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }
    }

    /// A reader-writer lock that does not poison, for the same reason as [`Mutex`].
    #[derive(Debug, Default)]
    pub(crate) struct RwLock<T>(parking_lot::RwLock<T>);

    pub(crate) type RwLockReadGuard<'a, T> = parking_lot::RwLockReadGuard<'a, T>;
    pub(crate) type RwLockWriteGuard<'a, T> = parking_lot::RwLockWriteGuard<'a, T>;

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            RwLock(parking_lot::RwLock::new(value))
        }

        #[inline]
        pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0.read()
        }

        #[inline]
        pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0.write()
        }
    }

    #[derive(Debug, Default)]
    pub(crate) struct Condvar(parking_lot::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Condvar(parking_lot::Condvar::new())
        }

        /// Waits for a notification or until `dur` has passed; spurious wake-ups are
        /// possible, so callers re-check their condition in a loop.
        pub(crate) fn wait_timeout<'a, T>(
            &self,
            mut guard: MutexGuard<'a, T>,
            dur: Duration,
        ) -> MutexGuard<'a, T> {
            self.0.wait_for(&mut guard, dur);
            guard
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

#[cfg(idemcache_loom)]
mod imp {
    use std::time::Duration;

    pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
    pub(crate) use loom::sync::Arc;

    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            // Loom's locks mirror std's and can poison; the crate never panics under a
            // lock outside of bugs, so a poisoned lock is itself a model failure.
            self.0.lock().expect("lock poisoned")
        }
    }

    #[derive(Debug)]
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

    pub(crate) type RwLockReadGuard<'a, T> = loom::sync::RwLockReadGuard<'a, T>;
    pub(crate) type RwLockWriteGuard<'a, T> = loom::sync::RwLockWriteGuard<'a, T>;

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            RwLock(loom::sync::RwLock::new(value))
        }

        pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0.read().expect("shard lock poisoned")
        }

        pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0.write().expect("shard lock poisoned")
        }
    }

    #[derive(Debug)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Condvar(loom::sync::Condvar::new())
        }

        /// Loom does not model time: a timed wait is an untimed wait that may also wake
        /// spuriously, which is exactly what callers must already tolerate.
        pub(crate) fn wait_timeout<'a, T>(
            &self,
            guard: MutexGuard<'a, T>,
            dur: Duration,
        ) -> MutexGuard<'a, T> {
            self.0.wait_timeout(guard, dur).expect("lock poisoned").0
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

pub(crate) use imp::*;

/// Pads and aligns a value to 128 bytes so two shards' locks never share a cache line
/// (adjacent-line prefetching on x86 pulls pairs of 64-byte lines).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct CachePadded<T>(pub(crate) T);

impl<T> std::ops::Deref for CachePadded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}
