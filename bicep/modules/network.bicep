// The workers' network: one subnet, no public IP on any VM, no inbound from
// the internet, outbound through a NAT gateway.
//
// Outbound is explicit because VMs of a Flexible scale set get no default
// outbound access: cloud-init needs to reach Storage (the binary), Microsoft
// Entra ID (through IMDS, for tokens), Application Insights and the Ubuntu
// mirrors. The NAT gateway gives them one static egress address and no
// inbound path. Storage is reached through a service endpoint, so that
// traffic stays on the Azure backbone and the storage firewall can admit this
// subnet by name.

param location string
param namePrefix string
param addressPrefix string
param subnetPrefix string
param tags object

resource natIp 'Microsoft.Network/publicIPAddresses@2023-11-01' = {
  name: '${namePrefix}-nat-ip'
  location: location
  tags: tags
  sku: {
    name: 'Standard'
  }
  properties: {
    publicIPAllocationMethod: 'Static'
    publicIPAddressVersion: 'IPv4'
  }
}

resource nat 'Microsoft.Network/natGateways@2023-11-01' = {
  name: '${namePrefix}-nat'
  location: location
  tags: tags
  sku: {
    name: 'Standard'
  }
  properties: {
    idleTimeoutInMinutes: 4
    publicIpAddresses: [
      {
        id: natIp.id
      }
    ]
  }
}

resource nsg 'Microsoft.Network/networkSecurityGroups@2023-11-01' = {
  name: '${namePrefix}-nsg'
  location: location
  tags: tags
  properties: {
    securityRules: [
      // The platform's defaults already drop internet inbound; this rule says
      // so explicitly and wins over anything added later at a lower priority.
      {
        name: 'deny-internet-inbound'
        properties: {
          priority: 4000
          direction: 'Inbound'
          access: 'Deny'
          protocol: '*'
          sourceAddressPrefix: 'Internet'
          sourcePortRange: '*'
          destinationAddressPrefix: '*'
          destinationPortRange: '*'
        }
      }
    ]
  }
}

resource vnet 'Microsoft.Network/virtualNetworks@2023-11-01' = {
  name: '${namePrefix}-vnet'
  location: location
  tags: tags
  properties: {
    addressSpace: {
      addressPrefixes: [
        addressPrefix
      ]
    }
    subnets: [
      {
        name: 'workers'
        properties: {
          addressPrefix: subnetPrefix
          networkSecurityGroup: {
            id: nsg.id
          }
          natGateway: {
            id: nat.id
          }
          defaultOutboundAccess: false
          privateEndpointNetworkPolicies: 'Enabled'
          serviceEndpoints: [
            {
              service: 'Microsoft.Storage'
            }
          ]
        }
      }
    ]
  }
}

output subnetId string = vnet.properties.subnets[0].id
output nsgId string = nsg.id
output natPublicIp string = natIp.properties.ipAddress
output vnetName string = vnet.name
output subnetName string = vnet.properties.subnets[0].name
