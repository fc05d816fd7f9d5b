//! The records statements' result columns, read by a driver as plain values, decoded
//! into the [`Store`](idemcache::store::Store) contract's answers: [`claim`] (and
//! [`turned_unknown`] after a lapse's turn), [`replay`], [`unknown_entry`]; and the
//! conversions of tokens and counts both ways.
//!
//! Invariant: every function here is total. A row the schema allows but the contract
//! cannot read (a fingerprint of another length, an UNKNOWN record without its mark
//! time, a state out of range, key bytes that are not a key) is
//! [`StoreError::Corrupt`] naming the record's key, never a panic; a driver reports a
//! column it could not read as a value of its type with [`unreadable`], to the same
//! effect.

use std::fmt;
use std::time::SystemTime;

use bytes::Bytes;
use idemcache::store::encoding::{corrupt, fingerprint, from_micros, key};
use idemcache::store::{StoreClaim, StoreError};
use idemcache::{FencingToken, Fingerprint, Replay, UnknownEntry};

/// `state` of a record being executed (PROCESSING).
pub const PROCESSING: i16 = 1;
/// `state` of a completed record.
pub const COMPLETED: i16 = 2;
/// `state` of a record whose outcome is unknown.
pub const UNKNOWN: i16 = 3;
/// `state` in a claim's answer row when this very claim took the key (no record's).
pub const TAKEN: i16 = 0;

/// The columns of a claim's answer row, in the order the dialects' claim statements
/// return them: the key taken by this claim ([`TAKEN`], with its token and lease end),
/// or the record that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRow {
    /// [`TAKEN`], or the record's state.
    pub state: i16,
    /// The token this claim took, or the record's.
    pub token: i64,
    /// The record's fingerprint (`None` when taken).
    pub fingerprint: Option<Vec<u8>>,
    /// The record's body.
    pub body: Option<Vec<u8>>,
    /// When the record was completed or marked UNKNOWN.
    pub settled_at: Option<i64>,
    /// The lease's end while PROCESSING, the TTL's after.
    pub expires_at: i64,
    /// Whether `expires_at` is still ahead of the server's now.
    pub live: bool,
    /// Whether it is a PROCESSING record whose lease lapsed less than the unknown TTL
    /// ago (never under `TakeOver`): a lapse to turn UNKNOWN.
    pub lapsed: bool,
    /// When taken: whether the claim replaced a PROCESSING record whose lease lapsed
    /// (a takeover), rather than an absent or expired key. False for a record read.
    pub took_over: bool,
}

/// What a claim does with its answer row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimStep {
    /// The claim's answer.
    Answer(StoreClaim),
    /// A lapse under `LapsePolicy::MarkUnknown`: turn the record claimed under `token`
    /// UNKNOWN with the dialect's turning statement, then decode its row with
    /// [`turned_unknown`]; no row means the record moved on since: look again.
    TurnUnknown {
        /// The lapsed record's token, which the turning statement is fenced by.
        token: i64,
    },
    /// The record is dead (expired, or a lapsed lease under `TakeOver`): it is the
    /// claim's to take. PostgreSQL's claim statement takes a dead record itself, so
    /// there this row means a concurrent writer got between: run the claim again.
    /// MySQL's look holds the record's row locked: take it over
    /// ([`mysql::TAKE_OVER`](super::mysql::TAKE_OVER)).
    Dead,
}

