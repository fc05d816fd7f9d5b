//! [`DynStore`]: the object-safe form of [`Store`], its futures boxed, so that a store
//! can be chosen at run time (from configuration, a URL) and held as one type,
//! [`AnyStore`].
//!
//! Invariant: a `DynStore` call is the `Store` call it wraps, boxed and nothing more;
//! every `Store` is a `DynStore`, and an [`AnyStore`] is a `Store` again (so it goes
//! behind [`Tiered`](super::Tiered) and the layer like any other). The price is one
//! allocation per call, small beside the store's round trip.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use super::{Record, RecordFilter, RecordState, Store, StoreClaim, StoreError};
use crate::{CorrelationId, FencingToken, Fingerprint, Key, Replay, UnknownEntry};

/// A boxed `Send` future, as [`DynStore`]'s methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`Store`] with boxed futures, so that it can be a trait object (`dyn DynStore`).
/// Implemented for every `Store`; see that trait for what each method does.
#[allow(missing_docs)] // Each method is the `Store` method of the same name.
pub trait DynStore: Send + Sync + std::fmt::Debug + 'static {
    fn claim_correlated<'a>(
        &'a self,
        key: &'a Key,
        fingerprint: Fingerprint,
        lease: Duration,
        correlation_id: Option<&'a CorrelationId>,
    ) -> BoxFuture<'a, Result<StoreClaim, StoreError>>;
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        token: FencingToken,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Replay<SystemTime>, StoreError>>;
    fn extend_lease<'a>(
        &'a self,
        key: &'a Key,
        token: FencingToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<SystemTime, StoreError>>;
    fn release<'a>(
        &'a self,
        key: &'a Key,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn mark_unknown<'a>(
        &'a self,
        key: &'a Key,
        token: FencingToken,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn resolve_fenced<'a>(
        &'a self,
        key: &'a Key,
        execution: Option<FencingToken>,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Replay<SystemTime>, StoreError>>;
    fn forget_fenced<'a>(
        &'a self,
        key: &'a Key,
        execution: Option<FencingToken>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn list_unknown(
        &self,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<UnknownEntry<SystemTime>>, StoreError>>;
    fn purge_expired(&self, limit: usize) -> BoxFuture<'_, Result<usize, StoreError>>;
    fn ensure_schema(&self) -> BoxFuture<'_, Result<(), StoreError>>;
    fn name(&self) -> &'static str;
    fn record<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<Record>, StoreError>>;
    fn records<'a>(
        &'a self,
        filter: &'a RecordFilter,
        after: Option<&'a Key>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>>;
    fn remove_record<'a>(
        &'a self,
        key: &'a Key,
        states: &'a [RecordState],
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>>;
}

impl<S: Store> DynStore for S {
    fn claim_correlated<'a>(
        &'a self,
        key: &'a Key,
        fingerprint: Fingerprint,
        lease: Duration,
        correlation_id: Option<&'a CorrelationId>,
    ) -> BoxFuture<'a, Result<StoreClaim, StoreError>> {
        Box::pin(Store::claim_correlated(self, key, fingerprint, lease, correlation_id))
    }
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        token: FencingToken,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Replay<SystemTime>, StoreError>> {
        Box::pin(Store::complete(self, key, token, body, ttl))
    }
    fn extend_lease<'a>(
        &'a self,
        key: &'a Key,
        token: FencingToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<SystemTime, StoreError>> {
        Box::pin(Store::extend_lease(self, key, token, lease))
    }
    fn release<'a>(
        &'a self,
        key: &'a Key,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::release(self, key, token))
    }
    fn mark_unknown<'a>(
        &'a self,
        key: &'a Key,
        token: FencingToken,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::mark_unknown(self, key, token, ttl))
    }
    fn resolve_fenced<'a>(
        &'a self,
        key: &'a Key,
        execution: Option<FencingToken>,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Replay<SystemTime>, StoreError>> {
        Box::pin(Store::resolve_fenced(self, key, execution, body, ttl))
    }
    fn forget_fenced<'a>(
        &'a self,
        key: &'a Key,
        execution: Option<FencingToken>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::forget_fenced(self, key, execution))
    }
    fn list_unknown(
        &self,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<UnknownEntry<SystemTime>>, StoreError>> {
        Box::pin(Store::list_unknown(self, limit))
    }
    fn purge_expired(&self, limit: usize) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(Store::purge_expired(self, limit))
    }
    fn ensure_schema(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(Store::ensure_schema(self))
    }
    fn name(&self) -> &'static str {
        Store::name(self)
    }
    fn record<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(Store::record(self, key))
    }
    fn records<'a>(
        &'a self,
        filter: &'a RecordFilter,
        after: Option<&'a Key>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        Box::pin(Store::records(self, filter, after, limit))
    }
    fn remove_record<'a>(
        &'a self,
        key: &'a Key,
        states: &'a [RecordState],
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(Store::remove_record(self, key, states))
    }
}

