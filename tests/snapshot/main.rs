//! Snapshots: a round trip keeps every fact; expiry runs on across a restart (and a wall
//! clock that moved between a save and a load clamps, `clamp`); a file
//! truncated at any byte or with any bit flipped loads nothing and says why; a foreign
//! file or a later version is refused; a live entry is never displaced; a save that
//! fails leaves the cache serving; and a writer killed (SIGKILL) mid-save leaves the
//! previous snapshot whole, and a later load removes what it left (`temporaries`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idemcache::snapshot::{read_bytes, Load, SnapshotError, SnapshotFile, SnapshotState};
use idemcache::{Cache, Claim, CorrelationId, EntryState, Fingerprint, Key, ManualClock, Outcome};

mod clamp;
#[cfg(target_os = "linux")]
mod temporaries;

pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idemcache-snap-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("cache.snap")
}

pub(crate) fn key(n: &str) -> Key {
    Key::new("POST /orders", "user:1", n).unwrap()
}

pub(crate) fn fp(s: &str) -> Fingerprint {
    Fingerprint::of(s.as_bytes())
}

pub(crate) fn manual() -> (Cache, ManualClock) {
    let clock = ManualClock::new();
    let cache = Cache::builder().clock(clock.clone()).max_result_size(64).build().unwrap();
    (cache, clock)
}

pub(crate) fn complete(cache: &Cache, k: &str, body: &[u8]) {
    complete_correlated(cache, k, body, None);
}

fn complete_correlated(cache: &Cache, k: &str, body: &[u8], id: Option<&CorrelationId>) {
    match cache.claim_correlated(&key(k), fp(k), id).unwrap() {
        Claim::Acquired(guard) => guard.complete(body.to_vec()).unwrap(),
        other => panic!("{k}: {other:?}"),
    }
}

/// The correlation id `filled` gives the claims of "kept" and "running".
fn trace(n: u8) -> CorrelationId {
    CorrelationId::new(format!("4bf92f3577b34da6a3ce929d0e0e47{n:02}")).unwrap()
}

/// A cache holding each kind of fact: a result, a result too large to keep, an UNKNOWN
/// mark, and a claim still executing; "kept" and "running" with correlation ids.
pub(crate) fn filled() -> (Cache, ManualClock) {
    let (cache, clock) = manual();
    complete_correlated(&cache, "kept", b"order 1", Some(&trace(1)));
    complete(&cache, "too-large", &[7u8; 100]);
    match cache.claim(&key("unknown"), fp("unknown")).unwrap() {
        Claim::Acquired(guard) => guard.mark_unknown().unwrap(),
        other => panic!("{other:?}"),
    }
    match cache.claim_correlated(&key("running"), fp("running"), Some(&trace(2))).unwrap() {
        Claim::Acquired(guard) => std::mem::forget(guard),
        other => panic!("{other:?}"),
    }
    (cache, clock)
}

#[test]
fn a_round_trip_keeps_every_fact_and_writes_processing_as_unknown() {
    let path = scratch("round-trip");
    let (cache, _clock) = filled();
    let saved = SnapshotFile::new(&path).save(&cache).unwrap();
    assert_eq!((saved.generation, saved.entries), (1, 4));
    assert_eq!(saved.bytes, std::fs::metadata(&path).unwrap().len());

    let (restarted, _clock) = manual();
    let loaded = SnapshotFile::new(&path).load(&restarted, Load::Strict).unwrap();
    assert_eq!((loaded.inserted, loaded.expired, loaded.occupied), (4, 0, 0));
    assert_eq!(loaded.generation, Some(1));
    match restarted.claim(&key("kept"), fp("kept")).unwrap() {
        Claim::Completed(replay) => assert_eq!(replay.body.as_deref(), Some(&b"order 1"[..])),
        other => panic!("{other:?}"),
    }
    match restarted.claim(&key("too-large"), fp("too-large")).unwrap() {
        Claim::Completed(replay) => assert!(replay.body.is_none()),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        restarted.claim(&key("unknown"), fp("unknown")).unwrap(),
        Claim::Unknown { .. }
    ));
    assert!(matches!(
        restarted.claim(&key("running"), fp("running")).unwrap(),
        Claim::Unknown { .. }
    ));
    // Fingerprints and correlation ids travel with their keys.
    assert!(matches!(restarted.claim(&key("kept"), fp("other")).unwrap(), Claim::Mismatch));
    let correlation = |k: &str| restarted.peek(&key(k)).unwrap().correlation_id;
    assert_eq!(correlation("kept"), Some(trace(1)));
    assert_eq!(correlation("running"), Some(trace(2)), "kept through the turn to UNKNOWN");
    assert_eq!((correlation("unknown"), correlation("too-large")), (None, None));
    restarted.debug_validate();
}

