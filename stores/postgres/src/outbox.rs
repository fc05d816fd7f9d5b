//! The transactional outbox in PostgreSQL, on your own tokio-postgres transaction:
//! [`enqueue`] writes a message in the transaction that makes the business change, so
//! both commit together and a rollback leaves neither; a relay ([`Storage`] with
//! [`relay_loop`]) claims due rows, publishes them and marks them, woken by
//! `LISTEN/NOTIFY` ([`Wakeup`]) with polling as the fallback. See
//! [`idemcache_sql::outbox`] for the flow.
//!
//! Invariant: the one of [`idemcache_sql::outbox::postgres`], whose statements this
//! module runs (the sqlx driver runs the same ones, so both may share one table): a row
//! is leased by one claim at a time (`FOR UPDATE SKIP LOCKED`: relays never wait on each
//! other), under a token higher than every earlier claim's of the row, and every mark is
//! fenced by that token. Its docs explain the per-key order, the times and the
//! notification.
//!
//! # A relay over a pool, woken by `NOTIFY`
//!
//! ```no_run
//! use std::time::SystemTime;
//!
//! use idemcache_postgres::deadpool_postgres::Pool;
//! use idemcache_postgres::outbox::{self, OutboxMessage, PublishError, Publisher, RelaySettings};
//! use idemcache_postgres::tokio_postgres::{self, NoTls};
//!
//! struct Broker; // your broker's client: answers once the broker confirmed
//! impl Publisher for Broker {
//!     async fn publish(&self, message: &OutboxMessage) -> Result<(), PublishError> {
//!         let _ = message; // publish with message.id() as the broker's message id
//!         Ok(())
//!     }
//! }
//!
//! # async fn run(pool: Pool, url: &str) -> Result<(), Box<dyn std::error::Error>> {
//! // A connection of its own that listens: its notifications wake the relay.
//! let (listener, connection) = tokio_postgres::connect(url, NoTls).await?;
//! let (wakeup, notifications) = outbox::wakeup(connection);
//! tokio::spawn(notifications);
//! outbox::listen(&listener).await?;
//! tokio::spawn(outbox::relay_loop(
//!     outbox::Storage::new(pool),
//!     Broker,
//!     RelaySettings::default(),
//!     SystemTime::now,
//!     // A notification, or the poll interval, whichever comes first.
//!     move |pause| wakeup.wait(tokio::time::sleep(pause)),
//!     |batch| {
//!         if let Err(e) = batch {
//!             eprintln!("relaying the outbox failed: {e}"); // the loop goes on
//!         }
//!     },
//! ));
//! # drop(listener);
//! # Ok(())
//! # }
//! ```
//!
//! Keep the listening client alive as long as the relay runs (dropping it closes the
//! connection: the relay then only polls).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use deadpool_postgres::Pool;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, Client, Connection, GenericClient, Row};

use idemcache::store::encoding::{micros, to_micros};

use crate::Transaction;
use idemcache_sql::outbox::decode::{self, RawRow};
use idemcache_sql::outbox::postgres::{
    BEGIN_ATTEMPT, CHANNEL, CLAIM, DELIVERED, DELIVERED_AND_BEGIN, ENQUEUE, ENSURE_SCHEMA, FAILED,
    INSPECT, LISTEN, LIST_DEAD, PURGE, REQUEUE,
};
use idemcache_sql::outbox::{check_claim, clip_error};

// The outbox's vocabulary and relay (`idemcache-sql`'s), re-exported so that one path
// imports the whole outbox of this driver.
pub use idemcache_sql::outbox::postgres::SCHEMA;
pub use idemcache_sql::outbox::{
    purge_loop, relay_batch, relay_loop, Batch, BatchReport, Claimed, Lease, Mark, OutboxAdmin,
    OutboxError, OutboxMessage, OutboxRow, OutboxStorage, PublishError, Publisher, RelaySettings,
    Retry,
};

/// Creates the outbox's table and indexes if they do not exist, under an advisory lock
/// so that several processes may run it at once (no lock when they exist).
pub async fn ensure_schema<C: GenericClient + Sync>(client: &C) -> Result<(), OutboxError> {
    client.batch_execute(ENSURE_SCHEMA).await.map_err(database)
}

