//! The layer's metrics (feature `metrics`), recorded through the
//! [`metrics`](https://docs.rs/metrics) facade, so any exporter the application installs
//! (Prometheus, StatsD, OpenTelemetry) reads them; with no recorder installed they cost
//! a lookup and nothing else.
//!
//! The metrics and their labels are listed in the layer's docs (`layer/mod.rs`,
//! "Metrics").
//!
//! Invariant: label values come from a bounded set, never from a key or a tenant: the
//! `decision` and `operation` names, the store's type name (`cache` for the cache
//! alone), and the first [`MAX_LABELLED_SCOPES`] scopes seen; later ones share the scope
//! label `other`. (Name scopes by route, not by raw path, and each keeps its own.)

use std::collections::HashMap;
use std::sync::Arc;

use metrics::{Counter, Histogram};
use parking_lot::RwLock;

use super::decision::{Decision, DecisionEvent};

/// The most scopes that get a `scope` label of their own (the layer's docs say so);
/// later ones are `other`.
pub(crate) const MAX_LABELLED_SCOPES: usize = 256;

/// The most UNKNOWN records `idemcache_unknown` counts (the layer's docs say so): more
/// reads as this many.
pub(crate) const UNKNOWN_GAUGE_LIMIT: usize = 10_000;

/// The scope label shared by scopes past [`MAX_LABELLED_SCOPES`].
const OTHER: &str = "other";

/// One scope's handles, registered once (a handle records without a lookup).
struct ScopeMetrics {
    decisions: [Counter; Decision::ALL.len()],
    execution: Histogram,
    wait: Histogram,
}

/// The layer's metrics: its store's label and its scopes' handles.
pub(crate) struct LayerMetrics {
    store: &'static str,
    scopes: RwLock<HashMap<String, Arc<ScopeMetrics>, ahash::RandomState>>,
}

impl LayerMetrics {
    pub(crate) fn new(store: &'static str) -> LayerMetrics {
        LayerMetrics { store, scopes: RwLock::default() }
    }

    /// The handles of `scope`, registered on first sight (as `other` once
    /// [`MAX_LABELLED_SCOPES`] have their own).
    fn scope(&self, scope: &str) -> Arc<ScopeMetrics> {
        if let Some(found) = self.scopes.read().get(scope) {
            return found.clone();
        }
        let mut scopes = self.scopes.write();
        if let Some(found) = scopes.get(scope) {
            return found.clone();
        }
        let labelled = if scopes.len() < MAX_LABELLED_SCOPES { scope } else { OTHER };
        if let Some(other) = scopes.get(labelled) {
            return other.clone();
        }
        let handles = Arc::new(self.register(labelled));
        scopes.insert(labelled.to_owned(), handles.clone());
        handles
    }

    fn register(&self, scope: &str) -> ScopeMetrics {
        let (scope, store) = (scope.to_owned(), self.store);
        let decisions = Decision::ALL.map(|decision| {
            metrics::counter!(
                "idemcache_decisions_total",
                "decision" => decision.as_str(),
                "scope" => scope.clone(),
                "store" => store,
            )
        });
        ScopeMetrics {
            decisions,
            execution: metrics::histogram!(
                "idemcache_execution_seconds", "scope" => scope.clone(), "store" => store
            ),
            wait: metrics::histogram!("idemcache_wait_seconds", "scope" => scope, "store" => store),
        }
    }

    /// Counts one request's decision and its times.
    pub(crate) fn decided(&self, scope: &str, event: &DecisionEvent<'_>, waited: bool) {
        let handles = self.scope(scope);
        handles.decisions[event.decision.index()].increment(1);
        if let Some(took) = event.execution_time {
            handles.execution.record(took);
        }
        if waited {
            handles.wait.record(event.claim_time);
        }
    }

    /// The store's label.
    pub(crate) fn store(&self) -> &'static str {
        self.store
    }
}

/// Records one call of a durable store: `operation` took `took`.
#[cfg(feature = "store")]
pub(crate) fn store_call(store: &'static str, operation: &'static str, took: std::time::Duration) {
    metrics::histogram!("idemcache_store_seconds", "operation" => operation, "store" => store)
        .record(took);
}

/// Sets the gauges.
pub(crate) fn gauges(store: &'static str, entries: u64, bytes: u64, unknown: usize) {
    metrics::gauge!("idemcache_entries", "store" => store).set(entries as f64);
    metrics::gauge!("idemcache_bytes", "store" => store).set(bytes as f64);
    metrics::gauge!("idemcache_unknown", "store" => store).set(unknown as f64);
}
