//! Snapshots of a [`Cache`] for warm restarts: its COMPLETED and UNKNOWN entries written
//! to a file, and loaded into a new cache at start.
//!
//! ```
//! use idemcache::snapshot::{Load, SnapshotFile};
//! use idemcache::{Cache, Claim, Fingerprint, Key};
//!
//! let path = std::env::temp_dir().join(format!("idemcache-doc-{}.snap", std::process::id()));
//! let cache = Cache::builder().build()?;
//! let key = Key::new("POST /orders", "user:1", "k1")?;
//! if let Claim::Acquired(guard) = cache.claim(&key, Fingerprint::of(b"req"))? {
//!     guard.complete(&b"order 1"[..])?;
//! }
//! let mut file = SnapshotFile::new(&path);
//! file.save(&cache)?; // at shutdown, or every few minutes
//!
//! let restarted = Cache::builder().build()?;
//! let loaded = SnapshotFile::new(&path).load(&restarted, Load::Strict)?;
//! assert_eq!(loaded.inserted, 1);
//! assert!(matches!(restarted.claim(&key, Fingerprint::of(b"req"))?, Claim::Completed(_)));
//! # std::fs::remove_file(&path)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Invariants:
//! - **Atomic replacement.** A save writes a temporary file beside the target, fsyncs it,
//!   renames it over the target and fsyncs the directory, so a crash at any instant
//!   leaves the previous snapshot or the new one, whole; never a mix. A failed save
//!   returns its error and changes nothing else: the cache goes on serving (unlike
//!   Redis's default, which refuses writes after a failed save).
//! - **All or nothing on load.** The file is checked whole (its format version and a
//!   checksum over every byte) before any entry is inserted: a corrupt, truncated or
//!   foreign file inserts nothing, and is a typed [`SnapshotError`] under
//!   [`Load::Strict`] or an empty start with the reason under [`Load::Quiet`].
//! - **Times are wall-clock.** Each entry keeps its own deadline as a wall-clock time:
//!   a cache loaded an hour later has an hour less of every TTL, and what expired while
//!   it was down is not loaded. A deadline further ahead than the cache can keep (a
//!   wall clock stepped back since the save) is kept as far as it can be, and counted
//!   in [`Loaded::clamped`]: only its own expiry drops a fact. PROCESSING entries are
//!   written as UNKNOWN (marked when the snapshot was taken, kept the cache's
//!   `unknown_ttl`, and under `LapsePolicy::MarkUnknown { ttl }` at least `ttl` past
//!   the lease's end, as the lapse would have kept them): their holder will not settle
//!   them in the next process, and nobody knows whether the effect happened.
//! - **A snapshot never overrides.** Loading uses [`Cache::insert`]: original times
//!   kept, and an entry the cache already holds live is kept, not replaced.
//!
//! **Under load**: a save copies one shard at a time under that shard's lock (each
//! shard a consistent instant; results are shared, not copied) and writes the file
//! with no lock held, so claims on other shards never wait for it, and a claim on the
//! shard being copied waits for that copy only. A writer concurrent with a save may or
//! may not be in it: a change to a shard already copied is not; one to a shard not yet
//! copied is. The snapshot as a whole is therefore not one instant of the cache, only
//! each shard is; nothing in it is ever half-written.
//!
//! **Over `Tiered`** (`idemcache::store::Tiered`, feature `store`) the store is the authority and a snapshot
//! only a hint, which cannot resurrect what the store dropped or changed: `Tiered`
//! answers from memory only COMPLETED results, and the `Store` trait never changes a
//! COMPLETED record before its TTL ends (a completion is final, `resolve` and `forget`
//! act on UNKNOWN records only); an entry keeps its deadline from the store's TTL, so it
//! expires from the loaded cache no later than the store purges it. UNKNOWN entries are
//! asked of the store again on every claim. Deleting a COMPLETED record outside the
//! trait (`SqliteStore::remove_record`, `idem forget --force`, a `DELETE` by hand) is the
//! exception: a snapshot taken before it would answer it again, so do not load one. Load a snapshot into the cache you give `Tiered`, before
//! it serves; its entries are in `Tiered`'s own format there.
//!
//! The file format (version 2; version 1 files are still read) is documented at
//! [`read_bytes`].

mod format;
mod temporary;

use std::fs::{File, OpenOptions};
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub use format::Snapshot;

use crate::{Bytes, Cache, CorrelationId, Fingerprint, InsertError, Key, Outcome};

