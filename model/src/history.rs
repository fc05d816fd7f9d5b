//! The histories of the real fault run ([`files`]: `.ci/faults` writes them) checked
//! against the promises the models check: per key, the attempts its client saw, the
//! executions the instances logged with their fencing tokens, and what the database
//! committed. ([`outbox`] checks the outbox chaos run's: the relays' publishes, and what the
//! outbox, the inbox and the ledger hold at the end.)
//!
//! Invariant: a history passes only if, for every key, (1) its attempts and a final read
//! of the database's row are linearizable against [`spec::ClaimOrReturn`] (stateright's
//! `LinearizabilityTester`): one commit at most, a first execution only before it, a
//! replay only of it, and the row is what the answers named; and (2) its [`tokens`]
//! grow: none executed twice, the committed one the highest.
//!
//! How attempts become operations: one that returned (a 201, a 409, a 4xx) is invoked
//! at its `sent` time and returns at its `ended` time; one whose outcome nobody saw (a
//! broken connection, a timeout, a 5xx) is invoked and never returns, so the tester may
//! linearize it anywhere after its invocation, or leave it out; a refused connection
//! never reached a server and is dropped. Each operation has a thread of its own (the
//! tester allows one operation in flight per thread): real time alone orders them.
//!
//! Of a key's attempts that never returned, only the earliest is given to the tester:
//! linearized, such an attempt executes if the key was not done and does nothing if it
//! was, so any linearization using a later one can use the earliest instead (invoked
//! first, it follows fewer operations), and the others add nothing but search: the
//! tester's backtracking is exponential in the attempts in flight, and a key a dead
//! instance kept answering with broken connections has tens of them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use stateright::semantics::{ConsistencyTester, LinearizabilityTester};

pub mod files;
pub mod outbox;
pub mod spec;
pub mod tokens;

use spec::{ClaimOrReturn, Mode, Op, Ret};

/// A fault run's history: each key's.
#[derive(Debug, Default, Clone)]
pub struct History {
    /// Each key's history, by the client's key.
    pub keys: BTreeMap<String, KeyHistory>,
}

/// One key's history.
#[derive(Debug, Default, Clone)]
pub struct KeyHistory {
    /// Its client's attempts, in the ledger's order.
    pub attempts: Vec<Attempt>,
    /// The tokens of its executions, as logged at their start.
    pub executions: Vec<u64>,
    /// The tokens of the executions that logged their order's commit (an execution
    /// killed between the commit and the line, or whose commit's answer was lost with
    /// its connection, is not among them).
    pub committed: Vec<u64>,
    /// The order the database committed for it, if any.
    pub row: Option<i64>,
    /// Its idempotency record, if it has one.
    pub record: Option<Record>,
}

/// One attempt, as its client saw it.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// Its number among the key's attempts (1, 2, ...).
    pub n: u32,
    /// The instance it was sent to.
    pub port: u16,
    /// When it was sent (s, the client's clock).
    pub sent: f64,
    /// When its answer came, or the connection broke (s).
    pub ended: f64,
    /// The ledger's outcome.
    pub outcome: String,
    /// What it means.
    pub answer: Answer,
}

/// What an attempt's outcome means for the check.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// It returned this.
    Returned(Ret),
    /// Its outcome was never seen: it may have executed.
    Indeterminate,
    /// It never reached a server (a refused connection).
    Dropped,
}

/// An idempotency record: its state (1 PROCESSING, 2 COMPLETED, 3 UNKNOWN) and token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// 1 PROCESSING, 2 COMPLETED, 3 UNKNOWN.
    pub state: u8,
    /// The token of the claim that wrote it last.
    pub token: u64,
}

/// What the check found.
#[derive(Debug)]
pub struct Checked {
    /// Keys checked.
    pub keys: usize,
    /// Operations: attempts that reached a server, and a read per key.
    pub operations: usize,
    /// Of which attempts whose outcome nobody saw.
    pub indeterminate: usize,
    /// Attempts dropped: refused connections.
    pub dropped: usize,
    /// The keys whose history is not linearizable.
    pub not_linearizable: Vec<String>,
    /// The token check.
    pub tokens: tokens::Tokens,
    /// One counterexample per violation (the key, its operations in order).
    pub counterexamples: Vec<String>,
}

impl Checked {
    /// Whether every property holds.
    pub fn holds(&self) -> bool {
        self.not_linearizable.is_empty() && self.tokens.violations.is_empty()
    }

    /// The report: one line per property, each counterexample, and the last line
    /// (`history: K keys, O operations, linearizable; tokens grow` when all hold).
    pub fn report(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "linearizable (claim-or-return, per key, with the database's row read last): \
             {} keys, {} operations ({} indeterminate: broken, timed out or 5xx; {} refused \
             connections dropped): {} keys violate it",
            self.keys,
            self.operations,
            self.indeterminate,
            self.dropped,
            self.not_linearizable.len()
        );
        let t = &self.tokens;
        let twice = t.twice;
        let _ = writeln!(
            out,
            "no token executes twice for a key: {} executions logged: {twice} violations",
            t.executions
        );
        let mut notes = vec![format!("{} commits logged", t.commits)];
        if t.unjudged > 0 {
            notes.push(format!(
                "{} keys with an order but no completed record not judged",
                t.unjudged
            ));
        }
        if t.backstopped > 0 {
            notes.push(format!(
                "{} keys whose order one execution inserted and a later one, answered by the \
                 backstop, completed",
                t.backstopped
            ));
        }
        let _ = writeln!(
            out,
            "the committing execution's token is the highest a key's executions held: {} keys \
             judged ({}): {} violations",
            t.judged,
            notes.join("; "),
            t.violations.len() - twice
        );
        for counterexample in &self.counterexamples {
            out.push_str(counterexample);
        }
        let last = if self.holds() {
            "linearizable; tokens grow".to_owned()
        } else {
            let mut violated = Vec::new();
            if !self.not_linearizable.is_empty() {
                violated.push(format!("{} keys not linearizable", self.not_linearizable.len()));
            }
            if !t.violations.is_empty() {
                violated.push(format!("{} token violations", t.violations.len()));
            }
            format!("violated: {}", violated.join(", "))
        };
        let _ =
            writeln!(out, "history: {} keys, {} operations, {last}", self.keys, self.operations);
        out
    }
}

