#!/usr/bin/env bash
# Deploys the worker to AKS in one command (docs/deploying.md, "On AKS"):
#   1. deploys bicep/aks/main.bicep: storage, the workers' identity and roles,
#      the cluster (system pool + Spot pool from zero, KEDA, OIDC issuer,
#      workload identity), the federated credentials, telemetry;
#   2. fetches the cluster's credentials (Entra ID; local accounts are off);
#   3. renders deploy/kubernetes/ with the deployment's outputs and applies
#      it: namespace, service account, the worker Deployment, and KEDA's
#      TriggerAuthentication + ScaledObject.
#
# Settings (environment): IMAGE (required: the worker image, built with
# scripts/build-image.sh and pushed to a registry the cluster can pull from,
# e.g. an ACR attached with `az aks update --attach-acr`), WORKER_ARGS (the
# container's command as a YAML flow list, default '["/usr/local/bin/primes"]';
# any program: '["/usr/local/bin/spot-worker", "run", "--", "python3", "job.py"]'
# with an image that holds it),
# RESOURCE_GROUP (spot-worker-rg), LOCATION (westeurope), OPERATOR_IP
# (default: your public address), PARAMS_FILE (bicep/aks/main.bicepparam),
# MAX_REPLICAS (20), MESSAGES_PER_POD (20); extra arguments go to
# `az deployment group create` (e.g. --parameters spotMaxCount=20).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib-azure.sh
source scripts/lib-azure.sh

DEPLOYMENT_NAME="${AKS_DEPLOYMENT_NAME:-spot-worker-aks}"
PARAMS_FILE="${PARAMS_FILE:-bicep/aks/main.bicepparam}"
NAMESPACE="${NAMESPACE:-spot-worker}"
WORKER_ARGS="${WORKER_ARGS:-[\"/usr/local/bin/primes\"]}"
MAX_REPLICAS="${MAX_REPLICAS:-20}"
MESSAGES_PER_POD="${MESSAGES_PER_POD:-20}"

[[ -n "${IMAGE:-}" ]] || die "set IMAGE to the worker image the cluster pulls (scripts/build-image.sh builds it; push it to your registry)"
command -v kubectl >/dev/null || die "kubectl is required (az aks install-cli)"
require_az

if [[ -z "${OPERATOR_IP:-}" ]]; then
  OPERATOR_IP="$(curl -fsS --max-time 10 https://api.ipify.org || true)"
fi
[[ "${OPERATOR_IP:-}" =~ ^[0-9]+(\.[0-9]+){3}(/[0-9]+)?$ ]] ||
  die "could not tell your public IPv4 address: set OPERATOR_IP (the storage firewall admits only it and the workers)"

log "resource group $RESOURCE_GROUP in $LOCATION"
az group create --name "$RESOURCE_GROUP" --location "$LOCATION" --output none

operator_id="$(az ad signed-in-user show --query id --output tsv 2>/dev/null || true)"
log "deploying bicep/aks/main.bicep (a new cluster takes about ten minutes)"
az deployment group create --resource-group "$RESOURCE_GROUP" --name "$DEPLOYMENT_NAME" \
  --template-file bicep/aks/main.bicep --parameters "$PARAMS_FILE" \
  --parameters namespace="$NAMESPACE" operatorIpRanges="[\"$OPERATOR_IP\"]" \
  operatorPrincipalId="$operator_id" "$@" --output none

cluster="$(deployment_output clusterName)"
log "credentials of $cluster"
az aks get-credentials --resource-group "$RESOURCE_GROUP" --name "$cluster" --overwrite-existing --output none
if command -v kubelogin >/dev/null; then
  kubelogin convert-kubeconfig -l azurecli
fi

# Fills every ${NAME} placeholder of a manifest; refuses one left unfilled.
# usage: render FILE
render() {
  local text name value
  text="$(cat "$1")"
  for name in NAMESPACE WORKER_CLIENT_ID SCALER_CLIENT_ID TENANT_ID IMAGE WORKER_ARGS \
    STORAGE_ACCOUNT STORAGE_ACCOUNT_URL QUEUE MAX_REPLICAS MESSAGES_PER_POD; do
    value="${!name}"
    text="${text//\$\{$name\}/$value}"
  done
  if [[ "$text" =~ \$\{[A-Z_]+\} ]]; then
    die "$1: ${BASH_REMATCH[0]} has no value"
  fi
  printf '%s\n' "$text"
}

WORKER_CLIENT_ID="$(deployment_output workerClientId)"
SCALER_CLIENT_ID="$(deployment_output scalerClientId)"
TENANT_ID="$(deployment_output tenantId)"
STORAGE_ACCOUNT="$(deployment_output storageAccountName)"
STORAGE_ACCOUNT_URL="$(deployment_output blobEndpoint)"
QUEUE="$(deployment_output queueName)"
export NAMESPACE WORKER_CLIENT_ID SCALER_CLIENT_ID TENANT_ID IMAGE WORKER_ARGS \
  STORAGE_ACCOUNT STORAGE_ACCOUNT_URL QUEUE MAX_REPLICAS MESSAGES_PER_POD

for manifest in namespace serviceaccount deployment keda; do
  log "kubectl apply deploy/kubernetes/$manifest.yaml"
  render "deploy/kubernetes/$manifest.yaml" | kubectl apply -f -
done

log "done: KEDA adds worker pods when messages wait in '$QUEUE' (kubectl -n $NAMESPACE get scaledobject,pods)"
