//! A producer in the layer's one-commit mode: the claim, the order, the outbox message
//! and the record in the one `PooledTransaction` the layer lends a handler, killed with
//! `kill -9` at the two instants that matter (after its message was enqueued and before
//! the commit; after the commit), then a relay over the outbox. Every committed order's
//! message is published exactly once, and nothing of an uncommitted one ever is.
//! Against a real PostgreSQL (`IDEMCACHE_POSTGRES_URL`), in a schema of its own.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use idemcache::store::conformance::{self, postgres_url_in_schema, service_url};
use idemcache::store::{OpenClaim, StoreClaim, TransactionalStore};
use idemcache::{Fingerprint, Key};
use idemcache_postgres::outbox::{self, OutboxMessage, PublishError, Publisher, RelaySettings};
use idemcache_postgres::{PooledTransaction, PostgresStore};

const LEASE: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(5);
const KEPT: Duration = Duration::from_secs(600);

/// The child process: the schema it works in, the key it claims, and when it waits to
/// be killed (`enqueued`: before the commit; `committed`: after it).
const CHILD_SCHEMA: &str = "IDEMCACHE_OUTBOX_CHILD_SCHEMA";
const CHILD_KEY: &str = "IDEMCACHE_OUTBOX_CHILD_KEY";
const CHILD_INSTANT: &str = "IDEMCACHE_OUTBOX_CHILD_INSTANT";

fn key(k: &str) -> Key {
    Key::new("POST /orders", "producer", k).unwrap()
}

/// What a one-commit handler does with the transaction it was lent: the order and its
/// message, in that transaction.
async fn order_and_message(tx: &PooledTransaction, key: &Key) {
    tx.execute("INSERT INTO orders VALUES ($1)", &[&key.client_key()]).await.unwrap();
    let message = OutboxMessage::new(format!("order-{}", key.client_key()), "orders", "{}");
    outbox::enqueue(tx, &message).await.unwrap();
}

/// One first execution as the layer runs it: claim in a new transaction, the handler's
/// writes, then the record with the commit.
async fn produce(store: &PostgresStore, key: &Key) {
    let mut tx = TransactionalStore::begin(store).await.unwrap();
    let claimed =
        TransactionalStore::claim_in(store, &mut tx, key, Fingerprint::of(b"o"), LEASE, WAIT, None);
    let StoreClaim::Acquired { token, .. } = claimed.await.unwrap() else { panic!("not acquired") };
    order_and_message(&tx, key).await;
    let claim = OpenClaim::new(key.clone(), token, KEPT);
    TransactionalStore::complete_and_commit(store, tx, &claim, Some(b"201")).await.unwrap();
}

/// The kill test's child (a no-op run as a test of its own).
#[tokio::test]
async fn child_produces_and_waits_to_be_killed() {
    let (Ok(schema), Ok(k), Ok(instant)) =
        (std::env::var(CHILD_SCHEMA), std::env::var(CHILD_KEY), std::env::var(CHILD_INSTANT))
    else {
        return;
    };
    let url = std::env::var("IDEMCACHE_POSTGRES_URL").unwrap();
    let store = PostgresStore::connect(&postgres_url_in_schema(&url, &schema)).await.unwrap();
    let key = key(&k);
    if instant == "enqueued" {
        let mut tx = TransactionalStore::begin(&store).await.unwrap();
        let claimed = TransactionalStore::claim_in(
            &store,
            &mut tx,
            &key,
            Fingerprint::of(b"o"),
            LEASE,
            WAIT,
            None,
        );
        assert!(matches!(claimed.await.unwrap(), StoreClaim::Acquired { .. }));
        order_and_message(&tx, &key).await;
        conformance::wait_to_be_killed_at("enqueued");
    }
    produce(&store, &key).await;
    conformance::wait_to_be_killed_at("committed");
}

/// Runs the child for `key`, waits for its line, and kills it (SIGKILL: no destructor,
/// no rollback sent; the server sees the connection drop).
fn kill_child_at(url: &str, schema: &str, key: &str, instant: &str) {
    conformance::kill_child_at(
        "child_produces_and_waits_to_be_killed",
        &[
            (CHILD_SCHEMA, schema),
            (CHILD_KEY, key),
            (CHILD_INSTANT, instant),
            ("IDEMCACHE_POSTGRES_URL", url),
        ],
        instant,
    );
}

/// A broker that confirms everything and keeps the ids it was handed.
#[derive(Default)]
struct Recording(Mutex<Vec<String>>);

impl Publisher for Recording {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), PublishError> {
        self.0.lock().unwrap().push(message.id().to_owned());
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_POSTGRES_URL"]
async fn a_one_commit_producer_killed_at_any_instant_publishes_each_committed_order_once() {
    let Some(url) =
        service_url("IDEMCACHE_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
    else {
        return;
    };
    let schema = format!("idemcache_producer_{}", std::process::id());
    let admin = PostgresStore::connect(&url).await.unwrap();
    let admin = admin.pool().get().await.unwrap();
    let reset = format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}");
    admin.batch_execute(&reset).await.unwrap();
    let store = PostgresStore::connect(&postgres_url_in_schema(&url, &schema)).await.unwrap();
    idemcache::store::Store::ensure_schema(&store).await.unwrap();
    let client = store.pool().get().await.unwrap();
    outbox::ensure_schema(&**client).await.unwrap();
    client.batch_execute("CREATE TABLE orders (key TEXT PRIMARY KEY)").await.unwrap();

    // Killed before its commit: nothing of it is there, and the client's retry runs.
    kill_child_at(&url, &schema, "k-enqueued", "enqueued");
    let orders = "SELECT count(*) FROM orders";
    assert_eq!(client.query_one(orders, &[]).await.unwrap().get::<_, i64>(0), 0);
    assert!(outbox::inspect(&**client, "order-k-enqueued").await.unwrap().is_none());
    produce(&store, &key("k-enqueued")).await;
    // Killed after its commit: the order, its record and its message are there, and
    // the retry replays.
    kill_child_at(&url, &schema, "k-committed", "committed");
    let mut tx = TransactionalStore::begin(&store).await.unwrap();
    let committed = key("k-committed");
    let fp = Fingerprint::of(b"o");
    let again = TransactionalStore::claim_in(&store, &mut tx, &committed, fp, LEASE, WAIT, None);
    assert!(matches!(again.await.unwrap(), StoreClaim::Completed(_)));
    TransactionalStore::rollback(&store, tx).await.unwrap();
    assert_eq!(client.query_one(orders, &[]).await.unwrap().get::<_, i64>(0), 2);

    // The relay publishes each committed order's message, once.
    let broker = Recording::default();
    let storage = outbox::Storage::new(store.pool().clone());
    let mut now = SystemTime::now;
    let settings = RelaySettings::default();
    let report = outbox::relay_batch(&storage, &broker, &settings, &mut now).await.unwrap();
    assert_eq!(report.delivered, 2, "{report:?}");
    let again = outbox::relay_batch(&storage, &broker, &settings, &mut now).await.unwrap();
    assert_eq!(again.claimed, 0);
    let mut published = broker.0.lock().unwrap().clone();
    published.sort();
    assert_eq!(published, ["order-k-committed", "order-k-enqueued"]);
    drop(client);
    admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.unwrap();
}
