//! The relay's history (`RELAY_HISTORY=FILE`, off by default): each publish the relay
//! begins, with its lease's fencing token and the attempt its count made, and each
//! publish's outcome, appended to a file for a checker to read after a run
//! (`.ci/outbox-chaos` hands it to `.ci/model --outbox-history`).
//!
//! One line per event, tab-separated: `time pid event message_id token attempt`, where
//! `time` is nanoseconds since the Unix epoch on this machine's clock, `pid` this
//! process's id, and `event` one of:
//! - `begin`: a publish begins, under the lease (`token`) whose count
//!   ([`OutboxStorage::begin_attempt`], or the count riding with the previous row's
//!   mark) was applied, as its `attempt`th ([`decode::begun`]). Its `time` is when that
//!   count was sent, not when the line was written: a count is fenced by the token, so
//!   a count sent later belongs to a later claim or a later attempt, and the times order
//!   a message's publishes as the database did. Written before the publish. A publish
//!   no applied count preceded (none does in `relay_batch`) is written with token and
//!   attempt 0.
//! - `confirmed` or `failed`: the broker's answer to that publish, at its arrival, with
//!   the same token and attempt. Written before the row is marked.
//!
//! Invariant: each line is written whole by one `write` call on a file opened for
//! appending (a regular file takes a line of this size at once), before the step it
//! records goes on, so a relay killed at any instant leaves whole lines only: every
//! publish it began has its `begin` line, and every outcome it saw its line before the
//! row's mark was sent.

// A build without a store or a broker never runs the relay's loop, so never records.
#![cfg_attr(
    not(all(feature = "amqp", feature = "nats", feature = "sqlite", feature = "postgres")),
    allow(dead_code)
)]

use std::collections::HashMap;
use std::fs::File;
use std::future::Future;
use std::io::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idemcache_sql::outbox::{
    decode, Batch, Lease, Mark, OutboxError, OutboxMessage, OutboxStorage, PublishError, Publisher,
    Retry,
};

/// The history file, and the counts applied whose publish has not begun yet.
#[derive(Debug)]
pub(crate) struct History {
    file: File,
    pid: u32,
    /// Per message id: the counted lease's token, its attempt, when the count was sent.
    counted: Mutex<HashMap<String, (u64, u32, u128)>>,
}

impl History {
    /// Opens (creating) `path` for appending.
    pub(crate) fn open(path: &Path) -> std::io::Result<Arc<History>> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Arc::new(History { file, pid: std::process::id(), counted: Mutex::default() }))
    }

    /// A count of `lease`'s row, sent at `sent`, was applied: its publish comes next.
    fn counted(&self, lease: &Lease, sent: u128) {
        let begun = decode::begun(lease);
        let mut counted = self.counted.lock().unwrap_or_else(|e| e.into_inner());
        counted.insert(begun.message_id, (begun.token, begun.attempts, sent));
    }

    /// The count a publish of `id` begins under (token and attempt 0 if none).
    fn take(&self, id: &str) -> (u64, u32, u128) {
        let mut counted = self.counted.lock().unwrap_or_else(|e| e.into_inner());
        counted.remove(id).unwrap_or((0, 0, now()))
    }

    /// Appends one event, whole, in one write.
    fn write(&self, time: u128, event: &str, id: &str, token: u64, attempt: u32) {
        let line = format!("{time}\t{}\t{event}\t{id}\t{token}\t{attempt}\n", self.pid);
        if let Err(e) = (&self.file).write_all(line.as_bytes()) {
            eprintln!("error: RELAY_HISTORY: {e}");
        }
    }
}

/// Nanoseconds since the Unix epoch.
fn now() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos()
}

/// A storage that tells the history each count it applied.
pub(crate) struct Recorded<T> {
    pub(crate) inner: T,
    pub(crate) history: Arc<History>,
}

