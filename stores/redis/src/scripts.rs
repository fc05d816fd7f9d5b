//! The Lua the store runs, and how it is sent.
//!
//! Invariant: every script touches exactly the one key it is given (`KEYS[1]`), reads
//! the time from Redis (`TIME`), and never returns a Lua `nil` inside a reply; a
//! settling script writes only a record still PROCESSING (or UNKNOWN) as its caller
//! says. A script is sent by its SHA1 and, if the server lacks it (`NOSCRIPT`: it did
//! not run), again whole, which runs it and loads it there.

use redis::{RedisResult, Script};

use idemcache::store::StoreError;

use crate::RedisStore;

/// The time on Redis's clock in µs; `fmt` for writing integers without exponents;
/// `int` for reading them (`nil` for anything else); `read(key)`: the record at `key`
/// but its body, state, token and expiry checked (`nil` if there is none, or `nil` and
/// why it does not read); `record()`: KEYS[1]'s, stopping the script with an
/// `IDEMCACHE_CORRUPT` error if it does not read; `owned(token)`: KEYS[1]'s record if
/// it is live PROCESSING under `token`; `unknown(lapse, token)`: KEYS[1]'s record if it
/// is a live UNKNOWN (or a lapse less than `lapse` ago) under `token` (empty: any
/// token); `settle(ends, body)`: writes KEYS[1] COMPLETED until `ends` with `body`
/// (none: `nil`).
///
/// Each `redis.call` costs the server about a microsecond beyond the command's own
/// work (the command's lookup, its timing, its arguments and reply crossing between
/// Lua and Redis), so no script reads a record twice or writes it with two `HSET`s:
/// BENCHMARKS.md has the per-command figures.
const PRELUDE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function fmt(x) return string.format('%.0f', x) end
local function int(s)
  if type(s) == 'string' and #s <= 18 and string.match(s, '^%-?%d+$') then return tonumber(s) end
end
local function read(key)
  local r = redis.pcall('HMGET', key, 'state', 'token', 'expires', 'fp', 'settled')
  if r.err then return nil, 'its Redis key holds another type' end
  if not (r[1] or r[2] or r[3]) and redis.call('EXISTS', key) == 0 then return nil end
  local state, token, expires = int(r[1]), int(r[2]), int(r[3])
  if state ~= 1 and state ~= 2 and state ~= 3 then return nil, 'its state is not 1, 2 or 3' end
  if not token then return nil, 'its token is not an integer' end
  if not expires then return nil, 'its expiry is not an integer' end
  return {state = state, token = token, expires = expires, fp = r[4], settled = r[5]}
end
local function record()
  local rec, bad = read(KEYS[1])
  if bad then error({err = 'IDEMCACHE_CORRUPT ' .. bad}) end
  return rec
end
local function owned(token)
  local rec = record()
  if rec ~= nil and rec.state == 1 and rec.token == tonumber(token) and rec.expires > now then
    return rec
  end
end
local function unknown(lapse, token)
  local rec = record()
  if rec == nil or (token ~= '' and rec.token ~= tonumber(token)) then return nil end
  if rec.state == 3 and rec.expires > now then return rec end
  if rec.state == 1 and rec.expires <= now and rec.expires + tonumber(lapse) > now then return rec end
end
local function settle(ends, body)
  if body then
    redis.call('HSET', KEYS[1], 'state', 2, 'settled', fmt(now), 'expires', fmt(ends), 'body', body)
  else
    redis.call('HSET', KEYS[1], 'state', 2, 'settled', fmt(now), 'expires', fmt(ends))
    redis.call('HDEL', KEYS[1], 'body')
  end
end
";

/// ARGV: fingerprint, lease in µs, the unknown TTL of lapses in µs (0: `TakeOver`), the
/// token whose lapse this call may turn UNKNOWN (0: none), the correlation id an
/// acquired record keeps in its field `corr` (empty: none). Replies `{state, fp, token,
/// body, settled, expires}`; state 0 is acquired (`settled` 1 when it took over a
/// PROCESSING record whose lease lapsed), 4 "lapsed under token, put its index
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
  return {3, rec.fp or false, rec.token, false, rec.expires, ends}
