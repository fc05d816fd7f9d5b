//! Doctored outbox histories the outbox history check must catch, and a clean one it
//! must pass: each an outbox chaos run's messages as `.ci/outbox-chaos` records them,
//! one defect planted at a time.

use idemcache_model::history::outbox::{check, files, Event, Kind, OutboxHistory, Property, Row};

const S: u128 = 1_000_000_000;

fn event(relay: &str, pid: u32, time: u128, kind: Kind, message: &str, token: u64) -> Event {
    // The clean history's attempts follow its tokens (every claim published).
    let attempt = u32::try_from(token).unwrap();
    Event { relay: relay.to_owned(), pid, time, kind, message: message.to_owned(), token, attempt }
}

fn row(state: u8, attempts: u32, token: u64, account: &str) -> Row {
    Row { state, attempts, token, account: account.to_owned(), amount: 1 }
}

/// The clean run: `m1` published and confirmed at once; `m2` published by r1, which was
/// killed before the broker answered, then by r2 under the next claim's token; `m3`
/// failed once and was confirmed at its second attempt; `m4` claimed by a relay killed
/// before it counted (token 1 spent, no publish), then published under token 2 as
/// attempt 1. Each was received once and credited its account once.
fn clean() -> OutboxHistory {
    let events = vec![
        event("relay.r1", 100, S, Kind::Begin, "m1", 1),
        event("relay.r1", 100, S + 10, Kind::Confirmed, "m1", 1),
        event("relay.r1", 100, S + 20, Kind::Begin, "m2", 1),
        // r1 killed; restarted as pid 300.
        event("relay.r1", 300, 5 * S, Kind::Begin, "m3", 1),
        event("relay.r1", 300, 5 * S + 10, Kind::Failed, "m3", 1),
        event("relay.r2", 200, 3 * S, Kind::Begin, "m2", 2),
        event("relay.r2", 200, 3 * S + 10, Kind::Confirmed, "m2", 2),
        event("relay.r2", 200, 7 * S, Kind::Begin, "m3", 2),
        event("relay.r2", 200, 7 * S + 10, Kind::Confirmed, "m3", 2),
        Event { attempt: 1, ..event("relay.r2", 200, 8 * S, Kind::Begin, "m4", 2) },
        Event { attempt: 1, ..event("relay.r2", 200, 8 * S + 10, Kind::Confirmed, "m4", 2) },
    ];
    let rows = [
        ("m1", row(2, 1, 1, "a1")),
        ("m2", row(2, 2, 2, "a2")),
        ("m3", row(2, 2, 2, "a3")),
        ("m4", row(2, 1, 2, "a4")),
    ];
    OutboxHistory {
        rows: rows.map(|(id, r)| (id.to_owned(), r)).into_iter().collect(),
        events,
        inbox: ["m1", "m2", "m3", "m4"].map(str::to_owned).to_vec(),
        accounts: [("a1", 1), ("a2", 1), ("a3", 1), ("a4", 1)]
            .map(|(a, b)| (a.to_owned(), b))
            .into_iter()
            .collect(),
    }
}

/// Checks `h` and asserts exactly `property` is violated, its counterexample naming
/// `message`; the report's last line says so.
fn caught(h: &OutboxHistory, property: Property, message: &str) {
    let checked = check(h);
    let report = checked.report();
    assert_eq!(checked.violated(), [property], "{report}");
    assert!(
        checked.violations.iter().all(|v| v.message == message),
        "{:?}\n{report}",
        checked.violations
    );
    assert!(report.contains(&format!("message {message}: ")), "{report}");
    let last = report.lines().last().unwrap();
    assert!(last.contains("violated:") && last.contains(&format!("{property:?}")), "{last}");
}

#[test]
fn a_clean_history_passes() {
    let checked = check(&clean());
    let report = checked.report();
    assert!(checked.holds(), "{report}");
    assert_eq!(
        report.lines().last().unwrap(),
        "outbox history: 4 messages, 6 publishes, applied once; tokens grow"
    );
    assert_eq!((checked.confirmed, checked.failed, checked.unanswered), (4, 1, 1), "{report}");
    assert_eq!((checked.delivered, checked.undelivered), (4, 0));
}

#[test]
fn applied_once_catches_a_message_applied_twice() {
    let mut h = clean();
    h.accounts.insert("a2".into(), 2);
    caught(&h, Property::AppliedOnce, "m2");
}

#[test]
fn applied_once_catches_a_message_received_twice_lost_or_invented() {
    let mut h = clean();
    h.inbox.push("m3".into());
    caught(&h, Property::AppliedOnce, "m3");

    let mut h = clean();
    h.inbox.retain(|id| id != "m1");
    h.accounts.remove("a1");
    caught(&h, Property::AppliedOnce, "m1");

    let mut h = clean();
    h.inbox.push("m9".into());
    caught(&h, Property::AppliedOnce, "m9");

    let mut h = clean();
    h.accounts.insert("a9".into(), 1);
    caught(&h, Property::AppliedOnce, "a9");
}

