//! The histories of the real outbox chaos run ([`files`]: `.ci/outbox-chaos` writes them)
//! checked against the promises the outbox's model checks (`crate::outbox`): per
//! message, the publishes the relays began with their lease's fencing token and the
//! attempt their count made, each publish's outcome, and what the databases hold at the
//! end (the outbox's row, the consumer's inbox and the ledger's balances).
//!
//! Invariant: a history passes only if each of these holds ([`Property`]):
//! 1. **Applied once** ([`Property::AppliedOnce`]): every committed message (an outbox
//!    row: it commits with its order) was received once by the consumer's inbox, and
//!    each ledger account's balance is the sum of the amounts of the committed messages
//!    naming it; nothing the outbox does not hold was received, and no account is
//!    credited that no committed message names. (The model's "a message is applied at
//!    most once" and "every committed message is applied"; the balance is the effect the
//!    inbox guards, so a message received once and applied twice, or applied outside
//!    the inbox, shows.)
//! 2. **Tokens grow** ([`Property::TokensGrow`]): per message, each publish begun was
//!    counted under a lease (its token is not 0), its token is at most the row's (a
//!    claim's token is the row's last plus one, so none above it was ever minted), and
//!    ordered by the time each count was sent, the tokens of its publishes strictly
//!    increase: a lower one after a higher is a count the fence should have refused,
//!    and one token twice is a lease used by two claims (or one claim publishing
//!    twice). A publish of a message the outbox does not hold, and an outcome that
//!    answers no publish its relay began just before, fail it too.
//! 3. **Attempts counted** ([`Property::Attempts`]): per message, in the same order, the
//!    attempt numbers strictly increase, and none is above the row's `attempts`, nor
//!    are there more publishes than that (the model's "no row has more publishes begun
//!    than its attempts").
//! 4. **Delivered as confirmed** ([`Property::DeliveredConfirmed`]): a delivered row's
//!    token (the claim whose fenced mark delivered it: a delivered row is never claimed
//!    again) began a publish the broker confirmed. With 2, that publish was the
//!    message's last begun (the relay marks a row delivered only after its broker
//!    confirmed it, under the token that published it).
//! 5. **Nothing dead** ([`Property::NothingDead`]): no row is dead. The chaos run has no
//!    poison message and its kills are far fewer than a row's 10 attempts, so a dead row
//!    is a good message given up ("no poison row takes another with it", "a row dies only
//!    after its last attempt was begun").
//!
//! Why the times can order a message's publishes: a count is fenced by the lease's
//! token, and a claim changes the token. A count applied under token `t` committed
//! before the claim that minted `t + 1`, which committed before any count under it was
//! sent; so the count of a later claim (or a later attempt) was sent strictly later, by
//! the one machine's clock the relays share (a clock stepped back mid-run fails the
//! check rather than passing it). The relay writes each `begin` with its count's send
//! time, so, ordered by time (ties by token), a message's publishes are in the order
//! the database applied their counts.
//!
//! What the data does not support, so not checked: which copy the consumer received
//! (the inbox keeps the message id, not the publish), whether a confirmed publish
//! reached the broker before a failed one (outcomes are not fenced), and the lease
//! times (the relay's clock decides them). A relay killed between a count applied and
//! its `begin` line leaves a count with no publish, which the check allows (the model's
//! limit: a count whose publish never began spends an attempt).

use std::collections::BTreeMap;
use std::fmt::Write as _;

pub mod files;

/// An outbox chaos run's history.
#[derive(Debug, Default, Clone)]
pub struct OutboxHistory {
    /// The outbox's rows at the end, by message id: the committed messages.
    pub rows: BTreeMap<String, Row>,
    /// Every relay's events, each file's in its order, the files in name order.
    pub events: Vec<Event>,
    /// The message ids the consumer's inbox holds, one per row of its table.
    pub inbox: Vec<String>,
    /// The ledger's balances, by account.
    pub accounts: BTreeMap<String, i64>,
}

/// An outbox row at the end of the run, and what its message credits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// 0 pending, 1 leased, 2 delivered, 3 dead (`State::code`).
    pub state: u8,
    /// The publishes of it counted as they began.
    pub attempts: u32,
    /// The last claim's fencing token.
    pub token: u64,
    /// The ledger account its payload names.
    pub account: String,
    /// The amount its payload credits.
    pub amount: i64,
}

