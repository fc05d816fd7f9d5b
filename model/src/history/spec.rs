//! [`ClaimOrReturn`]: one key's claim-or-return as its client sees it, the sequential
//! specification stateright's `LinearizabilityTester` checks a key's recorded attempts
//! against, and the claims' model steps at each claim's linearization point
//! (`crate::claim`).
//!
//! Invariant: a key is executed (its order committed) at most once, and every answer
//! agrees with that one commit: a first execution only before it, a replay only of it,
//! a 409 only before it (under [`Mode::Together`]), and the database's final row is it.

/// What the records promise about the commit of an order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The order and its record commit in one transaction (PostgreSQL holding both): once
    /// the order committed, every claim of its key replays it.
    Together,
    /// The record is written after the order commits (records in Redis): a kill between
    /// the two leaves the record PROCESSING or UNKNOWN over a committed order, so a 409
    /// may follow the commit, and a retry after the lease runs again and is answered by
    /// the orders' `UNIQUE` backstop with the key's one order, as a first execution
    /// (docs/commit-boundary.md, "What each layer survives").
    AfterCommit,
}

/// An operation on a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// One `POST` with the key (a client's attempt).
    Post,
    /// The database's row for the key, read after every attempt ended.
    Read,
}

/// What an operation returned.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Ret {
    /// 201, not replayed: this attempt executed and created the order.
    Executed(i64),
    /// 201 replayed: the key's stored answer, naming its order.
    Replayed(i64),
    /// 409 `request_in_progress`.
    InProgress,
    /// 409 `outcome_unknown`.
    Unknown,
    /// Any other answer (a 422, a 4xx): no step of the protocol gives it.
    Refused(String),
    /// The order the database committed for the key, if any.
    Read(Option<i64>),
    /// What an attempt that never returned did when it is linearized: it executed.
    Linearized,
}

/// The state of one key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClaimOrReturn {
    mode: Mode,
    /// `None`: not executed. `Some(None)`: executed by an attempt whose answer was never
    /// seen, its order bound by the first answer naming one. `Some(Some(order))`.
    done: Option<Option<i64>>,
}

impl ClaimOrReturn {
    /// A key nothing was done to yet, under `mode`.
    pub fn new(mode: Mode) -> ClaimOrReturn {
        ClaimOrReturn { mode, done: None }
    }

    /// Whether `order` is (or can be bound as) the key's executed order; binds it.
    fn is_the_order(&mut self, order: i64) -> bool {
        match &mut self.done {
            None => false,
            Some(bound @ None) => {
                *bound = Some(order);
                true
            }
            Some(Some(done)) => *done == order,
        }
    }
}

impl stateright::semantics::SequentialSpec for ClaimOrReturn {
    type Op = Op;
    type Ret = Ret;

    /// Only the tester's linearization of an attempt that never returned calls this (the
    /// attempts that returned go through `is_valid_step`): it executed, unless the key
    /// was done already (then it was answered a replay or a 409 nobody saw). An attempt
    /// that did nothing is one the tester leaves out.
    fn invoke(&mut self, op: &Op) -> Ret {
        match op {
            Op::Post => {
                if self.done.is_none() {
                    self.done = Some(None);
                }
                Ret::Linearized
            }
            Op::Read => Ret::Read(self.done.flatten()),
        }
    }

    fn is_valid_step(&mut self, op: &Op, ret: &Ret) -> bool {
        let after_commit = self.mode == Mode::AfterCommit;
        match (op, ret) {
            (Op::Post, Ret::Executed(order)) => {
                if self.done.is_none() {
                    self.done = Some(Some(*order));
                    return true;
                }
                // The backstop's answer to a second execution: the key's one order.
                after_commit && self.is_the_order(*order)
            }
            (Op::Post, Ret::Replayed(order)) => self.is_the_order(*order),
            (Op::Post, Ret::InProgress | Ret::Unknown) => self.done.is_none() || after_commit,
            (Op::Post, Ret::Linearized) => {
                self.invoke(op);
                true
            }
            (Op::Read, Ret::Read(None)) => self.done.is_none(),
            (Op::Read, Ret::Read(Some(order))) => self.is_the_order(*order),
            _ => false,
        }
    }
}
