//! The SQL the store runs, one constant a statement, each judged by SQLite's clock.
//!
//! Invariant: "now" is SQLite's (`unixepoch('subsec')` in µs) in every statement that
//! judges a record, never the process's; every write to a held record names the
//! caller's token and a live lease (`token = ?2 AND state = 1 AND expires_at > now`),
//! so a stale owner's write matches no row; a lapsed lease is UNKNOWN to a statement
//! exactly when it lapsed less than the handle's unknown TTL (bound, 0 under
//! `TakeOver`) ago.

/// "Now" on SQLite's clock, in microseconds since the epoch: a macro, so every statement
/// is one `concat!`ed constant.
macro_rules! now {
    () => {
        "CAST(unixepoch('subsec') * 1000000 AS INTEGER)"
    };
}

/// A record "lapsed less than `?N` µs ago": PROCESSING, past its lease, and within the
/// unknown TTL of `LapsePolicy::MarkUnknown` (never true when the TTL is 0, `TakeOver`).
/// Such a record is UNKNOWN to every statement of a `MarkUnknown` handle.
macro_rules! lapsed_within {
    ($ttl:literal) => {
        concat!(
            "(state = 1 AND expires_at <= ",
            now!(),
            " AND expires_at + ",
            $ttl,
            " > ",
            now!(),
            ")"
        )
    };
}

/// A lapsed lease a purge keeps: lapsed less than the unknown TTL `?N` µs ago, or less
/// than the time it was held (`expires_at - started_at`, at least one lease), so that a
/// claim after the lapse still finds the execution it takes over and answers
/// `took_over` (Redis keeps its key as long).
macro_rules! lapse_kept {
    ($ttl:literal) => {
        concat!(
            "(state = 1 AND expires_at <= ",
            now!(),
            " AND expires_at + MAX(",
            $ttl,
            ", expires_at - started_at) > ",
            now!(),
            ")"
        )
    };
}

/// A live UNKNOWN record, or one a lapse made so (see [`lapsed_within`]).
macro_rules! unknown_or_lapsed {
    ($ttl:literal) => {
        concat!("((state = 3 AND expires_at > ", now!(), ") OR ", lapsed_within!($ttl), ")")
    };
}

/// "The row is the listed one", binding `$token` (the listed token, or NULL: any row).
macro_rules! listed {
    ($token:literal) => {
        concat!("(", $token, " IS NULL OR token = ", $token, ")")
    };
}

/// SQLite's now.
pub(crate) const NOW: &str = concat!("SELECT ", now!());

/// The record of `?1` and the statement's "now" (one read: one snapshot, one clock).
pub(crate) const RECORD: &str = concat!(
    "SELECT ",
    now!(),
    ", fingerprint, state, body, settled_at, expires_at FROM idemcache_records WHERE key = ?1"
);

/// A lapsed lease of `?1` turned UNKNOWN, marked at its end, until `?2`.
pub(crate) const TURN_UNKNOWN: &str =
    "UPDATE idemcache_records SET state = 3, settled_at = expires_at, expires_at = ?2
     WHERE key = ?1";

/// The next fencing token (no row: the counter is gone).
pub(crate) const NEXT_TOKEN: &str =
    "UPDATE idemcache_tokens SET last = last + 1 WHERE id = 1 RETURNING last";

/// `?1` claimed for the fingerprint `?2` under the token `?3` at `?4`, its lease ending
/// at `?5`, with the correlation id `?6` (or NULL), over whatever record was there.
pub(crate) const ACQUIRE: &str = "INSERT OR REPLACE INTO idemcache_records
     (key, fingerprint, state, token, body, started_at, settled_at, expires_at, correlation_id)
 VALUES (?1, ?2, 1, ?3, NULL, ?4, NULL, ?5, ?6)";

