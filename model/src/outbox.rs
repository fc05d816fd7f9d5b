//! The outbox's relay, over the decision code every driver runs
//! (`idemcache_sql::outbox::decode`): relays that claim a batch of due rows under a
//! lease, and for each row in turn make it dead unpublished when it is out of attempts,
//! or count an attempt, publish it and mark it (delivered, or failed as the retry
//! policy says), as `relay_batch` does, crashing at any step; a poison message whose
//! publish kills its relay, every time; a consumer whose inbox applies each message id
//! once, deciding through `inbox::receive::Receiving`; relays' clocks apart (one a tick
//! ahead, the other stepping a tick forward or back once).
//!
//! What the model writes by hand is what the statements do (which rows are due: a
//! pending row past its due time, a leased row past its lease; each leased anew under a
//! token above the row's last; the fenced count and marks' `WHERE`, the row still leased
//! under the lease's token). A claimed batch is read by `decode::claimed_batch`, a row
//! out of attempts told by `decode::out_of_attempts`, the counted lease by
//! `decode::begun`, a mark's answer by `decode::mark`, a failure's next state by
//! `decode::failed_as`, all unchanged unless a [`Plant`] is named.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idemcache::Fingerprint;
use idemcache_sql::inbox::receive::{Claimed, Receiving, Step, Vanished};
use idemcache_sql::inbox::Receipt;
use idemcache_sql::outbox::decode::{self, RawRow};
use idemcache_sql::outbox::{Lease, Mark, Retry, State as RowState};
use stateright::{Model, Property};

use crate::{check, Checked};

/// A defect planted in the relay's decisions, for a property to catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plant {
    /// A failed publish fails every row of its batch with it, each dead: the batch-wide
    /// dead letter, a poison row taking its neighbours with it.
    BatchWideDeadLetter,
    /// The consumer applies every delivery, its inbox keeping no message id.
    InboxWithoutDedup,
    /// A mark changes the row whatever lease holds it now (no token in its `WHERE`).
    MarkUnfenced,
    /// Attempts count claims, and a batch charges its first row past them dead
    /// unpublished: the relay before attempts counted publishes begun.
    AttemptsCountClaims,
}

impl Plant {
    /// Every plant.
    pub const ALL: [Plant; 4] = [
        Plant::BatchWideDeadLetter,
        Plant::InboxWithoutDedup,
        Plant::MarkUnfenced,
        Plant::AttemptsCountClaims,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Plant::BatchWideDeadLetter => "batch-wide-dead-letter",
            Plant::InboxWithoutDedup => "inbox-without-dedup",
            Plant::MarkUnfenced => "mark-unfenced",
            Plant::AttemptsCountClaims => "attempts-count-claims",
        }
    }

    /// The plant named `name`.
    pub fn named(name: &str) -> Option<Plant> {
        Plant::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// One outbox row.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Row {
    /// Where it is in its life.
    pub state: RowState,
    /// The row's `attempts` column: publishes begun (claims, under the plant).
    pub attempts: u32,
    /// Publishes really begun, whatever the column says: what the properties judge by.
    pub tried: u32,
    /// The last claim's token.
    pub token: u64,
    /// When it is due, while pending (ticks).
    pub due: i64,
    /// When its lease lapses, while leased (ticks).
    pub lease_until: i64,
    /// Whether its publish kills the relay, every time (the poison message).
    pub poison: bool,
}

/// A relay.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Relay {
    /// Waiting for due rows.
    Idle,
    /// Working through a claimed batch: its leases (row index and lease), the next one,
    /// and whether that one is published, waiting for its mark.
    Holding {
        /// The batch's rows and leases, in enqueue order.
        batch: Vec<(usize, Lease)>,
        /// The next row of the batch.
        at: usize,
        /// Whether that row is published (its mark is next).
        published: bool,
        /// Whether a row of the batch was charged dead unpublished (the plant's rule).
        charged: bool,
    },
}

