// The workers' right to protect their own VM from scale-in (issue 39;
// bicep/README.md, "Instance protection"): a custom role with only the write
// of a scale set's VM instances (the worker's one call, a PUT that sets
// properties.protectionPolicy.protectFromScaleIn; it never reads the
// instance back: a starting worker clears the flag instead), assigned to the
// workers' identity on each scale set, not on the resource group. No read,
// no delete, no write of the scale set itself. Deployed only with
// scaleInProtection = true (the worker's SPOT_WORKER_SCALE_IN_PROTECTION).
// crates/azure/tests/arm reads the actions below for its stand-in of ARM.

param namePrefix string

@description('Principal id of the workers\' user-assigned identity.')
param principalId string

@description('Name of the Spot lane\'s scale set.')
param spotScaleSetName string

@description('Name of the regular lane\'s scale set; empty: no regular lane.')
param regularScaleSetName string

resource protector 'Microsoft.Authorization/roleDefinitions@2022-04-01' = {
  name: guid(resourceGroup().id, 'spot-worker scale-in protection')
  properties: {
    // Role names are unique in the tenant: one per resource group.
    roleName: '${namePrefix} scale-in protection ${uniqueString(resourceGroup().id)}'
    description: 'spot-worker: a worker protects its own VM from scale-in while it holds work (protectionPolicy.protectFromScaleIn)'
    type: 'CustomRole'
    assignableScopes: [
      resourceGroup().id
    ]
    permissions: [
      {
        actions: [
          'Microsoft.Compute/virtualMachineScaleSets/virtualMachines/write'
        ]
        notActions: []
        dataActions: []
        notDataActions: []
      }
    ]
  }
}

resource spotScaleSet 'Microsoft.Compute/virtualMachineScaleSets@2024-07-01' existing = {
  name: spotScaleSetName
}

resource regularScaleSet 'Microsoft.Compute/virtualMachineScaleSets@2024-07-01' existing = if (!empty(regularScaleSetName)) {
  name: regularScaleSetName
}

resource spotProtects 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(spotScaleSet.id, principalId, protector.id)
  scope: spotScaleSet
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: protector.id
    description: 'spot-worker worker: protect its own Spot VM from scale-in while it holds work'
  }
}

resource regularProtects 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(regularScaleSetName)) {
  name: guid(regularScaleSet.id, principalId, protector.id)
  scope: regularScaleSet
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: protector.id
    description: 'spot-worker worker: protect its own regular VM from scale-in while it holds work'
  }
}
