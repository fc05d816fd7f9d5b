//! The index of UNKNOWN records: putting a member in, and reading it window by window
//! for listing and purging.
//!
//! Invariant: a member (`<hex>:<token>`) is live only while its record is UNKNOWN under
//! that token (or a lease of that token that lapsed, or may lapse, under
//! `MarkUnknown`); each member is judged by a script on its own record's key, and a
//! stale one is removed by its exact name, so a newer mark is never removed. A window
//! reads at most the members it is asked for.

use std::time::SystemTime;

use redis::AsyncCommands;

use idemcache::store::encoding::{corrupt, fingerprint, from_micros, hex, lapse_ttl_micros};
use idemcache::store::StoreError;
use idemcache::{FencingToken, Key, UnknownEntry};

use crate::errors::read_reply;
use crate::schema::index_key;
use crate::scripts::{number, INDEX_MARK};
use crate::{Connection, RedisStore};

/// How many windows of the UNKNOWN index one `purge_expired` call checks at most (an
/// empty bucket is not a window: reading it costs one `ZRANGE` that finds nothing).
pub(crate) const PURGE_WINDOWS: usize = 4;

/// The largest window of the UNKNOWN index read at once.
pub(crate) const LONGEST_WINDOW: usize = 1000;

/// The bytes a lowercase (or uppercase) hex string spells; `None` if it does not.
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    s.len()
        .is_multiple_of(2)
        .then(|| {
            (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
        })
        .flatten()
}

impl RedisStore {
    /// Puts the UNKNOWN index's member of `key` under `token` in (its bucket, scored by
    /// Redis's time), as `mark_unknown` does; again is harmless.
    pub(crate) async fn index(
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
}

/// A window of the UNKNOWN index, checked.
pub(crate) struct IndexBatch {
    /// How many members the window held.
    pub(crate) members: usize,
    /// The members to keep, in index order.
    pub(crate) kept: Vec<Kept>,
    /// How many stale members this call removed.
    pub(crate) trimmed: usize,
}

/// An index member to keep: its record is a live UNKNOWN (its fingerprint and mark time
/// as read, `None` where a field is missing), or does not read (`why`).
#[derive(Debug)]
pub(crate) struct Kept {
    member: String,
    fingerprint: Option<Vec<u8>>,
    marked_at: Option<i64>,
    unreadable: Option<String>,
    expires_at: Option<i64>,
    /// A live lease whose member went in for a lapse not turned yet: kept, not listed.
    pub(crate) pending: bool,
}

/// What [`CHECK_MEMBER`](crate::scripts::CHECK_MEMBER) answered for a member to keep.
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
    pub(crate) fn listed(&self) -> Result<UnknownEntry<SystemTime>, StoreError> {
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
    pub(crate) async fn index_window(
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
