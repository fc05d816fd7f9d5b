//! Waiting for replicas ([`RedisStore::wait_for_replicas`]): `WAIT` sent with claims
//! and completions, and [`NotReplicated`] when fewer replicas acknowledged.
//!
//! Invariant: `WAIT` goes in one pipeline with the write it waits for (so on the
//! connection and the node that wrote), and a write fewer replicas acknowledged than
//! asked is answered as an error carrying [`NotReplicated`], never as done.

use std::time::Duration;

use redis::RedisResult;

use idemcache::store::StoreError;
use idemcache::Key;

use crate::scripts::{is_noscript, Lua};
use crate::{RedisStore, RESPONSE_TIMEOUT};

/// A write a store was asked to see on replicas ([`RedisStore::wait_for_replicas`])
/// that `WAIT` saw on fewer, carried by [`StoreError::Backend`] (downcast it to tell
/// it apart). The write stands on the primary; what it means for the record is in the
/// crate docs (Replication).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NotReplicated {
    /// The key written.
    pub key: Key,
    /// Which write: `"claim"` or `"completion"`.
    pub write: &'static str,
    /// How many replicas acknowledged it within the timeout.
    pub acknowledged: i64,
    /// How many were asked for.
    pub asked: u32,
}

impl std::fmt::Display for NotReplicated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the {} of {:?} reached {} of the {} replicas asked for in time",
            self.write, self.key, self.acknowledged, self.asked
        )
    }
}

impl std::error::Error for NotReplicated {}

impl RedisStore {
    /// Makes each claim and each completion wait (Redis `WAIT`, sent in one pipeline
    /// with the write, so on the connection and node that wrote) until `replicas`
    /// replicas have this connection's writes, for at most `timeout`. A write that fewer
    /// replicas acknowledged in time is answered [`StoreError::Backend`] carrying
    /// [`NotReplicated`]: for an acquiring claim, its caller does not execute and the
    /// claim is released (nothing ran under it); for a completion, the record is
    /// COMPLETED on the primary but may be lost with it. `WAIT` narrows what a failover
    /// loses; it does not make Redis's replication synchronous (the crate docs,
    /// Replication: the database's UNIQUE backstop is the guarantee).
    ///
    /// What it costs: `WAIT` holds the connection it is sent on, and the store shares
    /// one connection per node between all its operations, so while replicas lag each
    /// waited write delays everything this handle sends to that node (replays and lease
    /// renewals included) by up to `timeout`. Keep `timeout` a small fraction of the
    /// lease (a tenth, say), so that a renewal queued behind waits still lands before
    /// the lease ends. Marks (`mark_unknown`), resolutions and the UNKNOWN index's
    /// members are not waited for: a failover can lose them like any write.
    ///
    /// `replicas` of 0 turns waiting off; a `timeout` of zero (which Redis reads as
    /// "forever") or of 5 s or more (the store's response timeout, past which the wait
    /// would end as a timeout error rather than [`NotReplicated`]) is
    /// [`StoreError::InvalidInput`]. Clones made after share the setting.
    pub fn wait_for_replicas(
        mut self,
        replicas: u32,
        timeout: Duration,
    ) -> Result<RedisStore, StoreError> {
        if replicas == 0 {
            self.wait = None;
            return Ok(self);
        }
        if timeout.as_millis() == 0 || timeout >= RESPONSE_TIMEOUT {
            return Err(StoreError::InvalidInput(format!(
                "a WAIT timeout of {timeout:?}: give one from 1 ms to under \
                 {RESPONSE_TIMEOUT:?} (the store's response timeout)"
            )));
        }
        self.wait = Some((replicas, timeout));
        Ok(self)
    }

    /// [`run`](Self::run), followed in one pipeline (so on the same connection, to the
    /// same node) by `WAIT` when the store waits for replicas: the script's reply and
    /// how many replicas acknowledged.
    pub(crate) async fn run_replicated(
        &self,
        lua: &Lua,
        key: &str,
        args: &[Vec<u8>],
    ) -> RedisResult<(redis::Value, Option<i64>)> {
        let Some((replicas, timeout)) = self.wait else {
            return self.run(lua, key, args).await.map(|v| (v, None));
        };
        let mut connection = self.connection.clone();
        let pipe = |whole| {
            let mut pipe = redis::pipe();
            pipe.add_command(lua.cmd(whole, key, args));
            pipe.cmd("WAIT").arg(replicas).arg(timeout.as_millis() as u64);
            pipe
        };
        let done: RedisResult<(redis::Value, i64)> =
            match pipe(false).query_async(&mut connection).await {
                Err(e) if is_noscript(&e) => pipe(true).query_async(&mut connection).await,
                done => done,
            };
        done.map(|(v, n)| (v, Some(n)))
    }

    /// `Err` carrying [`NotReplicated`] if `acknowledged` is fewer than asked for.
    pub(crate) fn replicated(
        &self,
        key: &Key,
        write: &'static str,
        acknowledged: Option<i64>,
    ) -> Result<(), StoreError> {
        match (self.wait, acknowledged) {
            (Some((asked, _)), Some(acknowledged)) if acknowledged < i64::from(asked) => {
                Err(StoreError::Backend(Box::new(NotReplicated {
                    key: key.clone(),
                    write,
                    acknowledged,
                    asked,
                })))
            }
            _ => Ok(()),
        }
    }
}
