//! The claim protocol of one key across processes, over the decision code the MySQL
//! drivers run (`idemcache_sql::records::mysql_claim`).
//!
//! What is modelled: processes that mint a token, look at the key's record and do what
//! [`after_look`] decides (take a new key, take a dead record over, turn a lapsed lease
//! UNKNOWN, or answer), then execute, renew their lease, complete or release the key,
//! and crash at any step; in the one-commit mode the claim inserts its own row first and
//! its look finds it (the one-commit claim's `TAKE_NEW_OR_LOCK`); the server's clock
//! advancing past leases, and stepping back a tick once; the two lapse policies; an
//! effect inside the completion's transaction (one commit) or outside it (before the
//! completion), where a handler told `took_over` asks the authority first whether an
//! earlier execution had it; two reconcilers that check a record UNKNOWN to them (marked,
//! or a lapse `MarkUnknown` reads so) against the authority and settle it, fenced by the
//! token of the execution they checked (`idemcache::store::reconcile`); each process's
//! hot tier (`Tiered`'s cache), asked before the store, filled once a completion
//! committed or a claim read a committed record, lost with the process; a purge deleting
//! the record once it expired, as the drivers' `PURGE` selects it; each client's attempt
//! checked against [`ClaimOrReturn`] at its linearization point (`State::answer`).
//! What the model writes itself is what SQL does in the drivers: the `live`/`lapsed`
//! columns the look computes, and the fenced writes (a completion, renewal or release
//! changes the record only while it holds the process's token and a live lease, as
//! their `WHERE` says). Invariant of this file: every decision a claim makes comes from
//! [`after_look`], unchanged unless a [`Plant`] is named, and each plant stands for a
//! defect of that decision (or of its input, or of a handler) that a property must
//! catch.
//!
//! The properties ([`Protocol::properties`]): an effect inside the transaction happens
//! at most once; an effect outside it at most once under `MarkUnknown`, and under
//! `TakeOver` twice only where a live holder's lease lapsed or a lapse outlived its
//! window; the tokens a key's record holds only grow; a replay returns what committed; a
//! live lease is never taken over; a reconcile verdict settles only the execution it
//! names; a claim waits only on a live lease; the hot tier replays only what the store
//! committed; claim-or-return is linearizable (the clients' operations against
//! [`ClaimOrReturn`], the sequential specification the real runs' histories are checked
//! against too).

use idemcache::store::StoreClaim;
use idemcache::Fingerprint;
use idemcache_sql::records::decode::{ClaimRow, COMPLETED, PROCESSING, UNKNOWN};
use idemcache_sql::records::mysql_claim::{after_look, Next};
use std::fmt;

use stateright::semantics::SequentialSpec;
use stateright::{Model, Property};

use crate::history::spec::{ClaimOrReturn, Mode, Op, Ret};

use crate::{check, Checked};

/// The key every process claims (its stored form).
const KEY: &[u8] = b"k";
/// The request every process sends: each is a retry of one intent.
const REQUEST: Fingerprint = Fingerprint::from_u128(7);
/// How long a completed or UNKNOWN record is kept, in ticks: beyond the model's clock.
const KEPT: i64 = 1_000;
/// How long a lapsed lease stays UNKNOWN under `MarkUnknown`, in ticks.
const LAPSE_TTL: i64 = 1_000;

/// What a lapsed lease becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lapse {
    /// Taken over by the next claim (`LapsePolicy::TakeOver`).
    TakeOver,
    /// Turned UNKNOWN (`LapsePolicy::MarkUnknown`).
    MarkUnknown,
}

/// Where the business effect happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Effect {
    /// In the completion's transaction (the one-commit mode): both or neither.
    Inside,
    /// Before the completion, outside any transaction of the store's.
    Outside,
}

/// A defect planted in the decision (or its input), for a property to catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plant {
    /// A takeover writes the claim's own token without minting again when the dead
    /// record's is higher: a token reused after a clock step or a slow mint.
    TakeoverWithoutMint,
    /// A live lease read as dead: the unbounded takeover, a process whose key is still
    /// being executed taken over.
    LiveLeaseTakenOver,
    /// A lapse under `MarkUnknown` taken over instead of turned UNKNOWN.
    LapseTakenOver,
    /// A record being executed answered as completed: the hot tier replaying what the
    /// store did not commit.
    InProgressReplayed,
    /// A reconciler's verdict applied to whatever UNKNOWN record the key holds, not only
    /// the execution it checked (`resolve`/`forget` with no execution named): the stale
    /// verdict settling a later execution.
    StaleVerdict,
    /// A completion changes the record whichever execution holds it (no token in its
    /// `WHERE`): a stale owner's result written over a later execution's claim.
    CompletionUnfenced,
    /// A lease read as live after its end: a crashed holder's key never free again.
    LapsedLeaseHeld,
    /// The hot tier filled before the store's completion committed (a completion the
    /// store then refuses stays cached).
    CachedBeforeCommit,
    /// A purge deleting a lapsed lease still within its window (its UNKNOWN window under
    /// `MarkUnknown`; as long as it was held under `TakeOver`, where the SQL stores' purge
    /// shipped without one): the next claim runs the intent again, not told `took_over`.
    PurgeTakesALapse,
    /// A completed record read as UNKNOWN (its state decoded wrong): a claim after the
    /// commit answered "outcome unknown", which no order of the claims gives.
    CompletedReadUnknown,
    /// The handler ignores `took_over`: an execution that took a lapsed lease over has
    /// its effect without asking whether the earlier execution's happened.
    TookOverIgnored,
    /// The handler told `took_over` asks only when about to have its effect, and may
    /// give the key up before: the release erases the takeover, and the next claim is a
    /// first execution.
    TookOverAskedLate,
    /// A release deletes the key's record whichever execution holds it (no token in its
    /// `WHERE`): a stale owner's release of a later execution's record.
    ReleaseUnfenced,
}

