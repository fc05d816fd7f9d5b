//! [`Claimed`]: what the layer tells the handler about the claim it executes under.
//!
//! Invariant: a request the layer hands to the handler carries exactly one `Claimed` in
//! its extensions, naming the key the layer holds for it, its request's fingerprint and
//! correlation id: the same values a retry of the same intent (or a takeover after a
//! lapsed lease, or a reconciler's [`UnknownEntry`](crate::UnknownEntry)) would have, so
//! a [`DownstreamKey`] derived from it is the same in every execution.

use crate::{CorrelationId, DownstreamKey, Fingerprint, Key, PurposeError};

/// The claim a handler runs under, in the request's extensions: its key, the request's
/// fingerprint and correlation id, and the idempotency keys of the calls it makes to
/// outside systems.
///
/// ```
/// use idemcache::layer::Claimed;
///
/// /// A handler (axum: take the `Extension<Claimed>` extractor instead).
/// async fn create_order(request: http::Request<String>) -> http::StatusCode {
///     let Some(claimed) = request.extensions().get::<Claimed>() else {
///         return http::StatusCode::INTERNAL_SERVER_ERROR; // not behind the layer
///     };
///     let Ok(charge) = claimed.downstream_key("charge") else {
///         return http::StatusCode::INTERNAL_SERVER_ERROR;
///     };
///     // provider.charge(amount).idempotency_key(charge.as_str()).send().await
///     # let _ = charge;
///     http::StatusCode::CREATED
/// }
/// ```
#[derive(Debug, Clone)]
pub struct Claimed {
    key: Key,
    fingerprint: Fingerprint,
    correlation_id: Option<CorrelationId>,
    took_over: bool,
}

impl Claimed {
    pub(crate) fn new(
        key: Key,
        fingerprint: Fingerprint,
        correlation_id: Option<CorrelationId>,
        took_over: bool,
    ) -> Claimed {
        Claimed { key, fingerprint, correlation_id, took_over }
    }

    /// The key the layer holds for this request (its scope, tenant and client key).
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The request's fingerprint.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The request's correlation id, if it has one
    /// ([`IdempotencyLayer::correlation_id`](super::IdempotencyLayer::correlation_id)).
    pub fn correlation_id(&self) -> Option<&CorrelationId> {
        self.correlation_id.as_ref()
    }

    /// Whether this execution took the key over from an earlier one whose lease lapsed
    /// (its process crashed or stalled past the lease): that execution may have had
    /// its effects. A handler whose effect is outside the store checks the authority
    /// (by [`downstream_key`](Self::downstream_key), which is the same in both) before
    /// acting again, first, before anything that could end in a 5xx (which releases the
    /// key and, with it, this warning).
    ///
    /// In the one-commit mode the claim is in the handler's transaction, so a crashed
    /// execution's claim rolls back with it: the next one is not told, though an effect
    /// outside the transaction (a charge) may have happened: send such an effect under
    /// the downstream key to a system that dedupes by it, as the orders example's
    /// charge is (through `idemcache-client`).
    pub fn took_over(&self) -> bool {
        self.took_over
    }

    /// The idempotency key of this execution's call named `purpose` to an outside system
    /// ([`DownstreamKey::derive`]): the same in every execution of this intent.
    pub fn downstream_key(&self, purpose: &str) -> Result<DownstreamKey, PurposeError> {
        DownstreamKey::derive(&self.key, self.fingerprint, purpose)
    }
}