/// `body` (a snapshot without its checksum) with the checksum a writer would append.
fn with_checksum(mut body: Vec<u8>) -> Vec<u8> {
    let sum = xxhash_rust::xxh3::xxh3_64(&body);
    body.extend_from_slice(&sum.to_be_bytes());
    body
}

/// A snapshot of one completed entry whose claim had correlation id `req-1`, without
/// its checksum; and where the id's length byte is.
fn one_correlated_entry() -> (Vec<u8>, usize) {
    let path = scratch("one-correlated");
    let (cache, _clock) = manual();
    complete_correlated(&cache, "k", b"r", Some(&CorrelationId::new("req-1").unwrap()));
    SnapshotFile::new(&path).save(&cache).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(bytes.len() - 8);
    let at = bytes.windows(6).position(|w| w == b"\x05req-1").expect("the id's length and bytes");
    (bytes, at)
}

#[test]
fn a_version_1_snapshot_written_before_correlation_ids_still_loads() {
    // Version 1 is version 2 without the correlation id's length and bytes.
    let (mut bytes, at) = one_correlated_entry();
    bytes.drain(at..at + 6);
    bytes[8..10].copy_from_slice(&1u16.to_be_bytes());
    let snapshot = read_bytes(&with_checksum(bytes.clone())).unwrap();
    assert_eq!(snapshot.entries.len(), 1);
    assert_eq!(snapshot.entries[0].correlation_id, None);
    let path = scratch("version-1");
    std::fs::write(&path, with_checksum(bytes)).unwrap();
    let (restarted, _clock) = manual();
    assert_eq!(SnapshotFile::new(&path).load(&restarted, Load::Strict).unwrap().inserted, 1);
    let entry = restarted.peek(&key("k")).unwrap();
    assert!(matches!(entry.state, EntryState::Completed(_)));
    assert_eq!(entry.correlation_id, None);
}

#[test]
fn a_correlation_id_that_is_not_one_is_corrupt_and_loads_nothing() {
    let (good, at) = one_correlated_entry();
    assert_eq!(
        read_bytes(&with_checksum(good.clone())).unwrap().entries[0].correlation_id,
        Some(CorrelationId::new("req-1").unwrap())
    );
    let mut spaced = good.clone();
    spaced[at + 4] = b' ';
    let mut empty_but_present = good.clone();
    empty_but_present.drain(at + 1..at + 6);
    empty_but_present[at] = 0;
    match read_bytes(&with_checksum(spaced)) {
        Err(SnapshotError::Corrupt(what)) => {
            assert!(what.contains("correlation id") && what.contains("not visible ASCII"), "{what}")
        }
        other => panic!("{other:?}"),
    }
    // A length of 0 is "none", which a writer writes for a claim without one.
    let none = read_bytes(&with_checksum(empty_but_present)).unwrap();
    assert_eq!(none.entries[0].correlation_id, None);
    // A length longer than what is left is corrupt, never a read past the end.
    let mut long = good;
    long[at] = 200;
    assert!(matches!(read_bytes(&with_checksum(long)), Err(SnapshotError::Corrupt(_))));
}