impl Plant {
    /// Every plant.
    pub const ALL: [Plant; 13] = [
        Plant::TakeoverWithoutMint,
        Plant::LiveLeaseTakenOver,
        Plant::LapseTakenOver,
        Plant::InProgressReplayed,
        Plant::StaleVerdict,
        Plant::CompletionUnfenced,
        Plant::LapsedLeaseHeld,
        Plant::CachedBeforeCommit,
        Plant::PurgeTakesALapse,
        Plant::CompletedReadUnknown,
        Plant::TookOverIgnored,
        Plant::TookOverAskedLate,
        Plant::ReleaseUnfenced,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Plant::TakeoverWithoutMint => "takeover-without-mint",
            Plant::LiveLeaseTakenOver => "live-lease-taken-over",
            Plant::LapseTakenOver => "lapse-taken-over",
            Plant::InProgressReplayed => "in-progress-replayed",
            Plant::StaleVerdict => "stale-verdict",
            Plant::CompletionUnfenced => "completion-unfenced",
            Plant::LapsedLeaseHeld => "lapsed-lease-held",
            Plant::CachedBeforeCommit => "cached-before-commit",
            Plant::PurgeTakesALapse => "purge-takes-a-lapse",
            Plant::CompletedReadUnknown => "completed-read-unknown",
            Plant::TookOverIgnored => "took-over-ignored",
            Plant::TookOverAskedLate => "took-over-asked-late",
            Plant::ReleaseUnfenced => "release-unfenced",
        }
    }

    /// The plant named `name`.
    pub fn named(name: &str) -> Option<Plant> {
        Plant::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The configuration that shows it: the policy and effect under which its property
    /// is promised.
    pub fn shown_by(self) -> (Lapse, Effect) {
        match self {
            Plant::TakeoverWithoutMint => (Lapse::TakeOver, Effect::Inside),
            Plant::LiveLeaseTakenOver => (Lapse::TakeOver, Effect::Inside),
            Plant::LapseTakenOver => (Lapse::MarkUnknown, Effect::Outside),
            Plant::InProgressReplayed => (Lapse::TakeOver, Effect::Inside),
            Plant::StaleVerdict => (Lapse::MarkUnknown, Effect::Outside),
            Plant::CompletionUnfenced => (Lapse::TakeOver, Effect::Inside),
            Plant::LapsedLeaseHeld => (Lapse::TakeOver, Effect::Inside),
            Plant::CachedBeforeCommit => (Lapse::TakeOver, Effect::Inside),
            Plant::PurgeTakesALapse => (Lapse::MarkUnknown, Effect::Outside),
            Plant::CompletedReadUnknown => (Lapse::TakeOver, Effect::Inside),
            Plant::TookOverIgnored => (Lapse::TakeOver, Effect::Outside),
            Plant::TookOverAskedLate => (Lapse::TakeOver, Effect::Outside),
            Plant::ReleaseUnfenced => (Lapse::TakeOver, Effect::Outside),
        }
    }
}

/// The key's record, as its row holds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Row {
    /// PROCESSING, COMPLETED or UNKNOWN.
    pub state: i16,
    /// The token of the claim that wrote it.
    pub token: i64,
    /// What a completion stored: the token of the execution whose effect it is.
    pub body: Option<i64>,
    /// The lease's end while PROCESSING, the record's expiry after.
    pub expires_at: i64,
    /// When it was completed or marked UNKNOWN.
    pub settled_at: Option<i64>,
}

/// A process: one client's execution of the intent, retried until answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Proc {
    /// Not claiming (new, restarted after a crash, or told to retry later).
    Idle,
    /// Minted `token` and is about to look at the record.
    Minted(i64),
    /// Holds the key under `token`: executing.
    Holding(i64),
    /// Its effect (outside) happened; completing under `token`.
    Effected(i64),
    /// Answered: the execution's result, or a replay of it.
    Answered,
}

