//! The relay, broker-agnostic: claim a batch of due rows, publish each, mark it
//! delivered once the broker confirmed it and failed otherwise, and again, for as long
//! as the program runs. The storage is a driver's ([`OutboxStorage`]), the broker a
//! [`Publisher`], the clock and the timer the caller's (as in [`idemcache::purge`]: this
//! crate has no runtime).
//!
//! Invariant: a row is marked delivered only after its publisher answered `Ok` (the
//! broker confirmed it), and only under the token of the claim that leased it. A relay
//! dropped at any await (killed) leaves each row of its batch delivered, failed, or
//! leased; a leased row is due again when its lease lapses, so nothing is lost, and a
//! row is published twice at worst (the consumers' inbox, keyed by the message id,
//! applies it once). The loop never ends on its own and never panics (only the storage,
//! the publisher, `clock`, `wait` or `report` can): every failure is reported, and the
//! loop goes on.
//!
//! # Publishing order and leases
//!
//! A batch is published one message at a time, in enqueue order, and each publish is
//! counted as it begins ([`OutboxStorage::begin_attempt`], fenced by the lease): a
//! row's attempts are the publishes begun of it, never the claims that leased it. So a
//! relay that dies mid-batch charges an attempt to the row it was publishing and to no
//! row behind it, and a row out of attempts at its claim had each of its publishes
//! begun and none marked ([`decode::out_of_attempts`]): it is made dead without a
//! publish, and the rows that waited behind it are not. The lease must outlast the
//! batch's publishing (batch size times a publish's worst latency): a lease that lapses
//! mid-batch lets another relay claim the rest; the first relay's count of such a row
//! is then refused as stale and it skips the row, while a row nobody claimed meanwhile
//! it still publishes, late. A row on its last attempt whose publish outlives its lease
//! is made dead by the relay that claims it next, though the broker may have it (the
//! consumers' inbox absorbs the copy a requeue publishes again).

use std::convert::Infallible;
use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use super::{check_claim, decode, Batch, Lease, Mark, Next, OutboxError, OutboxMessage, Retry};

/// A broker: publishes a message and answers once the broker confirmed it (a publisher
/// confirm, a JetStream ack), or with why not.
///
/// The message id is in the message: a broker that deduplicates (JetStream's
/// `Nats-Msg-Id`, an AMQP `message-id` the consumer's inbox reads) should be handed it,
/// so that a re-publish after a lapsed lease is dropped or absorbed.
pub trait Publisher {
    /// Publishes `message`; `Ok` only once the broker has it (confirmed, durable as the
    /// broker promises). An `Err` makes the row retried later (or dead).
    fn publish(
        &self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<(), PublishError>> + Send;

    /// Whether the broker can take messages now, asked by [`relay_loop`] before it claims
    /// each batch: an `Err` (the broker unreachable, a connection that cannot be opened)
    /// makes the loop claim nothing, report [`OutboxError::BrokerUnavailable`] and wait,
    /// so that an outage does not use up the attempts of every row it would have claimed
    /// and failed. A publisher that reconnects opens its connection here. The default:
    /// always ready.
    fn ready(&self) -> impl Future<Output = Result<(), PublishError>> + Send {
        std::future::ready(Ok(()))
    }
}

/// Why a publish was not confirmed: the broker's error, kept (clipped) as the row's
/// `last_error`.
#[derive(Debug)]
pub struct PublishError(Box<dyn Error + Send + Sync>);

impl PublishError {
    /// A publish error from the broker's error or a message.
    pub fn new(error: impl Into<Box<dyn Error + Send + Sync>>) -> PublishError {
        PublishError(error.into())
    }
}

impl fmt::Display for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "publishing failed: {}", self.0)
    }
}

impl Error for PublishError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.0)
    }
}

/// A driver's outbox, as the relay uses it: each driver crate has one (`Storage` in its
/// `outbox` module), over a connection or a pool.
pub trait OutboxStorage {
    /// Leases up to `batch` due rows until `now + lease`, each under a new fencing token.
    fn claim_due(
        &self,
        batch: usize,
        lease: Duration,
        now: SystemTime,
    ) -> impl Future<Output = Result<Batch, OutboxError>> + Send;

