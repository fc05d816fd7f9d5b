//! Attacks on the removal of a killed save's temporaries (`path.tmp-*`): only a file
//! that is this snapshot's own temporary, that no save holds and that has gone a minute
//! unmodified may be removed, and nothing in the directory may hang or fail a save or a
//! load.

use std::time::{Duration, SystemTime};

use idemcache::snapshot::{Load, SnapshotFile};
use idemcache::{Cache, ManualClock};

use super::{age, complete, filled, manual, scratch};

/// A cache holding one result.
fn cache() -> Cache {
    let (cache, _clock) = manual();
    complete(&cache, "k", b"order 1");
    cache
}

/// A FIFO in the snapshot's directory named like one of its temporaries (left by a
/// tool, or put there by anyone who can write the directory) must not hang a load: a
/// service loading its snapshot at start would never start. The cleanup opens every
/// candidate for reading, and opening a FIFO blocks until a writer comes.
#[test]
fn a_fifo_named_like_a_temporary_does_not_hang_a_load() {
    let path = scratch("fifo");
    SnapshotFile::new(&path).save(&cache()).unwrap();
    let fifo = path.with_file_name("cache.snap.tmp-1-0-0");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    let loading = path.clone();
    std::thread::spawn(move || {
        let empty = Cache::builder().clock(ManualClock::new()).build().unwrap();
        let loaded = SnapshotFile::new(&loading).load(&empty, Load::Strict);
        let _ = done.send(loaded.map(|l| l.inserted).map_err(|e| e.to_string()));
    });
    // A load of one entry takes microseconds; ten seconds without an answer is a hang.
    let answer = finished.recv_timeout(Duration::from_secs(10));
    if answer.is_err() {
        // Let the blocked open return, so the thread ends with the test.
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
            .open(&fifo);
    }
    assert_eq!(answer.expect("the load hung on the FIFO"), Ok(1));
}

/// A snapshot path with no file name (`dir/..`) has no temporaries; its cleanup must
/// not take every `.tmp-*` file of `dir` (other programs' files) for one. The load
/// itself fails (the path is a directory), which is fine; removing files is not.
#[test]
fn a_path_without_a_file_name_removes_nothing() {
    let dir = scratch("no-name").parent().unwrap().join("inner");
    std::fs::create_dir_all(&dir).unwrap();
    let others = dir.join(".tmp-1-2-3");
    std::fs::write(&others, b"not a snapshot's").unwrap();
    age(&others, Duration::from_secs(120));
    let loaded = SnapshotFile::new(dir.join("..")).load(&cache(), Load::Quiet).unwrap();
    assert!(loaded.refused.is_some(), "a directory is no snapshot");
    assert!(others.exists(), "a file of another program was removed");
}

/// Two snapshots side by side, one named like a temporary of the other
/// (`cache.snap` and `cache.snap.tmp-archive`): a save of the first must not remove
/// the second, a finished snapshot nobody holds once it has gone a minute unmodified.
#[test]
fn a_save_keeps_another_snapshot_whose_name_starts_like_a_temporary() {
    let path = scratch("sibling");
    let sibling = path.with_file_name("cache.snap.tmp-archive");
    SnapshotFile::new(&sibling).save(&cache()).unwrap();
    age(&sibling, Duration::from_secs(120));
    SnapshotFile::new(&path).save(&cache()).unwrap();
    assert!(sibling.exists(), "another snapshot was removed as a temporary");
}

/// Held: a directory named like a temporary, however old, fails nothing and is left.
#[test]
fn a_directory_named_like_a_temporary_fails_nothing() {
    let path = scratch("directory");
    let named = path.with_file_name("cache.snap.tmp-1-0-0");
    std::fs::create_dir(&named).unwrap();
    let old = std::fs::File::open(&named).unwrap();
    old.set_modified(SystemTime::now() - Duration::from_secs(120)).unwrap();
    SnapshotFile::new(&path).save(&cache()).unwrap();
    let loaded = SnapshotFile::new(&path).load(&cache(), Load::Strict).unwrap();
    assert_eq!(loaded.occupied, 1);
    assert!(named.is_dir());
}

/// Held: a symbolic link named like a temporary is removed as a link; the old file it
/// points to is left whole.
#[test]
fn a_link_named_like_a_temporary_never_removes_its_target() {
    let path = scratch("link");
    let target = path.with_file_name("precious");
    std::fs::write(&target, b"precious").unwrap();
    age(&target, Duration::from_secs(120));
    let link = path.with_file_name("cache.snap.tmp-1-0-0");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    SnapshotFile::new(&path).save(&cache()).unwrap();
    assert_eq!(std::fs::read(&target).unwrap(), b"precious");
}

/// Held: saves on two handles of one path in threads of one process, each also
/// cleaning up, never remove each other's temporary (each save succeeds).
#[test]
fn concurrent_saves_in_one_process_never_fail_each_other() {
    let path = scratch("threads");
    let cache = std::sync::Arc::new(cache());
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (path, cache) = (path.clone(), cache.clone());
            std::thread::spawn(move || {
                let mut file = SnapshotFile::new(&path);
                for _ in 0..50 {
                    file.save(&cache).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let leftovers = std::fs::read_dir(path.parent().unwrap()).unwrap().count();
    assert_eq!(leftovers, 1, "only the snapshot is left");
}

/// Only a temporary that no save holds and that has gone a minute unmodified is
/// removed: one locked by a running save (however old), one just created (a save
/// between creating and locking it), and files that are not this snapshot's
/// temporaries are left as they are.
#[test]
fn a_save_removes_only_temporaries_no_save_is_writing() {
    let path = scratch("leftovers");
    let dir = path.parent().unwrap();
    let file = |name: &str| dir.join(name);
    for name in ["cache.snap.tmp-1-0-0", "cache.snap.tmp-2-0-0", "cache.snap.tmp-3-0-0"] {
        std::fs::write(file(name), b"part of a snapshot").unwrap();
    }
    std::fs::write(file("other.snap.tmp-4-0-0"), b"another snapshot's").unwrap();
    age(&file("cache.snap.tmp-1-0-0"), Duration::from_secs(120)); // killed long ago
    age(&file("cache.snap.tmp-2-0-0"), Duration::from_secs(120)); // a running save's
    age(&file("other.snap.tmp-4-0-0"), Duration::from_secs(120));
    let running = std::fs::File::open(file("cache.snap.tmp-2-0-0")).unwrap();
    rustix::fs::flock(&running, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();

    let (cache, _clock) = filled();
    SnapshotFile::new(&path).save(&cache).unwrap();
    let left = |name: &str| file(name).exists();
    assert!(!left("cache.snap.tmp-1-0-0"), "a leftover of a killed save is removed");
    assert!(left("cache.snap.tmp-2-0-0"), "a running save's temporary is kept");
    assert!(left("cache.snap.tmp-3-0-0"), "a temporary just created is kept");
    assert!(left("other.snap.tmp-4-0-0"), "another snapshot's temporary is kept");
    let loaded = SnapshotFile::new(&path).load(&manual().0, Load::Strict).unwrap();
    assert_eq!(loaded.inserted, 4, "the save itself is whole");
    drop(running);
}
