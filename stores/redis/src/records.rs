//! Records read for tools that inspect a store ([`Store::record`], [`Store::records`],
//! [`Store::remove_record`]): one script on the record's key to read (or read and
//! delete) it, and `SCAN` to find the keys a listing reads.
//!
//! Invariant: a record is judged by the core's [`judge`] at the time the script read
//! from Redis, under the handle's lapse setting, and a removal deletes it in the same
//! script only if the script judged it (by the same rules) in a state it was asked to
//! delete: the look and the delete are one atomic step. A listing reads every record key
//! its filter's pattern matches (`SCAN`: on a cluster, on every primary), sorts them by
//! the stored key, and reads them one script each from `after` on until `limit` are
//! found: its cost is a walk of the whole keyspace for each page, whatever the filter
//! (a scope and a client key narrow the pattern, so fewer keys come back, not fewer
//! walked). A Redis key of the records' pattern that is not a record's (its name does
//! not decode to an idemcache key) fails the listing with [`StoreError::Corrupt`]
//! naming it, as a record that does not read does: never skipped silently.
//!
//! [`Store::record`]: idemcache::store::Store::record
//! [`Store::records`]: idemcache::store::Store::records
//! [`Store::remove_record`]: idemcache::store::Store::remove_record

use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::Value;

use idemcache::store::encoding::{hex, lapse_ttl_micros};
use idemcache::store::record::{judge, prefix_end, StoredRecord};
use idemcache::store::{Record, RecordFilter, RecordState, StoreError};
use idemcache::Key;

use crate::errors::{named, read_reply};
use crate::index::unhex;
use crate::schema::record_key;
use crate::scripts::number;
use crate::{Connection, RedisStore};

/// How many keys one `SCAN` step asks a node for.
const SCAN_COUNT: usize = 1000;

/// The record script's reply: `now, state, fp, token, body, started, settled, expires,
/// deleted`.
type RecordReply = (
    i64,
    i64,
    Option<Vec<u8>>,
    i64,
    Option<Vec<u8>>,
    Option<i64>,
    Option<i64>,
    i64,
    i64,
    Option<Vec<u8>>,
);

impl RedisStore {
    /// Runs the record script on `key`, deleting the record if its judged state is a bit
    /// of `mask` (0: a read), and judges what it read.
    pub(crate) async fn read_record(
        &self,
        key: &Key,
        mask: i32,
    ) -> Result<Option<Record>, StoreError> {
        let lapse = lapse_ttl_micros(self.lapse);
        let args = [number(lapse), number(mask)];
        let reply = self
            .run(&self.scripts.record, &record_key(key), &args)
            .await
            .map_err(|e| named(key, self.failed(e)))?;
        let reply: Option<RecordReply> = read_reply(reply).map_err(|e| named(key, e))?;
        let Some((now, state, fp, token, body, started, settled, expires, deleted, corr)) = reply
        else {
            return Ok(None);
        };
        // Bytes that are not text are not a correlation id: `judge` names the record.
        let correlation_id = corr.map(|c| String::from_utf8_lossy(&c).into_owned());
        let stored = StoredRecord {
            key: key.as_bytes().to_vec(),
            fingerprint: fp,
            state,
            token,
            body,
            started_at: started,
            settled_at: settled,
            expires_at: expires,
            correlation_id,
        };
        let record = judge(stored, now, lapse).map_err(|e| match e {
            // The script deleted it before this read it: say the garbled record is gone.
            StoreError::Corrupt(why) if deleted == 1 => {
                StoreError::Corrupt(format!("{why} (it was deleted)"))
            }
            other => other,
        })?;
        // A removal answers what it deleted; a read, or a removal in no state asked for,
        // what it found, and only a removal's caller is told "nothing deleted".
        Ok(match (mask, deleted) {
            (0, _) | (_, 1) => record,
            _ => None,
        })
    }

