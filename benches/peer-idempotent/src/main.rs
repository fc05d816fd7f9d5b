//! The `idempotent` crate's server for the HTTP load benchmark, started by `http_load`:
//!
//! ```sh
//! http_peer_idempotent REDIS_URL [--threads N]
//! ```
//!
//! Its README's middleware setup: `IdempotencyLayer::new(store)` with the default
//! settings over `ValkeyStore::with_url(url)`, around the shared handler.
//!
//! Invariant: the same routes and runtime as every other row (`http_app`); only the
//! middleware differs. A store that cannot be opened prints `unavailable WHY`.

#[path = "../../support/http_app.rs"]
mod http_app;

use idempotent::middleware::IdempotencyLayer;
use idempotent::valkey::ValkeyStore;

fn main() {
    let url = std::env::args().skip(1).find(|a| !a.starts_with("--") && a.contains("://"));
    http_app::serve(move || async move {
        let url = url.ok_or("a Redis URL is needed")?;
        let store = ValkeyStore::with_url(url)
            .prefix("httpbench")
            .try_build()
            .await
            .map_err(|e| e.to_string())?;
        Ok(http_app::guarded_routes()
            .layer(IdempotencyLayer::new(store))
            .merge(http_app::open_routes()))
    });
}
