#!/usr/bin/env python3
"""The fault run's load clients and its audit (driven by .ci/faults; stdlib only).

`load`: client threads, each sending its own keys one after another to instances of
the orders example picked at random, and retrying each key until it gets an answer: a
201 (the execution or its replay). A 409 (in progress, outcome unknown), a 5xx or a
broken connection is retried with capped exponential backoff (25 ms doubling to
400 ms, jittered; Retry-After is not followed, so the figures show how long a key was
really unavailable, not the header's whole-second rounding). Every attempt is one
line of the ledger, written as it ends: the run's evidence, whatever happens next.

`audit`: the orders table and the idempotency records (read straight from
PostgreSQL, not through the relay) against the ledger and the fault log. Exits 1 on a
second execution of any key, an answer naming another order than the key's row, a
key reused for another order (422), or a key with no answer within its deadline; a
key left UNKNOWN is reported (the contract allows it; the README's reconcile path
settles it), not failed.
"""

import argparse
import http.client
import json
import random
import socket
import subprocess
import sys
import threading
import time
from email.utils import parsedate_to_datetime

BODY = json.dumps({"item": "faults", "qty": 1})


def attempt(port, user, key, timeout):
    """One POST on a fresh connection: (outcome, replayed, order id, Date skew s)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        try:
            conn.connect()
        except ConnectionRefusedError:
            return "refused", 0, "", ""
        except OSError:
            return "refused", 0, "", ""
        try:
            conn.request(
                "POST",
                "/orders",
                body=BODY,
                headers={
                    "Authorization": f"Bearer {user}",
                    "Idempotency-Key": key,
                    "Content-Type": "application/json",
                },
            )
            resp = conn.getresponse()
            data = resp.read()
        except socket.timeout:
            return "timeout", 0, "", ""
        except (OSError, http.client.HTTPException):
            # Connected, then the connection broke: the instance died under the request.
            return "broken", 0, "", ""
        skew = ""
        date = resp.getheader("Date")
        if date:
            try:
                skew = f"{parsedate_to_datetime(date).timestamp() - time.time():.1f}"
            except (TypeError, ValueError):
                pass
        replayed = 1 if (resp.getheader("Idempotent-Replayed") or "").lower() == "true" else 0
        outcome = str(resp.status)
        order = ""
        try:
            parsed = json.loads(data) if data else {}
        except ValueError:
            parsed = {}
        if resp.status == 201:
            order = str(parsed.get("id", ""))
        elif isinstance(parsed, dict) and parsed.get("code"):
            outcome = f"{resp.status}:{parsed['code']}"
        return outcome, replayed, order, skew
    finally:
        conn.close()


def load(args):
    ports = [int(p) for p in args.ports.split(",")]
    end = time.time() + args.seconds
    lock = threading.Lock()
    ledger = open(args.ledger, "w", buffering=1)
    ledger.write("key\tattempt\tport\tsent\tended\toutcome\treplayed\torder\tskew\n")

    def client(n):
        rng = random.Random(n * 7919 + int(time.time()))
        k = 0
        while time.time() < end:
            k += 1
            key = f"c{n}-{k}"
            first = time.time()
            tries = 0
            unknown_in_a_row = 0
            failures = 0
            while True:
                tries += 1
                port = rng.choice(ports)
                sent = time.time()
                outcome, replayed, order, skew = attempt(port, args.user, key, args.timeout)
                ended = time.time()
                with lock:
                    ledger.write(
                        f"{key}\t{tries}\t{port}\t{sent:.6f}\t{ended:.6f}\t{outcome}\t"
                        f"{replayed}\t{order}\t{skew}\n"
                    )
                if outcome in ("201", "422") or outcome.startswith("422:"):
                    break  # an answer (a 422 is one too: the audit fails it)
                unknown_in_a_row = unknown_in_a_row + 1 if outcome.endswith("outcome_unknown") else 0
                if unknown_in_a_row >= args.unknown_tries:
                    break  # UNKNOWN stays so until reconciled: reported by the audit
                if ended - first > args.deadline:
                    break  # never answered: the audit fails it
                if outcome == "refused":
                    # That instance is down (restarting): another one at once.
                    time.sleep(0.01)
                    continue
                failures += 1
                backoff = min(0.4, 0.025 * (2 ** min(failures - 1, 4)))
                time.sleep(backoff * (0.5 + rng.random()))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ledger.close()


def psql(db, sql):
    out = subprocess.run(["psql", db, "-AtF", "\t", "-c", sql], check=True, capture_output=True, text=True)
    return [line.split("\t") for line in out.stdout.splitlines() if line]


def pct(values, p):
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def figures(values):
    if not values:
        return "none"
    return f"p50 {pct(values, 50):.2f} s, p99 {pct(values, 99):.2f} s, max {max(values):.2f} s"


def audit(args):
    problems = []
    attempts = {}
    with open(args.ledger) as f:
        next(f)
        for line in f:
            key, n, port, sent, ended, outcome, replayed, order, skew = line.rstrip("\n").split("\t")
            attempts.setdefault(key, []).append(
                (int(n), int(port), float(sent), float(ended), outcome, int(replayed), order, skew)
            )
    faults = []
    with open(args.faults) as f:
        for line in f:
            parts = line.split()
            if parts:
                faults.append((float(parts[0]), parts[1], parts[2] if len(parts) > 2 else ""))
    kills = [(t, int(p)) for t, kind, p in faults if kind == "kill"]
    restarts = []  # from a kill to the instance serving again
    for t, p in kills:
        after = [u for u, kind, q in faults if kind == "start" and int(q) == p and u >= t]
        if after:
            restarts.append(min(after) - t)
    cuts = sum(1 for _, kind, _ in faults if kind == "cut")
    drops = sum(1 for _, kind, _ in faults if kind == "drop")
    skewed = int(args.skewed_port) if args.skewed_port else None

    # The business table: one row per key it holds (UNIQUE), and each second execution
    # that reached it (a handler whose INSERT found the key's row: the example says so on
    # stderr, "the backstop caught a second execution of KEY").
    rows = {key: (int(count), oid) for key, count, oid in psql(
        args.db, f"SELECT idempotency_key, COUNT(*), MIN(id) FROM orders WHERE \"user\" = '{args.user}' "
        "GROUP BY idempotency_key")}
    caught = {}
    for path in args.stderr:
        with open(path, errors="replace") as f:
            for line in f:
                if line.startswith("the backstop caught a second execution of "):
                    k = line.rsplit(" ", 1)[1].strip()
                    caught[k] = caught.get(k, 0) + 1
    if args.records_dump:
        # The store's now (µs), then a record a line: its key (hex), state, token and
        # expiry (µs), tab-separated (.ci/faults, store_dump).
        with open(args.records_dump) as f:
            lines = [line.rstrip("\n") for line in f]
        now_us = int(lines[0])
        records = {}
        for line in lines[1:]:
            _, state, _, expires = line.split("\t")
            c, lapsed = records.get(int(state), (0, 0))
            records[int(state)] = (c + 1, lapsed + (int(expires) <= now_us))
    else:
        records = {int(s): (int(c), int(lapsed)) for s, c, lapsed in psql(
            args.db, "WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us) "
            "SELECT state, COUNT(*), COUNT(*) FILTER (WHERE expires_at <= now.us) FROM idemcache_records, now "
            "GROUP BY state")}

    answered, unknown, unanswered, mismatched = {}, [], [], []
    executions_seen = {}
    for key, tries in attempts.items():
        last = tries[-1]
        executions_seen[key] = sum(1 for t in tries if t[4] == "201" and not t[5])
        if last[4] == "201":
            answered[key] = last
        elif last[4].startswith("422"):
            mismatched.append(key)
        elif last[4].endswith("outcome_unknown"):
            unknown.append(key)
        else:
            unanswered.append(key)

    doubles = sorted(k for k in rows if rows[k][0] + caught.get(k, 0) > 1)
    doubles += sorted(k for k in caught if k not in rows)
    # A client stops at its first 201, so at most one first-execution answer per key:
    # a second one would be a second execution answered.
    twice_answered = sorted(k for k, n in executions_seen.items() if n > 1)
    wrong = []
    for key, last in answered.items():
        ids = {t[6] for t in attempts[key] if t[4] == "201"}
        if key not in rows or ids != {rows[key][1]}:
            wrong.append(f"{key}: answered order(s) {sorted(ids)}, its row {rows.get(key, (0, 'none'))[1]}")
    orphans = sorted(k for k in rows if k not in answered)  # executed, answer never seen
    # Records written after the order commits (any store but PostgreSQL, which holds the
    # orders): a kill between the two lets a
    # retry run again once the lease lapses, and only the orders' UNIQUE stops it (the
    # README's contract for that case). Reported, not failed; a second row still fails.
    after_commit = bool(args.records_dump)
    if after_commit:
        doubles = sorted(k for k in rows if rows[k][0] > 1)
    if doubles:
        problems.append(f"keys executed more than once: {doubles[:20]}")
    if twice_answered:
        problems.append(f"keys answered as first executions twice: {twice_answered[:20]}")
    if wrong:
        problems.append("answers naming another order: " + "; ".join(wrong[:10]))
    if mismatched:
        problems.append(f"keys refused as reused (422): {mismatched[:20]}")
    if unanswered:
        problems.append(f"keys with no answer within {args.deadline:.0f} s: {unanswered[:20]}")
    orphan_not_unknown = [k for k in orphans if k not in unknown]
    if orphan_not_unknown:
        problems.append(f"orders for keys whose client saw no answer: {orphan_not_unknown[:20]}")

    # Availability. Time to answer: first attempt to the 201. A key "whose holder was
    # killed": one of its requests was at an instance when `kill -9` hit it (the
    # connection broke, and that instance's kill falls inside the attempt); it is then
    # unavailable from the kill until its answer (the holder's lease lapsing, mostly).
    def t_answer(key):
        return answered[key][3] - attempts[key][0][2]

    all_times = [t_answer(k) for k in answered]
    # Split by how the key was answered: a replay (the holder committed before it died)
    # or an execution elsewhere (nothing committed: taken over once its lease lapsed).
    held_total, replayed_since, taken = [], [], {False: [], True: []}
    cut_keys = []
    for key in answered:
        kill_at = None
        for _, port, sent, ended, outcome, _, _, _ in attempts[key]:
            if outcome in ("broken", "timeout"):
                hits = [(t, p) for t, p in kills if p == port and sent - 0.05 <= t <= ended + 0.05]
                if hits and kill_at is None:
                    kill_at = hits[0]
        if kill_at is not None:
            since = answered[key][3] - kill_at[0]
            if answered[key][5]:
                replayed_since.append(since)
            else:
                taken[kill_at[1] == skewed].append(since)
            held_total.append(t_answer(key))
        elif any(t[4].startswith(("500", "503")) for t in attempts[key]):
            cut_keys.append(t_answer(key))
    n_attempts = sum(len(t) for t in attempts.values())
    outcomes = {}
    for tries in attempts.values():
        for t in tries:
            outcomes[t[4]] = outcomes.get(t[4], 0) + 1
    first = min(t[2] for tries in attempts.values() for t in tries) if attempts else 0
    last = max(t[3] for tries in attempts.values() for t in tries) if attempts else 0
    wall = max(last - first, 1e-9)

    print(f"== fault run audit ({args.label})")
    print(f"load: {len(attempts)} keys, {n_attempts} requests over {wall:.0f} s ({n_attempts / wall:.0f} req/s, "
          f"{len(answered) / wall:.0f} keys answered/s), {args.clients} clients over {args.instances} instances")
    print(f"faults: {len(kills)} kill -9 of an instance (each restarted; down {figures(restarts)}), {cuts} store connection cuts "
          f"(relay killed and restarted), {drops} drops of every open store connection (relay kept listening)")
    print("answers: " + ", ".join(f"{k} x{v}" for k, v in sorted(outcomes.items(), key=lambda kv: -kv[1])))
    executed = sum(c for c, _ in rows.values())
    if after_commit:
        print(f"executions: {executed} orders for {len(rows)} keys; {len(doubles)} keys with a second order; "
              f"{sum(caught.values())} second executions of {len(caught)} keys reached the database and were "
              "stopped by its UNIQUE backstop (records written after the commit: a kill between the two), "
              "each answered with the key's one order")
    else:
        print(f"executions: {executed} orders for {len(rows)} keys; {len(doubles)} keys executed twice "
              f"(the backstop caught {sum(caught.values())} second executions); "
              f"{len(twice_answered)} keys answered as a first execution twice")
    print(f"keys: {len(answered)} answered (201, each naming its key's one order: {len(answered) - len(wrong)}), "
          f"{len(unknown)} left UNKNOWN, {len(unanswered)} never answered, {len(mismatched)} refused 422")
    state = {1: "PROCESSING", 2: "COMPLETED", 3: "UNKNOWN"}
    print("records: " + ", ".join(
        f"{state.get(s, s)} {c}" + (f" ({lapsed} past their lease: wedged until a retry takes them over)" if s == 1 else "")
        for s, (c, lapsed) in sorted(records.items())))
    total = sum(c for c, _ in records.values())
    if len(rows) > total:
        print(f"  {len(rows) - total} keys have no record: a PROCESSING record whose completion (and its UNKNOWN "
              "mark) failed with the store cut expires at its lease's end, and a retry would run again"
              + (", stopped by the backstop" if after_commit else ""))
    if records.get(3, (0, 0))[0]:
        print(f"  {records[3][0]} records UNKNOWN: a completion the store failed to record is marked UNKNOWN "
              "(its client had the answer; a retry gets 409 outcome_unknown, never a second run) until reconciled "
              "(docs/commit-boundary.md, \"Effects outside any transaction\": idemcache::store::reconcile, checking the key's "
              "row in orders: Verdict::Happened if there, DidNotHappen if not)")
    print(f"time to answer, every key: {figures(all_times)}")
    print(f"keys whose holder was killed: {len(held_total)}; first attempt to answer: {figures(held_total)} "
          f"(lease {args.lease_ms} ms)")
    print(f"  the holder had committed, so a replay ({len(replayed_since)} keys): from the kill to the answer "
          f"{figures(replayed_since)}")
    how = ("no record committed, run again once the lease lapsed (the backstop stopping those whose order "
           "had committed)" if after_commit else "nothing committed, taken over once the lease lapsed")
    print(f"  {how} ({len(taken[False]) + len(taken[True])} keys): "
          f"from the kill to the answer {figures(taken[False] + taken[True])}")
    if skewed:
        print(f"    of which the holder's clock was right ({len(taken[False])}): {figures(taken[False])}; "
              f"ahead ({len(taken[True])}): {figures(taken[True])}")
    print(f"keys that met a store cut (a 500/503, no kill): {len(cut_keys)}; first attempt to answer: {figures(cut_keys)}")
    if skewed:
        skews = [float(t[7]) for tries in attempts.values() for t in tries if t[1] == skewed and t[7]]
        others = [float(t[7]) for tries in attempts.values() for t in tries if t[1] != skewed and t[7]]
        busy = sum(1 for tries in attempts.values() for t in tries
                   if t[1] == skewed and t[4] == "409:request_in_progress")
        execs = sum(1 for tries in attempts.values() for t in tries if t[1] == skewed and t[4] == "201" and not t[5])
        ahead = pct(skews, 50) - pct(others, 50)
        print(f"clock ahead: instance {skewed} ran FAKETIME={args.skew} (its Date header {ahead:+.0f} s from "
              f"the others'); it executed {execs} keys, and answered 409 in progress {busy} times for a key "
              f"whose lease another process held (or had held until killed): leases are judged by the database's clock, so it took none "
              f"of them over early (each lease at most {args.lease_ms} ms long, so lapsed long ago by its own "
              "clock), and its own leases lapsed as soon as the others' when it was killed (above)")
        if args.skew and ahead < 1:
            problems.append(f"instance {skewed}'s clock is not ahead (Date header {ahead:+.1f} s): libfaketime "
                            "did not take")
    if unknown:
        print(f"UNKNOWN keys (allowed by the contract, never re-executed blindly): {unknown[:20]}; their orders "
              f"rows: {sum(1 for k in unknown if k in rows)} of {len(unknown)}. Reconcile as the README says "
              "(\"Effects outside any transaction\"): idemcache::store::reconcile with a check that looks up "
              "the key's row in orders: Verdict::Happened (resolve) if it is there, DidNotHappen (forget) if not")
    if problems:
        for p in problems:
            print("FAIL: " + p)
        return 1
    if after_commit:
        print("fault run: no key has two orders, every key answered with its one order")
    else:
        print("fault run: no key executed twice, every key answered with its one order")
    return 0


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    lo = sub.add_parser("load")
    lo.add_argument("--ports", required=True)
    lo.add_argument("--user", required=True)
    lo.add_argument("--clients", type=int, default=12)
    lo.add_argument("--seconds", type=float, default=60)
    lo.add_argument("--deadline", type=float, default=30)
    lo.add_argument("--timeout", type=float, default=5)
    lo.add_argument("--unknown-tries", type=int, default=20)
    lo.add_argument("--ledger", required=True)
    au = sub.add_parser("audit")
    au.add_argument("--db", required=True)
    au.add_argument("--user", required=True)
    au.add_argument("--ledger", required=True)
    au.add_argument("--faults", required=True)
    au.add_argument("--stderr", nargs="*", default=[])
    au.add_argument("--deadline", type=float, default=30)
    au.add_argument("--lease-ms", default="")
    au.add_argument("--skewed-port", default="")
    au.add_argument("--skew", default="")
    au.add_argument("--clients", default="")
    au.add_argument("--instances", default="")
    au.add_argument("--label", default="")
    au.add_argument("--records-dump", default="")
    args = parser.parse_args()
    if args.command == "load":
        load(args)
        return 0
    return audit(args)


if __name__ == "__main__":
    sys.exit(main())
