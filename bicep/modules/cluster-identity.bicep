// The AKS control plane's user-assigned identity, with the one right a
// cluster in an existing subnet needs: Network Contributor on that subnet
// (to join nodes and, with outboundType userAssignedNATGateway, to use its
// NAT gateway). Nothing account- or group-wide.

param location string
param name string

@description('Name of the virtual network holding the subnet.')
param vnetName string

@description('Name of the nodes\' subnet.')
param subnetName string

param tags object

var networkContributor = '4d97b98b-1d4f-4787-a291-c67834d212e7'

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: name
  location: location
  tags: tags
}

resource vnet 'Microsoft.Network/virtualNetworks@2023-11-01' existing = {
  name: vnetName

  resource subnet 'subnets' existing = {
    name: subnetName
  }
}

resource joinsSubnet 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(vnet::subnet.id, identity.id, networkContributor)
  scope: vnet::subnet
  properties: {
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', networkContributor)
    description: 'spot-worker AKS: join the node pools to the workers subnet'
  }
}

output id string = identity.id