impl<S: OutboxStorage + Sync> OutboxStorage for Recorded<S> {
    fn claim_due(
        &self,
        batch: usize,
        lease: Duration,
        now: SystemTime,
    ) -> impl Future<Output = Result<Batch, OutboxError>> + Send {
        self.inner.claim_due(batch, lease, now)
    }

    async fn begin_attempt(&self, lease: &Lease) -> Result<Mark, OutboxError> {
        let sent = now();
        let counted = self.inner.begin_attempt(lease).await;
        if let Ok(Mark::Applied) = counted {
            self.history.counted(lease, sent);
        }
        counted
    }

    fn mark_delivered(
        &self,
        lease: &Lease,
        now: SystemTime,
    ) -> impl Future<Output = Result<Mark, OutboxError>> + Send {
        self.inner.mark_delivered(lease, now)
    }

    fn mark_failed(
        &self,
        lease: &Lease,
        error: &str,
        now: SystemTime,
        retry: &Retry,
    ) -> impl Future<Output = Result<Mark, OutboxError>> + Send {
        self.inner.mark_failed(lease, error, now, retry)
    }

    async fn mark_delivered_and_begin(
        &self,
        lease: &Lease,
        at: SystemTime,
        next: &Lease,
    ) -> (Result<Mark, OutboxError>, Result<Mark, OutboxError>) {
        let sent = now();
        let (marked, counted) = self.inner.mark_delivered_and_begin(lease, at, next).await;
        if let Ok(Mark::Applied) = counted {
            self.history.counted(next, sent);
        }
        (marked, counted)
    }
}

impl<P: Publisher + Sync> Publisher for Recorded<P> {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), PublishError> {
        let (token, attempt, sent) = self.history.take(message.id());
        self.history.write(sent, "begin", message.id(), token, attempt);
        let published = self.inner.publish(message).await;
        let outcome = if published.is_ok() { "confirmed" } else { "failed" };
        self.history.write(now(), outcome, message.id(), token, attempt);
        published
    }

    fn ready(&self) -> impl Future<Output = Result<(), PublishError>> + Send {
        self.inner.ready()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Confirms every message but `"bad"`.
    struct Broker;
    impl Publisher for Broker {
        async fn publish(&self, message: &OutboxMessage) -> Result<(), PublishError> {
            if message.id() == "bad" {
                Err(PublishError::new("nack"))
            } else {
                Ok(())
            }
        }
    }

    #[tokio::test]
    async fn each_publish_is_written_with_its_counts_token_attempt_and_time() {
        let path = std::env::temp_dir().join(format!("relay-history-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let history = History::open(&path).unwrap();
        let publisher = Recorded { inner: Broker, history: history.clone() };
        let lease = |id: &str, token, attempts| Lease { message_id: id.into(), token, attempts };
        history.counted(&lease("m1", 3, 0), 1_000);
        history.counted(&lease("bad", 7, 4), 2_000);
        publisher.publish(&OutboxMessage::new("m1", "t", &b""[..])).await.unwrap();
        publisher.publish(&OutboxMessage::new("bad", "t", &b""[..])).await.unwrap_err();
        // No count before it: written under token and attempt 0.
        publisher.publish(&OutboxMessage::new("m1", "t", &b""[..])).await.unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let pid = std::process::id().to_string();
        let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
        assert_eq!(lines.len(), 6, "{text}");
        assert!(lines.iter().all(|l| l.len() == 6 && l[1] == pid), "{text}");
        let events: Vec<_> = lines.iter().map(|l| l[2..].join(" ")).collect();
        assert_eq!(
            events,
            ["begin m1 3 1", "confirmed m1 3 1", "begin bad 7 5", "failed bad 7 5"]
                .into_iter()
                .chain(["begin m1 0 0", "confirmed m1 0 0"])
                .collect::<Vec<_>>()
        );
        assert_eq!((lines[0][0], lines[2][0]), ("1000", "2000"), "a begin at its count's time");
        assert!(lines[1][0].parse::<u128>().unwrap() > 2_000, "an outcome at its arrival");
    }
}
