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
//! Keys are `idemcache:{<hex of the stored key>}`: the braces are a hash tag, so a
//! record is one slot. **Every script touches exactly the one key it is given**
//! (`KEYS[1]`), so the store works on Redis Cluster ([`RedisStore::connect_cluster`]) as
//! on one server, with the same scripts. The index of UNKNOWN records is sharded in
//! [`INDEX_BUCKETS`] sorted sets `idemcache:unknown:{0}` to `{15}` (each its own slot;
//! a key's bucket is FNV-1a of its bytes modulo 16), scored by Redis's own time at the
//! mark. Why buckets, and not the record keys tagged by their bucket: tagging records by
//! bucket would put every record in one of 16 slots (a cluster could not spread them
//! over more than 16 nodes, and would carry them unevenly) and change the layout of
//! every record; buckets spread the index's writes (one per acquiring claim under
//! `MarkUnknown`) over the nodes, and only the index's layout changes. The cost is in
//! listing and purging, which read bucket by bucket and check each member's record by a
//! script of its own on that record's key (all of a window's checks sent at once), where
//! one script read them all before.
//!
//! The index's members name the record *and its token* (`<hex>:<token>`): a member is
//! live only while that record is UNKNOWN under that token, so resolving or forgetting
//! never has to touch the index, and a stale member (resolved, expired, or its mark
//! refused) can be trimmed by exact name without ever removing a newer mark. The member
//! goes in first: `mark_unknown` pipelines the member's script in front of the mark's on
//! one server (one round trip) and sends it, answered, before the mark on a cluster
//! (two slots, so two commands); either way a connection lost between the two leaves a
//! stale member (trimmed later), not an UNKNOWN record nobody lists. Listing and purging
//! are bounded: a listing reads at most `limit` listable members per bucket; a purge
//! checks at most four times its `limit` (at most 4,000) members.
//!
//! A server that lacks a script (restarted, `SCRIPT FLUSH`, a replica promoted by a
//! failover that never saw `SCRIPT LOAD`) answers `NOSCRIPT` to `EVALSHA`; the script did
//! not run, so it is sent again whole (`EVAL`), which runs it and loads it there.
//!
//! Replication: Redis acknowledges a write before any replica has it, so a failover can
//! lose an acknowledged claim (a duplicate after it is Acquired again) or completion (the
//! key reads PROCESSING, then lapses). [`RedisStore::wait_for_replicas`] sends `WAIT`
//! with claims and completions and refuses a claim fewer replicas acknowledged; the
//! business table's UNIQUE constraint is the guarantee.
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
//! `resolve` and `forget` read a lapsed record as UNKNOWN too. So that `list_unknown` lists
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
use redis::cluster_async::ClusterConnection;
use redis::{AsyncCommands, RedisResult, Script};

use idemcache::store::encoding::{
    at_server, check_duration, check_url, corrupt, fingerprint, from_micros, hex, micros,
};
use idemcache::store::encoding::{check_lapse_policy, lapse_ttl_micros};
use idemcache::store::{Store, StoreClaim, StoreError};
use idemcache::{FencingToken, Fingerprint, Key, LapsePolicy, Replay, UnknownEntry};

pub use redis;

/// `e`, naming `key` if it is [`StoreError::Corrupt`] (which then did not name it).
fn named(key: &Key, e: StoreError) -> StoreError {
    match e {
        StoreError::Corrupt(why) => corrupt(key.as_bytes(), why),
        other => other,
    }
}

/// How long the store's own connections wait for a reply (and, on a cluster, for a
/// command's retries): an operation Redis does not answer in it is [`StoreError::Backend`].
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

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
local function listed(token)
  if token == '' then return true end
  local rec = record()
  return rec ~= nil and rec.token == tonumber(token)
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

/// ARGV: TTL in µs, the unknown TTL of lapses in µs, the listed token (empty: any
/// record), then the body if there is one.
const RESOLVE: &str = r"
if not (unknown(ARGV[2]) and listed(ARGV[3])) then return false end
local ends = now + tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'state', 2, 'settled', fmt(now), 'expires', fmt(ends))
if #ARGV >= 4 then redis.call('HSET', KEYS[1], 'body', ARGV[4]) else redis.call('HDEL', KEYS[1], 'body') end
redis.call('PEXPIREAT', KEYS[1], fmt(math.ceil(ends / 1000)))
return {now, ends}
";

