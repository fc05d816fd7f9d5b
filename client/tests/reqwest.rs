//! `IdempotentRetry` over reqwest against a payments service behind the idempotency
//! layer, through a proxy that loses, cuts or delays answers: each fault the proxy
//! injects is retried with the call's one key and ends `Executed` with the service's
//! handler run once (the answer replayed); a server never reached is `NotSent`; a reused
//! key is `Refused` (422) and never retried; the in-progress answer (409 with
//! `Retry-After`) is waited out; an answer that stays 503 is `Unknown` once the attempts
//! are spent; a streamed body is sent once; other methods pass untouched. Beside it,
//! the peer a user would reach for, `reqwest-retry`, under the same faults: it retries
//! the `POST` without a key, and the charge runs twice.
//!
//! Needs no service: the payments service and the proxy run in the test.

mod common;

use std::time::Duration;

use common::{nowhere, Fault, Payments, Proxy};
use idemcache_client::{CallFailed, CallKey, CallOutcome, IdempotentRetry, RetryPolicy};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};

/// A client whose every request opens a connection of its own (so each takes the
/// proxy's next fault), giving up on an answer after 300 ms, retrying quickly.
fn client(attempts: u32) -> ClientWithMiddleware {
    let inner = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let policy = RetryPolicy::default()
        .with_first_delay(Duration::from_millis(5))
        .unwrap()
        .with_attempts(attempts)
        .unwrap();
    ClientBuilder::new(inner).with(IdempotentRetry::new(policy)).build()
}

