//! The subcommands that look at or settle records: `status`, `forget`, `resolve`,
//! `list`, `gc`; each prints text for people or, with `--json`, one JSON document. They
//! act on idem's own database or, with `--store URL`, on any store ([`Target`]).
//!
//! Invariant: they read records as a claim of the store's handle would find them (idem's
//! own database: as `idem run` would, a run killed mid-command UNKNOWN once its lease
//! lapsed; another store: under the lapse policy `--unknown-ttl` names), and each change
//! is one atomic store operation that acts only on the state it names. An idem outcome
//! is decoded only from a record of idem's own scope; another record's body is told by
//! its size, and by its HTTP status when it is a response the HTTP layer stored.

use std::time::Duration;

use idemcache::store::encoding::hex;
use idemcache::store::{Record, RecordFilter, RecordState, Store, StoreError};
use idemcache::Key;
use serde_json::{json, Value};

use crate::exit::{self, Failure};
use crate::outcome::{Outcome, Stream};
use crate::output::{self, errln, outln};
use crate::run::SCOPE;
use crate::target::Target;
use crate::timefmt::{ago, micros, rfc3339};

/// How many records a page of `list` reads at once.
const PAGE: usize = 200;

/// Whether `key` is one of `idem run`'s own (its scope, no tenant).
fn is_idems(key: &Key) -> bool {
    key.scope() == SCOPE && key.tenant().is_none()
}

/// The HTTP status of a response the HTTP layer stored (`idemcache::layer`'s format,
/// `src/layer/stored_response.rs`: the magic `IDR1`, then the status as a big-endian
/// u16, then its fields and body), read from those first six bytes; `None` for a body
/// of another kind.
pub fn http_status(body: &[u8]) -> Option<u16> {
    let status = body.strip_prefix(b"IDR1")?.get(..2)?;
    let status = u16::from_be_bytes([status[0], status[1]]);
    (100..=999).contains(&status).then_some(status)
}
/// How many expired records one `gc` statement deletes.
const PURGE_BATCH: usize = 1000;

/// The key as the user typed it, for an `idem` key; another program's as its parts:
/// `[SCOPE] [TENANT] CLIENT_KEY` (`-` for no tenant).
fn shown(record: &Record) -> String {
    let key = &record.key;
    if is_idems(key) {
        key.client_key().to_owned()
    } else {
        format!("[{}] [{}] {}", key.scope(), key.tenant().unwrap_or("-"), key.client_key())
    }
}

/// The idem outcome a COMPLETED record of idem's own holds.
fn outcome_of(record: &Record) -> Option<Result<Outcome, String>> {
    let idems = is_idems(&record.key);
    (idems && record.state == RecordState::Completed).then(|| match &record.body {
        Some(body) => Outcome::decode(body),
        None => Err("kept without its outcome".into()),
    })
}

fn json_of(record: &Record) -> Value {
    let time = |t| json!({ "utc": rfc3339(t), "unix_micros": micros(t) });
    let processing = record.state == RecordState::Processing;
    let mut v = json!({
        "key": shown(record),
        "scope": record.key.scope(),
        "tenant": record.key.tenant(),
        "client_key": record.key.client_key(),
        "state": record.state.name(),
        "correlation_id": record.correlation_id.as_ref().map(|id| id.as_str()),
        "token": record.token.get(),
        "fencing_token": record.token.get(),
        "fingerprint": hex(&record.fingerprint.to_bytes()),
        "started_at": time(record.started_at),
        "settled_at": record.settled_at.map(time),
        "lease_ends_at": processing.then(|| time(record.expires_at)),
        "expires_at": time(record.expires_at),
        "lease_lapsed": record.lapsed,
        "result_bytes": record.body.as_ref().map(|b| b.len()),
        "http_status": record.body.as_deref().and_then(http_status),
    });
    if let Some(outcome) = outcome_of(record) {
        v["outcome"] = match outcome {
            Ok(o) => {
                let (kind, code) = match o.status {
                    crate::outcome::Status::Exited(c) => ("exited", c),
                    crate::outcome::Status::Signaled(n) => ("signaled", n),
                };
                let stream =
                    |s: &Stream| json!({ "bytes": s.len(), "kept": matches!(s, Stream::Kept(_)) });
                json!({
                    "status": kind,
                    "code": code,
                    "replayed_exit_code": o.status.exit_code(),
                    "command": o.argv.iter().map(|a| String::from_utf8_lossy(a).into_owned()).collect::<Vec<_>>(),
                    "resolved_by_hand": o.resolved,
                    "stdout": stream(&o.stdout),
                    "stderr": stream(&o.stderr),
                })
            }
            Err(why) => json!({ "unreadable": why }),
        };
    }
    v
}

