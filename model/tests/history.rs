//! Doctored histories the history check must catch, and clean ones it must pass: each
//! a fault run's key as `.ci/faults` records it, one defect planted at a time.

use idemcache_model::history::spec::{Mode, Ret};
use idemcache_model::history::{check, files, Answer, Attempt, History, KeyHistory, Record};

/// An attempt from `sent` to `ended` (s) that returned `ret`.
fn returned(n: u32, sent: f64, ended: f64, ret: Ret) -> Attempt {
    let outcome = match &ret {
        Ret::Executed(_) | Ret::Replayed(_) => "201".to_owned(),
        Ret::InProgress => "409:request_in_progress".to_owned(),
        Ret::Unknown => "409:outcome_unknown".to_owned(),
        other => format!("{other:?}"),
    };
    Attempt { n, port: 3981, sent, ended, outcome, answer: Answer::Returned(ret) }
}

/// An attempt whose outcome nobody saw (`outcome`: broken, timeout, 500).
fn lost(n: u32, sent: f64, ended: f64, outcome: &str) -> Attempt {
    let answer = Answer::Indeterminate;
    Attempt { n, port: 3982, sent, ended, outcome: outcome.to_owned(), answer }
}

fn refused(n: u32, at: f64) -> Attempt {
    let outcome = "refused".to_owned();
    Attempt { n, port: 3983, sent: at, ended: at, outcome, answer: Answer::Dropped }
}

/// A key with `attempts`, `executions` logged, its row, its completed record's token.
fn key(
    attempts: Vec<Attempt>,
    executions: &[u64],
    row: Option<i64>,
    record: Option<u64>,
) -> KeyHistory {
    KeyHistory {
        attempts,
        executions: executions.to_vec(),
        committed: Vec::new(),
        row,
        record: record.map(|token| Record { state: 2, token }),
    }
}

fn history(keys: Vec<(&str, KeyHistory)>) -> History {
    History { keys: keys.into_iter().map(|(k, h)| (k.to_owned(), h)).collect() }
}

/// The clean run: a key answered at once; one whose holder was killed (a broken
/// connection), taken over after a 409 and executed again; one whose holder committed
/// and died, replayed; one whose first attempts timed out and got a 500 after
/// executing, then replayed; a refused connection; a key left UNKNOWN with no row.
fn clean() -> History {
    let mut h = history(vec![
        ("c0-1", key(vec![returned(1, 0.0, 0.1, Ret::Executed(1))], &[10], Some(1), Some(10))),
        (
            "c0-2",
            key(
                vec![
                    lost(1, 0.2, 0.3, "broken"),
                    returned(2, 0.35, 0.36, Ret::InProgress),
                    refused(3, 0.4),
                    returned(4, 0.5, 2.0, Ret::Executed(7)),
                ],
                &[20, 21],
                Some(7),
                Some(21),
            ),
        ),
        (
            "c1-1",
            key(
                vec![lost(1, 0.0, 0.2, "broken"), returned(2, 0.3, 0.31, Ret::Replayed(3))],
                &[30],
                Some(3),
                Some(30),
            ),
        ),
        (
            "c2-1",
            key(
                vec![
                    lost(1, 0.0, 5.0, "timeout"),
                    lost(2, 5.1, 5.2, "500"),
                    lost(3, 5.3, 5.4, "broken"),
                    returned(4, 5.5, 5.6, Ret::Replayed(4)),
                    // Its connection broke after the replay was written (never seen).
                ],
                &[40],
                Some(4),
                Some(40),
            ),
        ),
        (
            "c3-1",
            key(
                vec![
                    lost(1, 0.0, 0.1, "500"),
                    returned(2, 0.2, 0.3, Ret::Unknown),
                    returned(3, 0.4, 0.5, Ret::Unknown),
                ],
                &[50],
                None,
                None,
            ),
        ),
    ]);
    // The commits logged (c1-1's and c2-1's executions died before their lines).
    h.keys.get_mut("c0-1").unwrap().committed = vec![10];
    h.keys.get_mut("c0-2").unwrap().committed = vec![21];
    h
}

fn violations(h: &History, mode: Mode) -> (Vec<String>, usize) {
    let checked = check(h, mode);
    (checked.not_linearizable.clone(), checked.tokens.violations.len())
}

#[test]
fn a_clean_history_passes_with_attempts_that_executed_unseen() {
    let checked = check(&clean(), Mode::Together);
    let report = checked.report();
    assert!(checked.holds(), "{report}");
    assert!(
        report.ends_with("history: 5 keys, 18 operations, linearizable; tokens grow\n"),
        "{report}"
    );
    assert_eq!((checked.indeterminate, checked.dropped), (6, 1));
    assert!(check(&clean(), Mode::AfterCommit).holds());
}

