#!/usr/bin/env bash
# Deploys the example worker to a Spot VM scale set in one command:
#   1. builds the release binary (cargo build --release --example primes);
#   2. deploys bicep/main.bicep without compute (storage, identity, network,
#      telemetry), granting you upload/enqueue rights and admitting your
#      public address through the storage firewall;
#   3. uploads the binary to the artifacts container (Entra ID, no keys);
#   4. deploys main.bicep in full: the scale set boots, cloud-init downloads
#      the binary with the managed identity, checks its SHA-256 and starts it.
#
# Settings (environment): RESOURCE_GROUP (spot-worker-rg), LOCATION
# (westeurope), SSH_PUBLIC_KEY (default: ~/.ssh/id_ed25519.pub or id_rsa.pub),
# OPERATOR_IP (default: your public address as Azure sees it), PARAMS_FILE
# (bicep/main.bicepparam); extra arguments go to `az deployment group create`
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

# Subscription features the scale set uses: encryption at host, and instance
# mix (several VM sizes in skuProfile) where it is still gated. Registering
# takes minutes and is done once per subscription, so only warn here.
for feature in EncryptionAtHost FlexVMScaleSetSkuProfileEnabled; do
  state="$(az feature show --namespace Microsoft.Compute --name "$feature" --query properties.state --output tsv 2>/dev/null || true)"
  if [[ "$state" != Registered ]]; then
    log "warning: Microsoft.Compute/$feature is '${state:-unknown}'; if the deployment asks for it:"
    log "  az feature register --namespace Microsoft.Compute --name $feature && az provider register -n Microsoft.Compute"
  fi
done

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
    "$@" \
    --output none
}

log "deploying storage, identity, network and telemetry"
deploy --parameters deployCompute=false "$@"

ACCOUNT="$(deployment_output storageAccountName)"
CONTAINER="$(deployment_output artifactsContainer)"
BLOB="$(deployment_output workerBinaryName)"
log "uploading $BINARY (sha256 $SHA256) to $ACCOUNT/$CONTAINER/$BLOB"
retry 10 30 az storage blob upload --auth-mode login --overwrite \
  --account-name "$ACCOUNT" --container-name "$CONTAINER" --name "$BLOB" \
  --file "$BINARY" --output none

log "deploying the scale set and autoscale"
deploy --parameters deployCompute=true "$@"

VMSS="$(deployment_output vmssName)"
log "deployed: scale set $VMSS, storage $ACCOUNT, queue $(deployment_output queueName)"
log "next: scripts/enqueue.sh 20   then watch: az vmss list-instances -g $RESOURCE_GROUP -n $VMSS -o table"