/// Every value of the id's length byte and of each of its bytes, sealed with a valid
/// checksum (as a writer that knew the format would): never a panic, and nothing read
/// but the one entry with a well-formed id of the length written. A length that does
/// not match the bytes that follow is corrupt, whatever those bytes happen to be.
#[test]
fn every_sealed_change_to_a_correlation_id_is_corrupt_or_a_well_formed_id() {
    let (good, at) = one_correlated_entry();
    for len in 0..=u8::MAX {
        let mut changed = good.clone();
        changed[at] = len;
        let read = read_bytes(&with_checksum(changed));
        match len {
            5 => {
                let id = read.unwrap().entries[0].correlation_id.clone();
                assert_eq!(id.unwrap().as_str(), "req-1");
            }
            _ => assert!(matches!(read, Err(SnapshotError::Corrupt(_))), "length {len}: {read:?}"),
        }
    }
    for i in 1..=5 {
        for byte in 0..=u8::MAX {
            let mut changed = good.clone();
            changed[at + i] = byte;
            match read_bytes(&with_checksum(changed)) {
                Ok(snapshot) => {
                    assert!(byte.is_ascii_graphic(), "byte {i} = {byte:#04x} read as an id");
                    assert_eq!(snapshot.entries.len(), 1);
                    let id = snapshot.entries[0].correlation_id.clone().unwrap();
                    assert_eq!(id.as_str().as_bytes()[i - 1], byte);
                }
                Err(SnapshotError::Corrupt(_)) => {
                    assert!(!byte.is_ascii_graphic(), "byte {i} = {byte:#04x} refused")
                }
                Err(other) => panic!("byte {i} = {byte:#04x}: {other:?}"),
            }
        }
    }
}

/// A snapshot of nothing is its header and trailer alone (45 bytes); any start of it is
/// `Truncated`, as documented, even sealed with a checksum that matches: never read
/// into a `Corrupt`, a `NotASnapshot` or a snapshot. Its count must be its entries'.
#[test]
fn a_file_shorter_than_a_header_and_trailer_is_truncated_even_sealed() {
    let path = scratch("empty");
    let (cache, _clock) = manual();
    SnapshotFile::new(&path).save(&cache).unwrap();
    let empty = std::fs::read(&path).unwrap();
    assert_eq!(empty.len(), 8 + 2 + 2 + 8 + 8 + 1 + 8 + 8);
    assert_eq!(read_bytes(&empty).unwrap().entries, vec![]);
    for len in 0..empty.len() {
        // Sealed wherever there is room for a checksum after the magic and version.
        let short = match len.checked_sub(8).filter(|&body| body >= 10) {
            Some(body) => with_checksum(empty[..body].to_vec()),
            None => empty[..len].to_vec(),
        };
        assert_eq!(short.len(), len);
        let read = read_bytes(&short);
        assert!(matches!(read, Err(SnapshotError::Truncated)), "{len} bytes: {read:?}");
    }
    // Short, but not the start of a snapshot; and a version named before the rest.
    assert!(matches!(read_bytes(b"{}"), Err(SnapshotError::NotASnapshot)));
    assert!(matches!(read_bytes(b"IDEMSNAP\x00\x03"), Err(SnapshotError::UnsupportedVersion(3))));
    // A count that is not the entries', or a byte after it: corrupt, even sealed.
    let body = &empty[..empty.len() - 8];
    let mut miscounted = body.to_vec();
    *miscounted.last_mut().unwrap() = 1;
    let mut trailing = body.to_vec();
    trailing.push(0);
    for garbage in [miscounted, trailing] {
        let read = read_bytes(&with_checksum(garbage));
        assert!(matches!(read, Err(SnapshotError::Corrupt(_))), "{read:?}");
    }
}

static WALL: AtomicU64 = AtomicU64::new(1_800_000_000_000_000);

fn wall() -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(WALL.load(Ordering::SeqCst))
}

