// The workers' user-assigned managed identity and its role assignments, each
// scoped to the one queue or container it is for: nothing account-wide.
//
// Why these roles (built-in role definition ids):
// - Storage Queue Data Contributor on the job queue and on the poison queue.
//   The worker receives, renews (Update Message: the lease), releases (Update
//   Message with visibility 0) and deletes messages, and its warmup gate calls
//   Create Queue (a no-op: the queue exists) and Get Queue Properties. The
//   narrower built-ins do not cover that: Message Processor has no Update
//   Message and no queue read/write; Message Sender only adds messages.
// - Storage Blob Data Contributor on the checkpoint, result and poison
//   containers (poison: originals too big for their poison record):
//   create-only and ETag-fenced writes, reads, deletes of the warmup gate's
//   write probes, and Create Container (a no-op: the container exists).
// - Storage Blob Data Reader on the artifacts container: cloud-init downloads
//   the worker binary with the identity.
// - The regular lane (docs/deploying.md, "The two lanes"), when deployed: Storage Queue Data
//   Contributor on its queue too. Workers of both lanes run as this
//   identity and poison into the one poison queue; each sends a job with a
//   deadline to the other lane's queue (Put Message) when the lane rule says
//   so, and the lane keeper, on any worker, peeks at, receives, puts back
//   and deletes the Spot lane's messages. Its turn is a blob lease in the
//   checkpoint container (Lease Blob: the Contributor there allows it).
// Because this template creates the queues and containers, the identity needs
// no account-level right: the worker's create-if-missing calls are answered
// "already exists" under the queue/container-scoped assignments above.
// Application Insights is reached with its connection string (the telemetry
// crate has no Entra token path), so no Monitoring Metrics Publisher role.

param location string
param name string
param storageAccountName string
param queueName string
param poisonQueueName string

@description('Grant the regular lane\'s queue too (docs/deploying.md, "The two lanes").')
param regularLane bool
param regularQueueName string
param checkpointContainer string
param resultsContainer string
param poisonContainer string
param artifactsContainer string

@description('Object id of the operator running scripts/ (upload the binary, enqueue jobs, read results); empty = none.')
param operatorPrincipalId string

@description('Kind of principal operatorPrincipalId names.')
@allowed([
  'User'
  'Group'
  'ServicePrincipal'
])
param operatorPrincipalType string

param tags object

var roles = {
  storageBlobDataContributor: 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'
  storageBlobDataReader: '2a2b9908-6ea1-4ae2-8e65-a410df84e7d1'
  storageQueueDataContributor: '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
  storageQueueDataMessageSender: 'c6a89b2d-59bc-44d0-9896-0f6e12d7b80a'
  storageQueueDataReader: '19e7f393-937e-4f77-808e-94535e297925'
}

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: name
  location: location
  tags: tags
}

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName

  resource queueService 'queueServices' existing = {
    name: 'default'

    resource jobQueue 'queues' existing = {
      name: queueName
    }

    resource poisonQueue 'queues' existing = {
      name: poisonQueueName
    }

    resource regularQueue 'queues' existing = {
      name: regularQueueName
    }
  }

  resource blobService 'blobServices' existing = {
    name: 'default'

    resource checkpoints 'containers' existing = {
      name: checkpointContainer
    }

    resource results 'containers' existing = {
      name: resultsContainer
    }

    resource poisonBodies 'containers' existing = {
      name: poisonContainer
    }

    resource artifacts 'containers' existing = {
      name: artifactsContainer
    }
  }
}

resource workerJobQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(account::queueService::jobQueue.id, identity.id, roles.storageQueueDataContributor)
  scope: account::queueService::jobQueue
  properties: {
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataContributor)
    description: 'spot-worker: receive, renew, release and delete job messages'
  }
}

resource workerPoisonQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(account::queueService::poisonQueue.id, identity.id, roles.storageQueueDataContributor)
  scope: account::queueService::poisonQueue
  properties: {
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataContributor)
    description: 'spot-worker: move poison messages aside'
  }
}

resource workerRegularQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (regularLane) {
  name: guid(account::queueService::regularQueue.id, identity.id, roles.storageQueueDataContributor)
  scope: account::queueService::regularQueue
  properties: {
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataContributor)
    description: 'spot-worker: the regular lane: receive, renew, release and delete its messages; send jobs to it'
  }
}

resource workerCheckpoints 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(account::blobService::checkpoints.id, identity.id, roles.storageBlobDataContributor)
  scope: account::blobService::checkpoints
  properties: {
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataContributor)
    description: 'spot-worker: read and write checkpoints'
  }
}

resource workerResults 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(account::blobService::results.id, identity.id, roles.storageBlobDataContributor)
  scope: account::blobService::results
  properties: {
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataContributor)
    description: 'spot-worker: write results'
  }
}

