#!/usr/bin/env python3
"""The two-service fault run's proxy and audit (driven by .ci/two-services; stdlib only).

`proxy`: a TCP proxy between the orders instances and the payments service that
injects faults both ways. Each chunk of a request, at random:
  - lose-request: the connection closed instead of forwarding it (the charge never
    ran, and the caller cannot tell);
  - cut-request: half of it forwarded, then both connections closed (the server never
    reads a whole request, so nothing runs);
and each chunk of an answer (the charge ran):
  - drop: the connection closed instead of forwarding it (the caller hears nothing);
  - reset: half of it forwarded, then a TCP reset (the answer cut mid-way);
  - delay: held for --delay seconds (beyond the caller's timeout) before forwarding;
  - else forwarded as it is.
And an outage: the last --outage-hold seconds of every --outage-every, every answer is
held until the outage ends, longer than a caller's whole retry budget, so the caller's
outcome is unknown (the orders example answers 503 and its client retries the order).
Each fault is one line of --log ("<time> <kind>").

`audit`: the orders and the payments, read straight from PostgreSQL, against the load's
ledgers and the fault log. For the keyed orders (idemcache-client, the order's DownstreamKey): each order
committed must have exactly one payment, and no payment may be left without its order.
For the orders that charged through reqwest-retry without a key: the orders paid more
than once, counted, not judged. The last line reads
`two services: C orders committed, P paid once, L lost, D paid twice; reqwest-retry: R paid twice`
and the exit code is 0 only when P == C, L == D == 0, no payment is without its order,
every keyed client got its answer, and the run proved something: every kind of fault
happened, at least one keyed order answered 503 (a charge whose outcome was unknown) and
at least one kill fell between a keyed order's payment and its commit.
"""

import argparse
import asyncio
import random
import socket
import struct
import subprocess
import sys
import time