/// PROCESSING → COMPLETED of `?1` under the token `?2`, the body `?3` kept for `?4` µs,
/// while the lease is live; returns `settled_at, expires_at`. The store's `complete` and
/// [`complete_in`](crate::complete_in) (the same write in the caller's transaction)
/// share it.
pub(crate) const COMPLETE: &str = concat!(
    "UPDATE idemcache_records SET state = 2, body = ?3, settled_at = ",
    now!(),
    ", expires_at = ",
    now!(),
    " + ?4
     WHERE key = ?1 AND token = ?2 AND state = 1 AND expires_at > ",
    now!(),
    "
     RETURNING settled_at, expires_at"
);

/// The live lease of `?1` under the token `?2` extended to `?3` µs from now; returns
/// `started_at, expires_at`.
pub(crate) const EXTEND_LEASE: &str = concat!(
    "UPDATE idemcache_records SET expires_at = ",
    now!(),
    " + ?3
     WHERE key = ?1 AND token = ?2 AND state = 1 AND expires_at > ",
    now!(),
    "
     RETURNING started_at, expires_at"
);

/// The live lease of `?1` under the token `?2` deleted.
pub(crate) const RELEASE: &str = concat!(
    "DELETE FROM idemcache_records WHERE key = ?1 AND token = ?2 AND state = 1 AND expires_at > ",
    now!()
);

/// PROCESSING → UNKNOWN of `?1` under the token `?2`, kept for `?3` µs, while the lease
/// is live; returns `settled_at, expires_at`.
pub(crate) const MARK_UNKNOWN: &str = concat!(
    "UPDATE idemcache_records SET state = 3, settled_at = ",
    now!(),
    ", expires_at = ",
    now!(),
    " + ?3
     WHERE key = ?1 AND token = ?2 AND state = 1 AND expires_at > ",
    now!(),
    "
     RETURNING settled_at, expires_at"
);

/// UNKNOWN (or lapsed within `?4` µs) → COMPLETED of `?1`, the body `?2` kept for `?3`
/// µs, of the listed token `?5` only if not NULL; returns `settled_at, expires_at`.
pub(crate) const RESOLVE: &str = concat!(
    "UPDATE idemcache_records SET state = 2, body = ?2, settled_at = ",
    now!(),
    ", expires_at = ",
    now!(),
    " + ?3
     WHERE key = ?1 AND ",
    unknown_or_lapsed!("?4"),
    " AND ",
    listed!("?5"),
    " RETURNING settled_at, expires_at"
);

/// UNKNOWN (or lapsed within `?2` µs) → absent of `?1`, of the listed token `?3` only if
/// not NULL.
pub(crate) const FORGET: &str = concat!(
    "DELETE FROM idemcache_records WHERE key = ?1 AND ",
    unknown_or_lapsed!("?2"),
    " AND ",
    listed!("?3")
);

/// Up to `?1` UNKNOWN records (a lapse within `?2` µs not yet turned by a claim reads as
/// the UNKNOWN it will be), in mark order: key, fingerprint, mark, expiry, token.
pub(crate) const LIST_UNKNOWN: &str = concat!(
    "SELECT key, fingerprint,
            CASE WHEN state = 1 THEN expires_at ELSE settled_at END AS marked,
            CASE WHEN state = 1 THEN expires_at + ?2 ELSE expires_at END,
            token
     FROM idemcache_records WHERE ",
    unknown_or_lapsed!("?2"),
    " ORDER BY marked, key LIMIT ?1"
);

/// Up to `?1` expired records deleted; a lapsed lease is kept while [`lapse_kept`]: the
/// unknown TTL `?2` µs (UNKNOWN to this handle until that mark would expire), or the
/// time it was held, whichever is longer.
pub(crate) const PURGE_EXPIRED: &str = concat!(
    "DELETE FROM idemcache_records WHERE key IN
         (SELECT key FROM idemcache_records WHERE expires_at <= ",
    now!(),
    " AND NOT ",
    lapse_kept!("?2"),
    " LIMIT ?1)"
);
