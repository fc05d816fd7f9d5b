//! The temporary files a save writes beside its target, and the removal of those a
//! killed save left behind.
//!
//! Invariant: a temporary is removed only when no save can still be writing it. A save
//! holds an exclusive `flock` on its temporary from just after creating it until the
//! file is renamed or removed, and a lock dies with its process (`kill -9` included),
//! so a temporary that can be locked belongs to no running save. A save between
//! creating its file and locking it is protected by the file's age: a temporary
//! modified within [`STALE_AFTER`] is left alone whatever its lock says. Where locks
//! are not available (outside Linux) nothing is removed.
//!
//! Only what a save could have left is a candidate: a regular file (never a directory,
//! a link or a FIFO, which opening for the lock check could block on) named exactly as
//! [`name_for`] names one, `target.tmp-PID-N-NANOS` in digits, so that a file of
//! another program or another snapshot whose name merely starts alike is never taken
//! for one. A target with no file name has no temporaries.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How long a temporary must have gone unmodified before it may be removed: far longer
/// than a save takes between creating its file and locking it (two system calls).
pub(super) const STALE_AFTER: Duration = Duration::from_secs(60);

/// `target.tmp-PID-N-NANOS`, beside the target (the rename stays on one filesystem), a
/// name of its own for every save: two saves at once (two threads, or two containers
/// whose processes are both PID 1) each write a file of their own, and the later rename
/// wins whole.
pub(super) fn name_for(target: &Path) -> PathBuf {
    static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let mut name = prefix(target).unwrap_or_else(|| ".tmp-".into());
    name.push(format!("{}-{n}-{}", std::process::id(), nanos.subsec_nanos()));
    target.with_file_name(name)
}

/// What every temporary of `target` is named starting with; `None` for a target with
/// no file name (`dir/..`), which no save can rename a temporary to.
fn prefix(target: &Path) -> Option<std::ffi::OsString> {
    let mut name = target.file_name()?.to_owned();
    name.push(".tmp-");
    Some(name)
}

/// Whether `name` is `prefix` then `PID-N-NANOS` in digits, as [`name_for`] names a
/// temporary.
fn is_temporary_name(name: &[u8], prefix: &[u8]) -> bool {
    name.strip_prefix(prefix).is_some_and(|rest| {
        let parts: Vec<&[u8]> = rest.split(|b| *b == b'-').collect();
        parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.iter().all(u8::is_ascii_digit))
    })
}

/// Marks `file` as a save in progress: the lock is held until the file is closed.
/// Best effort: a filesystem that refuses locks (NFS mounted `nolock`) refuses the
/// cleanup's lock too, so its temporaries are never taken for stale, and the save goes
/// on rather than failing for a lock that only serves the cleanup.
pub(super) fn hold(file: &File) {
    #[cfg(target_os = "linux")]
    let _ = rustix::fs::flock(file, rustix::fs::FlockOperation::NonBlockingLockExclusive);
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// Removes the temporaries of `target` that no save is writing (see the module docs).
/// Best effort: a directory or file that cannot be read is passed
/// over, as a leftover costs disk space, never correctness.
pub(super) fn remove_stale(target: &Path) {
    let dir = match target.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let Some(prefix) = prefix(target) else { return };
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        // `file_type` does not follow a link: a link named like a temporary is left.
        if is_temporary_name(name.as_encoded_bytes(), prefix.as_encoded_bytes())
            && entry.file_type().is_ok_and(|t| t.is_file())
            && is_stale(&entry.path())
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(target_os = "linux")]
fn is_stale(path: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    // Never blocking, never following a link: the name may have been replaced by a
    // FIFO or a link since it was listed.
    let flags = rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOFOLLOW;
    let opened = File::options().read(true).custom_flags(flags.bits() as i32).open(path);
    let Ok(file) = opened else { return false };
    let Ok(metadata) = file.metadata() else { return false };
    let Ok(modified) = metadata.modified() else { return false };
    if !metadata.is_file() {
        return false;
    }
    let idle = SystemTime::now().duration_since(modified).unwrap_or_default();
    // Locked by nobody: the lock is released as `file` closes, and a save that locks
    // it after this is one whose file was already `STALE_AFTER` old, which none is.
    let lock = rustix::fs::FlockOperation::NonBlockingLockExclusive;
    idle >= STALE_AFTER && rustix::fs::flock(&file, lock).is_ok()
}

#[cfg(not(target_os = "linux"))]
fn is_stale(_: &Path) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temporary_name_is_the_prefix_then_three_numbers() {
        let name = name_for(Path::new("/d/cache.snap"));
        let name = name.file_name().unwrap().as_encoded_bytes().to_vec();
        let prefix = b"cache.snap.tmp-";
        assert!(is_temporary_name(&name, prefix), "{}", String::from_utf8_lossy(&name));
        for other in [
            &b"cache.snap.tmp-1-2"[..],
            b"cache.snap.tmp-1-2-3-4",
            b"cache.snap.tmp-1--3",
            b"cache.snap.tmp-1-2-x",
            b"cache.snap.tmp-archive",
            b"other.snap.tmp-1-2-3",
        ] {
            assert!(!is_temporary_name(other, prefix), "{}", String::from_utf8_lossy(other));
        }
    }
}