#[test]
fn expiry_runs_on_across_a_restart_an_hour_later_has_an_hour_less() {
    let path = scratch("expiry");
    let (cache, _clock) = manual();
    let now = cache.now();
    let minutes = |m: u64| Duration::from_secs(60 * m);
    for (k, ttl) in [("half-hour", minutes(30)), ("two-hours", minutes(120))] {
        let known = Outcome::Completed {
            body: None,
            completed_at: now,
            expires_at: now.saturating_add(ttl),
        };
        cache.insert(&key(k), fp(k), known).unwrap();
    }
    SnapshotFile::new(&path).wall_clock(wall).save(&cache).unwrap();
    WALL.fetch_add(minutes(60).as_micros() as u64, Ordering::SeqCst); // down for an hour

    let (restarted, clock) = manual();
    let loaded = SnapshotFile::new(&path).wall_clock(wall).load(&restarted, Load::Strict).unwrap();
    assert_eq!((loaded.inserted, loaded.expired), (1, 1));
    assert!(restarted.peek(&key("half-hour")).is_none());
    clock.advance(minutes(59));
    assert!(restarted.peek(&key("two-hours")).is_some(), "an hour is left");
    clock.advance(minutes(2));
    assert!(restarted.peek(&key("two-hours")).is_none(), "and no more");
}

#[test]
fn a_file_truncated_at_any_byte_or_with_any_bit_flipped_loads_nothing_and_says_why() {
    let path = scratch("damage");
    let (cache, _clock) = filled();
    SnapshotFile::new(&path).save(&cache).unwrap();
    let whole = std::fs::read(&path).unwrap();
    read_bytes(&whole).unwrap();
    let damaged = path.with_file_name("damaged.snap");
    let check = |bytes: &[u8], what: &str| {
        assert!(read_bytes(bytes).is_err(), "{what}: decoded");
        std::fs::write(&damaged, bytes).unwrap();
        let (fresh, _clock) = manual();
        let strict = SnapshotFile::new(&damaged).load(&fresh, Load::Strict);
        assert!(strict.is_err(), "{what}: loaded strictly");
        let quiet = SnapshotFile::new(&damaged).load(&fresh, Load::Quiet).unwrap();
        let why = quiet.refused.unwrap_or_else(|| panic!("{what}: no reason given"));
        assert!(!why.to_string().is_empty());
        assert_eq!((quiet.inserted, fresh.stats().entries), (0, 0), "{what}: inserted something");
    };
    for len in 0..whole.len() {
        check(&whole[..len], &format!("truncated to {len} bytes"));
    }
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for at in 0..whole.len() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mut flipped = whole.clone();
        flipped[at] ^= 1 << (state % 8);
        check(&flipped, &format!("bit {} of byte {at} flipped", state % 8));
    }
}

#[test]
fn a_foreign_file_or_a_later_version_is_refused_by_name() {
    assert!(matches!(read_bytes(b"{\"not\": \"a snapshot\"}"), Err(SnapshotError::NotASnapshot)));
    assert!(matches!(read_bytes(b"IDEM"), Err(SnapshotError::Truncated)));
    let mut later = b"IDEMSNAP".to_vec();
    later.extend_from_slice(&3u16.to_be_bytes());
    later.extend_from_slice(&[0; 40]);
    let refused = read_bytes(&later).unwrap_err();
    assert!(matches!(refused, SnapshotError::UnsupportedVersion(3)));
    assert!(refused.to_string().contains("version 3"));
    // It names every version this build reads, the earlier one too.
    assert!(refused.to_string().contains("reads versions 1 and 2"), "{refused}");
    // A missing file: an error when strict, an empty start when quiet.
    let missing = scratch("missing");
    let (cache, _clock) = manual();
    let err = SnapshotFile::new(&missing).load(&cache, Load::Strict).unwrap_err();
    assert!(err.to_string().contains(&missing.display().to_string()), "{err}");
    let quiet = SnapshotFile::new(&missing).load(&cache, Load::Quiet).unwrap();
    assert!(quiet.refused.is_none() && quiet.generation.is_none());
}

