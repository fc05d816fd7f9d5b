//! The records table in PostgreSQL: its schema and statements, run alike by
//! `idemcache-postgres` (tokio-postgres) and `idemcache-sqlx` (sqlx). Each statement's
//! docs list its parameters (`$1`, `$2`, ...; `bytea`, `bigint`) and the columns it
//! returns, which [`decode`](super::decode) reads.
//!
//! Invariant: every operation is one statement, judged by the server's clock
//! (`clock_timestamp()`, read once per statement, so a statement inside a caller's
//! transaction sees the time it runs, not the transaction's start). [`CLAIM`] is one
//! `INSERT ... ON CONFLICT DO UPDATE ... WHERE <the holder is dead>` that also reads
//! the live holder in the same statement; tokens come from the sequence
//! `idemcache_tokens`, so they increase across processes and restarts; every later
//! write names its token in its `WHERE`. Under `LapsePolicy::MarkUnknown` (its unknown
//! TTL bound as a parameter, 0 under `TakeOver`) the claim never takes over a record
//! that lapsed less than the TTL ago: it returns it, flagged, and [`TURN_UNKNOWN`],
//! fenced by its token, turns it UNKNOWN.

/// The schema (PostgreSQL): the token sequence, the table and its expiry index. Run it
/// through [`ensure_schema`], which runs it once per database under an advisory lock.
/// `state` 1 PROCESSING, 2 COMPLETED, 3 UNKNOWN; `expires_at` the lease's end while
/// PROCESSING, the TTL's after; times in microseconds since the epoch (server clock);
/// `correlation_id` the one the claim that made the record was given (NULL: none).
pub const SCHEMA: &str = "
CREATE SEQUENCE IF NOT EXISTS idemcache_tokens;
CREATE TABLE IF NOT EXISTS idemcache_records (
    key         BYTEA PRIMARY KEY,
    fingerprint BYTEA NOT NULL,
    state       SMALLINT NOT NULL CHECK (state IN (1, 2, 3)),
    token       BIGINT NOT NULL,
    body        BYTEA,
    started_at  BIGINT NOT NULL,
    settled_at  BIGINT,
    expires_at  BIGINT NOT NULL,
    correlation_id TEXT
);
CREATE INDEX IF NOT EXISTS idemcache_records_expiry ON idemcache_records (expires_at);
";

/// What [`SCHEMA`] added since an earlier release made the table: its `correlation_id`
/// column. [`ensure_schema`] adds what is missing.
const UPGRADE: &str = "ALTER TABLE idemcache_records ADD COLUMN IF NOT EXISTS correlation_id TEXT;";

/// The advisory lock [`ensure_schema`] creates the records' schema under.
pub const SCHEMA_LOCK: i64 = 7_315_993_121;

/// [`SCHEMA`] as one statement to run (a batch, no parameters): skipped when the expiry
/// index (the object it creates last) exists, else run under [`SCHEMA_LOCK`]; then, on
/// a table an earlier release made, the columns added since, under the same lock and
/// only when missing (`ALTER TABLE` takes the table's exclusive lock even when it
/// changes nothing, and would queue behind every open transaction that wrote to it).
pub fn ensure_schema() -> String {
    format!(
        "{created}
         DO $idemcache$ BEGIN
           IF NOT EXISTS (SELECT 1 FROM pg_attribute
                          WHERE attrelid = to_regclass('idemcache_records')
                            AND attname = 'correlation_id' AND NOT attisdropped) THEN
             PERFORM pg_advisory_xact_lock({SCHEMA_LOCK});
             {UPGRADE}
           END IF;
         END $idemcache$;",
        created = schema_once(SCHEMA_LOCK, "idemcache_records_expiry", SCHEMA),
    )
}

