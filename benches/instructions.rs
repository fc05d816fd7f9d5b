//! Instructions per operation, counted by callgrind: repeatable whatever else the machine
//! runs, so a change to the hot path can be judged without timing noise.
//!
//! ```sh
//! cargo build --release -p idemcache-benches --bin instructions
//! target/release/instructions            # runs itself under valgrind per row; prints a table
//! ```
//!
//! Each row runs one scenario for one peer in a child process under
//! `valgrind --tool=callgrind --toggle-collect=*measured*`, so only the timed loop (the
//! `measured` function) is counted, not filling the map or building the requests; the
//! count is divided by the loop's operations. Peers are keyed as in
//! `benches/support/natural.rs`; "idemcache, key built beforehand" is the core alone.

use std::hint::black_box;
use std::process::Command;

#[path = "support/natural.rs"]
mod natural;
#[path = "support/peers.rs"]
mod peers;

use idemcache::{Cache, Claim, Fingerprint, Key};
use natural::{ask, build, result, Ask, Outcome};

const KEYS: u64 = 10_000;
const OPS: u64 = 20_000;

const ROWS: [&str; 5] = [
    "idemcache (Key + Fingerprint per call)",
    "idemcache, key built beforehand",
    natural::CONTRACT,
    "dashmap [u8; 16]",
    "quick_cache [u8; 16]",
];

#[inline(never)]
fn measured(run: &mut dyn FnMut(u64)) {
    for i in 0..OPS {
        run(i);
    }
}

fn workload(scenario: &str, peer: &str) {
    let asks: Vec<Ask> = (0..KEYS.max(OPS)).map(ask).collect();
    if peer == "idemcache, key built beforehand" {
        let cache = Cache::builder().max_entries(4 * OPS as usize).build().unwrap();
        let keys: Vec<Key> = asks
            .iter()
            .map(|a| Key::new("POST /v1/orders", "user:42", a.header_bytes()).unwrap())
            .collect();
        let fp = Fingerprint::of(natural::REQUEST);
        let claim_complete = |k: &Key, i: u64| match cache.claim(k, fp).unwrap() {
            Claim::Acquired(guard) => guard.complete(result(i)).unwrap(),
            Claim::Completed(replay) => drop(black_box(replay)),
            other => panic!("{other:?}"),
        };
        if scenario == "replay" {
            (0..KEYS).for_each(|i| claim_complete(&keys[i as usize], i));
            measured(&mut |i| claim_complete(&keys[(i % KEYS) as usize], i));
        } else {
            measured(&mut |i| claim_complete(&keys[i as usize], i));
        }
        return;
    }
    let peer = build(peer, 4 * OPS as usize);
    if scenario == "replay" {
        (0..KEYS).for_each(|i| {
            assert_eq!(peer.claim_complete(&asks[i as usize], &|| result(i)), Outcome::Executed)
        });
        measured(&mut |i| {
            drop(black_box(peer.claim_complete(&asks[(i % KEYS) as usize], &|| result(i))))
        });
    } else {
        measured(&mut |i| drop(black_box(peer.claim_complete(&asks[i as usize], &|| result(i)))));
    }
}

/// The child's instruction count from callgrind's summary line (`Collected : N`).
fn count(scenario: &str, peer: &str) -> Result<u64, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = Command::new("valgrind")
        .args(["--tool=callgrind", "--toggle-collect=*measured*", "--callgrind-out-file=/dev/null"])
        .arg(me)
        .args([scenario, peer])
        .output()
        .map_err(|e| format!("valgrind: {e} (is it installed?)"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    stderr
        .lines()
        .find_map(|l| l.split("Collected :").nth(1).map(|n| n.trim().parse::<u64>()))
        .ok_or_else(|| format!("no count in valgrind's output: {stderr}"))?
        .map_err(|e| e.to_string())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [scenario, peer] = args.as_slice() {
        return workload(scenario, peer);
    }
    println!("| peer | replay hit ({KEYS} keys), instructions/op | claim + complete (fresh keys), instructions/op |");
    println!("|---|---|---|");
    for peer in ROWS {
        let per_op = |scenario| match count(scenario, peer) {
            Ok(n) => format!("{:.0}", n as f64 / OPS as f64),
            Err(e) => {
                eprintln!("{peer}, {scenario}: {e}");
                "—".to_owned()
            }
        };
        println!("| {peer} | {} | {} |", per_op("replay"), per_op("claim"));
    }
}
