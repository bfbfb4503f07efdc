#!/usr/bin/env bash
# Deploys the example worker to a Spot VM scale set in one command:
#   1. builds the release binary (cargo build --release --example primes);
#   2. deploys bicep/main.bicep without compute (storage, identity, network,
#      telemetry), granting you upload/enqueue rights and admitting your
#      public address through the storage firewall;
#   3. uploads the binary to the artifacts container (Entra ID, no keys);
#   4. deploys main.bicep in full: the scale set boots, cloud-init downloads
#      the binary with the managed identity, checks its SHA-256 and starts it.
#      A re-deploy keeps the scale set's current instance count (read with
#      az vmss show just before): resetting sku.capacity to the minimum would
#      delete running Spot workers, which get no Scheduled Event for it.
#
# Settings (environment): RESOURCE_GROUP (spot-worker-rg), LOCATION
# (westeurope), SSH_PUBLIC_KEY (default: ~/.ssh/id_ed25519.pub or id_rsa.pub),
# OPERATOR_IP (default: your public address as Azure sees it), PARAMS_FILE
# (bicep/main.bicepparam), SCHEDULED_EVENTS_TO_EVENT_GRID (false; a preview
# behind a subscription feature flag); extra arguments go to
# `az deployment group create`
# (e.g. --parameters maxInstances=20).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib-azure.sh
source scripts/lib-azure.sh

PARAMS_FILE="${PARAMS_FILE:-bicep/main.bicepparam}"
BINARY=target/release/examples/primes

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

if [[ -z "${OPERATOR_IP:-}" ]]; then
  OPERATOR_IP="$(curl -fsS --max-time 10 https://api.ipify.org || true)"
fi
[[ "${OPERATOR_IP:-}" =~ ^[0-9]+(\.[0-9]+){3}(/[0-9]+)?$ ]] ||
  die "could not tell your public IPv4 address: set OPERATOR_IP (the storage firewall admits only it and the workers)"

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

log "building the worker (release)"
cargo build --release --locked --example primes
SHA256="$(sha256sum "$BINARY" | cut -d' ' -f1)"

log "resource group $RESOURCE_GROUP in $LOCATION"
az group create --name "$RESOURCE_GROUP" --location "$LOCATION" --output none

OPERATOR_ID="$(az ad signed-in-user show --query id --output tsv 2>/dev/null || true)"
OPERATOR_TYPE=User
if [[ -z "$OPERATOR_ID" ]]; then
  # Logged in as a service principal (CI).
  OPERATOR_ID="$(az ad sp show --id "$(az account show --query user.name --output tsv)" --query id --output tsv)"
  OPERATOR_TYPE=ServicePrincipal
fi

deploy() {
  az deployment group create \
    --resource-group "$RESOURCE_GROUP" \
    --name "$DEPLOYMENT_NAME" \
    --template-file bicep/main.bicep \
    --parameters "$PARAMS_FILE" \
    --parameters \
    sshPublicKey="$SSH_PUBLIC_KEY" \
    workerBinarySha256="$SHA256" \
    operatorPrincipalId="$OPERATOR_ID" \
    operatorPrincipalType="$OPERATOR_TYPE" \
    operatorIpRanges="[\"$OPERATOR_IP\"]" \
    publishScheduledEventsToEventGrid="$SCHEDULED_EVENTS_TO_EVENT_GRID" \
    "$@" \
    --output none
}

# The scale set of an earlier deployment, if one still exists: the one the last
# full deployment's outputs name (read before step 2, whose outputs name none),
# else the resource group's only scale set (an earlier run stopped early).
listed="$(az vmss list --resource-group "$RESOURCE_GROUP" --query "[].name" --output tsv)" ||
  die "could not list the scale sets of $RESOURCE_GROUP; deploying without their instance count could delete running workers"
mapfile -t scale_sets < <(printf '%s' "$listed" | sed '/^$/d')
named="$(deployment_output vmssName 2>/dev/null || true)"
EXISTING_VMSS=""
if [[ -n "$named" && " ${scale_sets[*]} " == *" $named "* ]]; then
  EXISTING_VMSS="$named"
elif ((${#scale_sets[@]} == 1)); then
  EXISTING_VMSS="${scale_sets[0]}"
elif ((${#scale_sets[@]} > 1)); then
  die "resource group $RESOURCE_GROUP holds several scale sets (${scale_sets[*]}): cannot tell which one's instance count to keep"
fi

log "deploying storage, identity, network and telemetry"
deploy --parameters deployCompute=false "$@"

ACCOUNT="$(deployment_output storageAccountName)"
CONTAINER="$(deployment_output artifactsContainer)"
BLOB="$(deployment_output workerBinaryName)"
log "uploading $BINARY (sha256 $SHA256) to $ACCOUNT/$CONTAINER/$BLOB"
retry 10 30 az storage blob upload --auth-mode login --overwrite \
  --account-name "$ACCOUNT" --container-name "$CONTAINER" --name "$BLOB" \
  --file "$BINARY" --output none

# Read as late as possible: autoscale may still change the count before the
# deployment applies it. Instances it adds in that minute are still booting
# (cloud-init takes minutes), so undoing them cuts no job, and autoscale adds
# them again. If the count cannot be read, stop: guessing 0 would reset the
# scale set to minInstances and delete busy workers.
CURRENT=0
if [[ -n "$EXISTING_VMSS" ]]; then
  CURRENT="$(az vmss show --resource-group "$RESOURCE_GROUP" --name "$EXISTING_VMSS" \
    --query sku.capacity --output tsv)" ||
    die "could not read the instance count of scale set $EXISTING_VMSS; deploying without it could delete running workers"
  [[ "$CURRENT" =~ ^[0-9]+$ ]] || die "scale set $EXISTING_VMSS reports instance count '$CURRENT', not a number"
  log "scale set $EXISTING_VMSS runs $CURRENT instances: the deployment keeps that count"
fi

log "deploying the scale set and autoscale"
deploy --parameters deployCompute=true currentInstanceCount="$CURRENT" "$@"

VMSS="$(deployment_output vmssName)"
log "deployed: scale set $VMSS, storage $ACCOUNT, queue $(deployment_output queueName)"
log "next: scripts/enqueue.sh 20   then watch: az vmss list-instances -g $RESOURCE_GROUP -n $VMSS -o table"
