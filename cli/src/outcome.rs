//! [`Outcome`]: what a run of CMD left, as it is kept in the key's record and replayed.
//!
//! Invariant: [`Outcome::decode`] reads back exactly what [`Outcome::encode`] wrote
//! (exit status or signal, stdout and stderr byte for byte, the command line), and
//! anything else is an error naming why, never a panic: a record is data from disk.
//!
//! Format, version 1, integers big-endian:
//! `"IDEM" 1 | kind u8 (0 exited, 1 killed by a signal) | code i32 | flags u8 (bit 0:
//! resolved by hand) | argc u32, then argc × (len u32, bytes) | stdout | stderr`, each
//! stream `0, len u64, bytes` (kept) or `1, len u64` (dropped: over the size limit; the
//! length it had).

/// How CMD ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// It exited with this code.
    Exited(i32),
    /// It was killed by this signal.
    Signaled(i32),
}

impl Status {
    /// The exit code `idem` replays it with: the code, or 128+N for signal N.
    pub fn exit_code(self) -> u8 {
        match self {
            Status::Exited(code) => u8::try_from(code.clamp(0, 255)).unwrap_or(u8::MAX),
            Status::Signaled(n) => crate::exit::signal_code(n),
        }
    }

    /// "exit 3", "killed by signal 15 (SIGTERM)".
    pub fn describe(self) -> String {
        match self {
            Status::Exited(code) => format!("exit {code}"),
            Status::Signaled(n) => match signal_hook::low_level::signal_name(n) {
                Some(name) => format!("killed by signal {n} ({name})"),
                None => format!("killed by signal {n}"),
            },
        }
    }
}

/// One output stream of CMD, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stream {
    /// Every byte, kept.
    Kept(Vec<u8>),
    /// Over the size limit: not kept; it had this many bytes.
    Dropped(u64),
}

impl Stream {
    /// How many bytes CMD wrote to it.
    pub fn len(&self) -> u64 {
        match self {
            Stream::Kept(bytes) => bytes.len() as u64,
            Stream::Dropped(len) => *len,
        }
    }

    /// How many bytes its record holds: a tag, a length, and what was kept.
    fn encoded_len(&self) -> usize {
        1 + 8
            + match self {
                Stream::Kept(bytes) => bytes.len(),
                Stream::Dropped(_) => 0,
            }
    }
}

/// What a run left: replayed by every repeat of its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// How CMD ended.
    pub status: Status,
    /// Its standard output.
    pub stdout: Stream,
    /// Its standard error.
    pub stderr: Stream,
    /// CMD and its arguments (empty for an outcome resolved by hand).
    pub argv: Vec<Vec<u8>>,
    /// Set by `idem resolve`, not by a run.
    pub resolved: bool,
}

const MAGIC: &[u8; 4] = b"IDEM";
const VERSION: u8 = 1;
/// The bytes before the command line: magic, version, kind, code, flags, argc.
const HEADER: usize = 4 + 1 + 1 + 4 + 1 + 4;

impl Outcome {
    /// The record's body, in memory of exactly its size: what was kept, never what a
    /// dropped stream's length says CMD wrote (gigabytes, which this process may not be
    /// allowed to reserve, and must not need to, to record that they were dropped).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        let (kind, code) = match self.status {
            Status::Exited(code) => (0, code),
            Status::Signaled(n) => (1, n),
        };
        out.push(kind);
        out.extend_from_slice(&code.to_be_bytes());
        out.push(u8::from(self.resolved));
        out.extend_from_slice(&(self.argv.len() as u32).to_be_bytes());
        for arg in &self.argv {
            out.extend_from_slice(&(arg.len() as u32).to_be_bytes());
            out.extend_from_slice(arg);
        }
        for stream in [&self.stdout, &self.stderr] {
            match stream {
                Stream::Kept(bytes) => {
                    out.push(0);
                    out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
                    out.extend_from_slice(bytes);
                }
                Stream::Dropped(len) => {
                    out.push(1);
                    out.extend_from_slice(&len.to_be_bytes());
                }
            }
        }
        debug_assert_eq!(out.len(), self.encoded_len());
        out
    }

    /// How many bytes [`Outcome::encode`] writes.
    fn encoded_len(&self) -> usize {
        let argv: usize = self.argv.iter().map(|arg| 4 + arg.len()).sum();
        HEADER + argv + self.stdout.encoded_len() + self.stderr.encoded_len()
    }

    /// Reads a record's body back; `Err` says why it is not one.
    pub fn decode(body: &[u8]) -> Result<Outcome, String> {
        let mut r = Reader(body);
        if r.take(4)? != MAGIC {
            return Err("it is not an idem record (no IDEM header)".into());
        }
        match r.u8()? {
            VERSION => {}
            v => {
                return Err(format!("its format version is {v}, this idem reads version {VERSION}"))
            }
        }
        let kind = r.u8()?;
        let code = i32::from_be_bytes(r.array()?);
        let status = match kind {
            0 => Status::Exited(code),
            1 => Status::Signaled(code),
            k => return Err(format!("its status kind is {k}")),
        };
        let flags = r.u8()?;
        if flags > 1 {
            return Err(format!("its flags are {flags:#x}"));
        }
        let argc = u32::from_be_bytes(r.array()?);
        let mut argv = Vec::new();
        for _ in 0..argc {
            let len = u32::from_be_bytes(r.array()?) as usize;
            argv.push(r.take(len)?.to_vec());
        }
        let mut streams = [Stream::Dropped(0), Stream::Dropped(0)];
        for stream in &mut streams {
            let tag = r.u8()?;
            let len = u64::from_be_bytes(r.array()?);
            *stream = match tag {
                0 => Stream::Kept(
                    r.take(usize::try_from(len).map_err(|_| "a stream too long")?)?.to_vec(),
                ),
                1 => Stream::Dropped(len),
                t => return Err(format!("its stream tag is {t}")),
            };
        }
        if !r.0.is_empty() {
            return Err(format!("{} bytes follow its end", r.0.len()));
        }
        let [stdout, stderr] = streams;
        Ok(Outcome { status, stdout, stderr, argv, resolved: flags == 1 })
    }

    /// The command line, for a person: arguments with spaces or quotes quoted.
    pub fn command_line(&self) -> String {
        command_line(&self.argv)
    }
}

