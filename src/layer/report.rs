//! [`Asked`]: a guarded request on its way through the layer, and its one report.
//!
//! Invariant: a request is reported at most once, with its final decision, to the hook,
//! as a `tracing` event and as metrics alike (see [`decision`](super::decision) for
//! which requests are reported); a hook that panics is caught.

use std::time::Duration;

use super::decision::{Decision, DecisionEvent};
use super::settings::Settings;
use crate::{CorrelationId, Key};

/// A guarded request on its way through the layer: what its report names.
#[derive(Clone)]
pub(crate) struct Asked {
    pub(crate) scope: String,
    pub(crate) key: Key,
    pub(crate) correlation_id: Option<CorrelationId>,
    /// How long the claim took (set once it answered).
    pub(crate) claim_time: Duration,
    /// Whether the claim waited for a duplicate to finish.
    pub(crate) waited: bool,
}

impl Asked {
    pub(crate) fn new(scope: String, key: Key, correlation_id: Option<CorrelationId>) -> Asked {
        Asked { scope, key, correlation_id, claim_time: Duration::ZERO, waited: false }
    }

    /// The span the request's claim and execution run in (the handler's own events
    /// carry its fields): `idempotency`, with the key's parts and the correlation id.
    #[cfg(feature = "tracing")]
    pub(crate) fn span(&self) -> tracing::Span {
        tracing::debug_span!(
            target: "idemcache::layer",
            "idempotency",
            scope = self.key.scope(),
            tenant = self.key.tenant(),
            client_key = self.key.client_key(),
            correlation_id = self.correlation_id.as_ref().map(CorrelationId::as_str),
        )
    }

    /// No span without the `tracing` feature.
    #[cfg(not(feature = "tracing"))]
    pub(crate) fn span(&self) -> super::span::NoSpan {
        super::span::NoSpan
    }

    /// Reports `decision` for this request (`execution_time`: if it executed).
    pub(crate) fn report(
        &self,
        settings: &Settings,
        decision: Decision,
        execution_time: Option<Duration>,
    ) {
        let event = DecisionEvent {
            decision,
            key: &self.key,
            correlation_id: self.correlation_id.as_ref(),
            claim_time: self.claim_time,
            execution_time,
        };
        #[cfg(feature = "tracing")]
        tracing::debug!(
            target: "idemcache::layer",
            decision = decision.as_str(),
            scope = self.key.scope(),
            tenant = self.key.tenant(),
            client_key = self.key.client_key(),
            correlation_id = self.correlation_id.as_ref().map(CorrelationId::as_str),
            claim_ms = event.claim_time.as_secs_f64() * 1e3,
            execution_ms = execution_time.map(|t| t.as_secs_f64() * 1e3),
        );
        #[cfg(feature = "metrics")]
        settings.metrics.decided(&self.scope, &event, self.waited);
        if let Some(hook) = &settings.on_decision {
            // A hook's panic is the hook's: the request is answered all the same.
            let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(&event)));
            drop(called);
        }
    }

    /// Whether anything observes a claim's time (so it is worth reading the clock).
    pub(crate) fn timed(settings: &Settings) -> bool {
        cfg!(any(feature = "metrics", feature = "tracing")) || settings.on_decision.is_some()
    }
}
