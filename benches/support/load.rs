//! What the closed-loop load benchmarks (`http_load`, `grpc_load`) share: their flags,
//! each server as a child process, the latency histogram, the median round, and the
//! table's cells.
//!
//! Invariants: every load table reports the round whose rate is the median, and that
//! round's own percentiles, so a row's figures always come from one measurement; and a
//! server child exits when the load generator does (its stdin, held here, closes).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};

use hdrhistogram::Histogram;

/// The value of `--NAME VALUE` on the command line, or `default` when it is absent or
/// does not parse.
pub fn flag<T: std::str::FromStr>(name: &str, default: T) -> T {
    let all: Vec<String> = std::env::args().collect();
    all.iter().position(|a| a == name).and_then(|i| all.get(i + 1)?.parse().ok()).unwrap_or(default)
}

/// The machine's cores: the default of the servers' `--threads`.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// A server child process; it exits when its stdin (held here) closes.
pub struct ServerProcess {
    child: Child,
    _stdin: ChildStdin,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        drop(self.child.kill());
        drop(self.child.wait());
    }
}

/// Starts `program args` and reads its first line: `listening ADDR`, or `unavailable
/// WHY` (the error).
pub fn start(program: &Path, args: &[String]) -> Result<ServerProcess, String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", program.display()))?;
    let stdin = child.stdin.take().ok_or("no stdin")?;
    let mut line = String::new();
    let stdout = child.stdout.take().ok_or("no stdout")?;
    BufReader::new(stdout).read_line(&mut line).map_err(|e| e.to_string())?;
    let line = line.trim();
    match line.strip_prefix("listening ") {
        Some(addr) => {
            let addr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
            Ok(ServerProcess { child, _stdin: stdin, addr })
        }
        None => {
            drop(child.kill());
            drop(child.wait());
            Err(line.strip_prefix("unavailable ").unwrap_or(line).to_owned())
        }
    }
}

/// Latencies in nanoseconds, 1 ns to a minute, three significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

/// The index of the median of `rates` (the upper one of an even count).
pub fn median_index(rates: &[f64]) -> usize {
    let mut order: Vec<usize> = (0..rates.len()).collect();
    order.sort_by(|&a, &b| rates[a].total_cmp(&rates[b]));
    order[order.len() / 2]
}

/// Requests per second in thousands: `55.0k`.
pub fn kilo(per_second: f64) -> String {
    format!("{:.1}k", per_second / 1000.0)
}

/// A quantile of `histogram` in µs, or ms from one millisecond up.
pub fn micros(histogram: &Histogram<u64>, quantile: f64) -> String {
    let ns = histogram.value_at_quantile(quantile) as f64;
    if ns >= 10_000_000.0 {
        format!("{:.0} ms", ns / 1e6)
    } else if ns >= 1_000_000.0 {
        format!("{:.1} ms", ns / 1e6)
    } else {
        format!("{:.0} µs", ns / 1e3)
    }
}

/// One phase of one round of one row.
pub struct Measured {
    /// Answers per second over the measured part.
    pub per_second: f64,
    /// Each answer's latency, in nanoseconds.
    pub histogram: Histogram<u64>,
    /// Answers that were not what the phase expects.
    pub unexpected: u64,
    /// The first of those, described.
    pub first_unexpected: Option<String>,
}

impl Measured {
    /// Nothing measured yet.
    pub fn empty() -> Measured {
        Measured { per_second: 0.0, histogram: histogram(), unexpected: 0, first_unexpected: None }
    }

    /// Adds one caller's answers (`first_unexpected` kept from the first that had one).
    pub fn add(&mut self, histogram: &Histogram<u64>, unexpected: u64, first: Option<String>) {
        self.histogram.add(histogram).expect("histograms of one shape");
        self.unexpected += unexpected;
        if self.first_unexpected.is_none() {
            self.first_unexpected = first;
        }
    }

    /// The progress line's figures: rate, p50, p99, what was unexpected.
    pub fn progress(&self) -> String {
        format!(
            "{:>9.0}/s p50 {} p99 {} unexpected {}{}",
            self.per_second,
            micros(&self.histogram, 0.5),
            micros(&self.histogram, 0.99),
            self.unexpected,
            self.first_unexpected.as_deref().map(|s| format!(" (first: {s})")).unwrap_or_default(),
        )
    }
}

/// The round whose rate is the median.
pub fn median(rounds: &[Measured]) -> &Measured {
    let rates: Vec<f64> = rounds.iter().map(|m| m.per_second).collect();
    &rounds[median_index(&rates)]
}

/// A table row's two cells for one phase: the median round's rate (with its ratio to
/// `bare`'s median rate, when given) and its p50 / p99 / p99.9.
pub fn cells(rounds: &[Measured], bare: Option<&[Measured]>) -> (String, String) {
    let m = median(rounds);
    let ratio = match bare {
        Some(b) => format!(" ({:.2}x bare)", m.per_second / median(b).per_second),
        None => String::new(),
    };
    let odd = match m.unexpected {
        0 => String::new(),
        n => format!(" [{n} unexpected]"),
    };
    (
        format!("{}{ratio}{odd}", kilo(m.per_second)),
        format!(
            "{} / {} / {}",
            micros(&m.histogram, 0.5),
            micros(&m.histogram, 0.99),
            micros(&m.histogram, 0.999)
        ),
    )
}

/// Every round's rates, `first / replay; ...`.
pub fn rounds_line(first: &[Measured], replay: &[Measured]) -> String {
    let rounds: Vec<String> = first
        .iter()
        .zip(replay)
        .map(|(f, p)| format!("{} / {}", kilo(f.per_second), kilo(p.per_second)))
        .collect();
    rounds.join("; ")
}