/// ARGV: the unknown TTL of lapses in µs, the listed token (empty: any record).
const FORGET: &str = r"
if not (unknown(ARGV[1]) and listed(ARGV[2])) then return false end
redis.call('DEL', KEYS[1])
return {now, now}
";

/// KEYS[1]: a record an index member names; ARGV: the unknown TTL of lapses in µs, the
/// member's token. Returns `false` for a stale member (the record is gone, or is not
/// UNKNOWN under that token), else `{fp, mark, why, expires, pending}`: a live UNKNOWN
/// under that token, or a lease of that token lapsed less than the TTL ago (the UNKNOWN
/// it is being turned into), with its fingerprint, mark time and expiry; a record that
/// does not read, with why; or a live lease of that token (a member put in for a lapse
/// a claim has not turned yet), pending. One record per call, so that on a cluster the
/// script touches only the slot of the key it is given.
const CHECK_MEMBER: &str = r"
local lapse = tonumber(ARGV[1])
local rec, bad = read(KEYS[1])
if bad then return {false, false, bad, false, false} end
if not rec or rec.token ~= tonumber(ARGV[2]) then return false end
if rec.state == 3 and rec.expires > now then
  local r = redis.call('HMGET', KEYS[1], 'fp', 'settled')
  return {r[1] or false, int(r[2]) or false, false, rec.expires, false}
elseif rec.state == 1 and rec.expires <= now and rec.expires + lapse > now then
  local fp = redis.call('HGET', KEYS[1], 'fp')
  return {fp or false, rec.expires, false, rec.expires + lapse, false}
elseif rec.state == 1 and rec.expires > now then
  return {false, false, false, false, 1}
end
return false
";

/// Idempotency records in Redis. See the module docs for the guarantees.
///
/// One type over one server ([`connect`](Self::connect),
/// [`from_connection`](Self::from_connection)) or a Redis Cluster
/// ([`connect_cluster`](Self::connect_cluster),
/// [`from_cluster_connection`](Self::from_cluster_connection)).
///
/// Redis expires records by itself, but not the index of UNKNOWN records: each
/// `mark_unknown` adds one member (the key in hex and the token, under 2.2 KiB) that
/// stays after its record is resolved, forgotten or expired, until
/// [`purge_expired`](Store::purge_expired) trims it (listing with
/// [`list_unknown`](Store::list_unknown) trims the stale members it reads too). Run
/// `purge_expired` periodically, as for every store: every minute, say, calling it
/// again while it returns its limit. Each call checks at most four times `limit` (at
/// most 4,000) members of the index and each bucket at most once, from where the last
/// call of this store stopped, wrapping at the last bucket, so its work is bounded
/// whatever the index holds; a call that trims less than `limit` may leave stale
/// members the next calls reach.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    scripts: std::sync::Arc<Scripts>,
    /// Where the next `purge_expired` looks in the UNKNOWN index: a bucket (an index
    /// into [`index_keys`]) and a rank in it.
    purge_from: std::sync::Arc<std::sync::Mutex<(usize, usize)>>,
    /// `host:port` (or the cluster's nodes), as connection errors name the server, when
    /// the store connected.
    server: Option<std::sync::Arc<str>>,
    /// What a lapsed lease becomes, for this handle's scripts.
    lapse: LapsePolicy,
    /// `WAIT` after each acquiring claim and each completion: how many replicas must
    /// acknowledge the write, and for how long to wait ([`RedisStore::wait_for_replicas`]).
    wait: Option<(u32, Duration)>,
}

/// The connection a store talks through: one server's, or a cluster's (which routes
/// each script by its first key, and each pipeline by its first keyed command).
#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Connection {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

/// How many windows of the UNKNOWN index one `purge_expired` call checks at most (an
/// empty bucket is not a window: reading it costs one `ZRANGE` that finds nothing).
const PURGE_WINDOWS: usize = 4;

