//! Open any idemcache store from a URL, so that configuration picks the store and the
//! code has one path: `sqlite:PATH` (or `sqlite::memory:`), `postgres://...` (or
//! `postgresql://`), `redis://...` (or `rediss://`).
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use idemcache::store::{Store, Tiered};
//! let url = std::env::var("IDEMPOTENCY_STORE").unwrap_or("sqlite::memory:".into());
//! let store = idemcache_any::open(&url).await?;
//! store.ensure_schema().await?;
//! let tiered = Tiered::new(idemcache::Cache::builder().build().unwrap(), store);
//! # drop(tiered); Ok(()) }
//! ```
//!
//! Each scheme is a feature (`sqlite`, `postgres`, `redis`, all on by default); a URL
//! of a scheme left out is [`OpenError::NotBuilt`], naming the feature.
//!
//! Invariant: `open` only connects. It creates no schema (call
//! [`ensure_schema`](idemcache::store::Store::ensure_schema)) and never executes anything.

#![cfg_attr(docsrs, feature(doc_cfg))]

use std::fmt;

pub use idemcache::store::AnyStore;
use idemcache::store::StoreError;

/// The PostgreSQL pool size `open` uses (a store's operations are one short statement
/// each). For another, build the pool yourself and `PostgresStore::from_pool` it.
pub const POSTGRES_CONNECTIONS: usize = 16;

/// Why [`open`] returned no store.
#[derive(Debug)]
#[non_exhaustive]
pub enum OpenError {
    /// The URL's scheme is none of the stores'.
    UnknownScheme {
        /// The URL, its password (if any) hidden.
        url: String,
    },
    /// The scheme's store was not built into this program.
    NotBuilt {
        /// The URL's scheme.
        scheme: &'static str,
        /// The `idemcache-any` feature that builds it in.
        feature: &'static str,
    },
    /// The store could not be opened (unreachable, refused, a bad path).
    Store {
        /// The URL, its password (if any) hidden.
        url: String,
        /// What the store said.
        error: StoreError,
    },
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::UnknownScheme { url } => write!(
                f,
                "{url:?} is not a store URL: use sqlite:PATH, postgres://... or redis://..."
            ),
            OpenError::NotBuilt { scheme, feature } => write!(
                f,
                "{scheme} stores are not built into this program (idemcache-any's `{feature}` feature)"
            ),
            OpenError::Store { url, .. } => write!(f, "opening the store at {url}"),
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::Store { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl From<OpenError> for StoreError {
    fn from(e: OpenError) -> StoreError {
        match e {
            OpenError::Store { error, .. } => error,
            other => StoreError::InvalidInput(other.to_string()),
        }
    }
}

/// `url` without its password (in the user part, or a `password=` query parameter),
/// for messages and logs.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let (before_query, query) = rest.split_at(rest.find('?').unwrap_or(rest.len()));
    // The user part ends at the last `@`: a password may hold `@` or `/`.
    let authority = match before_query.rsplit_once('@') {
        Some((user, host)) if user.contains(':') => {
            let name = user.split(':').next().unwrap_or_default();
            format!("{name}:***@{host}")
        }
        _ => before_query.to_owned(),
    };
    let tail = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if name.trim_start_matches('?').eq_ignore_ascii_case("password") => {
                format!("{name}=***")
            }
            _ => pair.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&");
    format!("{scheme}://{authority}{tail}")
}

/// Opens the store `url` names (see the crate docs for the schemes). Connects, or for
/// PostgreSQL builds a pool of [`POSTGRES_CONNECTIONS`] that connects on first use;
/// creates no schema.
pub async fn open(url: &str) -> Result<AnyStore, OpenError> {
    let failed = |error| OpenError::Store { url: redacted(url), error };
    let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
    match scheme {
        "sqlite" => {
            #[cfg(feature = "sqlite")]
            return idemcache_sqlite::SqliteStore::connect(url)
                .await
                .map(AnyStore::new)
                .map_err(failed);
            #[cfg(not(feature = "sqlite"))]
            return Err(OpenError::NotBuilt { scheme: "sqlite", feature: "sqlite" });
        }
        "postgres" | "postgresql" => {
            #[cfg(feature = "postgres")]
            return idemcache_postgres::PostgresStore::connect(url, POSTGRES_CONNECTIONS)
                .await
                .map(AnyStore::new)
                .map_err(failed);
            #[cfg(not(feature = "postgres"))]
            return Err(OpenError::NotBuilt { scheme: "postgres", feature: "postgres" });
        }
        "redis" | "rediss" => {
            #[cfg(feature = "redis")]
            return idemcache_redis::RedisStore::connect(url)
                .await
                .map(AnyStore::new)
                .map_err(failed);
            #[cfg(not(feature = "redis"))]
            return Err(OpenError::NotBuilt { scheme: "redis", feature: "redis" });
        }
        _ => {
            let _ = failed;
            Err(OpenError::UnknownScheme { url: redacted(url) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_a_message() {
        assert_eq!(redacted("postgres://app:s3cret@db:5432/x"), "postgres://app:***@db:5432/x");
        assert_eq!(redacted("redis://:pw@cache:6379/0"), "redis://:***@cache:6379/0");
        assert_eq!(
            redacted("postgres://db/x?user=a&password=pw&x=1"),
            "postgres://db/x?user=a&password=***&x=1"
        );
        assert_eq!(redacted("postgres://a:b@c@db/x"), "postgres://a:***@db/x");
        assert_eq!(redacted("sqlite:/tmp/x.db"), "sqlite:/tmp/x.db");
    }

    #[tokio::test]
    async fn a_url_of_no_store_is_a_typed_error_naming_it() {
        for url in ["mysql://root:pw@db/x", "records.db", ""] {
            match open(url).await {
                Err(OpenError::UnknownScheme { url: named }) => assert!(!named.contains("pw")),
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_sqlite_url_opens_a_store_that_conforms() {
        use idemcache::store::Store;
        let store = open("sqlite::memory:").await.unwrap();
        store.ensure_schema().await.unwrap();
        idemcache::store::conformance::run(&store).await;
        assert!(format!("{store:?}").contains("SqliteStore"));
    }

    #[tokio::test]
    async fn an_unopenable_store_names_its_url_and_keeps_the_cause() {
        use std::error::Error;
        let url = "sqlite:/nonexistent-dir-idemcache/x/records.db";
        let e = open(url).await.unwrap_err();
        assert!(matches!(e, OpenError::Store { .. }), "{e:?}");
        assert!(e.to_string().contains("nonexistent-dir-idemcache"), "{e}");
        assert!(e.source().unwrap().to_string().contains("opening the SQLite database"));
    }
}
