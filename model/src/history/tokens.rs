//! The fencing tokens of a key's executions against the one that committed.
//!
//! Invariant: no token executes twice for a key (a claim runs its handler once), and
//! the token of the execution that committed the key's order is the highest any
//! execution of the key held: an execution holding a higher one would have taken the
//! key over, and the fenced completion of the lower one would have failed. Under
//! [`Mode::Together`] the execution that inserted the order (its `committed` line) is
//! the one whose token completed the record, in one transaction; under
//! [`Mode::AfterCommit`] a later execution may complete it, after the backstop answered
//! it the order an earlier one inserted, and the record's token is the one judged.

use super::spec::Mode;
use super::History;

/// What the token check found.
#[derive(Debug, Default)]
pub struct Tokens {
    /// Executions logged at their start.
    pub executions: usize,
    /// Commits logged (not an execution killed between its commit and the line, nor one
    /// whose commit's answer was lost with its connection).
    pub commits: usize,
    /// Keys whose committed token was compared with their executions'.
    pub judged: usize,
    /// Keys with an order but no completed record, under [`Mode::AfterCommit`] (a kill
    /// between the order's commit and its record's): no committed token to compare.
    pub unjudged: usize,
    /// Keys whose order was inserted under a lower token than the one that completed
    /// the record, under [`Mode::AfterCommit`]: second executions the backstop answered.
    pub backstopped: usize,
    /// Of the violations, tokens executed twice.
    pub twice: usize,
    /// Each violation: the key, and what is wrong.
    pub violations: Vec<(String, String)>,
}

/// Checks every key of `history` under `mode`.
pub fn check(history: &History, mode: Mode) -> Tokens {
    let mut found = Tokens::default();
    let mut executed_twice = 0;
    for (key, of) in &history.keys {
        let mut fail = |why: String| found.violations.push((key.clone(), why));
        let mut started = of.executions.clone();
        started.sort_unstable();
        for twice in started.windows(2).filter(|w| w[0] == w[1]) {
            fail(format!("token {} executed twice", twice[0]));
            executed_twice += 1;
        }
        for token in of.committed.iter().filter(|t| !started.contains(t)) {
            fail(format!("token {token} committed, which no execution logged at its start"));
        }
        if of.committed.len() > 1 {
            fail(format!("executions under tokens {:?} each inserted an order", of.committed));
        }
        if !of.committed.is_empty() && of.row.is_none() {
            fail("an execution logged its order's commit, the database holds no row".to_owned());
        }
        let inserted = of.committed.first().copied();
        let completed = of.record.filter(|r| r.state == 2).map(|r| r.token);
        let committed = match (mode, inserted, completed) {
            (Mode::Together, Some(i), Some(c)) if i != c => {
                fail(format!(
                    "the order inserted under token {i}, its record completed under {c}: \
                     a second execution reached the order"
                ));
                c
            }
            (Mode::AfterCommit, Some(i), Some(c)) if i < c => {
                found.backstopped += 1;
                c
            }
            (_, _, Some(c)) => c,
            (_, _, None) if of.row.is_none() => continue,
            // Together, the order and its record commit in one transaction.
            (Mode::Together, _, None) => {
                let record = of.record.map_or("none".to_owned(), |r| format!("state {}", r.state));
                fail(format!(
                    "its order committed without its completed record (record: {record})"
                ));
                continue;
            }
            (Mode::AfterCommit, _, None) => {
                found.unjudged += 1;
                continue;
            }
        };
        found.judged += 1;
        if !started.contains(&committed) {
            fail(format!("completed under token {committed}, which no execution logged"));
        } else if let Some(&highest) = started.last().filter(|&&t| t > committed) {
            fail(format!("completed under token {committed}, an execution held {highest}"));
        }
    }
    found.twice = executed_twice;
    found.executions = history.keys.values().map(|k| k.executions.len()).sum();
    found.commits = history.keys.values().map(|k| k.committed.len()).sum();
    found
}