end
if rec and rec.expires > now then
  if rec.settled and not int(rec.settled) then error({err = 'IDEMCACHE_CORRUPT its settled time is not an integer'}) end
  local body = rec.state == 2 and redis.call('HGET', KEYS[1], 'body')
  return {rec.state, rec.fp or false, rec.token, body or false, int(rec.settled) or false, rec.expires}
end
local token = math.max((rec and rec.token or 0) + 1, now)
local ends = now + tonumber(ARGV[2])
-- A record left past its expiry goes first; a fresh key has none to delete.
if rec then redis.call('DEL', KEYS[1]) end
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], 'state', 1, 'fp', ARGV[1], 'token', fmt(token), 'started', fmt(now), 'expires', fmt(ends), 'corr', ARGV[5])
else
  redis.call('HSET', KEYS[1], 'state', 1, 'fp', ARGV[1], 'token', fmt(token), 'started', fmt(now), 'expires', fmt(ends))
end
-- Kept past the lease (the unknown TTL, or as long as the lease was held: one lease,
-- longer after renewals), so that a claim after a lapse finds the execution it takes over.
redis.call('PEXPIREAT', KEYS[1], fmt(math.ceil((ends + math.max(lapse, tonumber(ARGV[2]))) / 1000)))
-- The settled slot of an acquired reply: 1 when a lapsed execution was taken over.
return {0, false, token, false, (rec and rec.state == 1) and 1 or false, ends}
";

/// ARGV: token, TTL in µs, then the body if there is one.
const COMPLETE: &str = r"
if not owned(ARGV[1]) then return false end
local ends = now + tonumber(ARGV[2])
settle(ends, ARGV[3])
redis.call('PEXPIREAT', KEYS[1], fmt(math.ceil(ends / 1000)))
return {now, ends}
";

/// ARGV: token, lease in µs, the unknown TTL of lapses in µs (the key outlives the
/// lease by it, or by as long as the lease has been held if that is longer, as the SQL
/// stores' purge keeps a lapse).
const EXTEND_LEASE: &str = r"
if not owned(ARGV[1]) then return false end
local ends = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'expires', fmt(ends))
local started = int(redis.call('HGET', KEYS[1], 'started')) or now
redis.call('PEXPIREAT', KEYS[1], fmt(math.ceil((ends + math.max(tonumber(ARGV[3]), ends - started)) / 1000)))
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
pub(crate) const INDEX_MARK: &str = r"
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
if not unknown(ARGV[2], ARGV[3]) then return false end
local ends = now + tonumber(ARGV[1])
settle(ends, ARGV[4])
redis.call('PEXPIREAT', KEYS[1], fmt(math.ceil(ends / 1000)))
return {now, ends}
";

/// ARGV: the unknown TTL of lapses in µs, the listed token (empty: any record).
const FORGET: &str = r"
if not unknown(ARGV[1], ARGV[2]) then return false end
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
  return {rec.fp or false, int(rec.settled) or false, false, rec.expires, false}
elseif rec.state == 1 and rec.expires <= now and rec.expires + lapse > now then
  return {rec.fp or false, rec.expires, false, rec.expires + lapse, false}
elseif rec.state == 1 and rec.expires > now then
  return {false, false, false, false, 1}
end
return false
";

