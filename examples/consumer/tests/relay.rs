//! Outbox → RabbitMQ → inbox, through the real relay and consumer processes: each
//! payment committed with its outbox row is applied once downstream, one whose
//! transaction rolled back never is, and rows published again (a relay that died after
//! the broker's confirm and before marking them delivered) are duplicates at the inbox.
//! Outbox → NATS JetStream: rows published again within the stream's duplicate window
//! are dropped by the stream (their `Nats-Msg-Id`), and still marked delivered.

mod support;

/// The relay example, for its JetStream publisher.
#[allow(dead_code)]
#[path = "../relay.rs"]
mod relay_example;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use idemcache_sql::outbox::OutboxMessage;
use idemcache_sqlite::outbox;
use idemcache_sqlite::rusqlite::{Connection, TransactionBehavior};
use support::{amqp_url, payment, unique, wait_until, Broker, Consumer, Ledger};

const PAYMENTS: usize = 10;

/// The relay example's binary, built by cargo before the tests.
const RELAY: &str = env!("CARGO_BIN_EXE_idemcache-relay");

/// The relay as a process of its own over the outbox at `outbox`, killed when dropped.
struct Relay(Child);

impl Relay {
    fn start(amqp: &str, outbox: &Path) -> Relay {
        let child = Command::new(RELAY)
            .env("AMQP_URL", amqp)
            .env("DATABASE_URL", format!("sqlite:{}", outbox.display()))
            .env("POLL_MS", "20")
            .env_remove("BATCH")
            .env_remove("LEASE_MS")
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {RELAY}: {e}"));
        Relay(child)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Removes the outbox's file when the test ends, however it ends.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The outbox's rows by state code.
fn states(outbox: &Path) -> BTreeMap<i64, i64> {
    let db = Connection::open(outbox).unwrap();
    let mut statement =
        db.prepare("SELECT state, COUNT(*) FROM idemcache_outbox GROUP BY state").unwrap();
    let rows = statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?))).unwrap();
    rows.map(Result::unwrap).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_AMQP_URL"]
async fn committed_rows_are_applied_once_downstream_and_republished_ones_are_duplicates() {
    let Some(amqp) = amqp_url() else { return };
    let broker = Broker::connect(&amqp).await;
    let queue = broker.queue().await;
    let ledger = Ledger::sqlite();
    let outbox_path = std::env::temp_dir().join(format!("{}.db", unique("orders")));
    let _cleanup = RemoveOnDrop(outbox_path.clone());

    // The orders service's commits: each payment with its outbox row, and one whose
    // transaction rolls back.
    let mut db = Connection::open(&outbox_path).unwrap();
    outbox::ensure_schema(&db).unwrap();
    db.execute_batch("CREATE TABLE orders (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)").unwrap();
    let mut expected = BTreeMap::new();
    for i in 0..PAYMENTS {
        let (id, account, amount) = (format!("p{i}"), format!("a{}", i % 3), i as i64 + 1);
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
        tx.execute("INSERT INTO orders VALUES (?1, ?2)", (&id, amount)).unwrap();
        let message = OutboxMessage::new(id, queue.name.clone(), payment(&account, amount));
        outbox::enqueue(&tx, &message).unwrap();
        tx.commit().unwrap();
        *expected.entry(account).or_insert(0) += amount;
    }
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    let never = OutboxMessage::new("p-rolled-back", queue.name.clone(), payment("a0", 1000));
    outbox::enqueue(&tx, &never).unwrap();
    tx.rollback().unwrap();

    let name = unique("ledger");
    let mut consumers =
        [Consumer::start("consumer", &broker.env(&queue, &ledger, &name, &[])).await];
    let relay = Relay::start(&amqp, &outbox_path);
    wait_until(&mut consumers, "every payment applied", |c| c[0].ids("applied").len() >= PAYMENTS)
        .await;
    let delivered = |outbox: &Path| states(outbox).get(&2).copied().unwrap_or(0);
    wait_until(&mut consumers, "every row delivered", |_| {
        delivered(&outbox_path) == PAYMENTS as i64
    })
    .await;
    drop(relay);

    // A relay that died after the broker confirmed three rows and before it marked them:
    // they are due again, and published again.
    db.execute(
        "UPDATE idemcache_outbox SET state = 0, delivered_at = NULL, next_attempt_at = 0 \
         WHERE message_id IN ('p0', 'p1', 'p2')",
        [],
    )
    .unwrap();
    let _relay = Relay::start(&amqp, &outbox_path);
    wait_until(&mut consumers, "the three republished rows settled", |c| {
        c[0].ids("duplicate").len() >= 3
    })
    .await;
    wait_until(&mut consumers, "every row delivered again", |_| {
        delivered(&outbox_path) == PAYMENTS as i64
    })
    .await;

    let transcript = consumers[0].transcript();
    let mut applied = consumers[0].ids("applied");
    applied.sort();
    let mut all: Vec<String> = (0..PAYMENTS).map(|i| format!("p{i}")).collect();
    all.sort();
    assert_eq!(applied, all, "each committed payment applied once\n{transcript}");
    let mut duplicates = consumers[0].ids("duplicate");
    duplicates.sort();
    assert_eq!(duplicates, ["p0", "p1", "p2"], "{transcript}");
    assert_eq!(ledger.balances().await, expected, "{transcript}");
    assert_eq!(states(&outbox_path), BTreeMap::from([(2, PAYMENTS as i64)]));
}

