//! MySQL's claim decided here, sans I/O: once the claim's [`LOOK`] read the key's row
//! (under its lock, in the claim's transaction), what the claim does next
//! ([`after_look`]), and what it answers once its write changed the row
//! ([`acquired`]). The driver (`idemcache-sqlx`) runs [`LOOK`], the write named and a
//! mint, and retries an attempt a concurrent writer got between; it decides nothing.
//!
//! Both MySQL claims run it: the store's own (`LOOK` first, in a transaction of its own,
//! then [`TAKE_NEW`] or the write named) and the one-commit claim in a caller's
//! transaction ([`TAKE_NEW_OR_LOCK`] first, so that the `LOOK` after it finds either the
//! row this claim inserted, under its own token, or the record it waited on).
//!
//! Invariant: a key's tokens only grow: a takeover never writes a token at or below the
//! dead record's (it mints again first, with the record's row locked); every answer is
//! [`decode::claim`]'s or [`decode::turned_unknown`]'s verdict on the row the `LOOK`
//! read, or [`acquired`] after a write that changed exactly that row.
//!
//! [`LOOK`]: super::mysql::LOOK
//! [`TAKE_NEW`]: super::mysql::TAKE_NEW
//! [`TAKE_NEW_OR_LOCK`]: super::mysql::TAKE_NEW_OR_LOCK

use idemcache::store::encoding::from_micros;
use idemcache::store::{StoreClaim, StoreError};
use idemcache::Fingerprint;

use super::decode::{self, ClaimRow, ClaimStep};

/// What the claim does after its `LOOK`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// The claim's answer: nothing to write (roll back what the attempt opened).
    Answer(StoreClaim),
    /// The key has no record: [`TAKE_NEW`](super::mysql::TAKE_NEW) under the claim's
    /// token, then [`acquired`] (not a takeover).
    TakeNew,
    /// A lease lapsed under `LapsePolicy::MarkUnknown`:
    /// [`TURN_UNKNOWN`](super::mysql::TURN_UNKNOWN) fenced by `held`; once it changed
    /// the row, the claim answers `turned`.
    TurnUnknown {
        /// The lapsed claim's token.
        held: i64,
        /// The answer once the record is UNKNOWN.
        turned: StoreClaim,
    },
    /// The record is dead (expired, or a lapsed lease to take over):
    /// [`TAKE_OVER`](super::mysql::TAKE_OVER) fenced by `held`, under a token minted now
    /// if `mint` (the claim's own is not above the record's), then [`acquired`].
    TakeOver {
        /// The dead record's token.
        held: i64,
        /// Whether the claim's token must be minted again first.
        mint: bool,
        /// Whether the record was an earlier execution (PROCESSING), not an expired
        /// result: [`StoreClaim::Acquired::took_over`].
        took_over: bool,
    },
}

/// What the claim of `key` (its stored form) for the request `asked`, holding `token`,
/// does once its `LOOK` found `found` (the key's row, or none).
///
/// A row holding `token` is the claim's own insert ([`TAKE_NEW_OR_LOCK`]'s): acquired,
/// its lease ending as the row says.
///
/// [`TAKE_NEW_OR_LOCK`]: super::mysql::TAKE_NEW_OR_LOCK
pub fn after_look(
    key: &[u8],
    asked: Fingerprint,
    token: i64,
    found: Option<&ClaimRow>,
) -> Result<Next, StoreError> {
    let Some(row) = found else { return Ok(Next::TakeNew) };
    if row.token == token {
        return Ok(Next::Answer(StoreClaim::Acquired {
            token: decode::fencing_token(token),
            lease_ends_at: from_micros(row.expires_at),
            took_over: false,
        }));
    }
    Ok(match decode::claim(key, asked, row)? {
        ClaimStep::Answer(answer) => Next::Answer(answer),
        ClaimStep::TurnUnknown { .. } => Next::TurnUnknown {
            held: row.token,
            turned: decode::turned_unknown(
                key,
                asked,
                row.fingerprint.as_deref(),
                Some(row.expires_at),
            )?,
        },
        ClaimStep::Dead => Next::TakeOver {
            held: row.token,
            // The dead record's claim may have minted after this one did (and its lease
            // run out since): a token above it, minted now its row is locked.
            mint: token <= row.token,
            took_over: row.state == decode::PROCESSING,
        },
    })
}

