//! Times for people and scripts: RFC 3339 in UTC (`2026-12-01T12:00:00.123Z`), and
//! "3 min ago".
//!
//! Invariant: every `SystemTime` formats, however far from the epoch (before it, or
//! past year 9999, it is clamped to the nearest second that formats).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `at` as RFC 3339 in UTC, to the millisecond.
pub fn rfc3339(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    // 9999-12-31T23:59:59Z.
    let secs = since.as_secs().min(253_402_300_799);
    let millis = since.subsec_millis();
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// Howard Hinnant's `civil_from_days`: the proleptic Gregorian date `days` after
/// 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// How long ago `at` was (or "in ..." for a time to come), roughly.
pub fn ago(at: SystemTime) -> String {
    match SystemTime::now().duration_since(at) {
        Ok(past) => format!("{} ago", rough(past)),
        Err(future) => format!("in {}", rough(future.duration())),
    }
}

fn rough(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=119 => format!("{s} s"),
        120..=7_199 => format!("{} min", s / 60),
        7_200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} days", s / 86_400),
    }
}

/// `at` in microseconds since the epoch, for JSON.
pub fn micros(at: SystemTime) -> i64 {
    idemcache::store::encoding::to_micros(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_format_as_rfc3339() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_796_040_000_123);
        assert_eq!(rfc3339(t), "2026-11-30T12:00:00.123Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00.000Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(u64::MAX / 2)),
            "9999-12-31T23:59:59.000Z"
        );
        assert_eq!(rfc3339(UNIX_EPOCH - Duration::from_secs(5)), "1970-01-01T00:00:00.000Z");
    }
}