/// One step of the system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Process `n` mints a token.
    Mint(usize),
    /// Process `n` looks at the record and does what the decision says.
    Look(usize),
    /// Process `n`, holding the key, has its effect (outside the transaction).
    Effect(usize),
    /// Process `n` completes: with its effect in the transaction (inside), or after it.
    Complete(usize),
    /// Process `n`, holding the key, renews its lease, fenced by its token.
    Renew(usize),
    /// Process `n`, holding the key before any effect, gives it up (its handler failed;
    /// inside, its transaction rolled back), fenced by its token: the key is free.
    Release(usize),
    /// Process `n` crashes and restarts with nothing.
    Crash(usize),
    /// Reconciler `r` reads the UNKNOWN record and checks the authority: did that
    /// execution's effect happen?
    Check(usize),
    /// Reconciler `r` applies its verdict: resolve (it happened) or forget (it did not),
    /// fenced by the token of the execution it checked.
    Settle(usize),
    /// A purge deletes the record: expired, and not a lapse still to be turned UNKNOWN.
    Purge,
    /// The server's clock advances one tick.
    Tick,
    /// The server's clock steps back a tick (once): an NTP step.
    StepBack,
}

/// The system's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The server's clock, in ticks.
    pub now: i64,
    /// The key's record.
    pub row: Option<Row>,
    /// The last token minted (the sequence all claims draw from).
    pub minted: i64,
    /// The processes.
    pub procs: Vec<Proc>,
    /// Crashes so far.
    pub crashes: u8,
    /// Renewals and releases so far.
    pub renewals: u8,
    /// Releases so far.
    pub releases: u8,
    /// Claims begun so far (each mints a token): bounded, so the tokens are.
    pub claims: u8,
    /// Effects that happened (and, inside, committed).
    pub effects: u8,
    /// The token of the execution whose completion committed, if one did.
    pub committed: Option<i64>,
    /// A write put a token at or below the one it replaced.
    pub token_went_down: bool,
    /// The highest token the key's record ever held.
    pub highest: i64,
    /// A claim was answered with a replay of something other than what committed.
    pub replayed_wrong: bool,
    /// A claim took over a record whose lease had not run out.
    pub live_taken_over: bool,
    /// A claim was answered in progress while no live lease held the key.
    pub held_without_lease: bool,
    /// Purges that deleted the record.
    pub purges: u8,
    /// Each process's hot tier: the result it holds of the key, if any.
    pub cached: Vec<Option<i64>>,
    /// The hot tier replayed a result the store had not committed.
    pub cache_replayed_uncommitted: bool,
    /// The tokens whose execution's effect happened (bit `token`).
    pub effected: u64,
    /// Each reconciler's verdict in hand: the execution it checked, and whether its
    /// effect happened.
    pub verdicts: [Option<(i64, bool)>; 2],
    /// Checks the reconciler made.
    pub checks: u8,
    /// A verdict settled an execution other than the one it checked.
    pub settled_wrong: bool,
    /// Each process's `took_over` answer: the token of the execution whose lapsed lease
    /// its claim took over, while it holds the key.
    pub took_over: Vec<Option<i64>>,
    /// Each process's open one-commit transaction: the key's row before its claim wrote.
    pub undo: Vec<Option<Option<Row>>>,
    /// A claim took over the lease of an execution whose process still lives, its
    /// effect not yet had: the one case the docs allow an outside effect twice.
    pub live_holder_taken_over: bool,
    /// A purge deleted a lapsed lease past its window: the next claim is a new
    /// execution, not told `took_over` (dedup ends there, as with a result past its TTL).
    pub lapse_purged: bool,
    /// Whether the server's clock stepped back.
    pub stepped_back: bool,
    /// Claim-or-return's sequential specification, stepped at each operation's
    /// linearization point (see `State::answer`).
    pub spec: ClaimOrReturn,
    /// The first answer no linearization allows, with the process given it.
    pub not_linearizable: Option<(usize, Ret)>,
}

/// The model: its bounds and configuration.
#[derive(Debug, Clone)]
pub struct Protocol {
    /// Processes.
    pub procs: usize,
    /// Crashes at most.
    pub crashes: u8,
    /// Lease renewals at most.
    pub renewals: u8,
    /// Releases at most.
    pub releases: u8,
    /// Reconcilers (at most 2), each checking and settling in its own steps.
    pub reconcilers: usize,
    /// Reconciler checks at most, all reconcilers together.
    pub checks: u8,
    /// The token property judged against every token the key's record ever held, a
    /// deleted record's too, rather than the record a write replaces. Off in every
    /// configuration checked: a claim that minted its token before a later execution's
    /// record was forgotten or purged inserts a lower one (see the test that keeps it).
    pub tokens_across_deletes: bool,
    /// The reconciler may check a record whose owner still acts (stalled past its
    /// lease, then resuming). Off in every configuration checked; on, an effect outside
    /// the transaction can happen twice unless the provider keeps the downstream key.
    pub checks_a_stalled_owner: bool,
    /// Claims at most (first attempts and retries of every process together).
    pub claims: u8,
    /// Purges that delete the record, at most.
    pub purges: u8,
    /// The clock's last tick.
    pub max_clock: i64,
    /// Whether the server's clock may step back a tick, once, at any moment.
    pub step_back: bool,
    /// A claim's lease, in ticks.
    pub lease: i64,
    /// What a lapsed lease becomes.
    pub lapse: Lapse,
    /// Where the effect happens.
    pub effect: Effect,
    /// A planted defect, if any.
    pub plant: Option<Plant>,
}

