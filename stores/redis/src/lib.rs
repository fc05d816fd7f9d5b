//! [`RedisStore`]: idemcache's durable records in Redis, one hash per key.
//!
//! This crate tracks the redis crate's current release and re-exports it ([`redis`]), so
//! that the connection manager you already have can be the store's
//! ([`RedisStore::from_connection`]).
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
//!
//! Lapses ([`RedisStore::lapse_policy`]): under `LapsePolicy::MarkUnknown` a PROCESSING
//! record's Redis key lives the unknown TTL past its lease, so it does not vanish when
//! the lease lapses. The claim script never takes over a lease that lapsed less than
//! the TTL ago: it answers "lapsed, token T"; the client puts the index member of T in
//! (first, as `mark_unknown` does) and runs the claim again allowed to turn T, which
//! turns the record UNKNOWN (marked at the lease's end, expiring the TTL after it) in
//! the script and answers Unknown: three round trips on that path, one on every other.
//! `resolve` and `forget` read a lapsed record as UNKNOWN too. So that `unknown` lists
//! a lapse nobody claims again, an acquiring claim under `MarkUnknown` puts its token's
//! member in the index before it answers (one more round trip per acquired claim): the
//! listing keeps the member of a live lease (not listed), lists a lapsed one as the
//! UNKNOWN it is, and purging trims it once the lease settled. A claim that cannot put
//! its member in answers the error and its caller does not execute; the record then
//! lapses, and a check finds nothing happened.

#![cfg_attr(docsrs, feature(doc_cfg))]

use std::future::Future;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, RedisResult, Script};

use idemcache::store::encoding::{
    at_server, check_duration, check_url, corrupt, fingerprint, from_micros, hex, micros,
};
use idemcache::store::{Lapse, Store, StoreClaim, StoreError};
use idemcache::{FencingToken, Fingerprint, Key, LapsePolicy, Replay, UnknownEntry};

pub use redis;

/// `e`, naming `key` if it is [`StoreError::Corrupt`] (which then did not name it).
fn named(key: &Key, e: StoreError) -> StoreError {
    match e {
        StoreError::Corrupt(why) => corrupt(key.as_bytes(), why),
        other => other,
    }
}

const UNKNOWN_INDEX: &str = "idemcache:unknown";

/// The time on Redis's clock in µs; `fmt` for writing integers without exponents;
/// `int` for reading them (`nil` for anything else); `read(key)`: the record at `key`
/// checked field by field (`nil` if there is none, or `nil` and why it does not read);
/// `record()`: KEYS[1]'s, stopping the script with an `IDEMCACHE_CORRUPT` error if it
/// does not read; `owned(token)`: KEYS[1] is live PROCESSING under `token`;
/// `unknown()`: it is a live UNKNOWN.
const PRELUDE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function fmt(x) return string.format('%.0f', x) end
local function int(s)
  if type(s) == 'string' and #s <= 18 and string.match(s, '^%-?%d+$') then return tonumber(s) end
end
local function read(key)
  local r = redis.pcall('HMGET', key, 'state', 'token', 'expires')
  if r.err then return nil, 'its Redis key holds another type' end
  if not (r[1] or r[2] or r[3]) and redis.call('EXISTS', key) == 0 then return nil end
  local state, token, expires = int(r[1]), int(r[2]), int(r[3])
  if state ~= 1 and state ~= 2 and state ~= 3 then return nil, 'its state is not 1, 2 or 3' end
  if not token then return nil, 'its token is not an integer' end
  if not expires then return nil, 'its expiry is not an integer' end
  return {state = state, token = token, expires = expires}
end
local function record()
  local rec, bad = read(KEYS[1])
  if bad then error({err = 'IDEMCACHE_CORRUPT ' .. bad}) end
  return rec
end
local function owned(token)
  local rec = record()
  return rec ~= nil and rec.state == 1 and rec.token == tonumber(token) and rec.expires > now
end
local function unknown(lapse)
  local rec = record()
  if rec == nil then return false end
  if rec.state == 3 and rec.expires > now then return true end
  return rec.state == 1 and rec.expires <= now and rec.expires + tonumber(lapse) > now
