#!/usr/bin/env bash
# Deploys a worker to a Spot VM scale set in one command: the example worker
# (primes, the default), your own Rust worker binary, or a program run once
# per message by `spot-worker run -- <command>` with its application bundle.
#   1. builds the release binary (cargo build --release --example primes; the
#      spot-worker command for WORKER_COMMAND; nothing for WORKER_BINARY) and
#      packs the bundle;
#   2. deploys bicep/main.bicep without compute (storage, identity, network,
#      telemetry), granting you upload/enqueue rights and admitting your
#      public address through the storage firewall;
#   3. uploads the binary (and the bundle) to the artifacts container (Entra
#      ID, no keys);
#   4. deploys main.bicep in full: the scale set boots, cloud-init downloads
#      the binary (and the bundle) with the managed identity, checks their
#      SHA-256, unpacks the bundle and starts the worker.
#      A re-deploy keeps each scale set's current instance count, the Spot
#      lane's and the regular lane's (read with az vmss show just before):
#      resetting sku.capacity to the minimum would delete running Spot
#      workers, which get no Scheduled Event for it, and cut regular jobs
#      short.
#
# Settings (environment): RESOURCE_GROUP (spot-worker-rg), LOCATION
# (westeurope), SSH_PUBLIC_KEY (default: ~/.ssh/id_ed25519.pub or id_rsa.pub),
# OPERATOR_IP (default: your public address as Azure sees it; one address:
# a /32 is taken as its address, a /31 is refused), PARAMS_FILE
# (bicep/main.bicepparam), SCHEDULED_EVENTS_TO_EVENT_GRID (false; a preview
# behind a subscription feature flag); extra arguments go to
# `az deployment group create`
# (e.g. --parameters maxInstances=20).
#
# What runs (environment; all optional, primes by default):
#   WORKER_BINARY   a worker binary built already (your own Rust worker, made
#                   with spot_worker::Setup like examples/primes.rs; Linux
#                   x86_64 for Ubuntu 24.04); with WORKER_COMMAND it must be
#                   the spot-worker command.
#   WORKER_COMMAND  a program and its arguments: the VMs run
#                   `spot-worker run -- $WORKER_COMMAND` (docs/command.md),
#                   in the bundle's directory.
#   WORKER_RUN_FLAGS settings of `spot-worker run` before its `--`, e.g.
#                   '--job-key job_id --result-name {job_key}.json'.
#   WORKER_BUNDLE   a directory (packed here) or a .tar.gz holding the
#                   program's files, unpacked into /opt/spot-worker/app.
# e.g. WORKER_RUN_FLAGS='--job-key job_id --result-name {job_key}.json' \
#      WORKER_COMMAND='python3 primes.py' WORKER_BUNDLE=examples/command scripts/deploy.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib-azure.sh
source scripts/lib-azure.sh

PARAMS_FILE="${PARAMS_FILE:-bicep/main.bicepparam}"
WORKER_BINARY="${WORKER_BINARY:-}"
WORKER_COMMAND="${WORKER_COMMAND:-}"
WORKER_BUNDLE="${WORKER_BUNDLE:-}"
WORKER_RUN_FLAGS="${WORKER_RUN_FLAGS:-}"
[[ -z "$WORKER_RUN_FLAGS" || -n "$WORKER_COMMAND" ]] ||
  die "WORKER_RUN_FLAGS are settings of spot-worker run: they need WORKER_COMMAND"
[[ -z "$WORKER_BUNDLE" || -n "$WORKER_COMMAND" ]] ||
  die "WORKER_BUNDLE needs WORKER_COMMAND: the bundle holds the program the command runs"
if [[ -n "$WORKER_BINARY" ]]; then
  [[ -f "$WORKER_BINARY" && -x "$WORKER_BINARY" ]] || die "WORKER_BINARY=$WORKER_BINARY is not an executable file"
  BINARY="$WORKER_BINARY"
  BINARY_BLOB="$(basename "$WORKER_BINARY")"
elif [[ -n "$WORKER_COMMAND" ]]; then
  BINARY=target/release/spot-worker
  BINARY_BLOB=spot-worker
else
  BINARY=target/release/examples/primes
  BINARY_BLOB=spot-worker-primes
fi
if [[ -n "$WORKER_BUNDLE" ]]; then
  [[ -d "$WORKER_BUNDLE" || ( -f "$WORKER_BUNDLE" && "$WORKER_BUNDLE" == *.tar.gz ) ]] ||
    die "WORKER_BUNDLE=$WORKER_BUNDLE is neither a directory nor a .tar.gz file"
fi

require_az

if [[ -z "${SSH_PUBLIC_KEY:-}" ]]; then
  for candidate in "$HOME/.ssh/id_ed25519.pub" "$HOME/.ssh/id_rsa.pub"; do
    if [[ -f "$candidate" ]]; then
      SSH_PUBLIC_KEY="$(cat "$candidate")"
      break
    fi
  done