impl Protocol {
    /// The row as the claim's look reads it: `live` and `lapsed` as the look's SQL
    /// computes them against the server's clock.
    fn look(&self, row: &Row, now: i64) -> ClaimRow {
        let mut live = row.expires_at > now;
        if self.plant == Some(Plant::LiveLeaseTakenOver) && row.state == PROCESSING {
            live = false;
        }
        if self.plant == Some(Plant::LapsedLeaseHeld) && row.state == PROCESSING {
            live = true;
        }
        let lapsed = self.lapse == Lapse::MarkUnknown
            && row.state == PROCESSING
            && !live
            && now < row.expires_at + LAPSE_TTL
            && self.plant != Some(Plant::LapseTakenOver);
        let state = match (self.plant, row.state) {
            (Some(Plant::InProgressReplayed), PROCESSING) if live => COMPLETED,
            (Some(Plant::CompletedReadUnknown), COMPLETED) => UNKNOWN,
            (_, state) => state,
        };
        ClaimRow {
            state,
            token: row.token,
            fingerprint: Some(REQUEST.to_bytes().to_vec()),
            body: row.body.map(|b| b.to_be_bytes().to_vec()),
            settled_at: row.settled_at,
            expires_at: row.expires_at,
            live,
            lapsed,
            took_over: false,
        }
    }

    /// Writes `row` in `state` (every write of the record goes through here), noting a
    /// token below the record's it replaces, or a claim's not above it; or, with
    /// `tokens_across_deletes`, below (not above) the highest the key's record ever held,
    /// a forgotten or purged one's included.
    fn write(&self, state: &mut State, row: Row) {
        let claimed = row.state == PROCESSING;
        let floor = match &state.row {
            _ if self.tokens_across_deletes => Some(state.highest),
            Some(old) => Some(old.token),
            None => None,
        };
        if floor.is_some_and(|f| row.token < f || (claimed && row.token == f)) {
            state.token_went_down = true;
        }
        state.highest = state.highest.max(row.token);
        state.row = Some(row);
    }

    /// Process `n`, having minted `token`, looks and acts on the decision. In the
    /// one-commit mode (the effect inside) the claim is the one-commit claim: its
    /// `TAKE_NEW_OR_LOCK` inserts the key's row under its token if there is none, so its
    /// look finds its own insert; the store's own claim (the effect outside) looks first.
    fn look_and_act(&self, state: &mut State, n: usize, token: i64) {
        let now = state.now;
        // The one-commit claim's transaction holds its writes until the completion: a
        // crash or a failed handler rolls the key's row back to this.
        let before = state.row.clone();
        if self.effect == Effect::Inside && state.row.is_none() {
            self.write(state, self.held(token, now));
        }
        let seen = state.row.as_ref().map(|row| self.look(row, now));
        let decided = match after_look(KEY, REQUEST, token, seen.as_ref()) {
            Ok(next) => next,
            // A row the model wrote is always readable: a Corrupt here is a defect.
            Err(_) => {
                state.replayed_wrong = true;
                return;
            }
        };
        let answered = |state: &mut State, ret: Ret| state.answer(n, ret);
        let next = match decided {
            Next::TakeNew => {
                self.write(state, self.held(token, now));
                Proc::Holding(token)
            }
            Next::TakeOver { held: dead, mint, took_over } => {
                if state.row.as_ref().map(|r| r.token) != Some(dead) {
                    return; // the driver's fenced write changed nothing: it looks again
                }
                if state.row.as_ref().is_some_and(|r| r.state == PROCESSING && r.expires_at > now) {
                    state.live_taken_over = true;
                }
                let mint = mint && self.plant != Some(Plant::TakeoverWithoutMint);
                let token = if mint {
                    state.minted += 1;
                    state.minted
                } else {
                    token
                };
                if took_over && state.procs.contains(&Proc::Holding(dead)) {
                    state.live_holder_taken_over = true;
                }
                state.took_over[n] = took_over.then_some(dead);
                self.write(state, self.held(token, now));
                // The handler told `took_over` asks the authority, by the key, whether an
                // earlier execution had the effect, first, before anything it might give
                // up (docs/durable-tiers.md), and adopts the effect if so: completing is
                // what is left.
                let asks_first = took_over
                    && self.effect == Effect::Outside
                    && !matches!(
                        self.plant,
                        Some(Plant::TookOverIgnored | Plant::TookOverAskedLate)
                    );
                if asks_first && state.effected != 0 {
                    state.effected |= bit(token);
                    Proc::Effected(token)
                } else {
                    Proc::Holding(token)
                }
            }
            Next::TurnUnknown { held: dead, .. } => {
                if let Some(row) = state.row.as_mut().filter(|r| r.token == dead) {
                    row.state = UNKNOWN;
                    row.settled_at = Some(row.expires_at);
                    row.expires_at += LAPSE_TTL;
                }
                answered(state, Ret::Unknown);
                Proc::Idle
            }
            Next::Answer(StoreClaim::Completed(replay)) => {
                let body = replay.body.as_deref().and_then(|b| <[u8; 8]>::try_from(b).ok());
                let replayed = body.map(i64::from_be_bytes);
                if state.committed.is_none() || replayed != state.committed {
                    state.replayed_wrong = true;
                }
                // Read through: the hot tier keeps what the store answered committed.
                state.cached[n] = replayed;
                answered(state, Ret::Replayed(replayed.unwrap_or(-1)));
                Proc::Answered
            }
            // The one-commit claim's own insert: acquired, nothing taken over.
            Next::Answer(StoreClaim::Acquired { .. }) => {
                state.took_over[n] = None;
                Proc::Holding(token)
            }
            Next::Answer(StoreClaim::InProgress { .. }) => {
                // Another execution's live lease: never the claim's own insert.
                let leased = state.row.as_ref().is_some_and(|r| {
                    r.state == PROCESSING && r.expires_at > now && r.token != token
                });
                if !leased {
                    state.held_without_lease = true;
                }
                answered(state, Ret::InProgress);
                Proc::Idle
            }
            // UNKNOWN (settled by a reconciler, not here): the client retries later.
            Next::Answer(StoreClaim::Unknown { .. }) => {
                answered(state, Ret::Unknown);
                Proc::Idle
            }
            // A mismatch, or an answer no step of the protocol gives here.
            Next::Answer(other) => {
                answered(state, Ret::Refused(format!("{other:?}")));
                Proc::Idle
            }
        };
        let holds = matches!(next, Proc::Holding(_) | Proc::Effected(_));
        state.undo[n] = (self.effect == Effect::Inside && holds).then_some(before);
        state.procs[n] = next;
    }