end
local function listed(fp, marked)
  if fp == '' then return true end
  local rec = record()
  local r = redis.call('HMGET', KEYS[1], 'fp', 'settled')
  local mark = rec.expires
  if rec.state ~= 1 then mark = int(r[2]) end
  return r[1] == fp and mark == tonumber(marked)
end
";

/// ARGV: fingerprint, lease in µs, the unknown TTL of lapses in µs (0: `TakeOver`), the
/// token whose lapse this call may turn UNKNOWN (0: none). Replies `{state, fp, token,
/// body, settled, expires}`; state 0 is acquired, 4 "lapsed under token, put its index
/// member in and ask again", 3 also when this call turned the lapse.
const CLAIM: &str = r"
local rec = record()
local lapse = tonumber(ARGV[3])
if rec and rec.state == 1 and rec.expires <= now and rec.expires + lapse > now then
  if rec.token ~= tonumber(ARGV[4]) then
    return {4, false, rec.token, false, false, rec.expires}
  end
  local ends = rec.expires + lapse
  redis.call('HSET', KEYS[1], 'state', 3, 'settled', fmt(rec.expires), 'expires', fmt(ends))
  redis.call('PEXPIREAT', KEYS[1], fmt(math.ceil(ends / 1000)))
  return {3, redis.call('HGET', KEYS[1], 'fp') or false, rec.token, false, rec.expires, ends}
end
if rec and rec.expires > now then
  local r = redis.call('HMGET', KEYS[1], 'fp', 'body', 'settled')
  if r[3] and not int(r[3]) then error({err = 'IDEMCACHE_CORRUPT its settled time is not an integer'}) end
  return {rec.state, r[1] or false, rec.token, r[2] or false, int(r[3]) or false, rec.expires}
end
local token = math.max((rec and rec.token or 0) + 1, now)
local ends = now + tonumber(ARGV[2])
-- A record left past its expiry goes first; a fresh key has none to delete.
if rec then redis.call('DEL', KEYS[1]) end
redis.call('HSET', KEYS[1], 'state', 1, 'fp', ARGV[1], 'token', fmt(token), 'started', fmt(now), 'expires', fmt(ends))
redis.call('PEXPIREAT', KEYS[1], fmt(math.ceil((ends + lapse) / 1000)))
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

/// ARGV: token, lease in µs, the unknown TTL of lapses in µs (the key outlives the
/// lease by it).
const EXTEND_LEASE: &str = r"
if not owned(ARGV[1]) then return false end
local ends = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'expires', fmt(ends))
redis.call('PEXPIREAT', KEYS[1], fmt(math.ceil((ends + tonumber(ARGV[3])) / 1000)))
return {now, ends}
";

/// ARGV: token.
const RELEASE: &str = r"
if not owned(ARGV[1]) then return false end
redis.call('DEL', KEYS[1])
return {now, now}
";

/// KEYS[1]: the UNKNOWN index. ARGV: the member. Scores it by Redis's time. Sent whole
/// with `EVAL` (it is short), so it never meets `NOSCRIPT` in the pipeline it opens.
const INDEX_MARK: &str = r"
local t = redis.call('TIME')
redis.call('ZADD', KEYS[1], string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2])), ARGV[1])
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

/// ARGV: TTL in µs, the unknown TTL of lapses in µs, the listed fingerprint and mark
/// (both empty: any record), then the body if there is one.
const RESOLVE: &str = r"
if not (unknown(ARGV[2]) and listed(ARGV[3], ARGV[4])) then return false end
local ends = now + tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'state', 2, 'settled', fmt(now), 'expires', fmt(ends))
if #ARGV >= 5 then redis.call('HSET', KEYS[1], 'body', ARGV[5]) else redis.call('HDEL', KEYS[1], 'body') end
redis.call('PEXPIREAT', KEYS[1], fmt(math.ceil(ends / 1000)))
return {now, ends}
";

/// ARGV: the unknown TTL of lapses in µs, the listed fingerprint and mark (both empty:
/// any record).
const FORGET: &str = r"
if not (unknown(ARGV[1]) and listed(ARGV[2], ARGV[3])) then return false end
redis.call('DEL', KEYS[1])
return {now, now}
";