/// What a relay recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A publish begins (the line is written before it), after its count was applied.
    Begin,
    /// The broker confirmed the publish begun before.
    Confirmed,
    /// The publish begun before failed.
    Failed,
}

/// One line of a relay's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The relay's file (`relay.r1`).
    pub relay: String,
    /// The relay process's id.
    pub pid: u32,
    /// ns since the epoch: a begin's count's send time, an outcome's arrival.
    pub time: u128,
    /// What happened.
    pub kind: Kind,
    /// The message.
    pub message: String,
    /// The lease's fencing token.
    pub token: u64,
    /// The attempt the count made.
    pub attempt: u32,
}

/// A promise the check holds the history to (the module's docs say each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Property {
    /// Every committed message applied once, nothing else applied.
    AppliedOnce,
    /// Per message, the tokens of its publishes strictly increase, none above the row's.
    TokensGrow,
    /// Per message, its publishes' attempts strictly increase, none above the row's.
    Attempts,
    /// A delivered row's token published it, confirmed.
    DeliveredConfirmed,
    /// No row is dead.
    NothingDead,
}

impl Property {
    /// Every property, in the report's order.
    pub const ALL: [Property; 5] = [
        Property::AppliedOnce,
        Property::TokensGrow,
        Property::Attempts,
        Property::DeliveredConfirmed,
        Property::NothingDead,
    ];

    /// What it says, as the report names it.
    pub fn name(self) -> &'static str {
        match self {
            Property::AppliedOnce => {
                "every committed message applied once by the consumer (received once, each \
                 account's balance its committed messages' sum), nothing else applied"
            }
            Property::TokensGrow => {
                "per message, each publish begun under a counted lease, its token above the \
                 one before it (by the counts' times) and at most the row's; each outcome \
                 answers its relay's publish"
            }
            Property::Attempts => {
                "per message, each publish begun as a later attempt than the one before it, \
                 none beyond the attempts its row counts"
            }
            Property::DeliveredConfirmed => {
                "a delivered row's token began a publish the broker confirmed"
            }
            Property::NothingDead => "no row dead (the run has no poison message)",
        }
    }
}

/// A property violated: by which message (or account), and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The property.
    pub property: Property,
    /// The message id (or, for an account no message names, the account).
    pub message: String,
    /// What is wrong.
    pub why: String,
}

/// What the check found.
#[derive(Debug)]
pub struct Checked {
    /// Committed messages (outbox rows).
    pub messages: usize,
    /// Publishes begun.
    pub publishes: usize,
    /// Of which confirmed.
    pub confirmed: usize,
    /// Of which failed.
    pub failed: usize,
    /// Publishes begun with no outcome line (their relay was killed while publishing).
    pub unanswered: usize,
    /// Claims of the rows: the sum of their tokens (each claim mints the row's next).
    pub claims: u64,
    /// Rows delivered at the end.
    pub delivered: usize,
    /// Rows pending or leased at the end.
    pub undelivered: usize,
    /// Messages the inbox holds.
    pub received: usize,
    /// Ledger accounts.
    pub accounts: usize,
    /// Every violation found.
    pub violations: Vec<Violation>,
    /// One counterexample per violation shown (the message, its events in order).
    pub counterexamples: Vec<String>,
}

impl Checked {
    /// Whether every property holds.
    pub fn holds(&self) -> bool {
        self.violations.is_empty()
    }

    /// The properties violated, each once.
    pub fn violated(&self) -> Vec<Property> {
        let mut violated: Vec<Property> = self.violations.iter().map(|v| v.property).collect();
        violated.sort();
        violated.dedup();
        violated
    }

    /// The report: one line per property, each counterexample, and the last line
    /// (`outbox history: M messages, P publishes, applied once; tokens grow` when all
    /// hold).
    pub fn report(&self) -> String {
        let mut out = String::new();
        for property in Property::ALL {
            let n = self.violations.iter().filter(|v| v.property == property).count();
            let figures = match property {
                Property::AppliedOnce => format!(
                    "{} messages, {} received, {} accounts",
                    self.messages, self.received, self.accounts
                ),
                Property::TokensGrow => format!(
                    "{} publishes begun ({} confirmed, {} failed, {} cut by a kill) under {} \
                     claims",
                    self.publishes, self.confirmed, self.failed, self.unanswered, self.claims
                ),
                Property::Attempts => format!("{} publishes begun", self.publishes),
                Property::DeliveredConfirmed => {
                    format!("{} delivered ({} not delivered)", self.delivered, self.undelivered)
                }
                Property::NothingDead => format!("{} rows", self.messages),
            };
            let _ = writeln!(out, "{}: {figures}: {n} violations", property.name());
        }
        for counterexample in &self.counterexamples {
            out.push_str(counterexample);
        }
        let last = if self.holds() {
            "applied once; tokens grow".to_owned()
        } else {
            let violated: Vec<String> = self
                .violated()
                .into_iter()
                .map(|p| {
                    let n = self.violations.iter().filter(|v| v.property == p).count();
                    format!("{n} {p:?}")
                })
                .collect();
            format!("violated: {}", violated.join(", "))
        };
        let _ = writeln!(
            out,
            "outbox history: {} messages, {} publishes, {last}",
            self.messages, self.publishes
        );
        out
    }
}