/// `ddl` run once per database, as one statement: skipped when `last` (the object `ddl`
/// creates last) exists, else run under the advisory lock `lock`, so processes starting
/// together do not collide (concurrent `CREATE ... IF NOT EXISTS` can). The check comes
/// first because `CREATE INDEX IF NOT EXISTS` takes its table's lock before it finds the
/// index there: it would wait for every open transaction that wrote to the table (a
/// handler's, holding a record it completes in its own transaction), and every later
/// writer would queue behind it, so a restarting instance would stall the others.
pub fn schema_once(lock: i64, last: &str, ddl: &str) -> String {
    format!(
        "DO $idemcache$ BEGIN
           IF to_regclass('{last}') IS NULL THEN
             PERFORM pg_advisory_xact_lock({lock});
             {ddl}
           END IF;
         END $idemcache$;"
    )
}

/// "Now" on the server's clock, in microseconds, as a one-row CTE named `now`: a macro,
/// so every statement is one `concat!`ed constant.
macro_rules! now {
    () => {
        "now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us)"
    };
}

/// Record `r` "lapsed less than `$N` µs ago" (against the `now` CTE): PROCESSING, past
/// its lease, within the unknown TTL of `LapsePolicy::MarkUnknown` (never true when the
/// TTL is 0, `TakeOver`). Such a record is UNKNOWN to every statement of a
/// `MarkUnknown` handle.
macro_rules! lapsed_within {
    ($ttl:literal) => {
        concat!("(r.state = 1 AND r.expires_at <= now.us AND r.expires_at + ", $ttl, " > now.us)")
    };
}

