//! PostgreSQL at volume: `PostgresStore::purge_expired` beside a claim load over a big,
//! mostly expired table, and the table's and its indexes' size over compressed days of
//! churn. A measurement, not a test: it prints what it saw, and asserts nothing.
//!
//! Invariant: every run works in a schema of its own (`--schema`, default `pg_volume`),
//! selected through the connection's `search_path`, so the store's own table
//! (`idemcache_records`) and sequence are created there by its own `ensure_schema`, and
//! nothing outside that schema is read or written. `drop` removes the schema.
//!
//! ```sh
//! export IDEMCACHE_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test
//! B="cargo run --release -p idemcache-benches --bin pg_volume --"
//! $B load --records 10000000 --expired 0.9   # the store's table, 90% expired (default 100000)
//! $B purge --seconds 15 --rounds 3           # claims alone vs claims beside a purger, interleaved
//! $B churn --seconds 540 --rate 1000 --ttl 120 --sample 15
//! $B drop
//! $B load --schema pg_volume_hash --records 1000000 --partitions 16   # hash-partitioned by key
//! $B claims --schemas pg_volume,pg_volume_hash  # claim latency, plain vs partitioned, interleaved
//! ```
//!
//! Every flag may also come from the environment as `PG_VOLUME_<FLAG>` (`--records` is
//! `PG_VOLUME_RECORDS`); a flag wins over the environment.
//!
//! Claim latency is measured from the moment the claim was due (each worker issues at a
//! fixed rate), not from when it was sent: a stalled claim delays the worker's next ones,
//! and those wait on the stall too, so a stall is counted as often as it delays a claim
//! (no coordinated omission).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use idemcache::store::conformance::postgres_url_in_schema;
use idemcache::store::{Store, StoreClaim};
use idemcache::{Bytes, Fingerprint, Key};
use idemcache_postgres::tokio_postgres::{self, NoTls};
use idemcache_postgres::PostgresStore;
use tokio::time::MissedTickBehavior;

const SCOPE: &str = "POST /orders";
const TENANT: &str = "pg-volume";
/// Client keys are 32 hex characters, like a UUID without dashes: random, so the
/// primary key's inserts land all over the index, as real clients' keys do.
const CLIENT_KEY_LEN: usize = 32;
const LEASE: Duration = Duration::from_secs(30);
const BODY_LEN: usize = 128;
const DAY_US: i64 = 86_400_000_000;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// `--flag value` pairs, with `PG_VOLUME_FLAG` from the environment as the fallback.
struct Flags(HashMap<String, String>);

impl Flags {
    fn parse(args: &[String]) -> Result<Flags> {
        let mut map = HashMap::new();
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let name = flag.strip_prefix("--").ok_or_else(|| format!("not a flag: {flag}"))?;
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            map.insert(name.to_owned(), value.clone());
        }
        Ok(Flags(map))
    }

    fn get<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T>
    where
        T::Err: std::fmt::Display,
    {
        let env = format!("PG_VOLUME_{}", name.to_uppercase().replace('-', "_"));
        let raw = match self.0.get(name) {
            Some(v) => v.clone(),
            None => match std::env::var(&env) {
                Ok(v) => v,
                Err(_) => return Ok(default),
            },
        };
        raw.parse().map_err(|e| format!("--{name} {raw}: {e}").into())
    }
}

async fn connect(url: &str) -> Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("connection: {e}");
        }
    });
    Ok(client)
}

/// A random-looking 32-hex-digit client key, distinct for every `n` of one `seed`.
fn client_key(seed: u64, n: u64) -> String {
    fn mix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    format!("{:016x}{:016x}", mix(seed ^ n), mix(seed.rotate_left(17) ^ n))
}

fn seed() -> u64 {
    let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    t.as_nanos() as u64 ^ (u64::from(std::process::id()) << 32)
}

fn histogram() -> Histogram<u64> {
    // Microseconds, up to a minute, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")
}

fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).max(1)
}

/// `p50 / p99 / p99.9 / max` in milliseconds.
fn percentiles(h: &Histogram<u64>) -> String {
    let ms = |v: u64| v as f64 / 1000.0;
    format!(
        "{:.2} | {:.2} | {:.2} | {:.1}",
        ms(h.value_at_quantile(0.5)),
        ms(h.value_at_quantile(0.99)),
        ms(h.value_at_quantile(0.999)),
        ms(h.max())
    )
}

