//! The records table: its statements per dialect and the decoding of their rows.
//!
//! Both dialects keep the same columns with the same meaning, as the SQLite store does:
//! `key` (the [`Key::as_bytes`](idemcache::Key::as_bytes) form, the primary key),
//! `fingerprint` (16 bytes), `state` (1 PROCESSING, 2 COMPLETED, 3 UNKNOWN), `token`
//! (from a durable counter), `body`, and `started_at`, `settled_at`, `expires_at` in
//! microseconds since the Unix epoch on the server's clock (`expires_at` is the lease's
//! end while PROCESSING, the TTL's after).
//!
//! Invariant, in every dialect: a claim is one atomic step judged by the server's
//! clock; tokens increase across processes and restarts; every write after a claim
//! names its token in its `WHERE`, so a stale owner's write matches no row; and under
//! `LapsePolicy::MarkUnknown` a PROCESSING record whose lease lapsed less than the
//! unknown TTL ago is UNKNOWN to every statement (listed, settled by `resolve` and
//! `forget`, kept by the purge) until a claim turns it.

pub mod claim_loop;
pub mod decode;
pub mod listing;
pub mod mysql;
pub mod mysql_claim;
pub mod postgres;