/// ARGV: the unknown TTL of lapses in µs, then the index's members (`<hex>:<token>`) to
/// check. Returns the members to keep: those whose record is a live UNKNOWN under that
/// token, or a lease of that token lapsed less than the TTL ago (the UNKNOWN it is
/// being turned into), with its fingerprint, mark time and expiry; those whose record
/// does not read, with why (never stopping at one); and those whose record is a live
/// lease of that token (a member put in for a lapse a claim has not turned yet), marked
/// pending.
const LIST_UNKNOWN: &str = r"
local out = {}
local lapse = tonumber(ARGV[1])
for i, member in ipairs(ARGV) do
  local hex, token = string.match(member, '^(%x+):(%d+)$')
  if i > 1 and hex then
    local key = 'idemcache:{' .. hex .. '}'
    local rec, bad = read(key)
    if bad then
      table.insert(out, {member, false, false, bad, false, false})
    elseif rec and rec.token == tonumber(token) then
      if rec.state == 3 and rec.expires > now then
        local r = redis.call('HMGET', key, 'fp', 'settled')
        table.insert(out, {member, r[1] or false, int(r[2]) or false, false, rec.expires, false})
      elseif rec.state == 1 and rec.expires <= now and rec.expires + lapse > now then
        local fp = redis.call('HGET', key, 'fp')
        table.insert(out, {member, fp or false, rec.expires, false, rec.expires + lapse, false})
      elseif rec.state == 1 and rec.expires > now then
        table.insert(out, {member, false, false, false, false, true})
      end
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
/// again while it returns its limit. Each call checks at most four windows of the
/// index (of `limit` members, at most 1,000) from where the last call of this store
/// stopped, wrapping at the end, so its work is bounded whatever the index holds; a
/// call that trims less than `limit` may leave stale members the next calls reach.
#[derive(Clone)]
pub struct RedisStore {
    connection: ConnectionManager,
    scripts: std::sync::Arc<Scripts>,
    /// Where the next `purge_expired` looks in the UNKNOWN index (a rank).
    purge_from: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// `host:port`, as connection errors name the server, when the store connected.
    server: Option<std::sync::Arc<str>>,
    /// What a lapsed lease becomes, for this handle's scripts.
    lapse: Lapse,
}

/// How many windows of the UNKNOWN index one `purge_expired` call checks at most.
const PURGE_WINDOWS: usize = 4;

/// The largest window of the UNKNOWN index read at once.
const LONGEST_WINDOW: usize = 1000;

struct Scripts {
    claim: Script,
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
        f.debug_struct("RedisStore").field("server", &self.server).finish_non_exhaustive()
    }
}

/// A Redis error as a store error: a record a script found unreadable
/// (`IDEMCACHE_CORRUPT`) or a record key holding another type (`WRONGTYPE`) is
/// [`StoreError::Corrupt`]; anything else is the server failing or unreachable (a reply
/// that does not read as a record is [`read_reply`]'s).
fn backend(e: redis::RedisError) -> StoreError {
    // A script's error inside a pipeline (`mark_unknown`'s) is one of the pipeline's
    // server errors, not the error's own code: look at each.
    for (_, server) in e.clone().into_server_errors().iter().flat_map(|errors| errors.iter()) {
        match server.code() {
            "IDEMCACHE_CORRUPT" => {
                // The detail ends with where in which script: not the reader's concern.
                let why = server.details().unwrap_or_default();
                let why = why.split(" script: ").next().unwrap_or(why);
                return StoreError::Corrupt(why.to_owned());
            }
            "WRONGTYPE" => {
                return StoreError::Corrupt(format!("a key of the store does not read as one: {e}"))
            }
            _ => {}
        }
    }
    StoreError::Backend(Box::new(e))
}

/// A reply Redis sent, read as `T`: one that does not read (a field of another type) is
/// [`StoreError::Corrupt`]. Replies are fetched as `redis::Value` and read here, so a
/// parse error from the driver itself is the wire failing (a broken stream, another
/// service on the port: [`backend`]), never mistaken for a record that does not read.
fn read_reply<T: redis::FromRedisValue>(v: redis::Value) -> Result<T, StoreError> {
    redis::from_redis_value(v)
        .map_err(|e| StoreError::Corrupt(format!("a reply does not read as a record: {e}")))
}

