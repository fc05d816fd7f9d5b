//! [`OutcomeUnknown`]: a handler's word that its effect may or may not have happened, and
//! [`stored_response`], the bytes a reconciler resolves such a key with.
//!
//! Invariant: a response carrying [`OutcomeUnknown`] is never stored and never releases
//! its key: the layer marks the key UNKNOWN (409 `outcome_unknown` to every retry until
//! a reconciler resolves or forgets it) and answers the response as the handler made it.

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

/// Put in a response's extensions by a handler that cannot tell whether its effect
/// happened (a payment API that timed out after the request was sent): the layer marks
/// the key UNKNOWN instead of storing the response or releasing the key, so no retry runs
/// the effect a second time before the authority is checked.
///
/// ```
/// use http::{Response, StatusCode};
/// use idemcache::layer::OutcomeUnknown;
///
/// /// The payment API timed out after the request was sent: it may have charged.
/// fn charge_timed_out() -> Response<String> {
///     let mut response = Response::new("the charge may have happened".to_owned());
///     *response.status_mut() = StatusCode::GATEWAY_TIMEOUT;
///     response.extensions_mut().insert(OutcomeUnknown);
///     response
/// }
/// # let _ = charge_timed_out();
/// ```
///
/// A reconciler then asks the authority and settles the key
/// (`store::Tiered::reconcile` over a store,
/// [`Cache::reconcile`](crate::Cache::reconcile) over the cache): with [`stored_response`]'s bytes, so
/// that retries replay a response, or by forgetting it, so that a retry runs again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutcomeUnknown;

/// The record the layer replays for a response with `status`, `headers` and `body`
/// (the fields never replayed, such as `Set-Cookie`, left out): the bytes a reconciler
/// resolves a key the layer claimed with (`Verdict::Happened(Some(bytes))`), so that
/// its retries get that response. Inside a handler, `InTransaction::record` (feature
/// `store`) makes the same bytes under the layer's own settings.
pub fn stored_response(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Bytes {
    super::stored_response::encode(status, headers, false, body, None)
}