#[test]
fn loading_never_displaces_a_live_entry_and_generations_count_up() {
    let path = scratch("occupied");
    let (cache, _clock) = filled();
    let mut file = SnapshotFile::new(&path);
    file.save(&cache).unwrap();
    let (restarted, _clock) = manual();
    complete(&restarted, "kept", b"the live one");
    let mut reader = SnapshotFile::new(&path);
    let loaded = reader.load(&restarted, Load::Strict).unwrap();
    assert_eq!((loaded.inserted, loaded.occupied), (3, 1));
    match restarted.peek(&key("kept")).unwrap().state {
        EntryState::Completed(replay) => {
            assert_eq!(replay.body.as_deref(), Some(&b"the live one"[..]))
        }
        other => panic!("{other:?}"),
    }
    // The reader goes on from the generation it loaded.
    assert_eq!(reader.save(&restarted).unwrap().generation, 2);
    assert_eq!(file.save(&cache).unwrap().generation, 2);
}

#[test]
fn a_save_that_fails_names_the_file_and_the_cache_goes_on_serving() {
    let dir = scratch("fails").with_file_name("no-such-dir");
    let (cache, _clock) = filled();
    let err = SnapshotFile::new(dir.join("cache.snap")).save(&cache).unwrap_err();
    assert!(matches!(err, SnapshotError::Io { .. }));
    assert!(err.to_string().contains("no-such-dir"), "{err}");
    complete(&cache, "after", b"still serving");
}

const CHILD: &str = "IDEMCACHE_SNAPSHOT_WRITER";

/// The child process of the crash test: saves a large snapshot to `$CHILD` over and
/// over until it is killed, or until its parent is gone (a test run killed from
/// outside, e.g. by a timeout, cannot kill it, and it must not save forever as an
/// orphan). Does nothing in a normal run.
#[test]
fn snapshot_writer_child_process() {
    let Ok(path) = std::env::var(CHILD) else { return };
    let parent = parent_id();
    let cache = Cache::builder().max_entries(100_000).build().unwrap();
    for i in 0..3_000 {
        let k = Key::new("POST /big", "child", format!("k{i}")).unwrap();
        if let Claim::Acquired(guard) = cache.claim(&k, fp("child")).unwrap() {
            guard.complete(vec![i as u8; 60_000]).unwrap();
        }
    }
    let mut file = SnapshotFile::new(&path);
    while parent_id() == parent {
        file.save(&cache).unwrap();
    }
}

/// The process that started this one: on Unix a process whose parent died is adopted
/// by another, so a change means the parent is gone. Elsewhere nothing tells, and the
/// parent's [`KillOnDrop`] is all there is.
fn parent_id() -> u32 {
    #[cfg(unix)]
    return std::os::unix::process::parent_id();
    #[cfg(not(unix))]
    return 0;
}

