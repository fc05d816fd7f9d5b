//! Model-based test: random sequences of every public operation, clock moves and sweeps,
//! with and without capacity pressure, run against the cache and a sequential reference
//! model (`tests/common/model.rs`), checked step by step. A failure shrinks to a short,
//! readable list of `Op`s.

mod common;

use common::model::{Harness, Op, KEYS};
use idemcache::DropPolicy;
use proptest::prelude::*;

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS;
    let fp = 0u8..2;
    let guard = any::<u8>();
    prop_oneof![
        4 => (key.clone(), fp.clone(), 0u8..130).prop_map(|(key, fp, corr)| Op::Claim { key, fp, corr }),
        1 => (key.clone(), fp).prop_map(|(key, fp)| Op::ClaimWaitNow { key, fp }),
        3 => (guard, 0u8..12).prop_map(|(guard, len)| Op::Complete { guard, len }),
        1 => guard.prop_map(|guard| Op::Release { guard }),
        1 => guard.prop_map(|guard| Op::MarkUnknown { guard }),
        1 => guard.prop_map(|guard| Op::DropGuard { guard }),
        1 => (guard, 0u8..15).prop_map(|(guard, secs)| Op::Extend { guard, secs }),
        1 => (key.clone(), 0u8..12).prop_map(|(key, len)| Op::Resolve { key, len }),
        1 => key.clone().prop_map(|key| Op::Forget { key }),
        1 => key.clone().prop_map(|key| Op::Remove { key }),
        1 => key.clone().prop_map(|key| Op::Peek { key }),
        // Whole seconds, and less than the 1 s wheel tick (entries then die between
        // ticks, where a sweep does not reach them).
        1 => (0u32..25).prop_map(|secs| Op::Advance { millis: secs * 1000 }),
        2 => (0u32..1500).prop_map(|millis| Op::Advance { millis }),
        1 => (key, 0u8..2, any::<bool>(), 0u8..12, 0u32..5000, 0u32..40_000).prop_map(
            |(key, fp, unknown, len, age_ms, ttl_ms)| Op::Insert { key, fp, unknown, len, age_ms, ttl_ms }
        ),
        1 => (guard, 0u8..40).prop_map(|(guard, secs)| Op::SetResultTtl { guard, secs }),
        1 => Just(Op::RunPending),
        1 => (0u8..20).prop_map(|limit| Op::ListUnknown { limit }),
        1 => (0u8..20, any::<bool>()).prop_map(|(limit, undecided)| Op::Reconcile { limit, undecided }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn cache_agrees_with_the_reference_model(
        mark_unknown_on_drop in any::<bool>(),
        // Half the cases turn lapsed leases UNKNOWN instead of taking them over.
        mark_unknown_on_lapse in any::<bool>(),
        // Two thirds of the cases run bounded (of 16 keys): at 3, refusals are common; at
        // 12, eviction batches of a tenth differ from other fractions.
        max_entries in prop_oneof![Just(3usize), Just(12), Just(1000)],
        ops in proptest::collection::vec(op(), 1..100),
    ) {
        let policy = if mark_unknown_on_drop { DropPolicy::MarkUnknown } else { DropPolicy::Release };
        let mut harness = Harness::with_lapse(policy, mark_unknown_on_lapse, max_entries);
        for op in &ops {
            harness.apply(op);
        }
    }
}
