//! Two instances of the gRPC example over one durable store: a call executed by one is
//! replayed by the other, its success and its deterministic failure alike, and the key
//! reused with another message is refused by the other. Over a SQLite file always;
//! over PostgreSQL too when `IDEMCACHE_POSTGRES_URL` is set.

mod common;

use common::{failed, order, refusal, replayed, unique, Server};
use tonic::Code;

/// The example's store URL for a SQLite file of its own, and the file, removed on drop.
struct SqliteFile(std::path::PathBuf);

impl SqliteFile {
    fn new() -> SqliteFile {
        SqliteFile(std::env::temp_dir().join(format!("{}.sqlite", unique("idemcache-grpc"))))
    }

    fn url(&self) -> String {
        format!("sqlite:{}", self.0.display())
    }
}

impl Drop for SqliteFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.0.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

/// What two instances over the store at `url` must show.
async fn two_instances_share_keys(url: &str) {
    let env = [("IDEMPOTENCY_STORE", url)];
    // One after the other: the first creates the schema the second finds.
    let mut a = Server::start(&env).await;
    let mut b = Server::start(&env).await;
    let (mut on_a, mut on_b) = (a.client().await, b.client().await);
    // Keys are per tenant, and the database may outlive this run: a fresh user each time.
    let user = unique("erin");

    let key = unique("shared");
    let created = on_a.create(order("desk", 1), Some(&key), Some(&user)).await.unwrap();
    assert!(!replayed(created.metadata()));
    let again = on_b.create(order("desk", 1), Some(&key), Some(&user)).await.unwrap();
    assert!(replayed(again.metadata()), "the other instance replays it");
    assert_eq!(created.get_ref(), again.get_ref());

    let zero = unique("zero");
    failed(on_b.create(order("desk", 0), Some(&zero), Some(&user)).await, Code::InvalidArgument);
    let replay = on_a.create(order("desk", 0), Some(&zero), Some(&user)).await;
    let replay = failed(replay, Code::InvalidArgument);
    assert!(replayed(replay.metadata()), "{replay:?}");

    let reused = on_b.create(order("chair", 1), Some(&key), Some(&user)).await;
    let reused = failed(reused, Code::FailedPrecondition);
    assert_eq!(refusal(&reused), Some("idempotency_key_reused"));

    a.settle().await;
    b.settle().await;
    assert_eq!((a.executions(&key), b.executions(&key)), (1, 0));
    assert_eq!((a.executions(&zero), b.executions(&zero)), (0, 1));
}

#[tokio::test(flavor = "multi_thread")]
async fn over_a_sqlite_file() {
    let file = SqliteFile::new();
    two_instances_share_keys(&file.url()).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn over_postgres() {
    let Ok(url) = std::env::var("IDEMCACHE_POSTGRES_URL") else {
        eprintln!("IDEMCACHE_POSTGRES_URL is not set: PostgreSQL not tested");
        return;
    };
    two_instances_share_keys(&url).await;
}