/// The most counterexamples a report prints per property.
const SHOWN: usize = 3;

/// Checks `history` (the module's docs say what).
pub fn check(history: &OutboxHistory) -> Checked {
    let mut violations = Vec::new();
    let mut fail = |property, message: &str, why: String| {
        violations.push(Violation { property, message: message.to_owned(), why });
    };

    // 1. Applied once.
    let mut received: BTreeMap<&str, usize> = BTreeMap::new();
    for id in &history.inbox {
        *received.entry(id.as_str()).or_default() += 1;
    }
    let mut owed: BTreeMap<&str, i64> = BTreeMap::new();
    for (id, row) in &history.rows {
        *owed.entry(row.account.as_str()).or_default() += row.amount;
        match received.get(id.as_str()).copied().unwrap_or(0) {
            1 => {}
            0 => fail(Property::AppliedOnce, id, "committed, never received".to_owned()),
            n => fail(Property::AppliedOnce, id, format!("received {n} times")),
        }
    }
    for (&id, &n) in &received {
        if !history.rows.contains_key(id) {
            let why = format!("received {n} times, never committed (no outbox row)");
            fail(Property::AppliedOnce, id, why);
        }
    }
    for (id, row) in &history.rows {
        let owed = owed[row.account.as_str()];
        let balance = history.accounts.get(&row.account).copied();
        if balance != Some(owed) {
            let shown = balance.map_or("no balance".to_owned(), |b| format!("a balance of {b}"));
            let why = format!(
                "its account {:?} has {shown}, the committed messages naming it credit {owed}",
                row.account
            );
            fail(Property::AppliedOnce, id, why);
        }
    }
    for (account, balance) in &history.accounts {
        if !owed.contains_key(account.as_str()) {
            let why = format!(
                "account {account:?} has a balance of {balance}, no committed message names it"
            );
            fail(Property::AppliedOnce, account, why);
        }
    }

    // 2 and 3: each message's publishes, and each outcome against its relay's last line.
    let mut begun: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    let (mut confirmed, mut failed, mut unanswered) = (0, 0, 0);
    let mut previous: Option<&Event> = None;
    for event in &history.events {
        let before = previous.filter(|p| p.relay == event.relay);
        match event.kind {
            Kind::Begin => {
                if before.is_some_and(|b| b.kind == Kind::Begin) {
                    unanswered += 1;
                }
                begun.entry(event.message.as_str()).or_default().push(event);
            }
            Kind::Confirmed | Kind::Failed => {
                if event.kind == Kind::Confirmed {
                    confirmed += 1;
                } else {
                    failed += 1;
                }
                let answers = before.is_some_and(|b| {
                    b.kind == Kind::Begin
                        && b.pid == event.pid
                        && b.message == event.message
                        && b.token == event.token
                        && b.attempt == event.attempt
                });
                if !answers {
                    let why = format!(
                        "{} pid {}: {:?} under token {} attempt {}, which answers no publish \
                         its relay began just before",
                        event.relay, event.pid, event.kind, event.token, event.attempt
                    );
                    fail(Property::TokensGrow, &event.message, why);
                }
            }
        }
        // A relay's last line a begin: killed while publishing.
        previous = Some(event);
    }
    let mut last_of: BTreeMap<&str, &Event> = BTreeMap::new();
    for event in &history.events {
        last_of.insert(event.relay.as_str(), event);
    }
    unanswered += last_of.values().filter(|e| e.kind == Kind::Begin).count();
    let publishes = begun.values().map(Vec::len).sum();

    for (&id, publishes) in &mut begun {
        publishes.sort_by_key(|e| (e.time, e.token, e.attempt));
        let Some(row) = history.rows.get(id) else {
            let why = format!(
                "{} publishes begun of a message the outbox does not hold",
                publishes.len()
            );
            fail(Property::TokensGrow, id, why);
            continue;
        };
        for e in publishes.iter().filter(|e| e.token == 0) {
            let why = format!("{} pid {} began a publish under no counted lease", e.relay, e.pid);
            fail(Property::TokensGrow, id, why);
        }
        if let Some(e) = publishes.iter().find(|e| e.token > row.token) {
            let why = format!(
                "a publish began under token {}, above the row's last claim's {}",
                e.token, row.token
            );
            fail(Property::TokensGrow, id, why);
        }
        for pair in publishes.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if b.token == a.token {
                let why = format!("token {} began two publishes", a.token);
                fail(Property::TokensGrow, id, why);
            } else if b.token < a.token {
                let why = format!(
                    "a publish under token {} was counted after one under token {}",
                    b.token, a.token
                );
                fail(Property::TokensGrow, id, why);
            }
            if b.attempt <= a.attempt {
                let why = format!(
                    "attempt {} (token {}) was counted after attempt {} (token {})",
                    b.attempt, b.token, a.attempt, a.token
                );
                fail(Property::Attempts, id, why);
            }
        }
        let most = publishes.iter().map(|e| e.attempt).max().unwrap_or(0);
        if publishes.len() > row.attempts as usize || most > row.attempts {
            let why = format!(
                "{} publishes begun (the highest as attempt {most}), the row counts {} attempts",
                publishes.len(),
                row.attempts
            );
            fail(Property::Attempts, id, why);
        }
    }

    // 4 and 5.
    let (mut delivered, mut undelivered) = (0, 0);
    for (id, row) in &history.rows {
        match row.state {
            2 => {
                delivered += 1;
                let confirmed_under = history
                    .events
                    .iter()
                    .any(|e| e.kind == Kind::Confirmed && e.message == *id && e.token == row.token);
                if !confirmed_under {
                    let why = format!(
                        "delivered under token {}, no publish under it was confirmed",
                        row.token
                    );
                    fail(Property::DeliveredConfirmed, id, why);
                }
            }
            3 => {
                let why = format!("dead after {} attempts, in a run with no poison", row.attempts);
                fail(Property::NothingDead, id, why);
            }
            _ => undelivered += 1,
        }
    }

    let mut counterexamples = Vec::new();
    let start = history.events.iter().map(|e| e.time).min().unwrap_or(0);
    for property in Property::ALL {
        for v in violations.iter().filter(|v| v.property == property).take(SHOWN) {
            counterexamples.push(counterexample(history, v, start));
        }
    }
    Checked {
        messages: history.rows.len(),
        publishes,
        confirmed,
        failed,
        unanswered,
        claims: history.rows.values().map(|r| r.token).sum(),
        delivered,
        undelivered,
        received: history.inbox.len(),
        accounts: history.accounts.len(),
        violations,
        counterexamples,
    }
}

