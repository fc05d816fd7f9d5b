//! The consumer over NATS JetStream where RabbitMQ has no counterpart: refused messages
//! (no `Nats-Msg-Id`, a body that is not a payment) terminated and never redelivered,
//! the durable consumer it is handed, and a `CONSUMER` name the server refuses. Skipped
//! (with the reason on stderr) without `IDEMCACHE_NATS_URL`.
//!
//! "Never redelivered" is read from the server: once the payment published after the
//! refused messages is applied, the durable consumer must have nothing pending, nothing
//! awaiting an ack and nothing redelivered.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use support::{nats_url, payment, unique, Broker, Consumer, Ledger, Stream, DEADLINE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_NATS_URL"]
async fn refused_jetstream_messages_are_terminated_and_never_redelivered() {
    let Some(url) = nats_url() else { return };
    let broker = Broker::jetstream(&url).await;
    let ledger = Ledger::sqlite();
    let queue = broker.queue().await;
    let consumer = unique("ledger");
    broker.publish(&queue, None, payment("a1", 5).as_bytes()).await;
    broker.publish(&queue, Some("bad"), b"not json").await;
    broker.pay(&queue, "good", "a1", 5).await;
    let one = [("PREFETCH", "1")];
    let mut c = Consumer::start("consumer", &broker.env(&queue, &ledger, &consumer, &one)).await;
    c.wait_for(Stream::Out, "applied good").await;
    let said = c.transcript();
    assert_eq!(c.count(Stream::Err, "rejected (no message id)"), 1, "{said}");
    assert_eq!(c.ids("applied"), ["good"], "{said}");
    let context = jetstream::new(async_nats::connect(&url).await.unwrap());
    let stream = context.get_stream(&queue.name).await.unwrap();
    // The ack of `good` is confirmed (a double ack) before the line after it; poll the
    // server's view until it caught up with it, within the deadline.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut durable: jetstream::consumer::PullConsumer =
            stream.get_consumer(&consumer).await.unwrap();
        let info = durable.info().await.unwrap();
        let settled = (info.num_pending, info.num_ack_pending, info.num_redelivered);
        if settled == (0, 0, 0) {
            break;
        }
        assert!(Instant::now() < deadline, "not settled: {settled:?}\n{said}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.kill();
    assert_eq!(ledger.balances().await, [("a1".to_owned(), 5)].into(), "{said}");
}

/// Runs the consumer with `env` until it exits (within the deadline): its status code
/// and standard error.
fn run_to_exit(env: &[(&'static str, String)]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idemcache-consumer"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + DEADLINE;
    loop {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            return (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned());
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("still running after {DEADLINE:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// "Over JetStream it also names the durable pull consumer (explicit acks) they share,
/// so it may not hold `.`, `*`, `>` or white space there": such a name must end the
/// consumer at start, exit status 1 with one `error: ` line that names `CONSUMER`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_NATS_URL"]
async fn a_consumer_name_jetstream_refuses_ends_it_at_start_with_a_clear_error() {
    let Some(url) = nats_url() else { return };
    let broker = Broker::jetstream(&url).await;
    let ledger = Ledger::sqlite();
    let queue = broker.queue().await;
    for name in ["led.ger", "led*", "led>", "led ger", "led\tger", "led/ger"] {
        let env = broker.env(&queue, &ledger, name, &[]);
        let (code, err) = run_to_exit(&env);
        assert_eq!(code, Some(1), "{name:?}: {err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{name:?}: one line: {err}");
        assert!(
            lines[0].starts_with("error: ") && lines[0].contains("CONSUMER"),
            "{name:?}: {err}"
        );
    }
}

/// A stream named by `STREAM` that exists but does not hold `QUEUE`: the consumer must
/// not start (there is nothing it could consume); its error must say the stream does
/// not hold the subject.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_NATS_URL"]
async fn a_stream_that_does_not_hold_the_queue_ends_it_at_start_with_a_clear_error() {
    let Some(url) = nats_url() else { return };
    let broker = Broker::jetstream(&url).await;
    let ledger = Ledger::sqlite();
    let queue = broker.queue().await;
    let mut env = broker.env(&queue, &ledger, &unique("ledger"), &[]);
    let other = unique("idemcache-consumer-other");
    for (k, v) in env.iter_mut() {
        if *k == "QUEUE" {
            *v = other.clone();
        }
    }
    let (code, err) = run_to_exit(&env);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.starts_with("error: ") && err.contains(&other), "{err}");
}

/// The durable consumer outlives the process; started again with another `QUEUE` (a
/// subject the stream also holds) under the same `CONSUMER`, the consumer would go on
/// consuming the old subject while saying `consuming NEW as CONSUMER`. It must refuse to
/// start instead, naming both subjects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_NATS_URL"]
async fn a_durable_consumer_of_another_subject_is_not_taken_for_the_queue() {
    let Some(url) = nats_url() else { return };
    let broker = Broker::jetstream(&url).await;
    let ledger = Ledger::sqlite();
    let queue = broker.queue().await;
    let (old, new) = (format!("{}.old", queue.name), format!("{}.new", queue.name));
    let context = jetstream::new(async_nats::connect(&url).await.unwrap());
    let stream_name = format!("{}-two", queue.name);
    context
        .create_stream(jetstream::stream::Config {
            name: stream_name.clone(),
            subjects: vec![old.clone(), new.clone()],
            ..jetstream::stream::Config::default()
        })
        .await
        .unwrap();
    let consumer = unique("ledger");
    let env_for = |subject: &str| {
        let mut env = broker.env(&queue, &ledger, &consumer, &[]);
        for (k, v) in env.iter_mut() {
            match *k {
                "QUEUE" => *v = subject.to_owned(),
                "STREAM" => *v = stream_name.clone(),
                _ => {}
            }
        }
        env
    };
    drop(Consumer::start("on old", &env_for(&old)).await);
    let (code, err) = run_to_exit(&env_for(&new));
    let _ = context.delete_stream(&stream_name).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.starts_with("error: ") && err.contains(&old) && err.contains(&new), "{err}");
}