/// `clean()` with `key`'s history changed by `doctor`.
fn doctored(key: &str, doctor: impl FnOnce(&mut KeyHistory)) -> History {
    let mut h = clean();
    doctor(h.keys.get_mut(key).unwrap());
    h
}

#[test]
fn a_second_execution_is_caught() {
    // The 409 answered, then executed again while the first execution had committed.
    let h = doctored("c0-1", |k| {
        k.attempts[0].ended = 0.05;
        k.attempts.push(returned(2, 0.2, 0.3, Ret::Executed(1)));
        k.executions.push(11);
        k.record = Some(Record { state: 2, token: 11 });
    });
    // Its tokens show it too: inserted under 10, completed under 11.
    assert_eq!(violations(&h, Mode::Together), (vec!["c0-1".to_owned()], 1));
    // Records written after the commit allow it: the backstop answers the one order.
    assert_eq!(violations(&h, Mode::AfterCommit), (vec![], 0));
}

#[test]
fn a_second_order_is_caught_in_either_mode() {
    let h = doctored("c0-1", |k| k.attempts.push(returned(2, 0.2, 0.3, Ret::Executed(2))));
    assert_eq!(violations(&h, Mode::AfterCommit).0, vec!["c0-1".to_owned()]);
}

#[test]
fn a_replay_answered_before_the_executing_attempt_was_sent_is_caught() {
    let h = doctored("c0-2", |k| k.attempts.insert(0, returned(0, 0.0, 0.1, Ret::Replayed(7))));
    assert_eq!(violations(&h, Mode::Together).0, vec!["c0-2".to_owned()]);
    assert_eq!(violations(&h, Mode::AfterCommit).0, vec!["c0-2".to_owned()]);
}

#[test]
fn a_409_after_a_replay_is_caught() {
    let h = doctored("c1-1", |k| k.attempts.push(returned(3, 0.4, 0.41, Ret::InProgress)));
    assert_eq!(violations(&h, Mode::Together).0, vec!["c1-1".to_owned()]);
    let h = doctored("c1-1", |k| k.attempts.push(returned(3, 0.4, 0.41, Ret::Unknown)));
    assert_eq!(violations(&h, Mode::Together).0, vec!["c1-1".to_owned()]);
    // A record written after the commit may still be PROCESSING or UNKNOWN over it.
    assert_eq!(violations(&h, Mode::AfterCommit).0, Vec::<String>::new());
}

#[test]
fn a_replay_naming_another_order_is_caught() {
    let h = doctored("c0-1", |k| k.attempts.push(returned(2, 0.2, 0.3, Ret::Replayed(2))));
    assert_eq!(violations(&h, Mode::Together).0, vec!["c0-1".to_owned()]);
    assert_eq!(violations(&h, Mode::AfterCommit).0, vec!["c0-1".to_owned()]);
}

#[test]
fn a_replay_of_a_key_whose_row_is_absent_is_caught() {
    // The cache replayed what the store never committed.
    let h = doctored("c1-1", |k| k.row = None);
    assert_eq!(violations(&h, Mode::Together).0, vec!["c1-1".to_owned()]);
    assert_eq!(violations(&h, Mode::AfterCommit).0, vec!["c1-1".to_owned()]);
    // So is a row naming another order than the answers did.
    let h = doctored("c0-1", |k| k.row = Some(2));
    assert_eq!(violations(&h, Mode::Together).0, vec!["c0-1".to_owned()]);
}

#[test]
fn a_row_no_answer_could_have_made_is_caught() {
    // Every attempt answered 409 unknown, none in flight, yet an order committed.
    let h = doctored("c3-1", |k| {
        k.attempts.remove(0);
        k.row = Some(9);
        k.record = Some(Record { state: 2, token: 50 });
    });
    assert_eq!(violations(&h, Mode::Together).0, vec!["c3-1".to_owned()]);
}

#[test]
fn a_committed_token_lower_than_another_executions_is_caught() {
    // The insert's line lost (killed after the commit): the record's token judged.
    let h = doctored("c0-2", |k| {
        k.committed.clear();
        k.record = Some(Record { state: 2, token: 20 });
    });
    assert_eq!(violations(&h, Mode::Together), (vec![], 1));
    assert_eq!(violations(&h, Mode::AfterCommit), (vec![], 1));
    let report = check(&h, Mode::Together).report();
    assert!(report.contains("completed under token 20, an execution held 21"), "{report}");
}

#[test]
fn a_token_executed_twice_is_caught() {
    let h = doctored("c0-2", |k| k.executions = vec![21, 21]);
    assert_eq!(violations(&h, Mode::Together), (vec![], 1));
}

