//! idemcache's protocols model-checked with stateright, breadth-first, every state within
//! the bounds, over the decision code the drivers run: [`claim`] (one key's claims
//! across processes, the lapse policies, the one-commit transaction, reconcile, the hot
//! tier, purge) and [`outbox`] (the relay's leases, fencing and attempts, a poison row,
//! relays' clocks apart and stepping, the consumer's inbox). `.ci/model` runs both
//! (VERIFICATION.md, "The protocols, model-checked").
//! [`history`] checks the histories of the real fault run against the same promises
//! (`.ci/model --history DIR`), and [`history::outbox`] those of the outbox chaos run
//! (`.ci/model --outbox-history DIR`).
//!
//! Invariant: each model's transitions decide through the drivers' own functions,
//! unchanged unless a planted defect is named; what a model writes by hand is what SQL
//! does in the drivers (a lease's liveness, a fenced write), each said where it is.

use std::fmt::{Debug, Display};
use std::hash::Hash;

use stateright::{Checker, Model};

pub mod claim;
pub mod history;
pub mod outbox;

/// What a check found: the unique states explored, and each property violated with its
/// counterexample, written one step a line.
#[derive(Debug)]
pub struct Checked {
    /// Unique states explored.
    pub states: usize,
    /// Each violated property's name and counterexample trace.
    pub violated: Vec<(&'static str, String)>,
}

impl Checked {
    /// The names of the properties violated, each once (a property violated in several
    /// configurations has a counterexample from each).
    pub fn names(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = Vec::new();
        for (name, _) in &self.violated {
            if !names.contains(name) {
                names.push(name);
            }
        }
        names
    }
}

/// Checks `model` (`described` in its traces) breadth-first, every reachable state
/// within its bounds.
pub fn check<M>(model: M, described: &str) -> Checked
where
    M: Model + Clone + Send + Sync + 'static,
    M::State: Clone + Debug + Display + Hash + PartialEq + Send + Sync,
    M::Action: Clone + Debug + PartialEq + Send + Sync,
{
    let checker = model.clone().checker().spawn_bfs().join();
    let states = checker.unique_state_count();
    let mut names: Vec<_> = checker.discoveries().into_keys().collect();
    names.sort();
    let violated =
        names.into_iter().map(|name| (name, shortest_trace(&model, name, described))).collect();
    Checked { states, violated }
}

/// The shortest counterexample to the property `name`, as trace lines. The checker keeps
/// the last violating state it met, the deepest of a breadth-first search, so the search
/// is run again, one depth deeper each time, until it meets one.
fn shortest_trace<M>(model: &M, name: &'static str, described: &str) -> String
where
    M: Model + Clone + Send + Sync + 'static,
    M::State: Clone + Debug + Display + Hash + PartialEq + Send + Sync,
    M::Action: Clone + Debug + PartialEq + Send + Sync,
{
    let mut trace = format!("counterexample to \"{name}\" ({described}):\n");
    let path = (1..=256).find_map(|depth| {
        let checker = model.clone().checker().target_max_depth(depth).spawn_bfs().join();
        checker.discovery(name)
    });
    let Some(path) = path else { return trace };
    let states = path.clone().into_states();
    let actions = path.into_actions();
    for (n, state) in states.iter().enumerate() {
        trace.push_str(&format!("  {n:>2}: {state}\n"));
        if let Some(action) = actions.get(n) {
            trace.push_str(&format!("      then {action:?}\n"));
        }
    }
    trace
}
