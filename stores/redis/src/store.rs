//! `impl Store for RedisStore`: each operation as the scripts it runs.
//!
//! Invariant: a claim and every settling write is one script on the record's key
//! (judged by Redis's clock, a settling write only under the caller's token); an
//! acquiring claim under `MarkUnknown` puts its index member in before it answers, and
//! `mark_unknown` puts the member in before the mark, so a lost connection leaves a
//! stale member, never an UNKNOWN record nobody lists.

use std::future::Future;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use redis::RedisResult;

use idemcache::store::encoding::{
    check_duration, corrupt, fingerprint, from_micros, hex, lapse_ttl_micros, micros,
};
use idemcache::store::{Record, RecordFilter, RecordState, Store, StoreClaim, StoreError};
use idemcache::{CorrelationId, FencingToken, Fingerprint, Key, Replay, UnknownEntry};

use crate::errors::{named, read_reply};
use crate::index::{LONGEST_WINDOW, PURGE_WINDOWS};
use crate::schema::{index_key, index_keys, record_key};
use crate::scripts::{is_noscript, number, Lua, INDEX_MARK};
use crate::{Connection, RedisStore};

type ClaimReply = (i64, Option<Vec<u8>>, Option<i64>, Option<Vec<u8>>, Option<i64>, i64);

/// The listed record's token as the scripts compare it with the record's `token`
/// (empty: any record). A claim's token is `max(previous + 1, now in µs)`, so a key
/// forgotten and claimed again gets a later one unless Redis's clock stepped back to
/// the very microsecond of the listed claim.
fn listed_arg(token: FencingToken) -> Vec<u8> {
    number(token.get())
}

impl RedisStore {
    /// Runs a settling script; `None` from it is `missing` of the key.
    async fn settle(
        &self,
        script: &Lua,
        key: &Key,
        args: Vec<Vec<u8>>,
        missing: fn(Key) -> StoreError,
    ) -> Result<(i64, i64), StoreError> {
        let done = self
            .run(script, &record_key(key), &args)
            .await
            .map_err(|e| named(key, self.failed(e)))?;
        let done: Option<(i64, i64)> = read_reply(done).map_err(|e| named(key, e))?;
        done.ok_or_else(|| missing(key.clone()))
    }

    /// UNKNOWN → COMPLETED of `key`, of the `listed` record only if given.
    async fn resolve_where(
        &self,
        key: Key,
        listed: Option<Vec<u8>>,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> Result<Replay<SystemTime>, StoreError> {
        check_duration("result TTL", ttl)?;
        let mut args = vec![number(micros(ttl)), number(lapse_ttl_micros(self.lapse))];
        args.push(listed.unwrap_or_default());
        args.extend(body.as_deref().map(<[u8]>::to_vec));
        // The index's member for this mark is stale from now on (trimmed later).
        let (at, until) =
            self.settle(&self.scripts.resolve, &key, args, StoreError::NothingToSettle).await?;
        Ok(Replay::new(body, from_micros(at), from_micros(until)))
    }

    /// UNKNOWN → absent of `key`, of the `listed` record only if given.
    async fn forget_where(&self, key: Key, listed: Option<Vec<u8>>) -> Result<(), StoreError> {
        // The index's member for this mark is stale from now on (trimmed later).
        let args = vec![number(lapse_ttl_micros(self.lapse)), listed.unwrap_or_default()];
        self.settle(&self.scripts.forget, &key, args, StoreError::NothingToSettle).await.map(drop)
    }
}

impl Store for RedisStore {
    fn claim_correlated(
        &self,
        key: &Key,
        fp_in: Fingerprint,
        lease: Duration,
        correlation_id: Option<&CorrelationId>,
    ) -> impl Future<Output = Result<StoreClaim, StoreError>> + Send {
        let record = record_key(key);
        let key = key.clone();
        let correlation_id = correlation_id.map_or_else(Vec::new, |id| id.as_str().into());
        async move {
            check_duration("lease", lease)?;
            let mut connection = self.connection.clone();
            let lapse = lapse_ttl_micros(self.lapse);
            // The token whose lapse this claim may turn UNKNOWN, once its member is in.
            let mut turn = 0;
            let mut acknowledged;
            let (state, fp, token, body, settled, expires) = loop {
                let args = [
                    fp_in.to_bytes().to_vec(),
                    number(micros(lease)),
                    number(lapse),
                    number(turn),
                    correlation_id.clone(),
                ];
                let (reply, replicas) = self
                    .run_replicated(&self.scripts.claim, &record, &args)
                    .await
                    .map_err(|e| named(&key, self.failed(e)))?;
                acknowledged = replicas;
                let reply: ClaimReply = read_reply(reply).map_err(|e| named(&key, e))?;
                match reply {
                    // Lapsed under `token` (MarkUnknown): the index's member first, so a
                    // connection lost before the turn leaves a member, never an UNKNOWN
                    // record nobody lists; then again, allowed to turn it. A record that
                    // moved on meanwhile is answered as it is now (the member is stale).
                    (4, _, Some(token), ..) if turn != token => {
                        self.index(&mut connection, &key, token).await?;
                        turn = token;
                    }
                    (4, ..) => {
                        return Err(corrupt(key.as_bytes(), "its lapse did not turn UNKNOWN"));
                    }
                    reply => break reply,
                }
            };
            let token =
                token.ok_or_else(|| corrupt(key.as_bytes(), "its token is not a number"))?;
            if state == 0 {
                // Not seen on the replicas asked for: a failover could lose the claim
                // and let another caller acquire the key, so this caller must not
                // execute. Nothing ran under the token, so the key is let go at once
                // (best effort: a release that fails leaves the record to lapse),
                // rather than held for a lease and, under `MarkUnknown`, turned into an
                // UNKNOWN that nobody executed.
                if let Err(e) = self.replicated(&key, "claim", acknowledged) {
                    let _ = Store::release(self, &key, FencingToken::new(token as u64)).await;
                    return Err(e);
                }
            }
            if state == 0 && lapse > 0 {
                // Listed if it lapses, before anyone can execute under it.
                self.index(&mut connection, &key, token).await?;
            }
            if state == 0 {
                return Ok(StoreClaim::Acquired {
                    token: FencingToken::new(token as u64),
                    lease_ends_at: from_micros(expires),
                    took_over: settled.is_some(),
                });
            }
            let fp = fp.ok_or_else(|| corrupt(key.as_bytes(), "it has no fingerprint"))?;
            if self::fingerprint(&fp).map_err(|e| named(&key, e))? != fp_in {
                return Ok(StoreClaim::Mismatch);
            }
            let settled = from_micros(settled.unwrap_or(expires));
            Ok(match state {
                1 => StoreClaim::InProgress { lease_ends_at: from_micros(expires) },
                2 => StoreClaim::Completed(Replay::new(
                    body.map(Bytes::from),
                    settled,
                    from_micros(expires),
                )),
                3 => StoreClaim::Unknown { marked_at: settled },
                other => return Err(corrupt(key.as_bytes(), format_args!("its state is {other}"))),
            })
        }
    }

    fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Replay<SystemTime>, StoreError>> + Send {
        let key = key.clone();
        async move {
            check_duration("result TTL", ttl)?;
            let mut args = vec![number(token.get()), number(micros(ttl))];
            args.extend(body.as_deref().map(<[u8]>::to_vec));
            let (done, acknowledged) = self
                .run_replicated(&self.scripts.complete, &record_key(&key), &args)
                .await
                .map_err(|e| named(&key, self.failed(e)))?;
            let done: Option<(i64, i64)> = read_reply(done).map_err(|e| named(&key, e))?;
            let (at, until) = done.ok_or_else(|| StoreError::LeaseLost(key.clone()))?;
            self.replicated(&key, "completion", acknowledged)?;
            Ok(Replay::new(body, from_micros(at), from_micros(until)))
        }
    }

    fn extend_lease(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Duration,
    ) -> impl Future<Output = Result<SystemTime, StoreError>> + Send {
        let key = key.clone();
        async move {
            check_duration("lease", lease)?;
            let lapse = lapse_ttl_micros(self.lapse);
            let args = vec![number(token.get()), number(micros(lease)), number(lapse)];
            let (_, until) =
                self.settle(&self.scripts.extend_lease, &key, args, StoreError::LeaseLost).await?;
            Ok(from_micros(until))
        }
    }

    fn release(
        &self,
        key: &Key,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let key = key.clone();
        async move {
            let args = vec![number(token.get())];
            self.settle(&self.scripts.release, &key, args, StoreError::LeaseLost).await.map(drop)
        }
    }

