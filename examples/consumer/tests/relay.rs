//! Outbox → RabbitMQ → inbox, through the shipped relay (`idemcache-relay`, run here
//! as a task: its own tests run its binary) and the consumer's process: each payment
//! committed with its outbox row is applied once downstream, one whose transaction
//! rolled back never is, and rows published again (a relay that died after the
//! broker's confirm and before marking them delivered) are duplicates at the inbox.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use idemcache_sql::outbox::OutboxMessage;
use idemcache_sqlite::outbox;
use idemcache_sqlite::rusqlite::{Connection, TransactionBehavior};
use support::{amqp_url, payment, unique, wait_until, Broker, Consumer, Ledger};

const PAYMENTS: usize = 10;

/// The relay over the outbox at `outbox`, as its program runs it, stopped when dropped
/// (its task aborted at whatever await it is in, as a killed relay stops).
struct Relay(tokio::task::JoinHandle<()>);

impl Relay {
    fn start(amqp: &str, outbox: &Path) -> Relay {
        let (amqp, database) = (amqp.to_owned(), format!("sqlite:{}", outbox.display()));
        let config = idemcache_relay::Config::from_vars(|name| match name {
            "AMQP_URL" => Some(amqp.clone()),
            "DATABASE_URL" => Some(database.clone()),
            "POLL_MS" => Some("20".to_owned()),
            _ => None,
        })
        .unwrap();
        Relay(tokio::spawn(async move {
            let Err(e) = idemcache_relay::run(config).await;
            panic!("the relay did not start: {e}");
        }))
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.0.abort();
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
