//! Running CMD under a held claim: its output passed through live and captured (up to
//! a size limit), and the claim's lease renewed until it ends.
//!
//! Invariant: every byte CMD writes reaches `idem`'s own stdout or stderr as it comes
//! (a write that fails on our side stops the passing, never the capture; one that fails
//! for another reason than a reader gone is said on stderr), and is kept in
//! order per stream until the two streams together pass the limit; past it, that
//! stream's capture is dropped (its length still counted). A stream's capture never
//! holds more memory than the limit, whatever CMD writes. The lease is renewed every
//! third of its length from the moment CMD starts until [`Renewal::stop`], and a
//! renewal that fails is tried again until the lease's end, never waiting longer than
//! what is left of it.

use std::io::{Read, Write};
use std::process::{Child, ChildStderr, ChildStdout};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use idemcache::store::{block_on, Store, StoreError};
use idemcache::{FencingToken, Key};
use idemcache_sqlite::SqliteStore;

use crate::outcome::Stream;
use crate::output::errln;

/// What one of CMD's streams left.
struct Capture {
    kept: Option<Vec<u8>>,
    len: u64,
}

/// The two threads passing CMD's output through.
pub struct Tee {
    stdout: JoinHandle<Capture>,
    stderr: JoinHandle<Capture>,
}

impl Tee {
    /// Starts passing `child`'s piped stdout and stderr through, keeping up to `limit`
    /// bytes of the two together.
    pub fn start(child: &mut Child, limit: usize) -> std::io::Result<Tee> {
        let budget = Arc::new(AtomicUsize::new(limit));
        let out: ChildStdout =
            child.stdout.take().ok_or_else(|| std::io::Error::other("no stdout pipe"))?;
        let err: ChildStderr =
            child.stderr.take().ok_or_else(|| std::io::Error::other("no stderr pipe"))?;
        let b = budget.clone();
        let stdout = std::thread::Builder::new()
            .name("idem-stdout".into())
            .spawn(move || pass(out, std::io::stdout(), "stdout", &b))?;
        let stderr = std::thread::Builder::new()
            .name("idem-stderr".into())
            .spawn(move || pass(err, std::io::stderr(), "stderr", &budget))?;
        Ok(Tee { stdout, stderr })
    }

    /// Waits for both streams to close (CMD and anything it left holding them), and
    /// returns them as recorded.
    pub fn finish(self) -> (Stream, Stream) {
        let done = |t: JoinHandle<Capture>| match t.join() {
            Ok(Capture { kept: Some(bytes), .. }) => Stream::Kept(bytes),
            Ok(Capture { kept: None, len }) => Stream::Dropped(len),
            Err(_) => Stream::Dropped(0),
        };
        (done(self.stdout), done(self.stderr))
    }
}

/// Copies `from` to `to` (idem's own `name`) until end of file, keeping what fits in
/// `budget`.
fn pass(mut from: impl Read, to: impl Write, name: &str, budget: &AtomicUsize) -> Capture {
    let mut to = Some(to);
    let mut capture = Capture { kept: Some(Vec::new()), len: 0 };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let chunk = &buf[..n];
        capture.len += n as u64;
        if let Some(w) = &mut to {
            // A reader gone (`idem run ... | head`): stop passing, keep capturing. Another
            // failure (a full disk) is said once, as `output` says its own.
            if let Err(e) = w.write_all(chunk).and_then(|()| w.flush()) {
                to = None;
                if e.kind() != std::io::ErrorKind::BrokenPipe {
                    errln!(
                        "idem: writing the command's output to {name} failed: {e}; the rest \
                         of it is recorded, not written"
                    );
                }
            }
        }
        if capture.kept.is_some() {
            let taken = budget
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| left.checked_sub(n));
            match (taken, &mut capture.kept) {
                (Ok(left), Some(kept)) => keep(kept, chunk, left),
                _ => capture.kept = None,
            }
        }
    }
    capture
}

/// Appends `chunk` to `kept`, growing it as a `Vec` grows (doubling, so appends stay
/// cheap) but never past what the stream may still keep: `left` (the budget before this
/// chunk, at least its length) beyond what it holds.
fn keep(kept: &mut Vec<u8>, chunk: &[u8], left: usize) {
    if kept.capacity() - kept.len() < chunk.len() {
        kept.reserve_exact(kept.capacity().max(chunk.len()).min(left));
    }
    kept.extend_from_slice(chunk);
}

