//! Real process kills: the consumer is killed with SIGKILL at each point of a payment's
//! handling, restarted, and the payment is applied exactly once, on SQLite and on
//! PostgreSQL, from RabbitMQ and from NATS JetStream.
//!
//! How each point is reached without guessing at timing:
//! - before the commit: `APPLY_DELAY_MS` holds the transaction open after the payment
//!   was written; the consumer says `applying ID` (stderr) once its transaction has
//!   claimed the message, and the kill follows that line;
//! - between the commit and the ack: `ACK_DELAY_MS` holds the ack back; the kill follows
//!   `applied ID`, printed after the commit;
//! - after the ack: with a prefetch of 1 the broker hands over the next message only
//!   once it has taken the previous one's ack, so `applying NEXT` proves that `ID`'s
//!   ack reached it (JetStream: the consumer handles the next delivery only once the
//!   server confirmed the ack).
//!
//! RabbitMQ redelivers a killed consumer's deliveries when its connection drops;
//! JetStream once the ack wait (1 s here) passed.

mod support;

use support::{every_broker_and_ledger, unique, Consumer, Ledger, Stream};

/// Far longer than any test waits: the kill always comes first.
const HOLD_MS: &str = "600000";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_AMQP_URL or IDEMCACHE_NATS_URL"]
async fn killed_before_the_commit_the_redelivery_is_applied_once() {
    for (broker, ledger) in every_broker_and_ledger().await {
        let queue = broker.queue().await;
        let consumer = unique("ledger");
        let hold = [("APPLY_DELAY_MS", HOLD_MS)];
        let label = format!("consumer over {} via {} (killed)", ledger.engine(), broker.name());
        let mut first =
            Consumer::start(&label, &broker.env(&queue, &ledger, &consumer, &hold)).await;
        broker.pay(&queue, "p1", "a1", 5).await;
        first.wait_for(Stream::Err, "applying p1").await;
        first.kill();
        assert_eq!(first.ids("applied"), Vec::<String>::new(), "{}", first.transcript());
        // Nothing of the payment was committed: no balance, no inbox record.
        assert!(ledger.balances().await.is_empty(), "{} via {}", ledger.engine(), broker.name());
        assert_eq!(
            ledger.inbox_rows(&consumer).await,
            0,
            "{} via {}",
            ledger.engine(),
            broker.name()
        );

        let label = format!("consumer over {} via {} (restarted)", ledger.engine(), broker.name());
        let mut second =
            Consumer::start(&label, &broker.env(&queue, &ledger, &consumer, &[])).await;
        second.wait_for(Stream::Out, "applied p1").await;
        // A copy published now is a duplicate of the committed redelivery.
        broker.pay(&queue, "p1", "a1", 5).await;
        second.wait_for(Stream::Out, "duplicate p1").await;
        let said = second.transcript();
        assert_eq!(second.ids("applied"), ["p1"], "{said}");
        assert_eq!(ledger.balances().await, [("a1".to_owned(), 5)].into(), "{said}");
        assert_eq!(ledger.inbox_rows(&consumer).await, 1, "{said}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_AMQP_URL or IDEMCACHE_NATS_URL"]
async fn killed_between_the_commit_and_the_ack_the_redelivery_is_a_duplicate() {
    for (broker, ledger) in every_broker_and_ledger().await {
        let queue = broker.queue().await;
        let consumer = unique("ledger");
        let hold = [("ACK_DELAY_MS", HOLD_MS)];
        let label = format!("consumer over {} via {} (killed)", ledger.engine(), broker.name());
        let mut first =
            Consumer::start(&label, &broker.env(&queue, &ledger, &consumer, &hold)).await;
        broker.pay(&queue, "p1", "a1", 5).await;
        first.wait_for(Stream::Out, "applied p1").await;
        first.kill();
        // Committed, never acknowledged.
        assert_eq!(
            ledger.balances().await,
            [("a1".to_owned(), 5)].into(),
            "{} via {}",
            ledger.engine(),
            broker.name()
        );
        assert_eq!(
            ledger.inbox_rows(&consumer).await,
            1,
            "{} via {}",
            ledger.engine(),
            broker.name()
        );

        let label = format!("consumer over {} via {} (restarted)", ledger.engine(), broker.name());
        let mut second =
            Consumer::start(&label, &broker.env(&queue, &ledger, &consumer, &[])).await;
        second.wait_for(Stream::Out, "duplicate p1").await;
        // A later payment goes through the same consumer: the redelivery settled first.
        broker.pay(&queue, "p2", "a1", 7).await;
        second.wait_for(Stream::Out, "applied p2").await;
        let said = second.transcript();
        assert_eq!(second.ids("applied"), ["p2"], "p1 was not applied again\n{said}");
        assert_eq!(ledger.balances().await, [("a1".to_owned(), 12)].into(), "{said}");
        assert_eq!(ledger.inbox_rows(&consumer).await, 2, "{said}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_AMQP_URL or IDEMCACHE_NATS_URL"]
async fn killed_after_the_ack_a_copy_published_later_is_a_duplicate() {
    for (broker, ledger) in every_broker_and_ledger().await {
        let queue = broker.queue().await;
        let consumer = unique("ledger");
        let one = [("PREFETCH", "1")];
        let label = format!("consumer over {} via {} (killed)", ledger.engine(), broker.name());
        let mut first =
            Consumer::start(&label, &broker.env(&queue, &ledger, &consumer, &one)).await;
        broker.pay(&queue, "p1", "a1", 5).await;
        broker.pay(&queue, "p2", "a2", 7).await;
        // With a prefetch of 1, p2 arrives only once the broker took p1's ack.
        first.wait_for(Stream::Err, "applying p2").await;
        first.wait_for(Stream::Out, "applied p2").await;
        first.kill();
        assert_eq!(first.ids("applied"), ["p1", "p2"], "{}", first.transcript());

        // The publisher sends p1 again (say, it never saw the confirm).
        broker.pay(&queue, "p1", "a1", 5).await;
        let label = format!("consumer over {} via {} (restarted)", ledger.engine(), broker.name());
        let mut second =
            Consumer::start(&label, &broker.env(&queue, &ledger, &consumer, &one)).await;
        second.wait_for(Stream::Out, "duplicate p1").await;
        let said = second.transcript();
        // p2 may come back too (the kill may have beaten its ack): a duplicate if so.
        assert_eq!(second.ids("applied"), Vec::<String>::new(), "{said}");
        assert_eq!(
            ledger.balances().await,
            [("a1".to_owned(), 5), ("a2".to_owned(), 7)].into(),
            "{said}"
        );
        assert_eq!(ledger.inbox_rows(&consumer).await, 2, "{said}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_AMQP_URL or IDEMCACHE_NATS_URL"]
async fn a_second_consumer_never_applies_what_the_first_holds_uncommitted() {
    for (broker, ledger) in every_broker_and_ledger().await {
        let queue = broker.queue().await;
        let consumer = unique("ledger");
        let holding = [("PREFETCH", "1"), ("APPLY_DELAY_MS", HOLD_MS)];
        let label =
            format!("holding consumer over {} via {} (killed)", ledger.engine(), broker.name());
        let mut first =
            Consumer::start(&label, &broker.env(&queue, &ledger, &consumer, &holding)).await;
        broker.pay(&queue, "p1", "a1", 5).await;
        first.wait_for(Stream::Err, "applying p1").await;

        // The first holds its one delivery, so the copy goes to the second.
        let label = format!("second consumer over {} via {}", ledger.engine(), broker.name());
        let one = [("PREFETCH", "1")];
        let mut second =
            Consumer::start(&label, &broker.env(&queue, &ledger, &consumer, &one)).await;
        broker.pay(&queue, "p1", "a1", 5).await;
        if matches!(ledger, Ledger::Postgres { .. }) {
            // PostgreSQL's inbox answers at once that another transaction holds it; SQLite's
            // second writer waits for the first's lock instead (its busy timeout).
            let line = "in flight p1: another consumer's transaction holds it; requeued";
            second.wait_for(Stream::Err, line).await;
        }
        first.kill();
        // The first's transaction rolled back; its delivery and the copy both reach the
        // second now: one applied, the other a duplicate.
        second.wait_for(Stream::Out, "applied p1").await;
        second.wait_for(Stream::Out, "duplicate p1").await;
        let said = format!("{}{}", first.transcript(), second.transcript());
        assert_eq!(first.ids("applied"), Vec::<String>::new(), "{said}");
        assert_eq!(second.ids("applied"), ["p1"], "{said}");
        assert_eq!(ledger.balances().await, [("a1".to_owned(), 5)].into(), "{said}");
        assert_eq!(ledger.inbox_rows(&consumer).await, 1, "{said}");
    }
}
