//! Open any idemcache store from a URL, so that configuration picks the store and the
//! code has one path: `sqlite:PATH` (or `sqlite::memory:`), `postgres://...` (or
//! `postgresql://`), `redis://...` (or `rediss://`, `redis+unix://`, `unix://`), and
//! `redis-cluster://host:port,host:port,...` (a Redis Cluster: any of its nodes; the
//! client learns the rest), and `mysql://...` (or `mariadb://`: MySQL or MariaDB,
//! through sqlx). Schemes are read whatever their case.
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
//! Each scheme is a feature (`sqlite`, `postgres`, `redis`, on by default; `mysql`,
//! which brings sqlx); a URL of a scheme left out is [`OpenError::NotBuilt`], naming the
//! feature.
//!
//! Invariant: `open` only connects. It creates no schema (call
//! [`ensure_schema`](idemcache::store::Store::ensure_schema)) and never executes anything.

#![cfg_attr(docsrs, feature(doc_cfg))]
// Where links to this crate's items go from documentation built without it (another
// crate's `cargo doc --no-deps`); `.ci/package` checks the version.
#![doc(html_root_url = "https://docs.rs/idemcache-any/0.1.0")]

use std::fmt;

pub use idemcache::store::AnyStore;
use idemcache::store::StoreError;
use idemcache::LapsePolicy;

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
                "{url:?} is not a store URL: use sqlite:PATH, postgres://..., redis://..., \
                 redis-cluster://... or mysql://..."
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

/// `url` without its passwords, for messages and logs: the password of its user part
/// (up to the last `@`, whatever it holds: a password may hold `@`, `/`, `?` or `#`), and
/// the value of every `password`, `pass` or `sslpassword` parameter, in a URL's query or a
/// libpq key/value string (`host=db password=secret`), quoted or not, with spaces around
/// its `=` or not (libpq allows both: `password = secret`).
pub fn redacted(url: &str) -> String {
    let mut out = hide_parameters(url);
    if let Some(start) = out.find("://").map(|i| i + 3) {
        if let Some(at) = out[start..].rfind('@').map(|i| start + i) {
            if let Some(colon) = out[start..at].find(':').map(|i| start + i) {
                out.replace_range(colon + 1..at, "***");
            }
        }
    }
    out
}

/// The parameters whose values are secrets.
const SECRET_PARAMETERS: [&str; 3] = ["password", "pass", "sslpassword"];

