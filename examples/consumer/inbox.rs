//! The README's consumer quickstart: a payment published twice to RabbitMQ is applied
//! once, through the inbox, over SQLite in memory.
//!
//! ```sh
//! cargo run -p idemcache-consumer --example inbox
//! ```
//!
//! It publishes payment `pay-1` twice (as a publisher retrying after a lost confirm
//! would) to a queue of its own (exclusive: deleted when it disconnects), consumes both
//! copies, prints `pay-1: New` then `pay-1: Duplicate` and the balance, and exits 0
//! when the balance counts the payment once; 1 otherwise, or when the broker cannot be
//! reached within 30 s. `AMQP_URL` names the broker (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`). The complete consumer (PostgreSQL too,
//! every failure handled, a queue of your own) is `consumer.rs` beside it.
//!
//! Invariant: a delivery is acknowledged only after its inbox record and its payment
//! committed together, or when the inbox holds its id committed already.

use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

use futures_util::StreamExt;
use idemcache::Fingerprint;
use idemcache_sqlite::inbox::{self, Receipt};
use idemcache_sqlite::rusqlite::{params, Connection, TransactionBehavior};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, ConnectionProperties};
use serde::Deserialize;

/// A message's body: `{"account": "a1", "amount": 5}`.
#[derive(Deserialize)]
struct Payment {
    account: String,
    amount: i64,
}

impl Payment {
    /// The fields that make the payment what it is, however the producer serialized it.
    fn fingerprint(&self) -> Fingerprint {
        Fingerprint::builder()
            .bytes(self.account.as_bytes())
            .bytes(&self.amount.to_be_bytes())
            .finish()
    }
}

// ANCHOR: handle
/// Applies the payment `id` once: its inbox record and the payment commit together.
fn apply(db: &mut Connection, id: &str, payment: &Payment) -> Result<Receipt, Box<dyn Error>> {
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let receipt = inbox::receive(&tx, "ledger", id, payment.fingerprint())?;
    if receipt == Receipt::New {
        let sql = "UPDATE accounts SET balance = balance + ?2 WHERE id = ?1";
        tx.execute(sql, params![payment.account, payment.amount])?;
        tx.commit()?;
    }
    Ok(receipt) // anything else: rolled back, nothing written
}

/// Settles a delivery with the broker: acknowledged only once its payment is committed.
async fn handle(db: &mut Connection, delivery: &Delivery) -> Result<(), Box<dyn Error>> {
    let id = delivery.properties.message_id().as_ref().ok_or("no message id")?.as_str();
    let payment: Payment = serde_json::from_slice(&delivery.data)?;
    let receipt = apply(db, id, &payment)?;
    println!("{id}: {receipt:?}"); // New (applied now), Duplicate, Mismatch or InFlight
    if receipt == Receipt::InFlight {
        // Another transaction holds it, uncommitted: back to the queue.
        delivery.nack(BasicNackOptions { requeue: true, ..Default::default() }).await?;
    } else {
        delivery.ack(BasicAckOptions::default()).await?; // committed, now or before
    }
    Ok(())
}
// ANCHOR_END: handle

async fn run() -> Result<(), Box<dyn Error>> {
    let url = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let broker = lapin::Connection::connect(&url, ConnectionProperties::default()).await?;
    let channel = broker.create_channel().await?;
    let exclusive = QueueDeclareOptions { exclusive: true, ..QueueDeclareOptions::default() };
    let queue = channel.queue_declare("".into(), exclusive, FieldTable::default()).await?;
    let queue = queue.name().as_str();

    for _ in 0..2 {
        let properties = BasicProperties::default().with_message_id("pay-1".into());
        let body = br#"{"account": "a1", "amount": 5}"#;
        channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                body,
                properties,
            )
            .await?;
    }

    let mut db = Connection::open_in_memory()?;
    db.execute_batch(
        "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL);
         INSERT INTO accounts VALUES ('a1', 0);",
    )?;
    inbox::ensure_schema(&db)?;
    let mut deliveries = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    for _ in 0..2 {
        let delivery = deliveries.next().await.ok_or("the broker cancelled the consumer")??;
        handle(&mut db, &delivery).await?;
    }
    let balance: i64 =
        db.query_row("SELECT balance FROM accounts WHERE id = 'a1'", [], |row| row.get(0))?;
    println!("balance of a1: {balance}");
    if balance != 5 {
        return Err("the payment of 5 was not applied exactly once".into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    match tokio::time::timeout(Duration::from_secs(30), run()).await {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("error: no answer from the broker within 30 s");
            ExitCode::FAILURE
        }
    }
}
