#!/bin/sh
# backup.sh SOURCE DESTINATION: archives SOURCE into DESTINATION/backup-DATE.tar.gz and
# logs one line to DESTINATION/backup.log per run. The job of the crontab beside it:
# run through `idem run --key backup-DATE`, it runs at most once per key and date.
set -eu
source=$1
destination=$2
archive="$destination/backup-$(date +%F).tar.gz"
tar -czf "$archive" -C "$source" .
echo "$(date -u +%FT%TZ) $archive" >>"$destination/backup.log"
echo "backed up $source to $archive"
