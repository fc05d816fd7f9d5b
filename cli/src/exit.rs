//! `idem`'s exit codes, and [`Failure`]: an error that names its exit code.
//!
//! Invariant: every exit of `idem` that is not the command's own status is one of these
//! constants, each documented by number in `idem --help` (sysexits are deprecated on
//! some systems, so the numbers are the interface, not the names).

use std::fmt;

/// The key is being run by another invocation (with `--no-wait`, or `--wait` spent).
pub const IN_PROGRESS: u8 = 75;
/// The key was used for another command (another CMD or other arguments).
pub const MISMATCH: u8 = 65;
/// The key's outcome is UNKNOWN: an earlier run was interrupted or killed mid-command.
/// Not a sysexits code, so no program using them returns it by accident.
pub const UNKNOWN: u8 = 79;
/// The state database is unusable: corrupt, locked, unwritable, on a network
/// filesystem, or holding a record `idem` cannot read.
pub const DB_UNUSABLE: u8 = 71;
/// Bad usage: an unknown flag, a malformed key or duration.
pub const USAGE: u8 = 64;
/// `status`, `forget`, `resolve`: the key's record is not in a state the subcommand
/// acts on (nothing to forget, nothing UNKNOWN to resolve).
pub const REFUSED: u8 = 1;
/// CMD could not be started: not found (as a shell says it).
pub const NOT_FOUND: u8 = 127;
/// CMD could not be started: found but not executable, or another error.
pub const CANNOT_EXECUTE: u8 = 126;

/// The exit code a command killed by signal `n` is replayed with, as shells report it.
pub fn signal_code(n: i32) -> u8 {
    u8::try_from(128 + n.clamp(0, 127)).unwrap_or(u8::MAX)
}

/// An error `idem` reports on stderr (`idem: <message>`) and exits with `code`.
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: u8,
    /// What failed and why, for a person.
    pub message: String,
}

impl Failure {
    /// A failure exiting with `code`.
    pub fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure { code, message: message.into() }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The exit-code table, as `idem --help` prints it (and docs/cli.md copies it).
pub const TABLE: &str = "\
Exit codes:
  (CMD's own)  idem ran CMD, or replayed its recorded exit status
  128+N        CMD was killed by signal N (recorded as such, replayed so; killed by
               SIGINT, SIGTERM or SIGHUP it was interrupted: the key is left UNKNOWN)
  75           in progress: another invocation is running this key (--no-wait, or --wait spent)
  65           the key was used for another command (other CMD or arguments)
  79           the key's outcome is UNKNOWN: an earlier run was interrupted (Ctrl-C, SIGTERM)
               or killed mid-command; check whether its effect happened, then
               `idem resolve KEY --exit-code N` or `idem forget KEY` (or run --retry-unknown)
  71           the state database is unusable: corrupt, locked, unwritable, on a network
               filesystem, or holding a record idem cannot read
  64           bad usage (an unknown flag, a malformed key or duration)
  127 / 126    CMD could not be started (not found / not executable); nothing is recorded
  1            status/forget/resolve: the record is not in a state the subcommand acts on
A reader gone from idem's output (`idem list | head`) ends it quietly, and changes no
exit code: the code says what happened to the key or record, not who read about it.";
