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
//! `resolve` and `forget` read a lapsed record as UNKNOWN too. So that `unknown` lists
//! a lapse nobody claims again, an acquiring claim under `MarkUnknown` puts its token's
//! member in the index before it answers (one more round trip per acquired claim): the
//! listing keeps the member of a live lease (not listed), lists a lapsed one as the
//! UNKNOWN it is, and purging trims it once the lease settled. A claim that cannot put
//! its member in answers the error and its caller does not execute; the record then
//! lapses, and a check finds nothing happened.

#![cfg_attr(docsrs, feature(doc_cfg))]
// Where links to this crate's items go from documentation built without it (another
// crate's `cargo doc --no-deps`); `.ci/package` checks the version.
#![doc(html_root_url = "https://docs.rs/idemcache-redis/0.1.0")]

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;

use idemcache::store::encoding::{at_server, check_lapse_policy, check_url};
use idemcache::store::StoreError;
use idemcache::LapsePolicy;

pub use redis;

mod errors;
mod index;
mod records;
mod replication;
mod schema;
mod scripts;
mod store;

pub use replication::NotReplicated;
pub use schema::INDEX_BUCKETS;

use scripts::Scripts;

/// How long the store's own connections wait for a reply (and, on a cluster, for a
/// command's retries): an operation Redis does not answer in it is [`StoreError::Backend`].
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

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
/// [`purge_expired`](idemcache::store::Store::purge_expired) trims it (listing with
/// [`list_unknown`](idemcache::store::Store::list_unknown) trims the stale members it reads
/// too). Run `purge_expired` periodically, as for every store: every minute, say,
/// calling it again while it returns its limit. Each call checks at most four times `limit` (at
/// most 4,000) members of the index and each bucket at most once, from where the last
/// call of this store stopped, wrapping at the last bucket, so its work is bounded
/// whatever the index holds; a call that trims less than `limit` may leave stale
/// members the next calls reach.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    scripts: std::sync::Arc<Scripts>,
    /// Where the next `purge_expired` looks in the UNKNOWN index: a bucket (an index
    /// into [`index_keys`](schema::index_keys)) and a rank in it.
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

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").field("server", &self.server).finish_non_exhaustive()
    }
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
        RedisStore {
            connection,
            scripts: std::sync::Arc::new(Scripts::new()),
            purge_from: std::sync::Arc::default(),
            server: None,
            lapse: LapsePolicy::TakeOver,
            wait: None,
        }
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
}
