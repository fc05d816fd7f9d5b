//! The subcommands that look at or settle records: `status`, `forget`, `resolve`,
//! `list`, `gc`; each prints text for people or, with `--json`, one JSON document.
//!
//! Invariant: they read records as `idem run` would find them (the same lapse
//! policy: a run killed mid-command reads as UNKNOWN once its lease lapsed), and each
//! change is one atomic store operation that acts only on the state it names.

use std::time::Duration;

use idemcache::store::{Store, StoreError};
use idemcache_sqlite::{Record, RecordState};
use serde_json::{json, Value};

use crate::db::Db;
use crate::exit::{self, Failure};
use crate::outcome::{Outcome, Stream};
use crate::output::{self, errln, outln};
use crate::run::{key, SCOPE};
use crate::timefmt::{ago, micros, rfc3339};

/// How many records a page of `list` reads at once.
const PAGE: usize = 200;
/// How many expired records one `gc` statement deletes.
const PURGE_BATCH: usize = 1000;

/// The key as the user typed it, for an `idem` key; another program's key in full.
fn shown(record: &Record) -> String {
    if record.key.scope() == SCOPE && record.key.tenant().is_none() {
        record.key.client_key().to_owned()
    } else {
        format!("{:?}", record.key)
    }
}

fn outcome_of(record: &Record) -> Option<Result<Outcome, String>> {
    (record.state == RecordState::Completed).then(|| match &record.body {
        Some(body) => Outcome::decode(body),
        None => Err("kept without its outcome".into()),
    })
}

fn json_of(record: &Record) -> Value {
    let time = |t| json!({ "utc": rfc3339(t), "unix_micros": micros(t) });
    let mut v = json!({
        "key": shown(record),
        "state": record.state.name(),
        "token": record.token.get(),
        "started_at": time(record.started_at),
        "settled_at": record.settled_at.map(time),
        "expires_at": time(record.expires_at),
        "lease_lapsed": record.lapsed,
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

/// One line for `list`.
fn line_of(record: &Record) -> String {
    let detail = match (record.state, outcome_of(record)) {
        (RecordState::Completed, Some(Ok(o))) => {
            format!(
                "{}  `{}`",
                o.status.describe(),
                if o.resolved { "(resolved by hand)".into() } else { o.command_line() }
            )
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
    format!("{:<10}  {}  {}", record.state.name(), shown(record), detail)
}

/// `idem status KEY`.
pub fn status(db: &Db, client_key: &str, as_json: bool) -> Result<u8, Failure> {
    let record = db.wait(db.store.record(&key(client_key)?))?;
    if as_json {
        let v = match &record {
            Some(r) => json_of(r),
            None => json!({ "key": client_key, "state": "ABSENT" }),
        };
        outln!("{v}");
        return Ok(0);
    }
    let Some(r) = record else {
        outln!("{client_key}: no record (a run executes it)");
        return Ok(0);
    };
    outln!("key:       {client_key}");
    outln!("state:     {}", r.state.name());
    outln!("started:   {} ({})", rfc3339(r.started_at), ago(r.started_at));
    match r.state {
        RecordState::Processing => {
            outln!(
                "lease:     ends {} ({}), renewed while the command runs",
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
            if let Some(at) = r.settled_at {
                let how =
                    if r.lapsed { "its run died mid-command (lease lapsed)" } else { "marked" };
                outln!("unknown:   {how} {} ({})", rfc3339(at), ago(at));
            }
            outln!("expires:   {} ({})", rfc3339(r.expires_at), ago(r.expires_at));
            outln!("next:      check whether the command had its effect, then");
            outln!("           idem resolve {client_key} --exit-code N   (it did)");
            outln!("           idem forget {client_key}                  (it did not)");
        }
    }
    Ok(0)
}

/// `idem forget KEY [--force]`.
pub fn forget(db: &Db, client_key: &str, force: bool, as_json: bool) -> Result<u8, Failure> {
    let key = key(client_key)?;
    let states: &[RecordState] = if force {
        &[RecordState::Unknown, RecordState::Processing, RecordState::Completed]
    } else {
        &[RecordState::Unknown]
    };
    match db.wait(db.store.remove_record(&key, states))? {
        Some(was) => {
            if as_json {
                outln!("{}", json!({ "key": client_key, "forgotten": true, "was": json_of(&was) }));
            } else {
                outln!(
                    "{client_key}: forgot its {} record; the next run executes the command",
                    was.state.name()
                );
                if was.state == RecordState::Processing {
                    outln!("(a run still holding it will not have its outcome recorded)");
                }
            }
            Ok(0)
        }
        None => {
            let now = db.wait(db.store.record(&key))?;
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
    db: &Db,
    client_key: &str,
    exit_code: u8,
    ttl: Duration,
    as_json: bool,
) -> Result<u8, Failure> {
    let key = key(client_key)?;
    let outcome = Outcome {
        status: crate::outcome::Status::Exited(exit_code.into()),
        stdout: Stream::Kept(Vec::new()),
        stderr: Stream::Kept(Vec::new()),
        argv: Vec::new(),
        resolved: true,
    };
    match idemcache::store::block_on(db.store.resolve(&key, Some(outcome.encode().into()), ttl)) {
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
        Err(StoreError::NotUnknown(_)) => {
            let now = db.wait(db.store.record(&key))?;
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
        Err(e) => Err(db.failure(e)),
    }
}

/// `idem list [--unknown]`.
pub fn list(db: &Db, unknown_only: bool, as_json: bool) -> Result<u8, Failure> {
    let mut only = idemcache::store::RecordFilter::new();
    if unknown_only {
        only = only.state(RecordState::Unknown);
    }
    let mut after = None;
    let mut all = Vec::new();
    loop {
        let page = db.wait(db.store.records(&only, after.as_ref(), PAGE))?;
        let full = page.len() == PAGE;
        after = page.last().map(|r| r.key.clone());
        for record in &page {
            if as_json {
                all.push(json_of(record));
            } else {
                outln!("{}", line_of(record));
            }
        }
        // The reader gone (`idem list | head`): the rest is not wanted.
        if !full || output::stdout_gone() {
            break;
        }
    }
    if as_json {
        outln!("{}", Value::Array(all));
    }
    Ok(0)
}

/// `idem gc`.
pub fn gc(db: &Db, as_json: bool) -> Result<u8, Failure> {
    let mut purged = 0;
    loop {
        let n = db.wait(db.store.purge_expired(PURGE_BATCH))?;
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