/// Record `r` a lapsed lease a purge keeps (against the `now` CTE): lapsed less than the
/// unknown TTL `$N` µs ago, or less than the time it was held (`expires_at - started_at`,
/// at least one lease), so that a claim after the lapse still finds the execution it
/// takes over and answers `took_over` (Redis keeps its key as long). In `numeric`: a row
/// whose columns are far apart (one no store writes) must not overflow the `bigint`
/// arithmetic and fail the purge of the whole table.
macro_rules! lapse_kept {
    ($ttl:literal) => {
        concat!(
            "(r.state = 1 AND r.expires_at <= now.us
              AND r.expires_at::numeric + GREATEST(",
            $ttl,
            "::bigint, r.expires_at::numeric - r.started_at) > now.us)"
        )
    };
}

/// A live UNKNOWN record, or one a lapse made so (see [`lapsed_within`]).
macro_rules! unknown_or_lapsed {
    ($ttl:literal) => {
        concat!("((r.state = 3 AND r.expires_at > now.us) OR ", lapsed_within!($ttl), ")")
    };
}

/// "Record `r` is the listed one", binding `$token` (the listed token, or NULL: any
/// record). A listed token comes from `idemcache_tokens`, never handed out twice, so a
/// settling write "of it" matches only that execution's row, never a later one's,
/// whatever their fingerprints and mark times.
macro_rules! listed {
    ($token:literal) => {
        concat!("(", $token, "::bigint IS NULL OR r.token = ", $token, "::bigint)")
    };
}

/// The claim statement, taking the key `on conflict` as given ([`CLAIM`] takes a dead
/// record, [`CLAIM_ABSENT`] none): both bind and return alike.
macro_rules! claim {
    ($on_conflict:literal) => {
        concat!(
            "WITH ",
            now!(),
            ",
         before AS (SELECT r.state FROM idemcache_records r WHERE r.key = $1),
         taken AS (
             INSERT INTO idemcache_records AS r
                 (key, fingerprint, state, token, body, started_at, settled_at, expires_at,
                  correlation_id)
             SELECT $1, $2, 1, nextval('idemcache_tokens'), NULL, now.us, NULL, now.us + $3,
                    $5::text FROM now
             ",
            $on_conflict,
            "
             RETURNING token, expires_at
         )
         SELECT 0::smallint AS state, token, NULL::bytea AS fingerprint, NULL::bytea AS body,
                NULL::bigint AS settled_at, expires_at, true AS live, false AS lapsed,
                coalesce((SELECT state = 1 FROM before), false) AS took_over
         FROM taken
         UNION ALL
         SELECT r.state, r.token, r.fingerprint, r.body, r.settled_at, r.expires_at,
                r.expires_at > now.us, ",
            lapsed_within!("$4"),
            ", false AS took_over
         FROM idemcache_records r, now
         WHERE r.key = $1 AND NOT EXISTS (SELECT 1 FROM taken)"
        )
    };
}

/// The claim of `$1` (key) for `$2` (fingerprint) with a lease of `$3` µs, `$4` the
/// unknown TTL (0 under `TakeOver`), `$5` the correlation id (`text`, or NULL) an
/// acquired record keeps: take the key if absent or dead, else read its holder; one
/// statement. Returns at most one row, a
/// [`ClaimRow`](super::decode::ClaimRow): `state, token, fingerprint, body,
/// settled_at, expires_at, live, lapsed, took_over` (named so, for a driver's error to
/// name). `took_over` is the state the record had in the statement's snapshot (a
/// PROCESSING record taken is a takeover): a record that changed hands while the
/// statement waited for its row is reported as it was when the statement began. No row: a holder committed after this
/// statement's snapshot blocked the insert but is not visible to the read: run it again.
pub const CLAIM: &str = claim!(
    "ON CONFLICT (key) DO UPDATE SET
                 fingerprint = EXCLUDED.fingerprint, state = 1, token = EXCLUDED.token,
                 body = NULL, started_at = EXCLUDED.started_at, settled_at = NULL,
                 expires_at = EXCLUDED.expires_at, correlation_id = EXCLUDED.correlation_id
             WHERE r.expires_at <= EXCLUDED.started_at
               AND NOT (r.state = 1 AND r.expires_at + $4 > EXCLUDED.started_at)"
);

/// [`CLAIM`] for a claim made inside a caller's transaction, which holds what it locks
/// until that transaction ends: the same parameters and row, but it takes only an absent
/// key (`ON CONFLICT DO NOTHING`, which locks no existing row, where `DO UPDATE` locks the
/// conflicting row even when its `WHERE` declines it) and reads any other. A dead record
/// it reads ([`decode::claim`](super::decode::claim) answers `Dead`) is taken by
/// [`CLAIM`] next, which locks the row it takes. It waits, as [`CLAIM`] does, for a
/// concurrent transaction that inserted the key to end; no row then: run it again.
pub const CLAIM_ABSENT: &str = claim!("ON CONFLICT (key) DO NOTHING");

/// The one-commit claim's bound on a wait for another transaction: the transaction's
/// `lock_timeout` as it was kept in the transaction's setting `idemcache.lock_timeout`,
/// then set to `wait` in whole milliseconds, at least 1 (0 would mean no bound) and at
/// most PostgreSQL's limit. Two statements (run it as a simple query, or with sqlx's
/// `raw_sql`), sent as text (a number, never a caller's string); [`RESET_CLAIM_WAIT`]
/// puts the kept value back, so the statements after it wait as the session says.
/// What it bounds: the wait for the key's turn ([`claim_turn`]), and a claim's later
/// statements on the key's existing row (the takeover of a dead record, the turn of a
/// lapsed lease to UNKNOWN), never the insert of a fresh key.
pub fn bound_claim_wait(wait: std::time::Duration) -> String {
    format!(
        "SELECT set_config('idemcache.lock_timeout', current_setting('lock_timeout'), true); \
         SET LOCAL lock_timeout = {}",
        wait.as_millis().clamp(1, i32::MAX as u128)
    )
}

/// The transaction's `lock_timeout` back to what [`bound_claim_wait`] found.
pub const RESET_CLAIM_WAIT: &str =
    "SELECT set_config('lock_timeout', current_setting('idemcache.lock_timeout'), true)";

/// The one-commit claim's turn on its key, taken before the claim in the same
/// transaction, under [`bound_claim_wait`] (as a simple query, or with sqlx's
/// `raw_sql`; a number only, never a caller's string): a transaction-level advisory
/// lock on the key's 64-bit hash ([`claim_turn_lock`]).
///
/// Every one-commit claim of a key takes it first and holds it until its transaction
/// ends, so a duplicate waits for exactly the transaction that holds its key, and the
/// bound running out here (`lock_not_available`) means that: the answer is
/// `InProgress`. The insert of a fresh key after it then waits as the session says on
/// anything else it meets (a table lock, the locks of concurrent writers of other
/// keys), which is no holder of this key: when the claim itself ran under the bound, such
/// a wait under load answered a fresh key `InProgress`, a 409 saying that a request with
/// its key runs, which was false. Two keys share a turn only when their 64-bit hashes
/// collide; the lock space is the one `pg_advisory_xact_lock(bigint)` shares with the
/// application's own advisory locks.
pub fn claim_turn(key: &[u8]) -> String {
    format!("SELECT pg_advisory_xact_lock({})", claim_turn_lock(key))
}

/// The advisory lock [`claim_turn`] takes for `key`: the first 8 bytes of its
/// [`Fingerprint`](idemcache::Fingerprint), big-endian.
pub fn claim_turn_lock(key: &[u8]) -> i64 {
    let hash = idemcache::Fingerprint::of(key).to_bytes();
    i64::from_be_bytes([hash[0], hash[1], hash[2], hash[3], hash[4], hash[5], hash[6], hash[7]])
}

/// `LapsePolicy::MarkUnknown`: the lapsed lease of `$1` (key) claimed under `$2`
/// (token) turns UNKNOWN, marked at its end and kept `$3` µs (the unknown TTL) from
/// there. Returns `fingerprint, settled_at`; no row if the record moved on since the
/// claim read it.
pub const TURN_UNKNOWN: &str = concat!(
    "WITH ",
    now!(),
    " UPDATE idemcache_records r
     SET state = 3, settled_at = r.expires_at, expires_at = r.expires_at + $3 FROM now
     WHERE r.key = $1 AND r.token = $2 AND ",
    lapsed_within!("$3"),
    " RETURNING r.fingerprint, r.settled_at"
);

/// PROCESSING → COMPLETED of `$1` (key) under `$2` (token), the body `$3` (or NULL)
/// kept for `$4` µs, while the lease is live. Returns `settled_at, expires_at`; no row:
/// the lease was lost. The store's `complete` and a completion in the caller's
/// transaction share it: `clock_timestamp()`, not `now()`, whose value inside a
/// caller's transaction is when it began, so a lease that lapsed since would look live.
pub const COMPLETE: &str = concat!(
    "WITH ",
    now!(),
    " UPDATE idemcache_records r
     SET state = 2, body = $3, settled_at = now.us, expires_at = now.us + $4 FROM now
     WHERE r.key = $1 AND r.token = $2 AND r.state = 1 AND r.expires_at > now.us
     RETURNING r.settled_at, r.expires_at"
);

/// [`COMPLETE`] for a completion sent together with its transaction's `COMMIT`: the same
/// parameters and write, but a lost lease is an error (`division_by_zero`: it divides by
/// the rows it completed), which aborts the transaction, so the `COMMIT` behind it rolls
/// back instead of committing a business change without its record. Returns one row
/// (`1`) when it completed.
pub const COMPLETE_OR_ABORT: &str = concat!(
    "WITH ",
    now!(),
    ", done AS (UPDATE idemcache_records r
     SET state = 2, body = $3, settled_at = now.us, expires_at = now.us + $4 FROM now
     WHERE r.key = $1 AND r.token = $2 AND r.state = 1 AND r.expires_at > now.us
     RETURNING 1)
     SELECT 1 / count(*)::int FROM done"
);

