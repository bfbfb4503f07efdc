// An example parameter file: `az deployment group create -g RG --template-file
// bicep/aks/main.bicep --parameters bicep/aks/main.bicepparam`.
using './main.bicep'

param namePrefix = 'spotworker'
param queueName = 'jobs'
param systemVmSize = 'Standard_D2as_v5'
param systemNodeCount = 2
param spotVmSize = 'Standard_D2as_v5'
param spotMaxPrice = '-1'
param spotMinCount = 0
param spotMaxCount = 10
param namespace = 'spot-worker'
param serviceAccountName = 'spot-worker'
param retentionInDays = 30
param checkpointRetentionDays = 30