/// One line for `list`: state, key, the fingerprint's first 8 bytes (hex), then what the
/// state says.
fn line_of(record: &Record) -> String {
    let detail = match (record.state, outcome_of(record)) {
        (RecordState::Completed, Some(Ok(o))) => {
            format!(
                "{}  `{}`",
                o.status.describe(),
                if o.resolved { "(resolved by hand)".into() } else { o.command_line() }
            )
        }
        (RecordState::Completed, _) if !is_idems(&record.key) => {
            let size = record.body.as_ref().map_or(0, |b| b.len());
            match record.body.as_deref().and_then(http_status) {
                Some(status) => format!("HTTP {status}, {size} bytes"),
                None => format!("{size} bytes"),
            }
        }
        (RecordState::Completed, _) => "unreadable outcome".into(),
        (RecordState::Processing, _) => format!(
            "running since {} (lease ends {})",
            ago(record.started_at),
            ago(record.expires_at)
        ),
        (RecordState::Unknown, _) if record.lapsed => {
            format!("its run died mid-command {}", record.settled_at.map(ago).unwrap_or_default())
        }
        (RecordState::Unknown, _) => {
            format!("marked {}", record.settled_at.map(ago).unwrap_or_default())
        }
    };
    // The fingerprint's first 8 bytes: two keys for one intent (a client that made a
    // new key per attempt) show the same one, without `--json`.
    let fp = hex(&record.fingerprint.to_bytes()[..8]);
    format!("{:<10}  {}  fp {fp}  {}", record.state.name(), shown(record), detail)
}

