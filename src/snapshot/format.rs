//! The snapshot file format, version 2 (laid out in [`read_bytes`](super::read_bytes)'s
//! docs): encoding and strict decoding, no I/O. Version 1 (without correlation ids) is
//! still read, so a snapshot written before an upgrade loads after it. One byte of
//! length is enough for a correlation id: it is at most
//! [`MAX_CORRELATION_ID_LEN`](crate::MAX_CORRELATION_ID_LEN) (128) bytes.
//!
//! Integers are big-endian; times are microseconds since the Unix epoch, wall clock
//! (a snapshot outlives the process whose monotonic clock timed its entries).
//!
//! Invariant: [`decode`] accepts exactly what [`Encoder`] writes. It checks the whole
//! file's checksum before reading any entry, then every length against what is left,
//! every key as [`Key::from_bytes`] does, and the entry count; anything else (a foreign
//! file, a later version, a truncation at any byte, a flipped bit) is a typed error and
//! yields no entry at all, never a panic or an allocation larger than the input.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use xxhash_rust::xxh3::Xxh3;

use super::{SnapshotEntry, SnapshotError, SnapshotState};
use crate::{CorrelationId, Fingerprint, Key};

/// The first eight bytes of every snapshot.
pub(crate) const MAGIC: &[u8; 8] = b"IDEMSNAP";
/// The format this crate writes.
pub(crate) const VERSION: u16 = 2;
/// The earlier format it still reads: entries without correlation ids.
pub(crate) const VERSION_WITHOUT_CORRELATION: u16 = 1;
// The correlation id's length is one byte.
const _: () = assert!(crate::MAX_CORRELATION_ID_LEN <= u8::MAX as usize);
const HEADER: usize = 8 + 2 + 2 + 8 + 8;
/// The end tag, the count and the checksum.
const TRAILER: usize = 1 + 8 + 8;

const END: u8 = 0;
const COMPLETED: u8 = 1;
const COMPLETED_WITHOUT_BODY: u8 = 2;
const UNKNOWN: u8 = 3;

fn micros(at: SystemTime) -> u64 {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
}

fn time(micros: u64) -> SystemTime {
    UNIX_EPOCH.checked_add(Duration::from_micros(micros)).unwrap_or(UNIX_EPOCH)
}

/// Writes a snapshot to `out` entry by entry, hashing as it goes, so a large cache is
/// never held twice in memory.
pub(crate) struct Encoder<W> {
    out: W,
    hash: Xxh3,
    count: u64,
}

impl<W: std::io::Write> Encoder<W> {
    /// Starts a snapshot of `generation`, written at `written_at`.
    pub(crate) fn new(out: W, generation: u64, written_at: SystemTime) -> std::io::Result<Self> {
        let mut encoder = Encoder { out, hash: Xxh3::new(), count: 0 };
        let mut header = Vec::with_capacity(HEADER);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&VERSION.to_be_bytes());
        header.extend_from_slice(&0u16.to_be_bytes());
        header.extend_from_slice(&generation.to_be_bytes());
        header.extend_from_slice(&micros(written_at).to_be_bytes());
        encoder.write(&header)?;
        Ok(encoder)
    }

    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.hash.update(bytes);
        self.out.write_all(bytes)
    }

    /// Appends one entry.
    pub(crate) fn entry(&mut self, entry: &SnapshotEntry) -> std::io::Result<()> {
        let (tag, since, expires, body) = match &entry.state {
            SnapshotState::Completed { body: Some(body), completed_at, expires_at } => {
                (COMPLETED, *completed_at, *expires_at, Some(body))
            }
            SnapshotState::Completed { body: None, completed_at, expires_at } => {
                (COMPLETED_WITHOUT_BODY, *completed_at, *expires_at, None)
            }
            SnapshotState::Unknown { marked_at, expires_at } => {
                (UNKNOWN, *marked_at, *expires_at, None)
            }
        };
        let key = entry.key.as_bytes();
        let mut head = Vec::with_capacity(1 + 4 + key.len() + 16 + 16 + 4);
        head.push(tag);
        head.extend_from_slice(&len32(key.len())?.to_be_bytes());
        head.extend_from_slice(key);
        head.extend_from_slice(&entry.fingerprint.to_bytes());
        head.extend_from_slice(&micros(since).to_be_bytes());
        head.extend_from_slice(&micros(expires).to_be_bytes());
        let corr = entry.correlation_id.as_ref().map_or(&[][..], |id| id.as_str().as_bytes());
        // A CorrelationId is at most MAX_CORRELATION_ID_LEN bytes, which fits (above).
        head.push(corr.len() as u8);
        head.extend_from_slice(corr);
        if let Some(body) = body {
            head.extend_from_slice(&len32(body.len())?.to_be_bytes());
            self.write(&head)?;
            self.write(body)?;
        } else {
            self.write(&head)?;
        }
        self.count += 1;
        Ok(())
    }

    /// Writes the end tag, the count and the checksum; returns the writer and the count.
    pub(crate) fn finish(mut self) -> std::io::Result<(W, u64)> {
        let mut end = Vec::with_capacity(9);
        end.push(END);
        end.extend_from_slice(&self.count.to_be_bytes());
        self.write(&end)?;
        let sum = self.hash.digest();
        self.out.write_all(&sum.to_be_bytes())?;
        Ok((self.out, self.count))
    }
}

