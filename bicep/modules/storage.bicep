// Storage for the worker: the job queue and its poison queue, the checkpoint
// and result containers, and a container for the worker binary the deploy
// script uploads. Hardened: HTTPS only, TLS 1.2, no public blob access, no
// shared keys (every client uses Microsoft Entra ID), network access only from
// the workers' subnet and the operator's addresses.
//
// networkAcls.bypass: Logging and Metrics open read access to the classic
// Storage Analytics logs and metrics of the account (the logs container and
// the metrics tables) from any network (Azure Storage network security docs);
// AzureServices admits trusted Azure services. Whether the autoscale
// queue-length rule reads ApproximateMessageCount through any of these is NOT
// documented and not proven: after a deploy, check that the
// ObservedMetricValue metric of the autoscale setting has values
// (docs/deploying.md, "Did autoscale read the queue?"). Without values the
// rules never fire.

@description('Azure region.')
param location string

@description('Storage account name (3-24 lower-case letters and digits).')
@minLength(3)
@maxLength(24)
param name string

@description('The queue the workers consume; the poison queue is "<queue>-poison".')
param queueName string

@description('Create the regular lane\'s queue (docs/deploying.md, "The two lanes").')
param regularLane bool

@description('The regular lane\'s queue. Both lanes poison into "<queueName>-poison".')
param regularQueueName string

@description('Blob container for checkpoints (SPOT_WORKER_CHECKPOINT_CONTAINER).')
param checkpointContainer string

@description('Days after its last write a checkpoint-container blob is deleted; at least the queue messages\' time-to-live (7 days) plus the 3 days a checkpoint\'s chunks may age before they are dated anew.')
@minValue(10)
param checkpointRetentionDays int

@description('Blob container for results (SPOT_WORKER_RESULTS_CONTAINER).')
param resultsContainer string

@description('Blob container for the originals of poisoned messages too big for their poison record (SPOT_WORKER_POISON_CONTAINER).')
param poisonContainer string

@description('Blob container holding the worker binary the deploy script uploads.')
param artifactsContainer string

@description('Subnet allowed through the storage firewall (the workers).')
param workerSubnetId string

@description('Public IPv4 addresses or CIDR ranges allowed through the storage firewall (the operator running scripts/; empty = none).')
param allowedIpRanges array

@description('Log Analytics workspace receiving the storage logs.')
param workspaceId string

param tags object

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  //checkov:skip=CKV_AZURE_59:publicNetworkAccess stays Enabled so the operator's scripts (deploy, enqueue) can reach the account; networkAcls deny everything except the workers' subnet and operatorIpRanges, and shared keys are off. A private-endpoint variant would need a jump host for the operator.
  //checkov:skip=CKV_AZURE_206:Zone-redundant (ZRS) on purpose: the account survives a zone outage; jobs are re-runnable and results reproducible, so geo-replication (twice the storage cost) buys nothing here.
  name: name
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    // Zone-redundant: a zone outage must not lose checkpoints or messages. Geo-
    // replication is not needed for a queue of re-runnable jobs.
    name: 'Standard_ZRS'
  }
  properties: {
    accessTier: 'Hot'
    supportsHttpsTrafficOnly: true
    minimumTlsVersion: 'TLS1_2'
    allowBlobPublicAccess: false
    allowSharedKeyAccess: false
    defaultToOAuthAuthentication: true
    allowCrossTenantReplication: false
    isLocalUserEnabled: false
    isSftpEnabled: false
    isHnsEnabled: false
    publicNetworkAccess: 'Enabled' // filtered by networkAcls below
    networkAcls: {
      defaultAction: 'Deny'
      // What each bypass admits, and what is unproven: see the note on
      // networkAcls.bypass at the top of this file.
      bypass: 'AzureServices,Logging,Metrics'
      virtualNetworkRules: [
        {
          id: workerSubnetId
          action: 'Allow'
        }
      ]
      ipRules: [for range in allowedIpRanges: {
        value: range
        action: 'Allow'
      }]
    }
    encryption: {
      keySource: 'Microsoft.Storage'
      requireInfrastructureEncryption: true
      services: {
        blob: {
          enabled: true
          keyType: 'Account'
        }
        file: {
          enabled: true
          keyType: 'Account'
        }
        queue: {
          enabled: true
          keyType: 'Account'
        }
        table: {
          enabled: true
          keyType: 'Account'
        }
      }
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: account
  name: 'default'
  properties: {
    deleteRetentionPolicy: {
      enabled: true
      days: 7
    }
    containerDeleteRetentionPolicy: {
      enabled: true
      days: 7
    }
  }
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' = {
  parent: account
  name: 'default'
}

resource jobQueue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = {
  parent: queueService
  name: queueName
}

resource poisonQueue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = {
  parent: queueService
  name: '${queueName}-poison'
}

// The regular lane: jobs with a deadline that must run on regular capacity.
resource regularQueue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = if (regularLane) {
  parent: queueService
  name: regularQueueName
}

resource checkpoints 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: checkpointContainer
  properties: {
    publicAccess: 'None'
  }
}

// The checkpoint container's retention. Workers delete a checkpoint nobody
// can use once its job succeeded (keyed by the message id, or progress of a
// finished job); what must stay a while (completion markers under a job id
// from the body, for duplicates; attempt records of messages still in the
// queue) and what a crash left behind is deleted here, checkpointRetentionDays
// after its last write. No message can still need it by then: it is at least
// the messages' time-to-live. Delete Blob is not billed; the policy runs
// about once a day.
resource checkpointRetention 'Microsoft.Storage/storageAccounts/managementPolicies@2023-05-01' = {
  parent: account
  name: 'default'
  properties: {
    policy: {
      rules: [
        {
          name: 'expire-checkpoints'
          enabled: true
          type: 'Lifecycle'
          definition: {
            filters: {
              blobTypes: [
                'blockBlob'
              ]
              prefixMatch: [
                '${checkpoints.name}/'
              ]
            }
            actions: {
              baseBlob: {
                delete: {
                  daysAfterModificationGreaterThan: checkpointRetentionDays
                }
              }
            }
          }
        }
      ]
    }
  }
}

resource results 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: resultsContainer
  properties: {
    publicAccess: 'None'
  }
}

resource poisonBodies 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: poisonContainer
  properties: {
    publicAccess: 'None'
  }
}

resource artifacts 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: artifactsContainer
  properties: {
    publicAccess: 'None'
  }
}

// Read, write and delete logs of the queue and blob services (who took,
// renewed and deleted which message; who wrote which checkpoint), plus
// transaction metrics, to Log Analytics.
resource queueDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: queueService
  properties: {
    workspaceId: workspaceId
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
    metrics: [
      {
        category: 'Transaction'
        enabled: true
      }
    ]
  }
}

resource blobDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: blobService
  properties: {
    workspaceId: workspaceId
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
    metrics: [
      {
        category: 'Transaction'
        enabled: true
      }
    ]
  }
}

output id string = account.id
output name string = account.name
output blobEndpoint string = account.properties.primaryEndpoints.blob
output queueEndpoint string = account.properties.primaryEndpoints.queue
output queueServiceId string = queueService.id
output jobQueueName string = jobQueue.name
output poisonQueueName string = poisonQueue.name
// The regular lane's queue name, whether it is deployed or not (the callers'
// conditions say).
output regularQueueName string = regularQueueName
output checkpointContainerName string = checkpoints.name
output resultsContainerName string = results.name
output poisonContainerName string = poisonBodies.name
output artifactsContainerName string = artifacts.name