/// A store chosen at run time: any [`Store`] behind one type, itself a `Store` (so
/// `Tiered<AnyStore>` is one type whichever store configuration picked). Cheap to clone
/// (shared). `idemcache_any::open(url)` returns one; [`AnyStore::new`] wraps a store of
/// your own.
#[derive(Clone)]
pub struct AnyStore(Arc<dyn DynStore>);

impl AnyStore {
    /// `store`, behind the one type.
    pub fn new(store: impl DynStore) -> AnyStore {
        AnyStore(Arc::new(store))
    }

    /// A store already shared as a trait object.
    pub fn from_arc(store: Arc<dyn DynStore>) -> AnyStore {
        AnyStore(store)
    }
}

impl std::fmt::Debug for AnyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl Store for AnyStore {
    async fn claim_correlated(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        lease: Duration,
        correlation_id: Option<&CorrelationId>,
    ) -> Result<StoreClaim, StoreError> {
        self.0.claim_correlated(key, fingerprint, lease, correlation_id).await
    }
    async fn complete(
        &self,
        key: &Key,
        token: FencingToken,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> Result<Replay<SystemTime>, StoreError> {
        self.0.complete(key, token, body, ttl).await
    }
    async fn extend_lease(
        &self,
        key: &Key,
        token: FencingToken,
        lease: Duration,
    ) -> Result<SystemTime, StoreError> {
        self.0.extend_lease(key, token, lease).await
    }
    async fn release(&self, key: &Key, token: FencingToken) -> Result<(), StoreError> {
        self.0.release(key, token).await
    }
    async fn mark_unknown(
        &self,
        key: &Key,
        token: FencingToken,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.0.mark_unknown(key, token, ttl).await
    }
    async fn resolve_fenced(
        &self,
        key: &Key,
        execution: Option<FencingToken>,
        body: Option<Bytes>,
        ttl: Duration,
    ) -> Result<Replay<SystemTime>, StoreError> {
        self.0.resolve_fenced(key, execution, body, ttl).await
    }
    async fn forget_fenced(
        &self,
        key: &Key,
        execution: Option<FencingToken>,
    ) -> Result<(), StoreError> {
        self.0.forget_fenced(key, execution).await
    }
    async fn list_unknown(
        &self,
        limit: usize,
    ) -> Result<Vec<UnknownEntry<SystemTime>>, StoreError> {
        self.0.list_unknown(limit).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.0.purge_expired(limit).await
    }
    /// The name of the store it holds.
    fn name(&self) -> &'static str {
        self.0.name()
    }
    async fn ensure_schema(&self) -> Result<(), StoreError> {
        self.0.ensure_schema().await
    }
    async fn record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.0.record(key).await
    }
    async fn records(
        &self,
        filter: &RecordFilter,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.0.records(filter, after, limit).await
    }
    async fn remove_record(
        &self,
        key: &Key,
        states: &[RecordState],
    ) -> Result<Option<Record>, StoreError> {
        self.0.remove_record(key, states).await
    }
}
