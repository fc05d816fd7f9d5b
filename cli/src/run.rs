//! `idem run`: CMD at most once per key.
//!
//! Invariant: CMD is started only under a claim this run acquired in the store, and the
//! claim ends in exactly one of: completed with CMD's outcome (a repeat replays it),
//! marked UNKNOWN (interrupted while CMD ran; or the store failed to record it),
//! released (CMD could not be started, or a signal came before it did), or left to
//! lapse (`idem` itself killed), which the `MarkUnknown` lapse policy turns UNKNOWN.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use idemcache::store::{claim_wait, Store, StoreClaim, StoreError};
use idemcache::{Bytes, FencingToken, Fingerprint, Key};

use crate::child::{Renewal, Tee};
use crate::db::Db;
use crate::exit::{self, Failure};
use crate::outcome::{command_line, Outcome, Status, Stream};
use crate::output::{self, errln};
use crate::signals::Signals;
use crate::timefmt::{ago, rfc3339};

/// The scope of every key `idem` claims (keys of other programs sharing a database
/// cannot meet them).
pub const SCOPE: &str = "idem run";

/// The signals that interrupt a run (passed on to CMD, leaving the key UNKNOWN), and
/// that leave it UNKNOWN when CMD dies of one: SIGINT, SIGTERM, SIGHUP.
const INTERRUPTS: [i32; 3] =
    [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP];

/// What `idem run` was asked.
#[derive(Debug)]
pub struct Run {
    /// The key, as given.
    pub key: String,
    /// CMD and its arguments.
    pub argv: Vec<OsString>,
    /// How long the outcome is kept.
    pub ttl: Duration,
    /// How long an interrupted run's UNKNOWN mark is kept (as a lapsed lease's).
    pub unknown_ttl: Duration,
    /// How long to wait for a concurrent run of the key.
    pub wait: Duration,
    /// Forget an UNKNOWN outcome and run.
    pub retry_unknown: bool,
    /// The lease the run holds, renewed every third of it while CMD runs: a run killed
    /// with SIGKILL keeps its key "in progress" for at most this long, then the key is
    /// UNKNOWN.
    pub lease: Duration,
    /// The most output (stdout and stderr together) the record keeps: past it the
    /// status is kept and replayed, the output is not.
    pub max_output: usize,
}

/// The key `idem` keeps `client_key`'s record under.
pub fn key(client_key: &str) -> Result<Key, Failure> {
    Key::without_tenant(SCOPE, client_key).map_err(|e| {
        Failure::new(exit::USAGE, format!("the key {client_key:?} is refused: {e} (keys are 1 to 255 visible ASCII characters, no spaces)"))
    })
}

/// The request a run is: CMD and each argument, length-prefixed (`["a b"]` is not
/// `["a", "b"]`).
pub fn fingerprint(argv: &[OsString]) -> Fingerprint {
    let mut builder = Fingerprint::builder().bytes(b"idem run argv v1");
    for arg in argv {
        builder = builder.bytes(arg.as_bytes());
    }
    builder.finish()
}

