#!/usr/bin/env bash
# Deploys the worker to AKS in one command (docs/deploying.md, "On AKS"):
#   1. deploys bicep/aks/main.bicep: storage, the workers' identity and roles,
#      the cluster (system pool + Spot pool from zero, KEDA, OIDC issuer,
#      workload identity), the federated credentials, telemetry;
#   2. lets the cluster pull from your registry (ACR_NAME, optional), fetches
#      the cluster's credentials (Entra ID; local accounts are off) and turns
#      them into kubelogin's azurecli mode, as AKS's Entra ID docs say;
#   3. gives KEDA's operator the scaler identity, as AKS's KEDA-with-workload-
#      identity guide does: annotates kube-system/keda-operator with the
#      scaler's client id, restarts the operator, waits for the rollout and
#      checks the operator pods got AZURE_FEDERATED_TOKEN_FILE (without it
#      KEDA's scaler has no credential and nothing ever scales out);
#   4. renders deploy/kubernetes/ with the deployment's outputs and applies
#      it: namespace, the telemetry Secret (Application Insights' connection
#      string, never printed), service account, the worker Deployment (no
#      replica count: a re-run never scales running workers), KEDA's
#      TriggerAuthentication + ScaledObject, and with the regular lane
#      (docs/deploying.md, "The two lanes") its Deployment and ScaledObject (regular.yaml);
#   5. waits for KEDA to read the queues and reports each ScaledObject's
#      READY and ACTIVE conditions, failing with KEDA's own message if it
#      cannot.
#
# Settings (environment): IMAGE (required: the worker image, built with
# scripts/build-image.sh and pushed to a registry the cluster can pull from,
# docs/deploying.md "On AKS"), ACR_NAME (an Azure Container Registry to attach
# with `az aks update --attach-acr`; needs the right to assign roles),
# WORKER_ARGS (the container's command as a YAML flow list, default
# '["/usr/local/bin/primes"]'; any program:
# '["/usr/local/bin/spot-worker", "run", "--", "python3", "job.py"]' with an
# image that holds it), RESOURCE_GROUP (spot-worker-rg), LOCATION
# (westeurope), OPERATOR_IP (default: your public address; a single address),
# PARAMS_FILE (bicep/aks/main.bicepparam), MAX_REPLICAS (20),
# MESSAGES_PER_POD (20), REGULAR_MAX_REPLICAS (5: regular-lane pods, one job
# each), KEDA_CHECKS (12 checks of the ScaledObject, 5 s
# apart); extra arguments go to `az deployment group create` (e.g.
# --parameters spotMaxCount=20 spotMaxPrice=0.05).
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
REGULAR_MAX_REPLICAS="${REGULAR_MAX_REPLICAS:-5}"

[[ -n "${IMAGE:-}" ]] || die "set IMAGE to the worker image the cluster pulls (scripts/build-image.sh builds it; push it to your registry: docs/deploying.md, On AKS)"
KEDA_CHECKS="${KEDA_CHECKS:-12}"
[[ "$KEDA_CHECKS" =~ ^[1-9][0-9]*$ ]] || die "KEDA_CHECKS must be a positive number, not '$KEDA_CHECKS'"
command -v kubectl >/dev/null || die "kubectl is required (az aks install-cli)"
# Local accounts are off and Azure RBAC is on: kubectl signs in through
# kubelogin, which az aks get-credentials' kubeconfig calls.
command -v kubelogin >/dev/null || die "kubelogin is required: the cluster takes Entra ID sign-in only (az aks install-cli installs kubectl and kubelogin)"
require_az
OPERATOR_IP="$(operator_ip)"
STARTED="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

log "resource group $RESOURCE_GROUP in $LOCATION"
az group create --name "$RESOURCE_GROUP" --location "$LOCATION" --output none

operator_identity
log "deploying bicep/aks/main.bicep (a new cluster takes about ten minutes)"
az deployment group create --resource-group "$RESOURCE_GROUP" --name "$DEPLOYMENT_NAME" \
  --template-file bicep/aks/main.bicep --parameters "$PARAMS_FILE" \
  --parameters namespace="$NAMESPACE" operatorIpRanges="[\"$OPERATOR_IP\"]" \
  operatorPrincipalId="$OPERATOR_ID" operatorPrincipalType="$OPERATOR_TYPE" "$@" --output none

cluster="$(deployment_output clusterName)"
if [[ -n "${ACR_NAME:-}" ]]; then
  log "letting $cluster pull from the registry $ACR_NAME"
  az aks update --resource-group "$RESOURCE_GROUP" --name "$cluster" --attach-acr "$ACR_NAME" --output none