/// The largest window of the UNKNOWN index read at once.
const LONGEST_WINDOW: usize = 1000;

/// How many buckets the UNKNOWN index is sharded into (see the module docs). Part of
/// the key layout: a member put in a bucket by a version with another count would
/// still be listed (every bucket is read) only if its bucket is among these.
pub const INDEX_BUCKETS: usize = 16;

/// The Redis keys of the UNKNOWN index, in the order listing and purging read them: the
/// buckets `idemcache:unknown:{0}` to `{15}`.
fn index_keys() -> impl Iterator<Item = String> {
    (0..INDEX_BUCKETS).map(|n| format!("idemcache:unknown:{{{n}}}"))
}

/// The bucket of the UNKNOWN index `key`'s members go in: FNV-1a (32 bits) of the
/// stored key's bytes, modulo [`INDEX_BUCKETS`]. Spreads the index's writes (one per
/// acquiring claim under `MarkUnknown`) over buckets, and so over a cluster's nodes.
fn index_key(key: &Key) -> String {
    let hash = key
        .as_bytes()
        .iter()
        .fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193));
    format!("idemcache:unknown:{{{}}}", hash as usize % INDEX_BUCKETS)
}

/// One Lua script: its source (sent whole with `EVAL` to a server that lacks it) and
/// its SHA1 (sent with `EVALSHA`).
struct Lua {
    source: String,
    sha: String,
}

impl Lua {
    fn new(body: &str) -> Lua {
        let source = format!("{PRELUDE}{body}");
        let sha = Script::new(&source).get_hash().to_owned();
        Lua { source, sha }
    }

    /// `EVALSHA` of it (or `EVAL` of its source, `whole`) on `key` with `args`.
    fn cmd(&self, whole: bool, key: &str, args: &[Vec<u8>]) -> redis::Cmd {
        let mut cmd = match whole {
            true => redis::cmd("EVAL").arg(&self.source).to_owned(),
            false => redis::cmd("EVALSHA").arg(&self.sha).to_owned(),
        };
        cmd.arg(1).arg(key);
        for arg in args {
            cmd.arg(arg);
        }
        cmd
    }
}

/// Whether `e` (a command's error or a pipeline's) is Redis lacking a script: the
/// script did not run, so running it again (whole) is safe.
fn is_noscript(e: &redis::RedisError) -> bool {
    e.code() == Some("NOSCRIPT")
        || e.clone()
            .into_server_errors()
            .iter()
            .flat_map(|errors| errors.iter())
            .any(|(_, server)| server.code() == "NOSCRIPT")
}

struct Scripts {
    claim: Lua,
    complete: Lua,
    extend_lease: Lua,
    release: Lua,
    mark_unknown: Lua,
    resolve: Lua,
    forget: Lua,
    check_member: Lua,
}

