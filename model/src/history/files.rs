//! Reading a fault run's evidence from its directory into a [`History`]: the clients'
//! ledger, the executions' log, and what the database committed.
//!
//! Invariant: every line of every file is read or the whole read fails, naming the file
//! and line: a history the checker half understood would pass by leaving things out.
//!
//! The files (`.ci/faults` writes them; each a TSV, no header unless said):
//! - `ledger`: the load clients' attempts, one a line, under a header: `key attempt port
//!   sent ended outcome replayed order skew` (.ci/faults.py);
//! - `executions`: `key token`, a line at the start of each execution, and `key token
//!   committed` once the order it inserted committed (the orders example's
//!   `ORDERS_HISTORY`);
//! - `orders`: `key order`, the orders table's rows;
//! - `records`: `stored-key-in-hex state token`, the idempotency records.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::path::Path;

use super::spec::Ret;
use super::{Answer, Attempt, History, KeyHistory, Record};

/// Reads the history in `dir`; with `tenant`, only the records of that tenant's keys
/// (a database holding several runs' or groups' records).
pub fn read(dir: &Path, tenant: Option<&str>) -> Result<History, String> {
    let mut keys: BTreeMap<String, KeyHistory> = BTreeMap::new();
    for (at, fields) in lines(dir, "ledger", 9..=9)?.into_iter().skip(1) {
        let number = |i: usize| fields[i].parse::<f64>().map_err(|_| bad(&at, &fields[i]));
        let attempt = Attempt {
            n: fields[1].parse().map_err(|_| bad(&at, &fields[1]))?,
            port: fields[2].parse().map_err(|_| bad(&at, &fields[2]))?,
            sent: number(3)?,
            ended: number(4)?,
            outcome: fields[5].clone(),
            answer: answer(&fields[5], &fields[6], &fields[7])
                .map_err(|why| format!("{at}: {why}"))?,
        };
        keys.entry(fields[0].clone()).or_default().attempts.push(attempt);
    }
    for (at, fields) in lines(dir, "executions", 2..=3)? {
        let token = fields[1].parse().map_err(|_| bad(&at, &fields[1]))?;
        let key = keys.entry(fields[0].clone()).or_default();
        match fields.get(2).map(String::as_str) {
            None => key.executions.push(token),
            Some("committed") => key.committed.push(token),
            Some(other) => return Err(format!("{at}: not \"committed\": {other:?}")),
        }
    }
    for (at, fields) in lines(dir, "orders", 2..=2)? {
        let order = fields[1].parse().map_err(|_| bad(&at, &fields[1]))?;
        let key = keys.entry(fields[0].clone()).or_default();
        if key.row.replace(order).is_some() {
            return Err(format!("{at}: a second row for the key {}", fields[0]));
        }
    }
    for (at, fields) in lines(dir, "records", 3..=3)? {
        let stored = unhex(&fields[0]).ok_or_else(|| bad(&at, &fields[0]))?;
        let stored = idemcache::Key::from_bytes(&stored).map_err(|e| format!("{at}: {e}"))?;
        if tenant.is_some_and(|t| stored.tenant() != Some(t)) {
            continue;
        }
        let record = Record {
            state: fields[1].parse().map_err(|_| bad(&at, &fields[1]))?,
            token: fields[2].parse().map_err(|_| bad(&at, &fields[2]))?,
        };
        keys.entry(stored.client_key().to_owned()).or_default().record = Some(record);
    }
    Ok(History { keys })
}

/// An attempt's answer from the ledger's `outcome`, `replayed` and `order` columns.
fn answer(outcome: &str, replayed: &str, order: &str) -> Result<Answer, String> {
    Ok(match outcome {
        // The connection was refused: no server ever saw the request.
        "refused" => Answer::Dropped,
        // The request may have reached a server that executed it and died, or answered
        // after the client stopped waiting: an outcome nobody saw.
        "broken" | "timeout" => Answer::Indeterminate,
        _ if outcome.starts_with('5') => Answer::Indeterminate,
        "201" => {
            let order = order.parse().map_err(|_| format!("a 201 naming no order: {order:?}"))?;
            Answer::Returned(if replayed == "1" {
                Ret::Replayed(order)
            } else {
                Ret::Executed(order)
            })
        }
        "409:request_in_progress" => Answer::Returned(Ret::InProgress),
        "409:outcome_unknown" => Answer::Returned(Ret::Unknown),
        other => Answer::Returned(Ret::Refused(other.to_owned())),
    })
}

/// The lines of `dir/name`, each split into tab-separated fields, as many as `fields`
/// allows, with where each is (`name:line`).
pub(crate) fn lines(
    dir: &Path,
    name: &str,
    fields: RangeInclusive<usize>,
) -> Result<Vec<(String, Vec<String>)>, String> {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let at = format!("{}:{}", path.display(), n + 1);
        let split: Vec<String> = line.split('\t').map(str::to_owned).collect();
        if !fields.contains(&split.len()) {
            return Err(format!("{at}: {} fields, not {fields:?}: {line:?}", split.len()));
        }
        out.push((at, split));
    }
    Ok(out)
}

pub(crate) fn bad(at: &str, field: &str) -> String {
    format!("{at}: not a number: {field:?}")
}

/// The bytes `hex` spells (lower or upper case), or `None`.
fn unhex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect()
}