fn len32(n: usize) -> std::io::Result<u32> {
    u32::try_from(n).map_err(|_| std::io::Error::other("an entry over 4 GiB cannot be written"))
}

/// A snapshot read whole: its header, and its entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The generation its writer gave it (one more than the snapshot it replaced).
    pub generation: u64,
    /// When it was written (the writer's wall clock).
    pub written_at: SystemTime,
    /// Its entries, in the order written (shard by shard).
    pub entries: Vec<SnapshotEntry>,
}

/// Reads a snapshot file's bytes, strictly (see the module docs).
pub(crate) fn decode(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        let short = bytes.len() < MAGIC.len() && MAGIC.starts_with(bytes);
        return Err(if short { SnapshotError::Truncated } else { SnapshotError::NotASnapshot });
    }
    if bytes.len() < MAGIC.len() + 2 {
        return Err(SnapshotError::Truncated);
    }
    let version = u16::from_be_bytes([bytes[8], bytes[9]]);
    if version != VERSION && version != VERSION_WITHOUT_CORRELATION {
        return Err(SnapshotError::UnsupportedVersion(version));
    }
    if bytes.len() < HEADER + TRAILER {
        return Err(SnapshotError::Truncated);
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    let stored = u64::from_be_bytes(sum.try_into().map_err(|_| SnapshotError::Truncated)?);
    if xxhash_rust::xxh3::xxh3_64(body) != stored {
        // A truncated file's last eight bytes are not its checksum either: both read so.
        return Err(SnapshotError::Checksum);
    }
    let mut r = Reader { bytes: body, at: MAGIC.len() + 2 };
    let flags = r.u16()?;
    if flags != 0 {
        return Err(r.corrupt(format_args!("unknown flags {flags:#06x}")));
    }
    let generation = r.u64()?;
    let written_at = time(r.u64()?);
    let mut entries = Vec::new();
    loop {
        let at = r.at;
        let tag = r.u8()?;
        if tag == END {
            break;
        }
        if !matches!(tag, COMPLETED | COMPLETED_WITHOUT_BODY | UNKNOWN) {
            return Err(SnapshotError::Corrupt(format!("unknown entry tag {tag} at byte {at}")));
        }
        let key_len = r.u32()? as usize;
        let key = Key::from_bytes(r.take(key_len)?).map_err(|e| {
            SnapshotError::Corrupt(format!("the key of the entry at byte {at}: {e}"))
        })?;
        let fingerprint = Fingerprint::try_from(r.take(16)?)
            .map_err(|_| r.corrupt(format_args!("the fingerprint of the entry at byte {at}")))?;
        let (since, expires) = (time(r.u64()?), time(r.u64()?));
        let correlation_id = if version == VERSION_WITHOUT_CORRELATION {
            None
        } else {
            match r.u8()? {
                0 => None,
                len => Some(CorrelationId::new(r.take(usize::from(len))?).map_err(|e| {
                    SnapshotError::Corrupt(format!(
                        "the correlation id of the entry at byte {at}: {e}"
                    ))
                })?),
            }
        };
        let state = match tag {
            COMPLETED => {
                let len = r.u32()? as usize;
                let body = Some(Bytes::copy_from_slice(r.take(len)?));
                SnapshotState::Completed { body, completed_at: since, expires_at: expires }
            }
            COMPLETED_WITHOUT_BODY => {
                SnapshotState::Completed { body: None, completed_at: since, expires_at: expires }
            }
            _ => SnapshotState::Unknown { marked_at: since, expires_at: expires },
        };
        entries.push(SnapshotEntry { key, fingerprint, state, correlation_id });
    }
    let count = r.u64()?;
    if count != entries.len() as u64 || r.at != body.len() {
        return Err(r.corrupt(format_args!(
            "it says {count} entries and holds {} ending at byte {} of {}",
            entries.len(),
            r.at,
            body.len()
        )));
    }
    Ok(Snapshot { generation, written_at, entries })
}

/// A cursor over the checksummed bytes; every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.bytes.len());
        let end = end.ok_or_else(|| self.corrupt(format_args!("{n} bytes needed")))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, SnapshotError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().unwrap_or_default()))
    }

    fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().unwrap_or_default()))
    }

    fn u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().unwrap_or_default()))
    }

    /// A checksummed file that still does not parse: written by something else that
    /// knew the format, or by a bug.
    fn corrupt(&self, what: std::fmt::Arguments<'_>) -> SnapshotError {
        SnapshotError::Corrupt(format!("{what} at byte {}", self.at))
    }
}
