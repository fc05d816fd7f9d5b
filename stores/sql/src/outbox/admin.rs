//! [`OutboxAdmin`]: what an operator does to a driver's outbox, as one trait, so that the
//! tools and suites that do it are written once for every driver.
//!
//! Invariant: each operation is the driver's own free function of the same name, run on
//! the storage's connection or pool; the trait adds no behaviour of its own.

use std::future::Future;
use std::time::SystemTime;

use super::{OutboxError, OutboxRow};

/// A driver's outbox as an operator uses it (each driver's `outbox::Storage` implements
/// it beside [`OutboxStorage`](super::OutboxStorage), the relay's part): the dead rows,
/// one row by its id, a dead row back to pending, the delivered rows purged.
pub trait OutboxAdmin {
    /// Up to `limit` dead rows, oldest first.
    fn list_dead(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<OutboxRow>, OutboxError>> + Send;

    /// The row of `message_id`, in any state, or `None`; an unreadable one is
    /// [`OutboxError::Corrupt`].
    fn inspect(
        &self,
        message_id: &str,
    ) -> impl Future<Output = Result<Option<OutboxRow>, OutboxError>> + Send;

    /// Makes a dead row pending again, due at once, its attempts reset: `true` if
    /// `message_id` was dead, `false` otherwise (nothing changed).
    fn requeue(&self, message_id: &str) -> impl Future<Output = Result<bool, OutboxError>> + Send;

    /// Deletes up to `limit` rows delivered before `cutoff` (oldest first) and returns how
    /// many: call it until it returns less than `limit`. `limit` 0 deletes nothing.
    fn purge_delivered(
        &self,
        cutoff: SystemTime,
        limit: usize,
    ) -> impl Future<Output = Result<usize, OutboxError>> + Send;
}