/// The most counterexamples a report prints in full.
const SHOWN: usize = 5;

/// Checks `history` under `mode`.
pub fn check(history: &History, mode: Mode) -> Checked {
    let mut checked = Checked {
        keys: history.keys.len(),
        operations: 0,
        indeterminate: 0,
        dropped: 0,
        not_linearizable: Vec::new(),
        tokens: tokens::check(history, mode),
        counterexamples: Vec::new(),
    };
    let start = history
        .keys
        .values()
        .flat_map(|k| k.attempts.iter().map(|a| a.sent))
        .fold(f64::INFINITY, f64::min);
    for (key, of) in &history.keys {
        for attempt in &of.attempts {
            match attempt.answer {
                Answer::Dropped => checked.dropped += 1,
                Answer::Indeterminate => checked.indeterminate += 1,
                Answer::Returned(_) => {}
            }
        }
        checked.operations +=
            of.attempts.iter().filter(|a| a.answer != Answer::Dropped).count() + 1;
        if let Err(why) = linearizable(of, mode) {
            checked.not_linearizable.push(key.clone());
            if checked.counterexamples.len() < SHOWN {
                let told = format!("not linearizable: {why}");
                checked.counterexamples.push(counterexample(key, of, &told, start));
            }
        }
    }
    for (key, why) in &checked.tokens.violations {
        if checked.counterexamples.len() < 2 * SHOWN {
            let of = &history.keys[key];
            checked.counterexamples.push(counterexample(key, of, why, start));
        }
    }
    checked
}

/// One event of a key's history, at its time: an operation invoked, or returning.
enum Event {
    Invoke(usize, Op),
    Return(usize, Ret),
}

/// Whether `of`'s operations are linearizable; why not if they are not.
fn linearizable(of: &KeyHistory, mode: Mode) -> Result<(), String> {
    // Of the attempts that never returned, the earliest only (the module's docs say why
    // the others add nothing).
    let earliest = of
        .attempts
        .iter()
        .enumerate()
        .filter(|(_, a)| a.answer == Answer::Indeterminate)
        .min_by(|(_, a), (_, b)| a.sent.total_cmp(&b.sent))
        .map(|(thread, _)| thread);
    let mut events: Vec<(f64, u8, Event)> = Vec::new();
    for (thread, attempt) in of.attempts.iter().enumerate() {
        match &attempt.answer {
            Answer::Dropped => {}
            Answer::Indeterminate if Some(thread) == earliest => {
                events.push((attempt.sent, 1, Event::Invoke(thread, Op::Post)));
            }
            Answer::Indeterminate => {}
            Answer::Returned(ret) => {
                events.push((attempt.sent, 1, Event::Invoke(thread, Op::Post)));
                // At one instant, returns first: an answer seen, then the next sent.
                events.push((attempt.ended, 0, Event::Return(thread, ret.clone())));
            }
        }
    }
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut tester = LinearizabilityTester::new(ClaimOrReturn::new(mode));
    for (_, _, event) in events {
        match event {
            Event::Invoke(thread, op) => tester.on_invoke(thread, op).map(|_| ())?,
            Event::Return(thread, ret) => tester.on_return(thread, ret).map(|_| ())?,
        }
    }
    // The database's row, read after every attempt ended.
    tester.on_invoke(usize::MAX, Op::Read)?;
    tester.on_return(usize::MAX, Ret::Read(of.row))?;
    if tester.is_consistent() {
        return Ok(());
    }
    Err("no order of its operations, each at an instant within its interval, meets the spec"
        .to_owned())
}

/// `key`'s history, one operation a line in the order sent, times from `start`.
fn counterexample(key: &str, of: &KeyHistory, why: &str, start: f64) -> String {
    let mut out = format!("counterexample, key {key}: {why}\n");
    for a in &of.attempts {
        let shown = match &a.answer {
            Answer::Returned(ret) => format!("{ret:?}"),
            Answer::Indeterminate => "never returned (may have executed)".to_owned(),
            Answer::Dropped => "dropped (refused)".to_owned(),
        };
        let _ = writeln!(
            out,
            "  #{:<3} port {} sent {:>8.3} s ended {:>8.3} s  {:<24} {shown}",
            a.n,
            a.port,
            a.sent - start,
            a.ended - start,
            a.outcome
        );
    }
    let row = of.row.map_or("none".to_owned(), |o| format!("order {o}"));
    let _ = writeln!(out, "  then the database's row: {row}");
    let record =
        of.record.map_or("none".to_owned(), |r| format!("state {} token {}", r.state, r.token));
    let _ = writeln!(
        out,
        "  executions' tokens: {:?}; commits logged: {:?}; record: {record}",
        of.executions, of.committed
    );
    out
}
