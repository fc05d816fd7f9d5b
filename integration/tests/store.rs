//! The stores under `Tiered` (over SQLite: repeats answered from memory, instances
//! sharing a file, a store it cannot reach, a guard moved into a task; over a server
//! killed mid-request, through a relay cut in the middle). SQLite always; PostgreSQL and
//! Redis when their URL is in the environment (CI sets both). Each store's own suites
//! (the conformance suite, what is particular to its engine) are in its crate's tests/.
use std::time::Duration;

use idemcache::store::conformance::{self, fp, key, LEASE};
use idemcache::store::{Store, StoreClaim, StoreError, Tiered, TieredClaim};
use idemcache::Cache;
use idemcache_postgres::tokio_postgres;
use idemcache_redis::redis;
use idemcache_sqlite::SqliteStore;

/// A store on the SQLite file `url`.
async fn open(url: &str) -> SqliteStore {
    SqliteStore::connect(url).await.unwrap()
}

/// `IDEMCACHE_POSTGRES_URL`, or `None` after saying the test is skipped.
fn postgres_url() -> Option<String> {
    conformance::service_url("IDEMCACHE_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
}

/// `IDEMCACHE_REDIS_STORE_URL`, or `None` after saying the test is skipped.
fn redis_url() -> Option<String> {
    conformance::service_url("IDEMCACHE_REDIS_STORE_URL", "redis://127.0.0.1:6379/14")
}

async fn sqlite_memory() -> SqliteStore {
    let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
    store.ensure_schema().await.unwrap();
    store.ensure_schema().await.unwrap(); // idempotent
    store
}

#[tokio::test]
async fn tiered_answers_completed_repeats_from_memory_and_reads_through_otherwise() {
    let store = sqlite_memory().await;
    let tiered = Tiered::new(Cache::builder().build().unwrap(), store);
    let k = key("tiered");
    let guard = match tiered.claim(&k, fp("r")).await.unwrap() {
        TieredClaim::Acquired(guard) => guard,
        other => panic!("{other:?}"),
    };
    // A local duplicate is answered by the cache while the store holds the claim.
    assert!(matches!(tiered.claim(&k, fp("r")).await.unwrap(), TieredClaim::InProgress { .. }));
    let record = guard.complete(&b"receipt"[..]).await.unwrap();
    // The durable fact is there.
    assert!(matches!(
        tiered.store().claim(&k, fp("r"), LEASE).await.unwrap(),
        StoreClaim::Completed(_)
    ));
    // The repeat is answered from memory: the cache counts a replay.
    let before = tiered.cache().stats().replayed;
    match tiered.claim(&k, fp("r")).await.unwrap() {
        // The store's own record, times and all, not the cache's idea of them.
        TieredClaim::Completed(replay) => assert_eq!(replay, record),
        other => panic!("{other:?}"),
    }
    assert_eq!(tiered.cache().stats().replayed, before + 1);
    assert!(matches!(tiered.claim(&k, fp("other")).await.unwrap(), TieredClaim::Mismatch));
}

/// A correlated claim's id is in the store's record and, while it executes, in the hot
/// tier's entry (what `Cache::peek` shows an operator of the process).
#[tokio::test]
async fn tiered_keeps_the_correlation_id_in_the_record_and_the_hot_tiers_claim() {
    let store = sqlite_memory().await;
    let tiered = Tiered::new(Cache::builder().build().unwrap(), store);
    let k = key("tiered-correlated");
    let id = idemcache::CorrelationId::new("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
    let guard = match tiered.claim_correlated(&k, fp("r"), Some(&id)).await.unwrap() {
        TieredClaim::Acquired(guard) => guard,
        other => panic!("{other:?}"),
    };
    let local = tiered.cache().peek(&k).expect("the hot tier's claim");
    assert_eq!(local.correlation_id.as_ref(), Some(&id));
    guard.complete(&b"receipt"[..]).await.unwrap();
    let record = tiered.store().record(&k).await.unwrap().expect("the record");
    assert_eq!(record.correlation_id, Some(id));
}

#[tokio::test]
async fn tiered_instances_over_one_store_execute_once_and_a_new_one_reads_through() {
    let dir = std::env::temp_dir().join(format!("idemcache-tiered-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("records.db");
    let _ = std::fs::remove_file(&path);
    let url = format!("sqlite:{}", path.display());
    let open = || async { Tiered::new(Cache::builder().build().unwrap(), open(&url).await) };
    let (one, two) = (open().await, open().await);
    one.store().ensure_schema().await.unwrap();
    let k = key("across");
    let guard = match one.claim(&k, fp("r")).await.unwrap() {
        TieredClaim::Acquired(guard) => guard,
        other => panic!("{other:?}"),
    };
    assert!(matches!(two.claim(&k, fp("r")).await.unwrap(), TieredClaim::InProgress { .. }));
    guard.complete(&b"once"[..]).await.unwrap();
    for tiered in [&two, &open().await] {
        match tiered.claim(&k, fp("r")).await.unwrap() {
            TieredClaim::Completed(replay) => assert_eq!(replay.body.unwrap(), "once"),
            other => panic!("{other:?}"),
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn an_unreachable_store_is_a_typed_error_and_nothing_executes() {
    // A file in a directory that does not exist: the store cannot open it.
    let missing = std::env::temp_dir().join("idemcache-no-such-dir/x/records.db");
    let url = format!("sqlite:{}", missing.display());
    let opened = SqliteStore::connect(&url).await;
    assert!(
        matches!(&opened, Err(StoreError::Backend(e)) if e.to_string().contains("idemcache-no-such-dir")),
        "{opened:?}"
    );
    // A store without its schema fails every claim with a backend error, and the
    // cache in front lets the key go (the next claim asks the store again).
    let bare = SqliteStore::connect("sqlite::memory:").await.unwrap();
    let tiered = Tiered::new(Cache::builder().build().unwrap(), bare);
    let k = key("down");
    for _ in 0..2 {
        match tiered.claim(&k, fp("r")).await {
            Err(idemcache::store::TieredError::Store(StoreError::Backend(_))) => {}
            other => panic!("expected a backend error, got {other:?}"),
        }
    }
    assert_eq!(tiered.cache().stats().entries, 0);
}

/// PostgreSQL, when `IDEMCACHE_POSTGRES_URL` names a server (CI sets it).
mod postgres {
    use super::*;
    use idemcache_postgres::PostgresStore;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs IDEMCACHE_POSTGRES_URL"]
    async fn a_postgres_killed_mid_request_is_a_typed_error_and_nothing_runs_twice() {
        let Some(direct) = postgres_url() else { return };
        PostgresStore::connect(&direct).await.unwrap().ensure_schema().await.unwrap();
        let url: tokio_postgres::Config =
            std::env::var("IDEMCACHE_POSTGRES_URL").unwrap().parse().unwrap();
        let host = match &url.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(host) => host.clone(),
            other => panic!("a TCP host, got {other:?}"),
        };
        let port = url.get_ports().first().copied().unwrap_or(5432);
        let upstream =
            tokio::net::lookup_host((host.as_str(), port)).await.unwrap().next().unwrap();
        let relay = super::relay::Relay::start(upstream).await;
        let user = url.get_user().unwrap_or("postgres");
        let db = url.get_dbname().unwrap_or("test");
        let through = format!("postgres://{user}@{}/{db}", relay.addr);
        let store = PostgresStore::connect(&through).await.unwrap();
        killed_mid_request(store, &relay, "pg").await;
    }
}

/// Redis, when `IDEMCACHE_REDIS_STORE_URL` names a server (CI sets it): `Tiered` over
/// it with the server killed mid-request. The Redis store's own suites are in
/// stores/redis/tests/.
mod redis_store {
    use super::*;
    use idemcache_redis::RedisStore;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs IDEMCACHE_REDIS_STORE_URL"]
    async fn a_redis_killed_mid_request_is_a_typed_error_and_nothing_runs_twice() {
        let Some(url) = redis_url() else { return };
        let info: redis::ConnectionInfo =
            redis::IntoConnectionInfo::into_connection_info(url.as_str()).unwrap();
        let redis::ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
            panic!("a TCP address, got {:?}", info.addr());
        };
        let upstream =
            tokio::net::lookup_host((host.as_str(), port)).await.unwrap().next().unwrap();
        let relay = super::relay::Relay::start(upstream).await;
        let through = format!("redis://{}/{}", relay.addr, info.redis_settings().db());
        let store = RedisStore::connect(&through).await.unwrap();
        killed_mid_request(store, &relay, "redis").await;
    }
}

/// A guard owns what it needs, so the execution can run in a task of its own; its lease
/// is renewed in the store while it runs. Dropped unsettled, it lets the cache's claim go
/// whatever the cache's drop policy, and the store's record stays held.
#[tokio::test]
async fn a_tiered_guard_moves_into_a_task_renews_its_lease_and_drops_cleanly() {
    let cache = Cache::builder().drop_policy(idemcache::DropPolicy::MarkUnknown).build().unwrap();
    let tiered = Tiered::new(cache, sqlite_memory().await).with_lease(Duration::from_secs(5));
    let k = key("spawned");
    let TieredClaim::Acquired(mut guard) = tiered.claim(&k, fp("r")).await.unwrap() else {
        panic!("expected Acquired");
    };
    let first_end = guard.lease_ends_at();
    let renewed = tokio::spawn(async move {
        let ends = guard.extend_lease(LEASE).await.unwrap();
        (guard, ends)
    });
    let (guard, ends) = renewed.await.unwrap();
    assert!(ends > first_end + Duration::from_secs(20), "{ends:?} after {first_end:?}");
    match tiered.store().claim(&k, fp("r"), LEASE).await.unwrap() {
        StoreClaim::InProgress { lease_ends_at } => assert_eq!(lease_ends_at, ends),
        other => panic!("{other:?}"),
    }
    drop(guard);
    // Not UNKNOWN in memory (the drop released the cache's claim): the store still holds
    // the key, so a repeat is in progress, not re-run and not unknown.
    assert_eq!(tiered.cache().stats().entries, 0);
    assert!(matches!(tiered.claim(&k, fp("r")).await.unwrap(), TieredClaim::InProgress { .. }));
}

/// A TCP relay to a real server that a test can cut (every connection dropped, nobody
/// listening) and restore on the same port: the store killed mid-request, then back.
mod relay {
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};
    use tokio::task::JoinHandle;

    pub struct Relay {
        pub addr: SocketAddr,
        upstream: SocketAddr,
        tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    }

    impl Relay {
        pub async fn start(upstream: SocketAddr) -> Relay {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let relay =
                Relay { addr: listener.local_addr().unwrap(), upstream, tasks: Arc::default() };
            relay.serve(listener);
            relay
        }

        fn serve(&self, listener: tokio::net::TcpListener) {
            let (upstream, tasks) = (self.upstream, self.tasks.clone());
            let accept = tokio::spawn(async move {
                loop {
                    let Ok((mut client, _)) = listener.accept().await else { return };
                    let pipe = tokio::spawn(async move {
                        let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
                            return;
                        };
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    });
                    tasks.lock().unwrap().push(pipe);
                }
            });
            self.tasks.lock().unwrap().push(accept);
        }

        /// Drops every connection and stops listening.
        pub fn cut(&self) {
            for task in self.tasks.lock().unwrap().drain(..) {
                task.abort();
            }
        }

        /// Listens again on the same port.
        pub async fn restore(&self) {
            for _ in 0..100 {
                // The aborted listener's socket closes once its task is dropped.
                if let Ok(listener) = tokio::net::TcpListener::bind(self.addr).await {
                    self.serve(listener);
                    return;
                }
                tokio::task::yield_now().await;
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            panic!("could not listen on {} again", self.addr);
        }
    }
}

/// The store killed mid-request: a claim is taken, then the store goes away before the
/// completion. Every operation is then a typed backend error and nothing executes; when
/// the store is back, the key is still held (the lease has not lapsed): not executed again.
async fn killed_mid_request<S: Store>(store: S, relay: &relay::Relay, prefix: &str) {
    use idemcache::store::TieredError;
    let tiered = Tiered::new(Cache::builder().build().unwrap(), store);
    let k = key(&format!("{prefix}-killed"));
    let TieredClaim::Acquired(guard) = tiered.claim(&k, fp("r")).await.unwrap() else {
        panic!("expected Acquired");
    };
    relay.cut();
    let completed = guard.complete(&b"effect happened"[..]).await;
    assert!(matches!(completed, Err(TieredError::Store(StoreError::Backend(_)))), "{completed:?}");
    let said = completed.unwrap_err().to_string();
    assert!(said.contains(&relay.addr.to_string()), "names the server it lost: {said}");
    let again = tiered.claim(&k, fp("r")).await;
    assert!(matches!(again, Err(TieredError::Store(StoreError::Backend(_)))), "{again:?}");
    let other = tiered.claim(&key(&format!("{prefix}-during")), fp("r")).await;
    assert!(matches!(other, Err(TieredError::Store(StoreError::Backend(_)))), "{other:?}");
    relay.restore().await;
    let mut answer = tiered.claim(&k, fp("r")).await;
    for _ in 0..200 {
        // A pool or connection manager may hand out one dead connection first.
        if !matches!(answer, Err(TieredError::Store(StoreError::Backend(_)))) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        answer = tiered.claim(&k, fp("r")).await;
    }
    assert!(
        matches!(answer, Ok(TieredClaim::InProgress { .. })),
        "held until its lease lapses, never executed again: {answer:?}"
    );
}