fi
log "credentials of $cluster (Entra ID, through kubelogin)"
az aks get-credentials --resource-group "$RESOURCE_GROUP" --name "$cluster" --overwrite-existing --output none
kubelogin convert-kubeconfig -l azurecli

# Fills every ${NAME} placeholder of a manifest; refuses one left unfilled.
# usage: render FILE
render() {
  local text name value
  text="$(cat "$1")"
  for name in NAMESPACE WORKER_CLIENT_ID SCALER_CLIENT_ID TENANT_ID IMAGE WORKER_ARGS \
    STORAGE_ACCOUNT STORAGE_ACCOUNT_URL QUEUE REGULAR_QUEUE MAX_REPLICAS REGULAR_MAX_REPLICAS \
    MESSAGES_PER_POD; do
    value="${!name}"
    text="${text//\$\{$name\}/$value}"
  done
  if [[ "$text" =~ \$\{[A-Z_]+\} ]]; then
    die "$1: ${BASH_REMATCH[0]} has no value"
  fi
  printf '%s\n' "$text"
}

apply_manifest() {
  log "kubectl apply deploy/kubernetes/$1.yaml"
  render "deploy/kubernetes/$1.yaml" | kubectl apply -f -
}

WORKER_CLIENT_ID="$(deployment_output workerClientId)"
SCALER_CLIENT_ID="$(deployment_output scalerClientId)"
TENANT_ID="$(deployment_output tenantId)"
STORAGE_ACCOUNT="$(deployment_output storageAccountName)"
STORAGE_ACCOUNT_URL="$(deployment_output blobEndpoint)"
QUEUE="$(deployment_output queueName)"
# Empty without the regular lane: the Spot lane's workers then have no lanes.
REGULAR_QUEUE="$(deployment_output regularQueueName)"
APP_INSIGHTS="$(deployment_output appInsightsName)"
export NAMESPACE WORKER_CLIENT_ID SCALER_CLIENT_ID TENANT_ID IMAGE WORKER_ARGS \
  STORAGE_ACCOUNT STORAGE_ACCOUNT_URL QUEUE REGULAR_QUEUE MAX_REPLICAS REGULAR_MAX_REPLICAS \
  MESSAGES_PER_POD
[[ -n "$SCALER_CLIENT_ID" ]] || die "the deployment has no scalerClientId output"

# KEDA's identity (AKS, "Securely scale your applications using the KEDA
# add-on and workload identity"; the annotation step: Azure/AKS#5243). The
# add-on's operator runs as kube-system/keda-operator, which the scaler
# identity's federated credential trusts; the webhook injects the token only
# into pods started after the service account names a client id, and with the
# add-on and workload identity enabled in one deployment their order is not
# defined: so annotate, and restart the operator unless its pods already have
# the token for this identity (a re-run restarts nothing).
keda_pods() {
  kubectl get pods --namespace kube-system --selector app=keda-operator \
    --output jsonpath='{range .items[*]}{.metadata.name}{"|"}{.metadata.deletionTimestamp}{"|"}{range .spec.containers[*].env[*]}{.name}{"="}{.value}{" "}{end}{"\n"}{end}'
}
# Succeeds when every running operator pod has the token file and the
# scaler's client id (the webhook's injected variables).
keda_has_token() {
  local pods name deleting env seen=0
  pods="$(keda_pods)" || return 1
  while IFS='|' read -r name deleting env; do
    [[ -n "$name" && -z "$deleting" ]] || continue
    seen=$((seen + 1))
    [[ " $env" == *" AZURE_FEDERATED_TOKEN_FILE="* && " $env" == *" AZURE_CLIENT_ID=$SCALER_CLIENT_ID "* ]] || return 1
  done <<<"$pods"
  ((seen > 0))
}
annotated="$(kubectl get serviceaccount keda-operator --namespace kube-system \
  --output jsonpath='{.metadata.annotations.azure\.workload\.identity/client-id}')" ||
  die "could not read kube-system/keda-operator: is the KEDA add-on on?"
if [[ "$annotated" != "$SCALER_CLIENT_ID" ]] || ! keda_has_token; then
  log "giving KEDA's operator the scaler identity $SCALER_CLIENT_ID (annotate, restart)"
  kubectl annotate serviceaccount keda-operator --namespace kube-system --overwrite \
    "azure.workload.identity/client-id=$SCALER_CLIENT_ID"
  kubectl rollout restart deployment/keda-operator --namespace kube-system
  kubectl rollout status deployment/keda-operator --namespace kube-system --timeout=300s
  keda_has_token ||
    die "KEDA's operator pods have no AZURE_FEDERATED_TOKEN_FILE after the restart: workload identity did not reach them, and KEDA's scaler would fail with 'sources must contain at least one TokenCredential' (kedacore/keda#5006). Check: kubectl -n kube-system describe pod -l app=keda-operator"
