#!/usr/bin/env bash
# Simulates a Spot eviction of one worker: scripts/simulate-eviction.sh [VM_NAME]
# (default: the first VM of the scale set). Azure posts a Preempt Scheduled
# Event to the VM (at least 30 s notice), the worker drains (checkpoints, gives
# its messages back, approves the event) and the VM is deleted (eviction
# policy Delete); autoscale replaces it while the queue has work, and another
# worker resumes the jobs from their checkpoints.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib-azure.sh
source scripts/lib-azure.sh

require_az
VMSS="$(deployment_output vmssName)"
[[ -n "$VMSS" ]] || die "no scale set deployed (run scripts/deploy.sh)"

# In a Flexible scale set each instance is a VM of its own: `az vm list
# --vmss` lists them (az's help for `vmss list-instances` sends Flexible
# scale sets there), and the VM-level call is the one that applies to it
# (the instance-id form is for Uniform sets).
VM="${1:-}"
if [[ -z "$VM" ]]; then
  VM="$(az vm list --resource-group "$RESOURCE_GROUP" --vmss "$VMSS" --query '[0].name' --output tsv)"
fi
[[ -n "$VM" ]] || die "the scale set $VMSS has no VM to evict"

log "simulating the eviction of $VM (scale set $VMSS)"
az vm simulate-eviction --resource-group "$RESOURCE_GROUP" --name "$VM"
log "watch it drain: the workbook's 'Eviction notices' and 'Notice to drained' panels, or"
log "  az vm run-command invoke -g $RESOURCE_GROUP -n $VM --command-id RunShellScript --scripts 'journalctl -u spot-worker -n 50'"
