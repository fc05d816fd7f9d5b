//! [`complete_in`]: a claim's completion written in the caller's own transaction, so
//! that it commits with the business change it records, or not at all; and
//! [`SqliteStore::claim_in`], the claim itself made in that transaction, so that a first
//! execution is one commit.
//!
//! Invariant: the write is the store's own completion (the same statement), fenced by
//! the claim's token and refused once the key has moved on; it changes nothing but the
//! claim's record, and commits or rolls back with the caller's transaction.

use std::time::{Duration, SystemTime};

use rusqlite::{Connection, OptionalExtension, Transaction};

use idemcache::store::encoding::{check_duration, from_micros, lapse_ttl_micros, micros};
use idemcache::store::{OpenClaim, StoreClaim, StoreError};
use idemcache::{Bytes, FencingToken, Fingerprint, Key, Replay};

use crate::errors::backend;
use crate::statements::COMPLETE;
use crate::store::claim_locked;
use crate::SqliteStore;

impl SqliteStore {
    /// Claims `key` for a request whose fingerprint is `fp` inside `tx`, your own
    /// transaction on the database file this store keeps its records in, opened with
    /// [`TransactionBehavior::Immediate`](rusqlite::TransactionBehavior): with
    /// [`complete_in`] and your business writes in the same `tx`, a first execution is
    /// one commit (get or create the record, check the fingerprint, write the change,
    /// mark the record completed, commit).
    ///
    /// Answers as [`Store::claim`](idemcache::store::Store::claim) does. On
    /// [`StoreClaim::Acquired`], make the claim (`OpenClaim::new(key, token,
    /// result_ttl)`), write your change, [`complete_in`], commit; on any other answer,
    /// roll `tx` back and answer it. A rollback, or a crash before the commit, leaves
    /// nothing behind: the PROCESSING record was never committed. SQLite has one writer:
    /// a concurrent duplicate waits for the write lock at its own `BEGIN IMMEDIATE` (the
    /// connection's busy timeout bounds it, then `SQLITE_BUSY`), and once it has the lock
    /// it finds what `tx` committed. `lease` bounds the transaction: [`complete_in`] after
    /// it is refused ([`StoreError::LeaseLost`]). Under `LapsePolicy::MarkUnknown` a lapsed
    /// record this claim turns UNKNOWN stays so only if `tx` commits (roll back and it is
    /// judged UNKNOWN again by the next claim).
    ///
    /// ```
    /// use idemcache::store::{block_on, OpenClaim, Store, StoreClaim};
    /// use idemcache::{Fingerprint, Key};
    /// use idemcache_sqlite::rusqlite::{Connection, TransactionBehavior};
    /// use idemcache_sqlite::{complete_in, SqliteStore};
    /// use std::time::Duration;
    ///
    /// let path = std::env::temp_dir().join(format!("claim-in-doc-{}.db", std::process::id()));
    /// let store = block_on(SqliteStore::open_path(&path))?;
    /// block_on(store.ensure_schema())?;
    /// let key = Key::new("POST /orders", "user:1", "k1")?;
    ///
    /// let mut db = Connection::open(&path)?;
    /// db.execute_batch("CREATE TABLE IF NOT EXISTS orders (item TEXT NOT NULL)")?;
    /// let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
    /// let claimed = store.claim_in(&tx, &key, Fingerprint::of(b"req"), Duration::from_secs(30))?;
    /// let StoreClaim::Acquired { token, .. } = claimed else { unreachable!() };
    /// tx.execute("INSERT INTO orders (item) VALUES ('book')", [])?;
    /// let claim = OpenClaim::new(key.clone(), token, Duration::from_secs(3600));
    /// complete_in(&tx, &claim, Some(b"201 created"))?;
    /// tx.commit()?; // the claim, the order and its record: one commit
    ///
    /// let again = block_on(store.claim(&key, Fingerprint::of(b"req"), Duration::from_secs(30)))?;
    /// assert!(matches!(again, StoreClaim::Completed(r) if r.body.as_deref() == Some(&b"201 created"[..])));
    /// # drop(store); let _ = std::fs::remove_file(&path);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn claim_in(
        &self,
        tx: &Transaction<'_>,
        key: &Key,
        fp: Fingerprint,
        lease: Duration,
    ) -> Result<StoreClaim, StoreError> {
        check_duration("lease", lease)?;
        claim_locked(tx, key.as_bytes(), fp, micros(lease), lapse_ttl_micros(self.lapse), None)
    }
}