/// The answer of a claim whose write ([`TAKE_NEW`](super::mysql::TAKE_NEW) or
/// [`TAKE_OVER`](super::mysql::TAKE_OVER)) changed the key's row under `token`, its lease
/// of `duration` µs from the server's `now` (µs).
pub fn acquired(token: i64, now: i64, duration: i64, took_over: bool) -> StoreClaim {
    StoreClaim::Acquired {
        token: decode::fencing_token(token),
        lease_ends_at: from_micros(now.saturating_add(duration)),
        took_over,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(body: &str) -> Fingerprint {
        Fingerprint::of(body.as_bytes())
    }

    fn row(state: i16, token: i64, live: bool, lapsed: bool) -> ClaimRow {
        ClaimRow {
            state,
            token,
            fingerprint: Some(fp("a").to_bytes().to_vec()),
            body: None,
            settled_at: Some(5),
            expires_at: 1_000,
            live,
            lapsed,
            took_over: false,
        }
    }

    #[test]
    fn no_record_is_taken_new_and_the_claims_own_insert_is_acquired() {
        assert_eq!(after_look(b"k", fp("a"), 7, None).unwrap(), Next::TakeNew);
        let mine = row(decode::PROCESSING, 7, true, false);
        let Next::Answer(StoreClaim::Acquired { token, lease_ends_at, took_over }) =
            after_look(b"k", fp("a"), 7, Some(&mine)).unwrap()
        else {
            panic!("acquired")
        };
        assert_eq!((token.get(), lease_ends_at, took_over), (7, from_micros(1_000), false));
    }

    #[test]
    fn a_dead_record_is_taken_over_and_mints_again_unless_the_token_is_above_it() {
        // A lease run out under `TakeOver` (no lapse to turn UNKNOWN).
        let lapsed = row(decode::PROCESSING, 9, false, false);
        let above = after_look(b"k", fp("a"), 12, Some(&lapsed)).unwrap();
        assert_eq!(above, Next::TakeOver { held: 9, mint: false, took_over: true });
        for token in [8, 3] {
            let below = after_look(b"k", fp("a"), token, Some(&lapsed)).unwrap();
            assert_eq!(below, Next::TakeOver { held: 9, mint: true, took_over: true });
        }
        let expired = row(decode::COMPLETED, 9, false, false);
        let result = after_look(b"k", fp("a"), 12, Some(&expired)).unwrap();
        assert_eq!(result, Next::TakeOver { held: 9, mint: false, took_over: false });
    }

    #[test]
    fn a_lapse_under_mark_unknown_is_turned_and_answers_unknown_since_the_lease_ended() {
        let lapsed = row(decode::PROCESSING, 9, false, true);
        let turned = StoreClaim::Unknown { marked_at: from_micros(1_000) };
        let next = after_look(b"k", fp("a"), 12, Some(&lapsed)).unwrap();
        assert_eq!(next, Next::TurnUnknown { held: 9, turned });
        let reused = after_look(b"k", fp("b"), 12, Some(&lapsed)).unwrap();
        assert_eq!(reused, Next::TurnUnknown { held: 9, turned: StoreClaim::Mismatch });
    }

    #[test]
    fn a_live_record_answers_and_a_reused_key_is_a_mismatch() {
        let held = row(decode::PROCESSING, 9, true, false);
        let answer = after_look(b"k", fp("a"), 12, Some(&held)).unwrap();
        assert!(matches!(answer, Next::Answer(StoreClaim::InProgress { .. })), "{answer:?}");
        let other = after_look(b"k", fp("b"), 12, Some(&held)).unwrap();
        assert_eq!(other, Next::Answer(StoreClaim::Mismatch));
    }

    #[test]
    fn an_acquired_lease_ends_a_duration_after_the_servers_now() {
        let StoreClaim::Acquired { token, lease_ends_at, took_over } = acquired(4, 100, 50, true)
        else {
            panic!("acquired")
        };
        assert_eq!((token.get(), lease_ends_at, took_over), (4, from_micros(150), true));
        let far = acquired(4, i64::MAX, 50, false);
        assert!(matches!(far, StoreClaim::Acquired { .. }), "saturates, never overflows");
    }
}