/// One step of the system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Relay `n` claims a batch of due rows.
    Claim(usize),
    /// Relay `n` takes its next row: makes it dead if out of attempts, or counts an
    /// attempt and publishes it (the consumer receives it; the poison message kills the
    /// relay).
    Publish(usize),
    /// Relay `n`'s publish of its next row fails for once (the broker's hiccup).
    Hiccup(usize),
    /// Relay `n` marks its published row delivered.
    Mark(usize),
    /// Relay `n` crashes and restarts with nothing.
    Crash(usize),
    /// The clock advances one tick (only while something waits for time).
    Tick,
    /// Relay 0's clock steps a tick, forward (`1`) or back (`-1`), once: an NTP step.
    Step(i8),
}

/// The system's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The clock, in ticks (a relay's and the database's alike: leases are judged by the
    /// database's clock).
    pub now: i64,
    /// The outbox's rows, in enqueue order.
    pub rows: Vec<Row>,
    /// The relays.
    pub relays: Vec<Relay>,
    /// Crashes so far.
    pub crashes: u8,
    /// Hiccups so far.
    pub hiccups: u8,
    /// How many times the consumer applied each row's message.
    pub applied: Vec<u8>,
    /// The consumer's inbox table: the message ids it holds a record of (bit per row).
    pub seen: u32,
    /// A delivered row changed state after.
    pub delivered_changed: bool,
    /// A row was marked failed by another row's failed publish.
    pub failed_by_another: bool,
    /// A row was given up unpublished before its last attempt was begun.
    pub given_up_early: bool,
    /// The tick relay 0's clock stepped (forward `1`, back `-1`), or 0.
    pub stepped: i8,
}

/// The model: its bounds and configuration.
#[derive(Debug, Clone)]
pub struct Outbox {
    /// Rows: the first (the oldest, so first in its batch) is the poison message.
    pub rows: usize,
    /// Relays.
    pub relays: usize,
    /// Crashes at most.
    pub crashes: u8,
    /// Publishes of a good message that fail, at most.
    pub hiccups: u8,
    /// Rows a claim takes at most.
    pub batch: usize,
    /// A claim's lease, in ticks.
    pub lease: i64,
    /// Attempts before a row is dead.
    pub attempts: u32,
    /// The clock's last tick.
    pub max_clock: i64,
    /// How far relay 1's clock runs ahead of the others', in ticks (each relay leases
    /// and judges due rows by its own clock, the `now` its caller passes).
    pub skew: i64,
    /// Whether relay 0's clock may step a tick, forward or back, once, at any moment.
    pub step: bool,
    /// A planted defect, if any.
    pub plant: Option<Plant>,
}

/// A tick as the drivers' clock reads it.
fn at(tick: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(u64::try_from(tick).unwrap_or(0))
}

impl Outbox {
    fn retry(&self) -> Retry {
        Retry::new(Duration::from_secs(1), Duration::from_secs(2), self.attempts)
            .unwrap_or_default()
    }

    /// Relay `n`'s clock.
    fn clock(&self, state: &State, n: usize) -> i64 {
        match n {
            0 => state.now + i64::from(state.stepped),
            1 => state.now + self.skew,
            _ => state.now,
        }
    }

    fn due(&self, row: &Row, now: i64) -> bool {
        match row.state {
            RowState::Pending => row.due <= now,
            RowState::Leased => row.lease_until <= now,
            RowState::Delivered | RowState::Dead => false,
        }
    }

    /// Whether the mark of `lease` finds its row still leased under it (the fenced
    /// statement's `WHERE`), or (the plant) any row.
    fn holds(&self, row: &Row, lease: &Lease) -> bool {
        self.plant == Some(Plant::MarkUnfenced)
            || (row.state == RowState::Leased && row.token == lease.token)
    }