fi
[[ -n "${SSH_PUBLIC_KEY:-}" ]] || die "no SSH public key: set SSH_PUBLIC_KEY or create ~/.ssh/id_ed25519.pub (ssh-keygen -t ed25519)"

OPERATOR_IP="$(operator_ip)"

SCHEDULED_EVENTS_TO_EVENT_GRID="${SCHEDULED_EVENTS_TO_EVENT_GRID:-false}"
[[ "$SCHEDULED_EVENTS_TO_EVENT_GRID" == true || "$SCHEDULED_EVENTS_TO_EVENT_GRID" == false ]] ||
  die "SCHEDULED_EVENTS_TO_EVENT_GRID must be true or false, not '$SCHEDULED_EVENTS_TO_EVENT_GRID'"

# The scale set encrypts at host (temp disk, caches), which Azure refuses
# unless the subscription has the feature registered, and only at the last
# step, after storage and network exist: check it before deploying anything.
state="$(feature_state Microsoft.Compute EncryptionAtHost)"
[[ "$state" == Registered ]] || die "the scale set uses encryption at host, which needs the subscription feature Microsoft.Compute/EncryptionAtHost; here it is '${state:-unknown}'.
  Register it once per subscription (it takes a few minutes), then run this again:
    az feature register --namespace Microsoft.Compute --name EncryptionAtHost
    az feature show --namespace Microsoft.Compute --name EncryptionAtHost --query properties.state   # until Registered
    az provider register --namespace Microsoft.Compute"
if [[ "$SCHEDULED_EVENTS_TO_EVENT_GRID" == true ]]; then
  log "SCHEDULED_EVENTS_TO_EVENT_GRID=true: publishing Scheduled Events to Event Grid and Resource Graph is a preview"
  log "  behind a subscription feature flag; register it as the Scheduled Events documentation says, or the deployment fails"
fi
# Instance mix (several sizes in skuProfile) was gated by a feature flag in
# some subscriptions; warn only, since it is generally available now.
state="$(feature_state Microsoft.Compute FlexVMScaleSetSkuProfileEnabled)"
if [[ "$state" != Registered ]]; then
  log "note: Microsoft.Compute/FlexVMScaleSetSkuProfileEnabled is '${state:-unknown}'; if the deployment refuses skuProfile:"
  log "  az feature register --namespace Microsoft.Compute --name FlexVMScaleSetSkuProfileEnabled && az provider register -n Microsoft.Compute"
fi

if [[ -n "$WORKER_BINARY" ]]; then
  log "deploying the worker binary $WORKER_BINARY"
elif [[ -n "$WORKER_COMMAND" ]]; then
  log "building the spot-worker command (release)"
  cargo build --release --locked -p spot-worker-cli --bin spot-worker
else
  log "building the example worker (release)"
  cargo build --release --locked --example primes
fi
SHA256="$(sha256sum "$BINARY" | cut -d' ' -f1)"

BUNDLE_FILE=""
BUNDLE_SHA256=""
BUNDLE_BLOB=""
if [[ -n "$WORKER_BUNDLE" ]]; then
  if [[ -d "$WORKER_BUNDLE" ]]; then
    bundle_dir="$(mktemp -d)"
    trap 'rm -rf "$bundle_dir"' EXIT
    BUNDLE_FILE="$bundle_dir/bundle.tar.gz"
    log "packing $WORKER_BUNDLE into a bundle"
    tar -czf "$BUNDLE_FILE" -C "$WORKER_BUNDLE" .
  else
    BUNDLE_FILE="$WORKER_BUNDLE"
  fi
  BUNDLE_SHA256="$(sha256sum "$BUNDLE_FILE" | cut -d' ' -f1)"
  # Named by its content: VMs booting while a new bundle is uploaded still
  # find the one their template names.
  BUNDLE_BLOB="app-${BUNDLE_SHA256:0:16}.tar.gz"
fi

log "resource group $RESOURCE_GROUP in $LOCATION"
az group create --name "$RESOURCE_GROUP" --location "$LOCATION" --output none

operator_identity

deploy() {
  az deployment group create \
    --resource-group "$RESOURCE_GROUP" \
    --name "$DEPLOYMENT_NAME" \
    --template-file bicep/main.bicep \
    --parameters "$PARAMS_FILE" \
    --parameters \
    sshPublicKey="$SSH_PUBLIC_KEY" \
    workerBinaryName="$BINARY_BLOB" \
    workerBinarySha256="$SHA256" \
    workerCommand="$WORKER_COMMAND" \
    workerRunFlags="$WORKER_RUN_FLAGS" \
    workerBundleName="$BUNDLE_BLOB" \
    workerBundleSha256="$BUNDLE_SHA256" \
    operatorPrincipalId="$OPERATOR_ID" \
    operatorPrincipalType="$OPERATOR_TYPE" \
    operatorIpRanges="[\"$OPERATOR_IP\"]" \
    publishScheduledEventsToEventGrid="$SCHEDULED_EVENTS_TO_EVENT_GRID" \
    "$@" \
    --output none
}

