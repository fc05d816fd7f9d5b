//! `idemcache-relay`: relays one outbox to RabbitMQ or NATS JetStream until stopped.
//!
//! ```sh
//! DATABASE_URL=sqlite:/var/lib/orders.db idemcache-relay
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/orders AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f idemcache-relay
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/orders NATS_URL=nats://127.0.0.1:4222 idemcache-relay
//! ```
//!
//! The environment is `idemcache_relay::Config::from_env`'s; the output `run`'s: `relaying`
//! once connected, then a line per batch. Exit status 1, with `error: ...` on standard
//! error, when the configuration does not parse or the database or broker cannot be
//! reached at start (the database within 5 s).

use std::process::ExitCode;

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return fail(format!("starting the runtime: {e}")),
    };
    let started = idemcache_relay::Config::from_env().map(idemcache_relay::run);
    match started {
        Err(e) => fail(e.to_string()),
        Ok(relaying) => match runtime.block_on(relaying) {
            Ok(never) => match never {},
            Err(e) => fail(e.to_string()),
        },
    }
}

fn fail(why: String) -> ExitCode {
    eprintln!("error: {why}");
    ExitCode::FAILURE
}
