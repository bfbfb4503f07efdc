// The AKS cluster for spot-worker pods: a small regular system pool for the
// cluster's own pods, and a Spot user pool, scaled from zero by the cluster
// autoscaler, where the workers run. KEDA (the managed add-on) scales the
// worker Deployment on the queue's length; the OIDC issuer and workload
// identity let the pods reach Storage with the workers' user-assigned
// identity, with no secret in the cluster.
//
// With the regular lane (docs/deploying.md, "The two lanes"), a regular-priority user pool from
// zero too, for the regular lane's worker pods only.
//
// Why a Spot pool needs nothing more than this: each worker pod reads its
// node's Scheduled Events itself (IMDS answers pods unless the cluster opts
// into the IMDS restriction), sees the Preempt, drains and releases its
// messages, so no node termination handler is involved. AKS taints Spot nodes
// with kubernetes.azure.com/scalesetpriority=spot:NoSchedule; the worker
// Deployment (deploy/kubernetes/) tolerates it and prefers those nodes.

param location string
param name string

@description('Kubernetes version; empty = the region\'s default.')
param kubernetesVersion string

@description('VM size of the system pool (the cluster\'s own pods).')
param systemVmSize string

@description('Nodes in the system pool.')
@minValue(1)
@maxValue(5)
param systemNodeCount int

@description('VM size of the Spot user pool (the workers).')
param spotVmSize string

// A string: Azure takes a decimal price (0.05) and bicep has no float type,
// so json() turns it into the number the API expects.
@description('Spot max price in USD per hour, as a string: "-1" = up to the pay-as-you-go price (evicted for capacity only), e.g. "0.05" to cap it (evicted on price too).')
param spotMaxPrice string

@description('Fewest Spot nodes (0: the pool empties when the queue does).')
@minValue(0)
param spotMinCount int

@description('Most Spot nodes.')
@minValue(1)
@maxValue(100)
param spotMaxCount int

@description('Add the regular lane\'s pool (docs/deploying.md, "The two lanes"): regular-priority nodes from zero, tainted and labelled for the regular lane\'s worker pods only.')
param regularPool bool

@description('VM size of the regular pool.')
param regularVmSize string

@description('Most regular nodes.')
@minValue(1)
@maxValue(100)
param regularMaxCount int

@description('Subnet of both pools (its NAT gateway is the egress, its service endpoint reaches Storage).')
param subnetId string

@description('Resource id of the control plane\'s user-assigned identity (Network Contributor on the subnet).')
param controlPlaneIdentityId string

@description('Log Analytics workspace for the control plane\'s logs.')
param workspaceId string

param tags object

var spotTaint = 'kubernetes.azure.com/scalesetpriority=spot:NoSchedule'

