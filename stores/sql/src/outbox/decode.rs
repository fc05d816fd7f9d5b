//! A row of the outbox, as a driver read it, turned into an [`OutboxRow`] or a
//! [`Claimed`] message; and what a driver's statement answered, turned into the
//! outbox's answer ([`claimed_batch`], [`mark`]), with the values a fenced statement
//! binds ([`lease_token`], [`failed_as`]). Every driver decides these here, once.
//!
//! Every read statement of every dialect returns the same columns, in the order of
//! [`RawRow`]'s fields (`COLUMNS` in [`postgres`](super::postgres) and
//! [`mysql`](super::mysql)); a driver reads them as plain values (text as bytes, numbers
//! as `i64`) and hands them here.
//!
//! Invariant: whatever the columns hold, the answer is a value or
//! [`OutboxError::Corrupt`] naming the row's message id (or, for an id that is not
//! UTF-8, its bytes), never a panic.

use std::time::SystemTime;

use bytes::Bytes;
use idemcache::store::encoding::{from_micros, to_micros};

use super::{
    decode_headers, Batch, Claimed, Lease, Mark, Next, OutboxError, OutboxMessage, OutboxRow,
    Retry, State,
};

/// The columns of one outbox row, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawRow {
    /// `seq`: the row's place in enqueue order.
    pub seq: i64,
    /// `message_id`, as bytes.
    pub message_id: Vec<u8>,
    /// `topic`, as bytes.
    pub topic: Vec<u8>,
    /// `payload`.
    pub payload: Vec<u8>,
    /// `headers`, in [`encode_headers`](super::encode_headers)'s form.
    pub headers: Vec<u8>,
    /// `aggregate_key`, as bytes.
    pub aggregate_key: Option<Vec<u8>>,
    /// `state`: a [`State::code`].
    pub state: i64,
    /// `attempts`.
    pub attempts: i64,
    /// `next_attempt_at`, µs since the epoch.
    pub next_attempt_at: i64,
    /// `lease_until`, µs since the epoch.
    pub lease_until: Option<i64>,
    /// `token`.
    pub token: i64,
    /// `last_error`, as bytes.
    pub last_error: Option<Vec<u8>>,
    /// `created_at`, µs since the epoch.
    pub created_at: i64,
    /// `delivered_at`, µs since the epoch.
    pub delivered_at: Option<i64>,
}

/// The row as an operator sees it.
pub fn row(raw: RawRow) -> Result<(i64, OutboxRow), OutboxError> {
    let id = match String::from_utf8(raw.message_id) {
        Ok(id) => id,
        Err(e) => {
            let shown = String::from_utf8_lossy(e.as_bytes()).into_owned();
            return Err(OutboxError::corrupt(&shown, "the message id is not UTF-8"));
        }
    };
    let corrupt = |why: String| OutboxError::corrupt(&id, why);
    let utf8 = |what: &str, bytes: Vec<u8>| {
        String::from_utf8(bytes).map_err(|_| corrupt(format!("the {what} is not UTF-8")))
    };
    let topic = utf8("topic", raw.topic)?;
    let aggregate_key = raw.aggregate_key.map(|k| utf8("aggregate key", k)).transpose()?;
    let last_error = raw.last_error.map(|e| utf8("last error", e)).transpose()?;
    let headers =
        decode_headers(&raw.headers).map_err(|why| corrupt(format!("the headers: {why}")))?;
    let state = State::from_code(raw.state)
        .ok_or_else(|| corrupt(format!("the state {} is none of 0..=3", raw.state)))?;
    let attempts = u32::try_from(raw.attempts)
        .map_err(|_| corrupt(format!("the attempts {} are out of range", raw.attempts)))?;
    let token = u64::try_from(raw.token)
        .map_err(|_| corrupt(format!("the token {} is negative", raw.token)))?;
    if state == State::Leased && raw.lease_until.is_none() {
        return Err(corrupt("leased without a lease end".to_owned()));
    }
    let message =
        OutboxMessage::from_parts(id, topic, Bytes::from(raw.payload), headers, aggregate_key);
    let time = |us: i64| -> SystemTime { from_micros(us) };
    Ok((
        raw.seq,
        OutboxRow {
            message,
            state,
            attempts,
            next_attempt_at: time(raw.next_attempt_at),
            lease_until: raw.lease_until.map(time),
            token,
            last_error,
            created_at: time(raw.created_at),
            delivered_at: raw.delivered_at.map(time),
        },
    ))
}

