//! The built `idem` binary, run as a user runs it (`std::process::Command`): once-only
//! across runs, byte-exact replays, concurrent runs of one key, mismatches, `--no-wait`,
//! interrupts and `kill -9` leaving UNKNOWN, a command killed by a signal, and a corrupt
//! or locked database. Each test has a directory (and database) of its own; nothing
//! waits a fixed time for correctness: every wait polls a condition under a deadline.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};

const IDEM: &str = env!("CARGO_BIN_EXE_idem");

/// A directory of one test's own, holding its database and files.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("idem-test-{}-{name}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn db(&self) -> PathBuf {
        self.path("state/idem.db")
    }

    /// `idem ARGS` on this directory's database, in this directory.
    fn idem(&self, args: &[&str]) -> Command {
        self.command(IDEM, args)
    }

    /// `PROGRAM ARGS` with the environment and directory [`Dir::idem`] gives idem.
    fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut c = Command::new(program);
        c.args(args)
            .current_dir(&self.0)
            .env("IDEM_DB", self.db())
            .env_remove("IDEM_STORE")
            .env_remove("IDEM_LEASE_MS")
            .env_remove("IDEM_MAX_OUTPUT")
            .env_remove("IDEM_BUSY_TIMEOUT_MS")
            .stdin(Stdio::null());
        c
    }

    /// `idem run --key KEY EXTRA... -- sh -c SCRIPT`, finished.
    fn run(&self, key: &str, extra: &[&str], script: &str) -> Output {
        self.run_cmd(key, extra, script).output().unwrap()
    }

    fn run_cmd(&self, key: &str, extra: &[&str], script: &str) -> Command {
        let mut args = vec!["run", "--key", key];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        self.idem(&args)
    }

    /// How many lines the file `name` holds (0 if it does not exist).
    fn lines(&self, name: &str) -> usize {
        std::fs::read_to_string(self.path(name)).map_or(0, |s| s.lines().count())
    }

    /// `idem status KEY --json`'s state.
    fn state(&self, key: &str) -> String {
        let out = self.idem(&["status", key, "--json"]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["state"].as_str().unwrap().to_owned()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or_else(|| panic!("idem died by a signal: {:?}", out.status))
}

/// Polls `done` every 10 ms until it holds, failing after `secs` seconds.
fn eventually(secs: u64, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn signal(pid: u32, sig: Signal) {
    kill_process(Pid::from_raw(pid as i32).unwrap(), sig).unwrap();
}

/// Waits for `child` (bounded: a hung idem fails the test, it does not hang it).
fn finish(mut child: Child, secs: u64) -> Output {
    let mut status = None;
    eventually(secs, "idem to exit", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    child.wait_with_output().unwrap()
}

/// A command that records that it ran, and with the file `slow` present writes its
/// pid to `pid` and sleeps (as `exec sleep`, so the pid is the sleeper's).
const SLOW_OR_QUICK: &str =
    "echo ran >> ran; if [ -f slow ]; then echo $$ > pid.tmp; mv pid.tmp pid; exec sleep 30; fi; echo quick";

fn read_pid(dir: &Dir) -> u32 {
    std::fs::read_to_string(dir.path("pid")).unwrap().trim().parse().unwrap()
}

/// Ends an orphaned sleeper left by a test that killed its `idem`.
fn kill_orphan(dir: &Dir) {
    if let Ok(pid) = std::fs::read_to_string(dir.path("pid")) {
        if let Ok(pid) = pid.trim().parse::<u32>() {
            let _ = kill_process(Pid::from_raw(pid as i32).unwrap(), Signal::KILL);
        }
    }
}

#[test]
fn a_key_runs_once_across_runs_and_repeats_replay() {
    let dir = Dir::new("once");
    let script = "echo ran >> ran; echo out; echo err >&2; exit 3";
    let first = dir.run("k1", &[], script);
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(&dir.path("state")), mode(&dir.db())), (0o700, 0o600), "the state is private");
    assert_eq!(code(&first), 3, "{}", text(&first.stderr));
    assert_eq!((text(&first.stdout).as_str(), text(&first.stderr).as_str()), ("out\n", "err\n"));
    for _ in 0..3 {
        let again = dir.run("k1", &[], script);
        assert_eq!(code(&again), 3);
        assert_eq!(
            (again.stdout.as_slice(), again.stderr.as_slice()),
            (&b"out\n"[..], &b"err\n"[..])
        );
    }
    assert_eq!(dir.lines("ran"), 1, "the command ran more than once");
    assert_eq!(dir.state("k1"), "COMPLETED");
    // Another key is another intent.
    assert_eq!(code(&dir.run("k2", &[], script)), 3);
    assert_eq!(dir.lines("ran"), 2);
}

#[test]
fn replays_are_byte_exact_binary_output_and_a_large_stderr() {
    let dir = Dir::new("bytes");
    let blob: Vec<u8> =
        (0..64 * 1024).map(|i| (i * 7 % 256) as u8).chain([0, 0xff, b'\r', b'\n', 0]).collect();
    let big: Vec<u8> =
        (0..1_500_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    std::fs::write(dir.path("blob"), &blob).unwrap();
    std::fs::write(dir.path("big"), &big).unwrap();
    let script = "echo ran >> ran; cat blob; cat big >&2; printf 'no newline'; exit 7";
    let first = dir.run("bin", &[], script);
    let mut stdout = blob.clone();
    stdout.extend_from_slice(b"no newline");
    assert_eq!(code(&first), 7);
    assert!(first.stdout == stdout, "the first run passes stdout through unchanged");
    assert!(first.stderr == big, "and stderr");
    let replay = dir.run("bin", &[], script);
    assert_eq!(code(&replay), 7);
    assert!(replay.stdout == stdout, "replayed stdout differs ({} bytes)", replay.stdout.len());
    assert!(replay.stderr == big, "replayed stderr differs ({} bytes)", replay.stderr.len());
    assert_eq!(dir.lines("ran"), 1);
}

#[test]
fn output_over_the_limit_replays_the_status_and_says_it_was_dropped() {
    let dir = Dir::new("limit");
    let script = "echo ran >> ran; head -c 5000 /dev/zero; echo small >&2; exit 4";
    let mut first = dir.run_cmd("big", &[], script);
    let first = first.env("IDEM_MAX_OUTPUT", "1000").output().unwrap();
    assert_eq!(
        (code(&first), first.stdout.len()),
        (4, 5000),
        "the first run still passes it all through"
    );
    assert!(text(&first.stderr).contains("over the 1000 byte limit"), "{}", text(&first.stderr));
    let replay = dir.run("big", &[], script);
    assert_eq!(code(&replay), 4);
    assert!(replay.stdout.is_empty());
    // stderr fit, but half an output replayed would pass for all of it: neither is kept.
    assert!(!text(&replay.stderr).starts_with("small"), "{}", text(&replay.stderr));
    let said = text(&replay.stderr);
    assert!(said.contains("5000 bytes of stdout") && said.contains("not kept"), "{said}");
    assert_eq!(dir.lines("ran"), 1);
}

#[test]
fn twenty_concurrent_runs_of_a_key_execute_once_and_all_replay() {
    let dir = Dir::new("twenty");
    let script = "echo ran >> ran; sleep 0.3; echo result; echo note >&2; exit 5";
    let children: Vec<Child> = (0..20)
        .map(|_| {
            dir.run_cmd("shared", &[], script)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = finish(child, 60);
        assert_eq!(code(&out), 5, "{}", text(&out.stderr));
        assert_eq!(
            (out.stdout.as_slice(), out.stderr.as_slice()),
            (&b"result\n"[..], &b"note\n"[..])
        );
    }
    assert_eq!(dir.lines("ran"), 1, "20 concurrent runs executed more than once");
}

#[test]
fn the_same_key_with_another_command_is_refused_with_65() {
    let dir = Dir::new("mismatch");
    let first = dir.idem(&["run", "--key", "m", "--", "echo", "a b"]).output().unwrap();
    assert_eq!((code(&first), text(&first.stdout).as_str()), (0, "a b\n"));
    // The same words split otherwise are another command: arguments are length-prefixed.
    let split = dir.idem(&["run", "--key", "m", "--", "echo", "a", "b"]).output().unwrap();
    assert_eq!(code(&split), 65, "{}", text(&split.stderr));
    assert!(split.stdout.is_empty(), "nothing ran, nothing replayed");
    let said = text(&split.stderr);
    assert!(said.contains("used for another command (`echo 'a b'`), not `echo a b`"), "{said}");
    let same = dir.idem(&["run", "--key", "m", "--", "echo", "a b"]).output().unwrap();
    assert_eq!((code(&same), text(&same.stdout).as_str()), (0, "a b\n"));
}

#[test]
fn no_wait_while_a_run_is_in_progress_exits_75_and_waiting_replays() {
    let dir = Dir::new("nowait");
    let script =
        "echo ran >> ran; touch started; while [ ! -f go ]; do sleep 0.02; done; echo done";
    let holder = dir.run_cmd("busy", &[], script).stdout(Stdio::piped()).spawn().unwrap();
    eventually(10, "the first run to start", || dir.path("started").exists());
    let at_once = Instant::now();
    let refused = dir.run("busy", &["--no-wait"], script);
    assert_eq!(code(&refused), 75, "{}", text(&refused.stderr));
    assert!(at_once.elapsed() < Duration::from_secs(3), "--no-wait waited");
    assert!(text(&refused.stderr).contains("in progress"));
    // A wait that is spent is the same answer.
    let spent = dir.run("busy", &["--wait", "0.3"], script);
    assert_eq!(code(&spent), 75);
    // A waiter waits for the holder and replays it.
    let waiter =
        dir.run_cmd("busy", &["--wait", "30"], script).stdout(Stdio::piped()).spawn().unwrap();
    std::fs::write(dir.path("go"), "").unwrap();
    let held = finish(holder, 30);
    let waited = finish(waiter, 30);
    assert_eq!((code(&held), code(&waited)), (0, 0));
    assert_eq!((text(&held.stdout).as_str(), text(&waited.stdout).as_str()), ("done\n", "done\n"));
    assert_eq!(dir.lines("ran"), 1);
}

/// An `idem` running the slow command, once the command is running.
fn start_slow(dir: &Dir, key: &str, lease_ms: Option<&str>) -> Child {
    std::fs::write(dir.path("slow"), "").unwrap();
    let mut cmd = dir.run_cmd(key, &[], SLOW_OR_QUICK);
    if let Some(ms) = lease_ms {
        cmd.env("IDEM_LEASE_MS", ms);
    }
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    eventually(10, "the command to start", || dir.path("pid").exists());
    child
}

fn interrupt_leaves_unknown(sig: Signal, name: &str) {
    let dir = Dir::new(name);
    let idem = start_slow(&dir, "irq", None);
    let sleeper = read_pid(&dir);
    signal(idem.id(), sig);
    let out = finish(idem, 20);
    // The signal was passed on: the command died of it, and idem says so.
    assert_eq!(code(&out), 128 + sig.as_raw(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("marked UNKNOWN"), "{}", text(&out.stderr));
    assert!(!Path::new(&format!("/proc/{sleeper}")).exists() || proc_is_zombie_or_gone(sleeper));
    assert_eq!(dir.state("irq"), "UNKNOWN");
    std::fs::remove_file(dir.path("slow")).unwrap();
    let again = dir.run("irq", &[], SLOW_OR_QUICK);
    assert_eq!(code(&again), 79, "{}", text(&again.stderr));
    assert!(text(&again.stderr).contains("UNKNOWN"));
    assert_eq!(dir.lines("ran"), 1, "an UNKNOWN key was run again");
    // Listed for a decision.
    let listed = dir.idem(&["list", "--unknown", "--json"]).output().unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed[0]["key"], "irq");
    // --retry-unknown forgets it and runs.
    let retried = dir.run("irq", &["--retry-unknown"], SLOW_OR_QUICK);
    assert_eq!(
        (code(&retried), text(&retried.stdout).as_str()),
        (0, "quick\n"),
        "{}",
        text(&retried.stderr)
    );
    assert_eq!(dir.lines("ran"), 2);
    assert_eq!(dir.state("irq"), "COMPLETED");
}

/// Whether process `pid` has a handler for signal `n` (Linux: `SigCgt` in its status).
fn catches(pid: u32, n: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (n - 1)) != 0)
}

fn proc_is_zombie_or_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn ctrl_c_is_passed_to_the_command_and_leaves_the_key_unknown() {
    interrupt_leaves_unknown(Signal::INT, "sigint");
}

#[test]
fn sigterm_is_passed_to_the_command_and_leaves_the_key_unknown() {
    interrupt_leaves_unknown(Signal::TERM, "sigterm");
}

#[test]
fn kill_9_of_idem_leaves_the_key_unknown_once_the_lease_lapses() {
    let dir = Dir::new("kill9");
    let mut idem = start_slow(&dir, "k9", Some("600"));
    idem.kill().unwrap(); // SIGKILL: no handler runs, the command is orphaned.
    idem.wait().unwrap();
    std::fs::remove_file(dir.path("slow")).unwrap();
    // In progress until the lease (600 ms) lapses, then UNKNOWN: never run again.
    let mut last = None;
    eventually(15, "the killed run's lease to lapse", || {
        let out = dir
            .run_cmd("k9", &["--no-wait"], SLOW_OR_QUICK)
            .env("IDEM_LEASE_MS", "600")
            .output()
            .unwrap();
        let c = code(&out);
        assert!(c == 75 || c == 79, "exit {c}: {}", text(&out.stderr));
        last = Some(out);
        c == 79
    });
    assert!(text(&last.unwrap().stderr).contains("outcome UNKNOWN"));
    assert_eq!(dir.lines("ran"), 1, "the killed run's command was run again");
    let status = dir.idem(&["status", "k9"]).output().unwrap();
    assert!(text(&status.stdout).contains("UNKNOWN"), "{}", text(&status.stdout));
    kill_orphan(&dir);
    // Resolved by hand: repeats replay the status given, without running.
    let resolved = dir.idem(&["resolve", "k9", "--exit-code", "4"]).output().unwrap();
    assert_eq!(code(&resolved), 0, "{}", text(&resolved.stderr));
    assert_eq!(code(&dir.run("k9", &[], SLOW_OR_QUICK)), 4);
    assert_eq!(dir.lines("ran"), 1);
}

/// How long a killed run stays UNKNOWN is idem's, not the next run's `--ttl`: a run
/// killed under a short `--ttl`, its lease and that TTL both past, is still UNKNOWN to
/// `status`, to `list --unknown` and to a run with `--ttl 1s`, which does not execute it.
#[test]
fn a_killed_run_stays_unknown_whatever_ttl_the_next_run_is_given() {
    let dir = Dir::new("kill9-ttl");
    std::fs::write(dir.path("slow"), "").unwrap();
    let mut idem = dir
        .run_cmd("kt", &["--ttl", "1s"], SLOW_OR_QUICK)
        .env("IDEM_LEASE_MS", "300")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually(10, "the command to start", || dir.path("pid").exists());
    idem.kill().unwrap();
    idem.wait().unwrap();
    std::fs::remove_file(dir.path("slow")).unwrap();
    // The lease (300 ms) and the killed run's TTL (1 s) both pass.
    let mut last = None;
    eventually(15, "the killed run's lease to lapse", || {
        let out = dir
            .run_cmd("kt", &["--ttl", "1s", "--no-wait"], SLOW_OR_QUICK)
            .env("IDEM_LEASE_MS", "300")
            .output()
            .unwrap();
        let c = code(&out);
        last = Some(c);
        c == 79
    });
    std::thread::sleep(Duration::from_millis(1500));
    let again = dir
        .run_cmd("kt", &["--ttl", "1s", "--no-wait"], SLOW_OR_QUICK)
        .env("IDEM_LEASE_MS", "300")
        .output()
        .unwrap();
    assert_eq!(code(&again), 79, "{:?} then: {}", last, text(&again.stderr));
    assert_eq!(dir.lines("ran"), 1, "the killed run's command was run again");
    let listed = dir.idem(&["list", "--unknown"]).output().unwrap();
    assert!(text(&listed.stdout).contains("kt"), "{}", text(&listed.stdout));
    kill_orphan(&dir);
}

/// A bad key is a usage error (64) even when the database is unusable (71 otherwise).
#[test]
fn a_bad_key_is_64_whatever_the_database() {
    let dir = Dir::new("bad-key");
    let nowhere = dir.path("no-dir").join("deeper").join("idem.db");
    std::fs::write(dir.path("no-dir"), "a file where a directory belongs").unwrap();
    for args in [&["status", "bad key"][..], &["forget", ""], &["run", "--key", "é", "--", "true"]]
    {
        let mut all = vec!["--db", nowhere.to_str().unwrap()];
        all.extend_from_slice(args);
        let out = dir.idem(&all).output().unwrap();
        assert_eq!(code(&out), 64, "{args:?}: {}", text(&out.stderr));
    }
    let out = dir.idem(&["--db", nowhere.to_str().unwrap(), "status", "good"]).output().unwrap();
    assert_eq!(code(&out), 71, "{}", text(&out.stderr));
}

/// An `idem` whose command waits for the file `go`. A failing assertion still ends the
/// command (and waits for it, before its directory goes): left waiting, it would hold
/// the test run's stderr open and hang it, or, its directory gone, never see `go`.
struct Holder(Option<Child>, PathBuf);

impl Holder {
    /// Lets the command end, and waits for `idem`.
    fn finish(mut self) -> Output {
        std::fs::write(&self.1, "").unwrap();
        finish(self.0.take().unwrap(), 20)
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if let Some(child) = self.0.take() {
            let _ = std::fs::write(&self.1, "");
            let _ = child.wait_with_output();
        }
    }
}

/// The renewal is watched through `idem status` (a reader: it takes no write lock), not
/// by runs claiming the key in a loop. A tight loop of claims held SQLite's write lock
/// so often (each claim took it then, even of a live key) that on a loaded CI machine
/// the holder's renewals waited behind them past a 600 ms lease, and the key lapsed to
/// UNKNOWN under a live command: the test measured lock contention, not renewal. One
/// claim at the end checks that another run sees the key in progress; the replay of the
/// recorded outcome checks that no renewal found its lease lapsed (a renewal after a
/// lapse is refused, and the run records nothing and says it lost the key).
#[test]
fn a_long_command_keeps_its_key_past_many_leases() {
    const LEASE_MS: i64 = 1000;
    let dir = Dir::new("renew");
    let script =
        "echo ran >> ran; touch started; while [ ! -f go ]; do sleep 0.02; done; echo long";
    let spawned = dir
        .run_cmd("long", &[], script)
        .env("IDEM_LEASE_MS", LEASE_MS.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let holder = Holder(Some(spawned), dir.path("go"));
    eventually(10, "the command to start", || dir.path("started").exists());
    let lease_end = || {
        let out = dir.idem(&["status", "long", "--json"]).output().unwrap();
        assert_eq!(code(&out), 0, "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["state"].as_str(), Some("PROCESSING"), "{v}");
        v["expires_at"]["unix_micros"].as_i64().unwrap()
    };
    let first = lease_end();
    // Three leases past the first one's end: the claim's lease was renewed at least
    // three times while the command ran, each renewal before the lease it extended ended.
    eventually(30, "three leases' worth of renewals", || {
        lease_end() >= first + 3 * LEASE_MS * 1000
    });
    let again = dir
        .run_cmd("long", &["--no-wait"], script)
        .env("IDEM_LEASE_MS", LEASE_MS.to_string())
        .output()
        .unwrap();
    assert_eq!(code(&again), 75, "the renewed key was not in progress: {}", text(&again.stderr));
    let held = holder.finish();
    assert_eq!(code(&held), 0, "{}", text(&held.stderr));
    assert!(!text(&held.stderr).contains("lost its hold"), "{}", text(&held.stderr));
    assert_eq!(text(&dir.run("long", &[], script).stdout), "long\n");
    assert_eq!(dir.lines("ran"), 1);
}

#[test]
fn a_command_killed_by_a_signal_is_recorded_so_and_replayed_as_128_plus_n() {
    let dir = Dir::new("signaled");
    let script = "echo ran >> ran; echo before; kill -USR1 $$";
    let first = dir.run("sig", &[], script);
    assert_eq!(code(&first), 128 + 10, "{}", text(&first.stderr));
    let replay = dir.run("sig", &[], script);
    assert_eq!((code(&replay), text(&replay.stdout).as_str()), (138, "before\n"));
    assert_eq!(dir.lines("ran"), 1);
    let status = dir.idem(&["status", "sig", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(
        (v["outcome"]["status"].as_str(), v["outcome"]["code"].as_i64()),
        (Some("signaled"), Some(10))
    );
    let text_status = text(&dir.idem(&["status", "sig"]).output().unwrap().stdout);
    assert!(text_status.contains("killed by signal 10 (SIGUSR1)"), "{text_status}");
    // Dying of an interrupting signal is an interruption: UNKNOWN, whoever sent it.
    let term = dir.run("term", &[], "echo ran >> ran; kill -TERM $$");
    assert_eq!(code(&term), 143, "{}", text(&term.stderr));
    assert_eq!(dir.state("term"), "UNKNOWN");
    assert_eq!(code(&dir.run("term", &[], "echo ran >> ran; kill -TERM $$")), 79);
}

#[test]
fn a_corrupt_database_is_refused_with_71_naming_the_file() {
    let dir = Dir::new("corrupt");
    std::fs::create_dir_all(dir.path("state")).unwrap();
    std::fs::write(dir.db(), b"this is not a database, it is a shopping list\n".repeat(200))
        .unwrap();
    let out = dir.run("c", &[], "echo ran >> ran");
    assert_eq!(code(&out), 71, "{}", text(&out.stderr));
    let said = text(&out.stderr);
    assert!(said.contains(&dir.db().display().to_string()), "the file is not named: {said}");
    assert!(said.contains("not an SQLite database"), "{said}");
    assert_eq!(dir.lines("ran"), 0);
    assert_eq!(code(&dir.idem(&["status", "c"]).output().unwrap()), 71);
}

#[test]
fn a_database_locked_by_another_process_is_refused_with_71() {
    use idemcache_sqlite::rusqlite::Connection;
    let dir = Dir::new("locked");
    assert_eq!(code(&dir.run("l", &[], "true")), 0, "the database is created");
    // This test's process holds the database's write lock, as another program would.
    let other = Connection::open(dir.db()).unwrap();
    other.execute_batch("BEGIN EXCLUSIVE; CREATE TABLE held (x);").unwrap();
    let out = dir
        .run_cmd("l2", &[], "echo ran >> ran")
        .env("IDEM_BUSY_TIMEOUT_MS", "300")
        .output()
        .unwrap();
    assert_eq!(code(&out), 71, "{}", text(&out.stderr));
    let said = text(&out.stderr);
    assert!(said.contains("locked by another process") && said.contains("idem.db"), "{said}");
    assert_eq!(dir.lines("ran"), 0);
    other.execute_batch("ROLLBACK").unwrap();
    assert_eq!(code(&dir.run("l2", &[], "echo ran >> ran")), 0, "usable once the lock is gone");
}

#[test]
fn a_command_that_cannot_start_exits_127_and_records_nothing() {
    let dir = Dir::new("notfound");
    let out = dir.idem(&["run", "--key", "nf", "--", "/nonexistent/command"]).output().unwrap();
    assert_eq!(code(&out), 127, "{}", text(&out.stderr));
    assert_eq!(dir.state("nf"), "ABSENT");
}

#[test]
fn forget_and_gc_and_usage_errors() {
    let dir = Dir::new("admin");
    assert_eq!(code(&dir.run("done", &[], "true")), 0);
    // forget clears UNKNOWN only; --force any record.
    let refused = dir.idem(&["forget", "done"]).output().unwrap();
    assert_eq!(code(&refused), 1);
    assert!(text(&refused.stderr).contains("COMPLETED"));
    assert_eq!(code(&dir.idem(&["forget", "done", "--force"]).output().unwrap()), 0);
    assert_eq!(dir.state("done"), "ABSENT");
    let resolved = dir.idem(&["resolve", "done", "--exit-code", "0"]).output().unwrap();
    assert_eq!(code(&resolved), 1, "nothing UNKNOWN to resolve");
    // Records past their TTL are gone for runs at once, and from the file with gc.
    assert_eq!(code(&dir.run("brief", &["--ttl", "1s"], "true")), 0);
    eventually(10, "the record to expire", || dir.state("brief") == "ABSENT");
    let gc = dir.idem(&["gc", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&gc.stdout).unwrap();
    assert_eq!(v["purged"], 1);
    // Usage errors are 64, help is 0 and names the exit codes.
    assert_eq!(code(&dir.idem(&["run", "--key", "x"]).output().unwrap()), 64);
    assert_eq!(code(&dir.idem(&["run", "--key", "has space", "--", "true"]).output().unwrap()), 64);
    assert_eq!(
        code(&dir.idem(&["run", "--key", "x", "--ttl", "soon", "--", "true"]).output().unwrap()),
        64
    );
    let help = dir.idem(&["--help"]).output().unwrap();
    assert_eq!(code(&help), 0);
    for number in ["75", "65", "79", "71", "64", "128+N"] {
        assert!(text(&help.stdout).contains(number), "--help does not name exit code {number}");
    }
    // A crontab line as shown works when pasted: cron makes an unescaped `%` a newline
    // (the job then fails with a shell syntax error and never runs), and its HOME,
    // PATH and working directory are not the shell's.
    let run_help = dir.idem(&["run", "--help"]).output().unwrap();
    for help in [text(&help.stdout), text(&run_help.stdout)] {
        assert!(help.contains(r"date +\%F"), "no crontab line: {help}");
        // The help's dated keys are crontab lines: every `%` in them escaped.
        for line in help.lines().filter(|l| l.contains("$(date")) {
            let unescaped = line.match_indices('%').any(|(i, _)| !line[..i].ends_with('\\'));
            assert!(!unescaped, "a `%` cron would cut the line at: {line}");
        }
        assert!(help.contains("IDEM_DB="), "cron's database is not set: {help}");
        assert!(help.contains("absolute"), "cron's command path is not said: {help}");
    }
    // A run suspended past its lease loses its key: said where leases are.
    assert!(text(&help.stdout).contains("suspended (Ctrl-Z"), "{}", text(&help.stdout));
}

#[test]
fn an_interrupted_waiter_exits_at_once_holding_nothing() {
    let dir = Dir::new("waiter");
    let script =
        "echo ran >> ran; touch started; while [ ! -f go ]; do sleep 0.02; done; echo done";
    let holder = dir.run_cmd("w", &[], script).stdout(Stdio::piped()).spawn().unwrap();
    eventually(10, "the first run to start", || dir.path("started").exists());
    let waiter = dir
        .run_cmd("w", &["--wait", "60"], script)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once it catches SIGINT (its handler is installed before its first claim).
    eventually(10, "the waiter to catch SIGINT", || catches(waiter.id(), 2));
    let asked = Instant::now();
    signal(waiter.id(), Signal::INT);
    let out = finish(waiter, 10);
    assert_eq!(code(&out), 130, "{}", text(&out.stderr));
    assert!(asked.elapsed() < Duration::from_secs(5), "the waiter did not stop at once");
    std::fs::write(dir.path("go"), "").unwrap();
    assert_eq!(code(&finish(holder, 20)), 0);
    assert_eq!(
        dir.state("w"),
        "COMPLETED",
        "the waiter's interrupt changed nothing of the holder's"
    );
    assert_eq!(dir.lines("ran"), 1);
}

#[test]
fn a_run_whose_key_is_forgotten_by_force_records_nothing_and_says_so() {
    let dir = Dir::new("forced");
    let script = "echo ran >> ran; touch started; while [ ! -f go ]; do sleep 0.02; done; exit 6";
    let holder = dir.run_cmd("f", &[], script).stderr(Stdio::piped()).spawn().unwrap();
    eventually(10, "the command to start", || dir.path("started").exists());
    assert_eq!(dir.state("f"), "PROCESSING");
    let plain = dir.idem(&["forget", "f"]).output().unwrap();
    assert_eq!(code(&plain), 1, "forget without --force leaves a PROCESSING record");
    assert_eq!(code(&dir.idem(&["forget", "f", "--force"]).output().unwrap()), 0);
    std::fs::write(dir.path("go"), "").unwrap();
    let out = finish(holder, 20);
    assert_eq!(code(&out), 6, "CMD's status is still what idem exits with");
    assert!(text(&out.stderr).contains("lost its hold on the key"), "{}", text(&out.stderr));
    assert_eq!(dir.state("f"), "ABSENT", "the stale run's completion was refused");
}

#[test]
fn a_database_that_cannot_be_made_is_refused_with_71_saying_why() {
    let dir = Dir::new("unmakeable");
    // Its directory would have to be made inside a regular file.
    std::fs::write(dir.path("file"), "").unwrap();
    let out = dir
        .idem(&["run", "--key", "u", "--db", "file/sub/idem.db", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 71, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("file/sub/idem.db")
            && text(&out.stderr).contains("creating its directory")
    );
    // A directory where the file belongs.
    std::fs::create_dir_all(dir.path("adir")).unwrap();
    let out = dir.idem(&["status", "u", "--db", "adir"]).output().unwrap();
    assert_eq!(code(&out), 71);
    assert!(text(&out.stderr).contains("is a directory"), "{}", text(&out.stderr));
    // --db wins over $IDEM_DB.
    let out =
        dir.idem(&["run", "--key", "u", "--db", "elsewhere.db", "--", "true"]).output().unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(dir.path("elsewhere.db").exists() && !dir.db().exists());
}

/// A command writing far more than `IDEM_MAX_OUTPUT` is recorded (its status, and how
/// much it wrote) by an idem whose memory follows what it keeps, not what was written:
/// 1 GiB written under a 700 MiB address-space limit (`ulimit -v`), 1000 bytes kept.
/// An idem that reserved room for the whole output to record its length aborted
/// (exit 134) after the command ran, recording nothing: the key then read UNKNOWN.
#[test]
fn output_far_over_the_limit_is_recorded_in_memory_bounded_by_what_is_kept() {
    let dir = Dir::new("huge");
    let script = "echo ran >> ran; head -c 1073741824 /dev/zero; exit 3";
    let limited = || {
        let mut c = dir.command(
            "sh",
            &[
                "-c",
                "ulimit -v 716800 && exec \"$@\"",
                "sh",
                IDEM,
                "run",
                "--key",
                "huge",
                "--",
                "sh",
                "-c",
                script,
            ],
        );
        c.env("IDEM_MAX_OUTPUT", "1000");
        c
    };
    let first = limited().stdout(Stdio::null()).output().unwrap();
    assert_eq!(code(&first), 3, "{}", text(&first.stderr));
    assert!(text(&first.stderr).contains("over the 1000 byte limit"), "{}", text(&first.stderr));
    let status = dir.idem(&["status", "huge", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["state"], "COMPLETED", "{v}");
    assert_eq!(v["outcome"]["stdout"], serde_json::json!({ "bytes": 1u64 << 30, "kept": false }));
    let replay = limited().output().unwrap();
    assert_eq!((code(&replay), replay.stdout.len()), (3, 0), "{}", text(&replay.stderr));
    assert_eq!(dir.lines("ran"), 1);
}

/// The write end of a pipe whose reader is gone: the stdin of a `true` that exited.
fn readerless_pipe() -> Stdio {
    let mut reader = Command::new("true").stdin(Stdio::piped()).spawn().unwrap();
    let end = reader.stdin.take().unwrap();
    reader.wait().unwrap();
    Stdio::from(end)
}

/// `cmd` run with its stdout (and, with `stderr_too`, its stderr) a pipe whose reader
/// is gone before idem writes a byte, as `idem list | head -c 10` leaves it once `head`
/// has read its fill.
fn with_reader_gone(cmd: &mut Command, stderr_too: bool) -> Output {
    cmd.stderr(if stderr_too { readerless_pipe() } else { Stdio::piped() });
    finish(cmd.stdout(readerless_pipe()).spawn().unwrap(), 30)
}

/// A reader gone (`| head`) ends idem's output quietly, in every subcommand and every
/// path that prints (records, JSON, help, messages, replays, a command's live output),
/// and changes no exit code: it is what idem would have exited with, never a panic
/// (101, "failed printing to stdout: Broken pipe").
#[test]
fn a_reader_gone_ends_the_output_quietly_and_changes_no_exit_code() {
    let dir = Dir::new("epipe");
    let done = "echo ran >> ran; echo out; exit 0";
    let over = "echo ran >> ran; echo 0123456789; exit 4";
    let term = "echo ran >> ran; kill -TERM $$";
    assert_eq!(code(&dir.run("done", &[], done)), 0);
    assert_eq!(
        code(&dir.run_cmd("over", &[], over).env("IDEM_MAX_OUTPUT", "1").output().unwrap()),
        4
    );
    assert_eq!(code(&dir.run("term", &[], term)), 143);
    let run = |key: &'static str, script: &'static str| -> Vec<&'static str> {
        vec!["run", "--key", key, "--", "sh", "-c", script]
    };
    let cases: Vec<(Vec<&str>, bool, i32)> = vec![
        (vec!["list"], false, 0),
        (vec!["list", "--json"], false, 0),
        (vec!["list", "--unknown"], true, 0),
        (vec!["status", "done"], false, 0),
        (vec!["status", "done", "--json"], true, 0),
        (vec!["status", "term"], false, 0),
        (vec!["status", "nothing"], false, 0),
        (vec!["gc"], false, 0),
        (vec!["gc", "--json"], true, 0),
        (vec!["forget", "done"], true, 1),
        (vec!["forget", "done", "--json"], false, 1),
        (vec!["--help"], true, 0),
        (vec!["run", "--help"], true, 0),
        (vec!["--version"], true, 0),
        (vec!["status", "bad key"], true, 64),
        // Replays: the recorded output, the note that it was not kept, the refusals.
        (run("done", done), true, 0),
        (run("over", over), true, 4),
        (run("over", done), true, 65),
        (run("term", term), true, 79),
        // A first run: the command's output passed through live, and recorded.
        (run("fresh", "echo ran >> ran; echo out; echo err >&2; exit 5"), true, 5),
        (vec!["resolve", "term", "--exit-code", "6"], false, 0),
        (vec!["resolve", "term", "--exit-code", "6", "--json"], true, 1),
        (vec!["forget", "done", "--force"], false, 0),
    ];
    for (args, stderr_too, expected) in cases {
        let out = with_reader_gone(&mut dir.idem(&args), stderr_too);
        let said = text(&out.stderr);
        assert_eq!(code(&out), expected, "{args:?}: {said}");
        assert!(!said.contains("panicked") && !said.contains("Broken pipe"), "{args:?}: {said}");
    }
    assert_eq!(dir.lines("ran"), 4, "a replay ran its command");
    let fresh = dir.run("fresh", &[], "echo ran >> ran; echo out; echo err >&2; exit 5");
    assert_eq!((code(&fresh), text(&fresh.stdout).as_str()), (5, "out\n"), "recorded whole");
    assert_eq!(code(&dir.run("term", &[], term)), 6, "resolved");
    assert_eq!(dir.state("done"), "ABSENT", "forgotten");
}

/// Every `IDEM_*` variable idem reads is checked before anything is done: one that is
/// not a whole number in its range is a usage error (64) naming the variable, its value
/// and the range, for every subcommand. (A lease of "abc" or an output limit of -1 was
/// silently ignored; a busy timeout over 2^31 ms panicked, 101; a lease over 100 years
/// was 71, blaming the database.)
#[test]
fn every_idem_variable_is_checked_and_a_bad_one_is_64_naming_it_and_its_range() {
    let dir = Dir::new("env");
    let range = |var: &str| match var {
        "IDEM_LEASE_MS" => "from 300 to 3153600000000",
        "IDEM_BUSY_TIMEOUT_MS" => "from 0 to 2147483647",
        _ => "from 0 to 536870912",
    };
    let bad = [
        ("IDEM_LEASE_MS", "abc"),
        ("IDEM_LEASE_MS", "299"),
        ("IDEM_LEASE_MS", "-5"),
        ("IDEM_LEASE_MS", "3153600000001"),
        ("IDEM_LEASE_MS", "99999999999999999999999"),
        ("IDEM_MAX_OUTPUT", "-1"),
        ("IDEM_MAX_OUTPUT", "4M"),
        ("IDEM_MAX_OUTPUT", "536870913"),
        ("IDEM_BUSY_TIMEOUT_MS", "3000000000"),
        ("IDEM_BUSY_TIMEOUT_MS", "1.5"),
    ];
    let script = "echo ran >> ran";
    for (var, value) in bad {
        for args in [
            &["run", "--key", "v", "--", "sh", "-c", script][..],
            &["status", "v"],
            &["list", "--json"],
        ] {
            let out = dir.idem(args).env(var, value).output().unwrap();
            let said = text(&out.stderr);
            assert_eq!(code(&out), 64, "{var}={value} {args:?}: {said}");
            assert!(said.starts_with("idem: ") && said.contains(var), "{var}={value}: {said}");
            assert!(said.contains(&format!("{value:?}")), "the value is not named: {said}");
            assert!(said.contains(range(var)), "the range is not named: {said}");
            assert!(out.stdout.is_empty());
        }
    }
    assert_eq!(dir.lines("ran"), 0, "a run with a bad setting ran its command");
    let good = [
        ("IDEM_LEASE_MS", "300"),
        ("IDEM_LEASE_MS", "3153600000000"),
        ("IDEM_BUSY_TIMEOUT_MS", "0"),
        ("IDEM_BUSY_TIMEOUT_MS", "2147483647"),
        ("IDEM_MAX_OUTPUT", "0"),
        ("IDEM_MAX_OUTPUT", "536870912"),
        ("IDEM_MAX_OUTPUT", ""),
    ];
    for (i, (var, value)) in good.iter().enumerate() {
        let out = dir.run_cmd(&format!("g{i}"), &[], script).env(var, value).output().unwrap();
        assert_eq!(code(&out), 0, "{var}={value}: {}", text(&out.stderr));
    }
    assert_eq!(dir.lines("ran"), good.len());
}

/// A renewal that meets another connection's write lock is tried again, with short
/// pauses, until the lease's end: a lock held across a renewal and released before the
/// lease ends leaves the live command its key. The old renewal waited out the busy
/// timeout (here 3 s of a 6 s lease, as 5 s of the default 10 s), then a whole beat
/// (2 s) before trying again: past the lease's end, so the command's key lapsed to
/// UNKNOWN under it while the database had been free for half a second.
#[test]
fn a_renewal_held_off_by_a_write_lock_tries_again_within_the_lease() {
    use idemcache_sqlite::rusqlite::Connection;
    const LEASE_MS: i64 = 6000;
    let dir = Dir::new("renew-locked");
    let script =
        "echo ran >> ran; touch started; while [ ! -f go ]; do sleep 0.02; done; echo long";
    let spawned = dir
        .run_cmd("held", &[], script)
        .env("IDEM_LEASE_MS", LEASE_MS.to_string())
        .env("IDEM_BUSY_TIMEOUT_MS", (LEASE_MS / 2).to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let holder = Holder(Some(spawned), dir.path("go"));
    eventually(10, "the command to start", || dir.path("started").exists());
    let lock = Connection::open(dir.db()).unwrap();
    lock.busy_timeout(Duration::from_secs(10)).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    // Under the lock, the lease's end cannot move: the last renewal's, plus the lease.
    let ends: i64 =
        lock.query_row("SELECT expires_at FROM idemcache_records", [], |r| r.get(0)).unwrap();
    let now = || {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        since.as_micros() as i64
    };
    // Held past the next beat's renewal and the busy timeout it waited, released with a
    // twelfth of the lease left.
    eventually(20, "the lease's end to near", || now() >= ends - LEASE_MS * 1000 / 12);
    lock.execute_batch("ROLLBACK").unwrap();
    let lease_end = || {
        let out = dir.idem(&["status", "held", "--json"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["state"].as_str(), Some("PROCESSING"), "the live key lapsed: {v}");
        v["expires_at"]["unix_micros"].as_i64().unwrap()
    };
    eventually(10, "the lease to be renewed", || lease_end() > ends);
    let held = holder.finish();
    assert_eq!(code(&held), 0, "{}", text(&held.stderr));
    assert!(!text(&held.stderr).contains("lost its hold"), "{}", text(&held.stderr));
    assert_eq!(text(&dir.run("held", &[], script).stdout), "long\n");
    assert_eq!(dir.lines("ran"), 1);
}

#[test]
fn a_wait_too_large_says_so_and_names_the_most() {
    let dir = Dir::new("wait-max");
    let out = dir
        .idem(&["run", "--key", "w", "--wait", "18446744073709551615", "--", "true"])
        .output()
        .unwrap();
    let said = text(&out.stderr);
    assert_eq!(code(&out), 64, "{said}");
    assert!(said.contains("too large") && said.contains("3153600000"), "{said}");
    assert!(!said.contains("not negative"), "{said}");
}

/// The token counter's row deleted by hand is exit 71 naming the table and how to
/// restore it (it was "SQLite: Query returned no rows", naming nothing).
#[test]
fn a_lost_token_counter_row_is_71_naming_its_table_and_the_repair() {
    use idemcache_sqlite::rusqlite::Connection;
    let dir = Dir::new("tokens");
    assert_eq!(code(&dir.run("t1", &[], "true")), 0);
    Connection::open(dir.db()).unwrap().execute_batch("DELETE FROM idemcache_tokens").unwrap();
    let out = dir.run("t2", &[], "echo ran >> ran");
    let said = text(&out.stderr);
    assert_eq!(code(&out), 71, "{said}");
    assert!(said.contains("idemcache_tokens") && said.contains("INSERT INTO"), "{said}");
    assert!(said.contains(&dir.db().display().to_string()), "{said}");
    assert_eq!(dir.lines("ran"), 0);
}

/// A command's output that cannot be written to idem's stdout for another reason than
/// a reader gone (a full disk: `/dev/full`) is said on stderr, as every other write to
/// stdout that fails is ("another failure to write stdout (a full disk) is said on
/// stderr"), and is still recorded whole. The live pass-through dropped it in silence:
/// exit 0, nothing said, the output lost.
#[test]
fn a_full_disk_under_a_commands_live_output_is_said_on_stderr() {
    let dir = Dir::new("full");
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let out = dir
        .run_cmd("full", &[], "echo ran >> ran; echo hello")
        .stdout(Stdio::from(full))
        .output()
        .unwrap();
    let said = text(&out.stderr);
    assert_eq!(code(&out), 0, "{said}");
    assert!(said.contains("stdout") && said.contains("No space left"), "nothing said: {said:?}");
    let replay = dir.run("full", &[], "echo ran >> ran; echo hello");
    assert_eq!((code(&replay), text(&replay.stdout).as_str()), (0, "hello\n"), "recorded whole");
    assert_eq!(dir.lines("ran"), 1);
}

/// A run interrupted (SIGTERM) after its key was taken from it (`forget --force` here;
/// a lease lapsed while idem was suspended is the same) before a renewal noticed: the
/// command's outcome is not recorded and idem says it lost its hold, exiting with the
/// command's 128+N, as a run that loses its key and is not interrupted does. It exited
/// 71, "the state database ... is unusable", after saying "the key is marked UNKNOWN",
/// neither of which was so: marking UNKNOWN a key it no longer held was refused.
#[test]
fn an_interrupted_run_that_lost_its_key_says_so_and_exits_with_the_commands_status() {
    let dir = Dir::new("lost-irq");
    let script = "echo ran >> ran; touch started; exec sleep 30";
    // A minute's lease: its first renewal (20 s on) comes long after the test's end.
    let spawned = dir
        .run_cmd("li", &[], script)
        .env("IDEM_LEASE_MS", "60000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually(10, "the command to start", || dir.path("started").exists());
    assert_eq!(code(&dir.idem(&["forget", "li", "--force"]).output().unwrap()), 0);
    signal(spawned.id(), Signal::TERM);
    let out = finish(spawned, 20);
    let said = text(&out.stderr);
    assert_eq!(code(&out), 128 + Signal::TERM.as_raw(), "{said}");
    assert!(said.contains("lost its hold on the key"), "{said}");
    assert!(!said.contains("unusable") && !said.contains("marked UNKNOWN"), "{said}");
    assert_eq!(dir.state("li"), "ABSENT", "the forgotten key was not written again");
}

/// A database path that is a symlink to a file not made yet (a state directory linked
/// to another disk before the first run) is made 0600, as every database idem makes:
/// records hold commands' output. It was made by SQLite through the link, 0644 under a
/// umask of 022: readable by every user.
#[test]
fn a_database_made_through_a_dangling_symlink_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = Dir::new("dangling");
    std::fs::create_dir_all(dir.path("disk")).unwrap();
    std::os::unix::fs::symlink(dir.path("disk/idem.db"), dir.path("link.db")).unwrap();
    let out = dir
        .command("sh", &["-c", "umask 022 && exec \"$@\"", "sh", IDEM])
        .args(["run", "--key", "d", "--db", "link.db", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let mode = std::fs::metadata(dir.path("disk/idem.db")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "made {:o}", mode & 0o777);
}

/// `idem list` prints the oldest records first (not in key order), at most `--limit`,
/// and `--in-progress` selects PROCESSING ones, on idem's own database.
#[test]
fn list_is_oldest_first_bounded_and_filters_by_state() {
    let dir = Dir::new("list-order");
    for key in ["zz-first", "aa-second", "mm-third"] {
        assert_eq!(code(&dir.run(key, &[], "true")), 0);
    }
    let listed = |args: &[&str]| -> Vec<String> {
        let out = dir.idem(args).output().unwrap();
        assert_eq!(code(&out), 0, "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(listed(&["list", "--json"]), ["zz-first", "aa-second", "mm-third"]);
    assert_eq!(listed(&["list", "--json", "--limit", "2"]), ["zz-first", "aa-second"]);
    assert_eq!(listed(&["list", "--json", "--in-progress"]), Vec::<String>::new());
    assert_eq!(listed(&["list", "--json", "--key", "aa-second"]), ["aa-second"]);
    assert_eq!(listed(&["list", "--json", "--scope", "POST /other"]), Vec::<String>::new());
    let text_list = dir.idem(&["list"]).output().unwrap();
    let lines: Vec<String> = text(&text_list.stdout).lines().map(str::to_owned).collect();
    assert!(lines[0].contains("zz-first") && lines[2].contains("mm-third"), "{lines:?}");
    // `run` keeps its records in idem's own database only.
    let refused = dir.idem(&["run", "--store", "sqlite::memory:", "--key", "k", "--", "true"]);
    assert_eq!(code(&{ refused }.output().unwrap()), 64);
}

/// A store URL's password is never printed, even when the store cannot be reached.
#[test]
fn a_store_that_cannot_be_reached_is_71_and_its_password_is_never_printed() {
    let dir = Dir::new("store-unreachable");
    let url = "postgres://ops:hunter2@127.0.0.1:1/shop";
    for args in [vec!["list"], vec!["status", "k"], vec!["gc"]] {
        let mut all = vec!["--store", url];
        all.extend(args);
        let out = dir.idem(&all).output().unwrap();
        assert_eq!(code(&out), 71, "{}", text(&out.stderr));
        let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(!said.contains("hunter2") && said.contains("ops:***@"), "{said}");
    }
    let out = dir.idem(&["list", "--store", "nosuch://x"]).output().unwrap();
    assert_eq!(code(&out), 64, "{}", text(&out.stderr));
}

/// A `sqlite:` store URL naming no file (a mistyped path) is 71 naming it, and leaves no
/// file behind: idem reads a service's store, it never makes one (the driver created an
/// empty database there and then reported a missing table).
#[test]
fn a_sqlite_store_that_does_not_exist_is_71_and_is_not_created() {
    let dir = Dir::new("store-typo");
    let path = dir.path("servcie.db");
    for url in [format!("sqlite:{}", path.display()), format!("SQLite://{}", path.display())] {
        for args in [vec!["list"], vec!["status", "k"], vec!["gc"]] {
            let mut all = vec!["--store", url.as_str()];
            all.extend(args);
            let out = dir.idem(&all).output().unwrap();
            assert_eq!(code(&out), 71, "{}", text(&out.stderr));
            assert!(text(&out.stderr).contains("servcie.db"), "{}", text(&out.stderr));
            assert!(!path.exists(), "idem created {path:?}");
        }
    }
}

/// An empty `--store` (the runbook's `--store "$STORE"` with the variable unset, or an
/// empty `IDEM_STORE`) names no store: it is 64, as it is for `idem run`, never a read of
/// idem's own database answering "no record" about a store nobody looked in.
#[test]
fn an_empty_store_url_is_a_usage_error_not_idems_own_database() {
    let dir = Dir::new("store-empty");
    assert_eq!(code(&dir.idem(&["run", "--key", "k", "--", "true"]).output().unwrap()), 0);
    for args in [vec!["list", "--key", "k", "--json"], vec!["status", "k"], vec!["gc"]] {
        let mut all = vec!["--store", ""];
        all.extend(args.iter().copied());
        let out = dir.idem(&all).output().unwrap();
        assert_eq!(code(&out), 64, "{:?}: {}", args, text(&out.stdout));
        assert!(text(&out.stderr).contains("--store"), "{}", text(&out.stderr));
        let out = dir.idem(&args).env("IDEM_STORE", "").output().unwrap();
        assert_eq!(code(&out), 64, "{:?}: {}", args, text(&out.stdout));
    }
}

/// `list --key` with a client key no record can have (empty: `--key "$KEY"` with the
/// variable unset; a space or a newline pasted with it; over 255 bytes) is 64 naming it,
/// as `status` is, never an empty list read as "no record of this key".
#[test]
fn list_by_a_client_key_no_record_can_have_is_a_usage_error() {
    let dir = Dir::new("list-bad-key");
    assert_eq!(code(&dir.idem(&["run", "--key", "k", "--", "true"]).output().unwrap()), 0);
    let long = "k".repeat(256);
    for bad in ["", "8e03978e 40d5", "8e03978e\n", long.as_str()] {
        let out = dir.idem(&["list", "--key", bad, "--json"]).output().unwrap();
        assert_eq!(code(&out), 64, "{bad:?}: {}", text(&out.stdout));
        assert!(text(&out.stderr).contains("refused"), "{}", text(&out.stderr));
    }
    let out = dir.idem(&["list", "--key", "k", "--json"]).output().unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
}

/// The service URL in `var`, or `None` after saying on stderr that the test is skipped.
fn service_url(var: &str, example: &str) -> Option<String> {
    use std::io::Write;
    let url = std::env::var(var).ok().filter(|url| !url.is_empty());
    if url.is_none() {
        let test = std::thread::current().name().unwrap_or("a test").to_owned();
        let _ = writeln!(std::io::stderr(), "skipped {test}: set {var} (e.g. {example}) to run it");
    }
    url
}

/// A stored HTTP response as the layer keeps it (`IDR1`, status 201, no header or
/// trailer fields, then the body).
const STORED_201: &[u8] = b"IDR1\x00\xc9\x00\x00\x00\x00{\"order\":7}";

/// Records made through the Rust API in the store at `url` (as a service's HTTP layer
/// makes them), inspected with `idem --store URL`: every record of one client key
/// whatever its scope and tenant, each filter, status with its HTTP status, forget
/// (with and without --force), resolve of idem's own key, gc and purge.
fn inspect_a_store(url: &str, tag: &str) {
    use idemcache::store::{RecordState, Store, StoreClaim};
    use idemcache::{Fingerprint, Key};
    use std::time::SystemTime;

    let dir = Dir::new(&format!("store-{tag}"));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let store = rt.block_on(idemcache_any::open(url)).unwrap();
    rt.block_on(store.ensure_schema()).unwrap();
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos();
    let k = format!("cust-{tag}-{}-{nanos}", std::process::id());
    let lease = Duration::from_secs(60);
    let ttl = Duration::from_secs(3600);
    let claim = |key: &Key| match rt.block_on(store.claim(key, Fingerprint::of(b"r"), lease)) {
        Ok(StoreClaim::Acquired { token, .. }) => token,
        other => panic!("{other:?}"),
    };
    let orders_a = Key::new("POST /orders", "tenant-a", &k).unwrap();
    let orders_b = Key::new("POST /orders", "tenant-b", &k).unwrap();
    let refund_a = Key::new("POST /refunds", "tenant-a", &k).unwrap();
    let refund_none = Key::without_tenant("POST /refunds", &k).unwrap();
    let not_theirs = Key::new("POST /orders", "tenant-a", format!("{k}-2")).unwrap();
    let idems = Key::without_tenant("idem run", &k).unwrap();
    // Made in this order; listed oldest first (records made within one tick of the
    // store's clock tie, and may be listed in either order).
    let t = claim(&orders_a);
    rt.block_on(store.complete(&orders_a, t, Some(STORED_201.to_vec().into()), ttl)).unwrap();
    let by = idemcache::CorrelationId::new("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
    let held =
        rt.block_on(store.claim_correlated(&orders_b, Fingerprint::of(b"r"), lease, Some(&by)));
    assert!(matches!(held, Ok(StoreClaim::Acquired { .. })), "{held:?}");
    let t = claim(&refund_a);
    rt.block_on(store.mark_unknown(&refund_a, t, ttl)).unwrap();
    let t = claim(&refund_none);
    rt.block_on(store.complete(&refund_none, t, None, ttl)).unwrap();
    let t = claim(&not_theirs);
    rt.block_on(store.complete(&not_theirs, t, None, ttl)).unwrap();
    let t = claim(&idems);
    rt.block_on(store.mark_unknown(&idems, t, ttl)).unwrap();

    let idem = |args: &[&str]| {
        let mut all = vec!["--store", url];
        all.extend_from_slice(args);
        dir.idem(&all).output().unwrap()
    };
    let listed = |args: &[&str]| -> Vec<serde_json::Value> {
        let mut all = vec!["list", "--key", &k, "--json"];
        all.extend_from_slice(args);
        let out = idem(&all);
        assert_eq!(code(&out), 0, "{}", text(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    };
    let every = listed(&[]);
    let who: Vec<(String, Option<String>, String)> = every
        .iter()
        .map(|r| {
            assert_eq!(r["client_key"], k.as_str());
            let correlated = r["tenant"] == "tenant-b";
            assert_eq!(r["correlation_id"].as_str(), correlated.then_some(by.as_str()), "{r}");
            for field in ["expires_at", "started_at"] {
                assert!(r[field]["utc"].is_string() && r[field]["unix_micros"].is_i64(), "{r}");
            }
            assert!(r["fencing_token"].is_u64(), "{r}");
            let processing = r["state"] == "PROCESSING";
            assert_eq!(r["lease_ends_at"].is_object(), processing, "{r}");
            assert_eq!(r["settled_at"].is_object(), !processing, "{r}");
            assert!(r.get("result_bytes").is_some(), "{r}");
            (
                r["scope"].as_str().unwrap().to_owned(),
                r["tenant"].as_str().map(str::to_owned),
                r["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let started: Vec<i64> =
        every.iter().map(|r| r["started_at"]["unix_micros"].as_i64().unwrap()).collect();
    assert!(started.windows(2).all(|w| w[0] <= w[1]), "not oldest first: {started:?}");
    let some = |s: &str| Some(s.to_owned());
    let mut who = who;
    who.sort();
    assert_eq!(
        who,
        [
            ("POST /orders".into(), some("tenant-a"), "COMPLETED".into()),
            ("POST /orders".into(), some("tenant-b"), "PROCESSING".into()),
            ("POST /refunds".into(), None, "COMPLETED".into()),
            ("POST /refunds".into(), some("tenant-a"), "UNKNOWN".into()),
            ("idem run".into(), None, "UNKNOWN".into()),
        ]
    );
    let first = every
        .iter()
        .find(|r| r["scope"] == "POST /orders" && r["tenant"] == "tenant-a")
        .expect("the completed order's record");
    assert_eq!(
        (first["http_status"].as_u64(), first["result_bytes"].as_u64()),
        (Some(201), Some(STORED_201.len() as u64))
    );
    let count = |args: &[&str]| listed(args).len();
    assert_eq!(count(&["--scope", "POST /orders"]), 2);
    assert_eq!(count(&["--tenant", "tenant-a"]), 2);
    assert_eq!(count(&["--scope", "POST /refunds", "--tenant", "tenant-a"]), 1);
    assert_eq!(count(&["--unknown"]), 2);
    assert_eq!(count(&["--in-progress"]), 1);
    assert_eq!(count(&["--unknown", "--in-progress"]), 3);
    assert_eq!(count(&["--limit", "1"]), 1);

    // status: the HTTP layer's record, addressed as the layer builds its key.
    let at = ["--scope", "POST /orders", "--tenant", "tenant-a"];
    let status = |args: &[&str]| {
        let mut all = vec!["status", &k];
        all.extend_from_slice(args);
        idem(&all)
    };
    let out = status(&[&at[..], &["--json"]].concat());
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["state"].as_str(), v["http_status"].as_u64()), (Some("COMPLETED"), Some(201)));
    let out = status(&at);
    assert!(text(&out.stdout).contains("HTTP 201") && text(&out.stdout).contains("fingerprint"));
    let v: serde_json::Value =
        serde_json::from_slice(&status(&["--scope", "POST /nothing", "--json"]).stdout).unwrap();
    assert_eq!(v["state"], "ABSENT");

    // A service's UNKNOWN record: the next commands address it as it is addressed here,
    // and speak of a request, not a run.
    let out = status(&["--scope", "POST /refunds", "--tenant", "tenant-a"]);
    let said = text(&out.stdout);
    assert!(said.contains(&format!("--scope 'POST /refunds' --tenant tenant-a {k}")), "{said}");
    assert!(!said.contains("idem resolve") && said.contains("request"), "{said}");
    let out = status(&["--scope", "POST /orders", "--tenant", "tenant-b"]);
    assert!(
        text(&out.stdout).contains(by.as_str()),
        "the holder's correlation id: {}",
        text(&out.stdout)
    );
    // The client key under a scope it has no record in: it exists elsewhere.
    // The hint addresses the same store: `--store` included (it was left out).
    let out = status(&["--scope", "POST /nothing"]);
    let said = text(&out.stdout);
    assert!(said.contains("exist elsewhere: idem list --store "), "{said}");
    assert!(said.contains(&format!("--key {k}")), "{said}");
    // The text listing names each record by its parts.
    let out = idem(&["list", "--key", &k, "--scope", "POST /orders"]);
    assert!(
        text(&out.stdout).contains(&format!("[POST /orders] [tenant-a] {k}")),
        "{}",
        text(&out.stdout)
    );

    // forget: UNKNOWN only, PROCESSING with --force; resolve only idem's own.
    let refunds = ["--scope", "POST /refunds", "--tenant", "tenant-a"];
    assert_eq!(code(&idem(&[&["forget", &k][..], &refunds].concat())), 0);
    assert_eq!(code(&idem(&[&["forget", &k][..], &refunds].concat())), 1);
    let held = ["--scope", "POST /orders", "--tenant", "tenant-b"];
    assert_eq!(code(&idem(&[&["forget", &k][..], &held].concat())), 1);
    assert_eq!(code(&idem(&[&["forget", &k, "--force"][..], &held].concat())), 0);
    assert_eq!(code(&idem(&[&["resolve", &k, "--exit-code", "0"][..], &at].concat())), 64);
    let out = idem(&["resolve", &k, "--exit-code", "3"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let replayed = dir.idem(&["--store", url, "status", &k, "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&replayed.stdout).unwrap();
    assert_eq!((v["state"].as_str(), v["outcome"]["code"].as_i64()), (Some("COMPLETED"), Some(3)));
    assert_eq!(count(&[]), 3, "two forgotten of five");
    for sub in ["gc", "purge"] {
        let out = idem(&[sub, "--json"]);
        assert_eq!(code(&out), 0, "{sub}: {}", text(&out.stderr));
    }
    for key in [&orders_a, &orders_b, &refund_a, &refund_none, &not_theirs, &idems] {
        rt.block_on(store.remove_record(key, &RecordState::ALL)).unwrap();
    }
}

#[test]
fn idem_inspects_a_sqlite_store_by_url() {
    let dir = Dir::new("store-file");
    let url = format!("sqlite:{}", dir.path("service.db").display());
    inspect_a_store(&url, "sqlite");
}

#[test]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
fn idem_inspects_a_postgres_store() {
    let Some(url) =
        service_url("IDEMCACHE_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
    else {
        return;
    };
    inspect_a_store(&url, "postgres");
}

#[test]
#[ignore = "needs IDEMCACHE_REDIS_STORE_URL"]
fn idem_inspects_a_redis_store() {
    let Some(url) = service_url("IDEMCACHE_REDIS_STORE_URL", "redis://127.0.0.1:6379/14") else {
        return;
    };
    inspect_a_store(&url, "redis");
}

#[test]
#[ignore = "needs IDEMCACHE_MYSQL_URL"]
fn idem_inspects_a_mysql_store() {
    let Some(url) = service_url("IDEMCACHE_MYSQL_URL", "mysql://root@127.0.0.1:3306/test") else {
        return;
    };
    inspect_a_store(&url, "mysql");
}

#[test]
#[ignore = "needs IDEMCACHE_REDIS_CLUSTER_URLS"]
fn idem_inspects_a_redis_cluster() {
    let Some(urls) = service_url(
        "IDEMCACHE_REDIS_CLUSTER_URLS",
        "redis://127.0.0.1:7000,redis://127.0.0.1:7001",
    ) else {
        return;
    };
    // `redis-cluster://host:port,host:port`: the nodes without their schemes.
    let nodes: Vec<&str> =
        urls.split(',').map(|u| u.trim().trim_start_matches("redis://")).collect();
    inspect_a_store(&format!("redis-cluster://{}", nodes.join(",")), "cluster");
}
