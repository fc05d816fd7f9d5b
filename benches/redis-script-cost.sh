#!/usr/bin/env bash
# What a first execution costs Redis's own CPU: `usec_per_call` of `INFO commandstats`
# for the store's claim and completion scripts (read from stores/redis/src/scripts.rs
# as this checkout has them), against the hand-written middleware's `SET key NX EX`
# claim and `SET key body EX` completion, and against two floors: a script that only
# reads the clock, and a claim of a packed string record by one `SET NX GET PX` in a
# script. Each row sends N commands on fresh keys through `redis-cli --pipe`, so the
# client's speed does not enter the figure; ROUNDS rounds, interleaved.
#
#   benches/redis-script-cost.sh [REDIS_URL] [N] [ROUNDS]
#       (default redis://127.0.0.1:6379/13, 100000, 3; the database is flushed)
#
# SCRIPTS=FILE reads the scripts from FILE instead (e.g. an older commit's
# `git show REV:stores/redis/src/scripts.rs`), to compare two versions in one run.
#
# Needs redis-cli and python3. Results and how to read them: BENCHMARKS.md, "Where the
# time goes" (first executions over Redis).
set -euo pipefail

url="${1:-redis://127.0.0.1:6379/13}"
n="${2:-100000}"
rounds="${3:-3}"
root="$(git rev-parse --show-toplevel)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
r() { redis-cli -u "$url" "$@"; }

python3 - "${SCRIPTS:-$root/stores/redis/src/scripts.rs}" "$work" <<'PY'
import re, sys
src = open(sys.argv[1]).read()
def const(name):
    return re.search(r'const ' + name + r': &str = r"(.*?)";\n', src, re.S).group(1)
prelude = const('PRELUDE')
out = sys.argv[2]
open(out + '/claim.lua', 'w').write(prelude + const('CLAIM'))
open(out + '/complete.lua', 'w').write(prelude + const('COMPLETE'))
open(out + '/clock.lua', 'w').write("local t = redis.call('TIME')\nreturn 1\n")
open(out + '/packed.lua', 'w').write(
    "local t = redis.call('TIME')\n"
    "local now = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))\n"
    "return redis.call('SET', KEYS[1], '1|' .. ARGV[1] .. '|' .. now, 'NX', 'PX', ARGV[2], 'GET') or false\n")
PY

# RESP for N commands of one kind: $1 the kind, $2 a script's SHA1.
commands() {
    python3 - "$1" "${2:-}" "$n" <<'PY'
import sys
kind, sha, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
body = b'{"status":201,"body":"{\\"order\\":42}"}'
def resp(*args):
    parts = [b'*%d\r\n' % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b'$%d\r\n%s\r\n' % (len(a), a))
    return b''.join(parts)
w = sys.stdout.buffer
for i in range(n):
    k = 'k:%d' % i
    w.write({
        'record': lambda: resp('HSET', k, 'state', 1, 'fp', 'fp', 'token', 5, 'started', 1,
                               'expires', 9999999999999999),
        'claim': lambda: resp('EVALSHA', sha, 1, k, 'fp', 30000000, 0, 0, ''),
        'complete': lambda: resp('EVALSHA', sha, 1, k, 5, 60000000, body),
        'script': lambda: resp('EVALSHA', sha, 1, k, 'fp', 30000000),
        'set-nx': lambda: resp('SET', k, 'processing', 'NX', 'EX', 60),
        'set-body': lambda: resp('SET', k, body, 'EX', 60),
    }[kind]())
PY
}

# One row: flush, optionally lay PROCESSING records under token 5, send, read the figure.
row() {
    local label="$1" kind="$2" sha="${3:-}" records="${4:-}"
    r flushdb >/dev/null
    [[ -n "$records" ]] && commands record | r --pipe >/dev/null
    r config resetstat >/dev/null
    commands "$kind" "$sha" | r --pipe >/dev/null
    local command=evalsha
    [[ "$kind" == set-* ]] && command=set
    printf '%-40s %s\n' "$label" \
        "$(r info commandstats | grep "^cmdstat_$command:" | sed 's/.*usec_per_call=\([0-9.]*\).*/\1 µs/')"
}

for round in $(seq "$rounds"); do
    echo "round $round of $rounds ($n commands per row, usec_per_call)"
    claim=$(r script load "$(cat "$work/claim.lua")")
    complete=$(r script load "$(cat "$work/complete.lua")")
    clock=$(r script load "$(cat "$work/clock.lua")")
    packed=$(r script load "$(cat "$work/packed.lua")")
    row "the store's claim script" claim "$claim"
    row "the store's completion script" complete "$complete" records
    row "hand-written claim: SET NX EX" set-nx
    row "hand-written completion: SET EX" set-body
    row "floor: a script reading TIME" script "$clock"
    row "floor: packed record, SET NX GET PX" script "$packed"
done
r flushdb >/dev/null
