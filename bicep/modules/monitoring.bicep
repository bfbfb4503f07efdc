// Telemetry: a Log Analytics workspace, a workspace-based Application
// Insights the workers export to (its connection string is handed to them
// through cloud-init), and the workbook dashboard (../workbook.json).

param location string
param namePrefix string

// Application Insights' RetentionInDays takes only these values; the
// workspace (PerGB2018) takes 30..730, so this list suits both.
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
param retentionInDays int

param tags object

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: '${namePrefix}-logs'
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: retentionInDays
    features: {
      enableLogAccessUsingOnlyResourcePermissions: true
    }
  }
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: '${namePrefix}-appi'
  location: location
  tags: tags
  kind: 'other'
  properties: {
    Application_Type: 'other'
    WorkspaceResourceId: workspace.id
    IngestionMode: 'LogAnalytics'
    // The workers authenticate ingestion with the connection string's
    // instrumentation key: the telemetry crate has no Entra token path.
    DisableLocalAuth: false
    publicNetworkAccessForIngestion: 'Enabled'
    publicNetworkAccessForQuery: 'Enabled'
    RetentionInDays: retentionInDays
  }
}

output workspaceId string = workspace.id
output appInsightsId string = appInsights.id
output appInsightsName string = appInsights.name
// Not a credential for reading anything: it lets a client send telemetry to
// this resource. Passed to the workers as APPLICATIONINSIGHTS_CONNECTION_STRING.
output appInsightsConnectionString string = appInsights.properties.ConnectionString