/// One entry of a snapshot, with wall-clock times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotEntry {
    /// Its key.
    pub key: Key,
    /// The fingerprint of the request that claimed it.
    pub fingerprint: Fingerprint,
    /// What was known of it.
    pub state: SnapshotState,
    /// The correlation id its claim was given
    /// ([`Cache::claim_correlated`](crate::Cache::claim_correlated)); `None` when none
    /// was, and for every entry of a version-1 file.
    pub correlation_id: Option<CorrelationId>,
}

/// What a snapshot knew of an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotState {
    /// Completed: repeats replay `body` (`None`: completed, result not kept).
    Completed {
        /// The stored result.
        body: Option<Bytes>,
        /// When it completed.
        completed_at: SystemTime,
        /// When the result stops being replayed.
        expires_at: SystemTime,
    },
    /// The outcome is unknown to whoever loads the snapshot: marked UNKNOWN, or in flight
    /// when the snapshot was taken (then marked at that instant: its holder will not
    /// settle it in the process that loads it). The file does not tell the two apart.
    Unknown {
        /// When it was marked unknown.
        marked_at: SystemTime,
        /// When the mark expires.
        expires_at: SystemTime,
    },
}

/// Why a snapshot could not be written or read. A failed load inserted nothing.
#[derive(Debug)]
#[non_exhaustive]
pub enum SnapshotError {
    /// Reading, writing, syncing or renaming a file failed.
    Io {
        /// What was being done, naming the file.
        doing: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The file is not a snapshot (it does not start with the snapshot magic).
    NotASnapshot,
    /// A snapshot of a format version this crate does not read.
    UnsupportedVersion(u16),
    /// The file ends before its header and trailer do.
    Truncated,
    /// The checksum over the file does not match: a truncation or a changed byte.
    Checksum,
    /// The checksum matches but the entries do not parse (the message says where).
    Corrupt(String),
}

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotError::Io { doing, source } => write!(f, "{doing}: {source}"),
            SnapshotError::NotASnapshot => f.write_str("not an idemcache snapshot"),
            SnapshotError::UnsupportedVersion(v) => write!(
                f,
                "a snapshot of format version {v}; this build reads versions {} and {}",
                format::VERSION_WITHOUT_CORRELATION,
                format::VERSION
            ),
            SnapshotError::Truncated => f.write_str("the snapshot is truncated"),
            SnapshotError::Checksum => {
                f.write_str("the snapshot's checksum does not match (truncated or damaged)")
            }
            SnapshotError::Corrupt(why) => write!(f, "the snapshot is corrupt: {why}"),
        }
    }
}

impl std::error::Error for SnapshotError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SnapshotError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// How [`SnapshotFile::load`] treats a file it cannot use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Refuse: the error is returned (and nothing inserted). A missing file is an error
    /// too.
    Strict,
    /// Start empty and say why in [`Loaded::refused`]: for a service that must start
    /// whatever its last snapshot looks like. A missing file is an empty start.
    Quiet,
}

/// What a save wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    /// The snapshot's generation.
    pub generation: u64,
    /// Entries written.
    pub entries: u64,
    /// The file's size in bytes.
    pub bytes: u64,
}

/// What a load did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Loaded {
    /// The loaded snapshot's generation (`None`: nothing was read).
    pub generation: Option<u64>,
    /// When it was written.
    pub written_at: Option<SystemTime>,
    /// Entries inserted.
    pub inserted: usize,
    /// Of those inserted, entries whose deadline lay further ahead than
    /// [`MAX_DURATION`](crate::MAX_DURATION) from now (the wall clock stepped back
    /// since the save, or the snapshot came from a cache with longer TTLs): kept until
    /// `now + MAX_DURATION`, the furthest the cache can keep anything. A fact that did
    /// not expire is never dropped for its deadline being too far ahead.
    pub clamped: usize,
    /// Entries that expired while the cache was down: not loaded.
    pub expired: usize,
    /// Entries whose key the cache already holds live: the live entry was kept.
    pub occupied: usize,
    /// Entries the cache had no room for (its bounds are smaller than the snapshot).
    /// A mark finds room by evicting results, as a claim does, and is never evicted
    /// for a later entry: results are the ones left out.
    pub no_room: usize,
    /// Under [`Load::Quiet`]: why the file was not used (nothing was inserted then).
    pub refused: Option<SnapshotError>,
}

/// A snapshot file: saves replace it atomically, loads read it strictly. Generations
/// count up from the one this handle loaded (or 1): load before you save, or a new
/// handle's first save is generation 1 again. A symbolic link at the path is replaced
/// by the snapshot (the rename does not follow it). The file is created readable by its
/// owner only (mode 0600 on Unix): it holds every stored result. On Linux, a save and a
/// load first remove the temporaries (`path.tmp-*`) that saves killed mid-write left
/// behind, once no process holds them and they have gone a minute unmodified.
#[derive(Debug, Clone)]
pub struct SnapshotFile {
    path: PathBuf,
    next_generation: u64,
    wall_clock: fn() -> SystemTime,
}