/// What a claim load saw.
struct LoadResult {
    /// Claim latency from when the claim was due.
    claim: Histogram<u64>,
    /// Completion latency (from when it was sent).
    complete: Histogram<u64>,
    errors: u64,
    unexpected: u64,
}

/// `workers` tasks issuing claim + complete of fresh random keys at `rate` per second in
/// total, for `run`; results kept for `ttl`.
async fn claim_load(
    store: &PostgresStore,
    rate: f64,
    workers: usize,
    run: Duration,
    ttl: Duration,
) -> LoadResult {
    let period = Duration::from_secs_f64(workers as f64 / rate);
    let end = Instant::now() + run;
    let mut tasks = Vec::new();
    for w in 0..workers {
        let store = store.clone();
        let seed = seed() ^ (w as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
        tasks.push(tokio::spawn(async move {
            let mut out =
                LoadResult { claim: histogram(), complete: histogram(), errors: 0, unexpected: 0 };
            // Workers start spread over one period, not all at once.
            tokio::time::sleep(period.mul_f64(w as f64 / workers as f64)).await;
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
            let body = Bytes::from(vec![b'x'; BODY_LEN]);
            let fp = Fingerprint::of(b"the request");
            for n in 0u64.. {
                let due = tick.tick().await.into_std();
                if due >= end {
                    break;
                }
                let Ok(key) = Key::new(SCOPE, TENANT, client_key(seed, n)) else {
                    out.errors += 1;
                    continue;
                };
                match store.claim(&key, fp, LEASE).await {
                    Ok(StoreClaim::Acquired { token, .. }) => {
                        let _ = out.claim.record(micros(due.elapsed()));
                        let sent = Instant::now();
                        match store.complete(&key, token, Some(body.clone()), ttl).await {
                            Ok(_) => {
                                let _ = out.complete.record(micros(sent.elapsed()));
                            }
                            Err(_) => out.errors += 1,
                        }
                    }
                    Ok(_) => out.unexpected += 1,
                    Err(_) => out.errors += 1,
                }
            }
            out
        }));
    }
    let mut total =
        LoadResult { claim: histogram(), complete: histogram(), errors: 0, unexpected: 0 };
    for task in tasks {
        if let Ok(part) = task.await {
            let _ = total.claim.add(&part.claim);
            let _ = total.complete.add(&part.complete);
            total.errors += part.errors;
            total.unexpected += part.unexpected;
        }
    }
    total
}

/// A purger running until `stop`: `purge_expired(batch)` in a loop, `pause` after a full
/// batch and `idle` after a short one (nothing left to purge right now).
struct Purger {
    stop: Arc<AtomicBool>,
    purged: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<(Histogram<u64>, u64)>,
}

impl Purger {
    fn start(store: PostgresStore, batch: usize, pause: Duration, idle: Duration) -> Purger {
        let stop = Arc::new(AtomicBool::new(false));
        let purged = Arc::new(AtomicU64::new(0));
        let (s, p) = (stop.clone(), purged.clone());
        let task = tokio::spawn(async move {
            let mut batches = histogram();
            let mut errors = 0;
            while !s.load(Ordering::Relaxed) {
                let started = Instant::now();
                match store.purge_expired(batch).await {
                    Ok(n) => {
                        let _ = batches.record(micros(started.elapsed()));
                        p.fetch_add(n as u64, Ordering::Relaxed);
                        let wait = if n < batch { idle } else { pause };
                        if !wait.is_zero() {
                            tokio::time::sleep(wait).await;
                        }
                    }
                    Err(e) => {
                        errors += 1;
                        eprintln!("purge: {e}");
                        tokio::time::sleep(idle).await;
                    }
                }
            }
            (batches, errors)
        });
        Purger { stop, purged, task }
    }

    async fn finish(self) -> (Histogram<u64>, u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let (batches, errors) = self.task.await.unwrap_or_else(|_| (histogram(), 1));
        (batches, self.purged.load(Ordering::Relaxed), errors)
    }
}

struct Ctx {
    flags: Flags,
    admin: tokio_postgres::Client,
    schema: String,
    url: String,
}

impl Ctx {
    async fn store(&self, connections: usize) -> Result<PostgresStore> {
        let store = PostgresStore::connect(&self.url).await?;
        store.pool().resize(connections);
        Ok(store)
    }

    async fn scalar_i64(&self, sql: &str) -> Result<i64> {
        Ok(self.admin.query_one(sql, &[]).await?.get(0))
    }

    async fn show(&self, setting: &str) -> Result<String> {
        Ok(self.admin.query_one(&format!("SHOW {setting}"), &[]).await?.get(0))
    }
}

/// `load`: the schema afresh, the store's own table in it, and `--records` rows shaped
/// as the store writes a completed record.
async fn load(ctx: &Ctx) -> Result<()> {
    let records: i64 = ctx.flags.get("records", 100_000)?;
    let expired: f64 = ctx.flags.get("expired", 0.9)?;
    let chunk: i64 = ctx.flags.get("chunk", 1_000_000)?;
    // > 0: the table created first, partitioned by hash of the key into this many
    // partitions (the store's `ensure_schema` then finds it and creates nothing).
    let partitions: u32 = ctx.flags.get("partitions", 0)?;
    if !(0.0..1.0).contains(&expired) {
        return Err("--expired is a fraction in [0, 1)".into());
    }
    let schema = &ctx.schema;
    ctx.admin
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"))
        .await?;
    if partitions > 0 {
        ctx.admin.batch_execute(&partitioned_schema(schema, partitions)).await?;
    }
    ctx.store(1).await?.ensure_schema().await?;
    // Every record was kept for a day (TTL); they were written at a steady rate over
    // `span` ending now, so the oldest `expired` fraction is past its TTL: what a table
    // looks like when nothing purged it for `span - 1 day`.
    let span = (DAY_US as f64 / (1.0 - expired)) as i64;
    let sample = Key::new(SCOPE, TENANT, "0".repeat(CLIENT_KEY_LEN))?;
    let prefix = &sample.as_bytes()[..sample.as_bytes().len() - CLIENT_KEY_LEN];
    let body = vec![b'x'; BODY_LEN];
    let sql = format!(
        "INSERT INTO {schema}.idemcache_records
             (key, fingerprint, state, token, body, started_at, settled_at, expires_at)
         SELECT $1::bytea || convert_to(md5(g::text), 'UTF8'), decode(md5('fp' || g::text), 'hex'),
                2, nextval('{schema}.idemcache_tokens'), $2::bytea, t.s, t.s + 2000, t.s + {DAY_US}
         FROM generate_series($3::bigint, $4::bigint) g,
              LATERAL (SELECT $6::bigint - $5::bigint + g * $5::bigint / $7::bigint AS s) t"
    );
    let now =
        ctx.scalar_i64("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint").await?;
    let started = Instant::now();
    let mut from = 0;
    while from < records {
        let to = (from + chunk).min(records) - 1;
        ctx.admin.execute(&sql, &[&prefix, &body, &from, &to, &span, &now, &records]).await?;
        from = to + 1;
        println!("loaded {from} rows in {:.0} s", started.elapsed().as_secs_f64());
    }
    // What autovacuum would have done to a table this old (the shared test server runs
    // with autovacuum off): visibility map and statistics, so plans are the steady state's.
    ctx.admin.batch_execute(&format!("VACUUM (ANALYZE) {schema}.idemcache_records")).await?;
    println!("vacuumed and analyzed at {:.0} s", started.elapsed().as_secs_f64());
    sizes_line(ctx, "after load").await?;
    Ok(())
}

/// The store's sequence and table in `schema`, the table partitioned by hash of `key`
/// (the primary key is the partition key, so each partition's is the whole table's
/// uniqueness), with the expiry index on every partition.
fn partitioned_schema(schema: &str, partitions: u32) -> String {
    let mut ddl = format!(
        "CREATE SEQUENCE {schema}.idemcache_tokens;
         CREATE TABLE {schema}.idemcache_records (
             key BYTEA PRIMARY KEY, fingerprint BYTEA NOT NULL,
             state SMALLINT NOT NULL CHECK (state IN (1, 2, 3)), token BIGINT NOT NULL,
             body BYTEA, started_at BIGINT NOT NULL, settled_at BIGINT, expires_at BIGINT NOT NULL
         ) PARTITION BY HASH (key);"
    );
    for p in 0..partitions {
        ddl += &format!(
            "CREATE TABLE {schema}.idemcache_records_{p} PARTITION OF {schema}.idemcache_records
             FOR VALUES WITH (MODULUS {partitions}, REMAINDER {p});"
        );
    }
    ddl + &format!(
        "CREATE INDEX idemcache_records_expiry ON {schema}.idemcache_records (expires_at);"
    )
}

/// `claims`: the claim load alone, in rounds alternating between the schemas of
/// `--schemas` (e.g. a plain table and a hash-partitioned one, each `load`ed first).
async fn claims(ctx: &Ctx, base: &str) -> Result<()> {
    let schemas: String = ctx.flags.get("schemas", String::new())?;
    let seconds: f64 = ctx.flags.get("seconds", 5.0)?;
    let rounds: usize = ctx.flags.get("rounds", 3)?;
    let rate: f64 = ctx.flags.get("rate", 500.0)?;
    let workers: usize = ctx.flags.get("workers", 8)?;
    let names: Vec<&str> = schemas.split(',').filter(|s| !s.is_empty()).collect();
    if names.is_empty() {
        return Err("--schemas a,b: the schemas to compare".into());
    }
    let mut stores = Vec::new();
    for name in &names {
        let store = PostgresStore::connect(&postgres_url_in_schema(base, name)).await?;
        store.pool().resize(workers);
        let _ =
            claim_load(&store, rate, workers, Duration::from_secs(2), Duration::from_secs(3600))
                .await;
        stores.push((name, store, histogram(), Vec::new()));
    }
    println!("claims: {rate}/s over {workers} connections, {rounds} x {seconds} s rounds per schema, interleaved");
    for round in 0..rounds {
        for (name, store, total, p99s) in &mut stores {
            let got = claim_load(
                store,
                rate,
                workers,
                Duration::from_secs_f64(seconds),
                Duration::from_secs(3600),
            )
            .await;
            println!(
                "round {round} {name}: claim p50/p99/p99.9/max ms {}",
                percentiles(&got.claim)
            );
            p99s.push(got.claim.value_at_quantile(0.99));
            let _ = total.add(&got.claim);
        }
    }
    println!("| schema | claims | claim p50 ms | p99 ms | p99.9 ms | max ms | median of the rounds' p99 ms |");
    println!("|---|---|---|---|---|---|---|");
    for (name, _, total, p99s) in &mut stores {
        p99s.sort_unstable();
        let median = p99s.get(p99s.len() / 2).copied().unwrap_or(0) as f64 / 1000.0;
        println!("| {name} | {} | {} | {median:.2} |", total.len(), percentiles(total));
    }
    Ok(())
}

/// One line of the table's statistics and sizes.
async fn sizes_line(ctx: &Ctx, label: &str) -> Result<String> {
    let s = &ctx.schema;
    let row = ctx
        .admin
        .query_one(
            &format!(
                "SELECT coalesce(st.n_live_tup, 0), coalesce(st.n_dead_tup, 0),
                        coalesce(st.autovacuum_count + st.vacuum_count, 0),
                        pg_relation_size('{s}.idemcache_records'),
                        pg_relation_size('{s}.idemcache_records_pkey'),
                        pg_relation_size('{s}.idemcache_records_expiry'),
                        pg_total_relation_size('{s}.idemcache_records')
                 FROM (SELECT 1) one LEFT JOIN pg_stat_user_tables st
                   ON st.schemaname = '{s}' AND st.relname = 'idemcache_records'"
            ),
            &[],
        )
        .await?;
    let mb = |i: usize| row.get::<_, i64>(i) as f64 / 1_048_576.0;
    let line = format!(
        "| {label} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} |",
        row.get::<_, i64>(0),
        row.get::<_, i64>(1),
        row.get::<_, i64>(2),
        mb(3),
        mb(4),
        mb(5),
        mb(6)
    );
    println!("{line}");
    Ok(line)
}

const SIZES_HEADER: &str = "| at | n_live_tup | n_dead_tup | vacuums | heap MB | pkey MB | expiry index MB | total MB |\n|---|---|---|---|---|---|---|---|";

/// `purge`: claims alone, and claims beside a purger, in interleaved rounds.
async fn purge(ctx: &Ctx) -> Result<()> {
    let seconds: f64 = ctx.flags.get("seconds", 5.0)?;
    let rounds: usize = ctx.flags.get("rounds", 2)?;
    let rate: f64 = ctx.flags.get("rate", 500.0)?;
    let workers: usize = ctx.flags.get("workers", 8)?;
    let batch: usize = ctx.flags.get("batch", 1000)?;
    let pause_ms: u64 = ctx.flags.get("pause-ms", 0)?;
    let run = Duration::from_secs_f64(seconds);
    let claims = ctx.store(workers).await?;
    let purging = ctx.store(1).await?;
    let expired_at_start = ctx
        .scalar_i64(&format!(
            "SELECT count(*) FROM {}.idemcache_records
             WHERE expires_at <= (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
            ctx.schema
        ))
        .await?;
    println!(
        "purge: {expired_at_start} expired rows; claims at {rate}/s over {workers} connections, \
         {rounds} x {seconds} s rounds per condition; purge batch {batch}, pause {pause_ms} ms; \
         autovacuum {}",
        ctx.show("autovacuum").await?
    );
    println!("{SIZES_HEADER}");
    sizes_line(ctx, "before").await?;
    // Warm-up: connections, prepared statements, the indexes' hot pages.
    let _ =
        claim_load(&claims, rate, workers, Duration::from_secs(2), Duration::from_secs(3600)).await;
    let mut alone =
        LoadResult { claim: histogram(), complete: histogram(), errors: 0, unexpected: 0 };
    let mut beside =
        LoadResult { claim: histogram(), complete: histogram(), errors: 0, unexpected: 0 };
    let mut batches = histogram();
    let (mut purged, mut purge_errors) = (0, 0);
    let mut per_round = Vec::new();
    // Each round's claim p99, per condition: a checkpoint or a neighbour's burst lands in
    // one round, and the median of the rounds' p99s says what a typical round saw.
    let (mut p99s_alone, mut p99s_beside) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for with_purge in [false, true] {
            let purger = with_purge.then(|| {
                Purger::start(
                    purging.clone(),
                    batch,
                    Duration::from_millis(pause_ms),
                    Duration::from_millis(100),
                )
            });
            let got = claim_load(&claims, rate, workers, run, Duration::from_secs(3600)).await;
            let mut note = String::new();
            if let Some(purger) = purger {
                let (b, n, e) = purger.finish().await;
                let _ = batches.add(&b);
                purged += n;
                purge_errors += e;
                note = format!(", purged {n} ({:.0}/s)", n as f64 / seconds);
            }
            let cond = if with_purge { "with purger" } else { "claims alone" };
            per_round.push(format!(
                "round {round} {cond}: claim p50/p99/p99.9/max ms {} ({} claims{note})",
                percentiles(&got.claim),
                got.claim.len()
            ));
            println!("{}", per_round.last().map_or("", String::as_str));
            let p99s = if with_purge { &mut p99s_beside } else { &mut p99s_alone };
            p99s.push(got.claim.value_at_quantile(0.99));
            let into = if with_purge { &mut beside } else { &mut alone };
            let _ = into.claim.add(&got.claim);
            let _ = into.complete.add(&got.complete);
            into.errors += got.errors;
            into.unexpected += got.unexpected;
        }
    }
    sizes_line(ctx, "after").await?;
    println!();
    println!("| condition | claims | claim p50 ms | p99 ms | p99.9 ms | max ms | complete p50 ms | complete p99 ms | errors |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (name, r) in [("claims alone", &alone), ("beside the purger", &beside)] {
        println!(
            "| {name} | {} | {} | {:.2} | {:.2} | {} |",
            r.claim.len(),
            percentiles(&r.claim),
            r.complete.value_at_quantile(0.5) as f64 / 1000.0,
            r.complete.value_at_quantile(0.99) as f64 / 1000.0,
            r.errors + r.unexpected
        );
    }
    let ratio = |q: f64| {
        beside.claim.value_at_quantile(q) as f64 / alone.claim.value_at_quantile(q).max(1) as f64
    };
    println!();
    println!(
        "claim p50 ratio (beside / alone) {:.2}x, p99 ratio {:.2}x, p99.9 ratio {:.2}x",
        ratio(0.5),
        ratio(0.99),
        ratio(0.999)
    );
    let median = |v: &mut Vec<u64>| {
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0) as f64 / 1000.0
    };
    let (m_alone, m_beside) = (median(&mut p99s_alone), median(&mut p99s_beside));
    println!(
        "median of the rounds' claim p99: alone {m_alone:.2} ms, beside the purger \
         {m_beside:.2} ms: {:.2}x",
        m_beside / m_alone.max(0.001)
    );
    let purge_secs = seconds * rounds as f64;
    println!(
        "purger: {purged} rows in {purge_secs:.0} s ({:.0} rows/s), {} batches of {batch}, \
         batch p50/p99/p99.9/max ms {}, {purge_errors} errors",
        purged as f64 / purge_secs,
        batches.len(),
        percentiles(&batches)
    );
    Ok(())
}

