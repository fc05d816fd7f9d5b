//! [`receive`](crate::inbox)'s decisions, sans I/O, for every driver: which statement
//! runs next ([`Receiving::next`]: the claim, or the read of the record the claim met)
//! and what each answer means, down to the [`Receipt`]. A driver runs the statements on
//! its connection, tells what they answered ([`Receiving::claimed`],
//! [`Receiving::read`], [`Receiving::conflicted`]) and decides nothing.
//!
//! The claim inserts the message's record (the dedup fact, committed with the change).
//! If the record is there, the read compares its fingerprint: the same is
//! [`Receipt::Duplicate`], another [`Receipt::Mismatch`]. Another transaction holding
//! the message, or a conflict of the engine's isolation, is [`Receipt::InFlight`]: roll
//! back, requeue. A record the read does not find after the claim met it is what the
//! engine's locks say it is ([`Vanished`]).
//!
//! Invariant: every answer is a verdict on a row a statement returned, or `InFlight`;
//! a stored fingerprint that is not 16 bytes is `Corrupt` naming the message, never a
//! verdict; the claim runs at most [`MAX_CLAIMS`] times.

use std::fmt;

use idemcache::Fingerprint;

use super::{InboxError, Receipt};

/// How many times a receive claims before it lets the redelivery decide (`InFlight`).
pub const MAX_CLAIMS: u32 = 2;

/// The statement a receive runs next, or its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The engine's claim of the message: tell what it did with [`Receiving::claimed`].
    Claim,
    /// The read of the record's fingerprint: tell what it found with
    /// [`Receiving::read`].
    Read,
    /// The receive's answer.
    Answer(Receipt),
}

/// What the engine's claim did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// It inserted the record: the message is new.
    Inserted,
    /// The record was there (committed, or this transaction's own): read it.
    Exists,
    /// Another transaction holds the message (its lock, or its uncommitted record).
    Held,
}

/// What a record the claim met but the read did not find means, by the engine's locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vanished {
    /// Nothing the transaction holds keeps it (PostgreSQL: a purge may delete it between
    /// the claim and the read): claim again.
    ClaimAgain,
    /// The transaction's lock keeps it (SQLite's write lock, InnoDB's lock from the
    /// failed insert): a read that misses it is a store that cannot be read.
    Corrupt,
}

/// One receive of a message, from its claim to its [`Receipt`].
#[derive(Debug, Clone)]
pub struct Receiving<'m> {
    consumer: &'m str,
    message_id: &'m str,
    asked: Fingerprint,
    vanished: Vanished,
    claims: u32,
    next: Step,
}

impl<'m> Receiving<'m> {
    /// The receive of `message_id` by `consumer`, whose content's fingerprint is
    /// `asked`, on an engine where a record that vanished means `vanished`.
    pub fn new(
        consumer: &'m str,
        message_id: &'m str,
        asked: Fingerprint,
        vanished: Vanished,
    ) -> Receiving<'m> {
        Receiving { consumer, message_id, asked, vanished, claims: 0, next: Step::Claim }
    }

    /// What to run now, or the answer.
    pub fn next(&self) -> Step {
        self.next
    }

    /// The claim's outcome.
    pub fn claimed(&mut self, claimed: Claimed) {
        self.claims += 1;
        self.next = match claimed {
            Claimed::Inserted => Step::Answer(Receipt::New),
            Claimed::Exists => Step::Read,
            Claimed::Held => Step::Answer(Receipt::InFlight),
        };
    }

    /// The read's outcome: the stored fingerprint's bytes, or `None` if it found no
    /// record. A fingerprint that is not 16 bytes is `Corrupt`.
    pub fn read(&mut self, stored: Option<&[u8]>) -> Result<(), InboxError> {
        let Some(bytes) = stored else {
            self.next = match self.vanished {
                Vanished::ClaimAgain if self.claims < MAX_CLAIMS => Step::Claim,
                // Twice in a row: the inbox cannot judge the message; the redelivery will.
                Vanished::ClaimAgain => Step::Answer(Receipt::InFlight),
                Vanished::Corrupt => {
                    return Err(
                        self.unreadable("the insert met a record that the read then did not find")
                    );
                }
            };
            return Ok(());
        };
        let stored = Fingerprint::try_from(bytes).map_err(|_| {
            self.unreadable(format_args!("the fingerprint is {} bytes, not 16", bytes.len()))
        })?;
        let receipt = if stored == self.asked { Receipt::Duplicate } else { Receipt::Mismatch };
        self.next = Step::Answer(receipt);
        Ok(())
    }

    /// A statement failed on a conflict of the engine's (a serialization failure, a
    /// lock wait timeout, a deadlock): the message is in flight elsewhere.
    pub fn conflicted(&mut self) {
        self.next = Step::Answer(Receipt::InFlight);
    }

    /// The error of a record the driver could not read (`why`), naming the message.
    pub fn unreadable(&self, why: impl fmt::Display) -> InboxError {
        InboxError::corrupt(self.consumer, self.message_id, why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(s: &str) -> Fingerprint {
        Fingerprint::of(s.as_bytes())
    }

    #[test]
    fn an_insert_is_new_and_a_held_message_is_in_flight() {
        for (claimed, receipt) in
            [(Claimed::Inserted, Receipt::New), (Claimed::Held, Receipt::InFlight)]
        {
            let mut r = Receiving::new("c", "m", fp("a"), Vanished::Corrupt);
            assert_eq!(r.next(), Step::Claim);
            r.claimed(claimed);
            assert_eq!(r.next(), Step::Answer(receipt));
        }
    }

    #[test]
    fn an_existing_record_is_a_duplicate_or_a_mismatch_by_its_fingerprint() {
        for (stored, receipt) in [("a", Receipt::Duplicate), ("b", Receipt::Mismatch)] {
            let mut r = Receiving::new("c", "m", fp("a"), Vanished::Corrupt);
            r.claimed(Claimed::Exists);
            assert_eq!(r.next(), Step::Read);
            r.read(Some(&fp(stored).to_bytes())).unwrap();
            assert_eq!(r.next(), Step::Answer(receipt));
        }
    }

    #[test]
    fn a_fingerprint_of_another_length_is_corrupt_naming_the_message() {
        let mut r = Receiving::new("ledger", "m-1", fp("a"), Vanished::ClaimAgain);
        r.claimed(Claimed::Exists);
        let e = r.read(Some(&[1, 2, 3])).unwrap_err();
        let said = e.to_string();
        assert!(
            said.contains("ledger") && said.contains("m-1") && said.contains("3 bytes"),
            "{said}"
        );
    }

    #[test]
    fn a_vanished_record_is_claimed_again_once_or_is_corrupt_where_a_lock_keeps_it() {
        let mut again = Receiving::new("c", "m", fp("a"), Vanished::ClaimAgain);
        again.claimed(Claimed::Exists);
        again.read(None).unwrap();
        assert_eq!(again.next(), Step::Claim);
        again.claimed(Claimed::Exists);
        again.read(None).unwrap();
        assert_eq!(again.next(), Step::Answer(Receipt::InFlight), "the redelivery decides");

        let mut locked = Receiving::new("c", "m", fp("a"), Vanished::Corrupt);
        locked.claimed(Claimed::Exists);
        assert!(matches!(locked.read(None), Err(InboxError::Corrupt(_))));
    }

    #[test]
    fn a_conflict_is_in_flight() {
        let mut r = Receiving::new("c", "m", fp("a"), Vanished::Corrupt);
        r.claimed(Claimed::Exists);
        r.conflicted();
        assert_eq!(r.next(), Step::Answer(Receipt::InFlight));
    }
}