/// Writes `message` inside `tx`, the transaction of the change it announces: pending,
/// due at once, and a notification to listening relays at the commit. Checked first by
/// [`OutboxMessage::check`]. A row with the same message id is
/// [`OutboxError::Duplicate`], and **`tx` is then aborted** (PostgreSQL aborts a
/// transaction on any failed statement): roll it back. One round trip.
pub async fn enqueue<T: Transaction>(tx: &T, message: &OutboxMessage) -> Result<(), OutboxError> {
    message.check()?;
    let headers = message.encoded_headers();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
        &message.id(),
        &message.topic(),
        &&message.payload()[..],
        &headers,
        &message.aggregate_key(),
    ];
    match tx.connection().execute(ENQUEUE, &params).await {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
            Err(OutboxError::Duplicate(message.id().to_owned()))
        }
        Err(e) => Err(database(e)),
    }
}

/// Leases up to `batch` due rows until `now + lease`, oldest first, each under a new
/// fencing token, skipping rows another claim holds: one statement (run it outside a
/// transaction of yours, so that its leases commit at once). Rows that cannot be read
/// stay leased and are reported in [`Batch::unreadable`].
pub async fn claim_due<C: GenericClient + Sync>(
    client: &C,
    batch: usize,
    lease: Duration,
    now: SystemTime,
) -> Result<Batch, OutboxError> {
    check_claim(batch, lease)?;
    let now_us = to_micros(now);
    let until = now_us.saturating_add(micros(lease));
    let limit = i64::try_from(batch).unwrap_or(i64::MAX);
    let rows = client.query(CLAIM, &[&now_us, &limit, &until]).await.map_err(database)?;
    Ok(decode::claimed_batch(rows.iter().map(raw)))
}

/// Counts an attempt of the row as its publish begins, if `lease` is still its lease:
/// [`Mark::Stale`] (nothing changed) otherwise.
pub async fn begin_attempt<C: GenericClient + Sync>(
    client: &C,
    lease: &Lease,
) -> Result<Mark, OutboxError> {
    let token = decode::lease_token(lease)?;
    let changed =
        client.execute(BEGIN_ATTEMPT, &[&lease.message_id, &token]).await.map_err(database)?;
    Ok(decode::mark(changed))
}

/// Marks the row delivered at `now`, if `lease` is still its lease: [`Mark::Stale`]
/// (nothing changed) otherwise.
pub async fn mark_delivered<C: GenericClient + Sync>(
    client: &C,
    lease: &Lease,
    now: SystemTime,
) -> Result<Mark, OutboxError> {
    let token = decode::lease_token(lease)?;
    let changed = client
        .execute(DELIVERED, &[&lease.message_id, &token, &to_micros(now)])
        .await
        .map_err(database)?;
    Ok(decode::mark(changed))
}

/// [`mark_delivered`] of `lease` and [`begin_attempt`] of `next`, in one statement:
/// what each did (its failure is both's).
pub async fn mark_delivered_and_begin<C: GenericClient + Sync>(
    client: &C,
    lease: &Lease,
    now: SystemTime,
    next: &Lease,
) -> (Result<Mark, OutboxError>, Result<Mark, OutboxError>) {
    let both = async {
        let (token, next_token) = (decode::lease_token(lease)?, decode::lease_token(next)?);
        let params: [&(dyn ToSql + Sync); 5] =
            [&lease.message_id, &token, &to_micros(now), &next.message_id, &next_token];
        let row = client.query_one(DELIVERED_AND_BEGIN, &params).await.map_err(database)?;
        let (delivered, begun): (i64, i64) = (row.get(0), row.get(1));
        Ok((decode::mark(delivered.unsigned_abs()), decode::mark(begun.unsigned_abs())))
    };
    decode::both(both.await)
}

/// Marks the row failed with `error` (clipped), if `lease` is still its lease: pending
/// again after `retry`'s backoff, or dead after its last attempt. [`Mark::Stale`]
/// (nothing changed) otherwise.
pub async fn mark_failed<C: GenericClient + Sync>(
    client: &C,
    lease: &Lease,
    error: &str,
    now: SystemTime,
    retry: &Retry,
) -> Result<Mark, OutboxError> {
    let token = decode::lease_token(lease)?;
    let (state, due) = decode::failed_as(lease, now, retry);
    let why = clip_error(error);
    let changed = client
        .execute(FAILED, &[&lease.message_id, &token, &state.code(), &due, &&*why])
        .await
        .map_err(database)?;
    Ok(decode::mark(changed))
}

