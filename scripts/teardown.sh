#!/usr/bin/env bash
# Deletes everything the deployment created: the whole resource group
# (scale set, disks, storage with its queues and results, network, telemetry).
# scripts/teardown.sh [--yes]  (asks first unless --yes)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib-azure.sh
source scripts/lib-azure.sh

require_az
if [[ "${1:-}" != "--yes" ]]; then
  read -r -p "Delete resource group $RESOURCE_GROUP and everything in it? [y/N] " answer
  [[ "$answer" == [yY]* ]] || die "nothing deleted"
fi
log "deleting resource group $RESOURCE_GROUP"
az group delete --name "$RESOURCE_GROUP" --yes
log "deleted"