    /// Counts an attempt of the leased row as its publish begins, if `lease` is still its
    /// lease: [`Mark::Stale`] when another claim took it (the relay then skips it). The
    /// relay calls it before each publish, and charges a failure with the attempt it
    /// counted ([`decode::begun`]).
    fn begin_attempt(
        &self,
        lease: &Lease,
    ) -> impl Future<Output = Result<Mark, OutboxError>> + Send;

    /// Marks the leased row delivered at `now`, if `lease` is still its lease.
    fn mark_delivered(
        &self,
        lease: &Lease,
        now: SystemTime,
    ) -> impl Future<Output = Result<Mark, OutboxError>> + Send;

    /// Marks the leased row failed with `error`: pending again after `retry`'s backoff,
    /// or dead after its last attempt, if `lease` is still its lease.
    fn mark_failed(
        &self,
        lease: &Lease,
        error: &str,
        now: SystemTime,
        retry: &Retry,
    ) -> impl Future<Output = Result<Mark, OutboxError>> + Send;

    /// [`mark_delivered`](Self::mark_delivered) of `lease`, then
    /// [`begin_attempt`](Self::begin_attempt) of `next`, the row the relay publishes
    /// next, in one round trip where the driver can (one statement on PostgreSQL), so
    /// that counting each attempt costs a relay no round trip but a batch's first: what
    /// each did. A driver that runs both as one statement answers its failure as both's
    /// (nothing applied, or the answer lost); the relay then runs each alone, so a
    /// failure there costs a round trip, and never the mark of a row the broker
    /// confirmed.
    fn mark_delivered_and_begin(
        &self,
        lease: &Lease,
        now: SystemTime,
        next: &Lease,
    ) -> impl Future<Output = (Result<Mark, OutboxError>, Result<Mark, OutboxError>)> + Send;
}

/// How a relay runs: rows per claim, how long a claim holds them, how long to wait for
/// new rows when a claim came back short, and how failures are retried.
///
/// ```
/// use idemcache_sql::outbox::{RelaySettings, Retry};
/// use std::time::Duration;
///
/// let settings = RelaySettings::default()
///     .with_batch(50)?
///     .with_lease(Duration::from_secs(60))?
///     .with_poll(Duration::from_millis(500))?
///     .with_retry(Retry::new(Duration::from_secs(1), Duration::from_secs(60), 8)?);
/// assert_eq!(settings.batch(), 50);
/// # Ok::<(), idemcache_sql::outbox::OutboxError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelaySettings {
    batch: usize,
    lease: Duration,
    poll: Duration,
    retry: Retry,
}

impl Default for RelaySettings {
    /// Batches of 100, leased for 30 s, polling every second, [`Retry::default`].
    fn default() -> Self {
        RelaySettings {
            batch: 100,
            lease: Duration::from_secs(30),
            poll: Duration::from_secs(1),
            retry: Retry::default(),
        }
    }
}

impl RelaySettings {
    /// At most `batch` rows per claim; refuses 0.
    pub fn with_batch(self, batch: usize) -> Result<Self, OutboxError> {
        check_claim(batch, self.lease)?;
        Ok(RelaySettings { batch, ..self })
    }

    /// Claimed rows held for `lease`; refuses zero or more than `MAX_DURATION`.
    pub fn with_lease(self, lease: Duration) -> Result<Self, OutboxError> {
        check_claim(self.batch, lease)?;
        Ok(RelaySettings { lease, ..self })
    }

    /// The longest wait for new rows after a short claim; refuses zero (the loop would
    /// never wait).
    pub fn with_poll(self, poll: Duration) -> Result<Self, OutboxError> {
        if poll.is_zero() {
            return Err(OutboxError::InvalidInput("a poll interval of zero".into()));
        }
        Ok(RelaySettings { poll, ..self })
    }

    /// Failures retried by `retry`.
    pub fn with_retry(self, retry: Retry) -> Self {
        RelaySettings { retry, ..self }
    }

