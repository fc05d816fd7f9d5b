//! [`Settings`]: what an [`IdempotencyLayer`](super::IdempotencyLayer) was configured
//! with, shared by every service it wraps.
//!
//! Invariant: the settings are fixed once the layer wraps a service (each wrapped
//! service shares them behind an `Arc`), so every request of one service is judged by
//! the same rules.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::request::Parts;
use http::{Method, StatusCode};

use super::backend::Records;
use super::decision::DecisionEvent;
use super::grpc::Grpc;
use crate::CorrelationId;

/// The default limit on a request body the layer buffers: 1 MiB.
pub const DEFAULT_MAX_REQUEST_BODY: usize = 1 << 20;

pub(crate) type ScopeFn = dyn Fn(&Parts) -> String + Send + Sync;
pub(crate) type TenantFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;
pub(crate) type StoreFn = dyn Fn(StatusCode) -> bool + Send + Sync;
pub(crate) type KeyFromFn = dyn Fn(&Parts, &[u8]) -> Result<Option<Vec<u8>>, String> + Send + Sync;
pub(crate) type FingerprintBodyFn = dyn Fn(&Parts, &[u8]) -> Vec<u8> + Send + Sync;
pub(crate) type CorrelationFn = dyn Fn(&Parts) -> Option<CorrelationId> + Send + Sync;
pub(crate) type DecisionFn = dyn Fn(&DecisionEvent<'_>) + Send + Sync;

#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) records: Records,
    pub(crate) methods: Vec<Method>,
    pub(crate) require_key: bool,
    pub(crate) max_request_body: usize,
    pub(crate) fingerprint_headers: Vec<HeaderName>,
    pub(crate) wait: Option<Duration>,
    pub(crate) scope: Arc<ScopeFn>,
    pub(crate) tenant: Option<Arc<TenantFn>>,
    pub(crate) store: Arc<StoreFn>,
    pub(crate) replay_set_cookie: bool,
    pub(crate) correlation_id: Arc<CorrelationFn>,
    pub(crate) on_decision: Option<Arc<DecisionFn>>,
    /// Speaks gRPC: keeps answers by gRPC status, refuses with gRPC statuses.
    pub(crate) grpc: Option<Grpc>,
    /// Reads the client's key from the request instead of the `Idempotency-Key` header.
    pub(crate) key_from: Option<Arc<KeyFromFn>>,
    /// Selects what of the body the fingerprint covers.
    pub(crate) fingerprint_body: Option<Arc<FingerprintBodyFn>>,
    /// Shared by every clone: the scopes' recent execution times, for `Retry-After`.
    pub(crate) times: Arc<super::timing::ExecutionTimes>,
    /// Shared by every clone: the scopes' registered metrics.
    #[cfg(feature = "metrics")]
    pub(crate) metrics: Arc<super::metrics::LayerMetrics>,
}

impl Settings {
    /// Whether a request's correlation id is read with its key: for a hook, the `metrics`
    /// or `tracing` feature, or a durable store (which keeps it with the record). The
    /// cache alone keeps it too, but reads it only once a claim may acquire.
    pub(crate) fn observes_correlation(&self) -> bool {
        cfg!(any(feature = "metrics", feature = "tracing"))
            || self.on_decision.is_some()
            || !matches!(self.records, Records::Memory(_))
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("methods", &self.methods)
            .field("require_key", &self.require_key)
            .field("max_request_body", &self.max_request_body)
            .field("fingerprint_headers", &self.fingerprint_headers)
            .field("wait", &self.wait)
            .field("tenant", &self.tenant.is_some())
            .field("replay_set_cookie", &self.replay_set_cookie)
            .field("on_decision", &self.on_decision.is_some())
            .field("grpc", &self.grpc)
            .finish_non_exhaustive()
    }
}