#[test]
fn tokens_grow_catches_a_lower_token_counted_later() {
    let mut h = clean();
    // r1's publish of m2 under token 1 counted after r2's under token 2 (attempts kept
    // rising, so only the token is out of order).
    for e in &mut h.events {
        if e.message == "m2" && e.relay == "relay.r1" {
            e.time = 4 * S;
            e.attempt = 3;
        }
    }
    h.rows.get_mut("m2").unwrap().attempts = 3;
    caught(&h, Property::TokensGrow, "m2");
}

#[test]
fn tokens_grow_catches_a_token_used_by_two_claims() {
    let mut h = clean();
    // r2 published m2 under r1's token 1 (as its second attempt).
    for e in &mut h.events {
        if e.message == "m2" && e.relay == "relay.r2" {
            e.token = 1;
        }
    }
    h.rows.get_mut("m2").unwrap().token = 1;
    caught(&h, Property::TokensGrow, "m2");
}

#[test]
fn tokens_grow_catches_a_token_above_the_rows_and_an_outcome_with_no_publish() {
    let mut h = clean();
    // m4's row holds token 1: its publish's token 2 was never minted.
    h.events.retain(|e| e.message != "m4");
    h.events.push(Event { attempt: 1, ..event("relay.r2", 200, 8 * S, Kind::Begin, "m4", 3) });
    h.events
        .push(Event { attempt: 1, ..event("relay.r2", 200, 8 * S + 9, Kind::Confirmed, "m4", 3) });
    h.rows.get_mut("m4").unwrap().token = 3;
    assert!(check(&h).holds());
    h.rows.get_mut("m4").unwrap().state = 1; // not delivered: only the token judged
    h.rows.get_mut("m4").unwrap().token = 2;
    caught(&h, Property::TokensGrow, "m4");

    let mut h = clean();
    // A confirmation of m9, which r1 never began (after its failure of m3).
    assert_eq!(h.events[4].kind, Kind::Failed);
    h.events.insert(5, event("relay.r1", 300, 6 * S, Kind::Confirmed, "m9", 1));
    h.rows.insert("m9".into(), row(0, 0, 0, "a9"));
    h.inbox.push("m9".into());
    h.accounts.insert("a9".into(), 1);
    caught(&h, Property::TokensGrow, "m9");
}

#[test]
fn attempts_catch_more_publishes_than_the_row_counts() {
    let mut h = clean();
    h.rows.get_mut("m2").unwrap().attempts = 1;
    caught(&h, Property::Attempts, "m2");

    let mut h = clean();
    // Both publishes of m3 counted as attempt 1: a count the row never made.
    for e in &mut h.events {
        if e.message == "m3" {
            e.attempt = 1;
        }
    }
    caught(&h, Property::Attempts, "m3");
}

#[test]
fn delivered_confirmed_catches_a_row_delivered_unconfirmed() {
    let mut h = clean();
    // r2's publish of m2 failed, yet the row is delivered under its token.
    for e in &mut h.events {
        if e.message == "m2" && e.kind == Kind::Confirmed {
            e.kind = Kind::Failed;
        }
    }
    caught(&h, Property::DeliveredConfirmed, "m2");
}

#[test]
fn nothing_dead_catches_a_dead_row() {
    let mut h = clean();
    h.rows.get_mut("m3").unwrap().state = 3;
    caught(&h, Property::NothingDead, "m3");
}

/// The files `.ci/outbox-chaos` writes, read back; a torn or unknown line fails naming
/// its file and line; a directory with no relay file, or none at all, cannot be read.
#[test]
fn files_are_read_strictly() {
    let dir = std::env::temp_dir().join(format!("outbox-history-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
    assert!(files::read(&dir).unwrap_err().contains("no relay.NAME file"));
    write("relay.r1", "1000\t7\tbegin\tm1\t1\t1\n1010\t7\tconfirmed\tm1\t1\t1\n");
    write("outbox", "m1\t2\t1\t1\ta1\t1\n");
    write("inbox", "m1\n");
    write("accounts", "a1\t1\n");
    let read = files::read(&dir).unwrap();
    assert!(check(&read).holds(), "{}", check(&read).report());
    assert_eq!(read.events.len(), 2);

    write("relay.r2", "1000\t8\tbegin\tm1\t1\t1\n1010\t8\tconfirm");
    let torn = files::read(&dir).unwrap_err();
    assert!(torn.contains("relay.r2:2: 3 fields"), "{torn}");
    write("relay.r2", "1000\t8\tpublished\tm1\t1\t1\n");
    assert!(files::read(&dir).unwrap_err().contains("relay.r2:1: not begin"));
    std::fs::remove_file(dir.join("relay.r2")).unwrap();
    write("outbox", "m1\t4\t1\t1\ta1\t1\n");
    assert!(files::read(&dir).unwrap_err().contains("outbox:1: the state 4"));
    write("outbox", "m1\t2\t1\t1\ta1\t1\nm1\t2\t1\t1\ta1\t1\n");
    assert!(files::read(&dir).unwrap_err().contains("outbox:2: a second row"));
    std::fs::remove_file(dir.join("inbox")).unwrap();
    write("outbox", "m1\t2\t1\t1\ta1\t1\n");
    assert!(files::read(&dir).unwrap_err().contains("inbox"));
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(files::read(&dir).is_err());
}