/// `argv` as a shell-like line, for messages.
pub fn command_line(argv: &[Vec<u8>]) -> String {
    let words: Vec<String> = argv
        .iter()
        .map(|arg| {
            let arg = String::from_utf8_lossy(arg);
            let plain = !arg.is_empty()
                && arg.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
            if plain {
                arg.into_owned()
            } else {
                format!("'{}'", arg.replace('\'', r"'\''"))
            }
        })
        .collect();
    words.join(" ")
}

/// A cursor over a record's bytes that fails, never panics, past the end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!("it is truncated ({} bytes short)", n - self.0.len()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Outcome {
        Outcome {
            status: Status::Signaled(15),
            stdout: Stream::Kept((0..=255).collect()),
            stderr: Stream::Dropped(9_000_000),
            argv: vec![b"sh".to_vec(), b"-c".to_vec(), b"echo 'hi'".to_vec()],
            resolved: false,
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let outcome = sample();
        assert_eq!(Outcome::decode(&outcome.encode()), Ok(outcome));
        let resolved = Outcome {
            status: Status::Exited(0),
            stdout: Stream::Kept(Vec::new()),
            stderr: Stream::Kept(Vec::new()),
            argv: Vec::new(),
            resolved: true,
        };
        assert_eq!(Outcome::decode(&resolved.encode()), Ok(resolved));
    }

    /// A dropped stream's length is what CMD wrote, not what is kept: the record
    /// reserves nothing for it (reserving it made an idem under a memory limit abort
    /// after a command wrote gigabytes, recording nothing).
    #[test]
    fn a_record_reserves_what_it_keeps_not_what_was_dropped() {
        let outcome = Outcome {
            status: Status::Exited(0),
            stdout: Stream::Dropped(1 << 29),
            stderr: Stream::Dropped(1 << 29),
            argv: vec![b"yes".to_vec()],
            resolved: false,
        };
        let bytes = outcome.encode();
        assert!(bytes.capacity() < 4096, "{} bytes reserved", bytes.capacity());
        assert_eq!(Outcome::decode(&bytes), Ok(outcome));
        let kept = sample().encode();
        assert_eq!(kept.capacity(), kept.len(), "reserved exactly");
    }

    #[test]
    fn every_truncation_and_any_trailing_byte_is_refused() {
        let bytes = sample().encode();
        for end in 0..bytes.len() {
            assert!(Outcome::decode(&bytes[..end]).is_err(), "cut at {end} was accepted");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Outcome::decode(&longer).unwrap_err().contains("follow its end"));
        assert!(Outcome::decode(b"{\"json\":1}").unwrap_err().contains("not an idem record"));
    }

    #[test]
    fn statuses_replay_as_shells_report_them() {
        assert_eq!(Status::Exited(3).exit_code(), 3);
        assert_eq!(Status::Signaled(9).exit_code(), 137);
        assert_eq!(Status::Signaled(15).describe(), "killed by signal 15 (SIGTERM)");
        assert_eq!(
            command_line(&[b"echo".to_vec(), b"a b".to_vec(), b"it's".to_vec()]),
            r"echo 'a b' 'it'\''s'"
        );
    }
}
