//! `idem`'s own printing: what a subcommand answers on stdout, and its messages on
//! stderr ([`outln!`], [`errln!`], and a replay's recorded bytes).
//!
//! Invariant: no write here panics, and none changes `idem`'s exit code, which says
//! what happened to the key or the record, never whether someone read about it. A
//! reader gone from stdout (`idem list | head`: the pipe's read end closed, EPIPE) ends
//! stdout output quietly, as a tool killed by SIGPIPE ends, but with the exit code it
//! would have had: nothing more is written there, and [`stdout_gone`] tells a loop
//! (`list`'s pages) to stop reading. Any other failure to write stdout (a full disk) is
//! said once on stderr, and ends stdout output too. A failure to write stderr has
//! nowhere to be said, and is ignored.

use std::fmt;
use std::io::{ErrorKind, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once a write to stdout failed: nothing more is written there.
static STDOUT_GONE: AtomicBool = AtomicBool::new(false);

/// Prints a line on stdout, as `println!` does but never panicking.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::stdout_line(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// Prints a line on stderr, as `eprintln!` does but never panicking.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::output::stderr_line(format_args!($($arg)*))
    };
}
pub(crate) use errln;

/// Whether stdout's reader is gone (or writing it failed): no more output is wanted.
pub fn stdout_gone() -> bool {
    STDOUT_GONE.load(Ordering::Relaxed)
}

/// Writes `line` and a newline on stdout (see [`outln!`]).
pub fn stdout_line(line: fmt::Arguments<'_>) {
    to_stdout(|out| writeln!(out, "{line}"));
}

/// Writes `bytes` on stdout as they are (a replay's recorded output).
pub fn stdout_bytes(bytes: &[u8]) {
    to_stdout(|out| out.write_all(bytes));
}

/// Writes `line` and a newline on stderr (see [`errln!`]).
pub fn stderr_line(line: fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

/// Writes `bytes` on stderr as they are (a replay's recorded output).
pub fn stderr_bytes(bytes: &[u8]) {
    let _ = std::io::stderr().lock().write_all(bytes);
}

/// Runs `write` on a locked stdout and flushes it, unless stdout is gone; a failure
/// makes it gone.
fn to_stdout(write: impl FnOnce(&mut std::io::StdoutLock<'static>) -> std::io::Result<()>) {
    if stdout_gone() {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = write(&mut out).and_then(|()| out.flush()) {
        STDOUT_GONE.store(true, Ordering::Relaxed);
        if e.kind() != ErrorKind::BrokenPipe {
            stderr_line(format_args!(
                "idem: writing to stdout failed: {e}; the rest of the output is not written"
            ));
        }
    }
}
