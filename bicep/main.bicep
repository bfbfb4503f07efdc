// spot-worker: the example worker (examples/primes.rs) on a Spot VM scale set.
// One resource group: storage (queue, poison queue, checkpoints, results,
// artifacts), a user-assigned identity with queue- and container-scoped roles,
// a private network with NAT egress, the scale set, autoscale on the queue, and
// Log Analytics + Application Insights + a workbook. With regularLane (the
// default), the regular lane too (docs/deploying.md, "The two lanes"): its queue and a
// regular-priority scale set of the same image and identity, scaled from zero
// by its own autoscale. scripts/deploy.sh runs it twice: first with
// deployCompute=false (storage exists, the binary can be uploaded), then in
// full.

targetScope = 'resourceGroup'

@description('Azure region for everything.')
param location string = resourceGroup().location

@description('Prefix of every resource name (letters, digits, dashes).')
@minLength(3)
@maxLength(16)
param namePrefix string = 'spotworker'

@description('The queue the workers consume (SPOT_WORKER_QUEUE); the poison queue is "<queue>-poison".')
@minLength(3)
@maxLength(56)
param queueName string = 'jobs'

// Instance mix requires the same architecture, storage interface, local disk
// configuration and security profile across the sizes. These three are all
// 2 vCPU / 8 GiB x64, SCSI, Trusted Launch capable and have NO local temp disk
// (the worker needs none: checkpoints go to Blob storage). Standard_D2as_v4
// was dropped: it has a temp disk. The v6 sizes are left out too: NVMe only.
@description('VM sizes the scale set may use (instance mix, up to five), all with the same local-disk configuration (here: no temp disk). Similar sizes spread the eviction risk across capacity pools.')
@minLength(1)
@maxLength(5)
param vmSizes array = [
  'Standard_D2as_v5'
  'Standard_D2s_v5'
  'Standard_D2s_v4'
]

// Scale set API 2024-07-01 has only these two (Prioritized is a later preview).
@description('How the platform picks among vmSizes: LowestPrice or CapacityOptimized (fewest evictions; default).')
@allowed([
  'LowestPrice'
  'CapacityOptimized'
])
param allocationStrategy string = 'CapacityOptimized'

@description('Spot max price in USD per hour, as a string: "-1" = up to the pay-as-you-go price (evicted for capacity only), e.g. "0.05" to cap it (evicted on price too).')
param maxPrice string = '-1'

// At least 1: autoscale wakes from zero only through the per-instance queue
// metric at zero instances, which Azure does not document (bicep/README.md).
@description('Fewest workers (when the queue is empty).')
@minValue(1)
param minInstances int = 1

@description('Workers the scale set runs now (deploy.sh reads it with az vmss show; 0 = a new scale set). A re-deploy keeps this count instead of resetting sku.capacity to minInstances, which would delete running Spot workers without a Scheduled Event.')
@minValue(0)
param currentInstanceCount int = 0

@description('Most workers.')
@minValue(1)
@maxValue(100)
param maxInstances int = 10

@description('Waiting messages per worker above which autoscale adds workers.')
@minValue(1)
param backlogPerInstance int = 20

@description('Workers added per scale-out.')
@minValue(1)
param scaleOutStep int = 2

@description('Deploy the regular lane (docs/deploying.md, "The two lanes"): a second queue, and a regular-priority scale set (minimum 0) that jobs with a deadline fall back to when the lane rule says they must. false: Spot only.')
param regularLane bool = true

@description('The regular lane\'s queue (SPOT_WORKER_REGULAR_QUEUE). Both lanes poison into "<queueName>-poison".')
@minLength(3)
@maxLength(56)
param regularQueueName string = 'jobs-regular'

@description('VM sizes of the regular lane\'s scale set (instance mix), with one local-disk configuration.')
@minLength(1)
@maxLength(5)
param regularVmSizes array = vmSizes

@description('Fewest regular workers: 0 (the regular lane starts at none), or 1 to keep one always: it keeps the lanes and runs regular jobs at once, whatever Azure reads at zero instances (bicep/README.md, "The regular lane\'s autoscale").')
@minValue(0)
@maxValue(5)
param regularMinInstances int = 0

@description('Most regular workers.')
@minValue(1)
@maxValue(100)
param regularMaxInstances int = 5

@description('Regular workers the regular scale set runs now (deploy.sh reads it with az vmss show; 0 = a new scale set or none running). A re-deploy keeps this count, as for the Spot scale set.')
@minValue(0)
param currentRegularInstanceCount int = 0

