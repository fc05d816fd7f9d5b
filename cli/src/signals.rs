//! Ctrl-C, SIGTERM and SIGHUP while `idem run` works: forwarded to CMD while it runs,
//! and, before CMD starts, an end to the wait for a busy key.
//!
//! Invariant: from [`Signals::listen`] on, none of these signals ends `idem` by itself:
//! each is recorded (the first one is what the run reports), and while CMD runs it is
//! sent on to CMD, unless the kernel sent it to the whole foreground process group (a
//! terminal's Ctrl-C), which CMD is in and so got already. A waiter's pause ([`Nap`])
//! ends at once when a signal arrives, and [`Interruptible`] abandons the wait only at
//! such a pause, never while a claim is in flight (that claim could have acquired).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::iterator::{Handle, SignalsInfo};
use signal_hook::low_level::siginfo::Cause;

/// What the signal thread and the run share.
#[derive(Debug, Default)]
struct Route {
    /// The first signal received.
    first: Option<i32>,
    /// CMD's pid while it runs.
    child: Option<i32>,
    /// A signal received before CMD's pid was known, to send it once it is.
    unsent: Option<i32>,
    /// A [`Nap`] saw the signal and is parked: the wait may be abandoned.
    napping: bool,
}

/// The signal listener of one run.
#[derive(Debug)]
pub struct Signals {
    route: Arc<(Mutex<Route>, Condvar)>,
    handle: Handle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Signals {
    /// Starts listening for SIGINT, SIGTERM and SIGHUP.
    pub fn listen() -> std::io::Result<Signals> {
        let mut signals = SignalsInfo::<WithOrigin>::new([SIGINT, SIGTERM, SIGHUP])?;
        let handle = signals.handle();
        let route = Arc::new((Mutex::new(Route::default()), Condvar::new()));
        let shared = route.clone();
        let thread = std::thread::Builder::new().name("idem-signals".into()).spawn(move || {
            for origin in signals.forever() {
                let (route, changed) = &*shared;
                let mut r = lock(route);
                r.first.get_or_insert(origin.signal);
                // The kernel sends a terminal's signals to the whole foreground group,
                // CMD included: sending it again could make CMD take it as a second one.
                let to_group = matches!(origin.cause, Cause::Kernel);
                match r.child {
                    Some(pid) if !to_group => forward(pid, origin.signal),
                    Some(_) => {}
                    None if !to_group => r.unsent = Some(origin.signal),
                    None => {}
                }
                changed.notify_all();
            }
        })?;
        Ok(Signals { route, handle, thread: Some(thread) })
    }

    /// The first signal received so far.
    pub fn received(&self) -> Option<i32> {
        lock(&self.route.0).first
    }

    /// CMD started as `pid`: signals from now on go to it (and one that came while it
    /// started, too). Returns the first signal received before, if any.
    pub fn child_started(&self, pid: u32) -> Option<i32> {
        let mut r = lock(&self.route.0);
        let pid = i32::try_from(pid).unwrap_or(i32::MAX);
        r.child = Some(pid);
        if let Some(signal) = r.unsent.take() {
            forward(pid, signal);
        }
        r.first
    }

    /// CMD ended: nothing is forwarded any more. Returns the first signal received
    /// until then (one after it changes nothing of what CMD did).
    pub fn child_ended(&self) -> Option<i32> {
        let mut r = lock(&self.route.0);
        r.child = None;
        r.first
    }

    /// A sleep for [`claim_wait`](idemcache::store::claim_wait) that ends early when a
    /// signal arrives.
    pub fn nap(&self, d: Duration) -> Nap {
        Nap { route: self.route.clone(), until: Instant::now() + d }
    }

    /// `future` (a claim-and-wait napping with [`Signals::nap`]), abandoned at a nap
    /// when a signal arrives: `None` then.
    pub fn interruptible<F: Future + Unpin>(&self, future: F) -> Interruptible<F> {
        Interruptible { future, route: self.route.clone() }
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn lock(route: &Mutex<Route>) -> MutexGuard<'_, Route> {
    route.lock().unwrap_or_else(|p| p.into_inner())
}

fn forward(pid: i32, signal: i32) {
    let (Some(pid), Some(signal)) =
        (rustix::process::Pid::from_raw(pid), rustix::process::Signal::from_named_raw(signal))
    else {
        return;
    };
    // CMD may have just exited: nothing to do then.
    let _ = rustix::process::kill_process(pid, signal);
}

/// A pause of a waiter, blocking its thread (under `block_on`) until its end or a
/// signal. After a signal it stays pending (and marks the route as napping) so that
/// [`Interruptible`] can abandon the wait here.
#[derive(Debug)]
pub struct Nap {
    route: Arc<(Mutex<Route>, Condvar)>,
    until: Instant,
}

impl Future for Nap {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let (route, changed) = &*self.route;
        let mut r = lock(route);
        loop {
            if r.first.is_some() {
                r.napping = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let left = self.until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Poll::Ready(());
            }
            r = changed.wait_timeout(r, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

/// See [`Signals::interruptible`].
#[derive(Debug)]
pub struct Interruptible<F> {
    future: F,
    route: Arc<(Mutex<Route>, Condvar)>,
}

impl<F: Future + Unpin> Future for Interruptible<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(out) = Pin::new(&mut self.future).poll(cx) {
            return Poll::Ready(Some(out));
        }
        // Only a nap sets this, and only after a signal: no claim is in flight.
        if lock(&self.route.0).napping {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}
