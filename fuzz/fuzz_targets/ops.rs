//! Arbitrary sequences of every public operation and clock moves, run against the cache
//! and the sequential reference model the proptest suite uses (`tests/common/model.rs`).
//! Any divergence, panic or drifted internal count is a crash.
#![no_main]

use arbitrary::{Result, Unstructured};
use idemcache::DropPolicy;
use libfuzzer_sys::fuzz_target;

#[path = "../../tests/common/model.rs"]
#[allow(dead_code)]
mod model;

use model::{Harness, Op};

fn op(u: &mut Unstructured<'_>) -> Result<Op> {
    let small = |u: &mut Unstructured<'_>, max: u8| u.int_in_range(0..=max);
    Ok(match u.int_in_range(0..=16u8)? {
        0 => Op::Claim { key: small(u, 7)?, fp: small(u, 2)?, corr: small(u, 130)? },
        1 => Op::ClaimWaitNow { key: small(u, 7)?, fp: small(u, 2)? },
        2 => Op::Complete { guard: u.arbitrary()?, len: small(u, 16)? },
        3 => Op::Release { guard: u.arbitrary()? },
        4 => Op::MarkUnknown { guard: u.arbitrary()? },
        5 => Op::DropGuard { guard: u.arbitrary()? },
        6 => Op::Extend { guard: u.arbitrary()?, secs: small(u, 40)? },
        7 => Op::Resolve { key: small(u, 7)?, len: small(u, 16)? },
        8 => Op::Forget { key: small(u, 7)? },
        9 => Op::Remove { key: small(u, 7)? },
        10 => Op::Peek { key: small(u, 7)? },
        // Milliseconds: mostly less than the 1 s wheel tick, so entries die between ticks.
        11 => Op::Advance { millis: u32::from(u.arbitrary::<u16>()?) },
        12 => Op::SetResultTtl { guard: u.arbitrary()?, secs: small(u, 60)? },
        13 => Op::Insert {
            key: small(u, 7)?,
            fp: small(u, 2)?,
            unknown: u.arbitrary()?,
            len: small(u, 16)?,
            age_ms: u32::from(u.arbitrary::<u16>()?),
            ttl_ms: u32::from(u.arbitrary::<u16>()?),
        },
        14 => Op::ListUnknown { limit: small(u, 10)? },
        15 => Op::Reconcile { limit: small(u, 10)?, undecided: u.arbitrary()? },
        _ => Op::RunPending,
    })
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let policy =
        if u.arbitrary().unwrap_or(false) { DropPolicy::MarkUnknown } else { DropPolicy::Release };
    let max_entries = if u.arbitrary().unwrap_or(false) { 4 } else { 1000 };
    let mark_lapses = u.arbitrary().unwrap_or(false);
    let mut harness = Harness::with_lapse(policy, mark_lapses, max_entries);
    // `Unstructured` keeps answering with defaults once the data runs out: stop then.
    while !u.is_empty() {
        let Ok(op) = op(&mut u) else { break };
        harness.apply(&op);
    }
    harness.apply(&Op::RunPending);
});
