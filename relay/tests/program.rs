//! `idemcache-relay`, the program, as a user runs it: a configuration it cannot use is
//! exit 1 naming the variable; a database that accepts connections and never answers is
//! exit 1 within its timeout, not a hang; and over RabbitMQ (`IDEMCACHE_AMQP_URL`) every
//! committed row reaches its queue with its id as the AMQP `message_id`.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use idemcache_sql::outbox::OutboxMessage;
use idemcache_sqlite::outbox;
use idemcache_sqlite::rusqlite::{Connection, TransactionBehavior};
use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::ConnectionProperties;

const RELAY: &str = env!("CARGO_BIN_EXE_idemcache-relay");

fn amqp_url() -> Option<String> {
    idemcache::store::conformance::service_url(
        "IDEMCACHE_AMQP_URL",
        "amqp://guest:guest@127.0.0.1:5672/%2f",
    )
}

/// The relay with exactly `env`, run until it exits (a guard of 60 s fails the test
/// rather than hanging it): its status code, standard error, and how long it ran.
fn run_to_exit(env: &[(&str, &str)]) -> (Option<i32>, String, Duration) {
    let started = Instant::now();
    let mut child = Command::new(RELAY)
        .env_clear()
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the relay");
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
            return (status.code(), stderr, started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the relay did not exit within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_configuration_it_cannot_use_is_exit_1_naming_the_variable() {
    for (env, said) in [
        (&[][..], "DATABASE_URL is not set"),
        (&[("DATABASE_URL", "mysql://x")][..], "DATABASE_URL is neither"),
        (&[("DATABASE_URL", "sqlite:/tmp/x.db"), ("BATCH", "ten")][..], "BATCH=\"ten\""),
        (&[("DATABASE_URL", "sqlite:/tmp/x.db"), ("BATCH", "0")][..], "settings"),
        (&[("DATABASE_URL", "sqlite:/tmp/x.db"), ("POLL_MS", "0")][..], "settings"),
    ] {
        let (code, stderr, _) = run_to_exit(env);
        assert_eq!(code, Some(1), "{env:?}: {stderr}");
        assert!(stderr.starts_with("error: ") && stderr.contains(said), "{env:?}: {stderr}");
    }
}

#[test]
fn a_broker_it_cannot_reach_is_exit_1() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let amqp = format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
    let (code, stderr, _) =
        run_to_exit(&[("DATABASE_URL", "sqlite::memory:"), ("AMQP_URL", &amqp)]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("the broker"), "{stderr}");
}

/// A PostgreSQL address that accepts connections and never answers (a server stopped
/// dead, a black-holing proxy): the relay gives up after its 5 s and exits 1, naming
/// PostgreSQL. (Before, its pool had no timeout, and it hung at start for good.)
#[test]
#[ignore = "needs IDEMCACHE_AMQP_URL"]
fn a_database_that_never_answers_is_exit_1_not_a_hang() {
    let Some(amqp) = amqp_url() else { return };
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    // Accepted by the kernel's backlog, never read: the handshake never gets an answer.
    let database = format!("postgres://postgres@127.0.0.1:{port}/test");
    let (code, stderr, took) = run_to_exit(&[("DATABASE_URL", &database), ("AMQP_URL", &amqp)]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("PostgreSQL"), "{stderr}");
    assert!(took < Duration::from_secs(30), "{took:?}: {stderr}");
    drop(silent);
}

/// Rows committed to a SQLite outbox reach their RabbitMQ queue through the program,
/// each with its row's id as the `message_id`, and are marked delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs IDEMCACHE_AMQP_URL"]
async fn committed_rows_reach_their_queue_with_their_ids() {
    let Some(amqp) = amqp_url() else { return };
    let name = format!("idemcache-relay-program-{}", std::process::id());
    let connection =
        lapin::Connection::connect(&amqp, ConnectionProperties::default()).await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    let _ = channel.queue_delete(name.as_str().into(), QueueDeleteOptions::default()).await;
    channel
        .queue_declare(name.as_str().into(), QueueDeclareOptions::default(), FieldTable::default())
        .await
        .unwrap();
    let path = std::env::temp_dir().join(format!("{name}.db"));
    let _ = std::fs::remove_file(&path);
    let mut db = Connection::open(&path).unwrap();
    outbox::ensure_schema(&db).unwrap();
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate).unwrap();
    for i in 0..3 {
        outbox::enqueue(&tx, &OutboxMessage::new(format!("m{i}"), name.clone(), "{}")).unwrap();
    }
    tx.commit().unwrap();

    let mut relay = Command::new(RELAY)
        .env("DATABASE_URL", format!("sqlite:{}", path.display()))
        .env("AMQP_URL", &amqp)
        .env("POLL_MS", "20")
        .env_remove("NATS_URL")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let delivered = || -> i64 {
        db.query_row("SELECT COUNT(*) FROM idemcache_outbox WHERE state = 2", [], |r| r.get(0))
            .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while delivered() < 3 {
        assert!(Instant::now() < deadline, "the rows were not delivered within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = relay.kill();
    let _ = relay.wait();
    let mut ids = Vec::new();
    while let Some(got) =
        channel.basic_get(name.as_str().into(), BasicGetOptions { no_ack: true }).await.unwrap()
    {
        ids.push(got.delivery.properties.message_id().as_ref().unwrap().to_string());
    }
    assert_eq!(ids, ["m0", "m1", "m2"]);
    channel.queue_delete(name.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
    let _ = std::fs::remove_file(&path);
}
