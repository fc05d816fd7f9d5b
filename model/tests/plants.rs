//! Each planted defect is caught, with a counterexample, by the property it stands
//! against; and without a plant every property holds in every configuration.

use idemcache_model::claim::{self, Effect, Lapse};
use idemcache_model::outbox;

#[test]
fn every_property_holds_on_the_decision_code_as_it_ships() {
    let checked = claim::check_all(false);
    assert!(checked.violated.is_empty(), "{:?}", checked.violated);
    assert!(checked.states > 1_000, "{} states", checked.states);
    let relayed = outbox::check_planted(None, false);
    assert!(relayed.violated.is_empty(), "{:?}", relayed.violated);
    assert!(relayed.states > 100, "{} states", relayed.states);
}

#[test]
fn each_claim_plant_is_caught_by_its_property_with_a_trace() {
    for plant in claim::Plant::ALL {
        let caught_by = match plant {
            claim::Plant::TakeoverWithoutMint => "a key's tokens only grow",
            claim::Plant::LiveLeaseTakenOver => "a live lease is never taken over",
            claim::Plant::LapseTakenOver => "an effect outside it at most once under MarkUnknown",
            claim::Plant::InProgressReplayed => "a replay returns what committed",
            claim::Plant::StaleVerdict => "a reconcile verdict settles only the execution it names",
            claim::Plant::CompletionUnfenced => "a key's tokens only grow",
            claim::Plant::LapsedLeaseHeld => "a claim waits only on a live lease",
            claim::Plant::CachedBeforeCommit => {
                "the hot tier replays only what the store committed"
            }
            claim::Plant::PurgeTakesALapse => "an effect outside it at most once under MarkUnknown",
            claim::Plant::CompletedReadUnknown => "claim-or-return is linearizable",
            claim::Plant::TookOverIgnored | claim::Plant::TookOverAskedLate => {
                "an effect outside it twice under TakeOver only where a live holder lapsed or a lapse was purged"
            }
            claim::Plant::ReleaseUnfenced => "claim-or-return is linearizable",
        };
        let (lapse, effect) = plant.shown_by();
        let checked = claim::check_planted(lapse, effect, Some(plant), false);
        assert!(checked.names().contains(&caught_by), "{}: {:?}", plant.name(), checked.names());
        let (_, trace) = &checked.violated[0];
        assert!(trace.contains("then Look("), "{}: a trace of steps: {trace}", plant.name());
        assert_eq!(claim::Plant::named(plant.name()), Some(plant));
    }
}

#[test]
fn each_outbox_plant_is_caught_by_its_property_with_a_trace() {
    for plant in outbox::Plant::ALL {
        let caught_by = match plant {
            outbox::Plant::BatchWideDeadLetter => "no poison row takes another with it",
            outbox::Plant::InboxWithoutDedup => "a message is applied at most once",
            outbox::Plant::MarkUnfenced => "a delivered row stays delivered",
            outbox::Plant::AttemptsCountClaims => {
                "a row dies only after its last attempt was begun"
            }
        };
        let checked = outbox::check_planted(Some(plant), false);
        assert!(checked.names().contains(&caught_by), "{}: {:?}", plant.name(), checked.names());
        let (_, trace) = &checked.violated[0];
        assert!(trace.contains("then Claim("), "{}: a trace of steps: {trace}", plant.name());
        assert_eq!(outbox::Plant::named(plant.name()), Some(plant));
    }
}

/// The model's one finding about the docs' promise, kept: a reconciler that checks an
/// UNKNOWN record while its owner, stalled past its lease, can still act, forgets it on
/// "did not happen", and the owner's late effect and the next execution's both happen.
/// `reconcile` cannot tell a stalled owner from a dead one: the provider's key
/// (`DownstreamKey`), which turns the second call into the first one's answer, is what
/// keeps the effect once (docs/commit-boundary.md).
#[test]
fn checking_a_stalled_owner_lets_an_outside_effect_run_twice() {
    let mut model = claim::protocol(Lapse::MarkUnknown, Effect::Outside, None, false);
    model.checks_a_stalled_owner = true;
    let checked = idemcache_model::check(model, "a reconciler checking a stalled owner");
    assert_eq!(checked.names(), ["an effect outside it at most once under MarkUnknown"]);
}

/// The model's second finding, kept until the claim mints a new key's token under the
/// key's lock: a MySQL claim mints its token before it looks, so a claim that minted,
/// then stalled while a later execution's record was released, forgotten, purged or
/// rolled back with its one-commit transaction, inserts a token below the one that
/// record held (the shortest trace now: a rollback). `FencingToken`'s docs promise tokens that grow
/// with every claim of a key; an authority fencing by `fence < token` would then take
/// the forgotten execution's late write over this one's.
#[test]
fn a_claim_minted_before_a_forget_inserts_a_lower_token() {
    let mut model = claim::protocol(Lapse::MarkUnknown, Effect::Inside, None, false);
    model.tokens_across_deletes = true;
    let checked = idemcache_model::check(model, "tokens judged across deletes");
    assert_eq!(checked.names(), ["a key's tokens only grow"]);
    let (_, trace) = &checked.violated[0];
    let deleted = ["then Settle(", "then Release(", "then Purge", "then Crash("];
    assert!(deleted.iter().any(|d| trace.contains(d)), "a delete before the lower insert: {trace}");
}

/// The model's third finding, fixed: under `TakeOver` the SQL stores' purge deleted a
/// lapsed lease as soon as it lapsed, so the claim after a purge was a new execution
/// that `took_over` did not warn, and a handler asking the authority only when warned
/// had an outside effect a second time. The purge now keeps a lapsed lease as long as
/// it was held (Redis always kept its key that long); the old purge is the plant here.
#[test]
fn a_purge_taking_a_fresh_lapse_under_take_over_hides_took_over() {
    let checked = claim::check_planted(
        Lapse::TakeOver,
        Effect::Outside,
        Some(claim::Plant::PurgeTakesALapse),
        false,
    );
    assert_eq!(
        checked.names(),
        [
            "an effect outside it twice under TakeOver only where a live holder lapsed or a lapse was purged"
        ]
    );
    let (_, trace) = &checked.violated[0];
    assert!(trace.contains("then Purge"), "a purge between the lapse and the claim: {trace}");
}
