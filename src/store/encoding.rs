//! For store authors (a user of a store never needs it): how a store writes a record's
//! fields and reads them back, shared by every store so that they agree: times in
//! microseconds since the Unix epoch on the store's clock, durations in whole
//! microseconds rounded up (a lease never shrinks to zero), keys as [`Key::as_bytes`],
//! fingerprints as their 16 bytes; the error for a record that does not read back,
//! naming its key; [`check_url`], the check every store makes of a connection URL before
//! its driver reads it; and [`check_lapse_policy`] for a store's lapse setting.
//!
//! Invariant: every function here is total. Out-of-range times saturate, and bytes that
//! are not a key or a fingerprint are a [`StoreError::Corrupt`], never a panic.

use std::fmt;
use std::time::{Duration, SystemTime};

pub use super::lapse::{check_lapse_policy, lapse_ttl_micros};
use super::StoreError;
use crate::{Fingerprint, Key};

/// Checks a lease or TTL as the cache does: more than zero, at most
/// [`MAX_DURATION`](crate::MAX_DURATION). `what` names it in the error.
pub fn check_duration(what: &str, d: Duration) -> Result<(), StoreError> {
    if d.is_zero() || d > crate::MAX_DURATION {
        return Err(StoreError::InvalidInput(format!(
            "{what} must be more than zero and at most {:?}, got {d:?}",
            crate::MAX_DURATION
        )));
    }
    Ok(())
}

/// The time `us` microseconds after the Unix epoch (before it, if negative).
pub fn from_micros(us: i64) -> SystemTime {
    if us >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_micros(us as u64)
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_micros(us.unsigned_abs())
    }
}

/// Microseconds since the Unix epoch of `at` (the inverse of [`from_micros`]),
/// saturating at the ends of `i64`.
pub fn to_micros(at: SystemTime) -> i64 {
    match at.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_micros()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_micros()).map_or(i64::MIN, |us| -us),
    }
}

/// A duration in whole microseconds, rounded up (so a lease never shrinks to zero),
/// saturating at `i64::MAX`.
pub fn micros(d: Duration) -> i64 {
    let us = d.as_nanos().div_ceil(1000);
    i64::try_from(us).unwrap_or(i64::MAX)
}

/// The fingerprint stored as `bytes`, or [`StoreError::Corrupt`] if they are not 16
/// bytes. (The caller knows the record's key: name it with [`corrupt`].)
pub fn fingerprint(bytes: &[u8]) -> Result<Fingerprint, StoreError> {
    Fingerprint::try_from(bytes)
        .map_err(|_| StoreError::Corrupt("a fingerprint is not 16 bytes".into()))
}

/// The key stored as `bytes`, or [`StoreError::Corrupt`] naming those bytes.
pub fn key(bytes: &[u8]) -> Result<Key, StoreError> {
    Key::from_bytes(bytes).map_err(|e| corrupt(bytes, e))
}

/// A record the store holds that cannot be read, named by its key (so an operator can
/// find it, and [`forget`](super::Store::forget) or fix it): by the key's `Debug` form,
/// or, for bytes that are not an idemcache key (another program's row), in hex.
pub fn corrupt(stored_key: &[u8], why: impl fmt::Display) -> StoreError {
    match Key::from_bytes(stored_key) {
        Ok(key) => StoreError::Corrupt(format!("the record of {key:?}: {why}")),
        Err(_) => {
            let hex = hex(stored_key);
            StoreError::Corrupt(format!("the record stored under key bytes {hex}: {why}"))
        }
    }
}

/// Refuses a connection URL a driver would read differently from its author: one with
/// an `@` anywhere but as the end of its user and password, or with a `/`, `?` or `#`
/// before that `@` (`postgres://app:p@ss/word@db/x`, `redis://:pa?ss@cache`, or a query
/// `password=a@b`, which tokio-postgres takes for the user part). A driver would connect
/// elsewhere (the host becomes `ss`, part of the password) and name it in its errors.
/// Percent-encode such characters (`%40`, `%2F`, `%3F`, `%23`). The error echoes
/// nothing of the URL.
pub fn check_url(url: &str) -> Result<(), StoreError> {
    let Some((_, rest)) = url.split_once("://") else { return Ok(()) };
    let misread = match rest.find('@') {
        None => false,
        Some(at) => rest[at + 1..].contains('@') || rest[..at].contains(['/', '?', '#']),
    };
    if misread {
        return Err(StoreError::InvalidInput(
            "the URL holds an unencoded '@', or a '/', '?' or '#' before its '@': \
             percent-encode them in the user, password and parameters (%40, %2F, %3F, %23)"
                .into(),
        ));
    }
    Ok(())
}

/// `error` from the server `server` names (`"PostgreSQL at db:5432/app"`), as a
/// [`StoreError::Backend`] that says where it failed and keeps `error` as its source.
pub fn at_server(
    server: impl Into<String>,
    error: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> StoreError {
    StoreError::Backend(Box::new(ServerError { server: server.into(), error: error.into() }))
}

/// An error naming the server it came from; see [`at_server`].
#[derive(Debug)]
pub struct ServerError {
    server: String,
    error: Box<dyn std::error::Error + Send + Sync>,
}

impl ServerError {
    /// The server, as named (`"Redis at cache:6379"`).
    pub fn server(&self) -> &str {
        &self.server
    }
}

impl fmt::Display for ServerError {
    /// The server, the driver's error, and each cause under it that the line does not
    /// already say (drivers often keep the reason a few causes down: "db error" above
    /// `database "x" does not exist`), so that `{e}` alone tells what failed. As
    /// [`StoreError`]'s own `Display`, it says its causes; `source()` still hands the
    /// driver's error to code that downcasts it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.server, one_line(&*self.error))
    }
}