@description('Regular workers added per scale-out of the regular lane.')
@minValue(1)
param regularScaleOutStep int = 1

@description('Minutes without any Spot VM running before the regular lane wakes one VM to keep the lanes (docs/deploying.md, "Who keeps the lanes"); an autoscale metric window, 5 minutes to 12 hours.')
@minValue(5)
@maxValue(720)
param keeperWakeMinutes int = 10

@description('Admin user on the VMs (SSH key only; reachable only from inside the virtual network).')
param adminUsername string = 'azureuser'

@description('SSH public key for adminUsername.')
param sshPublicKey string

@description('Blob name of the worker binary in the artifacts container (deploy.sh uploads it there).')
param workerBinaryName string = 'spot-worker-primes'

@description('SHA-256 (hex) of the uploaded worker binary; deploy.sh computes it.')
@minLength(64)
@maxLength(64)
param workerBinarySha256 string

@description('A program to run once per message with `spot-worker run -- <workerCommand>` (docs/command.md), e.g. `python3 primes.py`; the worker binary must then be the spot-worker command. Empty (the default): the worker binary is the worker itself (primes, or your own Rust worker). Written into the unit\'s ExecStart: systemd quoting applies (double quotes group words), `%` and `$` are taken literally.')
param workerCommand string = ''

@description('Settings of `spot-worker run` as flags, before the `--` (only with workerCommand), e.g. `--job-key job_id --result-name {job_key}.json`; any setting of docs/configuration.md. Same quoting as workerCommand.')
param workerRunFlags string = ''

@description('Blob name in the artifacts container of an application bundle (a .tar.gz) unpacked into /opt/spot-worker/app, the program\'s working directory, before the worker starts; empty = none.')
param workerBundleName string = ''

@description('SHA-256 (hex) of the bundle; the VM refuses a bundle that does not match. Required with workerBundleName.')
param workerBundleSha256 string = ''

@description('Also publish Scheduled Events to Event Grid and Resource Graph. A preview behind a subscription feature flag, so off by default.')
param publishScheduledEventsToEventGrid bool = false

@description('Deploy the scale set and autoscale (false: storage, identity, network and telemetry only, so the binary can be uploaded first).')
param deployCompute bool = true

@description('Scale in idle VMs promptly (bicep/README.md, "Instance protection"; issue 39): every worker protects its own VM from scale-in while it holds work (SPOT_WORKER_SCALE_IN_PROTECTION=on, on both lanes\' scale sets), with a custom role allowing only that write on the scale sets, and autoscale removes idle VMs a step at a time as soon as the queue holds less work than the fleet can take. false: none of the three, and the fleet scales in only after the queue held nothing for 15 minutes.')
param scaleInProtection bool = true

@description('With scaleInProtection: minutes (5 or more, Azure\'s shortest window) the queue\'s average count per instance must stay below 1 before idle VMs are removed.')
@minValue(5)
@maxValue(60)
param scaleInWindowMinutes int = 5

@description('With scaleInProtection: minutes between two scale-ins.')
@minValue(1)
@maxValue(60)
param scaleInCooldownMinutes int = 5

@description('With scaleInProtection: idle VMs removed per scale-in, at most (a step bounds the harm if Azure handled a scale-in asking for more VMs than are unprotected otherwise than documented; bicep/README.md).')
@minValue(1)
param scaleInStep int = 5

@description('Public IPv4 addresses or CIDR ranges allowed through the storage firewall: the operator running scripts/ (deploy.sh fills in its own address).')
param operatorIpRanges array = []

@description('Object id of the operator (deploy.sh: the signed-in user), granted upload, enqueue and read-results rights; empty = none.')
param operatorPrincipalId string = ''

@allowed([
  'User'
  'Group'
  'ServicePrincipal'
])
param operatorPrincipalType string = 'User'

// The values both resources take: Application Insights' RetentionInDays
// takes only these; the workspace takes 30..730 (bicep/README.md).
@description('Days Log Analytics and Application Insights keep data.')
@allowed([
  30
  60
  90
  120
  180
  270
  365
  550
  730
])
param retentionInDays int = 30

// Checked by tools/infra/check_infra.py: the floor is the job queue's message
// time-to-live (7 days, the service default every sender here uses) plus the
// 3 days a checkpoint's chunks may age before a save, restore or move dates
// them anew (docs/storage.md).
@description('Days after its last write the storage lifecycle policy deletes a blob of the checkpoint container (completion markers under job ids from the body, attempt records, progress a crash left behind). At least the queue messages\' time-to-live (7 days) plus 3: a message, or a duplicate of it, must still find its job\'s checkpoint and every chunk it names.')
@minValue(10)
param checkpointRetentionDays int = 30