    /// Rows per claim.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// How long a claim holds its rows.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The longest wait after a short claim.
    pub fn poll(&self) -> Duration {
        self.poll
    }

    /// The retry policy.
    pub fn retry(&self) -> &Retry {
        &self.retry
    }
}

/// What one batch did.
#[derive(Debug, Default)]
pub struct BatchReport {
    /// Rows the claim leased (readable or not).
    pub claimed: usize,
    /// Rows published, confirmed and marked delivered.
    pub delivered: usize,
    /// Rows whose publish failed, pending again after a backoff.
    pub retried: usize,
    /// Rows whose publish failed for the last time: dead.
    pub dead: usize,
    /// Rows whose count or mark was refused: their lease lapsed and another claim took
    /// them.
    pub stale: usize,
    /// The rows that could not be read, and the counts and marks the database failed
    /// (their rows stay leased, and are due again when the lease lapses).
    pub errors: Vec<OutboxError>,
}

/// Claims one batch and publishes it: each row's attempt is counted, then it is marked
/// delivered once `publisher` confirmed it, failed otherwise; a row out of attempts
/// ([`decode::out_of_attempts`]) is made dead unpublished. `clock` is read for the claim
/// and for each mark.
/// An `Err` is the claim's (nothing was leased); a mark's failure is in the report.
pub async fn relay_batch<S, P, C>(
    storage: &S,
    publisher: &P,
    settings: &RelaySettings,
    clock: &mut C,
) -> Result<BatchReport, OutboxError>
where
    S: OutboxStorage,
    P: Publisher,
    C: FnMut() -> SystemTime,
{
    let batch = storage.claim_due(settings.batch, settings.lease, clock()).await?;
    let mut report = BatchReport {
        claimed: batch.claimed.len() + batch.unreadable.len(),
        errors: batch.unreadable,
        ..BatchReport::default()
    };
    // The count of the row published next, when the mark before it made it already.
    let mut counted = None;
    let rows = &batch.claimed;
    for (at, claimed) in rows.iter().enumerate() {
        if decode::out_of_attempts(&claimed.lease, &settings.retry) {
            // Each of its publishes was begun and none was marked: a relay died
            // publishing it, every time (a poison message), or a limit of
            // `out_of_attempts` spent them. Dead, without a publish.
            let why = format!("{} publishes begun, none marked", claimed.lease.attempts);
            let now = clock();
            match storage.mark_failed(&claimed.lease, &why, now, &settings.retry).await {
                Ok(Mark::Applied) => report.dead += 1,
                Ok(Mark::Stale) => report.stale += 1,
                Err(e) => report.errors.push(e),
            }
            continue;
        }
        let count = match counted.take() {
            Some(count) => count,
            None => storage.begin_attempt(&claimed.lease).await,
        };
        match count {
            Ok(Mark::Applied) => {}
            // Another claim took it (this lease lapsed): that relay publishes it.
            Ok(Mark::Stale) => {
                report.stale += 1;
                continue;
            }
            // Unpublished, counted or not (the error may follow the commit): it is due
            // again when its lease lapses. A count whose answer was lost costs an attempt.
            Err(e) => {
                report.errors.push(e);
                continue;
            }
        }
        let lease = &decode::begun(&claimed.lease);
        let (marked, failed_as) = match publisher.publish(&claimed.message).await {
            // The next row's attempt is counted with this one's mark: nothing comes
            // between them but the publish it counts.
            Ok(()) => match rows.get(at + 1) {
                Some(next) if !decode::out_of_attempts(&next.lease, &settings.retry) => {
                    let now = clock();
                    match storage.mark_delivered_and_begin(lease, now, &next.lease).await {
                        (Ok(marked), next_count) => {
                            counted = Some(next_count);
                            (Ok(marked), None)
                        }
                        // The mark failed (with the count, in one statement): each alone.
                        (Err(_), _) => (storage.mark_delivered(lease, clock()).await, None),
                    }
                }
                _ => (storage.mark_delivered(lease, clock()).await, None),
            },
            Err(error) => {
                let now = clock();
                let next = settings.retry.after(lease.attempts, now);
                let why = error.to_string();
                (storage.mark_failed(lease, &why, now, &settings.retry).await, Some(next))
            }
        };
        match (marked, failed_as) {
            (Ok(Mark::Stale), _) => report.stale += 1,
            (Ok(Mark::Applied), None) => report.delivered += 1,
            (Ok(Mark::Applied), Some(Next::Dead)) => report.dead += 1,
            (Ok(Mark::Applied), Some(Next::At(_))) => report.retried += 1,
            (Err(e), _) => report.errors.push(e),
        }
    }
    Ok(report)
}