/// Completes `claim` with `body` inside `tx`, a transaction on a connection to the
/// database the [`SqliteStore`](crate::SqliteStore) keeps its records in, so that the
/// record commits with your business writes in `tx`, or neither does. Returns the
/// record as it will be replayed once `tx` commits.
///
/// Refused with [`StoreError::LeaseLost`] if the claim no longer owns its key (the
/// lease lapsed, or it was settled): roll `tx` back then, someone else owns the key.
/// Hands the claim over first ([`OpenClaim::hand_over`]): the HTTP layer then neither
/// renews the lease nor completes the claim itself. Open `tx` with
/// [`TransactionBehavior::Immediate`](rusqlite::TransactionBehavior) as the store does,
/// so a write lock taken late cannot fail it with `SQLITE_BUSY`.
///
/// ```
/// use idemcache::store::{block_on, OpenClaim, Store, StoreClaim};
/// use idemcache::{Fingerprint, Key};
/// use idemcache_sqlite::rusqlite::{Connection, TransactionBehavior};
/// use idemcache_sqlite::{complete_in, SqliteStore};
/// use std::time::Duration;
///
/// let path = std::env::temp_dir().join(format!("complete-in-doc-{}.db", std::process::id()));
/// let store = block_on(SqliteStore::open_path(&path))?;
/// block_on(store.ensure_schema())?;
/// let key = Key::new("POST /orders", "user:1", "k1")?;
/// let StoreClaim::Acquired { token, .. } =
///     block_on(store.claim(&key, Fingerprint::of(b"req"), Duration::from_secs(30)))?
/// else { unreachable!() };
/// let claim = OpenClaim::new(key.clone(), token, Duration::from_secs(3600));
///
/// let mut db = Connection::open(&path)?;
/// db.execute_batch("CREATE TABLE IF NOT EXISTS orders (item TEXT NOT NULL)")?;
/// let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
/// tx.execute("INSERT INTO orders (item) VALUES ('book')", [])?;
/// complete_in(&tx, &claim, Some(b"201 created"))?;
/// tx.commit()?; // the order and its record, together
///
/// let again = block_on(store.claim(&key, Fingerprint::of(b"req"), Duration::from_secs(30)))?;
/// assert!(matches!(again, StoreClaim::Completed(r) if r.body.as_deref() == Some(&b"201 created"[..])));
/// # drop(store); let _ = std::fs::remove_file(&path);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn complete_in(
    tx: &Transaction<'_>,
    claim: &OpenClaim,
    body: Option<&[u8]>,
) -> Result<Replay<SystemTime>, StoreError> {
    let ttl = claim.result_ttl();
    check_duration("result TTL", ttl)?;
    claim.hand_over();
    complete_on(tx, claim.key(), claim.token(), body, ttl)
}

/// The completion [`complete_in`] writes, on `db`, in the transaction it is in: the
/// claim of `key` under `token`, handed over already, its TTL checked.
pub(crate) fn complete_on(
    db: &Connection,
    key: &Key,
    token: FencingToken,
    body: Option<&[u8]>,
    ttl: Duration,
) -> Result<Replay<SystemTime>, StoreError> {
    let args = rusqlite::params![key.as_bytes(), token.get() as i64, body, micros(ttl)];
    let settled: Option<(i64, i64)> =
        db.query_row(COMPLETE, args, |r| Ok((r.get(0)?, r.get(1)?))).optional().map_err(backend)?;
    let (at, until) = settled.ok_or_else(|| StoreError::LeaseLost(key.clone()))?;
    Ok(Replay::new(body.map(Bytes::copy_from_slice), from_micros(at), from_micros(until)))
}