impl SnapshotFile {
    /// The snapshot at `path`; nothing is read or written yet.
    pub fn new(path: impl AsRef<Path>) -> SnapshotFile {
        let path = path.as_ref().to_owned();
        SnapshotFile { path, next_generation: 1, wall_clock: SystemTime::now }
    }

    /// Reads "now" on the wall clock from `clock` instead of [`SystemTime::now`], which
    /// ties the cache's times to wall-clock times on save and back on load: for tests
    /// that drive a [`ManualClock`](crate::ManualClock) across a simulated restart.
    pub fn wall_clock(mut self, clock: fn() -> SystemTime) -> SnapshotFile {
        self.wall_clock = clock;
        self
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `cache`'s live COMPLETED and UNKNOWN entries (and PROCESSING ones, as
    /// UNKNOWN) to the file, replacing it atomically (see the module docs).
    pub fn save(&mut self, cache: &Cache) -> Result<Saved, SnapshotError> {
        temporary::remove_stale(&self.path);
        let generation = self.next_generation;
        let temporary = self.temporary();
        let written = self.write(cache, generation, &temporary);
        // `_held` keeps the temporary locked through the rename (see `temporary`).
        let saved = written.and_then(|(saved, _held)| {
            let doing = format!("renaming {} to {}", temporary.display(), self.path.display());
            std::fs::rename(&temporary, &self.path).map_err(|e| io(doing, e))?;
            sync_directory(&self.path)?;
            Ok(saved)
        });
        if saved.is_err() {
            let _ = std::fs::remove_file(&temporary);
        } else {
            self.next_generation = generation + 1;
        }
        saved
    }

    fn temporary(&self) -> PathBuf {
        temporary::name_for(&self.path)
    }

    /// Writes the snapshot to `to` and syncs it; returns the file still open, so that
    /// its lock holds until the caller has renamed it.
    fn write(
        &self,
        cache: &Cache,
        generation: u64,
        to: &Path,
    ) -> Result<(Saved, File), SnapshotError> {
        let doing = || format!("writing the snapshot {}", to.display());
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        // Results are what the cache's users were answered: readable by their owner only.
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file = options.open(to).map_err(|e| io(doing(), e))?;
        temporary::hold(&file);
        let wall = (self.wall_clock)();
        let out = BufWriter::with_capacity(1 << 16, file);
        let mut encoder =
            format::Encoder::new(out, generation, wall).map_err(|e| io(doing(), e))?;
        for shard in 0..cache.shard_count() {
            let now = cache.now();
            for (key, fingerprint, known, correlation_id) in cache.export_shard(shard) {
                let state = to_wall(known, now, wall);
                encoder
                    .entry(&SnapshotEntry { key, fingerprint, state, correlation_id })
                    .map_err(|e| io(doing(), e))?;
            }
        }
        let (out, entries) = encoder.finish().map_err(|e| io(doing(), e))?;
        let file = out.into_inner().map_err(|e| io(doing(), e.into_error()))?;
        file.sync_all().map_err(|e| io(format!("syncing {}", to.display()), e))?;
        let bytes = file.metadata().map(|m| m.len()).unwrap_or_default();
        Ok((Saved { generation, entries, bytes }, file))
    }

    /// Loads the file into `cache` (see the module docs and [`Load`]). Entries are
    /// inserted only after the whole file was read and checked.
    pub fn load(&mut self, cache: &Cache, mode: Load) -> Result<Loaded, SnapshotError> {
        temporary::remove_stale(&self.path);
        let read = std::fs::read(&self.path)
            .map_err(|e| (e.kind(), io(format!("reading the snapshot {}", self.path.display()), e)))
            .and_then(|bytes| read_bytes(&bytes).map_err(|e| (std::io::ErrorKind::Other, e)));
        let snapshot = match (read, mode) {
            (Ok(snapshot), _) => snapshot,
            (Err((_, e)), Load::Strict) => return Err(e),
            (Err((std::io::ErrorKind::NotFound, _)), Load::Quiet) => return Ok(Loaded::default()),
            (Err((_, e)), Load::Quiet) => {
                return Ok(Loaded { refused: Some(e), ..Loaded::default() })
            }
        };
        self.next_generation = self.next_generation.max(snapshot.generation.saturating_add(1));
        let mut loaded = Loaded {
            generation: Some(snapshot.generation),
            written_at: Some(snapshot.written_at),
            ..Loaded::default()
        };
        let wall = (self.wall_clock)();
        for entry in snapshot.entries {
            let (known, clamped) = from_wall(entry.state, cache, wall);
            let correlation_id = entry.correlation_id.as_ref();
            match cache.insert_correlated(&entry.key, entry.fingerprint, known, correlation_id) {
                Ok(()) => {
                    loaded.inserted += 1;
                    loaded.clamped += usize::from(clamped);
                }
                Err(InsertError::Occupied(_)) => loaded.occupied += 1,
                Err(InsertError::CapacityExhausted) => loaded.no_room += 1,
                // `from_wall` keeps the times within what `insert` takes (a mark or a
                // completion at or before now, a deadline within MAX_DURATION), so the
                // one refusal left is a deadline that passed.
                Err(
                    InsertError::Expired | InsertError::StartsInTheFuture | InsertError::TtlTooLong,
                ) => loaded.expired += 1,
            }
        }
        Ok(loaded)
    }
}

/// Reads a snapshot from its bytes, strictly: the format version, the checksum over
/// the whole file, then every entry; any problem is an error and no entry is returned.
/// What [`SnapshotFile::load`] does before inserting, for tools that inspect a file.
///
/// Format version 2 (integers big-endian, times µs since the Unix epoch):
///
/// ```text
/// header   "IDEMSNAP"  u16 version = 2  u16 flags = 0  u64 generation  u64 written_at
/// entries  u8 tag (1 COMPLETED with body, 2 COMPLETED without, 3 UNKNOWN),
///          u32 key length, the key's bytes (Key::as_bytes), 16 fingerprint bytes,
///          u64 since (completed or marked), u64 expires,
///          u8 correlation id length (0: none), its bytes,
///          and for tag 1: u32 length, body
/// end      u8 0, u64 entry count, u64 xxh3-64 of every byte before it
/// ```
///
/// Version 1, written before entries kept correlation ids, is version 2 without the
/// correlation id's length and bytes; it is still read (its entries have none).
pub fn read_bytes(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
    format::decode(bytes)
}

fn io(doing: String, source: std::io::Error) -> SnapshotError {
    SnapshotError::Io { doing, source }
}

/// Makes a rename in `path`'s directory durable: without it, a power cut after the
/// rename can bring back the old name's file.
fn sync_directory(path: &Path) -> Result<(), SnapshotError> {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let doing = || format!("syncing the directory {}", dir.display());
        File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io(doing(), e))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// A cache's fact as wall-clock times: `now` on the cache's clock is `wall`.
fn to_wall(known: Outcome, now: crate::Timestamp, wall: SystemTime) -> SnapshotState {
    let at = |ts: crate::Timestamp| {
        let moved = if ts >= now {
            wall.checked_add(ts.saturating_duration_since(now))
        } else {
            wall.checked_sub(now.saturating_duration_since(ts))
        };
        moved.unwrap_or(wall)
    };
    match known {
        Outcome::Completed { body, completed_at, expires_at } => SnapshotState::Completed {
            body,
            completed_at: at(completed_at),
            expires_at: at(expires_at),
        },
        Outcome::Unknown { marked_at, expires_at } => {
            SnapshotState::Unknown { marked_at: at(marked_at), expires_at: at(expires_at) }
        }
    }
}

/// A snapshot's fact on `cache`'s clock, whose now is `wall`, and whether its deadline
/// was clamped. Times before the clock's origin read as its origin (a completion long ago
/// is still at or before now); a deadline further ahead than the cache can keep (the
/// wall clock stepped back since the save) is kept as far as it can be: the fact did
/// not expire, and dropping it would let its key execute again.
fn from_wall(state: SnapshotState, cache: &Cache, wall: SystemTime) -> (Outcome, bool) {
    let now = cache.now();
    let at = |t: SystemTime| match t.duration_since(wall) {
        Ok(ahead) => now.saturating_add(ahead),
        Err(behind) => now.saturating_sub(behind.duration()),
    };
    let furthest = now.saturating_add(crate::MAX_DURATION);
    let deadline = |t: SystemTime| {
        let deadline = at(t);
        (deadline.min(furthest), deadline > furthest)
    };
    match state {
        SnapshotState::Completed { body, completed_at, expires_at } => {
            let (expires_at, clamped) = deadline(expires_at);
            let completed_at = at(completed_at).min(now);
            (Outcome::Completed { body, completed_at, expires_at }, clamped)
        }
        SnapshotState::Unknown { marked_at, expires_at } => {
            let (expires_at, clamped) = deadline(expires_at);
            (Outcome::Unknown { marked_at: at(marked_at).min(now), expires_at }, clamped)
        }
    }
}