    /// Process `n`'s one-commit transaction rolls back (its process crashed, or its
    /// handler failed): the key's row is again what it was before the claim, if the
    /// claim's write is still there.
    fn roll_back(&self, state: &mut State, n: usize, token: i64) {
        if let Some(before) = state.undo[n].take() {
            if state.row.as_ref().is_some_and(|r| r.state == PROCESSING && r.token == token) {
                state.row = before;
            }
        }
    }

    /// The key's row as a claim at `now` writes it under `token`: PROCESSING, leased.
    fn held(&self, token: i64, now: i64) -> Row {
        Row { state: PROCESSING, token, body: None, expires_at: now + self.lease, settled_at: None }
    }

    /// The reconciler's verdict on the execution claimed under `token`: applied only while
    /// the key's record is that execution's and still UNKNOWN (`resolve_fenced` and
    /// `forget_fenced`, as `reconcile` calls them), or (the plant) to any UNKNOWN record.
    fn settle(&self, state: &mut State, token: i64, happened: bool) {
        let Some(row) = state.row.as_ref().filter(|r| self.unknown_at(r, state.now)) else {
            return;
        };
        let fenced = self.plant != Some(Plant::StaleVerdict);
        if fenced && row.token != token {
            return; // NothingToSettle: the record moved on since the check
        }
        if row.token != token {
            state.settled_wrong = true;
        }
        let now = state.now;
        if happened {
            // Resolved with the execution's result: a replay answers it from now on. The
            // execution, whose answer nobody saw, is linearized here.
            state.spec.invoke(&Op::Post);
            state.committed = Some(row.token);
            let resolved = Row {
                state: COMPLETED,
                token: row.token,
                body: Some(row.token),
                expires_at: now + KEPT,
                settled_at: Some(now),
            };
            self.write(state, resolved);
        } else {
            // Forgotten: the next claim runs the intent again.
            state.row = None;
        }
    }

    /// Whether `row` is UNKNOWN to a reconciler at `now`, as the drivers' `UNKNOWN`,
    /// `RESOLVE` and `FORGET` select it: UNKNOWN and live, or under `MarkUnknown` a lapse
    /// within the unknown TTL, read as the UNKNOWN it will be.
    fn unknown_at(&self, row: &Row, now: i64) -> bool {
        let lapsed = self.lapse == Lapse::MarkUnknown
            && row.state == PROCESSING
            && row.expires_at <= now
            && row.expires_at + LAPSE_TTL > now;
        (row.state == UNKNOWN && row.expires_at > now) || lapsed
    }

    /// Process `n` renews its lease under `token` (`EXTEND`: its token, PROCESSING, the
    /// lease not yet ended); refused, it goes on, and its completion will be refused.
    /// (No plant stands against this fence: a renewal reviving a lapse nobody read yet,
    /// or extending another execution's lease, breaks no promise by itself.)
    fn renew(&self, state: &mut State, token: i64) {
        let now = state.now;
        if let Some(row) = state.row.as_mut().filter(|r| leased_to(r, token, now)) {
            row.expires_at = now + self.lease;
        }
    }

