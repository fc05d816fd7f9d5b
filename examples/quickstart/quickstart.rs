//! The idemcache tour: a first execution, a replayed duplicate, a concurrent duplicate
//! refused while the first is still running, a key reused for a different request, and
//! the counters at the end.
//!
//! Run it with `cargo run --release --example quickstart`.

use std::sync::mpsc;
use std::thread;

use idemcache::{Cache, Claim, Fingerprint, Key};

fn main() -> std::process::ExitCode {
    // An error is printed as a person reads it (its `Display`), not as a `Debug` dump.
    match tour() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn tour() -> Result<(), Box<dyn std::error::Error>> {
    let cache = Cache::builder().build()?;

    // A client sends "create order" with Idempotency-Key: order-7f3a.
    let key = Key::new("POST /v1/orders", "user:42", "order-7f3a")?;
    let request = Fingerprint::builder()
        .method("POST")
        .path("/v1/orders")
        .body(b"{\"sku\":\"A1\",\"qty\":2}")
        .finish();

    // 1. The first request claims the key and executes.
    match cache.claim(&key, request)? {
        Claim::Acquired(guard) => {
            let response = create_order();
            guard.complete(response)?;
            println!(
                "1. first request:      executed, stored {:?}",
                String::from_utf8_lossy(response)
            );
        }
        other => unreachable!("a fresh key is always acquired, got {other:?}"),
    }

    // 2. The client's retry (lost response, network blip) replays the stored result.
    match cache.claim(&key, request)? {
        Claim::Completed(replay) => {
            let body = replay.body.expect("small results are kept");
            println!(
                "2. retry:              replayed {:?}, not executed",
                String::from_utf8_lossy(&body)
            );
        }
        other => unreachable!("a completed key replays, got {other:?}"),
    }

    // 3. A concurrent duplicate: while one thread is still executing, another arrives.
    let payment = Key::new("POST /v1/payments", "user:42", "pay-91c2")?;
    let charge = Fingerprint::of(b"amount=1999&currency=eur");
    let (started, proceed) = (mpsc::channel(), mpsc::channel::<()>());
    let worker = {
        let (cache, payment) = (cache.clone(), payment.clone());
        thread::spawn(move || {
            let Claim::Acquired(guard) = cache.claim(&payment, charge).expect("cache has room")
            else {
                unreachable!("the worker claims first")
            };
            started.0.send(()).unwrap();
            proceed.1.recv().unwrap(); // still "executing" until main has tried its duplicate
            guard.complete(b"{\"payment\":\"pay_1\",\"status\":\"captured\"}").unwrap();
        })
    };
    started.1.recv()?;
    match cache.claim(&payment, charge)? {
        Claim::InProgress { .. } => {
            println!("3. concurrent retry:   refused, in progress (HTTP 409)")
        }
        other => unreachable!("the worker holds the key, got {other:?}"),
    }
    proceed.0.send(())?;
    worker.join().expect("worker thread");

    // 4. The same key reused for a different request is a mismatch, never a replay.
    let other_request = Fingerprint::builder()
        .method("POST")
        .path("/v1/orders")
        .body(b"{\"sku\":\"B2\",\"qty\":9}")
        .finish();
    match cache.claim(&key, other_request)? {
        Claim::Mismatch => println!("4. same key, new body: refused, mismatch (HTTP 422)"),
        other => unreachable!("a different fingerprint is a mismatch, got {other:?}"),
    }

    let stats = cache.stats();
    println!(
        "\nstats: acquired {}, replayed {}, in progress {}, mismatches {}, entries {}, bytes {}",
        stats.acquired,
        stats.replayed,
        stats.in_progress,
        stats.mismatches,
        stats.entries,
        stats.bytes
    );
    Ok(())
}

fn create_order() -> &'static [u8] {
    b"{\"order\":\"ord_1\",\"status\":\"created\"}"
}
