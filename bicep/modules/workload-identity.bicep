// Workload identity for the AKS deployment: who may exchange a Kubernetes
// service-account token for an Entra token, and as which identity.
//
// - The workers' identity (modules/identity.bicep, with its queue- and
//   container-scoped storage roles) trusts the worker pods' service account.
// - KEDA's scaler gets an identity of its own with one role, Storage Queue
//   Data Reader on the job queue (queue properties and peek: the queue's
//   length), trusted for the managed KEDA operator's service account
//   (kube-system/keda-operator). It never sees a message body it could act on
//   and cannot change the queue. With the regular lane, the same role on its
//   queue.

param location string

@description('Name of the workers\' user-assigned identity (created by modules/identity.bicep).')
param workerIdentityName string

@description('Name of the identity KEDA\'s azure-queue scaler authenticates as.')
param scalerIdentityName string

@description('The cluster\'s OIDC issuer URL.')
param oidcIssuerUrl string

@description('Namespace of the worker Deployment.')
param namespace string

@description('Service account of the worker pods.')
param serviceAccountName string

param storageAccountName string
param queueName string

@description('Let the scaler read the regular lane\'s queue too (docs/deploying.md, "The two lanes").')
param regularLane bool
param regularQueueName string
param tags object

var tokenExchangeAudience = 'api://AzureADTokenExchange'
var storageQueueDataReader = '19e7f393-937e-4f77-808e-94535e297925'

resource workerIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' existing = {
  name: workerIdentityName
}

resource workerPods 'Microsoft.ManagedIdentity/userAssignedIdentities/federatedIdentityCredentials@2023-01-31' = {
  parent: workerIdentity
  name: 'spot-worker-pods'
  properties: {
    issuer: oidcIssuerUrl
    subject: 'system:serviceaccount:${namespace}:${serviceAccountName}'
    audiences: [
      tokenExchangeAudience
    ]
  }
}

resource scalerIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: scalerIdentityName
  location: location
  tags: tags
}

resource kedaOperator 'Microsoft.ManagedIdentity/userAssignedIdentities/federatedIdentityCredentials@2023-01-31' = {
  parent: scalerIdentity
  name: 'keda-operator'
  properties: {
    issuer: oidcIssuerUrl
    subject: 'system:serviceaccount:kube-system:keda-operator'
    audiences: [
      tokenExchangeAudience
    ]
  }
}

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName

  resource queueService 'queueServices' existing = {
    name: 'default'

    resource jobQueue 'queues' existing = {
      name: queueName
    }

    resource regularQueue 'queues' existing = {
      name: regularQueueName
    }
  }
}

resource scalerReadsQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(account::queueService::jobQueue.id, scalerIdentity.id, storageQueueDataReader)
  scope: account::queueService::jobQueue
  properties: {
    principalId: scalerIdentity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataReader)
    description: 'spot-worker: KEDA reads the job queue\'s length'
  }
}

// The regular lane's ScaledObject reads both queues: the regular one's
// length, and the Spot one's visible and leased messages (it wakes a regular
// pod to keep the lanes when no Spot worker holds any: docs/deploying.md, "The two lanes").
resource scalerReadsRegularQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (regularLane) {
  name: guid(account::queueService::regularQueue.id, scalerIdentity.id, storageQueueDataReader)
  scope: account::queueService::regularQueue
  properties: {
    principalId: scalerIdentity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataReader)
    description: 'spot-worker: KEDA reads the regular lane\'s queue length'
  }
}

output scalerClientId string = scalerIdentity.properties.clientId
