//! `.ci/model`: checks the claim protocol's model ([`idemcache_model`]) breadth-first,
//! every configuration, and prints `model: S states, P properties hold` (exit 0), or a
//! property's counterexample (exit 1).
//!
//! `--list-plants` prints the planted defects' names, one a line; `--plant NAME` checks
//! the configuration that shows that defect with it planted, and exits 1 after printing
//! the counterexample the checker found (exit 2 if it found none: the property is
//! blind to it). `--deep` checks larger bounds (the full tier).

use std::process::ExitCode;

use idemcache_model::{check, configurations, protocol, Plant};
use stateright::Model;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let deep = args.iter().any(|a| a == "--deep");
    if args.iter().any(|a| a == "--list-plants") {
        for plant in Plant::ALL {
            println!("{}", plant.name());
        }
        return ExitCode::SUCCESS;
    }
    if let Some(at) = args.iter().position(|a| a == "--plant") {
        let Some(plant) = args.get(at + 1).and_then(|name| Plant::named(name)) else {
            eprintln!("--plant takes one of: {}", Plant::ALL.map(Plant::name).join(", "));
            return ExitCode::from(64);
        };
        let (lapse, effect) = plant.shown_by();
        let checked = check(protocol(lapse, effect, Some(plant), deep));
        for (_, trace) in &checked.violated {
            print!("{trace}");
        }
        let names: Vec<_> = checked.violated.iter().map(|(name, _)| *name).collect();
        if names.is_empty() {
            println!("model: {} states, no property caught {}", checked.states, plant.name());
            return ExitCode::from(2);
        }
        println!(
            "model: {} states, {} caught by: {}",
            checked.states,
            plant.name(),
            names.join("; ")
        );
        return ExitCode::FAILURE;
    }
    let (mut states, mut properties) = (0, 0);
    for (lapse, effect) in configurations() {
        let model = protocol(lapse, effect, None, deep);
        properties = model.properties().len();
        let checked = check(model);
        states += checked.states;
        if !checked.violated.is_empty() {
            for (_, trace) in &checked.violated {
                print!("{trace}");
            }
            println!("model: {states} states, a property is violated");
            return ExitCode::FAILURE;
        }
    }
    println!("model: {states} states, {properties} properties hold");
    ExitCode::SUCCESS
}
