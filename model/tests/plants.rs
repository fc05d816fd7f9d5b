//! Each planted defect is caught, with a counterexample, by the property it stands
//! against; and without a plant every property holds in every configuration.

use idemcache_model::{check, configurations, protocol, Plant};

#[test]
fn every_property_holds_on_the_decision_code_as_it_ships() {
    for (lapse, effect) in configurations() {
        let checked = check(protocol(lapse, effect, None, false));
        assert!(checked.violated.is_empty(), "{:?}", checked.violated);
        assert!(checked.states > 100, "{lapse:?}/{effect:?}: {} states", checked.states);
    }
}

#[test]
fn each_plant_is_caught_by_its_property_with_a_trace() {
    let caught_by = |plant| match plant {
        Plant::TakeoverWithoutMint => "a key's tokens only grow",
        Plant::LiveLeaseTakenOver => "a live lease is never taken over",
        Plant::LapseTakenOver => "an effect outside it at most once under MarkUnknown",
        Plant::InProgressReplayed => "a replay returns what committed",
        Plant::StaleVerdict => "a reconcile verdict settles only the execution it names",
    };
    for plant in Plant::ALL {
        let (lapse, effect) = plant.shown_by();
        let checked = check(protocol(lapse, effect, Some(plant), false));
        let names: Vec<_> = checked.violated.iter().map(|(name, _)| *name).collect();
        assert!(names.contains(&caught_by(plant)), "{}: caught by {names:?}", plant.name());
        let (_, trace) = &checked.violated[0];
        assert!(trace.contains("then Look("), "{}: a trace of steps: {trace}", plant.name());
        assert_eq!(Plant::named(plant.name()), Some(plant));
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
    use idemcache_model::{Effect, Lapse};
    let mut model = protocol(Lapse::MarkUnknown, Effect::Outside, None, false);
    model.checks_a_stalled_owner = true;
    let checked = check(model);
    let names: Vec<_> = checked.violated.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, ["an effect outside it at most once under MarkUnknown"]);
}