/// `idem status KEY`.
pub fn status(t: &Target, key: &Key, as_json: bool) -> Result<u8, Failure> {
    let client_key = key.client_key();
    let record = t.wait(t.store.record(key))?;
    if as_json {
        let v = match &record {
            Some(r) => json_of(r),
            None => json!({ "key": client_key, "state": "ABSENT" }),
        };
        outln!("{v}");
        return Ok(0);
    }
    let Some(r) = record else {
        if is_idems(key) && t.is_local() {
            outln!("{client_key}: no record (a run executes it)");
            return Ok(0);
        }
        outln!(
            "{client_key}: no record under scope {:?}, tenant {} (a request with it executes)",
            key.scope(),
            key.tenant().map_or_else(|| "(none)".to_owned(), |t| format!("{t:?}"))
        );
        // The operator may have the client key without its scope and tenant.
        let elsewhere = RecordFilter::new().client_key(client_key);
        if let Ok(found) = t.wait(t.store.records(&elsewhere, None, 1)) {
            if !found.is_empty() {
                let store = t.store_option();
                outln!("           records of this client key exist elsewhere: idem list {store}--key {client_key}");
            }
        }
        return Ok(0);
    };
    outln!("key:       {client_key}");
    if !is_idems(key) {
        outln!("scope:     {}", key.scope());
        outln!("tenant:    {}", key.tenant().unwrap_or("(none)"));
    }
    outln!("state:     {}", r.state.name());
    outln!("started:   {} ({})", rfc3339(r.started_at), ago(r.started_at));
    outln!("token:     {} (fencing token)", r.token.get());
    outln!("request:   {} (fingerprint)", hex(&r.fingerprint.to_bytes()));
    if let Some(id) = &r.correlation_id {
        outln!("by:        {id} (the request's correlation id: find its logs by it)");
    }
    if let Some(body) = &r.body {
        match http_status(body) {
            Some(code) => outln!("result:    {} bytes, an HTTP {code} response", body.len()),
            None => outln!("result:    {} bytes", body.len()),
        }
    }
    match r.state {
        RecordState::Processing => {
            let holder = if is_idems(key) { "the command runs" } else { "its request executes" };
            outln!(
                "lease:     ends {} ({}), renewed while {holder}",
                rfc3339(r.expires_at),
                ago(r.expires_at)
            );
        }
        RecordState::Completed => {
            if let Some(at) = r.settled_at {
                outln!("completed: {} ({})", rfc3339(at), ago(at));
            }
            match outcome_of(&r) {
                Some(Ok(o)) => {
                    outln!(
                        "outcome:   {} (a repeat exits {})",
                        o.status.describe(),
                        o.status.exit_code()
                    );
                    if o.resolved {
                        outln!("command:   (resolved by hand with idem resolve)");
                    } else {
                        outln!("command:   {}", o.command_line());
                    }
                    let kept = |s: &Stream| {
                        if matches!(s, Stream::Kept(_)) {
                            "kept"
                        } else {
                            "not kept: over the limit"
                        }
                    };
                    outln!("stdout:    {} bytes ({})", o.stdout.len(), kept(&o.stdout));
                    outln!("stderr:    {} bytes ({})", o.stderr.len(), kept(&o.stderr));
                }
                Some(Err(why)) => outln!("outcome:   unreadable: {why}"),
                None => {}
            }
            outln!("expires:   {} ({})", rfc3339(r.expires_at), ago(r.expires_at));
        }
        RecordState::Unknown => {
            let idems = is_idems(key);
            if let Some(at) = r.settled_at {
                let how = match (r.lapsed, idems) {
                    (true, true) => "its run died mid-command (lease lapsed)",
                    (true, false) => "its execution died mid-request (lease lapsed)",
                    (false, _) => "marked",
                };
                outln!("unknown:   {how} {} ({})", rfc3339(at), ago(at));
            }
            outln!("expires:   {} ({})", rfc3339(r.expires_at), ago(r.expires_at));
            let addressed = t.addressed(key);
            if idems {
                outln!("next:      check whether the command had its effect, then");
                outln!("           idem resolve {addressed} --exit-code N   (it did)");
                outln!("           idem forget {addressed}                  (it did not)");
            } else {
                outln!("next:      check whether the request had its effect, then let the");
                outln!("           service's reconciler settle it (it did), or");
                outln!("           idem forget {addressed}   (it did not)");
            }
        }
    }
    Ok(0)
}

/// `idem forget KEY [--force]`.
pub fn forget(t: &Target, key: &Key, force: bool, as_json: bool) -> Result<u8, Failure> {
    let client_key = key.client_key();
    let states: &[RecordState] = if force {
        &[RecordState::Unknown, RecordState::Processing, RecordState::Completed]
    } else {
        &[RecordState::Unknown]
    };
    match t.wait(t.store.remove_record(key, states))? {
        Some(was) => {
            if as_json {
                outln!("{}", json!({ "key": client_key, "forgotten": true, "was": json_of(&was) }));
            } else {
                let (next, holder) = if is_idems(key) {
                    ("the next run executes the command", "a run still holding it")
                } else {
                    ("the next request with it executes", "an execution still holding it")
                };
                outln!("{client_key}: forgot its {} record; {next}", was.state.name());
                if was.state == RecordState::Processing {
                    outln!("({holder} will not have its outcome recorded)");
                }
            }
            Ok(0)
        }
        None => {
            let now = t.wait(t.store.record(key))?;
            let why = match &now {
                None => "it has no record".to_owned(),
                Some(r) => format!(
                    "it is {}: forget clears UNKNOWN records only; --force clears any",
                    r.state.name()
                ),
            };
            if as_json {
                outln!("{}", json!({ "key": client_key, "forgotten": false, "why": why }));
            } else {
                errln!("idem: {client_key}: nothing forgotten: {why}");
            }
            Ok(exit::REFUSED)
        }
    }
}