    /// Process `n` releases the key under `token` (`RELEASE`: its token, PROCESSING, the
    /// lease not yet ended): the record deleted, the next claim a first execution.
    fn release(&self, state: &mut State, token: i64) {
        let now = state.now;
        let unfenced = self.plant == Some(Plant::ReleaseUnfenced);
        let holds = state.row.as_ref().is_some_and(|r| unfenced || leased_to(r, token, now));
        if holds {
            state.row = None;
        }
    }

    /// Whether a purge deletes `row` at `now`, as the drivers' `PURGE` selects: expired,
    /// but not a lapsed lease within its window: the unknown TTL under `MarkUnknown`, and
    /// at least the time the lease was held under either policy, so that a claim after
    /// the lapse still finds the execution it takes over (and says `took_over`).
    fn purgeable(&self, row: &Row, now: i64) -> bool {
        row.expires_at <= now
            && (!self.within_window(row, now) || self.plant == Some(Plant::PurgeTakesALapse))
    }

    /// Whether `row` is a lapsed lease within its window at `now`: the unknown TTL under
    /// `MarkUnknown`, and at least the time the lease was held under either policy.
    fn within_window(&self, row: &Row, now: i64) -> bool {
        let unknown = if self.lapse == Lapse::MarkUnknown { LAPSE_TTL } else { 0 };
        row.state == PROCESSING && row.expires_at + unknown.max(self.lease) > now
    }

    /// Process `n` completes under `token`: fenced by it, as the drivers' statements are.
    fn complete(&self, state: &mut State, n: usize, token: i64) {
        let now = state.now;
        if self.plant == Some(Plant::CachedBeforeCommit) {
            state.cached[n] = Some(token);
        }
        let fenced = self.plant != Some(Plant::CompletionUnfenced);
        // Unfenced, the `WHERE` names no token: whichever execution holds the lease.
        let holds = state
            .row
            .as_ref()
            .is_some_and(|r| leased_to(r, if fenced { token } else { r.token }, now));
        if !holds {
            // Lease lost: the transaction rolls back (inside, the effect with it), and the
            // client is answered an error: its claim is one nobody saw the outcome of.
            state.procs[n] = Proc::Idle;
            state.took_over[n] = None;
            self.roll_back(state, n, token);
            return;
        }
        if self.effect == Effect::Inside {
            state.effects += 1;
        }
        state.committed = Some(token);
        let completed = Row {
            state: COMPLETED,
            token,
            body: Some(token),
            expires_at: now + KEPT,
            settled_at: Some(now),
        };
        self.write(state, completed);
        // Only now, the store's completion committed, does the hot tier keep it.
        state.cached[n] = Some(token);
        state.took_over[n] = None;
        state.undo[n] = None;
        state.procs[n] = Proc::Answered;
        state.answer(n, Ret::Executed(token));
    }
}

