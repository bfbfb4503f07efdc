// The operator's rights on the AKS cluster, which has local accounts off and
// Azure RBAC for Kubernetes authorization on: sign in (az aks
// get-credentials) and kubectl apply the manifests of deploy/kubernetes/,
// then watch their pods; and what scripts/deploy-aks.sh does besides (KEDA's
// operator annotated and restarted, the telemetry Secret, KEDA's events).
// Nothing else in the cluster.
//
// No built-in role fits (tools/infra/kubectl_permissions.py compares them):
// RBAC Writer and RBAC Admin may not create the namespace (a cluster-scoped
// object) and Writer has no KEDA objects; RBAC Cluster Admin may do
// everything. So a custom role holds exactly the data actions the manifests
// need, assigned on the cluster because the namespace is created there. It
// therefore also allows these kinds in other namespaces: narrow it by
// assigning it at `<cluster id>/namespaces/<namespace>` once the namespace
// exists (docs/deploying.md, "On AKS").

param clusterName string
param namePrefix string

@description('Object id of the operator; the module is deployed only with one.')
param operatorPrincipalId string

@allowed([
  'User'
  'Group'
  'ServicePrincipal'
])
param operatorPrincipalType string

// Azure Kubernetes Service Cluster User Role: listClusterUserCredential, the
// kubeconfig for an Entra ID sign-in (no Kubernetes rights by itself).
var clusterUserRole = '4abbcc35-e782-43d8-92c5-2d3f1bd2253f'

// What kubectl apply of deploy/kubernetes/ does (get, then create or patch:
// read and write) per kind, and the watch of the pods. Checked against the
// manifests by tools/infra/kubectl_permissions.py.
var deployerDataActions = [
  'Microsoft.ContainerService/managedClusters/namespaces/read'
  'Microsoft.ContainerService/managedClusters/namespaces/write'
  'Microsoft.ContainerService/managedClusters/serviceaccounts/read'
  'Microsoft.ContainerService/managedClusters/serviceaccounts/write'
  'Microsoft.ContainerService/managedClusters/apps/deployments/read'
  'Microsoft.ContainerService/managedClusters/apps/deployments/write'
  'Microsoft.ContainerService/managedClusters/keda.sh/scaledobjects/read'
  'Microsoft.ContainerService/managedClusters/keda.sh/scaledobjects/write'
  'Microsoft.ContainerService/managedClusters/keda.sh/triggerauthentications/read'
  'Microsoft.ContainerService/managedClusters/keda.sh/triggerauthentications/write'
  'Microsoft.ContainerService/managedClusters/pods/read'
  // deploy/kubernetes/pod-deletion-cost.yaml: the workers' Role and its
  // binding. Kubernetes lets a user grant only what it holds itself (RBAC's
  // escalation check), so the operator also holds what the Role allows:
  // patch on pods (write).
  'Microsoft.ContainerService/managedClusters/rbac.authorization.k8s.io/roles/read'
  'Microsoft.ContainerService/managedClusters/rbac.authorization.k8s.io/roles/write'
  'Microsoft.ContainerService/managedClusters/rbac.authorization.k8s.io/rolebindings/read'
  'Microsoft.ContainerService/managedClusters/rbac.authorization.k8s.io/rolebindings/write'
  'Microsoft.ContainerService/managedClusters/pods/write'
  // scripts/deploy-aks.sh: the spot-worker-telemetry Secret, and KEDA's
  // events when it checks the ScaledObject.
  'Microsoft.ContainerService/managedClusters/secrets/read'
  'Microsoft.ContainerService/managedClusters/secrets/write'
  'Microsoft.ContainerService/managedClusters/events/read'
]

resource cluster 'Microsoft.ContainerService/managedClusters@2026-05-01' existing = {
  name: clusterName
}

resource deployer 'Microsoft.Authorization/roleDefinitions@2022-04-01' = {
  name: guid(resourceGroup().id, 'spot-worker deployer')
  properties: {
    // Role names are unique in the tenant: one per resource group.
    roleName: '${namePrefix} deployer ${uniqueString(resourceGroup().id)}'
    description: 'spot-worker: kubectl apply deploy/kubernetes/ (namespace, service account, Deployment, KEDA objects) and watch its pods'
    type: 'CustomRole'
    assignableScopes: [
      resourceGroup().id
    ]
    permissions: [
      {
        actions: []
        notActions: []
        dataActions: deployerDataActions
        notDataActions: []
      }
    ]
  }
}

resource operatorSignsIn 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(cluster.id, operatorPrincipalId, clusterUserRole)
  scope: cluster
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', clusterUserRole)
    description: 'spot-worker operator: az aks get-credentials'
  }
}

resource operatorApplies 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(cluster.id, operatorPrincipalId, deployer.id)
  scope: cluster
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: deployer.id
    description: 'spot-worker operator: kubectl apply deploy/kubernetes/'
  }
}
