//! [`RedisStore`]: idempotency records in Redis, one hash per key.
//!
//! Invariant: every claim and every settling write is one Lua script (one round trip,
//! atomic on the server) that reads the time from Redis (`TIME`) and, for a settling
//! write, checks the record is still PROCESSING under the caller's token. A record's key
//! expires with the record (`PEXPIREAT`), so Redis purges what is dead by itself.
//!
//! Keys are `idemcache:{<hex of the stored key>}`: the braces are a hash tag, so each
//! script touches one slot and the store works on Redis Cluster. The index of UNKNOWN
//! records (`idemcache:unknown`, a sorted set scored by Redis's own time at the mark)
//! lives in its own slot, so it is written by a script of its own pipelined in front of
//! `mark_unknown`'s (one round trip). Its members name the record *and its token*
//! (`<hex>:<token>`): a member is live only while that record is UNKNOWN under that
//! token, so resolving or forgetting never has to touch the index, and a stale member
//! (resolved, expired, or its mark refused) can be trimmed by exact name without ever
//! removing a newer mark. The member goes in first, so a connection lost between the
//! two leaves a stale member (trimmed later), not an UNKNOWN record nobody lists.
//!
//! Scripts never return a Lua `nil` inside a reply (it would cut the array short): a
//! field a record lacks comes back `false`, and the client answers
//! [`StoreError::Corrupt`] naming the key.
//!
//! Tokens are `max(previous token + 1, Redis's time in µs)`: larger than any earlier
//! token of the key while its record lives, and after it expired as long as Redis's
//! clock does not step back.

use std::future::Future;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, RedisResult, Script};

use super::{
    check_duration, corrupt, fingerprint_of, from_micros, micros, named, Store, StoreClaim,
    StoreError, StoredResult, UnknownRecord,
};
use crate::{Fingerprint, Key};

const UNKNOWN_INDEX: &str = "idemcache:unknown";

/// The time on Redis's clock in µs; `fmt` for writing integers without exponents;
/// `owned(token)`: KEYS[1] is live PROCESSING under `token`; `unknown()`: it is a live
/// UNKNOWN.
const PRELUDE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function fmt(x) return string.format('%.0f', x) end
local function owned(token)
  local r = redis.call('HMGET', KEYS[1], 'state', 'token', 'expires')
  return tonumber(r[1]) == 1 and tonumber(r[2]) == tonumber(token) and tonumber(r[3]) > now
end
local function unknown()
  local r = redis.call('HMGET', KEYS[1], 'state', 'expires')
  return tonumber(r[1]) == 3 and tonumber(r[2]) > now
end
";

const CLAIM: &str = r"
local r = redis.call('HMGET', KEYS[1], 'state', 'fp', 'token', 'body', 'settled', 'expires')
local state, expires = tonumber(r[1]), tonumber(r[6])
if state and expires and expires > now then
  return {state, r[2] or false, tonumber(r[3]) or false, r[4] or false, tonumber(r[5]) or false, expires}
end
local token = math.max((tonumber(r[3]) or 0) + 1, now)
local ends = now + tonumber(ARGV[2])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'state', 1, 'fp', ARGV[1], 'token', fmt(token), 'started', fmt(now), 'expires', fmt(ends))
redis.call('PEXPIREAT', KEYS[1], fmt(math.ceil(ends / 1000)))
return {0, false, token, false, false, ends}
";

/// ARGV: token, TTL in µs, then the body if there is one.
const COMPLETE: &str = r"
if not owned(ARGV[1]) then return false end
local ends = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'state', 2, 'settled', fmt(now), 'expires', fmt(ends))
if #ARGV >= 3 then redis.call('HSET', KEYS[1], 'body', ARGV[3]) else redis.call('HDEL', KEYS[1], 'body') end
redis.call('PEXPIREAT', KEYS[1], fmt(math.ceil(ends / 1000)))
return {now, ends}
";

/// ARGV: token, lease in µs.
const EXTEND_LEASE: &str = r"
if not owned(ARGV[1]) then return false end
local ends = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'expires', fmt(ends))
redis.call('PEXPIREAT', KEYS[1], fmt(math.ceil(ends / 1000)))
return {now, ends}
";

/// ARGV: token.
const RELEASE: &str = r"
if not owned(ARGV[1]) then return false end
redis.call('DEL', KEYS[1])
return {now, now}
";

/// KEYS[1]: the UNKNOWN index. ARGV: the member. Scores it by Redis's time.
const INDEX_MARK: &str = r"
redis.call('ZADD', KEYS[1], fmt(now), ARGV[1])
return 1
";

/// ARGV: token, TTL in µs.
const MARK_UNKNOWN: &str = r"
if not owned(ARGV[1]) then return false end
local ends = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'state', 3, 'settled', fmt(now), 'expires', fmt(ends))
redis.call('PEXPIREAT', KEYS[1], fmt(math.ceil(ends / 1000)))
return {now, ends}
";