/// `text` with the value of each secret parameter ([`SECRET_PARAMETERS`], at the start,
/// or after `?`, `&`, `;` or whitespace; any case; spaces around its `=` allowed) replaced
/// by `***`.
fn hide_parameters(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut at_boundary = true;
    while let Some(c) = rest.chars().next() {
        if at_boundary {
            if let Some((named, value)) = secret_parameter(rest) {
                out.push_str(named);
                out.push_str("***");
                rest = &rest[named.len() + value..];
                at_boundary = false;
                continue;
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
        at_boundary = matches!(c, '?' | '&' | ';') || c.is_whitespace();
    }
    out
}

/// If `text` starts with a secret parameter: its name and `=` (with the spaces around
/// them), and the length of its value (quoted, libpq's `\'` and `\\` escapes included;
/// else up to the next separator).
fn secret_parameter(text: &str) -> Option<(&str, usize)> {
    let name_len = text.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
    let name = &text[..name_len];
    if !SECRET_PARAMETERS.iter().any(|secret| name.eq_ignore_ascii_case(secret)) {
        return None;
    }
    let after_name = text[name_len..].trim_start_matches([' ', '\t']);
    let after_equals = after_name.strip_prefix('=')?.trim_start_matches([' ', '\t']);
    let named = &text[..text.len() - after_equals.len()];
    let value = match after_equals.strip_prefix('\'') {
        Some(quoted) => {
            // A backslash quotes the next character: `\'` is not the closing quote.
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((at, c)) = chars.next() {
                match c {
                    '\\' => {
                        let _escaped = chars.next();
                    }
                    '\'' => {
                        end = at + 1;
                        break;
                    }
                    _ => {}
                }
            }
            1 + end
        }
        None => after_equals.find(['&', ' ', '\t', '\n', ';', '#']).unwrap_or(after_equals.len()),
    };
    Some((named, value))
}

/// Opens the store `url` names (see the crate docs for the schemes). Connects, or for
/// PostgreSQL builds a pool (`PostgresStore::connect`'s) that connects on first use;
/// creates no schema. Lapsed leases are taken over; [`open_with`] chooses.
pub async fn open(url: &str) -> Result<AnyStore, OpenError> {
    open_with(url, LapsePolicy::TakeOver).await
}

/// [`open`], the store built with `lapse_policy` (each store's `with_lapse_policy`):
/// e.g. `LapsePolicy::MarkUnknown { ttl }` for executions with external effects, whose
/// lapsed leases must never be re-run. A `ttl` of zero or over
/// [`MAX_DURATION`](idemcache::MAX_DURATION) is an [`OpenError::Store`] naming it.
pub async fn open_with(url: &str, lapse_policy: LapsePolicy) -> Result<AnyStore, OpenError> {
    let failed = |error| OpenError::Store { url: redacted(url), error };
    let _ = lapse_policy; // unused when no store is built in
    let scheme =
        url.split_once(':').map_or(String::new(), |(scheme, _)| scheme.to_ascii_lowercase());
    match scheme.as_str() {
        "sqlite" => {
            #[cfg(feature = "sqlite")]
            return idemcache_sqlite::SqliteStore::connect(url)
                .await
                .and_then(|store| store.with_lapse_policy(lapse_policy))
                .map(AnyStore::new)
                .map_err(failed);
            #[cfg(not(feature = "sqlite"))]
            return Err(OpenError::NotBuilt { scheme: "sqlite", feature: "sqlite" });
        }
        "postgres" | "postgresql" => {
            #[cfg(feature = "postgres")]
            return idemcache_postgres::PostgresStore::connect(url)
                .await
                .and_then(|store| store.with_lapse_policy(lapse_policy))
                .map(AnyStore::new)
                .map_err(failed);
            #[cfg(not(feature = "postgres"))]
            return Err(OpenError::NotBuilt { scheme: "postgres", feature: "postgres" });
        }
        "redis-cluster" => {
            #[cfg(feature = "redis")]
            return match cluster_nodes(url) {
                Ok(nodes) => idemcache_redis::RedisStore::connect_cluster(&nodes)
                    .await
                    .and_then(|store| store.with_lapse_policy(lapse_policy))
                    .map(AnyStore::new)
                    .map_err(failed),
                Err(e) => Err(failed(e)),
            };
            #[cfg(not(feature = "redis"))]
            return Err(OpenError::NotBuilt { scheme: "redis-cluster", feature: "redis" });
        }
        "redis" | "rediss" | "redis+unix" | "unix" => {
            #[cfg(feature = "redis")]
            return idemcache_redis::RedisStore::connect(url)
                .await
                .and_then(|store| store.with_lapse_policy(lapse_policy))
                .map(AnyStore::new)
                .map_err(failed);
            #[cfg(not(feature = "redis"))]
            return Err(OpenError::NotBuilt { scheme: "redis", feature: "redis" });
        }
        "mysql" | "mariadb" => {
            #[cfg(feature = "mysql")]
            return idemcache_sqlx::MySqlStore::connect(url)
                .await
                .and_then(|store| store.with_lapse_policy(lapse_policy))
                .map(AnyStore::new)
                .map_err(failed);
            #[cfg(not(feature = "mysql"))]
            return Err(OpenError::NotBuilt { scheme: "mysql", feature: "mysql" });
        }
        _ => {
            let _ = failed;
            Err(OpenError::UnknownScheme { url: redacted(url) })
        }
    }
}

/// The node URLs of `redis-cluster://[user:password@]h1:p1,h2:p2,...` (a path of `/`
/// or `/0` allowed: a cluster has one database): `redis://[user:password@]h:p` each.
/// Anything else after the hosts, or no host, is [`StoreError::InvalidInput`].
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
fn cluster_nodes(url: &str) -> Result<Vec<String>, StoreError> {
    let bad = |why: &str| {
        StoreError::InvalidInput(format!(
            "{why}: a Redis Cluster URL is redis-cluster://host:port,host:port,..."
        ))
    };
    let rest = url.split_once("://").map(|(_, rest)| rest).ok_or_else(|| bad("no ://"))?;
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), rest),
    };
    let hosts = hosts.strip_suffix("/0").or_else(|| hosts.strip_suffix('/')).unwrap_or(hosts);
    if hosts.contains(['/', '?', '#']) {
        return Err(bad("a cluster has one database and these URLs take no parameters"));
    }
    let nodes: Vec<String> = hosts
        .split(',')
        .filter(|host| !host.is_empty())
        .map(|host| format!("redis://{auth}{host}"))
        .collect();
    if nodes.is_empty() {
        return Err(bad("no node"));
    }
    Ok(nodes)
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
        assert_eq!(redacted("redis://:pa?zzsecret@cache:6379/12"), "redis://:***@cache:6379/12");
        assert_eq!(redacted("postgres://app:pa#zz@db/x"), "postgres://app:***@db/x");
        assert_eq!(
            redacted("host=127.0.0.1 user=postgres password=zzsecret dbname=test"),
            "host=127.0.0.1 user=postgres password=*** dbname=test"
        );
        assert_eq!(redacted("host=db password='a b c' user=u"), "host=db password=*** user=u");
        assert_eq!(
            redacted("redis+unix:///tmp/x.sock?db=12&pass=zzsecret"),
            "redis+unix:///tmp/x.sock?db=12&pass=***"
        );
        assert_eq!(
            redacted("postgres://db:5432/x?user=u&password=pa@zzsecret"),
            "postgres://db:5432/x?user=u&password=***"
        );
        assert_eq!(redacted("postgres://u@db/x?bypass=1"), "postgres://u@db/x?bypass=1");
    }

    /// libpq allows spaces around a parameter's `=`, has `sslpassword` (a client key's
    /// passphrase) and escapes a quote inside a quoted value with a backslash: each of
    /// these kept the password in the message.
    #[test]
    fn a_libpq_password_is_hidden_however_it_is_written() {
        for (url, shown) in [
            ("host=db password = zzsecret user=u", "host=db password = *** user=u"),
            ("host=db PASSWORD\t=zzsecret", "host=db PASSWORD\t=***"),
            ("host=db sslpassword=zzsecret user=u", "host=db sslpassword=*** user=u"),
            ("host=db password='a\\' zzsecret' user=u", "host=db password=*** user=u"),
            ("host=db password='a\\\\' user=zz", "host=db password=*** user=zz"),
            ("host=db password=", "host=db password=***"),
            ("host=db passwords=1 pass", "host=db passwords=1 pass"),
        ] {
            assert_eq!(redacted(url), shown, "{url}");
        }
    }

    #[test]
    fn a_cluster_url_names_each_node() {
        assert_eq!(
            cluster_nodes("redis-cluster://127.0.0.1:7000,127.0.0.1:7001/").unwrap(),
            ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]
        );
        assert_eq!(
            cluster_nodes("Redis-Cluster://:pw@a:1,b:2").unwrap(),
            ["redis://:pw@a:1", "redis://:pw@b:2"]
        );
        for bad in ["redis-cluster://", "redis-cluster://a:1/3", "redis-cluster://a:1?x=1"] {
            assert!(matches!(cluster_nodes(bad), Err(StoreError::InvalidInput(_))), "{bad}");
        }
    }

    #[tokio::test]
    async fn an_unreachable_cluster_names_its_nodes_and_never_its_password() {
        let e = open("redis-cluster://:zzsecret@127.0.0.1:1,127.0.0.1:2").await.unwrap_err();
        let said = format!("{e} {e:?} {}", std::error::Error::source(&e).unwrap());
        assert!(matches!(e, OpenError::Store { error: StoreError::Backend(_), .. }), "{e:?}");
        assert!(said.contains("127.0.0.1:1,127.0.0.1:2"), "{said}");
        assert!(!said.contains("zzsecret"), "{said}");
    }

    #[tokio::test]
    async fn a_url_of_no_store_is_a_typed_error_naming_it() {
        for url in ["mongodb://root:pw@db/x", "records.db", "", "host=db password=pw user=u"] {
            match open(url).await {
                Err(e @ OpenError::UnknownScheme { .. }) => {
                    assert!(!format!("{e} {e:?}").contains("pw"), "{e:?}");
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    /// `mysql://` (and `mariadb://`) open `idemcache-sqlx`'s `MySqlStore` when the
    /// `mysql` feature is built in, with the lapse policy asked for; without it, the
    /// error names the feature.
    #[tokio::test]
    #[cfg_attr(feature = "mysql", ignore = "needs IDEMCACHE_MYSQL_URL")]
    async fn a_mysql_url_opens_the_sqlx_store_or_names_its_feature() {
        #[cfg(not(feature = "mysql"))]
        for url in ["mysql://root@127.0.0.1/test", "MariaDB://root:pw@db/x"] {
            let e = open(url).await.unwrap_err();
            assert!(matches!(e, OpenError::NotBuilt { feature: "mysql", .. }), "{url}: {e:?}");
            assert!(!format!("{e} {e:?}").contains("pw"), "{e:?}");
        }
        #[cfg(feature = "mysql")]
        {
            use idemcache::store::{conformance, Store};
            let Some(url) =
                conformance::service_url("IDEMCACHE_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
            else {
                return;
            };
            let ttl = std::time::Duration::from_secs(3600);
            let store = open_with(&url, LapsePolicy::MarkUnknown { ttl }).await.unwrap();
            assert!(format!("{store:?}").contains("MySqlStore"), "{store:?}");
            store.ensure_schema().await.unwrap();
            conformance::run_mark_unknown(&store, ttl, true).await;
            let zero = LapsePolicy::MarkUnknown { ttl: std::time::Duration::ZERO };
            let refused = open_with(&url, zero).await.unwrap_err();
            assert!(matches!(refused, OpenError::Store { error: StoreError::InvalidInput(_), .. }));
        }
    }

    #[tokio::test]
    async fn schemes_are_read_whatever_their_case() {
        for url in ["SQLITE::memory:", "Sqlite::memory:"] {
            let store = open(url).await.unwrap();
            assert!(format!("{store:?}").contains("SqliteStore"), "{url}");
        }
        // A Redis nobody listens on: the Redis store was asked (it names the server).
        for url in ["REDIS://127.0.0.1:1/0", "Redis://127.0.0.1:1/0"] {
            let e = open(url).await.unwrap_err();
            assert!(e.to_string().contains("127.0.0.1:1"), "{url}: {e}");
            assert!(matches!(e, OpenError::Store { .. }), "{url}: {e:?}");
        }
    }

    #[tokio::test]
    async fn a_password_the_driver_would_misread_is_refused_and_never_printed() {
        for url in [
            "redis://:pa?zzsecret@127.0.0.1:6379/12",
            "postgres://127.0.0.1:5432/test?user=postgres&password=pa@zzsecret",
            "postgres://postgres:p@ss/zzsecret@127.0.0.1:1/test",
        ] {
            let e = open(url).await.unwrap_err();
            let said = format!("{e} {e:?} {}", std::error::Error::source(&e).unwrap());
            assert!(!said.contains("zzsecret") && !said.contains("ss/"), "{said}");
            assert!(
                matches!(e, OpenError::Store { error: StoreError::InvalidInput(_), .. }),
                "{e:?}"
            );
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
