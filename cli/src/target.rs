//! Where `status`, `list`, `resolve`, `forget` and `gc` act: idem's own state database
//! (`--db`), or any idemcache store a service keeps its records in (`--store URL`:
//! PostgreSQL, Redis, Redis Cluster, MySQL/MariaDB, SQLite, opened with
//! `idemcache_any`), and how a record there is addressed (`--scope`, `--tenant` and the
//! client key, as the HTTP layer builds its keys).
//!
//! Invariant: every store operation runs to its end on one tokio runtime owned here
//! (the async stores' connections live on it), and every error it returns is a
//! [`Failure`] with [`DB_UNUSABLE`] naming the store: the state database's file, or the
//! URL with its password hidden ([`idemcache_any::redacted`]); no password is ever
//! printed. A store opened by URL is only read and settled: no schema is created in a
//! service's database.

use std::time::Duration;

use idemcache::store::encoding::one_line;
use idemcache::store::{AnyStore, StoreError};
use idemcache::{Key, LapsePolicy};

use crate::db::Db;
use crate::exit::{self, Failure, DB_UNUSABLE};
use crate::run::SCOPE;

/// A store the admin subcommands act on.
pub struct Target {
    /// The store.
    pub store: AnyStore,
    /// idem's own database, when that is the store (its errors name the file).
    local: Option<Db>,
    /// The store's URL, its password hidden (a store opened by URL).
    url: String,
    /// Dropped last: the stores' connections are tasks on it.
    runtime: tokio::runtime::Runtime,
}

/// A single-threaded runtime: one operation at a time, driven by `block_on`.
fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(DB_UNUSABLE, format!("starting an async runtime: {e}")))
}

/// `s` as one word of a shell command line: bare when it is plain, else single-quoted.
fn quoted(s: &str) -> String {
    if s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:@,+=".contains(&b)) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

impl Target {
    /// The options that address this store and `key` on a command line, for the next
    /// commands `status` suggests: `--store URL` (its password hidden: type it again),
    /// `--scope`, `--tenant`, then the client key. Just the client key for idem's own
    /// records in its own database.
    pub fn addressed(&self, key: &Key) -> String {
        let mut out = self.store_option();
        if key.scope() != crate::run::SCOPE {
            out.push_str(&format!("--scope {} ", quoted(key.scope())));
        }
        if let Some(tenant) = key.tenant() {
            out.push_str(&format!("--tenant {} ", quoted(tenant)));
        }
        out.push_str(&quoted(key.client_key()));
        out
    }

    /// `--store URL ` (its password hidden) that addresses this store on a command
    /// line, or nothing for idem's own database.
    pub fn store_option(&self) -> String {
        match self.local {
            Some(_) => String::new(),
            None => format!("--store {} ", quoted(&self.url)),
        }
    }

    /// Whether this is idem's own database.
    pub fn is_local(&self) -> bool {
        self.local.is_some()
    }

    /// idem's own state database.
    pub fn local(db: Db) -> Result<Target, Failure> {
        Ok(Target {
            store: AnyStore::new(db.store.clone()),
            url: String::new(),
            local: Some(db),
            runtime: runtime()?,
        })
    }

    /// The store at `url`, its lapsed leases read as `lapse` says (as the service's
    /// own handle reads them).
    pub fn remote(url: &str, lapse: LapsePolicy) -> Result<Target, Failure> {
        let runtime = runtime()?;
        let shown = idemcache_any::redacted(url);
        // A SQLite store is a file its driver creates when it is absent: a path mistyped
        // would leave an empty database (in WAL mode) where the service keeps its own,
        // and be reported as a table missing from it. idem only reads a store.
        if let Some(path) = sqlite_file(url) {
            if !path.exists() {
                return Err(Failure::new(
                    DB_UNUSABLE,
                    format!("the store {shown} cannot be opened: no database file at {path:?}"),
                ));
            }
        }
        let store = runtime.block_on(idemcache_any::open_with(url, lapse)).map_err(|e| {
            let code = match &e {
                idemcache_any::OpenError::Store { error: StoreError::Backend(_), .. } => {
                    DB_UNUSABLE
                }
                _ => exit::USAGE,
            };
            let why = match &e {
                idemcache_any::OpenError::Store { error, .. } => format!(": {}", one_line(error)),
                _ => String::new(),
            };
            Failure::new(code, format!("the store {shown} cannot be opened: {e}{why}"))
        })?;
        Ok(Target { store, local: None, url: shown, runtime })
    }

    /// A failed store operation, named by the store and why.
    pub fn failure(&self, e: StoreError) -> Failure {
        match &self.local {
            Some(db) => db.failure(e),
            None => {
                let why = match &e {
                    StoreError::Corrupt(why) => format!("it holds what idem cannot read: {why}"),
                    other => one_line(other),
                };
                Failure::new(DB_UNUSABLE, format!("the store {} is unusable: {why}", self.url))
            }
        }
    }

    /// Runs a store operation to its end, its error as the store said it.
    pub fn wait_raw<T>(
        &self,
        op: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.runtime.block_on(op)
    }

    /// Runs a store operation to its end.
    pub fn wait<T>(
        &self,
        op: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, Failure> {
        self.runtime.block_on(op).map_err(|e| self.failure(e))
    }
}

/// The file a `sqlite:` store URL names (as `SqliteStore::connect` reads it), or `None`
/// for another scheme or an in-memory database.
fn sqlite_file(url: &str) -> Option<&std::path::Path> {
    let (scheme, rest) = url.split_once(':')?;
    if !scheme.eq_ignore_ascii_case("sqlite") {
        return None;
    }
    let path = rest.strip_prefix("//").unwrap_or(rest);
    (!path.is_empty() && path != ":memory:" && !path.contains('?'))
        .then(|| std::path::Path::new(path))
}

/// How a record is addressed: a scope (idem's own, `idem run`, when none is given) and
/// a tenant (none when none is given), with the client key a subcommand names.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Address {
    /// The record's scope, as the service names its operation (e.g. "POST /v1/orders").
    /// Default: idem's own ("idem run"); `list` without it lists every scope.
    #[arg(long, value_name = "SCOPE")]
    pub scope: Option<String>,
    /// The record's tenant (default: none; `list` without it lists every tenant).
    #[arg(long, value_name = "TENANT")]
    pub tenant: Option<String>,
}

impl Address {
    /// The key of `client_key` at this address; a key the rules refuse is a usage error.
    pub fn key(&self, client_key: &str) -> Result<Key, Failure> {
        let scope = self.scope.as_deref().unwrap_or(SCOPE);
        let key = match &self.tenant {
            Some(tenant) => Key::new(scope, tenant, client_key),
            None => Key::without_tenant(scope, client_key),
        };
        key.map_err(|e| {
            Failure::new(
                exit::USAGE,
                format!(
                    "the key {client_key:?} is refused: {e} (keys are 1 to 255 visible ASCII \
                     characters, no spaces; a scope and tenant at most 1024 bytes together)"
                ),
            )
        })
    }
}

/// How long a lapse reads as UNKNOWN for `--unknown-ttl`: `None` is `TakeOver`.
pub fn lapse_policy(unknown_ttl: Option<Duration>) -> LapsePolicy {
    match unknown_ttl {
        Some(ttl) => LapsePolicy::MarkUnknown { ttl },
        None => LapsePolicy::TakeOver,
    }
}