/// `churn`: claims + completions of fresh keys kept `--ttl` seconds, a purger, and the
/// table sampled every `--sample` seconds.
async fn churn(ctx: &Ctx) -> Result<()> {
    let seconds: u64 = ctx.flags.get("seconds", 60)?;
    let rate: f64 = ctx.flags.get("rate", 500.0)?;
    let workers: usize = ctx.flags.get("workers", 8)?;
    let ttl: u64 = ctx.flags.get("ttl", 20)?;
    let sample: u64 = ctx.flags.get("sample", 5)?;
    let batch: usize = ctx.flags.get("batch", 1000)?;
    let idle_ms: u64 = ctx.flags.get("idle-ms", 1000)?;
    let fresh: bool = ctx.flags.get("fresh", true)?;
    // Per-table autovacuum settings to apply, e.g. "autovacuum_vacuum_scale_factor=0.02".
    let reloptions: String = ctx.flags.get("reloptions", String::new())?;
    // With the server's autovacuum off: a plain VACUUM of the table this often (0: never).
    let vacuum_every: u64 = ctx.flags.get("vacuum-every", 0)?;
    let schema = &ctx.schema;
    if fresh {
        ctx.admin
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
            ))
            .await?;
    }
    let claims = ctx.store(workers).await?;
    claims.ensure_schema().await?;
    if !reloptions.is_empty() {
        ctx.admin
            .batch_execute(&format!("ALTER TABLE {schema}.idemcache_records SET ({reloptions})"))
            .await?;
    }
    println!(
        "churn: {rate} claim+complete/s over {workers} connections, TTL {ttl} s, {seconds} s \
         ({:.1} TTLs); purge batch {batch}, idle {idle_ms} ms; autovacuum {} (naptime {}), \
         table options [{reloptions}], manual VACUUM every {vacuum_every} s",
        seconds as f64 / ttl as f64,
        ctx.show("autovacuum").await?,
        ctx.show("autovacuum_naptime").await?
    );
    println!("{SIZES_HEADER}");
    let purger =
        Purger::start(ctx.store(1).await?, batch, Duration::ZERO, Duration::from_millis(idle_ms));
    let load = {
        let claims = claims.clone();
        tokio::spawn(async move {
            claim_load(
                &claims,
                rate,
                workers,
                Duration::from_secs(seconds),
                Duration::from_secs(ttl),
            )
            .await
        })
    };
    let started = Instant::now();
    let mut last_vacuum = Instant::now();
    let mut next = Duration::ZERO;
    while started.elapsed() < Duration::from_secs(seconds) {
        if let Some(wait) = next.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        next += Duration::from_secs(sample);
        if vacuum_every > 0 && last_vacuum.elapsed() >= Duration::from_secs(vacuum_every) {
            ctx.admin.batch_execute(&format!("VACUUM {schema}.idemcache_records")).await?;
            last_vacuum = Instant::now();
        }
        sizes_line(ctx, &format!("{} s", started.elapsed().as_secs())).await?;
    }
    let got = load.await?;
    let (batches, purged, purge_errors) = purger.finish().await;
    sizes_line(ctx, "end").await?;
    println!(
        "claims {} (p50/p99/p99.9/max ms {}), {} errors; purged {purged} rows in {} batches \
         (p50/p99/max ms {}), {purge_errors} purge errors",
        got.claim.len(),
        percentiles(&got.claim),
        got.errors + got.unexpected,
        batches.len(),
        percentiles(&batches)
    );
    Ok(())
}

async fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = args.split_first() else {
        return Err("usage: pg_volume load|purge|churn|claims|drop [--flag value ...]".into());
    };
    let flags = Flags::parse(rest)?;
    let base = std::env::var("IDEMCACHE_POSTGRES_URL")
        .map_err(|_| "IDEMCACHE_POSTGRES_URL is not set (postgres://user@host:port/db)")?;
    let schema: String = flags.get("schema", "pg_volume".to_owned())?;
    if schema.is_empty() || !schema.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
        return Err("--schema: lowercase letters and '_' only".into());
    }
    let admin = connect(&base).await?;
    let ctx = Ctx { url: postgres_url_in_schema(&base, &schema), flags, admin, schema };
    match command.as_str() {
        "load" => load(&ctx).await,
        "purge" => purge(&ctx).await,
        "churn" => churn(&ctx).await,
        "claims" => claims(&ctx, &base).await,
        "drop" => {
            ctx.admin
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", ctx.schema))
                .await?;
            println!("dropped schema {}", ctx.schema);
            Ok(())
        }
        other => Err(format!("unknown command {other}: load, purge, churn, claims or drop").into()),
    }
}

fn main() {
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pg_volume: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run()) {
        eprintln!("pg_volume: {e}");
        std::process::exit(1);
    }
}