#[test]
fn a_committed_token_no_execution_logged_is_caught() {
    let h = doctored("c0-1", |k| {
        k.committed.clear();
        k.record = Some(Record { state: 2, token: 99 });
    });
    assert_eq!(violations(&h, Mode::Together), (vec![], 1));
}

#[test]
fn an_order_without_its_completed_record_is_caught_only_in_one_commit() {
    let h = doctored("c0-1", |k| k.record = Some(Record { state: 1, token: 10 }));
    assert_eq!(violations(&h, Mode::Together), (vec![], 1));
    let checked = check(&h, Mode::AfterCommit);
    assert!(checked.holds(), "{}", checked.report());
    assert_eq!(checked.tokens.unjudged, 1);
}

#[test]
fn many_attempts_in_flight_do_not_stall_a_failing_check() {
    // Forty broken connections, then a replay of an order no row holds.
    let mut attempts: Vec<Attempt> =
        (0..40).map(|n| lost(n + 1, f64::from(n), f64::from(n) + 0.5, "broken")).collect();
    attempts.push(returned(41, 50.0, 50.1, Ret::Replayed(1)));
    attempts.push(returned(42, 51.0, 51.1, Ret::InProgress));
    let h = history(vec![("c0-1", key(attempts, &[1], Some(1), Some(1)))]);
    let checked = check(&h, Mode::Together);
    assert_eq!(checked.not_linearizable, vec!["c0-1".to_owned()]);
    assert!(checked.report().contains("counterexample, key c0-1"));
}

#[test]
fn a_run_directory_is_read() {
    let dir = std::env::temp_dir().join(format!("idemcache-history-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ledger = "key\tattempt\tport\tsent\tended\toutcome\treplayed\torder\tskew\n\
                  c0-1\t1\t3981\t1.0\t1.5\tbroken\t0\t\t\n\
                  c0-1\t2\t3982\t1.6\t1.6\trefused\t0\t\t\n\
                  c0-1\t3\t3982\t1.7\t1.8\t201\t1\t5\t0.0\n";
    let stored = idemcache::Key::new("POST /orders", "faults1", "c0-1").unwrap();
    let hex: String = stored.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(dir.join("ledger"), ledger).unwrap();
    std::fs::write(dir.join("executions"), "c0-1\t7\n").unwrap();
    std::fs::write(dir.join("orders"), "c0-1\t5\n").unwrap();
    std::fs::write(dir.join("records"), format!("{hex}\t2\t7\n")).unwrap();
    let read = files::read(&dir, None).unwrap();
    let checked = check(&read, Mode::Together);
    assert!(checked.holds(), "{}", checked.report());
    assert_eq!((checked.keys, checked.operations), (1, 3));
    // Another tenant's record of the same client key is left out with `--tenant`, and
    // read without it (a second record for the key fails nothing, the last one wins).
    let other = idemcache::Key::new("POST /orders", "faults12", "c0-1").unwrap();
    let other: String = other.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(dir.join("records"), format!("{hex}\t2\t7\n{other}\t1\t9\n")).unwrap();
    let mine = files::read(&dir, Some("faults1")).unwrap();
    assert_eq!(mine.keys["c0-1"].record.map(|r| r.token), Some(7));
    let all = files::read(&dir, None).unwrap();
    assert_eq!(all.keys["c0-1"].record.map(|r| r.token), Some(9));
    // A line cut short fails the read, naming where.
    std::fs::write(dir.join("executions"), "c0-1\n").unwrap();
    let why = files::read(&dir, None).unwrap_err();
    assert!(why.contains("executions:1"), "{why}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_order_inserted_by_one_execution_and_completed_by_another_is_caught_in_one_commit() {
    // The control of .ci/faults (records written after the commit, in PostgreSQL): the
    // first execution inserted the order and died; the second, after the lease, was
    // answered by the backstop and completed the record.
    let h = doctored("c0-2", |k| k.committed = vec![20]);
    assert_eq!(violations(&h, Mode::Together), (vec![], 1));
    let report = check(&h, Mode::Together).report();
    assert!(report.contains("inserted under token 20, its record completed under 21"), "{report}");
    // What records written after the commit allow: counted, not failed.
    let checked = check(&h, Mode::AfterCommit);
    assert!(checked.holds(), "{}", checked.report());
    assert_eq!(checked.tokens.backstopped, 1);
}

#[test]
fn two_inserts_or_an_insert_without_a_row_are_caught() {
    let h = doctored("c0-2", |k| k.committed = vec![20, 21]);
    assert_eq!(violations(&h, Mode::AfterCommit).1, 1);
    let h = doctored("c3-1", |k| k.committed = vec![50]);
    assert_eq!(violations(&h, Mode::AfterCommit).1, 1);
}
