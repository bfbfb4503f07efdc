#!/usr/bin/env bash
# Enqueues sample primes jobs: scripts/enqueue.sh [COUNT] [SIZE]
# Job i counts the primes in [i*SIZE, (i+1)*SIZE) (default 20 jobs of
# 200,000,000 numbers: a few minutes each on a 2-vCPU VM, long enough to be
# caught by an eviction). Results appear in the results container as
# <job_id>.json; list them with:
#   az storage blob list --auth-mode login --account-name ACCOUNT -c results -o table
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib-azure.sh
source scripts/lib-azure.sh

COUNT="${1:-20}"
SIZE="${2:-200000000}"
[[ "$COUNT" =~ ^[0-9]+$ && "$SIZE" =~ ^[0-9]+$ && "$SIZE" -gt 0 ]] || die "usage: $0 [COUNT] [SIZE]"

require_az
ACCOUNT="$(deployment_output storageAccountName)"
QUEUE="$(deployment_output queueName)"
RUN="$(date -u +%Y%m%dT%H%M%SZ)"

log "enqueueing $COUNT jobs of $SIZE numbers to $ACCOUNT/$QUEUE (run $RUN)"
for ((i = 0; i < COUNT; i++)); do
  start=$((i * SIZE))
  end=$((start + SIZE))
  body="{\"job_id\":\"$RUN-$i\",\"start\":$start,\"end\":$end}"
  retry 5 20 az storage message put --auth-mode login \
    --account-name "$ACCOUNT" --queue-name "$QUEUE" --content "$body" --output none
done
log "done; queue length: $(az storage queue metadata show --auth-mode login --account-name "$ACCOUNT" --name "$QUEUE" --query approximateMessageCount --output tsv 2>/dev/null || echo '?')"