/// A row a claim returned, as the message to publish under its lease. The row must be
/// leased (the claim just leased it) under a token.
pub fn claimed(raw: RawRow) -> Result<(i64, Claimed), OutboxError> {
    let (seq, row) = row(raw)?;
    let id = row.message.id().to_owned();
    if row.state != State::Leased || row.token == 0 {
        return Err(OutboxError::corrupt(
            &id,
            format_args!(
                "a claim returned it {:?} with {} attempts and token {}",
                row.state, row.attempts, row.token
            ),
        ));
    }
    let lease = Lease { message_id: id, token: row.token, attempts: row.attempts };
    Ok((seq, Claimed { message: row.message, lease }))
}

/// The rows a claim returned, decoded and put in enqueue order (a statement's
/// `RETURNING` promises no order).
pub fn batch(rows: Vec<RawRow>) -> super::Batch {
    let mut decoded = Vec::with_capacity(rows.len());
    let mut unreadable = Vec::new();
    for raw in rows {
        match claimed(raw) {
            Ok(c) => decoded.push(c),
            Err(e) => unreadable.push(e),
        }
    }
    decoded.sort_by_key(|(seq, _)| *seq);
    super::Batch { claimed: decoded.into_iter().map(|(_, c)| c).collect(), unreadable }
}

/// The rows a claim returned, each as the driver read it (a column it could not read
/// is already `Corrupt`): decoded, in enqueue order, the unreadable ones set aside in
/// [`Batch::unreadable`] so that they hold back no other.
pub fn claimed_batch(rows: impl IntoIterator<Item = Result<RawRow, OutboxError>>) -> Batch {
    let mut raws = Vec::new();
    let mut unreadable = Vec::new();
    for row in rows {
        match row {
            Ok(raw) => raws.push(raw),
            Err(e) => unreadable.push(e),
        }
    }
    let mut decoded = batch(raws);
    decoded.unreadable.extend(unreadable);
    decoded
}

/// What a fenced mark did, from the rows its `UPDATE` changed: one is
/// [`Mark::Applied`], none is [`Mark::Stale`] (the lease is no longer the row's).
pub fn mark(changed: u64) -> Mark {
    if changed == 1 {
        Mark::Applied
    } else {
        Mark::Stale
    }
}

/// A lease's token as a statement binds it: no row holds one above `i64::MAX`, so such
/// a lease is `InvalidInput`.
pub fn lease_token(lease: &Lease) -> Result<i64, OutboxError> {
    i64::try_from(lease.token)
        .map_err(|_| OutboxError::InvalidInput(format!("a token of {} is no row's", lease.token)))
}

/// Whether a claimed row is out of attempts before the relay publishes it: every one of
/// its `max_attempts` publishes was begun and none was marked. A relay died publishing
/// it each time (a poison message that kills its relay); or, the limits, a publish
/// outlived its lease (the broker may have it) or a count's answer was lost after it
/// committed. The relay makes it dead without publishing it. A row whose last publish
/// failed is dead already, and a row that only waited behind such a one was never
/// counted. Lowering `max_attempts` makes pending rows at or above it dead at their next
/// claim, unpublished.
pub fn out_of_attempts(lease: &Lease, retry: &Retry) -> bool {
    lease.attempts >= retry.max_attempts()
}

/// The lease once [`OutboxStorage::begin_attempt`](super::OutboxStorage::begin_attempt)
/// counted its publish: one attempt more, the one a failure of this publish is charged
/// with.
pub fn begun(lease: &Lease) -> Lease {
    Lease { attempts: lease.attempts.saturating_add(1), ..lease.clone() }
}

/// What a statement that marks one row and counts the next (PostgreSQL's
/// `DELIVERED_AND_BEGIN`) did, as each part's answer: its failure is the mark's, and
/// the count's says it did not run alone.
pub fn both(
    answered: Result<(Mark, Mark), OutboxError>,
) -> (Result<Mark, OutboxError>, Result<Mark, OutboxError>) {
    match answered {
        Ok((marked, counted)) => (Ok(marked), Ok(counted)),
        Err(e) => {
            let count =
                OutboxError::Database(format!("counted with a mark that failed: {e}").into());
            (Err(e), Err(count))
        }
    }
}