// The regular lane's pool: only pods that tolerate this taint and select
// this label run there (deploy/kubernetes/regular.yaml), so neither the
// Spot lane's workers nor anything else lands on regular capacity.
var regularLaneKey = 'spot-worker/lane'
resource cluster 'Microsoft.ContainerService/managedClusters@2026-05-01' = {
  //checkov:skip=CKV_AZURE_6:The API server is public with Entra ID authentication (local accounts off): the operator applies the manifests from wherever they are; a fixed IP list would lock out the operator's changing address. Narrow it with apiServerAccessProfile.authorizedIPRanges where the operator's range is known.
  //checkov:skip=CKV_AZURE_172:No Secrets Store CSI driver: the workers hold no secrets (workload identity tokens only).
  //checkov:skip=CKV_AZURE_227:Encryption at host needs a subscription feature registration; disks are encrypted at rest by the platform.
  //checkov:skip=CKV_AZURE_226:Ephemeral OS disks depend on the VM size's cache; the default sizes here have none big enough, so managed OS disks.
  // Choices a production cluster may make differently: the Free tier (the
  // workers drain and resume whatever the API server does; Standard gives an
  // SLA), a public API server with Entra ID sign-in only (a private cluster
  // needs a jump host for kubectl), platform-managed disk keys (the disks
  // hold nothing of the jobs).
  name: name
  location: location
  tags: tags
  sku: {
    name: 'Base'
    tier: 'Free'
  }
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${controlPlaneIdentityId}': {}
    }
  }
  properties: {
    kubernetesVersion: empty(kubernetesVersion) ? null : kubernetesVersion
    dnsPrefix: name
    enableRBAC: true
    disableLocalAccounts: true
    aadProfile: {
      managed: true
      enableAzureRBAC: true
    }
    autoUpgradeProfile: {
      upgradeChannel: 'patch'
      nodeOSUpgradeChannel: 'NodeImage'
    }
    oidcIssuerProfile: {
      enabled: true
    }
    securityProfile: {
      workloadIdentity: {
        enabled: true
      }
    }
    workloadAutoScalerProfile: {
      keda: {
        enabled: true
      }
    }
    addonProfiles: {
      // Off, and said so: an old cluster API enabled it by default.
      kubeDashboard: {
        enabled: false
      }
      omsagent: {
        enabled: true
        config: {
          logAnalyticsWorkspaceResourceID: workspaceId
        }
      }
    }
    networkProfile: {
      networkPlugin: 'azure'
      networkPluginMode: 'overlay'
      networkPolicy: 'azure'
      podCidr: '10.244.0.0/16'
      serviceCidr: '10.245.0.0/16'
      dnsServiceIP: '10.245.0.10'
      outboundType: 'userAssignedNATGateway'
    }
    agentPoolProfiles: [
      {
        name: 'system'
        mode: 'System'
        count: systemNodeCount
        vmSize: systemVmSize
        osType: 'Linux'
        osSKU: 'AzureLinux'
        type: 'VirtualMachineScaleSets'
        vnetSubnetID: subnetId
        maxPods: 50
        enableNodePublicIP: false
        // Only the cluster's own pods: the workers go to the Spot pool.
        nodeTaints: [
          'CriticalAddonsOnly=true:NoSchedule'
        ]
      }
      {
        name: 'spot'
        mode: 'User'
        osType: 'Linux'
        osSKU: 'AzureLinux'
        type: 'VirtualMachineScaleSets'
        vmSize: spotVmSize
        vnetSubnetID: subnetId
        maxPods: 50
        enableNodePublicIP: false
        scaleSetPriority: 'Spot'
        // Delete, not Deallocate: a deallocated Spot node still counts against
        // the quota and comes back with stale pods; a new node starts clean.
        scaleSetEvictionPolicy: 'Delete'
        spotMaxPrice: json(spotMaxPrice)
        enableAutoScaling: true
        count: spotMinCount
        minCount: spotMinCount
        maxCount: spotMaxCount
        // AKS sets this taint on Spot pools itself; stating it keeps the
        // template and the cluster in agreement.
        nodeTaints: [
          spotTaint
        ]
      }
    ]
  }
}

// The regular lane's pool (docs/deploying.md, "The two lanes"): regular-priority nodes from zero,
// scaled by the cluster autoscaler for the regular lane's pods, which KEDA
// scales (deploy/kubernetes/regular.yaml).
resource regularAgentPool 'Microsoft.ContainerService/managedClusters/agentPools@2026-05-01' = if (regularPool) {
  //checkov:skip=CKV_AZURE_168:maxPods is 50 (properties.maxPods below); checkov reads no properties of a conditional resource (`= if (...)`), so it sees none.
  //checkov:skip=CKV_AZURE_227:Encryption at host needs a subscription feature registration; disks are encrypted at rest by the platform (as for the cluster's own pools).
  parent: cluster
  name: 'regular'
  properties: {
    mode: 'User'
    osType: 'Linux'
    osSKU: 'AzureLinux'
    type: 'VirtualMachineScaleSets'
    vmSize: regularVmSize
    vnetSubnetID: subnetId
    maxPods: 50
    enableNodePublicIP: false
    scaleSetPriority: 'Regular'
    enableAutoScaling: true
    count: 0
    minCount: 0
    maxCount: regularMaxCount
    nodeLabels: {
      '${regularLaneKey}': 'regular'
    }
    nodeTaints: [
      '${regularLaneKey}=regular:NoSchedule'
    ]
  }
}

output id string = cluster.id
output name string = cluster.name
output oidcIssuerUrl string = cluster.properties.oidcIssuerProfile.issuerURL