    /// Relay `n` claims: the due rows, oldest first, up to a batch, each leased anew;
    /// the batch as `decode::claimed_batch` reads the claim's rows.
    fn claim(&self, state: &mut State, n: usize) {
        let now = self.clock(state, n);
        let mut raws = Vec::new();
        for (i, row) in state.rows.iter_mut().enumerate() {
            if raws.len() == self.batch || !self.due(row, now) {
                continue;
            }
            row.state = RowState::Leased;
            if self.plant == Some(Plant::AttemptsCountClaims) {
                row.attempts += 1;
            }
            row.token += 1;
            row.lease_until = now + self.lease;
            raws.push(Ok(RawRow {
                seq: i64::try_from(i).unwrap_or(i64::MAX),
                message_id: format!("m{i}").into_bytes(),
                topic: b"orders".to_vec(),
                payload: b"{}".to_vec(),
                state: RowState::Leased.code(),
                attempts: i64::from(row.attempts),
                next_attempt_at: row.lease_until * 1_000_000,
                lease_until: Some(row.lease_until * 1_000_000),
                token: i64::try_from(row.token).unwrap_or(i64::MAX),
                ..RawRow::default()
            }));
        }
        let batch = decode::claimed_batch(raws);
        let batch = batch
            .claimed
            .into_iter()
            .filter_map(|c| Some((c.lease.message_id.strip_prefix('m')?.parse().ok()?, c.lease)))
            .collect();
        state.relays[n] = Relay::Holding { batch, at: 0, published: false, charged: false };
    }

    /// Relay `n` takes the next row of its batch, as `relay_batch` does: a row out of
    /// attempts is made dead unpublished; otherwise its attempt is counted (fenced: a
    /// row another claim took is skipped) and it is published. The consumer receives
    /// it; or the poison message kills the relay; or (a `hiccup`) the publish fails and
    /// the row is marked as `decode::failed_as` says, fenced.
    fn publish(&self, state: &mut State, n: usize, hiccup: bool) -> Option<()> {
        let Relay::Holding { batch, at: next, charged, .. } = &state.relays[n] else {
            return None;
        };
        let (i, lease) = batch.get(*next)?.clone();
        let retry = self.retry();
        let out = if self.plant == Some(Plant::AttemptsCountClaims) {
            lease.attempts > retry.max_attempts() && !charged
        } else {
            decode::out_of_attempts(&lease, &retry)
        };
        if out {
            if state.rows[i].tried < self.attempts {
                state.given_up_early = true;
            }
            if let Relay::Holding { charged, .. } = &mut state.relays[n] {
                *charged = true;
            }
            self.fail(state, n, &lease);
            return Some(());
        }
        let row = &mut state.rows[i];
        if !self.holds(row, &lease) {
            self.advance(state, n, 1);
            return Some(());
        }
        row.tried += 1;
        let lease = if self.plant == Some(Plant::AttemptsCountClaims) {
            lease
        } else {
            row.attempts += 1;
            decode::begun(&lease)
        };
        if row.poison {
            state.relays[n] = Relay::Idle;
            return Some(());
        }
        let Relay::Holding { batch, at, published, .. } = &mut state.relays[n] else {
            return None;
        };
        batch[*at].1 = lease.clone();
        if hiccup {
            self.fail(state, n, &lease);
            return Some(());
        }
        *published = true;
        if self.receive(state, i) == Receipt::New || self.plant == Some(Plant::InboxWithoutDedup) {
            state.applied[i] = state.applied[i].saturating_add(1);
        }
        Some(())
    }

    /// The consumer receives row `i`'s message, as `inbox::receive` decides
    /// (`inbox::receive::Receiving`): its claim inserts the message's record unless the
    /// table holds it, the read finds the fingerprint stored with it. A `New` message is
    /// applied in the transaction that inserted its record.
    fn receive(&self, state: &mut State, i: usize) -> Receipt {
        let id = format!("m{i}");
        let content = Fingerprint::of(id.as_bytes());
        let mut receiving = Receiving::new("ledger", &id, content, Vanished::ClaimAgain);
        loop {
            match receiving.next() {
                Step::Claim => {
                    let held = state.seen & (1 << i) != 0;
                    state.seen |= 1 << i;
                    receiving.claimed(if held { Claimed::Exists } else { Claimed::Inserted });
                }
                Step::Read => {
                    let stored = (state.seen & (1 << i) != 0).then(|| content.to_bytes());
                    if receiving.read(stored.as_ref().map(|b| &b[..])).is_err() {
                        return Receipt::InFlight;
                    }
                }
                Step::Answer(receipt) => return receipt,
            }
        }
    }