/// Relays forever: a batch at once; another at once after a full one (after a yield to
/// the executor); after a short or failed one, `wait(settings.poll())` first. A batch is
/// claimed only once [`Publisher::ready`] says the broker can take it. Each
/// batch's outcome is handed to `report`. `wait` is the caller's timer
/// (`tokio::time::sleep`), or a wake-up that ends early when a row was enqueued
/// (PostgreSQL's `LISTEN`: `idemcache_postgres::outbox::Wakeup`). Stop it by dropping
/// it: its leased rows are due again when their leases lapse.
pub async fn relay_loop<S, P, C, W, WF, R>(
    storage: S,
    publisher: P,
    settings: RelaySettings,
    mut clock: C,
    mut wait: W,
    mut report: R,
) -> Infallible
where
    S: OutboxStorage,
    P: Publisher,
    C: FnMut() -> SystemTime,
    W: FnMut(Duration) -> WF,
    WF: Future<Output = ()>,
    R: FnMut(Result<BatchReport, OutboxError>),
{
    loop {
        let done = match publisher.ready().await {
            Ok(()) => relay_batch(&storage, &publisher, &settings, &mut clock).await,
            Err(e) => Err(OutboxError::BrokerUnavailable(e)),
        };
        let full = matches!(&done, Ok(r) if r.claimed >= settings.batch);
        report(done);
        if full {
            YieldNow(false).await;
        } else {
            wait(settings.poll).await;
        }
    }
}

