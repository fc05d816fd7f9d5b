//! PostgreSQL's claim as a loop decided here, sans I/O: which statement runs next
//! ([`ClaimLoop::next`]) and what its answer row means ([`ClaimLoop::answer`]). The
//! drivers (`idemcache-postgres`, `idemcache-sqlx`) run the statements on their
//! connections and decode the rows into [`ClaimAnswer`]; neither decides anything.
//!
//! The loop: the first statement ([`CLAIM`], or [`CLAIM_ABSENT`] in a caller's
//! transaction, which locks no row it does not take); a dead record it read is taken by
//! [`CLAIM`] next; under `LapsePolicy::MarkUnknown` a lapsed lease is turned UNKNOWN by
//! [`TURN_UNKNOWN`], fenced by the lapsed claim's token; a claim statement that found no
//! row (a concurrent writer got between its look and its write) runs again, and a turn
//! that found none (the record moved on since) looks again with the claim statement.
//!
//! Invariant: every answer a claim gives is [`decode::claim`]'s or
//! [`decode::turned_unknown`]'s verdict on a row a statement returned; a claim that keeps
//! racing concurrent writers gives up after [`MAX_STATEMENTS`] statements with an error,
//! never loops for ever, and never answers without a row.
//!
//! [`CLAIM`]: super::postgres::CLAIM
//! [`CLAIM_ABSENT`]: super::postgres::CLAIM_ABSENT
//! [`TURN_UNKNOWN`]: super::postgres::TURN_UNKNOWN

use idemcache::store::{StoreClaim, StoreError};
use idemcache::Fingerprint;

use super::decode::{self, ClaimRow, ClaimStep};
use super::postgres::CLAIM;

/// How many statements a claim runs at most before it gives up.
pub const MAX_STATEMENTS: u32 = 16;

/// The statement a claim runs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimStatement {
    /// [`CLAIM`] or [`CLAIM_ABSENT`](super::postgres::CLAIM_ABSENT) (they bind alike:
    /// key, fingerprint, lease, unknown TTL, correlation id); its answer is
    /// [`ClaimAnswer::Claimed`].
    Claim(&'static str),
    /// [`TURN_UNKNOWN`](super::postgres::TURN_UNKNOWN) (key, `token`, unknown TTL); its
    /// answer is [`ClaimAnswer::Turned`].
    TurnUnknown {
        /// The lapsed claim's token, which the turn is fenced by.
        token: i64,
    },
}

/// What the statement [`ClaimLoop::next`] named returned, decoded by the driver.
#[derive(Debug, Clone, Copy)]
pub enum ClaimAnswer<'r> {
    /// It returned no row.
    Nothing,
    /// A claim statement's row.
    Claimed(&'r ClaimRow),
    /// The turn's row: the record's fingerprint and its mark time, as stored.
    Turned {
        /// The fingerprint column.
        fingerprint: Option<&'r [u8]>,
        /// The time the record was marked UNKNOWN (µs).
        marked_at: Option<i64>,
    },
}

/// One claim of a key, from its first statement to its answer.
#[derive(Debug, Clone)]
pub struct ClaimLoop<'k> {
    key: &'k [u8],
    asked: Fingerprint,
    /// The claim statement a look runs: `first`, then [`CLAIM`] once a record was dead.
    look: &'static str,
    next: ClaimStatement,
    run: u32,
}