    /// Relay `n` moves `by` rows on in its batch, idle past its end.
    fn advance(&self, state: &mut State, n: usize, by: usize) {
        if let Relay::Holding { batch, at, published, .. } = &mut state.relays[n] {
            *at += by;
            *published = false;
            if *at >= batch.len() {
                state.relays[n] = Relay::Idle;
            }
        }
    }

    /// Relay `n`'s next row failed under `lease` (its publish, or its attempts): marked
    /// as `decode::failed_as` says, fenced; under the plant, with every row behind it
    /// in the batch, dead.
    fn fail(&self, state: &mut State, n: usize, lease: &Lease) {
        let Relay::Holding { batch, at: next, .. } = &state.relays[n] else {
            return;
        };
        let failed_row = batch[*next].0;
        let failed: Vec<(usize, Lease)> = if self.plant == Some(Plant::BatchWideDeadLetter) {
            let mut rows = vec![(failed_row, lease.clone())];
            rows.extend(batch[*next + 1..].iter().cloned());
            rows
        } else {
            vec![(failed_row, lease.clone())]
        };
        self.advance(state, n, failed.len());
        let now = self.clock(state, n);
        for (i, lease) in failed {
            if i != failed_row {
                state.failed_by_another = true;
            }
            let (to, due) = decode::failed_as(&lease, at(now), &self.retry());
            let to =
                if self.plant == Some(Plant::BatchWideDeadLetter) { RowState::Dead } else { to };
            let row = &mut state.rows[i];
            if self.holds(row, &lease) {
                if row.state == RowState::Delivered {
                    state.delivered_changed = true;
                }
                row.state = to;
                row.due = due / 1_000_000;
            }
        }
    }

    /// Relay `n` marks its published row delivered, fenced; `decode::mark` reads what the
    /// statement changed.
    fn mark(&self, state: &mut State, n: usize) -> Option<()> {
        let Relay::Holding { batch, at: next, .. } = &state.relays[n] else {
            return None;
        };
        let (i, lease) = batch.get(*next)?.clone();
        self.advance(state, n, 1);
        let row = &mut state.rows[i];
        let changed = u64::from(self.holds(row, &lease));
        if decode::mark(changed) == Mark::Applied {
            row.state = RowState::Delivered;
        }
        Some(())
    }
}

