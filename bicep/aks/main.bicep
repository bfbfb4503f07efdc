// spot-worker on AKS: the same storage, identity roles and telemetry as the
// scale-set deployment (../main.bicep), with the workers as pods on a Spot
// node pool instead of a Spot scale set. One resource group: storage (queue,
// poison queue, checkpoints, results), the workers' user-assigned identity
// with queue- and container-scoped roles and a federated credential for the
// worker pods' service account, a scaler identity for KEDA (read the queue's
// length, nothing else), a private network with NAT egress, the cluster
// (system pool + Spot user pool from zero, KEDA add-on, OIDC issuer, workload
// identity), and Log Analytics + Application Insights + the workbook. With
// regularLane (the default), the regular lane too (docs/deploying.md, "The two lanes"): its queue
// and a regular-priority user pool from zero for its worker pods.
// The pods themselves are deployed with deploy/kubernetes/ (docs/deploying.md,
// "On AKS").

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

@description('Deploy the regular lane (docs/deploying.md, "The two lanes"): a second queue and a regular-priority node pool from zero, where the regular lane\'s worker pods run (deploy/kubernetes/regular.yaml). false: Spot only.')
param regularLane bool = true

@description('The regular lane\'s queue (SPOT_WORKER_REGULAR_QUEUE). Both lanes poison into "<queueName>-poison".')
@minLength(3)
@maxLength(56)
param regularQueueName string = 'jobs-regular'

@description('Kubernetes version; empty = the region\'s default.')
param kubernetesVersion string = ''

@description('VM size of the system pool (the cluster\'s own pods).')
param systemVmSize string = 'Standard_D2as_v5'

@description('Nodes in the system pool.')
@minValue(1)
@maxValue(5)
param systemNodeCount int = 2

@description('VM size of the Spot pool (the workers).')
param spotVmSize string = 'Standard_D2as_v5'

@description('Spot max price in USD per hour, as a string (bicep has no float type): "-1" = up to the pay-as-you-go price (evicted for capacity only), e.g. "0.05" to cap it (evicted on price too).')
param spotMaxPrice string = '-1'

@description('Fewest Spot nodes: 0 lets the pool empty with the queue (KEDA scales the pods to zero, the cluster autoscaler the nodes).')
@minValue(0)
param spotMinCount int = 0

@description('Most Spot nodes.')
@minValue(1)
@maxValue(100)
param spotMaxCount int = 10

@description('VM size of the regular pool (the regular lane\'s workers, one job per pod).')
param regularVmSize string = 'Standard_D2as_v5'

@description('Most regular nodes; the pool starts at none.')
@minValue(1)
@maxValue(100)
param regularMaxCount int = 5

@description('Namespace of the worker Deployment (deploy/kubernetes/).')
param namespace string = 'spot-worker'

@description('Service account of the worker pods (deploy/kubernetes/).')
param serviceAccountName string = 'spot-worker'

@description('Public IPv4 addresses or CIDR ranges allowed through the storage firewall: the operator running scripts/.')
param operatorIpRanges array = []

@description('Object id of the operator (deploy-aks.sh: the signed-in user), granted the storage rights of every operator command and, on the cluster, sign-in and kubectl apply of deploy/kubernetes/; empty = none.')
param operatorPrincipalId string = ''

@allowed([
  'User'
  'Group'
  'ServicePrincipal'
])
param operatorPrincipalType string = 'User'

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

module monitoring '../modules/monitoring.bicep' = {
  name: 'monitoring'
  params: {
    location: location
    namePrefix: namePrefix
    retentionInDays: retentionInDays
    tags: tags
  }
}

module network '../modules/network.bicep' = {
  name: 'network'
  params: {
    location: location
    namePrefix: namePrefix
    addressPrefix: '10.42.0.0/16'
    subnetPrefix: '10.42.0.0/22'
    tags: tags
  }
}

module storage '../modules/storage.bicep' = {
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

module identity '../modules/identity.bicep' = {
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

module clusterIdentity '../modules/cluster-identity.bicep' = {
  name: 'cluster-identity'
  params: {
    location: location
    name: '${namePrefix}-aks-id'
    vnetName: network.outputs.vnetName
    subnetName: network.outputs.subnetName
    tags: tags
  }
}

module cluster '../modules/aks.bicep' = {
  name: 'aks'
  params: {
    location: location
    name: '${namePrefix}-aks'
    kubernetesVersion: kubernetesVersion
    systemVmSize: systemVmSize
    systemNodeCount: systemNodeCount
    spotVmSize: spotVmSize
    spotMaxPrice: spotMaxPrice
    spotMinCount: spotMinCount
    spotMaxCount: spotMaxCount
    regularPool: regularLane
    regularVmSize: regularVmSize
    regularMaxCount: regularMaxCount
    subnetId: network.outputs.subnetId
    controlPlaneIdentityId: clusterIdentity.outputs.id
    workspaceId: monitoring.outputs.workspaceId
    tags: tags
  }
}

module workloadIdentity '../modules/workload-identity.bicep' = {
  name: 'workload-identity'
  params: {
    location: location
    workerIdentityName: '${namePrefix}-worker-id'
    scalerIdentityName: '${namePrefix}-scaler-id'
    oidcIssuerUrl: cluster.outputs.oidcIssuerUrl
    namespace: namespace
    serviceAccountName: serviceAccountName
    storageAccountName: storage.outputs.name
    queueName: storage.outputs.jobQueueName
    regularLane: regularLane
    regularQueueName: storage.outputs.regularQueueName
    tags: tags
  }
  dependsOn: [
    identity
  ]
}

// The operator may sign in to the cluster and kubectl apply deploy/kubernetes/.
module operatorCluster '../modules/operator-aks.bicep' = if (!empty(operatorPrincipalId)) {
  name: 'operator-aks'
  params: {
    clusterName: cluster.outputs.name
    namePrefix: namePrefix
    operatorPrincipalId: operatorPrincipalId
    operatorPrincipalType: operatorPrincipalType
  }
}

module workbook '../modules/workbook.bicep' = {
  name: 'workbook'
  params: {
    location: location
    displayName: '${namePrefix} spot workers on AKS'
    appInsightsId: monitoring.outputs.appInsightsId
    queueServiceId: storage.outputs.queueServiceId
    tags: tags
  }
}

// What deploy/kubernetes/ needs (docs/deploying.md, "On AKS").
output clusterName string = cluster.outputs.name
output storageAccountName string = storage.outputs.name
output blobEndpoint string = storage.outputs.blobEndpoint
output queueEndpoint string = storage.outputs.queueEndpoint
output queueName string = queueName
output regularQueueName string = regularLane ? storage.outputs.regularQueueName : ''
output resultsContainer string = resultsContainer
output workerClientId string = identity.outputs.clientId
output scalerClientId string = workloadIdentity.outputs.scalerClientId
output tenantId string = tenant().tenantId
output appInsightsName string = monitoring.outputs.appInsightsName
