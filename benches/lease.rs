//! How short a lease can be: the time a lease renewal (`Store::extend_lease`) takes on
//! each store while the store is loaded with claims, measured from the moment the renewal
//! was due. A measurement, not a test: it prints what it saw and asserts nothing.
//!
//! A holder renews every third of its lease (the HTTP layer's beat), so a renewal has two
//! thirds of a lease to land before the key lapses; a crashed holder's keys are free again
//! at most one lease after its last renewal. The default lease (`Tiered::new`) is chosen
//! from this run's worst renewal: docs/durable-tiers.md, "How long a crash blocks a key".
//!
//! ```sh
//! cargo run --release -p idemcache-benches --bin lease -- \
//!     --seconds 60 --holders 64 --beat-ms 100 --load 16 \
//!     postgres://postgres@127.0.0.1:5432/test redis://127.0.0.1:6379/15 \
//!     mysql://root@127.0.0.1:3306/test sqlite:/tmp/lease.db
//! ```
//!
//! For each store URL, `--holders` executions each hold a claim and renew it every
//! `--beat-ms` (a fixed schedule: a slow renewal delays the holder's next ones, and those
//! are counted from when they were due too), while `--load` workers claim and complete
//! fresh keys as fast as the store answers, the traffic a renewal queues behind.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use idemcache::store::{AnyStore, Store, StoreClaim};
use idemcache::{Bytes, Fingerprint, Key};
use tokio::time::MissedTickBehavior;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A lease no run outlives, so a renewal measured is never one of a lapsed claim.
const HELD_LEASE: Duration = Duration::from_secs(600);
/// The load's results expire at once: the run purges them when it ends, so it leaves
/// nothing behind in a database that test suites share (a suite that purges in small
/// batches would otherwise spend minutes on this run's rows).
const TTL: Duration = Duration::from_millis(1);

struct Settings {
    seconds: u64,
    holders: usize,
    beat: Duration,
    load: usize,
    urls: Vec<String>,
}

fn settings() -> Result<Settings> {
    let mut s = Settings {
        seconds: 30,
        holders: 64,
        beat: Duration::from_millis(100),
        load: 16,
        urls: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--seconds" => s.seconds = value()?.parse()?,
            "--holders" => s.holders = value()?.parse()?,
            "--beat-ms" => s.beat = Duration::from_millis(value()?.parse()?),
            "--load" => s.load = value()?.parse()?,
            flag if flag.starts_with("--") => return Err(format!("unknown flag {flag}").into()),
            url => s.urls.push(url.to_owned()),
        }
    }
    if s.urls.is_empty() {
        return Err("name at least one store URL".into());
    }
    Ok(s)
}

fn histogram() -> Histogram<u64> {
    // Microseconds, up to ten minutes, 3 significant digits.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid bounds")
}

fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).max(1)
}

fn key(run: u64, kind: &str, n: u64) -> Result<Key> {
    Ok(Key::new("POST /orders", "lease-bench", format!("{run:x}-{kind}-{n}"))?)
}

/// One holder: claims its key, then renews it on a fixed schedule until `stop`.
async fn hold(
    store: AnyStore,
    key: Key,
    beat: Duration,
    stop: Arc<AtomicBool>,
) -> Result<Histogram<u64>> {
    let mut seen = histogram();
    let token = match store.claim(&key, Fingerprint::of(b"hold"), HELD_LEASE).await? {
        StoreClaim::Acquired { token, .. } => token,
        other => return Err(format!("a fresh key answered {other:?}").into()),
    };
    let mut ticks = tokio::time::interval(beat);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Burst);
    ticks.tick().await;
    while !stop.load(Ordering::Relaxed) {
        let due = ticks.tick().await;
        store.extend_lease(&key, token, HELD_LEASE).await?;
        seen.record(micros(due.elapsed()))?;
    }
    store.release(&key, token).await?;
    Ok(seen)
}

/// One load worker: claims and completes fresh keys until `stop`; counts them.
async fn load(
    store: AnyStore,
    run: u64,
    worker: usize,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> Result<()> {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let key = key(run, &format!("load{worker}"), n)?;
        if let StoreClaim::Acquired { token, .. } =
            store.claim(&key, Fingerprint::of(b"load"), HELD_LEASE).await?
        {
            store.complete(&key, token, Some(Bytes::from_static(b"ok")), TTL).await?;
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

async fn measure(url: &str, s: &Settings, run: u64) -> Result<()> {
    let store = idemcache_any::open(url).await?;
    store.ensure_schema().await?;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let holders: Vec<_> = (0..s.holders)
        .map(|h| {
            let key = key(run, "held", h as u64);
            let (store, stop) = (store.clone(), stop.clone());
            let beat = s.beat;
            tokio::spawn(async move { hold(store, key?, beat, stop).await })
        })
        .collect();
    let loaders: Vec<_> = (0..s.load)
        .map(|w| tokio::spawn(load(store.clone(), run, w, stop.clone(), done.clone())))
        .collect();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(s.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut renewals = histogram();
    for holder in holders {
        renewals.add(holder.await??)?;
    }
    for loader in loaders {
        loader.await??;
    }
    let claims = done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    while store.purge_expired(10_000).await? == 10_000 {}
    let ms = |v: u64| v as f64 / 1000.0;
    let worst = ms(renewals.max());
    println!(
        "{:<10} | {:>8} | {:>8.0} | {:>6.2} | {:>6.2} | {:>7.2} | {:>7.1}",
        url.split(':').next().unwrap_or(url),
        renewals.len(),
        claims,
        ms(renewals.value_at_quantile(0.5)),
        ms(renewals.value_at_quantile(0.99)),
        ms(renewals.value_at_quantile(0.999)),
        worst,
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let s = settings()?;
    let run = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    println!(
        "{} s per store, {} holders renewing every {} ms, {} load workers",
        s.seconds,
        s.holders,
        s.beat.as_millis(),
        s.load
    );
    println!("store      | renewals | claims/s | p50 ms | p99 ms | p99.9 ms | max ms");
    for url in &s.urls {
        measure(url, &s, run).await?;
    }
    println!();
    println!("lease | renewal every | renewal must land within | store writes per handler-second");
    for lease in [2u64, 5, 10, 30, 60] {
        println!(
            "{lease:>4} s | {:>11.2} s | {:>22.2} s | {:>6.2}",
            lease as f64 / 3.0,
            lease as f64 * 2.0 / 3.0,
            3.0 / lease as f64
        );
    }
    Ok(())
}
