//! The store's worker thread: the one thread that owns the store's connection and runs
//! its operations, and the one-shot exchange each caller is answered through.
//!
//! Invariant: every operation of a store (and its clones) runs on its one connection,
//! on the worker thread, one at a time in the order sent, so blocking SQLite calls never
//! run on an async runtime's threads; every caller is answered exactly once, with an
//! error if the worker is gone or never opened its connection, so no future waits
//! forever. The futures need no runtime.

use std::future::Future;
use std::pin::Pin;
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll, Waker};

use rusqlite::Connection;

use idemcache::store::StoreError;
use idemcache::LapsePolicy;

use crate::SqliteStore;

/// An operation the worker runs on its connection.
pub(crate) type Job = Box<dyn FnOnce(&mut Connection) + Send>;
/// The worker's first job: put a connection in its slot (or fail, and the worker ends).
type Open = Box<dyn FnOnce(&mut Option<Connection>) + Send>;

/// Gives a new store's worker its connection.
pub(crate) struct Opener {
    open: mpsc::Sender<Open>,
    /// Why the worker thread could not be spawned, if it could not.
    spawned: Option<String>,
}

impl Opener {
    /// Runs `op` on the worker with its connection slot; resolves with its result.
    pub(crate) fn run(
        self,
        op: impl FnOnce(&mut Option<Connection>) -> Result<(), StoreError> + Send + 'static,
    ) -> Answer<()> {
        let (reply, answer) = exchange();
        match self.spawned {
            Some(why) => {
                let why = format!("spawning the SQLite worker thread: {why}");
                reply.send(Err(StoreError::Backend(why.into())));
            }
            None => drop(self.open.send(Box::new(move |db| reply.send(op(db))))),
        }
        answer
    }
}

impl SqliteStore {
    /// A store whose worker thread has no connection yet, and the handle that gives it
    /// one (the first thing the worker does).
    pub(crate) fn start(database: &str) -> (SqliteStore, Opener) {
        let (jobs, inbox) = mpsc::channel::<Job>();
        let (open, opened) = mpsc::channel::<Open>();
        let spawned =
            std::thread::Builder::new().name("idemcache-sqlite".into()).spawn(move || {
                let mut db = None;
                if let Ok(open) = opened.recv() {
                    open(&mut db);
                }
                // No connection: the jobs are dropped unanswered, and each `Reply` answers
                // its caller with an error.
                let Some(mut db) = db else { return };
                // Ends when the store's last clone (the only senders) is dropped.
                for job in inbox {
                    job(&mut db);
                }
            });
        let store = SqliteStore {
            jobs,
            database: database.into(),
            lapse: LapsePolicy::TakeOver,
            file: None,
        };
        (store, Opener { open, spawned: spawned.err().map(|e| e.to_string()) })
    }

    /// Runs `op` on the worker thread; the future resolves with its result.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Answer<T> {
        let (reply, answer) = exchange();
        let job: Job = Box::new(move |db| reply.send(op(db)));
        // If the worker is gone, the job comes back in the error and is dropped here:
        // its `Reply` then answers the slot with an error.
        drop(self.jobs.send(job));
        answer
    }
}

/// The two halves of one answer from the worker: its [`Reply`] and the caller's
/// [`Answer`], sharing one slot.
fn exchange<T>() -> (Reply<T>, Answer<T>) {
    let slot = Arc::new(Mutex::new(Slot { value: None, waker: None }));
    (Reply(slot.clone()), Answer(slot))
}

struct Slot<T> {
    value: Option<Result<T, StoreError>>,
    waker: Option<Waker>,
}

/// The worker's half: answers once; dropped unanswered (the worker died), it answers
/// with an error so no caller waits forever.
struct Reply<T>(Arc<Mutex<Slot<T>>>);

impl<T> Reply<T> {
    fn send(self, value: Result<T, StoreError>) {
        self.put(value);
    }

    fn put(&self, value: Result<T, StoreError>) {
        let waker = {
            let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
            if slot.value.is_some() {
                return;
            }
            slot.value = Some(value);
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Drop for Reply<T> {
    fn drop(&mut self) {
        let gone = "the SQLite worker thread is gone".to_owned();
        self.put(Err(StoreError::Backend(gone.into())));
    }
}

/// The caller's half: a future of the worker's answer.
pub(crate) struct Answer<T>(Arc<Mutex<Slot<T>>>);

impl<T> Future for Answer<T> {
    type Output = Result<T, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match slot.value.take() {
            Some(value) => Poll::Ready(value),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