/// Up to `limit` dead rows, oldest first.
pub async fn list_dead<C: GenericClient + Sync>(
    client: &C,
    limit: usize,
) -> Result<Vec<OutboxRow>, OutboxError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client.query(LIST_DEAD, &[&limit]).await.map_err(database)?;
    rows.iter().map(|r| decode::row(raw(r)?).map(|(_, row)| row)).collect()
}

/// The row of `message_id`, in any state, or `None`.
pub async fn inspect<C: GenericClient + Sync>(
    client: &C,
    message_id: &str,
) -> Result<Option<OutboxRow>, OutboxError> {
    let found = client.query_opt(INSPECT, &[&message_id]).await.map_err(database)?;
    found.map(|r| decode::row(raw(&r)?).map(|(_, row)| row)).transpose()
}

/// Makes a dead row pending again, due at once, its attempts reset: `true` if
/// `message_id` was dead, `false` otherwise (nothing changed).
pub async fn requeue<C: GenericClient + Sync>(
    client: &C,
    message_id: &str,
) -> Result<bool, OutboxError> {
    Ok(client.execute(REQUEUE, &[&message_id]).await.map_err(database)? == 1)
}

/// Deletes up to `limit` rows delivered before `cutoff` (oldest first, skipping rows
/// another purge is deleting) and returns how many: call it until it returns less than
/// `limit`. `limit` 0 deletes nothing.
pub async fn purge_delivered<C: GenericClient + Sync>(
    client: &C,
    cutoff: SystemTime,
    limit: usize,
) -> Result<usize, OutboxError> {
    if limit == 0 {
        return Ok(0);
    }
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let deleted = client.execute(PURGE, &[&to_micros(cutoff), &limit]).await.map_err(database)?;
    Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
}

/// Subscribes `client`'s session to the outbox's notifications; its connection's
/// [`wakeup`] then hears every commit that enqueued a row.
pub async fn listen(client: &Client) -> Result<(), OutboxError> {
    client.batch_execute(LISTEN).await.map_err(database)
}

/// A relay's storage over a deadpool pool: each operation takes a connection for one
/// statement.
#[derive(Clone)]
pub struct Storage {
    pool: Pool,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage").finish_non_exhaustive()
    }
}

impl Storage {
    /// The storage over `pool` (the schema is not created: [`ensure_schema`]).
    pub fn new(pool: Pool) -> Storage {
        Storage { pool }
    }

    /// The pool, for the operations a relay does not run.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, OutboxError> {
        self.pool.get().await.map_err(|e| OutboxError::Database(Box::new(e)))
    }
}

impl OutboxStorage for Storage {
    async fn claim_due(
        &self,
        batch: usize,
        lease: Duration,
        now: SystemTime,
    ) -> Result<Batch, OutboxError> {
        claim_due(&**self.client().await?, batch, lease, now).await
    }

    async fn begin_attempt(&self, lease: &Lease) -> Result<Mark, OutboxError> {
        begin_attempt(&**self.client().await?, lease).await
    }

    async fn mark_delivered_and_begin(
        &self,
        lease: &Lease,
        now: SystemTime,
        next: &Lease,
    ) -> (Result<Mark, OutboxError>, Result<Mark, OutboxError>) {
        match self.client().await {
            Ok(client) => mark_delivered_and_begin(&**client, lease, now, next).await,
            Err(e) => decode::both(Err(e)),
        }
    }

    async fn mark_delivered(&self, lease: &Lease, now: SystemTime) -> Result<Mark, OutboxError> {
        mark_delivered(&**self.client().await?, lease, now).await
    }

    async fn mark_failed(
        &self,
        lease: &Lease,
        error: &str,
        now: SystemTime,
        retry: &Retry,
    ) -> Result<Mark, OutboxError> {
        mark_failed(&**self.client().await?, lease, error, now, retry).await
    }
}

impl OutboxAdmin for Storage {
    async fn list_dead(&self, limit: usize) -> Result<Vec<OutboxRow>, OutboxError> {
        list_dead(&**self.client().await?, limit).await
    }

    async fn inspect(&self, message_id: &str) -> Result<Option<OutboxRow>, OutboxError> {
        inspect(&**self.client().await?, message_id).await
    }

    async fn requeue(&self, message_id: &str) -> Result<bool, OutboxError> {
        requeue(&**self.client().await?, message_id).await
    }