    /// Up to `limit` live records `filter` selects, in key order after `after`.
    pub(crate) async fn list_records(
        &self,
        filter: &RecordFilter,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let prefix = filter.key_prefix().unwrap_or_default();
        let suffix = filter.key_suffix().unwrap_or_default();
        let pattern = format!("idemcache:{{{}*{}}}", hex(&prefix), hex(&suffix));
        let mut keys = Vec::new();
        for name in self.scan(&pattern).await? {
            // A key's name is bytes: one that is not text is not a record's either.
            let bytes = std::str::from_utf8(&name)
                .ok()
                .and_then(|n| n.strip_prefix("idemcache:{"))
                .and_then(|n| n.strip_suffix('}'))
                .and_then(unhex)
                .ok_or_else(|| {
                    let name = String::from_utf8_lossy(&name);
                    StoreError::Corrupt(format!("the Redis key {name:?} is not a record's"))
                })?;
            keys.push(bytes);
        }
        keys.sort();
        keys.dedup();
        let after = after.map(|k| k.as_bytes().to_vec()).unwrap_or_default();
        let below = prefix_end(&prefix);
        let mut out = Vec::new();
        for bytes in keys {
            if bytes <= after || below.as_ref().is_some_and(|b| bytes >= *b) {
                continue;
            }
            let key = idemcache::store::encoding::key(&bytes)?;
            if !filter.matches_key(&key) {
                continue;
            }
            if let Some(record) = self.read_record(&key, 0).await? {
                if filter.matches(&record) {
                    out.push(record);
                    if out.len() == limit {
                        break;
                    }
                }
            }
        }
        Ok(out)
    }

    /// Every key `pattern` matches: one server's `SCAN`, or every primary's on a cluster.
    async fn scan(&self, pattern: &str) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut connection = self.connection.clone();
        let mut out = Vec::new();
        match &mut connection {
            Connection::Single(c) => {
                let mut cursor = 0u64;
                loop {
                    let step = scan_step(cursor, pattern);
                    let reply: Value = step.query_async(c).await.map_err(|e| self.failed(e))?;
                    cursor = scanned(reply, &mut out)?;
                    if cursor == 0 {
                        break;
                    }
                }
            }
            Connection::Cluster(c) => {
                let slots = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
                let any = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
                let slots = c.route_command(slots, any).await.map_err(|e| self.failed(e))?;
                for (host, port) in primaries(slots)? {
                    let mut cursor = 0u64;
                    loop {
                        let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port,
                        });
                        let step = scan_step(cursor, pattern);
                        let reply =
                            c.route_command(step, node).await.map_err(|e| self.failed(e))?;
                        cursor = scanned(reply, &mut out)?;
                        if cursor == 0 {
                            break;
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

/// One `SCAN` step from `cursor`.
fn scan_step(cursor: u64, pattern: &str) -> redis::Cmd {
    redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(SCAN_COUNT).to_owned()
}

/// A `SCAN` reply's keys, added to `out`; returns the next cursor (0: done).
fn scanned(reply: Value, out: &mut Vec<Vec<u8>>) -> Result<u64, StoreError> {
    // Names as bytes: Redis keys need not be UTF-8, and a name that is not fails the
    // listing as a key that is not a record's (`Corrupt`), not as a reply that does not
    // read (`Backend`, which says the server is at fault).
    let (cursor, keys): (String, Vec<Vec<u8>>) = redis::from_redis_value(reply)
        .map_err(|e| StoreError::Backend(format!("a SCAN reply does not read: {e}").into()))?;
    out.extend(keys);
    cursor
        .parse()
        .map_err(|_| StoreError::Backend(format!("a SCAN cursor is not a number: {cursor}").into()))
}

/// The primaries of a `CLUSTER SLOTS` reply (each slot range's first node), each once.
fn primaries(reply: Value) -> Result<Vec<(String, u16)>, StoreError> {
    let bad = |why: &str| StoreError::Backend(format!("a CLUSTER SLOTS reply {why}").into());
    let Value::Array(ranges) = reply else { return Err(bad("is not an array")) };
    let mut out = Vec::new();
    for range in ranges {
        let Value::Array(range) = range else {
            return Err(bad("holds a range that is not an array"));
        };
        let Some(Value::Array(primary)) = range.get(2) else {
            return Err(bad("holds a range without its primary"));
        };
        let host: String = primary
            .first()
            .cloned()
            .and_then(|v| redis::from_redis_value(v).ok())
            .ok_or_else(|| bad("names a primary without its host"))?;
        let port: u16 = primary
            .get(1)
            .cloned()
            .and_then(|v| redis::from_redis_value(v).ok())
            .ok_or_else(|| bad("names a primary without its port"))?;
        if !out.contains(&(host.clone(), port)) {
            out.push((host, port));
        }
    }
    Ok(out)
}

/// The mask of bits `1 << state` a removal in one of `states` sends.
pub(crate) fn removal_mask(states: &[RecordState]) -> i32 {
    states.iter().fold(0, |mask, s| mask | 1 << s.code())
}
