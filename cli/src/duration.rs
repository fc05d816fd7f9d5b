//! Durations on the command line: `--ttl 24h` (`90s`, `30m`, `7d`, `1h30m`, `500ms`, or
//! bare seconds) and `--wait SECS` (seconds, fractions allowed).
//!
//! Invariant: a parsed TTL is more than zero and at most the stores' `MAX_DURATION`;
//! a parsed wait is not negative and at most the same (100 years: as good as forever).

use std::time::Duration;

/// Parses a TTL: one or more `<number><unit>` (units `ms`, `s`, `m`, `h`, `d`), or a
/// bare number of seconds.
pub fn parse_ttl(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let bad = || format!("{text:?} is not a duration (examples: 24h, 90m, 30s, 7d, 1h30m)");
    if text.is_empty() {
        return Err(bad());
    }
    let total = if text.bytes().all(|b| b.is_ascii_digit()) {
        Duration::from_secs(text.parse().map_err(|_| bad())?)
    } else {
        let mut total = Duration::ZERO;
        let mut rest = text;
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return Err(bad());
            }
            let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
            rest = &rest[digits..];
            let unit = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
            let millis = match &rest[..unit] {
                "ms" => 1,
                "s" => 1_000,
                "m" => 60_000,
                "h" => 3_600_000,
                "d" => 86_400_000,
                _ => return Err(bad()),
            };
            rest = &rest[unit..];
            let part = n.checked_mul(millis).ok_or_else(bad)?;
            total = total.checked_add(Duration::from_millis(part)).ok_or_else(bad)?;
        }
        total
    };
    if total.is_zero() {
        return Err(format!("{text:?}: a TTL must be more than zero"));
    }
    if total > idemcache::MAX_DURATION {
        return Err(format!("{text:?}: a TTL must be at most {:?}", idemcache::MAX_DURATION));
    }
    Ok(total)
}

/// Parses `--wait SECS`: seconds, fractions allowed, zero for "do not wait".
pub fn parse_wait(text: &str) -> Result<Duration, String> {
    let not_a_number = || format!("{text:?} is not a number of seconds");
    let secs: f64 = text.trim().parse().map_err(|_| not_a_number())?;
    let most = idemcache::MAX_DURATION;
    if secs.is_nan() {
        Err(not_a_number())
    } else if secs < 0.0 {
        Err(format!("{text:?}: the wait must not be negative"))
    } else if secs > most.as_secs_f64() {
        Err(format!(
            "{text:?} seconds is too large: the most is {} seconds (100 years)",
            most.as_secs()
        ))
    } else {
        Ok(Duration::from_secs_f64(secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_read_as_people_write_them() {
        assert_eq!(parse_ttl("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_ttl("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_ttl("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_ttl("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_ttl("7d"), Ok(Duration::from_secs(7 * 86_400)));
        for bad in ["", "h", "24y", "24x", "1h 30m", "-1s", "0s", "0", "99999999999999999999d"] {
            assert!(parse_ttl(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn waits_are_seconds() {
        assert_eq!(parse_wait("60"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_wait("0.25"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_wait("0"), Ok(Duration::ZERO));
        for bad in ["-1", "inf", "NaN", "soon"] {
            assert!(parse_wait(bad).is_err(), "{bad:?} was accepted");
        }
        assert_eq!(parse_wait("3153600000"), Ok(idemcache::MAX_DURATION), "the most");
        for large in ["3153600001", "18446744073709551615", "1e300", "inf"] {
            let said = parse_wait(large).unwrap_err();
            assert!(said.contains("too large: the most is 3153600000 seconds"), "{said}");
        }
        assert!(parse_wait("-1").unwrap_err().contains("not be negative"));
        assert!(parse_wait("NaN").unwrap_err().contains("not a number"));
    }
}
