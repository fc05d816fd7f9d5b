//! A store's [`LapsePolicy`], checked once when set ([`check_lapse_policy`]); each store
//! crate takes one through its `with_lapse_policy` setting and binds
//! [`lapse_ttl_micros`] in its statements.
//!
//! Invariant: a store holds only a checked policy: under `MarkUnknown` its `ttl` is more
//! than zero and at most [`MAX_DURATION`](crate::MAX_DURATION), so a store binds it
//! without checking again.
//!
//! What a store does under each policy is written once, on [`LapsePolicy`].

use super::encoding::{check_duration, micros};
use super::StoreError;
use crate::LapsePolicy;

/// `policy` if a store may hold it: under [`LapsePolicy::MarkUnknown`] a `ttl` of zero or
/// over [`MAX_DURATION`](crate::MAX_DURATION) is [`StoreError::InvalidInput`].
pub fn check_lapse_policy(policy: LapsePolicy) -> Result<LapsePolicy, StoreError> {
    if let Some(ttl) = policy.unknown_ttl() {
        check_duration("the ttl of LapsePolicy::MarkUnknown", ttl)?;
    }
    Ok(policy)
}

/// The policy's unknown TTL in microseconds, 0 under `TakeOver`: for a statement that
/// reads "lapsed less than this long ago" (`expires_at + ttl > now`, never true of a
/// lapsed lease when 0).
pub fn lapse_ttl_micros(policy: LapsePolicy) -> i64 {
    policy.unknown_ttl().map_or(0, micros)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_lapse_policy_is_checked_once() {
        let ttl = Duration::from_secs(60);
        let marking = LapsePolicy::MarkUnknown { ttl };
        assert_eq!(check_lapse_policy(marking).unwrap(), marking);
        assert_eq!(lapse_ttl_micros(marking), 60_000_000);
        assert_eq!(check_lapse_policy(LapsePolicy::TakeOver).unwrap(), LapsePolicy::TakeOver);
        assert_eq!(lapse_ttl_micros(LapsePolicy::TakeOver), 0);
        for bad in [Duration::ZERO, crate::MAX_DURATION + Duration::from_nanos(1)] {
            let refused = check_lapse_policy(LapsePolicy::MarkUnknown { ttl: bad });
            assert!(matches!(refused, Err(StoreError::InvalidInput(_))), "{refused:?}");
        }
    }
}