param tags object = {
  workload: 'spot-worker'
}

var storageName = '${take(toLower(replace(namePrefix, '-', '')), 11)}${uniqueString(resourceGroup().id)}'
var checkpointContainer = 'checkpoints'
var resultsContainer = 'results'
var poisonContainer = 'poison'
var artifactsContainer = 'artifacts'

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  params: {
    location: location
    namePrefix: namePrefix
    retentionInDays: retentionInDays
    tags: tags
  }
}

module network 'modules/network.bicep' = {
  name: 'network'
  params: {
    location: location
    namePrefix: namePrefix
    addressPrefix: '10.42.0.0/16'
    subnetPrefix: '10.42.0.0/22'
    tags: tags
  }
}

module storage 'modules/storage.bicep' = {
  name: 'storage'
  params: {
    location: location
    name: storageName
    queueName: queueName
    regularLane: regularLane
    regularQueueName: regularQueueName
    checkpointContainer: checkpointContainer
    checkpointRetentionDays: checkpointRetentionDays
    resultsContainer: resultsContainer
    poisonContainer: poisonContainer
    artifactsContainer: artifactsContainer
    workerSubnetId: network.outputs.subnetId
    allowedIpRanges: operatorIpRanges
    workspaceId: monitoring.outputs.workspaceId
    tags: tags
  }
}

module identity 'modules/identity.bicep' = {
  name: 'identity'
  params: {
    location: location
    name: '${namePrefix}-worker-id'
    storageAccountName: storage.outputs.name
    queueName: storage.outputs.jobQueueName
    poisonQueueName: storage.outputs.poisonQueueName
    regularLane: regularLane
    regularQueueName: storage.outputs.regularQueueName
    checkpointContainer: storage.outputs.checkpointContainerName
    resultsContainer: storage.outputs.resultsContainerName
    poisonContainer: storage.outputs.poisonContainerName
    artifactsContainer: storage.outputs.artifactsContainerName
    operatorPrincipalId: operatorPrincipalId
    operatorPrincipalType: operatorPrincipalType
    tags: tags
  }
}

module workbook 'modules/workbook.bicep' = {
  name: 'workbook'
  params: {
    location: location
    displayName: '${namePrefix} spot workers'
    appInsightsId: monitoring.outputs.appInsightsId
    queueServiceId: storage.outputs.queueServiceId
    tags: tags
  }
}

module compute 'modules/compute.bicep' = if (deployCompute) {
  name: 'compute'
  params: {
    location: location
    namePrefix: namePrefix
    priority: 'Spot'
    lane: 'spot'
    regularQueueName: regularLane ? storage.outputs.regularQueueName : ''
    // One per CPU.
    concurrency: ''
    vmSizes: vmSizes
    allocationStrategy: allocationStrategy
    maxPrice: maxPrice
    // Never below what runs now: see currentInstanceCount.
    instanceCount: max(minInstances, currentInstanceCount)
    publishScheduledEventsToEventGrid: publishScheduledEventsToEventGrid
    adminUsername: adminUsername
    sshPublicKey: sshPublicKey
    subnetId: network.outputs.subnetId
    nsgId: network.outputs.nsgId
    identityId: identity.outputs.id
    identityClientId: identity.outputs.clientId
    storageBlobEndpoint: storage.outputs.blobEndpoint
    queueName: storage.outputs.jobQueueName
    checkpointContainer: checkpointContainer
    resultsContainer: resultsContainer
    workerBinaryUrl: '${storage.outputs.blobEndpoint}${artifactsContainer}/${workerBinaryName}'
    workerBinarySha256: workerBinarySha256
    // After the binary in ExecStart: nothing (the binary is the worker), or
    // `run -- <command>` for the spot-worker command.
    workerArgs: empty(workerCommand) ? '' : (empty(workerRunFlags) ? 'run -- ${workerCommand}' : 'run ${workerRunFlags} -- ${workerCommand}')
    workerBundleUrl: empty(workerBundleName) ? '' : '${storage.outputs.blobEndpoint}${artifactsContainer}/${workerBundleName}'
    workerBundleSha256: workerBundleSha256
    // One parameter: the setting, the role and the prompt rule together.
    scaleInProtection: scaleInProtection ? 'on' : 'off'
    appInsightsConnectionString: monitoring.outputs.appInsightsConnectionString
    tags: tags
  }
}

