// The dashboard: throughput, failures, poison count, evictions, notice-to-
// drained time and queue depth. The panels live in ../workbook.json (the
// portal's own format, so it can be edited there and pasted back).

param location string
param displayName string
param appInsightsId string
param queueServiceId string
param tags object

var panels = replace(replace(loadTextContent('../workbook.json'), '{{appInsightsId}}', appInsightsId), '{{queueServiceId}}', queueServiceId)

resource workbook 'Microsoft.Insights/workbooks@2023-06-01' = {
  name: guid(resourceGroup().id, displayName)
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: displayName
    category: 'workbook'
    sourceId: appInsightsId
    serializedData: panels
  }
}

output id string = workbook.id
