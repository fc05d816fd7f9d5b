//! A crash at an instant that matters, for a store's crash tests: the test binary runs
//! one of its own tests in a child process, which does its part up to the instant, says
//! so, and waits; the parent then kills it with SIGKILL (no destructor runs, no rollback
//! is sent, the database sees the connection drop) and checks what the store kept.
//!
//! Invariant: the parent never kills before the child said its instant, and a child that
//! ends without saying it fails the test, so a crash test cannot pass by killing a
//! process that did nothing; the child never outlives its parent's test (it waits on
//! its stdin, which closes with the parent).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

/// The parent half: runs `test` (a test of this binary, alone) in a child process with
/// `env` set, waits until the child prints a line holding `instant`, then kills it with
/// SIGKILL and reaps it. Panics if the child ends without printing it.
///
/// ```ignore
/// #[test]
/// fn child_claims_and_waits_to_be_killed() {
///     let Ok(path) = std::env::var("MY_CHILD_DB") else { return }; // a no-op on its own
///     // ... claim, write, never commit ...
///     conformance::wait_to_be_killed_at("claimed");
/// }
///
/// #[test]
/// fn a_process_killed_between_claim_and_commit_leaves_no_record() {
///     conformance::kill_child_at("child_claims_and_waits_to_be_killed", &[("MY_CHILD_DB", &path)], "claimed");
///     // ... check the store ...
/// }
/// ```
pub fn kill_child_at(test: &str, env: &[(&str, &str)], instant: &str) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new(exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1", "--include-ignored"])
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the child test process");
    let stdout = BufReader::new(child.stdout.take().expect("the child's stdout"));
    let said = stdout.lines().map_while(Result::ok).any(|line| line.contains(instant));
    assert!(said, "the child {test} reached {instant:?} before it was killed");
    child.kill().expect("SIGKILL to the child");
    child.wait().expect("the killed child reaped");
}

/// The child half: prints `instant` on a line of its own and blocks until the parent
/// kills it (its stdin stays open while the parent lives). Blocks the calling thread,
/// so whatever the child holds open (a transaction, a lock, a claim) stays as it is.
/// Panics if the parent ends without killing it.
pub fn wait_to_be_killed_at(instant: &str) -> ! {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{instant}");
    let _ = out.flush();
    drop(out);
    let _ = std::io::stdin().read_line(&mut String::new());
    panic!("the parent should have killed this process at {instant:?}");
}