/// The answer row of a claim of `stored_key` for the request `asked`.
pub fn claim(
    stored_key: &[u8],
    asked: Fingerprint,
    row: &ClaimRow,
) -> Result<ClaimStep, StoreError> {
    if row.state == TAKEN {
        return Ok(ClaimStep::Answer(StoreClaim::Acquired {
            token: fencing_token(row.token),
            lease_ends_at: from_micros(row.expires_at),
            took_over: row.took_over,
        }));
    }
    if row.lapsed {
        return Ok(ClaimStep::TurnUnknown { token: row.token });
    }
    if !row.live {
        return Ok(ClaimStep::Dead);
    }
    if !same_request(stored_key, asked, row.fingerprint.as_deref())? {
        return Ok(ClaimStep::Answer(StoreClaim::Mismatch));
    }
    let settled = from_micros(row.settled_at.unwrap_or(row.expires_at));
    Ok(ClaimStep::Answer(match row.state {
        PROCESSING => StoreClaim::InProgress { lease_ends_at: from_micros(row.expires_at) },
        COMPLETED => StoreClaim::Completed(Replay::new(
            row.body.clone().map(Bytes::from),
            settled,
            from_micros(row.expires_at),
        )),
        UNKNOWN => StoreClaim::Unknown { marked_at: settled },
        other => return Err(corrupt(stored_key, format_args!("its state is {other}"))),
    }))
}

/// The answer of a claim for `asked` that turned a lapse UNKNOWN, from the turned row's
/// `fingerprint` and `settled_at` (the mark: the lease's end).
pub fn turned_unknown(
    stored_key: &[u8],
    asked: Fingerprint,
    stored_fingerprint: Option<&[u8]>,
    marked_at: Option<i64>,
) -> Result<StoreClaim, StoreError> {
    if !same_request(stored_key, asked, stored_fingerprint)? {
        return Ok(StoreClaim::Mismatch);
    }
    let marked_at = marked_at.ok_or_else(|| no_mark(stored_key))?;
    Ok(StoreClaim::Unknown { marked_at: from_micros(marked_at) })
}

/// Whether the stored fingerprint is `asked`'s.
fn same_request(
    stored_key: &[u8],
    asked: Fingerprint,
    stored: Option<&[u8]>,
) -> Result<bool, StoreError> {
    let stored = stored.ok_or_else(|| corrupt(stored_key, "it has no fingerprint"))?;
    Ok(fingerprint(stored).map_err(|e| corrupt(stored_key, e))? == asked)
}

fn no_mark(stored_key: &[u8]) -> StoreError {
    corrupt(stored_key, "it has no mark time (settled_at)")
}

/// The record a settling write stored: `body`, completed at `settled_at`, kept until
/// `expires_at`.
pub fn replay(body: Option<Bytes>, settled_at: i64, expires_at: i64) -> Replay<SystemTime> {
    Replay::new(body, from_micros(settled_at), from_micros(expires_at))
}

/// One row of an UNKNOWN listing: the record's key, fingerprint, token, mark time and
/// expiry, as the dialects' listing statements return them.
pub fn unknown_entry(
    stored_key: &[u8],
    stored_fingerprint: &[u8],
    token: i64,
    marked_at: Option<i64>,
    expires_at: i64,
) -> Result<UnknownEntry<SystemTime>, StoreError> {
    Ok(UnknownEntry::new(
        key(stored_key)?,
        fingerprint(stored_fingerprint).map_err(|e| corrupt(stored_key, e))?,
        fencing_token(token),
        from_micros(marked_at.ok_or_else(|| no_mark(stored_key))?),
        from_micros(expires_at),
    ))
}

/// A column of the record stored under `stored_key` that the driver could not read as
/// its type (another type, or NULL where a value belongs), as [`StoreError::Corrupt`].
pub fn unreadable(stored_key: &[u8], column: &str, why: impl fmt::Display) -> StoreError {
    corrupt(stored_key, format_args!("column {column}: {why}"))
}

/// A token as its `BIGINT` column holds it: the bits of the `u64`.
pub fn token(token: FencingToken) -> i64 {
    token.get() as i64
}

/// A `BIGINT` token column as the token (the inverse of [`token`]).
pub fn fencing_token(column: i64) -> FencingToken {
    FencingToken::new(column as u64)
}

