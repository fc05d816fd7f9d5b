//! What Redis answers, as the store's answers: its errors and its replies.
//!
//! Invariant: a record the store cannot read (a script's `IDEMCACHE_CORRUPT`, a key
//! holding another type, a reply whose fields do not read) is [`StoreError::Corrupt`],
//! named by its key where the caller knows it; the wire failing or the server out of
//! reach is [`StoreError::Backend`], named by the server when the store connected
//! itself. Never a panic, whatever Redis holds or sends.

use idemcache::store::encoding::{at_server, corrupt};
use idemcache::store::StoreError;
use idemcache::Key;

use crate::RedisStore;

/// `e`, naming `key` if it is [`StoreError::Corrupt`] (which then did not name it).
pub(crate) fn named(key: &Key, e: StoreError) -> StoreError {
    match e {
        StoreError::Corrupt(why) => corrupt(key.as_bytes(), why),
        other => other,
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
pub(crate) fn read_reply<T: redis::FromRedisValue>(v: redis::Value) -> Result<T, StoreError> {
    redis::from_redis_value(v)
        .map_err(|e| StoreError::Corrupt(format!("a reply does not read as a record: {e}")))
}

impl RedisStore {
    /// A Redis error as a store error ([`backend`]); one of reaching the server names it.
    pub(crate) fn failed(&self, e: redis::RedisError) -> StoreError {
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
}