/// The violation's message, its events in order (times from `start`), and its row,
/// receipts and account at the end.
fn counterexample(history: &OutboxHistory, v: &Violation, start: u128) -> String {
    let mut out =
        format!("counterexample to \"{:?}\", message {}: {}\n", v.property, v.message, v.why);
    let mut events: Vec<&Event> =
        history.events.iter().filter(|e| e.message == v.message).collect();
    events.sort_by_key(|e| (e.time, e.token, e.attempt));
    for e in events {
        let at = e.time.saturating_sub(start) as f64 / 1e9;
        let kind = format!("{:?}", e.kind).to_lowercase();
        let _ = writeln!(
            out,
            "  {at:>11.6} s  {} pid {:<7} {kind:<9} token {} attempt {}",
            e.relay, e.pid, e.token, e.attempt
        );
    }
    let received = history.inbox.iter().filter(|id| **id == v.message).count();
    match history.rows.get(&v.message) {
        Some(row) => {
            let state = ["pending", "leased", "delivered", "dead"]
                .get(usize::from(row.state))
                .unwrap_or(&"?");
            let balance =
                history.accounts.get(&row.account).map_or("none".to_owned(), |b| b.to_string());
            let _ = writeln!(
                out,
                "  then the row: {state}, {} attempts, token {}; received {received} times; \
                 account {:?} (credited {}): balance {balance}",
                row.attempts, row.token, row.account, row.amount
            );
        }
        None => {
            let _ = writeln!(out, "  then no outbox row; received {received} times");
        }
    }
    out
}