impl Scripts {
    fn all(&self) -> [&Lua; 8] {
        [
            &self.claim,
            &self.complete,
            &self.extend_lease,
            &self.release,
            &self.mark_unknown,
            &self.resolve,
            &self.forget,
            &self.check_member,
        ]
    }
}

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
    s.len()
        .is_multiple_of(2)
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
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(1);
        let connection = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(|e| at_server(format!("Redis at {server}"), e))?;
        Ok(RedisStore { server: Some(server.into()), ..RedisStore::from_connection(connection) })
    }

    /// Connects to the Redis Cluster whose nodes include `urls` (`redis://host:port`
    /// each; one reachable node is enough, the client learns the others from it), and
    /// loads the store's scripts on every node. The connection follows the cluster's
    /// topology by itself (a failover, a resharding: `MOVED`), retrying a command a few
    /// times within its 5 s timeout; an operation the cluster cannot answer in that time
    /// (a primary down and its replica not promoted yet) is [`StoreError::Backend`].
    /// Every key one script touches is in one slot (see the crate docs). No URL, or one
    /// that does not read, is [`StoreError::InvalidInput`].
    pub async fn connect_cluster<S: AsRef<str>>(urls: &[S]) -> Result<RedisStore, StoreError> {
        if urls.is_empty() {
            return Err(StoreError::InvalidInput("a Redis Cluster needs at least one node".into()));
        }
        for url in urls {
            check_url(url.as_ref())?;
        }
        let nodes: Vec<&str> = urls.iter().map(AsRef::as_ref).collect();
        let client = redis::cluster::ClusterClient::builder(nodes)
            .connection_timeout(Duration::from_secs(5))
            .response_timeout(RESPONSE_TIMEOUT)
            .build()
            .map_err(|e| StoreError::InvalidInput(format!("not Redis Cluster URLs: {e}")))?;
        let server = format!(
            "Redis Cluster at {}",
            urls.iter()
                .map(|u| u.as_ref().rsplit_once('@').map_or(u.as_ref(), |(_, host)| host))
                .map(|u| u.split_once("://").map_or(u, |(_, host)| host))
                .collect::<Vec<_>>()
                .join(",")
        );
        let connection =
            client.get_async_connection().await.map_err(|e| at_server(server.clone(), e))?;
        let store = RedisStore {
            server: Some(server.into()),
            ..RedisStore::from_cluster_connection(connection)
        };
        store.load_scripts().await?;
        Ok(store)
    }

    /// A store over your own connection manager (with the timeouts, TLS and retries you
    /// chose); it is cloned per operation, as the manager is meant to be. The store does
    /// not know where the manager connects, so its errors are the driver's own, not
    /// named by the server as [`connect`](Self::connect)'s are.
    pub fn from_connection(connection: ConnectionManager) -> RedisStore {
        RedisStore::over(Connection::Single(connection))
    }

    /// A store over your own Redis Cluster connection (the redis crate's
    /// [`ClusterClient`](redis::cluster::ClusterClient), built with the nodes, timeouts,
    /// TLS and retries you chose); it is cloned per operation. Scripts are loaded on the
    /// node that lacks one when it first answers `NOSCRIPT` (call
    /// [`load_scripts`](Self::load_scripts) to load them everywhere first, as
    /// [`connect_cluster`](Self::connect_cluster) does). Errors are the driver's own.
    pub fn from_cluster_connection(connection: ClusterConnection) -> RedisStore {
        RedisStore::over(Connection::Cluster(connection))
    }

    fn over(connection: Connection) -> RedisStore {
        let scripts = Scripts {
            claim: Lua::new(CLAIM),
            complete: Lua::new(COMPLETE),
            extend_lease: Lua::new(EXTEND_LEASE),
            release: Lua::new(RELEASE),
            mark_unknown: Lua::new(MARK_UNKNOWN),
            resolve: Lua::new(RESOLVE),
            forget: Lua::new(FORGET),
            check_member: Lua::new(CHECK_MEMBER),
        };
        RedisStore {
            connection,
            scripts: std::sync::Arc::new(scripts),
            purge_from: std::sync::Arc::default(),
            server: None,
            lapse: LapsePolicy::TakeOver,
            wait: None,
        }
    }

    /// Loads the store's scripts (`SCRIPT LOAD`): on a cluster, on every node the
    /// client knows, primaries and replicas, so that a replica promoted later has them.
    /// Optional: a node that lacks a script (restarted, flushed, added later) answers
    /// `NOSCRIPT` and is sent the script whole, which runs it and loads it there.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        let mut connection = self.connection.clone();
        for lua in self.scripts.all() {
            let _: redis::Value = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(&lua.source)
                .query_async(&mut connection)
                .await
                .map_err(|e| self.failed(e))?;
        }
        Ok(())
    }

    /// What a lapsed lease becomes for this handle's claims, listings and purges:
    /// taken over ([`LapsePolicy::TakeOver`], the default), or UNKNOWN from the lease's
    /// end for the policy's `ttl` ([`LapsePolicy::MarkUnknown`]; see the crate docs, for what
    /// Redis lists, and [`LapsePolicy`] for what every store does and why handles sharing a
    /// server should agree: a `TakeOver` handle's leases expire from Redis at their end,
    /// and it takes over a lapse not yet turned). Clones made after share the setting.
    /// A `ttl` of zero or over [`MAX_DURATION`](idemcache::MAX_DURATION) under
    /// `MarkUnknown` is [`StoreError::InvalidInput`].
    pub fn with_lapse_policy(mut self, policy: LapsePolicy) -> Result<RedisStore, StoreError> {
        self.lapse = check_lapse_policy(policy)?;
        Ok(self)
    }

    /// This handle's lapse policy.
    pub fn lapse_policy(&self) -> LapsePolicy {
        self.lapse
    }

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

    /// Puts the UNKNOWN index's member of `key` under `token` in (its bucket, scored by
    /// Redis's time), as `mark_unknown` does; again is harmless.
    async fn index(
        &self,
        connection: &mut Connection,
        key: &Key,
        token: i64,
    ) -> Result<(), StoreError> {
        let member = format!("{}:{token}", hex(key.as_bytes()));
        let _: redis::Value = redis::cmd("EVAL")
            .arg(INDEX_MARK)
            .arg(1)
            .arg(index_key(key))
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
            Some(server) if unreachable && server.starts_with("Redis Cluster") => {
                at_server(server.to_string(), e)
            }
            Some(server) if unreachable => at_server(format!("Redis at {server}"), e),
            _ => backend(e),
        }
    }

    /// Runs `lua` on the record (or index) key `key`: by its SHA1, and whole if the
    /// server lacks it (a restart, `SCRIPT FLUSH`, a replica promoted by a failover
    /// that never saw `SCRIPT LOAD`), which also loads it there.
    async fn run(&self, lua: &Lua, key: &str, args: &[Vec<u8>]) -> RedisResult<redis::Value> {
        let mut connection = self.connection.clone();
        match lua.cmd(false, key, args).query_async(&mut connection).await {
            Err(e) if is_noscript(&e) => {
                lua.cmd(true, key, args).query_async(&mut connection).await
            }
            done => done,
        }
    }

    /// [`run`](Self::run), followed in one pipeline (so on the same connection, to the
    /// same node) by `WAIT` when the store waits for replicas: the script's reply and
    /// how many replicas acknowledged.
    async fn run_replicated(
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
    fn replicated(
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
}

fn number(n: impl ToString) -> Vec<u8> {
    n.to_string().into_bytes()
}

type ClaimReply = (i64, Option<Vec<u8>>, Option<i64>, Option<Vec<u8>>, Option<i64>, i64);

/// The listed record's token as the scripts compare it with the record's `token`
/// (empty: any record). A claim's token is `max(previous + 1, now in µs)`, so a key
/// forgotten and claimed again gets a later one unless Redis's clock stepped back to
/// the very microsecond of the listed claim.
fn listed_arg(entry: &UnknownEntry<SystemTime>) -> Vec<u8> {
    number(entry.token.get())
}

impl RedisStore {
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
            self.settle(&self.scripts.resolve, &key, args, StoreError::NotUnknown).await?;
        Ok(Replay::new(body, from_micros(at), from_micros(until)))
    }

    /// UNKNOWN → absent of `key`, of the `listed` record only if given.
    async fn forget_where(&self, key: Key, listed: Option<Vec<u8>>) -> Result<(), StoreError> {
        // The index's member for this mark is stale from now on (trimmed later).
        let args = vec![number(lapse_ttl_micros(self.lapse)), listed.unwrap_or_default()];
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
            let lapse = lapse_ttl_micros(self.lapse);
            // The token whose lapse this claim may turn UNKNOWN, once its member is in.
            let mut turn = 0;
            let mut acknowledged;
            let (state, fp, token, body, settled, expires) = loop {
                let args =
                    [fp_in.to_bytes().to_vec(), number(micros(lease)), number(lapse), number(turn)];
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
        self.resolve_where(listed.key.clone(), Some(listed_arg(listed)), body, ttl)
    }

    fn forget_listed(
        &self,
        listed: &UnknownEntry<SystemTime>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.forget_where(listed.key.clone(), Some(listed_arg(listed)))
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

/// What [`CHECK_MEMBER`] answered for a member to keep.
struct Checked(Option<Vec<u8>>, Option<i64>, Option<String>, Option<i64>, Option<i64>);

impl redis::FromRedisValue for Checked {
    fn from_redis_value(v: redis::Value) -> Result<Checked, redis::ParsingError> {
        // Lua's `true` arrives as 1, its `false` as nil.
        let (fingerprint, marked_at, unreadable, expires_at, pending) = redis::from_redis_value(v)?;
        Ok(Checked(fingerprint, marked_at, unreadable, expires_at, pending))
    }
}

impl Checked {
    fn kept(self, member: String) -> Kept {
        let Checked(fingerprint, marked_at, unreadable, expires_at, pending) = self;
        Kept { member, fingerprint, marked_at, unreadable, expires_at, pending: pending.is_some() }
    }
}

impl Kept {
    /// The listed record, or [`StoreError::Corrupt`] naming its key.
    fn listed(&self) -> Result<UnknownEntry<SystemTime>, StoreError> {
        let (stored, token) = self
            .member
            .split_once(':')
            .and_then(|(hex, token)| Some((unhex(hex)?, token.parse::<u64>().ok()?)))
            .ok_or_else(|| StoreError::Corrupt(format!("the index member {:?}", self.member)))?;
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
            FencingToken::new(token),
            from_micros(marked_at),
            from_micros(expires_at),
        ))
    }
}

impl RedisStore {
    /// Reads up to `n` members of the UNKNOWN index's bucket `index` from rank `start`,
    /// keeps the live and the unreadable ones (oldest first) and removes the stale ones
    /// from the bucket. Each member's record is checked by a script of its own on that
    /// record's key (its own slot on a cluster), all sent at once.
    async fn index_window(
        &self,
        index: &str,
        start: usize,
        n: usize,
    ) -> Result<IndexBatch, StoreError> {
        let empty = IndexBatch { members: 0, kept: Vec::new(), trimmed: 0 };
        if n == 0 {
            // `ZRANGE key s s-1` would read nothing, but `0 -1` reads everything.
            return Ok(empty);
        }
        let mut connection = self.connection.clone();
        let first = isize::try_from(start).unwrap_or(isize::MAX);
        let last = first.saturating_add(isize::try_from(n).unwrap_or(isize::MAX) - 1);
        let members: redis::Value =
            connection.zrange(index, first, last).await.map_err(|e| self.failed(e))?;
        let members: Vec<String> = read_reply(members)?;
        if members.is_empty() {
            return Ok(empty);
        }
        let lapse = number(lapse_ttl_micros(self.lapse));
        let checks = members.iter().map(|member| {
            let lapse = lapse.clone();
            async move {
                // A member that does not read as `<hex>:<token>` names no record: stale.
                let Some((hex, token)) = member.split_once(':').filter(|(hex, token)| {
                    !hex.is_empty()
                        && hex.bytes().all(|b| b.is_ascii_hexdigit())
                        && !token.is_empty()
                        && token.bytes().all(|b| b.is_ascii_digit())
                }) else {
                    return Ok(None);
                };
                let record = format!("idemcache:{{{hex}}}");
                let args = [lapse, token.as_bytes().to_vec()];
                let found = self
                    .run(&self.scripts.check_member, &record, &args)
                    .await
                    .map_err(|e| self.failed(e))?;
                let found: Option<Checked> = read_reply(found)?;
                Ok::<_, StoreError>(found.map(|c| c.kept(member.clone())))
            }
        });
        let kept: Vec<Kept> =
            futures_util::future::try_join_all(checks).await?.into_iter().flatten().collect();
        let stale: Vec<&String> =
            members.iter().filter(|m| !kept.iter().any(|k| k.member == **m)).collect();
        // Counted as Redis removed them: a purge or listing running beside this one may
        // have trimmed some first.
        let trimmed: usize = match stale.is_empty() {
            true => 0,
            false => {
                let removed: redis::Value =
                    connection.zrem(index, &stale).await.map_err(|e| self.failed(e))?;
                read_reply(removed)?
            }
        };
        Ok(IndexBatch { members: members.len(), trimmed, kept })
    }
}