// The regular lane's scale set: the same worker, image and identity on
// regular-priority VMs, serving the regular lane's queue, one job per VM.
module regularCompute 'modules/compute.bicep' = if (deployCompute && regularLane) {
  name: 'regular-compute'
  params: {
    location: location
    namePrefix: namePrefix
    priority: 'Regular'
    lane: 'regular'
    regularQueueName: storage.outputs.regularQueueName
    concurrency: '1'
    vmSizes: regularVmSizes
    allocationStrategy: allocationStrategy
    // Not a Spot price: regular VMs have none.
    maxPrice: '-1'
    // Never below what runs now, as for the Spot scale set.
    instanceCount: currentRegularInstanceCount
    publishScheduledEventsToEventGrid: publishScheduledEventsToEventGrid
    adminUsername: adminUsername
    sshPublicKey: sshPublicKey
    subnetId: network.outputs.subnetId
    nsgId: network.outputs.nsgId
    identityId: identity.outputs.id
    identityClientId: identity.outputs.clientId
    storageBlobEndpoint: storage.outputs.blobEndpoint
    queueName: storage.outputs.jobQueueName
    checkpointContainer: checkpointContainer
    resultsContainer: resultsContainer
    workerBinaryUrl: '${storage.outputs.blobEndpoint}${artifactsContainer}/${workerBinaryName}'
    workerBinarySha256: workerBinarySha256
    workerArgs: empty(workerCommand) ? '' : (empty(workerRunFlags) ? 'run -- ${workerCommand}' : 'run ${workerRunFlags} -- ${workerCommand}')
    workerBundleUrl: empty(workerBundleName) ? '' : '${storage.outputs.blobEndpoint}${artifactsContainer}/${workerBundleName}'
    workerBundleSha256: workerBundleSha256
    scaleInProtection: scaleInProtection ? 'on' : 'off'
    appInsightsConnectionString: monitoring.outputs.appInsightsConnectionString
    tags: tags
  }
}

module regularAutoscale 'modules/regular-autoscale.bicep' = if (deployCompute && regularLane) {
  name: 'regular-autoscale'
  params: {
    location: location
    name: '${namePrefix}-regular-autoscale'
    vmssId: regularCompute.outputs.id
    queueMetricsId: '${storage.outputs.id}/services/queue/queues/${regularQueueName}'
    spotVmssId: compute.outputs.id
    minInstances: regularMinInstances
    maxInstances: regularMaxInstances
    scaleOutStep: regularScaleOutStep
    keeperWakeMinutes: keeperWakeMinutes
    tags: tags
  }
}

module scaleInProtectionRole 'modules/scale-in-protection.bicep' = if (deployCompute && scaleInProtection) {
  name: 'scale-in-protection'
  params: {
    namePrefix: namePrefix
    principalId: identity.outputs.principalId
    spotScaleSetName: compute.outputs.name
    regularScaleSetName: regularLane ? regularCompute.outputs.name : ''
  }
}

module autoscale 'modules/autoscale.bicep' = if (deployCompute) {
  name: 'autoscale'
  params: {
    location: location
    name: '${namePrefix}-autoscale'
    vmssId: compute.outputs.id
    queueMetricsId: '${storage.outputs.id}/services/queue/queues/${queueName}'
    minInstances: minInstances
    maxInstances: maxInstances
    backlogPerInstance: backlogPerInstance
    scaleOutStep: scaleOutStep
    // The prompt rule only with the workers' protection and its role.
    scaleInProtection: scaleInProtection
    scaleInWindowMinutes: scaleInWindowMinutes
    scaleInCooldownMinutes: scaleInCooldownMinutes
    scaleInStep: scaleInStep
    tags: tags
  }
}

output storageAccountName string = storage.outputs.name
output blobEndpoint string = storage.outputs.blobEndpoint
output queueEndpoint string = storage.outputs.queueEndpoint
output queueName string = queueName
output artifactsContainer string = artifactsContainer
output resultsContainer string = resultsContainer
output workerBinaryName string = workerBinaryName
output workerBundleName string = workerBundleName
output vmssName string = deployCompute ? compute.outputs.name : ''
output regularQueueName string = regularLane ? storage.outputs.regularQueueName : ''
output regularVmssName string = deployCompute && regularLane ? regularCompute.outputs.name : ''
output appInsightsName string = monitoring.outputs.appInsightsName
output natPublicIp string = network.outputs.natPublicIp