/// Over JetStream the message id is the `Nats-Msg-Id`: rows published again within the
/// stream's duplicate window are acked as duplicates (the relay marks them delivered)
/// and the stream keeps one message per row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_NATS_URL"]
async fn to_jetstream_a_row_published_again_is_dropped_by_the_stream() {
    use async_nats::jetstream;
    use idemcache_sql::outbox::{relay_batch, RelaySettings};

    let Some(url) =
        idemcache::store::conformance::service_url("IDEMCACHE_NATS_URL", "nats://127.0.0.1:4222")
    else {
        return;
    };
    let client = async_nats::connect(&url).await.expect("connecting to NATS");
    let js = jetstream::new(client);
    let name = unique("idemcache-relay");
    let subject = format!("{name}.payments");
    let config = jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        duplicate_window: std::time::Duration::from_secs(120),
        ..Default::default()
    };
    let mut stream = js.create_stream(config).await.expect("creating the test's stream");

    let conn = Connection::open_in_memory().unwrap();
    outbox::ensure_schema(&conn).unwrap();
    let storage = outbox::Storage::new(conn);
    {
        let mut db = storage.connection();
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
        for i in 0..5 {
            let message = OutboxMessage::new(format!("p{i}"), subject.clone(), payment("a", i))
                .with_header("content-type", "application/json");
            outbox::enqueue(&tx, &message).unwrap();
        }
        tx.commit().unwrap();
    }
    let publisher = relay_example::JetStream { context: js.clone() };
    let settings = RelaySettings::default();
    let mut clock = std::time::SystemTime::now;
    let first = relay_batch(&storage, &publisher, &settings, &mut clock).await.unwrap();
    assert_eq!((first.claimed, first.delivered), (5, 5), "{first:?}");
    assert_eq!(stream.info().await.unwrap().state.messages, 5);

    // A relay that died after JetStream acked two rows and before it marked them.
    storage
        .connection()
        .execute(
            "UPDATE idemcache_outbox SET state = 0, delivered_at = NULL, next_attempt_at = 0 \
             WHERE message_id IN ('p0', 'p1')",
            [],
        )
        .unwrap();
    let again = relay_batch(&storage, &publisher, &settings, &mut clock).await.unwrap();
    assert_eq!((again.claimed, again.delivered), (2, 2), "{again:?}");
    assert_eq!(stream.info().await.unwrap().state.messages, 5, "the copies were dropped");
    let kept = stream.get_raw_message(1).await.expect("the first message");
    assert_eq!(kept.headers.get("Nats-Msg-Id").map(|v| v.as_str()), Some("p0"));
    assert_eq!(kept.headers.get("content-type").map(|v| v.as_str()), Some("application/json"));
    let rows: i64 = storage
        .connection()
        .query_row("SELECT COUNT(*) FROM idemcache_outbox WHERE state = 2", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 5);
    js.delete_stream(&name).await.expect("deleting the test's stream");
}
