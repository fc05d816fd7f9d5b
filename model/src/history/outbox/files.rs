//! Reading an outbox chaos run's evidence from its directory into an [`OutboxHistory`]:
//! the relays' histories and what the databases hold at the end.
//!
//! Invariant: every line of every file is read or the whole read fails, naming the file
//! and line (a torn line included: the relay writes each whole, so none should be): a
//! history the checker half understood would pass by leaving things out.
//!
//! The files (`.ci/outbox-chaos` writes them; each a TSV, no header):
//! - `relay.NAME`, one per relay (at least one): `time pid event message_id token
//!   attempt`, `event` one of `begin`, `confirmed`, `failed` (the relay's
//!   `RELAY_HISTORY`, appended by each of its processes in turn);
//! - `outbox`: `message_id state attempts token account amount`, the outbox's rows (the
//!   account and amount from each payload);
//! - `inbox`: `message_id`, the consumer's inbox rows;
//! - `accounts`: `account balance`, the ledger's balances.

use std::collections::BTreeMap;
use std::path::Path;

use super::{Event, Kind, OutboxHistory, Row};
use crate::history::files::{bad, lines};

/// Reads the history in `dir`.
pub fn read(dir: &Path) -> Result<OutboxHistory, String> {
    let mut history = OutboxHistory::default();
    let listed = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut relays = Vec::new();
    for entry in listed {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        let name = entry.file_name().into_string().map_err(|name| {
            format!("{}: a file name that is not UTF-8: {name:?}", dir.display())
        })?;
        if name.starts_with("relay.") {
            relays.push(name);
        }
    }
    if relays.is_empty() {
        return Err(format!("{}: no relay.NAME file", dir.display()));
    }
    relays.sort();
    for relay in relays {
        for (at, fields) in lines(dir, &relay, 6..=6)? {
            let kind = match fields[2].as_str() {
                "begin" => Kind::Begin,
                "confirmed" => Kind::Confirmed,
                "failed" => Kind::Failed,
                other => {
                    return Err(format!("{at}: not begin, confirmed or failed: {other:?}"));
                }
            };
            if fields[3].is_empty() {
                return Err(format!("{at}: an empty message id"));
            }
            history.events.push(Event {
                relay: relay.clone(),
                time: fields[0].parse().map_err(|_| bad(&at, &fields[0]))?,
                pid: fields[1].parse().map_err(|_| bad(&at, &fields[1]))?,
                kind,
                message: fields[3].clone(),
                token: fields[4].parse().map_err(|_| bad(&at, &fields[4]))?,
                attempt: fields[5].parse().map_err(|_| bad(&at, &fields[5]))?,
            });
        }
    }
    for (at, fields) in lines(dir, "outbox", 6..=6)? {
        let state: u8 = fields[1].parse().map_err(|_| bad(&at, &fields[1]))?;
        if state > 3 {
            return Err(format!("{at}: the state {state} is none of 0..=3"));
        }
        if fields[0].is_empty() || fields[4].is_empty() {
            return Err(format!("{at}: an empty message id or account: {fields:?}"));
        }
        let row = Row {
            state,
            attempts: fields[2].parse().map_err(|_| bad(&at, &fields[2]))?,
            token: fields[3].parse().map_err(|_| bad(&at, &fields[3]))?,
            account: fields[4].clone(),
            amount: fields[5].parse().map_err(|_| bad(&at, &fields[5]))?,
        };
        if history.rows.insert(fields[0].clone(), row).is_some() {
            return Err(format!("{at}: a second row for the message {}", fields[0]));
        }
    }
    for (at, fields) in lines(dir, "inbox", 1..=1)? {
        if fields[0].is_empty() {
            return Err(format!("{at}: an empty message id"));
        }
        history.inbox.push(fields[0].clone());
    }
    let mut accounts = BTreeMap::new();
    for (at, fields) in lines(dir, "accounts", 2..=2)? {
        let balance: i64 = fields[1].parse().map_err(|_| bad(&at, &fields[1]))?;
        if accounts.insert(fields[0].clone(), balance).is_some() {
            return Err(format!("{at}: a second balance for the account {}", fields[0]));
        }
    }
    history.accounts = accounts;
    Ok(history)
}