impl<'k> ClaimLoop<'k> {
    /// The claim of `key` (its stored form) for the request `asked`, starting with
    /// `first` ([`CLAIM`], or [`CLAIM_ABSENT`](super::postgres::CLAIM_ABSENT)).
    pub fn new(first: &'static str, key: &'k [u8], asked: Fingerprint) -> ClaimLoop<'k> {
        ClaimLoop { key, asked, look: first, next: ClaimStatement::Claim(first), run: 0 }
    }

    /// The statement to run now; [`gave_up`](Self::gave_up) once the claim ran
    /// [`MAX_STATEMENTS`].
    pub fn next(&self) -> Result<ClaimStatement, StoreError> {
        if self.run >= MAX_STATEMENTS {
            return Err(Self::gave_up());
        }
        Ok(self.next)
    }

    /// What the statement [`next`](Self::next) named answered: the claim's answer, or
    /// `None` (run [`next`](Self::next) again). An answer of the wrong kind for the
    /// statement is an error, never a verdict.
    pub fn answer(&mut self, answer: ClaimAnswer<'_>) -> Result<Option<StoreClaim>, StoreError> {
        self.run += 1;
        match (self.next, answer) {
            // A concurrent writer got between the statement's look and its write, or the
            // lapsed record moved on before its turn: look again.
            (_, ClaimAnswer::Nothing) => {
                self.next = ClaimStatement::Claim(self.look);
                Ok(None)
            }
            (ClaimStatement::Claim(_), ClaimAnswer::Claimed(row)) => {
                match decode::claim(self.key, self.asked, row)? {
                    ClaimStep::Answer(answer) => Ok(Some(answer)),
                    // Dead: the first statement did not take it (`CLAIM_ABSENT`), or a
                    // concurrent writer got between `CLAIM`'s look and its write.
                    ClaimStep::Dead => {
                        self.look = CLAIM;
                        self.next = ClaimStatement::Claim(CLAIM);
                        Ok(None)
                    }
                    ClaimStep::TurnUnknown { token } => {
                        self.next = ClaimStatement::TurnUnknown { token };
                        Ok(None)
                    }
                }
            }
            (
                ClaimStatement::TurnUnknown { .. },
                ClaimAnswer::Turned { fingerprint, marked_at },
            ) => decode::turned_unknown(self.key, self.asked, fingerprint, marked_at).map(Some),
            (statement, answer) => Err(StoreError::Backend(
                format!("{statement:?} answered with a row of another statement: {answer:?}")
                    .into(),
            )),
        }
    }

    /// The error of a claim that kept racing concurrent writers.
    pub fn gave_up() -> StoreError {
        StoreError::Backend("the claim kept racing a concurrent writer".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::postgres::CLAIM_ABSENT;

    fn row(state: i16, token: i64, live: bool, lapsed: bool) -> ClaimRow {
        ClaimRow {
            state,
            token,
            fingerprint: Some(Fingerprint::of(b"r").to_bytes().to_vec()),
            body: None,
            settled_at: None,
            expires_at: 1,
            live,
            lapsed,
            took_over: false,
        }
    }

    #[test]
    fn a_dead_record_is_taken_by_claim_next_and_a_lapse_is_turned_under_its_token() {
        let fp = Fingerprint::of(b"r");
        let mut claim = ClaimLoop::new(CLAIM_ABSENT, b"k", fp);
        assert_eq!(claim.next().unwrap(), ClaimStatement::Claim(CLAIM_ABSENT));
        let dead = row(2, 7, false, false);
        assert!(claim.answer(ClaimAnswer::Claimed(&dead)).unwrap().is_none());
        assert_eq!(claim.next().unwrap(), ClaimStatement::Claim(CLAIM));
        let lapsed = row(1, 9, false, true);
        assert!(claim.answer(ClaimAnswer::Claimed(&lapsed)).unwrap().is_none());
        assert_eq!(claim.next().unwrap(), ClaimStatement::TurnUnknown { token: 9 });
        let stored = fp.to_bytes();
        let turned = ClaimAnswer::Turned { fingerprint: Some(&stored), marked_at: Some(5) };
        let answer = claim.answer(turned).unwrap();
        assert!(matches!(answer, Some(StoreClaim::Unknown { .. })), "{answer:?}");
    }

    #[test]
    fn a_turn_that_finds_nothing_looks_again_with_the_claim_statement() {
        let mut claim = ClaimLoop::new(CLAIM_ABSENT, b"k", Fingerprint::of(b"r"));
        let lapsed = row(1, 9, false, true);
        assert!(claim.answer(ClaimAnswer::Claimed(&lapsed)).unwrap().is_none());
        assert_eq!(claim.next().unwrap(), ClaimStatement::TurnUnknown { token: 9 });
        // The record moved on (completed meanwhile): look, never turn again.
        assert!(claim.answer(ClaimAnswer::Nothing).unwrap().is_none());
        assert_eq!(claim.next().unwrap(), ClaimStatement::Claim(CLAIM_ABSENT));
        // Once a record was dead, a look is CLAIM's, which takes it.
        let dead = row(2, 7, false, false);
        assert!(claim.answer(ClaimAnswer::Claimed(&dead)).unwrap().is_none());
        assert!(claim.answer(ClaimAnswer::Nothing).unwrap().is_none());
        assert_eq!(claim.next().unwrap(), ClaimStatement::Claim(CLAIM));
    }

    #[test]
    fn no_row_runs_the_same_statement_again_and_the_claim_gives_up_after_the_bound() {
        let mut claim = ClaimLoop::new(CLAIM, b"k", Fingerprint::of(b"r"));
        for _ in 0..MAX_STATEMENTS {
            assert_eq!(claim.next().unwrap(), ClaimStatement::Claim(CLAIM));
            assert!(claim.answer(ClaimAnswer::Nothing).unwrap().is_none());
        }
        let e = claim.next().unwrap_err();
        assert!(e.to_string().contains("kept racing"), "{e}");
    }

    #[test]
    fn a_row_of_another_statement_is_an_error_not_a_verdict() {
        let mut claim = ClaimLoop::new(CLAIM, b"k", Fingerprint::of(b"r"));
        let turned = ClaimAnswer::Turned { fingerprint: None, marked_at: None };
        assert!(claim.answer(turned).is_err());
    }
}