/// The writer child, killed when the test ends however it ends: a failed assertion
/// unwinds past the test's own `kill`, and the child would otherwise save forever.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_writer_killed_mid_save_leaves_the_previous_snapshot_whole() {
    let path = scratch("killed");
    let (cache, _clock) = filled();
    let mut file = SnapshotFile::new(&path);
    file.save(&cache).unwrap();
    let before = std::fs::read(&path).unwrap();

    let mut child = KillOnDrop(
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "snapshot_writer_child_process", "--nocapture", "--test-threads=1"])
            .env(CHILD, &path)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let prefix = format!("cache.snap.tmp-{}-", child.0.id());
    let dir = path.parent().unwrap().to_owned();
    let written = || {
        let entries = std::fs::read_dir(&dir).into_iter().flatten().flatten();
        let mine = entries.filter(|e| e.file_name().to_string_lossy().starts_with(&prefix));
        mine.filter_map(|e| e.metadata().ok()).map(|m| m.len()).max().unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    // Mid-write: the temporary file exists and holds part of the new snapshot.
    while written() < 4 << 20 {
        assert!(std::time::Instant::now() < deadline, "the writer never started writing");
        assert!(child.0.try_wait().unwrap().is_none(), "the writer exited");
        std::thread::yield_now();
    }
    child.0.kill().unwrap(); // SIGKILL
    child.0.wait().unwrap();
    // The target was never touched mid-write: it is the previous snapshot, byte for
    // byte, unless the writer finished a whole save (and rename) first, which is a
    // whole snapshot too.
    let after = std::fs::read(&path).unwrap();
    let snapshot = read_bytes(&after).unwrap();
    if after != before {
        assert_eq!(snapshot.entries.len(), 3_000, "a renamed snapshot is whole");
    }
    // The killed save's temporary is left, and removed by the next load once it has
    // gone unmodified long enough to belong to no save starting up (its lock died with
    // the writer).
    let leftovers = || {
        let entries = std::fs::read_dir(&dir).unwrap().flatten();
        entries.filter(|e| e.file_name().to_string_lossy().starts_with(&prefix)).count()
    };
    assert!(leftovers() <= 1, "one save at a time: at most one temporary");
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            age(&entry.path(), Duration::from_secs(120));
        }
    }
    let (restarted, _clock) = manual();
    let loaded = SnapshotFile::new(&path).load(&restarted, Load::Strict).unwrap();
    #[cfg(target_os = "linux")]
    assert_eq!(leftovers(), 0, "the killed save's temporary is removed");
    assert_eq!(loaded.inserted + loaded.no_room, snapshot.entries.len());
    assert!(matches!(
        snapshot.entries.iter().find(|e| e.key == key("kept")).map(|e| &e.state),
        Some(SnapshotState::Completed { .. }) | None
    ));
}

#[test]
fn a_lease_that_lapsed_under_mark_unknown_is_unknown_after_a_restart() {
    let path = scratch("lapsed");
    let clock = ManualClock::new();
    let cache = Cache::builder()
        .clock(clock.clone())
        .lapse_policy(idemcache::LapsePolicy::MarkUnknown { ttl: Duration::from_secs(24 * 3600) })
        .build()
        .unwrap();
    match cache.claim(&key("charge"), fp("charge")).unwrap() {
        Claim::Acquired(guard) => std::mem::forget(guard), // the owner hangs
        other => panic!("{other:?}"),
    }
    clock.advance(Duration::from_secs(120)); // past the lease: UNKNOWN, nobody read it yet
    let saved = SnapshotFile::new(&path).save(&cache).unwrap();
    assert_eq!(saved.entries, 1, "the lapse is written, as the UNKNOWN it is");
    let (restarted, _clock) = manual();
    SnapshotFile::new(&path).load(&restarted, Load::Strict).unwrap();
    assert!(matches!(
        restarted.claim(&key("charge"), fp("charge")).unwrap(),
        Claim::Unknown { .. }
    ));
}

#[test]
fn saves_racing_to_one_path_each_leave_a_whole_snapshot() {
    let path = scratch("racing");
    let (small, _c) = filled();
    let big = Cache::builder().build().unwrap();
    for i in 0..2_000 {
        complete(&big, &format!("big-{i}"), &[1u8; 60]);
    }
    for round in 0..10 {
        std::thread::scope(|s| {
            let a = s.spawn(|| SnapshotFile::new(&path).save(&small));
            let b = s.spawn(|| SnapshotFile::new(&path).save(&big));
            a.join().unwrap().unwrap();
            b.join().unwrap().unwrap();
        });
        let snapshot = read_bytes(&std::fs::read(&path).unwrap())
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!([4, 2_000].contains(&snapshot.entries.len()), "round {round}: a mix");
    }
}

#[cfg(unix)]
#[test]
fn the_file_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let path = scratch("mode");
    let (cache, _clock) = filled();
    SnapshotFile::new(&path).save(&cache).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
}

