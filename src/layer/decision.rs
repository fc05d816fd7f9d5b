//! [`Decision`]: what the layer decided for one guarded request, and [`DecisionEvent`],
//! how it is reported: to the hook ([`IdempotencyLayer::on_decision`]), as a `tracing`
//! event (feature `tracing`) and as metrics (feature `metrics`).
//!
//! Invariant: every guarded request that reaches its claim is reported exactly once,
//! with its final decision: a request that executed is reported when its claim is
//! settled (recorded, released, marked UNKNOWN or lost), never at the claim as well,
//! so the decisions of a run add up to its requests. Requests refused before their
//! claim (no key, a malformed one, no tenant, a body too large) are not reported: they
//! never reached the records. A hook that panics is caught: the request is answered as
//! if it had returned.
//!
//! [`IdempotencyLayer::on_decision`]: super::IdempotencyLayer::on_decision

use std::fmt;
use std::time::Duration;

use crate::{CorrelationId, Key};

/// What the layer decided for one guarded request (see [`DecisionEvent`]).
///
/// The names are the `decision` label of the `idemcache_decisions_total` counter
/// (feature `metrics`) and of the `tracing` events: [`as_str`](Decision::as_str).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Decision {
    /// `acquired`: the request held its key and executed, and its response was stored
    /// (or recorded in the handler's transaction): repeats replay it.
    Acquired,
    /// `replayed`: a stored response was replayed; nothing executed.
    Replayed,
    /// `replayed_after_wait`: as `replayed`, once the duplicate it waited for
    /// ([`wait`](super::IdempotencyLayer::wait)) finished.
    ReplayedAfterWait,
    /// `in_progress`: refused with 409 while another request with the key executes
    /// (after waiting, if the layer waits), or its client gone while it waited.
    InProgress,
    /// `mismatch`: refused with 422, the key used for a different request.
    Mismatch,
    /// `unknown`: refused with 409, an earlier execution's outcome unknown; nothing ran.
    Unknown,
    /// `marked_unknown`: executed, and its outcome marked unknown: its response carried
    /// [`OutcomeUnknown`](super::OutcomeUnknown), its body failed mid-way, or it
    /// panicked under [`DropPolicy::MarkUnknown`](crate::DropPolicy::MarkUnknown).
    /// Repeats are refused until a reconciler settles it.
    MarkedUnknown,
    /// `released`: executed, and its key released so a retry runs again: a response not
    /// stored (5xx by default), an error from the service, a panic (under the
    /// default [`DropPolicy`](crate::DropPolicy)), or a handler that recorded its response
    /// in its own transaction (`InTransaction`) and rolled it back.
    Released,
    /// `lease_lost`: executed past its lease and the key moved on; its response was
    /// answered but not recorded.
    LeaseLost,
    /// `capacity_refused`: refused with 503, the cache full of in-flight work.
    CapacityRefused,
    /// `store_error`: the records failed the request, and nothing it did stands: the
    /// store unreachable (503) or a record unreadable (500) before it ran, settings the
    /// backend refuses, or a one-commit transaction that did not commit (503: what the
    /// handler wrote rolled back).
    StoreError,
    /// `not_settled`: executed and answered, but the store failed to settle its claim as
    /// the answer said (record the response, release the key, or mark it unknown). After
    /// a failed recording the layer marks the record UNKNOWN if the store takes that
    /// mark; otherwise the record stays PROCESSING until its lease lapses. A retry is
    /// refused until then, and then runs again.
    NotSettled,
}

impl Decision {
    /// Every decision, in the order the docs list them.
    pub const ALL: [Decision; 12] = [
        Decision::Acquired,
        Decision::Replayed,
        Decision::ReplayedAfterWait,
        Decision::InProgress,
        Decision::Mismatch,
        Decision::Unknown,
        Decision::MarkedUnknown,
        Decision::Released,
        Decision::LeaseLost,
        Decision::CapacityRefused,
        Decision::StoreError,
        Decision::NotSettled,
    ];

    /// The decision's name: `acquired`, `replayed`, `replayed_after_wait`,
    /// `in_progress`, `mismatch`, `unknown`, `marked_unknown`, `released`, `lease_lost`,
    /// `capacity_refused`, `store_error`, `not_settled`.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Acquired => "acquired",
            Decision::Replayed => "replayed",
            Decision::ReplayedAfterWait => "replayed_after_wait",
            Decision::InProgress => "in_progress",
            Decision::Mismatch => "mismatch",
            Decision::Unknown => "unknown",
            Decision::MarkedUnknown => "marked_unknown",
            Decision::Released => "released",
            Decision::LeaseLost => "lease_lost",
            Decision::CapacityRefused => "capacity_refused",
            Decision::StoreError => "store_error",
            Decision::NotSettled => "not_settled",
        }
    }

    /// Its place in [`ALL`](Decision::ALL).
    #[cfg(feature = "metrics")]
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One guarded request's decision, as the layer reports it to
/// [`IdempotencyLayer::on_decision`](super::IdempotencyLayer::on_decision): once per
/// request that reached its claim (see [`Decision`]).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct DecisionEvent<'a> {
    /// What was decided.
    pub decision: Decision,
    /// The request's key: [`scope`](Key::scope), [`tenant`](Key::tenant) and
    /// [`client_key`](Key::client_key).
    pub key: &'a Key,
    /// The request's correlation id
    /// ([`IdempotencyLayer::correlation_id`](super::IdempotencyLayer::correlation_id)),
    /// if it had one.
    pub correlation_id: Option<&'a CorrelationId>,
    /// How long the claim took, waiting for a duplicate included; zero when nothing
    /// observes decisions (no hook, and neither `metrics` nor `tracing` on).
    pub claim_time: Duration,
    /// How long the execution took, from the handler's start to its response read
    /// whole; `None` if the request did not execute.
    pub execution_time: Option<Duration>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_decision_has_its_own_name_and_place() {
        let names: std::collections::HashSet<_> =
            Decision::ALL.iter().map(|d| d.as_str()).collect();
        assert_eq!(names.len(), Decision::ALL.len());
        for (at, decision) in Decision::ALL.iter().enumerate() {
            assert_eq!(*decision as usize, at, "{decision} is out of place in ALL");
            assert_eq!(decision.to_string(), decision.as_str());
        }
    }
}