/// KEYS[1]: a record. ARGV: the unknown TTL of lapses in µs, then the states to delete
/// it in, as a mask of bits `1 << state` (empty or 0: only read it). Judges the record
/// as `idemcache::store::record::judge` does (1 PROCESSING, 2 COMPLETED, 3 UNKNOWN or a
/// lapse `MarkUnknown` reads so, 0 dead) and deletes it if its judged state is in the
/// mask. Returns `false` for no record, else `{now, state, fp, token, body, started,
/// settled, expires, deleted}` as stored (the caller judges it at that `now`, as this
/// script did); a record that does not read stops it with `IDEMCACHE_CORRUPT`.
const RECORD: &str = r"
local rec = record()
if not rec then return false end
local lapse = tonumber(ARGV[1])
local judged = 0
if rec.expires > now then judged = rec.state
elseif rec.state == 1 and rec.expires + lapse > now then judged = 3 end
local mask = tonumber(ARGV[2]) or 0
local deleted = 0
if judged ~= 0 and math.floor(mask / (2 ^ judged)) % 2 == 1 then deleted = 1 end
local r = redis.call('HMGET', KEYS[1], 'body', 'started', 'corr')
if r[2] and not int(r[2]) then error({err = 'IDEMCACHE_CORRUPT its start time is not an integer'}) end
if rec.settled and not int(rec.settled) then error({err = 'IDEMCACHE_CORRUPT its settled time is not an integer'}) end
if deleted == 1 then redis.call('DEL', KEYS[1]) end
return {now, rec.state, rec.fp or false, rec.token, r[1] or false, int(r[2]) or false, int(rec.settled) or false, rec.expires, deleted, r[3] or false}
";

/// One Lua script: its source (sent whole with `EVAL` to a server that lacks it) and
/// its SHA1 (sent with `EVALSHA`).
pub(crate) struct Lua {
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
    pub(crate) fn cmd(&self, whole: bool, key: &str, args: &[Vec<u8>]) -> redis::Cmd {
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
pub(crate) fn is_noscript(e: &redis::RedisError) -> bool {
    e.code() == Some("NOSCRIPT")
        || e.clone()
            .into_server_errors()
            .iter()
            .flat_map(|errors| errors.iter())
            .any(|(_, server)| server.code() == "NOSCRIPT")
}

pub(crate) struct Scripts {
    pub(crate) claim: Lua,
    pub(crate) complete: Lua,
    pub(crate) extend_lease: Lua,
    pub(crate) release: Lua,
    pub(crate) mark_unknown: Lua,
    pub(crate) resolve: Lua,
    pub(crate) forget: Lua,
    pub(crate) check_member: Lua,
    pub(crate) record: Lua,
}

impl Scripts {
    /// Every script of the store, each with its SHA1.
    pub(crate) fn new() -> Scripts {
        Scripts {
            claim: Lua::new(CLAIM),
            complete: Lua::new(COMPLETE),
            extend_lease: Lua::new(EXTEND_LEASE),
            release: Lua::new(RELEASE),
            mark_unknown: Lua::new(MARK_UNKNOWN),
            resolve: Lua::new(RESOLVE),
            forget: Lua::new(FORGET),
            check_member: Lua::new(CHECK_MEMBER),
            record: Lua::new(RECORD),
        }
    }

    fn all(&self) -> [&Lua; 9] {
        [
            &self.claim,
            &self.complete,
            &self.extend_lease,
            &self.release,
            &self.mark_unknown,
            &self.resolve,
            &self.forget,
            &self.check_member,
            &self.record,
        ]
    }
}

impl RedisStore {
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

    /// Runs `lua` on the record (or index) key `key`: by its SHA1, and whole if the
    /// server lacks it (a restart, `SCRIPT FLUSH`, a replica promoted by a failover
    /// that never saw `SCRIPT LOAD`), which also loads it there.
    pub(crate) async fn run(
        &self,
        lua: &Lua,
        key: &str,
        args: &[Vec<u8>],
    ) -> RedisResult<redis::Value> {
        let mut connection = self.connection.clone();
        match lua.cmd(false, key, args).query_async(&mut connection).await {
            Err(e) if is_noscript(&e) => {
                lua.cmd(true, key, args).query_async(&mut connection).await
            }
            done => done,
        }
    }
}

pub(crate) fn number(n: impl ToString) -> Vec<u8> {
    n.to_string().into_bytes()
}
