//! `idem`'s tuning from the environment: `IDEM_LEASE_MS`, `IDEM_BUSY_TIMEOUT_MS` and
//! `IDEM_MAX_OUTPUT` (`IDEM_DB` is clap's, beside `--db`).
//!
//! Invariant: every variable is read once, before anything is done, by every subcommand
//! alike. Unset or empty, it takes its default; set, it is a whole number of its unit
//! within its range, or `idem` exits 64 naming the variable, its value and the range.
//! No value is clamped or ignored in silence: a typo would otherwise run with a setting
//! nobody chose.

use std::time::Duration;

use crate::exit::{Failure, USAGE};

/// What `idem` runs with.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The lease a run holds ([`LEASE_MS`]).
    pub lease: Duration,
    /// How long a statement waits for another process's lock ([`BUSY_TIMEOUT_MS`]).
    pub busy_timeout: Duration,
    /// The most output a record keeps, in bytes ([`MAX_OUTPUT`]).
    pub max_output: usize,
}

/// One variable: its name, unit and range, and its value when unset.
#[derive(Debug)]
pub struct Variable {
    /// Its name in the environment.
    pub name: &'static str,
    /// What its number counts, for messages.
    pub unit: &'static str,
    /// The least value accepted.
    pub min: u64,
    /// The most value accepted.
    pub max: u64,
    /// Its value when unset or empty.
    pub default: u64,
}

/// The lease, in milliseconds: at least 300, at most the stores' longest duration (100
/// years). The lease's end is set before the claim's commit syncs to disk, and one
/// sync took 39 ms here: a 30 ms lease lost its key in 3 of 5 runs of a 2 s command
/// (60 ms: 1 of 5; 100 and 300 ms: none). It is renewed every third of it.
pub const LEASE_MS: Variable = Variable {
    name: "IDEM_LEASE_MS",
    unit: "milliseconds",
    min: 300,
    max: idemcache::MAX_DURATION.as_millis() as u64,
    default: 10_000,
};

/// SQLite's busy timeout, in milliseconds: SQLite takes it as a C `int`.
pub const BUSY_TIMEOUT_MS: Variable = Variable {
    name: "IDEM_BUSY_TIMEOUT_MS",
    unit: "milliseconds",
    min: 0,
    max: i32::MAX as u64,
    default: 5_000,
};

/// The output kept, in bytes: at most 512 MiB, well under the largest value SQLite
/// stores (1,000,000,000 bytes) with the command line beside it, since a record is held
/// a few times in memory on its way there (the capture, the record, the store's copy).
pub const MAX_OUTPUT: Variable =
    Variable { name: "IDEM_MAX_OUTPUT", unit: "bytes", min: 0, max: 512 << 20, default: 4 << 20 };

impl Settings {
    /// The settings this process's environment gives; `Err` (exit 64) names the first
    /// variable out of its range.
    pub fn from_env() -> Result<Settings, Failure> {
        let read = |v: &Variable| v.parse(std::env::var_os(v.name).as_deref());
        Ok(Settings {
            lease: Duration::from_millis(read(&LEASE_MS)?),
            busy_timeout: Duration::from_millis(read(&BUSY_TIMEOUT_MS)?),
            max_output: usize::try_from(read(&MAX_OUTPUT)?).unwrap_or(usize::MAX),
        })
    }
}

impl Variable {
    /// The number `value` sets (the default when unset or empty).
    fn parse(&self, value: Option<&std::ffi::OsStr>) -> Result<u64, Failure> {
        let Some(value) = value.filter(|v| !v.is_empty()) else { return Ok(self.default) };
        value
            .to_str()
            // Digits only: `u64::from_str` also takes a leading `+`, which no other
            // number idem reads (`--ttl`, `--wait`) accepts.
            .filter(|text| text.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|text| text.parse::<u64>().ok())
            .filter(|n| (self.min..=self.max).contains(n))
            .ok_or_else(|| {
                Failure::new(
                    USAGE,
                    format!(
                        "{} is {:?}: it must be a whole number of {} from {} to {} (unset, it \
                         is {})",
                        self.name,
                        value.to_string_lossy(),
                        self.unit,
                        self.min,
                        self.max,
                        self.default
                    ),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn a_variable_is_its_default_or_a_number_in_its_range() {
        let parse =
            |v: &Variable, text: &str| v.parse(Some(OsStr::new(text))).map_err(|f| f.message);
        assert_eq!(LEASE_MS.parse(None).ok(), Some(10_000));
        assert_eq!(parse(&LEASE_MS, "").ok(), Some(10_000), "empty is unset");
        assert_eq!(parse(&LEASE_MS, "300").ok(), Some(300));
        assert_eq!(parse(&LEASE_MS, "3153600000000").ok(), Some(3_153_600_000_000));
        assert_eq!(parse(&BUSY_TIMEOUT_MS, "2147483647").ok(), Some(2_147_483_647));
        assert_eq!(parse(&MAX_OUTPUT, "0").ok(), Some(0));
        for (v, bad) in [
            (&LEASE_MS, "299"),
            (&LEASE_MS, "+300"),
            (&LEASE_MS, "abc"),
            (&LEASE_MS, " 100"),
            (&LEASE_MS, "3153600000001"),
            (&BUSY_TIMEOUT_MS, "2147483648"),
            (&BUSY_TIMEOUT_MS, "-1"),
            (&MAX_OUTPUT, "536870913"),
            (&MAX_OUTPUT, "1e6"),
        ] {
            let said = parse(v, bad).unwrap_err();
            assert!(said.starts_with(&format!("{} is {bad:?}: ", v.name)), "{said}");
            assert!(said.contains(&format!("from {} to {}", v.min, v.max)), "{said}");
        }
        assert_eq!(
            LEASE_MS.max as u128 * 1000,
            idemcache::MAX_DURATION.as_micros(),
            "the longest lease is the stores' longest duration"
        );
    }
}