resource workerPoisonBodies 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(account::blobService::poisonBodies.id, identity.id, roles.storageBlobDataContributor)
  scope: account::blobService::poisonBodies
  properties: {
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataContributor)
    description: 'spot-worker: keep the originals of big poisoned messages'
  }
}

resource workerArtifacts 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(account::blobService::artifacts.id, identity.id, roles.storageBlobDataReader)
  scope: account::blobService::artifacts
  properties: {
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataReader)
    description: 'spot-worker: download the worker binary at boot'
  }
}

// The operator: every command of docs/operating.md (spot-worker enqueue,
// status, poison, checkpoints) and the scripts (upload the binary, enqueue,
// read results), each role on the one queue or container it is for. Which
// storage operation each command issues, the permission it needs and the
// role here that grants it: docs/deploying.md, "What each identity may do",
// checked by tools/infra/permissions.py against what the commands really
// issue (tests/it/storage_permissions.rs).
resource operatorArtifacts 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(operatorPrincipalId)) {
  name: guid(account::blobService::artifacts.id, operatorPrincipalId, roles.storageBlobDataContributor)
  scope: account::blobService::artifacts
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataContributor)
    description: 'spot-worker operator: upload the worker binary and bundle'
  }
}

// enqueue, poison requeue: Put Message. Nothing more: sending needs no right
// on the queue itself (enqueue does not create it; the deployment does).
resource operatorJobQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(operatorPrincipalId)) {
  name: guid(account::queueService::jobQueue.id, operatorPrincipalId, roles.storageQueueDataMessageSender)
  scope: account::queueService::jobQueue
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataMessageSender)
    description: 'spot-worker operator: enqueue jobs, requeue poisoned ones'
  }
}

// status: the job queue's depth (Get Queue Metadata) and its oldest message
// (Peek Messages).
resource operatorJobQueueRead 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(operatorPrincipalId)) {
  name: guid(account::queueService::jobQueue.id, operatorPrincipalId, roles.storageQueueDataReader)
  scope: account::queueService::jobQueue
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataReader)
    description: 'spot-worker operator: queue depth and oldest message (status)'
  }
}

// enqueue --deadline: a job with too little slack goes straight to the
// regular lane (Put Message).
resource operatorRegularQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(operatorPrincipalId) && regularLane) {
  name: guid(account::queueService::regularQueue.id, operatorPrincipalId, roles.storageQueueDataMessageSender)
  scope: account::queueService::regularQueue
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataMessageSender)
    description: 'spot-worker operator: enqueue jobs with a deadline to the regular lane'
  }
}

// status: the regular lane's depth, its oldest and waiting messages (Get
// Queue Metadata, Peek Messages).
resource operatorRegularQueueRead 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(operatorPrincipalId) && regularLane) {
  name: guid(account::queueService::regularQueue.id, operatorPrincipalId, roles.storageQueueDataReader)
  scope: account::queueService::regularQueue
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataReader)
    description: 'spot-worker operator: the regular lane\'s depth and waiting jobs (status)'
  }
}

// poison list --all, show, requeue, purge: records are received (Get
// Messages), made visible again (Update Message: only Contributor has
// messages/write) or deleted.
resource operatorPoisonQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(operatorPrincipalId)) {
  name: guid(account::queueService::poisonQueue.id, operatorPrincipalId, roles.storageQueueDataContributor)
  scope: account::queueService::poisonQueue
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageQueueDataContributor)
    description: 'spot-worker operator: read, requeue and purge poison records'
  }
}

// checkpoints list/show/delete, status, enqueue --skip-existing: list, read
// and delete checkpoints.
resource operatorCheckpoints 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(operatorPrincipalId)) {
  name: guid(account::blobService::checkpoints.id, operatorPrincipalId, roles.storageBlobDataContributor)
  scope: account::blobService::checkpoints
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataContributor)
    description: 'spot-worker operator: list, show and delete checkpoints'
  }
}

// enqueue --skip-existing --results, and reading results.
resource operatorResults 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(operatorPrincipalId)) {
  name: guid(account::blobService::results.id, operatorPrincipalId, roles.storageBlobDataReader)
  scope: account::blobService::results
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataReader)
    description: 'spot-worker operator: read results'
  }
}

// poison show (claim-check originals), requeue and purge (delete them).
resource operatorPoisonBodies 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(operatorPrincipalId)) {
  name: guid(account::blobService::poisonBodies.id, operatorPrincipalId, roles.storageBlobDataContributor)
  scope: account::blobService::poisonBodies
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataContributor)
    description: 'spot-worker operator: read and delete the originals of poison records'
  }
}

output id string = identity.id
output clientId string = identity.properties.clientId
output principalId string = identity.properties.principalId
