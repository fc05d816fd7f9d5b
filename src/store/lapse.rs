//! [`Lapse`]: a store's [`LapsePolicy`] with the unknown TTL it marks lapsed leases for,
//! checked once when set; each store crate takes one through its `lapse_policy` setting.
//!
//! Invariant: a `Lapse` that exists is valid: under `MarkUnknown` its TTL is more than
//! zero and at most [`MAX_DURATION`](crate::MAX_DURATION), so a store binds it without
//! checking again.
//!
//! What every store does under [`LapsePolicy::MarkUnknown`] (the conformance suite's
//! `run_mark_unknown` checks it): a claim that finds a PROCESSING record whose lease
//! lapsed less than the TTL ago turns it UNKNOWN in the same atomic step (marked at the
//! lease's end, expiring the TTL after it) and answers [`StoreClaim::Unknown`](super::StoreClaim::Unknown)
//! (or `Mismatch` for another request); such a record is UNKNOWN to `resolve` and
//! `forget` too; `purge_expired` never deletes it; the lapsed token's writes are
//! refused with [`StoreError::LeaseLost`] as under `TakeOver`.
//!
//! The policy is the handle's, not the record's: handles sharing one store should use
//! one policy. A record once UNKNOWN is UNKNOWN to every handle; a PROCESSING record
//! whose lease lapsed is taken over (or purged) by a `TakeOver` handle that reaches it
//! before a `MarkUnknown` handle turns it.

use std::time::Duration;

use super::encoding::{check_duration, micros};
use super::StoreError;
use crate::LapsePolicy;

/// A store's lapse setting: [`LapsePolicy::TakeOver`] (the default), or
/// [`LapsePolicy::MarkUnknown`] with the TTL of the UNKNOWN records lapses turn into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lapse {
    /// `Some` under `MarkUnknown`: how long a lapsed lease stays UNKNOWN, from its end.
    unknown_ttl: Option<Duration>,
}

impl Lapse {
    /// `TakeOver`: the next claim takes a lapsed lease over.
    pub const TAKE_OVER: Lapse = Lapse { unknown_ttl: None };

    /// `policy`, marking lapsed leases UNKNOWN for `unknown_ttl` under
    /// [`LapsePolicy::MarkUnknown`] (`TakeOver` ignores it). A TTL of zero or over
    /// [`MAX_DURATION`](crate::MAX_DURATION) is [`StoreError::InvalidInput`] under
    /// `MarkUnknown`.
    pub fn new(policy: LapsePolicy, unknown_ttl: Duration) -> Result<Lapse, StoreError> {
        match policy {
            LapsePolicy::MarkUnknown => {
                check_duration("unknown TTL of lapsed leases", unknown_ttl)?;
                Ok(Lapse { unknown_ttl: Some(unknown_ttl) })
            }
            _ => Ok(Lapse::TAKE_OVER),
        }
    }

    /// The policy.
    pub fn policy(&self) -> LapsePolicy {
        match self.unknown_ttl {
            Some(_) => LapsePolicy::MarkUnknown,
            None => LapsePolicy::TakeOver,
        }
    }

    /// How long a lapsed lease stays UNKNOWN, from its end; `None` under `TakeOver`.
    pub fn unknown_ttl(&self) -> Option<Duration> {
        self.unknown_ttl
    }

    /// [`unknown_ttl`](Lapse::unknown_ttl) in microseconds, 0 under `TakeOver`: for a
    /// statement that reads "lapsed less than this long ago" (`expires_at + ttl > now`,
    /// never true of a lapsed lease when 0).
    pub fn unknown_ttl_micros(&self) -> i64 {
        self.unknown_ttl.map_or(0, micros)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lapse_setting_is_checked_once() {
        let ttl = Duration::from_secs(60);
        assert_eq!(Lapse::default(), Lapse::TAKE_OVER);
        assert_eq!(Lapse::new(LapsePolicy::TakeOver, Duration::ZERO).unwrap(), Lapse::TAKE_OVER);
        let marking = Lapse::new(LapsePolicy::MarkUnknown, ttl).unwrap();
        assert_eq!(marking.policy(), LapsePolicy::MarkUnknown);
        assert_eq!((marking.unknown_ttl(), marking.unknown_ttl_micros()), (Some(ttl), 60_000_000));
        assert_eq!(
            (Lapse::TAKE_OVER.policy(), Lapse::TAKE_OVER.unknown_ttl_micros()),
            (LapsePolicy::TakeOver, 0)
        );
        for bad in [Duration::ZERO, crate::MAX_DURATION + Duration::from_nanos(1)] {
            let refused = Lapse::new(LapsePolicy::MarkUnknown, bad);
            assert!(matches!(refused, Err(StoreError::InvalidInput(_))), "{refused:?}");
        }
    }
}
