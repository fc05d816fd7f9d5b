//! Duplicates through the real broker into real databases: every payment published
//! twice (some ten times) is applied once, by one consumer or by two consumers sharing
//! one queue and one database, from RabbitMQ and from NATS JetStream; the balances in the database are the sum of the distinct
//! payments, and the inbox holds one record per payment.

mod support;

use std::collections::BTreeMap;

use support::{every_broker_and_ledger, unique, wait_until, Broker, Consumer, Ledger};

/// Twenty payments over four accounts: id `p{i}`, account `a{i % 4}`, amount `i + 1`.
const PAYMENTS: usize = 20;
/// The first few are published ten times, the rest twice.
const TEN_TIMES: usize = 4;

fn account(i: usize) -> String {
    format!("a{}", i % 4)
}

fn amount(i: usize) -> i64 {
    i as i64 + 1
}

/// The balances the distinct payments add up to.
fn expected_balances() -> BTreeMap<String, i64> {
    let mut balances = BTreeMap::new();
    for i in 0..PAYMENTS {
        *balances.entry(account(i)).or_insert(0) += amount(i);
    }
    balances
}

/// The publishing order: each payment twice in a row (two consumers with a prefetch
/// of 1 each take one copy, so a copy can arrive while the other's transaction is
/// open), then the first few eight times more, interleaved.
fn copies() -> Vec<usize> {
    let mut order = Vec::new();
    for i in 0..PAYMENTS {
        order.extend([i, i]);
    }
    for _ in 0..8 {
        order.extend(0..TEN_TIMES);
    }
    order
}

/// Publishes every copy, waits until the consumers have settled each one (`applied` or
/// `duplicate`), and checks the database and what the consumers said.
async fn publish_and_check(
    broker: &Broker,
    queue: &support::TestQueue,
    ledger: &Ledger,
    consumer: &str,
    consumers: &mut [Consumer],
) {
    let order = copies();
    for &i in &order {
        broker.pay(queue, &format!("p{i}"), &account(i), amount(i)).await;
    }
    let total = order.len();
    wait_until(consumers, &format!("{total} deliveries settled"), |cs| {
        cs.iter_mut().map(|c| c.ids("applied").len() + c.ids("duplicate").len()).sum::<usize>()
            >= total
    })
    .await;

    let mut applied: Vec<String> = consumers.iter_mut().flat_map(|c| c.ids("applied")).collect();
    applied.sort();
    let mut distinct: Vec<String> = (0..PAYMENTS).map(|i| format!("p{i}")).collect();
    distinct.sort();
    let transcripts: String = consumers.iter_mut().map(|c| c.transcript()).collect();
    assert_eq!(applied, distinct, "each payment applied exactly once\n{transcripts}");
    let duplicates: usize = consumers.iter_mut().map(|c| c.ids("duplicate").len()).sum();
    assert_eq!(duplicates, total - PAYMENTS, "every other copy a duplicate\n{transcripts}");
    assert!(
        consumers.iter_mut().all(|c| c.ids("mismatch").is_empty()),
        "no mismatch\n{transcripts}"
    );
    assert_eq!(ledger.balances().await, expected_balances(), "{}\n{transcripts}", ledger.engine());
    assert_eq!(ledger.inbox_rows(consumer).await, PAYMENTS as i64, "{}", ledger.engine());

    // Whatever is still in the queue once they are gone is a copy whose ack the kill
    // beat: a payment already applied, never one still to apply. (A JetStream stream
    // keeps its messages; the consumer's redeliveries were checked above.)
    for c in consumers.iter_mut() {
        c.kill();
    }
    if !matches!(broker, Broker::Amqp { .. }) {
        return;
    }
    for (id, _) in broker.drain(queue).await {
        assert!(
            id.as_ref().is_some_and(|id| applied.contains(id)),
            "left in the queue: {id:?}\n{transcripts}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_AMQP_URL or IDEMCACHE_NATS_URL"]
async fn every_payment_published_twice_or_ten_times_is_applied_once() {
    for (broker, ledger) in every_broker_and_ledger().await {
        let queue = broker.queue().await;
        let consumer = unique("ledger");
        let started = Consumer::start(
            &format!("consumer over {} via {}", ledger.engine(), broker.name()),
            &broker.env(&queue, &ledger, &consumer, &[]),
        )
        .await;
        publish_and_check(&broker, &queue, &ledger, &consumer, &mut [started]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_AMQP_URL or IDEMCACHE_NATS_URL"]
async fn two_consumers_on_one_queue_apply_each_payment_once_between_them() {
    for (broker, ledger) in every_broker_and_ledger().await {
        let queue = broker.queue().await;
        let consumer = unique("ledger");
        // A prefetch of 1 makes the broker alternate between them, and the delay keeps
        // one's transaction open while the other gets the second copy.
        let settings = [("PREFETCH", "1"), ("APPLY_DELAY_MS", "20")];
        let mut both = Vec::new();
        for name in ["first", "second"] {
            let label = format!("{name} consumer over {} via {}", ledger.engine(), broker.name());
            both.push(
                Consumer::start(&label, &broker.env(&queue, &ledger, &consumer, &settings)).await,
            );
        }
        publish_and_check(&broker, &queue, &ledger, &consumer, &mut both).await;
        let transcripts: String = both.iter_mut().map(|c| c.transcript()).collect();
        for c in &mut both {
            let settled = c.ids("applied").len() + c.ids("duplicate").len();
            assert!(settled > 0, "{} settled nothing: not spread\n{transcripts}", c.label);
        }
    }
}