/// `error` and its causes on one line, `: `-separated, each said once (a cause whose
/// message the line already holds is not repeated): for a log line or a program's
/// `error: ...` on stderr, where a `Debug` dump or a bare top-level message would not
/// tell a person what failed.
pub fn one_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    for cause in std::iter::successors(error.source(), |e| e.source()) {
        let said = cause.to_string();
        if !line.contains(&said) {
            line.push_str(": ");
            line.push_str(&said);
        }
    }
    line
}

impl std::error::Error for ServerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.error)
    }
}

/// `bytes` in lowercase hex, two digits a byte.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_before_and_after_the_epoch_round_trip_through_micros() {
        for us in [-1_000_000_007, -1, 0, 1, 1_700_000_000_000_000] {
            assert_eq!(to_micros(from_micros(us)), us);
        }
        assert!(from_micros(-1) < SystemTime::UNIX_EPOCH);
    }

    #[test]
    fn durations_are_checked_as_the_cache_checks_them() {
        assert!(check_duration("lease", crate::MAX_DURATION).is_ok());
        assert!(check_duration("lease", Duration::from_nanos(1)).is_ok());
        for bad in [Duration::ZERO, crate::MAX_DURATION + Duration::from_nanos(1)] {
            let err = check_duration("lease", bad).unwrap_err();
            assert!(matches!(err, StoreError::InvalidInput(ref why) if why.starts_with("lease")));
        }
    }

    #[test]
    fn durations_round_up_to_whole_microseconds() {
        assert_eq!(micros(Duration::from_nanos(1)), 1);
        assert_eq!(micros(Duration::from_nanos(1000)), 1);
        assert_eq!(micros(Duration::from_nanos(1001)), 2);
        assert_eq!(micros(Duration::MAX), i64::MAX);
    }

    #[test]
    fn urls_a_driver_would_misread_are_refused_without_echoing_them() {
        for ok in ["postgres://app:pw@db:5432/x", "redis://:p%40ss@cache/0", "sqlite:/tmp/x.db"] {
            assert!(check_url(ok).is_ok(), "{ok}");
        }
        for ok in [
            "postgres://[::1]:5432/x",
            "postgres:///db?host=/tmp",
            "postgres://db/x?password=a%40b",
            "rediss://u:p@cache:6380/0#insecure",
            "redis+unix:///tmp/redis.sock?db=1",
        ] {
            assert!(check_url(ok).is_ok(), "{ok}");
        }
        for bad in [
            "postgres://app:p@ss/secret@db:1/x",
            "redis://u:a/b@cache/0",
            "redis://:pa?zzsecret@cache/0",
            // tokio-postgres takes everything before the first '@' for the user part.
            "postgres://db:5432/x?user=u&password=pa@zzsecret",
        ] {
            let Err(StoreError::InvalidInput(why)) = check_url(bad) else { panic!("{bad}") };
            assert!(!why.contains("secret") && !why.contains("ss/") && !why.contains("a/b"));
        }
    }

    #[test]
    fn a_server_error_names_the_server_and_keeps_its_cause() {
        let e = at_server("Redis at cache:6379", std::io::Error::other("connection refused"));
        assert_eq!(
            e.to_string(),
            "the idempotency store failed: Redis at cache:6379: connection refused"
        );
        let StoreError::Backend(inner) = &e else { panic!("{e:?}") };
        assert_eq!(inner.source().unwrap().to_string(), "connection refused");
        let named = inner.downcast_ref::<ServerError>().expect("a ServerError");
        assert_eq!(named.server(), "Redis at cache:6379");

        /// An error whose reason is its cause's, as drivers' often are.
        #[derive(Debug)]
        struct Vague(std::io::Error);
        impl fmt::Display for Vague {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("db error")
            }
        }
        impl std::error::Error for Vague {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let reason = std::io::Error::other("database \"x\" does not exist");
        let e = at_server("PostgreSQL at db:5432/x", Vague(reason));
        assert!(
            e.to_string().ends_with("db:5432/x: db error: database \"x\" does not exist"),
            "{e}"
        );
    }

    #[test]
    fn unreadable_bytes_are_corrupt_and_named() {
        assert!(matches!(fingerprint(&[0; 15]), Err(StoreError::Corrupt(_))));
        assert_eq!(fingerprint(&[7; 16]).unwrap(), Fingerprint::from_bytes([7; 16]));
        let Err(StoreError::Corrupt(why)) = key(&[0xff, 0x00]) else { panic!() };
        assert!(why.contains("ff00"), "{why}");
        let k = Key::new("POST /orders", "t", "k-1").unwrap();
        let StoreError::Corrupt(why) = corrupt(k.as_bytes(), "bad state") else { panic!() };
        assert!(why.contains("k-1") && why.ends_with("bad state"), "{why}");
    }
}