fn record_key(key: &Key) -> String {
    format!("idemcache:{{{}}}", hex(key.as_bytes()))
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
    /// unreachable server is [`StoreError::Backend`] naming its host and port, here or
    /// (the driver's own message) from any later operation. Redis needs no schema.
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        check_url(url)?;
        let client = redis::Client::open(url)
            .map_err(|e| StoreError::InvalidInput(format!("not a Redis URL: {e}")))?;
        let server = client.get_connection_info().addr().to_string();
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(1);
        let connection = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(|e| at_server(format!("Redis at {server}"), e))?;
        Ok(RedisStore { server: Some(server.into()), ..RedisStore::from_connection(connection) })
    }

    /// A store over your own connection manager (with the timeouts, TLS and retries you
    /// chose); it is cloned per operation, as the manager is meant to be. The store does
    /// not know where the manager connects, so its errors are the driver's own, not
    /// named by the server as [`connect`](Self::connect)'s are.
    pub fn from_connection(connection: ConnectionManager) -> RedisStore {
        let script = |body: &str| Script::new(&format!("{PRELUDE}{body}"));
        let scripts = Scripts {
            claim: script(CLAIM),
            complete: script(COMPLETE),
            extend_lease: script(EXTEND_LEASE),
            release: script(RELEASE),
            mark_unknown: script(MARK_UNKNOWN),
            resolve: script(RESOLVE),
            forget: script(FORGET),
            list_unknown: script(LIST_UNKNOWN),
        };
        RedisStore {
            connection,
            scripts: std::sync::Arc::new(scripts),
            purge_from: std::sync::Arc::default(),
            server: None,
            lapse: Lapse::TAKE_OVER,
        }
    }

    /// What a lapsed lease becomes for this handle's claims, listings and purges:
    /// taken over ([`LapsePolicy::TakeOver`], the default), or UNKNOWN from the lease's
    /// end for `unknown_ttl` ([`LapsePolicy::MarkUnknown`]; see the crate docs, for what
    /// Redis lists, and [`Lapse`] for what every store does and why handles sharing a
    /// server should agree: a `TakeOver` handle's leases expire from Redis at their end,
    /// and it takes over a lapse not yet turned). Clones made after share the setting.
    /// An `unknown_ttl` of zero or over [`MAX_DURATION`](idemcache::MAX_DURATION) under
    /// `MarkUnknown` is [`StoreError::InvalidInput`].
    pub fn lapse_policy(
        mut self,
        policy: LapsePolicy,
        unknown_ttl: Duration,
    ) -> Result<RedisStore, StoreError> {
        self.lapse = Lapse::new(policy, unknown_ttl)?;
        Ok(self)
    }

    /// This handle's lapse setting.
    pub fn lapse(&self) -> Lapse {
        self.lapse
    }

    /// Puts the UNKNOWN index's member of `key` under `token` in (scored by Redis's
    /// time), as `mark_unknown` does; again is harmless.
    async fn index(
        &self,
        connection: &mut ConnectionManager,
        key: &Key,
        token: i64,
    ) -> Result<(), StoreError> {
        let member = format!("{}:{token}", hex(key.as_bytes()));
        let _: redis::Value = redis::cmd("EVAL")
            .arg(INDEX_MARK)
            .arg(1)
            .arg(UNKNOWN_INDEX)
            .arg(&member)
            .query_async(connection)
            .await
            .map_err(|e| self.failed(e))?;
        Ok(())
    }

    /// A Redis error as a store error ([`backend`]); one of reaching the server names it.
    fn failed(&self, e: redis::RedisError) -> StoreError {
        let unreachable = e.is_io_error()
            || e.is_connection_refusal()
            || e.is_connection_dropped()
            || e.is_timeout();
        match &self.server {
            Some(server) if unreachable => at_server(format!("Redis at {server}"), e),
            _ => backend(e),
        }
    }

    /// Runs a settling script; `None` from it is `missing` of the key.
    async fn settle(
        &self,
        script: &Script,
        key: &Key,
        args: Vec<Vec<u8>>,
        missing: fn(Key) -> StoreError,
    ) -> Result<(i64, i64), StoreError> {
        let mut invocation = script.key(record_key(key));
        for arg in args {
            invocation.arg(arg);
        }
        let mut connection = self.connection.clone();
        let done: redis::Value = invocation
            .invoke_async(&mut connection)
            .await
            .map_err(|e| named(key, self.failed(e)))?;
        let done: Option<(i64, i64)> = read_reply(done).map_err(|e| named(key, e))?;
        done.ok_or_else(|| missing(key.clone()))
    }
}