else
  log "KEDA's operator already runs with the scaler identity"
fi

apply_manifest namespace
if [[ -n "$APP_INSIGHTS" ]]; then
  # The workers export telemetry when the Secret exists (deployment.yaml reads
  # it, optional). The connection string goes to kubectl on stdin: it is never
  # an argument (visible in ps) nor printed.
  log "the telemetry Secret spot-worker-telemetry (Application Insights $APP_INSIGHTS)"
  connection="$(az resource show --resource-group "$RESOURCE_GROUP" --name "$APP_INSIGHTS" \
    --resource-type Microsoft.Insights/components --query properties.ConnectionString --output tsv)"
  [[ "$connection" == InstrumentationKey=* ]] ||
    die "Application Insights $APP_INSIGHTS has no connection string the workers could use"
  connection="${connection//\\/\\\\}"
  printf 'apiVersion: v1\nkind: Secret\nmetadata:\n  name: spot-worker-telemetry\n  namespace: %s\ntype: Opaque\nstringData:\n  connection-string: "%s"\n' \
    "$NAMESPACE" "${connection//\"/\\\"}" | kubectl apply -f -
  unset connection
fi
manifests=(serviceaccount pod-deletion-cost deployment keda)
scaled_objects=(spot-worker)
if [[ -n "$REGULAR_QUEUE" ]]; then
  manifests+=(regular)
  scaled_objects+=(spot-worker-regular)
fi
for manifest in "${manifests[@]}"; do
  apply_manifest "$manifest"
done

# KEDA reads the queues every pollingInterval (15 s): a scaler that cannot
# (no token, no role, the firewall) sets READY False or records a
# KEDAScalerFailed event. Watch a few intervals before calling it done.
# usage: wait_for_keda SCALED_OBJECT
wait_for_keda() {
  local object="$1" check conditions failure latest type status text when
  log "waiting for KEDA to read the queues of ScaledObject $object"
  ready="" active="" message=""
  for ((check = 1; check <= KEDA_CHECKS; check++)); do
    conditions="$(kubectl get scaledobject "$object" --namespace "$NAMESPACE" \
      --output jsonpath='{range .status.conditions[*]}{.type}{"|"}{.status}{"|"}{.message}{"\n"}{end}')" || conditions=""
    ready="" active="" message=""
    while IFS='|' read -r type status text; do
      case "$type" in
        Ready) ready="$status" message="$text" ;;
        Active) active="$status" ;;
      esac
    done <<<"$conditions"
    failure="$(kubectl get events --namespace "$NAMESPACE" \
      --field-selector "involvedObject.kind=ScaledObject,involvedObject.name=$object,reason=KEDAScalerFailed" \
      --output jsonpath='{range .items[*]}{.lastTimestamp}{"|"}{.message}{"\n"}{end}')" || failure=""
    latest=""
    while IFS='|' read -r when text; do
      # Only this run's: an event of an earlier run lingers for an hour.
      if [[ -n "$when" && ! "$when" < "$STARTED" ]]; then
        latest="$text"
      fi
    done <<<"$failure"
    if [[ "$ready" == False || -n "$latest" ]]; then
      die "KEDA cannot scale $object: READY=${ready:-unknown} ${message:+($message) }${latest:+KEDA: $latest}"
    fi
    if [[ "$ready" == True ]] && ((check * 2 > KEDA_CHECKS)); then
      break
    fi
    sleep 5
  done
  [[ "$ready" == True ]] || die "KEDA did not report the ScaledObject $object ready after $KEDA_CHECKS checks: kubectl -n $NAMESPACE describe scaledobject $object"
  log "ScaledObject $object: READY=$ready ACTIVE=${active:-unknown} (ACTIVE is True while messages wait or are leased)"
}
for object in "${scaled_objects[@]}"; do
  wait_for_keda "$object"
done
queues="'$QUEUE'"
if [[ -n "$REGULAR_QUEUE" ]]; then
  queues+=" and '$REGULAR_QUEUE'"
fi
log "done: KEDA adds worker pods when messages wait in $queues (kubectl -n $NAMESPACE get scaledobject,pods)"
log "next: export SPOT_WORKER_STORAGE_ACCOUNT_URL=$STORAGE_ACCOUNT_URL SPOT_WORKER_QUEUE=$QUEUE${REGULAR_QUEUE:+ SPOT_WORKER_REGULAR_QUEUE=$REGULAR_QUEUE}"
log "  spot-worker enqueue jobs.jsonl; spot-worker status"