async fn executed(outcome: CallOutcome) -> (bool, String) {
    match outcome {
        CallOutcome::Executed { response, replayed } => (replayed, response.text().await.unwrap()),
        other => panic!("expected Executed, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_lost_answer_is_retried_with_one_key_and_the_charge_runs_once() {
    let payments = Payments::default();
    let proxy = Proxy::to(payments.serve().await).await;
    let client = client(5);
    let faults =
        [Fault::DropResponse, Fault::ResetMidResponse, Fault::Delay(Duration::from_secs(2))];
    for (n, fault) in faults.into_iter().enumerate() {
        proxy.script([fault]);
        let before = (payments.runs(), proxy.connections());
        let sent =
            client.post(format!("http://{}/charges", proxy.addr)).body(format!("c{n}")).send();
        let (replayed, body) = executed(CallOutcome::of(sent.await).await).await;
        assert!(replayed, "{fault:?}: the retry got the first attempt's answer back");
        assert_eq!(body, format!("charge {}: c{n}", before.0 + 1), "{fault:?}");
        assert_eq!(payments.runs(), before.0 + 1, "{fault:?}: the handler ran once");
        assert_eq!(proxy.connections(), before.1 + 2, "{fault:?}: one retry");
    }
}

#[tokio::test]
async fn the_callers_key_goes_with_every_attempt() {
    let payments = Payments::default();
    let proxy = Proxy::to(payments.serve().await).await;
    let client = client(3);
    let key = CallKey::new("order-7-charge").unwrap();
    proxy.script([Fault::DropResponse]);
    let url = format!("http://{}/charges", proxy.addr);
    let first = client.post(&url).body("7").with_extension(key.clone()).send().await;
    assert!(executed(CallOutcome::of(first).await).await.0);
    // Another call under the same key (a retry of the whole execution, another
    // process): the same charge, replayed.
    let again = client.post(&url).body("7").header("idempotency-key", key.as_str()).send().await;
    let (replayed, body) = executed(CallOutcome::of(again).await).await;
    assert!(replayed);
    assert_eq!(body, "charge 1: 7");
    assert_eq!(payments.runs(), 1);
}

#[tokio::test]
async fn a_server_never_reached_is_not_sent_after_every_attempt() {
    let client = client(3);
    let sent = client.post(format!("http://{}/charges", nowhere())).body("x").send().await;
    let error = sent.as_ref().map(drop).unwrap_err();
    let failed = CallFailed::of(error).expect("a CallFailed");
    assert_eq!((failed.attempts, failed.sent), (3, false), "{failed}");
    let outcome = CallOutcome::of(sent).await;
    assert!(matches!(outcome, CallOutcome::NotSent { .. }), "{outcome:?}");
    assert_eq!(outcome.ran(), Some(false));
}

#[tokio::test]
async fn a_reused_key_is_refused_with_its_problem_and_never_retried() {
    let payments = Payments::default();
    let proxy = Proxy::to(payments.serve().await).await;
    let client = client(5);
    let url = format!("http://{}/charges", proxy.addr);
    let key = CallKey::new("order-8-charge").unwrap();
    let first = client.post(&url).body("8").with_extension(key.clone()).send().await;
    executed(CallOutcome::of(first).await).await;
    let connections = proxy.connections();
    let other = client.post(&url).body("another order").with_extension(key).send().await;
    match CallOutcome::of(other).await {
        CallOutcome::Refused { status, problem } => {
            assert_eq!(status, 422);
            let problem = String::from_utf8_lossy(&problem);
            assert!(problem.contains("\"status\":422"), "{problem}");
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    assert_eq!(proxy.connections(), connections + 1, "never retried");
    assert_eq!(payments.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_progress_answer_is_waited_out_and_replays_the_first() {
    let payments = Payments::default();
    let addr = payments.serve().await;
    let url = format!("http://{addr}/slow");
    let key = CallKey::new("order-9-charge").unwrap();
    let first = tokio::spawn({
        let (url, key) = (url.clone(), key.clone());
        // No timeout of its own: it waits for the handler.
        let plain = ClientBuilder::new(reqwest::Client::new()).with(IdempotentRetry::default());
        async move { plain.build().post(&url).body("9").with_extension(key).send().await }
    });
    while payments.runs() == 0 {
        tokio::task::yield_now().await;
    }
    // The duplicate gets 409 with Retry-After (1 s) and waits it out; the first is let
    // go meanwhile, so its retry replays the first's answer.
    let policy = RetryPolicy::default().with_attempts(4).unwrap();
    let duplicate =
        ClientBuilder::new(reqwest::Client::new()).with(IdempotentRetry::new(policy)).build();
    let second =
        tokio::spawn(
            async move { duplicate.post(&url).body("9").with_extension(key).send().await },
        );
    while payments.answered_in_progress() == 0 {
        tokio::task::yield_now().await;
    }
    payments.release();
    let (replayed, body) = executed(CallOutcome::of(second.await.unwrap()).await).await;
    assert_eq!(body, "slow: 9");
    let (first_replayed, first_body) = executed(CallOutcome::of(first.await.unwrap()).await).await;
    assert!(!first_replayed && replayed, "the first answered, the duplicate replayed it");
    assert_eq!(first_body, body);
    assert_eq!(payments.runs(), 1);
    assert_eq!(payments.answered_in_progress(), 1, "one 409, then the replay");
}

#[tokio::test]
async fn an_answer_that_stays_503_is_unknown_once_the_attempts_are_spent() {
    let payments = Payments::default();
    let addr = payments.serve().await;
    let sent = client(3).post(format!("http://{addr}/broken")).body("x").send().await;
    match CallOutcome::of(sent).await {
        CallOutcome::Unknown { status, error } => {
            assert_eq!(status, Some(reqwest::StatusCode::SERVICE_UNAVAILABLE));
            assert!(error.is_none());
        }
        other => panic!("expected Unknown, got {other:?}"),
    }
    assert_eq!(payments.runs(), 3, "every attempt reached the handler (503 is not kept)");
}

/// A key the server holds UNKNOWN (its handler could not tell whether the effect
/// happened) answers every retry 409 `outcome_unknown`: the call is `Unknown`, never
/// `Refused`, since it may have run.
#[tokio::test]
async fn a_key_the_server_holds_unknown_is_unknown_never_refused() {
    let payments = Payments::default();
    let addr = payments.serve().await;
    let sent = client(3).post(format!("http://{addr}/unknown")).body("x").send().await;
    match CallOutcome::of(sent).await {
        CallOutcome::Unknown { status, .. } => {
            assert_eq!(status, Some(reqwest::StatusCode::CONFLICT))
        }
        other => panic!("expected Unknown, got {other:?}"),
    }
}

#[tokio::test]
async fn a_get_passes_untouched_and_carries_no_key() {
    let payments = Payments::default();
    let proxy = Proxy::to(payments.serve().await).await;
    proxy.script([Fault::DropResponse]);
    let sent = client(5).get(format!("http://{}/charges", proxy.addr)).send().await;
    let outcome = CallOutcome::of(sent).await;
    assert_eq!(outcome.ran(), None, "a GET's lost answer is not retried: {outcome:?}");
    assert_eq!(proxy.connections(), 1);
}

#[tokio::test]
async fn a_key_header_no_key_can_be_is_refused_before_anything_is_sent() {
    let payments = Payments::default();
    let proxy = Proxy::to(payments.serve().await).await;
    let long = "k".repeat(300);
    let sent = client(3)
        .post(format!("http://{}/charges", proxy.addr))
        .header("idempotency-key", long)
        .send()
        .await;
    assert!(matches!(CallOutcome::of(sent).await, CallOutcome::NotSent { .. }));
    assert_eq!(proxy.connections(), 0);
}

#[tokio::test]
async fn a_streamed_body_is_sent_once_and_a_lost_answer_after_it_is_unknown() {
    let payments = Payments::default();
    let proxy = Proxy::to(payments.serve().await).await;
    proxy.script([Fault::DropResponse]);
    let chunks: Vec<Result<&'static str, std::io::Error>> = vec![Ok("stre"), Ok("amed")];
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let sent = client(5).post(format!("http://{}/charges", proxy.addr)).body(body).send().await;
    match CallOutcome::of(sent).await {
        CallOutcome::Unknown { status: None, error: Some(_) } => {}
        other => panic!("expected Unknown, got {other:?}"),
    }
    assert_eq!(proxy.connections(), 1, "a stream cannot be sent again");
    assert_eq!(payments.runs(), 1, "it reached the handler: that is why it is unknown");
}

/// The same lost answers through `reqwest-retry`'s `RetryTransientMiddleware`, as its
/// users set it up: it retries the `POST` as it was sent, with no key, so the service
/// cannot tell the retry from a new charge and runs it again. (What the two-service
/// fault run counts at scale.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reqwest_retry_without_a_key_charges_twice_under_the_same_faults() {
    use reqwest_retry::policies::ExponentialBackoff;
    use reqwest_retry::RetryTransientMiddleware;
    let payments = Payments::default();
    let proxy = Proxy::to(payments.serve().await).await;
    let inner = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let policy = ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(5), Duration::from_millis(50))
        .build_with_max_retries(4);
    let peer =
        ClientBuilder::new(inner).with(RetryTransientMiddleware::new_with_policy(policy)).build();
    let faults =
        [Fault::DropResponse, Fault::ResetMidResponse, Fault::Delay(Duration::from_secs(2))];
    for fault in faults {
        proxy.script([fault]);
        let before = payments.runs();
        let answer = peer.post(format!("http://{}/charges", proxy.addr)).body("c").send().await;
        assert_eq!(answer.unwrap().status(), 201, "{fault:?}: it answered as if once");
        assert_eq!(payments.runs(), before + 2, "{fault:?}: the charge ran twice");
    }
}