/// The state and due time (microseconds) a failure at `now` leaves a row in: pending
/// after `retry`'s backoff, or dead after its last attempt.
pub fn failed_as(lease: &Lease, now: SystemTime, retry: &Retry) -> (State, i64) {
    match retry.after(lease.attempts, now) {
        Next::At(at) => (State::Pending, to_micros(at)),
        Next::Dead => (State::Dead, to_micros(now)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn leased() -> RawRow {
        RawRow {
            seq: 1,
            message_id: b"m-1".to_vec(),
            topic: b"orders".to_vec(),
            payload: b"{}".to_vec(),
            state: 1,
            attempts: 1,
            token: 1,
            lease_until: Some(5),
            ..RawRow::default()
        }
    }

    #[test]
    fn a_leased_row_is_a_claim() {
        let (seq, c) = claimed(leased()).unwrap();
        assert_eq!(seq, 1);
        assert_eq!(c.lease, Lease { message_id: "m-1".into(), token: 1, attempts: 1 });
        assert_eq!(c.message.topic(), "orders");
    }

    #[test]
    fn a_claimed_row_no_publish_was_begun_of_is_a_claim() {
        let (_, c) = claimed(RawRow { attempts: 0, ..leased() }).unwrap();
        assert_eq!(c.lease.attempts, 0, "a claim counts no attempt");
        assert_eq!(begun(&c.lease).attempts, 1, "its publish does");
        let top = Lease { attempts: u32::MAX, ..c.lease };
        assert_eq!(begun(&top).attempts, u32::MAX, "never wraps to a first attempt");
    }

    #[test]
    fn a_failed_mark_and_count_is_both_parts_failure() {
        let (marked, counted) = both(Ok((Mark::Applied, Mark::Stale)));
        assert_eq!((marked.unwrap(), counted.unwrap()), (Mark::Applied, Mark::Stale));
        let (marked, counted) = both(Err(OutboxError::Database("reset".into())));
        assert!(marked.unwrap_err().to_string().contains("reset"));
        let counted = counted.unwrap_err().to_string();
        assert!(counted.contains("counted with a mark that failed") && counted.contains("reset"));
    }

    #[test]
    fn only_a_row_every_attempt_was_begun_of_is_out_of_attempts() {
        let retry = Retry::new(Duration::from_secs(1), Duration::from_secs(2), 3).unwrap();
        let lease = |attempts| Lease { message_id: "m".into(), token: 9, attempts };
        assert!(!out_of_attempts(&lease(0), &retry));
        assert!(!out_of_attempts(&lease(2), &retry), "its last attempt is still to come");
        assert!(out_of_attempts(&lease(3), &retry));
        assert!(out_of_attempts(&lease(7), &retry));
        let (state, _) = failed_as(&lease(3), SystemTime::UNIX_EPOCH, &retry);
        assert_eq!(state, State::Dead, "the relay's charge makes it dead");
    }

    #[test]
    fn every_unreadable_column_is_corrupt_and_named() {
        let cases: Vec<(RawRow, &str)> = vec![
            (RawRow { message_id: vec![0xff], ..leased() }, "message id is not UTF-8"),
            (RawRow { topic: vec![0xff], ..leased() }, "topic is not UTF-8"),
            (RawRow { aggregate_key: Some(vec![0xc3]), ..leased() }, "aggregate key"),
            (RawRow { headers: vec![0, 9], ..leased() }, "the headers"),
            (RawRow { state: 9, ..leased() }, "state 9"),
            (RawRow { attempts: -1, ..leased() }, "attempts -1"),
            (RawRow { token: -4, ..leased() }, "token -4"),
            (RawRow { lease_until: None, ..leased() }, "without a lease end"),
            (RawRow { state: 0, ..leased() }, "a claim returned it Pending"),
        ];
        for (raw, says) in cases {
            let e = claimed(raw).unwrap_err();
            assert!(matches!(e, OutboxError::Corrupt(_)), "{e:?}");
            assert!(e.to_string().contains(says), "{e}");
        }
    }

    #[test]
    fn a_batch_is_in_enqueue_order_and_keeps_the_unreadable_apart() {
        let rows = vec![
            RawRow { seq: 3, message_id: b"c".to_vec(), ..leased() },
            RawRow { seq: 2, state: 7, ..leased() },
            RawRow { seq: 1, message_id: b"a".to_vec(), ..leased() },
        ];
        let b = batch(rows);
        let ids: Vec<&str> = b.claimed.iter().map(|c| c.message.id()).collect();
        assert_eq!(ids, ["a", "c"]);
        assert_eq!(b.unreadable.len(), 1);
    }
}
