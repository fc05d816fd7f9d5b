//! Running CMD under a held claim: its output passed through live and captured (up to
//! a size limit), and the claim's lease renewed until it ends.
//!
//! Invariant: every byte CMD writes reaches `idem`'s own stdout or stderr as it comes
//! (a closed pipe on our side stops the passing, never the capture), and is kept in
//! order per stream until the two streams together pass the limit; past it, that
//! stream's capture is dropped (its length still counted). A stream's capture never
//! holds more memory than the limit, whatever CMD writes. The lease is renewed every
//! third of its length from the moment CMD starts until [`Renewal::stop`].

use std::io::{Read, Write};
use std::process::{Child, ChildStderr, ChildStdout};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use idemcache::store::{block_on, Store, StoreError};
use idemcache::{FencingToken, Key};
use idemcache_sqlite::SqliteStore;

use crate::outcome::Stream;

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
            .spawn(move || pass(out, std::io::stdout(), &b))?;
        let stderr = std::thread::Builder::new()
            .name("idem-stderr".into())
            .spawn(move || pass(err, std::io::stderr(), &budget))?;
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

/// Copies `from` to `to` until end of file, keeping what fits in `budget`.
fn pass(mut from: impl Read, to: impl Write, budget: &AtomicUsize) -> Capture {
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
            // A reader gone (`idem run ... | head`): stop passing, keep capturing.
            if w.write_all(chunk).and_then(|()| w.flush()).is_err() {
                to = None;
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

/// The thread renewing a claim's lease while CMD runs.
pub struct Renewal {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<Option<StoreError>>,
}

impl Renewal {
    /// Renews `token`'s lease on `key` to `lease` every third of `lease`.
    pub fn start(
        store: SqliteStore,
        key: Key,
        token: FencingToken,
        lease: Duration,
    ) -> std::io::Result<Renewal> {
        let (stop, stopped) = mpsc::channel::<()>();
        let beat = lease / 3;
        let thread = std::thread::Builder::new().name("idem-lease".into()).spawn(move || {
            loop {
                match stopped.recv_timeout(beat) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return None,
                }
                match block_on(store.extend_lease(&key, token, lease)) {
                    Ok(_) => {}
                    // The key moved on (forgotten by force): nothing more to renew.
                    Err(lost @ StoreError::LeaseLost(_)) => return Some(lost),
                    // The database busy or failing this time: the next beat tries again,
                    // two more before the lease lapses.
                    Err(_) => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What a stream keeps, read in chunks from `input` under `limit`.
    fn captured(input: &[u8], limit: usize) -> Capture {
        pass(input, std::io::sink(), &AtomicUsize::new(limit))
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