/// ARGV: TTL in µs, then the body if there is one.
const RESOLVE: &str = r"
if not unknown() then return false end
local ends = now + tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'state', 2, 'settled', fmt(now), 'expires', fmt(ends))
if #ARGV >= 2 then redis.call('HSET', KEYS[1], 'body', ARGV[2]) else redis.call('HDEL', KEYS[1], 'body') end
redis.call('PEXPIREAT', KEYS[1], fmt(math.ceil(ends / 1000)))
return {now, ends}
";

const FORGET: &str = r"
if not unknown() then return false end
redis.call('DEL', KEYS[1])
return {now, now}
";

/// ARGV: the index's members (`<hex>:<token>`) to check. Returns those whose record is
/// a live UNKNOWN under that token, with its fingerprint and mark time.
const LIST_UNKNOWN: &str = r"
local out = {}
for i, member in ipairs(ARGV) do
  local hex, token = string.match(member, '^(%x+):(%d+)$')
  if hex then
    local r = redis.call('HMGET', 'idemcache:{' .. hex .. '}', 'state', 'fp', 'settled', 'expires', 'token')
    if tonumber(r[1]) == 3 and tonumber(r[4]) > now and tonumber(r[5]) == tonumber(token) then
      table.insert(out, {member, r[2] or false, tonumber(r[3]) or false})
    end
  end
end
return out
";

/// Idempotency records in Redis. See the module docs for the guarantees.
///
/// Redis expires records by itself, but not the index of UNKNOWN records: each
/// `mark_unknown` adds one member (the key in hex and the token, under 2.2 KiB) that
/// stays after its record is resolved, forgotten or expired, until
/// [`purge_expired`](Store::purge_expired) trims it (listing with
/// [`unknown`](Store::unknown) trims the stale members it reads too). Run
/// `purge_expired` periodically, as for every store: every minute, say, calling it
/// again while it returns its limit.
#[derive(Clone)]
pub struct RedisStore {
    connection: ConnectionManager,
    scripts: std::sync::Arc<Scripts>,
}

struct Scripts {
    claim: Script,
    index_mark: Script,
    complete: Script,
    extend_lease: Script,
    release: Script,
    mark_unknown: Script,
    resolve: Script,
    forget: Script,
    list_unknown: Script,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").finish_non_exhaustive()
    }
}

/// A Redis error as a store error: a record key holding another type (`WRONGTYPE`) or
/// a reply that does not read as a record is [`StoreError::Corrupt`]; anything else is
/// the server failing or unreachable.
fn backend(e: redis::RedisError) -> StoreError {
    if e.code() == Some("WRONGTYPE") || e.kind() == redis::ErrorKind::TypeError {
        return StoreError::Corrupt(format!("a record does not read as one: {e}"));
    }
    StoreError::Backend(Box::new(e))
}

fn record_key(key: &Key) -> String {
    format!("idemcache:{{{}}}", hex(key.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    (s.len() % 2 == 0)
        .then(|| {
            (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
        })
        .flatten()
}

impl RedisStore {
    /// Connects to `url` (`redis://host:port/db`); reconnects by itself afterwards. An
    /// unreachable server is [`StoreError::Backend`], here or from any later operation.
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url).map_err(backend)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Duration::from_secs(5))
            .set_response_timeout(Duration::from_secs(5))
            .set_number_of_retries(1);
        let connection =
            client.get_connection_manager_with_config(config).await.map_err(backend)?;
        let script = |body: &str| Script::new(&format!("{PRELUDE}{body}"));
        let scripts = Scripts {
            claim: script(CLAIM),
            index_mark: script(INDEX_MARK),
            complete: script(COMPLETE),
            extend_lease: script(EXTEND_LEASE),
            release: script(RELEASE),
            mark_unknown: script(MARK_UNKNOWN),
            resolve: script(RESOLVE),
            forget: script(FORGET),
            list_unknown: script(LIST_UNKNOWN),
        };
        Ok(RedisStore { connection, scripts: std::sync::Arc::new(scripts) })
    }

    /// Runs a settling script; `None` from it is `missing`.
    async fn settle(
        &self,
        script: &Script,
        key: &Key,
        args: Vec<Vec<u8>>,
        missing: StoreError,
    ) -> Result<(i64, i64), StoreError> {
        let mut invocation = script.key(record_key(key));
        for arg in args {
            invocation.arg(arg);
        }
        let mut connection = self.connection.clone();
        let done: Option<(i64, i64)> =
            invocation.invoke_async(&mut connection).await.map_err(backend)?;
        done.ok_or(missing)
    }
}

fn number(n: impl ToString) -> Vec<u8> {
    n.to_string().into_bytes()
}