impl State {
    /// Process `n`'s claim returns `ret` to its client.
    ///
    /// Each claim is an operation of its client, invoked when it asks its hot tier or
    /// mints, and linearized at the one atomic step that decides its answer (the look,
    /// the completion's commit, the hot tier's read): the specification must allow the
    /// answer there. An execution whose answer nobody saw (its process crashed, or its
    /// completion was refused) is linearized only where it made the key done: at the
    /// reconciler's resolve ([`Ret::Linearized`]), inside its interval, which never
    /// closed. Every answer passing exhibits a linearization, so the history is
    /// linearizable; that is also what the real runs' histories are checked for, with
    /// stateright's `LinearizabilityTester` searching the points instead (too heavy to
    /// carry in every state of the model).
    fn answer(&mut self, n: usize, ret: Ret) {
        if !self.spec.is_valid_step(&Op::Post, &ret) && self.not_linearizable.is_none() {
            self.not_linearizable = Some((n, ret));
        }
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            row: None,
            minted: 0,
            procs: vec![Proc::Idle; self.procs],
            crashes: 0,
            renewals: 0,
            releases: 0,
            claims: 0,
            effects: 0,
            committed: None,
            highest: 0,
            token_went_down: false,
            replayed_wrong: false,
            live_taken_over: false,
            held_without_lease: false,
            purges: 0,
            cached: vec![None; self.procs],
            cache_replayed_uncommitted: false,
            effected: 0,
            verdicts: [None; 2],
            checks: 0,
            settled_wrong: false,
            took_over: vec![None; self.procs],
            undo: vec![None; self.procs],
            live_holder_taken_over: false,
            stepped_back: false,
            lapse_purged: false,
            spec: ClaimOrReturn::new(Mode::Together),
            not_linearizable: None,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (n, proc) in state.procs.iter().enumerate() {
            match proc {
                // Idle, or answered and sent the intent again (another retry of it).
                Proc::Idle | Proc::Answered if state.claims < self.claims => {
                    actions.push(Action::Mint(n))
                }
                Proc::Idle => {}
                Proc::Minted(_) => actions.push(Action::Look(n)),
                Proc::Holding(_) if self.effect == Effect::Outside => {
                    actions.push(Action::Effect(n))
                }
                Proc::Holding(_) | Proc::Effected(_) => actions.push(Action::Complete(n)),
                Proc::Answered => {}
            }
            if let Proc::Holding(_) | Proc::Effected(_) = proc {
                if state.renewals < self.renewals {
                    actions.push(Action::Renew(n));
                }
            }
            if let Proc::Holding(_) = proc {
                if state.releases < self.releases {
                    actions.push(Action::Release(n));
                }
            }
            let crashable = !matches!(proc, Proc::Idle | Proc::Answered);
            if crashable && state.crashes < self.crashes {
                actions.push(Action::Crash(n));
            }
        }
        let unknown = state.row.as_ref().is_some_and(|r| self.unknown_at(r, state.now));
        // An assumption, not something `reconcile` enforces: the record is checked once
        // its owner (dead or done) no longer acts. `checks_a_stalled_owner` drops it.
        let owner_acts = state.row.as_ref().is_some_and(|r| {
            !self.checks_a_stalled_owner && state.procs.contains(&Proc::Holding(r.token))
        });
        for (r, verdict) in state.verdicts.iter().enumerate().take(self.reconcilers) {
            match verdict {
                None if unknown && !owner_acts && state.checks < self.checks => {
                    actions.push(Action::Check(r))
                }
                None => {}
                Some(_) => actions.push(Action::Settle(r)),
            }
        }
        if state.purges < self.purges
            && state.row.as_ref().is_some_and(|r| self.purgeable(r, state.now))
        {
            actions.push(Action::Purge);
        }
        if state.now < self.max_clock {
            actions.push(Action::Tick);
        }
        if self.step_back && !state.stepped_back && state.now > 0 {
            actions.push(Action::StepBack);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Mint(n) => {
                state.claims += 1;
                // `Tiered` asks its hot tier first: a result there is answered from memory.
                if let Some(body) = state.cached[n] {
                    if state.committed != Some(body) {
                        state.cache_replayed_uncommitted = true;
                    }
                    state.procs[n] = Proc::Answered;
                    state.answer(n, Ret::Replayed(body));
                    return Some(state);
                }
                state.minted += 1;
                state.procs[n] = Proc::Minted(state.minted);
            }
            Action::Look(n) => {
                let Proc::Minted(token) = state.procs[n] else { return None };
                self.look_and_act(&mut state, n, token);
            }
            Action::Effect(n) => {
                let Proc::Holding(token) = state.procs[n] else { return None };
                // Under the plant, the handler asks only now, about to have its effect.
                let asks_late =
                    state.took_over[n].is_some() && self.plant == Some(Plant::TookOverAskedLate);
                let adopted = asks_late && state.effected != 0;
                if !adopted {
                    state.effects += 1;
                }
                state.effected |= bit(token);
                state.procs[n] = Proc::Effected(token);
            }
            Action::Complete(n) => {
                let (Proc::Holding(token) | Proc::Effected(token)) = state.procs[n] else {
                    return None;
                };
                self.complete(&mut state, n, token);
            }
            Action::Renew(n) => {
                let (Proc::Holding(token) | Proc::Effected(token)) = state.procs[n] else {
                    return None;
                };
                state.renewals += 1;
                self.renew(&mut state, token);
            }
            Action::Release(n) => {
                let Proc::Holding(token) = state.procs[n] else { return None };
                state.releases += 1;
                if self.effect == Effect::Inside {
                    // The handler failed: its transaction, the claim in it, rolls back.
                    self.roll_back(&mut state, n, token);
                } else {
                    self.release(&mut state, token);
                }
                // The client is answered an error: an outcome it cannot read.
                state.procs[n] = Proc::Idle;
                state.took_over[n] = None;
            }
            Action::Crash(n) => {
                state.crashes += 1;
                if let Proc::Holding(token) | Proc::Effected(token) = state.procs[n] {
                    self.roll_back(&mut state, n, token);
                }
                state.procs[n] = Proc::Idle;
                state.cached[n] = None;
                state.took_over[n] = None;
            }
            Action::Check(r) => {
                let token = state.row.as_ref()?.token;
                state.checks += 1;
                state.verdicts[r] = Some((token, state.effected & bit(token) != 0));
            }
            Action::Settle(r) => {
                let (token, happened) = state.verdicts[r].take()?;
                self.settle(&mut state, token, happened);
            }
            Action::Purge => {
                state.purges += 1;
                let row = state.row.take()?;
                if row.state == PROCESSING && !self.within_window(&row, state.now) {
                    state.lapse_purged = true;
                }
            }
            Action::Tick => state.now += 1,
            Action::StepBack => {
                state.stepped_back = true;
                state.now -= 1;
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "an effect inside the transaction happens at most once",
                |m: &Protocol, s: &State| m.effect != Effect::Inside || s.effects <= 1,
            ),
            Property::always(
                "an effect outside it at most once under MarkUnknown",
                |m: &Protocol, s: &State| {
                    m.effect != Effect::Outside || m.lapse != Lapse::MarkUnknown || s.effects <= 1
                },
            ),
            // Under `TakeOver` the docs allow a second effect only where a lease lapsed
            // while its holder lived on to have its effect, or where the lapsed lease was
            // kept past its window and purged (as a result is, past its TTL): a crashed
            // holder's effect is found by the handler `took_over` tells to ask.
            Property::always(
                "an effect outside it twice under TakeOver only where a live holder lapsed or a lapse was purged",
                |m: &Protocol, s: &State| {
                    m.effect != Effect::Outside
                        || m.lapse != Lapse::TakeOver
                        || s.effects <= 1
                        || s.live_holder_taken_over
                        || s.lapse_purged
                },
            ),
            Property::always("claim-or-return is linearizable", |_: &Protocol, s: &State| {
                s.not_linearizable.is_none()
            }),
            Property::always("a key's tokens only grow", |_: &Protocol, s: &State| {
                !s.token_went_down
            }),
            Property::always("a replay returns what committed", |_: &Protocol, s: &State| {
                !s.replayed_wrong
            }),
            Property::always(
                "a reconcile verdict settles only the execution it names",
                |_: &Protocol, s: &State| !s.settled_wrong,
            ),
            Property::always("a live lease is never taken over", |_: &Protocol, s: &State| {
                !s.live_taken_over
            }),
            // The liveness the docs promise, as the safety it comes to at each claim: a
            // key whose holder crashed is free again once its lease ends.
            Property::always("a claim waits only on a live lease", |_: &Protocol, s: &State| {
                !s.held_without_lease
            }),
            Property::always(
                "the hot tier replays only what the store committed",
                |_: &Protocol, s: &State| !s.cache_replayed_uncommitted,
            ),
        ]
    }
}

