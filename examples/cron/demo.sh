#!/bin/sh
# demo.sh [IDEM]: runs the crontab's command twice, as cron would on one day, with the
# idem binary IDEM (default target/release/idem) over temporary directories, and checks
# that the second run replayed the first's output without running the backup again.
# Exit 0 when it did; 1 otherwise. CI runs it (.ci/run).
set -eu
idem=${1:-target/release/idem}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/data" "$work/backups"
echo "important" >"$work/data/file.txt"
export IDEM_DB="$work/idem.db"

key="backup-$(date +%F)"
for run in 1 2; do
    echo "-- run $run"
    "$idem" run --key "$key" --no-wait -- "$here/backup.sh" "$work/data" "$work/backups"
done

runs=$(wc -l <"$work/backups/backup.log")
echo "-- the backup ran $runs time(s)"
[ "$runs" -eq 1 ] || { echo "the second run must replay, not run the backup again"; exit 1; }
"$idem" status "$key"