impl Model for Outbox {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let rows = (0..self.rows)
            .map(|i| Row {
                state: RowState::Pending,
                attempts: 0,
                tried: 0,
                token: 0,
                due: 0,
                lease_until: 0,
                poison: i == 0,
            })
            .collect();
        vec![State {
            now: 0,
            rows,
            relays: vec![Relay::Idle; self.relays],
            crashes: 0,
            hiccups: 0,
            applied: vec![0; self.rows],
            seen: 0,
            delivered_changed: false,
            failed_by_another: false,
            given_up_early: false,
            stepped: 0,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (n, relay) in state.relays.iter().enumerate() {
            let any_due = state.rows.iter().any(|r| self.due(r, self.clock(state, n)));
            match relay {
                Relay::Idle if any_due => actions.push(Action::Claim(n)),
                Relay::Idle => {}
                Relay::Holding { published: false, .. } => {
                    actions.push(Action::Publish(n));
                    let next_is_poison = match relay {
                        Relay::Holding { batch, at, .. } => {
                            batch.get(*at).is_some_and(|(i, _)| state.rows[*i].poison)
                        }
                        Relay::Idle => false,
                    };
                    if state.hiccups < self.hiccups && !next_is_poison {
                        actions.push(Action::Hiccup(n));
                    }
                }
                Relay::Holding { published: true, .. } => actions.push(Action::Mark(n)),
            }
            if !matches!(relay, Relay::Idle) && state.crashes < self.crashes {
                actions.push(Action::Crash(n));
            }
        }
        // Time passes only while a row waits for it: a pending row not yet due, a lease
        // not yet lapsed. So every run ends, and ends with nothing left to do.
        let waiting = state.rows.iter().any(|r| {
            (r.state == RowState::Pending && r.due > state.now)
                || (r.state == RowState::Leased && r.lease_until > state.now)
        });
        if waiting && state.now < self.max_clock {
            actions.push(Action::Tick);
        }
        if self.step && state.stepped == 0 {
            actions.push(Action::Step(1));
            // Back only from a tick past the epoch: the drivers' clock has no tick before it.
            if state.now > 0 {
                actions.push(Action::Step(-1));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Claim(n) => self.claim(&mut state, n),
            Action::Publish(n) => self.publish(&mut state, n, false)?,
            Action::Hiccup(n) => {
                state.hiccups += 1;
                self.publish(&mut state, n, true)?
            }
            Action::Mark(n) => self.mark(&mut state, n)?,
            Action::Crash(n) => {
                state.crashes += 1;
                state.relays[n] = Relay::Idle;
            }
            Action::Tick => state.now += 1,
            Action::Step(by) => state.stepped = by,
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("a message is applied at most once", |_: &Outbox, s: &State| {
                s.applied.iter().all(|&n| n <= 1)
            }),
            Property::always("no poison row takes another with it", |_: &Outbox, s: &State| {
                !s.failed_by_another
            }),
            Property::always("a delivered row stays delivered", |_: &Outbox, s: &State| {
                !s.delivered_changed
            }),
            Property::always(
                "a row dies only after its last attempt was begun",
                |m: &Outbox, s: &State| {
                    s.rows.iter().all(|r| r.state != RowState::Dead || r.tried >= m.attempts)
                },
            ),
            Property::always(
                "a row is given up unpublished only after its last attempt was begun",
                |_: &Outbox, s: &State| !s.given_up_early,
            ),
            Property::always(
                "no row has more publishes begun than its attempts",
                |m: &Outbox, s: &State| s.rows.iter().all(|r| r.tried <= m.attempts),
            ),
            // Judged where a run ends: within the clock's bound (a run the bound cut short,
            // with a row still waiting for time, is not judged).
            // A message dead after its last attempt is an operator's (`requeue`).
            Property::eventually("every committed message is applied", |m: &Outbox, s: &State| {
                let cut_short = s.now >= m.max_clock;
                let settled = |(r, &n): (&Row, &u8)| {
                    r.poison || n >= 1 || (r.state == RowState::Dead && r.tried >= m.attempts)
                };
                cut_short || s.rows.iter().zip(&s.applied).all(settled)
            }),
        ]
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows: Vec<String> = self
            .rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let kind = if r.poison { "poison " } else { "" };
                format!(
                    "{kind}m{i} {:?} token {} attempts {} tried {}",
                    r.state, r.token, r.attempts, r.tried
                )
            })
            .collect();
        let relays: Vec<String> = self
            .relays
            .iter()
            .map(|r| match r {
                Relay::Idle => "idle".to_owned(),
                Relay::Holding { batch, at, published, .. } => {
                    let ids: Vec<String> =
                        batch.iter().map(|(i, l)| format!("m{i}@{}", l.token)).collect();
                    let what = if *published { "marking" } else { "publishing" };
                    format!("{what} #{at} of [{}]", ids.join(" "))
                }
            })
            .collect();
        write!(
            f,
            "t={}{} rows [{}]; relays [{}]; applied {:?}",
            self.now,
            match self.stepped {
                1 => " (relay 0 a tick ahead)",
                -1 => " (relay 0 a tick behind)",
                _ => "",
            },
            rows.join(", "),
            relays.join(", "),
            self.applied
        )
    }
}

/// The bounded model, with `plant`: `deep` sets larger bounds.
pub fn outbox(plant: Option<Plant>, deep: bool) -> Outbox {
    Outbox {
        rows: if deep { 3 } else { 2 },
        relays: 2,
        crashes: if deep { 2 } else { 1 },
        hiccups: if deep { 1 } else { 2 },
        batch: 2,
        lease: 2,
        attempts: 2,
        max_clock: 12,
        skew: if deep { 0 } else { 1 },
        step: !deep,
        plant,
    }
}

/// Checks the outbox with `plant`.
pub fn check_planted(plant: Option<Plant>, deep: bool) -> Checked {
    check(outbox(plant, deep), "the outbox relay and an inbox consumer")
}