/// The live lease of `$1` (key) under `$2` (token) renewed to end `$3` µs from now.
/// Returns `started_at, expires_at`; no row: the lease was lost.
pub const EXTEND: &str = concat!(
    "WITH ",
    now!(),
    " UPDATE idemcache_records r SET expires_at = now.us + $3 FROM now
     WHERE r.key = $1 AND r.token = $2 AND r.state = 1 AND r.expires_at > now.us
     RETURNING r.started_at, r.expires_at"
);

/// PROCESSING → absent of `$1` (key) under `$2` (token), while the lease is live.
/// Returns `started_at, expires_at`; no row: the lease was lost.
pub const RELEASE: &str = concat!(
    "WITH ",
    now!(),
    " DELETE FROM idemcache_records r USING now
     WHERE r.key = $1 AND r.token = $2 AND r.state = 1 AND r.expires_at > now.us
     RETURNING r.started_at, r.expires_at"
);

/// PROCESSING → UNKNOWN of `$1` (key) under `$2` (token), kept `$3` µs from now, while
/// the lease is live. Returns `settled_at, expires_at`; no row: the lease was lost.
pub const MARK_UNKNOWN: &str = concat!(
    "WITH ",
    now!(),
    " UPDATE idemcache_records r
     SET state = 3, settled_at = now.us, expires_at = now.us + $3 FROM now
     WHERE r.key = $1 AND r.token = $2 AND r.state = 1 AND r.expires_at > now.us
     RETURNING r.settled_at, r.expires_at"
);