fn number(n: impl ToString) -> Vec<u8> {
    n.to_string().into_bytes()
}

type ClaimReply = (i64, Option<Vec<u8>>, Option<i64>, Option<Vec<u8>>, Option<i64>, i64);

/// The listed record's fingerprint and mark as the scripts compare them (the record's
/// `fp` bytes; `settled`, or a lapse's `expires`, in µs); both empty: any record.
fn listed_args(entry: &UnknownEntry<SystemTime>) -> [Vec<u8>; 2] {
    let mark = idemcache::store::encoding::to_micros(entry.marked_at);
    [entry.fingerprint.to_bytes().to_vec(), number(mark)]
}

impl RedisStore {
    /// UNKNOWN → COMPLETED of `key`, of the `listed` record only if given.
    async fn resolve_where(
        &self,
        key: Key,
        listed: Option<[Vec<u8>; 2]>,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> Result<Replay<SystemTime>, StoreError> {
        check_duration("result TTL", ttl)?;
        let mut args = vec![number(micros(ttl)), number(self.lapse.unknown_ttl_micros())];
        args.extend(listed.unwrap_or_default());
        args.extend(body.as_deref().map(<[u8]>::to_vec));
        // The index's member for this mark is stale from now on (trimmed later).
        let (at, until) =
            self.settle(&self.scripts.resolve, &key, args, StoreError::NotUnknown).await?;
        Ok(Replay::new(body, from_micros(at), from_micros(until)))
    }

    /// UNKNOWN → absent of `key`, of the `listed` record only if given.
    async fn forget_where(&self, key: Key, listed: Option<[Vec<u8>; 2]>) -> Result<(), StoreError> {
        // The index's member for this mark is stale from now on (trimmed later).
        let mut args = vec![number(self.lapse.unknown_ttl_micros())];
        args.extend(listed.unwrap_or_default());
        self.settle(&self.scripts.forget, &key, args, StoreError::NotUnknown).await.map(drop)
    }
}

impl Store for RedisStore {
    fn claim(
        &self,
        key: &Key,
        fp_in: Fingerprint,
        lease: Duration,
    ) -> impl Future<Output = Result<StoreClaim, StoreError>> + Send {
        let record = record_key(key);
        let key = key.clone();
        async move {
            check_duration("lease", lease)?;
            let mut connection = self.connection.clone();
            let lapse = self.lapse.unknown_ttl_micros();
            // The token whose lapse this claim may turn UNKNOWN, once its member is in.
            let mut turn = 0;
            let (state, fp, token, body, settled, expires) = loop {
                let reply: redis::Value = self
                    .scripts
                    .claim
                    .key(&record)
                    .arg(fp_in.to_bytes().to_vec())
                    .arg(micros(lease))
                    .arg(lapse)
                    .arg(number(turn))
                    .invoke_async(&mut connection)
                    .await
                    .map_err(|e| named(&key, self.failed(e)))?;
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
            if state == 0 && lapse > 0 {
                // Listed if it lapses, before anyone can execute under it.
                self.index(&mut connection, &key, token).await?;
            }
            if state == 0 {
                return Ok(StoreClaim::Acquired {
                    token: FencingToken::new(token as u64),
                    lease_ends_at: from_micros(expires),
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
            let (at, until) =
                self.settle(&self.scripts.complete, &key, args, StoreError::LeaseLost).await?;
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
            let lapse = self.lapse.unknown_ttl_micros();
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
            let member = format!("{}:{}", hex(key.as_bytes()), token.get());
            let mark = &self.scripts.mark_unknown;
            let mut connection = self.connection.clone();
            // The index's member first, then the mark, in one round trip; the member is
            // stale (and trimmed later) if the mark is refused or never runs. Only the
            // mark can meet NOSCRIPT (the index's script is sent whole), and then it did
            // not run: running both again is safe.
            let mut pipe = redis::pipe();
            pipe.cmd("EVAL").arg(INDEX_MARK).arg(1).arg(UNKNOWN_INDEX).arg(&member).ignore();
            pipe.cmd("EVALSHA").arg(mark.get_hash()).arg(1).arg(&record);
            pipe.arg(number(token.get())).arg(number(micros(ttl)));
            let mut done: RedisResult<(redis::Value,)> = pipe.query_async(&mut connection).await;
            if matches!(&done, Err(e) if e.code() == Some("NOSCRIPT")) {
                // Redis lost its script cache (a restart, SCRIPT FLUSH): load and again.
                mark.prepare_invoke()
                    .load_async(&mut connection)
                    .await
                    .map_err(|e| self.failed(e))?;
                done = pipe.query_async(&mut connection).await;
            }
            let (done,) = done.map_err(|e| named(&key, self.failed(e)))?;
            let done: Option<(i64, i64)> = read_reply(done).map_err(|e| named(&key, e))?;
            done.map(drop).ok_or(StoreError::LeaseLost(key.clone()))
        }
    }

    fn resolve(
        &self,
        key: &Key,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Replay<SystemTime>, StoreError>> + Send {
        self.resolve_where(key.clone(), None, body, ttl)
    }

    fn forget(&self, key: &Key) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.forget_where(key.clone(), None)
    }

    fn resolve_listed(
        &self,
        listed: &UnknownEntry<SystemTime>,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Replay<SystemTime>, StoreError>> + Send {
        self.resolve_where(listed.key.clone(), Some(listed_args(listed)), body, ttl)
    }

    fn forget_listed(
        &self,
        listed: &UnknownEntry<SystemTime>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.forget_where(listed.key.clone(), Some(listed_args(listed)))
    }

    async fn unknown(&self, limit: usize) -> Result<Vec<UnknownEntry<SystemTime>>, StoreError> {
        let mut out = Vec::new();
        // `limit` members at a time (a listing may be long: its caller bounds it).
        let window = limit.max(16);
        // Members may be stale (resolved elsewhere, expired), which each window trims, or
        // name live leases (`MarkUnknown`), which are kept and not listed: the next
        // window starts past the kept ones.
        let mut start = 0;
        while out.len() < limit {
            let batch = self.index_window(start, window).await?;
            for kept in batch.kept.iter().filter(|k| !k.pending).take(limit - out.len()) {
                out.push(kept.listed()?);
            }
            if batch.members < window {
                break;
            }
            start += batch.kept.len();
        }
        // The index is scored by the time its member went in, a moment before the mark
        // itself: order what is listed by the mark, as the other stores do.
        out.sort_by(|a, b| (a.marked_at, a.key.as_bytes()).cmp(&(b.marked_at, b.key.as_bytes())));
        Ok(out)
    }

    /// Redis expires records by itself; this trims up to `limit` members of the UNKNOWN
    /// index whose record is gone or no longer UNKNOWN, and returns how many. It checks
    /// at most four windows of the index from where the last call stopped (see
    /// [`RedisStore`]). A `limit` of 0 does nothing.
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        use std::sync::atomic::Ordering::Relaxed;
        let (mut trimmed, mut start) = (0, self.purge_from.load(Relaxed));
        for _ in 0..PURGE_WINDOWS {
            let window = (limit - trimmed).min(LONGEST_WINDOW);
            if window == 0 {
                break;
            }
            let batch = self.index_window(start, window).await?;
            trimmed += batch.trimmed;
            // The stale ones are gone; the kept ones stay ahead of the next window.
            start += batch.kept.len();
            if batch.members < window {
                start = 0; // the end of the index: the next call starts from the front
                break;
            }
        }
        self.purge_from.store(start, Relaxed);
        Ok(trimmed)
    }
}

/// A window of the UNKNOWN index, checked.
struct IndexBatch {
    /// How many members the window held.
    members: usize,
    /// The members to keep, in index order.
    kept: Vec<Kept>,
    /// How many stale members this call removed.
    trimmed: usize,
}

/// An index member to keep: its record is a live UNKNOWN (its fingerprint and mark time
/// as read, `None` where a field is missing), or does not read (`why`).
#[derive(Debug)]
struct Kept {
    member: String,
    fingerprint: Option<Vec<u8>>,
    marked_at: Option<i64>,
    unreadable: Option<String>,
    expires_at: Option<i64>,
    /// A live lease whose member went in for a lapse not turned yet: kept, not listed.
    pending: bool,
}

impl redis::FromRedisValue for Kept {
    fn from_redis_value(v: redis::Value) -> Result<Kept, redis::ParsingError> {
        // Lua's `true` arrives as 1, its `false` as nil.
        let (member, fingerprint, marked_at, unreadable, expires_at, pending): (
            _,
            _,
            _,
            _,
            _,
            Option<i64>,
        ) = redis::from_redis_value(v)?;
        let pending = pending.is_some();
        Ok(Kept { member, fingerprint, marked_at, unreadable, expires_at, pending })
    }
}

impl Kept {
    /// The listed record, or [`StoreError::Corrupt`] naming its key.
    fn listed(&self) -> Result<UnknownEntry<SystemTime>, StoreError> {
        let stored =
            self.member.split_once(':').and_then(|(hex, _token)| unhex(hex)).ok_or_else(|| {
                StoreError::Corrupt(format!("the index member {:?}", self.member))
            })?;
        let unreadable = |why: &str| {
            let hex = hex(&stored);
            corrupt(&stored, format_args!("{why} (delete the Redis key idemcache:{{{hex}}})"))
        };
        if let Some(why) = &self.unreadable {
            return Err(unreadable(why));
        }
        let fingerprint = self.fingerprint.clone().ok_or_else(|| unreadable("no fingerprint"))?;
        let marked_at = self.marked_at.ok_or_else(|| unreadable("no mark time (settled)"))?;
        let expires_at = self.expires_at.ok_or_else(|| unreadable("no expiry"))?;
        Ok(UnknownEntry::new(
            Key::from_bytes(&stored).map_err(|e| unreadable(&e.to_string()))?,
            self::fingerprint(&fingerprint).map_err(|e| unreadable(&e.to_string()))?,
            from_micros(marked_at),
            from_micros(expires_at),
        ))
    }
}

impl RedisStore {
    /// Reads up to `n` members of the UNKNOWN index from rank `start`, keeps the live
    /// and the unreadable ones (oldest first) and removes the stale ones from the index.
    async fn index_window(&self, start: usize, n: usize) -> Result<IndexBatch, StoreError> {
        let empty = IndexBatch { members: 0, kept: Vec::new(), trimmed: 0 };
        if n == 0 {
            // `ZRANGE key s s-1` would read nothing, but `0 -1` reads everything.
            return Ok(empty);
        }
        let mut connection = self.connection.clone();
        let first = isize::try_from(start).unwrap_or(isize::MAX);
        let last = first.saturating_add(isize::try_from(n).unwrap_or(isize::MAX) - 1);
        let members: redis::Value =
            connection.zrange(UNKNOWN_INDEX, first, last).await.map_err(|e| self.failed(e))?;
        let members: Vec<String> = read_reply(members)?;
        if members.is_empty() {
            return Ok(empty);
        }
        let mut invocation = self.scripts.list_unknown.prepare_invoke();
        invocation.arg(self.lapse.unknown_ttl_micros());
        for member in &members {
            invocation.arg(member);
        }
        let kept: redis::Value =
            invocation.invoke_async(&mut connection).await.map_err(|e| self.failed(e))?;
        let kept: Vec<Kept> = read_reply(kept)?;
        let stale: Vec<&String> =
            members.iter().filter(|m| !kept.iter().any(|k| k.member == **m)).collect();
        // Counted as Redis removed them: a purge or listing running beside this one may
        // have trimmed some first.
        let trimmed: usize = match stale.is_empty() {
            true => 0,
            false => {
                let removed: redis::Value =
                    connection.zrem(UNKNOWN_INDEX, &stale).await.map_err(|e| self.failed(e))?;
                read_reply(removed)?
            }
        };
        Ok(IndexBatch { members: members.len(), trimmed, kept })
    }
}