type ClaimReply = (i64, Option<Vec<u8>>, Option<i64>, Option<Vec<u8>>, Option<i64>, i64);

impl Store for RedisStore {
    fn claim(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> impl Future<Output = Result<StoreClaim, StoreError>> + Send {
        let record = record_key(key);
        let key = key.clone();
        async move {
            check_duration("lease", lease)?;
            let mut connection = self.connection.clone();
            let reply: ClaimReply = self
                .scripts
                .claim
                .key(record)
                .arg(fingerprint.to_bytes().to_vec())
                .arg(micros(lease))
                .invoke_async(&mut connection)
                .await
                .map_err(|e| named(&key, backend(e)))?;
            let (state, fp, token, body, settled, expires) = reply;
            let token =
                token.ok_or_else(|| corrupt(key.as_bytes(), "its token is not a number"))?;
            if state == 0 {
                return Ok(StoreClaim::Acquired {
                    token: token as u64,
                    lease_ends_at: from_micros(expires),
                });
            }
            let fp = fp.ok_or_else(|| corrupt(key.as_bytes(), "it has no fingerprint"))?;
            if fingerprint_of(fp).map_err(|e| named(&key, e))? != fingerprint {
                return Ok(StoreClaim::Mismatch);
            }
            let settled = from_micros(settled.unwrap_or(expires));
            Ok(match state {
                1 => StoreClaim::InProgress { lease_ends_at: from_micros(expires) },
                2 => StoreClaim::Completed(StoredResult {
                    body: body.map(Bytes::from),
                    completed_at: settled,
                    expires_at: from_micros(expires),
                }),
                3 => StoreClaim::Unknown { marked_at: settled },
                other => return Err(corrupt(key.as_bytes(), format_args!("its state is {other}"))),
            })
        }
    }

    fn complete(
        &self,
        key: &Key,
        token: u64,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<StoredResult, StoreError>> + Send {
        let key = key.clone();
        async move {
            check_duration("result TTL", ttl)?;
            let mut args = vec![number(token), number(micros(ttl))];
            args.extend(body.as_deref().map(<[u8]>::to_vec));
            let (at, until) =
                self.settle(&self.scripts.complete, &key, args, StoreError::LeaseLost).await?;
            Ok(StoredResult { body, completed_at: from_micros(at), expires_at: from_micros(until) })
        }
    }

    fn extend_lease(
        &self,
        key: &Key,
        token: u64,
        lease: Duration,
    ) -> impl Future<Output = Result<SystemTime, StoreError>> + Send {
        let key = key.clone();
        async move {
            check_duration("lease", lease)?;
            let args = vec![number(token), number(micros(lease))];
            let (_, until) =
                self.settle(&self.scripts.extend_lease, &key, args, StoreError::LeaseLost).await?;
            Ok(from_micros(until))
        }
    }

    fn release(
        &self,
        key: &Key,
        token: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let key = key.clone();
        async move {
            let args = vec![number(token)];
            self.settle(&self.scripts.release, &key, args, StoreError::LeaseLost).await.map(drop)
        }
    }

    fn mark_unknown(
        &self,
        key: &Key,
        token: u64,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let key = key.clone();
        async move {
            check_duration("unknown TTL", ttl)?;
            let record = record_key(&key);
            let member = format!("{}:{token}", hex(key.as_bytes()));
            let (index, mark) = (&self.scripts.index_mark, &self.scripts.mark_unknown);
            let mut connection = self.connection.clone();
            // The index's member first, then the mark, in one round trip; the member is
            // stale (and trimmed later) if the mark is refused or never runs.
            let mut pipe = redis::pipe();
            pipe.cmd("EVALSHA").arg(index.get_hash()).arg(1).arg(UNKNOWN_INDEX).arg(&member);
            pipe.ignore();
            pipe.cmd("EVALSHA").arg(mark.get_hash()).arg(1).arg(&record);
            pipe.arg(number(token)).arg(number(micros(ttl)));
            let mut done: RedisResult<(Option<(i64, i64)>,)> =
                pipe.query_async(&mut connection).await;
            if matches!(&done, Err(e) if e.kind() == redis::ErrorKind::NoScriptError) {
                // Redis lost its script cache (a restart, SCRIPT FLUSH): load and again.
                for script in [index, mark] {
                    script.prepare_invoke().load_async(&mut connection).await.map_err(backend)?;
                }
                done = pipe.query_async(&mut connection).await;
            }
            let (done,) = done.map_err(backend)?;
            done.map(drop).ok_or(StoreError::LeaseLost)
        }
    }

    fn resolve(
        &self,
        key: &Key,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<StoredResult, StoreError>> + Send {
        let key = key.clone();
        async move {
            check_duration("result TTL", ttl)?;
            let mut args = vec![number(micros(ttl))];
            args.extend(body.as_deref().map(<[u8]>::to_vec));
            // The index's member for this mark is stale from now on (trimmed later).
            let (at, until) =
                self.settle(&self.scripts.resolve, &key, args, StoreError::NotUnknown).await?;
            Ok(StoredResult { body, completed_at: from_micros(at), expires_at: from_micros(until) })
        }
    }

    fn forget(&self, key: &Key) -> impl Future<Output = Result<(), StoreError>> + Send {
        let key = key.clone();
        async move {
            // The index's member for this mark is stale from now on (trimmed later).
            self.settle(&self.scripts.forget, &key, vec![], StoreError::NotUnknown).await.map(drop)
        }
    }

    async fn unknown(&self, limit: usize) -> Result<Vec<UnknownRecord>, StoreError> {
        let mut out = Vec::new();
        let window = limit.max(16);
        // Members may be stale (resolved elsewhere, expired): each window's stale ones
        // are trimmed, so the next window from the front holds new ones.
        while out.len() < limit {
            let batch = self.index_window(0, window).await?;
            for (member, fp, marked_at) in batch.live.iter().take(limit - out.len()) {
                let stored = member
                    .split_once(':')
                    .and_then(|(hex, _token)| unhex(hex))
                    .ok_or_else(|| StoreError::Corrupt(format!("the index member {member:?}")))?;
                let fp = fp.clone().ok_or_else(|| corrupt(&stored, "it has no fingerprint"))?;
                let marked_at =
                    marked_at.ok_or_else(|| corrupt(&stored, "it has no mark time (settled)"))?;
                out.push(UnknownRecord {
                    key: Key::from_stored(&stored).map_err(|e| corrupt(&stored, e))?,
                    fingerprint: fingerprint_of(fp).map_err(|e| corrupt(&stored, e))?,
                    marked_at: from_micros(marked_at),
                });
            }
            if batch.members < window || batch.trimmed == 0 {
                break;
            }
            out.clear(); // the next window starts from the front again
        }
        // The index is scored by the time its member went in, a moment before the mark
        // itself: order what is listed by the mark, as the other stores do.
        out.sort_by(|a, b| (a.marked_at, a.key.as_bytes()).cmp(&(b.marked_at, b.key.as_bytes())));
        Ok(out)
    }

    /// Redis expires records by itself; this trims up to `limit` members of the UNKNOWN
    /// index whose record is gone or no longer UNKNOWN (wherever they stand, behind live
    /// ones too), and returns how many. A `limit` of 0 does nothing.
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let (mut trimmed, mut start) = (0, 0);
        while trimmed < limit {
            let window = limit - trimmed;
            let batch = self.index_window(start, window).await?;
            trimmed += batch.trimmed;
            if batch.members < window {
                break; // the end of the index
            }
            start += batch.live.len(); // the stale ones are gone; the live ones stay ahead
        }
        Ok(trimmed)
    }
}

/// A window of the UNKNOWN index, checked: its live members with their record's
/// fingerprint and mark time as read (`None`: the record lacks the field).
#[allow(clippy::type_complexity)]
struct IndexBatch {
    members: usize,
    live: Vec<(String, Option<Vec<u8>>, Option<i64>)>,
    trimmed: usize,
}

impl RedisStore {
    /// Reads up to `n` members of the UNKNOWN index from rank `start`, keeps the live
    /// ones (oldest first) and removes the stale ones from the index.
    async fn index_window(&self, start: usize, n: usize) -> Result<IndexBatch, StoreError> {
        if n == 0 {
            // `ZRANGE key s s-1` would read nothing, but `0 -1` reads everything.
            return Ok(IndexBatch { members: 0, live: Vec::new(), trimmed: 0 });
        }
        let mut connection = self.connection.clone();
        let first = isize::try_from(start).unwrap_or(isize::MAX);
        let last = first.saturating_add(isize::try_from(n).unwrap_or(isize::MAX) - 1);
        let members: Vec<String> =
            connection.zrange(UNKNOWN_INDEX, first, last).await.map_err(backend)?;
        if members.is_empty() {
            return Ok(IndexBatch { members: 0, live: Vec::new(), trimmed: 0 });
        }
        let mut invocation = self.scripts.list_unknown.prepare_invoke();
        for member in &members {
            invocation.arg(member);
        }
        let live: Vec<(String, Option<Vec<u8>>, Option<i64>)> =
            invocation.invoke_async(&mut connection).await.map_err(backend)?;
        let stale: Vec<&String> =
            members.iter().filter(|m| !live.iter().any(|(l, _, _)| l == *m)).collect();
        if !stale.is_empty() {
            let _: () = connection.zrem(UNKNOWN_INDEX, &stale).await.map_err(backend)?;
        }
        Ok(IndexBatch { members: members.len(), trimmed: stale.len(), live })
    }
}