/// Runs `run` over `db`; the exit code `idem` ends with.
pub fn run(db: &Db, run: Run) -> Result<u8, Failure> {
    let key = key(&run.key)?;
    let fp = fingerprint(&run.argv);
    let signals = Signals::listen().map_err(|e| {
        Failure::new(exit::CANNOT_EXECUTE, format!("cannot listen for signals: {e}"))
    })?;
    let mut retried = false;
    loop {
        let waiting =
            Box::pin(claim_wait(&db.store, &key, fp, run.lease, run.wait, |d| signals.nap(d)));
        let claim = match idemcache::store::block_on(signals.interruptible(waiting)) {
            Some(claim) => claim.map_err(|e| db.failure(e))?,
            // Interrupted while waiting: nothing was held, nothing ran.
            None => return Ok(exit::signal_code(signals.received().unwrap_or(0))),
        };
        match claim {
            StoreClaim::Acquired { token, lease_ends_at, .. } => {
                return execute(db, &run, &key, token, lease_ends_at, &signals)
            }
            StoreClaim::Completed(replay) => return replay_outcome(&run.key, replay.body),
            StoreClaim::InProgress { lease_ends_at } => {
                let waited = if run.wait.is_zero() {
                    String::new()
                } else {
                    format!(" (waited {:.1} s)", run.wait.as_secs_f64())
                };
                errln!(
                    "idem: {}: in progress{waited}: another run holds the key (its lease ends {}); \
                     try again later, or wait longer with --wait SECS",
                    run.key,
                    rfc3339(lease_ends_at)
                );
                return Ok(exit::IN_PROGRESS);
            }
            StoreClaim::Unknown { .. } if run.retry_unknown && !retried => {
                retried = true;
                match idemcache::store::block_on(db.store.forget(&key)) {
                    Ok(()) => {
                        errln!("idem: {}: forgot the UNKNOWN outcome (--retry-unknown)", run.key)
                    }
                    // Settled by someone else meanwhile: the next look says how.
                    Err(StoreError::NothingToSettle(_)) => {}
                    Err(e) => return Err(db.failure(e)),
                }
            }
            StoreClaim::Unknown { marked_at } => {
                errln!(
                    "idem: {}: outcome UNKNOWN since {} ({}): an earlier run was interrupted or killed \
                     while its command ran, so it may or may not have had its effect. Check, then \
                     `idem resolve {} --exit-code N` (it happened) or `idem forget {}` (it did not), \
                     or run again with --retry-unknown",
                    run.key,
                    rfc3339(marked_at),
                    ago(marked_at),
                    run.key,
                    run.key
                );
                return Ok(exit::UNKNOWN);
            }
            StoreClaim::Mismatch => {
                // Which command, if the record says (a completed run's does).
                let recorded = db
                    .wait(db.store.record(&key))
                    .ok()
                    .flatten()
                    .and_then(|r| r.body)
                    .and_then(|body| Outcome::decode(&body).ok())
                    .filter(|o| !o.resolved)
                    .map_or_else(String::new, |o| format!(" (`{}`)", o.command_line()));
                errln!(
                    "idem: {}: the key was used for another command{recorded}, not `{}`; use \
                     another key (or `idem status {}` to see its record)",
                    run.key,
                    command_line(&bytes_of(&run.argv)),
                    run.key
                );
                return Ok(exit::MISMATCH);
            }
        }
    }
}

fn bytes_of(argv: &[OsString]) -> Vec<Vec<u8>> {
    argv.iter().map(|a| a.as_bytes().to_vec()).collect()
}

/// Replays a recorded outcome: its output, byte for byte, then its status.
fn replay_outcome(client_key: &str, body: Option<Bytes>) -> Result<u8, Failure> {
    let unreadable = |why: String| {
        Failure::new(
            exit::DB_UNUSABLE,
            format!("{client_key}: its record cannot be replayed: {why}"),
        )
    };
    let body = body.ok_or_else(|| unreadable("it was kept without its outcome".into()))?;
    let outcome = Outcome::decode(&body).map_err(unreadable)?;
    // A reader gone (`| head`) is not an error of the replay: the status still counts.
    if let Stream::Kept(bytes) = &outcome.stdout {
        output::stdout_bytes(bytes);
    }
    if let Stream::Kept(bytes) = &outcome.stderr {
        output::stderr_bytes(bytes);
    }
    if let (Stream::Dropped(_), _) | (_, Stream::Dropped(_)) = (&outcome.stdout, &outcome.stderr) {
        errln!(
            "idem: {client_key}: its output ({} bytes of stdout, {} of stderr) was over the limit \
             when it ran and was not kept: only its status is replayed",
            outcome.stdout.len(),
            outcome.stderr.len()
        );
    }
    Ok(outcome.status.exit_code())
}