/// The configurations a run checks: each lapse policy with each effect.
pub fn configurations() -> Vec<(Lapse, Effect)> {
    vec![
        (Lapse::TakeOver, Effect::Inside),
        (Lapse::TakeOver, Effect::Outside),
        (Lapse::MarkUnknown, Effect::Inside),
        (Lapse::MarkUnknown, Effect::Outside),
    ]
}

/// The bounded model of `lapse` and `effect`, with `plant`: `deep` sets larger bounds
/// (more processes, crashes, claims, checks and ticks).
pub fn protocol(lapse: Lapse, effect: Effect, plant: Option<Plant>, deep: bool) -> Protocol {
    Protocol {
        procs: if deep { 3 } else { 2 },
        crashes: if deep { 2 } else { 1 },
        renewals: 1,
        releases: 1,
        claims: if deep { 6 } else { 4 },
        purges: 1,
        reconcilers: 2,
        checks: if deep { 3 } else { 2 },
        checks_a_stalled_owner: false,
        tokens_across_deletes: false,
        max_clock: if deep { 5 } else { 4 },
        step_back: true,
        lease: 2,
        lapse,
        effect,
        plant,
    }
}

/// Whether `row` is still held under `token` by a lease live at `now`: the `WHERE` of
/// the drivers' fenced writes of a claim (`COMPLETE`, `EXTEND`, `RELEASE`).
fn leased_to(row: &Row, token: i64, now: i64) -> bool {
    row.state == PROCESSING && row.token == token && row.expires_at > now
}

/// Bit `token` of a set of tokens.
fn bit(token: i64) -> u64 {
    u32::try_from(token).ok().and_then(|t| 1u64.checked_shl(t)).unwrap_or(0)
}

/// A state as a trace line: the clock, the row, the processes, what happened.
impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self;
        let row = match &state.row {
            None => "no record".to_owned(),
            Some(r) => {
                let name = match r.state {
                    PROCESSING => "PROCESSING",
                    COMPLETED => "COMPLETED",
                    UNKNOWN => "UNKNOWN",
                    _ => "?",
                };
                format!("{name} token {} until {}", r.token, r.expires_at)
            }
        };
        write!(
            f,
            "t={} record: {row}; processes {:?}; hot tiers {:?}; effects {}; committed {:?}",
            state.now, state.procs, state.cached, state.effects, state.committed
        )?;
        match &state.not_linearizable {
            Some((n, ret)) => write!(f, "; process {n} answered {ret:?}, which no order allows"),
            None => Ok(()),
        }
    }
}

/// Checks every configuration: the unique states explored, and what was violated.
pub fn check_all(deep: bool) -> Checked {
    let mut all = Checked { states: 0, violated: Vec::new() };
    for (lapse, effect) in configurations() {
        let checked = check_planted(lapse, effect, None, deep);
        all.states += checked.states;
        all.violated.extend(checked.violated);
    }
    all
}

/// Checks `lapse` and `effect` with `plant`.
pub fn check_planted(lapse: Lapse, effect: Effect, plant: Option<Plant>, deep: bool) -> Checked {
    let described = format!("{lapse:?} lapse, effect {effect:?}");
    check(protocol(lapse, effect, plant, deep), &described)
}