/// UNKNOWN → COMPLETED of `$1` (key) with the body `$2` (or NULL) kept `$3` µs, `$4`
/// the unknown TTL (a lapse is UNKNOWN too), `$5` the listed token (or NULL: whichever
/// execution holds it). Returns `settled_at, expires_at`; no row: the key has no such
/// UNKNOWN record.
pub const RESOLVE: &str = concat!(
    "WITH ",
    now!(),
    " UPDATE idemcache_records r
     SET state = 2, body = $2, settled_at = now.us, expires_at = now.us + $3 FROM now
     WHERE r.key = $1 AND ",
    unknown_or_lapsed!("$4"),
    " AND ",
    listed!("$5"),
    " RETURNING r.settled_at, r.expires_at"
);

/// UNKNOWN → absent of `$1` (key), `$2` the unknown TTL, `$3` the listed token (or
/// NULL). Returns `started_at, expires_at`; no row: the key has no such UNKNOWN record.
pub const FORGET: &str = concat!(
    "WITH ",
    now!(),
    " DELETE FROM idemcache_records r USING now
     WHERE r.key = $1 AND ",
    unknown_or_lapsed!("$2"),
    " AND ",
    listed!("$3"),
    " RETURNING r.started_at, r.expires_at"
);

/// Up to `$1` live UNKNOWN records, oldest mark first, `$2` the unknown TTL (a lapse
/// not yet turned by a claim reads as the UNKNOWN it will be). Returns `key,
/// fingerprint, marked_at, expires_at, token` (for
/// [`unknown_entry`](super::decode::unknown_entry)).
pub const UNKNOWN: &str = concat!(
    "WITH ",
    now!(),
    " SELECT r.key, r.fingerprint,
             CASE WHEN r.state = 1 THEN r.expires_at ELSE r.settled_at END AS marked,
             CASE WHEN r.state = 1 THEN r.expires_at + $2 ELSE r.expires_at END,
             r.token
      FROM idemcache_records r, now
      WHERE ",
    unknown_or_lapsed!("$2"),
    " ORDER BY marked, r.key LIMIT $1"
);

/// One bounded batch of `purge_expired`: at most `$1` expired records (`$2` the unknown
/// TTL of `LapsePolicy::MarkUnknown`: a lapsed lease stays while `lapse_kept!`), one
/// count back (`bigint`).
///
/// The batch is picked through the expiry index (`LIMIT $1`, `SKIP LOCKED`: two purgers
/// never wait on each other's batch, and a claim's row being written is skipped) and
/// deleted by row address (`ctid = ANY(ARRAY(...))`, a TID scan), so its cost is the
/// batch's rows whatever the table holds. It used to join the batch back on `key`; in
/// the generic plan a prepared statement gets after five runs, the planner does not
/// know the limit and hashed every expired row for that join: 15 s for a batch of 1000
/// over 9 million expired rows, against 3 ms now (BENCHMARKS.md, "PostgreSQL at
/// volume"). A row address is a partition's own, so the address is matched with its
/// table (`tableoid`, a semi-join against the picked batch only): on a table you
/// partitioned by key, one batch is still at most `$1`. The `DELETE` checks expiry again
/// on the version it deletes, so a record a claim took over since it was picked is kept.
pub const PURGE: &str = concat!(
    "WITH ",
    now!(),
    ",
         picked AS (
             SELECT r.tableoid AS rel, r.ctid AS addr FROM idemcache_records r, now
             WHERE r.expires_at <= now.us AND NOT ",
    lapse_kept!("$2"),
    "
             LIMIT $1 FOR UPDATE OF r SKIP LOCKED
         ),
         gone AS (
             DELETE FROM idemcache_records r USING now
             WHERE r.ctid = ANY(ARRAY(SELECT addr FROM picked))
               AND EXISTS (SELECT 1 FROM picked p WHERE p.rel = r.tableoid AND p.addr = r.ctid)
               AND r.expires_at <= now.us AND NOT ",
    lapse_kept!("$2"),
    "
             RETURNING 1
         )
     SELECT count(*) FROM gone"
);

