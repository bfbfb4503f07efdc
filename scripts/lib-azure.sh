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

# The operator's public IPv4 address as the storage firewall takes it: a
# single address, never a /31 or /32 range (Azure Storage's IP network rules
# do not support those prefix sizes and ask for individual addresses instead:
# learn.microsoft.com/azure/storage/common/storage-network-security).
# From OPERATOR_IP, else asked of api.ipify.org; `/32` becomes the address,
# `/31` is refused. Prints the address.
operator_ip() {
  local ip="${OPERATOR_IP:-}"
  if [[ -z "$ip" ]]; then
    ip="$(curl -fsS --max-time 10 https://api.ipify.org || true)"
  fi
  ip="${ip%/32}"
  if [[ "$ip" == */31 ]]; then
    die "OPERATOR_IP=$ip: the storage firewall takes single addresses, not /31 ranges; set OPERATOR_IP to the one address your traffic leaves from"
  fi
  [[ "$ip" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}(/([0-9]|[12][0-9]|30))?$ ]] ||
    die "could not tell your public IPv4 address (got '$ip'): set OPERATOR_IP to it (the storage firewall admits only it and the workers)"
  printf '%s\n' "$ip"
}

# The signed-in operator, whom the templates grant upload, enqueue and
# read-results rights: sets OPERATOR_ID (object id) and OPERATOR_TYPE (User,
# or ServicePrincipal when az is logged in as one, as in CI).
operator_identity() {
  OPERATOR_ID="$(az ad signed-in-user show --query id --output tsv 2>/dev/null || true)"
  OPERATOR_TYPE=User
  if [[ -z "$OPERATOR_ID" ]]; then
    OPERATOR_ID="$(az ad sp show --id "$(az account show --query user.name --output tsv)" --query id --output tsv)"
    OPERATOR_TYPE=ServicePrincipal
  fi
  export OPERATOR_ID OPERATOR_TYPE
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