/// A cache too small for a snapshot keeps its UNKNOWN marks, evicting results for them
/// as a claim would: a mark left out would let its key run again with nobody knowing
/// whether the first run happened.
#[test]
fn a_cache_too_small_for_the_snapshot_keeps_its_marks_first() {
    let path = scratch("marks-first");
    let (cache, _clock) = manual();
    for i in 0..8 {
        complete(&cache, &format!("done-{i}"), b"r");
    }
    for i in 0..4 {
        match cache.claim(&key(&format!("unknown-{i}")), fp("u")).unwrap() {
            Claim::Acquired(guard) => guard.mark_unknown().unwrap(),
            other => panic!("{other:?}"),
        }
    }
    SnapshotFile::new(&path).save(&cache).unwrap();

    let small = Cache::builder().shards(1).max_entries(4).build().unwrap();
    let loaded = SnapshotFile::new(&path).load(&small, Load::Strict).unwrap();
    assert_eq!(loaded.expired, 0);
    for i in 0..4 {
        let k = key(&format!("unknown-{i}"));
        assert!(matches!(small.claim(&k, fp("u")).unwrap(), Claim::Unknown { .. }), "{i}");
    }
}

/// Sets `path`'s modification time `by` into the past.
pub(crate) fn age(path: &std::path::Path, by: Duration) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::now() - by).unwrap();
}

/// A cache whose bound is taken by marks (never evicted) has no room for the results
/// that come after them: they are counted as such, not as expired.
#[test]
fn results_that_find_no_room_are_counted_as_such() {
    let path = scratch("no-room");
    let (cache, _clock) = manual();
    for i in 0..4 {
        match cache.claim(&key(&format!("unknown-{i}")), fp("u")).unwrap() {
            Claim::Acquired(guard) => guard.mark_unknown().unwrap(),
            other => panic!("{other:?}"),
        }
    }
    SnapshotFile::new(&path).save(&cache).unwrap();
    let full = Cache::builder().shards(1).max_entries(4).build().unwrap();
    SnapshotFile::new(&path).load(&full, Load::Strict).unwrap();
    complete(&cache, "done", b"r");
    SnapshotFile::new(&path).save(&cache).unwrap();
    let loaded = SnapshotFile::new(&path).load(&full, Load::Strict).unwrap();
    assert_eq!((loaded.inserted, loaded.occupied, loaded.no_room, loaded.expired), (0, 4, 1, 0));
}

/// A claim still executing when the snapshot is taken, under `LapsePolicy::MarkUnknown`
/// with a day's `ttl` and a guard's `unknown_ttl` of one second: its holder is gone after
/// the restart, so its lease lapses there, and a lapse's UNKNOWN is kept the policy's
/// `ttl` (CHANGELOG: the cache's `unknown_ttl` keeps only what a guard marks). Two
/// seconds after the restart the key must not be claimable (it would run again).
#[test]
fn a_claim_executing_at_a_save_under_mark_unknown_is_kept_the_lapse_ttl() {
    let path = scratch("executing-marking");
    let day = Duration::from_secs(24 * 3600);
    let marking = |clock: &ManualClock| {
        Cache::builder()
            .clock(clock.clone())
            .unknown_ttl(Duration::from_secs(1))
            .lapse_policy(idemcache::LapsePolicy::MarkUnknown { ttl: day })
            .build()
            .unwrap()
    };
    let clock = ManualClock::new();
    let cache = marking(&clock);
    match cache.claim(&key("charge"), fp("charge")).unwrap() {
        Claim::Acquired(guard) => std::mem::forget(guard), // executing at the save
        other => panic!("{other:?}"),
    }
    // Without a restart: in progress, then UNKNOWN from the lease's end for a day.
    clock.advance(Duration::from_secs(2));
    assert!(matches!(cache.claim(&key("charge"), fp("charge")).unwrap(), Claim::InProgress { .. }));
    SnapshotFile::new(&path).save(&cache).unwrap();
    let restarted_clock = ManualClock::new();
    let restarted = marking(&restarted_clock);
    SnapshotFile::new(&path).load(&restarted, Load::Strict).unwrap();
    restarted_clock.advance(Duration::from_secs(2));
    match restarted.claim(&key("charge"), fp("charge")).unwrap() {
        Claim::Unknown { .. } => {}
        other => panic!("the execution in flight at the save must not run again: {other:?}"),
    }
}