/// Runs CMD under the claim `token` (its lease ending at `lease_ends_at`), and settles
/// the claim by what happened.
fn execute(
    db: &Db,
    run: &Run,
    key: &Key,
    token: FencingToken,
    lease_ends_at: SystemTime,
    signals: &Signals,
) -> Result<u8, Failure> {
    let release = |why: String, code: u8| {
        let released = db.wait(db.store.release(key, token));
        errln!("idem: {}: {why}", run.key);
        released.map(|()| code)
    };
    if let Some(signal) = signals.received() {
        return release(
            "interrupted before the command started: nothing ran".into(),
            exit::signal_code(signal),
        );
    }
    // The renewals' own connection, opened before CMD starts: failing to open it, no
    // command has run yet.
    let renewer = match db.renewal_store() {
        Ok(store) => store,
        Err(failure) => {
            let _ = db.wait(db.store.release(key, token));
            return Err(failure);
        }
    };
    let mut child = match Command::new(&run.argv[0])
        .args(&run.argv[1..])
        .stdin(Stdio::inherit())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
            let what = run.argv[0].to_string_lossy().into_owned();
            return release(
                format!("cannot run {what:?}: {e}; nothing ran, nothing is recorded"),
                code,
            );
        }
    };
    let interrupted_early = signals.child_started(child.id());
    let renewal = Renewal::start(renewer, key.clone(), token, run.lease, lease_ends_at);
    let tee = Tee::start(&mut child, run.max_output);
    let waited = child.wait();
    let interrupted = signals.child_ended().or(interrupted_early);
    let (stdout, stderr) = match tee {
        Ok(tee) => tee.finish(),
        Err(_) => (Stream::Dropped(0), Stream::Dropped(0)),
    };
    let lost = renewal.ok().and_then(Renewal::stop);
    let status = match waited {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => Status::Exited(code),
            (None, Some(signal)) => Status::Signaled(signal),
            (None, None) => Status::Exited(exit::CANNOT_EXECUTE.into()),
        },
        Err(e) => {
            // Not known how CMD ended: neither is its effect.
            let _ = db.wait(db.store.mark_unknown(key, token, run.unknown_ttl));
            return Err(Failure::new(
                exit::UNKNOWN,
                format!(
                    "{}: waiting for the command failed: {e}; the key is marked UNKNOWN",
                    run.key
                ),
            ));
        }
    };
    if let Some(lost) = lost {
        drop(lost);
        return Ok(lost_hold(&run.key, status));
    }
    // CMD killed by an interrupting signal is interrupted too, whether or not this
    // process saw it: a terminal's Ctrl-C reaches CMD and `idem` at once, and CMD may be
    // reaped before `idem`'s own copy is read; a kill may have been aimed at CMD alone.
    let interrupted = interrupted.or(match status {
        Status::Signaled(n) if INTERRUPTS.contains(&n) => Some(n),
        _ => None,
    });
    if let Some(signal) = interrupted {
        let marked = idemcache::store::block_on(db.store.mark_unknown(key, token, run.unknown_ttl));
        // Taken from this run before a renewal heard it (forgotten by force; a lapse read
        // since): not the database's failure, and nothing of this run's to mark.
        if let Err(StoreError::LeaseLost(_)) = marked {
            return Ok(lost_hold(&run.key, status));
        }
        let name = signal_hook::low_level::signal_name(signal).unwrap_or("a signal");
        errln!(
            "idem: {}: interrupted by {name} while the command ran (it ended: {}): the key is \
             marked UNKNOWN, since its effect may or may not have happened. Check, then \
             `idem resolve {} --exit-code N` or `idem forget {}`",
            run.key,
            status.describe(),
            run.key,
            run.key
        );
        marked.map_err(|e| db.failure(e))?;
        return Ok(status.exit_code());
    }
    let dropped = matches!((&stdout, &stderr), (Stream::Dropped(_), _) | (_, Stream::Dropped(_)));
    // Over the limit, neither stream is kept: a replay of one without the other would
    // look like the whole output.
    let (stdout, stderr) = if dropped {
        (Stream::Dropped(stdout.len()), Stream::Dropped(stderr.len()))
    } else {
        (stdout, stderr)
    };
    let outcome = Outcome { status, stdout, stderr, argv: bytes_of(&run.argv), resolved: false };
    if dropped {
        errln!(
            "idem: {}: the output ({} bytes of stdout, {} of stderr) is over the {} byte limit: \
             only the status is recorded, repeats will not replay the output",
            run.key,
            outcome.stdout.len(),
            outcome.stderr.len(),
            run.max_output
        );
    }
    // The captured output is let go of before the store copies the record: at most
    // the record and the store's copies of it are held at once.
    let body = outcome.encode();
    drop(outcome);
    match idemcache::store::block_on(db.store.complete(key, token, Some(body.into()), run.ttl)) {
        Ok(_) => Ok(status.exit_code()),
        Err(StoreError::LeaseLost(_)) => Ok(lost_hold(&run.key, status)),
        Err(e) => {
            // Maybe recorded, maybe not; the command ran: never to be run again blindly.
            let _ = idemcache::store::block_on(db.store.mark_unknown(key, token, run.unknown_ttl));
            let failure = db.failure(e);
            errln!(
                "idem: {}: recording the outcome ({}) failed, the key is marked UNKNOWN if the \
                 database allowed it: {}",
                run.key,
                status.describe(),
                failure.message
            );
            Ok(status.exit_code())
        }
    }
}

/// Says that this run lost the key while CMD ran, so CMD's outcome is not recorded;
/// returns CMD's exit code (what happened is still CMD's status).
fn lost_hold(client_key: &str, status: Status) -> u8 {
    errln!(
        "idem: {client_key}: this run lost its hold on the key while the command ran (its \
         lease lapsed: idem was suspended, or the database unreachable, longer than the lease; \
         or the key was forgotten with --force): its outcome ({}) is not recorded; `idem \
         status {client_key}` says what the key is now",
        status.describe()
    );
    status.exit_code()
}