/// A count as a `LIMIT` takes it (past `i64::MAX`, no limit).
pub fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A count of deleted rows as `purge_expired` returns it (a negative count is none).
pub fn purged(n: i64) -> usize {
    usize::try_from(n).unwrap_or(if n < 0 { 0 } else { usize::MAX })
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemcache::Key;

    fn row(state: i16) -> ClaimRow {
        ClaimRow {
            state,
            token: 7,
            fingerprint: Some(Fingerprint::of(b"r").to_bytes().to_vec()),
            body: Some(b"ok".to_vec()),
            settled_at: Some(10),
            expires_at: 20,
            live: true,
            lapsed: false,
            took_over: false,
        }
    }

    #[test]
    fn a_claim_row_decodes_to_the_contracts_answer() {
        let k = Key::new("POST /x", "t", "k-1").unwrap();
        let (key, r) = (k.as_bytes(), Fingerprint::of(b"r"));
        let answer = |row: &ClaimRow| claim(key, r, row).unwrap();
        let acquired = answer(&ClaimRow { fingerprint: None, ..row(TAKEN) });
        assert_eq!(
            acquired,
            ClaimStep::Answer(StoreClaim::Acquired {
                token: FencingToken::new(7),
                lease_ends_at: from_micros(20),
                took_over: false,
            })
        );
        assert!(matches!(
            answer(&row(PROCESSING)),
            ClaimStep::Answer(StoreClaim::InProgress { .. })
        ));
        let ClaimStep::Answer(StoreClaim::Completed(replay)) = answer(&row(COMPLETED)) else {
            panic!()
        };
        assert_eq!(
            (replay.body.as_deref(), replay.completed_at),
            (Some(&b"ok"[..]), from_micros(10))
        );
        assert_eq!(
            answer(&row(UNKNOWN)),
            ClaimStep::Answer(StoreClaim::Unknown { marked_at: from_micros(10) })
        );
        let other = claim(key, Fingerprint::of(b"other"), &row(COMPLETED)).unwrap();
        assert_eq!(other, ClaimStep::Answer(StoreClaim::Mismatch));
        assert_eq!(answer(&ClaimRow { live: false, ..row(COMPLETED) }), ClaimStep::Dead);
        let lapsed = ClaimRow { live: false, lapsed: true, ..row(PROCESSING) };
        assert_eq!(answer(&lapsed), ClaimStep::TurnUnknown { token: 7 });
        assert_eq!(
            turned_unknown(key, r, lapsed.fingerprint.as_deref(), Some(20)).unwrap(),
            StoreClaim::Unknown { marked_at: from_micros(20) }
        );
    }

    #[test]
    fn unreadable_rows_are_corrupt_and_name_their_key() {
        let k = Key::new("POST /x", "t", "k-9").unwrap();
        let (key, r) = (k.as_bytes(), Fingerprint::of(b"r"));
        let named = |e: StoreError| match e {
            StoreError::Corrupt(why) => assert!(why.contains("k-9"), "{why}"),
            other => panic!("{other:?}"),
        };
        named(claim(key, r, &ClaimRow { state: 9, ..row(9) }).unwrap_err());
        named(claim(key, r, &ClaimRow { fingerprint: Some(vec![1, 2, 3]), ..row(2) }).unwrap_err());
        named(claim(key, r, &ClaimRow { fingerprint: None, ..row(2) }).unwrap_err());
        named(turned_unknown(key, r, Some(&r.to_bytes()), None).unwrap_err());
        named(unknown_entry(key, &r.to_bytes(), 1, None, 5).unwrap_err());
        named(unreadable(key, "state", "NULL"));
        let Err(StoreError::Corrupt(why)) = unknown_entry(&[0xff], &r.to_bytes(), 1, Some(1), 2)
        else {
            panic!()
        };
        assert!(why.contains("ff"), "{why}");
        let entry = unknown_entry(key, &r.to_bytes(), -1, Some(1), 2).unwrap();
        assert_eq!((entry.key, entry.token), (k, FencingToken::new(u64::MAX)));
    }

    #[test]
    fn counts_and_tokens_convert_both_ways() {
        assert_eq!(limit(usize::MAX), i64::MAX);
        assert_eq!((purged(-1), purged(3)), (0, 3));
        let t = FencingToken::new(u64::MAX);
        assert_eq!(fencing_token(token(t)), t);
    }
}