/// `idem resolve KEY --exit-code N`.
pub fn resolve(
    t: &Target,
    key: &Key,
    exit_code: u8,
    ttl: Duration,
    as_json: bool,
) -> Result<u8, Failure> {
    let client_key = key.client_key();
    if !is_idems(key) {
        // The outcome idem records is a command's; another program replays what it
        // stored itself (an HTTP response), which idem cannot write for it.
        return Err(Failure::new(
            exit::USAGE,
            "resolve records an idem command's outcome, under idem's own scope and no tenant: \
             another program's record is resolved by that program (or forgotten with idem forget)",
        ));
    }
    let outcome = Outcome {
        status: crate::outcome::Status::Exited(exit_code.into()),
        stdout: Stream::Kept(Vec::new()),
        stderr: Stream::Kept(Vec::new()),
        argv: Vec::new(),
        resolved: true,
    };
    match t.wait_raw(t.store.resolve(key, Some(outcome.encode().into()), ttl)) {
        Ok(replay) => {
            if as_json {
                outln!(
                    "{}",
                    json!({ "key": client_key, "resolved": true, "exit_code": exit_code, "expires_at": rfc3339(replay.expires_at) })
                );
            } else {
                outln!("{client_key}: resolved as exit {exit_code}: repeats exit {exit_code} without running (until {})", rfc3339(replay.expires_at));
            }
            Ok(0)
        }
        Err(StoreError::NothingToSettle(_)) => {
            let now = t.wait(t.store.record(key))?;
            let why = match now {
                None => "it has no record".to_owned(),
                Some(r) => format!("it is {}, not UNKNOWN", r.state.name()),
            };
            if as_json {
                outln!("{}", json!({ "key": client_key, "resolved": false, "why": why }));
            } else {
                errln!("idem: {client_key}: not resolved: {why}");
            }
            Ok(exit::REFUSED)
        }
        Err(e) => Err(t.failure(e)),
    }
}

/// What `idem list` selects and how many it prints.
#[derive(Debug)]
pub struct Listing {
    /// The records selected.
    pub filter: RecordFilter,
    /// The most printed: the oldest ones.
    pub limit: usize,
}

/// `idem list [--unknown] [--in-progress] [--scope S] [--tenant T] [--key K]`: the
/// `limit` oldest (by claim time) live records the filter selects. Reads every page (a
/// store lists in key order) and keeps only the oldest `limit` between pages, so its
/// memory is bounded by the limit, whatever the store holds.
pub fn list(t: &Target, listing: &Listing, as_json: bool) -> Result<u8, Failure> {
    let oldest = |r: &Record| (r.started_at, r.key.as_bytes().to_vec());
    let mut after: Option<Key> = None;
    let mut kept: Vec<Record> = Vec::new();
    loop {
        let page = t.wait(t.store.records(&listing.filter, after.as_ref(), PAGE))?;
        let full = page.len() == PAGE;
        after = page.last().map(|r| r.key.clone());
        kept.extend(page);
        kept.sort_by_key(oldest);
        kept.truncate(listing.limit);
        if !full {
            break;
        }
    }
    if as_json {
        outln!("{}", Value::Array(kept.iter().map(json_of).collect()));
        return Ok(0);
    }
    if kept.is_empty() {
        // On stderr: a script reading stdout sees an empty listing, a person sees why.
        errln!("idem: no records match");
    }
    for record in &kept {
        // The reader gone (`idem list | head`): the rest is not wanted.
        if output::stdout_gone() {
            break;
        }
        outln!("{}", line_of(record));
    }
    Ok(0)
}

/// `idem gc` (or `idem purge`).
pub fn gc(t: &Target, as_json: bool) -> Result<u8, Failure> {
    let mut purged = 0;
    loop {
        let n = t.wait(t.store.purge_expired(PURGE_BATCH))?;
        purged += n;
        if n < PURGE_BATCH {
            break;
        }
    }
    if as_json {
        outln!("{}", json!({ "purged": purged }));
    } else {
        outln!("purged {purged} expired record{}", if purged == 1 { "" } else { "s" });
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_http_status_is_read_from_the_layers_stored_form_only() {
        assert_eq!(http_status(b"IDR1\x00\xc9\x00\x00\x00\x00body"), Some(201));
        assert_eq!(http_status(b"IDR1\x01\xf4"), Some(500));
        for other in [&b"IDR1\x00"[..], b"IDR2\x00\xc9", b"", b"IDR1\x00\x05", b"IDR1\xff\xff"] {
            assert_eq!(http_status(other), None, "{other:?}");
        }
    }
}
