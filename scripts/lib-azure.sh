# Shared by the deployment scripts (sourced, not run): settings, checks and
# small helpers. Every setting can be given in the environment.
# shellcheck shell=bash

RESOURCE_GROUP="${RESOURCE_GROUP:-spot-worker-rg}"
LOCATION="${LOCATION:-westeurope}"
DEPLOYMENT_NAME="${DEPLOYMENT_NAME:-spot-worker}"

log() { printf '==> %s\n' "$*" >&2; }
die() {
  printf 'error: %s\n' "$*" >&2
  exit 1
}

require_az() {
  command -v az >/dev/null || die "the Azure CLI (az) is required: https://learn.microsoft.com/cli/azure/install-azure-cli"
  az account show --output none 2>/dev/null || die "not logged in: run 'az login' (and 'az account set -s SUBSCRIPTION')"
}

# One output of the last deployment of main.bicep.
deployment_output() {
  az deployment group show --resource-group "$RESOURCE_GROUP" --name "$DEPLOYMENT_NAME" \
    --query "properties.outputs.$1.value" --output tsv
}

# The registration state of a subscription feature (Registered, NotRegistered,
# Pending, ...); empty when az cannot tell.
# usage: feature_state NAMESPACE FEATURE
feature_state() {
  az feature show --namespace "$1" --name "$2" --query properties.state --output tsv 2>/dev/null || true
}

# Retries a command (role assignments take a minute or two to apply).
retry() {
  local attempts="$1" delay="$2" n=1
  shift 2
  until "$@"; do
    if ((n >= attempts)); then
      return 1
    fi
    log "attempt $n of $attempts failed; retrying in ${delay}s (role assignments may still be propagating)"
    sleep "$delay"
    n=$((n + 1))
  done
}