/// The first pause after a renewal failed, doubling to [`LONGEST_PAUSE`]: short, so
/// that a lock released is found soon, among other writers queuing for it (SQLite's
/// own busy handler pauses 1 ms to 100 ms).
const FIRST_PAUSE: Duration = Duration::from_millis(2);
/// The longest pause between two tries of one renewal.
const LONGEST_PAUSE: Duration = Duration::from_millis(25);

/// The thread renewing a claim's lease while CMD runs.
pub struct Renewal {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<Option<StoreError>>,
}

/// How one renewal ended.
enum Renewed {
    /// The lease now ends then.
    Until(SystemTime),
    /// The key has moved on (forgotten by force, or the lease lapsed): nothing more to
    /// renew.
    Lost(StoreError),
    /// The lease's end came with every try failing: the next beat's try hears it lost
    /// (or renews it, if SQLite's clock is behind this process's).
    Lapsed,
    /// [`Renewal::stop`] was called.
    Stopped,
}

impl Renewal {
    /// Renews `token`'s lease on `key` to `lease` every third of `lease`, through
    /// `store` (a connection that does not wait for locks: see
    /// [`Db::renewal_store`](crate::db::Db::renewal_store)). A renewal that fails is
    /// tried again after a short pause until the lease ends (`ends_at`, then the end
    /// each renewal returns).
    pub fn start(
        store: SqliteStore,
        key: Key,
        token: FencingToken,
        lease: Duration,
        ends_at: SystemTime,
    ) -> std::io::Result<Renewal> {
        let (stop, stopped) = mpsc::channel::<()>();
        let beat = lease / 3;
        let thread = std::thread::Builder::new().name("idem-lease".into()).spawn(move || {
            let mut ends = monotonic(ends_at);
            loop {
                if !rest(&stopped, beat) {
                    return None;
                }
                match renew(&store, &key, token, lease, ends, &stopped) {
                    Renewed::Until(until) => ends = monotonic(until),
                    Renewed::Lost(lost) => return Some(lost),
                    Renewed::Lapsed => {}
                    Renewed::Stopped => return None,
                }
            }
        })?;
        Ok(Renewal { stop, thread })
    }

    /// Stops renewing; returns the loss, if the lease was lost meanwhile.
    pub fn stop(self) -> Option<StoreError> {
        drop(self.stop);
        self.thread.join().unwrap_or(None)
    }
}

/// One renewal, tried until the store answers or the lease ends (`ends`), pausing
/// after each failure: the database locked by another writer (this connection does not
/// wait) or failing.
fn renew(
    store: &SqliteStore,
    key: &Key,
    token: FencingToken,
    lease: Duration,
    ends: Instant,
    stopped: &mpsc::Receiver<()>,
) -> Renewed {
    let mut pause = FIRST_PAUSE;
    loop {
        match block_on(store.extend_lease(key, token, lease)) {
            Ok(until) => return Renewed::Until(until),
            Err(lost @ StoreError::LeaseLost(_)) => return Renewed::Lost(lost),
            Err(_) => {}
        }
        let left = ends.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Renewed::Lapsed;
        }
        if !rest(stopped, pause.min(left)) {
            return Renewed::Stopped;
        }
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

/// Waits `d`, or until told to stop: `false` then.
fn rest(stopped: &mpsc::Receiver<()>, d: Duration) -> bool {
    matches!(stopped.recv_timeout(d), Err(mpsc::RecvTimeoutError::Timeout))
}

/// The instant on this process's monotonic clock of `at`, a time on SQLite's (the
/// system's) clock; the present if it is past (or beyond what an `Instant` holds).
fn monotonic(at: SystemTime) -> Instant {
    let now = Instant::now();
    now.checked_add(at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO)).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a stream keeps, read in chunks from `input` under `limit`.
    fn captured(input: &[u8], limit: usize) -> Capture {
        pass(input, std::io::sink(), "stdout", &AtomicUsize::new(limit))
    }

    #[test]
    fn a_capture_holds_no_more_memory_than_the_limit() {
        // Two reads (64 KiB, then the rest): doubling would reserve 128 KiB.
        let input = vec![7u8; 99_999];
        let capture = captured(&input, 100_000);
        let kept = capture.kept.expect("it fits");
        assert_eq!(kept, input);
        assert!(kept.capacity() <= 100_000, "{} bytes reserved", kept.capacity());
        // Over the limit: dropped, its length counted.
        let over = captured(&vec![1u8; 300_000], 100_000);
        assert_eq!((over.kept, over.len), (None, 300_000));
    }
}
