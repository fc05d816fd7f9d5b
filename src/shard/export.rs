//! [`Shard::export`]: a copy of one shard's live facts, for a snapshot.
//!
//! Invariant: what is exported is exactly the shard's live entries at one instant (the
//! caller holds the shard's lock for the whole copy), each as a fact a later
//! [`Cache::insert`](crate::Cache::insert) can restore: COMPLETED with its result (a
//! `Bytes` sharing the shard's buffer, so the copy allocates no result bytes), UNKNOWN as
//! it is, and PROCESSING as UNKNOWN marked now (kept the cache's `unknown_ttl`, and under
//! `LapsePolicy::MarkUnknown` at least until its lapse would have expired): whoever
//! holds it will not settle it in the process that loads the snapshot, and nobody knows
//! whether its effect happened. A
//! lease that lapsed under `LapsePolicy::MarkUnknown` is turned UNKNOWN first, as every
//! path that reaches it does.

use super::entry::State;
use super::{deadline_after, Shard};
use crate::config::Config;
use crate::{CorrelationId, Fingerprint, Key, Outcome, Timestamp};

/// One live entry as a fact, with its claim's correlation id.
pub(crate) type Exported = (Key, Fingerprint, Outcome, Option<CorrelationId>);

impl Shard {
    /// Appends every live entry of this shard to `out` as a fact (see the module docs).
    pub(crate) fn export(&mut self, now: Timestamp, cfg: &Config, out: &mut Vec<Exported>) {
        out.reserve(self.table.len());
        for i in 0..self.slots.len() {
            let Some(e) = self.slots.get(i) else { continue };
            // A lease that lapsed under `LapsePolicy::MarkUnknown` is UNKNOWN, whoever
            // reads it first: turned here as on every other path, never left out.
            if !e.is_live(now) && !self.lapse(i as u32, now) {
                continue;
            }
            let Some(e) = self.slots.get(i) else { continue };
            let (state, since, deadline, body) = (e.state, e.since, e.deadline, e.body);
            let key = e.key.clone();
            let fingerprint = e.fingerprint;
            let known = match state {
                State::Completed => Outcome::Completed {
                    body: body.map(|r| self.results.sealed(r)),
                    completed_at: since,
                    expires_at: deadline,
                },
                State::Unknown => Outcome::Unknown { marked_at: since, expires_at: deadline },
                State::Processing => {
                    // Kept as a guard's mark would be, and under `MarkUnknown` never less
                    // than the lapse would have kept it: the policy's ttl from the lease's
                    // end (`deadline`). A restart must not free the key sooner than the
                    // running process would have.
                    let marked = deadline_after(now, cfg.unknown_ttl);
                    let lapsed =
                        cfg.lapse_policy.unknown_ttl().map(|ttl| deadline_after(deadline, ttl));
                    Outcome::Unknown {
                        marked_at: now,
                        expires_at: lapsed.map_or(marked, |l| l.max(marked)),
                    }
                }
            };
            out.push((key, fingerprint, known, self.correlations.get(i as u32).cloned()));
        }
    }
}