def proxy(args):
    rng = random.Random(args.seed)
    log = open(args.log, "a", buffering=1)
    started = time.time()

    def outage_left():
        """Seconds left of the outage under way, or 0."""
        if not args.outage_every:
            return 0
        phase = (time.time() - started) % args.outage_every
        return args.outage_every - phase if phase >= args.outage_every - args.outage_hold else 0

    def fault(kind):
        log.write(f"{time.time():.6f} {kind}\n")

    def reset(writer):
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        writer.transport.abort()

    async def handle(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", args.to)
        except OSError:
            reset(client_writer)
            return

        async def requests():
            while data := await client_reader.read(65536):
                r = rng.random()
                if r < args.lose_request:
                    fault("lose-request")
                    return
                if r < args.lose_request + args.cut_request:
                    fault("cut-request")
                    server_writer.write(data[: len(data) // 2])
                    await server_writer.drain()
                    return
                server_writer.write(data)
                await server_writer.drain()
            server_writer.close()

        async def answers():
            while data := await server_reader.read(65536):
                held = outage_left()
                if held:
                    fault("outage")
                    await asyncio.sleep(held)
                r = rng.random()
                if r < args.drop:
                    fault("drop")
                    return
                if r < args.drop + args.reset:
                    fault("reset")
                    client_writer.write(data[: len(data) // 2])
                    await client_writer.drain()
                    reset(client_writer)
                    return
                if r < args.drop + args.reset + args.delay_p:
                    fault("delay")
                    await asyncio.sleep(args.delay)
                client_writer.write(data)
                await client_writer.drain()

        tasks = [asyncio.ensure_future(requests()), asyncio.ensure_future(answers())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            for w in (client_writer, server_writer):
                w.transport.abort()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", args.listen, reuse_address=True)
        print(f"proxy on {args.listen}", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def psql(db, sql):
    out = subprocess.run(["psql", db, "-AtF", "\t", "-c", sql], check=True, capture_output=True, text=True)
    return [line.split("\t") for line in out.stdout.splitlines() if line]


def last_outcomes(path):
    """Each key's last outcome in a load ledger (.ci/faults.py's format)."""
    last = {}
    attempts = 0
    with open(path) as f:
        next(f)
        for line in f:
            fields = line.rstrip("\n").split("\t")
            last[fields[0]] = fields[5]
            attempts += 1
    return last, attempts


def audit(args):
    orders = {}
    for user, key in psql(args.orders_db, 'SELECT "user", idempotency_key FROM orders'):
        orders.setdefault(user, set()).add(key)
    paid = {}
    for account, key, n in psql(args.payments_db,
                                "SELECT account, order_key, COUNT(*) FROM payments GROUP BY 1, 2"):
        paid[(account, key)] = int(n)

    def tally(user):
        keys = orders.get(user, set())
        counts = [paid.get((user, k), 0) for k in keys]
        orphans = sorted(k for (a, k) in paid if a == user and k not in keys)
        return (len(keys), sum(1 for n in counts if n == 1), sum(1 for n in counts if n == 0),
                sum(1 for n in counts if n > 1), sum(counts) - sum(1 for n in counts if n), orphans)

    c, p, lost, d, _, orphans = tally(args.keyed)
    cr, pr, lr, r, extra, orphans_r = tally(args.plain)
    keyed_last, keyed_attempts = last_outcomes(args.keyed_ledger)
    plain_last, plain_attempts = last_outcomes(args.plain_ledger)
    unanswered = sorted(k for k, o in keyed_last.items() if o != "201")

    # Each keyed order's payment time and commit time, for the kills that fell between.
    paid_at = {key: float(t) for key, t in psql(
        args.payments_db, f"SELECT order_key, extract(epoch FROM MIN(paid_at)) FROM payments "
        f"WHERE account = '{args.keyed}' GROUP BY 1")}
    committed_at = {}
    for key_hex, settled in psql(args.orders_db, "SELECT encode(key, 'hex'), settled_at FROM idemcache_records "
                                 "WHERE settled_at IS NOT NULL"):
        stored = bytes.fromhex(key_hex)
        if args.keyed.encode() in stored:
            committed_at[stored] = int(settled) / 1e6
    # The fault log, read once: each kind's count, and each kill's time and port.
    faults, kills = {}, []
    with open(args.faults) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2:
                faults[parts[1]] = faults.get(parts[1], 0) + 1
            if len(parts) >= 3 and parts[1] == "kill":
                kills.append((float(parts[0]), parts[2]))
    between = keyed_503 = 0
    with open(args.keyed_ledger) as f:
        next(f)
        for line in f:
            key, _, port, sent, ended, outcome = line.rstrip("\n").split("\t")[:6]
            keyed_503 += outcome.startswith("503")
            if outcome != "broken" or key not in paid_at:
                continue
            hit = [t for t, p in kills if p == port and float(sent) <= t <= float(ended) + 0.1]
            commit = [t for stored, t in committed_at.items() if stored.endswith(key.encode())]
            between += bool(hit and commit and paid_at[key] < hit[0] < commit[0])

    replayed = 0
    for path in args.stderr:
        with open(path, errors="replace") as f:
            replayed += sum(1 for line in f if line.startswith("the charge of ") and "replayed" in line)

    print(f"== two-service fault run audit ({args.label})")
    print(f"faults: {faults.get('kill', 0)} kill -9 of an orders instance (each restarted), killing {between} keyed "
          f"executions between their payment and their order's commit; on the way to payments: "
          f"{faults.get('lose-request', 0)} requests lost, {faults.get('cut-request', 0)} cut mid-request; on the "
          f"way back: {faults.get('drop', 0)} answers dropped, {faults.get('reset', 0)} reset mid-answer, "
          f"{faults.get('delay', 0)} delayed past the caller's timeout, {faults.get('outage', 0)} held by an outage "
          f"({keyed_503} keyed orders answered 503, their charge's outcome unknown, and retried)")
    print(f"idemcache-client (the order's DownstreamKey): {len(keyed_last)} keys, {keyed_attempts} order requests; "
          f"{c} orders committed: {p} paid once, {lost} without a payment, {d} paid more than once; "
          f"{len(orphans)} payments without their order; {len(unanswered)} keys never answered; "
          f"{replayed} charges repeated (after a lost answer or a killed instance) answered with the first "
          "charge's replay")
    print(f"reqwest-retry (no key): {len(plain_last)} keys, {plain_attempts} order requests; {cr} orders committed: "
          f"{pr} paid once, {lr} without a payment, {r} paid more than once ({extra} payments too many); "
          f"{len(orphans_r)} payments without their order")
    problems = []
    if orphans:
        problems.append(f"payments without their order: {orphans[:20]}")
    if unanswered:
        problems.append(f"keys with no answer: {unanswered[:20]}")
    if not c:
        problems.append("no order committed: the run proved nothing")
    kinds = ("kill", "lose-request", "cut-request", "drop", "reset", "delay", "outage")
    missing = [kind for kind in kinds if not faults.get(kind)]
    if missing:
        problems.append(f"faults that never happened: {missing}")
    if not between:
        problems.append("no kill fell between a keyed order's payment and its commit")
    if not keyed_503:
        problems.append("no keyed order met a charge whose outcome was unknown (503)")
    if not r:
        print("note: no reqwest-retry order was paid twice this run")
    for problem in problems:
        print("FAIL: " + problem)
    print(f"two services: {c} orders committed, {p} paid once, {lost} lost, {d} paid twice; "
          f"reqwest-retry: {r} paid twice")
    return 0 if p == c and lost == 0 and d == 0 and not problems else 1


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    pr = sub.add_parser("proxy")
    pr.add_argument("--listen", type=int, required=True)
    pr.add_argument("--to", type=int, required=True)
    pr.add_argument("--log", required=True)
    pr.add_argument("--drop", type=float, default=0.05)
    pr.add_argument("--reset", type=float, default=0.05)
    pr.add_argument("--delay-p", type=float, default=0.05)
    pr.add_argument("--delay", type=float, default=1.5)
    pr.add_argument("--lose-request", type=float, default=0.03)
    pr.add_argument("--cut-request", type=float, default=0.03)
    # Longer than a charge's budget: the orders example's 5 s deadline, plus the last
    # attempt's 1 s timeout, plus its backoff.
    pr.add_argument("--outage-every", type=float, default=20)
    pr.add_argument("--outage-hold", type=float, default=8)
    pr.add_argument("--seed", type=int, default=None)
    au = sub.add_parser("audit")
    au.add_argument("--orders-db", required=True)
    au.add_argument("--payments-db", required=True)
    au.add_argument("--keyed", required=True)
    au.add_argument("--plain", required=True)
    au.add_argument("--keyed-ledger", required=True)
    au.add_argument("--plain-ledger", required=True)
    au.add_argument("--faults", required=True)
    au.add_argument("--stderr", nargs="*", default=[])
    au.add_argument("--label", default="")
    args = parser.parse_args()
    if args.command == "proxy":
        proxy(args)
        return 0
    return audit(args)


if __name__ == "__main__":
    sys.exit(main())
