//! stub
#![forbid(unsafe_code)]

mod cache;
mod claim;
mod clock;
mod config;
mod entry;
mod error;
mod fingerprint;
mod guard;
mod key;
mod shard;
mod stats;
mod sync;

pub use cache::Cache;
pub use claim::{Claim, EntrySnapshot, EntryState, FencingToken, Replay};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use config::{CacheBuilder, DropPolicy, MAX_DURATION, MAX_RESULT_SIZE_LIMIT, MAX_SHARDS};
pub use entry::ENTRY_OVERHEAD;
pub use error::{BuildError, ClaimError, ExtendLeaseError, LeaseLost, ResolveError};
pub use fingerprint::{Fingerprint, FingerprintBuilder};
pub use guard::ClaimGuard;
pub use key::{Key, KeyError, MAX_CLIENT_KEY_LEN, MAX_SCOPE_AND_TENANT_LEN};
pub use stats::Stats;