/// Pending once (waking itself), then ready: lets the executor run others between two
/// full batches.
struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if std::mem::replace(&mut self.0, true) {
            Poll::Ready(())
        } else {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_refuse_what_would_never_work() {
        let s = RelaySettings::default();
        assert!(s.with_batch(0).is_err());
        assert!(s.with_lease(Duration::ZERO).is_err());
        assert!(s.with_poll(Duration::ZERO).is_err());
        assert_eq!(s.with_batch(7).unwrap().batch(), 7);
    }

    use std::cell::RefCell;
    use std::sync::{Arc, Mutex};
    use std::task::{Wake, Waker};

    use crate::outbox::Claimed;

    /// Storage in memory: claims hand out the queued batches in turn (then nothing, or
    /// an error when told to), and every call is logged.
    #[derive(Default)]
    struct Memory {
        batches: Mutex<Vec<Result<Vec<&'static str>, ()>>>,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl OutboxStorage for Memory {
        fn claim_due(
            &self,
            batch: usize,
            _: Duration,
            _: SystemTime,
        ) -> impl Future<Output = Result<Batch, OutboxError>> + Send {
            let mut batches = self.batches.lock().unwrap();
            let next = if batches.is_empty() { Ok(Vec::new()) } else { batches.remove(0) };
            self.log.lock().unwrap().push(format!("claim {batch}"));
            std::future::ready(match next {
                Err(()) => Err(OutboxError::Corrupt("claim".into())),
                Ok(ids) => Ok(Batch {
                    claimed: ids
                        .into_iter()
                        .map(|id| Claimed {
                            message: OutboxMessage::new(id, "t", &b""[..]),
                            lease: Lease { message_id: id.into(), token: 1, attempts: 1 },
                        })
                        .collect(),
                    unreadable: Vec::new(),
                }),
            })
        }
        fn begin_attempt(
            &self,
            lease: &Lease,
        ) -> impl Future<Output = Result<Mark, OutboxError>> + Send {
            self.log.lock().unwrap().push(format!("begin {}", lease.message_id));
            std::future::ready(Ok(Mark::Applied))
        }
        fn mark_delivered(
            &self,
            lease: &Lease,
            _: SystemTime,
        ) -> impl Future<Output = Result<Mark, OutboxError>> + Send {
            self.log.lock().unwrap().push(format!("delivered {}", lease.message_id));
            std::future::ready(Ok(Mark::Applied))
        }
        fn mark_failed(
            &self,
            lease: &Lease,
            error: &str,
            _: SystemTime,
            _: &Retry,
        ) -> impl Future<Output = Result<Mark, OutboxError>> + Send {
            self.log.lock().unwrap().push(format!("failed {}: {error}", lease.message_id));
            std::future::ready(Ok(Mark::Applied))
        }
        async fn mark_delivered_and_begin(
            &self,
            lease: &Lease,
            now: SystemTime,
            next: &Lease,
        ) -> (Result<Mark, OutboxError>, Result<Mark, OutboxError>) {
            (self.mark_delivered(lease, now).await, self.begin_attempt(next).await)
        }
    }

    /// Confirms every message but `"bad"`, logging each publish into the storage's log.
    struct Broker(Arc<Mutex<Vec<String>>>);
    impl Publisher for Broker {
        fn publish(
            &self,
            message: &OutboxMessage,
        ) -> impl Future<Output = Result<(), PublishError>> + Send {
            self.0.lock().unwrap().push(format!("publish {}", message.id()));
            std::future::ready(if message.id() == "bad" {
                Err(PublishError::new("nack"))
            } else {
                Ok(())
            })
        }
    }

    struct Nobody;
    impl Wake for Nobody {
        fn wake(self: Arc<Self>) {}
    }

    #[test]
    fn marks_follow_the_brokers_answer_and_only_a_short_batch_waits() {
        let storage = Memory::default();
        *storage.batches.lock().unwrap() =
            vec![Ok(vec!["a", "bad"]), Ok(vec!["c"]), Err(()), Ok(vec![])];
        let log = storage.log.clone();
        let broker = Broker(log.clone());
        let settings = RelaySettings::default().with_batch(2).unwrap();
        let reports = RefCell::new(Vec::new());
        let waits = RefCell::new(Vec::new());
        let relay = relay_loop(
            storage,
            broker,
            settings,
            || SystemTime::UNIX_EPOCH,
            |pause| {
                waits.borrow_mut().push(pause);
                YieldNow(false) // pending once: one wait per poll
            },
            |report: Result<BatchReport, OutboxError>| {
                reports.borrow_mut().push(match report {
                    Ok(r) => format!("{}/{}/{}", r.claimed, r.delivered, r.retried),
                    Err(e) => e.to_string(),
                })
            },
        );
        let mut relay = std::pin::pin!(relay);
        let waker = Waker::from(Arc::new(Nobody));
        let mut cx = Context::from_waker(&waker);
        assert!(relay.as_mut().poll(&mut cx).is_pending(), "a full batch yields");
        assert_eq!(*reports.borrow(), ["2/1/1"]);
        assert!(waits.borrow().is_empty(), "no wait after a full batch");
        let logged = log.lock().unwrap().clone();
        let published =
            ["claim 2", "begin a", "publish a", "delivered a", "begin bad", "publish bad"];
        assert_eq!(logged[..6], published, "counted first, delivered once confirmed");
        assert_eq!(logged[6], "failed bad: publishing failed: nack");
        for _ in 0..3 {
            assert!(relay.as_mut().poll(&mut cx).is_pending());
        }
        let failed = "an outbox row cannot be read: claim";
        assert_eq!(*reports.borrow(), ["2/1/1", "1/1/0", failed, "0/0/0"]);
        let poll = settings.poll();
        assert_eq!(*waits.borrow(), [poll, poll, poll], "a short or failed batch waits");
    }

    #[test]
    fn a_publish_error_says_the_brokers_reason() {
        let e = PublishError::new("no confirm within 5s");
        assert_eq!(e.to_string(), "publishing failed: no confirm within 5s");
        assert!(e.source().is_some());
    }
}