/// Record `r`'s state as `idemcache::store::record::judge` reads it (against the `now`
/// CTE, `$ttl` the unknown TTL): 0 dead (expired, or a lapse `TakeOver` takes over), 1
/// PROCESSING, 2 COMPLETED, 3 UNKNOWN (marked, or a lapse `MarkUnknown` reads so), 4 a
/// state no store writes (for `judge` to name corrupt). As an `int`, for `1 << it`.
macro_rules! judged {
    ($ttl:literal) => {
        concat!(
            "(CASE WHEN r.state NOT IN (1, 2, 3) THEN 4
                  WHEN r.expires_at > now.us THEN r.state
                  WHEN r.state = 1 AND r.expires_at + ",
            $ttl,
            " > now.us THEN 3 ELSE 0 END)::int"
        )
    };
}

/// The columns the record reads return, in order: the server's now (µs), then `key,
/// fingerprint, state, token, body, started_at, settled_at, expires_at, correlation_id`:
/// an `idemcache::store::record::StoredRecord` and the now to judge it at.
macro_rules! record_columns {
    () => {
        "now.us, r.key, r.fingerprint, r.state, r.token, r.body, r.started_at, r.settled_at,
         r.expires_at, r.correlation_id"
    };
}

/// The record of `$1` (key), whatever its state, with the server's now: the record
/// columns (see [`RECORDS`]); no row, no record. The driver judges it.
pub const RECORD: &str = concat!(
    "WITH ",
    now!(),
    " SELECT ",
    record_columns!(),
    " FROM idemcache_records r, now WHERE r.key = $1"
);

/// Up to `$6` records in key order, each with the server's now: `now, key,
/// fingerprint, state, token, body, started_at, settled_at, expires_at, correlation_id` (the driver
/// judges each with `idemcache::store::record::judge` at that now). Those whose key is
/// past `$1` and before `$2` (NULL: no end), ends with `$3` (empty: any), whose state as
/// judged under the unknown TTL `$5` is a bit of the mask `$4` (`1 << state`: a
/// `RecordFilter::state_mask`, with bit 4 for rows a store never writes, so that they
/// are named corrupt, never skipped).
///
/// Through the primary key's range from `$1` to `$2`: a filter naming a scope reads its
/// range only; otherwise the rest of the table from `$1`, each row's suffix and state
/// checked as it is read (a scan, for tools, never a request's path).
pub const RECORDS: &str = concat!(
    "WITH ",
    now!(),
    " SELECT ",
    record_columns!(),
    " FROM idemcache_records r, now
      WHERE r.key > $1 AND ($2::bytea IS NULL OR r.key < $2::bytea)
        AND (octet_length($3::bytea) = 0
             OR substring(r.key FROM octet_length(r.key) - octet_length($3::bytea) + 1) = $3::bytea)
        AND ($4::int & (1 << ",
    judged!("$5"),
    ")) <> 0
      ORDER BY r.key LIMIT $6"
);

/// Deletes the record of `$1` (key) if its state as judged under the unknown TTL `$3`
/// is a bit of the mask `$2` (`1 << state`), in one statement (the look and the delete
/// one atomic step); returns the deleted record's columns as [`RECORDS`] does, judged
/// at the same now by the driver; no row, nothing deleted.
pub const REMOVE: &str = concat!(
    "WITH ",
    now!(),
    " DELETE FROM idemcache_records r USING now
      WHERE r.key = $1 AND ($2::int & (1 << ",
    judged!("$3"),
    ")) <> 0 RETURNING ",
    record_columns!()
);