# The scale sets of an earlier deployment, if they still exist: the Spot
# lane's and the regular lane's (docs/deploying.md, "The two lanes", named *-regular-vmss). Each is
# the one the last full deployment's outputs name (read before step 2, whose
# outputs name none), else the resource group's only one of its lane (an
# earlier run stopped early).
listed="$(az vmss list --resource-group "$RESOURCE_GROUP" --query "[].name" --output tsv)" ||
  die "could not list the scale sets of $RESOURCE_GROUP; deploying without their instance count could delete running workers"
mapfile -t scale_sets < <(printf '%s' "$listed" | sed '/^$/d')
spot_sets=()
regular_sets=()
for set in "${scale_sets[@]}"; do
  if [[ "$set" == *-regular-vmss ]]; then
    regular_sets+=("$set")
  else
    spot_sets+=("$set")
  fi
done
# usage: existing OUTPUT SETS...: the scale set of a lane to keep the count of
existing() {
  local named
  named="$(deployment_output "$1" 2>/dev/null || true)"
  shift
  if [[ -n "$named" && " $* " == *" $named "* ]]; then
    printf '%s' "$named"
  elif (($# == 1)); then
    printf '%s' "$1"
  elif (($# > 1)); then
    die "resource group $RESOURCE_GROUP holds several scale sets of one lane ($*): cannot tell which one's instance count to keep"
  fi
}
EXISTING_VMSS="$(existing vmssName "${spot_sets[@]}")"
EXISTING_REGULAR="$(existing regularVmssName "${regular_sets[@]}")"

log "deploying storage, identity, network and telemetry"
deploy --parameters deployCompute=false "$@"

ACCOUNT="$(deployment_output storageAccountName)"
CONTAINER="$(deployment_output artifactsContainer)"
BLOB="$(deployment_output workerBinaryName)"
log "uploading $BINARY (sha256 $SHA256) to $ACCOUNT/$CONTAINER/$BLOB"
retry 10 30 az storage blob upload --auth-mode login --overwrite \
  --account-name "$ACCOUNT" --container-name "$CONTAINER" --name "$BLOB" \
  --file "$BINARY" --output none
if [[ -n "$BUNDLE_FILE" ]]; then
  log "uploading the bundle (sha256 $BUNDLE_SHA256) to $ACCOUNT/$CONTAINER/$BUNDLE_BLOB"
  retry 10 30 az storage blob upload --auth-mode login --overwrite \
    --account-name "$ACCOUNT" --container-name "$CONTAINER" --name "$BUNDLE_BLOB" \
    --file "$BUNDLE_FILE" --output none
fi

# Read as late as possible: autoscale may still change the count before the
# deployment applies it. Instances it adds in that minute are still booting
# (cloud-init takes minutes), so undoing them cuts no job, and autoscale adds
# them again. If the count cannot be read, stop: guessing 0 would reset the
# scale set to minInstances and delete busy workers.
# usage: capacity SCALE_SET: its instance count now (0 for none)
capacity() {
  local count=0
  if [[ -n "$1" ]]; then
    count="$(az vmss show --resource-group "$RESOURCE_GROUP" --name "$1" --query sku.capacity --output tsv)" ||
      die "could not read the instance count of scale set $1; deploying without it could delete running workers"
    [[ "$count" =~ ^[0-9]+$ ]] || die "scale set $1 reports instance count '$count', not a number"
    log "scale set $1 runs $count instances: the deployment keeps that count"
  fi
  printf '%s' "$count"
}
CURRENT="$(capacity "$EXISTING_VMSS")"
CURRENT_REGULAR="$(capacity "$EXISTING_REGULAR")"

log "deploying the scale sets and autoscale"
deploy --parameters deployCompute=true currentInstanceCount="$CURRENT" \
  currentRegularInstanceCount="$CURRENT_REGULAR" "$@"

VMSS="$(deployment_output vmssName)"
QUEUE="$(deployment_output queueName)"
REGULAR_QUEUE="$(deployment_output regularQueueName)"
log "deployed: scale set $VMSS, storage $ACCOUNT, queue $QUEUE${REGULAR_QUEUE:+, regular lane queue $REGULAR_QUEUE}"
# The operator's commands take the workers' own settings (docs/operating.md).
# A Flexible scale set's instances are VMs of their own: az vm list --vmss
# lists them (az vmss list-instances is for Uniform scale sets).
log "next: export SPOT_WORKER_STORAGE_ACCOUNT_URL=$(deployment_output blobEndpoint) SPOT_WORKER_QUEUE=$QUEUE${REGULAR_QUEUE:+ SPOT_WORKER_REGULAR_QUEUE=$REGULAR_QUEUE}"
log "  spot-worker enqueue jobs.jsonl; spot-worker status"
log "  the workers: az vm list -g $RESOURCE_GROUP --vmss $VMSS -o table"
