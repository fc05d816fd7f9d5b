//! `.ci/model`: checks the protocols' models ([`idemcache_model`]) breadth-first, every
//! configuration, and prints `model: S states, P properties hold` (exit 0), or each
//! violated property's counterexample (exit 1).
//!
//! `--list-plants` prints the planted defects' names, one a line; `--plant NAME` checks
//! the configuration that shows that defect with it planted, and exits 1 after printing
//! the counterexample the checker found (exit 2 if it found none: the properties are
//! blind to it). `--deep` checks larger bounds (the full tier).
//!
//! `--history DIR [--after-commit]` checks a fault run's history instead
//! ([`idemcache_model::history`]; `.ci/faults` writes DIR): one line per property, a
//! counterexample for each violation, and last `history: K keys, O operations,
//! linearizable; tokens grow` (exit 0), or `..., violated: ...` (exit 1); exit 64 if the
//! history cannot be read. `--after-commit` checks it as records written after the order
//! commits allow (records in Redis), not as the one-commit run promises.
//!
//! `--outbox-history DIR` checks an outbox chaos run's history
//! ([`idemcache_model::history::outbox`]; `.ci/outbox-chaos` writes DIR): one line per
//! property, a counterexample for each violation (the message and its events in order),
//! and last `outbox history: M messages, P publishes, applied once; tokens grow` (exit
//! 0), or `..., violated: ...` (exit 1); exit 64 if the history cannot be read.

use std::path::Path;
use std::process::ExitCode;

use idemcache_model::history::spec::Mode;
use idemcache_model::{claim, history, outbox, Checked};
use stateright::Model;

/// Prints what `checked` found; its exit code.
fn report(checked: &Checked, properties: usize) -> ExitCode {
    for (_, trace) in &checked.violated {
        print!("{trace}");
    }
    if checked.violated.is_empty() {
        println!("model: {} states, {properties} properties hold", checked.states);
        return ExitCode::SUCCESS;
    }
    println!("model: {} states, violated: {}", checked.states, checked.names().join("; "));
    ExitCode::FAILURE
}

/// A history check's exit: its report printed, 0 when every property holds, 1 when one
/// does not; 64, named `what`, when `dir` could not be read.
fn history_exit(what: &str, dir: &Path, checked: Result<(String, bool), String>) -> ExitCode {
    match checked {
        Ok((report, holds)) => {
            print!("{report}");
            if holds {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(why) => {
            eprintln!("{what}: cannot read {}: {why}", dir.display());
            ExitCode::from(64)
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let deep = args.iter().any(|a| a == "--deep");
    if let Some(at) = args.iter().position(|a| a == "--outbox-history") {
        let dir = Path::new(args.get(at + 1).map_or("", String::as_str));
        let checked = history::outbox::files::read(dir).map(|read| {
            let checked = history::outbox::check(&read);
            (checked.report(), checked.holds())
        });
        return history_exit("outbox history", dir, checked);
    }
    if let Some(at) = args.iter().position(|a| a == "--history") {
        let dir = Path::new(args.get(at + 1).map_or("", String::as_str));
        let mode = if args.iter().any(|a| a == "--after-commit") {
            Mode::AfterCommit
        } else {
            Mode::Together
        };
        let tenant = args.iter().position(|a| a == "--tenant").and_then(|at| args.get(at + 1));
        let checked = history::files::read(dir, tenant.map(String::as_str)).map(|read| {
            let checked = history::check(&read, mode);
            (checked.report(), checked.holds())
        });
        return history_exit("history", dir, checked);
    }
    let names = || {
        let claims = claim::Plant::ALL.map(claim::Plant::name);
        claims.into_iter().chain(outbox::Plant::ALL.map(outbox::Plant::name))
    };
    if args.iter().any(|a| a == "--list-plants") {
        names().for_each(|name| println!("{name}"));
        return ExitCode::SUCCESS;
    }
    if let Some(at) = args.iter().position(|a| a == "--plant") {
        let name = args.get(at + 1).map_or("", String::as_str);
        let checked = if let Some(plant) = claim::Plant::named(name) {
            let (lapse, effect) = plant.shown_by();
            claim::check_planted(lapse, effect, Some(plant), deep)
        } else if let Some(plant) = outbox::Plant::named(name) {
            outbox::check_planted(Some(plant), deep)
        } else {
            eprintln!("--plant takes one of: {}", names().collect::<Vec<_>>().join(", "));
            return ExitCode::from(64);
        };
        for (_, trace) in &checked.violated {
            print!("{trace}");
        }
        if checked.violated.is_empty() {
            println!("model: {} states, no property caught {name}", checked.states);
            return ExitCode::from(2);
        }
        println!(
            "model: {} states, {name} caught by: {}",
            checked.states,
            checked.names().join("; ")
        );
        return ExitCode::FAILURE;
    }
    let mut checked = claim::check_all(deep);
    let relayed = outbox::check_planted(None, deep);
    checked.states += relayed.states;
    checked.violated.extend(relayed.violated);
    let properties = claim::protocol(claim::Lapse::TakeOver, claim::Effect::Inside, None, deep)
        .properties()
        .len()
        + outbox::outbox(None, deep).properties().len();
    report(&checked, properties)
}
