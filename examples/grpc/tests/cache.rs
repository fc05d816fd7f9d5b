//! The gRPC example over the cache alone, through a real tonic client: each status the
//! layer keeps is replayed without a second execution, a transient one is run again,
//! and each refusal is the gRPC status its table names.

mod common;

use common::{failed, order, refusal, replayed, unique, CreateOrder, Order, OrdersClient, Server};
use tonic::{Code, Response, Status};

/// `calls` calls of `message` with `key` as `user`, each on its own connection and
/// task, all started before any is awaited; their answers once all have answered.
async fn concurrently(
    server: &Server,
    calls: usize,
    message: CreateOrder,
    key: &str,
    user: &'static str,
) -> Vec<Result<Response<Order>, Status>> {
    let tasks: Vec<_> = (0..calls)
        .map(|_| {
            let (url, message, key) = (server.url.clone(), message.clone(), key.to_owned());
            tokio::spawn(async move {
                let mut client = OrdersClient::connect(url).await.expect("connect");
                client.create(message, Some(&key), Some(user)).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("the call's task"));
    }
    answers
}

/// Concurrent duplicates (the first still running) execute once: each other call gets
/// `ABORTED` with a pushback and, retried once the first answered, its replay.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_duplicates_execute_once() {
    let mut server = Server::start(&[("ORDER_DELAY_MS", "300")]).await;
    let key = unique("dup");
    // All of them joined: the executing call has answered once this returns, so a retry
    // of an aborted one finds the answer kept.
    let answers = concurrently(&server, 6, order("book", 2), &key, "ann").await;
    let mut orders = Vec::new();
    let mut aborted = 0;
    for answer in answers {
        match answer {
            Ok(response) => orders.push(response.into_inner()),
            Err(status) => {
                assert_eq!(status.code(), Code::Aborted, "{status:?}");
                assert_eq!(refusal(&status), Some("request_in_progress"));
                let pushback = status.metadata().get("grpc-retry-pushback-ms");
                assert!(pushback.is_some(), "ABORTED says when to retry: {status:?}");
                aborted += 1;
                let mut client = server.client().await;
                let retried = client.create(order("book", 2), Some(&key), Some("ann")).await;
                let retried = retried.expect("the retry gets the kept answer");
                assert!(replayed(retried.metadata()), "the retry is a replay");
                orders.push(retried.into_inner());
            }
        }
    }
    assert!(aborted > 0, "with no wait, a duplicate in progress is answered ABORTED");
    assert!(orders.windows(2).all(|w| w[0] == w[1]), "one order for all: {orders:?}");
    server.settle().await;
    assert_eq!(server.executions(&key), 1);
}

/// With `IDEMPOTENCY_WAIT_MS`, the duplicates wait for the first call and get its replay.
#[tokio::test(flavor = "multi_thread")]
async fn waiting_duplicates_get_the_replay() {
    let mut server =
        Server::start(&[("ORDER_DELAY_MS", "300"), ("IDEMPOTENCY_WAIT_MS", "20000")]).await;
    let key = unique("wait");
    let answers: Vec<_> = concurrently(&server, 4, order("lamp", 1), &key, "ann")
        .await
        .into_iter()
        .map(|a| a.expect("every duplicate gets the answer"))
        .collect();
    let replays = answers.iter().filter(|a| replayed(a.metadata())).count();
    assert_eq!(replays, answers.len() - 1, "all but the first are replays");
    assert!(answers.windows(2).all(|w| w[0].get_ref() == w[1].get_ref()));
    server.settle().await;
    assert_eq!(server.executions(&key), 1);
}

/// `UNAVAILABLE` is transient: the key is released, the retry runs and succeeds, and a
/// third call replays the success.
#[tokio::test(flavor = "multi_thread")]
async fn a_transient_status_is_run_again_then_kept() {
    let mut server = Server::start(&[]).await;
    let mut client = server.client().await;
    let key = unique("flaky");
    let first = client.create(order("flaky", 1), Some(&key), Some("bob")).await;
    let first = failed(first, Code::Unavailable);
    assert_eq!(refusal(&first), None, "the service's own status, not a refusal");
    let second = client.create(order("flaky", 1), Some(&key), Some("bob")).await.unwrap();
    assert!(!replayed(second.metadata()), "the retry executes");
    let third = client.create(order("flaky", 1), Some(&key), Some("bob")).await.unwrap();
    assert!(replayed(third.metadata()), "the success is kept");
    assert_eq!(second.get_ref(), third.get_ref());
    server.settle().await;
    assert_eq!(server.executions(&key), 2);
}

/// `INVALID_ARGUMENT` from the service is deterministic: kept, and replayed as such.
#[tokio::test(flavor = "multi_thread")]
async fn a_deterministic_failure_is_replayed() {
    let mut server = Server::start(&[]).await;
    let mut client = server.client().await;
    let key = unique("zero");
    let first = client.create(order("book", 0), Some(&key), Some("cat")).await;
    let first = failed(first, Code::InvalidArgument);
    assert!(!replayed(first.metadata()));
    let second = client.create(order("book", 0), Some(&key), Some("cat")).await;
    let second = failed(second, Code::InvalidArgument);
    assert!(replayed(second.metadata()), "the replay says so: {second:?}");
    assert_eq!(first.message(), second.message());
    server.settle().await;
    assert_eq!(server.executions(&key), 1);
}

/// The refusals: a reused key, no key, no tenant; none of them executes.
#[tokio::test(flavor = "multi_thread")]
async fn refusals_are_grpc_statuses() {
    let mut server = Server::start(&[]).await;
    let mut client = server.client().await;
    let key = unique("reused");
    client.create(order("book", 1), Some(&key), Some("dan")).await.unwrap();
    let reused = client.create(order("book", 2), Some(&key), Some("dan")).await;
    let reused = failed(reused, Code::FailedPrecondition);
    assert_eq!(refusal(&reused), Some("idempotency_key_reused"));

    let no_key =
        failed(client.create(order("book", 1), None, Some("dan")).await, Code::InvalidArgument);
    assert_eq!(refusal(&no_key), Some("missing_idempotency_key"));

    let anonymous = unique("anonymous");
    let no_user = client.create(order("book", 1), Some(&anonymous), None).await;
    failed(no_user, Code::Unauthenticated);

    server.settle().await;
    assert_eq!(server.executions(&key), 1);
    assert_eq!(server.executions(&anonymous), 0);
}
