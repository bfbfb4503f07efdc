// Autoscale on the job queue's length: out on backlog, in to the minimum when
// the queue is empty. ApproximateMessageCount counts messages in flight too
// (a message being processed is only invisible), so "empty" means no work
// anywhere and scaling in never interrupts a job.

param location string
param name string
param vmssId string

@description('Resource id of the job queue\'s metrics: <storage account id>/services/queue/queues/<queue>.')
param queueMetricsId string

@minValue(1)
param minInstances int

@minValue(1)
param maxInstances int

@description('Messages waiting per instance above which the scale set grows.')
@minValue(1)
param backlogPerInstance int

@description('Instances added per scale-out.')
@minValue(1)
param scaleOutStep int

param tags object

resource autoscale 'Microsoft.Insights/autoscalesettings@2022-10-01' = {
  name: name
  location: location
  tags: tags
  properties: {
    enabled: true
    targetResourceUri: vmssId
    profiles: [
      {
        name: 'queue-backlog'
        capacity: {
          minimum: string(minInstances)
          maximum: string(maxInstances)
          default: string(minInstances)
        }
        rules: [
          {
            metricTrigger: {
              metricName: 'ApproximateMessageCount'
              metricNamespace: ''
              metricResourceUri: queueMetricsId
              timeGrain: 'PT1M'
              statistic: 'Average'
              timeWindow: 'PT5M'
              timeAggregation: 'Average'
              operator: 'GreaterThan'
              threshold: backlogPerInstance
              dividePerInstance: true
            }
            scaleAction: {
              direction: 'Increase'
              type: 'ChangeCount'
              value: string(scaleOutStep)
              cooldown: 'PT5M'
            }
          }
          {
            metricTrigger: {
              metricName: 'ApproximateMessageCount'
              metricNamespace: ''
              metricResourceUri: queueMetricsId
              timeGrain: 'PT1M'
              statistic: 'Average'
              timeWindow: 'PT10M'
              timeAggregation: 'Maximum'
              operator: 'LessThan'
              threshold: 1
              dividePerInstance: false
            }
            scaleAction: {
              // Idle: straight down to the minimum.
              direction: 'Decrease'
              type: 'ExactCount'
              value: string(minInstances)
              cooldown: 'PT10M'
            }
          }
        ]
      }
    ]
  }
}

output id string = autoscale.id
