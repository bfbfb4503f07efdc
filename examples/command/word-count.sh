#!/bin/sh
# A job for `spot-worker run` in a dozen lines of shell: count the words of
# the message body, one line of the body per step, resuming where a previous
# delivery stopped (its progress is in $SPOT_WORKER_CHECKPOINT).
#   spot-worker run -- sh examples/command/word-count.sh
set -eu
cat > "$SPOT_WORKER_WORK_DIR/body"                  # the body, from stdin
done_lines=$(cat "$SPOT_WORKER_CHECKPOINT" 2>/dev/null || echo 0)
total=$(wc -l < "$SPOT_WORKER_WORK_DIR/body")
while [ "$done_lines" -lt "$total" ]; do
  done_lines=$((done_lines + 1))
  echo "$done_lines" > "$SPOT_WORKER_CHECKPOINT.tmp" && mv "$SPOT_WORKER_CHECKPOINT.tmp" "$SPOT_WORKER_CHECKPOINT"
done
wc -w < "$SPOT_WORKER_WORK_DIR/body" > "$SPOT_WORKER_RESULT"   # stored as the result
