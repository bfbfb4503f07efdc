// An example parameter file: `az deployment group create -g RG --parameters bicep/main.bicepparam`.
// scripts/deploy.sh passes its own values (SSH key, binary hash, operator) on
// top of this file.
using './main.bicep'

param namePrefix = 'spotworker'
param queueName = 'jobs'
// Same local-disk configuration across the mix (none): see main.bicep.
param vmSizes = [
  'Standard_D2as_v5'
  'Standard_D2s_v5'
  'Standard_D2s_v4'
]
param allocationStrategy = 'CapacityOptimized'
param maxPrice = '-1'
param minInstances = 1
param maxInstances = 10
param backlogPerInstance = 20
param scaleOutStep = 2
// Idle VMs go promptly: the workers protect their own VM while they hold
// work, and autoscale removes up to scaleInStep idle VMs once the queue's
// count per instance averaged over the window is below 1 (bicep/README.md,
// "Instance protection"). false: only after 15 minutes of an empty queue.
param scaleInProtection = true
param scaleInWindowMinutes = 5
param scaleInCooldownMinutes = 5
param scaleInStep = 5
// The regular lane (docs/deploying.md, "The two lanes"): from zero, a VM per job with a deadline
// that must run on regular capacity, and one to keep the lanes while Spot
// has no VM.
param regularLane = true
param regularQueueName = 'jobs-regular'
param regularMinInstances = 0
param regularMaxInstances = 5
param regularScaleOutStep = 1
param keeperWakeMinutes = 10
param adminUsername = 'azureuser'
// Replace with your key (deploy.sh uses ~/.ssh/id_ed25519.pub or SSH_PUBLIC_KEY).
param sshPublicKey = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIReplaceWithYourOwnPublicKey0000000000000000 you@example'
// deploy.sh computes it from the binary it uploads.
param workerBinarySha256 = '0000000000000000000000000000000000000000000000000000000000000000'
param retentionInDays = 30
// Not below the queue messages' time-to-live (7 days).
param checkpointRetentionDays = 30