    async fn purge_delivered(
        &self,
        cutoff: SystemTime,
        limit: usize,
    ) -> Result<usize, OutboxError> {
        purge_delivered(&**self.client().await?, cutoff, limit).await
    }
}

/// What a listening connection heard: a commit that enqueued, not yet waited for.
/// Cheap to clone (clones share it).
#[derive(Debug, Clone, Default)]
pub struct Wakeup {
    signal: Arc<Mutex<Signal>>,
}

#[derive(Debug, Default)]
struct Signal {
    notified: bool,
    waiter: Option<Waker>,
}

impl Wakeup {
    /// Waits for a notification heard since the last wait ended, or for `timer`,
    /// whichever comes first (a notification heard during a batch ends the next wait at
    /// once, so none is missed between two waits).
    pub fn wait<F: Future<Output = ()>>(&self, timer: F) -> Wait<F> {
        Wait { signal: self.signal.clone(), timer: Box::pin(timer) }
    }

    fn notify(&self) {
        let mut signal = lock(&self.signal);
        signal.notified = true;
        if let Some(waiter) = signal.waiter.take() {
            waiter.wake();
        }
    }
}

/// [`Wakeup::wait`]'s future.
pub struct Wait<F> {
    signal: Arc<Mutex<Signal>>,
    timer: Pin<Box<F>>,
}

impl<F> std::fmt::Debug for Wait<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wait").finish_non_exhaustive()
    }
}

impl<F: Future<Output = ()>> Future for Wait<F> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        {
            let mut signal = lock(&self.signal);
            if std::mem::take(&mut signal.notified) {
                return Poll::Ready(());
            }
            signal.waiter = Some(cx.waker().clone());
        }
        self.timer.as_mut().poll(cx)
    }
}

/// Drives a listening connection: the returned future (spawn it; it ends with the
/// connection) hands every notification on the outbox's channel to the [`Wakeup`].
/// Call [`listen`] on the connection's client to subscribe.
pub fn wakeup<S, T>(
    mut connection: Connection<S, T>,
) -> (Wakeup, impl Future<Output = Result<(), OutboxError>> + Send)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
    T: AsyncRead + AsyncWrite + Unpin + Send,
{
    let wakeup = Wakeup::default();
    let heard = wakeup.clone();
    let driving = std::future::poll_fn(move |cx| loop {
        match connection.poll_message(cx) {
            Poll::Ready(Some(Ok(AsyncMessage::Notification(n)))) if n.channel() == CHANNEL => {
                heard.notify();
            }
            Poll::Ready(Some(Ok(_))) => {}
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(database(e))),
            Poll::Ready(None) => return Poll::Ready(Ok(())),
            Poll::Pending => return Poll::Pending,
        }
    });
    (wakeup, driving)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One row's columns as stored (text read as bytes); a column that cannot be read is
/// `Corrupt`, naming the row's id.
fn raw(row: &Row) -> Result<RawRow, OutboxError> {
    let id: String = row.try_get(1).unwrap_or_else(|_| "?".to_owned());
    let corrupt = |column: &str, e: tokio_postgres::Error| {
        OutboxError::corrupt(&id, format_args!("column {column}: {e}"))
    };
    macro_rules! col {
        ($i:literal, $name:literal, $t:ty) => {
            row.try_get::<_, $t>($i).map_err(|e| corrupt($name, e))?
        };
    }
    Ok(RawRow {
        seq: col!(0, "seq", i64),
        message_id: col!(1, "message_id", String).into_bytes(),
        topic: col!(2, "topic", String).into_bytes(),
        payload: col!(3, "payload", Vec<u8>),
        headers: col!(4, "headers", Vec<u8>),
        aggregate_key: col!(5, "aggregate_key", Option<String>).map(String::into_bytes),
        state: col!(6, "state", i64),
        attempts: col!(7, "attempts", i64),
        next_attempt_at: col!(8, "next_attempt_at", i64),
        lease_until: col!(9, "lease_until", Option<i64>),
        token: col!(10, "token", i64),
        last_error: col!(11, "last_error", Option<String>).map(String::into_bytes),
        created_at: col!(12, "created_at", i64),
        delivered_at: col!(13, "delivered_at", Option<i64>),
    })
}

fn database(e: tokio_postgres::Error) -> OutboxError {
    OutboxError::Database(Box::new(e))
}
