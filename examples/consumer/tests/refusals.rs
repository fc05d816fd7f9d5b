//! Messages the consumer must not apply: one without an id and bodies that are not
//! payments (rejected without requeue: they never come back), a reused id with another
//! body (a mismatch: acknowledged, never applied), and a payment that would overflow the
//! balance (rejected, the balance kept).
//!
//! "Never comes back" is checked without waiting for something not to happen: with a
//! prefetch of 1 the broker delivers the next message only once the previous one is
//! settled, and a requeued message goes back to the head of the queue, so had a refused
//! message been requeued it would be delivered again before the payment published after
//! it. Once that payment is applied, the refusal was said once and the queue, with the
//! consumer gone, holds nothing but (perhaps) that last payment.

mod support;

use support::{amqp_url, payment, unique, Broker, Consumer, Ledger, Stream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_AMQP_URL"]
async fn messages_without_an_id_or_a_payment_body_are_rejected_and_never_come_back() {
    let Some(amqp) = amqp_url() else { return };
    let broker = Broker::connect(&amqp).await;
    let ledger = Ledger::sqlite();
    let queue = broker.queue().await;
    let consumer = unique("ledger");
    let bad_bodies: [&[u8]; 6] = [
        b"not json",
        br#"{"account": "a1"}"#,
        br#"{"account": "a1", "amount": "5"}"#,
        br#"{"account": "a1", "amount": 1.5}"#,
        br#"{"account": "", "amount": 5}"#,
        b"",
    ];
    // Published before the consumer starts, in this order, then one good payment.
    broker.publish(&queue, None, payment("a1", 5).as_bytes()).await;
    broker.publish(&queue, Some(""), payment("a1", 5).as_bytes()).await;
    for (i, body) in bad_bodies.iter().enumerate() {
        broker.publish(&queue, Some(&format!("bad{i}")), body).await;
    }
    broker.pay(&queue, "good", "a1", 5).await;

    let one = [("PREFETCH", "1")];
    let mut c = Consumer::start("consumer", &broker.env(&queue, &ledger, &consumer, &one)).await;
    c.wait_for(Stream::Out, "applied good").await;
    c.kill();
    let said = c.transcript();
    // No id and an empty id alike.
    assert_eq!(c.count(Stream::Err, "rejected (no message id)"), 2, "{said}");
    for i in 0..bad_bodies.len() {
        let prefix = format!("rejected bad{i}: ");
        let times = c.seen.iter().filter(|(s, l)| *s == Stream::Err && l.starts_with(&prefix));
        assert_eq!(times.count(), 1, "bad{i} rejected once\n{said}");
    }
    assert_eq!(c.ids("applied"), ["good"], "{said}");
    assert_eq!(ledger.balances().await, [("a1".to_owned(), 5)].into(), "{said}");
    assert_eq!(ledger.inbox_rows(&consumer).await, 1, "nothing refused left a record\n{said}");
    let left: Vec<_> = broker.drain(&queue).await.into_iter().map(|(id, _)| id).collect();
    assert!(left.is_empty() || left == [Some("good".to_owned())], "left: {left:?}\n{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_AMQP_URL"]
async fn a_reused_id_with_another_body_is_a_mismatch_acknowledged_and_never_applied() {
    let Some(amqp) = amqp_url() else { return };
    let broker = Broker::connect(&amqp).await;
    for ledger in Ledger::every().await {
        let queue = broker.queue().await;
        let consumer = unique("ledger");
        broker.pay(&queue, "p1", "a1", 5).await;
        broker.pay(&queue, "p1", "a1", 500).await; // same id, another amount
        broker.pay(&queue, "p1", "a2", 5).await; // same id, another account
        broker.pay(&queue, "after", "a1", 1).await;
        let one = [("PREFETCH", "1")];
        let label = format!("consumer over {}", ledger.engine());
        let mut c = Consumer::start(&label, &broker.env(&queue, &ledger, &consumer, &one)).await;
        c.wait_for(Stream::Out, "applied after").await;
        c.kill();
        let said = c.transcript();
        assert_eq!(c.ids("applied"), ["p1", "after"], "{said}");
        assert_eq!(c.ids("mismatch"), ["p1", "p1"], "{said}");
        assert_eq!(ledger.balances().await, [("a1".to_owned(), 6)].into(), "{said}");
        // Acknowledged: with the prefetch of 1, `after` came only once both were settled,
        // and a mismatch requeued would have come back before it.
        let left: Vec<_> = broker.drain(&queue).await.into_iter().map(|(id, _)| id).collect();
        assert!(left.is_empty() || left == [Some("after".to_owned())], "left: {left:?}\n{said}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_AMQP_URL"]
async fn a_payment_that_would_overflow_the_balance_is_rejected_and_the_balance_kept() {
    let Some(amqp) = amqp_url() else { return };
    let broker = Broker::connect(&amqp).await;
    for ledger in Ledger::every().await {
        let queue = broker.queue().await;
        let consumer = unique("ledger");
        broker.pay(&queue, "big", "a1", i64::MAX).await;
        broker.pay(&queue, "over", "a1", 1).await;
        broker.pay(&queue, "under", "a1", -1).await;
        let one = [("PREFETCH", "1")];
        let label = format!("consumer over {}", ledger.engine());
        let mut c = Consumer::start(&label, &broker.env(&queue, &ledger, &consumer, &one)).await;
        c.wait_for(Stream::Out, "applied under").await;
        c.kill();
        let said = c.transcript();
        assert_eq!(c.ids("applied"), ["big", "under"], "{said}");
        let refused =
            c.seen.iter().filter(|(s, l)| *s == Stream::Err && l.starts_with("rejected over: "));
        assert_eq!(refused.count(), 1, "{said}");
        assert_eq!(ledger.balances().await, [("a1".to_owned(), i64::MAX - 1)].into(), "{said}");
        // The refused payment's inbox record rolled back with it.
        assert_eq!(ledger.inbox_rows(&consumer).await, 2, "{said}");
    }
}