    fn mark_unknown(
        &self,
        key: &Key,
        token: FencingToken,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let key = key.clone();
        async move {
            check_duration("unknown TTL", ttl)?;
            let record = record_key(&key);
            let args = [number(token.get()), number(micros(ttl))];
            let mark = &self.scripts.mark_unknown;
            let mut connection = self.connection.clone();
            // The index's member first, then the mark; the member is stale (and trimmed
            // later) if the mark is refused or never runs. On one server both go in one
            // round trip (a pipeline); on a cluster they are in two slots, so two
            // commands, the member's answered before the mark is sent.
            let done = match &connection {
                Connection::Single(_) => {
                    let member = format!("{}:{}", hex(key.as_bytes()), token.get());
                    let pipe = |whole| {
                        let mut pipe = redis::pipe();
                        pipe.cmd("EVAL").arg(INDEX_MARK).arg(1).arg(index_key(&key)).arg(&member);
                        pipe.ignore().add_command(mark.cmd(whole, &record, &args));
                        pipe
                    };
                    // Only the mark can meet NOSCRIPT (the index's script is sent whole),
                    // and then it did not run: running both again is safe.
                    let done: RedisResult<(redis::Value,)> = match pipe(false)
                        .query_async(&mut connection)
                        .await
                    {
                        Err(e) if is_noscript(&e) => pipe(true).query_async(&mut connection).await,
                        done => done,
                    };
                    done.map(|(done,)| done)
                }
                Connection::Cluster(_) => {
                    self.index(&mut connection, &key, token.get() as i64).await?;
                    self.run(mark, &record, &args).await
                }
            };
            let done = done.map_err(|e| named(&key, self.failed(e)))?;
            let done: Option<(i64, i64)> = read_reply(done).map_err(|e| named(&key, e))?;
            done.map(drop).ok_or(StoreError::LeaseLost(key.clone()))
        }
    }

    fn resolve_fenced(
        &self,
        key: &Key,
        execution: Option<FencingToken>,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Replay<SystemTime>, StoreError>> + Send {
        self.resolve_where(key.clone(), execution.map(listed_arg), body, ttl)
    }

    fn forget_fenced(
        &self,
        key: &Key,
        execution: Option<FencingToken>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.forget_where(key.clone(), execution.map(listed_arg))
    }

    async fn list_unknown(
        &self,
        limit: usize,
    ) -> Result<Vec<UnknownEntry<SystemTime>>, StoreError> {
        let mut out = Vec::new();
        // `limit` members at a time (a listing may be long: its caller bounds it).
        let window = limit.max(16);
        // Each bucket is ordered by the time its members went in, so the first `limit`
        // listable members of every bucket hold the first `limit` of the whole index:
        // read up to that many from each, bucket by bucket (one slot at a time), merge.
        for index in index_keys() {
            // Members may be stale (resolved elsewhere, expired), which each window
            // trims, or name live leases (`MarkUnknown`), which are kept and not
            // listed: the next window starts past the kept ones.
            let (mut listed, mut start) = (0, 0);
            while listed < limit {
                let batch = self.index_window(&index, start, window).await?;
                for kept in batch.kept.iter().filter(|k| !k.pending).take(limit - listed) {
                    out.push(kept.listed()?);
                    listed += 1;
                }
                if batch.members < window {
                    break;
                }
                start += batch.kept.len();
            }
        }
        // The index is scored by the time its member went in, a moment before the mark
        // itself: order what is listed by the mark, as the other stores do.
        out.sort_by(|a, b| (a.marked_at, a.key.as_bytes()).cmp(&(b.marked_at, b.key.as_bytes())));
        out.truncate(limit);
        Ok(out)
    }

    /// Redis expires records by itself; this trims up to `limit` members of the UNKNOWN
    /// index whose record is gone or no longer UNKNOWN, and returns how many. It checks
    /// at most four times `limit` (at most 4,000) members of the index, and each of its
    /// buckets at most once, from where the last call stopped (see [`RedisStore`]). A
    /// `limit` of 0 does nothing.
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let indexes: Vec<String> = index_keys().collect();
        let cursor = || self.purge_from.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (mut bucket, mut start) = *cursor();
        let budget = PURGE_WINDOWS * limit.min(LONGEST_WINDOW);
        let (mut trimmed, mut checked, mut ended) = (0, 0, 0);
        while trimmed < limit && checked < budget && ended < indexes.len() {
            let window = (limit - trimmed).min(LONGEST_WINDOW).min(budget - checked);
            let batch = self.index_window(&indexes[bucket % indexes.len()], start, window).await?;
            trimmed += batch.trimmed;
            checked += batch.members;
            // The stale ones are gone; the kept ones stay ahead of the next window.
            start += batch.kept.len();
            if batch.members < window {
                // The end of this bucket: the next window is the next bucket's first.
                (bucket, start) = ((bucket + 1) % indexes.len(), 0);
                ended += 1;
            }
        }
        *cursor() = (bucket, start);
        Ok(trimmed)
    }

    async fn record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.read_record(key, 0).await
    }

    /// `SCAN`s every record key (every primary's, on a cluster) for each call, then reads
    /// the keys past `after` one script each: see `records.rs` for the cost.
    async fn records(
        &self,
        filter: &RecordFilter,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.list_records(filter, after, limit).await
    }

    /// One script: the look and the delete are one atomic step.
    async fn remove_record(
        &self,
        key: &Key,
        states: &[RecordState],
    ) -> Result<Option<Record>, StoreError> {
        let mask = crate::records::removal_mask(states);
        if mask == 0 {
            return Ok(None);
        }
        self.read_record(key, mask).await
    }
}
