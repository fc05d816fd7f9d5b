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
